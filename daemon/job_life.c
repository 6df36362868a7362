/*
 * The life of a job on the main thread (job_life.h): submission, waiters,
 * what a job lets go of when it ends, completion, cancellation. Main
 * thread only.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "daemon/job_life.h"
#include "workers/log.h"
#include "daemon/progress.h"
#include "daemon/reply.h"

static void waiter_on_closed(uv_handle_t *handle)
{
	free(handle->data);
}

static void waiter_unlink(struct waiter *w)
{
	if (w->job_prev)
		w->job_prev->job_next = w->job_next;
	else
		w->job->waiters = w->job_next;
	if (w->job_next)
		w->job_next->job_prev = w->job_prev;
	if (w->conn_prev)
		w->conn_prev->conn_next = w->conn_next;
	else
		w->conn->waiters = w->conn_next;
	if (w->conn_next)
		w->conn_next->conn_prev = w->conn_prev;
	if (w->timer_armed) {
		uv_timer_stop(&w->timer);
		uv_close((uv_handle_t *)&w->timer, waiter_on_closed);
	} else {
		free(w);
	}
}

void waiters_drop_conn(struct daemon *d, struct conn *c)
{
	(void)d;
	while (c->waiters)
		waiter_unlink(c->waiters);
}

/*
 * The record goes along, so that the client knows which job to wait for
 * again; but an attach is given up with its request, and the reply says
 * that instead.
 */
static void waiter_on_timeout(uv_timer_t *timer)
{
	struct waiter *w = timer->data;
	struct job *job = w->job;
	struct conn *c = w->conn;
	struct daemon *d = c->server->daemon;
	uint64_t request_id = w->request_id;
	struct gpuq_error err;
	struct mp_map body, record;
	gpuq_fail(&err, GPUQ_E_TIMEOUT,
		  "job %llu is still %s; it goes on (gpuq wait %llu to wait again)",
		  (unsigned long long)job->id, gpuq_job_state_name(job_current_state(job)),
		  (unsigned long long)job->id);
	waiter_unlink(w); /* first: a job given up answers its waiters, and this one gets the timeout */
	if (job->lease)
		lease_attach_timed_out(d, job, c, request_id, &err);
	mp_map_init(&body);
	mp_map_init(&record);
	job_render(job, false, &record);
	mp_put_map(&body, "job", &record);
	error_render(&err, &body);
	reply_to(c, request_id, false, &body);
	job_evict_history(&d->jobs);
}

static int waiter_add(struct daemon *d, struct conn *c, uint64_t request_id, struct job *job,
		      uint64_t timeout_ms, struct gpuq_error *err)
{
	struct waiter *w = calloc(1, sizeof *w);
	if (!w)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no memory to wait for job %llu",
				 (unsigned long long)job->id);
	w->job = job;
	w->conn = c;
	w->request_id = request_id;
	if (timeout_ms > 0) {
		uv_timer_init(d->loop, &w->timer);
		w->timer.data = w;
		w->timer_armed = true;
		uv_timer_start(&w->timer, waiter_on_timeout, timeout_ms, 0);
	}
	w->job_next = job->waiters;
	if (job->waiters)
		job->waiters->job_prev = w;
	job->waiters = w;
	w->conn_next = c->waiters;
	if (c->waiters)
		c->waiters->conn_prev = w;
	c->waiters = w;
	return 0;
}

/*
 * The job lets go of b. An ephemeral buffer whose connection is gone goes
 * once nothing holds it (after a free that failed, only at the service's
 * next tick).
 */
static void job_let_go(struct daemon *d, const struct job *job, struct buffer *b)
{
	buffer_let_go(d, b, job->work.kind != WORK_FREE);
}

/*
 * What a job holds until it ends, whether it ran or was refused: its
 * buffers, what its op's finish hook settles, and the client's descriptor.
 */
static void job_release(struct daemon *d, struct job *job)
{
	if (job->buffer2) {
		job_let_go(d, job, job->buffer2);
		job->buffer2 = NULL;
	}
	if (job->kind->finish) /* while the job still holds its buffer (free and alloc's may remove it) */
		job->kind->finish(d, job);
	region_job_release(d, job);
	if (job->buffer) {
		job_let_go(d, job, job->buffer);
		job->buffer = NULL; /* the record keeps job->brief */
	}
	if (job->work.fd >= 0) {
		close(job->work.fd);
		job->work.fd = -1;
	}
}

/* Undoes a job that never reached a worker, as if it had failed with err. */
static void job_abandon(struct daemon *d, struct job *job, const struct gpuq_error *err)
{
	job->work.error = *err;
	durable_job_ended(d, job);
	job_release(d, job);
	job_discard(&d->jobs, job);
}

