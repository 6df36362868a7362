/*
 * Device worker threads and the queues between them and the main thread.
 *
 * Ownership: each worker thread owns its struct device (the backend state,
 * streams, pool, staging ring) from open to close; nothing else touches it.
 * The fields under worker.lock (queue, health, info copy, counters) are
 * shared with the main thread. A work item belongs to the main thread until
 * worker_submit, to the worker until it reaches the completion queue, and to
 * the main thread again from the async callback on.
 */
#include "workers/worker.h"
#include "workers/log.h"
#include "workers/clock.h"
#include "workers/backend/device_reset.h"
#include "workers/transfer/map_cache.h"
#include "workers/transfer/region_pin.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void pool_push_done(struct worker_pool *pool, struct work *work)
{
	pthread_mutex_lock(&pool->done_lock);
	work->next = NULL;
	if (pool->done_tail)
		pool->done_tail->next = work;
	else
		pool->done_head = work;
	pool->done_tail = work;
	pthread_mutex_unlock(&pool->done_lock);
	uv_async_send(&pool->async);
}

/* Main thread: libuv may coalesce wake-ups, so take everything queued. */
static void pool_on_async(uv_async_t *handle)
{
	struct worker_pool *pool = handle->data;
	pthread_mutex_lock(&pool->done_lock);
	struct work *list = pool->done_head;
	pool->done_head = pool->done_tail = NULL;
	pthread_mutex_unlock(&pool->done_lock);
	while (list) {
		struct work *next = list->next;
		list->next = NULL;
		pool->on_done(list, pool->on_done_arg);
		list = next;
	}
	/* After the jobs a reset failed: then their buffers are marked lost. */
	for (int i = 0; i < pool->count && pool->workers; i++) {
		struct worker *w = &pool->workers[i];
		unsigned done = atomic_load(&w->resets_done);
		if (done != w->resets_seen) {
			w->resets_seen = done;
			if (pool->on_reset)
				pool->on_reset(i, pool->on_done_arg);
		}
	}
}

static void worker_mark_opened(struct worker *w, int rc, const struct gpuq_error *err)
{
	pthread_mutex_lock(&w->lock);
	w->healthy = rc == 0;
	if (rc == 0)
		snprintf(w->health, sizeof w->health, "ok");
	else
		snprintf(w->health, sizeof w->health, "%s", err->message);
	w->info = w->dev.info;
	pthread_mutex_unlock(&w->lock);

	struct worker_pool *pool = w->pool;
	pthread_mutex_lock(&pool->done_lock);
	pool->opened++;
	pthread_cond_broadcast(&pool->opened_cond);
	pthread_mutex_unlock(&pool->done_lock);
}

static bool work_moves_bytes(enum work_kind kind)
{
	return kind == WORK_PUT || kind == WORK_GET || kind == WORK_COPY;
}

static bool work_changes_memory(const struct work *work)
{
	return work->kind == WORK_ALLOC || work->kind == WORK_FREE;
}

void worker_refresh_after(struct worker *w, const struct work *work)
{
	struct gpuq_error ignored;
	if (work_changes_memory(work) && !w->dev.faulted && w->dev.ops->device.refresh_info)
		w->dev.ops->device.refresh_info(&w->dev, &ignored);
}

void worker_account_locked(struct worker *w, const struct work *work)
{
	w->counters.jobs++;
	if (work->error.code != GPUQ_OK)
		w->counters.jobs_failed++;
	if (work_moves_bytes(work->kind))
		w->counters.bytes_moved += work->result.bytes;
	if (w->dev.faulted && w->healthy) {
		w->healthy = false;
		snprintf(w->health, sizeof w->health, "%s", w->dev.fault_reason);
	}
	if (work_changes_memory(work))
		w->info = w->dev.info;
}

void worker_wake_main(struct worker *w)
{
	uv_async_send(&w->pool->async);
}

void worker_hand_back(struct worker *w, struct work *work)
{
	atomic_store(&work->phase, WORK_FINISHED);
	pool_push_done(w->pool, work);
}

void worker_finish_work(struct worker *w, struct work *work)
{
	worker_refresh_after(w, work);
	pthread_mutex_lock(&w->lock);
	worker_account_locked(w, work);
	pthread_mutex_unlock(&w->lock);
	worker_hand_back(w, work);
}

