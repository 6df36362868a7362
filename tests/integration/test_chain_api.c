/*
 * Kernel chains, the interface: refused requests naming the op and its
 * position, the plan cache as `stats` counts it (a cached chain's second run
 * never instantiates; other buffers update; the cache is bounded), the stats
 * op, and the gpuq commands run, stats and bench chain. Both tiers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/integration/chain_util.h"

static void expect(struct gpuq_reply *r, enum gpuq_errc code, const char *contains)
{
	expect_error(r, code, contains);
	gpuq_reply_free(r);
}

/* A run request whose ops field is given whole (NULL: absent). */
static struct gpuq_reply *run_raw(struct gpuq_client *c, const char *buffer, struct mp_array *ops)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "run");
	mp_put_str(&req, "buffer", buffer);
	if (ops)
		mp_put_array(&req, "ops", ops);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

static void check_op_errors(struct gpuq_client *c)
{
	expect(run_chain(c, "x", "sin | frob 2", NULL, 0, NULL), GPUQ_E_BAD_REQUEST,
	       "op 2: unknown op 'frob'");
	expect(run_chain(c, "x", "add", NULL, 0, NULL), GPUQ_E_BAD_REQUEST,
	       "op 1 'add' takes 1 argument");
	expect(run_chain(c, "x", "sqrt | sin 3", NULL, 0, NULL), GPUQ_E_BAD_REQUEST,
	       "op 2 'sin' takes 0 arguments");
	expect(run_chain(c, "x", "abs | abs | clamp 1", NULL, 0, NULL), GPUQ_E_BAD_REQUEST,
	       "op 3 'clamp' takes 2 arguments");
	expect(run_chain(c, "x", "fma 1 2 3", NULL, 0, NULL), GPUQ_E_BAD_REQUEST,
	       "op 1 'fma' takes 2 arguments");
	struct mp_array ops, op;
	mp_array_init(&ops);
	mp_array_init(&op);
	mp_array_str(&op, "mul");
	mp_array_str(&op, "two");
	mp_array_array(&ops, &op);
	expect(run_raw(c, "x", &ops), GPUQ_E_BAD_REQUEST, "op 1 'mul': argument 1 is not a number");
	mp_array_init(&ops);
	mp_array_u64(&ops, 7);
	expect(run_raw(c, "x", &ops), GPUQ_E_BAD_REQUEST, "op 1: expected");
	mp_array_init(&ops);
	expect(run_raw(c, "x", &ops), GPUQ_E_BAD_REQUEST, "'ops' has 0 ops");
	mp_array_init(&ops);
	for (int i = 0; i < 65; i++) {
		mp_array_init(&op);
		mp_array_str(&op, "abs");
		mp_array_array(&ops, &op);
	}
	expect(run_raw(c, "x", &ops), GPUQ_E_BAD_REQUEST, "1 to 64");
	expect(run_raw(c, "x", NULL), GPUQ_E_BAD_REQUEST, "'ops'");
}

static void check_field_errors(struct gpuq_client *c)
{
	expect(run_chain(c, "x", "sin", "turbo", 0, NULL), GPUQ_E_BAD_REQUEST, "'turbo'");
	struct mp_map req;
	struct mp_array ops, op;
	mp_array_init(&ops);
	mp_array_init(&op);
	mp_array_str(&op, "sin");
	mp_array_array(&ops, &op);
	gpuq_request_begin(c, &req, "run");
	mp_put_str(&req, "buffer", "x");
	mp_put_array(&req, "ops", &ops);
	mp_put_str(&req, "repeat", "many");
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "'repeat'");
	expect(run_chain(c, "x", "sin", NULL, 2000000, NULL), GPUQ_E_BAD_REQUEST, "'repeat'");
	expect(run_chain(c, "x", "sin", "graph", 70000, NULL), GPUQ_E_BAD_REQUEST, "65536");
	expect(run_chain(c, "nothere", "sin", NULL, 0, NULL), GPUQ_E_NOT_FOUND, "nothere");
	expect(run_chain(c, "x", "sin", NULL, 0, "nothere"), GPUQ_E_NOT_FOUND, "nothere");
	expect(run_chain(c, "ints", "sin | cos", NULL, 0, NULL), GPUQ_E_BAD_REQUEST,
	       "op 1 'sin': dtype i32 is not supported");
	expect(run_chain(c, "raw", "neg", NULL, 0, NULL), GPUQ_E_BAD_REQUEST,
	       "op 1 'neg': dtype bytes is not supported");
	expect(run_chain(c, "x", "sin", NULL, 0, "short"), GPUQ_E_BAD_REQUEST, "same shape");
	expect(run_chain(c, "x", "sin", NULL, 0, "halves"), GPUQ_E_BAD_REQUEST, "same shape");
}