int read_wait_options(struct request *req, struct wait_options *o, struct gpuq_error *err)
{
	*o = (struct wait_options){ .wait = false };
	if (msg_get_bool(req->map, "wait", &o->wait, err) < 0 ||
	    msg_get_u64(req->map, "timeout_ms", &o->timeout_ms, err) < 0 ||
	    msg_get_bool(req->map, "progress", &o->progress, err) < 0)
		return -1;
	return 0;
}

/*
 * The request's `priority`: high, normal or low, within what the caller's
 * quota allows; absent, normal or the quota's cap if less urgent.
 */
static int read_priority(struct request *req, int *priority, struct gpuq_error *err)
{
	char name[16];
	enum gpuq_priority p;
	int rc = msg_get_str(req->map, "priority", name, sizeof name, err);
	if (rc < 0)
		return -1;
	if (rc == 0) {
		*priority = quota_default_priority(req->d, req->conn);
		return 0;
	}
	if (gpuq_priority_from_name(name, strlen(name), &p) < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'priority': '%s' is not a priority (high, normal, low)", name);
	*priority = (int)p;
	return quota_check_priority(req->d, req->conn, *priority, err);
}

/* What every work of job tells its scheduler: priority, whose share (weight), which job. */
static void job_set_scheduling(struct job *job, int priority, double weight)
{
	job->priority = priority;
	for (int i = 0; i < job_nworks(job); i++) {
		struct work *w = job_work(job, i);
		w->priority = priority;
		w->owner_uid = job->owner;
		w->weight = weight;
		w->job_id = job->id;
	}
}

void wait_for(struct request *req, struct job *job, const struct wait_options *o)
{
	struct gpuq_error err;
	if (waiter_add(req->d, req->conn, req->id, job, o->timeout_ms, &err) < 0)
		reply_error(req, &err);
	else
		progress_request(req->d, job->waiters, o->progress); /* the waiter just added */
}

void job_submit(struct request *req, struct job *job)
{
	struct daemon *d = req->d;
	struct gpuq_error err;
	struct wait_options opts;
	struct mp_map record;
	int priority = GPUQ_PRIORITY_NORMAL;
	int rc = read_wait_options(req, &opts, &err);
	/* A quiet replay's client had its answer: a waiter would answer its request twice. */
	opts.wait = (opts.wait || job->must_wait) && !req->quiet;
	if (rc == 0)
		rc = read_priority(req, &priority, &err);
	if (rc == 0)
		job_set_scheduling(job, priority, quota_weight(d, req->conn));
	/* Without wait the reply is the record as it stands now, at submission: queued. */
	mp_map_init(&record);
	if (rc == 0 && !opts.wait)
		job_render(job, false, &record);
	if (rc == 0 && d->stopping)
		rc = gpuq_fail(&err, GPUQ_E_SHUTTING_DOWN, "gpuqd is shutting down; no new jobs");
	if (rc == 0 && d->restart.active)
		rc = gpuq_fail(&err, GPUQ_E_RESTARTED,
			       "gpuqd is restarting (%s); submit the job again in a moment: the "
			       "connection stays open", d->restart.reason);
	if (rc == 0)
		rc = quota_check_job(d, req->conn, job, &err);
	if (rc == 0)
		durable_job_submitting(d, job); /* the buffers it writes are flagged from now on */
	if (rc == 0 && job->parts) {
		struct work *parts[GPUQ_MAX_DEVICES];
		for (int i = 0; i < job->nparts; i++)
			parts[i] = &job->parts[i];
		rc = worker_submit_group(&d->pool, parts, job->nparts, &err);
	} else if (rc == 0) {
		rc = worker_submit(&d->pool, &job->work, &err);
	}
	if (rc < 0) {
		mp_map_destroy(&record);
		job_abandon(d, job, &err);
		reply_error(req, &err);
		return;
	}
	d->last_dispatch = monotonic_seconds();
	d->jobs.hooks.started(d, job);
	leases_yield(d, job); /* revocable leases it waits for end where they can */
	log_debug("job %llu: %s on device %d for uid %d", (unsigned long long)job->id,
		  job->kind->op, job->work.device, (int)job->owner);
	if (opts.wait) {
		mp_map_destroy(&record);
		wait_for(req, job, &opts);
		return;
	}
	struct mp_map body;
	mp_map_init(&body);
	mp_put_map(&body, "job", &record);
	reply_ok(req, &body);
}

int job_submit_own(struct daemon *d, struct job *job, struct gpuq_error *err)
{
	job_set_scheduling(job, GPUQ_PRIORITY_NORMAL, 1.0);
	durable_job_submitting(d, job);
	if (worker_submit(&d->pool, &job->work, err) < 0) {
		durable_job_ended(d, job);
		return -1;
	}
	d->last_dispatch = monotonic_seconds();
	d->jobs.hooks.started(d, job);
	leases_yield(d, job);
	return 0;
}

/*
 * One line per finished job, in key=value form for log tools: who, what,
 * where, how much, how long and how it ended. Failures the device caused
 * are errors, other failures warnings, the rest information.
 */
static void job_log_outcome(const struct job *job)
{
	char gpus[160];
	size_t used = 0;
	for (int i = 0; i < job_nworks(job) && used < sizeof gpus; i++)
		used += (size_t)snprintf(gpus + used, sizeof gpus - used, "%s%d", i ? "," : "",
					 job_device(job, i));
	enum log_level level = LOG_LEVEL_INFO;
	if (job->error.code == GPUQ_E_DEVICE_ERROR || job->error.code == GPUQ_E_INTERNAL)
		level = LOG_LEVEL_ERROR;
	else if (job->state == GPUQ_JOB_FAILED)
		level = LOG_LEVEL_WARN;
	double total = job->finished - job->submitted;
	bool ok = job->state == GPUQ_JOB_DONE;
	log_msg(level, "job %llu: uid=%d op=%s gpus=%s bytes=%llu duration_s=%.6f run_s=%.6f result=%s%s%s%s%s%s",
		(unsigned long long)job->id, (int)job->owner, job->kind->op, gpus,
		(unsigned long long)job->work.result.bytes, total < 0 ? 0 : total, job->run_seconds,
		gpuq_errc_name(job->error.code), job->buffer_label[0] ? " buffer=" : "",
		job->buffer_label, ok ? "" : " error=\"", ok ? "" : job->error.message, ok ? "" : "\"");
}

/*
 * Everything that follows a job's end, but eviction from the history: the
 * caller may still need the job (op_cancel renders it afterwards).
 */
static void job_complete(struct daemon *d, struct job *job)
{
	durable_job_ended(d, job); /* buffers made, freed or no longer written; regions; leases */
	job_mark_finished(&d->jobs, job);
	d->jobs.hooks.finished(d, job);
	job_release(d, job);
	job_log_outcome(job);
	while (job->waiters) {
		struct waiter *w = job->waiters;
		reply_outcome(w->conn, w->request_id, job);
		waiter_unlink(w);
	}
	job->reply_fd = -1; /* sent (or its request gave up): a later `wait` gets the record alone */
}

void job_finish_now(struct request *req, struct job *job)
{
	struct daemon *d = req->d;
	gpuq_error_clear(&job->work.error);
	d->jobs.hooks.started(d, job);
	job_complete(d, job);
	reply_outcome(req->conn, req->id, job); /* done: the same with or without wait */
	job_evict_history(&d->jobs);
}

/* Whether a work of job writes b. */
static bool job_writes_buffer(struct job *job, const struct buffer *b)
{
	for (int i = 0; b && b->dptr && i < job_nworks(job); i++) {
		const struct work *w = job_work(job, i);
		for (unsigned k = 0; k < w->naccess; k++)
			if (w->access[k].write && w->access[k].base == b->dptr)
				return true;
	}
	return false;
}

/*
 * Whether w, which failed once it had started, may have written some of
 * its bytes: a put once it issued a DMA into the buffer; any other (a run
 * cancelled between passes, a copy) once it started.
 */
static bool work_may_have_written(struct work *w)
{
	if (w->started_at <= 0)
		return false;
	if (w->kind == WORK_PUT)
		return atomic_load(&w->dma_issued);
	return true;
}

/*
 * A job cut short may have written part of its bytes: a restart's drain
 * cancelled it (it ends `restarted`, not `cancelled`: it may be submitted
 * again), its device failed under it once it had started (device_error:
 * a fault, whose re-exec keeps the device's buffers), or it failed or was
 * cancelled part way (a put whose source ended early or whose client
 * died, a cancelled run or copy). The buffers it was writing are suspect
 * from now on, in this image and the next, until a write of every byte:
 * no reader takes a torn buffer for a sound one.
 */
static void job_mark_cut_short(struct daemon *d, struct job *job)
{
	char why[400] = "";
	for (int i = 0; i < job_nworks(job) && !why[0]; i++) {
		struct work *w = job_work(job, i);
		if (d->restart.active && w->error.code == GPUQ_E_CANCELLED) {
			gpuq_fail(&w->error, GPUQ_E_RESTARTED,
				  "gpuqd restarted while the job ran (--restart-drain ran out); submit it again");
			snprintf(why, sizeof why, "a job writing it was cut short by a restart "
				 "(--restart-drain); its bytes may be partly written");
		} else if (w->error.code == GPUQ_E_DEVICE_ERROR && w->started_at > 0) {
			snprintf(why, sizeof why, "a job writing it failed on its device (device_error); "
				 "its bytes may be partly written");
		} else if (w->error.code != GPUQ_OK && work_may_have_written(w)) {
			snprintf(why, sizeof why, "job %llu (%s) writing it ended early (%s: %.200s); its "
				 "bytes may be partly written",
				 (unsigned long long)job->id, job->kind->op,
				 gpuq_errc_name(w->error.code), w->error.message);
		}
	}
	struct buffer *written[2] = { job->buffer, job->buffer2 };
	for (int i = 0; why[0] && i < 2; i++)
		if (job_writes_buffer(job, written[i]))
			buffer_mark_suspect(written[i], why);
}

void job_on_done(struct work *work, void *arg)
{
	struct daemon *d = arg;
	struct job *job = work->owner;
	if (!job_work_returned(job))
		return; /* other parts of its gang are still out */
	job_mark_cut_short(d, job);
	job_complete(d, job);
	job_evict_history(&d->jobs);
	if (d->stopping)
		d->jobs.hooks.shutdown_step(d); /* finishes once the last job is in */
	else if (d->restart.active)
		d->jobs.hooks.restart_step(d); /* execs once the last job is in */
}

void job_fail_unqueued(struct daemon *d, struct job *job, enum gpuq_errc code, const char *why)
{
	job->held = false;
	for (int i = 0; i < job_nworks(job); i++) {
		struct work *w = job_work(job, i);
		gpuq_fail(&w->error, code, "%s", why);
		w->result.seconds = 0;
		job_work_returned(job);
	}
	job_complete(d, job);
}

void cancel_unqueued(struct daemon *d, struct job *job, const char *why)
{
	job_fail_unqueued(d, job, GPUQ_E_CANCELLED, why);
}

void jobs_fail_queued(struct daemon *d, enum gpuq_errc code, const char *why)
{
	struct work *list = worker_pool_unqueue_all(&d->pool);
	while (list) {
		struct work *next = list->next;
		list->next = NULL;
		job_fail_unqueued(d, list->owner, code, why);
		list = next;
	}
	for (struct job *j = d->jobs.oldest, *next; j; j = next) { /* a shutdown during a restart */
		next = j->newer;
		if (j->held)
			job_fail_unqueued(d, j, code, why);
	}
	job_evict_history(&d->jobs);
}

void jobs_cancel_queued(struct daemon *d)
{
	jobs_fail_queued(d, GPUQ_E_CANCELLED, "cancelled while queued: gpuqd is shutting down");
}

void job_cancel_running(struct daemon *d, struct job *job)
{
	job_request_cancel(job);
	for (int i = 0; i < job_nworks(job); i++) /* a job waiting for something slow looks at its flag now */
		worker_kick(&d->pool, job_device(job, i));
}

void jobs_cancel_running_on(struct daemon *d, int device)
{
	for (struct job *j = d->jobs.oldest; j; j = j->newer) {
		if (job_current_state(j) != GPUQ_JOB_RUNNING)
			continue;
		for (int i = 0; i < job_nworks(j); i++)
			if (job_device(j, i) == device) {
				job_cancel_running(d, j);
				break;
			}
	}
}

void jobs_cancel_running(struct daemon *d)
{
	for (struct job *j = d->jobs.oldest; j; j = j->newer)
		if (!job_is_finished(j) && !j->held)
			job_cancel_running(d, j);
}

bool job_unqueue(struct daemon *d, struct job *job)
{
	if (job->held) { /* out of every queue already, for the next image */
		job->held = false;
		return true;
	}
	if (!job->parts)
		return worker_unqueue(&d->pool, &job->work);
	struct work *parts[GPUQ_MAX_DEVICES];
	for (int i = 0; i < job->nparts; i++)
		parts[i] = &job->parts[i];
	return worker_unqueue_group(&d->pool, parts, job->nparts);
}

void job_hand_over(struct daemon *d, struct job *job)
{
	for (int i = 0; i < job_nworks(job); i++)
		gpuq_fail(&job_work(job, i)->error, GPUQ_E_RESTARTED,
			  "handed over to the next gpuqd image, which replays it");
	job->work.error = job_work(job, 0)->error;
	job->error = job->work.error;
	job->finished = monotonic_seconds();
	job->held = false;
	durable_job_ended(d, job);
	d->jobs.hooks.finished(d, job); /* its owner's running jobs, as if it had ended */
	job_release(d, job);
	while (job->waiters)
		waiter_unlink(job->waiters);
	job_discard(&d->jobs, job);
}
