/*
 * The staged path: a regular file or memfd moved through the pinned staging
 * ring, its reads (put) or writes (get) done by the copy threads at the
 * file's offsets, several slots at once. The ring is the device's, shared by
 * the jobs in flight there: each chunk takes a slot from the scheduler
 * (sched_slot_acquire) and gives it back once its DMA (put) or its write-out
 * (get) is done, so a transfer holds at most its share of the ring while
 * others want slots, and a small job never waits behind a large one's ring.
 *
 * A chunk (a slot's worth) goes to the copy threads in parts
 * (XFER_PART_BYTES, transfer_impl.h), so that several threads fill or
 * empty one slot together and slots come ready in order.
 *
 * Put: the job keeps chunks handed to the copy threads ahead of the next DMA
 * (chunk j), as far as it can have slots without waiting; as each chunk is
 * read, in order, it issues that slot's DMA on its lane. Get is the mirror:
 * DMAs are issued into slots ahead, and a finished DMA is handed to a copy
 * thread to write out: by memcpy into a
 * shared mapping of the destination where the descriptor allows it (pwrites
 * to one file serialise on its inode lock; reads do not), populated first,
 * with the copy pool's store function (copy_store.h: memcpy, or
 * non-temporal stores with --copy-stores nt), else by pwrite.
 * Every chunk handed out
 * is waited for before the transfer returns, whatever happened, so that no
 * copy thread still touches a slot or a chunk afterwards.
 *
 * Worker thread, except part_read and part_write (copy threads).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "workers/transfer/copy_guard.h"
#include "workers/transfer/copy_hash.h"
#include "workers/transfer/map_cache.h"
#include "workers/sched/sched_wait.h"
#include "workers/transfer/transfer_impl.h"

/* A get's reservation of its destination's new blocks, on a copy thread (get_reserve). */
struct reserve_task {
	struct copy_task task; /* first */
	int fd;
	off_t at, len;
};

struct staged {
	struct xfer *x;
	struct xfer_chunk *ch; /* chunk k's record is ch[k % window] */
	unsigned window;
	struct copy_group group;
	uint64_t nchunks;
	struct copy_group reserve_group;
	struct reserve_task reserve;
	bool reserving;
};

/* Copy thread: the part's bytes from the source into its slot, until n or end of file. */
static void part_read(struct copy_task *task)
{
	struct xfer_part *p = (struct xfer_part *)task;
	struct xfer_chunk *c = p->chunk;
	struct xfer *x = c->x;
	unsigned char *buf = c->buf + p->off;
	uint64_t at = c->at + p->off;
	if (x->scratch) {
		copy_fill_random_words(buf, p->n, x->seed, at / 8);
		p->got = p->n;
	}
	while (p->got < p->n) {
		ssize_t r = pread(x->fd, buf + p->got, p->n - p->got, x->pos + (off_t)(at + p->got));
		if (r > 0) {
			p->got += (size_t)r;
		} else if (r == 0) {
			break;
		} else if (errno != EINTR) {
			p->error = errno;
			break;
		}
	}
	if (x->verify)
		p->sum = copy_hash_terms(buf, p->got, at / 8);
}

/*
 * Fills in the page tables for a chunk of the mapped destination in one
 * call. Left to page faults, each 4 KiB page of a 2 MiB chunk traps on its
 * own, and the traps, not the copy, set the pace (measured on a 6.18 kernel:
 * a GiB copied into a memfd mapping 2.5 times faster populated first). A
 * kernel without MADV_POPULATE_WRITE (before 5.14) says EINVAL and the
 * faults do the work; a failure of any other kind shows in the copy itself.
 */
static void populate_for_write(unsigned char *addr, size_t n)
{
	static const long populate_write = 23; /* MADV_POPULATE_WRITE, Linux 5.14 */
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)addr & ~(page - 1);
	(void)madvise((void *)start, (uintptr_t)addr + n - start, (int)populate_write);
}

