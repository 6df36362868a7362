/*
 * libFuzzer target for the path a client's bytes take: frame_reader ->
 * msg_decode -> field getters (and msg_print_json, as the CLI uses it).
 *
 *   make fuzz && build/fuzz-decode -max_total_time=60 tests/fuzz/corpus
 *
 * libFuzzer adds what it finds to the first directory named; to keep the
 * committed seeds as they are, name a scratch directory first:
 *   build/fuzz-decode -max_total_time=60 /tmp/gpuq-corpus tests/fuzz/corpus
 * The seeds are a ping, an alloc request, an attach, a region_create, a put
 * through a region and one through a ring, a lease_break, two frames back
 * to back, headers claiming 2^32-1 entries or bytes, deep nesting, a 4 GiB
 * frame, and requests with duplicate keys (at the root, in a nested map,
 * integer keys), distinct keys of one length, strings that are not UTF-8
 * (also after ASCII), an owner beyond 32 bits, a ring whose slot_bytes and
 * counters are nil, and fill values at the edges of f32, i64 and u64.
 *
 * Besides "does not crash", it checks these and abort()s when one fails, so
 * that libFuzzer keeps the input:
 *  - feeding the stream whole or in small pieces yields the same frames;
 *  - whatever msg_check_limits accepts, msgpack-c unpacks completely (the
 *    walker and the unpacker agree on where an object ends);
 *  - a decoded map copied with mp_put_object decodes again;
 *  - msg_check_unique_keys refuses only with a bad_request that says why,
 *    and msg_get_u64_in never returns a value outside its range;
 *  - every string of a frame (and the raw input), written back with
 *    mp_put_strn as a reply would be, decodes as valid UTF-8, unchanged
 *    when it was valid, and utf8_escape agrees with utf8_valid;
 *  - every number of a frame, printed as messages print it
 *    (gpuq_format_number), reads back as itself (as a double and a float);
 *  - a ring map's nil slot_bytes or counters reads as absent.
 * A crashing input found here becomes a regression test in
 * tests/unit/test_msg.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/frame.h"
#include "protocol/msg.h"
#include "protocol/utf8.h"

/* Small, so that the fuzzer reaches the refusal as well as the frames. */
#define FUZZ_MAX_FRAME 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *devnull;

static void exercise_getters(const msgpack_object *root)
{
	static const char *const keys[] = { "v", "id", "op", "bytes", "name" };
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		struct gpuq_error err;
		uint64_t u;
		int64_t s;
		double d;
		bool b;
		char str[65];
		const msgpack_object *o;
		msg_get_u64(root, keys[i], &u, &err);
		msg_get_i64(root, keys[i], &s, &err);
		msg_get_f64(root, keys[i], &d, &err);
		msg_get_bool(root, keys[i], &b, &err);
		if (msg_get_str(root, keys[i], str, sizeof str, &err) == 1 &&
		    strlen(str) >= sizeof str)
			abort();
		if (msg_get_array(root, keys[i], &o, &err) == 1)
			msg_print_json(devnull, o);
		if (msg_get_map(root, keys[i], &o, &err) == 1)
			msg_print_json(devnull, o);
		msg_map_get(root, keys[i]);
	}
}

/*
 * A string as a reply writes it: mp_put_strn must produce valid UTF-8 that
 * is the string itself when that was valid, and utf8_escape the same.
 */
static void check_text(const char *p, size_t n)
{
	bool was_valid = utf8_valid(p, n);
	char *escaped = malloc(4 * n + 1);
	if (!escaped)
		abort();
	size_t len = utf8_escape(p, n, escaped);
	if (!utf8_valid(escaped, len) || (was_valid && (len != n || (n && memcmp(escaped, p, n)))) ||
	    (!was_valid && len <= n)) {
		fprintf(stderr, "utf8_escape and utf8_valid disagree\n");
		abort();
	}
	struct mp_map m;
	msgpack_sbuffer sb;
	struct msg back;
	struct gpuq_error err;
	mp_map_init(&m);
	mp_put_strn(&m, "s", p, n);
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&m, &sb);
	static const struct msg_limits wide = { 2, 2, 3, UINT32_MAX };
	if (msg_decode(&back, sb.data, sb.size, &wide, &err) < 0)
		abort();
	const msgpack_object *s = msg_map_get(back.root, "s");
	if (!s || s->type != MSGPACK_OBJECT_STR || s->via.str.size != len ||
	    (len && memcmp(s->via.str.ptr, escaped, len) != 0)) {
		fprintf(stderr, "mp_put_strn did not write the escaped string\n");
		abort();
	}
	msg_free(&back);
	msgpack_sbuffer_destroy(&sb);
	free(escaped);
}