TEST(chain_refusals_name_the_op_and_position)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	talloc(c, "x", &tdtype_f32, 100, 0);
	talloc(c, "short", &tdtype_f32, 99, 0);
	talloc(c, "halves", &tdtype_f16, 100, 0);
	talloc(c, "ints", &(struct tdtype){ "i32", GPUQ_DTYPE_I32, 4, 0, 0 }, 100, 0);
	do_alloc(c, "raw", 0, 400);
	check_op_errors(c);
	check_field_errors(c);
	if (device_count(c) > 1) {
		talloc(c, "far", &tdtype_f32, 100, 1);
		expect(run_chain(c, "x", "sin", NULL, 0, "far@1"), GPUQ_E_BAD_REQUEST, "one device");
	}
	/* Nothing ran, and the connection still works: the map form of an op too. */
	CHECK_EQ(chain_stat(c, 0, "runs"), 0);
	struct mp_array ops;
	struct mp_map op, req;
	struct mp_array args;
	mp_array_init(&ops);
	mp_map_init(&op);
	mp_array_init(&args);
	mp_array_f64(&args, 2);
	mp_put_str(&op, "op", "mul");
	mp_put_array(&op, "args", &args);
	mp_array_map(&ops, &op);
	gpuq_request_begin(c, &req, "run");
	mp_put_str(&req, "buffer", "x");
	mp_put_array(&req, "ops", &ops);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "run with {op, args}");
	CHECK(!reply_path(r, "job.result.out")); /* in place */
	gpuq_reply_free(r);
	CHECK_EQ(chain_stat(c, 0, "runs"), 1);
	/* Naming the input as out is running in place. */
	r = run_chain(c, "x", "neg", NULL, 0, "x@0");
	expect_ok(r, "run with out = the input");
	CHECK(!reply_path(r, "job.result.out"));
	gpuq_reply_free(r);
	do_free(c, "x"); /* held once, released once */
	gpuq_close(c);
	daemon_stop(&d);
}

struct cache_counts {
	uint64_t hits, misses, updates, inst, evict, entries;
};

static void counts(struct gpuq_client *c, struct cache_counts *k)
{
	k->hits = chain_stat(c, 0, "graph_hits");
	k->misses = chain_stat(c, 0, "graph_misses");
	k->updates = chain_stat(c, 0, "graph_updates");
	k->inst = chain_stat(c, 0, "graph_instantiations");
	k->evict = chain_stat(c, 0, "graph_evictions");
	k->entries = chain_stat(c, 0, "graph_entries");
}

#define EXPECT_COUNTS(c, h, m, u, i, e, n)                                                     \
	do {                                                                                   \
		struct cache_counts k_;                                                        \
		counts((c), &k_);                                                              \
		CHECKF(k_.hits == (h) && k_.misses == (m) && k_.updates == (u) &&                  \
			       k_.inst == (i) && k_.evict == (e) && k_.entries == (n),             \
		       "cache: hits %llu misses %llu updates %llu instantiations %llu "            \
		       "evictions %llu entries %llu; expected %d %d %d %d %d %d",                  \
		       (unsigned long long)k_.hits, (unsigned long long)k_.misses,                 \
		       (unsigned long long)k_.updates, (unsigned long long)k_.inst,                \
		       (unsigned long long)k_.evict, (unsigned long long)k_.entries, h, m, u, i,   \
		       e, n);                                                                      \
	} while (0)

