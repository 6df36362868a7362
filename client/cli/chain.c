/*
 * gpuq run, gpuq reduce and gpuq stats. run sends an expression as it is
 * (`expr`: the daemon parses it and points at the column of anything
 * wrong), or turns a chain's text ('sin | add 1 | clamp 0 1') into the
 * request's list form ([["sin"], ["add", 1], ["clamp", 0, 1]]); whether an
 * op exists and takes those arguments is the daemon's to say, and it names
 * the op and its position when one does not.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli/cli.h"

#define CHAIN_TEXT_MAX 4096
#define OP_WORDS_MAX 8

/* Splits s at blanks into at most max words (s is modified). Returns how many. */
static int split_words(char *s, char **words, int max)
{
	int n = 0;

	while (*s) {
		while (isspace((unsigned char)*s))
			*s++ = '\0';
		if (!*s)
			break;
		if (n == max)
			return max + 1;
		words[n++] = s;
		while (*s && !isspace((unsigned char)*s))
			s++;
	}
	return n;
}

/* One op's text ("add 1") as ["add", 1]; pos counts from 1. */
static int parse_op(const struct cli *cli, char *text, int pos, struct mp_array *ops)
{
	char *words[OP_WORDS_MAX];
	struct mp_array op;
	int n = split_words(text, words, OP_WORDS_MAX);

	if (n == 0)
		return cli_usage(cli, "op %d of the chain is empty; write ops between '|', "
				      "e.g. 'sin | add 1'", pos);
	if (n > OP_WORDS_MAX)
		return cli_usage(cli, "op %d ('%s') has too many words", pos, words[0]);
	mp_array_init(&op);
	mp_array_str(&op, words[0]);
	for (int i = 1; i < n; i++) {
		char *end;
		double v = strtod(words[i], &end);

		if (*end || end == words[i]) {
			mp_array_destroy(&op);
			return cli_usage(cli, "op %d '%s': '%s' is not a number", pos, words[0],
					 words[i]);
		}
		mp_array_f64(&op, v);
	}
	mp_array_array(ops, &op);
	return 0;
}

/* The chain's text as the `ops` list; 0 or CLI_USAGE (printed). */
static int parse_chain(const struct cli *cli, const char *chain, struct mp_array *ops)
{
	char text[CHAIN_TEXT_MAX], *save = NULL, *seg;
	int pos = 0, rc = 0;
	size_t len = strlen(chain);

	if (len >= sizeof(text))
		return cli_usage(cli, "the chain is %zu bytes; at most %zu", len, sizeof(text) - 1);
	memcpy(text, chain, len + 1);
	mp_array_init(ops);
	/* strtok would skip an empty op ('sin || add 1'); walk the bars by hand. */
	for (seg = text; rc == 0 && seg; seg = save) {
		save = strchr(seg, '|');
		if (save)
			*save++ = '\0';
		rc = parse_op(cli, seg, ++pos, ops);
	}
	if (rc)
		mp_array_destroy(ops);
	return rc;
}

/* How the run found its graph (on the host backend: its plan, as no graph exists there), in words. */
static const char *graph_words(const char *outcome, bool host)
{
	if (strcmp(outcome, "hit") == 0)
		return host ? " (cached plan)" : " (cached graph)";
	if (strcmp(outcome, "update") == 0)
		return host ? " (cached plan, updated to these buffers)"
			    : " (cached graph, updated to these buffers)";
	if (strcmp(outcome, "miss") == 0)
		return host ? " (plan built)" : " (graph instantiated)";
	return "";
}

/*
 * ", compiled kernel (disk, 0.41 ms, sm_90)" or ", interpreted kernel"; on the
 * host backend, which ran the program on its CPU, ", host evaluation (...)"
 * with the kernel it compiled and cached but did not run. The note goes on a
 * line of its own. Returns whether the host evaluated the program.
 */
