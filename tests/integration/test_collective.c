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
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "workers/collective_math.h"
#include "workers/host_patterns.h"

#define COUNT 1001 /* odd, so that the host backend's slices are uneven */

static const enum gpuq_dtype all_dtypes[] = {
	GPUQ_DTYPE_U8, GPUQ_DTYPE_I32, GPUQ_DTYPE_I64, GPUQ_DTYPE_F16,
	GPUQ_DTYPE_BF16, GPUQ_DTYPE_F32, GPUQ_DTYPE_F64,
};
static const char *const op_names[] = { "sum", "prod", "min", "max", "avg" };

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

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static struct gpuq_reply *allreduce(struct gpuq_client *c, const struct ar *a)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "allreduce");
	mp_put_str(&req, "buffer", a->buffer);
	if (a->devices) {
		struct mp_array devs;
		mp_array_init(&devs);
		for (int i = 0; i < a->n; i++)
			mp_array_u64(&devs, (uint64_t)a->devices[i]);
		mp_put_array(&req, "devices", &devs);
	}
	if (a->reduce)
		mp_put_str(&req, "reduce", a->reduce);
	if (a->out)
		mp_put_str(&req, "out", a->out);
	if (a->count)
		mp_put_u64(&req, "count", a->count);
	if (a->timeout_ms)
		mp_put_u64(&req, "collective_timeout_ms", a->timeout_ms);
	if (a->hang_rank >= 0)
		mp_put_u64(&req, "inject_hang_rank", (uint64_t)a->hang_rank);
	mp_put_bool(&req, "wait", !a->detach);
	return call(c, &req, NULL, 0);
}

static void alloc_typed(struct gpuq_client *c, const char *name, int device, enum gpuq_dtype t,
			uint64_t count)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "device", (uint64_t)device);
	mp_put_u64(&req, "count", count);
	mp_put_str(&req, "dtype", gpuq_dtype_name(t));
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "alloc");
	gpuq_reply_free(r);
}

static void fill_seed(struct gpuq_client *c, const char *name, int device, uint64_t seed)
{
	char ref[96];
	snprintf(ref, sizeof ref, "%s@%d", name, device);
	do_fill_random(c, ref, seed);
}

static void free_on(struct gpuq_client *c, const char *name, int device)
{
	char ref[96];
	snprintf(ref, sizeof ref, "%s@%d", name, device);
	do_free(c, ref);
}

/* The bytes of name@device, read back with get. */
static unsigned char *read_back(struct gpuq_client *c, const char *name, int device, size_t *n)
{
	char ref[96];
	snprintf(ref, sizeof ref, "%s@%d", name, device);
	int fd = memfd_create("gpuq-test-allreduce", MFD_CLOEXEC);
	CHECKF(fd >= 0, "memfd_create: %s", strerror(errno));
	do_get(c, ref, fd);
	unsigned char *p = fd_slurp(fd, n);
	close(fd);
	return p;
}

/*
 * Every rank's `out` holds, in its first count elements, the all-reduce of
 * the inputs filled with seeds[r], and past them what fill random `rest`
 * left (when rest is not 0).
 */
static void check_result(struct gpuq_client *c, const char *out, const int *devices, int n,
			 enum gpuq_dtype t, enum coll_op op, const uint64_t *seeds, uint64_t count,
			 uint64_t total, uint64_t rest)
{
	size_t sz = gpuq_dtype_size(t), bytes;
	uint64_t in[64];
	for (int r = 0; r < n; r++) {
		unsigned char *p = read_back(c, out, devices[r], &bytes);
		CHECK_EQ(bytes, total * sz);
		for (uint64_t i = 0; i < total; i++) {
			uint64_t got = 0;
			memcpy(&got, p + i * sz, sz);
			if (i >= count) {
				CHECKF(!rest || got == coll_random_element(t, rest, i),
				       "%s@%d element %llu past count %llu was changed", out,
				       devices[r], (unsigned long long)i, (unsigned long long)count);
				continue;
			}
			for (int k = 0; k < n; k++)
				in[k] = coll_random_element(t, seeds[k], i);
			CHECKF(coll_check_element(t, op, n, in, got),
			       "%s of %d ranks (%s): %s@%d element %llu is 0x%llx (rank 0 input 0x%llx)",
			       op_names[op], n, gpuq_dtype_name(t), out, devices[r],
			       (unsigned long long)i, (unsigned long long)got,
			       (unsigned long long)in[0]);
		}
		free(p);
	}
}

