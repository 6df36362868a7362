/* Unit tests for protocol/msg.c: the limit walker, decoding, getters, builders, JSON. */
#include "tests/harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "protocol/frame.h"
#include "protocol/msg.h"

static const struct msg_limits loose = { 32, UINT32_MAX, UINT32_MAX, UINT32_MAX };

/* A growable byte string for hand-made msgpack. */
struct bytes {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static void bytes_init(struct bytes *b)
{
	msgpack_sbuffer_init(&b->sb);
	msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

static void bytes_raw(struct bytes *b, const void *p, size_t n)
{
	msgpack_sbuffer_write(&b->sb, p, n);
}

static void bytes_fill(struct bytes *b, uint8_t c, size_t n)
{
	for (size_t i = 0; i < n; i++)
		bytes_raw(b, &c, 1);
}

static void bytes_free(struct bytes *b)
{
	msgpack_sbuffer_destroy(&b->sb);
}

/* Expects msg_check_limits to refuse data with exactly this message. */
static void check_refused(const void *data, size_t len, const struct msg_limits *lim,
			  const char *message)
{
	struct gpuq_error err;
	gpuq_error_clear(&err);
	int rc = msg_check_limits(data, len, lim, &err);
	CHECKF(rc == -1, "accepted; expected \"%s\"", message);
	CHECK_EQ(err.code, GPUQ_E_BAD_FRAME);
	CHECK_STR(err.message, message);
}

static void check_accepted(const void *data, size_t len, const struct msg_limits *lim)
{
	struct gpuq_error err;
	gpuq_error_clear(&err);
	int rc = msg_check_limits(data, len, lim, &err);
	CHECKF(rc == 0, "refused: %s", err.message);
}

/* msg_print_json's output as a string (free it). */
static char *json_of(const msgpack_object *o)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	CHECK(f != NULL);
	msg_print_json(f, o);
	fclose(f);
	return text;
}

/* Unpacks b (with msgpack-c directly) and checks its JSON. */
static void check_json(struct bytes *b, const char *want)
{
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	size_t off = 0;
	CHECK_EQ(msgpack_unpack_next(&u, b->sb.data, b->sb.size, &off),
		 MSGPACK_UNPACK_SUCCESS);
	char *got = json_of(&u.data);
	CHECK_STR(got, want);
	free(got);
	msgpack_unpacked_destroy(&u);
}

/* Decodes a finished map, failing the test if it does not decode. */
static void decode_ok(struct msg *m, const msgpack_sbuffer *sb)
{
	struct gpuq_error err;
	gpuq_error_clear(&err);
	int rc = msg_decode(m, sb->data, sb->size, &msg_request_limits, &err);
	CHECKF(rc == 0, "msg_decode: %s", err.message);
	CHECK(m->root && m->root->type == MSGPACK_OBJECT_MAP);
}

/* ---- Limits -------------------------------------------------------------- */

TEST(request_limits_values)
{
	CHECK_EQ(msg_request_limits.max_depth, 4);
	CHECK_EQ(msg_request_limits.max_container, 256);
	CHECK_EQ(msg_request_limits.max_total_objects, 4096);
	CHECK_EQ(msg_request_limits.max_str, 65536);
}

TEST(array32_claiming_4g_entries)
{
	const uint8_t a[] = { 0xdd, 0xff, 0xff, 0xff, 0xff };
	check_refused(a, sizeof a, &msg_request_limits,
		      "array of 4294967295 entries at byte 0 exceeds the limit of 256");
	/* Without the count limit, the bytes that follow still cannot hold it. */
	check_refused(a, sizeof a, &loose,
		      "array of 4294967295 entries at byte 0 cannot fit: 4294967295 objects are due and only 0 bytes remain");
	struct msg m;
	struct gpuq_error err;
	CHECK_EQ(msg_decode(&m, a, sizeof a, &loose, &err), -1);
	CHECK_EQ(err.code, GPUQ_E_BAD_FRAME);
}

TEST(map32_claiming_4g_entries)
{
	const uint8_t a[] = { 0xdf, 0xff, 0xff, 0xff, 0xff };
	check_refused(a, sizeof a, &msg_request_limits,
		      "map of 4294967295 entries at byte 0 exceeds the limit of 256");
	check_refused(a, sizeof a, &loose,
		      "map of 4294967295 entries at byte 0 cannot fit: 8589934590 objects are due and only 0 bytes remain");
	/* Nested, inside a valid-looking map: the position is reported. */
	const uint8_t b[] = { 0x81, 0xa1, 'k', 0xdf, 0xff, 0xff, 0xff, 0xff };
	check_refused(b, sizeof b, &msg_request_limits,
		      "map of 4294967295 entries at byte 3 exceeds the limit of 256");
}

TEST(str32_claiming_4gib)
{
	const uint8_t a[] = { 0xdb, 0xff, 0xff, 0xff, 0xff, 'x' };
	check_refused(a, sizeof a, &msg_request_limits,
		      "str of 4294967295 bytes at byte 0 exceeds the limit of 65536");
	check_refused(a, sizeof a, &loose,
		      "str of 4294967295 bytes at byte 0 runs past the end of the frame (1 bytes remain)");
	const uint8_t b[] = { 0xc6, 0xff, 0xff, 0xff, 0xff };
	check_refused(b, sizeof b, &msg_request_limits,
		      "bin of 4294967295 bytes at byte 0 exceeds the limit of 65536");
	const uint8_t c[] = { 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01 };
	check_refused(c, sizeof c, &msg_request_limits,
		      "ext of 4294967295 bytes at byte 0 exceeds the limit of 65536");
}

/* The remaining bytes must hold every entry announced, each at least one byte. */
TEST(container_must_fit_remaining_bytes)
{
	const uint8_t ok_map[] = { 0x82, 1, 2, 3, 4 };
	check_accepted(ok_map, sizeof ok_map, &loose);
	check_refused(ok_map, 4, &loose,
		      "map of 2 entries at byte 0 cannot fit: 4 objects are due and only 3 bytes remain");
	const uint8_t ok_arr[] = { 0xdc, 0x00, 0x03, 1, 2, 3 };
	check_accepted(ok_arr, sizeof ok_arr, &loose);
	check_refused(ok_arr, 5, &loose,
		      "array of 3 entries at byte 0 cannot fit: 3 objects are due and only 2 bytes remain");
	/* Objects owed by outer containers count too: [[1,2], 3] cut short. */
	const uint8_t nested[] = { 0x92, 0x92, 1, 2 };
	check_refused(nested, sizeof nested, &loose,
		      "array of 2 entries at byte 1 cannot fit: 3 objects are due and only 2 bytes remain");
}

static void nest_arrays(struct bytes *b, unsigned depth)
{
	bytes_init(b);
	for (unsigned i = 0; i < depth; i++)
		bytes_fill(b, 0x91, 1);
	bytes_fill(b, 0x00, 1);
}

TEST(depth_boundary)
{
	struct bytes b;
	nest_arrays(&b, 4);
	check_accepted(b.sb.data, b.sb.size, &msg_request_limits);
	bytes_free(&b);
	nest_arrays(&b, 5);
	check_refused(b.sb.data, b.sb.size, &msg_request_limits,
		      "array at byte 4 is nested 5 deep, beyond the limit of 4");
	bytes_free(&b);
	/* An empty container counts as a level too. */
	const uint8_t empty[] = { 0x81, 0xa1, 'a', 0x91, 0x91, 0x80 };
	check_accepted(empty, sizeof empty, &msg_request_limits);
	const uint8_t deeper[] = { 0x81, 0xa1, 'a', 0x91, 0x91, 0x91, 0x90 };
	check_refused(deeper, sizeof deeper, &msg_request_limits,
		      "array at byte 6 is nested 5 deep, beyond the limit of 4");
}

/* Deep nesting is refused at the limit however deep it goes, with any limit. */
TEST(deep_nesting)
{
	struct bytes b;
	nest_arrays(&b, 100000);
	check_refused(b.sb.data, b.sb.size, &msg_request_limits,
		      "array at byte 4 is nested 5 deep, beyond the limit of 4");
	const struct msg_limits deep = { 1000, 256, UINT32_MAX, 65536 };
	check_refused(b.sb.data, b.sb.size, &deep,
		      "array at byte 1000 is nested 1001 deep, beyond the limit of 1000");
	const struct msg_limits deepest = { UINT32_MAX, 256, UINT32_MAX, 65536 };
	check_accepted(b.sb.data, b.sb.size, &deepest);
	bytes_free(&b);
	/* msgpack-c cannot unpack past 32 levels: msg_decode says so, cleanly. */
	struct bytes c;
	bytes_init(&c);
	bytes_fill(&c, 0x81, 1);
	bytes_fill(&c, 0xa0, 1);
	for (int i = 0; i < 40; i++)
		bytes_fill(&c, 0x91, 1);
	bytes_fill(&c, 0xc0, 1);
	struct msg m;
	struct gpuq_error err;
	CHECK_EQ(msg_decode(&m, c.sb.data, c.sb.size, &deepest, &err), -1);
	CHECK_EQ(err.code, GPUQ_E_BAD_FRAME);
	CHECK(strstr(err.message, "msgpack-c could not unpack") != NULL);
	bytes_free(&c);
}

static void array_of(struct bytes *b, uint32_t n)
{
	bytes_init(b);
	msgpack_pack_array(&b->pk, n);
	for (uint32_t i = 0; i < n; i++)
		msgpack_pack_uint32(&b->pk, i);
}

static void map_of(struct bytes *b, uint32_t n)
{
	bytes_init(b);
	msgpack_pack_map(&b->pk, n);
	for (uint32_t i = 0; i < n; i++) {
		msgpack_pack_uint32(&b->pk, i);
		msgpack_pack_nil(&b->pk);
	}
}

TEST(container_boundary)
{
	struct bytes b;
	array_of(&b, 256);
	check_accepted(b.sb.data, b.sb.size, &msg_request_limits);
	bytes_free(&b);
	array_of(&b, 257);
	check_refused(b.sb.data, b.sb.size, &msg_request_limits,
		      "array of 257 entries at byte 0 exceeds the limit of 256");
	bytes_free(&b);
	map_of(&b, 256);
	check_accepted(b.sb.data, b.sb.size, &msg_request_limits);
	struct msg m;
	decode_ok(&m, &b.sb);
	CHECK_EQ(m.root->via.map.size, 256);
	msg_free(&m);
	bytes_free(&b);
	map_of(&b, 257);
	check_refused(b.sb.data, b.sb.size, &msg_request_limits,
		      "map of 257 entries at byte 0 exceeds the limit of 256");
	bytes_free(&b);
}

/*
 * 1 root + 16 array16s + nils: 4096 objects, or 4097 with the last nil at
 * byte 3 + 15 * 258 + 3 + 254 = 4130.
 */
static void many_objects(struct bytes *b, uint32_t total)
{
	bytes_init(b);
	msgpack_pack_array(&b->pk, 16);
	uint32_t ints = total - 17;
	for (int i = 0; i < 16; i++) {
		uint32_t n = ints > 255 ? 255 : ints;
		ints -= n;
		msgpack_pack_array(&b->pk, n);
		for (uint32_t j = 0; j < n; j++)
			msgpack_pack_nil(&b->pk);
	}
}

TEST(total_objects_boundary)
{
	struct bytes b;
	many_objects(&b, 4096);
	check_accepted(b.sb.data, b.sb.size, &msg_request_limits);
	bytes_free(&b);
	many_objects(&b, 4097);
	check_refused(b.sb.data, b.sb.size, &msg_request_limits,
		      "object at byte 4130 is one more than the limit of 4096 objects");
	bytes_free(&b);
	/* Map keys are objects too: {0:nil} is three. */
	const struct msg_limits three = { 4, 256, 3, 64 };
	const uint8_t m1[] = { 0x81, 0x00, 0xc0 };
	check_accepted(m1, sizeof m1, &three);
	const uint8_t a3[] = { 0x93, 1, 2, 3 };
	check_refused(a3, sizeof a3, &three,
		      "object at byte 3 is one more than the limit of 3 objects");
}

static void str_of(struct bytes *b, uint8_t format, uint32_t n)
{
	bytes_init(b);
	if (format == 0xd9) {
		msgpack_pack_str(&b->pk, n);
	} else if (format == 0xc4) {
		msgpack_pack_bin(&b->pk, n);
	} else {
		msgpack_pack_ext(&b->pk, n, 7);
	}
	bytes_fill(b, 'z', n);
}

TEST(string_boundary)
{
	static const struct {
		uint8_t format;
		const char *kind;
	} kinds[] = { { 0xd9, "str" }, { 0xc4, "bin" }, { 0xc7, "ext" } };
	for (size_t i = 0; i < 3; i++) {
		struct bytes b;
		str_of(&b, kinds[i].format, 65536);
		check_accepted(b.sb.data, b.sb.size, &msg_request_limits);
		bytes_free(&b);
		str_of(&b, kinds[i].format, 65537);
		char want[128];
		snprintf(want, sizeof want,
			 "%s of 65537 bytes at byte 0 exceeds the limit of 65536",
			 kinds[i].kind);
		check_refused(b.sb.data, b.sb.size, &msg_request_limits, want);
		bytes_free(&b);
	}
}

TEST(trailing_bytes)
{
	const uint8_t a[] = { 0x80, 0x00 };
	check_refused(a, sizeof a, &msg_request_limits,
		      "1 trailing bytes after the object that ends at byte 1");
	const uint8_t b[] = { 0x81, 0xa1, 'k', 0x01, 0xc0, 0xc0, 0xc0 };
	check_refused(b, sizeof b, &msg_request_limits,
		      "3 trailing bytes after the object that ends at byte 4");
	/* Two maps back to back are two objects. */
	const uint8_t c[] = { 0x80, 0x80 };
	struct msg m;
	struct gpuq_error err;
	CHECK_EQ(msg_decode(&m, c, sizeof c, &msg_request_limits, &err), -1);
	CHECK_EQ(err.code, GPUQ_E_BAD_FRAME);
}

TEST(empty_and_invalid)
{
	check_refused("", 0, &msg_request_limits,
		      "empty payload: expected one msgpack object");
	const uint8_t c1[] = { 0xc1 };
	check_refused(c1, 1, &msg_request_limits,
		      "byte 0 is 0xc1, which is not a msgpack format");
	const uint8_t nested[] = { 0x81, 0xa1, 'k', 0xc1 };
	check_refused(nested, sizeof nested, &msg_request_limits,
		      "byte 3 is 0xc1, which is not a msgpack format");
}

TEST(truncated_headers)
{
	const uint8_t u16[] = { 0xcd, 0x01 };
	check_refused(u16, sizeof u16, &loose,
		      "uint16 at byte 0 is truncated: it needs 3 bytes and 2 remain");
	const uint8_t f64[] = { 0x91, 0xcb, 0, 0, 0 };
	check_refused(f64, sizeof f64, &loose,
		      "float64 at byte 1 is truncated: it needs 9 bytes and 4 remain");
	const uint8_t fixext[] = { 0xd8, 0x01, 0, 0 };
	check_refused(fixext, sizeof fixext, &loose,
		      "ext of 16 bytes at byte 0 runs past the end of the frame (2 bytes remain)");
	const uint8_t str[] = { 0xa5, 'a', 'b' };
	check_refused(str, sizeof str, &loose,
		      "str of 5 bytes at byte 0 runs past the end of the frame (2 bytes remain)");
	const uint8_t early[] = { 0x92, 0xa1, 'x' };
	check_refused(early, sizeof early, &loose,
		      "the frame ends at byte 3 with 1 objects still due");
}

/* One object of each msgpack format, in a map so that msg_decode takes it. */
static void every_format(struct bytes *b)
{
	static const uint8_t raw[] = {
		0xa1, 'v', 0xdc, 0x00, 37,	/* "v": array16 of 37 */
		0x05, 0xe0, 0xff, 0xc0, 0xc2, 0xc3,	/* fixints, nil, bools */
		0xcc, 0xff, 0xcd, 0xff, 0xff, 0xce, 0, 0, 1, 0,
		0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
		0xd0, 0x80, 0xd1, 0x80, 0x00, 0xd2, 0x80, 0, 0, 0,
		0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0,
		0xca, 0x3f, 0xc0, 0, 0, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0,
		0xa2, 'h', 'i', 0xd9, 2, 'h', 'i', 0xda, 0, 2, 'h', 'i',
		0xdb, 0, 0, 0, 2, 'h', 'i',
		0xc4, 1, 0xab, 0xc5, 0, 1, 0xab, 0xc6, 0, 0, 0, 1, 0xab,
		0xd4, 1, 0xa, 0xd5, 2, 0xa, 0xb, 0xd6, 3, 1, 2, 3, 4,
		0xd7, 4, 1, 2, 3, 4, 5, 6, 7, 8,
		0xd8, 5, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8,
		0xc7, 1, 6, 0xee, 0xc8, 0, 1, 6, 0xee, 0xc9, 0, 0, 0, 1, 6, 0xee,
		0x91, 0x00, 0xdc, 0, 1, 0x00, 0xdd, 0, 0, 0, 1, 0x00,
		0x81, 0x00, 0x00, 0xde, 0, 1, 0x00, 0x00, 0xdf, 0, 0, 0, 1, 0x00, 0x00,
	};
	bytes_init(b);
	bytes_fill(b, 0x81, 1);
	bytes_raw(b, raw, sizeof raw);
}

TEST(every_format_accepted)
{
	struct bytes b;
	every_format(&b);
	struct msg m;
	decode_ok(&m, &b.sb);
	const msgpack_object *v = NULL;
	CHECK_EQ(msg_get_array(m.root, "v", &v, NULL), 1);
	CHECK_EQ(v->via.array.size, 37);
	char *json = json_of(v);
	CHECK_STR(json,
		  "[5,-32,-1,null,false,true,255,65535,256,18446744073709551615,"
		  "-128,-32768,-2147483648,-9223372036854775808,1.5,1.5,"
		  "\"hi\",\"hi\",\"hi\",\"hi\",\"ab\",\"ab\",\"ab\","
		  "{\"ext\":1,\"data\":\"0a\"},{\"ext\":2,\"data\":\"0a0b\"},"
		  "{\"ext\":3,\"data\":\"01020304\"},"
		  "{\"ext\":4,\"data\":\"0102030405060708\"},"
		  "{\"ext\":5,\"data\":\"01020304050607080102030405060708\"},"
		  "{\"ext\":6,\"data\":\"ee\"},{\"ext\":6,\"data\":\"ee\"},"
		  "{\"ext\":6,\"data\":\"ee\"},"
		  "[0],[0],[0],{\"0\":0},{\"0\":0},{\"0\":0}]");
	free(json);
	msg_free(&m);
	bytes_free(&b);
}

/* Every proper prefix of a valid frame is refused, and none crashes. */
TEST(every_truncation_refused)
{
	struct bytes b;
	every_format(&b);
	for (size_t n = 0; n < b.sb.size; n++) {
		struct msg m;
		struct gpuq_error err;
		gpuq_error_clear(&err);
		int rc = msg_decode(&m, b.sb.data, n, &loose, &err);
		CHECKF(rc == -1, "prefix of %zu bytes accepted", n);
		CHECK_EQ(err.code, GPUQ_E_BAD_FRAME);
		CHECK(err.message[0] != '\0');
	}
	bytes_free(&b);
}

TEST(non_map_root)
{
	const uint8_t arr[] = { 0x91, 0x01 };
	struct msg m;
	struct gpuq_error err;
	CHECK_EQ(msg_check_limits(arr, sizeof arr, &msg_request_limits, &err), 0);
	CHECK_EQ(msg_decode(&m, arr, sizeof arr, &msg_request_limits, &err), -1);
	CHECK_EQ(err.code, GPUQ_E_BAD_FRAME);
	CHECK_STR(err.message, "the frame's root is a msgpack array; requests and replies are maps");
	const uint8_t str[] = { 0xa2, 'h', 'i' };
	CHECK_EQ(msg_decode(&m, str, sizeof str, &msg_request_limits, &err), -1);
	CHECK_STR(err.message, "the frame's root is a msgpack str; requests and replies are maps");
	const uint8_t nil[] = { 0xc0 };
	CHECK_EQ(msg_decode(&m, nil, 1, &msg_request_limits, &err), -1);
	CHECK_STR(err.message, "the frame's root is a msgpack nil; requests and replies are maps");
}

/* ---- Builders and getters ------------------------------------------------ */

static void build_request(struct mp_map *req)
{
	mp_map_init(req);
	mp_put_u64(req, "v", 1);
	mp_put_u64(req, "id", UINT64_MAX);
	mp_put_str(req, "op", "alloc");
	mp_put_strn(req, "name", "w0xyz", 2);
	mp_put_i64(req, "neg", INT64_MIN);
	mp_put_i64(req, "pos", 5);
	mp_put_f64(req, "ratio", 0.25);
	mp_put_bool(req, "wait", true);
	mp_put_bool(req, "quiet", false);
	mp_put_nil(req, "none");
	struct mp_map child;
	mp_map_init(&child);
	mp_put_u64(&child, "a", 1);
	struct mp_array arr;
	mp_array_init(&arr);
	mp_array_str(&arr, "s");
	mp_array_u64(&arr, 2);
	mp_array_i64(&arr, -3);
	mp_array_f64(&arr, 1.5);
	mp_array_bool(&arr, false);
	mp_array_bool(&arr, true);
	mp_array_str(&arr, NULL);
	struct mp_map inner;
	mp_map_init(&inner);
	mp_array_map(&arr, &inner);
	struct mp_array inner_arr;
	mp_array_init(&inner_arr);
	mp_array_u64(&inner_arr, 9);
	mp_array_array(&arr, &inner_arr);
	mp_put_array(&child, "list", &arr);
	mp_put_map(req, "child", &child);
}

TEST(build_and_read_back)
{
	struct mp_map req;
	build_request(&req);
	CHECK_EQ(req.count, 11);
	msgpack_sbuffer out;
	msgpack_sbuffer_init(&out);
	mp_map_finish(&req, &out);
	struct msg m;
	decode_ok(&m, &out);
	struct gpuq_error err;
	uint64_t u = 0;
	int64_t i = 0;
	double d = 0;
	bool flag = false;
	char name[16];
	CHECK_EQ(msg_get_u64(m.root, "v", &u, &err), 1);
	CHECK_EQ(u, 1);
	CHECK_EQ(msg_get_u64(m.root, "id", &u, &err), 1);
	CHECK_EQ(u, UINT64_MAX);
	CHECK_EQ(msg_get_str(m.root, "op", name, sizeof name, &err), 1);
	CHECK_STR(name, "alloc");
	CHECK_EQ(msg_get_str(m.root, "name", name, sizeof name, &err), 1);
	CHECK_STR(name, "w0");
	CHECK_EQ(msg_get_i64(m.root, "neg", &i, &err), 1);
	CHECK(i == INT64_MIN);
	CHECK_EQ(msg_get_i64(m.root, "pos", &i, &err), 1);
	CHECK(i == 5);
	CHECK_EQ(msg_get_f64(m.root, "ratio", &d, &err), 1);
	CHECK(d == 0.25);
	CHECK_EQ(msg_get_bool(m.root, "wait", &flag, &err), 1);
	CHECK(flag);
	CHECK_EQ(msg_get_bool(m.root, "quiet", &flag, &err), 1);
	CHECK(!flag);
	CHECK_EQ(msg_get_u64(m.root, "none", &u, &err), 0);
	CHECK_EQ(msg_get_u64(m.root, "missing", &u, &err), 0);
	CHECK_EQ(u, UINT64_MAX); /* untouched */
	const msgpack_object *child = NULL, *list = NULL;
	CHECK_EQ(msg_get_map(m.root, "child", &child, &err), 1);
	CHECK_EQ(msg_get_array(child, "list", &list, &err), 1);
	char *json = json_of(list);
	CHECK_STR(json, "[\"s\",2,-3,1.5,false,true,null,{},[9]]");
	free(json);
	msg_free(&m);
	msgpack_sbuffer_destroy(&out);
	mp_map_destroy(&req); /* already destroyed by finish: harmless */
}

TEST(map_frame_round_trip)
{
	msgpack_sbuffer out;
	msgpack_sbuffer_init(&out);
	for (int k = 0; k < 3; k++) {
		struct mp_map req;
		mp_map_init(&req);
		mp_put_u64(&req, "v", 1);
		mp_put_u64(&req, "id", (uint64_t)k);
		mp_put_str(&req, "op", "ping");
		mp_map_frame(&req, &out);
	}
	/* Each frame is 4 + 1 + (2+1) + (3+1) + (3+5) = 20 bytes. */
	CHECK_EQ(out.size, 60);
	CHECK_EQ(frame_get_header((const uint8_t *)out.data), 16);
	struct frame_reader r;
	frame_reader_init(&r, GPUQ_MIN_MAX_FRAME);
	CHECK_EQ(frame_reader_append(&r, out.data, out.size), 0);
	const uint8_t *p;
	size_t len;
	for (uint64_t k = 0; k < 3; k++) {
		CHECK_EQ(frame_reader_next(&r, &p, &len), 1);
		struct msg m;
		struct gpuq_error err;
		CHECK_EQ(msg_decode(&m, p, len, &msg_request_limits, &err), 0);
		uint64_t id = 99;
		CHECK_EQ(msg_get_u64(m.root, "id", &id, &err), 1);
		CHECK_EQ(id, k);
		msg_free(&m);
	}
	CHECK_EQ(frame_reader_next(&r, &p, &len), 0);
	frame_reader_free(&r);
	msgpack_sbuffer_destroy(&out);
}

TEST(put_object_copies)
{
	const uint8_t src[] = { 0x82, 0xa1, 'x', 0x92, 0x01, 0xa1, 'y', 0xa1, 'z', 0xca, 0x3f, 0xc0, 0, 0 };
	struct msg in;
	struct gpuq_error err;
	CHECK_EQ(msg_decode(&in, src, sizeof src, &msg_request_limits, &err), 0);
	struct mp_map out;
	mp_map_init(&out);
	mp_put_object(&out, "result", in.root);
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&out, &sb);
	msg_free(&in);
	/* The copy must not depend on the source. */
	CHECK_EQ(sb.size, 1 + 7 + sizeof src);
	CHECK(memcmp(sb.data + 8, src, sizeof src) == 0);
	struct msg m;
	decode_ok(&m, &sb);
	char *json = json_of(m.root);
	CHECK_STR(json, "{\"result\":{\"x\":[1,\"y\"],\"z\":1.5}}");
	free(json);
	msg_free(&m);
	msgpack_sbuffer_destroy(&sb);
}

