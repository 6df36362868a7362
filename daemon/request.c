/*
 * From a complete frame to an op handler. Main thread only.
 *
 * Where an error comes from decides the answer: a frame that cannot be read
 * (or whose descriptors are out of step) gets a bad_frame reply and the
 * connection is closed; a readable request that is refused gets an error
 * reply and the connection stays.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"

/*
 * Who may call an op. Every op is open to whoever may connect unless its
 * row says otherwise; the dispatcher checks after the arguments decode,
 * so that a malformed request is told so first, as the ops always did.
 */
enum op_caller {
	OP_ANYONE,
	OP_BENCH, /* benchmarks hold whole devices: admins and the quota's benchmarks right */
	OP_ADMIN, /* root and the admin group (rule: admin-group) */
	OP_ROOT,
};

/*
 * One op: its name, its arguments (daemon/args.h; the spec holds the
 * field table and the argument struct's size), the handler that receives
 * them decoded, and who may call it. `denied` words the refusal for a
 * caller `who` turns away (NULL: the standard words).
 *
 * Adding an op: its argument struct, field table and handler in an
 * op_*.c, their declarations in daemon.h, a row here, and its section in
 * docs/protocol.md (docs/ARCHITECTURE.md, "Recipes").
 */
struct op_def {
	const char *name;
	const struct args_spec *args;
	op_exec exec;
	enum op_caller who;
	void (*denied)(struct request *req, struct gpuq_error *err);
};

static const struct op_def op_table[] = {
	/* name, args, exec, who may call, how a refusal is worded */
	{ "ping", &op_ping_args, op_ping, OP_ANYONE, NULL },
	{ "devices", &op_devices_args, op_devices, OP_ANYONE, NULL },
	{ "noop", &op_noop_args, op_noop, OP_ANYONE, NULL },
	{ "alloc", &op_alloc_args, op_alloc, OP_ANYONE, NULL },
	{ "free", &op_free_args, op_free, OP_ANYONE, NULL },
	{ "buffers", &op_buffers_args, op_buffers, OP_ANYONE, NULL },
	{ "put", &op_put_args, op_transfer, OP_ANYONE, NULL },
	{ "get", &op_get_args, op_transfer, OP_ANYONE, NULL },
	{ "fill", &op_fill_args, op_fill, OP_ANYONE, NULL },
	{ "checksum", &op_checksum_args, op_checksum, OP_ANYONE, NULL },
	{ "jobs", &op_jobs_args, op_jobs, OP_ANYONE, NULL },
	{ "status", &op_status_args, op_status, OP_ANYONE, NULL },
	{ "wait", &op_wait_args, op_wait, OP_ANYONE, NULL },
	{ "cancel", &op_cancel_args, op_cancel, OP_ANYONE, NULL },
	{ "bench_copy", &op_bench_copy_args, op_bench_copy, OP_BENCH, NULL },
	{ "copy", &op_copy_args, op_copy, OP_ANYONE, NULL },
	{ "bench_d2d", &op_bench_d2d_args, op_bench_d2d, OP_BENCH, NULL },
	{ "run", &op_run_args, op_run, OP_ANYONE, NULL },
	{ "stats", &op_stats_args, op_stats, OP_ANYONE, NULL },
	{ "bench_chain", &op_bench_chain_args, op_bench_chain, OP_BENCH, NULL },
	{ "allreduce", &op_allreduce_args, op_collective, OP_ANYONE, NULL },
	{ "bench_allreduce", &op_bench_allreduce_args, op_collective, OP_BENCH, NULL },
	{ "reduce_scatter", &op_reduce_scatter_args, op_collective, OP_ANYONE, NULL },
	{ "all_gather", &op_all_gather_args, op_collective, OP_ANYONE, NULL },
	{ "broadcast", &op_broadcast_args, op_collective, OP_ANYONE, NULL },
	{ "reduce", &op_reduce_args, op_collective, OP_ANYONE, NULL },
	{ "sendrecv", &op_sendrecv_args, op_collective, OP_ANYONE, NULL },
	{ "all_to_all", &op_all_to_all_args, op_collective, OP_ANYONE, NULL },
	{ "group", &op_group_args, op_collective, OP_ANYONE, NULL },
	{ "bench_collective", &op_bench_collective_args, op_collective, OP_BENCH, NULL },
	{ "reduce_expr", &op_reduce_expr_args, op_reduce_expr, OP_ANYONE, NULL },
	{ "quota", &op_quota_args, op_quota, OP_ANYONE, NULL },
	{ "metrics", &op_metrics_args, op_metrics, OP_ANYONE, NULL },
	{ "shutdown", &op_shutdown_args, op_shutdown, OP_ADMIN, shutdown_denied },
	{ "restart", &op_restart_args, op_restart, OP_ADMIN, restart_denied },
	{ "bench_sched", &op_bench_sched_args, op_bench_sched, OP_BENCH, NULL },
	{ "bench_alloc", &op_bench_alloc_args, op_bench_alloc, OP_BENCH, NULL },
	{ "reset_device", &op_reset_device_args, op_reset_device, OP_ADMIN, reset_device_denied },
	{ "drop_absent", &op_drop_absent_args, op_drop_absent, OP_ADMIN, drop_absent_denied },
	{ "region_create", &op_region_create_args, op_region_create, OP_ANYONE, NULL },
	{ "region_free", &op_region_free_args, op_region_free, OP_ANYONE, NULL },
	{ "regions", &op_regions_args, op_regions, OP_ANYONE, NULL },
	{ "region_open", &op_region_open_args, op_region_open, OP_ANYONE, NULL },
	{ "attach", &op_attach_args, op_attach, OP_ANYONE, NULL },
	{ "release", &op_release_args, op_release, OP_ANYONE, NULL },
	{ "leases", &op_leases_args, op_leases, OP_ANYONE, NULL },
	{ "lease_break", &op_lease_break_args, op_lease_break, OP_ADMIN, lease_break_denied },
#ifdef GPUQ_FAULT_INJECTION
	/* tests/gpuqd-faults only */
	{ "inject_fault", &op_inject_fault_args, op_inject_fault, OP_ROOT, NULL },
#endif
};

