/*
 * A transfer through a client's ring (docs/protocol.md, "Rings"): the
 * buffer range moves in chunks of the ring's slot size, chunk k through
 * slot k % slots of a region the client and gpuqd share, and the two hand
 * the slots over through counters in that region instead of a request per
 * chunk. The client counts in `posted` the chunks it has written (put) or
 * copied out (get); gpuqd counts in `moved` the chunks whose DMA is done,
 * and says in `status` that the transfer ended.
 *
 * Put: chunk k's DMA (region slot -> buffer) is issued once posted > k;
 * moved then frees its slot for chunk k + slots. Get: chunk k's DMA
 * (buffer -> slot) is issued once its slot's last chunk has been copied
 * out (k < posted + slots); moved then tells the client the chunk is there.
 * DMAs go on the job's lane, each followed by an event; up to
 * RING_MAX_QUEUED are in flight, completed in order. They take DMA turns
 * with the device's other transfers (sched_wait.h) as staged DMAs do: the
 * copy engine runs what is queued in order, so a ring that kept its queue
 * full would otherwise hold every other job's DMA behind its own.
 *
 * A transfer whose whole range lies in pinned host memory (a region's own,
 * put/get through `region`, and the registered path's pinned memfd) runs
 * the same loop as a ring whose client had posted every chunk before it
 * started (xfer_pinned): chunk k is at k's offset there. A region moved as
 * one DMA once, which held a 1 GiB region's copy engine ~20 ms while every
 * other transfer's DMA waited (the registered path, in 64 MiB DMAs, 1.2 ms
 * each); in chunks of PINNED_CHUNK_SLOTS staging slots (16 MiB by default)
 * it takes turns, and pays the engine's gap between DMAs once per 16 MiB
 * (0.99 of one copy's rate on the H200).
 *
 * The client's counter is memory another process writes: it is read with
 * acquire loads, and a value that goes backwards, past the transfer's
 * chunks or (get) past what gpuqd has moved fails the job with
 * bad_request. A client that posts nothing for the job's idle timeout
 * (--transfer-idle-timeout) fails it with timeout.
 *
 * Worker thread only.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "workers/clock.h"
#include "workers/sched/sched_wait.h"
#include "workers/transfer/copy_hash.h"
#include "workers/transfer/transfer_impl.h"

/* DMAs a ring transfer keeps queued at most (and events it makes). */
#define RING_MAX_QUEUED 16
/* How long the worker polls the client's counter before it lets itself sleep between looks. */
#define RING_SPIN_S 2e-3
/* A transfer from or to pinned memory moves in chunks of this many of the device's staging slots. */
#define PINNED_CHUNK_SLOTS 8

enum { RING_POSTED, RING_MOVED, RING_STATUS };
enum { RING_RUNNING, RING_DONE, RING_FAILED };

/* Where a ring's slots and counters are. */
struct ring_spec {
	char *host; /* slot 0 */
	uint64_t slot_bytes;
	unsigned slots;
	_Atomic uint64_t *counter; /* the client's three counters; NULL: the whole range is at host */
};

struct ring {
	struct xfer *x;
	bool put;
	char *host;
	uint64_t slot_bytes, nchunks;
	unsigned slots;
	_Atomic uint64_t *counter; /* the three counters: the client's, or own_counter */
	_Atomic uint64_t own_counter[3];
	bool hash_chunks;          /* --verify: hash each chunk as it moves (a whole range: at the end) */
	void *event[RING_MAX_QUEUED];
	unsigned nevents;
	uint64_t issued, moved, posted; /* chunks: DMAs issued, DMAs done, the client's count */
	double posted_at;               /* when posted last moved (monotonic seconds) */
};

static uint64_t chunk_bytes(const struct ring *r, uint64_t k)
{
	uint64_t at = k * r->slot_bytes;
	return r->x->total - at < r->slot_bytes ? r->x->total - at : r->slot_bytes;
}

static char *slot_of(const struct ring *r, uint64_t k)
{
	return r->host + (k % r->slots) * r->slot_bytes;
}

/* The client's counter, checked: 1 when it moved, 0 when not, -1 with err for a value it cannot hold. */
static int read_posted(struct ring *r)
{
	uint64_t v = atomic_load_explicit(&r->counter[RING_POSTED], memory_order_acquire);
	if (v == r->posted)
		return 0;
	uint64_t most = r->put ? r->nchunks : r->moved;
	if (v < r->posted || v > most)
		return gpuq_fail(r->x->err, GPUQ_E_BAD_REQUEST,
				 "ring counter 'posted' went from %llu to %llu; it counts up to %llu "
				 "(the chunks %s)",
				 (unsigned long long)r->posted, (unsigned long long)v,
				 (unsigned long long)most,
				 r->put ? "of the transfer" : "gpuqd has moved so far");
	r->posted = v;
	r->posted_at = monotonic_seconds();
	return 1;
}

