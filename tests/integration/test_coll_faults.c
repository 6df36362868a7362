/*
 * The collectives' faults beyond all-reduce's (test_collective.c), on the
 * other primitives and on groups, which share its machinery: ranks still
 * queued when the timeout (counted from submission) passes are taken out of
 * their queues and the job answers on time; a hung rank in a group
 * (tests/gpuqd-faults); cancel and SIGTERM while a rank waits; and clients
 * issuing every kind of collective over overlapping ordered sets at once,
 * which must all finish, right, without deadlock.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/coll_util.h"

#define TWO_GPUS "needs two devices (the host backend has them; the CUDA tier needs a multi-GPU " \
		 "machine such as nvidia-h200-x2, and this one has one GPU)"

/* A group request with the fields tests add: a timeout, a rank to hang (-1: none). */
static struct gpuq_reply *send_group(struct gpuq_client *c, const struct gpuq_collective *ops,
				     int nops, const int *devices, int n, uint64_t timeout_ms,
				     int hang_rank, bool detach)
{
	struct mp_map req;
	gpuq_group_begin(c, &req, "group", ops, nops, devices, n);
	if (timeout_ms)
		mp_put_u64(&req, "collective_timeout_ms", timeout_ms);
	if (hang_rank >= 0)
		mp_put_u64(&req, "inject_hang_rank", (uint64_t)hang_rank);
	mp_put_bool(&req, "wait", !detach);
	return call(c, &req, NULL, 0);
}

/* x (f32, 8 elements, seeds 21 + rank), y (24) and z (8) on each of n devices. */
static void buffers(struct gpuq_client *c, const int *devices, int n)
{
	for (int r = 0; r < n; r++) {
		coll_alloc(c, "x", devices[r], GPUQ_DTYPE_F32, 8);
		coll_alloc(c, "y", devices[r], GPUQ_DTYPE_F32, 24);
		coll_alloc(c, "z", devices[r], GPUQ_DTYPE_F32, 8);
		coll_fill(c, "x", devices[r], 21 + (uint64_t)r);
	}
}

static const struct gpuq_collective gather = { .op = "all_gather", .buffer = "x", .out = "y",
					       .root = -1 };

/* An all_gather over devices: made afresh (the last one was aborted) and right. */
static void expect_fresh_gather(struct gpuq_client *c, const int *devices, int n)
{
	static const uint64_t seeds[4] = { 21, 22, 23, 24 };
	struct gpuq_reply *r = coll_run(c, &gather, devices, n, false);
	expect_ok(r, "all_gather");
	char comm[16];
	reply_str(r, "job.result.communicator", comm, sizeof comm);
	CHECK_STR(comm, "created");
	gpuq_reply_free(r);
	struct coll_layout l = { .prim = COLL_ALL_GATHER, .nranks = n, .count = 8 };
	struct coll_bufs b = { .in = "x", .out = "y" };
	coll_check(c, &l, GPUQ_DTYPE_F32, COLL_SUM, devices, &b, seeds, 0);
}

/*
 * The reply to a waited request came after timeout_s, and not long after:
 * without the timeout it would never come (the rank hangs), so the upper
 * bound (COLL_LATE_S) leaves a loaded machine's scheduling delays room.
 */
static void expect_on_time(double took, double timeout_s, const char *what)
{
	CHECKF(took >= timeout_s - 0.05 && took < timeout_s + COLL_LATE_S,
	       "%s: the reply came %.3f s after submission (timeout %.3f s)", what, took, timeout_s);
}

/*
 * Issue 10, item 4, for a primitive that is not all-reduce and for a group:
 * every rank queued behind stalled puts (none ever starts), then one rank
 * of two; both jobs answer `timeout` at the deadline, counted from
 * submission, and the puts are still running then.
 */
TEST(queued_ranks_are_taken_back_when_the_timeout_from_submission_passes)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL); /* one job in flight: a queue stays stuck behind the stalled put */
	struct gpuq_client *c = client_open(&d);
	if (device_count(c) < 2)
		SKIP(TWO_GPUS);
	int devices[2] = { 0, 1 }, p0[2], p1[2];
	buffers(c, devices, 2);
	gpuq_reply_free(coll_run(c, &gather, devices, 2, false)); /* warm */
	do_alloc(c, "w", 0, 16);
	do_alloc(c, "w", 1, 16);
	start_stalled_put(c, "w@0", p0);
	uint64_t put1 = start_stalled_put(c, "w@1", p1);
	double t0 = coll_now();
	struct gpuq_reply *r = send_group(c, &gather, 1, devices, 2, 200, -1, false);
	expect_on_time(coll_now() - t0, 0.2, "every rank queued");
	expect_error(r, GPUQ_E_TIMEOUT, "rank 0 (device 0), rank 1 (device 1) did not arrive "
		     "within 200 ms of the job's submission (queued behind other jobs there; "
		     "taken out of the queue)");
	char state[16];
	reply_str(r, "job.state", state, sizeof state);
	CHECK_STR(state, "failed");
	gpuq_reply_free(r);
	close(p0[1]); /* device 0 free: rank 0 runs and waits for rank 1, still queued */
	struct gpuq_collective bcast = { .op = "broadcast", .buffer = "x", .root = 1 };
	struct mp_map req;
	gpuq_collective_begin(c, &req, &bcast, devices, 2);
	mp_put_u64(&req, "collective_timeout_ms", 300);
	mp_put_bool(&req, "wait", true);
	t0 = coll_now();
	r = call(c, &req, NULL, 0);
	expect_on_time(coll_now() - t0, 0.3, "rank 1 queued");
	coll_expect_error(r, GPUQ_E_TIMEOUT, "broadcast over devices 0,1: rank 1 (device 1) did not "
			  "arrive within 300 ms of the job's submission");
	coll_job_state(c, put1, state, sizeof state);
	CHECK_STR(state, "running");
	close(p1[1]);
	expect_fresh_gather(c, devices, 2);
	gpuq_close(c);
	daemon_stop(&d);
}

