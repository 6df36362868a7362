/*
 * Requests that become jobs on a device worker: noop, alloc, free, fill,
 * checksum, put, get. Each handler validates everything it can on the main
 * thread (so a refused request moves no byte), fills in a job's work and
 * hands it to job_submit. Main thread only.
 */
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "daemon/log.h"
#include "protocol/dtype.h"

static void render_noop(const struct job *job, struct mp_map *out)
{
	mp_put_i64(out, "device", job->work.device);
}

static void render_bytes(const struct job *job, struct mp_map *out)
{
	mp_put_u64(out, "bytes", job->work.result.bytes);
}

static void render_checksum(const struct job *job, struct mp_map *out)
{
	mp_put_u64(out, "checksum", job->work.result.checksum);
	mp_put_u64(out, "bytes", job->work.result.bytes);
}

static void render_transfer(const struct job *job, struct mp_map *out)
{
	const struct work_result *r = &job->work.result;
	mp_put_u64(out, "bytes", r->bytes);
	mp_put_f64(out, "seconds", r->seconds);
	mp_put_f64(out, "gbps", r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0);
	mp_put_str(out, "path", r->path ? r->path : "none");
	if (job->work.transfer.verify) { /* a done job's checksums matched */
		mp_put_bool(out, "verified", true);
		mp_put_u64(out, "checksum", r->checksum);
	}
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
		b->state = BUFFER_READY;
		return;
	}
	buffer_remove(&d->buffers, b); /* the struct goes once the job lets go of it */
}

static void finish_free(struct daemon *d, struct job *job)
{
	struct buffer *b = job->buffer;
	if (job->work.error.code == GPUQ_OK) {
		buffer_remove(&d->buffers, b); /* the struct goes once every job lets go of it */
	} else {
		b->state = BUFFER_READY;
	}
}

static const struct job_kind kind_noop = { "noop", NULL, render_noop };
static const struct job_kind kind_alloc = { "alloc", finish_alloc, render_alloc };
static const struct job_kind kind_free = { "free", finish_free, render_bytes };
static const struct job_kind kind_fill = { "fill", NULL, render_bytes };
static const struct job_kind kind_checksum = { "checksum", NULL, render_checksum };
const struct job_kind kind_put = { "put", NULL, render_transfer };
const struct job_kind kind_get = { "get", NULL, render_transfer };

struct job *new_job(struct request *req, const struct job_kind *kind,
			   enum work_kind work_kind, int device)
{
	struct conn *c = req->conn;
	struct job *job = job_create(&req->d->jobs, kind, c->uid, c->gid, c->pid);
	if (!job) {
		struct gpuq_error err;
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for another job");
		reply_error(req, &err);
		return NULL;
	}
	job->work.kind = work_kind;
	job->work.device = device;
	return job;
}

void job_attach_buffer(struct job *job, struct buffer *b)
{
	job->buffer = b;
	b->users++;
	b->last_job = job->id;
	snprintf(job->buffer_label, sizeof job->buffer_label, "%s@%d", b->name, b->device);
	snprintf(job->brief.name, sizeof job->brief.name, "%s", b->name);
	job->brief.device = b->device;
	job->brief.dtype = b->dtype;
	job->brief.count = b->count;
	job->brief.bytes = b->bytes;
	job->brief.ephemeral = b->conn_serial != 0;
	job->work.dptr = b->dptr;
	job->work.device = b->device;
	job->work.naccess = 0;
	work_add_access(&job->work, b, 0, b->bytes, true); /* ops that read, or touch less, narrow it */
}

void work_add_access(struct work *w, const struct buffer *b, uint64_t offset, uint64_t length,
		     bool write)
{
	work_add_range(w, b->dptr, offset, length, write);
}

void work_add_range(struct work *w, const void *base, uint64_t offset, uint64_t length,
		    bool write)
{
	if (!base || w->naccess == WORK_MAX_ACCESS)
		return; /* a buffer being allocated has no memory yet: nothing to order against */
	w->access[w->naccess++] = (struct work_access){ base, offset, length, write };
}

