/*
 * gpuq bench sched (bench_sched.h lists its files): the run, its sizes, the
 * report, and part 1.
 *
 * Part 1, overlap. The ceiling is the daemon's bench_sched job: pinned H2D,
 * D2H and the fused chain sin | add 1 | sqrt | mul 2 | sub 3 on three
 * streams, each alone and all three at once, timed between device events
 * (workers/bench/sched_bench.c). Against it, gpuqd jobs of the same sizes on
 * three buffers: a put from scratch: into A, a get from B to scratch:, and
 * a run of the same chain, fused, on K; each alone, one after the other,
 * then all three sent at once on this connection (each with wait: true).
 * Times are this clock's, from submission to the reply (together: from the
 * first submission to the last reply); the job records' run_s and the
 * jobs' own timings are shown beside them. Medians of `reps` rounds, after
 * one unmeasured.
 *
 * The sizes shrink to fit the device (and are small on the host backend,
 * where a run takes seconds); the targets are the H200's, and are marked
 * met or MISSED whatever the backend. Exit status 0 when every part ran or
 * was skipped (saying why), whatever the targets say: the figures are for
 * reading, not a test.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/bench/bench_sched.h"

#define OVERLAP_BYTES_CUDA (4ull << 30)
#define OVERLAP_BYTES_HOST (16ull << 20)
#define SAMPLES_CUDA 200
#define SAMPLES_HOST 50
#define MAX_SAMPLES 100000
#define DEFAULT_REPS 3
#define MAX_REPS 20 /* the daemon's limit on bench_sched's reps */
#define CLIENT_TIMEOUT_MS 600000
#define TARGET_OVER_RAW 1.15
#define TARGET_OVER_SERIAL 0.6

enum { OV_PUT, OV_GET, OV_RUN, OV_JOBS };

struct overlap {
	char a[64], bb[64], k[64];
	uint64_t bytes;
	int only;      /* the job a round sends alone, or -1: all three */
	bool measured; /* the round counts (not the warm-up) */
	unsigned rep;
	double raw[OV_JOBS], raw_gbps[OV_JOBS], raw_together, raw_serial;
	double wall[OV_JOBS + 1][MAX_REPS]; /* alone, each job; [OV_JOBS]: together */
	double serial[MAX_REPS];
	double run_s[2][OV_JOBS][MAX_REPS]; /* the records' run_s: [0] alone, [1] together */
	double own_s[OV_JOBS][MAX_REPS];    /* alone: put/get's seconds, run's device_s */
};

/* ---- what parts record ---- */

void bench_sched_say(const struct bench_sched *b, const char *fmt, ...)
{
	va_list ap;

	if (b->cli->json)
		return;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
}

void bench_sched_figure(struct bench_sched *b, const char *key, double value)
{
	struct bench_sched_part *p = b->part;

	if (p->nfigures == BENCH_SCHED_MAX_FIGURES)
		return; /* a bug caught by the JSON test: every figure fits */
	snprintf(p->figures[p->nfigures].key, sizeof p->figures[0].key, "%s", key);
	p->figures[p->nfigures++].value = value;
}

void bench_sched_target(struct bench_sched *b, const char *what, double value, double lo,
			double hi, const char *text)
{
	struct bench_sched_part *p = b->part;
	struct bench_sched_target *t;

	if (p->ntargets == BENCH_SCHED_MAX_TARGETS)
		return;
	t = &p->targets[p->ntargets++];
	snprintf(t->what, sizeof t->what, "%s", what);
	snprintf(t->target, sizeof t->target, "%s", text);
	t->value = value;
	t->lo = lo;
	t->hi = hi;
	t->met = value > 0 && value <= hi && (lo < 0 || value >= lo);
}

int bench_sched_fail(struct bench_sched *b, const char *fmt, ...)
{
	struct bench_sched_part *p = b->part;
	va_list ap;

	if (p->state == PART_FAILED)
		return -1; /* the first failure is the one worth reading */
	p->state = PART_FAILED;
	va_start(ap, fmt);
	vsnprintf(p->why, sizeof p->why, fmt, ap);
	va_end(ap);
	return -1;
}

void bench_sched_skip(struct bench_sched *b, const char *fmt, ...)
{
	struct bench_sched_part *p = b->part;
	va_list ap;

	p->state = PART_SKIPPED;
	va_start(ap, fmt);
	vsnprintf(p->why, sizeof p->why, fmt, ap);
	va_end(ap);
}