/* Up to want ranks: the host backend's devices, or the GPUs there are. */
static int ranks(struct gpuq_client *c, int want, int *devices)
{
	int n = device_count(c);
	n = n < want ? n : want;
	for (int i = 0; i < n; i++)
		devices[i] = i;
	return n;
}

static void expect_job_error(struct gpuq_reply *r, enum gpuq_errc code, const char *contains)
{
	expect_error(r, code, contains);
	gpuq_reply_free(r);
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
	int devices[3], n = ranks(c, 3, devices);
	uint64_t seeds[3] = { 11, 22, 33 };
	for (size_t t = 0; t < sizeof all_dtypes / sizeof all_dtypes[0]; t++) {
		enum gpuq_dtype dt = all_dtypes[t];
		for (int r = 0; r < n; r++) {
			alloc_typed(c, "x", devices[r], dt, COUNT);
			alloc_typed(c, "y", devices[r], dt, COUNT);
			fill_seed(c, "x", devices[r], seeds[r]);
		}
		for (int op = COLL_SUM; op <= COLL_AVG; op++) {
			struct ar a = { .buffer = "x", .devices = devices, .n = n,
					.reduce = op_names[op], .out = "y", .hang_rank = -1 };
			struct gpuq_reply *r = allreduce(c, &a);
			expect_ok(r, op_names[op]);
			CHECK_EQ(reply_u64(r, "job.result.count"), COUNT);
			gpuq_reply_free(r);
			check_result(c, "y", devices, n, dt, (enum coll_op)op, seeds, COUNT, COUNT, 0);
		}
		/* in place, and the inputs really are replaced */
		struct ar a = { .buffer = "x", .devices = devices, .n = n, .hang_rank = -1 };
		struct gpuq_reply *r = allreduce(c, &a);
		expect_ok(r, "in place");
		CHECK(reply_path(r, "job.result.in_place")->via.boolean);
		gpuq_reply_free(r);
		check_result(c, "x", devices, n, dt, COLL_SUM, seeds, COUNT, COUNT, 0);
		for (int k = 0; k < n; k++) {
			free_on(c, "x", devices[k]);
			free_on(c, "y", devices[k]);
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
	int all[3] = { 0, 0, 0 }, n = ranks(c, 3, all);
	int holders[2] = { all[0], all[n > 1 ? n - 1 : 0] }, nh = n > 1 ? 2 : 1;
	uint64_t seeds[2] = { 5, 6 };
	for (int r = 0; r < nh; r++) {
		alloc_typed(c, "p", holders[r], GPUQ_DTYPE_F32, COUNT);
		fill_seed(c, "p", holders[r], seeds[r]);
		alloc_typed(c, "q", holders[r], GPUQ_DTYPE_F32, COUNT);
		fill_seed(c, "q", holders[r], 77); /* what must survive past count */
	}
	struct ar a = { .buffer = "p", .out = "q", .count = 100, .reduce = "max", .hang_rank = -1 };
	struct gpuq_reply *r = allreduce(c, &a); /* no `devices`: every device holding p */
	expect_ok(r, "allreduce without devices");
	const msgpack_object *devs = reply_path(r, "job.result.devices");
	CHECK(devs && devs->type == MSGPACK_OBJECT_ARRAY && (int)devs->via.array.size == nh);
	CHECK_EQ(devs->via.array.ptr[nh - 1].via.u64, holders[nh - 1]);
	gpuq_reply_free(r);
	check_result(c, "q", holders, nh, GPUQ_DTYPE_F32, COLL_MAX, seeds, 100, COUNT, 77);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(allreduce_refusals_come_before_any_rank_starts)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[2], n = ranks(c, 2, devices);
	for (int r = 0; r < n; r++)
		alloc_typed(c, "g", devices[r], GPUQ_DTYPE_F32, 64);
	do_alloc(c, "raw", 0, 256);
	struct ar a = { .buffer = "g", .devices = devices, .n = n, .hang_rank = -1 };
	a.reduce = "median";
	expect_job_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST, "'median' is not one of sum, prod");
	a.reduce = NULL;
	a.count = 65;
	expect_job_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST, "give 1 to 64");
	a.count = 0;
	a.buffer = "g@0";
	expect_job_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST, "not NAME@GPU");
	a.buffer = "nothere";
	expect_job_error(allreduce(c, &a), GPUQ_E_NOT_FOUND, "'nothere' not found on device 0");
	a.buffer = "g";
	a.out = "nothere";
	expect_job_error(allreduce(c, &a), GPUQ_E_NOT_FOUND, "'nothere' not found on device 0");
	a.out = NULL;
	int raw_dev[1] = { 0 };
	struct ar untyped = { .buffer = "raw", .devices = raw_dev, .n = 1, .hang_rank = -1 };
	expect_job_error(allreduce(c, &untyped), GPUQ_E_BAD_REQUEST, "untyped (bytes)");
	struct ar none = { .buffer = "absent", .hang_rank = -1 };
	expect_job_error(allreduce(c, &none), GPUQ_E_NOT_FOUND, "'absent' not found");
	struct mp_map req; /* a zero timeout is out of range */
	gpuq_request_begin(c, &req, "allreduce");
	mp_put_str(&req, "buffer", "g");
	mp_put_u64(&req, "collective_timeout_ms", 0);
	expect_job_error(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "collective_timeout_ms");
	if (n > 1) {
		int twice[2] = { devices[0], devices[0] };
		struct ar dup = { .buffer = "g", .devices = twice, .n = 2, .hang_rank = -1 };
		expect_job_error(allreduce(c, &dup), GPUQ_E_BAD_REQUEST, "listed twice");
		alloc_typed(c, "h", devices[0], GPUQ_DTYPE_F32, 64);
		alloc_typed(c, "h", devices[1], GPUQ_DTYPE_F16, 64);
		a.buffer = "h";
		expect_job_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST,
				 "is 64 x f16 but 'h@0' is 64 x f32");
		alloc_typed(c, "k", devices[0], GPUQ_DTYPE_F32, 64);
		alloc_typed(c, "k", devices[1], GPUQ_DTYPE_F32, 65);
		a.buffer = "k";
		expect_job_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST, "same dtype and count");
		a.buffer = "g";
		a.out = "k";
		expect_job_error(allreduce(c, &a), GPUQ_E_BAD_REQUEST, "is 65 x f32 but 'g@0'");
	}
	/* nothing was held or queued: every buffer frees, and no allreduce job exists */
	for (int r = 0; r < n; r++)
		free_on(c, "g", devices[r]);
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
	int devices[2], n = ranks(c, 2, devices);
	uint64_t seeds[2] = { 1, 2 };
	for (int r = 0; r < n; r++) {
		alloc_typed(c, "w", devices[r], GPUQ_DTYPE_F64, 300);
		alloc_typed(c, "o", devices[r], GPUQ_DTYPE_F64, 300);
		fill_seed(c, "w", devices[r], seeds[r]);
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
	check_result(c, "o", devices, n, GPUQ_DTYPE_F64, COLL_SUM, seeds, 300, 300, 0);
	if (n > 1) { /* rank order is part of the set: [1,0] is another communicator */
		int reversed[2] = { devices[1], devices[0] };
		uint64_t rseeds[2] = { seeds[1], seeds[0] };
		struct ar b = { .buffer = "w", .out = "o", .devices = reversed, .n = 2, .hang_rank = -1 };
		r = allreduce(c, &b);
		communicator_is(r, "created");
		CHECK(reply_u64(r, "job.result.generation") != gen);
		gpuq_reply_free(r);
		check_result(c, "o", reversed, 2, GPUQ_DTYPE_F64, COLL_SUM, rseeds, 300, 300, 0);
		r = allreduce(c, &a); /* the first is still warm */
		communicator_is(r, "cached");
		CHECK_EQ(reply_u64(r, "job.result.generation"), gen);
		gpuq_reply_free(r);
	}
	gpuq_close(c);
	daemon_stop(&d);
}

