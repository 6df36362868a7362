/*
 * Device-to-device copies (the copy op) and their benchmark (bench_d2d):
 * within one device by both engines, between devices by the peer path and
 * host-staged, ranges and odd sizes bit-exact, verify, cancellation, every
 * refusal, and the paths that `devices` reports. They run on both tiers:
 * the host backend has two devices, so every peer code path runs in CI;
 * on a one-GPU machine the tests that need two devices say so and skip.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "workers/backend/host_patterns.h"

/* ---- helpers ---- */

struct copy_opts {
	const char *engine; /* NULL: not sent */
	const char *path;
	uint64_t chunk;     /* 0: not sent */
	bool verify;
	bool detach;        /* no wait: the reply is the queued record */
};

static struct gpuq_reply *copy_call(struct gpuq_client *c, const char *src, const char *dst,
				    const struct copy_opts *o)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "copy");
	mp_put_str(&req, "src", src);
	mp_put_str(&req, "dst", dst);
	if (o && o->engine)
		mp_put_str(&req, "engine", o->engine);
	if (o && o->path)
		mp_put_str(&req, "path", o->path);
	if (o && o->chunk)
		mp_put_u64(&req, "chunk_bytes", o->chunk);
	if (o && o->verify)
		mp_put_bool(&req, "verify", true);
	mp_put_bool(&req, "wait", !(o && o->detach));
	return call(c, &req, NULL, 0);
}

/* A copy that must succeed; returns its result's path in path (if given). */
static uint64_t do_copy(struct gpuq_client *c, const char *src, const char *dst,
			const struct copy_opts *o, char *path, size_t size)
{
	struct gpuq_reply *r = copy_call(c, src, dst, o);
	char what[160];
	snprintf(what, sizeof what, "copy %s -> %s", src, dst);
	expect_ok(r, what);
	uint64_t bytes = reply_u64(r, "job.result.bytes");
	if (path)
		reply_str(r, "job.result.path", path, size);
	if (o && o->verify) {
		const msgpack_object *v = reply_path(r, "job.result.verified");
		CHECK(v && v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean);
	}
	gpuq_reply_free(r);
	return bytes;
}

static void expect_copy_refused(struct gpuq_client *c, const char *src, const char *dst,
				const struct copy_opts *o, enum gpuq_errc code, const char *contains)
{
	struct gpuq_reply *r = copy_call(c, src, dst, o);
	expect_error(r, code, contains);
	gpuq_reply_free(r);
}

/* n random bytes from seed, put into buffer; returns them (malloc'd). */
static unsigned char *put_random(struct gpuq_client *c, const char *buffer, size_t n,
				 uint64_t seed)
{
	int fd = memfd_random(n, seed);
	CHECK_EQ(do_put(c, buffer, fd), n);
	size_t got;
	unsigned char *data = fd_slurp(fd, &got);
	CHECK_EQ(got, n);
	close(fd);
	return data;
}

/* The whole of buffer (n bytes), read back. */
static unsigned char *get_all(struct gpuq_client *c, const char *buffer, size_t n)
{
	int fd = memfd_create("get", MFD_CLOEXEC);
	CHECK_EQ(do_get(c, buffer, fd), n);
	size_t got;
	unsigned char *data = fd_slurp(fd, &got);
	CHECK_EQ(got, n);
	close(fd);
	return data;
}

/* Fills buffer with the byte 0xAB: what a copy must not touch keeps it. */
static void poison(struct gpuq_client *c, const char *buffer)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "pattern", "value");
	mp_put_u64(&req, "value", 0xAB);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "poison");
	gpuq_reply_free(r);
}

static void check_poisoned(const unsigned char *p, size_t from, size_t to, const char *what)
{
	for (size_t i = from; i < to; i++)
		CHECKF(p[i] == 0xAB, "%s: byte %zu outside the copy changed to %02x", what, i, p[i]);
}

static void require_two_devices(struct gpuq_client *c)
{
	if (device_count(c) < 2)
		SKIP("needs two devices (the host backend has two; this machine has one GPU, so "
		     "peer copies run on GPUs only on a multi-GPU machine)");
}

/* The path a same-device copy by engine reports on this tier. */
static const char *same_path(const char *engine)
{
	return test_backend_is_cuda() ? engine : "host-memcpy";
}