/* Copy thread: the part's bytes out of its slot to the destination at its offset. */
static void part_write(struct copy_task *task)
{
	struct xfer_part *p = (struct xfer_part *)task;
	struct xfer_chunk *c = p->chunk;
	struct xfer *x = c->x;
	const unsigned char *buf = c->buf + p->off;
	uint64_t at = c->at + p->off;
	if (x->verify)
		p->sum = copy_hash_terms(buf, p->n, at / 8);
	if (x->map_data && p->n)
		populate_for_write(x->map_data + at, p->n);
	if (x->map_data || x->scratch) {
		p->error = x->scratch ? 0
				      : copy_guarded_store(x->map_data + at, buf, p->n,
							   copy_pool_store(x->pool));
		p->got = p->error ? 0 : p->n;
		return;
	}
	while (p->got < p->n) {
		ssize_t w = pwrite(x->fd, buf + p->got, p->n - p->got, x->pos + (off_t)(at + p->got));
		if (w > 0) {
			p->got += (size_t)w;
		} else if (w == 0) {
			p->error = EIO; /* a regular file that takes nothing */
			break;
		} else if (errno != EINTR) {
			p->error = errno;
			break;
		}
	}
}

/*
 * The pieces of a transfer, one per slot: whole slots, except that with
 * slots of XFER_RAMP_MIN_CHUNK or more and four slots' worth to move, the
 * first slot's span and the last one's are each cut into four pieces of
 * 1/8, 1/8, 1/4 and 1/2 slot (the last span in the mirror order: 1/2,
 * 1/4, 1/8, 1/8). A put's first DMA waits for its first piece to be read
 * by one copy thread (2 MiB: about 0.6 ms on the H200 machine, an eighth
 * of a 256 MiB put at pinned speed), and a get's last write-out follows
 * its last DMA; a small piece at each end shortens both, while the other
 * threads already read or write the larger pieces after it.
 */
#define XFER_RAMP_MIN_CHUNK ((size_t)128 << 10)
#define XFER_RAMP_PIECES 4

static bool ramped(uint64_t total, size_t chunk)
{
	return chunk >= XFER_RAMP_MIN_CHUNK && total >= 4 * (uint64_t)chunk;
}

uint64_t xfer_piece_count(uint64_t total, size_t chunk)
{
	if (!ramped(total, chunk))
		return (total + chunk - 1) / chunk;
	uint64_t middle = ((total - chunk) & ~(uint64_t)7) - chunk;
	return 2 * XFER_RAMP_PIECES + (middle + chunk - 1) / chunk;
}

/* Piece i (0-3) of a ramp from small to a slot: its offset within the slot's span and its size. */
static void ramp_piece(size_t chunk, unsigned i, size_t *at, size_t *n)
{
	size_t eighth = (chunk / 8) & ~(size_t)7;
	static const unsigned eighths_before[XFER_RAMP_PIECES] = { 0, 1, 2, 4 };
	*at = eighths_before[i] * eighth;
	*n = i == XFER_RAMP_PIECES - 1 ? chunk - 4 * eighth : i == 2 ? 2 * eighth : eighth;
}

/*
 * Offsets stay multiples of 8 (the checksum and the scratch stream count
 * in words): the last span starts a slot before the end, rounded down to
 * 8, and its last piece takes the odd bytes.
 */
void xfer_piece(uint64_t total, size_t chunk, uint64_t k, uint64_t *at, size_t *n)
{
	uint64_t count = xfer_piece_count(total, chunk);
	uint64_t tail = (total - chunk) & ~(uint64_t)7;
	size_t in, len;
	if (!ramped(total, chunk)) {
		*at = k * chunk;
		*n = total - *at < chunk ? (size_t)(total - *at) : chunk;
	} else if (k < XFER_RAMP_PIECES) {
		ramp_piece(chunk, (unsigned)k, &in, &len);
		*at = in;
		*n = len;
	} else if (k >= count - XFER_RAMP_PIECES) {
		/* the ramp's mirror: piece 3 (half a slot) first */
		unsigned i = (unsigned)(count - 1 - k);
		ramp_piece(chunk, i, &in, &len);
		*at = tail + (chunk - in - len);
		*n = i == 0 ? (size_t)(total - *at) : len;
	} else {
		*at = (k - XFER_RAMP_PIECES + 1) * chunk;
		*n = tail - *at < chunk ? (size_t)(tail - *at) : chunk;
	}
}