/* Worker thread: a device that never opened refuses what slipped in before its health was known. */
static void worker_refuse_all(struct worker *w, const struct gpuq_error *why)
{
	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (!w->stopping && !w->queues.queued)
			pthread_cond_wait(&w->wake, &w->lock);
		struct work *work = sched_queued_first(&w->queues);
		if (!work)
			break;
		sched_remove(&w->queues, work);
		w->depth--;
		pthread_mutex_unlock(&w->lock);
		gpuq_fail(&work->error, GPUQ_E_NO_DEVICE, "device %d is unhealthy: %s", w->dev.index,
			  why->message);
		atomic_store(&work->phase, WORK_FINISHED);
		pool_push_done(w->pool, work);
		pthread_mutex_lock(&w->lock);
	}
	pthread_mutex_unlock(&w->lock);
}

/* Between jobs: the kept mappings whose idle limit has passed are released (map_cache.h). */
static double worker_idle_due(struct worker *w)
{
	return map_cache_idle_due(&w->dev, monotonic_seconds());
}

static void worker_idle_run(struct worker *w)
{
	map_cache_expire(&w->dev, w->dev.config.copy_pool, monotonic_seconds());
}

/*
 * How the scheduler calls back the worker (sched_hooks.h): retiring works,
 * resetting the device, releasing idle mappings.
 */
static const struct sched_hooks worker_sched_hooks = {
	.idle_due = worker_idle_due,
	.idle_run = worker_idle_run,
	.refresh_after = worker_refresh_after,
	.account_locked = worker_account_locked,
	.hand_back = worker_hand_back,
	.reset_due = device_reset_due,
	.reset_run = device_reset_run,
};

/*
 * Whether an entry the previous image recorded for its device index device
 * and GPU uuid is this worker's: by uuid where the record has one (gpuq's
 * index may be another GPU's now), else by index.
 */
static bool worker_is(const struct worker *w, int device, const char *uuid)
{
	return uuid[0] ? strcmp(uuid, w->dev.info.uuid) == 0 : device == w->dev.index;
}

/*
 * A slab adopted under a name its keeper does not give it (an older
 * gpuqd's) is held under its own from now on: this thread owns its
 * descriptor while it adopts, before it serves.
 */
static void worker_rename_adopted(struct worker *w, const struct device_adopt *a)
{
	const struct slab_keeper *k = w->dev.config.slab_keeper;
	if (a->held_as[0] && k && k->rename)
		k->rename(k->ctx, a->held_as, w->dev.info.uuid, a->slab, a->fd);
}

/*
 * A re-exec, or a restart under the descriptor store: takes over the
 * slabs of this device's GPU that the previous image made, before the
 * worker serves (backend.h's struct device_adopt). A slab that cannot be
 * taken over is reported in its entry; the device serves on.
 */
static void worker_adopt(struct worker *w)
{
	struct device_adopt_list *list = w->dev.config.adopt;
	struct gpuq_error err;
	if (!list || !w->dev.ops->mem.adopt)
		return;
	for (size_t i = 0; i < list->n; i++) {
		struct device_adopt *a = &list->slabs[i];
		if (!worker_is(w, a->device, a->uuid) || a->fd < 0) /* no descriptor: a->why says why */
			continue;
		a->taken = true;
		if (w->dev.ops->mem.adopt(&w->dev, a->slab, a->fd, a->bytes, a->exported, a->ranges,
					  a->nranges, &a->base, &err) != 0) {
			a->base = NULL;
			snprintf(a->why, sizeof a->why, "%s", err.message);
		} else {
			worker_rename_adopted(w, a);
		}
	}
	if (w->dev.ops->device.refresh_info(&w->dev, &err) != 0) /* the free memory the adopted slabs took */
		log_warn("[gpu %d] %s (after adopting its slabs)", w->dev.index, err.message);
}

/*
 * A re-exec: maps and pins again the host regions the previous image had
 * pinned for this device, as region_create's work does (the registration
 * is this worker's to make), before the worker serves. One that fails is
 * reported in its entry; the device serves on.
 */
