/*
 * The life of a job on the main thread, from submission to its end:
 * handing its works to the workers, the clients waiting for it, what it
 * lets go of when it ends, cancellation. Main thread only. The job table
 * itself and the job record are job.h's; the jobs, status, wait and cancel
 * requests are op_jobs.c's.
 */
#ifndef GPUQ_JOB_LIFE_H
#define GPUQ_JOB_LIFE_H

#include <stdbool.h>
#include <stdint.h>

#include "protocol/protocol.h"

struct conn;
struct daemon;
struct job;
struct request;
struct work;

/*
 * The common path of every job request. Submits job to its worker and
 * answers req now (queued) or registers a waiter (wait: true). On refusal
 * the job is discarded, its buffer released and req answered.
 */
void job_submit(struct request *req, struct job *job);
/*
 * Submits a job of gpuqd's own, which no client asked for or waits on (the
 * free of an orphaned ephemeral buffer or region): normal priority, weight
 * 1, outside quotas. 0, or -1 with err (a full queue): the caller undoes
 * what it prepared and discards the job.
 */
int job_submit_own(struct daemon *d, struct job *job, struct gpuq_error *err);
/* Main thread: the worker pool's completion callback. */
void job_on_done(struct work *work, void *arg);
/*
 * A job whose work needs no device (the free of a buffer a reset lost):
 * done at once, on the main thread, and answered with its record.
 */
void job_finish_now(struct request *req, struct job *job);

/* The fields every job request (and `wait`) takes, type-checked whether or not they are used. */
struct wait_options {
	bool wait, progress;
	uint64_t timeout_ms;
};

int read_wait_options(struct request *req, struct wait_options *o, struct gpuq_error *err);
/* Registers a waiter for req (answered when job ends) with its timeout and progress events. */
void wait_for(struct request *req, struct job *job, const struct wait_options *o);
/* Unlinks and frees every waiter of c: its CONN_CLOSED hook (server.h). */
void waiters_drop_conn(struct daemon *d, struct conn *c);

/* Takes every work of the job out of its queue, if none has started (a held job: it is let go). */
bool job_unqueue(struct daemon *d, struct job *job);
/* Ends a job none of whose works has started (they are out of every queue) with code and why. */
void job_fail_unqueued(struct daemon *d, struct job *job, enum gpuq_errc code, const char *why);
/*
 * A held job goes to the next image (a re-exec, daemon/replay.h): it
 * ends here without a word to its waiters, letting go of what it holds
 * as a failed job would (an alloc's new buffer, a free's hold), and leaves
 * the table; the next image submits its request again under its id.
 */
void job_hand_over(struct daemon *d, struct job *job);
/* Ends a job none of whose works has started (they are out of every queue). */
void cancel_unqueued(struct daemon *d, struct job *job, const char *why);
/* Cancels every queued job (shutdown), answering their waiters. */
void jobs_cancel_queued(struct daemon *d);
/* Ends every queued job, held ones too, with code and why, answering their waiters. */
void jobs_fail_queued(struct daemon *d, enum gpuq_errc code, const char *why);
/* Asks every running job to stop at its next chunk. */
void jobs_cancel_running(struct daemon *d);
/* Asks one running job to stop at its next chunk, and wakes its workers to see it. */
void job_cancel_running(struct daemon *d, struct job *job);
/* The same for every running job with a part on device. */
void jobs_cancel_running_on(struct daemon *d, int device);

#endif