/* The ordering test: threads with overlapping ordered sets, all at once. */
#define ORDER_THREADS 4
#define ORDER_ROUNDS 30
#define ORDER_COUNT 2048

static const int order_sets[][4] = {
	{ 0, 1, 2, -1 }, { 2, 1, 0, -1 }, { 1, 2, 3, -1 }, { 3, 0, 1, -1 },
	{ 0, 1, -1, -1 }, { 1, 0, -1, -1 }, { 2, 3, -1, -1 }, { 0, 1, 2, 3 },
	{ 3, 2, 1, 0 }, { 1, 3, -1, -1 },
};
#define ORDER_NSETS (int)(sizeof order_sets / sizeof order_sets[0])

struct order_thread {
	const struct daemon_proc *d;
	int id;
	int sets[ORDER_NSETS], nsets; /* the sets whose devices the daemon has */
	uint64_t expected[ORDER_NSETS]; /* checksum of the result over each set */
};

static uint64_t order_seed(int thread, int device)
{
	return 1000u * (unsigned)thread + (unsigned)device + 1;
}

static int set_size(int s)
{
	int n = 0;
	while (n < 4 && order_sets[s][n] >= 0)
		n++;
	return n;
}

/* The checksum every rank's output must have after the all-reduce over set s. */
static uint64_t order_expected(int thread, int s)
{
	int n = set_size(s);
	uint64_t *ref = malloc(ORDER_COUNT * sizeof *ref), in[4];
	CHECK(ref);
	for (uint64_t i = 0; i < ORDER_COUNT; i++) {
		for (int r = 0; r < n; r++)
			in[r] = coll_random_element(GPUQ_DTYPE_I64,
						    order_seed(thread, order_sets[s][r]), i);
		ref[i] = coll_reference_int(GPUQ_DTYPE_I64, COLL_SUM, n, in);
	}
	uint64_t sum = host_checksum(ref, ORDER_COUNT * sizeof *ref);
	free(ref);
	return sum;
}