/* ---- part 1: overlap ---- */

/* The chain of bench chain's bandwidth rows and of the bench_sched ceiling. */
static void put_chain(struct mp_map *req)
{
	static const struct {
		const char *op;
		int args;
		double arg;
	} chain[] = { { "sin", 0, 0 }, { "add", 1, 1 }, { "sqrt", 0, 0 }, { "mul", 1, 2 },
		      { "sub", 1, 3 } };
	struct mp_array ops;

	mp_array_init(&ops);
	for (size_t i = 0; i < sizeof chain / sizeof chain[0]; i++) {
		struct mp_array op;

		mp_array_init(&op);
		mp_array_str(&op, chain[i].op);
		if (chain[i].args)
			mp_array_f64(&op, chain[i].arg);
		mp_array_array(&ops, &op);
	}
	mp_put_array(req, "ops", &ops);
	mp_put_str(req, "mode", "fused");
}

static uint64_t overlap_build(struct bench_sched *b, struct mp_map *req, unsigned i, void *arg)
{
	static const char *const ops[] = { "put", "get", "run" };
	const struct overlap *o = arg;
	int j = o->only >= 0 ? o->only : (int)i;
	uint64_t id = bench_job_begin(b, req, ops[j], true);

	if (j == OV_PUT) {
		bench_job_put_scratch(req, o->a, 0, o->bytes);
	} else if (j == OV_GET) {
		mp_put_str(req, "buffer", o->bb);
		mp_put_bool(req, "scratch", true);
	} else {
		mp_put_str(req, "buffer", o->k);
		put_chain(req);
	}
	return id;
}

static int overlap_reply(struct bench_sched *b, const struct gpuq_reply *r, unsigned i, void *arg)
{
	static const char *const what[] = { "put from scratch:", "get to scratch:", "run" };
	struct overlap *o = arg;
	int j = o->only >= 0 ? o->only : (int)i;
	const msgpack_object *rec = bench_job_record(r);
	struct gpuq_error err;

	if (!gpuq_reply_ok(r)) {
		gpuq_reply_error(r, &err);
		return bench_sched_fail(b, "%s: %s: %s", what[j], gpuq_errc_name(err.code),
					err.message);
	}
	if (!o->measured)
		return 0;
	o->run_s[o->only < 0][j][o->rep] = field_f64(rec, "run_s", 0);
	if (o->only >= 0)
		o->own_s[j][o->rep] =
			bench_job_sub_f64(rec, "result", j == OV_RUN ? "device_s" : "seconds");
	return 0;
}

/* One round: job `only` alone, or (-1) the three at once; *wall on this clock. */
static int overlap_round(struct bench_sched *b, struct overlap *o, int only, double *wall)
{
	double t0 = bench_now();
	int rc;

	o->only = only;
	rc = bench_job_pipeline(b, only < 0 ? OV_JOBS : 1, overlap_build, overlap_reply, o);
	*wall = bench_now() - t0;
	return rc;
}

/* The ceiling: bench_sched on the device, with nothing else there. */
static int overlap_ceiling(struct bench_sched *b, struct overlap *o)
{
	static const char *const parts[] = { "h2d", "d2h", "kernel" };
	const msgpack_object *res;
	struct gpuq_reply *r;
	struct mp_map req;

	bench_job_begin(b, &req, "bench_sched", true);
	mp_put_u64(&req, "device", b->device);
	mp_put_u64(&req, "bytes", o->bytes);
	mp_put_u64(&req, "reps", b->reps);
	if (bench_job_call(b, &req, "bench_sched (the raw ceiling)", &r) < 0)
		return -1;
	res = msg_map_get(bench_job_record(r), "result");
	for (int j = 0; j < OV_JOBS; j++) {
		o->raw[j] = bench_job_sub_f64(res, parts[j], "seconds");
		o->raw_gbps[j] = bench_job_sub_f64(res, parts[j], "gbps");
	}
	o->raw_together = res ? field_f64(res, "together_s", 0) : 0;
	o->raw_serial = res ? field_f64(res, "serial_s", 0) : 0;
	gpuq_reply_free(r);
	if (o->raw_together <= 0)
		return bench_sched_fail(b, "bench_sched's reply has no together_s");
	return 0;
}