static int staged_open(struct staged *s, struct xfer *x)
{
	memset(s, 0, sizeof *s);
	s->x = x;
	s->nchunks = xfer_piece_count(x->total, x->chunk);
	s->window = x->slots;
	s->ch = calloc(s->window, sizeof *s->ch);
	if (!s->ch)
		return gpuq_fail(x->err, GPUQ_E_OUT_OF_MEMORY, "no host memory for %u chunk records",
				 s->window);
	copy_group_init(&s->group);
	return 0;
}

static struct xfer_chunk *chunk_of(struct staged *s, uint64_t k)
{
	return &s->ch[k % s->window];
}

/* Cuts the chunk into parts of about XFER_PART_BYTES, offsets multiples of 8 (the checksum's words). */
static void chunk_split(struct staged *s, struct xfer_chunk *c, copy_task_fn fn)
{
	size_t fit = c->n / XFER_PART_BYTES;
	c->nparts = fit < 2 ? 1 : fit > XFER_MAX_PARTS ? XFER_MAX_PARTS : (unsigned)fit;
	size_t each = (c->n / c->nparts) & ~(size_t)7;
	for (unsigned i = 0; i < c->nparts; i++) {
		struct xfer_part *p = &c->part[i];
		p->task.fn = fn;
		p->task.group = &s->group;
		p->chunk = c;
		p->off = i * each;
		p->n = i + 1 == c->nparts ? c->n - p->off : each;
	}
}

static void chunk_submit(struct staged *s, struct xfer_chunk *c)
{
	for (unsigned i = 0; i < c->nparts; i++)
		copy_pool_submit(s->x->pool, &c->part[i].task);
}

static bool chunk_done(struct xfer_chunk *c)
{
	for (unsigned i = 0; i < c->nparts; i++)
		if (!copy_task_done(&c->part[i].task))
			return false;
	return true;
}

/* Waits for every part, then sums them up into the chunk's got, error and sum. */
static void chunk_gather(struct xfer_chunk *c)
{
	bool short_part = false;
	for (unsigned i = 0; i < c->nparts; i++) {
		struct xfer_part *p = &c->part[i];
		copy_task_wait(&p->task);
		if (short_part)
			continue;
		c->sum += p->sum;
		c->got = p->off + p->got;
		c->error = p->error;
		short_part = p->error || p->got < p->n;
	}
}

/* Chunk k's record, with a slot taken (waiting for one only if `wait`); NULL without a slot. */
static struct xfer_chunk *chunk_prepare(struct staged *s, uint64_t k, copy_task_fn fn, bool wait)
{
	struct xfer *x = s->x;
	unsigned slot;
	if (sched_slot_acquire(x->dev, wait, &slot) != 0)
		return NULL;
	struct xfer_chunk *c = chunk_of(s, k);
	memset(c, 0, sizeof *c);
	c->x = x;
	c->slot = slot;
	c->buf = x->dev->staging[slot];
	xfer_piece(x->total, x->chunk, k, &c->at, &c->n);
	chunk_split(s, c, fn);
	return c;
}

/* Gives a chunk's slot back once its last DMA is done (waiting for it, unless the device faulted). */
static void chunk_release(struct staged *s, struct xfer_chunk *c, bool dma_issued)
{
	struct xfer *x = s->x;
	struct gpuq_error ignored;
	if (dma_issued && !x->dev->faulted)
		x->dev->ops->copy.slot_wait(x->dev, c->slot, &ignored);
	sched_slot_release(x->dev, c->slot);
}

/*
 * Why a write into the mapped destination failed (copy_guard turned its
 * SIGBUS into an error): the file shrank under the mapping, or its
 * filesystem could not back the pages (full, or over a quota), which
 * fallocate over the chunk's range then reports as the system's own error.
 */
