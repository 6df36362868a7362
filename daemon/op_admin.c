/*
 * Requests about the service itself: metrics (anyone who may connect),
 * shutdown and restart (root and the admin group). Main thread only.
 */
#include <limits.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"
#include "daemon/replay.h"

const struct args_spec op_metrics_args = ARGS_NONE;

void op_metrics(struct request *req, void *args)
{
	(void)args;
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
	if (!s.healthy && s.needs_restart && restart_after_fault(d, index)) {
		/* The worker kept the slabs' descriptors: the new image takes these buffers over. */
		log_error("gpu %d is unhealthy: %s; gpuqd re-executes itself for it, and its %u "
			  "buffers go to the new image", index, s.health, buffer_count_on(&d->buffers, index));
		durable_touch(d);
		return;
	}
	char why[400];
	snprintf(why, sizeof why, "when gpu %d was reset after %s", index, s.last_reset);
	unsigned lost = buffer_mark_lost(&d->buffers, index, why);
	durable_touch(d);
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
struct reset_device_args {
	int device;
};

static const struct args_field reset_device_fields[] = {
	{ "device", ARGS_DEVICE, ARGS_REQUIRED, ARGS_AT(struct reset_device_args, device) },
};
const struct args_spec op_reset_device_args =
	ARGS_SPEC(struct reset_device_args, reset_device_fields, NULL);

void reset_device_denied(struct request *req, struct gpuq_error *err)
{
	(void)req;
	gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
		  "only root and members of the admin group may reset a device (rule: admin-group)");
}

/* Only root and the admin group get here (request.c's op table). */
void op_reset_device(struct request *req, void *args)
{
	struct daemon *d = req->d;
	int device = ((struct reset_device_args *)args)->device;
	struct gpuq_error err;
	struct worker_snapshot s;
	char why[160];
	worker_snapshot(&d->pool, device, &s);
	/* The reset's cause, as `devices` (last_reset), its health and its lost buffers word it. */
	snprintf(why, sizeof why, "an administrator's request (uid %d)", (int)req->conn->uid);
	/*
	 * A restart's drain ends in an execve that would cut a reset short
	 * (its slabs already out of the descriptor store, its buffers not yet
	 * marked lost): the reset waits for the new image.
	 */
	if (d->restart.active) {
		gpuq_fail(&err, GPUQ_E_BUSY, "gpuqd is restarting (%s, %.1f s ago); ask for the reset "
			  "of gpu %d once it serves again", d->restart.reason,
			  monotonic_seconds() - d->restart.since, device);
		reply_error(req, &err);
		return;
	}
	/* Asked first: from then on the worker starts nothing, so that no job
	 * queued behind a cancelled one runs on buffers the reset is about to lose. */
	if (worker_ask_reset(&d->pool, device, why, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	jobs_cancel_running_on(d, device);
	log_warn("gpu %d is to be reset after %s", device, why);
	struct mp_map body;
	mp_map_init(&body);
	mp_put_u64(&body, "device", (uint64_t)device);
	mp_put_bool(&body, "reset_requested", true);
	mp_put_u64(&body, "resets", s.resets);
	reply_ok(req, &body);
}

/*
 * drop_absent: an administrator lets go of the buffers kept for a GPU this
 * gpuqd does not serve (daemon/absent.h), a GPU gone for good or given to
 * other work: their memory on it is freed, and no later gpuqd gets them.
 */
struct drop_absent_args {
	char uuid[SLAB_OWNER_MAX];
};

static const struct args_field drop_absent_fields[] = {
	{ "uuid", ARGS_STR, ARGS_REQUIRED, ARGS_AT(struct drop_absent_args, uuid) },
};
const struct args_spec op_drop_absent_args =
	ARGS_SPEC(struct drop_absent_args, drop_absent_fields, NULL);

void drop_absent_denied(struct request *req, struct gpuq_error *err)
{
	(void)req;
	gpuq_fail(err, GPUQ_E_PERMISSION_DENIED, "only root and members of the admin group may drop "
		  "the buffers kept for a GPU (rule: admin-group)");
}

/* Only root and the admin group get here (request.c's op table). */
void op_drop_absent(struct request *req, void *args)
{
	struct daemon *d = req->d;
	const char *uuid = ((struct drop_absent_args *)args)->uuid;
	struct gpuq_error err;
	struct absent_gpu gpus[GPUQ_MAX_DEVICES];
	unsigned buffers;
	uint64_t bytes;
	int served_as = absent_index_of(&d->absent, uuid);
	if (served_as >= 0) {
		gpuq_fail(&err, GPUQ_E_BAD_REQUEST, "GPU %s is device %d of this gpuqd: its buffers are "
			  "listed, not kept aside (free them one by one)", uuid, served_as);
		reply_error(req, &err);
		return;
	}
	absent_drop(&d->absent, uuid, &d->fd_store, &buffers, &bytes);
	if (buffers == 0) {
		size_t n = absent_by_gpu(&d->absent, gpus, GPUQ_MAX_DEVICES);
		char kept[400] = "none";
		for (size_t i = 0, used = 0; i < n && used < sizeof kept; i++)
			used += (size_t)snprintf(kept + used, sizeof kept - used, "%s%s", i ? ", " : "",
						 gpus[i].uuid);
		gpuq_fail(&err, GPUQ_E_NOT_FOUND, "no buffers are kept for GPU %s (kept for: %s)", uuid,
			  kept);
		reply_error(req, &err);
		return;
	}
	durable_touch(d);
	log_warn("uid %d dropped the %u buffers (%llu bytes) kept for GPU %s", (int)req->conn->uid,
		 buffers, (unsigned long long)bytes, uuid);
	struct mp_map body;
	mp_map_init(&body);
	mp_put_str(&body, "uuid", uuid);
	mp_put_u64(&body, "buffers", buffers);
	mp_put_u64(&body, "bytes", bytes);
	reply_ok(req, &body);
}

const struct args_spec op_shutdown_args = ARGS_NONE;

void shutdown_denied(struct request *req, struct gpuq_error *err)
{
	struct daemon *d = req->d;
	if (d->svc.quotas.has_admin)
		gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
			  "rule admin-group: only root and members of group '%s' may stop gpuqd; uid %d is neither",
			  d->svc.quotas.admin_group, (int)req->conn->uid);
	else
		gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
			  "rule admin-group: only root may stop gpuqd (no admin-group is configured); you are uid %d",
			  (int)req->conn->uid);
}

