/*
 * Progress events: while a job that some waiter asked progress for
 * (`progress: true` on the job request or on `wait`) waits in its queue or
 * runs, a timer sends that waiter an event frame every PROGRESS_MS once the
 * job has waited or run for PROGRESS_AFTER seconds:
 *
 *   {event: "progress", id: <the waiting request's id>, job, state, bytes,
 *    total, elapsed_s, gbps, eta_s}
 *
 * state is "queued" (elapsed_s since the job was submitted) or "running"
 * (since it started), so that a client can tell a job stuck behind others
 * from a slow one. The worker stores the job's bytes and total in its work
 * (work.progress_bytes/total) at each chunk; this file only reads them.
 * Main thread only: the timer and its state below are the loop's, and
 * exist from the first progress waiter until shutdown closes them.
 */
#include "daemon/daemon.h"

#define PROGRESS_MS 250
#define PROGRESS_AFTER 1.0

static struct {
	uv_timer_t timer;
	bool initialised, running, closed;
} progress;

/* Bytes and total of a job, summed over a gang's parts. */
static void job_progress(const struct job *job, uint64_t *bytes, uint64_t *total)
{
	int n = job->parts ? job->nparts : 1;
	*bytes = *total = 0;
	for (int i = 0; i < n; i++) {
		const struct work *w = job->parts ? &job->parts[i] : &job->work;
		*bytes += atomic_load_explicit(&w->progress_bytes, memory_order_relaxed);
		*total += atomic_load_explicit(&w->progress_total, memory_order_relaxed);
	}
}

static double job_start(const struct job *job)
{
	const struct work *w = job->parts ? &job->parts[0] : &job->work;
	return atomic_load(&w->phase) == WORK_QUEUED ? 0 : w->started_at;
}

static void send_event(struct waiter *w, const struct job *job, const char *state,
		       double elapsed)
{
	uint64_t bytes, total;
	struct mp_map m;
	msgpack_sbuffer frame;
	job_progress(job, &bytes, &total);
	double gbps = elapsed > 0 ? (double)bytes / elapsed / 1e9 : 0;
	mp_map_init(&m);
	mp_put_str(&m, "event", "progress");
	mp_put_u64(&m, "id", w->request_id);
	mp_put_u64(&m, "job", job->id);
	mp_put_str(&m, "state", state);
	mp_put_u64(&m, "bytes", bytes);
	mp_put_u64(&m, "total", total);
	mp_put_f64(&m, "elapsed_s", elapsed);
	mp_put_f64(&m, "gbps", gbps);
	if (total >= bytes && gbps > 0)
		mp_put_f64(&m, "eta_s", (double)(total - bytes) / (gbps * 1e9));
	msgpack_sbuffer_init(&frame);
	mp_map_frame(&m, &frame);
	conn_send(w->conn, frame.data, frame.size);
	msgpack_sbuffer_destroy(&frame);
}

/* Sends what is due; stops the timer once no unfinished job has a progress waiter. */
static void on_tick(uv_timer_t *timer)
{
	struct daemon *d = timer->data;
	double now = monotonic_seconds();
	unsigned watched = 0;
	for (struct job *job = d->jobs.oldest; job; job = job->newer) {
		if (job_is_finished(job) || !job->waiters)
			continue;
		double started = job_start(job);
		const char *state = started > 0 ? "running" : "queued";
		double since = started > 0 ? started : job->submitted;
		for (struct waiter *w = job->waiters; w; w = w->job_next) {
			if (!w->progress)
				continue;
			watched++;
			if (since > 0 && now - since >= PROGRESS_AFTER)
				send_event(w, job, state, now - since);
		}
	}
	if (watched == 0) {
		uv_timer_stop(timer);
		progress.running = false;
	}
}

void progress_watch(struct daemon *d)
{
	if (progress.closed || progress.running)
		return;
	if (!progress.initialised) {
		uv_timer_init(d->loop, &progress.timer);
		progress.initialised = true;
	}
	progress.timer.data = d;
	uv_timer_start(&progress.timer, on_tick, PROGRESS_MS, PROGRESS_MS);
	progress.running = true;
}

void progress_close(struct daemon *d)
{
	(void)d;
	progress.closed = true;
	progress.running = false;
	if (progress.initialised && !uv_is_closing((uv_handle_t *)&progress.timer))
		uv_close((uv_handle_t *)&progress.timer, NULL);
}

void progress_request(struct daemon *d, struct waiter *w, bool wanted)
{
	if (!wanted)
		return;
	w->progress = true;
	progress_watch(d);
}
