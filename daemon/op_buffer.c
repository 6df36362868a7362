/*
 * Requests that become jobs on a device worker: noop, alloc, free, fill,
 * checksum, put, get. Each handler validates everything it can on the main
 * thread (so a refused request moves no byte), fills in a job's work and
 * hands it to job_submit. Main thread only.
 */
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"
#include "protocol/dtype.h"

static void render_noop(const struct job *job, struct mp_map *out)
{
	mp_put_i64(out, "device", job->work.device);
}

static void render_checksum(const struct job *job, struct mp_map *out)
{
	mp_put_u64(out, "checksum", job->work.result.checksum);
	mp_put_u64(out, "bytes", job->work.result.bytes);
}

static void render_alloc(const struct job *job, struct mp_map *out)
{
	mp_put_str(out, "name", job->brief.name);
	mp_put_i64(out, "device", job->brief.device);
	mp_put_str(out, "dtype", gpuq_dtype_name(job->brief.dtype));
	mp_put_u64(out, "count", job->brief.count);
	mp_put_u64(out, "bytes", job->brief.bytes);
	mp_put_bool(out, "shareable", job->work.shareable);
	mp_put_bool(out, "ephemeral", job->brief.ephemeral);
}

static void finish_alloc(struct daemon *d, struct job *job)
{
	struct buffer *b = job->buffer;
	if (job->work.error.code == GPUQ_OK) {
		b->dptr = job->work.dptr;
		b->share_fd = job->work.result.share_fd;
		b->slab = job->work.result.slab;
		b->slab_offset = job->work.result.slab_offset;
		b->slab_bytes = job->work.result.slab_bytes;
		b->slab_fd = job->work.result.slab ? job->work.result.slab_fd : -1;
		b->state = BUFFER_READY;
		return;
	}
	buffer_remove(&d->buffers, b); /* the struct goes once the job lets go of it */
}

static void finish_free(struct daemon *d, struct job *job)
{
	struct buffer *b = job->buffer;
	if (job->work.error.code == GPUQ_OK)
		buffer_remove(&d->buffers, b); /* the struct goes once every job lets go of it */
	else
		buffer_free_failed(b);
}

static const struct job_kind kind_noop = { "noop", NULL, render_noop };
static const struct job_kind kind_alloc = { "alloc", finish_alloc, render_alloc };
static const struct job_kind kind_free = { "free", finish_free, render_bytes };
/* A fill writes the whole buffer: a suspect one (read back after a re-exec) is sound again. */
static void finish_fill(struct daemon *d, struct job *job)
{
	(void)d;
	if (job->work.error.code == GPUQ_OK && job->buffer)
		buffer_clear_suspect(job->buffer);
}

static const struct job_kind kind_fill = { "fill", finish_fill, render_bytes };
static const struct job_kind kind_checksum = { "checksum", NULL, render_checksum };

/* noop on `device`, or as a gang on every device in `devices` (measures gang dispatch). */
struct noop_args {
	struct args_devices devices;
	int device;
};

static bool noop_on_one(const void *args)
{
	return ((const struct noop_args *)args)->devices.n == 0;
}

static const struct args_field noop_fields[] = {
	{ "devices", ARGS_DEVICES, 0, ARGS_AT(struct noop_args, devices) },
	{ "device", ARGS_DEVICE, 0, ARGS_AT(struct noop_args, device), .when = noop_on_one },
};
const struct args_spec op_noop_args = ARGS_SPEC(struct noop_args, noop_fields, NULL);

void op_noop(struct request *req, void *args)
{
	const struct noop_args *a = args;
	struct gpuq_error err;
	int n = a->devices.n;
	struct job *job = new_job(req, &kind_noop, WORK_NOOP, n ? a->devices.dev[0] : a->device);
	if (!job)
		return;
	/* `devices` makes a gang, even of one: its record lists them (docs/protocol.md) */
	if (n > 0 && job_make_gang(job, n) < 0) {
		job_discard(&req->d->jobs, job);
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for a %d-device job", n);
		reply_error(req, &err);
		return;
	}
	for (int i = 0; i < n && job->parts; i++)
		job->parts[i].device = a->devices.dev[i];
	job_submit(req, job);
}