TEST(null_string_is_nil)
{
	struct mp_map m;
	mp_map_init(&m);
	mp_put_str(&m, "s", NULL);
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&m, &sb);
	CHECK_EQ(sb.size, 4);
	CHECK_EQ((uint8_t)sb.data[3], 0xc0);
	msgpack_sbuffer_destroy(&sb);
}

/* A map holding one of every type, to test each getter against. */
static const uint8_t typed[] = {
	0x89,
	0xa1, 's', 0xa3, 'a', 'b', 'c',
	0xa1, 'u', 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0,
	0xa1, 'n', 0xfb, /* -5 */
	0xa1, 'f', 0xcb, 0x3f, 0xb9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a,
	0xa1, 'b', 0xc3,
	0xa1, 'a', 0x90,
	0xa1, 'm', 0x80,
	0xa1, 'z', 0xc0,
	0xa1, 'x', 0xc4, 0x01, 0x00,
};

TEST(getters_wrong_type_name_the_field)
{
	struct msg m;
	struct gpuq_error err;
	CHECK_EQ(msg_decode(&m, typed, sizeof typed, &msg_request_limits, &err), 0);
	uint64_t u;
	int64_t i;
	double d;
	bool b;
	char s[8];
	const msgpack_object *o;
#define WRONG(call, want)                                                   \
	do {                                                                   \
		gpuq_error_clear(&err);                                        \
		CHECK_EQ(call, -1);                                            \
		CHECK_EQ(err.code, GPUQ_E_BAD_REQUEST);                        \
		CHECK_STR(err.message, want);                                  \
	} while (0)
	WRONG(msg_get_u64(m.root, "s", &u, &err), "field 's': expected an unsigned integer, got str");
	WRONG(msg_get_u64(m.root, "f", &u, &err), "field 'f': expected an unsigned integer, got float64");
	WRONG(msg_get_i64(m.root, "b", &i, &err), "field 'b': expected an integer, got bool");
	WRONG(msg_get_f64(m.root, "s", &d, &err), "field 's': expected a number, got str");
	WRONG(msg_get_bool(m.root, "u", &b, &err), "field 'u': expected a bool, got unsigned integer");
	WRONG(msg_get_str(m.root, "n", s, sizeof s, &err), "field 'n': expected a string, got negative integer");
	WRONG(msg_get_str(m.root, "x", s, sizeof s, &err), "field 'x': expected a string, got bin");
	WRONG(msg_get_array(m.root, "m", &o, &err), "field 'm': expected an array, got map");
	WRONG(msg_get_map(m.root, "a", &o, &err), "field 'a': expected a map, got array");
#undef WRONG
	/* nil is absent for every getter. */
	CHECK_EQ(msg_get_u64(m.root, "z", &u, &err), 0);
	CHECK_EQ(msg_get_i64(m.root, "z", &i, &err), 0);
	CHECK_EQ(msg_get_f64(m.root, "z", &d, &err), 0);
	CHECK_EQ(msg_get_bool(m.root, "z", &b, &err), 0);
	CHECK_EQ(msg_get_str(m.root, "z", s, sizeof s, &err), 0);
	CHECK_EQ(msg_get_array(m.root, "z", &o, &err), 0);
	CHECK_EQ(msg_get_map(m.root, "z", &o, &err), 0);
	CHECK(msg_map_get(m.root, "z") != NULL);
	msg_free(&m);
}

