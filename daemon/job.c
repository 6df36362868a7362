/* The job table. Main thread only (see job.h). */
#include "daemon/job.h"

#include "workers/sched/sched.h"
#include "workers/clock.h"

#include <stdlib.h>
#include <string.h>

static void job_free(struct job *job)
{
	if (job->release)
		job->release(job);
	free(job->parts);
	free(job->request);
	free(job);
}

void job_table_init(struct job_table *t, unsigned history_max)
{
	memset(t, 0, sizeof *t);
	t->next_id = 1;
	t->history_max = history_max;
}

void job_table_skip_ids(struct job_table *t, uint64_t first)
{
	if (first > t->next_id)
		t->next_id = t->skipped_to = first;
}

void job_not_found(const struct job_table *t, uint64_t id, struct gpuq_error *err)
{
	unsigned long long n = (unsigned long long)id;
	if (t->next_id == 1)
		gpuq_fail(err, GPUQ_E_NOT_FOUND, "job %llu not found (no job was submitted yet)", n);
	else if (t->next_id == t->skipped_to)
		gpuq_fail(err, GPUQ_E_NOT_FOUND,
			  "job %llu not found (no job was submitted since gpuqd came back after it "
			  "died; the ids of this run start at %llu, those of the gpuqd that died are "
			  "gone)", n, (unsigned long long)t->skipped_to);
	else
		gpuq_fail(err, GPUQ_E_NOT_FOUND,
			  "job %llu not found (the newest job is %llu; the last %u finished jobs are "
			  "kept)", n, (unsigned long long)(t->next_id - 1), t->history_max);
}

