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