static int overlap_setup(struct bench_sched *b, struct overlap *o)
{
	if (bench_job_alloc(b, o->a, o->bytes, false) < 0 ||
	    bench_job_alloc(b, o->bb, o->bytes, false) < 0 ||
	    bench_job_alloc(b, o->k, o->bytes, true) < 0 ||
	    bench_job_fill_random(b, o->bb, 1) < 0 || bench_job_fill_random(b, o->k, 2) < 0)
		return -1;
	return 0;
}

/* One unmeasured round of everything, then reps rounds: each job alone, then together. */
static int overlap_measure(struct bench_sched *b, struct overlap *o)
{
	double ignored;

	o->measured = false;
	for (int j = -1; j < OV_JOBS; j++)
		if (overlap_round(b, o, j, &ignored) < 0)
			return -1;
	o->measured = true;
	for (o->rep = 0; o->rep < b->reps; o->rep++) {
		o->serial[o->rep] = 0;
		for (int j = 0; j < OV_JOBS; j++) {
			if (overlap_round(b, o, j, &o->wall[j][o->rep]) < 0)
				return -1;
			o->serial[o->rep] += o->wall[j][o->rep];
		}
		if (overlap_round(b, o, -1, &o->wall[OV_JOBS][o->rep]) < 0)
			return -1;
	}
	return 0;
}

/* GB/s the way bench_sched counts: bytes moved, the chain's read + written. */
static double overlap_gbps(const struct overlap *o, int j, double seconds)
{
	return seconds > 0 ? (double)o->bytes * (j == OV_RUN ? 2 : 1) / seconds / 1e9 : 0;
}

static void overlap_print(const struct bench_sched *b, const struct overlap *o,
			  const double *wall, const double *run_alone, const double *run_together,
			  const double *own, double serial)
{
	static const struct table_col cols[] = {
		{ "JOBS", false },  { "RAW s", true },   { "RAW GB/s", true }, { "GPUQD s", true },
		{ "GB/s", true },   { "RUN_S", true },   { "OWN s", true },    { "GPUQD/RAW", true },
	};
	static const char *const rows[] = { "put / H2D", "get / D2H", "run / chain" };
	double longest = 0;
	struct table t;

	table_init(&t, cols, (int)(sizeof cols / sizeof cols[0]));
	for (int j = 0; j < OV_JOBS; j++) {
		table_cell(&t, "%s", rows[j]);
		table_cell(&t, "%.4f", o->raw[j]);
		table_cell(&t, "%.1f", o->raw_gbps[j]);
		table_cell(&t, "%.4f", wall[j]);
		table_cell(&t, "%.1f", overlap_gbps(o, j, wall[j]));
		table_cell(&t, "%.4f", run_alone[j]);
		table_cell(&t, "%.4f", own[j]);
		table_cell(&t, "%.2f", o->raw[j] > 0 ? wall[j] / o->raw[j] : 0);
		longest = run_together[j] > longest ? run_together[j] : longest;
	}
	table_cell(&t, "one after another (sum)");
	table_cell(&t, "%.4f", o->raw_serial);
	table_cell(&t, "%s", "");
	table_cell(&t, "%.4f", serial);
	table_cell(&t, "%s", "");
	table_cell(&t, "%s", "");
	table_cell(&t, "%s", "");
	table_cell(&t, "%.2f", o->raw_serial > 0 ? serial / o->raw_serial : 0);
	table_cell(&t, "all three at once");
	table_cell(&t, "%.4f", o->raw_together);
	table_cell(&t, "%s", "");
	table_cell(&t, "%.4f", wall[OV_JOBS]);
	table_cell(&t, "%s", "");
	table_cell(&t, "%.4f", longest);
	table_cell(&t, "%s", "");
	table_cell(&t, "%.2f", wall[OV_JOBS] / o->raw_together);
	if (!b->cli->json)
		table_print(&t, stdout);
	table_free(&t);
}

