/*
 * Pieces every job-making op uses (daemon/op_common.h): a job for the
 * caller, aimed at its buffers; the results several kinds render alike;
 * the submission of a job that carries a spec. Main thread only.
 */
#include <stdio.h>
#include <stdlib.h>

#include "daemon/daemon.h"

void render_bytes(const struct job *job, struct mp_map *out)
{
	mp_put_u64(out, "bytes", job->work.result.bytes);
}

int shape_parse(const msgpack_object *o, uint64_t count, struct buffer_shape *out,
		struct gpuq_error *err)
{
	if (!o)
		return 0;
	uint32_t n = o->via.array.size;
	if (n > BUFFER_SHAPE_MAX)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'shape': %u dimensions; at most %d are kept", (unsigned)n,
				 BUFFER_SHAPE_MAX);
	struct buffer_shape s = { .given = true, .ndim = n };
	uint64_t product = 1;
	bool overflow = false;
	for (uint32_t i = 0; i < n; i++) {
		const msgpack_object *d = &o->via.array.ptr[i];
		if (d->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "field 'shape': dimension %u is not a non-negative integer",
					 (unsigned)i);
		s.dim[i] = d->via.u64;
		if (s.dim[i] && product > UINT64_MAX / s.dim[i])
			overflow = true;
		product *= s.dim[i];
	}
	if (overflow || product != count)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'shape': its dimensions multiply to %s%llu elements, but the "
				 "buffer holds %llu",
				 overflow ? "more than " : "",
				 (unsigned long long)(overflow ? UINT64_MAX : product),
				 (unsigned long long)count);
	*out = s;
	return 0;
}

void render_shape(struct mp_map *m, const struct buffer_shape *shape)
{
	if (!shape->given)
		return;
	struct mp_array dims;
	mp_array_init(&dims);
	for (unsigned i = 0; i < shape->ndim; i++)
		mp_array_u64(&dims, shape->dim[i]);
	mp_put_array(m, "shape", &dims);
}

void render_transfer(const struct job *job, struct mp_map *out)
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

void spec_job_submit(struct request *req, const struct spec_job *sj, const void *args)
{
	struct gpuq_error err;
	int device = 0;
	void *spec = calloc(1, sj->spec_size);
	if (!spec) {
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for %s", sj->what);
		reply_error(req, &err);
		return;
	}
	if (sj->fill(req, args, spec, &device, &err) < 0) {
		free(spec);
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, sj->kind, sj->work_kind, device);
	if (!job) {
		free(spec);
		return;
	}
	job->work.spec = spec;
	job->release = sj->release; /* from here the job frees spec */
	if (sj->shape && sj->shape(req, args, job, &err) < 0) {
		job_discard(&req->d->jobs, job);
		reply_error(req, &err);
		return;
	}
	job_submit(req, job);
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
