/*
 * bench_d2d: the device-to-device and peer copy benchmark as a job
 * (workers/bench/bench_d2d.c), on one device, or as a gang over every device when
 * there are peer pairs to measure. The request is checked here and each
 * pair's route decided as copy decides it; the job owns the spec, whose rows
 * the result renders until the job leaves the history. Main thread only.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "workers/bench/bench_d2d.h"

#define DEFAULT_REPEATS 5

static void render_bench_d2d(const struct job *job, struct mp_map *out)
{
	const struct bench_d2d *b = job->work.spec;
	struct mp_array notes;
	mp_put_i64(out, "device", b->device);
	mp_put_u64(out, "repeats", b->repeats);
	bench_rows_render(b->rows, b->nrows, out);
	mp_array_init(&notes);
	for (unsigned i = 0; i < b->nnotes; i++)
		mp_array_str(&notes, b->notes[i]);
	mp_put_array(out, "notes", &notes);
}

static void release_bench_d2d(struct job *job)
{
	struct bench_d2d *b = job->work.spec;
	if (b) {
		bench_d2d_destroy(b);
		free(b);
	}
	job->work.spec = NULL;
}

static const struct job_kind kind_bench_d2d = { "bench_d2d", NULL, render_bench_d2d };

static void add_note(struct bench_d2d *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add_note(struct bench_d2d *b, const char *fmt, ...)
{
	va_list ap;
	if (b->nnotes >= BENCH_D2D_MAX_NOTES)
		return;
	va_start(ap, fmt);
	vsnprintf(b->notes[b->nnotes++], sizeof b->notes[0], fmt, ap);
	va_end(ap);
}

struct bench_d2d_args {
	int device;
	uint64_t repeats, seed, timeout_ms;
	bool has_seed, peers;
	uint64_t sizes[BENCH_D2D_MAX_SIZES];
	unsigned nsizes;
	bool has_sizes;
};

static int check_repeats(struct request *req, void *args, struct gpuq_error *err)
{
	const struct bench_d2d_args *a = args;
	(void)req;
	if (a->repeats < 1 || a->repeats > BENCH_D2D_MAX_REPEATS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'repeats': %llu is not 1 to %d",
				 (unsigned long long)a->repeats, BENCH_D2D_MAX_REPEATS);
	return 0;
}

static int check_timeout(struct request *req, void *args, struct gpuq_error *err)
{
	const struct bench_d2d_args *a = args;
	(void)req;
	if (a->timeout_ms < 1 || a->timeout_ms > 3600000)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'peer_timeout_ms': %llu is not 1 to 3600000",
				 (unsigned long long)a->timeout_ms);
	return 0;
}

static int read_sizes(struct request *req, void *args, struct gpuq_error *err)
{
	struct bench_d2d_args *a = args;
	return read_bench_sizes(req, a->sizes, BENCH_D2D_MAX_SIZES, &a->nsizes, err);
}

static const struct args_field bench_d2d_fields[] = {
	{ "device", ARGS_DEVICE, 0, ARGS_AT(struct bench_d2d_args, device) },
	{ "repeats", ARGS_U64, 0, ARGS_AT(struct bench_d2d_args, repeats), .then = check_repeats },
	{ "seed", ARGS_U64, 0, ARGS_AT(struct bench_d2d_args, seed),
	  ARGS_GIVEN(struct bench_d2d_args, has_seed) },
	{ "peer_timeout_ms", ARGS_U64, 0, ARGS_AT(struct bench_d2d_args, timeout_ms),
	  .then = check_timeout },
	{ "peers", ARGS_BOOL, 0, ARGS_AT(struct bench_d2d_args, peers) },
	{ "sizes", ARGS_PRESENT, 0, ARGS_AT(struct bench_d2d_args, has_sizes), .then = read_sizes },
};
static const struct bench_d2d_args bench_d2d_defaults = {
	.repeats = DEFAULT_REPEATS, .timeout_ms = COPY_TIMEOUT_MS, .peers = true
};
const struct args_spec op_bench_d2d_args =
	ARGS_SPEC(struct bench_d2d_args, bench_d2d_fields, &bench_d2d_defaults);

/* Every pair i -> j with i < j, routed as copy routes it; notes say what differs. */
static void plan_pairs(struct daemon *d, struct bench_d2d *b)
{
	for (int i = 0; i < d->pool.count; i++) {
		struct worker_snapshot s;
		worker_snapshot(&d->pool, i, &s);
		if (s.peer_note[0])
			add_note(b, "gpu %d: %s", i, s.peer_note);
	}
	for (int i = 0; i < d->pool.count; i++) {
		for (int j = i + 1; j < d->pool.count; j++) {
			if (b->npairs == BENCH_D2D_MAX_PAIRS) {
				add_note(b, "only the first %d pairs are measured", BENCH_D2D_MAX_PAIRS);
				return;
			}
			struct bench_d2d_pair *p = &b->pairs[b->npairs++];
			p->src = i;
			p->dst = j;
			p->path = copy_peer_path(d, i, j, &p->direct);
			if (!p->direct)
				add_note(b, "peer %d->%d: no peer access, so gpuq copies it host-staged; "
					    "its ceiling, cudaMemcpyPeer, is then staged by the driver",
					 i, j);
		}
	}
}

