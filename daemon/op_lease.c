/*
 * Leases on shareable buffers (daemon/lease.h): attach, release, leases,
 * lease_break, and what ends a lease besides a release: its connection
 * closing, a device reset. Main thread only.
 *
 * An attach is a job: its work (WORK_ATTACH) waits in the device's ledger
 * like any job that touches the buffer, behind the earlier ones it
 * conflicts with, and when the scheduler admits it the lease's entry takes
 * its place there (sched_hold). The job's finish hook then hands the
 * buffer's descriptor to the client with the reply. Every way a lease ends
 * goes through lease_end, which takes the entry out (worker_unhold) so the
 * jobs behind it start.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"

const char *lease_state_name(enum lease_state state)
{
	switch (state) {
	case LEASE_WAITING: return "waiting";
	case LEASE_HELD: return "held";
	case LEASE_ENDED: return "ended";
	}
	return "unknown";
}

struct lease *lease_find(struct lease_table *t, uint64_t id)
{
	for (struct lease *l = t->head; l; l = l->next)
		if (l->id == id)
			return l;
	return NULL;
}

static void lease_unlink(struct lease_table *t, struct lease *l)
{
	for (struct lease **link = &t->head; *link; link = &(*link)->next) {
		if (*link == l) {
			*link = l->next;
			t->count--;
			return;
		}
	}
}

/* Tells the holder's connection that its lease is gone ({event: "lease_broken", ...}). */
static void lease_tell_holder(const struct lease *l, const char *why, uid_t by)
{
	struct mp_map m;
	msgpack_sbuffer frame;
	if (!l->conn)
		return;
	mp_map_init(&m);
	mp_put_str(&m, "event", "lease_broken");
	mp_put_u64(&m, "lease", l->id);
	mp_put_str(&m, "buffer", l->buffer ? l->buffer->name : "");
	mp_put_u64(&m, "by_uid", (uint64_t)by);
	mp_put_str(&m, "reason", why);
	msgpack_sbuffer_init(&frame);
	mp_map_frame(&m, &frame);
	conn_send(l->conn, frame.data, frame.size);
	msgpack_sbuffer_destroy(&frame);
}

/*
 * Its ledger entry leaves the device's ledger (or will never enter it) and
 * the jobs behind it may start. A held lease is freed now; a waiting one
 * with its attach job (finish_attach), which still points at it. An
 * ephemeral buffer whose connection closed while it was leased goes now,
 * if nothing else holds it: never while a client maps it.
 */
void lease_end(struct daemon *d, struct lease *l)
{
	if (l->state == LEASE_ENDED)
		return;
	worker_unhold(&d->pool, &l->hold);
	if (l->lock_fd >= 0)
		close(l->lock_fd); /* drops gpuqd's lock on byte 0: the holder sees the lease gone */
	l->lock_fd = -1;
	if (l->wanted)
		d->leases.wanted--;
	l->wanted = false;
	durable_touch(d);
	bool held = l->state == LEASE_HELD;
	l->state = LEASE_ENDED;
	if (l->buffer)
		l->buffer->leases--;
	if (!held)
		return;
	lease_unlink(&d->leases, l);
	buffer_let_go(d, l->buffer, true);
	free(l);
}

/* What an attach's record says of the device and the handle (work.spec, freed with the job). */
struct attach_info {
	char uuid[64]; /* the device's, for the client to find it in its own CUDA numbering */
	const char *handle;
	uint64_t generation; /* the buffer's (buffer.h) */
	bool revocable;
};

static void release_attach(struct job *job)
{
	free(job->work.spec);
	job->work.spec = NULL;
}

static void render_attach(const struct job *job, struct mp_map *out)
{
	const struct attach_info *info = job->work.spec;
	char name[BUFFER_NAME_MAX + 16];
	snprintf(name, sizeof name, "%s@%d", job->brief.name, job->brief.device);
	mp_put_u64(out, "lease", job->id);
	mp_put_str(out, "buffer", name);
	mp_put_i64(out, "device", job->brief.device);
	mp_put_str(out, "dtype", gpuq_dtype_name(job->brief.dtype));
	mp_put_u64(out, "count", job->brief.count);
	mp_put_u64(out, "bytes", job->brief.bytes);
	mp_put_str(out, "mode", job->work.access[0].write ? "read-write" : "read");
	if (info) {
		mp_put_str(out, "uuid", info->uuid);
		mp_put_str(out, "handle", info->handle);
		mp_put_u64(out, "generation", info->generation);
		if (info->revocable)
			mp_put_bool(out, "revocable", true);
	}
}

