/*
 * All-reduce: results against the reference for every op and dtype, the
 * refusals that come before any rank starts, the communicator cache and the
 * in-process id hand-off, ordering under many concurrent overlapping
 * collectives, and the faults: a rank that never arrives, a hung rank
 * (tests/gpuqd-faults), cancellation and shutdown mid-collective.
 *
 * On the host backend (CI) the daemon has 2 to 4 devices; on the CUDA tier
 * the tests that need two GPUs skip on a one-GPU machine and the rest run
 * with one rank (a one-rank communicator gives the input back).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/coll_util.h"
#include "workers/backend/host_patterns.h"

#define COUNT 1001 /* odd, so that the host backend's slices are uneven */

struct ar {
	const char *buffer;
	const int *devices; /* NULL: leave `devices` out */
	int n;
	const char *reduce; /* NULL: the default */
	const char *out;
	uint64_t count, timeout_ms;
	int hang_rank; /* -1: none (tests/gpuqd-faults only) */
	bool detach;
};

/* An allreduce request from libgpuq's call, with the fields tests add. */
static struct gpuq_reply *allreduce(struct gpuq_client *c, const struct ar *a)
{
	struct gpuq_collective ar = { .op = "allreduce", .buffer = a->buffer, .out = a->out,
				      .reduce = a->reduce, .root = -1, .count = a->count };
	struct mp_map req;
	gpuq_collective_begin(c, &req, &ar, a->devices, a->devices ? a->n : 0);
	if (a->timeout_ms)
		mp_put_u64(&req, "collective_timeout_ms", a->timeout_ms);
	if (a->hang_rank >= 0)
		mp_put_u64(&req, "inject_hang_rank", (uint64_t)a->hang_rank);
	mp_put_bool(&req, "wait", !a->detach);
	return call(c, &req, NULL, 0);
}

/*
 * Every rank's `out` holds, in its first count elements, the all-reduce of
 * the inputs filled with seeds[r], and past them what fill random `rest`
 * left (when rest is not 0).
 */
static void check_result(struct gpuq_client *c, const char *in, const char *out,
			 const int *devices, int n, enum gpuq_dtype t, enum coll_op op,
			 const uint64_t *seeds, uint64_t count, uint64_t rest)
{
	struct coll_layout l = { .prim = COLL_ALLREDUCE, .nranks = n, .count = count };
	struct coll_bufs b = { .in = in, .out = out };
	coll_check(c, &l, t, op, devices, &b, seeds, rest);
}

static void communicator_is(struct gpuq_reply *r, const char *want)
{
	char comm[16];
	expect_ok(r, "allreduce");
	reply_str(r, "job.result.communicator", comm, sizeof comm);
	CHECKF(strcmp(comm, want) == 0, "communicator %s, expected %s", comm, want);
}