static bool render_kernel(FILE *f, const msgpack_object *res, char *note, size_t size)
{
	char kernel[16], source[16], arch[24], math[8], evaluated[16];
	bool host, compiled;

	note[0] = '\0';
	if (!field_str(res, "kernel", kernel, sizeof(kernel), "")[0])
		return false;
	host = strcmp(field_str(res, "evaluated", evaluated, sizeof(evaluated), ""), "host") == 0;
	compiled = strcmp(kernel, "compiled") == 0;
	field_str(res, "math", math, sizeof(math), "ieee");
	field_str(res, "kernel_source", source, sizeof(source), "?");
	field_str(res, "arch", arch, sizeof(arch), "?");
	if (host && compiled)
		fprintf(f, ", host evaluation (the host backend: no GPU kernel ran; one compiled for "
			   "%s was cached: %s, %.2f ms)", arch,
			strcmp(source, "graph") == 0 ? "plan" : source, field_f64(res, "compile_ms", 0));
	else if (host) /* what --kernel chose, as a GPU would have run it */
		fputs(", host evaluation (the host backend: no GPU kernel ran; a GPU would run the "
		      "interpreted kernel)", f);
	else
		fprintf(f, ", %s kernel%s", kernel, strcmp(math, "fast") == 0 ? " (math fast)" : "");
	if (compiled && !host)
		fprintf(f, " (%s, %.2f ms, %s)", source, field_f64(res, "compile_ms", 0), arch);
	field_str(res, "kernel_note", note, size, "");
	return host;
}

/*
 * ": 1 kernel, 41 µs on the device, 2.04 GB/s; job 7", and the kernel's note;
 * ": 1 pass, 2.1 ms on the host, ..." where the host evaluated the program.
 */
static void render_timing(FILE *f, const msgpack_object *rec, const msgpack_object *res,
			  const char *note, bool host)
{
	char secs[32];
	uint64_t kernels = field_u64(res, "kernels", 0);

	fprintf(f, ": %" PRIu64 " %s%s, %s on the %s, %.2f GB/s; job %" PRIu64 "\n",
		kernels, host ? "pass" : "kernel", kernels == 1 ? "" : (host ? "es" : "s"),
		human_seconds(secs, sizeof(secs), field_f64(res, "device_s", -1)),
		host ? "host" : "device", field_f64(res, "gbps", 0), field_u64(rec, "job", 0));
	if (note[0])
		fprintf(f, "  (%s)\n", note);
}

/* "run x@0: 5 ops x1 on 1000 x f32, fused (cached graph), compiled kernel (...): 1 kernel, ...". */
static void render_run(FILE *f, const char *buf, const msgpack_object *rec,
		       const msgpack_object *res)
{
	char mode[16], graph[16], dtype[16], out[96], expr[256], note[400], evaluated[16];
	uint64_t nops = field_u64(res, "ops", 0);
	bool host = strcmp(field_str(res, "evaluated", evaluated, sizeof(evaluated), ""), "host") == 0;

	field_str(res, "mode", mode, sizeof(mode), "?");
	field_str(res, "graph", graph, sizeof(graph), "none");
	field_str(res, "dtype", dtype, sizeof(dtype), "?");
	field_str(res, "out", out, sizeof(out), "");
	if (field_str(res, "expr", expr, sizeof(expr), "")[0])
		fprintf(f, "run %s: %" PRIu64 " elements x%" PRIu64 ", %s", expr,
			field_u64(res, "count", 0), field_u64(res, "repeat", 1), mode);
	else
		fprintf(f, "run %s%s%s: %" PRIu64 " op%s x%" PRIu64 " on %" PRIu64 " x %s, %s",
			buf, out[0] ? " -> " : "", out, nops, nops == 1 ? "" : "s",
			field_u64(res, "repeat", 1), field_u64(res, "count", 0), dtype, mode);
	fputs(graph_words(graph, host), f);
	if (!render_kernel(f, res, note, sizeof(note)) && host)
		fputs(", host evaluation (the host backend: no GPU kernel or graph ran)", f);
	render_timing(f, rec, res, note, host);
}

/* A done run gets its own line; everything else (JSON, detach, failures) the usual. */
static int finish_run(struct cli *cli, struct gpuq_reply *r)
{
	const msgpack_object *rec = gpuq_reply_get(r, "job");
	const msgpack_object *res = rec && rec->type == MSGPACK_OBJECT_MAP
					    ? msg_map_get(rec, "result") : NULL;
	char buf[96];

	if (cli->json || cli->detach || !gpuq_reply_ok(r) || !res ||
	    res->type != MSGPACK_OBJECT_MAP)
		return cli_finish_job(cli, r);
	render_run(cli->out, field_str(rec, "buffer", buf, sizeof(buf), cli->args[0]), rec, res);
	gpuq_reply_free(r);
	return CLI_OK;
}

