/*
 * Device-to-device copies on the workers (see copy.h for the routes and the
 * protocol between a gang's two parts). Worker threads only: each part calls
 * the backend only for its own device, and what it hands the other part (an
 * event, the ring, a checksum) goes through the spec under its sync lock.
 *
 * Lifetimes across the parts. An event or the ring that one part made is
 * used by the other only under the lock, and its maker withdraws it under
 * the lock before destroying it; so the other part either used it before
 * (a stream wait, once enqueued, no longer needs the event) or sees it gone.
 * The source's ring is freed only once the destination has stopped using it
 * (or never started, which it then never will: the source has failed).
 */
#include "workers/copy/copy.h"
#include "workers/log.h"

#include <stdio.h>
#include <string.h>

#define RING_ALIGN 4096u

int copy_spec_init_gang(struct copy_spec *s, struct work *src_part, struct work *dst_part,
			unsigned timeout_ms)
{
	struct work *parts[2] = { src_part, dst_part };
	s->src_ready = s->dst_done = s->ring = NULL;
	s->dst_waited = s->src_waited = s->src_sum_ready = false;
	s->dst_started = s->dst_left = false;
	s->filled = s->drained = 0;
	return peer_sync_init(&s->sync, parts, 2, timeout_ms);
}

void copy_spec_destroy(struct copy_spec *s)
{
	if (s->route != COPY_ROUTE_SAME)
		peer_sync_destroy(&s->sync);
}

static void store_progress(struct work *work, uint64_t done)
{
	if (work)
		atomic_store_explicit(&work->progress_bytes, done, memory_order_relaxed);
}

static void store_total(struct work *work, uint64_t total)
{
	if (work)
		atomic_store_explicit(&work->progress_total, total, memory_order_relaxed);
}

/* ---- the chunk loop shared by SAME and PEER ---- */

/* Enqueues bytes [off, off + len) of a copy on dev's compute stream. */
typedef int (*chunk_fn)(struct device *dev, const void *arg, uint64_t off, size_t len,
			struct gpuq_error *err);

struct chunk_loop {
	struct device *dev;
	struct work *work;       /* cancel flag, progress; NULL: never cancelled */
	struct peer_sync *sync;  /* a gang's: also stop when another part fails */
	int self;                /* this part's index in sync */
	uint64_t n, chunk;
	chunk_fn enqueue;
	const void *arg;
	void *start, *end; /* timing events: before the first chunk, after the last; or NULL */
};

/* 1 when the loop should stop before its next chunk (err says why), else 0. */
static int loop_stop(const struct chunk_loop *l, struct gpuq_error *err)
{
	if (l->work && atomic_load(&l->work->cancel))
		return 1;
	if (l->sync && peer_sync_check(l->sync, l->self, err) < 0)
		return -1;
	return 0;
}

/* Waits for the last enqueued chunk (so for all of them: one stream), keeping a first error. */
static int loop_drain(struct device *dev, void *last, int rc, struct gpuq_error *err)
{
	struct gpuq_error drain_err;
	if (!last || dev->faulted)
		return rc;
	if (dev->ops->events.sync(dev, last, &drain_err) < 0 && rc == 0) {
		*err = drain_err;
		return -1;
	}
	return rc;
}

/*
 * Chunk k records ev[k % 2], and chunk k is enqueued only once chunk k - 2
 * is complete: the GPU always has the next chunk queued behind the one it
 * runs, and a cancel takes effect within two chunks. Returns with every
 * enqueued chunk complete.
 */