static void job_state(struct gpuq_client *c, uint64_t job, char *state, size_t size)
{
	struct gpuq_reply *r = job_request(c, "status", job, 0);
	reply_str(r, "job.state", state, size);
	gpuq_reply_free(r);
}

/* ---- within one device ---- */

static void same_device_round(struct gpuq_client *c, size_t n, uint64_t seed,
			      const char *engine, uint64_t chunk)
{
	do_alloc(c, "a", 0, n);
	do_alloc(c, "b", 0, n);
	unsigned char *want = put_random(c, "a", n, seed);
	poison(c, "b");
	struct copy_opts o = { .engine = engine, .chunk = chunk };
	char path[32];
	CHECK_EQ(do_copy(c, "a", "b", &o, path, sizeof path), n);
	CHECK_STR(path, same_path(engine));
	unsigned char *got = get_all(c, "b", n);
	CHECKF(memcmp(want, got, n) == 0, "%s copy of %zu bytes (chunk %llu) differs", engine, n,
	       (unsigned long long)chunk);
	free(want);
	free(got);
	do_free(c, "a");
	do_free(c, "b");
}

TEST(d2d_copy_within_a_device_by_both_engines_is_bit_exact)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t sizes[] = { 1, 15, 16, 17, 4096 + 1, 1000003 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		same_device_round(c, sizes[i], 10 + i, "ce", 0);
		same_device_round(c, sizes[i], 20 + i, "sm", 0);
	}
	/* Small chunks: many of them, the last one short, two in flight at a time. */
	same_device_round(c, 1000003, 31, "ce", 4096 + 7);
	same_device_round(c, 1000003, 32, "sm", 65536);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_copy_result_says_engine_path_and_verified_checksum)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 123457;
	do_alloc(c, "a", 0, n);
	do_alloc(c, "b", 0, n);
	unsigned char *want = put_random(c, "a", n, 5);
	struct copy_opts o = { .engine = "sm", .verify = true };
	struct gpuq_reply *r = copy_call(c, "a", "b", &o);
	expect_ok(r, "copy --verify");
	char s[64];
	reply_str(r, "job.op", s, sizeof s);
	CHECK_STR(s, "copy");
	reply_str(r, "job.result.engine", s, sizeof s);
	CHECK_STR(s, "sm");
	reply_str(r, "job.result.path", s, sizeof s);
	CHECK_STR(s, same_path("sm"));
	reply_str(r, "job.result.src", s, sizeof s);
	CHECK_STR(s, "a@0[0:123457]");
	reply_str(r, "job.result.dst", s, sizeof s);
	CHECK_STR(s, "b@0[0:123457]");
	CHECK_EQ(reply_u64(r, "job.result.checksum"), host_checksum(want, n));
	CHECK(reply_f64(r, "job.result.seconds") >= 0);
	gpuq_reply_free(r);
	CHECK_EQ(do_checksum(c, "b"), host_checksum(want, n));
	free(want);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_copy_ranges_touch_only_their_bytes)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 10000;
	do_alloc(c, "a", 0, n);
	do_alloc(c, "b", 0, n);
	unsigned char *a = put_random(c, "a", n, 77);
	const char *engines[] = { "ce", "sm" };
	for (int e = 0; e < 2; e++) {
		poison(c, "b");
		struct copy_opts o = { .engine = engines[e] };
		/* odd offsets on both sides, a longer destination range: 1000 bytes move */
		CHECK_EQ(do_copy(c, "a[3:1003]", "b@0[17:]", &o, NULL, 0), 1000);
		unsigned char *b = get_all(c, "b", n);
		CHECKF(memcmp(b + 17, a + 3, 1000) == 0, "%s: range copy differs", engines[e]);
		check_poisoned(b, 0, 17, engines[e]);
		check_poisoned(b, 1017, n, engines[e]);
		free(b);
		/* an empty range copies nothing, successfully */
		CHECK_EQ(do_copy(c, "a[5:5]", "b", &o, NULL, 0), 0);
		/* [START:] and [:STOP] forms */
		poison(c, "b");
		CHECK_EQ(do_copy(c, "a[9990:]", "b[:10]", &o, NULL, 0), 10);
		b = get_all(c, "b", n);
		CHECK(memcmp(b, a + 9990, 10) == 0);
		check_poisoned(b, 10, n, engines[e]);
		free(b);
	}
	free(a);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_copy_within_one_buffer_needs_disjoint_ranges)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 4096;
	do_alloc(c, "w", 0, n);
	unsigned char *w = put_random(c, "w", n, 3);
	CHECK_EQ(do_copy(c, "w[0:100]", "w[100:200]", NULL, NULL, 0), 100);
	CHECK_EQ(do_copy(c, "w[1001:1008]", "w[2000:]", &(struct copy_opts){ .engine = "sm" }, NULL,
			 0),
		 7);
	unsigned char *got = get_all(c, "w", n);
	CHECK(memcmp(got + 100, w, 100) == 0);
	CHECK(memcmp(got + 2000, w + 1001, 7) == 0);
	CHECK(memcmp(got, w, 100) == 0);
	expect_copy_refused(c, "w[0:100]", "w[50:150]", NULL, GPUQ_E_BAD_REQUEST, "overlap");
	expect_copy_refused(c, "w[50:150]", "w[0:100]", NULL, GPUQ_E_BAD_REQUEST, "overlap");
	expect_copy_refused(c, "w", "w", NULL, GPUQ_E_BAD_REQUEST, "overlap");
	free(w);
	free(got);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_copy_refusals_are_precise_and_move_nothing)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "big", 0, 1000);
	do_alloc(c, "small", 0, 100);
	poison(c, "small");
	expect_copy_refused(c, "big", "small", NULL, GPUQ_E_BAD_REQUEST, "holds 100 bytes");
	expect_copy_refused(c, "big[0:200]", "small[50:]", NULL, GPUQ_E_BAD_REQUEST,
			    "holds 50 bytes");
	expect_copy_refused(c, "big[900:1100]", "small", NULL, GPUQ_E_BAD_REQUEST, "outside");
	expect_copy_refused(c, "big[2000:]", "small", NULL, GPUQ_E_BAD_REQUEST, "past the end");
	expect_copy_refused(c, "nothere", "small", NULL, GPUQ_E_NOT_FOUND, "field 'src'");
	expect_copy_refused(c, "big", "nothere", NULL, GPUQ_E_NOT_FOUND, "field 'dst'");
	expect_copy_refused(c, "big@9", "small", NULL, GPUQ_E_NOT_FOUND, "device 9 does not exist");
	expect_copy_refused(c, "big[1:2", "small", NULL, GPUQ_E_BAD_REQUEST, "malformed range");
	expect_copy_refused(c, "big[:50]", "small", &(struct copy_opts){ .engine = "dma" },
			    GPUQ_E_BAD_REQUEST, "'engine'");
	expect_copy_refused(c, "big[:50]", "small", &(struct copy_opts){ .path = "host-staged" },
			    GPUQ_E_BAD_REQUEST, "between devices");
	expect_copy_refused(c, "big[:50]", "small", &(struct copy_opts){ .path = "teleport" },
			    GPUQ_E_BAD_REQUEST, "'path'");
	struct mp_map req;
	gpuq_request_begin(c, &req, "copy");
	mp_put_str(&req, "src", "big");
	expect_error(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "'dst'");
	gpuq_request_begin(c, &req, "copy");
	mp_put_str(&req, "src", "big[:10]");
	mp_put_str(&req, "dst", "small");
	mp_put_u64(&req, "chunk_bytes", 0);
	expect_error(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "'chunk_bytes'");
	/* nothing moved: small is still poisoned */
	unsigned char *s = get_all(c, "small", 100);
	check_poisoned(s, 0, 100, "refused copies");
	free(s);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_a_running_copy_holds_both_buffers)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "1G", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = test_backend_is_cuda() ? (1ull << 30) : (256ull << 20);
	do_alloc(c, "a", 0, n);
	do_alloc(c, "b", 0, n);
	/* a slow copy (small chunks) holds both buffers while it runs */
	struct copy_opts o = { .chunk = test_backend_is_cuda() ? (1u << 20) : 4096, .detach = true };
	struct gpuq_reply *r = copy_call(c, "a", "b", &o);
	expect_ok(r, "detached copy");
	uint64_t job = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	struct mp_map req;
	gpuq_request_begin(c, &req, "free");
	mp_put_str(&req, "buffer", "b");
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, NULL, 0);
	char state[16];
	job_state(c, job, state, sizeof state);
	if (strcmp(state, "done") != 0) /* still running: the destination is held */
		expect_error(r, GPUQ_E_BUSY, "in use");
	gpuq_reply_free(r);
	r = job_request(c, "wait", job, 60000);
	expect_ok(r, "the copy");
	gpuq_reply_free(r);
	do_free(c, "a"); /* released by the finished job */
	gpuq_close(c);
	daemon_stop(&d);
}

