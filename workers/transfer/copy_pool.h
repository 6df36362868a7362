/*
 * The host copy threads: one pool shared by every device worker, for the
 * host half of a copy (reading a client's file into a pinned staging slot,
 * writing a slot out to it, hashing bytes for --verify).
 *
 * Ownership: the daemon starts the pool before the workers and stops it after
 * them (daemon/main.c); workers hold only its pointer (device_config). A
 * worker submits tasks it owns and waits for each before it reuses or frees
 * it; a pool thread touches a task only between taking it from the queue and
 * marking it done. Pool threads never call the backend: the device's worker
 * stays the only thread that does (docs/ARCHITECTURE.md).
 *
 * Wake-ups: copy_pool_submit appends to its group's queue under the pool's
 * lock and signals one thread. Threads take the most urgent priority first
 * and, within one, the groups in turn (a small transfer's chunk does not
 * wait behind a large one's ring of reads); a thread that finishes a task sets its done
 * flag, broadcasts its group's condition variable and tells the submitting
 * worker's scheduler (sched_notify). A job on a worker yields until its
 * task is done (sched.h); any other submitter sleeps on the group's
 * condition variable after a short spin (a 2 MiB chunk's DMA takes about
 * 40 µs at pinned speed, so the wait is often shorter than a futex wake-up).
 */
#ifndef GPUQ_COPY_POOL_H
#define GPUQ_COPY_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"
#include "workers/transfer/copy_store.h"

struct copy_pool;
struct copy_task;
struct sched;

typedef void (*copy_task_fn)(struct copy_task *task);

/*
 * The tasks of one submitter (a transfer): what their waiter sleeps on, and
 * their own queue in the pool (under the pool's lock), so that the threads
 * take the groups of one priority in turn.
 */
struct copy_group {
	pthread_mutex_t lock;
	pthread_cond_t done_cond;
	struct copy_task *head, *tail; /* queued, not yet taken */
	struct copy_group *next_ready;  /* in the pool's ring of groups with tasks queued */
	bool in_ring;
};

/* One unit of host work; embed it in a struct of your own and recover it with container_of-style casts. */
struct copy_task {
	copy_task_fn fn;          /* runs on a pool thread (or inline without threads) */
	struct copy_group *group; /* set by the submitter */
	atomic_bool done;
	struct sched *sched;      /* the submitting worker's scheduler, told when the task is done */
	struct copy_task *next;   /* the pool's queue link */
};

/*
 * Starts `threads` copy threads (0: none; tasks then run inline in
 * copy_pool_submit, on the submitter's thread). NULL with err on failure.
 * Main thread, before the workers start.
 */
struct copy_pool *copy_pool_start(unsigned threads, struct gpuq_error *err);
/* Runs what is queued, joins the threads and frees the pool (NULL is fine). Main thread, after the workers stopped. */
void copy_pool_stop(struct copy_pool *pool);
unsigned copy_pool_threads(const struct copy_pool *pool);
/*
 * How the copy threads store into a client's mapping (copy_store.h): picked
 * once at copy_pool_start from copy_store_requested() and the CPU. A NULL
 * pool stores regularly. Its name is "memcpy", "nt-avx2" or "nt-sse2".
 */
copy_store_fn copy_pool_store(const struct copy_pool *pool);
const char *copy_pool_store_name(const struct copy_pool *pool);

void copy_group_init(struct copy_group *g);
void copy_group_destroy(struct copy_group *g);

/* Queues task (fn and group set by the caller); marks it not done first. Any thread. */
void copy_pool_submit(struct copy_pool *pool, struct copy_task *task);
/* Blocks until task is done. The submitting thread. */
void copy_task_wait(struct copy_task *task);
static inline bool copy_task_done(struct copy_task *task)
{
	return atomic_load_explicit(&task->done, memory_order_acquire);
}

#endif
