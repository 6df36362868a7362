/*
 * All-reduce, the main thread's part. `allreduce` resolves the buffer on
 * every listed device and checks that the copies agree (dtype, count), and
 * the same for `out`, before any rank starts; it holds every one of those
 * buffers for the job and queues one part per device in one step (a gang:
 * worker_submit_group), which is what keeps collectives over overlapping
 * devices in the same order everywhere. `bench_allreduce` does the same for
 * the benchmark's raw loop on the same communicator. Main thread only.
 *
 * A job owns a struct allreduce_job from the request until the job is freed
 * (job->release): the spec its parts share and the buffers it holds. The
 * kind's finish lets go of the buffers, when the job ends and, through
 * job_abandon, when it never reached a worker.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "workers/collective.h"

#define COLL_MAX_TIMEOUT_MS 3600000u
#define BENCH_DEFAULT_WARMUP 5u
#define BENCH_DEFAULT_ITERS 20u
#define BENCH_DEFAULT_REPEATS 5u
#define BENCH_MAX_WARMUP 10000u
#define BENCH_MAX_ITERS 100000u
#define BENCH_MAX_REPEATS 100u

struct allreduce_job {
	struct allreduce_spec spec; /* first: work.spec points here */
	struct buffer *held[2 * GPUQ_MAX_DEVICES];
	int nheld;
	char name[BUFFER_NAME_MAX + 1];
	char out_name[BUFFER_NAME_MAX + 1]; /* "" in place */
};

/* What the request asks for, resolved; nothing is held yet. */
struct allreduce_req {
	uid_t owner;
	char name[BUFFER_NAME_MAX + 1], out_name[BUFFER_NAME_MAX + 1];
	int devices[GPUQ_MAX_DEVICES], n;
	struct buffer *in[GPUQ_MAX_DEVICES], *out[GPUQ_MAX_DEVICES];
	enum coll_op op;
	uint64_t count;
	uint64_t timeout_ms;
	uint64_t warmup, iters, repeats;
	int hang_rank;
};

static void release_allreduce(struct job *job)
{
	struct allreduce_spec *spec = job->work.spec;
	if (!spec)
		return;
	coll_spec_destroy(spec);
	free(spec); /* the allreduce_job it begins */
	job->work.spec = NULL;
}

static void finish_allreduce(struct daemon *d, struct job *job)
{
	(void)d;
	struct allreduce_job *aj = job->work.spec;
	for (int i = 0; aj && i < aj->nheld; i++)
		buffer_unhold(aj->held[i]);
	if (aj)
		aj->nheld = 0;
}

/* The slowest rank's time, and the bandwidths nccl-tests reports for it. */
static void render_rates(struct mp_map *out, const struct allreduce_spec *s, double seconds)
{
	double bytes = (double)s->count * (double)gpuq_dtype_size(s->dtype);
	double algbw = seconds > 0 ? bytes / seconds / 1e9 : 0;
	mp_put_f64(out, "algbw_gbps", algbw);
	mp_put_f64(out, "busbw_gbps", algbw * 2.0 * (s->nranks - 1) / s->nranks);
}

static void render_common(const struct allreduce_job *aj, struct mp_map *out)
{
	const struct allreduce_spec *s = &aj->spec;
	struct mp_array devices;
	bool created = false;
	mp_put_str(out, "buffer", aj->name);
	mp_put_str(out, "out", aj->out_name[0] ? aj->out_name : aj->name);
	mp_put_bool(out, "in_place", aj->out_name[0] == '\0');
	mp_array_init(&devices);
	for (int r = 0; r < s->nranks; r++) {
		mp_array_i64(&devices, s->devices[r]);
		created = created || s->created[r];
	}
	mp_put_array(out, "devices", &devices);
	mp_put_str(out, "reduce", coll_op_name(s->op));
	mp_put_str(out, "dtype", gpuq_dtype_name(s->dtype));
	mp_put_u64(out, "count", s->count);
	mp_put_u64(out, "bytes", s->count * gpuq_dtype_size(s->dtype));
	mp_put_str(out, "communicator", created ? "created" : "cached");
	mp_put_u64(out, "generation", s->generation[0]);
}