/* ---- between devices ---- */

static void peer_round(struct gpuq_client *c, const char *path_opt, uint64_t chunk, size_t n,
		       uint64_t seed)
{
	do_alloc(c, "p0", 0, n);
	do_alloc(c, "p1", 1, n);
	unsigned char *want = put_random(c, "p0", n, seed);
	poison(c, "p1");
	struct copy_opts o = { .path = path_opt, .chunk = chunk, .verify = true };
	char path[32];
	CHECK_EQ(do_copy(c, "p0@0", "p1@1", &o, path, sizeof path), n);
	if (path_opt && strcmp(path_opt, "host-staged") == 0)
		CHECK_STR(path, "host-staged");
	else if (!test_backend_is_cuda())
		CHECK_STR(path, "host-memcpy");
	else
		CHECKF(strcmp(path, "nvlink") == 0 || strcmp(path, "pcie-p2p") == 0 ||
			       strcmp(path, "p2p") == 0 || strcmp(path, "host-staged") == 0,
		       "peer copy path '%s'", path);
	unsigned char *got = get_all(c, "p1@1", n);
	CHECKF(memcmp(want, got, n) == 0, "peer copy (%s, chunk %llu) of %zu bytes differs",
	       path_opt ? path_opt : "auto", (unsigned long long)chunk, n);
	/* and back, by ranges, into the poisoned middle of the source's device */
	if (n > 1011) {
		poison(c, "p0@0");
		CHECK_EQ(do_copy(c, "p1@1[5:1005]", "p0@0[11:]", &o, NULL, 0), 1000);
		free(got);
		got = get_all(c, "p0@0", n);
		CHECK(memcmp(got + 11, want + 5, 1000) == 0);
		check_poisoned(got, 0, 11, "peer range");
		check_poisoned(got, 1011, n, "peer range");
	}
	free(want);
	free(got);
	do_free(c, "p0@0");
	do_free(c, "p1@1");
}

