/*
 * Refused requests: each gets a precise error code and message, the
 * connection stays usable, and nothing else changes.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/integration/fixture.h"

/* Sends op with one string field and one integer field; returns the reply. */
static struct gpuq_reply *send_op(struct gpuq_client *c, const char *op, const char *skey,
				  const char *sval, const char *ukey, uint64_t uval)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	if (skey)
		mp_put_str(&req, skey, sval);
	if (ukey)
		mp_put_u64(&req, ukey, uval);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

static void expect(struct gpuq_reply *r, enum gpuq_errc code, const char *contains)
{
	expect_error(r, code, contains);
	gpuq_reply_free(r);
}

TEST(unknown_op_and_missing_fields)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	expect(send_op(c, "frobnicate", NULL, NULL, NULL, 0), GPUQ_E_UNKNOWN_OP, "frobnicate");
	expect(send_op(c, "alloc", NULL, NULL, "bytes", 10), GPUQ_E_BAD_REQUEST, "'name'");
	expect(send_op(c, "alloc", "name", "x", NULL, 0), GPUQ_E_BAD_REQUEST, "neither");
	expect(send_op(c, "checksum", NULL, NULL, NULL, 0), GPUQ_E_BAD_REQUEST, "'buffer'");
	expect(send_op(c, "status", NULL, NULL, NULL, 0), GPUQ_E_BAD_REQUEST, "'job'");
	expect(send_op(c, "status", NULL, NULL, "job", 999), GPUQ_E_NOT_FOUND, "job 999");
	expect(send_op(c, "fill", "buffer", "nothere", NULL, 0), GPUQ_E_NOT_FOUND, "nothere");
	/* the connection is still good */
	do_alloc(c, "ok", 0, 16);
	gpuq_close(c);
	daemon_stop(&d);
}

/* A checksum of buffer in owner's namespace (root may name any). */
static struct gpuq_reply *checksum_of(struct gpuq_client *c, const char *buffer, uint64_t owner)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", buffer);
	mp_put_u64(&req, "owner", owner);
	return call(c, &req, NULL, 0);
}

/* not_found lists the buffers of the namespace searched: another uid's are not "yours". */
TEST(not_found_names_whose_buffers_it_lists)
{
	if (geteuid() != 0)
		SKIP("needs root to name another uid's buffers");
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "mine", 0, 16);
	expect(checksum_of(c, "nothere", 1000), GPUQ_E_NOT_FOUND,
	       "buffer 'nothere' not found (uid 1000's buffers: none)");
	expect(checksum_of(c, "nothere@0", 1000), GPUQ_E_NOT_FOUND,
	       "buffer 'nothere' not found on device 0 (uid 1000's buffers there: none)");
	expect(checksum_of(c, "nothere", 0), GPUQ_E_NOT_FOUND,
	       "buffer 'nothere' not found (your buffers: mine@0)");
	expect(checksum_of(c, "nothere@0", 0), GPUQ_E_NOT_FOUND,
	       "buffer 'nothere' not found on device 0 (your buffers there: mine@0)");
	gpuq_close(c);
	daemon_stop(&d);
}

/* True if list ("a, b, c") holds name as one of its entries. */
static bool list_has(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; *p; ) {
		const char *end = strstr(p, ", ");
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == n && memcmp(p, name, n) == 0)
			return true;
		if (!end)
			break;
		p = end + 2;
	}
	return false;
}

