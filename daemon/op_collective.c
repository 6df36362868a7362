/*
 * The collectives, the main thread's part: allreduce, reduce_scatter,
 * all_gather, broadcast, reduce, sendrecv, all_to_all, group (several of
 * them as one NCCL group), and the benchmarks' raw loops (bench_allreduce,
 * bench_collective). op_collective_read.c reads and checks a request into a
 * plan before anything is held or queued; here a plan becomes a job that
 * holds every buffer it names and queues one part per device in one step
 * (a gang: worker_submit_group), which is what keeps collectives over
 * overlapping devices in the same order everywhere. Main thread only.
 *
 * A job owns a struct coll_job from the request until the job is freed
 * (job->release): the spec its parts share, the names its result shows,
 * the buffers it holds and its arrival deadline. The kind's finish lets go
 * of the buffers and the deadline, when the job ends and, through
 * job_abandon, when it never reached a worker.
 *
 * The arrival deadline. A collective's timeout counts from its submission:
 * a rank still queued behind other jobs when it passes must not keep the
 * job (and its client) waiting until that rank starts. So a timer per job
 * fires at submission + timeout and takes back every part still queued
 * (worker_unqueue); each ends with the collective's timeout, which the
 * ranks already started see at their next poll (coll_fail_withdrawn) and
 * which the ranks' own wait at the rendezvous also reaches then.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/op_collective.h"

struct coll_job {
	struct coll_spec spec; /* first: work.spec points here */
	struct coll_names *names; /* one per task */
	struct buffer **held;
	int nheld;
	bool group;
	uv_timer_t *deadline; /* armed from submission until the job ends */
	struct daemon *d;
	struct job *job;
};

static void release_collective(struct job *job)
{
	struct coll_job *cj = job->work.spec;
	if (!cj)
		return;
	coll_spec_destroy(&cj->spec);
	free(cj->spec.tasks);
	free(cj->names);
	free(cj->held);
	free(cj); /* the coll_spec it begins */
	job->work.spec = NULL;
}

static void free_handle(uv_handle_t *handle)
{
	free(handle);
}

static void finish_collective(struct daemon *d, struct job *job)
{
	(void)d;
	struct coll_job *cj = job->work.spec;
	if (!cj)
		return;
	for (int i = 0; i < cj->nheld; i++)
		buffer_unhold(cj->held[i]);
	cj->nheld = 0;
	if (cj->deadline) {
		uv_timer_stop(cj->deadline);
		uv_close((uv_handle_t *)cj->deadline, free_handle);
		cj->deadline = NULL;
	}
}

/* One primitive's keys: what it did, on which buffers, how much. */
static void render_task(const struct coll_task *t, const struct coll_names *nm,
			const struct coll_spec *s, struct mp_map *out)
{
	const struct coll_layout *l = &t->layout;
	mp_put_str(out, "collective", coll_prim_name(l->prim));
	if (l->prim == COLL_SENDRECV) {
		mp_put_str(out, "src", nm->in);
		mp_put_str(out, "dst", nm->out);
	} else {
		mp_put_str(out, "buffer", nm->in);
		mp_put_str(out, "out", nm->out);
		mp_put_bool(out, "in_place", nm->in_place);
	}
	if (coll_prim_reduces(l->prim))
		mp_put_str(out, "reduce", coll_op_name(t->op));
	if (coll_prim_has_root(l->prim)) {
		mp_put_u64(out, "root", (uint64_t)l->root);
		mp_put_u64(out, "root_device", (uint64_t)s->devices[l->root]);
	}
	mp_put_str(out, "dtype", gpuq_dtype_name(t->dtype));
	mp_put_u64(out, "count", l->count);
	mp_put_u64(out, "bytes", coll_size_elements(l) * gpuq_dtype_size(t->dtype));
}