static int chunk_mapped_error(struct xfer *x, const struct xfer_chunk *c)
{
	struct stat st;
	off_t at = x->pos + (off_t)c->at;
	if (fstat(x->fd, &st) == 0 && st.st_size < at + (off_t)c->n)
		return gpuq_fail(x->err, GPUQ_E_IO,
				 "writing the destination at byte %llu: the file shrank while it "
				 "was written", (unsigned long long)c->at);
	int error = fallocate(x->fd, 0, at, (off_t)c->n) < 0 ? errno : 0;
	if (error == 0 || error == EOPNOTSUPP || error == ENOSYS)
		return gpuq_fail(x->err, GPUQ_E_IO,
				 "writing the destination at byte %llu: the mapped write failed though "
				 "the file holds that range (is its filesystem full?)",
				 (unsigned long long)c->at);
	return gpuq_fail(x->err, GPUQ_E_IO, "writing the destination at byte %llu: %s",
			 (unsigned long long)c->at, strerror(error));
}

/* A finished chunk: its read or write error, or a source that ended early. */
static int chunk_check(struct xfer *x, const struct xfer_chunk *c, bool put)
{
	if (c->error && !put && x->map_data)
		return chunk_mapped_error(x, c);
	if (c->error)
		return gpuq_fail(x->err, GPUQ_E_IO, "%s the %s at byte %llu: %s",
				 put ? "reading" : "writing", put ? "source" : "destination",
				 (unsigned long long)(c->at + c->got), strerror(c->error));
	if (c->got < c->n)
		return gpuq_fail(x->err, GPUQ_E_IO,
				 "the source ended after %llu of the %llu bytes %s",
				 (unsigned long long)(c->at + c->got), (unsigned long long)x->total,
				 x->work->transfer.length_exact ? "asked for"
								  : "it held when the put started");
	return 0;
}

/*
 * DMAs a transfer keeps queued on its lane at most: the device's whole
 * queue when the transfer has had it to itself a while (sched.h's DMA
 * turns hold it to SCHED_DMA_QUEUE, 12 MiB, a quarter of a millisecond of
 * PCIe, while the device is shared).
 */
#define XFER_MAX_QUEUED_DMAS SCHED_DMA_QUEUE_ALONE

/*
 * One DMA covers at most this many neighbouring slots, and bytes. The
 * copy engine runs larger DMAs faster (on the H200 machine, 256 MiB of
 * pinned copies: 51.6 GB/s in DMAs of 2 MiB, 54.5 in DMAs of 8 MiB, 55.5
 * in one; docs/PERFORMANCE.md, "One DMA a slot"), and a put that reads
 * faster than PCIe moves finds several slots read and waiting whenever a
 * turn comes. Spans are taken only while the job has the device to itself
 * (sched_dma_alone); the slots cap is what a span may add to the queue
 * beyond the turn it was given.
 */
#define XFER_DMA_SPAN_SLOTS 4
#define XFER_DMA_SPAN_BYTES ((size_t)8 << 20)

/* Whether chunk b's slot follows chunk a's in the ring, its bytes right after a's in the transfer. */
static bool chunks_adjoin(const struct xfer_chunk *a, const struct xfer_chunk *b)
{
	return a->buf + a->n == b->buf && a->at + a->n == b->at;
}

/* ---- put ---- */

/* Where a put is: chunks [r, j) have DMAs issued, [j, next) are being read. */
struct put_state {
	uint64_t r, j, next;
};

/* Gives back the slots of chunks whose DMA has finished, oldest first. */
static int put_reclaim(struct staged *s, struct put_state *p)
{
	struct xfer *x = s->x;
	while (p->r < p->j) {
		bool ready = false;
		struct xfer_chunk *c = chunk_of(s, p->r);
		if (x->dev->ops->copy.slot_ready(x->dev, c->slot, &ready, x->err) < 0)
			return -1;
		if (!ready)
			break;
		sched_slot_release(x->dev, c->slot);
		p->r++;
	}
	return 0;
}

/*
 * Hands reads to the copy threads for as many chunks ahead as the job can
 * have slots for now. When nothing is being read, chunk j needs a slot: the
 * oldest DMA's, once done, or a free one, waited for.
 */