/* Every string key and value of a map, and in its nested arrays and maps. */
static void check_texts(const msgpack_object *o)
{
	if (o->type == MSGPACK_OBJECT_STR) {
		check_text(o->via.str.ptr, o->via.str.size);
	} else if (o->type == MSGPACK_OBJECT_ARRAY) {
		for (uint32_t i = 0; i < o->via.array.size; i++)
			check_texts(&o->via.array.ptr[i]);
	} else if (o->type == MSGPACK_OBJECT_MAP) {
		for (uint32_t i = 0; i < o->via.map.size; i++) {
			check_texts(&o->via.map.ptr[i].key);
			check_texts(&o->via.map.ptr[i].val);
		}
	}
}

/*
 * Every float and integer of a frame, as a message prints it
 * (gpuq_format_number): the text reads back as the same number, as a double
 * and as the float it rounds to, so that two numbers in a message never
 * read the same.
 */
static void check_number(double v)
{
	char text[40];
	if (!isfinite(v))
		return; /* messages print those as inf and nan themselves */
	gpuq_format_number(text, sizeof text, v, false);
	if (strtod(text, NULL) != v)
		abort();
	float f = (float)v;
	if (!isfinite(f))
		return;
	gpuq_format_number(text, sizeof text, f, true);
	if ((float)strtod(text, NULL) != f)
		abort();
}

static void check_numbers(const msgpack_object *o)
{
	switch (o->type) {
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		check_number(o->via.f64);
		break;
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		check_number((double)o->via.u64);
		break;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		check_number((double)o->via.i64);
		break;
	case MSGPACK_OBJECT_ARRAY:
		for (uint32_t i = 0; i < o->via.array.size; i++)
			check_numbers(&o->via.array.ptr[i]);
		break;
	case MSGPACK_OBJECT_MAP:
		for (uint32_t i = 0; i < o->via.map.size; i++)
			check_numbers(&o->via.map.ptr[i].val);
		break;
	default:
		break;
	}
}

/*
 * A nested map's fields are read as the root's are: nil is absent (nothing
 * stored, 0 returned), as a ring's slot_bytes must be (a nil one once passed
 * a presence check and divided by zero).
 */
static void check_nested_nil(const msgpack_object *root)
{
	struct gpuq_error err;
	const msgpack_object *ring;
	if (msg_get_map(root, "ring", &ring, &err) != 1)
		return;
	static const char *const keys[] = { "slot_bytes", "counters" };
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		const msgpack_object *o = msg_map_get(ring, keys[i]);
		uint64_t v = 12345;
		int rc = msg_get_u64_in(ring, keys[i], 8, UINT64_MAX, &v, &err);
		if (o && o->type == MSGPACK_OBJECT_NIL && (rc != 0 || v != 12345))
			abort();
		if (rc == 1 && v < 8)
			abort();
	}
}

/* The request-level checks every decoded request goes through in gpuqd. */
static void check_request_rules(const msgpack_object *root)
{
	struct gpuq_error err;
	gpuq_error_clear(&err);
	if (msg_check_unique_keys(root, &err) < 0 &&
	    (err.code != GPUQ_E_BAD_REQUEST || err.message[0] == '\0'))
		abort();
	static const char *const keys[] = { "owner", "device", "fds", "timeout_ms" };
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		uint64_t v = 12345;
		int rc = msg_get_u64_in(root, keys[i], 1, 4294967294u, &v, &err);
		if ((rc == 1 && (v < 1 || v > 4294967294u)) || (rc <= 0 && v != 12345))
			abort();
	}
	check_texts(root);
	check_numbers(root);
	check_nested_nil(root);
}

