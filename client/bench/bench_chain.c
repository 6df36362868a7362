/*
 * bench chain: asks gpuqd to run the chain benchmark as one job on a device
 * (workers/bench/chain_bench.h says what it measures) and prints its tables with
 * the issues' targets, each marked met or missed. The targets are the
 * H200's; on the host backend they are printed but do not apply.
 *
 * Exit status 0 when the benchmark ran, whatever the targets say: the
 * numbers are for reading (make gpu-check prints them), not a test.
 */
#include <inttypes.h>
#include <string.h>

#include "client/cli/cli.h"

#define TARGET_GRAPH_OVER_EAGER 0.35
#define TARGET_COMPILED_OF_MEMCPY 0.92
#define TARGET_OP_OF_MEMCPY 0.85
#define TARGET_FUSED_SPEEDUP 4.0
#define TARGET_AXPY_OF_MEMCPY 0.90
#define TARGET_REDUCE_OF_READ 0.90

struct targets {
	int met, total;
};

static const char *verdict(struct targets *t, bool ok)
{
	t->total++;
	t->met += ok;
	return ok ? "met" : "MISSED";
}

/* The map or array under key, or NULL. */
static const msgpack_object *child(const msgpack_object *map, const char *key,
				   msgpack_object_type type)
{
	const msgpack_object *o = map ? msg_map_get(map, key) : NULL;

	return o && o->type == type ? o : NULL;
}

static void print_launch(const msgpack_object *res, struct targets *tg)
{
	static const struct table_col cols[] = {
		{ "OPS", true },         { "KERNELS", true },     { "EAGER µs/KERNEL", true },
		{ "GRAPH µs/KERNEL", true }, { "GRAPH/EAGER", true }, { "TARGET <= 0.35", false },
	};
	const msgpack_object *list = child(res, "launch", MSGPACK_OBJECT_ARRAY);
	struct table t;

	printf("(a) launch-bound: %" PRIu64 " x f32, %" PRIu64 " passes of each chain\n",
	       field_u64(res, "launch_count", 0), field_u64(res, "launch_repeat", 0));
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	for (uint32_t i = 0; list && i < list->via.array.size; i++) {
		const msgpack_object *l = &list->via.array.ptr[i];
		double ratio = field_f64(l, "graph_over_eager", 0);

		table_cell(&t, "%" PRIu64, field_u64(l, "ops", 0));
		table_cell(&t, "%" PRIu64, field_u64(l, "kernels", 0));
		table_cell(&t, "%.2f", field_f64(l, "eager_us_per_kernel", 0));
		table_cell(&t, "%.2f", field_f64(l, "graph_us_per_kernel", 0));
		table_cell(&t, "%.3f", ratio);
		table_cell(&t, "%s", verdict(tg, ratio > 0 && ratio <= TARGET_GRAPH_OVER_EAGER));
	}
	table_print(&t, stdout);
	table_free(&t);
}

static void bandwidth_row(struct table *t, const char *what, double gbps, double copy,
			  const char *target)
{
	table_cell(t, "%s", what);
	table_cell(t, "%.1f", gbps);
	table_cell(t, "%.3f", copy > 0 ? gbps / copy : 0);
	table_cell(t, "%s", target);
}

