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

/*
 * The request, decoded (daemon/args.h): both sides resolved and their
 * ranges checked, then the engine, the route and the tuning, each checked
 * as its field decodes, in the order the checks were always made.
 */
struct copy_args {
	struct args_buffer src, dst; /* NAME[@GPU][[START:STOP]] */
	uint64_t src_length, dst_length; /* each side's range, checked */
	char engine_name[8], path_name[16];
	uint64_t chunk, timeout_ms;
	bool has_chunk, verify;
	enum copy_engine engine; /* from engine_name */
	enum copy_route route;   /* from path_name and the devices' links */
	const char *path;        /* what the result says */
	uint64_t chunk_bytes;
};

/* A side's range within its buffer; a refusal names the field. */
static int check_side(const char *field, struct args_buffer *side, uint64_t *length,
		      struct gpuq_error *err)
{
	const struct buffer_ref *ref = &side->ref;
	if (buffer_range_check(side->b, ref->offset, ref->has_length, ref->length, length, err) < 0)
		return args_key_named(field, err);
	return 0;
}

static int check_src(struct request *req, void *args, struct gpuq_error *err)
{
	struct copy_args *a = args;
	(void)req;
	return check_side("src", &a->src, &a->src_length, err);
}

/* The source's length goes; the destination's range must hold it; one buffer may not overlap. */
static int check_dst(struct request *req, void *args, struct gpuq_error *err)
{
	struct copy_args *a = args;
	(void)req;
	if (check_side("dst", &a->dst, &a->dst_length, err) < 0)
		return -1;
	const struct buffer *sb = a->src.b, *db = a->dst.b;
	uint64_t n = a->src_length, so = a->src.ref.offset, doff = a->dst.ref.offset;
	if (a->dst_length < n)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the destination %s%s holds %llu bytes but the source %s%s has %llu; "
				 "give a larger destination range or a shorter source range",
				 db->name, a->dst.ref.has_range ? " range" : "",
				 (unsigned long long)a->dst_length, sb->name,
				 a->src.ref.has_range ? " range" : "", (unsigned long long)n);
	if (sb == db && n > 0 && so < doff + n && doff < so + n)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "source [%llu, %llu) and destination [%llu, %llu) overlap in buffer "
				 "'%s@%d'; a copy within one buffer needs ranges that do not overlap",
				 (unsigned long long)so, (unsigned long long)(so + n),
				 (unsigned long long)doff, (unsigned long long)(doff + n), sb->name,
				 sb->device);
	return 0;
}

static int check_engine(struct request *req, void *args, struct gpuq_error *err)
{
	struct copy_args *a = args;
	(void)req;
	if (strcmp(a->engine_name, "ce") == 0)
		a->engine = COPY_ENGINE_CE;
	else if (strcmp(a->engine_name, "sm") == 0)
		a->engine = COPY_ENGINE_SM;
	else
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'engine': '%s' is not ce or sm",
				 a->engine_name);
	if (a->engine == COPY_ENGINE_SM && a->src.b->device != a->dst.b->device)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "engine sm copies within one GPU; a copy between GPUs %d and %d goes "
				 "by the peer link or through host memory (drop --engine sm)",
				 a->src.b->device, a->dst.b->device);
	return 0;
}

/* `path`: auto (default), peer or host-staged; decides the route with the devices' links. */
static int check_route(struct request *req, void *args, struct gpuq_error *err)
{
	struct copy_args *a = args;
	int src = a->src.b->device, dst = a->dst.b->device;
	bool direct, staged = strcmp(a->path_name, "host-staged") == 0,
		     peer = strcmp(a->path_name, "peer") == 0;
	if (!staged && !peer && strcmp(a->path_name, "auto") != 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'path': '%s' is not auto, peer or host-staged", a->path_name);
	if (src == dst) {
		if (staged || peer)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "field 'path': '%s' is for copies between devices; this one is "
					 "within gpu %d",
					 a->path_name, src);
		a->route = COPY_ROUTE_SAME;
		bool host = strcmp(req->d->ops->name, "host") == 0;
		a->path = host ? "host-memcpy" : a->engine == COPY_ENGINE_SM ? "sm" : "ce";
		return 0;
	}
	const char *link = copy_peer_path(req->d, src, dst, &direct);
	if (peer && !direct)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "path peer: gpu %d cannot read gpu %d's buffers directly (no peer "
				 "access); use path auto or host-staged",
				 dst, src);
	a->route = direct && !staged ? COPY_ROUTE_PEER : COPY_ROUTE_STAGED;
	a->path = a->route == COPY_ROUTE_PEER ? link : "host-staged";
	return 0;
}