/* A decoded map, put whole into a new map, must decode again. */
static void check_copy(const msgpack_object *root)
{
	static const struct msg_limits wider = { 5, 256, 2 * 4096 + 3, 64 * 1024 };
	struct mp_map m;
	mp_map_init(&m);
	mp_put_object(&m, "copy", root);
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&m, &sb);
	struct msg again;
	struct gpuq_error err;
	if (msg_decode(&again, sb.data, sb.size, &wider, &err) < 0) {
		fprintf(stderr, "copy does not decode: %s\n", err.message);
		abort();
	}
	msg_free(&again);
	msgpack_sbuffer_destroy(&sb);
}

/* Decodes one frame; returns a digest of the outcome for comparison. */
static uint64_t decode_frame(const uint8_t *p, size_t len)
{
	struct msg m;
	struct gpuq_error err;
	gpuq_error_clear(&err);
	if (msg_decode(&m, p, len, &msg_request_limits, &err) < 0) {
		if (err.code != GPUQ_E_BAD_FRAME || err.message[0] == '\0')
			abort();
		return 1;
	}
	exercise_getters(m.root);
	check_request_rules(m.root);
	msg_print_json(devnull, m.root);
	check_copy(m.root);
	uint64_t digest = 2 + m.root->via.map.size;
	msg_free(&m);
	return digest;
}

/*
 * Feeds data to a reader `chunk` bytes at a time and decodes every frame.
 * Returns a digest of the frames seen and how the stream ended.
 */
static uint64_t feed(const uint8_t *data, size_t size, size_t chunk)
{
	struct frame_reader r;
	frame_reader_init(&r, FUZZ_MAX_FRAME);
	uint64_t digest = 0;
	int rc = 0;
	for (size_t at = 0; at < size && rc >= 0; at += chunk) {
		size_t n = size - at < chunk ? size - at : chunk;
		if (frame_reader_append(&r, data + at, n) < 0)
			abort();
		const uint8_t *p;
		size_t len;
		while ((rc = frame_reader_next(&r, &p, &len)) == 1)
			digest = digest * 31 + decode_frame(p, len) * 7 + len;
		if (rc < 0 && (rc != -EMSGSIZE || len <= FUZZ_MAX_FRAME))
			abort();
	}
	digest = digest * 31 + (rc < 0 ? 3 : frame_reader_pending(&r));
	frame_reader_free(&r);
	return digest;
}

/* What the walker accepts with loose limits, msgpack-c must unpack whole. */
static void check_walker_agrees(const uint8_t *data, size_t size)
{
	/* msgpack-c's own stack holds 32 levels. */
	static const struct msg_limits loose = { 32, UINT32_MAX, UINT32_MAX, UINT32_MAX };
	if (msg_check_limits(data, size, &loose, NULL) < 0)
		return;
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	size_t off = 0;
	msgpack_unpack_return rc =
		msgpack_unpack_next(&u, (const char *)data, size, &off);
	if (rc != MSGPACK_UNPACK_SUCCESS || off != size) {
		fprintf(stderr, "walker accepted, msgpack-c returned %d at %zu of %zu\n",
			rc, off, size);
		abort();
	}
	msg_print_json(devnull, &u.data);
	msgpack_unpacked_destroy(&u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!devnull && !(devnull = fopen("/dev/null", "w")))
		abort();
	uint64_t whole = feed(data, size, size ? size : 1);
	uint64_t pieces = feed(data, size, 1 + size % 7);
	if (whole != pieces) {
		fprintf(stderr, "whole and piecewise feeding disagree\n");
		abort();
	}
	check_walker_agrees(data, size);
	check_text((const char *)data, size < 256 ? size : 256);
	if (size >= 4)
		check_walker_agrees(data + 4, size - 4);
	return 0;
}