/* The options run and reduce share: --kernel, --math, --device. */
static void put_expr_options(const struct cli *cli, struct mp_map *req)
{
	if (cli->kernel)
		mp_put_str(req, "kernel", cli->kernel);
	if (cli->math)
		mp_put_str(req, "math", cli->math);
	if (cli->has_device)
		mp_put_u64(req, "device", cli->device);
}

/* run EXPR: the expression as it is; the daemon says what is wrong with it. */
static int begin_expr_run(struct cli *cli, struct mp_map *req)
{
	int rc;

	if (!strchr(cli->args[0], '='))
		return cli_usage(cli, "'%s' is neither an expression (OUT = ..., as 'y = a * x + y') "
				      "nor a buffer followed by a chain ('w' 'sin | add 1')",
				 cli->args[0]);
	if (cli->out_buffer)
		return cli_usage(cli, "--out goes with BUF CHAIN; an expression names its outputs");
	if ((rc = cli_job_begin(cli, req, "run")) != 0)
		return rc;
	mp_put_str(req, "expr", cli->args[0]);
	return 0;
}

/* run BUF CHAIN: the chain in its list form. */
static int begin_chain_run(struct cli *cli, struct mp_map *req)
{
	struct mp_array ops;
	int rc = parse_chain(cli, cli->args[1], &ops);

	if (rc)
		return rc;
	if ((rc = cli_job_begin(cli, req, "run")) != 0) {
		mp_array_destroy(&ops);
		return rc;
	}
	mp_put_str(req, "buffer", cli->args[0]);
	mp_put_array(req, "ops", &ops);
	if (cli->out_buffer)
		mp_put_str(req, "out", cli->out_buffer);
	return 0;
}

int cmd_run(struct cli *cli)
{
	struct mp_map req;
	struct gpuq_reply *r;
	int rc = cli->nargs == 1 ? begin_expr_run(cli, &req) : begin_chain_run(cli, &req);

	if (rc)
		return rc;
	if (cli->mode)
		mp_put_str(&req, "mode", cli->mode);
	if (cli->has_repeat)
		mp_put_u64(&req, "repeat", cli->repeat);
	put_expr_options(cli, &req);
	if ((rc = progress_call(cli, &req, NULL, 0, &r)) != 0)
		return rc;
	return finish_run(cli, r);
}

/* "sum(abs(x - y)) = 1234.5 (f64 over 1048576 elements), compiled kernel (...): ...". */
static void render_reduce(FILE *f, const msgpack_object *rec, const msgpack_object *res)
{
	char expr[256], vtype[8], note[400];
	const msgpack_object *v = msg_map_get(res, "value");
	bool host;

	fprintf(f, "%s = ", field_str(res, "expr", expr, sizeof(expr), "?"));
	if (!v)
		fputs("?", f);
	else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		fprintf(f, "%" PRIu64, v->via.u64);
	else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		fprintf(f, "%" PRId64, v->via.i64);
	else if (v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32)
		fprintf(f, "%.17g", v->via.f64);
	fprintf(f, " (%s over %" PRIu64 " elements", field_str(res, "value_dtype", vtype, sizeof(vtype), "?"),
		field_u64(res, "count", 0));
	if (msg_map_get(res, "max"))
		fprintf(f, "; the value there: %.17g", field_f64(res, "max", 0));
	fputs(")", f);
	host = render_kernel(f, res, note, sizeof(note));
	render_timing(f, rec, res, note, host);
}