static void worker_adopt_regions(struct worker *w)
{
	struct device_adopt_list *list = w->dev.config.adopt;
	struct gpuq_error err;
	if (!list)
		return;
	for (size_t i = 0; i < list->nregions; i++) {
		struct device_adopt_region *a = &list->regions[i];
		if (!worker_is(w, a->device, a->uuid))
			continue;
		double t0 = monotonic_seconds();
		a->tried = true;
		a->served_by = w->dev.index;
		if (region_pin_map(&w->dev, a->fd, a->bytes, &a->map, &a->node, &err) != 0) {
			a->map = NULL;
			snprintf(a->why, sizeof a->why, "%s", err.message);
		}
		a->seconds = monotonic_seconds() - t0;
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct gpuq_error err;
	gpuq_error_clear(&err);
	int rc = w->dev.ops->device.open(&w->dev, &err);
	struct sched *s = NULL;
	if (rc == 0 && !(s = sched_create(w, &worker_sched_hooks, w->pool->max_inflight))) {
		rc = gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "device %d: no memory for its scheduler",
			       w->dev.index);
		w->dev.ops->device.close(&w->dev);
	}
	if (rc == 0) {
		worker_adopt(w);
		worker_adopt_regions(w);
	}
	pthread_mutex_lock(&w->lock);
	w->sched = s;
	pthread_mutex_unlock(&w->lock);
	worker_mark_opened(w, rc, &err);
	if (rc != 0) {
		worker_refuse_all(w, &err);
		return NULL;
	}
	sched_run(s);
	sched_release(s); /* the struct stays for worker_pool_stop: see sched.h */
	map_cache_drop(&w->dev, w->dev.config.copy_pool); /* mappings kept between transfers */
	region_pin_forget_all(&w->dev);
	w->dev.ops->device.close(&w->dev);
	device_close_kept(&w->dev); /* a faulted context's buffers, which no re-exec took */
	return NULL;
}

static void worker_init(struct worker_pool *pool, struct worker *w, int index,
			const struct device_config *config)
{
	memset(w, 0, sizeof *w);
	w->pool = pool;
	w->dev.index = index;
	w->dev.ordinal = pool->ordinals[index];
	w->dev.ordinals = pool->ordinals;
	w->dev.ops = pool->ops;
	w->dev.waits = &sched_device_waits;
	w->dev.config = *config;
	w->dev.device_count = pool->count;
	snprintf(w->health, sizeof w->health, "starting");
	sched_queues_init(&w->queues);
	pthread_mutex_init(&w->lock, NULL);
	pthread_condattr_t attr;
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* the scheduler's timed sleeps */
	pthread_cond_init(&w->wake, &attr);
	pthread_condattr_destroy(&attr);
}

static void pool_wait_opened(struct worker_pool *pool, int started)
{
	pthread_mutex_lock(&pool->done_lock);
	while (pool->opened < started)
		pthread_cond_wait(&pool->opened_cond, &pool->done_lock);
	pthread_mutex_unlock(&pool->done_lock);
}

int worker_pool_start(struct worker_pool *pool, uv_loop_t *loop,
		      const struct worker_pool_config *c, struct gpuq_error *err)
{
	int count = c->count;
	if (count < 1 || count > GPUQ_MAX_DEVICES)
		return gpuq_fail(err, GPUQ_E_NO_DEVICE, "%d devices requested; gpuqd serves 1 to %d",
				 count, GPUQ_MAX_DEVICES);
	memset(pool, 0, sizeof *pool);
	pool->ops = c->ops;
	pool->count = count;
	pool->queue_max = c->queue_max;
	pool->spin_us = c->spin_us;
	pool->max_inflight = c->max_inflight;
	pool->on_done = c->on_done;
	pool->on_reset = c->on_reset;
	pool->on_done_arg = c->on_done_arg;
	memcpy(pool->ordinals, c->ordinals, sizeof(int) * (size_t)count);
	pthread_mutex_init(&pool->done_lock, NULL);
	pthread_cond_init(&pool->opened_cond, NULL);
	int rc = uv_async_init(loop, &pool->async, pool_on_async);
	if (rc < 0)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "uv_async_init: %s", uv_strerror(rc));
	pool->async.data = pool;
	pool->workers = calloc((size_t)count, sizeof *pool->workers);
	if (!pool->workers) {
		uv_close((uv_handle_t *)&pool->async, NULL);
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "cannot allocate %d workers", count);
	}
	int started = 0;
	for (int i = 0; i < count; i++) {
		struct worker *w = &pool->workers[i];
		worker_init(pool, w, i, c->device);
		rc = pthread_create(&w->thread, NULL, worker_main, w);
		if (rc != 0) {
			snprintf(w->health, sizeof w->health, "cannot start its thread: %s",
				 strerror(rc));
			continue;
		}
		w->thread_started = true;
		started++;
	}
	pool_wait_opened(pool, started);
	if (started == 0)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "no worker thread could be started");
	return 0;
}