struct alloc_args {
	char name[BUFFER_NAME_MAX + 2];
	int device;
	uint64_t bytes, count;
	char dtype_name[16];
	bool has_bytes, has_count, has_dtype;
	enum gpuq_dtype dtype;     /* from dtype_name; bytes when absent */
	uint64_t wait_memory_ms;   /* how long to wait for memory others free (0: not at all) */
	bool shareable, ephemeral;
	const msgpack_object *shape_obj; /* `shape`, NULL when absent */
	struct buffer_shape shape;
};

static int alloc_check_name(struct request *req, void *args, struct gpuq_error *err)
{
	(void)req;
	return buffer_name_check(((struct alloc_args *)args)->name, err);
}

/* bytes, or count with dtype: the buffer's shape, both sizes set. */
static int alloc_check_shape(struct request *req, void *args, struct gpuq_error *err)
{
	struct alloc_args *a = args;
	(void)req;
	a->dtype = GPUQ_DTYPE_BYTES;
	if (a->has_dtype && gpuq_dtype_from_name(a->dtype_name, strlen(a->dtype_name), &a->dtype) < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'dtype': '%s' is not one of %s",
				 a->dtype_name, gpuq_dtype_list());
	size_t size = gpuq_dtype_size(a->dtype);
	if (a->has_bytes == a->has_count)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "alloc takes either 'bytes' or 'count' (with 'dtype'), not %s",
				 a->has_bytes ? "both" : "neither");
	if (a->has_count && !a->has_dtype)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'count' needs 'dtype'");
	/* Of dtype bytes, a count is a size: say so plainly, not "a multiple of bytes's 1 bytes". */
	if (a->dtype == GPUQ_DTYPE_BYTES && (a->has_count ? a->count : a->bytes) == 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field '%s': 0 bytes is not a positive size",
				 a->has_count ? "count" : "bytes");
	if (a->has_count) {
		if (a->count == 0 || a->count > UINT64_MAX / size)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'count': %llu is out of range",
					 (unsigned long long)a->count);
		a->bytes = a->count * size;
	} else {
		if (a->bytes == 0 || a->bytes % size)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "field 'bytes': %llu is not a positive multiple of %s's %zu bytes",
					 (unsigned long long)a->bytes, gpuq_dtype_name(a->dtype), size);
		a->count = a->bytes / size;
	}
	return 0;
}

/* `shape`, once count is known: its dimensions must multiply to count. */
static int alloc_check_dims(struct request *req, void *args, struct gpuq_error *err)
{
	struct alloc_args *a = args;
	(void)req;
	return shape_parse(a->shape_obj, a->count, &a->shape, err);
}

static const struct args_field alloc_fields[] = {
	{ "name", ARGS_STR, ARGS_REQUIRED, ARGS_AT(struct alloc_args, name),
	  .then = alloc_check_name },
	{ "device", ARGS_DEVICE, 0, ARGS_AT(struct alloc_args, device) },
	{ "bytes", ARGS_U64, 0, ARGS_AT(struct alloc_args, bytes),
	  ARGS_GIVEN(struct alloc_args, has_bytes) },
	{ "count", ARGS_U64, 0, ARGS_AT(struct alloc_args, count),
	  ARGS_GIVEN(struct alloc_args, has_count) },
	{ "dtype", ARGS_STR, 0, ARGS_AT(struct alloc_args, dtype_name),
	  ARGS_GIVEN(struct alloc_args, has_dtype), .then = alloc_check_shape },
	{ "wait_memory_ms", ARGS_U64, 0, ARGS_AT(struct alloc_args, wait_memory_ms),
	  .lo = 0, .hi = 3600000 },
	{ "shareable", ARGS_BOOL, 0, ARGS_AT(struct alloc_args, shareable) },
	{ "ephemeral", ARGS_BOOL, 0, ARGS_AT(struct alloc_args, ephemeral) },
	{ "shape", ARGS_ARRAY, 0, ARGS_AT(struct alloc_args, shape_obj),
	  .then = alloc_check_dims },
};
const struct args_spec op_alloc_args = ARGS_SPEC(struct alloc_args, alloc_fields, NULL);