/* unknown_op lists every op the daemon serves, none cut off. */
TEST(unknown_op_names_every_op)
{
	static const char *const ops[] = {
		"ping", "devices", "noop", "alloc", "free", "buffers", "put", "get", "fill",
		"checksum", "jobs", "status", "wait", "cancel", "bench_copy", "copy", "bench_d2d",
		"run", "stats", "bench_chain", "allreduce", "bench_allreduce", "reduce_scatter",
		"all_gather", "broadcast", "reduce", "sendrecv", "all_to_all", "group",
		"bench_collective", "reduce_expr", "metrics", "shutdown", "bench_sched",
		"reset_device", "region_create", "region_free", "regions", "region_open", "attach",
		"release", "leases", "lease_break", "bench_alloc", "drop_absent",
	};
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct gpuq_reply *r = send_op(c, "frobnicate", NULL, NULL, NULL, 0);
	struct gpuq_error err;
	expect_error(r, GPUQ_E_UNKNOWN_OP, "unknown op 'frobnicate' (ops: ");
	/* The reply's own words, which may outgrow a struct gpuq_error. */
	char message[2048], list[2048];
	const msgpack_object *e = msg_map_get(r->root, "error");
	CHECK(e && msg_get_str(e, "message", message, sizeof message, &err) == 1);
	const char *start = strstr(message, "(ops: ");
	snprintf(list, sizeof list, "%s", start ? start + 6 : "");
	size_t len = strlen(list);
	CHECKF(len > 0 && list[len - 1] == ')', "the list of ops is cut off: %s", message);
	if (len > 0)
		list[len - 1] = '\0';
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
		CHECKF(list_has(list, ops[i]), "unknown_op's list lacks %s: %s", ops[i], message);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(wrong_types_name_the_field)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "w");
	mp_put_str(&req, "bytes", "lots");
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "'bytes'");
	gpuq_request_begin(c, &req, "alloc");
	mp_put_u64(&req, "name", 7);
	mp_put_u64(&req, "bytes", 16);
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "'name'");
	gpuq_request_begin(c, &req, "noop");
	mp_put_str(&req, "wait", "yes");
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "'wait'");
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "w");
	mp_put_u64(&req, "count", 4);
	mp_put_str(&req, "dtype", "f128");
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "f128");
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "bad/name");
	mp_put_u64(&req, "bytes", 4);
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "bad/name");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(version_and_unknown_keys)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	mp_map_init(&req);
	mp_put_u64(&req, "v", 2);
	mp_put_u64(&req, "id", 41);
	mp_put_str(&req, "op", "ping");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	CHECK_EQ(r->id, 41);
	expect(r, GPUQ_E_UNSUPPORTED_VERSION, "version 2");
	gpuq_request_begin(c, &req, "ping");
	mp_put_str(&req, "some_future_key", "ignored");
	r = call(c, &req, NULL, 0);
	expect_ok(r, "ping with an unknown key");
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(alloc_refusals)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 64);
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "w");
	mp_put_u64(&req, "bytes", 64);
	expect(call(c, &req, NULL, 0), GPUQ_E_EXISTS, "already exists on device 0 (64 bytes); free");
	/* A name whose free is queued (behind a stalled put): wait for that free, not "free it". */
	int p[2];
	start_stalled_put(c, "w", p);
	gpuq_request_begin(c, &req, "free");
	mp_put_str(&req, "buffer", "w");
	struct gpuq_reply *freed = call(c, &req, NULL, 0);
	expect_ok(freed, "free queued behind the put");
	char words[128];
	snprintf(words, sizeof words, "buffer 'w' on device 0 is being freed (job %llu); wait for that job",
		 (unsigned long long)reply_u64(freed, "job.job"));
	gpuq_reply_free(freed);
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "w");
	mp_put_u64(&req, "bytes", 64);
	expect(call(c, &req, NULL, 0), GPUQ_E_EXISTS, words);
	close(p[1]);
	/* Sizes of dtype bytes in plain words: "0 bytes is not a positive size". */
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "z");
	mp_put_u64(&req, "bytes", 0);
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "field 'bytes': 0 bytes is not a positive size");
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "z");
	mp_put_u64(&req, "count", 0);
	mp_put_str(&req, "dtype", "bytes");
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "field 'count': 0 bytes is not a positive size");
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "z");
	mp_put_u64(&req, "bytes", 64);
	mp_put_u64(&req, "device", 99);
	expect(call(c, &req, NULL, 0), GPUQ_E_NOT_FOUND, "device 99");
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "z");
	mp_put_u64(&req, "bytes", 6);
	mp_put_str(&req, "dtype", "f32");
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "multiple");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(out_of_memory_is_reported_and_survived)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "64M", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "keep", 0, 1 << 20);
	do_fill_random(c, "keep", 11);
	uint64_t before = do_checksum(c, "keep");
	/* On the GPU: allocate 16 GiB at a time until the device says no. */
	uint64_t chunk = test_backend_is_cuda() ? (16ull << 30) : (48ull << 20);
	int n = 0;
	for (;; n++) {
		char name[32];
		snprintf(name, sizeof name, "big%d", n);
		struct mp_map req;
		gpuq_request_begin(c, &req, "alloc");
		mp_put_str(&req, "name", name);
		mp_put_u64(&req, "bytes", chunk);
		mp_put_bool(&req, "wait", true);
		struct gpuq_reply *r = call(c, &req, NULL, 0);
		bool ok = gpuq_reply_ok(r);
		if (!ok)
			expect_error(r, GPUQ_E_OUT_OF_MEMORY, "cannot");
		gpuq_reply_free(r);
		if (!ok)
			break;
		CHECKF(n < 64, "64 allocations of %llu bytes and no out_of_memory",
		       (unsigned long long)chunk);
	}
	for (int i = 0; i < n; i++) {
		char name[32];
		snprintf(name, sizeof name, "big%d", i);
		do_free(c, name);
	}
	CHECK_EQ(do_checksum(c, "keep"), before);
	do_alloc(c, "after", 0, chunk); /* the memory really came back */
	gpuq_close(c);
	daemon_stop(&d);
}