/* The same for a one-rank collective (not a gang): it runs on one GPU too. */
TEST(a_one_rank_collective_queued_past_its_timeout_is_taken_back)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL); /* one job in flight: a queue stays stuck behind the stalled put */
	struct gpuq_client *c = client_open(&d);
	int devices[1] = { 0 }, p[2];
	buffers(c, devices, 1);
	do_alloc(c, "w", 0, 16);
	uint64_t put = start_stalled_put(c, "w@0", p);
	struct gpuq_collective rs = { .op = "reduce_scatter", .buffer = "y", .out = "x",
				      .reduce = "avg", .root = -1, .count = 8 };
	struct mp_map req;
	gpuq_collective_begin(c, &req, &rs, devices, 1);
	mp_put_u64(&req, "collective_timeout_ms", 150);
	mp_put_bool(&req, "wait", true);
	double t0 = coll_now();
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_on_time(coll_now() - t0, 0.15, "one rank queued");
	coll_expect_error(r, GPUQ_E_TIMEOUT, "reduce_scatter over device 0: rank 0 (device 0) did "
			  "not arrive within 150 ms of the job's submission");
	char state[16];
	coll_job_state(c, put, state, sizeof state);
	CHECK_STR(state, "running");
	close(p[1]);
	r = coll_run(c, &rs, devices, 1, false); /* the device is free again: it runs */
	expect_ok(r, "reduce_scatter");
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(a_hung_rank_in_a_group_fails_it_on_time_and_the_next_one_is_fresh)
{
	fixture_daemon_binary = "tests/gpuqd-faults";
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[2], n = coll_ranks(c, 2, devices);
	buffers(c, devices, n);
	struct gpuq_collective ops[2] = {
		gather, { .op = "reduce", .buffer = "x", .out = "z", .reduce = "min", .root = n - 1 },
	};
	gpuq_reply_free(send_group(c, ops, 2, devices, n, 0, -1, false)); /* warm */
	double t0 = coll_now();
	struct gpuq_reply *r = send_group(c, ops, 2, devices, n, 300, n - 1, false);
	double took = coll_now() - t0;
	char want[64];
	snprintf(want, sizeof want, "group over device%s", n == 1 ? "" : "s");
	coll_expect_error(r, GPUQ_E_TIMEOUT, want);
	expect_on_time(took, 0.3, "a hung rank");
	expect_fresh_gather(c, devices, n); /* every rank dropped the aborted communicator */
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(cancel_stops_a_waiting_group_and_sigterm_a_waiting_sendrecv)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", "--shutdown-timeout", "200", NULL); /* one job in flight: a queue stays stuck behind the stalled put */
	struct gpuq_client *c = client_open(&d);
	if (device_count(c) < 2)
		SKIP(TWO_GPUS);
	int devices[2] = { 0, 1 }, p[2];
	buffers(c, devices, 2);
	do_alloc(c, "w", 1, 16);
	start_stalled_put(c, "w@1", p);
	struct gpuq_reply *r = send_group(c, &gather, 1, devices, 2, 0, -1, true);
	uint64_t job = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	usleep(50 * 1000); /* rank 0 waits at the rendezvous */
	struct mp_map req;
	gpuq_request_begin(c, &req, "cancel");
	mp_put_u64(&req, "job", job);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "cancel");
	gpuq_reply_free(r);
	close(p[1]);
	coll_expect_error(coll_wait(c, job, 10000), GPUQ_E_CANCELLED, "group cancelled");
	expect_fresh_gather(c, devices, 2);
	/* SIGTERM while a sendrecv's receiver is queued behind another stalled put */
	start_stalled_put(c, "w@1", p);
	struct gpuq_collective sr = { .op = "sendrecv", .src = "x@0", .dst = "y@1", .root = -1 };
	gpuq_reply_free(coll_run(c, &sr, NULL, 0, true));
	usleep(50 * 1000);
	daemon_stop(&d); /* exit status 0, socket removed; the communicators are destroyed */
	close(p[1]);
	gpuq_close(c);
}

