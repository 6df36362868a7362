/*
 * The per-GPU scheduler (see sched.h): the worker thread's loop that admits
 * queued works, runs each on a fiber with a lane of its own, and resumes
 * them as what they wait for becomes ready.
 *
 * One round of the loop: admit what may start (sched_queue.c decides), then
 * resume, in priority and submission order, every job whose predicate holds.
 * A round in which nothing moved ends in an idle wait: polling while some
 * job waits for the device (its events complete without telling anyone),
 * sleeping on the worker's condition variable otherwise, until a submission,
 * a cancel or sched_notify (a copy thread, another device's part) wakes it,
 * or, with no job in flight, until the worker's housekeeping falls due
 * (releasing kept mappings: the hooks' idle_due and idle_run).
 *
 * What a job may call while it runs (waits, slots, DMA turns) is in
 * sched_wait.c, below this file: the loop calls into it (to bind the
 * thread's scheduler, to reclaim a finished job's slots), never the other
 * way. The state both share is sched_state.h's. The worker above calls
 * this file; this file calls the worker back (retiring a work, resetting
 * the device, housekeeping) only through the hooks it was made with
 * (sched_hooks.h).
 *
 * Threads: everything here runs on the device's worker thread, except
 * sched_stats (any thread, under the worker's lock). The queues are the
 * worker's lock's (worker.h).
 */
#include "workers/sched/sched.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workers/clock.h"
#include "workers/sched/fiber.h"
#include "workers/sched/sched_state.h"
#include "workers/worker.h"

/* How often a sleeping scheduler looks again at its host waits anyway (deadlines, cancels). */
#define SCHED_HOST_RECHECK_S 0.01
/* Spinning on device waits: give up the CPU every so many rounds. */
#define SCHED_SPIN_YIELD_EVERY 64

/* ---- creating and freeing ---- */

struct sched *sched_create(struct worker *w, const struct sched_hooks *hooks,
			   unsigned max_inflight)
{
	struct sched *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->w = w;
	s->dev = &w->dev;
	s->lock = &w->lock;
	s->wake = &w->wake;
	s->queues = &w->queues;
	s->hooks = *hooks;
	s->max_inflight = max_inflight ? max_inflight : SCHED_DEFAULT_INFLIGHT;
	unsigned records = 2 * s->max_inflight;
	s->jobs = calloc(records, sizeof *s->jobs);
	s->free_fibers = calloc(records, sizeof *s->free_fibers);
	if (!s->jobs || !s->free_fibers) {
		free(s->jobs);
		free(s->free_fibers);
		free(s);
		return NULL;
	}
	for (unsigned i = 0; i < records; i++) {
		s->jobs[i].s = s;
		s->jobs[i].next = s->free_jobs;
		s->free_jobs = &s->jobs[i];
	}
	s->nfree_jobs = records;
	s->slots_free = s->dev->config.staging_slots;
	s->dev->sched = s;
	return s;
}

void sched_drop_lanes(struct sched *s)
{
	struct device *dev = s->dev;
	for (int p = 0; p < GPUQ_PRIORITIES; p++) {
		while (s->free_lanes[p]) {
			struct sched_lane *l = s->free_lanes[p];
			s->free_lanes[p] = l->next;
			dev->ops->events.destroy(dev, l->tail); /* the backends skip the device if it faulted */
			dev->ops->events.lane_destroy(dev, l->lane);
			free(l);
		}
	}
}

void sched_release(struct sched *s)
{
	if (!s)
		return;
	struct device *dev = s->dev;
	sched_drop_lanes(s);
	for (unsigned i = 0; i < s->nfree_fibers; i++)
		fiber_destroy(s->free_fibers[i]);
	s->nfree_fibers = 0;
	dev->sched = NULL;
	dev->lane = NULL;
}

void sched_free(struct sched *s)
{
	if (!s)
		return;
	free(s->free_fibers);
	free(s->jobs);
	free(s);
}

/* ---- lanes and fibers, kept between jobs ---- */

