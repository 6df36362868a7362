/*
 * Chunked descriptor <-> device transfers through the staging ring.
 * Worker thread only (see transfer.h).
 *
 * Descriptors belong to clients: a pipe may stall for ever. Non-regular
 * descriptors are therefore polled with a short timeout before each read or
 * write, so that a cancel request is seen within POLL_MS.
 */
#include "workers/transfer.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define POLL_MS 100

struct fd_stream {
	int fd;
	bool regular;
	atomic_bool *cancel;
};

static int fail_cancelled(struct gpuq_error *err, uint64_t done)
{
	return gpuq_fail(err, GPUQ_E_CANCELLED, "job cancelled after %llu bytes",
			 (unsigned long long)done);
}

/* Waits until fd is ready for `events`, or the job is cancelled. */
static int stream_wait(struct fd_stream *s, short events, uint64_t done, struct gpuq_error *err)
{
	if (s->regular)
		return 0;
	for (;;) {
		if (atomic_load(s->cancel))
			return fail_cancelled(err, done);
		struct pollfd p = { .fd = s->fd, .events = events };
		int n = poll(&p, 1, POLL_MS);
		if (n > 0)
			return 0; /* readable, writable, or an error the next call will report */
		if (n < 0 && errno != EINTR)
			return gpuq_fail(err, GPUQ_E_IO, "poll on the client's descriptor: %s",
					 strerror(errno));
	}
}

/* Reads up to n bytes; fewer only at end of file. Returns the count or -1. */
static ssize_t stream_read(struct fd_stream *s, void *buf, size_t n, uint64_t done,
			   struct gpuq_error *err)
{
	size_t got = 0;
	while (got < n) {
		if (stream_wait(s, POLLIN, done + got, err) < 0)
			return -1;
		ssize_t r = read(s->fd, (char *)buf + got, n - got);
		if (r > 0) {
			got += (size_t)r;
		} else if (r == 0) {
			break;
		} else if (errno != EINTR && errno != EAGAIN) {
			return gpuq_fail(err, GPUQ_E_IO, "reading the source after %llu bytes: %s",
					 (unsigned long long)(done + got), strerror(errno));
		}
	}
	return (ssize_t)got;
}

static int stream_write(struct fd_stream *s, const void *buf, size_t n, uint64_t done,
			struct gpuq_error *err)
{
	size_t put = 0;
	while (put < n) {
		if (stream_wait(s, POLLOUT, done + put, err) < 0)
			return -1;
		ssize_t w = write(s->fd, (const char *)buf + put, n - put);
		if (w > 0)
			put += (size_t)w;
		else if (w == 0 || (errno != EINTR && errno != EAGAIN))
			return gpuq_fail(err, GPUQ_E_IO, "writing the destination after %llu bytes: %s",
					 (unsigned long long)(done + put),
					 w == 0 ? "wrote nothing" : strerror(errno));
	}
	return 0;
}

static void stream_open(struct fd_stream *s, struct work *work)
{
	struct stat st;
	s->fd = work->fd;
	s->regular = fstat(work->fd, &st) == 0 && S_ISREG(st.st_mode);
	s->cancel = &work->cancel;
}

/* Waits for every slot; keeps the first error, if one was already set. */
static int drain_slots(struct device *dev, int rc, struct gpuq_error *err)
{
	for (unsigned i = 0; i < dev->config.staging_slots; i++) {
		struct gpuq_error slot_err;
		if (dev->ops->slot_wait(dev, i, &slot_err) < 0 && rc == 0) {
			*err = slot_err;
			rc = -1;
		}
	}
	return rc;
}

/* After filling the room: the source must end there. */
static int require_eof(struct fd_stream *s, uint64_t room, struct gpuq_error *err)
{
	char probe;
	ssize_t r = stream_read(s, &probe, 1, room, err);
	if (r < 0)
		return -1;
	if (r > 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the source is longer than the %llu bytes of room in the buffer; "
				 "give --length, or a larger buffer",
				 (unsigned long long)room);
	return 0;
}

int transfer_put(struct device *dev, struct work *work)
{
	struct gpuq_error *err = &work->error;
	struct fd_stream s;
	stream_open(&s, work);
	size_t slot_bytes = dev->config.staging_slot_bytes;
	uint64_t room = work->length, done = 0;
	unsigned slot = 0;
	bool eof = false;
	int rc = 0;

	work->result.path = "staged";
	while (done < room && rc == 0) {
		if (atomic_load(&work->cancel)) {
			rc = fail_cancelled(err, done);
			break;
		}
		size_t want = room - done < slot_bytes ? (size_t)(room - done) : slot_bytes;
		rc = dev->ops->slot_wait(dev, slot, err);
		ssize_t got = rc == 0 ? stream_read(&s, dev->staging[slot], want, done, err) : -1;
		if (got < 0) {
			rc = -1;
			break;
		}
		if (got > 0) {
			rc = dev->ops->h2d_async(dev, (char *)work->dptr + work->offset + done, slot,
						 (size_t)got, err);
			done += (uint64_t)got;
			slot = (slot + 1) % dev->config.staging_slots;
		}
		eof = (size_t)got < want;
		if (eof)
			break;
	}
	rc = drain_slots(dev, rc, err);
	work->result.bytes = done;
	if (rc == 0 && work->length_exact && done < room)
		rc = gpuq_fail(err, GPUQ_E_IO, "the source ended after %llu of the %llu bytes asked for",
			       (unsigned long long)done, (unsigned long long)room);
	if (rc == 0 && !work->length_exact && !eof)
		rc = require_eof(&s, room, err);
	return rc;
}

int transfer_get(struct device *dev, struct work *work)
{
	struct gpuq_error *err = &work->error;
	struct fd_stream s;
	stream_open(&s, work);
	size_t slot_bytes = dev->config.staging_slot_bytes;
	unsigned slots = dev->config.staging_slots;
	size_t sizes[GPUQ_MAX_STAGING_SLOTS] = { 0 };
	const char *src = (const char *)work->dptr + work->offset;
	uint64_t total = work->length, issued = 0, written = 0;
	int rc = 0;

	work->result.path = "staged";
	/* Every slot in flight first; then each written slot is refilled. */
	for (unsigned k = 0; k < slots && issued < total && rc == 0; k++) {
		sizes[k] = total - issued < slot_bytes ? (size_t)(total - issued) : slot_bytes;
		rc = dev->ops->d2h_async(dev, k, src + issued, sizes[k], err);
		issued += sizes[k];
	}
	for (unsigned slot = 0; written < total && rc == 0; slot = (slot + 1) % slots) {
		if (atomic_load(&work->cancel)) {
			rc = fail_cancelled(err, written);
			break;
		}
		rc = dev->ops->slot_wait(dev, slot, err);
		if (rc == 0)
			rc = stream_write(&s, dev->staging[slot], sizes[slot], written, err);
		if (rc < 0)
			break;
		written += sizes[slot];
		if (issued < total) {
			sizes[slot] = total - issued < slot_bytes ? (size_t)(total - issued) : slot_bytes;
			rc = dev->ops->d2h_async(dev, slot, src + issued, sizes[slot], err);
			issued += sizes[slot];
		}
	}
	rc = drain_slots(dev, rc, err);
	work->result.bytes = written;
	return rc;
}
