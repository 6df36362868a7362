/*
 * put and get: choosing the path, the streamed path, verification and the
 * bookkeeping every path shares. Worker thread only (see transfer.h).
 *
 * Descriptors belong to clients: a pipe may stall for ever. Descriptors read
 * or written in order are polled without blocking; while one is not ready
 * the job sleeps in growing steps up to POLL_MAX_S (yielding to the
 * scheduler, so other jobs on the device go on), and a cancel is seen at
 * the next look. One that moves no byte for the job's idle timeout
 * (--transfer-idle-timeout) fails the job rather than holding its device.
 */
#include "workers/transfer/transfer.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "protocol/hash.h"
#include "workers/clock.h"
#include "workers/transfer/copy_hash.h"
#include "workers/sched/sched_wait.h"
#include "workers/transfer/transfer_impl.h"

#define POLL_FIRST_S 20e-6
#define POLL_MAX_S 5e-3
#define POLL_ALONE_MS 1

static const char *const path_names[] = {
	[XFER_STAGED] = "staged",
	[XFER_STREAMED] = "streamed",
	[XFER_REGISTERED] = "registered",
	[XFER_REGION] = "region",
	[XFER_RING] = "ring",
};

int xfer_cancelled(struct xfer *x)
{
	if (!atomic_load(&x->work->cancel))
		return 0;
	return gpuq_fail(x->err, GPUQ_E_CANCELLED, "job cancelled after %llu bytes",
			 (unsigned long long)x->done);
}

void xfer_progress(struct xfer *x)
{
	atomic_store_explicit(&x->work->progress_bytes, x->done, memory_order_relaxed);
}

void xfer_dma_issued(struct xfer *x)
{
	struct transfer_timeline *t = x->work->transfer.timeline;
	atomic_store_explicit(&x->work->dma_issued, true, memory_order_relaxed);
	if (!t)
		return;
	t->last_dma_s = monotonic_seconds() - x->started;
	if (t->first_dma_s == 0)
		t->first_dma_s = t->last_dma_s;
}

struct turn_wait {
	struct xfer *x;
	enum sched_dma dir;
};

static bool turn_given(void *arg)
{
	const struct turn_wait *t = arg;
	return sched_dma_turn(t->x->job, t->dir);
}

bool xfer_dma_turn(struct xfer *x, enum sched_dma dir, bool wait)
{
	if (!wait)
		return sched_dma_turn(x->job, dir);
	struct turn_wait t = { x, dir };
	sched_wait_device(turn_given, &t);
	return true;
}

void xfer_issued_all(struct xfer *x)
{
	if (x->publish_tail)
		sched_publish_tail(x->dev);
}

/* ---- the streamed path: in order, by the worker ---- */

/* What kind of descriptor a client passed, for messages. */
static const char *stream_fd_kind(const struct xfer *x)
{
	if (S_ISFIFO(x->mode))
		return "pipe";
	if (S_ISSOCK(x->mode))
		return "socket";
	if (S_ISCHR(x->mode))
		return x->tty ? "terminal" : "character device";
	if (S_ISBLK(x->mode))
		return "block device";
	if (S_ISREG(x->mode))
		return "regular file";
	return "descriptor of no file type (an epoll, eventfd or other anonymous inode)";
}

/* Fails the transfer when its descriptor has moved no byte for the job's idle timeout. */
static int stream_check_idle(struct xfer *x, short events, uint64_t at)
{
	unsigned limit = x->work->transfer.idle_timeout_ms;
	if (limit == 0 || x->regular || (monotonic_seconds() - x->moved_at) * 1000 < limit)
		return 0;
	bool reading = events == POLLIN;
	return gpuq_fail(x->err, GPUQ_E_TIMEOUT,
			 "the %s (a %s) %s no byte for %u ms (--transfer-idle-timeout); the job stopped after %llu bytes",
			 reading ? "source" : "destination", stream_fd_kind(x),
			 reading ? "yielded" : "took", limit, (unsigned long long)at);
}

