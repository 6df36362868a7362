/* Requests the main thread answers from its own state: ping, devices, buffers. */
#include <unistd.h>

#include "daemon/daemon.h"

const struct args_spec op_ping_args = ARGS_NONE;
const struct args_spec op_devices_args = ARGS_NONE;

void op_ping(struct request *req, void *args)
{
	struct daemon *d = req->d;
	(void)args;
	struct mp_map body;
	mp_map_init(&body);
	mp_put_str(&body, "server", "gpuqd " GPUQD_VERSION);
	mp_put_u64(&body, "version", GPUQ_PROTOCOL_VERSION);
	mp_put_str(&body, "backend", d->ops->name);
	mp_put_u64(&body, "devices", (uint64_t)d->pool.count);
	mp_put_f64(&body, "uptime_s", monotonic_seconds() - d->started);
	mp_put_u64(&body, "pid", (uint64_t)getpid());
	struct mp_array features; /* what a client cannot learn from `version` alone */
	mp_array_init(&features);
	mp_array_str(&features, "ring");
	mp_put_array(&body, "features", &features);
	if (d->restart.count) /* only once it has re-executed: the reply is otherwise as before */
		mp_put_u64(&body, "restarts", d->restart.count);
	if (d->recover.recoveries) /* likewise, once it has come back from the descriptor store */
		mp_put_u64(&body, "recoveries", d->recover.recoveries);
	reply_ok(req, &body);
}

static void render_counters(const struct worker_counters *c, struct mp_map *out)
{
	struct mp_map m;
	mp_map_init(&m);
#define PUT_COUNTER(name) mp_put_u64(&m, #name, c->name);
	WORKER_COUNTERS(PUT_COUNTER)
#undef PUT_COUNTER
	mp_put_map(out, "counters", &m);
}

void render_scheduler(const struct worker_snapshot *s, struct mp_map *out)
{
	struct mp_map sched, inflight, busy;
	mp_map_init(&sched);
	mp_map_init(&inflight);
	mp_map_init(&busy);
	mp_put_u64(&sched, "inflight", s->sched.inflight);
	mp_put_u64(&sched, "max_inflight", s->sched.max_inflight);
	for (int e = 0; e < SCHED_ENGINES; e++) {
		mp_put_u64(&inflight, sched_engine_name((enum sched_engine)e), s->sched.inflight_by_engine[e]);
		mp_put_f64(&busy, sched_engine_name((enum sched_engine)e), s->sched.busy_seconds[e]);
	}
	mp_put_map(&sched, "inflight_by_engine", &inflight);
	mp_put_map(&sched, "busy_s", &busy);
	mp_put_map(out, "scheduler", &sched);
}

static void render_device(struct daemon *d, int index, struct mp_array *out)
{
	struct worker_snapshot s;
	worker_snapshot(&d->pool, index, &s);
	struct mp_map m;
	char cc[16];
	mp_map_init(&m);
	mp_put_i64(&m, "index", index);
	mp_put_str(&m, "backend", d->ops->name);
	mp_put_str(&m, "name", s.info.name);
	mp_put_str(&m, "uuid", s.info.uuid);
	mp_put_str(&m, "pci_bus_id", s.info.pci_bus_id);
	snprintf(cc, sizeof cc, "%d.%d", s.info.cc_major, s.info.cc_minor);
	mp_put_str(&m, "compute_capability", cc);
	mp_put_i64(&m, "sms", s.info.sms);
	mp_put_i64(&m, "copy_engines", s.info.copy_engines);
	mp_put_u64(&m, "mem_total", s.info.mem_total);
	mp_put_u64(&m, "mem_free", s.info.mem_free);
	mp_put_u64(&m, "mem_used", buffer_bytes_on(&d->buffers, index));
	if (s.info.buffer_memory) /* NULL only for a device that never opened */
		mp_put_str(&m, "buffer_memory", s.info.buffer_memory);
	unsigned regions;
	mp_put_u64(&m, "region_bytes", region_bytes_on(&d->regions, index, &regions));
	mp_put_u64(&m, "regions", regions);
	mp_put_bool(&m, "healthy", s.healthy);
	mp_put_str(&m, "health", s.health);
	/*
	 * Whether this device reads that one's buffers directly: the decision a
	 * copy from there to here makes (copy_peer_path), so that `copy path:
	 * peer` is accepted exactly where this says true.
	 */
	struct mp_array peers;
	mp_array_init(&peers);
	for (int j = 0; j < d->pool.count; j++) {
		bool direct;
		copy_peer_path(d, j, index, &direct);
		mp_array_bool(&peers, direct);
	}
	mp_put_array(&m, "peer_access", &peers);
	struct mp_array paths; /* how a copy from this device to each device travels */
	mp_array_init(&paths);
	for (int j = 0; j < d->pool.count; j++) {
		bool direct;
		mp_array_str(&paths, copy_peer_path(d, index, j, &direct));
	}
	mp_put_array(&m, "peer_path", &paths);
	if (s.peer_note[0])
		mp_put_str(&m, "peer_path_note", s.peer_note);
	mp_put_u64(&m, "queue_depth", s.queue_depth);
	render_counters(&s.counters, &m);
	render_scheduler(&s, &m);
	mp_put_u64(&m, "resets", s.resets);
	if (s.resets) {
		mp_put_str(&m, "last_reset", s.last_reset);
		mp_put_f64(&m, "last_reset_s", s.last_reset_s);
		mp_put_u64(&m, "last_reset_regions", s.last_reset_regions);
		mp_put_u64(&m, "last_reset_unpinned", s.last_reset_unpinned);
	}
	mp_array_map(out, &m);
}

