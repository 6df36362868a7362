/*
 * gpuq bench sched: gpuqd's per-GPU scheduler measured against what the
 * device does with nothing of gpuq's in the way, in the same run. Four
 * parts, each in its own file:
 *
 *   bench_sched.c          the run, its sizes, the report (text and JSON),
 *                          and part 1, overlap (put + get + chain against
 *                          the bench_sched op's raw ceiling)
 *   bench_sched_latency.c  parts 2 and 3: a small job's latency behind a
 *                          long put (head of line) and behind a backlog of
 *                          low-priority puts (priority), against idle
 *   bench_sched_fair.c     part 4: two owners' shares of the device
 *   bench_sched_jobs.c     the requests every part makes (calls that check
 *                          their reply, buffers, pipelined batches)
 *
 * One thread and one connection, except part 4's second owner (a child
 * process). A part that fails says why in its own record and the others
 * still run; only a broken connection stops the run.
 */
#ifndef GPUQ_BENCH_SCHED_H
#define GPUQ_BENCH_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "client/bench/bench_time.h"
#include "client/cli/cli.h"

#define BENCH_SCHED_MAX_FIGURES 48
#define BENCH_SCHED_MAX_TARGETS 6

enum bench_sched_state { PART_RAN, PART_FAILED, PART_SKIPPED };

/* A measured value, as --json prints it ("key": value). */
struct bench_sched_figure {
	char key[40];
	double value;
};

/* A value with its target range [lo, hi], for the closing table. */
struct bench_sched_target {
	char what[64];
	char target[24]; /* "<= 1.15", "50 +- 10 %" */
	double value, lo, hi;
	bool met;
};

struct bench_sched_part {
	const char *name; /* JSON key: overlap, head_of_line, priority, fairness */
	const char *title;
	enum bench_sched_state state;
	char why[600]; /* failed or skipped: the reason */
	struct bench_sched_figure figures[BENCH_SCHED_MAX_FIGURES];
	int nfigures;
	struct bench_sched_target targets[BENCH_SCHED_MAX_TARGETS];
	int ntargets;
};

/* The run: the connection, the device and what each part found. */
struct bench_sched {
	struct cli *cli;
	struct gpuq_client *c;
	bool cuda;                /* the daemon's backend is cuda (the targets are the H200's) */
	char backend[16];
	uint64_t device;
	uint64_t mem_total;       /* the device's, from devices */
	char tag[32];             /* "bsched.PID": the start of every buffer name */
	unsigned samples;         /* head of line: measured round trips per kind */
	unsigned reps;            /* overlap: timed rounds */
	uint64_t overlap_bytes;   /* overlap: each job's size */
	bool broken;              /* the connection broke: no further part runs */
	struct bench_sched_part *part; /* the part running now */
};

/* bench_sched.c: what a part records; say prints only without --json. */
void bench_sched_say(const struct bench_sched *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void bench_sched_figure(struct bench_sched *b, const char *key, double value);
/* A target value <= hi (lo < 0: no lower bound); text is how the table shows it. */
void bench_sched_target(struct bench_sched *b, const char *what, double value, double lo,
			double hi, const char *text);
/* Marks the running part failed (returns -1) or skipped, with the reason. */
int bench_sched_fail(struct bench_sched *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void bench_sched_skip(struct bench_sched *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* size, halved (not below 1 MiB) until n of it fit in budget bytes. */
uint64_t bench_sched_fit(uint64_t size, uint64_t n, uint64_t budget);

/* bench_sched_latency.c: parts 2 and 3; 0, or -1 with the part failed. */
int bench_latency_head_of_line(struct bench_sched *b);
int bench_latency_priority(struct bench_sched *b);
/* bench_sched_fair.c: part 4. */
int bench_fair_share(struct bench_sched *b);

/*
 * bench_sched_jobs.c. Every call checks its reply: a refusal or a failed
 * job fails the running part with "what: code: message" (a broken
 * connection also sets b->broken) and returns -1.
 */
/* The value at quantile q (0..1) of sorted v (bench_median sorts). */
double bench_job_quantile(const double *sorted, unsigned n, double q);
/* Sends req and returns its ok reply (the caller frees it). */
int bench_job_call(struct bench_sched *b, struct mp_map *req, const char *what,
		   struct gpuq_reply **out);
/* Starts a request (with wait: true when wait); returns its id. */
uint64_t bench_job_begin(struct bench_sched *b, struct mp_map *req, const char *op, bool wait);
/* Sends req and frees the reply. */
int bench_job_do(struct bench_sched *b, struct mp_map *req, const char *what);
/* "bsched.PID.SUFFIX" in out. */
const char *bench_job_name(const struct bench_sched *b, const char *suffix, char *out,
			   size_t size);
/* A buffer of bytes (dtype bytes), or of bytes / 4 f32 elements. */
int bench_job_alloc(struct bench_sched *b, const char *name, uint64_t bytes, bool f32);
int bench_job_fill_random(struct bench_sched *b, const char *name, uint64_t seed);
/* Frees name (after the jobs on it); quiet and best-effort: for cleanup. */
void bench_job_free(struct bench_sched *b, const char *name);
/* The same for root, of owner's buffer name. */
void bench_job_free_as(struct bench_sched *b, const char *name, int64_t owner);
/* A put of length bytes at offset from the scratch source (no descriptor). */
void bench_job_put_scratch(struct mp_map *req, const char *buffer, uint64_t offset,
			   uint64_t length);
/* The job record of a reply, and a field of a map inside a map ("result", "seconds"). */
const msgpack_object *bench_job_record(const struct gpuq_reply *r);
double bench_job_sub_f64(const msgpack_object *map, const char *sub, const char *key);
/* The devices reply (the caller frees it) and the bench's device in it (NULL: none such). */
int bench_job_device(struct bench_sched *b, struct gpuq_reply **out, const msgpack_object **dev);
/* The state of job id ("queued", "running", "done", ...) in state. */
int bench_job_state(struct bench_sched *b, uint64_t id, char *state, size_t size);

/*
 * n requests with up to 64 in flight on b's connection: build(i) starts and
 * fills the i-th request and returns its id, reply(i) looks at its reply (0
 * to go on, -1 after failing the part). Stops at the first failure, after
 * collecting the replies already owed.
 */
typedef uint64_t (*bench_job_build_fn)(struct bench_sched *b, struct mp_map *req, unsigned i,
				   void *arg);
typedef int (*bench_job_reply_fn)(struct bench_sched *b, const struct gpuq_reply *r,
				  unsigned i, void *arg);
int bench_job_pipeline(struct bench_sched *b, unsigned n, bench_job_build_fn build,
		       bench_job_reply_fn reply, void *arg);
/* Pipelined submissions of detached jobs: their ids in ids[i]. */
int bench_job_submit_all(struct bench_sched *b, unsigned n, bench_job_build_fn build,
			 uint64_t *ids, void *arg);
/* Cancels the jobs ids[0..n) (those not yet finished) and waits until every one has ended. */
int bench_job_cancel_all(struct bench_sched *b, const uint64_t *ids, unsigned n);
/* Waits until every job of ids[0..n) has ended; a failed one fails the part. */
int bench_job_wait_all(struct bench_sched *b, const uint64_t *ids, unsigned n);
/* on_record sees the status reply (bench_job_record: the record) of each job of ids[0..n). */
int bench_job_records(struct bench_sched *b, const uint64_t *ids, unsigned n,
		      bench_job_reply_fn on_record, void *arg);

#endif