static struct gpuq_reply *transfer(struct gpuq_client *c, const char *op, const char *buffer,
				   int fd, int64_t length)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, "buffer", buffer);
	if (length >= 0)
		mp_put_u64(&req, "length", (uint64_t)length);
	mp_put_bool(&req, "wait", true);
	if (fd < 0)
		return call(c, &req, NULL, 0);
	mp_put_u64(&req, "fds", 1);
	return call(c, &req, &fd, 1);
}

TEST(transfer_refusals)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 1000);
	do_fill_random(c, "w", 1);
	uint64_t before = do_checksum(c, "w");
	expect(transfer(c, "put", "w", -1, -1), GPUQ_E_BAD_REQUEST, "descriptor");
	int big = memfd_random(2000, 2);
	expect(transfer(c, "put", "w", big, -1), GPUQ_E_BAD_REQUEST, "room for 1000");
	expect(transfer(c, "put", "w", big, 1001), GPUQ_E_BAD_REQUEST, "outside buffer");
	int ro = open("/dev/null", O_RDONLY | O_CLOEXEC);
	expect(transfer(c, "get", "w", ro, -1), GPUQ_E_BAD_REQUEST, "reading only");
	int wo = open("/dev/null", O_WRONLY | O_CLOEXEC);
	expect(transfer(c, "put", "w", wo, -1), GPUQ_E_BAD_REQUEST, "writing only");
	CHECK_EQ(do_checksum(c, "w"), before); /* nothing moved */
	int small = memfd_random(10, 3);
	expect(transfer(c, "put", "w", small, 20), GPUQ_E_IO, "ended after 10");
	close(big);
	close(small);
	close(ro);
	close(wo);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(free_waits_for_the_jobs_on_its_buffer)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 4096);
	int p[2];
	CHECK(pipe(p) == 0);
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "w");
	mp_put_u64(&req, "fds", 1);
	struct gpuq_reply *r = call(c, &req, &p[0], 1); /* runs until the pipe closes */
	expect_ok(r, "put");
	uint64_t job = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	gpuq_request_begin(c, &req, "free");
	mp_put_str(&req, "buffer", "w");
	r = call(c, &req, NULL, 0);
	expect_ok(r, "free, queued behind the put");
	uint64_t freeing = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	char want[64], state[16], waiting[160];
	snprintf(want, sizeof want, "behind job %llu", (unsigned long long)job);
	for (int i = 0; i < 200; i++) { /* until its worker has looked at it */
		gpuq_request_begin(c, &req, "status");
		mp_put_u64(&req, "job", freeing);
		r = call(c, &req, NULL, 0);
		reply_str(r, "job.state", state, sizeof state);
		reply_str(r, "job.waiting", waiting, sizeof waiting);
		gpuq_reply_free(r);
		if (strstr(waiting, want))
			break;
		usleep(10000);
	}
	CHECK_STR(state, "queued");
	CHECKF(strstr(waiting, want), "waiting: '%s', not '%s'", waiting, want);
	gpuq_request_begin(c, &req, "checksum"); /* nothing new may start on a buffer being freed */
	mp_put_str(&req, "buffer", "w");
	expect(call(c, &req, NULL, 0), GPUQ_E_BUSY, "being freed");
	close(p[1]);
	uint64_t jobs[2] = { job, freeing };
	for (int i = 0; i < 2; i++) { /* the put ends first, then the free */
		gpuq_request_begin(c, &req, "wait");
		mp_put_u64(&req, "job", jobs[i]);
		mp_put_u64(&req, "timeout_ms", 10000);
		r = call(c, &req, NULL, 0);
		expect_ok(r, i ? "the free" : "the put");
		gpuq_reply_free(r);
	}
	close(p[0]);
	gpuq_request_begin(c, &req, "buffers");
	r = call(c, &req, NULL, 0);
	CHECK_EQ(reply_path(r, "buffers")->via.array.size, 0);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