/* Whether w can take one more work now; the caller holds w->lock. */
static int worker_check_room(struct worker_pool *pool, struct worker *w, int device,
			     struct gpuq_error *err)
{
	if (!w->healthy || w->stopping || !w->thread_started)
		return gpuq_fail(err, GPUQ_E_NO_DEVICE, "device %d is unavailable: %s", device,
				 w->stopping ? "its worker is stopping" : w->health);
	if (w->depth >= pool->queue_max)
		return gpuq_fail(err, GPUQ_E_BUSY,
				 "device %d's queue is full (%u jobs); retry later or raise --queue-depth",
				 device, pool->queue_max);
	return 0;
}

/* Queues work on w and wakes it; the caller holds w->lock. */
static int worker_enqueue(struct worker *w, struct work *work, struct gpuq_error *err)
{
	work->resets_known = w->resets_seen;
	atomic_store(&work->phase, WORK_QUEUED);
	atomic_store(&work->sched, NULL);
	if (sched_enqueue(&w->queues, work) != 0)
		return gpuq_fail(err, GPUQ_E_BUSY,
				 "device %d serves %d owners already; retry when some have finished",
				 work->device, SCHED_MAX_OWNERS);
	w->depth++;
	pthread_cond_signal(&w->wake);
	return 0;
}

static int check_device(struct worker_pool *pool, int device, struct gpuq_error *err)
{
	if (pool->stopped) /* connections closed at shutdown end their leases after this */
		return gpuq_fail(err, GPUQ_E_SHUTTING_DOWN, "gpuqd's device workers have stopped");
	if (device < 0 || device >= pool->count)
		return gpuq_fail(err, GPUQ_E_NOT_FOUND, "device %d does not exist (devices: 0-%d)",
				 device, pool->count - 1);
	return 0;
}

int worker_submit(struct worker_pool *pool, struct work *work, struct gpuq_error *err)
{
	if (check_device(pool, work->device, err) < 0)
		return -1;
	struct worker *w = &pool->workers[work->device];
	pthread_mutex_lock(&w->lock);
	int rc = worker_check_room(pool, w, work->device, err);
	if (rc == 0)
		rc = worker_enqueue(w, work, err);
	pthread_mutex_unlock(&w->lock);
	return rc;
}

/*
 * Locks the workers of a gang in device order (the main thread is the only
 * one that ever holds two worker locks, so any fixed order is deadlock-free).
 */
static int lock_gang(struct worker_pool *pool, struct work **works, int n, bool lock,
		     struct gpuq_error *err)
{
	bool used[GPUQ_MAX_DEVICES] = { false };
	for (int i = 0; i < n; i++) {
		if (check_device(pool, works[i]->device, err) < 0)
			return -1;
		if (used[works[i]->device])
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "device %d is named twice",
					 works[i]->device);
		used[works[i]->device] = true;
	}
	for (int d = 0; d < pool->count; d++) {
		if (!used[d])
			continue;
		if (lock)
			pthread_mutex_lock(&pool->workers[d].lock);
		else
			pthread_mutex_unlock(&pool->workers[d].lock);
	}
	return 0;
}

