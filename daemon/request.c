/*
 * From a complete frame to an op handler. Main thread only.
 *
 * Where an error comes from decides the answer: a frame that cannot be read
 * (or whose descriptors are out of step) gets a bad_frame reply and the
 * connection is closed; a readable request that is refused gets an error
 * reply and the connection stays.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "daemon/log.h"

struct op_entry {
	const char *name;
	request_handler handler;
};

static const struct op_entry ops[] = {
	{ "ping", op_ping },       { "devices", op_devices },   { "noop", op_noop },
	{ "alloc", op_alloc },     { "free", op_free },         { "buffers", op_buffers },
	{ "put", op_put },         { "get", op_get },           { "fill", op_fill },
	{ "checksum", op_checksum }, { "jobs", op_jobs },       { "status", op_status },
	{ "wait", op_wait },       { "cancel", op_cancel },
	{ "bench_copy", op_bench_copy },
	{ "copy", op_copy },       { "bench_d2d", op_bench_d2d },
	{ "run", op_run },         { "stats", op_stats },       { "bench_chain", op_bench_chain },
	{ "allreduce", op_collective }, { "bench_allreduce", op_collective },
	{ "reduce_scatter", op_collective }, { "all_gather", op_collective },
	{ "broadcast", op_collective }, { "reduce", op_collective }, { "sendrecv", op_collective },
	{ "all_to_all", op_collective }, { "group", op_collective },
	{ "bench_collective", op_collective },
	{ "reduce_expr", op_reduce_expr },
	{ "metrics", op_metrics },  { "shutdown", op_shutdown },
	{ "bench_sched", op_bench_sched }, { "reset_device", op_reset_device },
	{ "region_create", op_region_create }, { "region_free", op_region_free },
	{ "regions", op_regions },  { "region_open", op_region_open },
	{ "attach", op_attach },    { "release", op_release },
	{ "leases", op_leases },    { "lease_break", op_lease_break },
#ifdef GPUQ_FAULT_INJECTION
	{ "inject_fault", op_inject_fault }, /* tests/gpuqd-faults only */
#endif
};

static request_handler find_op(const char *name)
{
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
		if (strcmp(ops[i].name, name) == 0)
			return ops[i].handler;
	return NULL;
}

static void refuse_unknown_op(struct request *req, const char *op)
{
	char names[256];
	size_t used = 0;
	for (size_t i = 0; i < sizeof ops / sizeof ops[0] && used < sizeof names; i++)
		used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
					 ops[i].name);
	struct gpuq_error err;
	gpuq_fail(&err, GPUQ_E_UNKNOWN_OP, "unknown op '%s' (ops: %s)", op, names);
	reply_error(req, &err);
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
	request_handler handler = find_op(op);
	if (!handler) {
		refuse_unknown_op(req, op);
		return;
	}
	handler(req);
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
		dispatch(&req);
	}
	for (int i = 0; i < req.nfds; i++)
		if (req.fds[i] >= 0)
			close(req.fds[i]);
	msg_free(&m);
}
