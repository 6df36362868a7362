/* The rendezvous of a gang's parts (see peer_sync.h). Any worker thread. */
#include "workers/copy/peer_sync.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "workers/clock.h"
#include "workers/sched/sched_wait.h"

int peer_sync_init(struct peer_sync *s, struct work *const *parts, int nparts,
		   unsigned timeout_ms)
{
	pthread_condattr_t attr;
	memset(s, 0, sizeof *s);
	if (nparts < 1 || nparts > PEER_SYNC_MAX_PARTS)
		return -1;
	for (int i = 0; i < nparts; i++)
		s->parts[i] = parts[i];
	s->nparts = nparts;
	s->timeout_ms = timeout_ms;
	s->failed_part = -1;
	atomic_init(&s->abort, false);
	if (pthread_condattr_init(&attr) != 0)
		return -1;
	/* Deadlines on the monotonic clock: immune to wall-clock steps. */
	int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	if (rc == 0)
		rc = pthread_cond_init(&s->changed, &attr);
	pthread_condattr_destroy(&attr);
	if (rc != 0)
		return -1;
	if (pthread_mutex_init(&s->lock, NULL) != 0) {
		pthread_cond_destroy(&s->changed);
		return -1;
	}
	return 0;
}

void peer_sync_destroy(struct peer_sync *s)
{
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->changed);
}

void peer_sync_lock(struct peer_sync *s)
{
	pthread_mutex_lock(&s->lock);
}

void peer_sync_unlock(struct peer_sync *s)
{
	pthread_mutex_unlock(&s->lock);
}

void peer_sync_changed(struct peer_sync *s)
{
	atomic_fetch_add(&s->generation, 1);
	pthread_cond_broadcast(&s->changed);
	for (int i = 0; i < s->nparts; i++) /* parts that wait on a scheduler rather than the condvar */
		sched_notify(atomic_load(&s->parts[i]->sched));
}

void peer_sync_fail(struct peer_sync *s, int self)
{
	pthread_mutex_lock(&s->lock);
	if (s->failed_part < 0)
		s->failed_part = self;
	atomic_store(&s->abort, true);
	peer_sync_changed(s);
	pthread_mutex_unlock(&s->lock);
}

void peer_sync_leave(struct peer_sync *s, int self)
{
	pthread_mutex_lock(&s->lock);
	s->left[self] = true;
	peer_sync_changed(s);
	pthread_mutex_unlock(&s->lock);
}

/* Whether part i has ended or left; the lock is held. */
static bool part_gone(const struct peer_sync *s, int i)
{
	return s->left[i] || atomic_load(&s->parts[i]->phase) == WORK_FINISHED;
}

static int device_of(const struct peer_sync *s, int part)
{
	return part >= 0 && part < s->nparts ? s->parts[part]->device : -1;
}

/* The reasons to stop that do not depend on what is awaited; the lock is held. */
static int check_locked(struct peer_sync *s, int self, const char *what, struct gpuq_error *err)
{
	int me = device_of(s, self);
	if (atomic_load(&s->parts[self]->cancel))
		return gpuq_fail(err, GPUQ_E_CANCELLED, "job cancelled%s%s (gpu %d's part)",
				 what ? " while waiting for " : "", what ? what : "", me);
	if (atomic_load(&s->abort))
		return gpuq_fail(err, GPUQ_E_CANCELLED,
				 "stopped on gpu %d because gpu %d's part of this job failed", me,
				 device_of(s, s->failed_part));
	return 0;
}