/* chunk_bytes and peer_timeout_ms, once every tuning field has its type checked. */
static int check_tuning(struct request *req, void *args, struct gpuq_error *err)
{
	struct copy_args *a = args;
	(void)req;
	uint64_t max = a->route == COPY_ROUTE_STAGED ? COPY_RING_SLOT_MAX : MAX_CHUNK;
	if (a->has_chunk && (a->chunk == 0 || a->chunk > max))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'chunk_bytes': %llu is not 1 to %llu for this path",
				 (unsigned long long)a->chunk, (unsigned long long)max);
	if (a->timeout_ms < 1 || a->timeout_ms > MAX_PEER_TIMEOUT_MS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'peer_timeout_ms': %llu is not 1 to %u",
				 (unsigned long long)a->timeout_ms, MAX_PEER_TIMEOUT_MS);
	a->chunk_bytes = a->has_chunk ? a->chunk
			 : a->route == COPY_ROUTE_STAGED ? COPY_RING_SLOT
			 : a->route == COPY_ROUTE_PEER ? COPY_PEER_CHUNK
						       : COPY_SAME_CHUNK;
	return 0;
}

static const struct args_field copy_fields[] = {
	{ "src", ARGS_BUFFER, ARGS_REQUIRED | ARGS_KEY_NAMED, ARGS_AT(struct copy_args, src),
	  .then = check_src },
	{ "dst", ARGS_BUFFER, ARGS_REQUIRED | ARGS_KEY_NAMED, ARGS_AT(struct copy_args, dst),
	  .then = check_dst },
	{ "engine", ARGS_STR, 0, ARGS_AT(struct copy_args, engine_name), .then = check_engine },
	{ "path", ARGS_STR, 0, ARGS_AT(struct copy_args, path_name), .then = check_route },
	{ "chunk_bytes", ARGS_U64, 0, ARGS_AT(struct copy_args, chunk),
	  ARGS_GIVEN(struct copy_args, has_chunk) },
	{ "peer_timeout_ms", ARGS_U64, 0, ARGS_AT(struct copy_args, timeout_ms) },
	{ "verify", ARGS_BOOL, 0, ARGS_AT(struct copy_args, verify), .then = check_tuning },
};
static const struct copy_args copy_defaults = {
	.engine_name = "ce", .path_name = "auto", .timeout_ms = COPY_TIMEOUT_MS
};
const struct args_spec op_copy_args = ARGS_SPEC(struct copy_args, copy_fields, &copy_defaults);

static void label_side(char *out, size_t size, const struct args_buffer *side, uint64_t n)
{
	snprintf(out, size, "%s@%d[%llu:%llu]", side->b->name, side->b->device,
		 (unsigned long long)side->ref.offset, (unsigned long long)(side->ref.offset + n));
}

static int fill_copy(struct request *req, const void *args, void *spec, int *device,
		     struct gpuq_error *err)
{
	const struct copy_args *a = args;
	struct copy_spec *s = spec;
	(void)req;
	(void)err;
	s->src_device = a->src.b->device;
	s->dst_device = a->dst.b->device;
	s->bytes = a->src_length;
	s->src = (const char *)a->src.b->dptr + a->src.ref.offset;
	s->dst = (char *)a->dst.b->dptr + a->dst.ref.offset;
	label_side(s->src_label, sizeof s->src_label, &a->src, s->bytes);
	label_side(s->dst_label, sizeof s->dst_label, &a->dst, s->bytes);
	s->engine = a->engine;
	s->route = a->route;
	s->path = a->path;
	s->chunk_bytes = a->chunk_bytes;
	s->verify = a->verify;
	*device = s->src_device;
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
static void copy_set_access(struct job *job, const struct copy_args *a, uint64_t bytes)
{
	struct work *s = job->parts ? &job->parts[COPY_PART_SRC] : &job->work;
	struct work *d = job->parts ? &job->parts[COPY_PART_DST] : &job->work;
	s->naccess = d->naccess = 0;
	work_add_access(s, a->src.b, a->src.ref.offset, bytes, false);
	work_add_access(d, a->dst.b, a->dst.ref.offset, bytes, true);
}

/* Between devices a gang of two; then both buffers held for the job's life. */
static int shape_copy(struct request *req, const void *args, struct job *job,
		      struct gpuq_error *err)
{
	const struct copy_args *a = args;
	struct copy_spec *s = job->work.spec;
	(void)req;
	if (s->route != COPY_ROUTE_SAME && make_copy_gang(job, s, (unsigned)a->timeout_ms) < 0)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "gpuqd has no memory for a two-device copy");
	job_attach_buffer(job, a->src.b);
	job->buffer2 = a->dst.b;
	a->dst.b->users++;
	a->dst.b->last_job = job->id;
	job->work.length = s->bytes;
	copy_set_access(job, a, s->bytes);
	return 0;
}

static const struct spec_job copy_job = {
	.kind = &kind_copy,
	.work_kind = WORK_COPY,
	.spec_size = sizeof(struct copy_spec),
	.what = "a copy",
	.fill = fill_copy,
	.shape = shape_copy,
	.release = release_copy,
};

void op_copy(struct request *req, void *args)
{
	spec_job_submit(req, &copy_job, args);
}
