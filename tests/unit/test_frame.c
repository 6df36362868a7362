/* Unit tests for protocol/frame.c: headers and the incremental reader. */
#include "tests/harness.h"

#include <errno.h>
#include <stdlib.h>

#include "protocol/frame.h"
#include "protocol/protocol.h"

/* Appends a frame holding len bytes of `fill` to buf; returns the new end. */
static size_t put_frame(uint8_t *buf, size_t at, uint32_t len, uint8_t fill)
{
	frame_put_header(buf + at, len);
	memset(buf + at + 4, fill, len);
	return at + 4 + len;
}

/* Takes one frame and checks its length and contents. */
static void expect_frame(struct frame_reader *r, uint32_t len, uint8_t fill)
{
	const uint8_t *p = NULL;
	size_t n = 12345;
	int rc = frame_reader_next(r, &p, &n);
	CHECKF(rc == 1, "frame_reader_next returned %d, want a frame of %u", rc, len);
	CHECK_EQ(n, len);
	for (size_t i = 0; i < n; i++)
		CHECKF(p[i] == fill, "byte %zu of the frame is %u, want %u", i, p[i], fill);
}

static void expect_none(struct frame_reader *r)
{
	const uint8_t *p;
	size_t n;
	CHECK_EQ(frame_reader_next(r, &p, &n), 0);
}

TEST(header_big_endian)
{
	uint8_t h[4];
	frame_put_header(h, 0x01020304);
	CHECK_EQ(h[0], 1);
	CHECK_EQ(h[1], 2);
	CHECK_EQ(h[2], 3);
	CHECK_EQ(h[3], 4);
	CHECK_EQ(frame_get_header(h), 0x01020304);
	static const uint32_t values[] = { 0, 1, 255, 256, 65535, 1u << 20, UINT32_MAX };
	for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
		frame_put_header(h, values[i]);
		CHECK_EQ(frame_get_header(h), values[i]);
	}
	const uint8_t top[4] = { 0x80, 0, 0, 0 };
	CHECK_EQ(frame_get_header(top), 0x80000000u);
}

TEST(reader_one_frame)
{
	struct frame_reader r;
	frame_reader_init(&r, 1024);
	uint8_t buf[64];
	size_t n = put_frame(buf, 0, 10, 0xab);
	expect_none(&r);
	CHECK_EQ(frame_reader_append(&r, buf, n), 0);
	CHECK_EQ(frame_reader_pending(&r), 14);
	expect_frame(&r, 10, 0xab);
	CHECK_EQ(frame_reader_pending(&r), 0);
	expect_none(&r);
	frame_reader_free(&r);
	CHECK(r.buf == NULL);
	frame_reader_free(&r); /* twice is harmless */
}

TEST(reader_several_frames_in_one_append)
{
	struct frame_reader r;
	frame_reader_init(&r, 1024);
	uint8_t buf[256];
	size_t n = put_frame(buf, 0, 3, 1);
	n = put_frame(buf, n, 0, 0);
	n = put_frame(buf, n, 100, 2);
	n = put_frame(buf, n, 7, 3);
	buf[n++] = 0; /* the first two bytes of a next header */
	buf[n++] = 0;
	CHECK_EQ(frame_reader_append(&r, buf, n), 0);
	expect_frame(&r, 3, 1);
	expect_frame(&r, 0, 0);
	expect_frame(&r, 100, 2);
	expect_frame(&r, 7, 3);
	expect_none(&r);
	CHECK_EQ(frame_reader_pending(&r), 2);
	frame_reader_free(&r);
}

/* Three frames, the stream split in two at every position. */
TEST(reader_split_at_every_position)
{
	uint8_t buf[128];
	size_t n = put_frame(buf, 0, 5, 0x11);
	n = put_frame(buf, n, 0, 0);
	n = put_frame(buf, n, 40, 0x22);
	for (size_t cut = 0; cut <= n; cut++) {
		struct frame_reader r;
		frame_reader_init(&r, 64);
		int got = 0;
		const uint8_t *p;
		size_t len;
		CHECK_EQ(frame_reader_append(&r, buf, cut), 0);
		while (frame_reader_next(&r, &p, &len) == 1)
			got++;
		CHECK_EQ(frame_reader_append(&r, buf + cut, n - cut), 0);
		while (frame_reader_next(&r, &p, &len) == 1) {
			if (++got == 3)
				CHECK_EQ(len, 40);
		}
		CHECKF(got == 3, "cut at %zu: %d frames", cut, got);
		CHECK_EQ(frame_reader_pending(&r), 0);
		frame_reader_free(&r);
	}
}