TEST(d2d_copy_between_devices_by_the_peer_path_is_bit_exact)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_two_devices(c);
	peer_round(c, NULL, 0, 1, 1);
	peer_round(c, NULL, 0, 4096 + 1, 2);
	peer_round(c, NULL, 4096, 1000003, 3); /* many chunks, two in flight */
	do_alloc(c, "e0", 0, 16);
	do_alloc(c, "e1", 1, 16);
	CHECK_EQ(do_copy(c, "e0@0[3:3]", "e1@1", NULL, NULL, 0), 0);
	CHECK_EQ(do_copy(c, "e0@0[3:3]", "e1@1", &(struct copy_opts){ .path = "host-staged" },
			 NULL, 0),
		 0);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_copy_between_devices_host_staged_goes_through_the_ring)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_two_devices(c);
	peer_round(c, "host-staged", 0, 1, 4);
	peer_round(c, "host-staged", 0, 4096 + 1, 5);
	/* 1000-byte slots: the 4-slot ring wraps hundreds of times, the last chunk short */
	peer_round(c, "host-staged", 1000, 1000003, 6);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_devices_report_the_path_of_every_pair)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	gpuq_request_begin(c, &req, "devices");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "devices");
	const msgpack_object *list = reply_path(r, "devices");
	uint32_t n = list->via.array.size;
	for (uint32_t i = 0; i < n; i++) {
		const msgpack_object *paths = msg_map_get(&list->via.array.ptr[i], "peer_path");
		CHECKF(paths && paths->type == MSGPACK_OBJECT_ARRAY && paths->via.array.size == n,
		       "device %u: peer_path is not an array of %u", i, n);
		for (uint32_t j = 0; j < n; j++) {
			const msgpack_object *p = &paths->via.array.ptr[j];
			char s[32];
			CHECK(p->type == MSGPACK_OBJECT_STR && p->via.str.size < sizeof s);
			snprintf(s, sizeof s, "%.*s", (int)p->via.str.size, p->via.str.ptr);
			if (i == j)
				CHECK_STR(s, "self");
			else if (!test_backend_is_cuda())
				CHECK_STR(s, "host-memcpy");
			else
				CHECKF(strcmp(s, "nvlink") == 0 || strcmp(s, "pcie-p2p") == 0 ||
					       strcmp(s, "p2p") == 0 || strcmp(s, "same-gpu") == 0 ||
					       strcmp(s, "host-staged") == 0,
				       "device %u -> %u: peer path '%s'", i, j, s);
		}
	}
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_copy_refuses_sm_between_devices_and_unknown_paths)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_two_devices(c);
	do_alloc(c, "x", 0, 64);
	do_alloc(c, "y", 1, 64);
	expect_copy_refused(c, "x@0", "y@1", &(struct copy_opts){ .engine = "sm" },
			    GPUQ_E_BAD_REQUEST, "within one GPU");
	expect_copy_refused(c, "x@0", "y@1", &(struct copy_opts){ .path = "warp" },
			    GPUQ_E_BAD_REQUEST, "'path'");
	gpuq_close(c);
	daemon_stop(&d);
}

