/*
 * Parts 2 and 3 of gpuq bench sched: how long a small job takes while its
 * device is busy with other work, beside the same job on the idle device in
 * the same run. Every small job is sent with wait: true and timed on this
 * clock from submission to reply; the daemon's queued_s + run_s of each is
 * kept beside it.
 *
 * Head of line: a 1 MiB checksum (of buffer C), a 1 MiB put from scratch:
 * (into P) and a 1 MiB get (of C) to scratch: take turns, `samples` of each
 * on the idle device; then as many checksums and puts while a long put from
 * scratch: runs into L (32 GiB on a GPU, at most a quarter of the device;
 * 256 MiB on the host backend), and as many gets while a long get of L to
 * scratch: runs (host->device and device->host copies queue apart). A
 * round counts only if the long job was running before it and still is
 * after it (its state is asked between rounds); once it has ended, another
 * starts. Figures: p50 and p99 busy / idle.
 *
 * Priority: 1,000 low-priority puts from scratch: of 256 MiB (4 MiB on the
 * host backend) into a ring of 16 ranges of Q, so that as many are in
 * flight as the scheduler allows, sent detached; then high-priority 1 MiB
 * checksums one after another while they queue: their median / the same
 * checksum's idle median. The daemon's queue depth afterwards says whether
 * the backlog was still there. Then the backlog is cancelled and waited for.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/bench/bench_sched.h"

#define SMALL_BYTES (1ull << 20)
#define WARMUP 10
#define LONG_JOB_CUDA (32ull << 30)
#define LONG_JOB_HOST (256ull << 20)
#define LONG_JOB_MAX_STARTS 1000
#define RUNNING_WITHIN_S 30.0
#define LOW_JOBS 1000
#define LOW_BYTES_CUDA (256ull << 20)
#define LOW_BYTES_HOST (4ull << 20)
#define RING 16
#define IDLE_SAMPLES 20
#define HIGH_SAMPLES 20 /* as many as the idle median has */
#define TARGET_RATIO 3.0

enum { KIND_CHECKSUM, KIND_PUT, KIND_GET, KINDS };
static const char *const kind_names[] = { "checksum", "put", "get" };

/* Round trips of one kind: this clock's, and the daemon's queued_s + run_s. */
struct series {
	double *wall, *daemon;
	unsigned n;
};

static int series_alloc(struct series *s, unsigned n)
{
	s->n = 0;
	s->wall = calloc(n, sizeof *s->wall);
	s->daemon = calloc(n, sizeof *s->daemon);
	return s->wall && s->daemon ? 0 : -1;
}

static void series_free(struct series *s)
{
	free(s->wall);
	free(s->daemon);
}

/* Sends req (wait: true) and appends its round trip to s. */
static int timed(struct bench_sched *b, struct mp_map *req, const char *what, struct series *s)
{
	double t0 = bench_now();
	struct gpuq_reply *r;
	const msgpack_object *rec;

	if (bench_job_call(b, req, what, &r) < 0)
		return -1;
	s->wall[s->n] = bench_now() - t0;
	rec = bench_job_record(r);
	s->daemon[s->n++] = field_f64(rec, "queued_s", 0) + field_f64(rec, "run_s", 0);
	gpuq_reply_free(r);
	return 0;
}

static int small_checksum(struct bench_sched *b, const char *buffer, const char *priority,
			  struct series *s)
{
	struct mp_map req;

	bench_job_begin(b, &req, "checksum", true);
	mp_put_str(&req, "buffer", buffer);
	if (priority)
		mp_put_str(&req, "priority", priority);
	return timed(b, &req, "checksum of 1 MiB", s);
}

static int small_put(struct bench_sched *b, const char *buffer, struct series *s)
{
	struct mp_map req;

	bench_job_begin(b, &req, "put", true);
	bench_job_put_scratch(&req, buffer, 0, SMALL_BYTES);
	return timed(b, &req, "put of 1 MiB from scratch:", s);
}

static int small_get(struct bench_sched *b, const char *buffer, struct series *s)
{
	struct mp_map req;

	bench_job_begin(b, &req, "get", true);
	mp_put_str(&req, "buffer", buffer);
	mp_put_bool(&req, "scratch", true);
	return timed(b, &req, "get of 1 MiB to scratch:", s);
}

