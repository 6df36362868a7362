/*
 * The job table: every job from submission until it is evicted from the
 * bounded history of finished jobs. Main thread only.
 *
 * A job owns a struct work, which is the worker's from worker_submit until
 * the completion queue returns it (see workers/worker.h). Clients waiting for
 * a job are waiters: each is linked both to its job and to its connection,
 * so that either side going away unlinks it.
 */
#ifndef GPUQ_JOB_H
#define GPUQ_JOB_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon/buffer.h"
#include "protocol/msg.h"
#include "workers/work.h"

struct conn;
struct daemon;
struct job;
struct lease;
struct region;

/*
 * The request that made a job, as it arrived (the frame's msgpack map),
 * with the connection and request id it came on: a re-exec hands it to
 * the next image, which submits it again (daemon/replay.h).
 */
struct job_request {
	uint64_t conn; /* the connection's serial */
	uint64_t id;   /* the request id the client chose */
	size_t len;
	uint8_t bytes[];
};

struct waiter {
	struct job *job;
	struct conn *conn;
	uint64_t request_id;
	uv_timer_t timer; /* armed only with a timeout */
	bool timer_armed;
	bool progress; /* the request asked for progress events (daemon/progress.c) */
	struct waiter *job_prev, *job_next;
	struct waiter *conn_prev, *conn_next;
};

/* What differs between kinds of job: what happens at the end, what the result says. */
struct job_kind {
	const char *op;
	/* Main thread, after the work comes back (success or not). May be NULL. */
	void (*finish)(struct daemon *d, struct job *job);
	/* Adds the op's result keys. May be NULL. */
	void (*render)(const struct job *job, struct mp_map *result);
};

struct job {
	uint64_t id;
	const struct job_kind *kind;
	enum gpuq_job_state state;
	uid_t owner;
	gid_t gid;
	int priority; /* enum gpuq_priority */
	pid_t pid;
	struct buffer *buffer; /* held (users++) until the job finishes */
	/* copy's destination (and run's --out), held like `buffer`; released (and cleared) when the job ends */
	struct buffer *buffer2;
	/*
	 * The region a put/get moves bytes through (held: users++, until the
	 * job ends), or the region a region_create/region_free makes or
	 * frees (not held: region_free waits for the holders).
	 */
	struct region *region;
	bool region_held;
	/* attach: the lease it asks for (daemon/lease.h), until its finish hook grants it. */
	struct lease *lease;
	/* The job replies only when it has finished, whatever the request's `wait` (attach). */
	bool must_wait;
	/*
	 * A descriptor the reply to one waiter carries (attach: the buffer's
	 * handle, to the request that asked): reply_conn's request reply_id.
	 * Not ours; -1 once sent or when none.
	 */
	int reply_fd;
	struct conn *reply_conn;
	uint64_t reply_id;
	char buffer_label[BUFFER_NAME_MAX + 16]; /* "w0@1", kept after the buffer goes */
	/* The buffer as it was when attached, for records rendered after it is gone. */
	struct {
		char name[BUFFER_NAME_MAX + 1];
		int device;
		enum gpuq_dtype dtype;
		uint64_t count, bytes;
		bool ephemeral;
	} brief;
	struct work work;
	/*
	 * A gang job (one work per device, see worker_submit_group) keeps its
	 * works here; `work` then holds their merged outcome once all are back.
	 * NULL for an ordinary job, whose one work is `work`.
	 */
	struct work *parts;
	int nparts, parts_done;
	/* Frees what the op attached to the job (work.spec) when the job is freed. May be NULL. */
	void (*release)(struct job *job);
	double submitted, finished;
	double run_seconds;
	/* Its request, kept for a re-exec to replay until it ends; NULL when none was (why_kept_not says why). */
	struct job_request *request;
	const char *why_kept_not; /* static text; NULL: a job of gpuqd's own */
	/* A restart took it out of its queue for the next image to replay: no worker starts it. */
	bool held;
	struct gpuq_error error;
	struct waiter *waiters;
	struct job *hash_next;
	struct job *older, *newer; /* the table's list, in submission order */
	struct job *finished_after; /* the history's list, in the order jobs finished */
};

/* A job's works: its gang parts, or its one work. */
static inline int job_nworks(const struct job *job)
{
	return job->parts ? job->nparts : 1;
}

static inline struct work *job_work(struct job *job, int i)
{
	return job->parts ? &job->parts[i] : &job->work;
}