/* The waiter of the attach request itself, if it still waits (its timeout may have run out). */
static bool attach_waited(const struct job *job, const struct lease *l)
{
	for (const struct waiter *w = job->waiters; w; w = w->job_next)
		if (w->conn == l->conn && w->request_id == l->request_id)
			return true;
	return false;
}

/*
 * The grant, or what became of the attach: the lease is held only if the
 * client still waits for its answer; then that reply carries the buffer's
 * descriptor.
 */
static void finish_attach(struct daemon *d, struct job *job)
{
	struct lease *l = job->lease;
	bool granted = job->work.error.code == GPUQ_OK && l->state == LEASE_WAITING &&
		       attach_waited(job, l);
	job->lease = NULL; /* the table owns it from here, the job's record needs none of it */
	if (granted) {
		l->state = LEASE_HELD;
		l->since = monotonic_seconds();
		job->reply_fd = job->buffer->share_fd;
		job->reply_conn = l->conn;
		job->reply_id = l->request_id;
		if (l->lock_fd >= 0)
			lease_yield_granted(d, l, job); /* may end it: l is not used after this */
		return;
	}
	if (job->work.error.code == GPUQ_OK) { /* granted on the device, given up here */
		job->state = GPUQ_JOB_CANCELLED;
		gpuq_fail(&job->error, GPUQ_E_CANCELLED,
			  "the lease was released before it was granted (or its client stopped waiting)");
	}
	lease_end(d, l);
	lease_unlink(&d->leases, l);
	buffer_unhold(l->buffer);
	free(l);
}

/*
 * The attach request's own timeout_ms ran out: its client has stopped
 * waiting, so no lease will be granted. The lease ends now rather than at
 * the grant it would get, so that `leases` stops listing it and the jobs
 * queued behind it wait no longer for it, and the attach job ends cancelled
 * (at once while queued; one already admitted, by finish_attach).
 */
void lease_attach_timed_out(struct daemon *d, struct job *job, const struct conn *c,
			    uint64_t request_id, struct gpuq_error *err)
{
	struct lease *l = job->lease;
	if (!l || l->conn != c || l->request_id != request_id)
		return; /* a `wait` of another request's: the attach goes on for its own */
	const char *state = gpuq_job_state_name(job_current_state(job));
	lease_end(d, l);
	if (job_unqueue(d, job))
		cancel_unqueued(d, job, "given up while queued: its client stopped waiting "
					"(timeout_ms), and no lease is granted then");
	gpuq_fail(err, GPUQ_E_TIMEOUT,
		  "attach job %llu on buffer '%s@%d' was still %s at timeout_ms and is given up: its "
		  "lease is not granted (attach again, with a longer timeout_ms, for one)",
		  (unsigned long long)job->id, job->brief.name, job->brief.device, state);
}

static const struct job_kind kind_attach = { "attach", finish_attach, render_attach };

/* Only a shareable buffer of the caller's (root: anyone's) may be attached. */
static int check_attachable(const struct request *req, const struct buffer *b,
			    struct gpuq_error *err)
{
	if (req->conn->uid != 0 && b->owner != req->conn->uid)
		return gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
				 "buffer '%s@%d' belongs to uid %d: only its owner or root may attach it",
				 b->name, b->device, (int)b->owner);
	if (!b->shareable || b->share_fd < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "buffer '%s@%d' is not shareable: only a buffer allocated with shareable: true "
				 "(gpuq alloc --shareable) may be attached, since each is an allocation of its "
				 "own and its handle opens nothing else",
				 b->name, b->device);
	return 0;
}