int worker_submit_group(struct worker_pool *pool, struct work **works, int n,
			struct gpuq_error *err)
{
	if (lock_gang(pool, works, n, true, err) < 0)
		return -1;
	int rc = 0;
	for (int i = 0; i < n && rc == 0; i++)
		rc = worker_check_room(pool, &pool->workers[works[i]->device], works[i]->device, err);
	int queued = 0;
	for (int i = 0; i < n && rc == 0; i++, queued++) {
		works[i]->gang_size = (unsigned)n;
		rc = worker_enqueue(&pool->workers[works[i]->device], works[i], err);
	}
	for (int i = 0; rc != 0 && i < queued - 1; i++) { /* all or none */
		struct worker *w = &pool->workers[works[i]->device];
		sched_remove(&w->queues, works[i]);
		w->depth--;
	}
	lock_gang(pool, works, n, false, err);
	return rc;
}

/* Takes work back if it is still queued on w; the caller holds w->lock. */
static bool worker_remove(struct worker *w, struct work *work)
{
	if (atomic_load(&work->phase) != WORK_QUEUED || work->sched_state != SCHED_WORK_QUEUED)
		return false;
	sched_remove(&w->queues, work);
	w->depth--;
	return true;
}

bool worker_unqueue(struct worker_pool *pool, struct work *work)
{
	if (work->device < 0 || work->device >= pool->count)
		return false;
	struct worker *w = &pool->workers[work->device];
	pthread_mutex_lock(&w->lock);
	bool found = worker_remove(w, work);
	pthread_mutex_unlock(&w->lock);
	return found;
}

bool worker_unqueue_group(struct worker_pool *pool, struct work **works, int n)
{
	struct gpuq_error err;
	if (lock_gang(pool, works, n, true, &err) < 0)
		return false;
	bool all_queued = true;
	for (int i = 0; i < n; i++)
		all_queued = all_queued && atomic_load(&works[i]->phase) == WORK_QUEUED;
	for (int i = 0; i < n && all_queued; i++)
		worker_remove(&pool->workers[works[i]->device], works[i]);
	lock_gang(pool, works, n, false, &err);
	return all_queued;
}

/*
 * Every worker is locked before any work is taken, so that no worker
 * starts a work that waited behind one already taken (on a buffer that
 * two devices' works share): what is taken keeps its order whole. The
 * main thread is the only one that holds two worker locks, so taking
 * them in device order cannot deadlock.
 */
struct work *worker_pool_unqueue_all(struct worker_pool *pool)
{
	struct work *all = NULL, **end = &all;
	for (int i = 0; i < pool->count; i++)
		pthread_mutex_lock(&pool->workers[i].lock);
	for (int i = 0; i < pool->count; i++) {
		struct worker *w = &pool->workers[i];
		struct work *work = w->queues.ledger_head;
		while (work) {
			struct work *next = work->ledger_next;
			if (work->gang_size <= 1 && worker_remove(w, work)) {
				*end = work;
				end = &work->next;
				*end = NULL;
			}
			work = next;
		}
	}
	for (int i = pool->count; i-- > 0;)
		pthread_mutex_unlock(&pool->workers[i].lock);
	return all;
}

void worker_snapshot(struct worker_pool *pool, int index, struct worker_snapshot *out)
{
	struct worker *w = &pool->workers[index];
	pthread_mutex_lock(&w->lock);
	out->healthy = w->healthy;
	snprintf(out->health, sizeof out->health, "%s", w->health);
	out->info = w->info;
	memcpy(out->peer_access, w->dev.peer_access, sizeof out->peer_access);
	memcpy(out->peer_link, w->dev.peer_link, sizeof out->peer_link);
	memcpy(out->pool_shared, w->dev.pool_shared, sizeof out->pool_shared);
	snprintf(out->peer_note, sizeof out->peer_note, "%s", w->dev.peer_note);
	out->queue_depth = w->depth;
	out->counters = w->counters;
	sched_stats(w->sched, &out->sched);
	out->resets = w->resets;
	snprintf(out->last_reset, sizeof out->last_reset, "%s", w->last_reset);
	out->last_reset_s = w->last_reset_s;
	out->last_reset_regions = w->last_reset_regions;
	out->last_reset_unpinned = w->last_reset_unpinned;
	out->needs_restart = w->needs_restart;
	pthread_mutex_unlock(&w->lock);
	/*
	 * A reset the worker published and this (main) thread has not taken
	 * stock of yet (worker_drain: the device's buffers marked lost) still
	 * reads as under way, so a client that sees the device healthy again,
	 * or its reset counted, finds those buffers lost.
	 */
	if (out->resets != w->resets_seen) {
		out->healthy = false;
		device_reset_health(out->health, sizeof out->health, out->last_reset);
		out->resets = w->resets_seen;
	}
}