TEST(getters_integer_ranges)
{
	struct msg m;
	struct gpuq_error err;
	CHECK_EQ(msg_decode(&m, typed, sizeof typed, &msg_request_limits, &err), 0);
	uint64_t u = 7;
	int64_t i = 7;
	double d = 0;
	CHECK_EQ(msg_get_u64(m.root, "n", &u, &err), -1);
	CHECK_STR(err.message, "field 'n': expected an unsigned integer, got -5");
	CHECK_EQ(u, 7);
	CHECK_EQ(msg_get_i64(m.root, "u", &i, &err), -1);
	CHECK_STR(err.message, "field 'u': 9223372036854775808 is out of range (at most 9223372036854775807)");
	CHECK_EQ(i, 7);
	CHECK_EQ(msg_get_u64(m.root, "u", &u, &err), 1);
	CHECK_EQ(u, 1ull << 63);
	CHECK_EQ(msg_get_i64(m.root, "n", &i, &err), 1);
	CHECK(i == -5);
	CHECK_EQ(msg_get_f64(m.root, "n", &d, &err), 1);
	CHECK(d == -5.0);
	CHECK_EQ(msg_get_f64(m.root, "u", &d, &err), 1);
	CHECK(d == 9223372036854775808.0);
	CHECK_EQ(msg_get_f64(m.root, "f", &d, &err), 1);
	CHECK(d == 0.1);
	msg_free(&m);
	/* The largest int64 and a positive int8 encoding both read as i64. */
	const uint8_t edge[] = { 0x82, 0xa1, 'a', 0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
				 0xa1, 'b', 0xd0, 0x05 };
	CHECK_EQ(msg_decode(&m, edge, sizeof edge, &msg_request_limits, &err), 0);
	CHECK_EQ(msg_get_i64(m.root, "a", &i, &err), 1);
	CHECK(i == INT64_MAX);
	CHECK_EQ(msg_get_u64(m.root, "b", &u, &err), 1);
	CHECK_EQ(u, 5);
	msg_free(&m);
}

