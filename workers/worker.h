/*
 * Device workers: one pthread per device, each the only thread that calls
 * the backend for its device.
 *
 * Main -> worker: worker_submit appends to the worker's bounded queue under
 * its lock and signals its condition variable.
 * Worker -> main: the worker appends finished work to the pool's completion
 * queue under done_lock, then calls uv_async_send; the async callback, on the
 * main thread, takes the whole queue at once (libuv coalesces wake-ups) and
 * hands each work to on_done after unlocking.
 *
 * Only the main thread calls the functions here, except where one says so.
 */
#ifndef GPUQ_WORKER_H
#define GPUQ_WORKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "workers/backend/backend.h"
#include "workers/sched/sched.h"
#include "workers/work.h"

/* Per-worker counters, summed under the worker's lock; one list feeds stats. */
#define WORKER_COUNTERS(X)                                                     \
	X(jobs)                                                                \
	X(jobs_failed)                                                         \
	X(bytes_moved)

struct worker_counters {
#define WORKER_COUNTER_FIELD(name) uint64_t name;
	WORKER_COUNTERS(WORKER_COUNTER_FIELD)
#undef WORKER_COUNTER_FIELD
};

/* What the main thread may read of a worker, copied out under its lock. */
struct worker_snapshot {
	bool healthy;
	char health[600]; /* "ok", or why not */
	struct device_info info;
	bool peer_access[GPUQ_MAX_DEVICES];
	/* the device's peer links and pool sharing (backend.h), as open found them */
	enum peer_link peer_link[GPUQ_MAX_DEVICES];
	bool pool_shared[GPUQ_MAX_DEVICES];
	char peer_note[160];
	unsigned queue_depth;
	struct worker_counters counters;
	struct sched_stats sched;
	/* resets (workers/backend/device_reset.h): how many, the last one's cause and duration */
	unsigned resets;
	char last_reset[320];
	double last_reset_s;
	unsigned last_reset_regions, last_reset_unpinned; /* host regions pinned again, and not */
	bool needs_restart; /* the last reset failed and only a new process recovers the device */
};

struct worker_pool;

struct worker {
	struct device dev; /* owned by the worker thread */
	struct worker_pool *pool;
	pthread_t thread;
	bool thread_started;

	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t wake;  /* on CLOCK_MONOTONIC: the scheduler's idle sleep */
	struct sched_queues queues; /* queued and in-flight works (workers/sched/sched_queue.h) */
	struct sched *sched;  /* the worker thread's scheduler, once made */
	_Atomic unsigned depth; /* works queued, not yet admitted */
	bool stopping;
	bool healthy;
	char health[600];
	struct device_info info;
	struct worker_counters counters;
	/* Device resets (workers/backend/device_reset.c). */
	unsigned resets;
	double reset_times[8];     /* the latest resets, a ring: the limit's window */
	char last_reset[320];      /* why the last one happened */
	double last_reset_s;       /* how long it took */
	unsigned last_reset_regions;  /* the host regions it pinned again in the new context */
	unsigned last_reset_unpinned; /* and those it could not (logged) */
	bool needs_restart;        /* the last reset failed: the driver gives only a new process a context */
	atomic_bool reset_asked;   /* an administrator asked for one (reset_why says who) */
	bool reset_gave_up;        /* faulted past the limit: left unhealthy for an operator */
	char reset_why[160];
	_Atomic unsigned resets_done; /* written by the worker; the main thread compares with resets_seen */
	unsigned resets_seen;         /* main thread only */
};

typedef void (*worker_done_fn)(struct work *work, void *arg);
/* Main thread: device index was reset; its buffers are gone. */
typedef void (*worker_reset_fn)(int index, void *arg);

struct worker_pool {
	const struct backend_ops *ops;
	int count;
	struct worker *workers;
	int ordinals[GPUQ_MAX_DEVICES];
	unsigned queue_max;
	unsigned spin_us; /* how long an idle worker polls its queue before sleeping */
	unsigned max_inflight; /* jobs each worker keeps in flight (sched.h) */
	bool stopped; /* worker_pool_stop began: nothing more is queued, held or kicked */

	pthread_mutex_t done_lock; /* guards the completion queue and `opened` */
	pthread_cond_t opened_cond;
	int opened; /* workers that finished opening their device */
	struct work *done_head, *done_tail;
	uv_async_t async;
	worker_done_fn on_done;
	worker_reset_fn on_reset;
	void *on_done_arg;
};