/* The attach's record: its device's UUID and the kind of handle the reply carries. */
static int attach_info_new(struct request *req, struct job *job, const struct buffer *b)
{
	struct attach_info *info = calloc(1, sizeof *info);
	struct worker_snapshot snap;
	if (!info)
		return -1;
	worker_snapshot(&req->d->pool, b->device, &snap);
	snprintf(info->uuid, sizeof info->uuid, "%s", snap.info.uuid);
	info->handle = strcmp(req->d->ops->name, "host") == 0 ? "memfd" : "posix_fd";
	info->generation = b->generation;
	job->work.spec = info;
	job->release = release_attach;
	return 0;
}

/* A new lease of id on b (its ledger entry made, not yet held), in the table, holding b. */
static struct lease *lease_insert(struct daemon *d, struct buffer *b, uint64_t id, bool write,
				  uid_t uid)
{
	struct lease *l = calloc(1, sizeof *l);
	if (!l)
		return NULL;
	l->id = id;
	l->buffer = b;
	l->write = write;
	l->lock_fd = -1;
	l->uid = uid;
	l->hold.kind = WORK_ATTACH;
	l->hold.device = b->device;
	l->hold.job_id = id;
	l->hold.owner_uid = uid;
	l->hold.access[0] = (struct work_access){ b->dptr, 0, b->bytes, write };
	l->hold.naccess = 1;
	b->users++;
	b->leases++;
	l->next = d->leases.head;
	d->leases.head = l;
	d->leases.count++;
	return l;
}

static struct lease *lease_new(struct request *req, struct job *job, struct buffer *b, bool write)
{
	struct lease *l = lease_insert(req->d, b, job->id, write, req->conn->uid);
	if (!l)
		return NULL;
	l->conn = req->conn;
	l->conn_serial = req->conn->serial;
	l->request_id = req->id;
	l->pid = req->conn->pid;
	return l;
}

struct lease *lease_adopt(struct daemon *d, struct buffer *b, const struct lease *from,
			  struct gpuq_error *err)
{
	struct lease *l = lease_insert(d, b, from->id, from->write, from->uid);
	if (!l) {
		gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no memory for the lease");
		return NULL;
	}
	l->pid = from->pid;
	l->conn_serial = from->conn_serial;
	l->lock_fd = from->lock_fd;
	if (worker_hold(&d->pool, &l->hold, err) != 0) {
		l->lock_fd = -1; /* the caller's still */
		b->leases--;
		lease_unlink(&d->leases, l);
		buffer_unhold(b);
		free(l);
		return NULL;
	}
	double now = monotonic_seconds();
	l->state = LEASE_HELD;
	l->since = from->since > 0 && from->since <= now ? from->since : now; /* the same clock after an execve */
	return l;
}

/*
 * attach: a shareable `buffer`, `mode`: read or read-write (the default),
 * and `revocable` with its lock, the request's one descriptor.
 */
struct attach_args {
	struct args_buffer buffer;
	char mode[16];
	bool write;
	bool revocable;
};

static int attach_check_buffer(struct request *req, void *args, struct gpuq_error *err)
{
	return check_attachable(req, ((struct attach_args *)args)->buffer.b, err);
}

static int attach_check_mode(struct request *req, void *args, struct gpuq_error *err)
{
	struct attach_args *a = args;
	(void)req;
	a->write = strcmp(a->mode, "read-write") == 0;
	if (!a->write && strcmp(a->mode, "read") != 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'mode': '%s' is not read or read-write",
				 a->mode);
	return 0;
}

/* The lock is checked and byte 0 locked before the job exists; a refusal closes the descriptor. */
static int attach_check_lock(struct request *req, void *args, struct gpuq_error *err)
{
	if (!((struct attach_args *)args)->revocable)
		return 0;
	if (req->nfds != 1)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'revocable': a revocable lease needs its lock, a memfd, as the "
				 "request's one descriptor (fds: 1); %d came", req->nfds);
	return lease_lock_take(req->d, req->conn, req->fds[0], err);
}