TEST(allreduce_every_op_and_dtype_matches_the_reference)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-devices", "3", NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[3], n = coll_ranks(c, 3, devices);
	uint64_t seeds[3] = { 11, 22, 33 };
	for (size_t t = 0; t < 7; t++) {
		enum gpuq_dtype dt = coll_typed_dtypes[t];
		for (int r = 0; r < n; r++) {
			coll_alloc(c, "x", devices[r], dt, COUNT);
			coll_alloc(c, "y", devices[r], dt, COUNT);
			coll_fill(c, "x", devices[r], seeds[r]);
		}
		for (int op = COLL_SUM; op <= COLL_AVG; op++) {
			const char *name = coll_op_name((enum coll_op)op);
			struct ar a = { .buffer = "x", .devices = devices, .n = n, .reduce = name,
					.out = "y", .hang_rank = -1 };
			struct gpuq_reply *r = allreduce(c, &a);
			expect_ok(r, name);
			CHECK_EQ(reply_u64(r, "job.result.count"), COUNT);
			gpuq_reply_free(r);
			check_result(c, "x", "y", devices, n, dt, (enum coll_op)op, seeds, COUNT, 0);
		}
		/* in place, and the inputs really are replaced */
		struct ar a = { .buffer = "x", .devices = devices, .n = n, .hang_rank = -1 };
		struct gpuq_reply *r = allreduce(c, &a);
		expect_ok(r, "in place");
		CHECK(reply_path(r, "job.result.in_place")->via.boolean);
		gpuq_reply_free(r);
		check_result(c, "x", NULL, devices, n, dt, COLL_SUM, seeds, COUNT, 0);
		for (int k = 0; k < n; k++) {
			coll_free(c, "x", devices[k]);
			coll_free(c, "y", devices[k]);
		}
	}
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(allreduce_count_reduces_a_prefix_and_devices_default_to_every_holder)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-devices", "3", NULL);
	struct gpuq_client *c = client_open(&d);
	int all[3] = { 0, 0, 0 }, n = coll_ranks(c, 3, all);
	int holders[2] = { all[0], all[n > 1 ? n - 1 : 0] }, nh = n > 1 ? 2 : 1;
	uint64_t seeds[2] = { 5, 6 };
	for (int r = 0; r < nh; r++) {
		coll_alloc(c, "p", holders[r], GPUQ_DTYPE_F32, COUNT);
		coll_fill(c, "p", holders[r], seeds[r]);
		coll_alloc(c, "q", holders[r], GPUQ_DTYPE_F32, COUNT);
		coll_fill(c, "q", holders[r], 77); /* what must survive past count */
	}
	struct ar a = { .buffer = "p", .out = "q", .count = 100, .reduce = "max", .hang_rank = -1 };
	struct gpuq_reply *r = allreduce(c, &a); /* no `devices`: every device holding p */
	expect_ok(r, "allreduce without devices");
	const msgpack_object *devs = reply_path(r, "job.result.devices");
	CHECK(devs && devs->type == MSGPACK_OBJECT_ARRAY && (int)devs->via.array.size == nh);
	CHECK_EQ(devs->via.array.ptr[nh - 1].via.u64, holders[nh - 1]);
	gpuq_reply_free(r);
	check_result(c, "p", "q", holders, nh, GPUQ_DTYPE_F32, COLL_MAX, seeds, 100, 77);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(allreduce_refusals_come_before_any_rank_starts)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[2], n = coll_ranks(c, 2, devices);
	for (int r = 0; r < n; r++)
		coll_alloc(c, "g", devices[r], GPUQ_DTYPE_F32, 64);
	do_alloc(c, "raw", 0, 256);
	struct ar a = { .buffer = "g", .devices = devices, .n = n, .hang_rank = -1 };
	a.reduce = "median";
	coll_expect_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST, "'median' is not one of sum, prod");
	a.reduce = NULL;
	a.count = 65;
	coll_expect_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST,
			  "buffer 'g@0' (rank 0's input and output, in place) holds 64 f32 "
			  "elements, but allreduce of count 65 over");
	a.count = 0;
	a.buffer = "g@0";
	coll_expect_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST, "not NAME@GPU");
	a.buffer = "nothere";
	coll_expect_error(allreduce(c, &a), GPUQ_E_NOT_FOUND, "'nothere' not found on device 0");
	a.buffer = "g";
	a.out = "nothere";
	coll_expect_error(allreduce(c, &a), GPUQ_E_NOT_FOUND, "'nothere' not found on device 0");
	a.out = NULL;
	int raw_dev[1] = { 0 };
	struct ar untyped = { .buffer = "raw", .devices = raw_dev, .n = 1, .hang_rank = -1 };
	coll_expect_error(allreduce(c, &untyped), GPUQ_E_BAD_REQUEST, "untyped (bytes)");
	struct ar none = { .buffer = "absent", .hang_rank = -1 };
	coll_expect_error(allreduce(c, &none), GPUQ_E_NOT_FOUND, "'absent' not found");
	struct mp_map req; /* a zero timeout is out of range */
	gpuq_request_begin(c, &req, "allreduce");
	mp_put_str(&req, "buffer", "g");
	mp_put_u64(&req, "collective_timeout_ms", 0);
	coll_expect_error(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "collective_timeout_ms");
	if (n > 1) {
		int twice[2] = { devices[0], devices[0] };
		struct ar dup = { .buffer = "g", .devices = twice, .n = 2, .hang_rank = -1 };
		coll_expect_error(allreduce(c, &dup), GPUQ_E_BAD_REQUEST, "listed twice");
		coll_alloc(c, "h", devices[0], GPUQ_DTYPE_F32, 64);
		coll_alloc(c, "h", devices[1], GPUQ_DTYPE_F16, 64);
		a.buffer = "h";
		coll_expect_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST,
				 "is 64 x f16 but 'h@0' is 64 x f32");
		/* counts may differ; each buffer must hold what its rank needs */
		coll_alloc(c, "k", devices[0], GPUQ_DTYPE_F32, 65);
		coll_alloc(c, "k", devices[1], GPUQ_DTYPE_F32, 64);
		a.buffer = "k";
		coll_expect_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST,
				  "buffer 'k@1' (rank 1's input and output, in place) holds 64 f32 "
				  "elements, but allreduce of count 65 over 2 ranks needs 65 there: 1 "
				  "too few");
		a.buffer = "g";
		a.out = "h";
		coll_expect_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST,
				  "buffer 'h@1' is 64 x f16 but 'g@0' is 64 x f32");
	}
	/* nothing was held or queued: every buffer frees, and no allreduce job exists */
	for (int r = 0; r < n; r++)
		coll_free(c, "g", devices[r]);
	gpuq_request_begin(c, &req, "jobs");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	const msgpack_object *jobs = reply_path(r, "jobs");
	for (uint32_t i = 0; jobs && i < jobs->via.array.size; i++) {
		const msgpack_object *op = msg_map_get(&jobs->via.array.ptr[i], "op");
		CHECK(!op || op->via.str.size != 9 || memcmp(op->via.str.ptr, "allreduce", 9) != 0);
	}
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(communicators_are_made_once_per_ordered_set_and_kept_warm)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[2], n = coll_ranks(c, 2, devices);
	uint64_t seeds[2] = { 1, 2 };
	for (int r = 0; r < n; r++) {
		coll_alloc(c, "w", devices[r], GPUQ_DTYPE_F64, 300);
		coll_alloc(c, "o", devices[r], GPUQ_DTYPE_F64, 300);
		coll_fill(c, "w", devices[r], seeds[r]);
	}
	struct ar a = { .buffer = "w", .out = "o", .devices = devices, .n = n, .hang_rank = -1 };
	struct gpuq_reply *r = allreduce(c, &a);
	communicator_is(r, "created");
	uint64_t gen = reply_u64(r, "job.result.generation");
	gpuq_reply_free(r);
	for (int i = 0; i < 3; i++) {
		r = allreduce(c, &a);
		communicator_is(r, "cached");
		CHECK_EQ(reply_u64(r, "job.result.generation"), gen);
		gpuq_reply_free(r);
	}
	check_result(c, "w", "o", devices, n, GPUQ_DTYPE_F64, COLL_SUM, seeds, 300, 0);
	if (n > 1) { /* rank order is part of the set: [1,0] is another communicator */
		int reversed[2] = { devices[1], devices[0] };
		uint64_t rseeds[2] = { seeds[1], seeds[0] };
		struct ar b = { .buffer = "w", .out = "o", .devices = reversed, .n = 2, .hang_rank = -1 };
		r = allreduce(c, &b);
		communicator_is(r, "created");
		CHECK(reply_u64(r, "job.result.generation") != gen);
		gpuq_reply_free(r);
		check_result(c, "w", "o", reversed, 2, GPUQ_DTYPE_F64, COLL_SUM, rseeds, 300, 0);
		r = allreduce(c, &a); /* the first is still warm */
		communicator_is(r, "cached");
		CHECK_EQ(reply_u64(r, "job.result.generation"), gen);
		gpuq_reply_free(r);
	}
	gpuq_close(c);
	daemon_stop(&d);
}

