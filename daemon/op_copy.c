/*
 * copy: bytes from one buffer range to another, on one device or between
 * two (workers/copy/copy.c does the moving; copy.h says how). Everything is
 * checked here first, so that a refused copy changes no byte: both buffers
 * and ranges, the lengths, overlap, the engine and the path. The route is
 * decided here too, from what each device's worker found when it opened
 * (peer access, pool sharing, the link's kind), and the result says which
 * it took: a copy never falls back to a slower path without saying so.
 * Main thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "workers/copy/copy.h"

#define MAX_CHUNK (4ull << 30)
#define MAX_PEER_TIMEOUT_MS 3600000u

static const char *link_name(enum peer_link link)
{
	switch (link) {
	case PEER_LINK_SAME: return "same-gpu";
	case PEER_LINK_NVLINK: return "nvlink";
	case PEER_LINK_PCIE: return "pcie-p2p";
	case PEER_LINK_P2P: return "p2p";
	case PEER_LINK_HOST: return "host-memcpy";
	case PEER_LINK_NONE: break;
	}
	return "host-staged";
}

/*
 * The destination's copy engine reads the source over the link, so the
 * destination needs peer access to the source, and the source's pool must
 * have been shared with the destination.
 */
const char *copy_peer_path(struct daemon *d, int src, int dst, bool *direct)
{
	struct worker_snapshot from, to;
	*direct = false;
	if (src == dst)
		return "self";
	worker_snapshot(&d->pool, src, &from);
	worker_snapshot(&d->pool, dst, &to);
	enum peer_link link = to.peer_link[src];
	if (link == PEER_LINK_NONE || !from.pool_shared[dst])
		return "host-staged";
	*direct = true;
	return link_name(link);
}

static void render_copy(const struct job *job, struct mp_map *out)
{
	const struct copy_spec *s = job->work.spec;
	const struct work_result *r = &job->work.result;
	mp_put_str(out, "src", s->src_label);
	mp_put_str(out, "dst", s->dst_label);
	mp_put_u64(out, "bytes", r->bytes);
	mp_put_f64(out, "seconds", r->seconds);
	mp_put_f64(out, "gbps", r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0);
	mp_put_str(out, "path", s->path);
	if (s->route == COPY_ROUTE_SAME)
		mp_put_str(out, "engine", s->engine == COPY_ENGINE_SM ? "sm" : "ce");
	mp_put_bool(out, "verified", s->verify);
	if (s->verify)
		mp_put_u64(out, "checksum", s->dst_sum);
}

static void release_copy(struct job *job)
{
	struct copy_spec *s = job->work.spec;
	if (s) {
		copy_spec_destroy(s);
		free(s);
	}
	job->work.spec = NULL;
}

static const struct job_kind kind_copy = { "copy", NULL, render_copy };

/* One side: the buffer, its range checked, and its label "NAME@GPU[OFF:LEN]". */
struct copy_side {
	struct buffer *b;
	struct buffer_ref ref;
	uint64_t offset, length;
};

/* A side's failure, its message prefixed with the field (`src` or `dst`). */
static int side_fail(const char *field, struct gpuq_error *err)
{
	struct gpuq_error inner = *err;
	return gpuq_fail(err, inner.code, "field '%s': %s", field, inner.message);
}

static int read_side(struct request *req, const char *field, struct copy_side *side,
		     struct gpuq_error *err)
{
	side->b = read_buffer_ref(req, field, &side->ref, err);
	if (!side->b) {
		if (err->code == GPUQ_E_NOT_FOUND && side->ref.device >= req->d->pool.count)
			return gpuq_fail(err, GPUQ_E_NOT_FOUND,
					 "field '%s': device %d does not exist (devices: 0-%d)", field,
					 side->ref.device, req->d->pool.count - 1);
		return err->code == GPUQ_E_BAD_REQUEST ? -1 : side_fail(field, err);
	}
	side->offset = side->ref.offset;
	if (buffer_range_check(side->b, side->offset, side->ref.has_length, side->ref.length,
			       &side->length, err) < 0)
		return side_fail(field, err);
	return 0;
}

