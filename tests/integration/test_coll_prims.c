/*
 * NCCL's primitives against the reference (protocol/collective_layout.h):
 * every primitive x dtype x op once, the device count (2, 3, 4), the
 * placement (in and out of place), the root and the count (odd, and 1)
 * rotating among the combinations so that each primitive meets each of
 * them; sendrecv between ranges; the counts that default from the buffers;
 * all-to-all as one op and as a group of n x n sendrecvs; a group of mixed
 * primitives; and the refusals, each before any rank starts.
 *
 * On the CUDA tier the same tests run with the GPUs there are (one rank on
 * a one-GPU machine); those that need more devices say so and skip.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/integration/coll_util.h"

#define MAX_COUNT 37
#define SLACK 3 /* elements past what any combination writes: must stay untouched */
#define REST_SEED 0xAB

static const uint64_t counts[] = { MAX_COUNT, 7, 1 };

struct combo {
	enum coll_prim prim;
	enum gpuq_dtype dtype;
	enum coll_op op;
};

/* Every primitive x dtype (bytes too, where nothing is reduced) x op (where it reduces). */
static int all_combos(struct combo *out)
{
	int n = 0;
	for (int p = 0; p < COLL_PRIM_COUNT; p++) {
		bool reduces = coll_prim_reduces((enum coll_prim)p);
		for (int t = reduces ? 0 : -1; t < 7; t++) {
			enum gpuq_dtype dtype = t < 0 ? GPUQ_DTYPE_BYTES : coll_typed_dtypes[t];
			for (int op = COLL_SUM; op <= (reduces ? COLL_AVG : COLL_SUM); op++)
				out[n++] = (struct combo){ (enum coll_prim)p, dtype, (enum coll_op)op };
		}
	}
	return n;
}

/* The request and the layout of combination k over n ranks. */
static void plan(const struct combo *cb, int k, int n, const int *devices,
		 struct gpuq_collective *op, struct coll_layout *l, struct coll_bufs *b,
		 char *src, char *dst, size_t size)
{
	bool place = cb->prim != COLL_SENDRECV && cb->prim != COLL_ALL_TO_ALL;
	bool in_place = place && (k / 3) % 2 == 1;
	*l = (struct coll_layout){ .prim = cb->prim, .nranks = n, .count = counts[(k / 6) % 3],
				   .root = (k / 3) % n };
	l->peer = (l->root + 1) % n;
	*op = (struct gpuq_collective){ .op = coll_prim_name(cb->prim), .root = -1,
					.count = l->count };
	*b = (struct coll_bufs){ .in = "a", .out = in_place ? NULL : "b" };
	if (cb->prim == COLL_SENDRECV) {
		size_t elt = gpuq_dtype_size(cb->dtype);
		b->in_at = 3;
		b->out_at = 5;
		coll_range(src, size, "a", devices[l->root], b->in_at, l->count, elt);
		coll_range(dst, size, "b", devices[l->peer], b->out_at, l->count, elt);
		op->src = src;
		op->dst = dst;
		return;
	}
	op->buffer = "a";
	op->out = b->out;
	if (coll_prim_reduces(cb->prim))
		op->reduce = coll_op_name(cb->op);
	if (coll_prim_has_root(cb->prim))
		op->root = l->root;
}

static void run_combo(struct gpuq_client *c, const struct combo *cb, int k, int n,
		      const int *devices)
{
	struct gpuq_collective op;
	struct coll_layout l;
	struct coll_bufs b;
	char src[96], dst[96];
	uint64_t seeds[4];
	plan(cb, k, n, devices, &op, &l, &b, src, dst, sizeof src);
	for (int r = 0; r < n; r++) {
		seeds[r] = 1000u * (unsigned)k + (unsigned)r + 1;
		coll_fill(c, "a", devices[r], seeds[r]);
		coll_fill(c, "b", devices[r], REST_SEED);
	}
	struct gpuq_reply *reply = coll_run(c, &op, devices, n, false);
	expect_ok(reply, op.op);
	CHECK_EQ(reply_u64(reply, "job.result.count"), l.count);
	gpuq_reply_free(reply);
	coll_check(c, &l, cb->dtype, cb->op, devices, &b, seeds, REST_SEED);
}

