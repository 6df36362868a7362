/*
 * Length-prefixed framing. A frame_reader belongs to one connection and is
 * used by one thread at a time; it holds no locks.
 *
 * The buffer holds [consumed frames | pending bytes | free space]. Frames are
 * handed out in place, and the consumed prefix is only reclaimed in
 * frame_reader_space, which is what keeps a returned payload valid until the
 * next call that may write into the buffer.
 */
#include "protocol/frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* First allocation; grows by doubling from here. */
#define FRAME_INITIAL_CAP 4096u

void frame_reader_init(struct frame_reader *r, size_t max_frame)
{
	*r = (struct frame_reader){ .max_frame = max_frame };
}

void frame_reader_free(struct frame_reader *r)
{
	free(r->buf);
	*r = (struct frame_reader){ .max_frame = r->max_frame };
}

/* Moves the pending bytes to the front, dropping frames already handed out. */
static void frame_compact(struct frame_reader *r)
{
	if (r->consumed == 0)
		return;
	size_t pending = r->len - r->consumed;
	if (pending > 0)
		memmove(r->buf, r->buf + r->consumed, pending);
	r->len = pending;
	r->consumed = 0;
}

/* The smallest doubling of cap (from FRAME_INITIAL_CAP) that holds need. */
static size_t frame_grown_cap(size_t cap, size_t need)
{
	size_t c = cap ? cap : FRAME_INITIAL_CAP;
	while (c < need) {
		if (c > SIZE_MAX / 2)
			return need;
		c *= 2;
	}
	return c;
}

uint8_t *frame_reader_space(struct frame_reader *r, size_t want)
{
	frame_compact(r);
	if (want > SIZE_MAX - r->len)
		return NULL;
	if (r->cap - r->len < want || !r->buf) {
		size_t cap = frame_grown_cap(r->cap, r->len + want);
		uint8_t *buf = realloc(r->buf, cap);
		if (!buf)
			return NULL;
		r->buf = buf;
		r->cap = cap;
	}
	return r->buf + r->len;
}

void frame_reader_commit(struct frame_reader *r, size_t n)
{
	/* More than the space handed out would be a bug in the caller. */
	if (n > r->cap - r->len)
		abort();
	r->len += n;
}

int frame_reader_append(struct frame_reader *r, const void *data, size_t n)
{
	if (n == 0)
		return 0;
	uint8_t *p = frame_reader_space(r, n);
	if (!p)
		return -ENOMEM;
	memcpy(p, data, n);
	frame_reader_commit(r, n);
	return 0;
}

int frame_reader_next(struct frame_reader *r, const uint8_t **payload, size_t *len)
{
	size_t avail = r->len - r->consumed;
	if (avail < 4)
		return 0;
	uint32_t n = frame_get_header(r->buf + r->consumed);
	if (n > r->max_frame) {
		*len = n;
		return -EMSGSIZE;
	}
	if (avail - 4 < n)
		return 0;
	*payload = r->buf + r->consumed + 4;
	*len = n;
	r->consumed += 4 + (size_t)n;
	return 1;
}

size_t frame_reader_pending(const struct frame_reader *r)
{
	return r->len - r->consumed;
}

void frame_put_header(uint8_t out[4], uint32_t len)
{
	out[0] = (uint8_t)(len >> 24);
	out[1] = (uint8_t)(len >> 16);
	out[2] = (uint8_t)(len >> 8);
	out[3] = (uint8_t)len;
}

uint32_t frame_get_header(const uint8_t in[4])
{
	return (uint32_t)in[0] << 24 | (uint32_t)in[1] << 16 |
	       (uint32_t)in[2] << 8 | (uint32_t)in[3];
}