/* alloc of a name taken: `exists`, saying what to do about the buffer as it stands. */
static void refuse_existing(const struct buffer *old, struct gpuq_error *err)
{
	if (old->state == BUFFER_FREEING) {
		gpuq_fail(err, GPUQ_E_EXISTS,
			  "buffer '%s' on device %d is being freed (job %llu); wait for that job, "
			  "then allocate it again",
			  old->name, old->device, (unsigned long long)old->last_job);
		return;
	}
	bool raw = old->dtype == GPUQ_DTYPE_BYTES; /* "16 bytes", not "16 bytes of bytes" */
	gpuq_fail(err, GPUQ_E_EXISTS,
		  "buffer '%s' already exists on device %d (%llu bytes%s%s); free it or pick another name",
		  old->name, old->device, (unsigned long long)old->bytes, raw ? "" : " of ",
		  raw ? "" : gpuq_dtype_name(old->dtype));
}

void op_alloc(struct request *req, void *args)
{
	const struct alloc_args *a = args;
	struct gpuq_error err;
	struct buffer *old = buffer_find(&req->d->buffers, req->conn->uid, a->name, a->device);
	if (old) {
		refuse_existing(old, &err);
		reply_error(req, &err);
		return;
	}
	if (quota_check_alloc(req->d, req->conn, a->device, a->bytes, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	struct buffer *b = buffer_add(&req->d->buffers, a->name, a->device, req->conn->uid, a->dtype,
				      a->count, a->bytes);
	if (!b) {
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for another buffer");
		reply_error(req, &err);
		return;
	}
	b->conn_serial = a->ephemeral ? req->conn->serial : 0;
	b->shape = a->shape;
	struct job *job = new_job(req, &kind_alloc, WORK_ALLOC, a->device);
	if (!job) {
		buffer_remove(&req->d->buffers, b);
		return;
	}
	job_attach_buffer(job, b);
	b->shareable = a->shareable;
	job->work.length = a->bytes;
	job->work.shareable = a->shareable;
	job->work.wait_memory_ms = a->wait_memory_ms;
	job_submit(req, job);
}

/* The ops on one whole buffer: free, checksum. */
struct buffer_args {
	struct args_buffer buffer;
};

static const struct args_field free_fields[] = {
	{ "buffer", ARGS_BUFFER_NAME, ARGS_REQUIRED | ARGS_LOST_OK,
	  ARGS_AT(struct buffer_args, buffer) },
};
const struct args_spec op_free_args = ARGS_SPEC(struct buffer_args, free_fields, NULL);

/*
 * Jobs already on the buffer run first (the scheduler keeps their order).
 * A buffer a device reset lost names no memory: its free needs no device
 * (which may be unhealthy) and is done at once.
 */
void op_free(struct request *req, void *args)
{
	struct buffer *b = ((struct buffer_args *)args)->buffer.b;
	struct job *job = new_job(req, &kind_free, WORK_FREE, b->device);
	if (!job)
		return;
	bool lost = b->state == BUFFER_LOST;
	job_attach_buffer(job, b);
	b->state = BUFFER_FREEING;
	job->work.length = b->bytes;
	if (lost) {
		job->work.result.bytes = b->bytes;
		job_finish_now(req, job);
	}
	else
		job_submit(req, job);
}

static const struct args_field checksum_fields[] = {
	{ "buffer", ARGS_BUFFER_NAME, ARGS_REQUIRED, ARGS_AT(struct buffer_args, buffer) },
};
const struct args_spec op_checksum_args = ARGS_SPEC(struct buffer_args, checksum_fields, NULL);

void op_checksum(struct request *req, void *args)
{
	struct buffer *b = ((struct buffer_args *)args)->buffer.b;
	struct job *job = new_job(req, &kind_checksum, WORK_CHECKSUM, b->device);
	if (!job)
		return;
	job_attach_buffer(job, b);
	job->work.length = b->bytes;
	work_narrow_access(&job->work, 0, b->bytes, false);
	job_submit(req, job);
}

/* n as the request gave it: an integer exactly, a float in its shortest form. */
static void number_text(const struct args_number *n, char *out, size_t size)
{
	if (n->is_int)
		snprintf(out, size, "%" PRId64, n->i);
	else if (n->is_u64)
		snprintf(out, size, "%" PRIu64, n->u);
	else
		gpuq_format_number(out, size, n->f, false);
}

/*
 * A float fill value as one element of dtype: finite, and not so large that
 * it rounds to infinity there (an f16 holds at most 65504).
 */
static int fill_float(const struct args_number *n, enum gpuq_dtype dtype, uint64_t *bits,
		      struct gpuq_error *err)
{
	static const double max[] = { [GPUQ_DTYPE_F16] = 65504.0, [GPUQ_DTYPE_BF16] = 0x1.fep+127,
				      [GPUQ_DTYPE_F32] = FLT_MAX, [GPUQ_DTYPE_F64] = DBL_MAX };
	double v = n->f;
	if (!isfinite(v))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'value': %g; give a finite number", v);
	bool overflows = dtype != GPUQ_DTYPE_F64 && gpuq_f32_overflows(v);
	if (!overflows && dtype == GPUQ_DTYPE_F16)
		overflows = (gpuq_f32_to_f16_bits((float)v) & 0x7C00u) == 0x7C00u;
	else if (!overflows && dtype == GPUQ_DTYPE_BF16)
		overflows = (gpuq_f32_to_bf16_bits((float)v) & 0x7F80u) == 0x7F80u;
	if (overflows) {
		char text[32], limit[32];
		number_text(n, text, sizeof text);
		gpuq_format_number(limit, sizeof limit, max[dtype], dtype != GPUQ_DTYPE_F64);
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'value': %s is out of %s's range (its largest finite value is %s)",
				 text, gpuq_dtype_name(dtype), limit);
	}
	switch (dtype) {
	case GPUQ_DTYPE_F16: *bits = gpuq_f32_to_f16_bits((float)v); break;
	case GPUQ_DTYPE_BF16: *bits = gpuq_f32_to_bf16_bits((float)v); break;
	case GPUQ_DTYPE_F32: *bits = gpuq_f32_bits((float)v); break;
	default: memcpy(bits, &v, sizeof v); break;
	}
	return 0;
}

static int does_not_fit(const struct args_number *n, enum gpuq_dtype dtype,
			struct gpuq_error *err)
{
	char text[32];
	number_text(n, text, sizeof text);
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'value': %s does not fit in %s", text,
			 gpuq_dtype_name(dtype));
}

