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
 * a cancel or sched_notify (a copy thread, another device's part) wakes it.
 *
 * Threads: everything here runs on the device's worker thread, except
 * sched_notify and sched_stats (any thread; the latter under the worker's
 * lock). The queues are the worker's lock's (worker.h).
 */
#include "workers/sched/sched.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workers/clock.h"
#include "workers/backend/device_reset.h"
#include "workers/sched/fiber.h"
#include "workers/worker.h"

/* How often a sleeping scheduler looks again at its host waits anyway (deadlines, cancels). */
#define SCHED_HOST_RECHECK_S 0.01
/* A job polling in place for something no predicate says (sched_pause): pause this many times between looks. */
#define SCHED_SPIN_PAUSES 32
/* Spinning on device waits: give up the CPU every so many rounds. */
#define SCHED_SPIN_YIELD_EVERY 64
/*
 * The gap between two looks at what a job waits for on the device: half the
 * time waited so far, within these bounds. Each look is a call into the
 * driver (cudaEventQuery); a long wait, which has chunks queued behind it,
 * need not make one every microsecond, while a wait of a few microseconds
 * (a small collective) is still seen within one. (docs/ARCHITECTURE.md,
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
	uint64_t dma_turns; /* turns taken, numbering them */
	double shared_until; /* when more than one job was last in flight (monotonic seconds) */
	uint64_t memory_epoch;
	/* Waking from an idle sleep (sched_notify). */
	atomic_bool notified, sleeping;
	/* Engines in flight and their busy time; under the worker's lock. */
	unsigned by_engine[SCHED_ENGINES];
	double busy_since[SCHED_ENGINES], busy_total[SCHED_ENGINES];
};

static _Thread_local struct sched *self;

static int level_of(const struct work *w)
{
	return w->priority >= 0 && w->priority < GPUQ_PRIORITIES ? w->priority
								 : GPUQ_PRIORITY_NORMAL;
}

struct sched *sched_self(void)
{
	return self;
}

int sched_current_priority(void)
{
	if (!sched_in_job())
		return GPUQ_PRIORITY_NORMAL;
	return level_of(self->current->work);
}

bool sched_in_job(void)
{
	return self && self->current && fiber_current();
}

const char *sched_engine_name(enum sched_engine engine)
{
	static const char *const names[SCHED_ENGINES] = {
		[SCHED_ENGINE_H2D] = "h2d",       [SCHED_ENGINE_D2H] = "d2h",
		[SCHED_ENGINE_KERNEL] = "kernel", [SCHED_ENGINE_COPY] = "copy",
		[SCHED_ENGINE_COLLECTIVE] = "collective", [SCHED_ENGINE_OTHER] = "other",
	};
	return (unsigned)engine < SCHED_ENGINES ? names[engine] : "unknown";
}

enum sched_engine sched_engine_of(const struct work *work)
{
	static const enum sched_engine engines[WORK_KIND_COUNT] = {
#define WORK_KIND_ENGINE(kind, name, runner, engine, flags) [WORK_##kind] = SCHED_ENGINE_##engine,
		WORK_KINDS(WORK_KIND_ENGINE) /* workers/work_kinds.h */
#undef WORK_KIND_ENGINE
	};
	return (unsigned)work->kind < WORK_KIND_COUNT ? engines[work->kind] : SCHED_ENGINE_OTHER;
}

/* ---- creating and freeing ---- */