/* Only root and the admin group get here (request.c's op table). */
void op_shutdown(struct request *req, void *args)
{
	struct daemon *d = req->d;
	struct conn *c = req->conn;
	(void)args;
	log_info("shutdown requested by uid %d (pid %d)", (int)c->uid, (int)c->pid);
	struct mp_map body;
	mp_map_init(&body);
	mp_put_bool(&body, "stopping", true);
	mp_put_u64(&body, "jobs_active", d->jobs.active);
	mp_put_u64(&body, "shutdown_timeout_ms", d->opt.shutdown_timeout_ms);
	reply_ok(req, &body);
	service_request_shutdown(d);
}

/* restart: re-executes gpuqd (daemon/restart.h), its own binary or `binary`. */
struct restart_args {
	char binary[PATH_MAX];
};

static const struct args_field restart_fields[] = {
	{ "binary", ARGS_STR, 0, ARGS_AT(struct restart_args, binary) },
};
const struct args_spec op_restart_args = ARGS_SPEC(struct restart_args, restart_fields, NULL);

void restart_denied(struct request *req, struct gpuq_error *err)
{
	struct daemon *d = req->d;
	if (d->svc.quotas.has_admin)
		gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
			  "rule admin-group: only root and members of group '%s' may restart gpuqd; uid %d is neither",
			  d->svc.quotas.admin_group, (int)req->conn->uid);
	else
		gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
			  "rule admin-group: only root may restart gpuqd (no admin-group is configured); you are uid %d",
			  (int)req->conn->uid);
}

/* Only root and the admin group get here (request.c's op table). The reply goes out before the execve. */
void op_restart(struct request *req, void *args)
{
	struct daemon *d = req->d;
	const struct restart_args *a = args;
	struct gpuq_error err;
	char reason[64];
	snprintf(reason, sizeof reason, "asked by uid %d", (int)req->conn->uid);
	if (a->binary[0] && req->conn->uid != 0 && req->conn->uid != geteuid()) {
		gpuq_fail(&err, GPUQ_E_PERMISSION_DENIED,
			  "only root may name the binary a restart runs (it runs as gpuqd, with every "
			  "buffer); the admin group restarts gpuqd's own binary: leave binary out");
		reply_error(req, &err);
		return;
	}
	if (restart_request(d, a->binary[0] ? a->binary : NULL, reason, &err) != 0) {
		reply_error(req, &err);
		return;
	}
	struct mp_map body;
	mp_map_init(&body);
	mp_put_bool(&body, "restarting", true);
	mp_put_str(&body, "binary", d->restart.binary);
	/* the running jobs the drain waits for, as before queued jobs were held rather than failed */
	mp_put_u64(&body, "jobs_active", d->jobs.active - replay_held(d));
	mp_put_u64(&body, "restart_drain_ms", d->opt.restart_drain_ms);
	mp_put_u64(&body, "restarts", d->restart.count);
	reply_ok(req, &body);
}