int worker_ask_reset(struct worker_pool *pool, int device, const char *why, struct gpuq_error *err)
{
	if (check_device(pool, device, err) < 0)
		return -1;
	struct worker *w = &pool->workers[device];
	pthread_mutex_lock(&w->lock);
	if (!w->sched) {
		pthread_mutex_unlock(&w->lock);
		return gpuq_fail(err, GPUQ_E_NO_DEVICE,
				 "device %d has no worker to reset it (it never opened: %s); a restart "
				 "(gpuq admin restart) opens every device again, buffers kept",
				 device, w->health);
	}
	w->reset_asked = true;
	snprintf(w->reset_why, sizeof w->reset_why, "%s", why);
	sched_notify_locked(w->sched);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

void worker_unhold(struct worker_pool *pool, struct work *hold)
{
	if (check_device(pool, hold->device, &(struct gpuq_error){ 0 }) < 0)
		return;
	struct worker *w = &pool->workers[hold->device];
	pthread_mutex_lock(&w->lock);
	sched_unhold(&w->queues, hold);
	sched_notify_locked(w->sched);
	pthread_mutex_unlock(&w->lock);
}

int worker_hold(struct worker_pool *pool, struct work *hold, struct gpuq_error *err)
{
	if (check_device(pool, hold->device, err) < 0)
		return -1;
	struct worker *w = &pool->workers[hold->device];
	pthread_mutex_lock(&w->lock);
	if (!w->sched) {
		pthread_mutex_unlock(&w->lock);
		return gpuq_fail(err, GPUQ_E_NO_DEVICE, "device %d did not open (%s)", hold->device,
				 w->health);
	}
	bool held = sched_hold_last(&w->queues, hold);
	sched_notify_locked(w->sched);
	pthread_mutex_unlock(&w->lock);
	if (!held)
		return gpuq_fail(err, GPUQ_E_CANCELLED, "the lease was dropped before it was held");
	return 0;
}

void worker_kick(struct worker_pool *pool, int device)
{
	if (pool->stopped || device < 0 || device >= pool->count)
		return;
	struct worker *w = &pool->workers[device];
	pthread_mutex_lock(&w->lock);
	sched_notify_locked(w->sched);
	pthread_mutex_unlock(&w->lock);
}

int worker_pool_stop(struct worker_pool *pool, unsigned timeout_ms)
{
	pool->stopped = true;
	for (int i = 0; i < pool->count; i++) {
		struct worker *w = &pool->workers[i];
		pthread_mutex_lock(&w->lock);
		w->stopping = true;
		pthread_cond_signal(&w->wake);
		pthread_mutex_unlock(&w->lock);
	}
	struct timespec deadline = deadline_after(CLOCK_REALTIME, timeout_ms / 1e3);
	int stuck = 0;
	bool joined[GPUQ_MAX_DEVICES] = { false };
	for (int i = 0; i < pool->count; i++) {
		struct worker *w = &pool->workers[i];
		if (!w->thread_started)
			continue;
		if (pthread_timedjoin_np(w->thread, NULL, &deadline) != 0) {
			stuck++;
			continue;
		}
		w->thread_started = false;
		joined[i] = true;
	}
	/*
	 * Work finished during the stop is handed over now, not lost, and a
	 * reset done meanwhile is told (its hook reads the worker's snapshot):
	 * before the workers' locks go.
	 */
	pool_on_async(&pool->async);
	for (int i = 0; i < pool->count; i++) {
		struct worker *w = &pool->workers[i];
		if (!joined[i])
			continue;
		sched_free(w->sched);
		w->sched = NULL;
		sched_queues_destroy(&w->queues);
		pthread_mutex_destroy(&w->lock);
		pthread_cond_destroy(&w->wake);
	}
	uv_close((uv_handle_t *)&pool->async, NULL);
	if (stuck == 0)
		free(pool->workers);
	pool->workers = stuck ? pool->workers : NULL;
	return stuck;
}