static int put_fill(struct staged *s, struct put_state *p)
{
	struct xfer *x = s->x;
	while (p->next < s->nchunks && p->next < p->r + s->window) {
		bool must = p->next == p->j && p->r == p->j;
		struct xfer_chunk *c = chunk_prepare(s, p->next, part_read, must);
		if (!c)
			break;
		chunk_submit(s, c);
		p->next++;
	}
	if (p->next > p->j)
		return 0;
	/* Nothing is read and no slot is free to us: the oldest DMA's slot comes back first. */
	struct xfer_chunk *oldest = chunk_of(s, p->r);
	if (x->dev->ops->copy.slot_wait(x->dev, oldest->slot, x->err) < 0)
		return -1;
	sched_slot_release(x->dev, oldest->slot);
	p->r++;
	return put_fill(s, p);
}

/* Waits for what is still out: reads [j, next) and DMAs [r, j); gives every slot back. */
static void put_close(struct staged *s, const struct put_state *p)
{
	for (uint64_t k = p->j; k < p->next; k++) {
		chunk_gather(chunk_of(s, k));
		chunk_release(s, chunk_of(s, k), false);
	}
	for (uint64_t k = p->r; k < p->j; k++)
		chunk_release(s, chunk_of(s, k), true);
	copy_group_destroy(&s->group);
	free(s->ch);
	sched_dma_leave(s->x->job);
}

struct put_wait {
	struct staged *s;
	const struct put_state *p;
};

/* Chunk j can go to the copy engine, or the oldest DMA is done (its slot can take another read). */
static bool put_can_move(void *arg)
{
	const struct put_wait *w = arg;
	const struct put_state *p = w->p;
	struct xfer *x = w->s->x;
	bool ready = true;
	struct gpuq_error ignored;
	if (chunk_done(chunk_of(w->s, p->j)) && p->j - p->r < XFER_MAX_QUEUED_DMAS &&
	    sched_dma_turn(x->job, SCHED_DMA_H2D))
		return true;
	if (p->r == p->j)
		return false;
	if (x->dev->ops->copy.slot_ready(x->dev, chunk_of(w->s, p->r)->slot, &ready, &ignored) < 0)
		return true; /* a fault: the next call says it */
	return ready;
}

/*
 * How many chunks from j one DMA takes: chunk j, and while the job has the
 * device to itself, the read chunks after it whose slots follow its slot,
 * up to XFER_DMA_SPAN_SLOTS and _BYTES.
 */
static uint64_t put_span(struct staged *s, const struct put_state *p)
{
	size_t bytes = chunk_of(s, p->j)->n;
	uint64_t k = p->j + 1;
	if (!sched_dma_alone(s->x->job))
		return 1;
	for (; k < p->next && k - p->j < XFER_DMA_SPAN_SLOTS; k++) {
		struct xfer_chunk *c = chunk_of(s, k);
		if (!chunks_adjoin(chunk_of(s, k - 1), c) || bytes + c->n > XFER_DMA_SPAN_BYTES ||
		    !chunk_done(c))
			break;
		bytes += c->n;
	}
	return k - p->j;
}

/* Chunks [j, j + span) read: checked, and moved by one DMA. */
static int put_issue(struct staged *s, struct put_state *p, uint64_t span)
{
	struct xfer *x = s->x;
	struct xfer_chunk *first = chunk_of(s, p->j);
	size_t bytes = 0;
	for (uint64_t k = p->j; k < p->j + span; k++) {
		struct xfer_chunk *c = chunk_of(s, k);
		chunk_gather(c);
		if (chunk_check(x, c, true) != 0)
			return -1;
		bytes += c->n;
	}
	if (x->dev->ops->copy.h2d_async(x->dev, x->base + first->at, first->slot, bytes, x->err) != 0)
		return -1;
	for (uint64_t k = p->j; k < p->j + span; k++) {
		struct xfer_chunk *c = chunk_of(s, k);
		sched_dma_queued(x->job, c->slot, SCHED_DMA_H2D);
		x->sum += c->sum;
	}
	xfer_dma_issued(x);
	p->j += span;
	x->done += bytes;
	xfer_progress(x);
	if (p->j == s->nchunks)
		xfer_issued_all(x);
	return 0;
}