/* The buffers of the small jobs: c (1 MiB, random) and, when p is given, p. */
static int small_buffers(struct bench_sched *b, const char *c, const char *p)
{
	if (bench_job_alloc(b, c, SMALL_BYTES, false) < 0 || bench_job_fill_random(b, c, 3) < 0)
		return -1;
	return p ? bench_job_alloc(b, p, SMALL_BYTES, false) : 0;
}

/* ---- part 2: head of line ---- */

/* The long job the small jobs of a busy phase run beside: a put or a get. */
struct hol_long {
	const char *op, *what;
	int first, last; /* the kinds measured beside it */
	uint64_t id;
	unsigned starts;
};

struct hol {
	char l[64], c[64], p[64];
	uint64_t long_bytes;
	struct hol_long put, get;
	struct series idle[KINDS], busy[KINDS];
};

/* One job of each kind from first to last, in turn, into s. */
static int hol_round(struct bench_sched *b, struct hol *h, int first, int last, struct series *s)
{
	for (int k = first; k <= last; k++) {
		int rc = k == KIND_CHECKSUM ? small_checksum(b, h->c, NULL, &s[k])
			 : k == KIND_PUT    ? small_put(b, h->p, &s[k])
					    : small_get(b, h->c, &s[k]);
		if (rc < 0)
			return -1;
	}
	return 0;
}

/* WARMUP unmeasured rounds, then `samples` measured ones, on the idle device. */
static int hol_idle(struct bench_sched *b, struct hol *h)
{
	for (int i = 0; i < WARMUP; i++) {
		if (hol_round(b, h, 0, KINDS - 1, h->idle) < 0)
			return -1;
		for (int k = 0; k < KINDS; k++)
			h->idle[k].n = 0;
	}
	while (h->idle[0].n < b->samples)
		if (hol_round(b, h, 0, KINDS - 1, h->idle) < 0)
			return -1;
	return 0;
}

/* Starts the long job (detached) and returns once the daemon says it runs. */
static int hol_start_long(struct bench_sched *b, struct hol *h, struct hol_long *lj)
{
	double deadline = bench_now() + RUNNING_WITHIN_S;
	struct gpuq_reply *r;
	struct mp_map req;
	char state[16];

	bench_job_begin(b, &req, lj->op, false);
	bench_job_put_scratch(&req, h->l, 0, h->long_bytes);
	if (bench_job_call(b, &req, lj->what, &r) < 0)
		return -1;
	lj->id = field_u64(bench_job_record(r), "job", 0);
	gpuq_reply_free(r);
	lj->starts++;
	do {
		if (bench_job_state(b, lj->id, state, sizeof state) < 0)
			return -1;
		if (strcmp(state, "running") == 0)
			return 0;
		if (strcmp(state, "queued") != 0)
			return bench_sched_fail(b, "the long %s (job %" PRIu64 ") was %s before a "
						   "sample could be taken; `gpuq status %" PRIu64
						   "` says more", lj->op, lj->id, state, lj->id);
		usleep(1000);
	} while (bench_now() < deadline);
	return bench_sched_fail(b, "the long %s (job %" PRIu64 ") was still queued after %.0f s",
				lj->op, lj->id, RUNNING_WITHIN_S);
}

/* `samples` rounds of lj's kinds, each taken while a long job ran throughout it. */
static int hol_busy(struct bench_sched *b, struct hol *h, struct hol_long *lj)
{
	char state[16];

	if (hol_start_long(b, h, lj) < 0)
		return -1;
	while (h->busy[lj->first].n < b->samples) {
		if (hol_round(b, h, lj->first, lj->last, h->busy) < 0 ||
		    bench_job_state(b, lj->id, state, sizeof state) < 0)
			return -1;
		if (strcmp(state, "running") == 0)
			continue;
		/* The long job ended during the round: the round does not count. */
		for (int k = lj->first; k <= lj->last; k++)
			h->busy[k].n--;
		if (strcmp(state, "done") != 0)
			return bench_sched_fail(b, "the long %s (job %" PRIu64 ") ended %s; `gpuq "
						   "status %" PRIu64 "` says why", lj->op, lj->id,
						   state, lj->id);
		if (lj->starts == LONG_JOB_MAX_STARTS)
			return bench_sched_fail(b, "%u long %ss ended before %u rounds could be "
						   "taken during them", lj->starts, lj->op,
						   b->samples);
		if (hol_start_long(b, h, lj) < 0)
			return -1;
	}
	/* Cancelled, not waited out: what is left of it would hold up the next phase. */
	int rc = bench_job_cancel_all(b, &lj->id, 1);
	lj->id = 0;
	return rc;
}