static struct sched_lane *lane_take(struct sched *s, int priority, struct gpuq_error *err)
{
	struct sched_lane *l = s->free_lanes[priority];
	if (l) {
		s->free_lanes[priority] = l->next;
		return l;
	}
	struct device *dev = s->dev;
	l = calloc(1, sizeof *l);
	if (!l) {
		gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory for a lane", dev->index);
		return NULL;
	}
	l->priority = priority;
	if (dev->ops->events.lane_create(dev, priority, &l->lane, err) != 0) {
		free(l);
		return NULL;
	}
	if (dev->ops->events.create(dev, false, &l->tail, err) != 0) {
		dev->ops->events.lane_destroy(dev, l->lane);
		free(l);
		return NULL;
	}
	return l;
}

static void lane_give_back(struct sched *s, struct sched_lane *l)
{
	l->next = s->free_lanes[l->priority];
	s->free_lanes[l->priority] = l;
}

static void job_fiber_main(void *arg)
{
	struct sched_job *j = arg;
	run_work(j->s->dev, j->work);
}

static struct fiber *fiber_take(struct sched *s, struct sched_job *j)
{
	if (s->nfree_fibers) {
		struct fiber *f = s->free_fibers[--s->nfree_fibers];
		fiber_restart(f, job_fiber_main, j);
		return f;
	}
	return fiber_create(job_fiber_main, j, 0);
}

/* ---- accounting under the worker's lock ---- */

static void engine_busy(struct sched *s, enum sched_engine e, bool start, double now)
{
	if (start && s->by_engine[e]++ == 0)
		s->busy_since[e] = now;
	if (!start && --s->by_engine[e] == 0)
		s->busy_total[e] += now - s->busy_since[e];
}

void sched_stats(struct sched *s, struct sched_stats *out)
{
	double now = monotonic_seconds();
	memset(out, 0, sizeof *out);
	if (!s)
		return;
	/*
	 * Each job in flight keeps exactly one engine busy, so the engines'
	 * counts, kept under the worker's lock that the caller holds, add up
	 * to the jobs in flight; ninflight itself is the worker thread's alone.
	 */
	out->inflight = 0;
	out->max_inflight = s->max_inflight;
	for (int e = 0; e < SCHED_ENGINES; e++) {
		out->inflight += s->by_engine[e];
		out->inflight_by_engine[e] = s->by_engine[e];
		out->busy_seconds[e] = s->busy_total[e] + (s->by_engine[e] ? now - s->busy_since[e] : 0);
	}
}

/* ---- starting and finishing jobs ---- */

/* Inserts j among the jobs in flight: more urgent first, then earlier. */
static void inflight_insert(struct sched *s, struct sched_job *j)
{
	struct sched_job **link = &s->inflight;
	while (*link && ((*link)->work->priority < j->work->priority ||
			 ((*link)->work->priority == j->work->priority &&
			  (*link)->work->seq < j->work->seq)))
		link = &(*link)->next;
	j->next = *link;
	*link = j;
}

static void inflight_unlink(struct sched *s, struct sched_job *j)
{
	struct sched_job **link = &s->inflight;
	while (*link && *link != j)
		link = &(*link)->next;
	if (*link)
		*link = j->next;
	j->next = NULL;
}

/* Job records: 2 x max_inflight of them, kept on a free list. */
static struct sched_job *job_record_take(struct sched *s)
{
	struct sched_job *j = s->free_jobs;
	s->free_jobs = j->next;
	s->nfree_jobs--;
	memset(j, 0, sizeof *j);
	j->s = s;
	return j;
}

static void job_record_put(struct sched *s, struct sched_job *j)
{
	j->next = s->free_jobs;
	s->free_jobs = j;
	s->nfree_jobs++;
}

/* Everything after a work's end: the queues, the share, the counters, the main thread. */
static void job_retire(struct sched *s, struct work *work, double started, bool counted,
		       enum sched_engine engine)
{
	struct worker *w = s->w;
	double now = monotonic_seconds();
	s->hooks.refresh_after(w, work);
	pthread_mutex_lock(&w->lock);
	if (counted) {
		sched_retire(&w->queues, work, started, now);
		engine_busy(s, engine, false, now);
	} else {
		sched_remove(&w->queues, work);
	}
	s->hooks.account_locked(w, work);
	pthread_mutex_unlock(&w->lock);
	s->hooks.hand_back(w, work);
}