int xfer_put_staged(struct xfer *x)
{
	struct staged s;
	struct put_state p = { 0, 0, 0 };
	struct put_wait wait = { &s, &p };
	int rc = staged_open(&s, x);
	if (rc != 0)
		return rc;
	while (p.j < s.nchunks && rc == 0) {
		if ((rc = xfer_cancelled(x)) != 0 || (rc = put_reclaim(&s, &p)) != 0 ||
		    (rc = put_fill(&s, &p)) != 0)
			break;
		struct xfer_chunk *c = chunk_of(&s, p.j);
		if (!chunk_done(c) || p.j - p.r >= XFER_MAX_QUEUED_DMAS ||
		    !sched_dma_turn(x->job, SCHED_DMA_H2D)) {
			/* meanwhile, slots whose DMAs end take further reads */
			sched_wait_device(put_can_move, &wait);
			continue;
		}
		rc = put_issue(&s, &p, put_span(&s, &p));
	}
	put_close(&s, &p);
	return rc;
}

/* ---- get ---- */

/* Where a get is: chunks [collected, w) are being written out, [w, issued) have DMAs issued. */
struct get_state {
	uint64_t collected, w, issued;
};

/* A chunk a copy thread has written out: its outcome, counted once, and its slot back. */
static int get_collect(struct staged *s, struct get_state *g)
{
	struct xfer *x = s->x;
	struct xfer_chunk *c = chunk_of(s, g->collected);
	chunk_gather(c);
	g->collected++;
	sched_slot_release(x->dev, c->slot);
	if (chunk_check(x, c, false) < 0)
		return -1;
	x->sum += c->sum;
	x->done += c->n;
	xfer_progress(x);
	return 0;
}

/*
 * One DMA on a turn: into a slot for chunk `issued` (waiting for one only if
 * `must`) and, while the job has the device to itself, into the free slots
 * after it for the chunks after it, up to XFER_DMA_SPAN_SLOTS and _BYTES. 1: issued;
 * 0: no slot free now; -1: the DMA failed (its chunks count as issued, so
 * that get_close waits for their slots).
 */
static int get_issue(struct staged *s, struct get_state *g, bool must)
{
	struct xfer *x = s->x;
	struct xfer_chunk *first = chunk_prepare(s, g->issued, part_write, must);
	if (!first)
		return 0;
	uint64_t from = g->issued, end = from + 1;
	size_t bytes = first->n;
	bool alone = sched_dma_alone(x->job);
	while (alone && end < s->nchunks && end < g->collected + s->window &&
	       end - from < XFER_DMA_SPAN_SLOTS) {
		struct xfer_chunk *c = chunk_prepare(s, end, part_write, false);
		if (!c)
			break;
		if (!chunks_adjoin(chunk_of(s, end - 1), c) || bytes + c->n > XFER_DMA_SPAN_BYTES) {
			sched_slot_release(x->dev, c->slot);
			break;
		}
		bytes += c->n;
		end++;
	}
	g->issued = end;
	if (x->dev->ops->copy.d2h_async(x->dev, first->slot, x->base + first->at, bytes, x->err) < 0)
		return -1;
	for (uint64_t k = from; k < end; k++)
		sched_dma_queued(x->job, chunk_of(s, k)->slot, SCHED_DMA_D2H);
	xfer_dma_issued(x);
	if (g->issued == s->nchunks)
		xfer_issued_all(x);
	return 1;
}

/*
 * Issues DMAs for as many chunks ahead as the job can have slots for now;
 * when none is in flight, chunk w needs one: the oldest write's, once
 * done, or a free one, waited for.
 */
