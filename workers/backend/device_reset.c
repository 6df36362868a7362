/*
 * Recovering a device (see device_reset.h). Worker thread only, called by
 * the scheduler's loop once no job is in flight on the device.
 */
#include "workers/backend/device_reset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "workers/buffer/slab.h"
#include "workers/clock.h"
#include "workers/sched/sched.h"
#include "workers/transfer/map_cache.h"
#include "workers/transfer/region_pin.h"
#include "workers/worker.h"

bool device_reset_due(struct worker *w)
{
	if (!w->dev.faulted && !atomic_load(&w->reset_asked))
		return false; /* the common case, without the lock: every round of the scheduler asks */
	pthread_mutex_lock(&w->lock);
	bool due = w->reset_asked || (w->dev.faulted && !w->dev.lost && !w->reset_gave_up);
	pthread_mutex_unlock(&w->lock);
	return due;
}

/* The cause, for the health string and the log: the fault, or who asked. */
static void reset_cause(struct worker *w, char *out, size_t size)
{
	if (w->dev.faulted && !w->dev.lost) {
		snprintf(out, size, "a sticky fault: %s", w->dev.fault_reason);
		return;
	}
	pthread_mutex_lock(&w->lock);
	snprintf(out, size, "%s", w->reset_why);
	pthread_mutex_unlock(&w->lock);
}

/*
 * Fails the queued works that touch buffers: the memory they name is gone.
 * Works without buffers (noop, alloc) stay queued for the new context.
 */
static void fail_queued_with_buffers(struct worker *w, const char *cause)
{
	struct work *failed = NULL;
	pthread_mutex_lock(&w->lock);
	for (struct work *q = w->queues.ledger_head, *next; q; q = next) {
		next = q->ledger_next;
		if (q->sched_state != SCHED_WORK_QUEUED || q->naccess == 0)
			continue;
		sched_remove(&w->queues, q);
		w->depth--;
		q->next = failed;
		failed = q;
	}
	pthread_mutex_unlock(&w->lock);
	while (failed) {
		struct work *q = failed;
		failed = q->next;
		q->next = NULL;
		gpuq_fail(&q->error, GPUQ_E_DEVICE_ERROR,
			  "gpu %d was reset after %.300s, before this job started: the buffers it names are lost",
			  w->dev.index, cause);
		worker_finish_work(w, q);
	}
}

/* Automatic resets within the window so far; the lock is held. */
static unsigned resets_in_window(const struct worker *w, double now)
{
	unsigned recent = 0, ring = sizeof w->reset_times / sizeof w->reset_times[0];
	for (unsigned i = 0; i < ring; i++)
		recent += w->reset_times[i] > 0 && now - w->reset_times[i] <= w->dev.config.reset_window_s;
	return recent;
}

/*
 * A fault with reset_limit automatic resets behind it within the window (or
 * a limit of 0): the device stays faulted and unhealthy for an operator.
 * Returns true when that is the case. The lock is held.
 */
static bool reset_give_up(struct worker *w, double now, const char *cause)
{
	unsigned limit = w->dev.config.reset_limit;
	if (w->reset_asked || resets_in_window(w, now) < limit)
		return false;
	w->reset_gave_up = true;
	w->healthy = false;
	snprintf(w->health, sizeof w->health,
		 "%.300s; not reset: %u automatic resets within %u s is the limit (--reset-limit, "
		 "--reset-window); gpuq reset-device %d asks for one",
		 cause, limit, w->dev.config.reset_window_s, w->dev.index);
	return true;
}

/* The host regions a reset pinned again in the new context, and those it could not. */
struct reset_pins {
	unsigned regions, unpinned;
};