TEST(get_f64_float32)
{
	const uint8_t f[] = { 0x81, 0xa1, 'f', 0xca, 0x3f, 0xc0, 0x00, 0x00 };
	struct msg m;
	struct gpuq_error err;
	CHECK_EQ(msg_decode(&m, f, sizeof f, &msg_request_limits, &err), 0);
	double d = 0;
	CHECK_EQ(msg_get_f64(m.root, "f", &d, &err), 1);
	CHECK(d == 1.5);
	msg_free(&m);
}

TEST(get_str_limits)
{
	const uint8_t src[] = { 0x83, 0xa1, 's', 0xa3, 'a', 'b', 'c',
				0xa1, 'z', 0xa3, 'a', 0x00, 'c',
				0xa1, 'e', 0xa0 };
	struct msg m;
	struct gpuq_error err;
	CHECK_EQ(msg_decode(&m, src, sizeof src, &msg_request_limits, &err), 0);
	char out[8];
	memset(out, 'X', sizeof out);
	CHECK_EQ(msg_get_str(m.root, "s", out, 4, &err), 1); /* exactly fits */
	CHECK_STR(out, "abc");
	CHECK_EQ(msg_get_str(m.root, "s", out, 3, &err), -1); /* one short */
	CHECK_EQ(err.code, GPUQ_E_BAD_REQUEST);
	CHECK_STR(err.message, "field 's': a string of 3 bytes is too long (at most 2)");
	CHECK_EQ(msg_get_str(m.root, "s", out, 0, &err), -1);
	CHECK_EQ(msg_get_str(m.root, "z", out, sizeof out, &err), -1);
	CHECK_STR(err.message, "field 'z': the string has a NUL byte at offset 1");
	CHECK_EQ(msg_get_str(m.root, "e", out, 1, &err), 1);
	CHECK_STR(out, "");
	msg_free(&m);
}