/*
 * Starts one worker per device (ordinals: the backend's device numbers) and
 * waits until each has opened its device or failed to, so that `devices`
 * is true from the first request. A device that failed to open is kept,
 * unhealthy, with its reason. Returns 0, or -1 with err when no worker
 * could be started at all.
 */
struct worker_pool_config {
	const struct backend_ops *ops;
	const int *ordinals; /* the backend's device numbers, count of them */
	int count;
	const struct device_config *device;
	unsigned queue_max;
	unsigned spin_us;
	unsigned max_inflight;
	worker_done_fn on_done;
	worker_reset_fn on_reset;
	void *on_done_arg;
};

int worker_pool_start(struct worker_pool *pool, uv_loop_t *loop,
		      const struct worker_pool_config *config, struct gpuq_error *err);

/*
 * Queues work on its device's worker. -1 with GPUQ_E_BUSY when the queue is
 * full, GPUQ_E_NO_DEVICE when the device is unhealthy or stopping.
 */
int worker_submit(struct worker_pool *pool, struct work *work, struct gpuq_error *err);

/*
 * Queues the n works of a gang (one per device, devices distinct) in one
 * step: all or none. Because the main thread is the only one that submits,
 * two gangs over overlapping devices are queued in the same order on every
 * device they share, so their parts can never cross.
 */
int worker_submit_group(struct worker_pool *pool, struct work **works, int n,
			struct gpuq_error *err);

/* Takes work back if it has not started: true if it was still queued. */
bool worker_unqueue(struct worker_pool *pool, struct work *work);
/* Takes a gang back only if none of its parts has started. */
bool worker_unqueue_group(struct worker_pool *pool, struct work **works, int n);

/*
 * Takes back every queued work of every worker (shutdown) and returns them as
 * a list. Parts of gangs stay queued: a part that runs waits for its
 * siblings, so they are cancelled through their flags instead.
 */
struct work *worker_pool_unqueue_all(struct worker_pool *pool);

/* A device's state for replies and metrics (main thread: it reads what worker_drain saw). */
void worker_snapshot(struct worker_pool *pool, int index, struct worker_snapshot *out);

/*
 * Lets each worker finish its queue, close its device and exit, waiting at
 * most timeout_ms for all of them; returns the number still running then.
 * Closes the async handle (the loop must run once more to finish that).
 */
int worker_pool_stop(struct worker_pool *pool, unsigned timeout_ms);

/*
 * A lease ends: takes its ledger entry out of its device's ledger (if the
 * grant put it there; otherwise marks it so that the grant never does) and
 * wakes the scheduler, so that the jobs behind it may start.
 */
void worker_unhold(struct worker_pool *pool, struct work *hold);
/*
 * A re-exec: a lease the previous image granted goes back into its
 * device's ledger (sched_hold_last), before any job of the new image is
 * queued there. 0, or -1 with err when the device has no worker serving.
 */
int worker_hold(struct worker_pool *pool, struct work *hold, struct gpuq_error *err);
/* Wakes device's scheduler to look at its jobs again (a cancel was asked). */
void worker_kick(struct worker_pool *pool, int device);
/*
 * Asks device's worker to reset its device once its jobs in flight have
 * ended (the caller cancels them); why says who asked. -1 with not_found.
 */
int worker_ask_reset(struct worker_pool *pool, int device, const char *why, struct gpuq_error *err);

/* The work a worker runs, through its kind's runner (workers/work_kinds.c). Worker thread. */
void run_work(struct device *dev, struct work *work);
/*
 * Worker thread (sched.c): work has ended; records its outcome and the
 * device's health, and hands it to the main thread. worker_finish_work
 * does it all; the scheduler does it in its three steps (through
 * sched_hooks.h), so that the accounting shares the critical section in
 * which it retires the work:
 * worker_refresh_after (the device's memory figures after an alloc or a
 * free: a backend call, without the lock), worker_account_locked (under
 * w->lock), then worker_hand_back (without it).
 */
void worker_finish_work(struct worker *w, struct work *work);
void worker_refresh_after(struct worker *w, const struct work *work);
void worker_account_locked(struct worker *w, const struct work *work);
void worker_hand_back(struct worker *w, struct work *work);
/* Worker thread: the main thread should look at the workers (a reset happened). */
void worker_wake_main(struct worker *w);

#endif