/* Records the outcome under the lock: healthy again, or why not; tells the main thread. */
static int reset_publish(struct worker *w, int rc, const struct gpuq_error *err,
			 const char *cause, double t0, bool asked, const struct reset_pins *pins)
{
	double now = monotonic_seconds();
	unsigned ring = sizeof w->reset_times / sizeof w->reset_times[0];
	pthread_mutex_lock(&w->lock);
	if (asked) /* an operator's reset starts the count afresh */
		memset(w->reset_times, 0, sizeof w->reset_times);
	else
		w->reset_times[w->resets % ring] = now;
	w->resets++;
	w->dev.resets = w->resets;
	w->reset_asked = w->reset_gave_up = false;
	w->last_reset_s = now - t0;
	w->last_reset_regions = pins->regions;
	w->last_reset_unpinned = pins->unpinned;
	snprintf(w->last_reset, sizeof w->last_reset, "%s", cause);
	w->info = w->dev.info;
	w->healthy = rc == 0;
	w->needs_restart = rc != 0 && w->dev.needs_restart;
	if (rc != 0)
		snprintf(w->health, sizeof w->health, "reset after %.250s failed: %.250s", cause,
			 err->message);
	else
		snprintf(w->health, sizeof w->health, "ok");
	pthread_mutex_unlock(&w->lock);
	atomic_fetch_add(&w->resets_done, 1);
	worker_wake_main(w);
	return rc;
}

/*
 * Resets the device and opens it again, trying again, pausing between
 * tries, for up to RESET_RETRY_S when a step fails. Not when the backend
 * says that only a new process recovers the device (needs_restart: the
 * driver refuses this process a context; seen for 15 s and more on an
 * H200, so waiting does not help). Blocking is fine here: nothing is in
 * flight on the device.
 */
#define RESET_RETRY_S 5.0

static int reset_and_open(struct device *dev, struct gpuq_error *err)
{
	double start = monotonic_seconds(), pause = 0.05;
	for (unsigned tries = 1;; tries++) {
		gpuq_error_clear(err);
		int rc = dev->ops->device.reset(dev, err);
		if (rc == 0) {
			dev->faulted = dev->lost = false;
			dev->fault_reason[0] = '\0';
			rc = dev->ops->device.open(dev, err);
		}
		if (rc == 0 || dev->needs_restart || monotonic_seconds() - start + pause > RESET_RETRY_S) {
			if (rc != 0) {
				size_t used = strlen(err->message);
				snprintf(err->message + used, sizeof err->message - used,
					 " (%u tries over %.1f s)", tries, monotonic_seconds() - start);
			}
			return rc;
		}
		struct timespec ts = { (time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9) };
		nanosleep(&ts, NULL);
		pause = pause * 2 < 2.0 ? pause * 2 : 2.0;
	}
}

void device_close_kept(struct device *dev)
{
	slab_kept_close(dev->kept);
	dev->kept = NULL;
}

int device_reset_run(struct worker *w, struct sched *s)
{
	struct device *dev = &w->dev;
	struct gpuq_error err;
	char cause[300];
	double t0 = monotonic_seconds();
	reset_cause(w, cause, sizeof cause);
	pthread_mutex_lock(&w->lock);
	bool asked = w->reset_asked;
	if (reset_give_up(w, t0, cause)) {
		pthread_mutex_unlock(&w->lock);
		fail_queued_with_buffers(w, cause);
		return -1;
	}
	w->healthy = false;
	device_reset_health(w->health, sizeof w->health, cause);
	pthread_mutex_unlock(&w->lock);
	fail_queued_with_buffers(w, cause);
	sched_drop_lanes(s);
	/* What is pinned goes with the context: kept mappings are made afresh, regions pinned again. */
	map_cache_drop(dev, dev->config.copy_pool);
	region_pin_release(dev);
	if (!dev->lost)
		dev->ops->device.close(dev); /* skips the device itself where it faulted */
	int rc = reset_and_open(dev, &err);
	struct reset_pins pins = { 0, 0 };
	if (rc == 0)
		region_pin_restore(dev, &pins.regions, &pins.unpinned);
	if (rc == 0 || !dev->needs_restart)
		device_close_kept(dev); /* no re-exec will take the faulted context's buffers */
	if (rc != 0) { /* no context: every job is refused until an operator asks again */
		dev->faulted = dev->lost = true;
		snprintf(dev->fault_reason, sizeof dev->fault_reason, "the reset failed: %.200s",
			 err.message);
	}
	dev->sched = s;
	return reset_publish(w, rc, &err, cause, t0, asked, &pins);
}

void device_reset_health(char *health, size_t size, const char *cause)
{
	snprintf(health, size, "being reset after %.300s", cause);
}