/* p50 and p99 of this clock's and p50 of the daemon's times, in µs; sorts s. */
static void series_quantiles(struct series *s, double *p50, double *p99, double *daemon50)
{
	*daemon50 = bench_median(s->daemon, s->n) * 1e6;
	bench_median(s->wall, s->n);
	*p50 = bench_job_quantile(s->wall, s->n, 0.5) * 1e6;
	*p99 = bench_job_quantile(s->wall, s->n, 0.99) * 1e6;
}

static void hol_report(struct bench_sched *b, struct hol *h)
{
	static const struct table_col cols[] = {
		{ "JOB", false },         { "IDLE P50 µs", true },  { "IDLE P99 µs", true },
		{ "BUSY P50 µs", true },  { "BUSY P99 µs", true },  { "P50 BUSY/IDLE", true },
		{ "P99 BUSY/IDLE", true }, { "DAEMON P50 µs IDLE/BUSY", true },
	};
	struct table t;
	char key[48], what[48];

	bench_sched_figure(b, "long_put_bytes", (double)h->long_bytes);
	bench_sched_figure(b, "long_puts", h->put.starts);
	bench_sched_figure(b, "long_gets", h->get.starts);
	bench_sched_figure(b, "samples", b->samples);
	table_init(&t, cols, (int)(sizeof cols / sizeof cols[0]));
	for (int k = 0; k < KINDS; k++) {
		double i50, i99, idaemon, b50, b99, bdaemon;

		series_quantiles(&h->idle[k], &i50, &i99, &idaemon);
		series_quantiles(&h->busy[k], &b50, &b99, &bdaemon);
		table_cell(&t, "%s", kind_names[k]);
		table_cell(&t, "%.1f", i50);
		table_cell(&t, "%.1f", i99);
		table_cell(&t, "%.1f", b50);
		table_cell(&t, "%.1f", b99);
		table_cell(&t, "%.2f", i50 > 0 ? b50 / i50 : 0);
		table_cell(&t, "%.2f", i99 > 0 ? b99 / i99 : 0);
		table_cell(&t, "%.1f / %.1f", idaemon, bdaemon);
		const double fig[] = { i50, i99, b50, b99, idaemon, bdaemon };
		static const char *const fig_names[] = { "idle_p50_us", "idle_p99_us",
							 "busy_p50_us", "busy_p99_us",
							 "daemon_idle_p50_us", "daemon_busy_p50_us" };
		for (size_t f = 0; f < sizeof fig / sizeof fig[0]; f++) {
			snprintf(key, sizeof key, "%s_%s", kind_names[k], fig_names[f]);
			bench_sched_figure(b, key, fig[f]);
		}
		snprintf(what, sizeof what, "%s p50 busy / idle", kind_names[k]);
		bench_sched_target(b, what, i50 > 0 ? b50 / i50 : 0, -1, TARGET_RATIO, "<= 3");
		snprintf(what, sizeof what, "%s p99 busy / idle", kind_names[k]);
		bench_sched_target(b, what, i99 > 0 ? b99 / i99 : 0, -1, TARGET_RATIO, "<= 3");
	}
	if (!b->cli->json)
		table_print(&t, stdout);
	table_free(&t);
	bench_sched_say(b, "busy: %u long put%s (checksum, put) and %u long get%s (get), each "
			   "through the whole of a round; rounds during which one ended were taken "
			   "again\n",
			h->put.starts, h->put.starts == 1 ? "" : "s", h->get.starts,
			h->get.starts == 1 ? "" : "s");
}