static const struct args_field attach_fields[] = {
	{ "buffer", ARGS_BUFFER_NAME, ARGS_REQUIRED, ARGS_AT(struct attach_args, buffer),
	  .then = attach_check_buffer },
	{ "mode", ARGS_STR, 0, ARGS_AT(struct attach_args, mode), .then = attach_check_mode },
	{ "revocable", ARGS_BOOL, 0, ARGS_AT(struct attach_args, revocable),
	  .then = attach_check_lock },
};
static const struct attach_args attach_defaults = { .mode = "read-write" };
const struct args_spec op_attach_args = ARGS_SPEC(struct attach_args, attach_fields,
						  &attach_defaults);

void op_attach(struct request *req, void *args)
{
	const struct attach_args *a = args;
	struct gpuq_error err;
	struct buffer *b = a->buffer.b;
	bool write = a->write;
	struct job *job = new_job(req, &kind_attach, WORK_ATTACH, b->device);
	if (!job)
		return;
	struct lease *l = attach_info_new(req, job, b) == 0 ? lease_new(req, job, b, write) : NULL;
	if (!l) {
		release_attach(job);
		job_discard(&req->d->jobs, job);
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for another lease");
		reply_error(req, &err);
		return;
	}
	job_attach_buffer(job, b);
	work_narrow_access(&job->work, 0, b->bytes, write);
	job->work.length = b->bytes;
	job->work.hold = &l->hold;
	job->lease = l;
	if (a->revocable) {
		l->lock_fd = req->fds[0]; /* locked by attach_check_lock */
		req->fds[0] = -1;
		((struct attach_info *)job->work.spec)->revocable = true;
	}
	job->must_wait = true;
	job_submit(req, job);
}

/* release and lease_break: the lease named by `lease`, not yet ended. */
struct lease_args {
	uint64_t id;
	struct lease *lease;
};

static int lease_args_resolve(struct request *req, void *args, struct gpuq_error *err)
{
	struct lease_args *a = args;
	a->lease = lease_find(&req->d->leases, a->id);
	if (!a->lease || a->lease->state == LEASE_ENDED)
		return gpuq_fail(err, GPUQ_E_NOT_FOUND, "lease %llu not found (gpuq leases lists them)",
				 (unsigned long long)a->id);
	return 0;
}

/* release: the lease, which only its holder (and root) releases. */
static int release_args_resolve(struct request *req, void *args, struct gpuq_error *err)
{
	if (lease_args_resolve(req, args, err) < 0)
		return -1;
	const struct lease *l = ((struct lease_args *)args)->lease;
	if (req->conn->uid != 0 && req->conn->uid != l->uid)
		return gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
				 "lease %llu is held by uid %d; only its holder releases it (root and the "
				 "admin group may break it)",
				 (unsigned long long)l->id, (int)l->uid);
	return 0;
}

static const struct args_field release_fields[] = {
	{ "lease", ARGS_U64, ARGS_REQUIRED, ARGS_AT(struct lease_args, id),
	  .missing = "field 'lease' (the lease id attach returned) is required",
	  .then = release_args_resolve },
};
static const struct args_field lease_break_fields[] = {
	{ "lease", ARGS_U64, ARGS_REQUIRED, ARGS_AT(struct lease_args, id),
	  .missing = "field 'lease' (the lease id attach returned) is required",
	  .then = lease_args_resolve },
};
const struct args_spec op_release_args = ARGS_SPEC(struct lease_args, release_fields, NULL);
const struct args_spec op_lease_break_args = ARGS_SPEC(struct lease_args, lease_break_fields, NULL);
const struct args_spec op_leases_args = ARGS_NONE;

void lease_break_denied(struct request *req, struct gpuq_error *err)
{
	(void)req;
	gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
		  "breaking a lease is for root and the admin group (rule: admin-group)");
}

static void reply_lease_end(struct request *req, uint64_t id, const char *key)
{
	struct mp_map body;
	mp_map_init(&body);
	mp_put_u64(&body, "lease", id);
	mp_put_bool(&body, key, true);
	reply_ok(req, &body);
}

/* The holder is done with the buffer (its own stream work on it complete). */
void op_release(struct request *req, void *args)
{
	struct lease *l = ((struct lease_args *)args)->lease;
	uint64_t id = l->id;
	lease_end(req->d, l);
	reply_lease_end(req, id, "released");
}