#define OP_COUNT (sizeof op_table / sizeof op_table[0])

static const struct op_def *find_op(const char *name)
{
	for (size_t i = 0; i < OP_COUNT; i++)
		if (strcmp(op_table[i].name, name) == 0)
			return &op_table[i];
	return NULL;
}

/* Room for every op's name, comma-separated: 24 bytes each on average. */
#define OP_NAMES_MAX (OP_COUNT * (2 + 24))

/* Every op's name, comma-separated, as unknown_op lists them. */
static size_t op_names(char *out, size_t size)
{
	size_t used = 0;
	for (size_t i = 0; i < OP_COUNT; i++) {
		int n = snprintf(out + used, size - used, "%s%s", i ? ", " : "", op_table[i].name);
		used += (size_t)n < size - used ? (size_t)n : size - used - 1;
	}
	return used;
}

static void op_refuse_caller(const struct op_def *op, struct request *req, struct gpuq_error *err)
{
	if (op->denied) {
		op->denied(req, err);
		return;
	}
	if (op->who == OP_ROOT)
		gpuq_fail(err, GPUQ_E_PERMISSION_DENIED, "%s is root's", op->name);
	else
		gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
			  "only root and members of the admin group may call %s (rule: admin-group)",
			  op->name);
}

/* 0 when the caller may call op, else -1 with permission_denied saying who may. */
static int op_check_caller(const struct op_def *op, struct request *req, struct gpuq_error *err)
{
	switch (op->who) {
	case OP_ANYONE: return 0;
	case OP_BENCH: return quota_check_benchmarks(req->d, req->conn, op->name, err);
	case OP_ADMIN:
		if (quota_is_admin(req->d, req->conn))
			return 0;
		break;
	case OP_ROOT:
		if (req->conn->uid == 0)
			return 0;
		break;
	}
	op_refuse_caller(op, req, err);
	return -1;
}