TEST(chain_cache_hits_updates_and_evicts)
{
	struct daemon_proc d;
	daemon_start(&d, "--graph-cache", "2", NULL);
	struct gpuq_client *c = client_open(&d);
	talloc(c, "a", &tdtype_f32, 5000, 0);
	talloc(c, "b", &tdtype_f32, 5000, 0);
	talloc(c, "c", &tdtype_f32, 6000, 0);
	do_fill_random(c, "a", 1);
	do_fill_random(c, "b", 2);
	EXPECT_COUNTS(c, 0, 0, 0, 0, 0, 0);
	run_ok(c, "a", "sin | add 1", "graph", 0, NULL);
	EXPECT_COUNTS(c, 0, 1, 0, 1, 0, 1);
	/* A cached chain's second run replays it: no instantiation. */
	run_ok(c, "a", "sin | add 1", "graph", 0, NULL);
	EXPECT_COUNTS(c, 1, 1, 0, 1, 0, 1);
	/* Only the buffers differ: the graph is updated, not instantiated again. */
	run_ok(c, "b", "sin | add 1", "graph", 0, NULL);
	EXPECT_COUNTS(c, 1, 1, 1, 1, 0, 1);
	run_ok(c, "a", "sin | add 1", "graph", 0, "b");
	EXPECT_COUNTS(c, 1, 1, 2, 1, 0, 1);
	run_ok(c, "a", "sin | add 1", "graph", 0, "b");
	EXPECT_COUNTS(c, 2, 1, 2, 1, 0, 1);
	/* Eager runs use no graph. */
	run_ok(c, "a", "sin | add 1", "eager", 0, NULL);
	EXPECT_COUNTS(c, 2, 1, 2, 1, 0, 1);
	/* The mode, a constant, the count and the repeat are all part of the key. */
	run_ok(c, "a", "sin | add 1", "fused", 0, NULL);
	EXPECT_COUNTS(c, 2, 2, 2, 2, 0, 2);
	run_ok(c, "a", "sin | add 2", "graph", 0, NULL);
	EXPECT_COUNTS(c, 2, 3, 2, 3, 1, 2);
	run_ok(c, "c", "sin | add 2", "graph", 0, NULL);
	EXPECT_COUNTS(c, 2, 4, 2, 4, 2, 2);
	run_ok(c, "c", "sin | add 2", "graph", 2, NULL);
	EXPECT_COUNTS(c, 2, 5, 2, 5, 3, 2);
	/* The least recently used went first: 'sin | add 2' on c (repeat 1) is still there. */
	run_ok(c, "c", "sin | add 2", "graph", 0, NULL);
	EXPECT_COUNTS(c, 3, 5, 2, 5, 3, 2);
	CHECK_EQ(chain_stat(c, 0, "runs"), 11);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(chain_stats_reports_every_device)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	talloc(c, "s", &tdtype_f32, 64, 0);
	run_ok(c, "s", "abs | neg | relu", "graph", 4, NULL);
	struct mp_map req;
	gpuq_request_begin(c, &req, "stats");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "stats");
	const msgpack_object *devs = reply_path(r, "devices");
	CHECK(devs && devs->type == MSGPACK_OBJECT_ARRAY);
	CHECK_EQ(devs->via.array.size, device_count(c));
	const msgpack_object *d0 = &devs->via.array.ptr[0];
	const char *keys[] = { "runs", "kernels", "graph_hits", "graph_misses", "graph_updates",
			       "graph_instantiations", "graph_evictions", "graph_entries",
			       "graph_capacity" };
	for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
		CHECKF(msg_map_get(msg_map_get(d0, "chain"), keys[k]), "stats lacks chain.%s", keys[k]);
	CHECK(msg_map_get(msg_map_get(d0, "counters"), "jobs"));
	gpuq_reply_free(r);
	CHECK_EQ(chain_stat(c, 0, "kernels"), 12);
	CHECK_EQ(chain_stat(c, 0, "graph_capacity"), 64);
	gpuq_request_begin(c, &req, "stats");
	mp_put_u64(&req, "device", 99);
	expect(call(c, &req, NULL, 0), GPUQ_E_NOT_FOUND, "device 99");
	gpuq_close(c);
	daemon_stop(&d);
}