/* Only root and the admin group get here (request.c's op table). */
void op_lease_break(struct request *req, void *args)
{
	struct lease *l = ((struct lease_args *)args)->lease;
	uint64_t id = l->id;
	char why[160];
	snprintf(why, sizeof why, "broken by uid %d (gpuq lease break)", (int)req->conn->uid);
	log_warn("lease %llu on %s@%d of uid %d (pid %d): %s", (unsigned long long)id,
		 l->buffer->name, l->buffer->device, (int)l->uid, (int)l->pid, why);
	lease_tell_holder(l, why, req->conn->uid);
	lease_end(req->d, l);
	reply_lease_end(req, id, "broken");
}

static void render_lease(const struct lease *l, double now, struct mp_array *out)
{
	struct mp_map m;
	char name[BUFFER_NAME_MAX + 16];
	mp_map_init(&m);
	snprintf(name, sizeof name, "%s@%d", l->buffer->name, l->buffer->device);
	mp_put_u64(&m, "lease", l->id);
	mp_put_str(&m, "buffer", name);
	mp_put_i64(&m, "device", l->buffer->device);
	mp_put_u64(&m, "owner", (uint64_t)l->buffer->owner);
	mp_put_str(&m, "mode", l->write ? "read-write" : "read");
	mp_put_str(&m, "state", lease_state_name(l->state));
	mp_put_u64(&m, "uid", (uint64_t)l->uid);
	mp_put_u64(&m, "pid", (uint64_t)l->pid);
	mp_put_f64(&m, "held_s", l->state == LEASE_HELD ? now - l->since : 0);
	mp_put_bool(&m, "revocable", l->lock_fd >= 0);
	mp_array_map(out, &m);
}

/* The caller's leases and those on its buffers; every lease for root and the admin group. */
void op_leases(struct request *req, void *args)
{
	struct mp_map body;
	(void)args;
	struct mp_array list;
	bool admin = quota_is_admin(req->d, req->conn);
	double now = monotonic_seconds();
	uid_t uid = req->conn->uid;
	mp_map_init(&body);
	mp_array_init(&list);
	for (const struct lease *l = req->d->leases.head; l; l = l->next)
		if (l->state != LEASE_ENDED && (admin || l->uid == uid || l->buffer->owner == uid))
			render_lease(l, now, &list);
	mp_put_array(&body, "leases", &list);
	reply_ok(req, &body);
}

void leases_drop_conn(struct daemon *d, struct conn *c)
{
	struct lease *next;
	for (struct lease *l = d->leases.head; l; l = next) {
		next = l->next;
		if (l->conn != c)
			continue;
		l->conn = NULL;
		if (l->state == LEASE_HELD)
			log_info("lease %llu on %s@%d ends: its holder (uid %d, pid %d) disconnected",
				 (unsigned long long)l->id, l->buffer->name, l->buffer->device,
				 (int)l->uid, (int)l->pid);
		lease_end(d, l);
	}
}

void leases_adopt_conns(struct daemon *d)
{
	struct lease *next;
	for (struct lease *l = d->leases.head; l; l = next) {
		next = l->next;
		if (l->conn || l->state != LEASE_HELD) /* only a lease taken over has none while held */
			continue;
		l->conn = server_conn_of_serial(&d->server, l->conn_serial);
		if (l->conn)
			continue;
		log_info("lease %llu on %s@%d ends: its holder (uid %d, pid %d) did not come through "
			 "the re-exec connected", (unsigned long long)l->id, l->buffer->name,
			 l->buffer->device, (int)l->uid, (int)l->pid);
		lease_end(d, l);
	}
}

void leases_drop_device(struct daemon *d, int device)
{
	struct lease *next;
	char why[128];
	snprintf(why, sizeof why, "gpu %d was reset: the buffer's memory is lost", device);
	for (struct lease *l = d->leases.head; l; l = next) {
		next = l->next;
		if (l->buffer->device != device || l->state == LEASE_ENDED)
			continue;
		lease_tell_holder(l, why, 0);
		lease_end(d, l);
	}
}