void work_narrow_access(struct work *w, uint64_t offset, uint64_t length, bool write)
{
	if (w->naccess == 0)
		return;
	w->access[0].off = offset;
	w->access[0].len = length;
	w->access[0].write = write;
}

/* The `device` field: absent means 0; it must name one of this daemon's devices. */
int read_device(struct request *req, int *device, struct gpuq_error *err)
{
	uint64_t d = 0;
	if (msg_get_u64(req->map, "device", &d, err) < 0)
		return -1;
	if (d >= (uint64_t)req->d->pool.count)
		return gpuq_fail(err, GPUQ_E_NOT_FOUND, "device %llu does not exist (devices: 0-%d)",
				 (unsigned long long)d, req->d->pool.count - 1);
	*device = (int)d;
	return 0;
}

int read_owner(struct request *req, uid_t *owner, struct gpuq_error *err)
{
	uint64_t o;
	*owner = req->conn->uid;
	int rc = msg_get_u64_in(req->map, "owner", 0, GPUQ_MAX_UID, &o, err);
	if (rc <= 0)
		return rc;
	if (req->conn->uid != 0 && o != (uint64_t)req->conn->uid)
		return gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
				 "only root may name another owner's buffers (you are uid %d)",
				 (int)req->conn->uid);
	*owner = (uid_t)o;
	return 0;
}

/* The buffer named by the `buffer` field, ready for a job to use. */
/* The buffer the request's `buffer` field names, whatever its state; NULL with err. */
static struct buffer *lookup_buffer(struct request *req, struct gpuq_error *err)
{
	char ref[BUFFER_NAME_MAX + 32], name[BUFFER_NAME_MAX + 1];
	int device;
	uid_t owner;
	int rc = msg_get_str(req->map, "buffer", ref, sizeof ref, err);
	if (rc == 0)
		gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'buffer' (NAME or NAME@GPU) is required");
	if (rc <= 0 || buffer_ref_parse(ref, "buffer", name, &device, err) < 0 ||
	    read_owner(req, &owner, err) < 0)
		return NULL;
	return buffer_resolve(&req->d->buffers, owner, name, device, err);
}

struct buffer *read_buffer(struct request *req, struct gpuq_error *err)
{
	struct buffer *b = lookup_buffer(req, err);
	if (b && buffer_check_usable(b, err) < 0)
		return NULL;
	return b;
}

/*
 * The buffer named by `field`, which may carry a range
 * (NAME@GPU[OFFSET:LENGTH], daemon/buffer.h), ready for a job to use; *ref
 * holds the parsed reference. The range is not checked against the buffer.
 */
struct buffer *read_buffer_ref(struct request *req, const char *field, struct buffer_ref *ref,
			       struct gpuq_error *err)
{
	char text[BUFFER_NAME_MAX + 96];
	uid_t owner;
	int rc = msg_get_str(req->map, field, text, sizeof text, err);
	if (rc == 0)
		gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			  "field '%s' (NAME, NAME@GPU, optionally [OFFSET:LENGTH]) is required", field);
	if (rc <= 0 || buffer_ref_parse_range(text, field, ref, err) < 0 ||
	    read_owner(req, &owner, err) < 0)
		return NULL;
	struct buffer *b = buffer_resolve(&req->d->buffers, owner, ref->name, ref->device, err);
	if (b && buffer_check_usable(b, err) < 0)
		return NULL;
	return b;
}