void job_table_destroy(struct job_table *t)
{
	struct job *j = t->oldest;
	while (j) {
		struct job *next = j->newer;
		job_free(j);
		j = next;
	}
	memset(t->buckets, 0, sizeof t->buckets);
	t->oldest = t->newest = NULL;
	t->first_finished = t->last_finished = NULL;
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
	job->id = t->reuse.id ? t->reuse.id : t->next_id++;
	job->kind = kind;
	job->state = GPUQ_JOB_QUEUED;
	job->owner = owner;
	job->gid = gid;
	job->pid = pid;
	job->priority = GPUQ_PRIORITY_NORMAL;
	job->work.priority = GPUQ_PRIORITY_NORMAL;
	job->work.weight = 1;
	job->submitted = t->reuse.id ? t->reuse.submitted : monotonic_seconds();
	t->reuse.id = 0;
	job->work.fd = -1;
	job->reply_fd = -1;
	job->work.device = -1;
	job->work.gang_size = 1;
	job->work.owner = job;
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

int job_keep_request(struct job *job, uint64_t conn_serial, uint64_t request_id,
		     const void *bytes, size_t len)
{
	struct job_request *r = malloc(sizeof *r + len);
	if (!r) {
		job->why_kept_not = "gpuqd had no memory to keep its request";
		return -1;
	}
	*r = (struct job_request){ .conn = conn_serial, .id = request_id, .len = len };
	memcpy(r->bytes, bytes, len);
	free(job->request);
	job->request = r;
	return 0;
}

void job_discard(struct job_table *t, struct job *job)
{
	job_unlink(t, job);
	t->active--;
	job_free(job);
}

int job_make_gang(struct job *job, int n)
{
	job->parts = calloc((size_t)n, sizeof *job->parts);
	if (!job->parts)
		return -1;
	job->nparts = n;
	for (int i = 0; i < n; i++) {
		job->parts[i].kind = job->work.kind;
		job->parts[i].fd = -1;
		job->parts[i].device = -1;
		job->parts[i].gang_size = (unsigned)n;
		job->parts[i].owner = job;
	}
	return 0;
}

void job_request_cancel(struct job *job)
{
	if (!job->parts) {
		atomic_store(&job->work.cancel, true);
		return;
	}
	for (int i = 0; i < job->nparts; i++)
		atomic_store(&job->parts[i].cancel, true);
}

/*
 * A gang's outcome: the first real failure (a part cancelled because its
 * sibling failed says less than the sibling's own error), else the first
 * cancellation; its time is the slowest part's, its bytes all parts'.
 */
static void job_merge_gang(struct job *job)
{
	const struct work *failed = NULL, *cancelled = NULL;
	double started = 0;
	job->work.result.seconds = 0;
	job->work.result.bytes = 0;
	for (int i = 0; i < job->nparts; i++) {
		const struct work *p = &job->parts[i];
		if (p->error.code == GPUQ_E_CANCELLED)
			cancelled = cancelled ? cancelled : p;
		else if (p->error.code != GPUQ_OK && !failed)
			failed = p;
		if (p->result.seconds > job->work.result.seconds)
			job->work.result.seconds = p->result.seconds;
		job->work.result.bytes += p->result.bytes;
		if (p->started_at > 0 && (started == 0 || p->started_at < started))
			started = p->started_at;
	}
	job->work.result.path = job->parts[0].result.path;
	job->work.started_at = started;
	gpuq_error_clear(&job->work.error);
	if (failed || cancelled)
		job->work.error = (failed ? failed : cancelled)->error;
	atomic_store(&job->work.phase, WORK_FINISHED);
}

bool job_work_returned(struct job *job)
{
	if (!job->parts)
		return true;
	if (++job->parts_done < job->nparts)
		return false;
	job_merge_gang(job);
	return true;
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

/* When the job's first work started, or 0 if none has. */
static double job_started_at(const struct job *job)
{
	if (!job->parts || job_is_finished(job))
		return atomic_load(&job->work.phase) == WORK_QUEUED ? 0 : job->work.started_at;
	double started = 0;
	for (int i = 0; i < job->nparts; i++) {
		const struct work *p = &job->parts[i];
		if (atomic_load(&p->phase) != WORK_QUEUED && (started == 0 || p->started_at < started))
			started = p->started_at;
	}
	return started;
}

enum gpuq_job_state job_current_state(const struct job *job)
{
	if (job_is_finished(job))
		return job->state;
	return job_started_at(job) > 0 ? GPUQ_JOB_RUNNING : GPUQ_JOB_QUEUED;
}

void job_mark_finished(struct job_table *t, struct job *job)
{
	job->finished = monotonic_seconds();
	free(job->request); /* only a queued job is replayed: the history keeps no requests */
	job->request = NULL;
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
	job->finished_after = NULL;
	if (t->last_finished)
		t->last_finished->finished_after = job;
	else
		t->first_finished = job;
	t->last_finished = job;
}

void job_evict_history(struct job_table *t)
{
	struct job *before = NULL; /* the job finished before j that stays */
	struct job *j = t->first_finished;
	while (j && t->finished_count > t->history_max) {
		struct job *after = j->finished_after;
		if (j->waiters) { /* evicted once its waiters are answered */
			before = j;
		} else {
			if (before)
				before->finished_after = after;
			else
				t->first_finished = after;
			if (t->last_finished == j)
				t->last_finished = before;
			job_unlink(t, j);
			t->finished_count--;
			job_free(j);
		}
		j = after;
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
	double started = job_started_at(job);
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

/* Why the work waits, for people: the reason's words, the job it is behind, the buffer. */
static void waiting_text(const struct job *job, const struct work *w, enum sched_wait why,
			 uint64_t behind, char *out, size_t size)
{
	switch (why) {
	case SCHED_WAIT_QUEUE:
		snprintf(out, size, "queued: more urgent jobs, or other users' turns, go first on device %d",
			 w->device);
		return;
	case SCHED_WAIT_BUFFER: {
		bool one = !job->buffer2 && !job->parts && job->work.naccess <= 1 && job->buffer_label[0];
		snprintf(out, size, "behind job %llu on %s%s", (unsigned long long)behind,
			 one ? "buffer " : "one of its buffers", one ? job->buffer_label : "");
		return;
	}
	case SCHED_WAIT_GANG:
		snprintf(out, size,
			 "behind job %llu, an earlier multi-device job (they keep one order on every device)",
			 (unsigned long long)behind);
		return;
	case SCHED_WAIT_EXCLUSIVE:
		if (behind)
			snprintf(out, size, "behind job %llu: benchmarks run alone on device %d",
				 (unsigned long long)behind, w->device);
		else
			snprintf(out, size, "waiting for device %d to be idle: benchmarks run alone",
				 w->device);
		return;
	case SCHED_WAIT_CHAIN:
		snprintf(out, size, "behind job %llu: device %d runs one chain (run, reduce_expr) at a time",
			 (unsigned long long)behind, w->device);
		return;
	case SCHED_WAIT_INFLIGHT:
		snprintf(out, size, "device %d has as many jobs in flight as it takes (--max-inflight)",
			 w->device);
		return;
	case SCHED_WAIT_SLOTS:
		snprintf(out, size, "waiting for a pinned staging slot on device %d", w->device);
		return;
	case SCHED_WAIT_MEMORY:
		snprintf(out, size, "waiting for memory on device %d (wait_memory_ms)", w->device);
		return;
	case SCHED_WAIT_PEERS:
		snprintf(out, size, "waiting for its parts on other devices");
		return;
	case SCHED_WAIT_LEASE:
		snprintf(out, size, "behind lease %llu on %s%s: a client has it attached (gpuq leases)",
			 (unsigned long long)behind, job->buffer_label[0] ? "buffer " : "one of its buffers",
			 job->buffer_label);
		return;
	case SCHED_WAIT_REGION:
		snprintf(out, size, "waiting for the jobs that use the region to finish");
		return;
	case SCHED_NOT_WAITING:
	case SCHED_WAIT_COUNT:
		break;
	}
	out[0] = '\0';
}

/* `waiting` (why, in words), `waiting_reason` and `waiting_job`: the first part that waits. */
static void render_waiting(const struct job *job, struct mp_map *out)
{
	int n = job->parts ? job->nparts : 1;
	for (int i = 0; i < n; i++) {
		const struct work *w = job->parts ? &job->parts[i] : &job->work;
		if (atomic_load(&w->phase) == WORK_FINISHED)
			continue;
		enum sched_wait why = (enum sched_wait)atomic_load(&w->waiting);
		uint64_t behind = atomic_load(&w->waiting_job);
		char text[200];
		waiting_text(job, w, why, behind, text, sizeof text);
		if (!text[0])
			continue;
		mp_put_str(out, "waiting", text);
		mp_put_str(out, "waiting_reason", sched_wait_name(why));
		if (behind)
			mp_put_u64(out, "waiting_job", behind);
		return;
	}
}

void job_render(const struct job *job, bool with_result, struct mp_map *out)
{
	enum gpuq_job_state state = job_current_state(job);
	mp_put_u64(out, "job", job->id);
	mp_put_str(out, "op", job->kind->op);
	mp_put_str(out, "state", gpuq_job_state_name(state));
	mp_put_u64(out, "owner", (uint64_t)job->owner);
	mp_put_i64(out, "device", job_device(job, 0));
	if (job->parts) {
		struct mp_array devices;
		mp_array_init(&devices);
		for (int i = 0; i < job->nparts; i++)
			mp_array_i64(&devices, job->parts[i].device);
		mp_put_array(out, "devices", &devices);
	}
	if (job->buffer_label[0])
		mp_put_str(out, "buffer", job->buffer_label);
	mp_put_str(out, "priority", gpuq_priority_name((enum gpuq_priority)job->priority));
	if (state == GPUQ_JOB_QUEUED || state == GPUQ_JOB_RUNNING)
		render_waiting(job, out);
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