struct sched *sched_create(struct worker *w, unsigned max_inflight)
{
	struct sched *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->w = w;
	s->dev = &w->dev;
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
			dev->ops->event_destroy(dev, l->tail); /* the backends skip the device if it faulted */
			dev->ops->lane_destroy(dev, l->lane);
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
	if (dev->ops->lane_create(dev, priority, &l->lane, err) != 0) {
		free(l);
		return NULL;
	}
	if (dev->ops->event_create(dev, false, &l->tail, err) != 0) {
		dev->ops->lane_destroy(dev, l->lane);
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
	out->inflight = s->ninflight;
	out->max_inflight = s->max_inflight;
	for (int e = 0; e < SCHED_ENGINES; e++) {
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

/* Slots a job still holds when it ends (a path that failed between acquire and release). */
static bool slot_idle(void *arg);
static void slot_dma_clear(struct sched *s, unsigned slot);

static void reclaim_slots(struct sched *s, struct sched_job *j)
{
	struct device *dev = s->dev;
	for (unsigned i = 0; i < dev->config.staging_slots && j->slots_held; i++) {
		if (s->slot_holder[i] != j)
			continue;
		struct { struct device *dev; unsigned slot; } arg = { dev, i };
		if (!dev->faulted)
			sched_wait_device(slot_idle, &arg);
		slot_dma_clear(s, i);
		s->slot_holder[i] = NULL;
		s->slots_free++;
		j->slots_held--;
	}
	if (j->slot_user)
		s->slot_users--;
}

/* Everything after a work's end: the queues, the share, the counters, the main thread. */
static void job_retire(struct sched *s, struct work *work, double started, bool counted,
		       enum sched_engine engine)
{
	struct worker *w = s->w;
	double now = monotonic_seconds();
	worker_refresh_after(w, work);
	pthread_mutex_lock(&w->lock);
	if (counted) {
		sched_retire(&w->queues, work, started, now);
		engine_busy(s, engine, false, now);
	} else {
		sched_remove(&w->queues, work);
	}
	worker_account_locked(w, work);
	pthread_mutex_unlock(&w->lock);
	worker_hand_back(w, work);
}

static void job_finish(struct sched *s, struct sched_job *j)
{
	struct work *work = j->work;
	inflight_unlink(s, j);
	reclaim_slots(s, j);
	if (s->ninflight > 1)
		s->shared_until = monotonic_seconds();
	s->ninflight--;
	s->inflight_by_level[level_of(work)]--;
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
	return work->error.code != GPUQ_OK;
}

/* Makes the job's lane wait for the tail events of the earlier works it depends on. */
static int job_apply_deps(struct sched *s, struct sched_job *j, const struct sched_deps *deps)
{
	struct device *dev = s->dev;
	for (unsigned i = 0; i < deps->count; i++)
		if (dev->ops->event_wait(dev, deps->events[i], &j->work->error) != 0)
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
	j->lane = lane_take(s, level_of(work), &work->error);
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
	s->inflight_by_level[level_of(work)]++;
	inflight_insert(s, j);
	pthread_mutex_lock(&s->w->lock);
	engine_busy(s, j->engine, true, now);
	pthread_mutex_unlock(&s->w->lock);
}

/*
 * Admits what may start now, under the worker's lock, then starts it
 * outside. Returns whether anything started.
 */
static bool sched_admit(struct sched *s)
{
	struct worker *w = s->w;
	enum { BATCH = 16 };
	struct work *started[BATCH];
	struct sched_deps deps[BATCH];
	unsigned n = 0, room = s->nfree_jobs < BATCH ? s->nfree_jobs : BATCH;
	if (!atomic_load(&w->queues.dirty) || device_reset_due(w))
		return false; /* a reset first waits for the jobs in flight to end */
	pthread_mutex_lock(&w->lock);
	atomic_store(&w->queues.dirty, false);
	struct sched_load load = { .inflight = s->ninflight, .max_inflight = s->max_inflight };
	memcpy(load.inflight_by_level, s->inflight_by_level, sizeof load.inflight_by_level);
	double now = monotonic_seconds();
	while (n < room) {
		struct work *work = sched_pick(&w->queues, &load, &deps[n], now);
		if (!work)
			break;
		sched_admit_work(&w->queues, work, now);
		w->depth--;
		load.inflight++;
		load.inflight_by_level[level_of(work)]++;
		started[n++] = work;
	}
	if (n == room && w->queues.queued)
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
		int level = level_of(j->work);
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

static struct timespec deadline_after(double seconds)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	double ns = (double)t.tv_nsec + seconds * 1e9;
	t.tv_sec += (time_t)(ns / 1e9);
	t.tv_nsec = (long)(ns - (double)(time_t)(ns / 1e9) * 1e9);
	return t;
}

/* Whether the loop is over: told to stop, nothing queued, nothing in flight. Under the lock. */
static bool sched_done(const struct sched *s)
{
	return s->w->stopping && s->w->queues.queued == 0 && s->ninflight == 0;
}

/* How long to wait before the next look at a device wait that has lasted `waited` seconds. */
static double poll_gap(double waited)
{
	double gap = waited / 2;
	return gap < SCHED_POLL_MIN_S ? SCHED_POLL_MIN_S : gap > SCHED_POLL_MAX_S ? SCHED_POLL_MAX_S : gap;
}

/* Spins until `until` (monotonic seconds), pausing between looks at the clock. */
static void spin_until(double until)
{
	do {
		for (int i = 0; i < 8; i++)
			__builtin_ia32_pause();
	} while (monotonic_seconds() < until);
}

/*
 * Polling for the device: waits the gap for how long the scheduler has
 * been idle (since `idle_since`), and now and then gives the CPU to others.
 */
static void idle_spin(double idle_since, unsigned *rounds)
{
	double now = monotonic_seconds();
	spin_until(now + poll_gap(now - idle_since));
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
	struct timespec until = s->ninflight ? deadline_after(idle_timeout(s)) : (struct timespec){ 0 };
	pthread_mutex_lock(&w->lock);
	atomic_store(&s->sleeping, true);
	bool done;
	while (!(done = sched_done(s)) && !atomic_load(&s->notified) &&
	       !atomic_load(&w->queues.dirty) && !(w->stopping && s->ninflight == 0)) {
		if (s->ninflight == 0) {
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
	self = s;
	for (;;) {
		bool device_waits = false;
		if (s->ninflight == 0 && device_reset_due(w))
			device_reset_run(w, s);
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
		if (idle_sleep(s))
			break;
	}
	self = NULL;
}

void sched_notify_locked(struct sched *s)
{
	if (!s)
		return;
	atomic_store(&s->notified, true);
	pthread_cond_signal(&s->w->wake);
}

void sched_notify(struct sched *s)
{
	if (!s)
		return;
	atomic_store(&s->notified, true);
	if (atomic_load(&s->sleeping)) {
		pthread_mutex_lock(&s->w->lock);
		pthread_cond_signal(&s->w->wake);
		pthread_mutex_unlock(&s->w->lock);
	}
}

/* ---- waiting, from a job ---- */

/* Outside a job: poll ready on this thread, spinning first, then sleeping in growing steps. */
static void poll_until(bool (*ready)(void *arg), void *arg)
{
	unsigned rounds = 0;
	long sleep_ns = 1000;
	while (!ready(arg)) {
		if (++rounds < 1000) {
			__builtin_ia32_pause();
			continue;
		}
		struct timespec t = { 0, sleep_ns };
		nanosleep(&t, NULL);
		if (sleep_ns < 1000000)
			sleep_ns *= 2;
	}
}

/*
 * Whether the running job is the device's only business: nothing else in
 * flight, nothing queued that might start. Then a wait for the device
 * polls on the job's own stack: a switch to the scheduler and back costs
 * two system calls (the signal mask), which a collective's end would wait
 * for on every poll.
 */
static bool job_alone(const struct sched *s)
{
	return s->ninflight == 1 && !atomic_load(&s->w->queues.dirty) &&
	       !atomic_load(&s->notified) && !device_reset_due(s->w);
}

static void wait_until(bool (*ready)(void *arg), void *arg, bool device, enum sched_wait why)
{
	if (ready(arg))
		return;
	if (!sched_in_job()) {
		poll_until(ready, arg);
		return;
	}
	if (device && !self->dev->ops->completions_notify) {
		double start = monotonic_seconds();
		while (job_alone(self)) {
			double now = monotonic_seconds();
			spin_until(now + poll_gap(now - start));
			if (ready(arg))
				return;
		}
	}
	struct sched_job *j = self->current;
	if (why != SCHED_NOT_WAITING)
		atomic_store(&j->work->waiting, why);
	j->ready = ready;
	j->ready_arg = arg;
	j->device_wait = device && !self->dev->ops->completions_notify;
	fiber_yield();
	if (why != SCHED_NOT_WAITING)
		atomic_store(&j->work->waiting, SCHED_NOT_WAITING);
}

void sched_wait_device(bool (*ready)(void *arg), void *arg)
{
	wait_until(ready, arg, true, SCHED_NOT_WAITING);
}

void sched_wait_host(bool (*ready)(void *arg), void *arg, enum sched_wait why)
{
	wait_until(ready, arg, false, why);
}

static bool sleep_over(void *arg)
{
	return monotonic_seconds() >= *(const double *)arg;
}

void sched_sleep(double seconds)
{
	double until = monotonic_seconds() + seconds;
	if (!sched_in_job()) {
		struct timespec t = { (time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9) };
		nanosleep(&t, NULL);
		return;
	}
	self->current->wake_at = until;
	sched_wait_host(sleep_over, &until, SCHED_NOT_WAITING);
	self->current->wake_at = 0;
}

void sched_checkpoint(void)
{
	if (sched_in_job())
		fiber_yield();
}

void sched_pause(void)
{
	if (!sched_in_job()) {
		sched_yield();
		return;
	}
	if (job_alone(self) && !self->dev->ops->completions_notify) { /* as wait_until: poll in place */
		for (int i = 0; i < SCHED_SPIN_PAUSES; i++)
			__builtin_ia32_pause();
		return;
	}
	self->current->paused = true;
	fiber_yield();
}

struct sched_job *sched_running_job(struct device *dev)
{
	struct sched *s = dev->sched;
	return s && sched_in_job() && s == self ? s->current : NULL;
}

void sched_publish_tail(struct device *dev)
{
	struct sched_job *j = sched_running_job(dev);
	if (!j)
		return;
	struct sched *s = j->s;
	struct work *work = j->work;
	if (work->sched_state != SCHED_WORK_ADMITTED || !sched_work_lane_ordered(work))
		return;
	struct gpuq_error ignored;
	if (dev->ops->event_record(dev, j->lane->tail, &ignored) != 0)
		return; /* later works then wait for the end instead */
	pthread_mutex_lock(&s->w->lock);
	work->tail_event = j->lane->tail;
	sched_mark_tail(&s->w->queues, work);
	pthread_mutex_unlock(&s->w->lock);
}

/* ---- staging slots ---- */

static bool slot_idle(void *arg)
{
	struct { struct device *dev; unsigned slot; } *a = arg;
	bool ready = true;
	struct gpuq_error ignored;
	if (a->dev->ops->slot_ready(a->dev, a->slot, &ready, &ignored) != 0)
		return true; /* a fault: nothing more will run */
	return ready;
}

/* A job's fair part of the ring while others use it too. */
static unsigned slot_share(const struct sched *s)
{
	unsigned users = s->slot_users ? s->slot_users : 1;
	unsigned share = s->dev->config.staging_slots / users;
	return share ? share : 1;
}

/*
 * Whether job a goes before job b for a staging slot or a DMA turn: -1 if
 * so, 1 if b goes first, 0 if neither by priority. Within a priority the
 * callers take turns (fewer slots held, the earlier last turn): a job that
 * has had none yet, a short one just come, goes next, and every job in
 * flight keeps moving, so owners get the shares admission gave them. (An
 * order by bytes left, tried first, let the jobs nearest their end take
 * every turn: one owner's backlog then moved 98 % of the bytes.)
 */
static int job_claim_order(const struct sched_job *a, const struct sched_job *b)
{
	if (a->work->priority != b->work->priority)
		return a->work->priority < b->work->priority ? -1 : 1;
	return 0;
}

/* Whether another job has the better claim to the next free slot. */
static bool slot_outranked(const struct sched *s, const struct sched_job *j)
{
	for (const struct sched_job *o = s->inflight; o; o = o->next) {
		if (o == j || !o->slot_waiting || o->slots_held >= slot_share(s))
			continue;
		int order = job_claim_order(o, j);
		if (order < 0 || (order == 0 && o->slots_held < j->slots_held))
			return true;
	}
	return false;
}

static bool slot_takeable(void *arg)
{
	struct sched_job *j = arg;
	const struct sched *s = j->s;
	return s->slots_free > 0 && (j->slots_held < slot_share(s) || s->slot_users == 1) &&
	       !slot_outranked(s, j);
}

int sched_slot_acquire(struct device *dev, bool wait, unsigned *slot)
{
	struct sched *s = dev->sched;
	struct sched_job *j = sched_running_job(dev);
	if (!j) /* outside a job: the device is otherwise idle (open, tests) */
		return -1;
	if (!j->slot_user) {
		j->slot_user = true;
		s->slot_users++;
	}
	if (!slot_takeable(j)) {
		if (!wait)
			return -1;
		j->slot_waiting = true;
		sched_wait_host(slot_takeable, j, SCHED_WAIT_SLOTS);
		j->slot_waiting = false;
	}
	for (unsigned i = 0; i < dev->config.staging_slots; i++) {
		if (s->slot_holder[i])
			continue;
		s->slot_holder[i] = j;
		s->slots_free--;
		j->slots_held++;
		*slot = i;
		return 0;
	}
	return -1; /* slots_free said otherwise: a bug, but refuse rather than share */
}

void sched_slot_release(struct device *dev, unsigned slot)
{
	struct sched *s = dev->sched;
	if (!s || slot >= dev->config.staging_slots || !s->slot_holder[slot])
		return;
	slot_dma_clear(s, slot);
	s->slot_holder[slot]->slots_held--;
	s->slot_holder[slot] = NULL;
	s->slots_free++;
}

/* ---- DMA turns ---- */

static void slot_dma_clear(struct sched *s, unsigned slot)
{
	if (s->slot_dma[slot]) {
		s->dma_queued[s->slot_dma[slot] - 1]--;
		s->slot_dma[slot] = 0;
	}
}

/* Forgets the queued DMAs of dir that are done; returns how many of them job still has queued. */
static unsigned dma_refresh(struct sched *s, const struct sched_job *job, enum sched_dma dir)
{
	struct device *dev = s->dev;
	unsigned mine = 0, seen = 0;
	for (unsigned i = 0; i < dev->config.staging_slots && seen < s->dma_queued[dir]; i++) {
		if (s->slot_dma[i] != dir + 1)
			continue;
		struct { struct device *dev; unsigned slot; } arg = { dev, i };
		if (slot_idle(&arg)) {
			slot_dma_clear(s, i);
			continue;
		}
		seen++;
		mine += s->slot_holder[i] == job;
	}
	return mine;
}

/* Whether another job waiting for a turn in dir goes before job (then: whichever had its last turn earlier). */
static bool dma_outranked(const struct sched *s, const struct sched_job *job, enum sched_dma dir)
{
	for (const struct sched_job *o = s->inflight; o; o = o->next) {
		if (o == job || !o->dma_waiting[dir])
			continue;
		int order = job_claim_order(o, job);
		if (order == 0)
			order = o->dma_last != job->dma_last ? (o->dma_last < job->dma_last ? -1 : 1)
							       : (o->work->seq < job->work->seq ? -1 : 1);
		if (order < 0)
			return true;
	}
	return false;
}

/* How many DMAs a direction may have queued now: more once one job has had the device to itself a while. */
static unsigned dma_queue_limit(const struct sched *s)
{
	if (s->ninflight > 1 || monotonic_seconds() - s->shared_until < SCHED_DMA_ALONE_S)
		return SCHED_DMA_QUEUE;
	return SCHED_DMA_QUEUE_ALONE;
}

bool sched_dma_turn(struct sched_job *job, enum sched_dma dir)
{
	if (!job)
		return true;
	struct sched *s = job->s;
	unsigned mine = dma_refresh(s, job, dir);
	bool others = s->dma_queued[dir] > mine;
	if (s->dma_queued[dir] >= dma_queue_limit(s) || (others && mine > 0) ||
	    dma_outranked(s, job, dir)) {
		job->dma_waiting[dir] = true;
		return false;
	}
	return true;
}

void sched_dma_queued(struct sched_job *job, unsigned slot, enum sched_dma dir)
{
	if (!job || slot >= job->s->dev->config.staging_slots)
		return;
	struct sched *s = job->s;
	slot_dma_clear(s, slot);
	s->slot_dma[slot] = (unsigned char)(dir + 1);
	s->dma_queued[dir]++;
	job->dma_waiting[dir] = false;
	job->dma_last = ++s->dma_turns;
}

void sched_dma_leave(struct sched_job *job)
{
	if (job)
		memset(job->dma_waiting, 0, sizeof job->dma_waiting);
}

/* ---- memory ---- */

void sched_memory_released(struct device *dev)
{
	if (dev->sched)
		dev->sched->memory_epoch++;
}

uint64_t sched_memory_epoch(struct device *dev)
{
	return dev->sched ? dev->sched->memory_epoch : 0;
}
