/*
 * put and get: bytes between a client's descriptor and a buffer. The main
 * thread checks the descriptor, the range and the options before anything
 * moves, so a refused request changes no byte; the worker does the moving
 * (workers/transfer/transfer.c). Main thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"
#include "workers/transfer/transfer.h"

/* The one descriptor a put/get carries, checked for the access it needs. */
static int read_descriptor(struct request *req, bool for_reading, struct gpuq_error *err)
{
	const char *op = for_reading ? "put" : "get";
	struct stat st;
	if (req->nfds != 1)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "%s needs exactly one descriptor attached (fds: 1), not %d", op,
				 req->nfds);
	int flags = fcntl(req->fds[0], F_GETFL);
	if (flags < 0 || fstat(req->fds[0], &st) < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "the descriptor passed to %s: %s", op,
				 strerror(errno));
	int mode = flags & O_ACCMODE;
	if (flags & O_PATH)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the descriptor passed to %s was opened with O_PATH and can be neither "
				 "read nor written", op);
	if (for_reading && mode == O_WRONLY)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the descriptor passed to put is open for writing only; open the source for reading");
	if (!for_reading && mode == O_RDONLY)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the descriptor passed to get is open for reading only; open the destination for writing");
	if (S_ISDIR(st.st_mode))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "the descriptor passed to %s is a directory",
				 op);
	return 0;
}

/* A regular file that holds more than the room would fail late: refuse it now. */
static int check_source_fits(int fd, const struct buffer *b, uint64_t offset, uint64_t room,
			     struct gpuq_error *err)
{
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		return 0;
	off_t pos = lseek(fd, 0, SEEK_CUR);
	uint64_t left = pos >= 0 && pos < st.st_size ? (uint64_t)(st.st_size - pos) : 0;
	if (left > room)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the source holds %llu bytes but buffer '%s@%d' has room for %llu from offset %llu; "
				 "give --length or use a larger buffer",
				 (unsigned long long)left, b->name, b->device, (unsigned long long)room,
				 (unsigned long long)offset);
	return 0;
}

/*
 * `scratch` or `region`: no descriptor; otherwise exactly one, with the
 * access it needs.
 */
static int check_endpoint(struct request *req, bool put, bool region, bool scratch,
			  struct gpuq_error *err)
{
	if (region && (scratch || req->nfds != 0))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "a %s through a region takes no descriptor and no scratch (%d descriptors came)",
				 put ? "put" : "get", req->nfds);
	if (region)
		return 0;
	if (!scratch)
		return read_descriptor(req, put, err);
	if (req->nfds != 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "a scratch %s takes no descriptor, but %d came with the request",
				 put ? "source" : "sink", req->nfds);
	return 0;
}

/*
 * A ring's status counter says the job ended, however it ended: the
 * worker sets it when its transfer ends, but a job cancelled or refused
 * before it ran never reached the worker, and the client polls the
 * counter, not the socket (docs/protocol.md, "Rings").
 */
static void finish_ring(struct job *job)
{
	_Atomic uint64_t *status = (_Atomic uint64_t *)job->work.transfer.ring_counters;
	if (!status || !job->region)
		return;
	status += 2;
	uint64_t running = 0;
	atomic_compare_exchange_strong(status, &running, job->work.error.code == GPUQ_OK ? 1 : 2);
}

/* A put that wrote the whole buffer makes a suspect one (read back after a re-exec) sound again. */
static void finish_put(struct daemon *d, struct job *job)
{
	(void)d;
	finish_ring(job);
	if (job->work.error.code == GPUQ_OK && job->buffer && job->work.transfer.offset == 0 &&
	    job->work.result.bytes == job->buffer->bytes)
		buffer_clear_suspect(job->buffer);
}

static void finish_get(struct daemon *d, struct job *job)
{
	(void)d;
	finish_ring(job);
}

static const struct job_kind kind_put = { "put", finish_put, render_transfer };
static const struct job_kind kind_get = { "get", finish_get, render_transfer };

static bool is_ring_of(const struct job *job, const struct conn *c)
{
	return (job->kind == &kind_put || job->kind == &kind_get) &&
	       job->work.transfer.ring_counters && job->region &&
	       job->region->conn_serial == c->serial;
}

void rings_drop_conn(struct daemon *d, struct conn *c)
{
	if (d->stopping) /* the shutdown ends every job itself, the workers first */
		return;
	for (struct job *j = d->jobs.oldest, *next; j; j = next) {
		next = j->newer;
		if (job_is_finished(j) || !is_ring_of(j, c))
			continue;
		log_info("job %llu: cancelling the %s through ring region %s of uid %d: the "
			 "connection that made the region closed, and no one raises its counters now",
			 (unsigned long long)j->id, j->kind->op, j->region->name, (int)j->owner);
		if (job_unqueue(d, j))
			cancel_unqueued(d, j, "cancelled while queued: its ring's region went with the "
					      "connection that made it");
		else
			job_cancel_running(d, j);
	}
}

