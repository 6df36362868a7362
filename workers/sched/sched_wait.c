/*
 * The waits a job may call (sched_wait.h): yielding its fiber until a
 * predicate holds, sleeping, pausing, staging slots, DMA turns, the memory
 * epoch, publishing its tail. The loop that resumes the jobs is sched.c;
 * nothing here calls it, or any job: these functions switch fibers
 * (fiber.h) and read and change the scheduler's state (sched_state.h),
 * and reach the worker only through what the loop copied there.
 *
 * A job waits by leaving its predicate in its record and yielding; the
 * loop evaluates the predicate between rounds and resumes the job once it
 * holds, so a waiting job costs no switch. A job that is the device's only
 * business polls a device wait on its own stack instead (job_alone).
 *
 * Threads: the device's worker thread (a job's fiber, or its own stack
 * outside jobs, where waits poll), except sched_notify and
 * sched_notify_locked (any thread; the latter with the worker's lock held).
 */
#include "workers/sched/sched_wait.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workers/clock.h"
#include "workers/sched/fiber.h"
#include "workers/sched/sched_state.h"

/* A job polling in place for something no predicate says (sched_pause): pause this many times between looks. */
#define SCHED_SPIN_PAUSES 32

static _Thread_local struct sched *self;

void sched_wait_bind(struct sched *s)
{
	self = s;
}

struct sched *sched_self(void)
{
	return self;
}

int sched_current_priority(void)
{
	if (!sched_in_job())
		return GPUQ_PRIORITY_NORMAL;
	return sched_level_of(self->current->work);
}

bool sched_in_job(void)
{
	return self && self->current && fiber_current();
}

/* ---- waking the loop, from any thread ---- */

void sched_notify_locked(struct sched *s)
{
	if (!s)
		return;
	atomic_store(&s->notified, true);
	pthread_cond_signal(s->wake);
}

void sched_notify(struct sched *s)
{
	if (!s)
		return;
	atomic_store(&s->notified, true);
	if (atomic_load(&s->sleeping)) {
		pthread_mutex_lock(s->lock);
		pthread_cond_signal(s->wake);
		pthread_mutex_unlock(s->lock);
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
	return s->ninflight == 1 && !atomic_load(&s->queues->dirty) &&
	       !atomic_load(&s->notified) && !s->hooks.reset_due(s->w);
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
			sched_spin_until(now + sched_poll_gap(now - start));
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

bool sched_alone(void)
{
	return sched_in_job() && job_alone(self);
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
	if (dev->ops->events.record(dev, j->lane->tail, &ignored) != 0)
		return; /* later works then wait for the end instead */
	pthread_mutex_lock(s->lock);
	work->tail_event = j->lane->tail;
	sched_mark_tail(s->queues, work);
	pthread_mutex_unlock(s->lock);
}

/* ---- staging slots ---- */

static void slot_dma_clear(struct sched *s, unsigned slot); /* DMA turns, below */

static bool slot_idle(void *arg)
{
	struct { struct device *dev; unsigned slot; } *a = arg;
	bool ready = true;
	struct gpuq_error ignored;
	if (a->dev->ops->copy.slot_ready(a->dev, a->slot, &ready, &ignored) != 0)
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

/* Whether the device is shared: more than one job in flight, or one was a moment ago. */
static bool dma_shared(const struct sched *s)
{
	return s->ninflight > 1 || monotonic_seconds() - s->shared_until < SCHED_DMA_ALONE_S;
}

/*
 * How many bytes a direction may have queued now: more once one job has had
 * the device to itself a while. Bytes, not DMAs: a region's DMA moves
 * several slots' worth, and what waits behind it is its bytes; and larger
 * slots do not make the queue longer in time than the default slots' does.
 */
static uint64_t dma_queue_limit(const struct sched *s)
{
	bool shared = dma_shared(s);
	uint64_t slots = shared ? SCHED_DMA_QUEUE : SCHED_DMA_QUEUE_ALONE;
	uint64_t most = shared ? SCHED_DMA_QUEUE_MAX_BYTES : SCHED_DMA_QUEUE_ALONE_MAX_BYTES;
	uint64_t bytes = slots * s->dev->config.staging_slot_bytes;
	return bytes < most ? bytes : most;
}

bool sched_dma_turn(struct sched_job *job, enum sched_dma dir)
{
	if (!job)
		return true;
	struct sched *s = job->s;
	uint64_t slot_bytes = s->dev->config.staging_slot_bytes;
	uint64_t mine = dma_refresh(s, job, dir) * slot_bytes + job->dma_own[dir];
	uint64_t queued = s->dma_queued[dir] * slot_bytes + s->dma_own[dir];
	bool others = queued > mine;
	if (queued >= dma_queue_limit(s) || (others && mine > 0) || dma_outranked(s, job, dir)) {
		job->dma_waiting[dir] = true;
		return false;
	}
	return true;
}

bool sched_dma_alone(const struct sched_job *job)
{
	return !job || !dma_shared(job->s);
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

void sched_dma_own(struct sched_job *job, enum sched_dma dir, uint64_t bytes)
{
	if (!job)
		return;
	struct sched *s = job->s;
	if (bytes > job->dma_own[dir]) { /* a turn taken */
		job->dma_waiting[dir] = false;
		job->dma_last = ++s->dma_turns;
	}
	s->dma_own[dir] = s->dma_own[dir] - job->dma_own[dir] + bytes;
	job->dma_own[dir] = bytes;
}

void sched_dma_leave(struct sched_job *job)
{
	if (job)
		memset(job->dma_waiting, 0, sizeof job->dma_waiting);
}

/*
 * Slots a job still holds when it ends (a path that failed between acquire
 * and release), and the DMAs it counted as its own (done by now: a job
 * waits for its lane's work before it ends).
 */
void sched_slots_reclaim(struct sched *s, struct sched_job *j)
{
	struct device *dev = s->dev;
	for (unsigned dir = 0; dir < SCHED_DMA_DIRS; dir++)
		sched_dma_own(j, (enum sched_dma)dir, 0);
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

/* ---- the backends' hooks (backend.h's struct device_waits) ---- */

/* A backend's wait for what its own threads finish (host engines): nothing for `jobs` to show. */
static void wait_host_quietly(bool (*ready)(void *arg), void *arg)
{
	sched_wait_host(ready, arg, SCHED_NOT_WAITING);
}

const struct device_waits sched_device_waits = {
	.wait_device = sched_wait_device,
	.wait_host = wait_host_quietly,
	.notify = sched_notify,
	.publish_tail = sched_publish_tail,
};