TEST(map_get)
{
	/* Duplicate keys: the first wins. Non-str keys never match. */
	const uint8_t src[] = { 0x83, 0x01, 0x02, 0xa1, 'k', 0x03, 0xa1, 'k', 0x04 };
	struct msg m;
	struct gpuq_error err;
	CHECK_EQ(msg_decode(&m, src, sizeof src, &msg_request_limits, &err), 0);
	const msgpack_object *v = msg_map_get(m.root, "k");
	CHECK(v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 == 3);
	CHECK(msg_map_get(m.root, "") == NULL);
	CHECK(msg_map_get(m.root, "kk") == NULL);
	CHECK(msg_map_get(v, "k") == NULL); /* not a map */
	CHECK(msg_map_get(NULL, "k") == NULL);
	msg_free(&m);
}

/* ---- JSON ---------------------------------------------------------------- */

TEST(json_escapes_strings)
{
	struct bytes b;
	bytes_init(&b);
	static const char s[] = "q\"b\\n\nt\tr\r\x01\x1f\x7f/\b\f";
	msgpack_pack_str_with_body(&b.pk, s, sizeof s - 1);
	check_json(&b, "\"q\\\"b\\\\n\\nt\\tr\\r\\u0001\\u001f\\u007f/\\u0008\\u000c\"");
	bytes_free(&b);
	/* A NUL inside a str survives as an escape. */
	bytes_init(&b);
	msgpack_pack_str_with_body(&b.pk, "a\0b", 3);
	check_json(&b, "\"a\\u0000b\"");
	bytes_free(&b);
}

