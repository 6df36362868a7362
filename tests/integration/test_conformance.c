/*
 * docs/protocol.md as an independent client reads it: replies are UTF-8
 * whatever a request held, every field is type-checked, a job request
 * without wait replies `queued`, out-of-range values (fill values, chain
 * constants, owners) are refused, a gang noop lists its devices, `peer`
 * copies go where `devices` says there is peer access, duplicate keys are
 * refused and nil is absent.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "protocol/utf8.h"
#include "tests/integration/fixture.h"

/* Puts key with raw bytes as its string, invalid UTF-8 and all (mp_put_str would escape them). */
static void put_raw_str(struct mp_map *m, const char *key, const char *bytes, size_t n)
{
	msgpack_pack_str_with_body(&m->pk, key, strlen(key));
	msgpack_pack_str_with_body(&m->pk, bytes, n);
	m->count++;
}

/* Whether every string in o, keys included, is valid UTF-8. */
static bool all_utf8(const msgpack_object *o)
{
	switch (o->type) {
	case MSGPACK_OBJECT_STR:
		return utf8_valid(o->via.str.ptr, o->via.str.size);
	case MSGPACK_OBJECT_ARRAY:
		for (uint32_t i = 0; i < o->via.array.size; i++)
			if (!all_utf8(&o->via.array.ptr[i]))
				return false;
		return true;
	case MSGPACK_OBJECT_MAP:
		for (uint32_t i = 0; i < o->via.map.size; i++)
			if (!all_utf8(&o->via.map.ptr[i].key) || !all_utf8(&o->via.map.ptr[i].val))
				return false;
		return true;
	default:
		return true;
	}
}

/* call(), and the reply's strings must be UTF-8. */
static struct gpuq_reply *call_utf8(struct gpuq_client *c, struct mp_map *req)
{
	struct gpuq_reply *r = call(c, req, NULL, 0);
	CHECKF(all_utf8(r->root), "a reply holds a string that is not UTF-8");
	return r;
}

static void expect_free(struct gpuq_reply *r, enum gpuq_errc code, const char *contains)
{
	expect_error(r, code, contains);
	gpuq_reply_free(r);
}

TEST(replies_are_utf8_whatever_the_request_held)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	mp_map_init(&req);
	mp_put_u64(&req, "v", 1);
	mp_put_u64(&req, "id", 77);
	put_raw_str(&req, "op", "fr\xff\xfeob", 6);
	expect_free(call_utf8(c, &req), GPUQ_E_UNKNOWN_OP, "fr\\xff\\xfeob");
	gpuq_request_begin(c, &req, "alloc");
	put_raw_str(&req, "name", "\xc3\xa9t\xc3\xa9", 5); /* été */
	mp_put_u64(&req, "bytes", 16);
	expect_free(call_utf8(c, &req), GPUQ_E_BAD_REQUEST, "has '\xc3\xa9' at byte 0");
	gpuq_request_begin(c, &req, "alloc");
	put_raw_str(&req, "name", "a\xc3", 2); /* a character cut short */
	mp_put_u64(&req, "bytes", 16);
	expect_free(call_utf8(c, &req), GPUQ_E_BAD_REQUEST, "has '\\xc3' at byte 1");
	gpuq_request_begin(c, &req, "checksum");
	put_raw_str(&req, "buffer", "w\xed\xa0\x80", 4); /* a surrogate, which strict decoders refuse */
	expect_free(call_utf8(c, &req), GPUQ_E_BAD_REQUEST, "\\xed\\xa0\\x80");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(progress_and_wait_fields_are_type_checked)
{
	static const char *const ops[] = { "noop", "wait", "put", "get" };
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 16);
	static const char *const fields[] = { "'progress'", "'timeout_ms'", "'wait'" };
	for (size_t i = 0; i < sizeof ops / sizeof ops[0] * 3; i++) {
		const char *field = fields[i % 3];
		char key[16];
		snprintf(key, sizeof key, "%.*s", (int)strlen(field) - 2, field + 1);
		struct mp_map req;
		gpuq_request_begin(c, &req, ops[i / 3]);
		mp_put_str(&req, "buffer", "w");
		mp_put_u64(&req, "job", 1);
		mp_put_bool(&req, "scratch", true);
		mp_put_str(&req, key, "x");
		expect_free(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, field);
	}
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(a_job_request_without_wait_replies_the_record_at_submission)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	for (int i = 0; i < 300; i++) {
		struct mp_map req;
		gpuq_request_begin(c, &req, "noop");
		struct gpuq_reply *r = call(c, &req, NULL, 0);
		expect_ok(r, "noop");
		char state[16];
		reply_str(r, "job.state", state, sizeof state);
		CHECKF(strcmp(state, "queued") == 0, "noop %d replied %s, not queued", i, state);
		CHECK(reply_f64(r, "job.run_s") == 0);
		gpuq_reply_free(r);
	}
	gpuq_close(c);
	daemon_stop(&d);
}