/* Two ranks, f32 inputs from seeds 3 and 4 and an output buffer. */
static void two_rank_buffers(struct gpuq_client *c, const int *devices, int n)
{
	for (int r = 0; r < n; r++) {
		coll_alloc(c, "g", devices[r], GPUQ_DTYPE_F32, 512);
		coll_alloc(c, "o", devices[r], GPUQ_DTYPE_F32, 512);
		coll_fill(c, "g", devices[r], 3 + (uint64_t)r);
	}
}

static void expect_fresh_and_right(struct gpuq_client *c, const int *devices, int n)
{
	static const uint64_t seeds[2] = { 3, 4 };
	struct ar a = { .buffer = "g", .out = "o", .devices = devices, .n = n, .hang_rank = -1 };
	struct gpuq_reply *r = allreduce(c, &a);
	communicator_is(r, "created");
	gpuq_reply_free(r);
	check_result(c, "g", "o", devices, n, GPUQ_DTYPE_F32, COLL_SUM, seeds, 512, 0);
}

TEST(hung_rank_fails_within_the_timeout_and_the_next_allreduce_succeeds)
{
	fixture_daemon_binary = "tests/gpuqd-faults";
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[2], n = coll_ranks(c, 2, devices);
	two_rank_buffers(c, devices, n);
	struct ar a = { .buffer = "g", .out = "o", .devices = devices, .n = n, .hang_rank = -1 };
	struct gpuq_reply *r = allreduce(c, &a); /* warm: the hang hits a cached communicator */
	communicator_is(r, "created");
	gpuq_reply_free(r);
	a.hang_rank = n - 1;
	a.timeout_ms = 300;
	double t0 = coll_now();
	r = allreduce(c, &a);
	double took = coll_now() - t0;
	char want[32];
	snprintf(want, sizeof want, "rank %d", n - 1);
	coll_expect_error(r, GPUQ_E_TIMEOUT, want);
	/* Without the timeout the hung rank never answers: the upper bound leaves a loaded machine room. */
	CHECKF(took < 0.3 + COLL_LATE_S, "the hung rank's job took %.3f s to fail (timeout 0.3 s)", took);
	CHECKF(took >= 0.25, "the job failed after %.3f s, before its timeout", took);
	expect_fresh_and_right(c, devices, n); /* every rank dropped the aborted communicator */
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * Issue 10, item 4: the timeout counts from submission. Rank 1 is queued
 * behind a stalled put: at 300 ms it is taken out of its queue and the job
 * answers with `timeout` then, not when the put ends.
 */
TEST(a_rank_that_never_arrives_fails_the_job_on_time_naming_it)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL); /* one job in flight: a queue stays stuck behind the stalled put */
	struct gpuq_client *c = client_open(&d);
	if (device_count(c) < 2)
		SKIP("needs two devices (the host backend has them; this machine has one GPU)");
	int devices[2] = { 0, 1 }, p[2];
	two_rank_buffers(c, devices, 2);
	struct ar a = { .buffer = "g", .out = "o", .devices = devices, .n = 2, .hang_rank = -1 };
	gpuq_reply_free(allreduce(c, &a)); /* warm */
	do_alloc(c, "w", 1, 16);
	uint64_t put = start_stalled_put(c, "w@1", p); /* device 1's queue is stuck behind it */
	a.timeout_ms = 300;
	double t0 = coll_now();
	struct gpuq_reply *r = allreduce(c, &a);
	double took = coll_now() - t0;
	expect_error(r, GPUQ_E_TIMEOUT,
		     "rank 1 (device 1) did not arrive within 300 ms of the job's submission");
	uint64_t job = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	/* without the timeout it would wait for the stalled put, which never ends */
	CHECKF(took >= 0.25 && took < 0.3 + COLL_LATE_S, "the reply came %.3f s after submission "
	       "(timeout 0.3 s)", took);
	char state[16];
	coll_job_state(c, job, state, sizeof state);
	CHECKF(strcmp(state, "failed") == 0, "the job is %s", state);
	coll_job_state(c, put, state, sizeof state);
	CHECKF(strcmp(state, "running") == 0, "the put is %s: the job waited for it", state);
	close(p[1]); /* the put ends; rank 1 was never run */
	expect_fresh_and_right(c, devices, 2);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(cancel_stops_a_waiting_allreduce_and_holds_buffers_until_it_ends)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL); /* one job in flight: a queue stays stuck behind the stalled put */
	struct gpuq_client *c = client_open(&d);
	if (device_count(c) < 2)
		SKIP("needs two devices (the host backend has them; this machine has one GPU)");
	int devices[2] = { 0, 1 }, p[2];
	two_rank_buffers(c, devices, 2);
	do_alloc(c, "w", 1, 16);
	start_stalled_put(c, "w@1", p);
	struct ar a = { .buffer = "g", .out = "o", .devices = devices, .n = 2, .hang_rank = -1,
			.detach = true };
	struct gpuq_reply *r = allreduce(c, &a);
	uint64_t job = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	usleep(50 * 1000); /* rank 0 waits at the rendezvous */
	struct mp_map req;
	gpuq_request_begin(c, &req, "free"); /* waits for the all-reduce holding g@0 */
	mp_put_str(&req, "buffer", "g@0");
	r = call(c, &req, NULL, 0);
	expect_ok(r, "free, queued behind the all-reduce");
	uint64_t freeing = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	usleep(50 * 1000);
	char state[16];
	coll_job_state(c, freeing, state, sizeof state);
	CHECKF(strcmp(state, "queued") == 0, "the free is %s while the all-reduce holds g@0", state);
	r = job_request(c, "status", job, 0);
	double ran = reply_f64(r, "job.run_s"); /* rank 0's wait so far */
	gpuq_reply_free(r);
	gpuq_request_begin(c, &req, "cancel");
	mp_put_u64(&req, "job", job);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "cancel");
	gpuq_reply_free(r);
	close(p[1]);
	coll_expect_error(coll_wait(c, job, 10000), GPUQ_E_CANCELLED, "allreduce cancelled (rank 0");
	r = job_request(c, "status", job, 0);
	CHECKF(reply_f64(r, "job.run_s") >= ran, "the job ran %.3f s in all, after %.3f s so far",
	       reply_f64(r, "job.run_s"), ran);
	gpuq_reply_free(r);
	gpuq_reply_free(coll_wait(c, freeing, 10000)); /* released by the cancelled job: freed now */
	coll_alloc(c, "g", 0, GPUQ_DTYPE_F32, 512);
	coll_fill(c, "g", 0, 3);
	expect_fresh_and_right(c, devices, 2);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(sigterm_during_an_allreduce_exits_cleanly)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", "--shutdown-timeout", "200", NULL); /* one job in flight: a queue stays stuck behind the stalled put */
	struct gpuq_client *c = client_open(&d);
	if (device_count(c) < 2)
		SKIP("needs two devices (the host backend has them; this machine has one GPU)");
	int devices[2] = { 0, 1 }, p[2];
	two_rank_buffers(c, devices, 2);
	gpuq_reply_free(allreduce(c, &(struct ar){ .buffer = "g", .devices = devices, .n = 2,
						    .hang_rank = -1 }));
	do_alloc(c, "w", 1, 16);
	start_stalled_put(c, "w@1", p);
	struct ar a = { .buffer = "g", .devices = devices, .n = 2, .hang_rank = -1, .detach = true };
	gpuq_reply_free(allreduce(c, &a));
	usleep(50 * 1000);
	daemon_stop(&d); /* exit status 0, socket removed; the communicators are destroyed */
	close(p[1]);
	gpuq_close(c);
}