TEST(json_utf8)
{
	struct bytes b;
	bytes_init(&b);
	/* é, €, 😀 pass through; a lone continuation, an overlong '/', a
	 * surrogate and a cut-off sequence each become U+FFFD per byte. */
	static const char s[] = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
				"\x80\xc0\xaf\xed\xa0\x80\xe2\x82";
	msgpack_pack_str_with_body(&b.pk, s, sizeof s - 1);
	check_json(&b, "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
		       "\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\"");
	bytes_free(&b);
	/* A lead byte without its continuation; a code point past U+10FFFF. */
	bytes_init(&b);
	msgpack_pack_str_with_body(&b.pk, "\xc3" "A\xf4\x90\x80\x80", 6);
	check_json(&b, "\"\\ufffdA\\ufffd\\ufffd\\ufffd\\ufffd\"");
	bytes_free(&b);
}

TEST(json_numbers)
{
	struct bytes b;
	bytes_init(&b);
	msgpack_pack_array(&b.pk, 11);
	msgpack_pack_double(&b.pk, 0.1);
	msgpack_pack_double(&b.pk, 1.0 / 3.0);
	msgpack_pack_double(&b.pk, 1e300);
	msgpack_pack_double(&b.pk, -0.0);
	msgpack_pack_double(&b.pk, NAN);
	msgpack_pack_double(&b.pk, INFINITY);
	msgpack_pack_double(&b.pk, -INFINITY);
	msgpack_pack_float(&b.pk, 1.1f);
	msgpack_pack_float(&b.pk, NAN);
	msgpack_pack_int64(&b.pk, INT64_MIN);
	msgpack_pack_uint64(&b.pk, UINT64_MAX);
	check_json(&b, "[0.1,0.3333333333333333,1e+300,-0,null,null,null,1.1,null,"
		       "-9223372036854775808,18446744073709551615]");
	bytes_free(&b);
}