static struct gpuq_reply *fill_value(struct gpuq_client *c, const char *buffer, double v)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "pattern", "value");
	mp_put_f64(&req, "value", v);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

static void alloc_typed(struct gpuq_client *c, const char *name, const char *dtype)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "count", 64);
	mp_put_str(&req, "dtype", dtype);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "alloc");
	gpuq_reply_free(r);
}

static void expect_fill(struct gpuq_client *c, const char *buffer, double v, bool ok)
{
	struct gpuq_reply *r = fill_value(c, buffer, v);
	if (ok)
		expect_ok(r, "an in-range fill value");
	else
		expect_error(r, GPUQ_E_BAD_REQUEST, "'value'");
	gpuq_reply_free(r);
}

static struct gpuq_reply *run_one(struct gpuq_client *c, const char *buffer, const char *op, double k)
{
	struct mp_map req;
	struct mp_array ops, entry;
	gpuq_request_begin(c, &req, "run");
	mp_put_str(&req, "buffer", buffer);
	mp_array_init(&ops);
	mp_array_init(&entry);
	mp_array_str(&entry, op);
	mp_array_f64(&entry, k);
	mp_array_array(&ops, &entry);
	mp_put_array(&req, "ops", &ops);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

TEST(values_beyond_the_dtype_are_refused)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	alloc_typed(c, "h", "f16");
	alloc_typed(c, "b", "bf16");
	alloc_typed(c, "f", "f32");
	alloc_typed(c, "g", "f64");
	expect_fill(c, "h", 65504, true);
	expect_fill(c, "h", 65519, true); /* rounds down to 65504 */
	expect_fill(c, "h", 65520, false);
	expect_fill(c, "h", -1e6, false);
	expect_fill(c, "b", 3.38e38, true);
	expect_fill(c, "b", 3.4e38, false);
	expect_fill(c, "f", 3.4028234e38, true);
	expect_fill(c, "f", 1e39, false);
	expect_fill(c, "f", INFINITY, false);
	expect_fill(c, "f", NAN, false);
	expect_fill(c, "g", 1e300, true);
	expect_fill(c, "g", -INFINITY, false);
	expect_free(run_one(c, "f", "mul", 1e300), GPUQ_E_BAD_REQUEST, "beyond float's range");
	expect_free(run_one(c, "h", "add", 1e39), GPUQ_E_BAD_REQUEST, "argument 1");
	struct gpuq_reply *r = run_one(c, "g", "mul", 1e300); /* f64 chains keep doubles */
	expect_ok(r, "mul 1e300 on f64");
	gpuq_reply_free(r);
	r = run_one(c, "h", "mul", 1e6); /* f16 chains compute in float: 1e6 is fine */
	expect_ok(r, "mul 1e6 on f16");
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

/* peer_access[j] of device i from `devices`. */
static bool peer_access(struct gpuq_client *c, int i, int j)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "devices");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	const msgpack_object *devs = reply_path(r, "devices");
	CHECK(devs && devs->type == MSGPACK_OBJECT_ARRAY && devs->via.array.size > (uint32_t)i);
	const msgpack_object *row = msg_map_get(&devs->via.array.ptr[i], "peer_access");
	CHECK(row && row->type == MSGPACK_OBJECT_ARRAY && row->via.array.size > (uint32_t)j);
	bool v = row->via.array.ptr[j].via.boolean;
	gpuq_reply_free(r);
	return v;
}