static int chunk_loop_run(const struct chunk_loop *l, struct gpuq_error *err)
{
	struct device *dev = l->dev;
	const struct backend_ops *ops = dev->ops;
	void *ev[2] = { NULL, NULL };
	uint64_t issued = 0, ends[2] = { 0, 0 };
	unsigned k = 0;
	int stop = 0;
	int rc = ops->events.create(dev, false, &ev[0], err);
	if (rc == 0)
		rc = ops->events.create(dev, false, &ev[1], err);
	while (rc == 0 && issued < l->n) {
		if (k >= 2) {
			rc = ops->events.sync(dev, ev[k % 2], err);
			if (rc != 0)
				break;
			store_progress(l->work, ends[k % 2]);
		}
		stop = loop_stop(l, err);
		if (stop != 0)
			break;
		size_t len = l->n - issued < l->chunk ? (size_t)(l->n - issued) : (size_t)l->chunk;
		if (k == 0 && l->start)
			rc = ops->events.record(dev, l->start, err);
		if (rc == 0)
			rc = l->enqueue(dev, l->arg, issued, len, err);
		if (rc == 0)
			rc = ops->events.record(dev, ev[k % 2], err);
		if (rc != 0)
			break;
		issued += len;
		ends[k % 2] = issued;
		k++;
		if (issued == l->n && l->end)
			rc = ops->events.record(dev, l->end, err);
	}
	rc = loop_drain(dev, k > 0 ? ev[(k - 1) % 2] : NULL, rc, err);
	for (int i = 0; i < 2; i++)
		if (ev[i] && !dev->faulted)
			ops->events.destroy(dev, ev[i]);
	if (rc == 0 && stop > 0)
		rc = gpuq_fail(err, GPUQ_E_CANCELLED,
			       "copy cancelled on gpu %d after %llu of %llu bytes; the destination "
			       "holds a partial copy",
			       dev->index, (unsigned long long)issued, (unsigned long long)l->n);
	else if (rc == 0 && stop < 0)
		rc = -1;
	if (rc == 0)
		store_progress(l->work, issued);
	return rc;
}

/* ---- within one device ---- */

struct same_arg {
	void *dst;
	const void *src;
	enum copy_engine engine;
};

static int enqueue_same(struct device *dev, const void *arg, uint64_t off, size_t len,
			struct gpuq_error *err)
{
	const struct same_arg *a = arg;
	return dev->ops->copy.d2d(dev, (char *)a->dst + off, (const char *)a->src + off, len,
				  a->engine, err);
}

int copy_same(struct device *dev, struct work *work, void *dst, const void *src, uint64_t n,
	      enum copy_engine engine, uint64_t chunk, void *start, void *end,
	      struct gpuq_error *err)
{
	struct same_arg a = { dst, src, engine };
	struct chunk_loop l = { dev, work, NULL, 0, n, chunk ? chunk : COPY_SAME_CHUNK,
				enqueue_same, &a, start, end };
	store_total(work, n);
	return chunk_loop_run(&l, err);
}

static int verify_compare(const struct copy_spec *s, struct gpuq_error *err)
{
	if (s->src_sum == s->dst_sum)
		return 0;
	return gpuq_fail(err, GPUQ_E_DEVICE_ERROR,
			 "verify failed: the source %s hashes to %016llx but the destination %s "
			 "to %016llx after the copy (path %s)",
			 s->src_label, (unsigned long long)s->src_sum, s->dst_label,
			 (unsigned long long)s->dst_sum, s->path);
}

static int run_same(struct device *dev, struct work *work, struct copy_spec *s)
{
	struct gpuq_error *err = &work->error;
	int rc = copy_same(dev, work, s->dst, s->src, s->bytes, s->engine, s->chunk_bytes, NULL,
			   NULL, err);
	if (rc == 0 && s->verify) {
		rc = dev->ops->mem.checksum(dev, s->src, s->bytes, &s->src_sum, err);
		if (rc == 0)
			rc = dev->ops->mem.checksum(dev, s->dst, s->bytes, &s->dst_sum, err);
		if (rc == 0)
			rc = verify_compare(s, err);
	}
	return rc;
}

/* ---- predicates for peer_sync_wait (the lock is held) ---- */

static bool src_ready_published(void *arg)
{
	return ((struct copy_spec *)arg)->src_ready != NULL;
}

static bool dst_done_published(void *arg)
{
	return ((struct copy_spec *)arg)->dst_done != NULL;
}

static bool src_waited_on_done(void *arg)
{
	return ((struct copy_spec *)arg)->src_waited;
}

static bool src_sum_published(void *arg)
{
	return ((struct copy_spec *)arg)->src_sum_ready;
}

static bool ring_published(void *arg)
{
	return ((struct copy_spec *)arg)->ring != NULL;
}

static bool ring_released(void *arg)
{
	return ((struct copy_spec *)arg)->dst_left;
}

/* ---- shared steps of the two gang routes ---- */

static void publish_src_sum(struct copy_spec *s)
{
	peer_sync_lock(&s->sync);
	s->src_sum_ready = true;
	peer_sync_changed(&s->sync);
	peer_sync_unlock(&s->sync);
}