static void job_finish(struct sched *s, struct sched_job *j)
{
	struct work *work = j->work;
	inflight_unlink(s, j);
	sched_slots_reclaim(s, j);
	if (s->ninflight > 1)
		s->shared_until = monotonic_seconds();
	s->ninflight--;
	s->inflight_by_level[sched_level_of(work)]--;
	lane_give_back(s, j->lane);
	s->free_fibers[s->nfree_fibers++] = j->fiber;
	double started = j->started;
	enum sched_engine engine = j->engine;
	memset(j, 0, sizeof *j);
	j->s = s;
	job_record_put(s, j);
	job_retire(s, work, started, true, engine);
}

/* A work that ends before it starts: cancelled in time, or its device is unhealthy. */
static bool job_refused(struct sched *s, struct work *work)
{
	struct device *dev = s->dev;
	gpuq_error_clear(&work->error);
	if (atomic_load(&work->cancel))
		gpuq_fail(&work->error, GPUQ_E_CANCELLED, "job cancelled before it started");
	else if (dev->faulted)
		gpuq_fail(&work->error, GPUQ_E_NO_DEVICE, "device %d is unhealthy: %s", dev->index,
			  dev->fault_reason);
	else if (work->naccess > 0 && work->resets_known != dev->resets)
		gpuq_fail(&work->error, GPUQ_E_DEVICE_ERROR,
			  "the buffer memory the job names was lost when gpu %d was reset (the job "
			  "came in as the reset ended, before gpuqd had marked its buffers lost)",
			  dev->index);
	return work->error.code != GPUQ_OK;
}

/* Makes the job's lane wait for the tail events of the earlier works it depends on. */
static int job_apply_deps(struct sched *s, struct sched_job *j, const struct sched_deps *deps)
{
	struct device *dev = s->dev;
	for (unsigned i = 0; i < deps->count; i++)
		if (dev->ops->events.wait(dev, deps->events[i], &j->work->error) != 0)
			return -1;
	return 0;
}

/*
 * An attach admitted: every earlier work on its buffer that conflicts with
 * it has finished, so the lease takes the attach's place in the ledger
 * (unless the client went away meanwhile) and the attach ends at once.
 */
static void job_grant_lease(struct sched *s, struct work *work, double now)
{
	struct worker *w = s->w;
	pthread_mutex_lock(&w->lock);
	bool held = work->hold && sched_hold(&w->queues, work, work->hold);
	pthread_mutex_unlock(&w->lock);
	if (!held)
		gpuq_fail(&work->error, GPUQ_E_CANCELLED,
			  "the lease was dropped before it was granted (its connection closed)");
	job_retire(s, work, now, false, SCHED_ENGINE_OTHER);
}

/* Starts an admitted work: on a fiber with a lane, or at once for what never waits. */
static void job_start(struct sched *s, struct work *work, const struct sched_deps *deps)
{
	struct device *dev = s->dev;
	double now = monotonic_seconds();
	work->started_at = now;
	atomic_store(&work->sched, s);
	atomic_store(&work->phase, WORK_RUNNING);
	if (job_refused(s, work) || (work->kind == WORK_NOOP && deps->count == 0)) {
		job_retire(s, work, now, false, SCHED_ENGINE_OTHER);
		return;
	}
	if (work->kind == WORK_ATTACH) {
		job_grant_lease(s, work, now);
		return;
	}
	struct sched_job *j = job_record_take(s);
	j->work = work;
	j->started = now;
	j->engine = sched_engine_of(work);
	j->lane = lane_take(s, sched_level_of(work), &work->error);
	dev->lane = j->lane ? j->lane->lane : NULL;
	if (!j->lane || job_apply_deps(s, j, deps) != 0 || !(j->fiber = fiber_take(s, j))) {
		if (!j->fiber && work->error.code == GPUQ_OK)
			gpuq_fail(&work->error, GPUQ_E_OUT_OF_MEMORY,
				  "[gpu %d] cannot map a stack for the job: %s", dev->index,
				  strerror(errno));
		if (j->lane)
			lane_give_back(s, j->lane);
		dev->lane = NULL;
		job_record_put(s, j);
		job_retire(s, work, now, false, SCHED_ENGINE_OTHER);
		return;
	}
	dev->lane = NULL;
	s->ninflight++;
	s->inflight_by_level[sched_level_of(work)]++;
	inflight_insert(s, j);
	pthread_mutex_lock(&s->w->lock);
	engine_busy(s, j->engine, true, now);
	pthread_mutex_unlock(&s->w->lock);
}