/* The `value` field as one element of dtype, little-endian; range-checked. */
static int fill_value(const struct args_number *n, enum gpuq_dtype dtype, uint64_t *bits,
		      struct gpuq_error *err)
{
	double v = n->f;
	if (gpuq_dtype_is_float(dtype))
		return fill_float(n, dtype, bits, err);
	int64_t i = n->i;
	if (!n->is_int) {
		/* A float holding a whole number will do; anything else does not fit. */
		if (n->is_u64 || v != floor(v) || v < -9223372036854775808.0 ||
		    v >= 9223372036854775808.0)
			return does_not_fit(n, dtype, err);
		i = (int64_t)v;
	}
	bool small = dtype == GPUQ_DTYPE_BYTES || dtype == GPUQ_DTYPE_U8;
	if ((small && (i < 0 || i > 255)) ||
	    (dtype == GPUQ_DTYPE_I32 && (i < INT32_MIN || i > INT32_MAX)))
		return does_not_fit(n, dtype, err);
	*bits = (uint64_t)i;
	return 0;
}

/* pattern's names, in the order of fill_patterns */
static const char *const fill_pattern_names[] = { "zero", "value", "iota", "random", NULL };
static const enum fill_pattern fill_patterns[] = { FILL_ZERO, FILL_VALUE, FILL_IOTA, FILL_RANDOM };

