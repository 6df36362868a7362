/*
 * Requests about the service itself: metrics (anyone who may connect) and
 * shutdown (root and the admin group). Main thread only.
 */
#include <unistd.h>

#include "daemon/daemon.h"
#include "daemon/log.h"

void op_metrics(struct request *req)
{
	struct metrics_text text = { 0 };
	struct gpuq_error err;
	if (metrics_render(req->d, &text) < 0) {
		metrics_text_free(&text);
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory to render its metrics");
		reply_error(req, &err);
		return;
	}
	struct mp_map body;
	mp_map_init(&body);
	mp_put_str(&body, "format", "prometheus-text-0.0.4");
	mp_put_strn(&body, "text", text.data, text.len);
	metrics_text_free(&text);
	reply_ok(req, &body);
}

void device_on_reset(int index, void *arg)
{
	struct daemon *d = arg;
	struct worker_snapshot s;
	worker_snapshot(&d->pool, index, &s);
	unsigned lost = buffer_mark_lost(&d->buffers, index);
	/*
	 * After the buffers are marked lost: an orphaned ephemeral buffer whose
	 * last lease ends here is then dropped, not given a free job that would
	 * hand the old context's pointer to the new one.
	 */
	leases_drop_device(d, index);
	if (s.healthy)
		log_warn("gpu %d was reset after %s in %.3f s (reset %u); %u buffers there are lost",
			 index, s.last_reset, s.last_reset_s, s.resets, lost);
	else
		log_error("gpu %d is unhealthy: %s; %u buffers there are lost", index, s.health, lost);
}

/*
 * reset_device: an administrator's reset of one device (workers/backend/device_reset.h).
 * Its running jobs are cancelled; the worker resets the device once they
 * have ended, and the reply says only that it was asked: `devices` shows
 * the reset (`resets`, `last_reset`, health) once it happened.
 */
void op_reset_device(struct request *req)
{
	struct daemon *d = req->d;
	struct gpuq_error err;
	uint64_t device = 0;
	char why[160];
	int rc = msg_get_u64(req->map, "device", &device, &err);
	if (rc == 0)
		rc = gpuq_fail(&err, GPUQ_E_BAD_REQUEST, "field 'device' is required");
	if (rc > 0 && device >= (uint64_t)d->pool.count)
		rc = gpuq_fail(&err, GPUQ_E_NOT_FOUND, "device %llu does not exist (devices: 0-%d)",
			       (unsigned long long)device, d->pool.count - 1);
	if (rc > 0 && !quota_is_admin(d, req->conn))
		rc = gpuq_fail(&err, GPUQ_E_PERMISSION_DENIED,
			       "only root and members of the admin group may reset a device (rule: "
			       "admin-group)");
	struct worker_snapshot s;
	if (rc > 0) {
		worker_snapshot(&d->pool, (int)device, &s);
		snprintf(why, sizeof why, "a reset asked by uid %d", (int)req->conn->uid);
		jobs_cancel_running_on(d, (int)device);
		rc = worker_ask_reset(&d->pool, (int)device, why, &err) < 0 ? -1 : 1;
	}
	if (rc < 0) {
		reply_error(req, &err);
		return;
	}
	log_warn("gpu %d: %s", (int)device, why);
	struct mp_map body;
	mp_map_init(&body);
	mp_put_u64(&body, "device", device);
	mp_put_bool(&body, "reset_requested", true);
	mp_put_u64(&body, "resets", s.resets);
	reply_ok(req, &body);
}

void op_shutdown(struct request *req)
{
	struct daemon *d = req->d;
	struct conn *c = req->conn;
	struct gpuq_error err;
	if (!quota_is_admin(d, c)) {
		if (d->svc.quotas.has_admin)
			gpuq_fail(&err, GPUQ_E_PERMISSION_DENIED,
				  "rule admin-group: only root and members of group '%s' may stop gpuqd; uid %d is neither",
				  d->svc.quotas.admin_group, (int)c->uid);
		else
			gpuq_fail(&err, GPUQ_E_PERMISSION_DENIED,
				  "rule admin-group: only root may stop gpuqd (no admin-group is configured); you are uid %d",
				  (int)c->uid);
		reply_error(req, &err);
		return;
	}
	log_info("shutdown requested by uid %d (pid %d)", (int)c->uid, (int)c->pid);
	struct mp_map body;
	mp_map_init(&body);
	mp_put_bool(&body, "stopping", true);
	mp_put_u64(&body, "jobs_active", d->jobs.active);
	mp_put_u64(&body, "shutdown_timeout_ms", d->opt.shutdown_timeout_ms);
	reply_ok(req, &body);
	service_request_shutdown(d);
}