/* Runs gpuq with args against d; returns its exit status and output (the caller frees). */
static int gpuq_cli(const struct daemon_proc *d, const char *args, char **out)
{
	const char *build = getenv("GPUQ_BUILD");
	char cmd[1024];
	size_t cap = 1 << 16, n = 0;
	snprintf(cmd, sizeof cmd, "%s/gpuq --socket %s %s 2>&1", build && *build ? build : "build",
		 d->sock, args);
	FILE *p = popen(cmd, "r");
	CHECK(p);
	*out = calloc(1, cap);
	CHECK(*out);
	size_t got;
	while ((got = fread(*out + n, 1, cap - 1 - n, p)) > 0)
		n += got;
	int status = pclose(p);
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void expect_cli(const struct daemon_proc *d, const char *args, int code, const char *want)
{
	char *out;
	int rc = gpuq_cli(d, args, &out);
	CHECKF(rc == code && strstr(out, want), "gpuq %s: exit %d (want %d), output lacks '%s':\n%s",
	       args, rc, code, want, out);
	free(out);
}

/* The host backend says it evaluated a fused run itself; CUDA, whose kernel ran, leaves that out. */
static void expect_evaluated(struct gpuq_reply *r, const char *what)
{
	const msgpack_object *o = reply_path(r, "job.result.evaluated");
	if (test_backend_is_cuda())
		CHECKF(!o, "%s on CUDA: a result field 'evaluated', where the kernel itself ran", what);
	else
		CHECKF(o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == 4 &&
			       memcmp(o->via.str.ptr, "host", 4) == 0,
		       "%s on the host backend: no result field 'evaluated' of 'host'", what);
	gpuq_reply_free(r);
}

TEST(chain_result_says_whether_the_host_evaluated_it)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	talloc(c, "x", &tdtype_f32, 4096, 0);
	talloc(c, "y", &tdtype_f32, 4096, 0);
	expect_evaluated(expr_ok(c, "y = x * 2 + 1", &o), "run");
	o.kernel = "interpreted";
	expect_evaluated(expr_ok(c, "y = x * 2 + 1", &o), "run --kernel interpreted");
	o.kernel = NULL;
	struct gpuq_reply *r = expr_call(c, "reduce_expr", "sum(x)", &o);
	expect_ok(r, "reduce_expr");
	expect_evaluated(r, "reduce");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(chain_cli_run_stats_and_bench)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	talloc(c, "w", &tdtype_f32, 4096, 0);
	talloc(c, "v", &tdtype_f32, 4096, 0);
	expect_cli(&d, "run w 'sin | add 1 | clamp 0 1'", 0, "3 ops x1 on 4096 x f32, fused");
	expect_cli(&d, "run w 'sqrt' --mode graph --repeat 3 --out v", 0, "w@0 -> v@0");
	expect_cli(&d, "run w 'sin | | cos'", 2, "op 2 of the chain is empty");
	expect_cli(&d, "run w 'add one'", 2, "'one' is not a number");
	expect_cli(&d, "run w 'sin | tanh 2'", 1, "op 2 'tanh' takes 0 arguments");
	expect_cli(&d, "run 'v = w * 2 + v'", 0, "run v = w * 2 + v: 4096 elements x1, fused");
	expect_cli(&d, "run 'v = w * 2 + v' --kernel interpreted", 0, "interpreted kernel");
	expect_cli(&d, "reduce 'sum(abs(w - v))'", 0, "sum(abs(w - v)) = ");
	expect_cli(&d, "reduce 'argmax(w)' --count 1", 0, "argmax(w) = 0 (i64 over 1 elements");
	expect_cli(&d, "run 'v = w * q'", 1, "expression column 9: buffer 'q' not found");
	expect_cli(&d, "run 'v w'", 2, "neither an expression");
	expect_cli(&d, "stats", 0, "INSTANTIATED");
	expect_cli(&d, "stats", 0, "COMPILED");
	expect_cli(&d, "--json stats", 0, "\"graph_instantiations\"");
	expect_cli(&d, "bench chain --bytes 256K --repeat 3", 0, "(c) plans");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(chain_bench_job_reports_every_part)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	uint64_t free_before = device_mem_free(c, 0);
	struct mp_map req;
	gpuq_request_begin(c, &req, "bench_chain");
	mp_put_u64(&req, "bytes", 1 << 16);
	mp_put_u64(&req, "repeat", 2);
	mp_put_u64(&req, "reps", 3);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "bench_chain");
	CHECK(reply_f64(r, "job.result.bandwidth.memcpy_gbps") > 0);
	CHECK(reply_f64(r, "job.result.bandwidth.fused_gbps") > 0);
	CHECK(reply_f64(r, "job.result.cache.graph.instantiate_us") > 0);
	CHECK_EQ(reply_u64(r, "job.result.cache.cached_rerun_instantiations"), 0);
	CHECK(reply_f64(r, "job.result.bandwidth.compiled_gbps") > 0);
	CHECK(reply_f64(r, "job.result.expressions.axpy_gbps") > 0);
	CHECK(reply_f64(r, "job.result.expressions.sum_of_read") > 0);
	CHECK(reply_f64(r, "job.result.expressions.norm2") > 0);
	const msgpack_object *same = reply_path(r, "job.result.bandwidth.compiled_same_bits");
	CHECK(same && same->type == MSGPACK_OBJECT_BOOLEAN && same->via.boolean);
	same = reply_path(r, "job.result.expressions.sum_same_bits");
	CHECK(same && same->type == MSGPACK_OBJECT_BOOLEAN && same->via.boolean);
	const msgpack_object *compiled = reply_path(r, "job.result.compile.compiled");
	CHECK(compiled && compiled->type == MSGPACK_OBJECT_BOOLEAN);
	if (compiled->via.boolean) /* the compile costs were measured: NVRTC, then disk, then memory */
		CHECK(reply_f64(r, "job.result.compile.nvrtc_ms") > reply_f64(r, "job.result.compile.memory_ms"));
	const msgpack_object *launch = reply_path(r, "job.result.launch");
	CHECK(launch && launch->type == MSGPACK_OBJECT_ARRAY && launch->via.array.size == 3);
	gpuq_reply_free(r);
	/* The benchmark's buffers are gone (the host arena counts exactly). */
	if (!test_backend_is_cuda())
		CHECK_EQ(device_mem_free(c, 0), free_before);
	gpuq_request_begin(c, &req, "bench_chain");
	mp_put_u64(&req, "bytes", 1000);
	expect(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "'bytes'");
	gpuq_close(c);
	daemon_stop(&d);
}