/* The source's length goes; the destination's range must hold it; one buffer may not overlap. */
static int check_sides(const struct copy_side *src, const struct copy_side *dst,
		       struct gpuq_error *err)
{
	uint64_t n = src->length;
	if (dst->length < n)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the destination %s%s holds %llu bytes but the source %s%s has %llu; "
				 "give a larger destination range or a shorter source range",
				 dst->b->name, dst->ref.has_range ? " range" : "",
				 (unsigned long long)dst->length, src->b->name,
				 src->ref.has_range ? " range" : "", (unsigned long long)n);
	if (src->b == dst->b && n > 0 && src->offset < dst->offset + n &&
	    dst->offset < src->offset + n)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "source [%llu, %llu) and destination [%llu, %llu) overlap in buffer "
				 "'%s@%d'; a copy within one buffer needs ranges that do not overlap",
				 (unsigned long long)src->offset, (unsigned long long)(src->offset + n),
				 (unsigned long long)dst->offset, (unsigned long long)(dst->offset + n),
				 src->b->name, src->b->device);
	return 0;
}

static int read_engine(struct request *req, bool same_device, struct copy_spec *s,
		       struct gpuq_error *err)
{
	char engine[8] = "ce";
	int rc = msg_get_str(req->map, "engine", engine, sizeof engine, err);
	if (rc < 0)
		return -1;
	if (strcmp(engine, "ce") == 0)
		s->engine = COPY_ENGINE_CE;
	else if (strcmp(engine, "sm") == 0)
		s->engine = COPY_ENGINE_SM;
	else
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'engine': '%s' is not ce or sm",
				 engine);
	if (s->engine == COPY_ENGINE_SM && !same_device)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "engine sm copies within one GPU; a copy between GPUs %d and %d goes "
				 "by the peer link or through host memory (drop --engine sm)",
				 s->src_device, s->dst_device);
	return 0;
}

/* `path`: auto (default), peer or host-staged; decides the route with the devices' links. */
static int read_route(struct request *req, struct copy_spec *s, struct gpuq_error *err)
{
	char path[16] = "auto";
	bool direct;
	if (msg_get_str(req->map, "path", path, sizeof path, err) < 0)
		return -1;
	bool staged = strcmp(path, "host-staged") == 0, peer = strcmp(path, "peer") == 0;
	if (!staged && !peer && strcmp(path, "auto") != 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'path': '%s' is not auto, peer or host-staged", path);
	if (s->src_device == s->dst_device) {
		if (staged || peer)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "field 'path': '%s' is for copies between devices; this one is "
					 "within gpu %d",
					 path, s->src_device);
		s->route = COPY_ROUTE_SAME;
		bool host = strcmp(req->d->ops->name, "host") == 0;
		s->path = host ? "host-memcpy" : s->engine == COPY_ENGINE_SM ? "sm" : "ce";
		return 0;
	}
	const char *link = copy_peer_path(req->d, s->src_device, s->dst_device, &direct);
	if (peer && !direct)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "path peer: gpu %d cannot read gpu %d's buffers directly (no peer "
				 "access); use path auto or host-staged",
				 s->dst_device, s->src_device);
	s->route = direct && !staged ? COPY_ROUTE_PEER : COPY_ROUTE_STAGED;
	s->path = s->route == COPY_ROUTE_PEER ? link : "host-staged";
	return 0;
}

static int read_tuning(struct request *req, struct copy_spec *s, uint64_t *timeout_ms,
		       struct gpuq_error *err)
{
	uint64_t chunk = 0;
	*timeout_ms = COPY_TIMEOUT_MS;
	int has_chunk = msg_get_u64(req->map, "chunk_bytes", &chunk, err);
	if (has_chunk < 0 || msg_get_u64(req->map, "peer_timeout_ms", timeout_ms, err) < 0 ||
	    msg_get_bool(req->map, "verify", &s->verify, err) < 0)
		return -1;
	uint64_t max = s->route == COPY_ROUTE_STAGED ? COPY_RING_SLOT_MAX : MAX_CHUNK;
	if (has_chunk && (chunk == 0 || chunk > max))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'chunk_bytes': %llu is not 1 to %llu for this path",
				 (unsigned long long)chunk, (unsigned long long)max);
	if (*timeout_ms < 1 || *timeout_ms > MAX_PEER_TIMEOUT_MS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'peer_timeout_ms': %llu is not 1 to %u",
				 (unsigned long long)*timeout_ms, MAX_PEER_TIMEOUT_MS);
	s->chunk_bytes = has_chunk ? chunk
			 : s->route == COPY_ROUTE_STAGED ? COPY_RING_SLOT
			 : s->route == COPY_ROUTE_PEER ? COPY_PEER_CHUNK
						       : COPY_SAME_CHUNK;
	return 0;
}

