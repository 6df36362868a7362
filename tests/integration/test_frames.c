/*
 * Malformed frames from raw sockets: each gets a bad_frame reply and its
 * connection closed, while the daemon, its other clients and their buffers
 * carry on.
 */
#include <string.h>
#include <unistd.h>

#include "protocol/frame.h"
#include "tests/integration/fixture.h"

/* A buffer that another client keeps through every abuse. */
struct bystander {
	struct gpuq_client *c;
	uint64_t sum;
};

static void bystander_start(struct daemon_proc *d, struct bystander *b)
{
	b->c = client_open(d);
	do_alloc(b->c, "precious", 0, 123457);
	do_fill_random(b->c, "precious", 99);
	b->sum = do_checksum(b->c, "precious");
}

static void bystander_check(struct bystander *b)
{
	CHECK_EQ(do_checksum(b->c, "precious"), b->sum);
}

static void send_frame_expect(struct daemon_proc *d, struct bystander *b, const void *payload,
			      size_t len, const char *want_code)
{
	int fd = raw_connect(d);
	uint8_t hdr[4];
	frame_put_header(hdr, (uint32_t)len);
	raw_write(fd, hdr, 4);
	raw_write(fd, payload, len);
	char code[32];
	CHECKF(raw_read_reply(fd, code, sizeof code) == 0, "no reply to a malformed frame");
	CHECK_STR(code, want_code);
	if (strcmp(want_code, "bad_frame") == 0)
		CHECKF(raw_closed_by_peer(fd, 2000), "connection left open after bad_frame");
	close(fd);
	bystander_check(b);
}

TEST(garbage_payloads_get_bad_frame)
{
	struct daemon_proc d;
	struct bystander b;
	daemon_start(&d, NULL);
	bystander_start(&d, &b);
	const uint8_t garbage[] = { 0xc1, 0xff, 0x00, 0x13, 0x37 };
	send_frame_expect(&d, &b, garbage, sizeof garbage, "bad_frame");
	const uint8_t huge_array[] = { 0xdd, 0xff, 0xff, 0xff, 0xff };
	send_frame_expect(&d, &b, huge_array, sizeof huge_array, "bad_frame");
	const uint8_t huge_map[] = { 0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'v' };
	send_frame_expect(&d, &b, huge_map, sizeof huge_map, "bad_frame");
	const uint8_t huge_str[] = { 0x81, 0xa2, 'o', 'p', 0xdb, 0xff, 0xff, 0xff, 0xff, 'x' };
	send_frame_expect(&d, &b, huge_str, sizeof huge_str, "bad_frame");
	const uint8_t not_a_map[] = { 0x93, 0x01, 0x02, 0x03 };
	send_frame_expect(&d, &b, not_a_map, sizeof not_a_map, "bad_frame");
	const uint8_t trailing[] = { 0x80, 0x80 };
	send_frame_expect(&d, &b, trailing, sizeof trailing, "bad_frame");
	uint8_t deep[64];
	for (size_t i = 0; i < sizeof deep; i++)
		deep[i] = 0x91; /* [[[[...]]]] */
	deep[0] = 0x81;
	deep[1] = 0xa1;
	deep[2] = 'x';
	send_frame_expect(&d, &b, deep, sizeof deep, "bad_frame");
	/* a well-formed map that is not a valid request: refused, connection kept */
	const uint8_t empty_map[] = { 0x80 };
	send_frame_expect(&d, &b, empty_map, sizeof empty_map, "bad_request");
	gpuq_close(b.c);
	daemon_stop(&d);
}

TEST(oversize_lengths_are_refused_before_allocation)
{
	struct daemon_proc d;
	struct bystander b;
	daemon_start(&d, "--max-frame", "64K", NULL);
	bystander_start(&d, &b);
	const uint32_t lengths[] = { 0xffffffffu, (64u << 10) + 1 };
	for (size_t i = 0; i < 2; i++) {
		int fd = raw_connect(&d);
		uint8_t hdr[4];
		frame_put_header(hdr, lengths[i]);
		raw_write(fd, hdr, 4);
		char code[32];
		CHECKF(raw_read_reply(fd, code, sizeof code) == 0, "no reply to a %u-byte length",
		       lengths[i]);
		CHECK_STR(code, "bad_frame");
		CHECK(raw_closed_by_peer(fd, 2000));
		close(fd);
	}
	bystander_check(&b);
	gpuq_close(b.c);
	daemon_stop(&d);
}

TEST(truncated_and_split_frames)
{
	struct daemon_proc d;
	struct bystander b;
	daemon_start(&d, NULL);
	bystander_start(&d, &b);
	/* a frame announcing 100 bytes, then the client vanishes */
	int fd = raw_connect(&d);
	uint8_t hdr[4];
	frame_put_header(hdr, 100);
	raw_write(fd, hdr, 4);
	raw_write(fd, "\x81\xa2op", 4);
	close(fd);
	bystander_check(&b);
	/* a valid ping sent one byte at a time still works */
	struct mp_map req;
	msgpack_sbuffer sb;
	mp_map_init(&req);
	mp_put_u64(&req, "v", 1);
	mp_put_u64(&req, "id", 5);
	mp_put_str(&req, "op", "ping");
	msgpack_sbuffer_init(&sb);
	mp_map_frame(&req, &sb);
	fd = raw_connect(&d);
	for (size_t i = 0; i < sb.size; i++) {
		raw_write(fd, sb.data + i, 1);
		usleep(200);
	}
	char code[32];
	CHECK(raw_read_reply(fd, code, sizeof code) == 0);
	CHECK_STR(code, "ok");
	msgpack_sbuffer_destroy(&sb);
	close(fd);
	bystander_check(&b);
	gpuq_close(b.c);
	daemon_stop(&d);
}

TEST(descriptor_count_out_of_step_closes_the_connection)
{
	struct daemon_proc d;
	struct bystander b;
	daemon_start(&d, NULL);
	bystander_start(&d, &b);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "precious");
	mp_put_u64(&req, "fds", 2); /* but none attached */
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_BAD_FRAME, "descriptors");
	gpuq_reply_free(r);
	gpuq_close(c);
	bystander_check(&b);
	gpuq_close(b.c);
	daemon_stop(&d);
}