int cmd_reduce(struct cli *cli)
{
	struct mp_map req;
	struct gpuq_reply *r;
	int rc = cli_job_begin(cli, &req, "reduce_expr");

	if (rc)
		return rc;
	mp_put_str(&req, "expr", cli->args[0]);
	if (cli->has_count)
		mp_put_u64(&req, "count", cli->count);
	put_expr_options(cli, &req);
	if ((rc = progress_call(cli, &req, NULL, 0, &r)) != 0)
		return rc;
	const msgpack_object *rec = gpuq_reply_get(r, "job");
	const msgpack_object *res = rec && rec->type == MSGPACK_OBJECT_MAP
					    ? msg_map_get(rec, "result") : NULL;
	if (cli->json || cli->detach || !gpuq_reply_ok(r) || !res || res->type != MSGPACK_OBJECT_MAP)
		return cli_finish_job(cli, r);
	render_reduce(cli->out, rec, res);
	gpuq_reply_free(r);
	return CLI_OK;
}

static void stats_row(struct table *t, const msgpack_object *d)
{
	const msgpack_object *c = msg_map_get(d, "counters");
	const msgpack_object *g = msg_map_get(d, "chain");

	table_cell(t, "%" PRIu64, field_u64(d, "index", 0));
	table_cell(t, "%" PRIu64, c ? field_u64(c, "jobs", 0) : 0);
	table_cell(t, "%" PRIu64, c ? field_u64(c, "jobs_failed", 0) : 0);
	if (!g || g->type != MSGPACK_OBJECT_MAP) {
		for (int i = 0; i < 12; i++)
			table_cell(t, "-");
		return;
	}
	table_cell(t, "%" PRIu64, field_u64(g, "runs", 0));
	table_cell(t, "%" PRIu64, field_u64(g, "kernels", 0));
	table_cell(t, "%" PRIu64, field_u64(g, "graph_hits", 0));
	table_cell(t, "%" PRIu64, field_u64(g, "graph_misses", 0));
	table_cell(t, "%" PRIu64, field_u64(g, "graph_updates", 0));
	table_cell(t, "%" PRIu64, field_u64(g, "graph_instantiations", 0));
	table_cell(t, "%" PRIu64, field_u64(g, "graph_evictions", 0));
	table_cell(t, "%" PRIu64 "/%" PRIu64, field_u64(g, "graph_entries", 0),
		   field_u64(g, "graph_capacity", 0));
	table_cell(t, "%" PRIu64, field_u64(g, "kernel_compiles", 0));
	table_cell(t, "%" PRIu64, field_u64(g, "kernel_disk_hits", 0));
	table_cell(t, "%" PRIu64, field_u64(g, "kernel_memory_hits", 0));
	table_cell(t, "%" PRIu64, field_u64(g, "kernel_fallbacks", 0));
}

static void render_stats(FILE *f, const msgpack_object *reply)
{
	static const struct table_col cols[] = {
		{ "GPU", true },     { "JOBS", true },         { "FAILED", true },
		{ "CHAINS", true },  { "KERNELS", true },      { "HITS", true },
		{ "MISSES", true },  { "UPDATES", true },      { "INSTANTIATED", true },
		{ "EVICTED", true }, { "CACHED", true },       { "COMPILED", true },
		{ "DISK", true },    { "MEMORY", true },       { "INTERPRETED", true },
	};
	const msgpack_object *devs = msg_map_get(reply, "devices");
	char backend[16];
	struct table t;

	if (!devs || devs->type != MSGPACK_OBJECT_ARRAY || devs->via.array.size == 0) {
		fprintf(f, "no devices\n");
		return;
	}
	const msgpack_object *first = &devs->via.array.ptr[0];
	const msgpack_object *chain = first->type == MSGPACK_OBJECT_MAP ? msg_map_get(first, "chain") : NULL;
	char dir[256];

	fprintf(f, "%s backend; compiled kernels kept in %s\n",
		field_str(reply, "backend", backend, sizeof(backend), "?"),
		chain && field_str(chain, "kernel_cache", dir, sizeof(dir), "")[0] ? dir
										: "memory only");
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	for (uint32_t i = 0; i < devs->via.array.size; i++)
		if (devs->via.array.ptr[i].type == MSGPACK_OBJECT_MAP)
			stats_row(&t, &devs->via.array.ptr[i]);
	table_print(&t, f);
	table_free(&t);
}

int cmd_stats(struct cli *cli)
{
	struct mp_map req;
	int rc = cli_begin(cli, &req, "stats");

	if (rc)
		return rc;
	if (cli->has_device)
		mp_put_u64(&req, "device", cli->device);
	return cli_call_and_render(cli, &req, render_stats);
}