int bench_latency_head_of_line(struct bench_sched *b)
{
	struct hol h = {
		.put = { "put", "the long put from scratch:", KIND_CHECKSUM, KIND_PUT, 0, 0 },
		.get = { "get", "the long get to scratch:", KIND_GET, KIND_GET, 0, 0 },
	};
	char size[32];
	int rc = 0;

	h.long_bytes = bench_sched_fit(b->cuda ? LONG_JOB_CUDA : LONG_JOB_HOST, 4, b->mem_total);
	bench_job_name(b, "l", h.l, sizeof h.l);
	bench_job_name(b, "c", h.c, sizeof h.c);
	bench_job_name(b, "p", h.p, sizeof h.p);
	human_bytes(size, sizeof size, h.long_bytes, 2);
	bench_sched_say(b, "\n(2) head of line: a 1 MiB checksum, a 1 MiB put from scratch: and a "
			   "1 MiB get to scratch: (wait: true, this clock), %u of each idle, then %u "
			   "checksums and puts while a %s put from scratch: runs on another buffer, "
			   "and %u gets while a %s get to scratch: does\n",
			b->samples, b->samples, size, b->samples, size);
	for (int k = 0; k < KINDS && rc == 0; k++)
		if (series_alloc(&h.idle[k], b->samples) < 0 ||
		    series_alloc(&h.busy[k], b->samples) < 0)
			rc = bench_sched_fail(b, "out of memory for %u samples", b->samples);
	if (rc == 0)
		rc = small_buffers(b, h.c, h.p);
	if (rc == 0)
		rc = bench_job_alloc(b, h.l, h.long_bytes, false);
	if (rc == 0)
		rc = hol_idle(b, &h);
	if (rc == 0)
		rc = hol_busy(b, &h, &h.put);
	if (rc == 0)
		rc = hol_busy(b, &h, &h.get);
	if (h.put.id && bench_job_cancel_all(b, &h.put.id, 1) < 0)
		rc = -1;
	if (h.get.id && bench_job_cancel_all(b, &h.get.id, 1) < 0)
		rc = -1;
	if (rc == 0)
		hol_report(b, &h);
	bench_job_free(b, h.l);
	bench_job_free(b, h.c);
	bench_job_free(b, h.p);
	for (int k = 0; k < KINDS; k++) {
		series_free(&h.idle[k]);
		series_free(&h.busy[k]);
	}
	return rc;
}

/* ---- part 3: priority ---- */

struct prio {
	char q[64], c[64];
	uint64_t low_bytes;
	uint64_t ids[LOW_JOBS];
	double idle_wall[IDLE_SAMPLES], idle_daemon[IDLE_SAMPLES];
	double high_wall[HIGH_SAMPLES], high_daemon[HIGH_SAMPLES];
	double submit_s, drain_s;
	uint64_t queued_after;
};

static uint64_t low_put(struct bench_sched *b, struct mp_map *req, unsigned i, void *arg)
{
	const struct prio *p = arg;
	uint64_t id = bench_job_begin(b, req, "put", false);

	bench_job_put_scratch(req, p->q, (i % RING) * p->low_bytes, p->low_bytes);
	mp_put_str(req, "priority", "low");
	return id;
}

/* n high-priority checksums of C one after another into wall and daemon. */
static int high_checksums(struct bench_sched *b, struct prio *p, unsigned n, double *wall,
			  double *daemon)
{
	struct series s = { wall, daemon, 0 };

	while (s.n < n)
		if (small_checksum(b, p->c, "high", &s) < 0)
			return -1;
	return 0;
}

/* The daemon's queue depth on the device now (jobs queued, not in flight). */
static int queue_depth(struct bench_sched *b, uint64_t *depth)
{
	const msgpack_object *dev;
	struct gpuq_reply *r;

	if (bench_job_device(b, &r, &dev) < 0)
		return -1;
	*depth = dev ? field_u64(dev, "queue_depth", 0) : 0;
	gpuq_reply_free(r);
	return 0;
}