/* The destination's verify: its own checksum against the source's, once published. */
static int verify_dst(struct device *dev, struct copy_spec *s, struct gpuq_error *err)
{
	int rc = dev->ops->mem.checksum(dev, s->dst, s->bytes, &s->dst_sum, err);
	if (rc != 0)
		return rc;
	peer_sync_lock(&s->sync);
	rc = peer_sync_wait(&s->sync, COPY_PART_DST, src_sum_published, s,
			    "the source's checksum", err);
	peer_sync_unlock(&s->sync);
	return rc == 0 ? verify_compare(s, err) : rc;
}

/* ---- PEER: the source ---- */

/*
 * Waits for the destination's "done" event and makes this device's stream
 * wait for it, then for the stream: returns with the copy complete.
 */
static int peer_src_finish(struct device *dev, struct copy_spec *s, void *ready,
			   struct gpuq_error *err)
{
	peer_sync_lock(&s->sync);
	int rc = peer_sync_wait(&s->sync, COPY_PART_SRC, dst_done_published, s,
				"the destination's end of the copy", err);
	if (rc == 0)
		rc = dev->ops->events.wait(dev, s->dst_done, err);
	if (rc == 0) {
		s->src_waited = true;
		peer_sync_changed(&s->sync);
	}
	s->src_ready = NULL; /* the destination waited for it before it published done */
	peer_sync_unlock(&s->sync);
	if (rc == 0)
		rc = dev->ops->events.record(dev, ready, err);
	if (rc == 0)
		rc = dev->ops->events.sync(dev, ready, err);
	return rc;
}

static int peer_src(struct device *dev, struct copy_spec *s, struct gpuq_error *err)
{
	const struct backend_ops *ops = dev->ops;
	void *ready = NULL;
	int rc = ops->events.create(dev, false, &ready, err);
	if (rc == 0)
		rc = ops->events.record(dev, ready, err);
	if (rc == 0) {
		peer_sync_lock(&s->sync);
		s->src_ready = ready;
		peer_sync_changed(&s->sync);
		peer_sync_unlock(&s->sync);
	}
	/* The checksum reads the source while the destination copies it. */
	if (rc == 0 && s->verify) {
		rc = ops->mem.checksum(dev, s->src, s->bytes, &s->src_sum, err);
		if (rc == 0)
			publish_src_sum(s);
	}
	if (rc == 0)
		rc = peer_src_finish(dev, s, ready, err);
	if (rc != 0) {
		peer_sync_fail(&s->sync, COPY_PART_SRC);
		peer_sync_lock(&s->sync);
		s->src_ready = NULL;
		peer_sync_unlock(&s->sync);
	}
	if (ready && !dev->faulted)
		ops->events.destroy(dev, ready);
	return rc;
}

/* ---- PEER: the destination ---- */

struct peer_arg {
	void *dst;
	const void *src;
	int src_device;
};

static int enqueue_peer(struct device *dev, const void *arg, uint64_t off, size_t len,
			struct gpuq_error *err)
{
	const struct peer_arg *a = arg;
	return dev->ops->copy.peer(dev, (char *)a->dst + off, a->src_device,
				   (const char *)a->src + off, len, err);
}

/* Makes this device's stream wait for the source's go-ahead. */
static int peer_dst_start(struct device *dev, struct copy_spec *s, struct gpuq_error *err)
{
	peer_sync_lock(&s->sync);
	int rc = peer_sync_wait(&s->sync, COPY_PART_DST, src_ready_published, s,
				"the source's go-ahead", err);
	if (rc == 0)
		rc = dev->ops->events.wait(dev, s->src_ready, err);
	if (rc == 0) {
		s->dst_waited = true;
		peer_sync_changed(&s->sync);
	}
	peer_sync_unlock(&s->sync);
	return rc;
}

/* Withdraws the done event once the source has used it (or cannot any more). */
static void peer_dst_retire(struct device *dev, struct copy_spec *s, void *done)
{
	struct gpuq_error ignored;
	peer_sync_lock(&s->sync);
	if (s->dst_done)
		peer_sync_wait_cleanup(&s->sync, COPY_PART_DST, src_waited_on_done, s,
				       "the source to take the done event", &ignored);
	s->dst_done = NULL;
	peer_sync_unlock(&s->sync);
	if (done && !dev->faulted)
		dev->ops->events.destroy(dev, done);
}