/* The device work i of the job runs on. */
static inline int job_device(const struct job *job, int i)
{
	return job->parts ? job->parts[i].device : job->work.device;
}

/*
 * What the layers above hear of jobs, set once at start-up (main.c): the
 * service glue counts each job against its owner's quota and in the
 * metrics as it goes to a worker (or is done at once) and as it ends; a
 * shutdown under way takes its next step each time a job's last work comes
 * back.
 */
struct job_hooks {
	void (*started)(struct daemon *d, const struct job *job);
	void (*finished)(struct daemon *d, const struct job *job);
	void (*shutdown_step)(struct daemon *d);
	void (*restart_step)(struct daemon *d); /* a job ended during a restart's drain (restart.h) */
};

#define JOB_BUCKETS 4096

struct job_table {
	struct job *buckets[JOB_BUCKETS];
	struct job *oldest, *newest;
	/*
	 * Finished jobs in the order they finished: the history keeps the last
	 * history_max to finish, whenever they were submitted (a long job that
	 * ends after many later short ones is the newest to finish).
	 */
	struct job *first_finished, *last_finished;
	uint64_t next_id;
	uint64_t skipped_to; /* the first id after a skip past a dead gpuqd's ids; 0: none */
	unsigned finished_count;
	unsigned history_max;
	unsigned active; /* queued or running (held ones too) */
	struct job_hooks hooks;
	/*
	 * A replayed request's job (daemon/replay.h) takes the id and the
	 * submission time it had in the previous image: job_create uses these
	 * once, then clears them. id 0: a fresh id.
	 */
	struct {
		uint64_t id;
		double submitted;
	} reuse;
};

void job_table_init(struct job_table *t, unsigned history_max);
/* Ids go on from first (above every id a gpuqd that died gave out). Main thread only. */
void job_table_skip_ids(struct job_table *t, uint64_t first);
/*
 * Fills err with not_found for an id that names no job, saying what ids
 * there are: none yet, none since a skip (never "the newest job" then: the
 * id below the skip was not given out), or the newest and the history kept.
 */
void job_not_found(const struct job_table *t, uint64_t id, struct gpuq_error *err);
/* Frees every job; waiters must already be gone. */
void job_table_destroy(struct job_table *t);

/* A new QUEUED job with a fresh id (or t->reuse's), in the table; NULL when out of memory. */
struct job *job_create(struct job_table *t, const struct job_kind *kind, uid_t owner,
		       gid_t gid, pid_t pid);
/*
 * Makes job a gang of n works (1..GPUQ_MAX_DEVICES), each with its owner
 * set; the caller fills in their devices and parameters. 0, or -1 when out
 * of memory.
 */
int job_make_gang(struct job *job, int n);
/* Asks every work of the job to stop at its next chunk. */
void job_request_cancel(struct job *job);
/*
 * Called as each work of the job comes back; true once all have (a gang's
 * outcome is then merged into job->work).
 */
bool job_work_returned(struct job *job);

/*
 * Keeps a copy of the request that made job (its frame's payload, at most
 * the frame limit), freed with the job. -1 when out of memory: the job
 * then cannot be replayed.
 */
int job_keep_request(struct job *job, uint64_t conn_serial, uint64_t request_id,
		     const void *bytes, size_t len);

/* Takes a job that was never submitted back out of the table. */
void job_discard(struct job_table *t, struct job *job);
struct job *job_find(struct job_table *t, uint64_t id);

/* Whether uid may see and touch job (its owner, or root). */
bool job_visible(const struct job *job, uid_t uid);

/* QUEUED -> RUNNING as far as the worker has said (reads work.phase). */
enum gpuq_job_state job_current_state(const struct job *job);
bool job_is_finished(const struct job *job);

/*
 * Records the outcome of the job's work (state from its error), stamps the
 * end time and lets its kept request go; job_evict_history then evicts the
 * jobs that finished first beyond the history bound.
 * The job itself is evicted last, never before its waiters are answered.
 */
void job_mark_finished(struct job_table *t, struct job *job);
void job_evict_history(struct job_table *t);

/* The job record of docs/protocol.md; with_result adds `result`. */
void job_render(const struct job *job, bool with_result, struct mp_map *out);

/* Adds `error`: {code, message} to out. */
void error_render(const struct gpuq_error *err, struct mp_map *out);


#endif