static struct gpuq_reply *fill_value_u64(struct gpuq_client *c, const char *buffer, uint64_t v)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "pattern", "value");
	mp_put_u64(&req, "value", v);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

TEST(fill_values_out_of_range)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	const char *types[] = { "i64", "u8", "i32" };
	for (int i = 0; i < 3; i++) {
		gpuq_request_begin(c, &req, "alloc");
		mp_put_str(&req, "name", types[i]);
		mp_put_u64(&req, "count", 16);
		mp_put_str(&req, "dtype", types[i]);
		mp_put_bool(&req, "wait", true);
		gpuq_reply_free(call(c, &req, NULL, 0));
	}
	expect(fill_value_u64(c, "i64", UINT64_MAX), GPUQ_E_BAD_REQUEST, "does not fit in i64");
	expect(fill_value_u64(c, "u8", 300), GPUQ_E_BAD_REQUEST, "does not fit in u8");
	expect(fill_value_u64(c, "i32", 1ull << 31), GPUQ_E_BAD_REQUEST, "does not fit in i32");
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", "i32");
	mp_put_str(&req, "pattern", "value");
	mp_put_f64(&req, "value", 1.5);
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "does not fit");
	struct gpuq_reply *r = fill_value_u64(c, "i64", INT64_MAX);
	expect_ok(r, "fill i64 with INT64_MAX");
	gpuq_reply_free(r);
	int fd = memfd_create("out", MFD_CLOEXEC);
	CHECK_EQ(do_get(c, "i64", fd), 128);
	int64_t got[16];
	CHECK_EQ(pread(fd, got, sizeof got, 0), sizeof got);
	for (int i = 0; i < 16; i++)
		CHECK(got[i] == INT64_MAX);
	close(fd);
	gpuq_close(c);
	daemon_stop(&d);
}

static struct gpuq_reply *fill_value_f64(struct gpuq_client *c, const char *buffer, double v)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "pattern", "value");
	mp_put_f64(&req, "value", v);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

/*
 * A fill value out of range is printed as given, and a dtype's limit as
 * it is: with %g's six digits, 3.4028236e38 and f32's 3.4028235e38 read
 * the same, and 2^63 as 9.22337e+18.
 */