/* The group's bytes (nccl-tests' sizes, summed) and its bus bytes (each times its factor). */
static void spec_bytes(const struct coll_spec *s, double *bytes, double *bus)
{
	*bytes = *bus = 0;
	for (int i = 0; i < s->ntasks; i++) {
		const struct coll_task *t = &s->tasks[i];
		double b = (double)(coll_size_elements(&t->layout) * gpuq_dtype_size(t->dtype));
		*bytes += b;
		*bus += b * coll_bus_factor(t->layout.prim, s->nranks);
	}
}

/* The bandwidths nccl-tests reports for a run of `seconds`. */
static void render_rates(struct mp_map *out, const struct coll_spec *s, double seconds)
{
	double bytes, bus;
	spec_bytes(s, &bytes, &bus);
	mp_put_f64(out, "algbw_gbps", seconds > 0 ? bytes / seconds / 1e9 : 0);
	mp_put_f64(out, "busbw_gbps", seconds > 0 ? bus / seconds / 1e9 : 0);
}

static void render_common(const struct coll_job *cj, struct mp_map *out)
{
	const struct coll_spec *s = &cj->spec;
	struct mp_array devices, ops;
	bool created = false;
	if (!cj->group) {
		render_task(&s->tasks[0], &cj->names[0], s, out);
	} else {
		double bytes, bus;
		spec_bytes(s, &bytes, &bus);
		mp_put_str(out, "collective", "group");
		mp_array_init(&ops);
		for (int i = 0; i < s->ntasks; i++) {
			struct mp_map op;
			mp_map_init(&op);
			render_task(&s->tasks[i], &cj->names[i], s, &op);
			mp_array_map(&ops, &op);
		}
		mp_put_array(out, "ops", &ops);
		mp_put_u64(out, "bytes", (uint64_t)bytes);
	}
	mp_array_init(&devices);
	for (int r = 0; r < s->nranks; r++) {
		mp_array_i64(&devices, s->devices[r]);
		created = created || s->created[r];
	}
	mp_put_array(out, "devices", &devices);
	mp_put_str(out, "communicator", created ? "created" : "cached");
	mp_put_u64(out, "generation", s->generation[0]);
}

static void render_collective(const struct job *job, struct mp_map *out)
{
	const struct coll_job *cj = job->work.spec;
	if (!cj)
		return;
	double seconds = 0;
	for (int r = 0; r < cj->spec.nranks; r++)
		if (cj->spec.seconds[r] > seconds)
			seconds = cj->spec.seconds[r];
	render_common(cj, out);
	mp_put_f64(out, "seconds", seconds);
	render_rates(out, &cj->spec, seconds);
}

static void render_bench(const struct job *job, struct mp_map *out)
{
	const struct coll_job *cj = job->work.spec;
	if (!cj)
		return;
	const struct coll_spec *s = &cj->spec;
	struct mp_array ranks;
	double us = 0;
	mp_array_init(&ranks);
	for (int r = 0; r < s->nranks; r++) {
		mp_array_f64(&ranks, s->bench_us[r]);
		us = s->bench_us[r] > us ? s->bench_us[r] : us;
	}
	render_common(cj, out);
	mp_put_f64(out, "us", us);
	mp_put_array(out, "rank_us", &ranks);
	mp_put_u64(out, "warmup", s->warmup);
	mp_put_u64(out, "iters", s->iters);
	mp_put_u64(out, "repeats", s->repeats);
	render_rates(out, s, us / 1e6);
}

#define COLL_KIND(name) { .op = name, .finish = finish_collective, .render = render_collective }
#define BENCH_KIND(name) { .op = name, .finish = finish_collective, .render = render_bench }

/* Every collective op's job kind (their arguments: op_collective_read.c). */
static const struct job_kind coll_kinds[] = {
	COLL_KIND("allreduce"), COLL_KIND("reduce_scatter"), COLL_KIND("all_gather"),
	COLL_KIND("broadcast"), COLL_KIND("reduce"), COLL_KIND("sendrecv"),
	COLL_KIND("all_to_all"), COLL_KIND("group"),
	BENCH_KIND("bench_allreduce"), BENCH_KIND("bench_collective"),
};

