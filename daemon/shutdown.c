/*
 * The orderly shutdown, on SIGTERM/SIGINT. Main thread only.
 *
 * Stop accepting; cancel queued jobs; give running jobs --shutdown-timeout
 * to finish, then ask them to stop at their next chunk and give them two
 * seconds more; then close the connections, stop the workers (each frees
 * its device's memory, staging ring, streams and pool) and close the last
 * handles, so that uv_run returns to main.
 */
#include "daemon/daemon.h"
#include "daemon/job_life.h"
#include "workers/log.h"
#include "daemon/progress.h"
#include "daemon/server.h"
#include "daemon/service.h"

static void on_shutdown_timeout(uv_timer_t *timer)
{
	struct daemon *d = timer->data;
	if (!d->shutdown_cancel_sent) {
		log_warn("%u jobs still running after --shutdown-timeout; cancelling them",
			 d->jobs.active);
		jobs_cancel_running(d);
		d->shutdown_cancel_sent = true;
		uv_timer_start(timer, on_shutdown_timeout, 2000, 0);
		return;
	}
	log_error("%u jobs did not stop when cancelled; exiting without them", d->jobs.active);
	d->jobs.active = 0;
	daemon_shutdown(d);
}

static void close_handle(uv_handle_t *h)
{
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

/* The last step: everything is idle. Closes what the loop holds, so uv_run returns. */
static void daemon_finish(struct daemon *d)
{
	server_close_all(&d->server);
	fd_store_keep(&d->fd_store); /* the buffers outlive this process in the store */
	int stuck = worker_pool_stop(&d->pool, 5000);
	if (stuck)
		log_error("%d device workers did not stop within 5 s", stuck);
	close_handle((uv_handle_t *)&d->shutdown_timer);
	progress_close(d);
	leases_close(d);
	close_handle((uv_handle_t *)&d->sigterm);
	close_handle((uv_handle_t *)&d->sigint);
	restart_close(d);
	durable_close(d); /* the last generation: what the workers left */
	service_close(d);
}

void daemon_shutdown(struct daemon *d)
{
	static bool finished;
	if (!d->stopping) {
		d->stopping = true;
		service_stopping(d);
		server_stop_listening(&d->server);
		jobs_cancel_queued(d);
		if (d->jobs.active > 0) {
			log_info("waiting up to %u ms for %u running jobs",
				 d->opt.shutdown_timeout_ms, d->jobs.active);
			d->shutdown_timer.data = d;
			uv_timer_start(&d->shutdown_timer, on_shutdown_timeout,
				       d->opt.shutdown_timeout_ms, 0);
		}
	}
	if (d->jobs.active > 0 || finished)
		return;
	finished = true;
	daemon_finish(d);
}