/* The combinations k with k % 3 == which, over `want` devices (fewer where there are fewer). */
static void run_share(int want, int which)
{
	char hosts[8];
	snprintf(hosts, sizeof hosts, "%d", want);
	struct daemon_proc d;
	daemon_start(&d, "--host-devices", hosts, NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[4], n = coll_ranks(c, want, devices);
	struct combo combos[160];
	int ncombos = all_combos(combos);
	enum gpuq_dtype allocated = GPUQ_DTYPE_COUNT;
	for (int k = which; k < ncombos; k += 3) {
		if (combos[k].dtype != allocated) { /* one pair of buffers per dtype */
			for (int r = 0; r < n && allocated != GPUQ_DTYPE_COUNT; r++) {
				coll_free(c, "a", devices[r]);
				coll_free(c, "b", devices[r]);
			}
			allocated = combos[k].dtype;
			for (int r = 0; r < n; r++) {
				coll_alloc(c, "a", devices[r], allocated, 4 * MAX_COUNT + SLACK);
				coll_alloc(c, "b", devices[r], allocated, 4 * MAX_COUNT + SLACK);
			}
		}
		run_combo(c, &combos[k], k, n, devices);
	}
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(collectives_match_the_reference_on_2_devices)
{
	run_share(2, 0);
}

TEST(collectives_match_the_reference_on_3_devices)
{
	run_share(3, 1);
}

TEST(collectives_match_the_reference_on_4_devices)
{
	run_share(4, 2);
}

/* The combination list itself: every primitive meets every device count and placement. */
TEST(collective_combinations_cover_each_primitive_everywhere)
{
	struct combo combos[160];
	int n = all_combos(combos);
	CHECK_EQ(n, 3 * 7 * 5 + 4 * 8);
	for (int p = 0; p < COLL_PRIM_COUNT; p++) {
		bool seen[3][2] = { { false } };
		for (int k = 0; k < n; k++)
			if (combos[k].prim == (enum coll_prim)p)
				seen[k % 3][(k / 3) % 2] = true;
		for (int i = 0; i < 6; i++)
			CHECKF(seen[i / 2][i % 2], "%s never runs on %d devices %s place",
			       coll_prim_name((enum coll_prim)p), 2 + i / 2, i % 2 ? "in" : "out of");
	}
}

static struct gpuq_reply *run_named(struct gpuq_client *c, const char *op, const char *buffer,
				    const char *out, int root, uint64_t count, const int *devices,
				    int n)
{
	struct gpuq_collective g = { .op = op, .buffer = buffer, .out = out, .root = root,
				     .count = count };
	return coll_run(c, &g, devices, n, false);
}

/* Counts default from the buffers as NCCL's definitions say; devices from who holds them. */
TEST(collective_counts_and_devices_default_from_the_buffers)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-devices", "3", NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[3], n = coll_ranks(c, 3, devices);
	uint64_t seeds[3] = { 7, 8, 9 };
	for (int r = 0; r < n; r++) {
		coll_alloc(c, "v", devices[r], GPUQ_DTYPE_I32, 3 * 11 + 1); /* not a multiple of n */
		coll_alloc(c, "w", devices[r], GPUQ_DTYPE_I32, 3 * 11 + 1);
		coll_fill(c, "v", devices[r], seeds[r]);
	}
	struct gpuq_reply *r = run_named(c, "reduce_scatter", "v", "w", -1, 0, devices, n);
	expect_ok(r, "reduce_scatter");
	CHECK_EQ(reply_u64(r, "job.result.count"), (3 * 11 + 1) / (uint64_t)n);
	gpuq_reply_free(r);
	r = run_named(c, "all_gather", "v", NULL, -1, 0, devices, n); /* in place: count / n */
	expect_ok(r, "all_gather in place");
	uint64_t ag = reply_u64(r, "job.result.count");
	CHECK_EQ(ag, (3 * 11 + 1) / (uint64_t)n);
	CHECK(reply_path(r, "job.result.in_place")->via.boolean);
	gpuq_reply_free(r);
	struct coll_layout l = { .prim = COLL_ALL_GATHER, .nranks = n, .count = ag };
	struct coll_bufs b = { .in = "v" };
	coll_check(c, &l, GPUQ_DTYPE_I32, COLL_SUM, devices, &b, seeds, 0);
	/* broadcast out of place: only the root needs the input, and `out` says where */
	coll_alloc(c, "src", devices[n - 1], GPUQ_DTYPE_I32, 5);
	coll_fill(c, "src", devices[n - 1], 99);
	r = run_named(c, "broadcast", "src", "w", n - 1, 0, NULL, 0);
	expect_ok(r, "broadcast without devices");
	CHECK_EQ(reply_u64(r, "job.result.count"), 5);
	CHECK_EQ(reply_path(r, "job.result.devices")->via.array.size, n);
	CHECK_EQ(reply_u64(r, "job.result.root_device"), devices[n - 1]);
	gpuq_reply_free(r);
	uint64_t bseeds[3] = { 99, 99, 99 };
	l = (struct coll_layout){ .prim = COLL_BROADCAST, .nranks = n, .count = 5, .root = n - 1 };
	struct coll_bufs bb = { .in = "src", .out = "w" };
	coll_check(c, &l, GPUQ_DTYPE_I32, COLL_SUM, devices, &bb, bseeds, 0);
	/* sendrecv's count is its source range's */
	char src[64], dst[64];
	coll_range(src, sizeof src, "v", devices[0], 2, 6, 4);
	coll_range(dst, sizeof dst, "w", devices[n - 1], 1, 9, 4);
	struct gpuq_collective sr = { .op = "sendrecv", .src = src, .dst = dst, .root = -1 };
	r = coll_run(c, &sr, NULL, 0, false);
	expect_ok(r, "sendrecv");
	CHECK_EQ(reply_u64(r, "job.result.count"), 6);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

/* One all_to_all, and the same exchange as a group of n x n sendrecvs: both are the reference's. */
TEST(all_to_all_as_one_op_and_as_a_group_of_sendrecvs)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-devices", "4", NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[4], n = coll_ranks(c, 4, devices);
	const uint64_t count = 5;
	uint64_t seeds[4] = { 41, 42, 43, 44 };
	for (int r = 0; r < n; r++) {
		coll_alloc(c, "in", devices[r], GPUQ_DTYPE_BF16, (uint64_t)n * count);
		coll_alloc(c, "out", devices[r], GPUQ_DTYPE_BF16, (uint64_t)n * count);
		coll_fill(c, "in", devices[r], seeds[r]);
	}
	struct coll_layout l = { .prim = COLL_ALL_TO_ALL, .nranks = n, .count = count };
	struct coll_bufs b = { .in = "in", .out = "out" };
	struct gpuq_reply *r = run_named(c, "all_to_all", "in", "out", -1, 0, devices, n);
	expect_ok(r, "all_to_all");
	CHECK_EQ(reply_u64(r, "job.result.count"), count);
	gpuq_reply_free(r);
	coll_check(c, &l, GPUQ_DTYPE_BF16, COLL_SUM, devices, &b, seeds, 0);
	for (int rank = 0; rank < n; rank++)
		coll_fill(c, "out", devices[rank], REST_SEED);
	struct gpuq_collective ops[16];
	char src[16][64], dst[16][64];
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < n; j++) { /* block j of rank i to block i of rank j */
			int k = i * n + j;
			coll_range(src[k], sizeof src[k], "in", devices[i], (uint64_t)j * count, count, 2);
			coll_range(dst[k], sizeof dst[k], "out", devices[j], (uint64_t)i * count, count, 2);
			ops[k] = (struct gpuq_collective){ .op = "sendrecv", .src = src[k],
							   .dst = dst[k], .root = -1 };
		}
	}
	r = coll_run_group(c, ops, n * n, devices, n);
	expect_ok(r, "a group of sendrecvs");
	CHECK_EQ(reply_path(r, "job.result.ops")->via.array.size, n * n);
	char what[16];
	reply_str(r, "job.result.collective", what, sizeof what);
	CHECK_STR(what, "group");
	gpuq_reply_free(r);
	coll_check(c, &l, GPUQ_DTYPE_BF16, COLL_SUM, devices, &b, seeds, 0);
	gpuq_close(c);
	daemon_stop(&d);
}