TEST(copy_path_peer_is_accepted_exactly_where_devices_reports_peer_access)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int n = device_count(c);
	if (n < 2)
		SKIP("needs two devices");
	for (int i = 0; i < n; i++)
		do_alloc(c, "w", i, 4096);
	for (int src = 0; src < n; src++) {
		for (int dst = 0; dst < n; dst++) {
			if (src == dst)
				continue;
			char from[16], to[16];
			snprintf(from, sizeof from, "w@%d", src);
			snprintf(to, sizeof to, "w@%d", dst);
			struct mp_map req;
			gpuq_request_begin(c, &req, "copy");
			mp_put_str(&req, "src", from);
			mp_put_str(&req, "dst", to);
			mp_put_str(&req, "path", "peer");
			mp_put_bool(&req, "wait", true);
			struct gpuq_reply *r = call(c, &req, NULL, 0);
			if (peer_access(c, dst, src))
				expect_ok(r, "copy path peer where devices reports peer access");
			else
				expect_error(r, GPUQ_E_BAD_REQUEST, "path peer");
			gpuq_reply_free(r);
		}
	}
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(a_noop_given_devices_is_a_gang_that_lists_them)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int last = device_count(c) - 1;
	struct mp_map req;
	struct mp_array devices;
	gpuq_request_begin(c, &req, "noop");
	mp_array_init(&devices);
	mp_array_u64(&devices, (uint64_t)last);
	mp_put_array(&req, "devices", &devices);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "noop devices [last]");
	const msgpack_object *list = reply_path(r, "job.devices");
	CHECKF(list && list->type == MSGPACK_OBJECT_ARRAY && list->via.array.size == 1 &&
		       list->via.array.ptr[0].via.u64 == (uint64_t)last,
	       "the record has no devices [%d]", last);
	CHECK_EQ(reply_u64(r, "job.device"), last);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(owners_beyond_a_uid_are_refused)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 64);
	const uint64_t owners[] = { (1ull << 32) + 65534, 1ull << 32, UINT32_MAX };
	for (size_t i = 0; i < sizeof owners / sizeof owners[0]; i++) {
		struct mp_map req;
		gpuq_request_begin(c, &req, "checksum");
		mp_put_str(&req, "buffer", "w@0");
		mp_put_u64(&req, "owner", owners[i]);
		mp_put_bool(&req, "wait", true);
		expect_free(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "field 'owner'");
	}
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(duplicate_keys_are_refused_and_nil_is_absent)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	alloc_typed(c, "f", "f32");
	struct mp_map req;
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", "f");
	mp_put_str(&req, "buffer", "g");
	expect_free(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "key 'buffer' twice");
	/* in a nested map too: one op given twice */
	struct mp_array ops;
	struct mp_map op;
	gpuq_request_begin(c, &req, "run");
	mp_put_str(&req, "buffer", "f");
	mp_array_init(&ops);
	mp_map_init(&op);
	mp_put_str(&op, "op", "sin");
	mp_put_str(&op, "op", "cos");
	mp_array_map(&ops, &op);
	mp_put_array(&req, "ops", &ops);
	expect_free(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "key 'op' twice");
	/* nil: as if absent (device defaults to 0) */
	gpuq_request_begin(c, &req, "noop");
	mp_put_nil(&req, "device");
	mp_put_nil(&req, "timeout_ms");
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "noop with nil fields");
	CHECK_EQ(reply_u64(r, "job.result.device"), 0);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(a_device_that_does_not_exist_is_not_found_everywhere)
{
	static const char *const ops[] = { "buffers", "stats", "noop", "alloc", "bench_copy" };
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		struct mp_map req;
		gpuq_request_begin(c, &req, ops[i]);
		mp_put_str(&req, "name", "w");
		mp_put_u64(&req, "bytes", 64);
		mp_put_u64(&req, "device", 99);
		expect_free(call(c, &req, NULL, 0), GPUQ_E_NOT_FOUND, "device 99 does not exist");
	}
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * An entry of `devices`, or the @GPU of a buffer name, beyond the daemon's
 * devices is not_found with the same words as `device` (docs/protocol.md,
 * Requests): the device does not exist, whatever the op.
 */
TEST(a_device_in_a_list_or_a_name_that_does_not_exist_is_not_found)
{
	static const char *const list_ops[] = {
		"noop", "allreduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
		"sendrecv", "all_to_all", "group", "bench_allreduce", "bench_collective",
	};
	static const char *const name_ops[] = { "free", "fill", "checksum", "run", "attach" };
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	char want[96];
	snprintf(want, sizeof want, "device 99 does not exist (devices: 0-%d)", device_count(c) - 1);
	for (size_t i = 0; i < sizeof list_ops / sizeof list_ops[0]; i++) {
		struct mp_map req;
		struct mp_array devices;
		gpuq_request_begin(c, &req, list_ops[i]);
		mp_put_str(&req, "buffer", "w");
		mp_array_init(&devices);
		if (device_count(c) > 1) /* a good entry first where a list of two fits the daemon */
			mp_array_u64(&devices, 0);
		mp_array_u64(&devices, 99);
		mp_put_array(&req, "devices", &devices);
		expect_free(call(c, &req, NULL, 0), GPUQ_E_NOT_FOUND, want);
	}
	for (size_t i = 0; i < sizeof name_ops / sizeof name_ops[0]; i++) {
		struct mp_map req;
		gpuq_request_begin(c, &req, name_ops[i]);
		mp_put_str(&req, "buffer", "w@99");
		mp_put_str(&req, "pattern", "zeros");
		expect_free(call(c, &req, NULL, 0), GPUQ_E_NOT_FOUND, want);
	}
	/* the same inside an expression, at the name's column */
	struct mp_map req;
	gpuq_request_begin(c, &req, "run");
	mp_put_str(&req, "expr", "y = w@99 + 1");
	snprintf(want, sizeof want, "expression column 5: device 99 does not exist (devices: 0-%d)",
		 device_count(c) - 1);
	expect_free(call(c, &req, NULL, 0), GPUQ_E_NOT_FOUND, want);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(more_descriptors_than_a_request_may_carry_is_bad_frame)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "w");
	mp_put_u64(&req, "fds", 5);
	expect_free(call(c, &req, NULL, 0), GPUQ_E_BAD_FRAME, "at most 4");
	gpuq_close(c);
	daemon_stop(&d);
}