static void render_allreduce(const struct job *job, struct mp_map *out)
{
	const struct allreduce_job *aj = job->work.spec;
	if (!aj)
		return;
	double seconds = 0;
	for (int r = 0; r < aj->spec.nranks; r++)
		if (aj->spec.seconds[r] > seconds)
			seconds = aj->spec.seconds[r];
	render_common(aj, out);
	mp_put_f64(out, "seconds", seconds);
	render_rates(out, &aj->spec, seconds);
}

static void render_bench(const struct job *job, struct mp_map *out)
{
	const struct allreduce_job *aj = job->work.spec;
	if (!aj)
		return;
	const struct allreduce_spec *s = &aj->spec;
	struct mp_array ranks;
	double us = 0;
	mp_array_init(&ranks);
	for (int r = 0; r < s->nranks; r++) {
		mp_array_f64(&ranks, s->bench_us[r]);
		us = s->bench_us[r] > us ? s->bench_us[r] : us;
	}
	render_common(aj, out);
	mp_put_f64(out, "us", us);
	mp_put_array(out, "rank_us", &ranks);
	mp_put_u64(out, "warmup", s->warmup);
	mp_put_u64(out, "iters", s->iters);
	mp_put_u64(out, "repeats", s->repeats);
	render_rates(out, s, us / 1e6);
}

static const struct job_kind kind_allreduce = {
	.op = "allreduce", .finish = finish_allreduce, .render = render_allreduce
};
static const struct job_kind kind_bench_allreduce = {
	.op = "bench_allreduce", .finish = finish_allreduce, .render = render_bench
};

/* A buffer name field: NAME only, since `devices` says where. */
static int read_name(struct request *req, const char *field, bool required, char *name,
		     struct gpuq_error *err)
{
	char ref[BUFFER_NAME_MAX + 32];
	int device;
	int rc = msg_get_str(req->map, field, ref, sizeof ref, err);
	if (rc == 0 && required)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field '%s' (a buffer NAME) is required", field);
	if (rc <= 0)
		return rc;
	if (buffer_ref_parse(ref, field, name, &device, err) < 0)
		return -1;
	if (device >= 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field '%s': give the buffer's NAME ('%s'), not NAME@GPU: "
				 "'devices' says which GPUs take part",
				 field, name);
	return 1;
}

/* No `devices`: every device that has the buffer, in index order. */
static int devices_holding(struct request *req, struct allreduce_req *a, struct gpuq_error *err)
{
	a->n = 0;
	for (int d = 0; d < req->d->pool.count; d++)
		if (buffer_find(&req->d->buffers, a->owner, a->name, d))
			a->devices[a->n++] = d;
	if (a->n > 0)
		return 0;
	buffer_resolve(&req->d->buffers, a->owner, a->name, -1, err); /* lists yours */
	return -1;
}

static int check_typed(const struct buffer *b, struct gpuq_error *err)
{
	if (coll_dtype_supported(b->dtype))
		return 0;
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			 "buffer '%s@%d' is untyped (%s); allreduce reduces elements: allocate it "
			 "with --count N --dtype T (T one of " COLL_DTYPE_LIST ")",
			 b->name, b->device, gpuq_dtype_name(b->dtype));
}

/* b must match first (rank 0's input): same dtype and count. */
static int check_same_shape(const struct buffer *b, const struct buffer *first,
			    struct gpuq_error *err)
{
	if (b->dtype == first->dtype && b->count == first->count)
		return 0;
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			 "buffer '%s@%d' is %" PRIu64 " x %s but '%s@%d' is %" PRIu64
			 " x %s; allreduce needs the same dtype and count on every device",
			 b->name, b->device, b->count, gpuq_dtype_name(b->dtype), first->name,
			 first->device, first->count, gpuq_dtype_name(first->dtype));
}