/* Medians of the rounds, the table, the figures and the two targets. */
static void overlap_report(struct bench_sched *b, struct overlap *o)
{
	static const char *const names[] = { "put", "get", "chain" };
	double wall[OV_JOBS + 1], run_alone[OV_JOBS], run_together[OV_JOBS], own[OV_JOBS];
	double serial = bench_median(o->serial, b->reps);
	char key[40];

	for (int j = 0; j <= OV_JOBS; j++)
		wall[j] = bench_median(o->wall[j], b->reps);
	for (int j = 0; j < OV_JOBS; j++) {
		run_alone[j] = bench_median(o->run_s[0][j], b->reps);
		run_together[j] = bench_median(o->run_s[1][j], b->reps);
		own[j] = bench_median(o->own_s[j], b->reps);
	}
	overlap_print(b, o, wall, run_alone, run_together, own, serial);
	bench_sched_figure(b, "bytes", (double)o->bytes);
	bench_sched_figure(b, "reps", b->reps);
	bench_sched_figure(b, "raw_h2d_s", o->raw[OV_PUT]);
	bench_sched_figure(b, "raw_d2h_s", o->raw[OV_GET]);
	bench_sched_figure(b, "raw_kernel_s", o->raw[OV_RUN]);
	bench_sched_figure(b, "raw_serial_s", o->raw_serial);
	bench_sched_figure(b, "raw_together_s", o->raw_together);
	for (int j = 0; j < OV_JOBS; j++) {
		snprintf(key, sizeof key, "%s_s", names[j]);
		bench_sched_figure(b, key, wall[j]);
		snprintf(key, sizeof key, "%s_run_s", names[j]);
		bench_sched_figure(b, key, run_alone[j]);
		snprintf(key, sizeof key, "%s_own_s", names[j]);
		bench_sched_figure(b, key, own[j]);
		snprintf(key, sizeof key, "together_%s_run_s", names[j]);
		bench_sched_figure(b, key, run_together[j]);
	}
	bench_sched_figure(b, "serial_s", serial);
	bench_sched_figure(b, "together_s", wall[OV_JOBS]);
	bench_sched_figure(b, "together_over_raw", wall[OV_JOBS] / o->raw_together);
	bench_sched_figure(b, "together_over_serial", serial > 0 ? wall[OV_JOBS] / serial : 0);
	bench_sched_target(b, "together / raw together", wall[OV_JOBS] / o->raw_together, -1,
			   TARGET_OVER_RAW, "<= 1.15");
	bench_sched_target(b, "together / one after another",
			   serial > 0 ? wall[OV_JOBS] / serial : 0, -1, TARGET_OVER_SERIAL, "<= 0.6");
}

static int overlap_part(struct bench_sched *b)
{
	struct overlap *o = calloc(1, sizeof *o);
	char size[32];
	int rc;

	if (!o)
		return bench_sched_fail(b, "out of memory");
	o->bytes = b->overlap_bytes;
	bench_job_name(b, "a", o->a, sizeof o->a);
	bench_job_name(b, "b", o->bb, sizeof o->bb);
	bench_job_name(b, "k", o->k, sizeof o->k);
	human_bytes(size, sizeof size, o->bytes, 2);
	bench_sched_say(b, "\n(1) overlap: put %s from scratch: into A, get %s from B to scratch:, "
			   "run 'sin | add 1 | sqrt | mul 2 | sub 3' fused on K (%s of f32)\n",
			size, size, size);
	bench_sched_say(b, "RAW: bench_sched, %s; GPUQD: the jobs, submission to reply on this "
			   "clock; RUN_S: the job record's; OWN: put/get's seconds, run's device_s; "
			   "medians of %u rounds\n",
			b->cuda ? "pinned cudaMemcpyAsync H2D and D2H and the fused chain on three "
				  "streams, CUDA events"
				: "the host backend's engines, host clock",
			b->reps);
	rc = overlap_ceiling(b, o);
	if (rc == 0)
		rc = overlap_setup(b, o);
	if (rc == 0)
		rc = overlap_measure(b, o);
	if (rc == 0)
		overlap_report(b, o);
	bench_job_free(b, o->a);
	bench_job_free(b, o->bb);
	bench_job_free(b, o->k);
	free(o);
	return rc;
}

/* ---- the run ---- */

uint64_t bench_sched_fit(uint64_t size, uint64_t n, uint64_t budget)
{
	while (size > (1ull << 20) && size * n > budget)
		size /= 2;
	return size;
}

static int check_options(struct bench_sched *b)
{
	struct cli *cli = b->cli;

	if (cli->bytes_range)
		return cli_usage(cli, "--bytes '%s': bench sched takes one SIZE (the overlap "
				      "part's), not MIN:MAX", cli->bytes_range);
	if (cli->has_repeat && (cli->repeat < 1 || cli->repeat > MAX_REPS))
		return cli_usage(cli, "--repeat %" PRIu64 ": give 1 to %d timed rounds", cli->repeat,
				 MAX_REPS);
	if (cli->has_requests && (cli->requests < 1 || cli->requests > MAX_SAMPLES))
		return cli_usage(cli, "--requests %" PRIu64 ": give 1 to %d round trips per kind",
				 cli->requests, MAX_SAMPLES);
	return 0;
}