TEST(reader_byte_by_byte)
{
	uint8_t buf[20 * 4 + 3 * 190];
	size_t n = 0;
	for (uint32_t i = 0; i < 20; i++)
		n = put_frame(buf, n, i * 3, (uint8_t)(i + 1));
	struct frame_reader r;
	frame_reader_init(&r, 64);
	uint32_t next = 0;
	for (size_t i = 0; i < n; i++) {
		CHECK_EQ(frame_reader_append(&r, buf + i, 1), 0);
		const uint8_t *p;
		size_t len;
		int rc;
		while ((rc = frame_reader_next(&r, &p, &len)) == 1) {
			CHECK_EQ(len, next * 3);
			for (size_t j = 0; j < len; j++)
				CHECK_EQ(p[j], next + 1);
			next++;
		}
		CHECK_EQ(rc, 0);
	}
	CHECK_EQ(next, 20);
	CHECK_EQ(frame_reader_pending(&r), 0);
	/* Consumed bytes were reclaimed: the buffer never grew. */
	CHECK_EQ(r.cap, 4096);
	frame_reader_free(&r);
}

TEST(reader_max_frame_boundary)
{
	struct frame_reader r;
	frame_reader_init(&r, 100);
	uint8_t *buf = calloc(1, 300);
	size_t n = put_frame(buf, 0, 100, 7);
	CHECK_EQ(frame_reader_append(&r, buf, n), 0);
	expect_frame(&r, 100, 7);
	frame_put_header(buf, 101);
	CHECK_EQ(frame_reader_append(&r, buf, 4), 0);
	const uint8_t *p;
	size_t len = 0;
	CHECK_EQ(frame_reader_next(&r, &p, &len), -EMSGSIZE);
	CHECK_EQ(len, 101);
	/* The stream cannot be resynchronised: it stays refused. */
	CHECK_EQ(frame_reader_append(&r, buf + 4, 101), 0);
	CHECK_EQ(frame_reader_next(&r, &p, &len), -EMSGSIZE);
	free(buf);
	frame_reader_free(&r);
}

/* A 4 GiB length is refused from its four bytes, with nothing grown for it. */
TEST(reader_refuses_4gib_before_growing)
{
	struct frame_reader r;
	frame_reader_init(&r, GPUQ_DEFAULT_MAX_FRAME);
	const uint8_t h[4] = { 0xff, 0xff, 0xff, 0xff };
	const uint8_t *p;
	size_t len = 0;
	CHECK_EQ(frame_reader_append(&r, h, 3), 0);
	CHECK_EQ(frame_reader_next(&r, &p, &len), 0);
	CHECK_EQ(frame_reader_append(&r, h + 3, 1), 0);
	CHECK_EQ(frame_reader_next(&r, &p, &len), -EMSGSIZE);
	CHECK_EQ(len, UINT32_MAX);
	CHECK_EQ(r.cap, 4096);
	CHECK_EQ(r.len, 4);
	frame_reader_free(&r);
}

TEST(reader_just_over_default_max)
{
	struct frame_reader r;
	frame_reader_init(&r, GPUQ_DEFAULT_MAX_FRAME);
	uint8_t h[4];
	frame_put_header(h, GPUQ_DEFAULT_MAX_FRAME + 1);
	CHECK_EQ(frame_reader_append(&r, h, 4), 0);
	const uint8_t *p;
	size_t len;
	CHECK_EQ(frame_reader_next(&r, &p, &len), -EMSGSIZE);
	CHECK_EQ(len, GPUQ_DEFAULT_MAX_FRAME + 1);
	CHECK_EQ(r.cap, 4096);
	frame_reader_free(&r);
}