struct fill_args {
	struct args_buffer buffer;
	int pattern; /* index in fill_pattern_names */
	struct args_number value;
	uint64_t seed;
	uint64_t value_bits; /* value as one element of the buffer's dtype */
};

static bool fill_wants_value(const void *args)
{
	return fill_patterns[((const struct fill_args *)args)->pattern] == FILL_VALUE;
}

static bool fill_wants_seed(const void *args)
{
	return fill_patterns[((const struct fill_args *)args)->pattern] == FILL_RANDOM;
}

static int fill_check_value(struct request *req, void *args, struct gpuq_error *err)
{
	struct fill_args *a = args;
	(void)req;
	return fill_value(&a->value, a->buffer.b->dtype, &a->value_bits, err);
}

static const struct args_field fill_fields[] = {
	{ "buffer", ARGS_BUFFER_NAME, ARGS_REQUIRED, ARGS_AT(struct fill_args, buffer) },
	{ "pattern", ARGS_ENUM, ARGS_REQUIRED, ARGS_AT(struct fill_args, pattern),
	  .missing = "field 'pattern' (zero, value, iota, random) is required",
	  .names = fill_pattern_names, .strsize = 16,
	  .bad_name = "field 'pattern': '%s' is not zero, value, iota or random" },
	{ "value", ARGS_NUMBER, ARGS_REQUIRED, ARGS_AT(struct fill_args, value),
	  .missing = "fill value needs field 'value'", .when = fill_wants_value,
	  .then = fill_check_value },
	{ "seed", ARGS_U64, ARGS_REQUIRED, ARGS_AT(struct fill_args, seed),
	  .missing = "fill random needs field 'seed'", .when = fill_wants_seed },
};
const struct args_spec op_fill_args = ARGS_SPEC(struct fill_args, fill_fields, NULL);

void op_fill(struct request *req, void *args)
{
	const struct fill_args *a = args;
	struct buffer *b = a->buffer.b;
	struct job *job = new_job(req, &kind_fill, WORK_FILL, b->device);
	if (!job)
		return;
	job_attach_buffer(job, b);
	memset(&job->work.fill, 0, sizeof job->work.fill);
	job->work.fill.dtype = b->dtype;
	job->work.fill.pattern = fill_patterns[a->pattern];
	job->work.fill.value_bits = a->value_bits;
	job->work.fill.seed = a->seed;
	job->work.length = b->bytes;
	job_submit(req, job);
}

/*
 * The free of an orphaned ephemeral buffer that nothing holds
 * (buffer_free_if_orphaned, through the buffer table's free_orphan): a job
 * of gpuqd's own that no client asked for or waits on, outside quotas (it
 * only gives back). A full queue leaves b READY for a later try.
 */
void op_free_own(struct daemon *d, struct buffer *b)
{
	struct gpuq_error err;
	struct job *job = job_create(&d->jobs, &kind_free, b->owner, 0, 0);
	if (!job)
		return;
	job->work.kind = WORK_FREE;
	job_attach_buffer(job, b);
	b->state = BUFFER_FREEING;
	job->work.length = b->bytes;
	if (job_submit_own(d, job, &err) < 0) {
		b->state = BUFFER_READY;
		buffer_unhold(b);
		job_discard(&d->jobs, job);
		return;
	}
	log_info("job %llu: freeing ephemeral buffer %s@%d of uid %d: the connection that made it closed",
		 (unsigned long long)job->id, b->name, b->device, (int)b->owner);
}
