/*
 * gpuq top: a live view of gpuqd. Three files, one concern each:
 *
 *   top_snapshot.c  asks the daemon (ping, devices, jobs, buffers) and turns
 *                   two polls into a snapshot: the daemon's counters are
 *                   cumulative, so busy shares and rates are deltas
 *   top_view.c      renders a snapshot as text (a table per section) or JSON
 *   top.c           the command: --once, or the terminal loop with its keys
 *
 * Everything here runs on gpuq's one thread.
 */
#ifndef GPUQ_CLI_TOP_H
#define GPUQ_CLI_TOP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "client/cli/cli.h"

/* The engines of the protocol's scheduler maps, in display order. */
#define TOP_ENGINES 6
extern const char *const top_engine_keys[TOP_ENGINES];   /* "h2d", ... */
extern const char *const top_engine_titles[TOP_ENGINES]; /* "H2D", ... */

struct top_device {
	uint64_t index, mem_total, mem_free, mem_used, queue_depth, inflight;
	char name[64], health[64];
	bool healthy;
	/* Cumulative counters as read; the next poll's rates start from them. */
	double busy_s[TOP_ENGINES];
	uint64_t jobs, bytes_moved;
	/* Over the interval since the previous poll; has_rates is false on the first. */
	bool has_rates;
	double busy_share[TOP_ENGINES]; /* 0..1 of the interval */
	double bytes_per_s, jobs_per_s;
};

/* One user's buffers on one device. */
struct top_memory {
	uint64_t device, owner, buffers, bytes;
};

/* A job queued or running (finished ones only count towards device time). */
struct top_job {
	uint64_t job, owner, device;
	char op[32], state[16], priority[8], buffer[80], reason[16], waiting[160];
	double age_s, run_s;
};

/* One user's jobs, and the device time they have had. */
struct top_user {
	uint64_t owner, running, queued;
	double recent_s; /* device time during the interval */
	double total_s;  /* run time of every job the daemon still lists */
};

/* A job id and its run time at the previous poll, for device time deltas. */
struct top_seen {
	uint64_t job;
	double run_s;
};

struct top_snapshot {
	char server[64], backend[16];
	double uptime_s;
	double interval_s; /* between the two polls; 0 on the first */
	struct top_device *devices;
	struct top_memory *memory;
	struct top_job *jobs;
	struct top_user *users;
	struct top_seen *seen;
	int ndevices, nmemory, njobs, nusers, nseen;
	double polled_at; /* CLOCK_MONOTONIC seconds */
};

/* What the user chose to see: filters and sort, changed by keys. */
enum top_sort { TOP_SORT_PRIORITY, TOP_SORT_AGE, TOP_SORT_DEVICE, TOP_SORT_OWNER, TOP_SORTS };

struct top_view {
	int device;     /* -1: all */
	int64_t owner;  /* -1: all */
	enum top_sort sort;
};

/* top_snapshot.c */
/* CLOCK_MONOTONIC in seconds: what polls are timed with. */
double top_now_s(void);
/*
 * Polls the daemon into next, with rates against prev (NULL, or a snapshot
 * with no devices: none). 0, or -1 with err: the connection failed or the
 * daemon refused (the message says which request).
 */
int top_snapshot_poll(struct gpuq_client *c, const struct top_snapshot *prev,
		      struct top_snapshot *next, struct gpuq_error *err);
void top_snapshot_free(struct top_snapshot *s);
const char *top_sort_name(enum top_sort sort);
/* Sorts s's jobs by sort (ties: the older job first). */
void top_snapshot_sort(struct top_snapshot *s, enum top_sort sort);

/* top_view.c */
/* The snapshot as text, filtered by v: header, devices, memory, users, jobs. */
void top_view_text(FILE *f, const struct top_snapshot *s, const struct top_view *v);
/* The snapshot as one JSON object (filtered by v as the text is). */
void top_view_json(FILE *f, const struct top_snapshot *s, const struct top_view *v);

#endif