TEST(json_keys_become_strings)
{
	struct bytes b;
	bytes_init(&b);
	msgpack_pack_map(&b.pk, 6);
	msgpack_pack_uint8(&b.pk, 1);
	msgpack_pack_uint8(&b.pk, 2);
	msgpack_pack_true(&b.pk);
	msgpack_pack_nil(&b.pk);
	msgpack_pack_nil(&b.pk);
	msgpack_pack_int8(&b.pk, -1);
	msgpack_pack_array(&b.pk, 2);
	msgpack_pack_uint8(&b.pk, 1);
	msgpack_pack_str_with_body(&b.pk, "a", 1);
	msgpack_pack_uint8(&b.pk, 0);
	msgpack_pack_bin_with_body(&b.pk, "\x01\xff", 2);
	msgpack_pack_bin_with_body(&b.pk, "\x01\xff", 2);
	msgpack_pack_str_with_body(&b.pk, "k\"", 2);
	msgpack_pack_double(&b.pk, 2.5);
	check_json(&b, "{\"1\":2,\"true\":null,\"null\":-1,\"[1,\\\"a\\\"]\":0,"
		       "\"01ff\":\"01ff\",\"k\\\"\":2.5}");
	bytes_free(&b);
}

/* ---- Regressions from fuzzing (tests/fuzz/fuzz_decode.c) ----------------- */

/* Maps nested as keys n deep: {{{"a":1}:2}:2}... */
static void nested_keys(struct bytes *b, int n)
{
	bytes_init(b);
	bytes_fill(b, 0x81, (size_t)n);
	bytes_raw(b, "\xa1" "a\x01", 3);
	bytes_fill(b, 0x02, (size_t)n - 1);
}

/*
 * msg_print_json used to escape a non-string key's text again at every
 * level of keys within keys, doubling the output per level: 30 levels asked
 * for gigabytes (libFuzzer: out-of-memory in json_char via open_memstream).
 */
TEST(fuzz_json_nested_keys_linear)
{
	struct bytes b;
	nested_keys(&b, 3);
	check_json(&b, "{\"{{\\\"a\\\":1}:2}\":2}");
	bytes_free(&b);
	nested_keys(&b, 31);
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	size_t off = 0;
	CHECK_EQ(msgpack_unpack_next(&u, b.sb.data, b.sb.size, &off),
		 MSGPACK_UNPACK_SUCCESS);
	char *got = json_of(&u.data);
	char want[256] = "{\"";
	for (int i = 0; i < 29; i++)
		strcat(want, "{");
	strcat(want, "{\\\"a\\\":1}");
	for (int i = 0; i < 29; i++)
		strcat(want, ":2}");
	strcat(want, "\":2}");
	CHECK_EQ(strlen(want), 131);
	CHECK_STR(got, want);
	free(got);
	msgpack_unpacked_destroy(&u);
	bytes_free(&b);
}

/* Decodes sb (and destroys it); returns msg_check_unique_keys's verdict and message. */
static int keys_verdict(msgpack_sbuffer *sb, char *message, size_t size)
{
	struct msg msg;
	struct gpuq_error err;
	CHECK(msg_decode(&msg, sb->data, sb->size, &msg_request_limits, &err) == 0);
	gpuq_error_clear(&err);
	int rc = msg_check_unique_keys(msg.root, &err);
	snprintf(message, size, "%s", err.message);
	if (rc < 0)
		CHECK_EQ(err.code, GPUQ_E_BAD_REQUEST);
	msg_free(&msg);
	msgpack_sbuffer_destroy(sb);
	return rc;
}

/* Decodes a map built by build() and returns msg_check_unique_keys's verdict and message. */
static int unique_keys(void (*build)(struct mp_map *), char *message, size_t size)
{
	struct mp_map m;
	msgpack_sbuffer sb;
	mp_map_init(&m);
	build(&m);
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&m, &sb);
	return keys_verdict(&sb, message, size);
}