/*
 * Waits until the descriptor is ready for `events`, the job is cancelled,
 * or the descriptor has been idle too long: polls without blocking and
 * sleeps between looks, in steps that grow while nothing comes (so a
 * stalled pipe costs a look every few milliseconds, and a busy one is read
 * as soon as it has data). While the job is its device's only business
 * (sched_alone), poll itself waits, POLL_ALONE_MS at a time: the kernel
 * wakes it as soon as a pipe's reader has made room (or its writer put
 * data), where the sleeps woke 20 us to milliseconds late, at every slot
 * of a pipe drained faster than that (a get into a pipe: 2.16 GB/s on the
 * H200 machine, its 1 MiB pipe drained by one thread).
 */
static int stream_wait(struct xfer *x, short events, uint64_t at)
{
	double pause = POLL_FIRST_S;
	for (;;) {
		if (atomic_load(&x->work->cancel))
			return gpuq_fail(x->err, GPUQ_E_CANCELLED, "job cancelled after %llu bytes",
					 (unsigned long long)at);
		if (stream_check_idle(x, events, at) < 0)
			return -1;
		struct pollfd p = { .fd = x->fd, .events = events };
		bool alone = sched_alone();
		int n = poll(&p, 1, alone ? POLL_ALONE_MS : 0);
		if (n > 0)
			return 0; /* ready, or an error the next call will report */
		if (n < 0 && errno != EINTR)
			return gpuq_fail(x->err, GPUQ_E_IO, "poll on the client's descriptor: %s",
					 strerror(errno));
		if (alone)
			continue; /* poll waited: look at the cancel, the timeout and the others again */
		sched_sleep(pause);
		pause = pause * 2 < POLL_MAX_S ? pause * 2 : POLL_MAX_S;
	}
}

/* Reads up to n bytes; fewer only at end of file. Returns the count or -1. */
static ssize_t stream_read(struct xfer *x, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		if (stream_wait(x, POLLIN, x->done + got) < 0)
			return -1;
		ssize_t r = read(x->fd, (char *)buf + got, n - got);
		if (r > 0) {
			got += (size_t)r;
			x->moved_at = monotonic_seconds();
			/* A slow pipe shows progress before its slot is full. */
			atomic_store_explicit(&x->work->progress_bytes, x->done + got,
					      memory_order_relaxed);
		} else if (r == 0) {
			break;
		} else if (errno != EINTR && errno != EAGAIN) {
			return gpuq_fail(x->err, GPUQ_E_IO, "reading the source after %llu bytes: %s",
					 (unsigned long long)(x->done + got), strerror(errno));
		}
	}
	return (ssize_t)got;
}

/*
 * How much one write to the destination may carry without blocking, now
 * that poll said it is writable. A blocking pipe or terminal would block
 * the worker in write() (and so hold off cancels and the idle timeout) for
 * as long as its reader stalls, unless the write fits: a pipe takes what its
 * free pages hold (its size less what is unread, less the two pages that a
 * partly read head and a partly written tail may waste; poll's POLLOUT
 * promises at least one free page), a terminal PIPE_BUF. A socket is sent to with
 * MSG_DONTWAIT instead (stream_write_some), and a descriptor the client made
 * non-blocking answers EAGAIN.
 */
static size_t stream_write_room(struct xfer *x, size_t n)
{
	int unread = 0;
	size_t room = n;
	if (x->fd_flags & O_NONBLOCK)
		return n;
	if (S_ISFIFO(x->mode)) {
		long free_bytes = x->pipe_size > 0 && ioctl(x->fd, FIONREAD, &unread) == 0
					  ? (long)x->pipe_size - unread - 2 * 4096 : 0;
		room = free_bytes > PIPE_BUF ? (size_t)free_bytes : PIPE_BUF;
	} else if (x->tty) {
		room = PIPE_BUF;
	}
	return n < room ? n : room;
}