/* Resolves name on every device into bufs; each must exist, be usable and match bufs[0]. */
static int resolve_all(struct request *req, struct allreduce_req *a, const char *name,
		       struct buffer **bufs, struct gpuq_error *err)
{
	for (int i = 0; i < a->n; i++) {
		struct buffer *b = buffer_resolve(&req->d->buffers, a->owner, name, a->devices[i], err);
		if (!b || buffer_check_usable(b, err) < 0 || check_typed(b, err) < 0 ||
		    check_same_shape(b, a->in[0] ? a->in[0] : b, err) < 0)
			return -1;
		bufs[i] = b;
	}
	return 0;
}

static int read_op_and_count(struct request *req, struct allreduce_req *a, struct gpuq_error *err)
{
	char op[16] = "sum";
	if (msg_get_str(req->map, "reduce", op, sizeof op, err) < 0)
		return -1;
	if (coll_op_from_name(op, &a->op) < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'reduce': '%s' is not one of " COLL_OP_LIST, op);
	a->count = a->in[0]->count;
	int rc = msg_get_u64(req->map, "count", &a->count, err);
	if (rc < 0)
		return -1;
	if (rc > 0 && (a->count == 0 || a->count > a->in[0]->count))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'count': %" PRIu64 " elements; '%s' holds %" PRIu64
				 ", so give 1 to %" PRIu64,
				 a->count, a->name, a->in[0]->count, a->in[0]->count);
	return 0;
}

static int read_u64_in(struct request *req, const char *field, uint64_t lo, uint64_t hi,
		       uint64_t *out, struct gpuq_error *err)
{
	int rc = msg_get_u64(req->map, field, out, err);
	if (rc > 0 && (*out < lo || *out > hi))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field '%s': %" PRIu64 " is not in %" PRIu64
				 " to %" PRIu64, field, *out, lo, hi);
	return rc < 0 ? -1 : 0;
}

/* The timeout, the benchmark's loop sizes and (in test builds) the hang to inject. */
static int read_knobs(struct request *req, struct allreduce_req *a, bool bench,
		      struct gpuq_error *err)
{
	a->timeout_ms = req->d->opt.collective_timeout_ms;
	a->warmup = BENCH_DEFAULT_WARMUP;
	a->iters = BENCH_DEFAULT_ITERS;
	a->repeats = BENCH_DEFAULT_REPEATS;
	a->hang_rank = -1;
	if (read_u64_in(req, "collective_timeout_ms", 1, COLL_MAX_TIMEOUT_MS, &a->timeout_ms, err) < 0)
		return -1;
	if (bench && (read_u64_in(req, "warmup", 0, BENCH_MAX_WARMUP, &a->warmup, err) < 0 ||
		      read_u64_in(req, "iters", 1, BENCH_MAX_ITERS, &a->iters, err) < 0 ||
		      read_u64_in(req, "repeats", 1, BENCH_MAX_REPEATS, &a->repeats, err) < 0))
		return -1;
#ifdef GPUQ_FAULT_INJECTION
	uint64_t hang = 0;
	int rc = msg_get_u64(req->map, "inject_hang_rank", &hang, err);
	if (rc < 0)
		return -1;
	if (rc > 0 && hang >= (uint64_t)a->n)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'inject_hang_rank': %" PRIu64
				 " is not a rank (0-%d)", hang, a->n - 1);
	if (rc > 0)
		a->hang_rank = (int)hang;
#endif
	return 0;
}

/* Everything the request says, checked, before anything is held or queued. */
static int read_allreduce(struct request *req, struct allreduce_req *a, bool bench,
			  struct gpuq_error *err)
{
	memset(a, 0, sizeof *a);
	int rc;
	if (read_name(req, "buffer", true, a->name, err) < 0 ||
	    (rc = read_name(req, "out", false, a->out_name, err)) < 0 ||
	    read_owner(req, &a->owner, err) < 0)
		return -1;
	if (rc == 0 || strcmp(a->out_name, a->name) == 0)
		a->out_name[0] = '\0'; /* in place */
	rc = read_device_list(req, a->devices, &a->n, err);
	if (rc < 0 || (rc == 0 && devices_holding(req, a, err) < 0))
		return -1;
	if (resolve_all(req, a, a->name, a->in, err) < 0)
		return -1;
	if (a->out_name[0] && resolve_all(req, a, a->out_name, a->out, err) < 0)
		return -1;
	if (!a->out_name[0])
		memcpy(a->out, a->in, sizeof a->out);
	return read_op_and_count(req, a, err) < 0 ? -1 : read_knobs(req, a, bench, err);
}