int peer_sync_check(struct peer_sync *s, int self, struct gpuq_error *err)
{
	if (!atomic_load(&s->parts[self]->cancel) && !atomic_load(&s->abort))
		return 0; /* the common case, without the lock */
	pthread_mutex_lock(&s->lock);
	int rc = check_locked(s, self, NULL, err);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* A part that has ended can no longer provide anything; the lock is held. */
static int check_ended(struct peer_sync *s, int self, const char *what, struct gpuq_error *err)
{
	for (int i = 0; i < s->nparts; i++) {
		if (i == self || !part_gone(s, i))
			continue;
		/* Its error is final once its work has ended (the phase is stored after it). */
		bool ended = atomic_load(&s->parts[i]->phase) == WORK_FINISHED;
		const struct gpuq_error *theirs = &s->parts[i]->error;
		bool said = ended && theirs->code != GPUQ_OK;
		return gpuq_fail(err, GPUQ_E_CANCELLED,
				 "gpu %d's part of this job ended before gpu %d got %s%s%s%s",
				 device_of(s, i), device_of(s, self), what, said ? " (it said: " : "",
				 said ? theirs->message : "", said ? ")" : "");
	}
	return 0;
}

/* Whether every part but self has ended; the lock is held. */
static bool others_ended(const struct peer_sync *s, int self)
{
	for (int i = 0; i < s->nparts; i++)
		if (i != self && !part_gone(s, i))
			return false;
	return true;
}

/* A job's view of the rendezvous while it yields (sched.h): what ends its wait. */
struct peer_yield {
	struct peer_sync *s;
	unsigned generation;
	const struct work *part;
	double until;
};

static bool peer_yield_over(void *arg)
{
	const struct peer_yield *y = arg;
	return atomic_load(&y->s->generation) != y->generation || atomic_load(&y->s->abort) ||
	       atomic_load(&y->part->cancel) || monotonic_seconds() >= y->until;
}

/*
 * Waits for the next change, at most `seconds`, with the lock held on
 * entry and exit: a part running as a job yields to its device's
 * scheduler (which other parts notify); anything else sleeps on the
 * condition variable.
 */
static int wait_change(struct peer_sync *s, int self, double seconds, struct gpuq_error *err)
{
	if (sched_in_job()) {
		struct peer_yield y = { s, atomic_load(&s->generation), s->parts[self],
					monotonic_seconds() + seconds };
		pthread_mutex_unlock(&s->lock);
		sched_wait_host(peer_yield_over, &y, SCHED_WAIT_PEERS);
		pthread_mutex_lock(&s->lock);
		return 0;
	}
	struct timespec until = deadline_after(CLOCK_MONOTONIC, seconds);
	int rc = pthread_cond_timedwait(&s->changed, &s->lock, &until);
	if (rc != 0 && rc != ETIMEDOUT && rc != EINTR)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "pthread_cond_timedwait: %s", strerror(rc));
	return 0;
}

static int wait_until(struct peer_sync *s, int self, bool (*ready)(void *arg), void *arg,
		      const char *what, bool stoppable, struct gpuq_error *err)
{
	double deadline = monotonic_seconds() + s->timeout_ms / 1e3;
	for (;;) {
		if (ready(arg))
			return 0;
		if (stoppable &&
		    (check_locked(s, self, what, err) < 0 || check_ended(s, self, what, err) < 0))
			return -1;
		if (!stoppable && others_ended(s, self))
			return gpuq_fail(err, GPUQ_E_CANCELLED, "the other parts ended first");
		double left = deadline - monotonic_seconds();
		if (left <= 0)
			return gpuq_fail(err, GPUQ_E_TIMEOUT,
					 "gpu %d waited %u ms for %s in vain (the other part may be "
					 "queued behind long jobs; peer_timeout_ms sets the limit)",
					 device_of(s, self), s->timeout_ms, what);
		double slice = PEER_SYNC_POLL_MS / 1e3;
		if (wait_change(s, self, left < slice ? left : slice, err) < 0)
			return -1;
	}
}

int peer_sync_wait(struct peer_sync *s, int self, bool (*ready)(void *arg), void *arg,
		   const char *what, struct gpuq_error *err)
{
	return wait_until(s, self, ready, arg, what, true, err);
}

int peer_sync_wait_cleanup(struct peer_sync *s, int self, bool (*ready)(void *arg), void *arg,
			   const char *what, struct gpuq_error *err)
{
	return wait_until(s, self, ready, arg, what, false, err);
}

struct barrier_arg {
	struct peer_sync *s;
	unsigned generation;
};

static bool barrier_passed(void *arg)
{
	struct barrier_arg *b = arg;
	return b->s->barrier_generation != b->generation;
}

int peer_sync_barrier(struct peer_sync *s, int self, struct gpuq_error *err)
{
	pthread_mutex_lock(&s->lock);
	struct barrier_arg b = { s, s->barrier_generation };
	if (++s->barrier_count == (unsigned)s->nparts) {
		s->barrier_count = 0;
		s->barrier_generation++;
		peer_sync_changed(s);
	}
	int rc = peer_sync_wait(s, self, barrier_passed, &b, "the other parts at a barrier", err);
	pthread_mutex_unlock(&s->lock);
	return rc;
}