/* One write of what the destination takes without blocking (see stream_write_room). */
static ssize_t stream_write_some(struct xfer *x, const void *buf, size_t n)
{
	if (S_ISSOCK(x->mode))
		return send(x->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
	return write(x->fd, buf, stream_write_room(x, n));
}

static int stream_write(struct xfer *x, const void *buf, size_t n)
{
	size_t put = 0;
	while (put < n) {
		if (stream_wait(x, POLLOUT, x->done + put) < 0)
			return -1;
		ssize_t w = stream_write_some(x, (const char *)buf + put, n - put);
		if (w > 0) {
			put += (size_t)w;
			x->moved_at = monotonic_seconds();
			/* A slow reader sees progress before its slot is written out. */
			atomic_store_explicit(&x->work->progress_bytes, x->done + put,
					      memory_order_relaxed);
		} else if (w == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
			return gpuq_fail(x->err, GPUQ_E_IO, "writing the destination after %llu bytes: %s",
					 (unsigned long long)(x->done + put),
					 w == 0 ? "wrote nothing" : strerror(errno));
	}
	return 0;
}

/* Slots of a streamed transfer: DMAs in flight in order, each slot given back once its DMA is done. */
struct stream_ring {
	unsigned slot[GPUQ_MAX_STAGING_SLOTS];
	size_t size[GPUQ_MAX_STAGING_SLOTS];
	unsigned head, count;
};

static void ring_push(struct stream_ring *r, unsigned slot, size_t size)
{
	unsigned at = (r->head + r->count++) % GPUQ_MAX_STAGING_SLOTS;
	r->slot[at] = slot;
	r->size[at] = size;
}

/* Waits for the oldest DMA and takes it off the ring (its slot is still held). */
static int ring_pop(struct xfer *x, struct stream_ring *r, unsigned *slot, size_t *size)
{
	if (r->count == 0)
		return gpuq_fail(x->err, GPUQ_E_INTERNAL,
				 "[gpu %d] streamed transfer: no staging slot to be had outside a job",
				 x->dev->index);
	*slot = r->slot[r->head];
	*size = r->size[r->head];
	r->head = (r->head + 1) % GPUQ_MAX_STAGING_SLOTS;
	r->count--;
	return x->dev->ops->copy.slot_wait(x->dev, *slot, x->err);
}

/* Waits for every DMA still on the ring and gives its slot back; keeps the first error. */
static int ring_drain(struct xfer *x, struct stream_ring *r, int rc)
{
	while (r->count) {
		unsigned slot;
		size_t size = 0;
		struct gpuq_error err;
		struct gpuq_error *keep = x->err;
		x->err = &err;
		if (ring_pop(x, r, &slot, &size) < 0 && rc == 0) {
			*keep = err;
			rc = -1;
		}
		x->err = keep;
		sched_slot_release(x->dev, slot);
	}
	return rc;
}

/* A slot for the next chunk: a free one while the job may have more, else the oldest DMA's. */
static int ring_slot(struct xfer *x, struct stream_ring *r, unsigned *slot)
{
	size_t size;
	if (r->count < x->slots && sched_slot_acquire(x->dev, r->count == 0, slot) == 0)
		return 0;
	return ring_pop(x, r, slot, &size);
}

/* Reading the next chunk into a slot overlaps the DMAs of those before it, which take DMA turns. */
static int put_streamed(struct xfer *x)
{
	struct device *dev = x->dev;
	struct stream_ring ring = { .count = 0 };
	int rc = 0;
	while (x->done < x->total && rc == 0 && (rc = xfer_cancelled(x)) == 0) {
		size_t want = x->total - x->done < x->chunk ? (size_t)(x->total - x->done) : x->chunk;
		unsigned slot;
		if ((rc = ring_slot(x, &ring, &slot)) != 0)
			break;
		ssize_t got = stream_read(x, dev->staging[slot], want);
		if (got <= 0) {
			sched_slot_release(dev, slot);
			rc = got < 0 ? -1 : 0;
			x->eof = got == 0;
			break;
		}
		if (x->verify)
			x->sum += copy_hash_terms(dev->staging[slot], (size_t)got, x->done / 8);
		(void)xfer_dma_turn(x, SCHED_DMA_H2D, true);
		if ((rc = dev->ops->copy.h2d_async(dev, x->base + x->done, slot, (size_t)got, x->err)) != 0) {
			sched_slot_release(dev, slot);
			break;
		}
		sched_dma_queued(x->job, slot, SCHED_DMA_H2D);
		xfer_dma_issued(x);
		ring_push(&ring, slot, (size_t)got);
		x->done += (uint64_t)got;
		xfer_progress(x);
		if ((size_t)got < want)
			x->eof = true;
		if (x->eof || x->done == x->total)
			xfer_issued_all(x);
		if (x->eof)
			break;
	}
	sched_dma_leave(x->job);
	return ring_drain(x, &ring, rc);
}

/* DMAs into slots ahead, taking DMA turns; each finished slot is written out, then refilled. */
static int get_streamed(struct xfer *x)
{
	struct device *dev = x->dev;
	struct stream_ring ring = { .count = 0 };
	uint64_t issued = 0;
	int rc = 0;
	while (x->done < x->total && rc == 0 && (rc = xfer_cancelled(x)) == 0) {
		unsigned slot;
		/* with no DMA in flight it waits for a turn, else takes one only if it is free */
		while (issued < x->total && ring.count < x->slots &&
		       xfer_dma_turn(x, SCHED_DMA_D2H, ring.count == 0) &&
		       sched_slot_acquire(dev, ring.count == 0, &slot) == 0) {
			size_t n = x->total - issued < x->chunk ? (size_t)(x->total - issued) : x->chunk;
			if ((rc = dev->ops->copy.d2h_async(dev, slot, x->base + issued, n, x->err)) != 0) {
				sched_slot_release(dev, slot);
				break;
			}
			sched_dma_queued(x->job, slot, SCHED_DMA_D2H);
			xfer_dma_issued(x);
			ring_push(&ring, slot, n);
			issued += n;
			if (issued == x->total)
				xfer_issued_all(x);
		}
		/* no claim on a turn while it writes out: a stalled pipe would hold every other DMA */
		sched_dma_leave(x->job);
		size_t size = 0;
		if (rc != 0 || (rc = ring_pop(x, &ring, &slot, &size)) != 0) {
			if (size) /* popped: the slot is still ours */
				sched_slot_release(dev, slot);
			break;
		}
		if (x->verify)
			x->sum += copy_hash_terms(dev->staging[slot], size, x->done / 8);
		rc = stream_write(x, dev->staging[slot], size);
		sched_slot_release(dev, slot);
		if (rc != 0)
			break;
		x->done += size;
		xfer_progress(x);
	}
	sched_dma_leave(x->job);
	return ring_drain(x, &ring, rc);
}

/* ---- setting up, and what follows every path ---- */

/*
 * The bytes a put keeps read ahead of its next DMA, at most. The copy
 * threads outrun the DMA, so a put fills whatever slots it may hold, and a
 * chunk then waits that long between its copy thread's write and the
 * DMA's read (the less in between, the more of it is likely still in the
 * processor's cache). On the H200 machine a 256 MiB put from a memfd moved
 * at 0.55-0.66 of pinned memory's rate with the whole default ring (128
 * MiB) ahead, 0.75-0.82 with 64 MiB (docs/PERFORMANCE.md, "Polling the
 * device"). A get is not held to it: its slots wait for copy threads to
 * write them out, and fewer of them measured slower (32 MiB: 0.39-0.40
 * into a memfd, against 0.44-0.47). The ring stays larger, so that two
 * transfers at once each have this much.
 */
#define XFER_READ_AHEAD_BYTES ((size_t)64 << 20)

unsigned xfer_put_slots(unsigned ring, size_t chunk)
{
	size_t fit = XFER_READ_AHEAD_BYTES / chunk; /* chunk: 4K to 1G */
	return fit >= ring ? ring : fit >= 2 ? (unsigned)fit : 2;
}

static int xfer_open(struct xfer *x, struct device *dev, struct work *work)
{
	struct stat st;
	memset(x, 0, sizeof *x);
	x->dev = dev;
	x->work = work;
	x->err = &work->error;
	x->pool = dev->config.copy_pool;
	x->job = sched_running_job(dev);
	x->base = (char *)work->dptr + work->transfer.offset;
	x->fd = work->fd;
	x->total = work->length;
	x->chunk = dev->config.staging_slot_bytes & ~(size_t)7;
	x->slots = dev->config.staging_slots;
	x->verify = work->transfer.verify;
	x->publish_tail = true;
	x->scratch = work->transfer.scratch;
	x->seed = work->transfer.seed;
	x->moved_at = x->started = monotonic_seconds();
	if (work->transfer.timeline)
		*work->transfer.timeline = (struct transfer_timeline){ 0, 0 };
	if (x->scratch || work->transfer.host)
		return 0; /* no descriptor: staged, at offset 0; or a region */
	x->fd_flags = fcntl(work->fd, F_GETFL);
	if (x->fd_flags < 0 || fstat(work->fd, &st) < 0)
		return gpuq_fail(x->err, GPUQ_E_IO, "the client's descriptor: %s", strerror(errno));
	x->regular = S_ISREG(st.st_mode);
	x->mode = st.st_mode;
	x->tty = S_ISCHR(st.st_mode) && isatty(work->fd);
	x->pipe_size = S_ISFIFO(st.st_mode) ? fcntl(work->fd, F_GETPIPE_SZ) : 0;
	x->size = st.st_size;
	x->pos = x->regular ? lseek(work->fd, 0, SEEK_CUR) : 0;
	if (x->pos < 0)
		return gpuq_fail(x->err, GPUQ_E_IO, "the client's descriptor: lseek: %s",
				 strerror(errno));
	return 0;
}

/*
 * Staged when the descriptor can be read or written at offsets by several
 * threads (a regular file or memfd; for a get not O_APPEND, whose writes
 * land at the end whatever the offset); registered when asked, or from
 * --register-min bytes for a sealed memfd; streamed otherwise.
 */
static int xfer_choose_path(struct xfer *x, bool put)
{
	const struct transfer_spec *t = &x->work->transfer;
	uint64_t reg_min = x->dev->config.register_min_bytes;
	struct gpuq_error ignored;
	bool offsets = x->regular && (put || !(x->fd_flags & O_APPEND));
	x->path = offsets || x->scratch ? XFER_STAGED : XFER_STREAMED;
	if (t->host)
		x->path = t->ring_slot_bytes ? XFER_RING : XFER_REGION;
	if (x->scratch || t->host)
		return 0;
	if (t->path == TRANSFER_PATH_REGISTERED) {
		if (transfer_check_registrable(x->fd, put, x->err) < 0)
			return -1;
		x->path = XFER_REGISTERED;
	} else if (t->path == TRANSFER_PATH_AUTO && offsets && reg_min && x->total >= reg_min &&
		   transfer_check_registrable(x->fd, put, &ignored) == 0) {
		x->path = XFER_REGISTERED;
	}
	return 0;
}

/* A regular source: how much to read, known before the first byte moves. */
static int put_plan_regular(struct xfer *x)
{
	uint64_t avail = x->size > x->pos ? (uint64_t)(x->size - x->pos) : 0;
	if (x->work->transfer.length_exact && avail < x->total)
		return gpuq_fail(x->err, GPUQ_E_IO,
				 "the source ended after %llu of the %llu bytes asked for "
				 "(it holds %llu bytes from its offset %lld); nothing was copied",
				 (unsigned long long)avail, (unsigned long long)x->total,
				 (unsigned long long)avail, (long long)x->pos);
	if (!x->work->transfer.length_exact && avail > x->total)
		return gpuq_fail(x->err, GPUQ_E_BAD_REQUEST,
				 "the source holds %llu bytes but the buffer has room for %llu; "
				 "give --length, or a larger buffer",
				 (unsigned long long)avail, (unsigned long long)x->total);
	x->total = avail < x->total ? avail : x->total;
	return 0;
}

/* After a put that was to read until end of file: the source must end there. */
static int put_require_eof(struct xfer *x, uint64_t room)
{
	char probe;
	ssize_t r;
	if (x->path == XFER_STREAMED) {
		if (x->eof)
			return 0;
		r = stream_read(x, &probe, 1);
	} else {
		do
			r = pread(x->fd, &probe, 1, x->pos + (off_t)x->done);
		while (r < 0 && errno == EINTR);
	}
	if (r < 0)
		return x->path == XFER_STREAMED
			       ? -1
			       : gpuq_fail(x->err, GPUQ_E_IO, "reading the source at byte %llu: %s",
					   (unsigned long long)x->done, strerror(errno));
	if (r == 0)
		return 0;
	if (x->path == XFER_STREAMED && x->done == room)
		return gpuq_fail(x->err, GPUQ_E_BAD_REQUEST,
				 "the source is longer than the %llu bytes of room in the buffer; "
				 "give --length, or a larger buffer",
				 (unsigned long long)room);
	return gpuq_fail(x->err, GPUQ_E_IO,
			 "the source grew while it was read: it held %llu bytes when the put started",
			 (unsigned long long)x->done);
}

/* The device's checksum of the first `bytes` of the range. */
static int xfer_verify_device(struct xfer *x, uint64_t bytes, uint64_t *sum)
{
	return x->dev->ops->mem.checksum(x->dev, x->base, bytes, sum, x->err);
}

/* Compares the host's checksum of the bytes moved with the device's (`device`). */
static int xfer_verify_compare(struct xfer *x, bool put, uint64_t device)
{
	uint64_t host = gpuq_checksum_finish(x->sum, x->done);
	x->work->result.checksum = host;
	if (host == device)
		return 0;
	return gpuq_fail(x->err, GPUQ_E_DEVICE_ERROR,
			 "verify failed: the %llu bytes %s hash to 0x%016llx, but bytes [%llu, %llu) "
			 "of the buffer hash to 0x%016llx on the device",
			 (unsigned long long)x->done,
			 put ? "read from the source" : "written to the destination",
			 (unsigned long long)host, (unsigned long long)x->work->transfer.offset,
			 (unsigned long long)(x->work->transfer.offset + x->done),
			 (unsigned long long)device);
}

/* The descriptor's offset moves past what was read or written, as read() and write() would. */
static void xfer_close(struct xfer *x, int rc)
{
	struct work *work = x->work;
	work->result.bytes = x->done;
	work->result.path = path_names[x->path];
	if (x->regular && x->path != XFER_STREAMED && (rc == 0 || x->done > 0))
		(void)lseek(x->fd, x->pos + (off_t)x->done, SEEK_SET);
}

static int put_run(struct xfer *x)
{
	switch (x->path) {
	case XFER_STAGED: return xfer_put_staged(x);
	case XFER_STREAMED: return put_streamed(x);
	case XFER_REGISTERED: return xfer_put_registered(x);
	case XFER_REGION: return xfer_pinned(x, true, x->work->transfer.host);
	case XFER_RING: return xfer_ring(x, true);
	}
	return gpuq_fail(x->err, GPUQ_E_INTERNAL, "put: path %d unknown", (int)x->path);
}

static int get_run(struct xfer *x)
{
	switch (x->path) {
	case XFER_STAGED: return xfer_get_staged(x);
	case XFER_STREAMED: return get_streamed(x);
	case XFER_REGISTERED: return xfer_get_registered(x);
	case XFER_REGION: return xfer_pinned(x, false, x->work->transfer.host);
	case XFER_RING: return xfer_ring(x, false);
	}
	return gpuq_fail(x->err, GPUQ_E_INTERNAL, "get: path %d unknown", (int)x->path);
}

int transfer_put(struct device *dev, struct work *work)
{
	struct xfer x;
	uint64_t room = work->length, device_sum = 0;
	int rc = xfer_open(&x, dev, work);
	x.slots = xfer_put_slots(x.slots, x.chunk);
	x.publish_tail = !x.verify; /* verify reads the range on the device after the DMAs */
	if (rc == 0)
		rc = xfer_choose_path(&x, true);
	bool region = x.path == XFER_REGION || x.path == XFER_RING;
	if (rc == 0 && x.path != XFER_STREAMED && !region && !x.scratch)
		rc = put_plan_regular(&x);
	if (rc == 0) {
		bool known = x.path != XFER_STREAMED || work->transfer.length_exact;
		atomic_store(&work->progress_total, known ? x.total : 0);
		rc = put_run(&x);
	}
	if (rc == 0 && work->transfer.length_exact && x.done < x.total)
		rc = gpuq_fail(x.err, GPUQ_E_IO, "the source ended after %llu of the %llu bytes asked for",
			       (unsigned long long)x.done, (unsigned long long)x.total);
	if (rc == 0 && !work->transfer.length_exact && !x.scratch && !region)
		rc = put_require_eof(&x, room);
	if (rc == 0 && x.verify && (rc = xfer_verify_device(&x, x.done, &device_sum)) == 0)
		rc = xfer_verify_compare(&x, true, device_sum);
	xfer_close(&x, rc);
	return rc;
}

int transfer_get(struct device *dev, struct work *work)
{
	struct xfer x;
	uint64_t device_sum = 0;
	int rc = xfer_open(&x, dev, work);
	if (rc == 0)
		rc = xfer_choose_path(&x, false);
	/* The device's bytes first: what the destination must end up holding. */
	if (rc == 0 && x.verify)
		rc = xfer_verify_device(&x, x.total, &device_sum);
	if (rc == 0) {
		atomic_store(&work->progress_total, x.total);
		rc = get_run(&x);
	}
	if (rc == 0 && x.verify)
		rc = xfer_verify_compare(&x, false, device_sum);
	xfer_close(&x, rc);
	return rc;
}