static void *order_client(void *arg)
{
	struct order_thread *t = arg;
	struct gpuq_client *c = client_open(t->d);
	char in[16], out[16], ref[32];
	snprintf(in, sizeof in, "in%d", t->id);
	snprintf(out, sizeof out, "out%d", t->id);
	for (int round = 0; round < ORDER_ROUNDS; round++) {
		int s = t->sets[(round * 7 + t->id * 3) % t->nsets], n = set_size(s);
		struct ar a = { .buffer = in, .out = out, .devices = order_sets[s], .n = n,
				.hang_rank = -1 };
		struct gpuq_reply *r = allreduce(c, &a);
		expect_ok(r, "overlapping allreduce");
		gpuq_reply_free(r);
		for (int k = 0; k < n; k++) {
			snprintf(ref, sizeof ref, "%s@%d", out, order_sets[s][k]);
			CHECKF(do_checksum(c, ref) == t->expected[s],
			       "thread %d round %d: %s is not the sum over set %d", t->id, round, ref, s);
		}
	}
	gpuq_close(c);
	return NULL;
}

/* Whether every device of set s is one of the daemon's ndev. */
static bool set_fits(int s, int ndev)
{
	for (int r = 0; r < set_size(s); r++)
		if (order_sets[s][r] >= ndev)
			return false;
	return true;
}