/*
 * The arrival deadline has passed: every part still queued is taken back
 * and ends with the collective's timeout; the parts that started see it at
 * their next poll. The last part back completes the job, which may free it.
 */
static void on_arrival_deadline(uv_timer_t *timer)
{
	struct coll_job *cj = timer->data;
	struct job *job = cj->job;
	struct daemon *d = cj->d;
	struct work *taken[GPUQ_MAX_DEVICES];
	bool late[GPUQ_MAX_DEVICES] = { false };
	int ntaken = 0, nparts = job->parts ? job->nparts : 1;
	if (d->stopping && d->jobs.active == 0)
		return; /* a shutdown gave up on stuck jobs: the workers may be gone */
	for (int r = 0; r < nparts; r++) {
		struct work *w = job->parts ? &job->parts[r] : &job->work;
		if (worker_unqueue(&d->pool, w)) {
			late[r] = true;
			taken[ntaken++] = w;
		}
	}
	if (ntaken == 0)
		return;
	struct gpuq_error err;
	coll_fail_withdrawn(&cj->spec, late, &err);
	for (int i = 0; i < ntaken; i++) {
		taken[i]->error = err;
		taken[i]->result.seconds = 0;
		atomic_store(&taken[i]->phase, WORK_FINISHED); /* not queued: cancel leaves it be */
	}
	for (int i = 0; i < ntaken; i++)
		job_on_done(taken[i], d);
}

/* The part of the job that runs on device (the job's one work when it is not a gang). */
static struct work *part_on(struct job *job, int device)
{
	for (int r = 0; job->parts && r < job->nparts; r++)
		if (job->parts[r].device == device)
			return &job->parts[r];
	return &job->work;
}

/*
 * Holds every buffer the plan's regions name, each once (the regions are
 * sorted by buffer), and tells each device's scheduler which ranges its
 * part reads and writes. The parts' devices are set.
 */
static int hold_buffers(struct job *job, struct coll_job *cj, const struct coll_plan *p)
{
	cj->held = calloc((size_t)p->nregions + 1, sizeof *cj->held);
	if (!cj->held)
		return -1;
	for (int i = 0; i < p->nregions; i++) {
		const struct coll_region *g = &p->regions[i];
		work_add_access(part_on(job, g->buffer->device), g->buffer, g->lo, g->hi - g->lo,
				g->write);
	}
	uint64_t job_id = job->id;
	for (int i = 0; i < p->nregions; i++) {
		struct buffer *b = p->regions[i].buffer;
		if (cj->nheld > 0 && cj->held[cj->nheld - 1] == b)
			continue;
		b->users++;
		b->last_job = job_id;
		cj->held[cj->nheld++] = b;
	}
	return 0;
}

/* The spec from the plan, which gives up its tasks and names to the job. */
static void fill_spec(struct daemon *d, struct coll_job *cj, struct coll_plan *p, bool bench)
{
	struct coll_spec *s = &cj->spec;
	coll_spec_init(s);
	s->nranks = p->n;
	memcpy(s->devices, p->devices, sizeof s->devices);
	s->tasks = p->tasks;
	s->ntasks = p->ntasks;
	cj->names = p->names;
	p->tasks = NULL;
	p->names = NULL;
	cj->group = p->group;
	s->group = p->group;
	s->timeout_s = (double)p->timeout_ms / 1e3;
	uint64_t init_ms = p->timeout_ms > d->opt.collective_timeout_ms ? p->timeout_ms
									 : d->opt.collective_timeout_ms;
	s->init_timeout_s = (double)init_ms / 1e3;
	s->arrive_deadline = monotonic_seconds() + s->timeout_s;
	s->bench = bench;
	s->warmup = (unsigned)p->warmup;
	s->iters = (unsigned)p->iters;
	s->repeats = (unsigned)p->repeats;
	s->inject_hang_rank = p->hang_rank;
}

