/*
 * The scheduler's queues and admission rule (sched_queue.c): the part of
 * the per-GPU scheduler that decides which queued work starts next. Every
 * function here runs with the worker's lock held: the main thread enqueues
 * and removes, the worker thread picks, admits and retires. See sched.h for
 * the rules themselves.
 */
#ifndef GPUQ_SCHED_QUEUE_H
#define GPUQ_SCHED_QUEUE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "workers/work.h"

/* Why a work waits (work.waiting), as `jobs` and `status` show it. */
enum sched_wait {
	SCHED_NOT_WAITING,
	SCHED_WAIT_QUEUE,       /* behind other works of higher priority or another owner's turn */
	SCHED_WAIT_BUFFER,      /* behind job waiting_job on one of its buffers */
	SCHED_WAIT_GANG,        /* behind job waiting_job, an earlier multi-device job */
	SCHED_WAIT_EXCLUSIVE,   /* a benchmark (job waiting_job) runs alone, or waits to */
	SCHED_WAIT_INFLIGHT,    /* the device has max_inflight jobs in flight */
	SCHED_WAIT_CHAIN,       /* behind job waiting_job: a device runs one chain at a time */
	SCHED_WAIT_SLOTS,       /* running, waiting for a pinned staging slot */
	SCHED_WAIT_MEMORY,      /* running, waiting for device memory (alloc wait_memory_ms) */
	SCHED_WAIT_PEERS,       /* running, waiting for its parts on other devices */
	SCHED_WAIT_LEASE,       /* behind a client's lease on one of its buffers (the attach job waiting_job) */
	SCHED_WAIT_REGION,      /* running, a region_free waiting for jobs that use the region */
	SCHED_WAIT_COUNT
};
const char *sched_wait_name(enum sched_wait why);

/* Where a work is in its life, as the scheduler sees it (work.sched_state). */
enum sched_work_state {
	SCHED_WORK_QUEUED,   /* in an owner queue */
	SCHED_WORK_ADMITTED, /* in flight, still issuing device work */
	SCHED_WORK_TAIL,     /* in flight, all its device work issued (tail_event recorded) */
	SCHED_WORK_FINISHED,
	SCHED_WORK_HELD,     /* a lease: in the ledger only, holding its access until released */
};

/* Queued works of one owner at one priority, in submission order. */
struct sched_owner_queue {
	uid_t uid;
	struct work *head, *tail;
	unsigned count;
	struct sched_owner_queue *next;
};

/* An owner's share of the device: time its works were in flight, per weight. */
struct sched_owner {
	uid_t uid;
	double weight;
	double served; /* seconds its finished works were in flight, summed */
	double inflight_since; /* the start times of its works in flight, summed */
	unsigned queued, inflight;
	bool used;
};

#define SCHED_MAX_OWNERS 256
#define SCHED_MAX_DEPS 32

/*
 * The queues of one device. `ledger` holds every work not yet finished
 * (queued or in flight) in submission order: the orders that must be kept
 * are read off it.
 */
struct sched_queues {
	struct sched_owner_queue *levels[GPUQ_PRIORITIES];
	struct work *ledger_head, *ledger_tail;
	uint64_t next_seq;
	unsigned queued;
	unsigned holds; /* leases in the ledger (SCHED_WORK_HELD) */
	struct sched_owner owners[SCHED_MAX_OWNERS];
	atomic_bool dirty; /* something changed that may let a queued work start (read without the lock) */
};

/* What is in flight, as admission weighs it. */
struct sched_load {
	unsigned inflight_by_level[GPUQ_PRIORITIES];
	unsigned inflight;
	unsigned max_inflight;
};

/* The tail events of earlier works that an admitted work's lane must wait for. */
struct sched_deps {
	void *events[SCHED_MAX_DEPS];
	unsigned count;
};

void sched_queues_init(struct sched_queues *q);
void sched_queues_destroy(struct sched_queues *q);
/* Queues w (priority, owner_uid, weight, access set by the caller); -1 when no owner record is free. */
int sched_enqueue(struct sched_queues *q, struct work *w);
/* Takes a queued w back (cancel, shutdown). */
void sched_remove(struct sched_queues *q, struct work *w);
/* The earliest queued work, or NULL. */
struct work *sched_queued_first(struct sched_queues *q);

/*
 * The work that should start next, with the tail events it must wait for
 * in deps, or NULL when none may start now. Works looked at and refused
 * get their waiting reason. now: CLOCK_MONOTONIC seconds, for fair share.
 */
struct work *sched_pick(struct sched_queues *q, const struct sched_load *load,
			struct sched_deps *deps, double now);
/* w (just picked) is in flight now, since `now` (CLOCK_MONOTONIC seconds). */
void sched_admit_work(struct sched_queues *q, struct work *w, double now);
/* w has issued all its device work; tail_event is set. */
void sched_mark_tail(struct sched_queues *q, struct work *w);
/* w, in flight since `started`, has finished at `now`. */
void sched_retire(struct sched_queues *q, struct work *w, double started, double now);

/*
 * Leases (an attach's ledger entry). The lease of a client that attached a
 * buffer is a work that is never run: sched_hold puts `hold` (its access
 * set by the caller) in the ledger where the attach w stands, just before
 * w is retired, so that every later work that conflicts with it waits
 * (SCHED_WAIT_LEASE) until sched_unhold takes it out. Works that only read
 * pass a read lease. A hold that was dropped first (its `cancel` set: the
 * client went away before the grant) is not put in; returns whether it was.
 */
bool sched_hold(struct sched_queues *q, struct work *w, struct work *hold);
/*
 * A lease the previous gpuqd image granted (a re-exec): its entry goes at
 * the ledger's end, where no attach stands, so that every work queued after
 * it waits for it as for any lease. false when it was dropped first.
 */
bool sched_hold_last(struct sched_queues *q, struct work *hold);
void sched_unhold(struct sched_queues *q, struct work *hold);

bool sched_work_exclusive(const struct work *w);
bool sched_work_lane_ordered(const struct work *w);
bool sched_works_conflict(const struct work *a, const struct work *b);

#endif
