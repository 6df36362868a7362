/*
 * The scheduler's state, shared by its two halves and no one else: the
 * loop (sched.c: admits, resumes, retires) and the waits a job may call
 * (sched_wait.c). The loop calls down into the waits; the waits never call
 * the loop, and reach the worker only through what the loop copied here at
 * creation (its lock, condition variable, queues and hooks).
 *
 * Threads: the device's worker thread, except notified and sleeping
 * (atomic: sched_notify, any thread) and by_engine, busy_since and
 * busy_total (under the worker's lock: sched_stats).
 */
#ifndef GPUQ_SCHED_STATE_H
#define GPUQ_SCHED_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "protocol/protocol.h"
#include "workers/backend/backend.h"
#include "workers/clock.h"
#include "workers/sched/sched_engine.h"
#include "workers/sched/sched_hooks.h"
#include "workers/sched/sched_queue.h"
#include "workers/sched/sched_wait.h"
#include "workers/work.h"

struct worker;
struct fiber;

/*
 * The gap between two looks at what a job waits for on the device: half the
 * time waited so far, within these bounds. Each look is a call into the
 * driver (cudaEventQuery); a long wait, which has chunks queued behind it,
 * need not make one every microsecond, while a wait of a few microseconds
 * (a small collective) is still seen within one. (docs/PERFORMANCE.md,
 * "Polling the device": on the H200 the rate of looks did not set a
 * staged put's pace; its read-ahead did.)
 */
#define SCHED_POLL_MIN_S 1e-6
#define SCHED_POLL_MAX_S 16e-6

struct sched_lane {
	void *lane;
	void *tail; /* the event a job records when it has issued all its device work */
	int priority;
	struct sched_lane *next;
};

struct sched_job {
	struct sched *s;
	struct work *work;
	struct fiber *fiber;
	struct sched_lane *lane;
	double started;
	enum sched_engine engine;
	/* While it waits: the predicate, and whether the worker may sleep meanwhile. */
	bool (*ready)(void *arg);
	void *ready_arg;
	bool device_wait;
	double wake_at; /* a sleeping job's deadline (sched_sleep), else 0 */
	uint64_t round; /* the last round that resumed it */
	bool paused; /* yielded without doing anything (sched_pause) */
	/* Staging slots: held now; waiting for one. */
	unsigned slots_held;
	bool slot_user, slot_waiting;
	/* DMA turns (sched_dma_turn): waiting for one, by direction; when it last took one. */
	bool dma_waiting[SCHED_DMA_DIRS];
	uint64_t dma_last;
	/* Bytes of the DMAs it queued on its own lane, not through staging slots (a ring's), as it last counted. */
	uint64_t dma_own[SCHED_DMA_DIRS];
	struct sched_job *next; /* in flight, by priority then submission */
};

struct sched {
	struct worker *w;
	struct device *dev;
	unsigned max_inflight;
	struct sched_job *jobs; /* 2 x max_inflight records */
	struct sched_job *free_jobs;
	unsigned nfree_jobs;
	struct sched_job *inflight;
	struct sched_job *current; /* the job whose fiber runs now */
	uint64_t rounds; /* sched_round's, numbering them */
	unsigned ninflight;
	unsigned inflight_by_level[GPUQ_PRIORITIES];
	struct sched_lane *free_lanes[GPUQ_PRIORITIES];
	struct fiber **free_fibers;
	unsigned nfree_fibers;
	/* The staging ring: which slots are free, and which job holds each. */
	struct sched_job *slot_holder[GPUQ_MAX_STAGING_SLOTS];
	unsigned slots_free, slot_users;
	/* DMAs queued through slots and not yet seen done: each slot's direction + 1, or 0. */
	unsigned char slot_dma[GPUQ_MAX_STAGING_SLOTS];
	unsigned dma_queued[SCHED_DMA_DIRS];
	uint64_t dma_own[SCHED_DMA_DIRS]; /* the sum of the in-flight jobs' dma_own, bytes */
	uint64_t dma_turns; /* turns taken, numbering them */
	double shared_until; /* when more than one job was last in flight (monotonic seconds) */
	uint64_t memory_epoch;
	/* Waking from an idle sleep (sched_notify). */
	atomic_bool notified, sleeping;
	/*
	 * The worker's (w's), copied at creation for the waits, which know
	 * nothing of struct worker: its lock and condition variable and its
	 * queues; and how to call it back (the loop and the waits use these,
	 * never a worker_* or device_reset_* name).
	 */
	pthread_mutex_t *lock;
	pthread_cond_t *wake;
	struct sched_queues *queues;
	struct sched_hooks hooks;
	/* Engines in flight and their busy time; under the worker's lock. */
	unsigned by_engine[SCHED_ENGINES];
	double busy_since[SCHED_ENGINES], busy_total[SCHED_ENGINES];
};

/* The priority level a work is scheduled at: its own, or normal for one out of range. */
static inline int sched_level_of(const struct work *w)
{
	return w->priority >= 0 && w->priority < GPUQ_PRIORITIES ? w->priority
								 : GPUQ_PRIORITY_NORMAL;
}

/* How long to wait before the next look at a device wait that has lasted `waited` seconds. */
static inline double sched_poll_gap(double waited)
{
	double gap = waited / 2;
	return gap < SCHED_POLL_MIN_S ? SCHED_POLL_MIN_S : gap > SCHED_POLL_MAX_S ? SCHED_POLL_MAX_S : gap;
}

/* Spins until `until` (monotonic seconds), pausing between looks at the clock. */
static inline void sched_spin_until(double until)
{
	do {
		for (int i = 0; i < 8; i++)
			__builtin_ia32_pause();
	} while (monotonic_seconds() < until);
}

/* sched_wait.c, for the loop: s is the calling worker thread's scheduler (NULL: none any more). */
void sched_wait_bind(struct sched *s);
/* sched_wait.c, for the loop: gives back the slots j still holds as it ends (after its DMAs). */
void sched_slots_reclaim(struct sched *s, struct sched_job *j);

#endif