static int get_fill(struct staged *s, struct get_state *g)
{
	struct xfer *x = s->x;
	while (g->collected < g->w && chunk_done(chunk_of(s, g->collected)))
		if (get_collect(s, g) < 0)
			return -1;
	while (g->issued < s->nchunks && g->issued < g->collected + s->window &&
	       g->issued - g->w < XFER_MAX_QUEUED_DMAS) {
		bool must = g->issued == g->w && g->collected == g->w;
		if (!xfer_dma_turn(x, SCHED_DMA_D2H, must))
			break;
		int issued = get_issue(s, g, must);
		if (issued < 0)
			return -1;
		if (issued == 0)
			break;
	}
	if (g->issued > g->w)
		return 0;
	if (get_collect(s, g) < 0) /* the oldest write's slot comes back first */
		return -1;
	return get_fill(s, g);
}

/*
 * Maps the destination range when the descriptor allows it (open for
 * reading and writing), growing the file to hold the range first; else the
 * copy threads pwrite. A file that cannot be mapped is simply pwritten.
 * The mapping is kept for the next get into the same file (map_cache.h):
 * that get then neither maps nor unmaps, and finds the page table entries
 * it writes through already made.
 */
static void get_map_destination(struct xfer *x)
{
	long page = sysconf(_SC_PAGESIZE);
	off_t end = x->pos + (off_t)x->total, start = x->pos - x->pos % page;
	struct gpuq_error ignored;
	bool hit;
	void *map;
	if (x->scratch || (x->fd_flags & O_ACCMODE) != O_RDWR || x->total == 0 ||
	    (x->size < end && ftruncate(x->fd, end) < 0))
		return;
	size_t len = (size_t)(end - start + page - 1) / (size_t)page * (size_t)page;
	struct map_want want = { .fd = x->fd, .start = start, .len = len, .rw = true };
	if (map_cache_acquire(x->dev, x->pool, &want, &x->map_entry, &map, &hit, &ignored) < 0)
		return;
	/*
	 * Pages the get creates (a fresh memfd or tmpfs file) come as 2 MiB
	 * pages where shmem's policy allows them on request ("advise"): one
	 * allocation, fault and unmap for 512 small ones. Pages that exist
	 * stay as they are; a refusal changes nothing.
	 */
	if (!hit)
		(void)madvise(map, len, MADV_HUGEPAGE);
	x->map = map;
	x->map_len = len;
	x->map_data = x->map + (x->pos - start);
}

static void part_reserve(struct copy_task *task)
{
	struct reserve_task *r = (struct reserve_task *)task;
	while (fallocate(r->fd, 0, r->at, r->len) < 0 && errno == EINTR)
		;
}

/*
 * The part of a get's range past the destination's old end is new to a
 * disk file: its blocks are allocated in one fallocate, on a copy thread
 * while the first DMAs run, rather than a delayed allocation at each
 * page's first write (ext4 on the development machine, a fresh 512 MiB
 * file written mapped by 2 threads: 0.5-3.1 GB/s alone, 3.0-4.6 GB/s
 * with the blocks allocated first; by pwrite 2.5-4.1, and 5.3-5.5).
 * Copy threads that reach a page first race it harmlessly: either
 * allocation stands. Not for shmem (memfds, tmpfs), whose fallocate makes
 * the pages themselves one at a time under the inode's lock, nor when
 * it fails (the writes allocate as before).
 */
static void get_reserve(struct staged *s)
{
	struct xfer *x = s->x;
	struct statfs fs;
	off_t from = x->pos > x->size ? x->pos : x->size, end = x->pos + (off_t)x->total;
	if (x->scratch || from >= end || fstatfs(x->fd, &fs) < 0)
		return;
	unsigned long type = (unsigned long)fs.f_type & 0xffffffffUL;
	if (type == 0x01021994UL /* tmpfs, memfds */ || type == 0x958458f6UL /* hugetlbfs */)
		return;
	copy_group_init(&s->reserve_group);
	s->reserve = (struct reserve_task){ .fd = x->fd, .at = from, .len = end - from };
	s->reserve.task.fn = part_reserve;
	s->reserve.task.group = &s->reserve_group;
	s->reserving = true;
	copy_pool_submit(x->pool, &s->reserve.task);
}

/*
 * The mapping goes back to the cache: kept after a get that went well into
 * pages that existed before it. A get that made the destination's pages
 * (a fresh memfd) unmaps now, as it always did: kept, the mapping would be
 * the last holder of a memfd its client closes, and the next get would
 * pay for freeing its pages.
 */
