/* The job table. Main thread only (see job.h). */
#include "daemon/job.h"
#include "workers/clock.h"

#include <stdlib.h>
#include <string.h>

void job_table_init(struct job_table *t, unsigned history_max)
{
	memset(t, 0, sizeof *t);
	t->next_id = 1;
	t->history_max = history_max;
}

void job_table_destroy(struct job_table *t)
{
	struct job *j = t->oldest;
	while (j) {
		struct job *next = j->newer;
		free(j);
		j = next;
	}
	memset(t->buckets, 0, sizeof t->buckets);
	t->oldest = t->newest = NULL;
}

static struct job **bucket_of(struct job_table *t, uint64_t id)
{
	return &t->buckets[id % JOB_BUCKETS];
}

struct job *job_create(struct job_table *t, const struct job_kind *kind, uid_t owner,
		       gid_t gid, pid_t pid)
{
	struct job *job = calloc(1, sizeof *job);
	if (!job)
		return NULL;
	job->id = t->next_id++;
	job->kind = kind;
	job->state = GPUQ_JOB_QUEUED;
	job->owner = owner;
	job->gid = gid;
	job->pid = pid;
	job->submitted = monotonic_seconds();
	job->work.fd = -1;
	job->work.device = -1;
	struct job **bucket = bucket_of(t, job->id);
	job->hash_next = *bucket;
	*bucket = job;
	job->older = t->newest;
	if (t->newest)
		t->newest->newer = job;
	else
		t->oldest = job;
	t->newest = job;
	t->active++;
	return job;
}

static void job_unlink(struct job_table *t, struct job *job)
{
	for (struct job **link = bucket_of(t, job->id); *link; link = &(*link)->hash_next) {
		if (*link == job) {
			*link = job->hash_next;
			break;
		}
	}
	if (job->older)
		job->older->newer = job->newer;
	else
		t->oldest = job->newer;
	if (job->newer)
		job->newer->older = job->older;
	else
		t->newest = job->older;
}

void job_discard(struct job_table *t, struct job *job)
{
	job_unlink(t, job);
	t->active--;
	free(job);
}

struct job *job_find(struct job_table *t, uint64_t id)
{
	for (struct job *j = *bucket_of(t, id); j; j = j->hash_next)
		if (j->id == id)
			return j;
	return NULL;
}

bool job_visible(const struct job *job, uid_t uid)
{
	return uid == 0 || job->owner == uid;
}

bool job_is_finished(const struct job *job)
{
	return job->state == GPUQ_JOB_DONE || job->state == GPUQ_JOB_FAILED ||
	       job->state == GPUQ_JOB_CANCELLED;
}

enum gpuq_job_state job_current_state(const struct job *job)
{
	if (job_is_finished(job))
		return job->state;
	return atomic_load(&job->work.phase) == WORK_QUEUED ? GPUQ_JOB_QUEUED : GPUQ_JOB_RUNNING;
}

void job_mark_finished(struct job_table *t, struct job *job)
{
	job->finished = monotonic_seconds();
	job->error = job->work.error;
	job->run_seconds = job->work.result.seconds;
	if (job->error.code == GPUQ_OK)
		job->state = GPUQ_JOB_DONE;
	else if (job->error.code == GPUQ_E_CANCELLED)
		job->state = GPUQ_JOB_CANCELLED;
	else
		job->state = GPUQ_JOB_FAILED;
	t->active--;
	t->finished_count++;
}

void job_evict_history(struct job_table *t)
{
	struct job *j = t->oldest;
	while (j && t->finished_count > t->history_max) {
		struct job *newer = j->newer;
		if (job_is_finished(j) && !j->waiters) {
			job_unlink(t, j);
			t->finished_count--;
			free(j);
		}
		j = newer;
	}
}

void error_render(const struct gpuq_error *err, struct mp_map *out)
{
	struct mp_map e;
	mp_map_init(&e);
	mp_put_str(&e, "code", gpuq_errc_name(err->code));
	mp_put_str(&e, "message", err->message);
	mp_put_map(out, "error", &e);
}

static void render_times(const struct job *job, enum gpuq_job_state state, struct mp_map *out)
{
	double now = monotonic_seconds();
	double started = atomic_load(&job->work.phase) == WORK_QUEUED ? 0 : job->work.started_at;
	double queued = (started > 0 ? started : job_is_finished(job) ? job->finished : now) -
			job->submitted;
	double run = 0;
	if (job_is_finished(job))
		run = job->run_seconds;
	else if (state == GPUQ_JOB_RUNNING && started > 0)
		run = now - started;
	mp_put_f64(out, "queued_s", queued < 0 ? 0 : queued);
	mp_put_f64(out, "run_s", run);
}

void job_render(const struct job *job, bool with_result, struct mp_map *out)
{
	enum gpuq_job_state state = job_current_state(job);
	mp_put_u64(out, "job", job->id);
	mp_put_str(out, "op", job->kind->op);
	mp_put_str(out, "state", gpuq_job_state_name(state));
	mp_put_u64(out, "owner", (uint64_t)job->owner);
	mp_put_i64(out, "device", job->work.device);
	if (job->buffer_label[0])
		mp_put_str(out, "buffer", job->buffer_label);
	render_times(job, state, out);
	if (state == GPUQ_JOB_DONE && with_result) {
		struct mp_map result;
		mp_map_init(&result);
		if (job->kind->render)
			job->kind->render(job, &result);
		mp_put_map(out, "result", &result);
	}
	if (state == GPUQ_JOB_FAILED || state == GPUQ_JOB_CANCELLED)
		error_render(&job->error, out);
}