/* ---- cancellation and failures ---- */

/* Starts a copy that runs for a while and cancels it as soon as it runs; true if it stopped. */
static bool cancel_while_running(struct gpuq_client *c, const char *src, const char *dst,
				 const struct copy_opts *o)
{
	struct gpuq_reply *r = copy_call(c, src, dst, o);
	expect_ok(r, "copy to cancel");
	uint64_t job = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	char state[16] = "queued";
	for (int i = 0; i < 5000 && strcmp(state, "queued") == 0; i++) {
		job_state(c, job, state, sizeof state);
		if (strcmp(state, "queued") == 0)
			usleep(200);
	}
	r = job_request(c, "cancel", job, 0);
	expect_ok(r, "cancel");
	gpuq_reply_free(r);
	r = job_request(c, "wait", job, 60000);
	bool stopped = !gpuq_reply_ok(r);
	if (stopped)
		expect_error(r, GPUQ_E_CANCELLED, "cancelled");
	gpuq_reply_free(r);
	return stopped;
}

TEST(d2d_cancel_stops_a_running_copy_at_its_next_chunk)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "1G", NULL);
	struct gpuq_client *c = client_open(&d);
	/* Long enough (thousands of small chunks) that the cancel lands mid-copy. */
	const size_t n = test_backend_is_cuda() ? (8ull << 30) : (384ull << 20);
	do_alloc(c, "a", 0, n);
	do_alloc(c, "b", 0, n);
	struct copy_opts o = { .chunk = test_backend_is_cuda() ? (1u << 20) : 65536,
			       .detach = true };
	bool stopped = false;
	for (int attempt = 0; attempt < 5 && !stopped; attempt++)
		stopped = cancel_while_running(c, "a", "b", &o);
	CHECKF(stopped, "five copies of %zu bytes all finished before their cancel", n);
	do_free(c, "a"); /* the cancelled copies released their buffers */
	do_free(c, "b");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_cancel_stops_a_peer_copy_in_both_parts)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "1G", NULL);
	struct gpuq_client *c = client_open(&d);
	require_two_devices(c);
	const size_t n = test_backend_is_cuda() ? (4ull << 30) : (256ull << 20);
	do_alloc(c, "a", 0, n);
	do_alloc(c, "b", 1, n);
	const char *paths[] = { NULL, "host-staged" };
	for (int i = 0; i < 2; i++) {
		struct copy_opts o = { .path = paths[i], .chunk = 65536, .detach = true };
		bool stopped = false;
		for (int attempt = 0; attempt < 5 && !stopped; attempt++)
			stopped = cancel_while_running(c, "a@0", "b@1", &o);
		CHECKF(stopped, "peer copies (%s) all finished before their cancel",
		       paths[i] ? paths[i] : "auto");
	}
	/* both workers are free again */
	do_free(c, "a@0");
	do_free(c, "b@1");
	gpuq_close(c);
	daemon_stop(&d);
}