/* `absent`, only while buffers are kept for GPUs this gpuqd does not serve: the reply is otherwise as before. */
static void render_absent(struct daemon *d, struct mp_map *out)
{
	struct absent_gpu gpus[GPUQ_MAX_DEVICES];
	size_t n = absent_by_gpu(&d->absent, gpus, GPUQ_MAX_DEVICES);
	struct mp_array a;
	if (n == 0)
		return;
	mp_array_init(&a);
	for (size_t i = 0; i < n; i++) {
		struct mp_map m;
		mp_map_init(&m);
		mp_put_str(&m, "uuid", gpus[i].uuid);
		mp_put_u64(&m, "buffers", gpus[i].buffers);
		mp_put_u64(&m, "bytes", gpus[i].bytes);
		mp_array_map(&a, &m);
	}
	mp_put_array(out, "absent", &a);
}

void op_devices(struct request *req, void *args)
{
	struct daemon *d = req->d;
	(void)args;
	struct mp_map body;
	struct mp_array devices;
	mp_map_init(&body);
	mp_array_init(&devices);
	for (int i = 0; i < d->pool.count; i++)
		render_device(d, i, &devices);
	mp_put_str(&body, "backend", d->ops->name);
	mp_put_array(&body, "devices", &devices);
	if (d->restart.count) /* only once it has re-executed: the reply is otherwise as before */
		mp_put_u64(&body, "restarts", d->restart.count);
	if (d->recover.recoveries)
		mp_put_u64(&body, "recoveries", d->recover.recoveries);
	render_absent(d, &body);
	reply_ok(req, &body);
}

static void render_buffer(const struct buffer *b, double now, struct mp_array *out)
{
	struct mp_map m;
	mp_map_init(&m);
	mp_put_str(&m, "name", b->name);
	mp_put_i64(&m, "device", b->device);
	mp_put_str(&m, "dtype", gpuq_dtype_name(b->dtype));
	mp_put_u64(&m, "count", b->count);
	mp_put_u64(&m, "bytes", b->bytes);
	mp_put_bool(&m, "shareable", b->shareable);
	mp_put_u64(&m, "leases", b->leases);
	mp_put_bool(&m, "ephemeral", b->conn_serial != 0);
	mp_put_u64(&m, "owner", (uint64_t)b->owner);
	mp_put_f64(&m, "age_s", now - b->created);
	mp_put_u64(&m, "generation", b->generation);
	mp_put_str(&m, "state", b->suspect && b->state == BUFFER_READY ? "suspect"
								     : buffer_state_name(b->state));
	if (b->suspect)
		mp_put_str(&m, "suspect", b->suspect);
	render_shape(&m, &b->shape);
	mp_array_map(out, &m);
}

/* buffers: the caller's (root: everyone's), on `device` if given. */
struct buffers_args {
	int device;
	bool has_device;
};

static const struct args_field buffers_fields[] = {
	{ "device", ARGS_DEVICE, 0, ARGS_AT(struct buffers_args, device),
	  ARGS_GIVEN(struct buffers_args, has_device) },
};
const struct args_spec op_buffers_args = ARGS_SPEC(struct buffers_args, buffers_fields, NULL);

/*
 * `absent`, only while some of the caller's buffers (every user's for
 * root) are kept for GPUs this gpuqd does not serve: the reply is otherwise
 * as before.
 */
static void render_absent_buffers(const struct absent *a, uid_t uid, struct mp_map *out)
{
	struct mp_array list;
	bool any = false;
	mp_array_init(&list);
	for (size_t i = 0; i < a->n; i++) {
		const struct state_buffer *b = &a->buffers[i];
		if (uid != 0 && b->owner != (uint32_t)uid)
			continue;
		struct mp_map m;
		mp_map_init(&m);
		mp_put_str(&m, "name", b->name);
		mp_put_str(&m, "uuid", b->uuid);
		mp_put_str(&m, "dtype", gpuq_dtype_name(b->dtype));
		mp_put_u64(&m, "count", b->count);
		mp_put_u64(&m, "bytes", b->bytes);
		mp_put_u64(&m, "owner", b->owner);
		mp_put_str(&m, "state", b->state);
		mp_array_map(&list, &m);
		any = true;
	}
	if (any)
		mp_put_array(out, "absent", &list);
	else
		mp_array_destroy(&list);
}

void op_buffers(struct request *req, void *args)
{
	const struct buffers_args *a = args;
	uid_t uid = req->conn->uid;
	double now = monotonic_seconds();
	struct mp_map body;
	struct mp_array list;
	mp_map_init(&body);
	mp_array_init(&list);
	for (const struct buffer *b = req->d->buffers.head; b; b = b->next) {
		if ((uid != 0 && b->owner != uid) || (a->has_device && b->device != a->device))
			continue;
		render_buffer(b, now, &list);
	}
	mp_put_array(&body, "buffers", &list);
	render_absent_buffers(&req->d->absent, uid, &body);
	reply_ok(req, &body);
}