static int peer_dst(struct device *dev, struct copy_spec *s, struct gpuq_error *err)
{
	struct work *work = s->sync.parts[COPY_PART_DST];
	struct peer_arg a = { s->dst, s->src, s->src_device };
	struct chunk_loop l = { dev, work, &s->sync, COPY_PART_DST, s->bytes,
				s->chunk_bytes ? s->chunk_bytes : COPY_PEER_CHUNK, enqueue_peer, &a,
				NULL, s->timing_end };
	void *done = NULL;
	store_total(work, s->bytes);
	int rc = peer_dst_start(dev, s, err);
	if (rc == 0)
		rc = chunk_loop_run(&l, err);
	if (rc == 0)
		rc = dev->ops->events.create(dev, false, &done, err);
	if (rc == 0)
		rc = dev->ops->events.record(dev, done, err);
	if (rc == 0) {
		peer_sync_lock(&s->sync);
		s->dst_done = done;
		peer_sync_changed(&s->sync);
		peer_sync_unlock(&s->sync);
	}
	if (rc == 0 && s->verify)
		rc = verify_dst(dev, s, err);
	if (rc != 0)
		peer_sync_fail(&s->sync, COPY_PART_DST);
	peer_dst_retire(dev, s, done);
	return rc;
}

/* ---- STAGED: the source fills the ring, the destination empties it ---- */

static uint64_t staged_chunks(const struct copy_spec *s)
{
	return (s->bytes + s->chunk_bytes - 1) / s->chunk_bytes;
}

static size_t staged_len(const struct copy_spec *s, uint64_t chunk)
{
	uint64_t off = chunk * s->chunk_bytes;
	return s->bytes - off < s->chunk_bytes ? (size_t)(s->bytes - off) : (size_t)s->chunk_bytes;
}

static void *ring_slot(const struct copy_spec *s, uint64_t chunk)
{
	return (char *)s->ring + (size_t)(chunk % COPY_RING_SLOTS) * s->ring_stride;
}

static int make_events(struct device *dev, void **ev, unsigned n, struct gpuq_error *err)
{
	for (unsigned i = 0; i < n; i++)
		if (dev->ops->events.create(dev, false, &ev[i], err) != 0)
			return -1;
	return 0;
}

static void drop_events(struct device *dev, void **ev, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (ev[i] && !dev->faulted)
			dev->ops->events.destroy(dev, ev[i]);
}

struct ring_wait {
	struct copy_spec *s;
	uint64_t chunk;
};

static bool slot_free(void *arg)
{
	struct ring_wait *w = arg;
	return w->s->drained + COPY_RING_SLOTS > w->chunk;
}

static bool slot_filled(void *arg)
{
	struct ring_wait *w = arg;
	return w->s->filled > w->chunk;
}

/* Source: D2H into every free slot, then publish the oldest once it is in. */
static int staged_src_loop(struct device *dev, struct copy_spec *s, void **ev,
			   struct gpuq_error *err)
{
	uint64_t n = staged_chunks(s), issued = 0, done = 0;
	int rc = 0;
	while (rc == 0 && done < n) {
		peer_sync_lock(&s->sync);
		uint64_t drained = s->drained;
		peer_sync_unlock(&s->sync);
		for (; rc == 0 && issued < n && issued < drained + COPY_RING_SLOTS; issued++) {
			rc = peer_sync_check(&s->sync, COPY_PART_SRC, err);
			if (rc == 0)
				rc = dev->ops->copy.ring_d2h(dev, ring_slot(s, issued),
							(const char *)s->src + issued * s->chunk_bytes,
							staged_len(s, issued), err);
			if (rc == 0)
				rc = dev->ops->events.record(dev, ev[issued % COPY_RING_SLOTS], err);
			if (rc != 0)
				break;
		}
		if (rc != 0)
			break;
		if (issued == done) { /* every slot is the destination's: wait for one */
			struct ring_wait w = { s, issued };
			peer_sync_lock(&s->sync);
			rc = peer_sync_wait(&s->sync, COPY_PART_SRC, slot_free, &w, "a free ring slot",
					    err);
			peer_sync_unlock(&s->sync);
			continue;
		}
		rc = dev->ops->events.sync(dev, ev[done % COPY_RING_SLOTS], err);
		if (rc == 0) {
			done++;
			peer_sync_lock(&s->sync);
			s->filled = done;
			peer_sync_changed(&s->sync);
			peer_sync_unlock(&s->sync);
		}
	}
	if (issued > done) /* nothing may still write the ring once this returns */
		rc = loop_drain(dev, ev[(issued - 1) % COPY_RING_SLOTS], rc, err);
	return rc;
}