static void print_bandwidth(const msgpack_object *res, struct targets *tg)
{
	static const struct table_col cols[] = {
		{ "KERNELS", false }, { "GB/s", true }, { "OF MEMCPY", true }, { "TARGET", false },
	};
	const msgpack_object *b = child(res, "bandwidth", MSGPACK_OBJECT_MAP);
	const msgpack_object *ops = child(b, "per_op", MSGPACK_OBJECT_ARRAY);
	double copy = field_f64(b, "memcpy_gbps", 0), fused = field_f64(b, "fused_gbps", 0);
	double speedup = field_f64(b, "fused_speedup_over_graph", 0);
	char size[32], what[64], target[64];
	struct table t;

	printf("\n(b) bandwidth-bound: %s of f32, sin | add 1 | sqrt | mul 2 | sub 3; "
	       "GB/s = bytes read + written per pass\n",
	       human_bytes(size, sizeof(size), field_u64(b, "bytes", 0), 2));
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	bandwidth_row(&t, "cudaMemcpy D2D", copy, copy, "baseline");
	for (uint32_t i = 0; ops && i < ops->via.array.size; i++) {
		const msgpack_object *o = &ops->via.array.ptr[i];
		char name[16];
		double g = field_f64(o, "gbps", 0);

		snprintf(what, sizeof(what), "%s alone (1 kernel)",
			 field_str(o, "op", name, sizeof(name), "?"));
		snprintf(target, sizeof(target), ">= %.2f %s", TARGET_OP_OF_MEMCPY,
			 verdict(tg, copy > 0 && g / copy >= TARGET_OP_OF_MEMCPY));
		bandwidth_row(&t, what, g, copy, target);
	}
	bandwidth_row(&t, "chain eager (5 kernels)", field_f64(b, "eager_gbps", 0), copy, "");
	bandwidth_row(&t, "chain graph (5 kernels)", field_f64(b, "graph_gbps", 0), copy, "");
	bandwidth_row(&t, "chain fused, interpreted", fused, copy, "");
	double compiled = field_f64(b, "compiled_gbps", 0);
	snprintf(target, sizeof(target), ">= %.2f %s", TARGET_COMPILED_OF_MEMCPY,
		 verdict(tg, copy > 0 && compiled / copy >= TARGET_COMPILED_OF_MEMCPY));
	bandwidth_row(&t, "chain fused, compiled", compiled, copy, target);
	table_print(&t, stdout);
	table_free(&t);
	printf("fused chain %.2fx faster than the graph chain (target >= %.0fx: %s)\n", speedup,
	       TARGET_FUSED_SPEEDUP, verdict(tg, speedup >= TARGET_FUSED_SPEEDUP));
	printf("compiled %.2fx the interpreted fused kernel; its output the same bits: %s\n",
	       fused > 0 ? compiled / fused : 0,
	       verdict(tg, field_bool(b, "compiled_same_bits", false)));
}

/* y = a * x + y against the copy; sum and norm2 against the read kernel. */
static void print_expressions(const msgpack_object *res, struct targets *tg)
{
	static const struct table_col cols[] = {
		{ "JOB", false }, { "GB/s", true }, { "CEILING", false }, { "OF CEILING", true },
		{ "TARGET", false },
	};
	const msgpack_object *e = child(res, "expressions", MSGPACK_OBJECT_MAP);
	const msgpack_object *b = child(res, "bandwidth", MSGPACK_OBJECT_MAP);
	double copy = field_f64(b, "memcpy_gbps", 0), read = field_f64(e, "read_gbps", 0);
	struct {
		const char *what, *key, *ceiling;
		double base, target;
	} rows[] = {
		{ "y = a * x + y (3 streams)", "axpy_gbps", "cudaMemcpy D2D", copy, TARGET_AXPY_OF_MEMCPY },
		{ "read kernel", "read_gbps", "itself", read, 0 },
		{ "sum(x)", "sum_gbps", "read kernel", read, TARGET_REDUCE_OF_READ },
		{ "norm2(x)", "norm2_gbps", "read kernel", read, TARGET_REDUCE_OF_READ },
	};
	char size[32], target[64];
	struct table t;

	printf("\n(d) expressions and reductions over %s of f32 (compiled kernels); GB/s = bytes moved\n",
	       human_bytes(size, sizeof(size), field_u64(b, "bytes", 0), 2));
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		double g = field_f64(e, rows[i].key, 0), of = rows[i].base > 0 ? g / rows[i].base : 0;
		snprintf(target, sizeof(target), rows[i].target > 0 ? ">= %.2f %s" : "baseline",
			 rows[i].target, rows[i].target > 0 ? verdict(tg, of >= rows[i].target) : "");
		table_cell(&t, "%s", rows[i].what);
		table_cell(&t, "%.1f", g);
		table_cell(&t, "%s", rows[i].ceiling);
		table_cell(&t, "%.3f", of);
		table_cell(&t, "%s", target);
	}
	table_print(&t, stdout);
	table_free(&t);
	printf("sum(x) = %.17g, norm2(x) = %.17g; compiled sum the interpreted bits: %s\n",
	       field_f64(e, "sum", 0), field_f64(e, "norm2", 0),
	       verdict(tg, field_bool(e, "sum_same_bits", false)));
}

/* What getting the 5-op chain's kernel costs each way. */
static void print_compile(const msgpack_object *res, struct targets *tg)
{
	const msgpack_object *c = child(res, "compile", MSGPACK_OBJECT_MAP);
	char note[400];

	printf("\n(e) the 5-op chain's kernel: ");
	if (!field_bool(c, "compiled", false)) {
		printf("not compiled here: %s (%s)\n", field_str(c, "note", note, sizeof(note), "?"),
		       verdict(tg, false));
		return;
	}
	printf("NVRTC %.1f ms (opening NVRTC took %.1f ms, once), disk hit %.2f ms (as a new daemon), "
	       "memory hit %.3f ms\n",
	       field_f64(c, "nvrtc_ms", 0), field_f64(c, "nvrtc_load_ms", 0), field_f64(c, "disk_ms", 0),
	       field_f64(c, "memory_ms", 0));
}