struct transfer_args {
	bool put;                 /* put: from the descriptor to the buffer; get: back */
	struct args_buffer buffer; /* NAME[@GPU][[START:STOP]] */
	bool region_named;        /* `region` is in the request: no descriptor, no scratch */
	bool scratch;             /* a scratch source or sink: no descriptor */
	uint64_t offset, length;  /* the range in the buffer, once checked */
	bool has_offset, has_length;
	char region[BUFFER_NAME_MAX + 96];
	bool has_region;
	struct region_span span;  /* the region's side, once resolved */
	bool verify;
	char path_name[16];
	uint64_t seed;
	enum transfer_path path;
	const msgpack_object *shape_obj; /* put's `shape`, NULL when absent */
	struct buffer_shape shape;
	const msgpack_object *ring_obj;  /* `ring`, NULL when absent */
	struct region_ring ring;         /* its fields, once read */
};

static int transfer_check_endpoint(struct request *req, void *args, struct gpuq_error *err)
{
	const struct transfer_args *a = args;
	return check_endpoint(req, a->put, a->region_named, a->scratch, err);
}

/*
 * offset and length within b: from the reference's [START:STOP] or from
 * the `offset` and `length` fields, not both. has_length then says whether
 * a length was given.
 */
static int transfer_check_range(struct request *req, void *args, struct gpuq_error *err)
{
	struct transfer_args *a = args;
	const struct buffer *b = a->buffer.b;
	const struct buffer_ref *ref = &a->buffer.ref;
	(void)req;
	if (ref->has_range && (a->has_offset || a->has_length))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "buffer '%s@%d' is given a range both in 'buffer' ([START:STOP]) and "
				 "in 'offset'/'length'; give one",
				 b->name, b->device);
	if (ref->has_range) {
		a->offset = ref->offset;
		a->length = ref->length;
		a->has_length = ref->has_length;
	} else if (!a->has_offset) {
		a->offset = 0;
	}
	return buffer_range_check(b, a->offset, a->has_length, a->length, &a->length, err);
}

/* `ring`: slot_bytes and counters, for a transfer through a region (docs/protocol.md, "Rings"). */
static int transfer_check_ring(struct request *req, void *args, struct gpuq_error *err)
{
	struct transfer_args *a = args;
	(void)req;
	if (!a->ring_obj)
		return 0;
	if (!a->region_named)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'ring' needs 'region': the region whose range holds the ring's slots");
	/* 1: given; 0: absent or nil (the protocol's absent), which slot_bytes
	 * 0 would have let through to a division by zero */
	int has_slot = msg_get_u64_in(a->ring_obj, "slot_bytes", 8, UINT64_MAX,
				      &a->ring.slot_bytes, err);
	if (has_slot < 0)
		return -1;
	int has_counters = msg_get_u64(a->ring_obj, "counters", &a->ring.counters, err);
	if (has_counters < 0)
		return -1;
	if (!has_slot || !has_counters)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'ring' needs 'slot_bytes' and 'counters' (uint)");
	if (a->ring.slot_bytes % 8 != 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'ring': slot_bytes %llu is not a multiple of 8",
				 (unsigned long long)a->ring.slot_bytes);
	return 0;
}

/* The region's side, which may decide the length; then a source too large for the room. */
static int transfer_check_region(struct request *req, void *args, struct gpuq_error *err)
{
	struct transfer_args *a = args;
	const char *region = a->region_named ? a->region : NULL;
	if (a->ring_obj) /* the buffer's range says how many bytes move; the region holds slots */
		return region_ring_read(req, region, a->has_region, &a->ring, &a->span, err) < 0 ? -1 : 0;
	int rc = region_transfer_read(req, region, a->has_region, a->put, a->buffer.b, a->offset,
				      &a->length, a->has_length, &a->span, err);
	if (rc > 0)
		a->has_length = true; /* the region's range says how many bytes move */
	if (rc == 0 && a->put && !a->has_length && !a->scratch)
		rc = check_source_fits(req->fds[0], a->buffer.b, a->offset, a->length, err);
	return rc < 0 ? -1 : 0;
}

