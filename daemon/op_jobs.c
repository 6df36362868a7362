/*
 * The jobs, status, wait and cancel requests. Main thread only. What
 * happens to a job between its submission and its end is job_life.c's.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "daemon/job_life.h"
#include "daemon/reply.h"

static void reply_record(struct request *req, const struct job *job, int cancel_requested)
{
	struct mp_map body, record;
	mp_map_init(&body);
	mp_map_init(&record);
	job_render(job, true, &record);
	mp_put_map(&body, "job", &record);
	if (cancel_requested >= 0)
		mp_put_bool(&body, "cancel_requested", cancel_requested);
	reply_ok(req, &body);
}

/* The ops on one job: status, wait, cancel. `job` is resolved to one the caller may see. */
struct job_args {
	uint64_t id;
	struct job *job;
	struct wait_options wait; /* wait only */
};

/* The job named by `job`, if the caller may see it. */
static int job_args_resolve(struct request *req, void *args, struct gpuq_error *err)
{
	struct job_args *a = args;
	struct job *job = job_find(&req->d->jobs, a->id);
	if (!job) {
		job_not_found(&req->d->jobs, a->id, err);
		return -1;
	}
	if (!quota_may_see(req->d, req->conn, job->owner))
		return gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
				 "job %llu belongs to uid %d (rule: a job is its owner's, root's and the admin group's)",
				 (unsigned long long)a->id, (int)job->owner);
	a->job = job;
	return 0;
}

#define JOB_FIELD                                                                     \
	{ "job", ARGS_U64, ARGS_REQUIRED, ARGS_AT(struct job_args, id),               \
	  .missing = "field 'job' (the job id) is required", .then = job_args_resolve }
static const struct args_field job_fields[] = { JOB_FIELD };
static const struct args_field wait_fields[] = {
	JOB_FIELD,
	{ "wait", ARGS_BOOL, 0, ARGS_AT(struct job_args, wait.wait) },
	{ "timeout_ms", ARGS_U64, 0, ARGS_AT(struct job_args, wait.timeout_ms) },
	{ "progress", ARGS_BOOL, 0, ARGS_AT(struct job_args, wait.progress) },
};
#undef JOB_FIELD
const struct args_spec op_status_args = ARGS_SPEC(struct job_args, job_fields, NULL);
const struct args_spec op_cancel_args = ARGS_SPEC(struct job_args, job_fields, NULL);
const struct args_spec op_wait_args = ARGS_SPEC(struct job_args, wait_fields, NULL);
const struct args_spec op_jobs_args = ARGS_NONE;

void op_jobs(struct request *req, void *args)
{
	struct mp_map body;
	(void)args;
	struct mp_array list;
	mp_map_init(&body);
	mp_array_init(&list);
	bool admin = quota_is_admin(req->d, req->conn);
	for (const struct job *j = req->d->jobs.oldest; j; j = j->newer) {
		if (!admin && j->owner != req->conn->uid)
			continue;
		struct mp_map record;
		mp_map_init(&record);
		job_render(j, false, &record);
		mp_array_map(&list, &record);
	}
	mp_put_array(&body, "jobs", &list);
	reply_ok(req, &body);
}

void op_status(struct request *req, void *args)
{
	reply_record(req, ((struct job_args *)args)->job, -1);
}

void op_wait(struct request *req, void *args)
{
	const struct job_args *a = args;
	if (job_is_finished(a->job))
		reply_outcome(req->conn, req->id, a->job);
	else
		wait_for(req, a->job, &a->wait);
}

void op_cancel(struct request *req, void *args)
{
	struct job *job = ((struct job_args *)args)->job;
	if (job_is_finished(job)) {
		reply_record(req, job, 0);
		return;
	}
	if (job_unqueue(req->d, job)) {
		char why[128];
		snprintf(why, sizeof why, "cancelled by uid %d while queued", (int)req->conn->uid);
		cancel_unqueued(req->d, job, why);
	} else {
		job_cancel_running(req->d, job);
	}
	reply_record(req, job, 1);
	job_evict_history(&req->d->jobs);
}