static enum sched_dma ring_dir(const struct ring *r)
{
	return r->put ? SCHED_DMA_H2D : SCHED_DMA_D2H;
}

/* Whether chunk `issued` is ready for its DMA: its bytes are posted (put), its slot is free (get). */
static bool wants_issue(const struct ring *r)
{
	if (r->issued == r->nchunks || r->issued - r->moved == r->nevents)
		return false;
	return r->put ? r->issued < r->posted : r->issued < r->posted + r->slots;
}

/* Whether that DMA may go now: ready, and the device's DMA turns give it one. */
static bool may_issue(const struct ring *r)
{
	return wants_issue(r) && sched_dma_turn(r->x->job, ring_dir(r));
}

/* Tells the DMA turns how many of the ring's bytes are in flight. */
static void count_in_flight(const struct ring *r)
{
	uint64_t bytes = 0;
	for (uint64_t k = r->moved; k < r->issued; k++)
		bytes += chunk_bytes(r, k);
	sched_dma_own(r->x->job, ring_dir(r), bytes);
}

static int issue(struct ring *r)
{
	struct xfer *x = r->x;
	struct device *dev = x->dev;
	uint64_t k = r->issued, n = chunk_bytes(r, k);
	char *dptr = x->base + k * r->slot_bytes;
	if (r->put && r->hash_chunks)
		x->sum += copy_hash_terms(slot_of(r, k), n, k * r->slot_bytes / 8);
	int rc = r->put ? dev->ops->copy.ring_h2d(dev, dptr, slot_of(r, k), n, x->err)
			: dev->ops->copy.ring_d2h(dev, slot_of(r, k), dptr, n, x->err);
	if (rc == 0)
		rc = dev->ops->events.record(dev, r->event[k % r->nevents], x->err);
	if (rc != 0)
		return -1;
	r->issued++;
	count_in_flight(r);
	xfer_dma_issued(x);
	if (r->issued == r->nchunks)
		xfer_issued_all(x);
	return 0;
}

/* The oldest DMA in flight: 1 when it is done (counted, and the client told), 0 when not. */
static int complete(struct ring *r)
{
	struct xfer *x = r->x;
	bool done = false;
	if (r->moved == r->issued)
		return 0;
	if (x->dev->ops->events.query(x->dev, r->event[r->moved % r->nevents], &done, x->err) < 0)
		return -1;
	if (!done)
		return 0;
	uint64_t k = r->moved, n = chunk_bytes(r, k);
	if (!r->put && r->hash_chunks)
		x->sum += copy_hash_terms(slot_of(r, k), n, k * r->slot_bytes / 8);
	r->moved++;
	count_in_flight(r);
	x->done += n;
	xfer_progress(x);
	atomic_store_explicit(&r->counter[RING_MOVED], r->moved, memory_order_release);
	return 1;
}

/*
 * Whether the client has posted nothing for the job's idle limit while
 * gpuqd had nothing to do: no DMA in flight and none waiting for its turn.
 */
static bool idle_too_long(const struct ring *r)
{
	unsigned limit = r->x->work->transfer.idle_timeout_ms;
	return limit && r->moved == r->issued && !wants_issue(r) &&
	       (monotonic_seconds() - r->posted_at) * 1000 >= limit;
}

/* What the ring waits for: the client's counter, a DMA turn, the oldest DMA, a cancel, or the idle limit. */
static bool ring_can_move(void *arg)
{
	struct ring *r = arg;
	struct xfer *x = r->x;
	bool done = false;
	struct gpuq_error ignored;
	if (atomic_load(&x->work->cancel) ||
	    atomic_load_explicit(&r->counter[RING_POSTED], memory_order_acquire) != r->posted ||
	    may_issue(r))
		return true;
	if (r->moved < r->issued &&
	    (x->dev->ops->events.query(x->dev, r->event[r->moved % r->nevents], &done, &ignored) < 0 ||
	     done))
		return true;
	return idle_too_long(r);
}

/* Fails the transfer once idle_too_long. */
static int check_idle(struct ring *r)
{
	if (!idle_too_long(r))
		return 0;
	return gpuq_fail(r->x->err, GPUQ_E_TIMEOUT,
			 "the ring's client posted no chunk for %u ms (--transfer-idle-timeout); the "
			 "job stopped after %llu of %llu chunks",
			 r->x->work->transfer.idle_timeout_ms, (unsigned long long)r->moved,
			 (unsigned long long)r->nchunks);
}