/* The ordering test: threads with overlapping ordered sets and every primitive, all at once. */
#define ORDER_THREADS 4
#define ORDER_ROUNDS 21 /* three of each primitive */
#define ORDER_COUNT 64

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
};

static int set_size(int s)
{
	int n = 0;
	while (n < 4 && order_sets[s][n] >= 0)
		n++;
	return n;
}

static bool set_fits(int s, int ndev)
{
	for (int r = 0; r < set_size(s); r++)
		if (order_sets[s][r] >= ndev)
			return false;
	return true;
}

/* Round `round` of thread t: primitive p over set s, as a job; then its outputs checked. */
static void order_round(struct gpuq_client *c, const struct order_thread *t, int round)
{
	int s = t->sets[(round * 7 + t->id * 3) % t->nsets], n = set_size(s);
	enum coll_prim p = (enum coll_prim)((round + t->id) % COLL_PRIM_COUNT);
	const int *devices = order_sets[s];
	char in[16], out[16], src[4][64], dst[4][64];
	uint64_t seeds[4];
	snprintf(in, sizeof in, "in%d", t->id);
	snprintf(out, sizeof out, "out%d", t->id);
	for (int r = 0; r < n; r++)
		seeds[r] = 1000u * (unsigned)t->id + (unsigned)devices[r] + 1;
	struct coll_layout l[4];
	struct gpuq_collective ops[4];
	int nops = p == COLL_SENDRECV ? n : 1; /* sendrecv: a ring, as one group */
	for (int k = 0; k < nops; k++) {
		l[k] = (struct coll_layout){ .prim = p, .nranks = n, .count = ORDER_COUNT,
					     .root = p == COLL_SENDRECV ? k : round % n,
					     .peer = (k + 1) % n };
		ops[k] = (struct gpuq_collective){ .op = coll_prim_name(p), .buffer = in, .out = out,
						   .count = ORDER_COUNT, .root = -1 };
		if (coll_prim_has_root(p))
			ops[k].root = l[k].root;
		if (p == COLL_SENDRECV) {
			coll_range(src[k], sizeof src[k], in, devices[k], 0, ORDER_COUNT, 8);
			coll_range(dst[k], sizeof dst[k], out, devices[l[k].peer], 0, ORDER_COUNT, 8);
			ops[k] = (struct gpuq_collective){ .op = "sendrecv", .src = src[k],
							   .dst = dst[k], .root = -1 };
		}
	}
	struct gpuq_reply *r = nops == 1 ? coll_run(c, &ops[0], devices, n, false)
					 : coll_run_group(c, ops, nops, devices, n);
	expect_ok(r, coll_prim_name(p));
	gpuq_reply_free(r);
	struct coll_bufs b = { .in = in, .out = out };
	for (int k = 0; k < nops; k++)
		coll_check(c, &l[k], GPUQ_DTYPE_I64, COLL_SUM, devices, &b, seeds, 0);
}

static void *order_client(void *arg)
{
	struct order_thread *t = arg;
	struct gpuq_client *c = client_open(t->d);
	for (int round = 0; round < ORDER_ROUNDS; round++)
		order_round(c, t, round);
	gpuq_close(c);
	return NULL;
}

TEST(overlapping_collectives_of_every_kind_from_many_clients_never_cross)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-devices", "4", "--collective-timeout", "20000", NULL);
	struct gpuq_client *c = client_open(&d);
	int ndev = device_count(c) < 4 ? device_count(c) : 4;
	if (ndev < 2)
		SKIP(TWO_GPUS);
	struct order_thread th[ORDER_THREADS];
	pthread_t tid[ORDER_THREADS];
	for (int t = 0; t < ORDER_THREADS; t++) {
		char in[16], out[16];
		snprintf(in, sizeof in, "in%d", t);
		snprintf(out, sizeof out, "out%d", t);
		th[t] = (struct order_thread){ .d = &d, .id = t };
		for (int s = 0; s < ORDER_NSETS; s++)
			if (set_fits(s, ndev))
				th[t].sets[th[t].nsets++] = s;
		for (int dev = 0; dev < ndev; dev++) {
			coll_alloc(c, in, dev, GPUQ_DTYPE_I64, 4 * ORDER_COUNT);
			coll_alloc(c, out, dev, GPUQ_DTYPE_I64, 4 * ORDER_COUNT);
			coll_fill(c, in, dev, 1000u * (unsigned)t + (unsigned)dev + 1);
		}
	}
	for (int t = 0; t < ORDER_THREADS; t++)
		CHECK(pthread_create(&tid[t], NULL, order_client, &th[t]) == 0);
	for (int t = 0; t < ORDER_THREADS; t++)
		pthread_join(tid[t], NULL);
	gpuq_close(c);
	daemon_stop(&d);
}