/*
 * Admits what may start now, under the worker's lock, then starts it
 * outside. Returns whether anything started. sched_pick never lets more
 * than twice max_inflight be in flight, which is how many job records
 * there are, so it is asked even when every record is taken: then it
 * starts nothing and tells the work it would start why (inflight).
 */
static bool sched_admit(struct sched *s)
{
	struct worker *w = s->w;
	enum { BATCH = 16 };
	struct work *started[BATCH];
	struct sched_deps deps[BATCH];
	unsigned n = 0;
	if (!atomic_load(&w->queues.dirty) || s->hooks.reset_due(w))
		return false; /* a reset first waits for the jobs in flight to end */
	pthread_mutex_lock(&w->lock);
	atomic_store(&w->queues.dirty, false);
	struct sched_load load = { .inflight = s->ninflight, .max_inflight = s->max_inflight };
	memcpy(load.inflight_by_level, s->inflight_by_level, sizeof load.inflight_by_level);
	double now = monotonic_seconds();
	while (n < BATCH) {
		struct work *work = sched_pick(&w->queues, &load, &deps[n], now);
		if (!work)
			break;
		sched_admit_work(&w->queues, work, now);
		w->depth--;
		load.inflight++;
		load.inflight_by_level[sched_level_of(work)]++;
		started[n++] = work;
	}
	if (n == BATCH && w->queues.queued)
		atomic_store(&w->queues.dirty, true); /* look again next round */
	pthread_mutex_unlock(&w->lock);
	for (unsigned i = 0; i < n; i++)
		job_start(s, started[i], &deps[i]);
	return n > 0;
}

/* ---- running ---- */

/* Resumes j until it yields or ends; true when it did something. */
static bool job_resume(struct sched *s, struct sched_job *j, bool *device_waits)
{
	j->ready = NULL;
	j->paused = false;
	s->current = j;
	s->dev->lane = j->lane->lane;
	bool done = fiber_resume(j->fiber);
	s->current = NULL;
	s->dev->lane = NULL;
	if (done) {
		job_finish(s, j);
		return true;
	}
	if (j->paused)
		*device_waits = true; /* polling something no one announces */
	return !j->paused;
}

/*
 * Resumes every job whose wait is over, each once, in priority and
 * submission order; true when any did something. Once a job has run, a
 * more urgent one passed over as waiting is looked at again before the
 * rest: its wait may be over by now, and it should not wait for every less
 * urgent job in flight to take its turn first.
 */
static bool sched_round(struct sched *s, bool *device_waits)
{
	bool progress = false;
	uint64_t round = ++s->rounds;
	int passed_over = GPUQ_PRIORITIES; /* the most urgent level found waiting */
	*device_waits = false;
	/* Every predicate is looked at below: what was announced before now is seen. */
	atomic_store(&s->notified, false);
	struct sched_job *next;
	for (struct sched_job *j = s->inflight; j; j = next) {
		next = j->next;
		if (j->round == round)
			continue;
		int level = sched_level_of(j->work);
		if (j->ready && !j->ready(j->ready_arg)) {
			*device_waits = *device_waits || j->device_wait;
			passed_over = level < passed_over ? level : passed_over;
			continue;
		}
		j->round = round;
		progress = job_resume(s, j, device_waits) || progress;
		if (passed_over < level) {
			next = s->inflight;
			passed_over = GPUQ_PRIORITIES;
		}
	}
	return progress;
}

/* Whether the loop is over: told to stop, nothing queued, nothing in flight. Under the lock. */
static bool sched_done(const struct sched *s)
{
	return s->w->stopping && s->w->queues.queued == 0 && s->ninflight == 0;
}

/*
 * Polling for the device: waits the gap for how long the scheduler has
 * been idle (since `idle_since`), and now and then gives the CPU to others.
 */
