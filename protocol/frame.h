/*
 * Length-prefixed framing: a 4-byte big-endian length, then the payload.
 *
 * A frame_reader accumulates bytes as they arrive (in any split) and hands out
 * complete payloads. A length above max_frame is refused as soon as the four
 * header bytes are in, before any buffer is grown for it.
 */
#ifndef GPUQ_FRAME_H
#define GPUQ_FRAME_H

#include <stddef.h>
#include <stdint.h>

struct frame_reader {
	uint8_t *buf;
	size_t len;       /* bytes held */
	size_t cap;       /* bytes allocated */
	size_t consumed;  /* bytes of buf already handed out as frames */
	size_t max_frame; /* largest payload accepted */
};

void frame_reader_init(struct frame_reader *r, size_t max_frame);
void frame_reader_free(struct frame_reader *r);

/*
 * Returns a writable region of at least `want` bytes at the end of the
 * reader's buffer (grown, and compacted, as needed), or NULL when memory runs
 * out. Call frame_reader_commit with how many bytes were written there.
 */
uint8_t *frame_reader_space(struct frame_reader *r, size_t want);
void frame_reader_commit(struct frame_reader *r, size_t n);

/* Copies n bytes in (space + commit in one call). 0, or -ENOMEM. */
int frame_reader_append(struct frame_reader *r, const void *data, size_t n);

/*
 * Takes the next complete frame. Returns 1 and sets *payload and *len (valid
 * until the next call on r), 0 when more bytes are needed, or -EMSGSIZE when
 * the announced length exceeds max_frame (*len is then set to that length).
 * After -EMSGSIZE the stream cannot be resynchronised: close the connection.
 */
int frame_reader_next(struct frame_reader *r, const uint8_t **payload, size_t *len);

/* Bytes received but not yet returned as a frame (a truncated frame at EOF). */
size_t frame_reader_pending(const struct frame_reader *r);

/* Writes the 4-byte header for a payload of len bytes. */
void frame_put_header(uint8_t out[4], uint32_t len);
uint32_t frame_get_header(const uint8_t in[4]);

#endif
