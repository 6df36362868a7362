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

/* The job named by the request's `job` field, if the caller may see it. */
static struct job *lookup_job(struct request *req, struct gpuq_error *err)
{
	uint64_t id;
	int rc = msg_get_u64(req->map, "job", &id, err);
	if (rc == 0)
		gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'job' (the job id) is required");
	if (rc <= 0)
		return NULL;
	struct job *job = job_find(&req->d->jobs, id);
	if (!job) {
		gpuq_fail(err, GPUQ_E_NOT_FOUND,
			  "job %llu not found (ids so far: 1-%llu; the last %u finished jobs are kept)",
			  (unsigned long long)id, (unsigned long long)(req->d->jobs.next_id - 1),
			  req->d->jobs.history_max);
		return NULL;
	}
	if (!quota_may_see(req->d, req->conn, job->owner)) {
		gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
			  "job %llu belongs to uid %d (rule: a job is its owner's, root's and the admin group's)",
			  (unsigned long long)id, (int)job->owner);
		return NULL;
	}
	return job;
}

void op_jobs(struct request *req)
{
	struct mp_map body;
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

void op_status(struct request *req)
{
	struct gpuq_error err;
	struct job *job = lookup_job(req, &err);
	if (!job)
		reply_error(req, &err);
	else
		reply_record(req, job, -1);
}

void op_wait(struct request *req)
{
	struct gpuq_error err;
	struct wait_options opts;
	struct job *job = lookup_job(req, &err);
	if (job && read_wait_options(req, &opts, &err) < 0)
		job = NULL;
	if (!job)
		reply_error(req, &err);
	else if (job_is_finished(job))
		reply_outcome(req->conn, req->id, job);
	else
		wait_for(req, job, &opts);
}

void op_cancel(struct request *req)
{
	struct gpuq_error err;
	struct job *job = lookup_job(req, &err);
	if (!job) {
		reply_error(req, &err);
		return;
	}
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