TEST(overlapping_allreduces_from_many_clients_never_cross)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-devices", "4", "--collective-timeout", "20000", NULL);
	struct gpuq_client *c = client_open(&d);
	int ndev = device_count(c) < 4 ? device_count(c) : 4;
	if (ndev < 2)
		SKIP("needs two devices (the host backend has four; this machine has one GPU)");
	struct order_thread th[ORDER_THREADS];
	pthread_t tid[ORDER_THREADS];
	for (int t = 0; t < ORDER_THREADS; t++) {
		char in[16], out[16];
		snprintf(in, sizeof in, "in%d", t);
		snprintf(out, sizeof out, "out%d", t);
		th[t].nsets = 0;
		for (int s = 0; s < ORDER_NSETS; s++)
			if (set_fits(s, ndev))
				th[t].sets[th[t].nsets++] = s;
		for (int dev = 0; dev < ndev; dev++) {
			alloc_typed(c, in, dev, GPUQ_DTYPE_I64, ORDER_COUNT);
			alloc_typed(c, out, dev, GPUQ_DTYPE_I64, ORDER_COUNT);
			fill_seed(c, in, dev, order_seed(t, dev));
		}
		th[t].d = &d;
		th[t].id = t;
		for (int k = 0; k < th[t].nsets; k++)
			th[t].expected[th[t].sets[k]] = order_expected(t, th[t].sets[k]);
	}
	for (int t = 0; t < ORDER_THREADS; t++)
		CHECK(pthread_create(&tid[t], NULL, order_client, &th[t]) == 0);
	for (int t = 0; t < ORDER_THREADS; t++)
		pthread_join(tid[t], NULL);
	gpuq_close(c);
	daemon_stop(&d);
}

/* A job's state, from status. */
static void job_state(struct gpuq_client *c, uint64_t job, char *state, size_t size)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "status");
	mp_put_u64(&req, "job", job);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	reply_str(r, "job.state", state, size);
	gpuq_reply_free(r);
}

static struct gpuq_reply *wait_job(struct gpuq_client *c, uint64_t job, uint64_t timeout_ms)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "wait");
	mp_put_u64(&req, "job", job);
	mp_put_u64(&req, "timeout_ms", timeout_ms);
	return call(c, &req, NULL, 0);
}

/* Two ranks, f32 inputs from seeds 3 and 4 and an output buffer. */
static void two_rank_buffers(struct gpuq_client *c, const int *devices, int n)
{
	for (int r = 0; r < n; r++) {
		alloc_typed(c, "g", devices[r], GPUQ_DTYPE_F32, 512);
		alloc_typed(c, "o", devices[r], GPUQ_DTYPE_F32, 512);
		fill_seed(c, "g", devices[r], 3 + (uint64_t)r);
	}
}

static void expect_fresh_and_right(struct gpuq_client *c, const int *devices, int n)
{
	static const uint64_t seeds[2] = { 3, 4 };
	struct ar a = { .buffer = "g", .out = "o", .devices = devices, .n = n, .hang_rank = -1 };
	struct gpuq_reply *r = allreduce(c, &a);
	communicator_is(r, "created");
	gpuq_reply_free(r);
	check_result(c, "o", devices, n, GPUQ_DTYPE_F32, COLL_SUM, seeds, 512, 512, 0);
}