static void unmap_destination(struct xfer *x, int rc)
{
	struct gpuq_error ignored;
	bool existed = x->size >= x->pos + (off_t)x->total;
	(void)map_cache_release(x->dev, x->pool, x->map_entry, x->fd, rc == 0 && existed, &ignored);
	x->map_entry = NULL;
	x->map = x->map_data = NULL;
}

/* Waits for what is still out: DMAs [w, issued) and writes [collected, w); gives every slot back. */
static void get_close(struct staged *s, const struct get_state *g)
{
	for (uint64_t k = g->collected; k < g->w; k++) {
		chunk_gather(chunk_of(s, k));
		chunk_release(s, chunk_of(s, k), false);
	}
	for (uint64_t k = g->w; k < g->issued; k++)
		chunk_release(s, chunk_of(s, k), true);
	if (s->reserving) {
		copy_task_wait(&s->reserve.task);
		copy_group_destroy(&s->reserve_group);
	}
	copy_group_destroy(&s->group);
	free(s->ch);
	sched_dma_leave(s->x->job);
}

struct get_wait {
	struct staged *s;
	const struct get_state *g;
};

/* Chunk w's DMA is done, or the oldest write is (its slot can take another DMA). */
static bool get_can_move(void *arg)
{
	const struct get_wait *w = arg;
	const struct get_state *g = w->g;
	struct xfer *x = w->s->x;
	bool ready = true;
	struct gpuq_error ignored;
	if (x->dev->ops->copy.slot_ready(x->dev, chunk_of(w->s, g->w)->slot, &ready, &ignored) < 0)
		return true; /* a fault: the next call says it */
	return ready || (g->collected < g->w && chunk_done(chunk_of(w->s, g->collected)));
}

/*
 * A get that failed leaves the destination no longer than it was: the
 * mapped path grew it to the whole range first, and pwrites may have grown
 * it part way. If that fails too, the job's error says so.
 */
static void get_restore_length(struct xfer *x)
{
	struct stat st;
	int rc;
	if (x->scratch || fstat(x->fd, &st) < 0 || st.st_size <= x->size)
		return;
	while ((rc = ftruncate(x->fd, x->size)) < 0 && errno == EINTR)
		;
	size_t used = strlen(x->err->message);
	if (rc < 0 && used < sizeof x->err->message)
		snprintf(x->err->message + used, sizeof x->err->message - used,
			 "; restoring the destination's length of %lld bytes failed too: %s",
			 (long long)x->size, strerror(errno));
}

int xfer_get_staged(struct xfer *x)
{
	struct staged s;
	struct get_state g = { 0, 0, 0 };
	struct get_wait wait = { &s, &g };
	get_map_destination(x);
	int rc = staged_open(&s, x);
	if (rc == 0)
		get_reserve(&s);
	while (rc == 0 && g.w < s.nchunks) {
		if ((rc = xfer_cancelled(x)) != 0 || (rc = get_fill(&s, &g)) != 0)
			break;
		struct xfer_chunk *c = chunk_of(&s, g.w);
		bool ready = false;
		if ((rc = x->dev->ops->copy.slot_ready(x->dev, c->slot, &ready, x->err)) != 0)
			break;
		if (!ready) { /* meanwhile, slots whose writes end take further DMAs */
			sched_wait_device(get_can_move, &wait);
			continue;
		}
		chunk_submit(&s, c);
		g.w++;
	}
	/* The last writes: checked in order, stopping at the first failure. */
	while (rc == 0 && g.collected < g.w)
		rc = get_collect(&s, &g);
	if (rc == 0 && x->done < x->total && !atomic_load(&x->work->cancel))
		rc = gpuq_fail(x->err, GPUQ_E_INTERNAL, "get: %llu of %llu bytes written",
			       (unsigned long long)x->done, (unsigned long long)x->total);
	if (s.ch)
		get_close(&s, &g);
	if (x->map)
		unmap_destination(x, rc);
	if (rc != 0)
		get_restore_length(x);
	return rc;
}