/*
 * The device's ring, big enough for this copy's slots: made at the first
 * host-staged copy from the device and kept (pinning costs milliseconds).
 */
static int ring_get(struct device *dev, size_t stride, void **ring, struct gpuq_error *err)
{
	size_t bytes = stride * COPY_RING_SLOTS;
	if (dev->peer_ring && dev->peer_ring_bytes >= bytes) {
		*ring = dev->peer_ring;
		return 0;
	}
	if (dev->peer_ring)
		dev->ops->mem.host_free_portable(dev, dev->peer_ring);
	dev->peer_ring = NULL;
	dev->peer_ring_bytes = 0;
	if (dev->ops->mem.host_alloc_portable(dev, bytes, &dev->peer_ring, err) != 0) {
		dev->peer_ring = NULL;
		return -1;
	}
	dev->peer_ring_bytes = bytes;
	*ring = dev->peer_ring;
	return 0;
}

/*
 * Takes the ring back once the destination is off it. A destination that has
 * not started never will get on it: the ring is withdrawn under the lock, and
 * it starts only under the lock. One that holds it for ever keeps it: the
 * device forgets the ring (leaked) and makes another for its next copy.
 */
static void staged_src_release(struct device *dev, struct copy_spec *s, void *ring)
{
	struct gpuq_error err;
	gpuq_error_clear(&err);
	peer_sync_lock(&s->sync);
	if (s->dst_started && !s->dst_left)
		peer_sync_wait_cleanup(&s->sync, COPY_PART_SRC, ring_released, s,
				       "the destination to stop using the ring", &err);
	bool safe = !s->dst_started || s->dst_left;
	s->ring = NULL;
	peer_sync_unlock(&s->sync);
	if (safe)
		return;
	log_warn("[gpu %d] host-staged copy: the destination still holds the ring; "
		 "leaving its %zu bytes to it: %s",
		dev->index, dev->peer_ring_bytes, err.message);
	if (dev->peer_ring == ring) {
		dev->peer_ring = NULL;
		dev->peer_ring_bytes = 0;
	}
}