/* Several primitives of different dtypes in one group: one job, each result right. */
TEST(group_of_mixed_collectives_runs_as_one_job)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-devices", "3", NULL);
	struct gpuq_client *c = client_open(&d);
	int devices[3], n = coll_ranks(c, 3, devices);
	uint64_t s1[3] = { 1, 2, 3 }, s2[3] = { 4, 5, 6 }, s3[3] = { 7, 8, 9 };
	for (int r = 0; r < n; r++) {
		coll_alloc(c, "g", devices[r], GPUQ_DTYPE_F32, 64);
		coll_alloc(c, "shard", devices[r], GPUQ_DTYPE_F64, 9);
		coll_alloc(c, "full", devices[r], GPUQ_DTYPE_F64, 27);
		coll_alloc(c, "w", devices[r], GPUQ_DTYPE_I64, 33);
		coll_fill(c, "g", devices[r], s1[r]);
		coll_fill(c, "shard", devices[r], s2[r]);
		coll_fill(c, "w", devices[r], s3[r]);
	}
	int root = n - 1;
	struct gpuq_collective ops[3] = {
		{ .op = "allreduce", .buffer = "g", .reduce = "max", .root = -1 },
		{ .op = "all_gather", .buffer = "shard", .out = "full", .root = -1 },
		{ .op = "reduce", .buffer = "w", .reduce = "prod", .root = root },
	};
	struct gpuq_reply *r = coll_run_group(c, ops, 3, devices, n);
	expect_ok(r, "group");
	if (n > 1) /* a gang: the record names its devices */
		CHECK_EQ(reply_path(r, "job.devices")->via.array.size, n);
	gpuq_reply_free(r);
	struct coll_layout l1 = { .prim = COLL_ALLREDUCE, .nranks = n, .count = 64 };
	struct coll_layout l2 = { .prim = COLL_ALL_GATHER, .nranks = n, .count = 9 };
	struct coll_layout l3 = { .prim = COLL_REDUCE, .nranks = n, .count = 33, .root = root };
	struct coll_bufs b1 = { .in = "g" }, b2 = { .in = "shard", .out = "full" }, b3 = { .in = "w" };
	coll_check(c, &l1, GPUQ_DTYPE_F32, COLL_MAX, devices, &b1, s1, 0);
	coll_check(c, &l2, GPUQ_DTYPE_F64, COLL_SUM, devices, &b2, s2, 0);
	coll_check(c, &l3, GPUQ_DTYPE_I64, COLL_PROD, devices, &b3, s3, 0);
	gpuq_close(c);
	daemon_stop(&d);
}