/* `path` (auto, staged, registered) against the endpoint it would take. */
static int transfer_check_path(struct request *req, void *args, struct gpuq_error *err)
{
	struct transfer_args *a = args;
	if (strcmp(a->path_name, "auto") == 0)
		a->path = TRANSFER_PATH_AUTO;
	else if (strcmp(a->path_name, "staged") == 0)
		a->path = TRANSFER_PATH_STAGED;
	else if (strcmp(a->path_name, "registered") == 0)
		a->path = TRANSFER_PATH_REGISTERED;
	else
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'path': '%s' is not auto, staged or registered", a->path_name);
	if (a->path == TRANSFER_PATH_REGISTERED && a->scratch)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "path registered needs a memfd; a scratch %s has none",
				 a->put ? "source" : "sink");
	if (a->path != TRANSFER_PATH_AUTO && a->region_named)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'path': a region is pinned already and always takes path %s; "
				 "leave path out (or auto)", a->ring_obj ? "ring" : "region");
	if (a->path == TRANSFER_PATH_REGISTERED)
		return transfer_check_registrable(req->fds[0], a->put, err);
	return 0;
}

static bool transfer_is_put(const void *args)
{
	return ((const struct transfer_args *)args)->put;
}

/* put's `shape`: the whole buffer's, whatever range this put fills. */
static int transfer_check_shape(struct request *req, void *args, struct gpuq_error *err)
{
	struct transfer_args *a = args;
	(void)req;
	return shape_parse(a->shape_obj, a->buffer.b->count, &a->shape, err);
}

#define T struct transfer_args
static const struct args_field transfer_fields[] = {
	{ "buffer", ARGS_BUFFER, ARGS_REQUIRED, ARGS_AT(T, buffer) },
	{ "region", ARGS_PRESENT, 0, ARGS_AT(T, region_named) },
	{ "ring", ARGS_MAP, 0, ARGS_AT(T, ring_obj), .then = transfer_check_ring },
	{ "scratch", ARGS_BOOL, 0, ARGS_AT(T, scratch), .then = transfer_check_endpoint },
	{ "offset", ARGS_U64, 0, ARGS_AT(T, offset), ARGS_GIVEN(T, has_offset) },
	{ "length", ARGS_U64, 0, ARGS_AT(T, length), ARGS_GIVEN(T, has_length),
	  .then = transfer_check_range },
	{ "region", ARGS_STR, 0, ARGS_AT(T, region), ARGS_GIVEN(T, has_region),
	  .then = transfer_check_region },
	{ "verify", ARGS_BOOL, 0, ARGS_AT(T, verify) },
	{ "path", ARGS_STR, 0, ARGS_AT(T, path_name) },
	{ "seed", ARGS_U64, 0, ARGS_AT(T, seed), .then = transfer_check_path },
	{ "shape", ARGS_ARRAY, 0, ARGS_AT(T, shape_obj), .when = transfer_is_put,
	  .then = transfer_check_shape },
};
#undef T
static const struct transfer_args put_defaults = { .put = true, .path_name = "auto" };
static const struct transfer_args get_defaults = { .put = false, .path_name = "auto" };
const struct args_spec op_put_args = ARGS_SPEC(struct transfer_args, transfer_fields, &put_defaults);
const struct args_spec op_get_args = ARGS_SPEC(struct transfer_args, transfer_fields, &get_defaults);

/* put and get: the transfer, checked whole, becomes a job on the buffer's device. */
void op_transfer(struct request *req, void *args)
{
	const struct transfer_args *a = args;
	struct buffer *b = a->buffer.b;
	bool put = a->put;
	struct job *job = new_job(req, put ? &kind_put : &kind_get, put ? WORK_PUT : WORK_GET,
				  b->device);
	if (!job)
		return;
	job_attach_buffer(job, b);
	if (a->shape.given) /* kept from the accepted request on, as the buffer's */
		b->shape = a->shape;
	job->work.transfer.offset = a->offset;
	job->work.length = a->length;
	work_narrow_access(&job->work, a->offset, a->length, put);
	job->work.transfer.length_exact = put && a->has_length;
	job->work.transfer.verify = a->verify;
	job->work.transfer.path = a->path;
	job->work.transfer.scratch = a->scratch;
	job->work.transfer.seed = a->seed;
	job->work.transfer.idle_timeout_ms = req->d->opt.transfer_idle_timeout_ms;
	if (a->span.region && a->ring_obj)
		region_ring_hold(job, &a->span, &a->ring, put);
	else if (a->span.region)
		region_transfer_hold(job, &a->span, put);
	else if (!a->scratch) {
		job->work.fd = req->fds[0];
		req->fds[0] = -1; /* the job closes it when done */
	}
	job_submit(req, job);
}