/* A put on device 1 that waits on a pipe until the test writes p[1]; returns its job. */
static uint64_t stall_device_1(struct gpuq_client *c, int p[2], uint64_t bytes)
{
	do_alloc(c, "stall", 1, bytes);
	return start_stalled_put(c, "stall@1", p);
}

TEST(d2d_a_peer_copy_waiting_for_a_busy_device_is_cancelled_cleanly)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL); /* device 1 is busy: one job in flight */
	struct gpuq_client *c = client_open(&d);
	require_two_devices(c);
	do_alloc(c, "a", 0, 4096);
	do_alloc(c, "b", 1, 4096);
	int p[2];
	uint64_t put = stall_device_1(c, p, 16), jobs[2];
	for (int k = 0; k < 2; k++) {
		/* the source part starts on device 0 and waits for its partner, queued on 1 */
		struct copy_opts o = { .path = k ? "host-staged" : NULL, .detach = true };
		struct gpuq_reply *r = copy_call(c, "a@0", "b@1", &o);
		expect_ok(r, "queued copy");
		jobs[k] = reply_u64(r, "job.job");
		gpuq_reply_free(r);
		char state[16] = "queued";
		for (int i = 0; i < 2000 && strcmp(state, "running") != 0; i++) {
			usleep(1000);
			job_state(c, jobs[k], state, sizeof state);
		}
		CHECK_STR(state, "running");
		r = job_request(c, "cancel", jobs[k], 0);
		expect_ok(r, "cancel");
		gpuq_reply_free(r);
		/* the source part has let device 0 go: a job there runs at once */
		struct mp_map req;
		gpuq_request_begin(c, &req, "noop");
		mp_put_u64(&req, "device", 0);
		mp_put_bool(&req, "wait", true);
		mp_put_u64(&req, "timeout_ms", 5000);
		r = call(c, &req, NULL, 0);
		expect_ok(r, "noop on device 0 after the cancel");
		gpuq_reply_free(r);
	}
	CHECK_EQ(write(p[1], "0123456789abcdef", 16), 16);
	close(p[1]);
	struct gpuq_reply *r = job_request(c, "wait", put, 10000);
	expect_ok(r, "the put, after the cancelled copies");
	gpuq_reply_free(r);
	for (int k = 0; k < 2; k++) { /* their destination parts never ran */
		r = job_request(c, "wait", jobs[k], 10000);
		expect_error(r, GPUQ_E_CANCELLED, NULL);
		gpuq_reply_free(r);
	}
	/* both devices serve again: a copy now succeeds */
	CHECK_EQ(do_copy(c, "stall@1", "a@0[100:]", NULL, NULL, 0), 16);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_a_peer_copy_that_times_out_waiting_fails_and_frees_its_worker)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL); /* device 1 is busy: one job in flight */
	struct gpuq_client *c = client_open(&d);
	require_two_devices(c);
	do_alloc(c, "a", 0, 4096);
	do_alloc(c, "b", 1, 4096);
	int p[2];
	stall_device_1(c, p, 4);
	struct mp_map req;
	gpuq_request_begin(c, &req, "copy");
	mp_put_str(&req, "src", "a@0");
	mp_put_str(&req, "dst", "b@1");
	mp_put_u64(&req, "peer_timeout_ms", 200);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "queued copy");
	uint64_t job = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	/* the source part gives up after 200 ms and lets device 0 go */
	gpuq_request_begin(c, &req, "noop");
	mp_put_u64(&req, "device", 0);
	mp_put_bool(&req, "wait", true);
	mp_put_u64(&req, "timeout_ms", 5000);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "noop on device 0 behind the timed-out part");
	gpuq_reply_free(r);
	CHECK_EQ(write(p[1], "abcd", 4), 4);
	close(p[1]);
	/* then the destination part runs, finds its partner failed, and stops */
	r = job_request(c, "wait", job, 10000);
	expect_error(r, GPUQ_E_TIMEOUT, "peer_timeout_ms");
	gpuq_reply_free(r);
	CHECK_EQ(do_copy(c, "a@0[:4]", "b@1", NULL, NULL, 0), 4);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(d2d_copy_to_an_unhealthy_device_is_refused)
{
	if (test_backend_is_cuda())
		SKIP("an unhealthy GPU cannot be made on purpose; the host tier covers this");
	setenv("GPUQ_HOST_FAULT_DEVICE", "1", 1); /* device 1's first checksum faults it */
	struct daemon_proc d;
	daemon_start(&d, "--reset-limit", "0", NULL); /* and it stays unhealthy: no reset */
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "a", 0, 64);
	do_alloc(c, "b", 1, 64);
	struct mp_map req;
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", "b@1");
	mp_put_bool(&req, "wait", true);
	expect_error(call(c, &req, NULL, 0), GPUQ_E_DEVICE_ERROR, NULL);
	expect_copy_refused(c, "a@0", "b@1", NULL, GPUQ_E_NO_DEVICE, "device 1");
	expect_copy_refused(c, "a@0", "b@1", &(struct copy_opts){ .path = "host-staged" },
			    GPUQ_E_NO_DEVICE, "device 1");
	expect_copy_refused(c, "b@1", "a@0", NULL, GPUQ_E_NO_DEVICE, "device 1");
	/* device 0 alone still copies */
	do_alloc(c, "a2", 0, 64);
	CHECK_EQ(do_copy(c, "a@0", "a2@0", NULL, NULL, 0), 64);
	gpuq_close(c);
	daemon_stop(&d);
}

