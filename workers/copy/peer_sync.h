/*
 * The rendezvous of a gang's parts: the state two or more device workers
 * share while they run the parts of one job (a peer copy, the copy
 * benchmark), and the waits they make on each other.
 *
 * Every part runs on its own worker thread and calls CUDA only for its own
 * device; what one part hands another (an event to wait for, a ring slot,
 * a checksum) goes through state guarded by `lock`, and every change is
 * broadcast on `changed` (and told to the schedulers of parts that run as
 * jobs, which yield instead of sleeping on it). No wait is unbounded: a waiting part gives up when
 * its own job is cancelled, when another part has failed (`abort`), when a
 * part it waits for has ended without providing what it waits for (as a
 * part that never ran does), or when nothing has changed for timeout_ms.
 * Cancel flags are set by the main thread without a broadcast, so waits
 * poll them every PEER_SYNC_POLL_MS.
 */
#ifndef GPUQ_PEER_SYNC_H
#define GPUQ_PEER_SYNC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "workers/work.h"

#define PEER_SYNC_MAX_PARTS GPUQ_MAX_DEVICES
#define PEER_SYNC_POLL_MS 20

struct peer_sync {
	pthread_mutex_t lock;
	pthread_cond_t changed; /* broadcast after every change of shared state */
	struct work *parts[PEER_SYNC_MAX_PARTS];
	int nparts;
	unsigned timeout_ms;   /* the longest a part waits without anything changing */
	atomic_bool abort;     /* a part failed: every other part stops */
	_Atomic unsigned generation; /* bumped by every change: what parts yielding to a scheduler watch */
	int failed_part;       /* which one (the first), for messages; under lock */
	unsigned barrier_count, barrier_generation; /* peer_sync_barrier's; under lock */
	bool left[PEER_SYNC_MAX_PARTS]; /* the part has said it provides nothing more; under lock */
};

/* Main thread or a part, before any part waits: parts[i] runs part i. */
int peer_sync_init(struct peer_sync *s, struct work *const *parts, int nparts,
		   unsigned timeout_ms);
void peer_sync_destroy(struct peer_sync *s);

void peer_sync_lock(struct peer_sync *s);
void peer_sync_unlock(struct peer_sync *s);
/* With the lock held: wakes every waiting part after a change. */
void peer_sync_changed(struct peer_sync *s);

/* Part `self` failed: makes every other part's waits (and chunk loops) stop. */
void peer_sync_fail(struct peer_sync *s, int self);
/*
 * Part `self` provides nothing more: waits for something from it end as
 * when its work has ended (for when the work goes on to other things, as
 * the benchmark's parts do between copies).
 */
void peer_sync_leave(struct peer_sync *s, int self);

/*
 * With the lock held: waits until ready(arg) is true and returns 0, or
 * returns -1 with err set (cancelled, or timeout) as the header says.
 * `what` completes "waited for ..." in messages. The lock is held again
 * on return either way.
 */
int peer_sync_wait(struct peer_sync *s, int self, bool (*ready)(void *arg), void *arg,
		   const char *what, struct gpuq_error *err);
/*
 * The same for cleaning up (another part must let go of something of
 * ours first): cancel and failures do not end it, only ready(arg), the
 * other parts having ended, or the timeout.
 */
int peer_sync_wait_cleanup(struct peer_sync *s, int self, bool (*ready)(void *arg), void *arg,
			   const char *what, struct gpuq_error *err);

/* Whether part self should stop now (its job cancelled, or another part failed). */
int peer_sync_check(struct peer_sync *s, int self, struct gpuq_error *err);

/* Without the lock: waits until every part has arrived (reusable). */
int peer_sync_barrier(struct peer_sync *s, int self, struct gpuq_error *err);

#endif