static void idle_spin(double idle_since, unsigned *rounds)
{
	double now = monotonic_seconds();
	sched_spin_until(now + sched_poll_gap(now - idle_since));
	if (++*rounds % SCHED_SPIN_YIELD_EVERY == 0)
		sched_yield();
}

/* How long the scheduler may sleep: until the earliest sleeping job's deadline, at most the recheck. */
static double idle_timeout(const struct sched *s)
{
	double now = monotonic_seconds(), t = SCHED_HOST_RECHECK_S;
	for (const struct sched_job *j = s->inflight; j; j = j->next)
		if (j->wake_at > 0 && j->wake_at - now < t)
			t = j->wake_at - now;
	return t > 0 ? t : 0;
}

/* An idle worker's poll for new work, for spin_us: whether something came. */
static bool idle_spin_for_work(struct sched *s)
{
	struct worker *w = s->w;
	double end = monotonic_seconds() + w->pool->spin_us / 1e6;
	for (unsigned i = 1; !atomic_load(&w->queues.dirty) && !atomic_load(&s->notified); i++) {
		__builtin_ia32_pause();
		if (i % 64 == 0 && monotonic_seconds() > end)
			return false;
	}
	return true;
}

/* When the worker's housekeeping falls due (sched_hooks.h): seconds, negative for never. */
static double housekeeping_due(struct sched *s)
{
	return s->hooks.idle_due ? s->hooks.idle_due(s->w) : -1;
}

/* Runs the worker's housekeeping if it is due and no job is in flight; whether it ran. */
static bool housekeeping(struct sched *s)
{
	if (s->ninflight || housekeeping_due(s) != 0)
		return false;
	s->hooks.idle_run(s->w);
	return true;
}

/*
 * Nothing moved in the last round and nothing waits for the device: sleep
 * until a submission, a cancel or a notification, looking again at least
 * every SCHED_HOST_RECHECK_S while jobs are in flight. An idle worker first
 * polls for spin_us (a client's next request often comes at once). Returns
 * whether the loop is over (sched_done): this is the one place it looks,
 * under the lock it takes anyway to sleep.
 */
static bool idle_sleep(struct sched *s)
{
	struct worker *w = s->w;
	if (s->ninflight == 0 && w->pool->spin_us && idle_spin_for_work(s))
		return false; /* not the end: something was queued or announced */
	double chore = s->ninflight == 0 ? housekeeping_due(s) : -1;
	struct timespec until = s->ninflight ? deadline_after(CLOCK_MONOTONIC, idle_timeout(s))
			      : chore >= 0 ? deadline_after(CLOCK_MONOTONIC, chore)
					   : (struct timespec){ 0 };
	pthread_mutex_lock(&w->lock);
	atomic_store(&s->sleeping, true);
	bool done;
	while (!(done = sched_done(s)) && !atomic_load(&s->notified) &&
	       !atomic_load(&w->queues.dirty) && !(w->stopping && s->ninflight == 0)) {
		if (s->ninflight == 0 && chore < 0) {
			pthread_cond_wait(&w->wake, &w->lock);
		} else if (pthread_cond_timedwait(&w->wake, &w->lock, &until) == ETIMEDOUT) {
			break;
		}
	}
	atomic_store(&s->sleeping, false);
	atomic_store(&s->notified, false);
	pthread_mutex_unlock(&w->lock);
	return done;
}

void sched_run(struct sched *s)
{
	struct worker *w = s->w;
	unsigned spins = 0;
	double idle_since = 0; /* when the rounds stopped moving; 0 while they move */
	sched_wait_bind(s);
	for (;;) {
		bool device_waits = false;
		if (s->ninflight == 0 && s->hooks.reset_due(w))
			s->hooks.reset_run(w, s);
		bool progress = sched_admit(s);
		progress = sched_round(s, &device_waits) || progress;
		if (progress) {
			idle_since = 0;
			continue; /* a round that moved is followed by another: the end is seen there */
		}
		if (device_waits) { /* jobs in flight: not the end */
			if (idle_since == 0)
				idle_since = monotonic_seconds();
			idle_spin(idle_since, &spins);
			continue;
		}
		idle_since = 0;
		if (housekeeping(s))
			continue;
		if (idle_sleep(s))
			break;
	}
	sched_wait_bind(NULL);
}