static void hold(struct allreduce_job *aj, struct buffer *b, uint64_t job_id)
{
	b->users++;
	b->last_job = job_id;
	aj->held[aj->nheld++] = b;
}

/* The job's spec from the request; holds the buffers. */
static void fill_job(struct daemon *d, struct job *job, struct allreduce_job *aj,
		     const struct allreduce_req *a, bool bench)
{
	struct allreduce_spec *s = &aj->spec;
	coll_spec_init(s);
	s->op = a->op;
	s->dtype = a->in[0]->dtype;
	s->count = a->count;
	s->nranks = a->n;
	s->timeout_s = (double)a->timeout_ms / 1e3;
	s->init_timeout_s = (double)(a->timeout_ms > d->opt.collective_timeout_ms
					     ? a->timeout_ms
					     : d->opt.collective_timeout_ms) / 1e3;
	s->bench = bench;
	s->warmup = (unsigned)a->warmup;
	s->iters = (unsigned)a->iters;
	s->repeats = (unsigned)a->repeats;
	s->inject_hang_rank = a->hang_rank;
	for (int r = 0; r < a->n; r++) {
		s->devices[r] = a->devices[r];
		s->in[r] = a->in[r]->dptr;
		s->out[r] = a->out[r]->dptr;
		hold(aj, a->in[r], job->id);
		if (a->out[r] != a->in[r])
			hold(aj, a->out[r], job->id);
		struct work *w = job->parts ? &job->parts[r] : &job->work;
		work_add_access(w, a->in[r], 0, a->in[r]->bytes, a->out[r] == a->in[r]);
		if (a->out[r] != a->in[r])
			work_add_access(w, a->out[r], 0, a->out[r]->bytes, true);
	}
	snprintf(aj->name, sizeof aj->name, "%s", a->name);
	snprintf(aj->out_name, sizeof aj->out_name, "%s", a->out_name);
	if (a->n == 1)
		snprintf(job->buffer_label, sizeof job->buffer_label, "%s@%d", a->name, a->devices[0]);
	else
		snprintf(job->buffer_label, sizeof job->buffer_label, "%s", a->name);
}

static void refuse_oom(struct request *req, struct job *job, const char *what)
{
	struct gpuq_error err;
	job_discard(&req->d->jobs, job);
	gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for %s", what);
	reply_error(req, &err);
}

static void submit_allreduce(struct request *req, bool bench)
{
	struct gpuq_error err;
	struct allreduce_req a;
	if (read_allreduce(req, &a, bench, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, bench ? &kind_bench_allreduce : &kind_allreduce,
				  bench ? WORK_ALLREDUCE_BENCH : WORK_ALLREDUCE, a.devices[0]);
	if (!job)
		return;
	struct allreduce_job *aj = calloc(1, sizeof *aj);
	if (!aj) {
		refuse_oom(req, job, "an allreduce");
		return;
	}
	if (a.n > 1 && job_make_gang(job, a.n) < 0) {
		free(aj);
		refuse_oom(req, job, "a gang of parts");
		return;
	}
	fill_job(req->d, job, aj, &a, bench);
	job->work.spec = &aj->spec;
	job->release = release_allreduce;
	for (int r = 0; job->parts && r < a.n; r++) {
		job->parts[r].device = a.devices[r];
		job->parts[r].spec = &aj->spec;
	}
	job_submit(req, job);
}

void op_allreduce(struct request *req)
{
	submit_allreduce(req, false);
}

void op_bench_allreduce(struct request *req)
{
	submit_allreduce(req, true);
}
