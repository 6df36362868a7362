/*
 * Metrics in the Prometheus text exposition format: counters the main
 * thread keeps as jobs finish, and gauges read at render time from the
 * worker pool, the buffer and job tables and the server. Served by the
 * `metrics` op, and optionally written atomically (write, then rename) to a
 * file for node_exporter's textfile collector. Main thread only.
 */
#ifndef GPUQ_METRICS_H
#define GPUQ_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"

/* The quota limits refusals are counted by (metrics.c names them). */
#define METRICS_QUOTA_LIMITS 10

struct daemon;

#define METRICS_MAX_OPS 48
#define METRICS_MAX_PATHS 48
/* Job latency buckets (seconds, upper bounds; +Inf follows). */
#define METRICS_LATENCY_BUCKETS 19

struct metrics_op {
	const char *op; /* the job kind's static name */
	uint64_t results[GPUQ_ERRC_COUNT]; /* by error code; GPUQ_OK: succeeded */
	uint64_t latency[METRICS_LATENCY_BUCKETS + 1]; /* per bucket, not cumulative */
	double latency_sum;
};

struct metrics_path {
	const char *op, *path; /* static strings */
	uint64_t bytes;
};

struct metrics {
	/* Seconds from submission to start, per priority: what the scheduler made jobs wait. */
	uint64_t queue_wait[GPUQ_PRIORITIES][METRICS_LATENCY_BUCKETS + 1];
	double queue_wait_sum[GPUQ_PRIORITIES];
	struct metrics_op ops[METRICS_MAX_OPS];
	int nops;
	struct metrics_path paths[METRICS_MAX_PATHS];
	int npaths;
	uint64_t quota_refusals[METRICS_QUOTA_LIMITS]; /* by limit, in metrics.c's order */
	uint64_t deadline_cancels;
	uint64_t reloads_ok, reloads_failed;
	uint64_t textfile_errors;
	char textfile_error[256]; /* the last one, logged once */
};

/* A job finished: latency is seconds from submission to its end. */
void metrics_job_finished(struct metrics *m, const char *op, enum gpuq_errc result,
			  double latency, const char *path, uint64_t bytes);
/* A job of that priority started `seconds` after its submission. */
void metrics_queue_wait(struct metrics *m, int priority, double seconds);
/* limit: "device-memory", "queued-jobs", "devices", "max-priority", or one of quota.h's holds ("reply-bytes"). */
void metrics_quota_refusal(struct metrics *m, const char *limit);

/* A growable text buffer. */
struct metrics_text {
	char *data;
	size_t len, cap;
	int failed; /* out of memory: the text is incomplete */
};
void metrics_text_free(struct metrics_text *t);

/* Renders every metric into t (initialised to zeros by the caller). 0, or -1 without memory. */
int metrics_render(struct daemon *d, struct metrics_text *t);

/* Writes the metrics to path through path.tmp and rename(). 0, or -1 with msg. */
int metrics_write_textfile(struct daemon *d, const char *path, char *msg, size_t msgsize);

#endif