/* The backend, and the device's name and memory, from ping and devices; sizes from them. */
static int open_device(struct bench_sched *b, char *name, size_t size)
{
	const msgpack_object *dev;
	struct gpuq_reply *r;
	struct mp_map req;

	gpuq_request_begin(b->c, &req, "ping");
	if (bench_job_call(b, &req, "ping", &r) < 0)
		return -1;
	field_str(r->root, "backend", b->backend, sizeof b->backend, "?");
	gpuq_reply_free(r);
	b->cuda = strcmp(b->backend, "cuda") == 0;
	if (bench_job_device(b, &r, &dev) < 0)
		return -1;
	if (!dev || !field_bool(dev, "healthy", false)) {
		bench_sched_fail(b, "device %" PRIu64 " %s; `gpuq devices` lists them", b->device,
				 dev ? "is not healthy" : "does not exist");
		gpuq_reply_free(r);
		return -1;
	}
	b->mem_total = field_u64(dev, "mem_total", 0);
	field_str(dev, "name", name, size, "?");
	gpuq_reply_free(r);
	return 0;
}

static void choose_sizes(struct bench_sched *b)
{
	struct cli *cli = b->cli;

	b->reps = cli->has_repeat ? (unsigned)cli->repeat : DEFAULT_REPS;
	b->samples = cli->has_requests ? (unsigned)cli->requests
				       : b->cuda ? SAMPLES_CUDA : SAMPLES_HOST;
	/* bench_sched holds three of it, then this part's three buffers do. */
	b->overlap_bytes = cli->has_bytes ? cli->bytes
					  : bench_sched_fit(b->cuda ? OVERLAP_BYTES_CUDA : OVERLAP_BYTES_HOST,
						6, b->mem_total);
}

static const char *state_name(enum bench_sched_state s)
{
	return s == PART_RAN ? "ran" : s == PART_FAILED ? "failed" : "skipped";
}

/* The closing table: every target, met or MISSED, and the parts that did not run. */
static void report_table(const struct bench_sched *b, const struct bench_sched_part *parts,
			 int nparts)
{
	static const struct table_col cols[] = {
		{ "PART", false }, { "MEASURE", false }, { "VALUE", true },
		{ "TARGET", false }, { "", false },
	};
	int met = 0, total = 0;
	struct table t;

	printf("\nbench sched summary (%s backend, gpu %" PRIu64 ")\n", b->backend, b->device);
	table_init(&t, cols, (int)(sizeof cols / sizeof cols[0]));
	for (int i = 0; i < nparts; i++) {
		const struct bench_sched_part *p = &parts[i];

		if (p->state != PART_RAN) {
			table_cell(&t, "%s", p->title);
			table_cell(&t, "%s (below)", p->state == PART_FAILED ? "FAILED" : "skipped");
			table_cell(&t, "%s", "");
			table_cell(&t, "%s", "");
			table_cell(&t, "%s", "");
			continue;
		}
		for (int k = 0; k < p->ntargets; k++) {
			const struct bench_sched_target *tg = &p->targets[k];

			table_cell(&t, "%s", k ? "" : p->title);
			table_cell(&t, "%s", tg->what);
			table_cell(&t, "%.2f", tg->value);
			table_cell(&t, "%s", tg->target);
			table_cell(&t, "%s", tg->met ? "met" : "MISSED");
			met += tg->met;
			total++;
		}
	}
	table_print(&t, stdout);
	table_free(&t);
	for (int i = 0; i < nparts; i++)
		if (parts[i].state != PART_RAN)
			printf("%s %s: %s\n", parts[i].title,
			       parts[i].state == PART_FAILED ? "FAILED" : "skipped", parts[i].why);
	printf("targets (H200): %d of %d met%s\n", met, total,
	       b->cuda ? "" : " (host backend: the GPU targets do not apply)");
}