/*
 * Yields until something can move: polling while the client has just
 * posted (the next chunk comes within microseconds), while a DMA is in
 * flight or one waits for its turn (other jobs' DMAs end on the device),
 * and letting the worker sleep between looks while the client is slow.
 */
static void wait_for_move(struct ring *r)
{
	if (monotonic_seconds() - r->posted_at < RING_SPIN_S || r->moved < r->issued ||
	    wants_issue(r))
		sched_wait_device(ring_can_move, r);
	else
		sched_wait_host(ring_can_move, r, SCHED_NOT_WAITING);
}

/*
 * The loop's state for spec's slots and counters. Without the client's
 * counters the whole range is at spec->host, one slot a chunk: every chunk
 * is posted (put) and every slot free (get), so nothing waits for a
 * client, and --verify hashes the range at the end, on the copy threads.
 */
static int ring_open(struct ring *r, struct xfer *x, bool put, const struct ring_spec *spec)
{
	memset(r, 0, sizeof *r);
	r->x = x;
	r->put = put;
	r->host = spec->host;
	r->slot_bytes = spec->slot_bytes;
	r->slots = spec->slots;
	r->nchunks = (x->total + r->slot_bytes - 1) / r->slot_bytes;
	r->counter = spec->counter ? spec->counter : r->own_counter;
	r->hash_chunks = x->verify && spec->counter;
	if (!spec->counter) {
		r->posted = put ? r->nchunks : 0;
		atomic_store(&r->own_counter[RING_POSTED], r->posted);
	}
	r->posted_at = monotonic_seconds();
	unsigned want = r->slots < RING_MAX_QUEUED ? r->slots : RING_MAX_QUEUED;
	for (; r->nevents < want; r->nevents++)
		if (x->dev->ops->events.create(x->dev, false, &r->event[r->nevents], x->err) < 0)
			return -1;
	return 0;
}

/* Waits for the DMAs still in flight (unless the device faulted), frees the events, sets status. */
static void ring_close(struct ring *r, int rc)
{
	struct xfer *x = r->x;
	struct gpuq_error ignored;
	for (uint64_t k = r->moved; k < r->issued && !x->dev->faulted; k++)
		(void)x->dev->ops->events.sync(x->dev, r->event[k % r->nevents], &ignored);
	for (unsigned i = 0; i < r->nevents; i++)
		x->dev->ops->events.destroy(x->dev, r->event[i]);
	sched_dma_own(x->job, ring_dir(r), 0);
	sched_dma_leave(x->job);
	atomic_store_explicit(&r->counter[RING_STATUS], rc == 0 ? RING_DONE : RING_FAILED,
			      memory_order_release);
}

/* Moves the chunks as the client posts them, taking DMA turns; then ring_close. */
static int ring_run(struct ring *r)
{
	struct xfer *x = r->x;
	int rc = 0;
	while (r->moved < r->nchunks) {
		int moved;
		if ((rc = xfer_cancelled(x)) != 0 || (rc = read_posted(r)) < 0)
			break;
		rc = 0;
		if (may_issue(r)) {
			if ((rc = issue(r)) != 0)
				break;
			continue;
		}
		if ((moved = complete(r)) < 0) {
			rc = -1;
			break;
		}
		if (moved == 0 && (rc = check_idle(r)) != 0)
			break;
		if (moved == 0)
			wait_for_move(r);
	}
	ring_close(r, rc);
	return rc;
}

int xfer_ring(struct xfer *x, bool put)
{
	const struct transfer_spec *t = &x->work->transfer;
	struct ring_spec spec = { t->host, t->ring_slot_bytes, t->ring_slots,
				  (_Atomic uint64_t *)t->ring_counters };
	struct ring r;
	if (ring_open(&r, x, put, &spec) < 0) {
		ring_close(&r, -1);
		return -1;
	}
	return ring_run(&r);
}

int xfer_pinned(struct xfer *x, bool put, void *host)
{
	int rc = xfer_cancelled(x);
	if (rc != 0 || x->total == 0)
		return rc;
	uint64_t chunk = (uint64_t)x->dev->config.staging_slot_bytes * PINNED_CHUNK_SLOTS;
	struct ring_spec spec = { host, chunk, (unsigned)((x->total + chunk - 1) / chunk), NULL };
	struct ring r;
	if (ring_open(&r, x, put, &spec) < 0) {
		ring_close(&r, -1);
		return -1;
	}
	if ((rc = ring_run(&r)) == 0 && x->verify)
		x->sum = copy_hash_terms_parallel(x->pool, host, x->done);
	return rc;
}