TEST(fill_range_errors_print_numbers_whole)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const char *types[] = { "i64", "i32", "f16", "bf16", "f32" };
	for (int i = 0; i < 5; i++)
		do_alloc_typed(c, types[i], 0, types[i], 16);
	expect(fill_value_u64(c, "i64", 1ull << 63), GPUQ_E_BAD_REQUEST,
	       "field 'value': 9223372036854775808 does not fit in i64");
	expect(fill_value_u64(c, "i64", UINT64_MAX), GPUQ_E_BAD_REQUEST,
	       "field 'value': 18446744073709551615 does not fit in i64");
	expect(fill_value_f64(c, "i64", 0x1p63), GPUQ_E_BAD_REQUEST,
	       "field 'value': 9.223372036854776e+18 does not fit in i64");
	expect(fill_value_f64(c, "i32", 0.1), GPUQ_E_BAD_REQUEST,
	       "field 'value': 0.1 does not fit in i32");
	expect(fill_value_f64(c, "i32", 2147483648.5), GPUQ_E_BAD_REQUEST,
	       "field 'value': 2147483648.5 does not fit in i32");
	expect(fill_value_f64(c, "f32", 3.4028236e38), GPUQ_E_BAD_REQUEST,
	       "field 'value': 3.4028236e+38 is out of f32's range (its largest finite value is "
	       "3.4028235e+38)");
	expect(fill_value_f64(c, "bf16", 3.3961776e38), GPUQ_E_BAD_REQUEST,
	       "field 'value': 3.3961776e+38 is out of bf16's range (its largest finite value is "
	       "3.3895314e+38)");
	expect(fill_value_f64(c, "f16", 65520.25), GPUQ_E_BAD_REQUEST,
	       "field 'value': 65520.25 is out of f16's range (its largest finite value is 65504)");
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * libgpuq checks a request's descriptors before it sends: a closed one
 * made sendmsg fail once the frame was on its way, and the connection was
 * broken for good (every later call failed the same way) though nothing
 * had reached gpuqd; a NULL array with a count crashed the caller.
 */
TEST(a_descriptor_that_cannot_be_sent_is_refused_and_the_client_goes_on)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 4096);
	int closed = open("/dev/null", O_RDONLY | O_CLOEXEC);
	CHECK(closed >= 0);
	close(closed);
	struct gpuq_reply *r;
	struct gpuq_error err;
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "w");
	mp_put_u64(&req, "fds", 1);
	CHECK(gpuq_call(c, &req, &closed, 1, &r, &err) < 0);
	CHECKF(err.code == GPUQ_E_BAD_REQUEST && strstr(err.message, "cannot be sent"), "%s: %s",
	       gpuq_errc_name(err.code), err.message);
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "w");
	mp_put_u64(&req, "fds", 2);
	CHECK(gpuq_call(c, &req, NULL, 2, &r, &err) < 0);
	CHECKF(err.code == GPUQ_E_BAD_REQUEST && strstr(err.message, "fds is NULL"), "%s",
	       err.message);
	CHECK_EQ(do_checksum(c, "w"), do_checksum(c, "w")); /* the same connection serves on */
	gpuq_close(c);
	daemon_stop(&d);
}

/* A job that is not there: on a fresh gpuqd the message said "ids so far: 1-0". */
TEST(a_missing_job_is_worded_for_a_fresh_daemon_and_a_busy_one)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct gpuq_reply *r = job_request(c, "status", 5, 0);
	expect_error(r, GPUQ_E_NOT_FOUND, "job 5 not found (no job was submitted yet)");
	gpuq_reply_free(r);
	do_alloc(c, "w", 0, 64);
	r = job_request(c, "status", 5, 0);
	expect_error(r, GPUQ_E_NOT_FOUND, "job 5 not found (the newest job is 1;");
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}