/* ---- big and the benchmark ---- */

TEST(d2d_copy_3GiB_plus_17_bit_exact_on_the_gpu)
{
	if (!test_backend_is_cuda())
		SKIP("3 GiB copies run on the cuda tier (make gpu-check)");
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const uint64_t n = (3ull << 30) + 17;
	do_alloc(c, "src", 0, n + 8);
	do_alloc(c, "dst", 0, n + 8);
	do_fill_random(c, "src", 31337);
	const char *engines[] = { "ce", "sm" };
	for (int e = 0; e < 2; e++) {
		poison(c, "dst");
		struct copy_opts o = { .engine = engines[e], .verify = true };
		/* aligned, then both misaligned differently (the SM kernel's shifted path) */
		CHECK_EQ(do_copy(c, "src[0:3221225489]", "dst[0:3221225489]", &o, NULL, 0), n);
		CHECK_EQ(do_copy(c, "src[1:3221225490]", "dst[6:3221225495]", &o, NULL, 0), n);
	}
	gpuq_close(c);
	daemon_stop(&d);
}

static void check_rows(const struct gpuq_reply *r, unsigned want_rows)
{
	const msgpack_object *rows = reply_path(r, "job.result.rows");
	CHECK(rows && rows->type == MSGPACK_OBJECT_ARRAY);
	CHECKF(rows->via.array.size == want_rows, "%u rows, not %u", rows->via.array.size,
	       want_rows);
	const char *keys[] = { "group", "bytes", "method", "role", "gbps", "ceiling", "ratio",
			       "verified" };
	for (uint32_t i = 0; i < rows->via.array.size; i++) {
		const msgpack_object *row = &rows->via.array.ptr[i];
		for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
			CHECKF(msg_map_get(row, keys[k]), "row %u lacks '%s'", i, keys[k]);
		const msgpack_object *v = msg_map_get(row, "verified");
		CHECKF(v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean, "row %u not verified", i);
	}
}

TEST(d2d_bench_d2d_gives_verified_rows_for_every_method)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices = device_count(c);
	struct mp_map req;
	struct mp_array sizes;
	gpuq_request_begin(c, &req, "bench_d2d");
	mp_array_init(&sizes);
	mp_array_u64(&sizes, 4096 + 1);
	mp_array_u64(&sizes, 1u << 20);
	mp_put_array(&req, "sizes", &sizes);
	mp_put_u64(&req, "repeats", 2);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "bench_d2d");
	/* D2D: 3 methods x 2 sizes; each pair: ceiling, peer (where direct), staged */
	unsigned pairs = (unsigned)(devices * (devices - 1) / 2);
	unsigned per_pair = test_backend_is_cuda() ? 0 : 3 * 2;
	if (test_backend_is_cuda()) {
		const msgpack_object *rows = reply_path(r, "job.result.rows");
		CHECK(rows->via.array.size >= 6 + pairs * 2 * 2);
		check_rows(r, rows->via.array.size);
	} else {
		check_rows(r, 6 + pairs * per_pair);
	}
	const msgpack_object *notes = reply_path(r, "job.result.notes");
	CHECK(notes && notes->type == MSGPACK_OBJECT_ARRAY);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}