/* Runs the gpuq CLI against d; returns its exit status and leaves its output in out. */
static int run_cli(const struct daemon_proc *d, const char *args, char *out, size_t size)
{
	const char *build = getenv("GPUQ_BUILD") ? getenv("GPUQ_BUILD") : "build";
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "%s/gpuq --socket %s %s 2>&1", build, d->sock, args);
	FILE *f = popen(cmd, "r");
	CHECK(f);
	size_t got = fread(out, 1, size - 1, f);
	out[got] = '\0';
	int status = pclose(f);
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Runs the CLI and fails the test unless it exits with want and prints every one of expect. */
static void expect_cli(const struct daemon_proc *d, const char *args, int want,
		       const char *const *expect)
{
	static char out[16384];
	int rc = run_cli(d, args, out, sizeof out);
	bool all = rc == want;
	for (int i = 0; all && expect && expect[i]; i++)
		all = strstr(out, expect[i]) != NULL;
	CHECKF(all, "gpuq %s: exit %d (expected %d):\n%s", args, rc, want, out);
}

#define SAYS(...) ((const char *const[]){ __VA_ARGS__, NULL })

TEST(cli_collectives_and_their_benchmarks)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[2], n = coll_ranks(c, 2, devices);
	for (int r = 0; r < n; r++) {
		coll_alloc(c, "grads", devices[r], GPUQ_DTYPE_BF16, 4096);
		coll_alloc(c, "full", devices[r], GPUQ_DTYPE_BF16, 4096 * (uint64_t)n);
		coll_alloc(c, "full2", devices[r], GPUQ_DTYPE_BF16, 4096 * (uint64_t)n);
		coll_fill(c, "grads", devices[r], 9 + (uint64_t)r);
	}
	char args[256];
	expect_cli(&d, "allreduce grads --devices all --op avg", 0,
		   SAYS("allreduce grads over devices", "avg of 4096 x bf16"));
	expect_cli(&d, "all-gather grads --out full --devices all", 0,
		   SAYS("all_gather grads over devices", "4096 x bf16", "into full"));
	expect_cli(&d, "reduce-scatter full --out grads --op max --devices all", 0,
		   SAYS("reduce_scatter full over devices", "max of 4096 x bf16"));
	snprintf(args, sizeof args, "broadcast grads --root %d --devices all", n - 1);
	expect_cli(&d, args, 0, SAYS("broadcast grads over", "root rank", "in place"));
	expect_cli(&d, "reduce grads --root 0 --op min --devices all", 0, SAYS("min of 4096"));
	expect_cli(&d, "all-to-all full --out full2 --devices all", 0, SAYS("all_to_all full over"));
	snprintf(args, sizeof args, "sendrecv 'grads@0[0:64]' 'full@%d[64:128]'", devices[n - 1]);
	expect_cli(&d, args, 0, SAYS("sendrecv over device", "grads@0[0:64] -> full@", "32 x bf16"));
	expect_cli(&d, "group --devices all 'all-gather grads --out full' 'reduce full2 --root 0'",
		   0, SAYS("group of 2 over devices", "  all_gather grads: 4096 x bf16", "  reduce full2"));
	expect_cli(&d, "group 'all-gather grads --out full'", 2, SAYS("needs --devices"));
	expect_cli(&d, "group --devices all 'gather grads'", 2, SAYS("does not start with a collective"));
	expect_cli(&d, "group --devices all 'reduce grads --root'", 2, SAYS("--root needs a value"));
	expect_cli(&d, "allreduce grads --devices 0 --op mean", 1, SAYS("'mean' is not one of"));
	expect_cli(&d, "allreduce grads --devices 0-x", 2, NULL);
	expect_cli(&d, "bench allreduce --bytes 8:4K --factor 8 --devices all --requests 20", 0,
		   SAYS("RAW µs", "4 KiB", "0/0"));
	expect_cli(&d, "bench collective --op all-gather --bytes 8:4K --factor 8 --requests 20", 0,
		   SAYS("bench all_gather", "nccl-tests' bus factor for all_gather", "0/0"));
	expect_cli(&d, "bench collective --op sendrecv --bytes 256 --requests 10 --dtype bytes", 0,
		   SAYS("bench sendrecv", "a ring", "0/0"));
	expect_cli(&d, "bench collective --op reduce --root 1 --reduce max --bytes 64 --requests 10",
		   n > 1 ? 0 : 1, SAYS("reduce"));
	expect_cli(&d, "bench collective --bytes 64", 2, SAYS("needs --op PRIMITIVE"));
	gpuq_close(c);
	daemon_stop(&d);
}

/* bench_allreduce, the request, is still served (the CLI sends bench_collective). */
TEST(bench_allreduce_request_times_the_raw_loop)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[2], n = coll_ranks(c, 2, devices);
	two_rank_buffers(c, devices, n);
	struct gpuq_collective ar = { .op = "bench_allreduce", .buffer = "g", .out = "o", .root = -1 };
	struct mp_map req;
	gpuq_collective_begin(c, &req, &ar, devices, n);
	mp_put_u64(&req, "iters", 3);
	mp_put_u64(&req, "repeats", 2);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "bench_allreduce");
	CHECK(reply_f64(r, "job.result.us") > 0);
	CHECK_EQ(reply_path(r, "job.result.rank_us")->via.array.size, n);
	CHECK_EQ(reply_u64(r, "job.result.iters"), 3);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}