/* The gang over every device (part i on device i), sharing b. */
static int make_bench_gang(struct job *job, struct bench_d2d *b, int count)
{
	struct work *parts[GPUQ_MAX_DEVICES];
	if (job_make_gang(job, count) < 0)
		return -1;
	for (int i = 0; i < count; i++) {
		job->parts[i].device = i;
		job->parts[i].spec = b;
		parts[i] = &job->parts[i];
	}
	unsigned npairs = b->npairs;
	b->npairs = 0; /* release_bench_d2d destroys no lock that was not made */
	if (bench_d2d_init_gang(b, parts, count) != 0)
		return -1;
	b->npairs = npairs;
	return 0;
}

/* The spec from the args, with the notes and the peer pairs to measure. */
static int fill_bench_d2d(struct request *req, const void *args, void *spec, int *device,
			  struct gpuq_error *err)
{
	const struct bench_d2d_args *a = args;
	struct bench_d2d *b = spec;
	(void)err;
	/* fresh data each run unless a seed is given */
	b->seed = a->has_seed ? a->seed : (uint64_t)(monotonic_seconds() * 1e9);
	memcpy(b->sizes, a->sizes, sizeof b->sizes);
	b->nsizes = a->nsizes;
	b->device = a->device;
	b->repeats = (unsigned)a->repeats;
	b->timeout_ms = (unsigned)a->timeout_ms;
	b->host = strcmp(req->d->ops->name, "host") == 0;
	if (b->host)
		add_note(b, "host backend: every method is a memcpy in host memory, timed with "
			    "the host clock; no GPU was measured");
	if (req->d->pool.count < 2)
		add_note(b, "one device: no peer rows (a peer pair needs two)");
	else if (!a->peers)
		add_note(b, "peer rows not asked for (peers: false)");
	else
		plan_pairs(req->d, b);
	*device = b->device;
	return 0;
}

/* With peer pairs to measure, the job is a gang over every device. */
static int shape_bench_d2d(struct request *req, const void *args, struct job *job,
			   struct gpuq_error *err)
{
	struct bench_d2d *b = job->work.spec;
	int count = req->d->pool.count;
	(void)args;
	if (b->npairs > 0 && make_bench_gang(job, b, count) < 0)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for a %d-device job",
				 count);
	return 0;
}

static const struct spec_job bench_d2d_job = {
	.kind = &kind_bench_d2d,
	.work_kind = WORK_BENCH_D2D,
	.spec_size = sizeof(struct bench_d2d),
	.what = "a benchmark",
	.fill = fill_bench_d2d,
	.shape = shape_bench_d2d,
	.release = release_bench_d2d,
};

void op_bench_d2d(struct request *req, void *args)
{
	spec_job_submit(req, &bench_d2d_job, args);
}