static void print_cache(const msgpack_object *res, struct targets *tg)
{
	static const struct table_col cols[] = {
		{ "MODE", false }, { "INSTANTIATE µs", true }, { "UPDATE µs", true }, { "HIT µs", true },
	};
	static const char *const modes[] = { "graph", "fused" };
	const msgpack_object *c = child(res, "cache", MSGPACK_OBJECT_MAP);
	uint64_t again = field_u64(c, "cached_rerun_instantiations", UINT64_MAX);
	struct table t;

	printf("\n(c) plans for the 5-op chain on %" PRIu64 " x f32: build (capture + "
	       "instantiate), update (capture + cudaGraphExecUpdate), hit (lookup)\n",
	       field_u64(res, "launch_count", 0));
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		const msgpack_object *m = child(c, modes[i], MSGPACK_OBJECT_MAP);

		table_cell(&t, "%s", modes[i]);
		table_cell(&t, "%.1f", field_f64(m, "instantiate_us", 0));
		table_cell(&t, "%.1f", field_f64(m, "update_us", 0));
		table_cell(&t, "%.2f", field_f64(m, "hit_us", 0));
	}
	table_print(&t, stdout);
	table_free(&t);
	printf("a cached chain's second run instantiated %" PRIu64 " graphs (target 0: %s)\n",
	       again, verdict(tg, again == 0));
}

/* The daemon's backend, from ping; "" when it cannot be read. */
static int daemon_backend(struct cli *cli, char *backend, size_t size)
{
	struct gpuq_reply *r;
	struct mp_map req;
	int rc = cli_begin(cli, &req, "ping");

	if (rc || (rc = cli_call(cli, &req, NULL, 0, &r)))
		return rc;
	rc = gpuq_reply_ok(r) ? 0 : cli_report_refusal(r);
	field_str(r->root, "backend", backend, size, "");
	gpuq_reply_free(r);
	return rc;
}

static int run_bench(struct cli *cli, struct gpuq_reply **out)
{
	struct mp_map req;
	int rc = cli_begin(cli, &req, "bench_chain");

	if (rc)
		return rc;
	if (cli->has_device)
		mp_put_u64(&req, "device", cli->device);
	if (cli->has_bytes)
		mp_put_u64(&req, "bytes", cli->bytes);
	if (cli->has_repeat)
		mp_put_u64(&req, "repeat", cli->repeat);
	mp_put_bool(&req, "wait", true);
	return cli_call(cli, &req, NULL, 0, out);
}

static void print_report(const char *backend, const msgpack_object *rec)
{
	const msgpack_object *res = child(rec, "result", MSGPACK_OBJECT_MAP);
	struct targets tg = { 0, 0 };

	bool cuda = strcmp(backend, "cuda") == 0;

	printf("bench chain (%s backend, gpu %" PRIu64 "): medians of %" PRIu64
	       " timed replays after one unmeasured; %s\n",
	       backend, field_u64(rec, "device", 0), field_u64(res, "reps", 0),
	       cuda ? "device time between CUDA events" : "host clock");
	print_launch(res, &tg);
	print_bandwidth(res, &tg);
	print_cache(res, &tg);
	print_expressions(res, &tg);
	print_compile(res, &tg);
	printf("\ntargets (H200): %d of %d met%s\n", tg.met, tg.total,
	       cuda ? "" : " (host backend: the GPU targets do not apply)");
}

int bench_chain(struct cli *cli)
{
	char backend[16];
	struct gpuq_reply *r;
	int rc = daemon_backend(cli, backend, sizeof(backend));

	if (rc || (rc = run_bench(cli, &r)))
		return rc;
	if (cli->json_out)
		render_json(cli->json_out, r->root);
	if (!gpuq_reply_ok(r)) {
		rc = cli_report_refusal(r);
	} else if (!cli->json) {
		const msgpack_object *rec = gpuq_reply_get(r, "job");

		if (rec && rec->type == MSGPACK_OBJECT_MAP)
			print_report(backend, rec);
	}
	gpuq_reply_free(r);
	return rc;
}