static void label_side(char *out, size_t size, const struct copy_side *side, uint64_t n)
{
	snprintf(out, size, "%s@%d[%llu:%llu]", side->b->name, side->b->device,
		 (unsigned long long)side->offset, (unsigned long long)n);
}

/* Everything the request says, checked; fills s and the sides. */
static int read_copy(struct request *req, struct copy_spec *s, struct copy_side *src,
		     struct copy_side *dst, uint64_t *timeout_ms, struct gpuq_error *err)
{
	if (read_side(req, "src", src, err) < 0 || read_side(req, "dst", dst, err) < 0 ||
	    check_sides(src, dst, err) < 0)
		return -1;
	s->src_device = src->b->device;
	s->dst_device = dst->b->device;
	s->bytes = src->length;
	s->src = (const char *)src->b->dptr + src->offset;
	s->dst = (char *)dst->b->dptr + dst->offset;
	label_side(s->src_label, sizeof s->src_label, src, s->bytes);
	label_side(s->dst_label, sizeof s->dst_label, dst, s->bytes);
	if (read_engine(req, s->src_device == s->dst_device, s, err) < 0 ||
	    read_route(req, s, err) < 0 || read_tuning(req, s, timeout_ms, err) < 0)
		return -1;
	return 0;
}

/* A gang of two: the source's part, then the destination's, sharing s. */
static int make_copy_gang(struct job *job, struct copy_spec *s, unsigned timeout_ms)
{
	if (job_make_gang(job, 2) < 0)
		return -1;
	job->parts[COPY_PART_SRC].device = s->src_device;
	job->parts[COPY_PART_DST].device = s->dst_device;
	job->parts[COPY_PART_SRC].spec = job->parts[COPY_PART_DST].spec = s;
	enum copy_route route = s->route;
	s->route = COPY_ROUTE_SAME; /* release_copy destroys no lock that was not made */
	if (copy_spec_init_gang(s, &job->parts[COPY_PART_SRC], &job->parts[COPY_PART_DST],
				timeout_ms) != 0)
		return -1;
	s->route = route;
	return 0;
}

/* Within a device one work reads the source and writes the destination; a gang splits them. */
static void copy_set_access(struct job *job, const struct copy_side *src, const struct copy_side *dst,
			    uint64_t bytes)
{
	struct work *s = job->parts ? &job->parts[COPY_PART_SRC] : &job->work;
	struct work *d = job->parts ? &job->parts[COPY_PART_DST] : &job->work;
	s->naccess = d->naccess = 0;
	work_add_access(s, src->b, src->offset, bytes, false);
	work_add_access(d, dst->b, dst->offset, bytes, true);
}

void op_copy(struct request *req)
{
	struct gpuq_error err;
	struct copy_side src, dst;
	uint64_t timeout_ms = COPY_TIMEOUT_MS;
	struct copy_spec *s = calloc(1, sizeof *s);
	if (!s) {
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for a copy");
		reply_error(req, &err);
		return;
	}
	if (read_copy(req, s, &src, &dst, &timeout_ms, &err) < 0) {
		free(s);
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, &kind_copy, WORK_COPY, s->src_device);
	if (!job) {
		free(s);
		return;
	}
	job->work.spec = s;
	job->release = release_copy;
	if (s->route != COPY_ROUTE_SAME && make_copy_gang(job, s, (unsigned)timeout_ms) < 0) {
		job_discard(&req->d->jobs, job);
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for a two-device copy");
		reply_error(req, &err);
		return;
	}
	job_attach_buffer(job, src.b);
	job->buffer2 = dst.b;
	dst.b->users++;
	dst.b->last_job = job->id;
	job->work.length = s->bytes;
	copy_set_access(job, &src, &dst, s->bytes);
	job_submit(req, job);
}