static int staged_src(struct device *dev, struct copy_spec *s, struct gpuq_error *err)
{
	void *ev[COPY_RING_SLOTS] = { NULL };
	void *ring = NULL;
	size_t stride = (size_t)((s->chunk_bytes + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN);
	int rc = ring_get(dev, stride, &ring, err);
	if (rc == 0)
		rc = make_events(dev, ev, COPY_RING_SLOTS, err);
	if (rc == 0) {
		peer_sync_lock(&s->sync);
		s->ring_stride = stride;
		s->ring = ring;
		peer_sync_changed(&s->sync);
		peer_sync_unlock(&s->sync);
		rc = staged_src_loop(dev, s, ev, err);
	}
	if (rc == 0 && s->verify) {
		rc = dev->ops->mem.checksum(dev, s->src, s->bytes, &s->src_sum, err);
		if (rc == 0)
			publish_src_sum(s);
	}
	if (rc == 0) { /* the ring is the destination's until it has emptied it */
		peer_sync_lock(&s->sync);
		rc = peer_sync_wait(&s->sync, COPY_PART_SRC, ring_released, s,
				    "the destination to empty the ring", err);
		peer_sync_unlock(&s->sync);
	}
	if (rc != 0)
		peer_sync_fail(&s->sync, COPY_PART_SRC);
	if (ring)
		staged_src_release(dev, s, ring);
	drop_events(dev, ev, COPY_RING_SLOTS);
	return rc;
}

/* Destination: H2D out of every filled slot, then hand the oldest back once it is out. */
static int staged_dst_loop(struct device *dev, struct copy_spec *s, void **ev,
			   struct gpuq_error *err)
{
	struct work *work = s->sync.parts[COPY_PART_DST];
	uint64_t n = staged_chunks(s), issued = 0, done = 0;
	int rc = 0;
	while (rc == 0 && done < n) {
		peer_sync_lock(&s->sync);
		uint64_t filled = s->filled;
		peer_sync_unlock(&s->sync);
		for (; rc == 0 && issued < filled; issued++) {
			rc = peer_sync_check(&s->sync, COPY_PART_DST, err);
			if (rc == 0)
				rc = dev->ops->copy.ring_h2d(dev, (char *)s->dst + issued * s->chunk_bytes,
							ring_slot(s, issued), staged_len(s, issued), err);
			if (rc == 0)
				rc = dev->ops->events.record(dev, ev[issued % COPY_RING_SLOTS], err);
			if (rc == 0 && issued + 1 == n && s->timing_end)
				rc = dev->ops->events.record(dev, s->timing_end, err);
			if (rc != 0)
				break;
		}
		if (rc != 0)
			break;
		if (issued == done) {
			struct ring_wait w = { s, issued };
			peer_sync_lock(&s->sync);
			rc = peer_sync_wait(&s->sync, COPY_PART_DST, slot_filled, &w,
					    "the next filled ring slot", err);
			peer_sync_unlock(&s->sync);
			continue;
		}
		rc = dev->ops->events.sync(dev, ev[done % COPY_RING_SLOTS], err);
		if (rc == 0) {
			done++;
			store_progress(work, done == n ? s->bytes : done * s->chunk_bytes);
			peer_sync_lock(&s->sync);
			s->drained = done;
			peer_sync_changed(&s->sync);
			peer_sync_unlock(&s->sync);
		}
	}
	if (issued > done)
		rc = loop_drain(dev, ev[(issued - 1) % COPY_RING_SLOTS], rc, err);
	return rc;
}

static int staged_dst(struct device *dev, struct copy_spec *s, struct gpuq_error *err)
{
	void *ev[COPY_RING_SLOTS] = { NULL };
	store_total(s->sync.parts[COPY_PART_DST], s->bytes);
	int rc = 0;
	peer_sync_lock(&s->sync);
	bool aborted = atomic_load(&s->sync.abort);
	if (!aborted) {
		s->dst_started = true; /* from here the source keeps the ring until dst_left */
		rc = peer_sync_wait(&s->sync, COPY_PART_DST, ring_published, s, "the source's ring",
				    err);
	}
	peer_sync_unlock(&s->sync);
	if (aborted)
		rc = peer_sync_check(&s->sync, COPY_PART_DST, err); /* says which part failed */
	if (rc == 0)
		rc = make_events(dev, ev, COPY_RING_SLOTS, err);
	if (rc == 0)
		rc = staged_dst_loop(dev, s, ev, err);
	peer_sync_lock(&s->sync);
	s->dst_left = true;
	peer_sync_changed(&s->sync);
	peer_sync_unlock(&s->sync);
	if (rc == 0 && s->verify)
		rc = verify_dst(dev, s, err);
	if (rc != 0)
		peer_sync_fail(&s->sync, COPY_PART_DST);
	drop_events(dev, ev, COPY_RING_SLOTS);
	return rc;
}

int copy_gang_part(struct device *dev, struct copy_spec *s, enum copy_part part,
		   struct gpuq_error *err)
{
	int rc;
	if (s->route == COPY_ROUTE_PEER)
		rc = part == COPY_PART_SRC ? peer_src(dev, s, err) : peer_dst(dev, s, err);
	else if (s->route == COPY_ROUTE_STAGED)
		rc = part == COPY_PART_SRC ? staged_src(dev, s, err) : staged_dst(dev, s, err);
	else
		rc = gpuq_fail(err, GPUQ_E_INTERNAL, "copy: route %d is not a gang's", (int)s->route);
	peer_sync_leave(&s->sync, part);
	return rc;
}

int copy_run(struct device *dev, struct work *work)
{
	struct copy_spec *s = work->spec;
	work->result.path = s->path;
	if (s->route == COPY_ROUTE_SAME) {
		int rc = run_same(dev, work, s);
		work->result.bytes = rc == 0 ? s->bytes : 0;
		work->result.checksum = s->dst_sum;
		return rc;
	}
	enum copy_part part = work == s->sync.parts[COPY_PART_SRC] ? COPY_PART_SRC : COPY_PART_DST;
	int rc = copy_gang_part(dev, s, part, &work->error);
	/* The gang's bytes are the parts' sum: the destination counts them (and knows dst_sum). */
	if (part == COPY_PART_DST) {
		work->result.bytes = rc == 0 ? s->bytes : 0;
		work->result.checksum = s->dst_sum;
	}
	return rc;
}