/* Decodes the op's arguments, checks the caller, then runs the op. */
static void op_run_one(const struct op_def *op, struct request *req)
{
	_Alignas(max_align_t) char args[ARGS_MAX_SIZE];
	struct gpuq_error err;
	if (op->args && op->args->size > sizeof args) {
		gpuq_fail(&err, GPUQ_E_INTERNAL, "op %s: its arguments take %zu bytes; at most %zu",
			  op->name, op->args->size, sizeof args);
		reply_error(req, &err);
		return;
	}
	if (args_decode(req, op->args, args, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	if (op_check_caller(op, req, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	op->exec(req, args);
}

int request_check_ops(struct gpuq_error *err)
{
	for (size_t i = 0; i < OP_COUNT; i++) {
		const struct op_def *op = &op_table[i];
		if (!op->exec || !op->args)
			return gpuq_fail(err, GPUQ_E_INTERNAL, "op %s: give its args and exec", op->name);
		struct gpuq_error spec_err;
		if (args_spec_check(op->args, &spec_err) < 0)
			return gpuq_fail(err, GPUQ_E_INTERNAL, "op %s: %s", op->name, spec_err.message);
		for (size_t j = 0; j < i; j++)
			if (strcmp(op_table[j].name, op->name) == 0)
				return gpuq_fail(err, GPUQ_E_INTERNAL, "op %s is in the table twice",
						 op->name);
	}
	char names[OP_NAMES_MAX];
	size_t len = op_names(names, sizeof names);
	if (len + 1 >= sizeof names)
		return gpuq_fail(err, GPUQ_E_INTERNAL,
				 "the ops' names take %zu bytes or more: unknown_op's message would cut "
				 "them off", len);
	return 0;
}

static void refuse_unknown_op(struct request *req, const char *op)
{
	char names[OP_NAMES_MAX], message[OP_NAMES_MAX + 64];
	op_names(names, sizeof names);
	snprintf(message, sizeof message, "unknown op '%s' (ops: %s)", op, names);
	reply_error_text(req, GPUQ_E_UNKNOWN_OP, message); /* longer than a struct gpuq_error holds */
}

/*
 * Takes the request's descriptors first, so that the stream stays in step:
 * `fds` of them must have arrived with the frame's first byte, and any
 * that did and are not declared are closed after the request (conn.c).
 */
static int take_fds(struct request *req, struct gpuq_error *err)
{
	uint64_t n = 0;
	int arrived;
	if (msg_get_u64(req->map, "fds", &n, err) < 0) {
		err->code = GPUQ_E_BAD_FRAME; /* unknowable how many arrived: out of step */
		return -1;
	}
	if (n > GPUQ_MAX_FDS_PER_REQUEST)
		return gpuq_fail(err, GPUQ_E_BAD_FRAME, "field 'fds': %llu descriptors; at most %d",
				 (unsigned long long)n, GPUQ_MAX_FDS_PER_REQUEST);
	if (conn_take_fds(req->conn, (int)n, req->fds, &arrived) < 0)
		return gpuq_fail(err, GPUQ_E_BAD_FRAME,
				 "the request says it carries %llu descriptors (field 'fds') but %d arrived with "
				 "its first byte; send them on the sendmsg that carries it",
				 (unsigned long long)n, arrived);
	req->nfds = (int)n;
	return 0;
}

static int read_header(struct request *req, char *op, size_t opsize, struct gpuq_error *err)
{
	uint64_t version = 0;
	int rc = msg_get_u64(req->map, "v", &version, err);
	if (rc == 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'v' (protocol version) is required");
	if (rc < 0)
		return -1;
	if (version != GPUQ_PROTOCOL_VERSION)
		return gpuq_fail(err, GPUQ_E_UNSUPPORTED_VERSION,
				 "protocol version %llu is not supported; this gpuqd speaks %d",
				 (unsigned long long)version, GPUQ_PROTOCOL_VERSION);
	rc = msg_get_str(req->map, "op", op, opsize, err);
	if (rc == 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'op' is required");
	return rc < 0 ? -1 : 0;
}

static void dispatch(struct request *req)
{
	struct gpuq_error err;
	char op[32];
	int rc = msg_get_u64(req->map, "id", &req->id, &err);
	if (rc <= 0) {
		if (rc == 0)
			gpuq_fail(&err, GPUQ_E_BAD_REQUEST, "field 'id' (request id) is required");
		req->id = 0;
		reply_error(req, &err);
		return;
	}
	if (msg_check_unique_keys(req->map, &err) < 0 || read_header(req, op, sizeof op, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	const struct op_def *def = find_op(op);
	if (!def) {
		refuse_unknown_op(req, op);
		return;
	}
	op_run_one(def, req);
}

/*
 * The job the request made (job_id, the first made while it was handled:
 * a job of gpuqd's own that its handling set off, such as the free of an
 * orphaned buffer, comes after and has no pid), if it is still queued or
 * running, keeps the request for a re-exec to replay (daemon/replay.h):
 * not one that carried descriptors, which do not outlive the image.
 */
static void keep_for_replay(struct request *req, uint64_t job_id, const uint8_t *payload,
			    size_t len)
{
	struct job *job = job_find(&req->d->jobs, job_id);
	if (!job || job_is_finished(job) || job->pid != req->conn->pid || job->owner != req->conn->uid)
		return;
	if (req->nfds > 0)
		job->why_kept_not = "its request passed descriptors, which do not outlive gpuqd's image";
	else
		job_keep_request(job, req->conn->serial, req->id, payload, len);
}

void request_handle(struct daemon *d, struct conn *c, const uint8_t *payload, size_t len)
{
	struct msg m;
	struct gpuq_error err;
	if (msg_decode(&m, payload, len, &msg_request_limits, &err) < 0) {
		conn_refuse(c, 0, &err);
		return;
	}
	struct request req = { .d = d, .conn = c, .map = m.root };
	if (take_fds(&req, &err) < 0) {
		uint64_t id = 0;
		struct gpuq_error ignored;
		msg_get_u64(m.root, "id", &id, &ignored);
		conn_refuse(c, id, &err);
	} else {
		uint64_t first = d->jobs.next_id;
		dispatch(&req);
		if (d->jobs.next_id > first) /* it made a job: the request is what replays it */
			keep_for_replay(&req, first, payload, len);
	}
	for (int i = 0; i < req.nfds; i++)
		if (req.fds[i] >= 0)
			close(req.fds[i]);
	msg_free(&m);
}

int request_replay(struct daemon *d, struct conn *c, const uint8_t *payload, size_t len,
		   bool quiet, struct gpuq_error *err)
{
	struct msg m;
	uint64_t job_id = d->jobs.reuse.id;
	if (msg_decode(&m, payload, len, &msg_request_limits, err) < 0) {
		d->jobs.reuse.id = 0;
		return -1;
	}
	struct request req = { .d = d, .conn = c, .map = m.root, .quiet = quiet };
	dispatch(&req);
	d->jobs.reuse.id = 0; /* a request refused before it made its job */
	keep_for_replay(&req, job_id, payload, len);
	msg_free(&m);
	return 0;
}