TEST(hung_rank_fails_within_the_timeout_and_the_next_allreduce_succeeds)
{
	fixture_daemon_binary = "tests/gpuqd-faults";
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[2], n = ranks(c, 2, devices);
	two_rank_buffers(c, devices, n);
	struct ar a = { .buffer = "g", .out = "o", .devices = devices, .n = n, .hang_rank = -1 };
	struct gpuq_reply *r = allreduce(c, &a); /* warm: the hang hits a cached communicator */
	communicator_is(r, "created");
	gpuq_reply_free(r);
	a.hang_rank = n - 1;
	a.timeout_ms = 300;
	double t0 = now_s();
	r = allreduce(c, &a);
	double took = now_s() - t0;
	char want[32];
	snprintf(want, sizeof want, "rank %d", n - 1);
	expect_job_error(r, GPUQ_E_TIMEOUT, want);
	CHECKF(took < 0.3 + 1.0, "the hung rank's job took %.3f s to fail (timeout 0.3 s)", took);
	CHECKF(took >= 0.25, "the job failed after %.3f s, before its timeout", took);
	expect_fresh_and_right(c, devices, n); /* every rank dropped the aborted communicator */
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(a_rank_that_never_arrives_fails_the_job_naming_it)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL); /* device 1 is busy: one job in flight */
	struct gpuq_client *c = client_open(&d);
	if (device_count(c) < 2)
		SKIP("needs two devices (the host backend has them; this machine has one GPU)");
	int devices[2] = { 0, 1 }, p[2];
	two_rank_buffers(c, devices, 2);
	struct ar a = { .buffer = "g", .out = "o", .devices = devices, .n = 2, .hang_rank = -1 };
	gpuq_reply_free(allreduce(c, &a)); /* warm */
	do_alloc(c, "w", 1, 16);
	start_stalled_put(c, "w@1", p); /* device 1's queue is stuck behind a put */
	a.timeout_ms = 300;
	a.detach = true;
	struct gpuq_reply *r = allreduce(c, &a);
	expect_ok(r, "queued allreduce");
	uint64_t job = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	usleep(700 * 1000); /* rank 0 gives up at 300 ms; rank 1 has not started */
	char state[16];
	job_state(c, job, state, sizeof state);
	CHECKF(strcmp(state, "running") == 0, "the job is %s while rank 1 is queued", state);
	close(p[1]); /* the put ends; rank 1 starts, finds the job failed, and ends */
	expect_job_error(wait_job(c, job, 10000), GPUQ_E_TIMEOUT,
			 "rank 1 (device 1) did not arrive within 300 ms");
	expect_fresh_and_right(c, devices, 2);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(cancel_stops_a_waiting_allreduce_and_holds_buffers_until_it_ends)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL); /* device 1 is busy: one job in flight */
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
	job_state(c, freeing, state, sizeof state);
	CHECKF(strcmp(state, "queued") == 0, "the free is %s while the all-reduce holds g@0", state);
	gpuq_request_begin(c, &req, "cancel");
	mp_put_u64(&req, "job", job);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "cancel");
	gpuq_reply_free(r);
	close(p[1]);
	expect_job_error(wait_job(c, job, 10000), GPUQ_E_CANCELLED, NULL);
	gpuq_reply_free(wait_job(c, freeing, 10000)); /* released by the cancelled job: freed now */
	alloc_typed(c, "g", 0, GPUQ_DTYPE_F32, 512);
	fill_seed(c, "g", 0, 3);
	expect_fresh_and_right(c, devices, 2);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(sigterm_during_an_allreduce_exits_cleanly)
{
	struct daemon_proc d;
	daemon_start(&d, "--shutdown-timeout", "200", NULL);
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

TEST(cli_allreduce_and_bench_allreduce)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[2], n = ranks(c, 2, devices);
	for (int r = 0; r < n; r++) {
		alloc_typed(c, "grads", devices[r], GPUQ_DTYPE_BF16, 4096);
		fill_seed(c, "grads", devices[r], 9 + (uint64_t)r);
	}
	static char out[16384];
	int rc = run_cli(&d, "allreduce grads --devices all --op avg", out, sizeof out);
	CHECKF(rc == 0 && strstr(out, "allreduce grads over devices") && strstr(out, "avg of 4096 x bf16"),
	       "gpuq allreduce: exit %d:\n%s", rc, out);
	rc = run_cli(&d, "allreduce grads --devices 0 --op mean", out, sizeof out);
	CHECKF(rc == 1 && strstr(out, "'mean' is not one of"), "bad op: exit %d:\n%s", rc, out);
	rc = run_cli(&d, "allreduce grads --devices 0-x", out, sizeof out);
	CHECKF(rc == 2, "bad --devices: exit %d:\n%s", rc, out);
	rc = run_cli(&d, "bench allreduce --bytes 8:4K --factor 8 --devices all --requests 20", out,
		     sizeof out);
	CHECKF(rc == 0 && strstr(out, "RAW µs") && strstr(out, "4 KiB") && strstr(out, "0/0"),
	       "gpuq bench allreduce: exit %d:\n%s", rc, out);
	gpuq_close(c);
	daemon_stop(&d);
}