int read_device_list(struct request *req, int *devices, int *n, struct gpuq_error *err)
{
	const msgpack_object *list;
	*n = 0;
	int rc = msg_get_array(req->map, "devices", &list, err);
	if (rc <= 0)
		return rc;
	if (list->via.array.size == 0 || list->via.array.size > (uint32_t)req->d->pool.count)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'devices': %u devices listed; give 1 to %d distinct ones",
				 list->via.array.size, req->d->pool.count);
	for (uint32_t i = 0; i < list->via.array.size; i++) {
		const msgpack_object *o = &list->via.array.ptr[i];
		if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 >= (uint64_t)req->d->pool.count)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "field 'devices': entry %u is not a device of this daemon (0-%d)",
					 i, req->d->pool.count - 1);
		for (int j = 0; j < *n; j++)
			if (devices[j] == (int)o->via.u64)
				return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
						 "field 'devices': device %d is listed twice", devices[j]);
		devices[(*n)++] = (int)o->via.u64;
	}
	return 1;
}

int read_bench_sizes(struct request *req, uint64_t *sizes, unsigned max, unsigned *n,
		     struct gpuq_error *err)
{
	static const uint64_t defaults[] = { 256ull << 20, 1ull << 30, 4ull << 30 };
	static const uint64_t max_size = 1ull << 40;
	const msgpack_object *list;
	int rc = msg_get_array(req->map, "sizes", &list, err);
	*n = 0;
	if (rc < 0)
		return -1;
	if (rc == 0) {
		for (unsigned i = 0; i < 3 && i < max; i++)
			sizes[(*n)++] = defaults[i];
		return 0;
	}
	if (list->via.array.size == 0 || list->via.array.size > max)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'sizes': give 1 to %u sizes, not %u",
				 max, list->via.array.size);
	for (uint32_t i = 0; i < list->via.array.size; i++) {
		const msgpack_object *o = &list->via.array.ptr[i];
		if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 == 0 ||
		    o->via.u64 > max_size)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "field 'sizes': entry %u is not a byte count from 1 to 1 TiB", i);
		sizes[(*n)++] = o->via.u64;
	}
	return 0;
}

/* noop on `device`, or as a gang on every device in `devices` (measures gang dispatch). */
void op_noop(struct request *req)
{
	struct gpuq_error err;
	int device = 0, devices[GPUQ_MAX_DEVICES], n;
	int rc = read_device_list(req, devices, &n, &err);
	if (rc == 0)
		rc = read_device(req, &device, &err);
	if (rc < 0) {
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, &kind_noop, WORK_NOOP, n ? devices[0] : device);
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
		job->parts[i].device = devices[i];
	job_submit(req, job);
}

/* bytes, or count with dtype: the buffer's shape. */
static int read_shape(struct request *req, enum gpuq_dtype *dtype, uint64_t *count,
		      uint64_t *bytes, struct gpuq_error *err)
{
	char dname[16] = "";
	int has_bytes = msg_get_u64(req->map, "bytes", bytes, err);
	int has_count = has_bytes < 0 ? -1 : msg_get_u64(req->map, "count", count, err);
	int has_dtype = has_count < 0 ? -1 : msg_get_str(req->map, "dtype", dname, sizeof dname, err);
	if (has_dtype < 0)
		return -1;
	*dtype = GPUQ_DTYPE_BYTES;
	if (has_dtype && gpuq_dtype_from_name(dname, strlen(dname), dtype) < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'dtype': '%s' is not one of %s",
				 dname, gpuq_dtype_list());
	size_t size = gpuq_dtype_size(*dtype);
	if (has_bytes == has_count)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "alloc takes either 'bytes' or 'count' (with 'dtype'), not %s",
				 has_bytes ? "both" : "neither");
	if (has_count && !has_dtype)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'count' needs 'dtype'");
	if (has_count) {
		if (*count == 0 || *count > UINT64_MAX / size)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'count': %llu is out of range",
					 (unsigned long long)*count);
		*bytes = *count * size;
	} else {
		if (*bytes == 0 || *bytes % size)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "field 'bytes': %llu is not a positive multiple of %s's %zu bytes",
					 (unsigned long long)*bytes, gpuq_dtype_name(*dtype), size);
		*count = *bytes / size;
	}
	return 0;
}