static void json_part(struct mp_map *parts, const struct bench_sched_part *p, int *met,
		      int *total)
{
	struct mp_map m, figures;
	struct mp_array targets;

	mp_map_init(&m);
	mp_put_str(&m, "state", state_name(p->state));
	if (p->state != PART_RAN)
		mp_put_str(&m, "why", p->why);
	mp_map_init(&figures);
	for (int i = 0; i < p->nfigures; i++)
		mp_put_f64(&figures, p->figures[i].key, p->figures[i].value);
	mp_put_map(&m, "figures", &figures);
	mp_array_init(&targets);
	for (int i = 0; p->state == PART_RAN && i < p->ntargets; i++) {
		struct mp_map t;

		mp_map_init(&t);
		mp_put_str(&t, "what", p->targets[i].what);
		mp_put_f64(&t, "value", p->targets[i].value);
		mp_put_str(&t, "target", p->targets[i].target);
		mp_put_bool(&t, "met", p->targets[i].met);
		mp_array_map(&targets, &t);
		*met += p->targets[i].met;
		(*total)++;
	}
	mp_put_array(&m, "targets", &targets);
	mp_put_map(parts, p->name, &m);
}

/* --json: one object with every part's state, figures and targets. */
static void report_json(const struct bench_sched *b, const struct bench_sched_part *parts,
			int nparts)
{
	struct mp_map root, pm;
	msgpack_sbuffer sb;
	msgpack_unpacked u;
	size_t off = 0;
	int met = 0, total = 0;

	mp_map_init(&root);
	mp_put_str(&root, "bench", "sched");
	mp_put_str(&root, "backend", b->backend);
	mp_put_u64(&root, "device", b->device);
	mp_map_init(&pm);
	for (int i = 0; i < nparts; i++)
		json_part(&pm, &parts[i], &met, &total);
	mp_put_map(&root, "parts", &pm);
	mp_put_u64(&root, "targets_met", (uint64_t)met);
	mp_put_u64(&root, "targets_total", (uint64_t)total);
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&root, &sb);
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS)
		render_json(b->cli->json_out, &u.data);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
}

/* Runs the parts in turn; the exit status: 0 when none failed. */
static int run_parts(struct bench_sched *b, struct bench_sched_part *parts, int nparts)
{
	static int (*const run[])(struct bench_sched *) = {
		overlap_part, bench_latency_head_of_line, bench_latency_priority, bench_fair_share,
	};
	int rc = CLI_OK;

	for (int i = 0; i < nparts; i++) {
		b->part = &parts[i];
		if (b->broken)
			bench_sched_skip(b, "the connection to gpuqd broke in an earlier part");
		else
			run[i](b);
		if (parts[i].state == PART_FAILED) {
			fprintf(stderr, "gpuq bench sched: %s failed: %s\n", parts[i].title,
				parts[i].why);
			rc = b->broken ? CLI_UNREACHABLE : CLI_REFUSED;
		} else if (parts[i].state == PART_SKIPPED) {
			bench_sched_say(b, "skipped (see the summary)\n");
		}
		fflush(stdout);
	}
	return rc;
}

int bench_sched(struct cli *cli)
{
	struct bench_sched_part setup = { .name = "setup", .title = "setup" };
	struct bench_sched_part parts[] = {
		{ .name = "overlap", .title = "overlap" },
		{ .name = "head_of_line", .title = "head of line" },
		{ .name = "priority", .title = "priority" },
		{ .name = "fairness", .title = "fairness" },
	};
	int nparts = (int)(sizeof parts / sizeof parts[0]);
	struct bench_sched b = { .cli = cli, .part = &setup };
	char name[128], mem[32];
	struct gpuq_error err;
	int rc = check_options(&b);

	if (rc)
		return rc;
	if (!cli->client && gpuq_connect(cli->socket, &cli->client, &err) < 0) {
		cli_print_error(&err);
		return CLI_UNREACHABLE;
	}
	b.c = cli->client;
	b.device = cli->has_device ? cli->device : 0;
	snprintf(b.tag, sizeof b.tag, "bsched.%d", (int)getpid());
	gpuq_set_timeout(b.c, cli->has_timeout ? (unsigned)cli->timeout_ms : CLIENT_TIMEOUT_MS);
	if (open_device(&b, name, sizeof name) < 0) {
		fprintf(stderr, "gpuq bench sched: %s\n", setup.why);
		return b.broken ? CLI_UNREACHABLE : CLI_REFUSED;
	}
	choose_sizes(&b);
	bench_sched_say(&b, "bench sched (%s backend, gpu %" PRIu64 ": %s, %s): gpuqd's scheduler "
			    "beside what the device does alone, measured in this run\n",
			b.backend, b.device, name, human_bytes(mem, sizeof mem, b.mem_total, 1));
	rc = run_parts(&b, parts, nparts);
	if (cli->json_out)
		report_json(&b, parts, nparts);
	if (!cli->json)
		report_table(&b, parts, nparts);
	return rc;
}