static int prio_measure(struct bench_sched *b, struct prio *p)
{
	double t0;

	if (small_buffers(b, p->c, NULL) < 0 ||
	    bench_job_alloc(b, p->q, RING * p->low_bytes, false) < 0 ||
	    high_checksums(b, p, WARMUP, p->idle_wall, p->idle_daemon) < 0 ||
	    high_checksums(b, p, IDLE_SAMPLES, p->idle_wall, p->idle_daemon) < 0)
		return -1;
	t0 = bench_now();
	if (bench_job_submit_all(b, LOW_JOBS, low_put, p->ids, p) < 0)
		return -1;
	p->submit_s = bench_now() - t0;
	if (high_checksums(b, p, HIGH_SAMPLES, p->high_wall, p->high_daemon) < 0 ||
	    queue_depth(b, &p->queued_after) < 0)
		return -1;
	t0 = bench_now();
	if (bench_job_cancel_all(b, p->ids, LOW_JOBS) < 0)
		return -1;
	p->drain_s = bench_now() - t0;
	return 0;
}

static void prio_report(struct bench_sched *b, struct prio *p)
{
	double first = p->high_wall[0] * 1e6;
	double idle = bench_median(p->idle_wall, IDLE_SAMPLES) * 1e6;
	double high = bench_median(p->high_wall, HIGH_SAMPLES) * 1e6;
	double worst = p->high_wall[HIGH_SAMPLES - 1] * 1e6; /* sorted by the median */
	double ratio = idle > 0 ? high / idle : 0;
	bool held = p->queued_after > 0;

	bench_sched_say(b, "idle: %.1f µs (median of %d; the daemon's %.1f µs); behind the "
			   "backlog: median %.1f µs, first %.1f µs, worst %.1f µs (the daemon's "
			   "median %.1f µs)\n",
			idle, IDLE_SAMPLES, bench_median(p->idle_daemon, IDLE_SAMPLES) * 1e6,
			high, first, worst, bench_median(p->high_daemon, HIGH_SAMPLES) * 1e6);
	bench_sched_say(b, "backlog: %d puts sent in %.3f s, %" PRIu64 " still queued after the "
			   "checksums%s; cancelled and drained in %.3f s\n",
			LOW_JOBS, p->submit_s, p->queued_after,
			held ? "" : " (NONE: the checksums did not run behind a backlog)",
			p->drain_s);
	bench_sched_figure(b, "low_jobs", LOW_JOBS);
	bench_sched_figure(b, "low_bytes", (double)p->low_bytes);
	bench_sched_figure(b, "idle_us", idle);
	bench_sched_figure(b, "high_us", high);
	bench_sched_figure(b, "high_first_us", first);
	bench_sched_figure(b, "high_worst_us", worst);
	bench_sched_figure(b, "queued_after", (double)p->queued_after);
	bench_sched_figure(b, "submit_s", p->submit_s);
	bench_sched_figure(b, "drain_s", p->drain_s);
	bench_sched_figure(b, "high_over_idle", ratio);
	/* Without a backlog left the figure measures nothing: never counted as met. */
	bench_sched_target(b, held ? "high checksum / idle" : "high checksum / idle (no backlog)",
			   held ? ratio : 0, -1, TARGET_RATIO, "<= 3");
}

int bench_latency_priority(struct bench_sched *b)
{
	struct prio *p = calloc(1, sizeof *p);
	char size[32];
	int rc;

	if (!p)
		return bench_sched_fail(b, "out of memory");
	p->low_bytes = bench_sched_fit(b->cuda ? LOW_BYTES_CUDA : LOW_BYTES_HOST, 4 * RING,
				       b->mem_total);
	bench_job_name(b, "q", p->q, sizeof p->q);
	bench_job_name(b, "c", p->c, sizeof p->c);
	bench_sched_say(b, "\n(3) priority: %d low-priority puts of %s from scratch: (detached, "
			   "into %d ranges of one buffer), then %d high-priority 1 MiB checksums "
			   "one after another\n",
			LOW_JOBS, human_bytes(size, sizeof size, p->low_bytes, 0), RING,
			HIGH_SAMPLES);
	rc = prio_measure(b, p);
	if (rc < 0)
		bench_job_cancel_all(b, p->ids, LOW_JOBS); /* whatever was sent of the backlog */
	else
		prio_report(b, p);
	bench_job_free(b, p->q);
	bench_job_free(b, p->c);
	free(p);
	return rc;
}