/* A frame bigger than the first allocation makes the buffer double. */
TEST(reader_grows_geometrically)
{
	struct frame_reader r;
	frame_reader_init(&r, 1 << 20);
	size_t total = 4 + 100000;
	uint8_t *buf = malloc(total);
	put_frame(buf, 0, 100000, 0x5a);
	size_t caps[32], ncaps = 0;
	for (size_t at = 0; at < total; at += 1000) {
		size_t chunk = total - at < 1000 ? total - at : 1000;
		CHECK_EQ(frame_reader_append(&r, buf + at, chunk), 0);
		if (ncaps == 0 || caps[ncaps - 1] != r.cap)
			caps[ncaps++] = r.cap;
	}
	CHECK_EQ(ncaps, 6); /* 4096 .. 131072 */
	for (size_t i = 0; i < ncaps; i++)
		CHECK_EQ(caps[i], (size_t)4096 << i);
	expect_frame(&r, 100000, 0x5a);
	free(buf);
	frame_reader_free(&r);
}

/* Pending bytes move to the front when space is asked for. */
TEST(reader_compacts)
{
	struct frame_reader r;
	frame_reader_init(&r, 4096);
	uint8_t buf[64];
	size_t n = put_frame(buf, 0, 10, 1);
	n = put_frame(buf, n, 20, 2);
	CHECK_EQ(frame_reader_append(&r, buf, n - 5), 0);
	expect_frame(&r, 10, 1);
	CHECK_EQ(r.consumed, 14);
	uint8_t *space = frame_reader_space(&r, 5);
	CHECK(space != NULL);
	CHECK_EQ(r.consumed, 0);
	CHECK_EQ(r.len, 24 - 5);
	CHECK(space == r.buf + r.len);
	memcpy(space, buf + n - 5, 5);
	frame_reader_commit(&r, 5);
	expect_frame(&r, 20, 2);
	frame_reader_free(&r);
}

/* A payload stays put across further next() calls until space() is called. */
TEST(reader_payloads_stay_valid_until_space)
{
	struct frame_reader r;
	frame_reader_init(&r, 4096);
	uint8_t buf[64];
	size_t n = put_frame(buf, 0, 4, 0x41);
	n = put_frame(buf, n, 4, 0x42);
	CHECK_EQ(frame_reader_append(&r, buf, n), 0);
	const uint8_t *a, *b;
	size_t la, lb;
	CHECK_EQ(frame_reader_next(&r, &a, &la), 1);
	CHECK_EQ(frame_reader_next(&r, &b, &lb), 1);
	CHECK_EQ(a[0], 0x41);
	CHECK_EQ(b[3], 0x42);
	frame_reader_free(&r);
}

TEST(reader_space_and_commit)
{
	struct frame_reader r;
	frame_reader_init(&r, 4096);
	uint8_t *p = frame_reader_space(&r, 65536);
	CHECK(p != NULL);
	CHECK(r.cap >= 65536);
	frame_put_header(p, 3);
	memcpy(p + 4, "abc", 3);
	frame_reader_commit(&r, 7);
	const uint8_t *payload;
	size_t len;
	CHECK_EQ(frame_reader_next(&r, &payload, &len), 1);
	CHECK_EQ(len, 3);
	CHECK(memcmp(payload, "abc", 3) == 0);
	CHECK_EQ(frame_reader_append(&r, NULL, 0), 0);
	/* A size that cannot be added to what is held fails before allocating. */
	CHECK_EQ(frame_reader_append(&r, "\0\0", 2), 0);
	CHECK(frame_reader_space(&r, SIZE_MAX - 1) == NULL);
	CHECK_EQ(frame_reader_pending(&r), 2);
	frame_reader_free(&r);
}

TEST(reader_truncated_at_eof)
{
	struct frame_reader r;
	frame_reader_init(&r, 4096);
	uint8_t buf[64];
	size_t n = put_frame(buf, 0, 30, 9);
	CHECK_EQ(frame_reader_append(&r, buf, n - 1), 0);
	expect_none(&r);
	CHECK_EQ(frame_reader_pending(&r), n - 1);
	frame_reader_free(&r);
}