static void label_job(struct job *job, const struct coll_job *cj)
{
	const char *name = cj->names[0].in;
	if (cj->spec.nranks == 1 && cj->spec.tasks[0].layout.prim != COLL_SENDRECV)
		snprintf(job->buffer_label, sizeof job->buffer_label, "%.64s@%d", name,
			 cj->spec.devices[0]);
	else
		snprintf(job->buffer_label, sizeof job->buffer_label, "%.72s", name);
}

/* A job's collective state with its deadline timer initialised (not started); NULL: no memory. */
static struct coll_job *coll_job_new(struct daemon *d, struct job *job)
{
	struct coll_job *cj = calloc(1, sizeof *cj);
	uv_timer_t *timer = malloc(sizeof *timer);
	if (!cj || !timer || uv_timer_init(d->loop, timer) != 0) {
		free(cj);
		free(timer);
		return NULL;
	}
	timer->data = cj;
	uv_unref((uv_handle_t *)timer); /* a deadline never keeps the loop (and a shutdown) alive */
	cj->deadline = timer;
	cj->d = d;
	cj->job = job;
	return cj;
}

/* Undoes coll_job_new and what was added since, for a job never submitted. */
static void refuse(struct request *req, struct job *job, struct coll_job *cj,
		   struct coll_plan *p, const char *what)
{
	struct gpuq_error err;
	if (cj) {
		free(cj->held);
		uv_close((uv_handle_t *)cj->deadline, free_handle);
		free(cj);
	}
	op_collective_plan_free(p);
	job_discard(&req->d->jobs, job);
	gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for %s", what);
	reply_error(req, &err);
}

static void submit_collective(struct request *req, const struct job_kind *kind,
			      const struct coll_args *a)
{
	struct gpuq_error err;
	struct coll_plan p;
	if (op_collective_read(req, a, &p, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, kind, a->bench ? WORK_COLLECTIVE_BENCH : WORK_COLLECTIVE,
				  p.devices[0]);
	if (!job) {
		op_collective_plan_free(&p);
		return;
	}
	struct coll_job *cj = coll_job_new(req->d, job);
	if (!cj || (p.n > 1 && job_make_gang(job, p.n) < 0)) {
		refuse(req, job, cj, &p, "a collective job");
		return;
	}
	for (int r = 0; job->parts && r < p.n; r++)
		job->parts[r].device = p.devices[r];
	if (hold_buffers(job, cj, &p) < 0) {
		refuse(req, job, cj, &p, "a collective job");
		return;
	}
	uint64_t timeout_ms = p.timeout_ms;
	fill_spec(req->d, cj, &p, a->bench);
	op_collective_plan_free(&p);
	job->work.spec = &cj->spec;
	job->release = release_collective;
	label_job(job, cj);
	for (int r = 0; job->parts && r < cj->spec.nranks; r++) {
		job->parts[r].device = cj->spec.devices[r];
		job->parts[r].spec = &cj->spec;
	}
	/* From here the job's finish and release undo everything, job_submit's refusals included. */
	int rc = uv_timer_start(cj->deadline, on_arrival_deadline, timeout_ms, 0);
	if (rc != 0) {
		finish_collective(req->d, job);
		job_discard(&req->d->jobs, job);
		gpuq_fail(&err, GPUQ_E_INTERNAL, "uv_timer_start (a collective's deadline): %s",
			  uv_strerror(rc));
		reply_error(req, &err);
		return;
	}
	job_submit(req, job);
}

void op_collective(struct request *req, void *args)
{
	const struct coll_args *a = args;
	struct gpuq_error err;
	for (size_t i = 0; i < sizeof coll_kinds / sizeof coll_kinds[0]; i++) {
		if (strcmp(a->op, coll_kinds[i].op) == 0) {
			submit_collective(req, &coll_kinds[i], a);
			return;
		}
	}
	gpuq_fail(&err, GPUQ_E_INTERNAL, "op '%s' reached the collectives, which do not have it",
		  a->op);
	reply_error(req, &err);
}
