/*
 * The host copy threads (see copy_pool.h for who owns what and who wakes
 * whom). The queue is FIFO, so the chunks of one transfer are taken roughly
 * in order and the tasks of several workers interleave fairly.
 */
#include "workers/transfer/copy_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/clock.h"
#include "workers/sched/sched_wait.h"

/*
 * How long copy_task_wait polls before it sleeps: a little more than a 2 MiB
 * slot's DMA at pinned speed (~40 µs), so that a worker waiting for the next
 * chunk of a fast transfer rarely pays a futex wake-up.
 */
#define COPY_SPIN_SECONDS 50e-6

struct copy_pool {
	pthread_mutex_t lock; /* guards the queues and `stopping` */
	pthread_cond_t work_cond;
	/* Per priority, the ring of groups with tasks queued; each group's own FIFO. */
	struct copy_group *ring_head[GPUQ_PRIORITIES], *ring_tail[GPUQ_PRIORITIES];
	bool stopping;
	unsigned nthreads;
	pthread_t *threads;
	copy_store_fn store; /* constant after start */
	const char *store_name;
};

/*
 * The thread's last touch of task is the store of `done`; the group outlives
 * it (copy_group_destroy) and so does the submitter's scheduler (sched.h),
 * which is told last: its job may be yielding until the task is done.
 */
static void task_finish(struct copy_task *task)
{
	struct copy_group *g = task->group;
	struct sched *s = task->sched;
	pthread_mutex_lock(&g->lock);
	atomic_store_explicit(&task->done, true, memory_order_release);
	pthread_cond_broadcast(&g->done_cond);
	pthread_mutex_unlock(&g->lock);
	sched_notify(s);
}

static void ring_append(struct copy_pool *pool, int p, struct copy_group *g)
{
	g->next_ready = NULL;
	g->in_ring = true;
	if (pool->ring_tail[p])
		pool->ring_tail[p]->next_ready = g;
	else
		pool->ring_head[p] = g;
	pool->ring_tail[p] = g;
}

/*
 * The next task: the most urgent priority first, and within it the first
 * task of the group at the ring's head, which then goes to the ring's end.
 * NULL when nothing is queued. Under the lock.
 */
static struct copy_task *pool_take(struct copy_pool *pool)
{
	for (int p = 0; p < GPUQ_PRIORITIES; p++) {
		struct copy_group *g = pool->ring_head[p];
		if (!g)
			continue;
		pool->ring_head[p] = g->next_ready;
		if (!pool->ring_head[p])
			pool->ring_tail[p] = NULL;
		g->in_ring = false;
		struct copy_task *task = g->head;
		g->head = task->next;
		if (!g->head)
			g->tail = NULL;
		else
			ring_append(pool, p, g);
		return task;
	}
	return NULL;
}

/* Pool thread: runs tasks until stopped and the queue is empty. */
static void *copy_thread_main(void *arg)
{
	struct copy_pool *pool = arg;
	pthread_mutex_lock(&pool->lock);
	for (;;) {
		struct copy_task *task;
		while (!(task = pool_take(pool)) && !pool->stopping)
			pthread_cond_wait(&pool->work_cond, &pool->lock);
		if (!task)
			break; /* stopping, and nothing is left */
		pthread_mutex_unlock(&pool->lock);
		task->fn(task);
		task_finish(task);
		pthread_mutex_lock(&pool->lock);
	}
	pthread_mutex_unlock(&pool->lock);
	return NULL;
}

struct copy_pool *copy_pool_start(unsigned threads, struct gpuq_error *err)
{
	struct copy_pool *pool = calloc(1, sizeof *pool);
	if (!pool || (threads && !(pool->threads = calloc(threads, sizeof *pool->threads)))) {
		free(pool);
		gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no memory for %u copy threads", threads);
		return NULL;
	}
	pthread_mutex_init(&pool->lock, NULL);
	pthread_cond_init(&pool->work_cond, NULL);
	/*
	 * The one line to change when a kind wins on every machine measured:
	 * the kind requested (gpuqd --copy-stores) is regular unless asked.
	 */
	pool->store = copy_store_pick(copy_store_requested(), &pool->store_name);
	for (unsigned i = 0; i < threads; i++) {
		int rc = pthread_create(&pool->threads[i], NULL, copy_thread_main, pool);
		if (rc != 0) {
			gpuq_fail(err, GPUQ_E_INTERNAL, "cannot start copy thread %u of %u: %s", i + 1,
				  threads, strerror(rc));
			copy_pool_stop(pool);
			return NULL;
		}
		pool->nthreads++;
	}
	return pool;
}

void copy_pool_stop(struct copy_pool *pool)
{
	if (!pool)
		return;
	pthread_mutex_lock(&pool->lock);
	pool->stopping = true;
	pthread_cond_broadcast(&pool->work_cond);
	pthread_mutex_unlock(&pool->lock);
	for (unsigned i = 0; i < pool->nthreads; i++)
		pthread_join(pool->threads[i], NULL);
	pthread_mutex_destroy(&pool->lock);
	pthread_cond_destroy(&pool->work_cond);
	free(pool->threads);
	free(pool);
}

unsigned copy_pool_threads(const struct copy_pool *pool)
{
	return pool ? pool->nthreads : 0;
}

copy_store_fn copy_pool_store(const struct copy_pool *pool)
{
	return pool ? pool->store : copy_store_regular;
}

const char *copy_pool_store_name(const struct copy_pool *pool)
{
	return pool ? pool->store_name : "memcpy";
}

void copy_group_init(struct copy_group *g)
{
	memset(g, 0, sizeof *g);
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->done_cond, NULL);
}

/*
 * A waiter that saw its last task done while spinning may get here while the
 * pool thread that finished it still holds the lock to broadcast: taking the
 * lock once waits for that thread to let go.
 */
void copy_group_destroy(struct copy_group *g)
{
	pthread_mutex_lock(&g->lock);
	pthread_mutex_unlock(&g->lock);
	pthread_mutex_destroy(&g->lock);
	pthread_cond_destroy(&g->done_cond);
}

void copy_pool_submit(struct copy_pool *pool, struct copy_task *task)
{
	atomic_store_explicit(&task->done, false, memory_order_relaxed);
	task->next = NULL;
	task->sched = sched_self();
	if (!pool || pool->nthreads == 0) {
		task->fn(task);
		atomic_store_explicit(&task->done, true, memory_order_release);
		return;
	}
	int p = sched_current_priority();
	struct copy_group *g = task->group;
	pthread_mutex_lock(&pool->lock);
	if (g->tail)
		g->tail->next = task;
	else
		g->head = task;
	g->tail = task;
	if (!g->in_ring)
		ring_append(pool, p, g);
	pthread_cond_signal(&pool->work_cond);
	pthread_mutex_unlock(&pool->lock);
}

static bool task_done(void *arg)
{
	return copy_task_done(arg);
}

void copy_task_wait(struct copy_task *task)
{
	if (copy_task_done(task))
		return;
	if (sched_in_job()) { /* the worker goes on with other jobs meanwhile */
		sched_wait_host(task_done, task, SCHED_NOT_WAITING);
		return;
	}
	double end = monotonic_seconds() + COPY_SPIN_SECONDS;
	for (unsigned i = 1; !copy_task_done(task); i++) {
		__builtin_ia32_pause();
		if (i % 64 == 0 && monotonic_seconds() > end)
			break;
	}
	struct copy_group *g = task->group;
	pthread_mutex_lock(&g->lock);
	while (!copy_task_done(task))
		pthread_cond_wait(&g->done_cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
}