/* `wait_memory_ms`: how long an alloc may wait for memory others free (0, the default: not at all). */
static int read_wait_memory(struct request *req, uint64_t *ms, struct gpuq_error *err)
{
	if (msg_get_u64(req->map, "wait_memory_ms", ms, err) < 0)
		return -1;
	if (*ms > 3600000)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'wait_memory_ms': %llu is out of range (0 to 3600000)",
				 (unsigned long long)*ms);
	return 0;
}

void op_alloc(struct request *req)
{
	struct gpuq_error err;
	char name[BUFFER_NAME_MAX + 2];
	int device = 0;
	enum gpuq_dtype dtype;
	uint64_t count = 0, bytes = 0, wait_memory_ms = 0;
	bool shareable = false, ephemeral = false;
	int rc = msg_get_str(req->map, "name", name, sizeof name, &err);
	if (rc == 0)
		rc = gpuq_fail(&err, GPUQ_E_BAD_REQUEST, "field 'name' is required");
	if (rc < 0 || buffer_name_check(name, &err) < 0 || read_device(req, &device, &err) < 0 ||
	    read_shape(req, &dtype, &count, &bytes, &err) < 0 ||
	    read_wait_memory(req, &wait_memory_ms, &err) < 0 ||
	    msg_get_bool(req->map, "shareable", &shareable, &err) < 0 ||
	    msg_get_bool(req->map, "ephemeral", &ephemeral, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	struct buffer *old = buffer_find(&req->d->buffers, req->conn->uid, name, device);
	if (old) {
		gpuq_fail(&err, GPUQ_E_EXISTS,
			  "buffer '%s' already exists on device %d (%llu bytes of %s); free it or pick another name",
			  name, device, (unsigned long long)old->bytes, gpuq_dtype_name(old->dtype));
		reply_error(req, &err);
		return;
	}
	if (quota_check_alloc(req->d, req->conn, device, bytes, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	struct buffer *b = buffer_add(&req->d->buffers, name, device, req->conn->uid, dtype, count, bytes);
	if (!b) {
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for another buffer");
		reply_error(req, &err);
		return;
	}
	b->conn_serial = ephemeral ? req->conn->serial : 0;
	struct job *job = new_job(req, &kind_alloc, WORK_ALLOC, device);
	if (!job) {
		buffer_remove(&req->d->buffers, b);
		return;
	}
	job_attach_buffer(job, b);
	b->shareable = shareable;
	job->work.length = bytes;
	job->work.shareable = shareable;
	job->work.wait_memory_ms = wait_memory_ms;
	job_submit(req, job);
}

/*
 * Jobs already on the buffer run first (the scheduler keeps their order).
 * A buffer a device reset lost names no memory: its free needs no device
 * (which may be unhealthy) and is done at once.
 */
void op_free(struct request *req)
{
	struct gpuq_error err;
	struct buffer *b = lookup_buffer(req, &err);
	if (b && b->state != BUFFER_LOST && buffer_check_usable(b, &err) < 0)
		b = NULL;
	if (!b) {
		reply_error(req, &err);
		return;
	}
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

void op_checksum(struct request *req)
{
	struct gpuq_error err;
	struct buffer *b = read_buffer(req, &err);
	if (!b) {
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, &kind_checksum, WORK_CHECKSUM, b->device);
	if (!job)
		return;
	job_attach_buffer(job, b);
	job->work.length = b->bytes;
	work_narrow_access(&job->work, 0, b->bytes, false);
	job_submit(req, job);
}

/*
 * A float fill value as one element of dtype: finite, and not so large that
 * it rounds to infinity there (an f16 holds at most 65504).
 */
static int read_fill_float(double v, enum gpuq_dtype dtype, uint64_t *bits, struct gpuq_error *err)
{
	static const double max[] = { [GPUQ_DTYPE_F16] = 65504.0, [GPUQ_DTYPE_BF16] = 0x1.fep+127,
				      [GPUQ_DTYPE_F32] = FLT_MAX, [GPUQ_DTYPE_F64] = DBL_MAX };
	if (!isfinite(v))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'value': %g; give a finite number", v);
	bool overflows = dtype != GPUQ_DTYPE_F64 && gpuq_f32_overflows(v);
	if (!overflows && dtype == GPUQ_DTYPE_F16)
		overflows = (gpuq_f32_to_f16_bits((float)v) & 0x7C00u) == 0x7C00u;
	else if (!overflows && dtype == GPUQ_DTYPE_BF16)
		overflows = (gpuq_f32_to_bf16_bits((float)v) & 0x7F80u) == 0x7F80u;
	if (overflows)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'value': %g is out of %s's range (its largest finite value is %g)", v,
				 gpuq_dtype_name(dtype), max[dtype]);
	switch (dtype) {
	case GPUQ_DTYPE_F16: *bits = gpuq_f32_to_f16_bits((float)v); break;
	case GPUQ_DTYPE_BF16: *bits = gpuq_f32_to_bf16_bits((float)v); break;
	case GPUQ_DTYPE_F32: *bits = gpuq_f32_bits((float)v); break;
	default: memcpy(bits, &v, sizeof v); break;
	}
	return 0;
}

/* The `value` field as one element of dtype, little-endian; range-checked. */
static int read_fill_value(struct request *req, enum gpuq_dtype dtype, uint64_t *bits,
			   struct gpuq_error *err)
{
	double v;
	int rc = msg_get_f64(req->map, "value", &v, err);
	if (rc == 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "fill value needs field 'value'");
	if (rc < 0)
		return -1;
	if (gpuq_dtype_is_float(dtype))
		return read_fill_float(v, dtype, bits, err);
	int64_t i;
	struct gpuq_error not_int;
	if (msg_get_i64(req->map, "value", &i, &not_int) <= 0) {
		/* A float holding a whole number will do; anything else does not fit. */
		if (v != floor(v) || v < -9223372036854775808.0 || v >= 9223372036854775808.0)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'value': %g does not fit in %s",
					 v, gpuq_dtype_name(dtype));
		i = (int64_t)v;
	}
	bool small = dtype == GPUQ_DTYPE_BYTES || dtype == GPUQ_DTYPE_U8;
	if ((small && (i < 0 || i > 255)) ||
	    (dtype == GPUQ_DTYPE_I32 && (i < INT32_MIN || i > INT32_MAX)))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'value': %lld does not fit in %s",
				 (long long)i, gpuq_dtype_name(dtype));
	*bits = (uint64_t)i;
	return 0;
}

static int read_fill(struct request *req, enum gpuq_dtype dtype, struct fill_spec *spec,
		     struct gpuq_error *err)
{
	char pattern[16];
	int rc = msg_get_str(req->map, "pattern", pattern, sizeof pattern, err);
	if (rc == 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'pattern' (zero, value, iota, random) is required");
	if (rc < 0)
		return -1;
	memset(spec, 0, sizeof *spec);
	spec->dtype = dtype;
	if (strcmp(pattern, "zero") == 0) {
		spec->pattern = FILL_ZERO;
	} else if (strcmp(pattern, "iota") == 0) {
		spec->pattern = FILL_IOTA;
	} else if (strcmp(pattern, "value") == 0) {
		spec->pattern = FILL_VALUE;
		return read_fill_value(req, dtype, &spec->value_bits, err);
	} else if (strcmp(pattern, "random") == 0) {
		spec->pattern = FILL_RANDOM;
		rc = msg_get_u64(req->map, "seed", &spec->seed, err);
		if (rc == 0)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "fill random needs field 'seed'");
		return rc < 0 ? -1 : 0;
	} else {
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'pattern': '%s' is not zero, value, iota or random", pattern);
	}
	return 0;
}

void op_fill(struct request *req)
{
	struct gpuq_error err;
	struct fill_spec spec;
	struct buffer *b = read_buffer(req, &err);
	if (!b || read_fill(req, b->dtype, &spec, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, &kind_fill, WORK_FILL, b->device);
	if (!job)
		return;
	job_attach_buffer(job, b);
	job->work.fill = spec;
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