static void distinct(struct mp_map *m)
{
	mp_put_u64(m, "a", 1);
	mp_put_u64(m, "b", 1);
	mp_put_str(m, "ab", "a");
}

static void twice_at_root(struct mp_map *m)
{
	mp_put_u64(m, "a", 1);
	mp_put_u64(m, "b", 1);
	mp_put_str(m, "a", "again");
}

static void twice_in_a_nested_map(struct mp_map *m)
{
	struct mp_array ops;
	struct mp_map op;
	mp_array_init(&ops);
	mp_map_init(&op);
	mp_put_str(&op, "op", "sin");
	mp_put_nil(&op, "op");
	mp_array_map(&ops, &op);
	mp_put_array(m, "ops", &ops);
}

TEST(msg_duplicate_keys_are_found_at_any_depth)
{
	char message[512];
	CHECK(unique_keys(distinct, message, sizeof message) == 0);
	CHECK(unique_keys(twice_at_root, message, sizeof message) < 0);
	CHECK(strstr(message, "key 'a' twice"));
	CHECK(unique_keys(twice_in_a_nested_map, message, sizeof message) < 0);
	CHECK(strstr(message, "key 'op' twice"));
}

static void same_length_keys(struct mp_map *m)
{
	mp_put_u64(m, "ab", 1);
	mp_put_u64(m, "ba", 1);
}

/* msg_check_unique_keys on raw msgpack: {"x": {k: 1, k': 2}}, k and k' built by pack_key. */
static int raw_nested_keys(void (*pack_key)(msgpack_packer *, int), char *message, size_t size)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 1);
	msgpack_pack_str_with_body(&pk, "x", 1);
	msgpack_pack_map(&pk, 2);
	for (int i = 0; i < 2; i++) {
		pack_key(&pk, i);
		msgpack_pack_int(&pk, i + 1);
	}
	return keys_verdict(&sb, message, size);
}

/* Found by the fuzzer: two empty keys, whose pointers msgpack-c leaves NULL (no memcmp on those). */
static void empty_key_twice(msgpack_packer *pk, int i)
{
	(void)i;
	msgpack_pack_str(pk, 0);
}

static void int_key_twice(msgpack_packer *pk, int i)
{
	(void)i;
	msgpack_pack_int(pk, 7);
}

static void int_then_uint_key(msgpack_packer *pk, int i)
{
	if (i == 0)
		msgpack_pack_int64(pk, -7);
	else
		msgpack_pack_uint64(pk, 7);
}

static void str_then_int_key(msgpack_packer *pk, int i)
{
	if (i == 0)
		msgpack_pack_str_with_body(pk, "7", 1);
	else
		msgpack_pack_int(pk, 7);
}

/* Keys that are not strings still go through msgpack's own equality. */
TEST(msg_duplicate_keys_of_other_types_and_same_length_strings)
{
	char message[512];
	CHECK(unique_keys(same_length_keys, message, sizeof message) == 0);
	CHECK(raw_nested_keys(empty_key_twice, message, sizeof message) < 0);
	CHECK(strstr(message, "twice"));
	CHECK(raw_nested_keys(int_key_twice, message, sizeof message) < 0);
	CHECK(strstr(message, "twice"));
	CHECK(raw_nested_keys(int_then_uint_key, message, sizeof message) == 0);
	CHECK(raw_nested_keys(str_then_int_key, message, sizeof message) == 0);
}

static void owner_wide(struct mp_map *m)
{
	mp_put_u64(m, "owner", (1ull << 32) + 65534);
	mp_put_u64(m, "ok", 7);
}

TEST(msg_get_u64_in_names_the_field_and_range)
{
	struct mp_map m;
	msgpack_sbuffer sb;
	struct msg msg;
	struct gpuq_error err;
	uint64_t v = 0;
	mp_map_init(&m);
	owner_wide(&m);
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&m, &sb);
	CHECK(msg_decode(&msg, sb.data, sb.size, &msg_request_limits, &err) == 0);
	CHECK(msg_get_u64_in(msg.root, "owner", 0, 4294967294u, &v, &err) == -1);
	CHECK_STR(err.message, "field 'owner': 4295032830 is out of range (0 to 4294967294)");
	CHECK(msg_get_u64_in(msg.root, "ok", 1, 7, &v, &err) == 1 && v == 7);
	CHECK(msg_get_u64_in(msg.root, "absent", 1, 7, &v, &err) == 0);
	msg_free(&msg);
	msgpack_sbuffer_destroy(&sb);
}

/*
 * In a nested map as at the root, nil is absent: the getters return 0 and
 * store nothing, so that a caller tells a given field by what they return,
 * not by looking for the key (which a ring's nil slot_bytes once passed, to
 * a division by zero in gpuqd).
 */
TEST(msg_nil_in_a_nested_map_reads_as_absent)
{
	struct mp_map m, ring;
	msgpack_sbuffer sb;
	struct msg msg;
	struct gpuq_error err;
	const msgpack_object *nested;
	uint64_t v = 12345;
	mp_map_init(&m);
	mp_map_init(&ring);
	mp_put_nil(&ring, "slot_bytes");
	mp_put_u64(&ring, "counters", 0);
	mp_put_map(&m, "ring", &ring);
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&m, &sb);
	CHECK(msg_decode(&msg, sb.data, sb.size, &msg_request_limits, &err) == 0);
	CHECK(msg_get_map(msg.root, "ring", &nested, &err) == 1);
	CHECK(msg_map_get(nested, "slot_bytes") != NULL); /* the key is there ... */
	CHECK(msg_get_u64_in(nested, "slot_bytes", 8, UINT64_MAX, &v, &err) == 0); /* ... absent */
	CHECK_EQ(v, 12345);
	CHECK(msg_get_u64(nested, "counters", &v, &err) == 1 && v == 0);
	msg_free(&msg);
	msgpack_sbuffer_destroy(&sb);
}
