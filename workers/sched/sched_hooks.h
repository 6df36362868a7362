/*
 * How the scheduler calls back the worker that makes and runs it
 * (workers/worker.c), so that the scheduler never names the worker or the
 * device reset: the worker hands this table to sched_create, and the loop
 * (sched.c) and the waits (sched_wait.c) call through it. Worker thread.
 */
#ifndef GPUQ_SCHED_HOOKS_H
#define GPUQ_SCHED_HOOKS_H

#include <stdbool.h>

struct sched;
struct work;
struct worker;

struct sched_hooks {
	/*
	 * A work has ended: the device's memory figures after an alloc or a
	 * free (a backend call, without the worker's lock), its outcome in
	 * the counters and health (under the lock, in the critical section
	 * that retires it), then to the main thread (without the lock).
	 */
	void (*refresh_after)(struct worker *w, const struct work *work);
	void (*account_locked)(struct worker *w, const struct work *work);
	void (*hand_back)(struct worker *w, struct work *work);
	/* Whether w's device must be reset now; resetting it with nothing in flight. */
	bool (*reset_due)(struct worker *w);
	int (*reset_run)(struct worker *w, struct sched *s);
	/*
	 * Housekeeping while no job is in flight (NULL: none): seconds until
	 * it is due (0: now; negative: nothing due), and running it. The loop
	 * sleeps no longer than that.
	 */
	double (*idle_due)(struct worker *w);
	void (*idle_run)(struct worker *w);
};

#endif