/* A group over devices 0 and 1 (or, without devices, none named). */
static struct gpuq_reply *group_of(struct gpuq_client *c, const struct gpuq_collective *ops,
				   int nops, bool devices)
{
	struct mp_map req;
	int devs[2] = { 0, 1 };
	gpuq_group_begin(c, &req, "group", ops, nops, devs, devices ? 2 : 0);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

/* Every refusal names the thing and comes before any rank starts; nothing is held after. */
TEST(collective_refusals_name_the_buffer_and_what_it_lacks)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	if (device_count(c) < 2)
		SKIP("needs two devices (the host backend has them; a multi-GPU machine such as "
		     "nvidia-h200-x2 for the CUDA tier)");
	int devices[2] = { 0, 1 };
	for (int r = 0; r < 2; r++) {
		coll_alloc(c, "a", r, GPUQ_DTYPE_F32, 10);
		coll_alloc(c, "b", r, GPUQ_DTYPE_F32, 15);
	}
	coll_alloc(c, "h", 1, GPUQ_DTYPE_F16, 10);
	do_alloc(c, "raw", 0, 64);
	do_alloc(c, "raw", 1, 64);
	coll_expect_error(run_named(c, "all_gather", "a", "b", -1, 0, devices, 2), GPUQ_E_BAD_REQUEST,
			  "buffer 'b@0' (rank 0's output) holds 15 f32 elements, but all_gather of "
			  "count 10 over 2 ranks needs 20 there: 5 too few");
	coll_expect_error(run_named(c, "reduce_scatter", "a", "b", -1, 6, devices, 2),
			  GPUQ_E_BAD_REQUEST, "'a@0' (rank 0's input) holds 10 f32 elements, but "
			  "reduce_scatter of count 6 over 2 ranks needs 12 there: 2 too few");
	coll_expect_error(run_named(c, "all_gather", "b", NULL, -1, 8, devices, 2), GPUQ_E_BAD_REQUEST,
			  "(rank 0's input and output, in place) holds 15 f32 elements, but "
			  "all_gather of count 8 over 2 ranks needs 16 there: 1 too few");
	coll_expect_error(run_named(c, "broadcast", "a", NULL, 2, 0, devices, 2), GPUQ_E_BAD_REQUEST,
			  "field 'root': rank 2, but there are 2 ranks (0-1)");
	coll_expect_error(run_named(c, "all_to_all", "a", NULL, -1, 0, devices, 2),
			  GPUQ_E_BAD_REQUEST, "all_to_all cannot run in place");
	coll_expect_error(run_named(c, "reduce_scatter", "raw", NULL, -1, 0, devices, 2),
			  GPUQ_E_BAD_REQUEST, "'raw@0' is untyped (bytes); reduce_scatter reduces");
	struct gpuq_reply *r = run_named(c, "all_gather", "raw", NULL, -1, 0, devices, 2);
	expect_ok(r, "all_gather moves bytes");
	gpuq_reply_free(r);
	struct gpuq_collective sr = { .op = "sendrecv", .src = "a@0[2:10]", .dst = "b@1", .root = -1 };
	coll_expect_error(coll_run(c, &sr, NULL, 0, false), GPUQ_E_BAD_REQUEST,
			  "field 'src': the range [2:10] of 'a@0' is not whole f32 elements");
	sr.src = "a@0";
	sr.dst = "h@1";
	coll_expect_error(coll_run(c, &sr, NULL, 0, false), GPUQ_E_BAD_REQUEST,
			  "src 'a@0' is f32 but dst 'h@1' is f16");
	sr.dst = "a@1[8:]";
	coll_expect_error(coll_run(c, &sr, NULL, 0, false), GPUQ_E_BAD_REQUEST,
			  "dst: the range of 'a@1' holds 8 f32 elements, but sendrecv of count 10 "
			  "needs 10 there: 2 too few");
	sr.dst = "a@0[4:]";
	sr.count = 2;
	coll_expect_error(coll_run(c, &sr, NULL, 0, false), GPUQ_E_BAD_REQUEST,
			  "src and dst overlap in 'a@0'");
	sr.dst = "b@1";
	int only0[1] = { 0 };
	coll_expect_error(coll_run(c, &sr, only0, 1, false), GPUQ_E_BAD_REQUEST,
			  "dst 'b@1' is on device 1, which is not one of the ranks");
	struct gpuq_collective two[2] = {
		{ .op = "all_gather", .buffer = "a", .out = "b", .count = 5, .root = -1 },
		{ .op = "sendrecv", .src = "a@0", .dst = "b@1[20:]", .count = 2, .root = -1 },
	};
	coll_expect_error(group_of(c, two, 2, true), GPUQ_E_BAD_REQUEST,
			  "writes bytes 0-40 of 'b@1', which ops[1] (sendrecv) also writes");
	coll_expect_error(group_of(c, two, 2, false), GPUQ_E_BAD_REQUEST,
			  "field 'devices' (the ranks, in order) is required");
	two[1].op = "scatter";
	coll_expect_error(group_of(c, two, 2, true), GPUQ_E_BAD_REQUEST,
			  "ops[1]: 'op' 'scatter' is not one of allreduce, reduce_scatter");
	two[1] = (struct gpuq_collective){ .op = "broadcast", .buffer = "a", .root = 5 };
	coll_expect_error(group_of(c, two, 2, true), GPUQ_E_BAD_REQUEST,
			  "ops[1] (broadcast): field 'root': rank 5");
	coll_expect_error(group_of(c, two, 0, true), GPUQ_E_BAD_REQUEST,
			  "field 'ops': 0 collectives; a group holds 1 to 64");
	/* nothing was held: every buffer frees */
	for (int dev = 0; dev < 2; dev++) {
		coll_free(c, "a", dev);
		coll_free(c, "b", dev);
	}
	gpuq_close(c);
	daemon_stop(&d);
}
