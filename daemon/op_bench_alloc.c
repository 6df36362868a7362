/*
 * bench_alloc: a job that measures alloc and free latency on one device,
 * from the memory pool and from slabs in the same run
 * (workers/bench/bench_alloc.c), so that `--buffer-memory` can be chosen
 * on numbers. The request is checked here; the job owns the spec, whose
 * rows the result renders until the job leaves the history. Main thread
 * only.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "workers/bench/bench_alloc.h"

#define DEFAULT_REPEATS 50
#define MAX_REPEATS 1000

static void render_bench_alloc(const struct job *job, struct mp_map *out)
{
	const struct bench_alloc_spec *s = job->work.spec;
	struct mp_array rows, notes;
	mp_put_i64(out, "device", job->work.device);
	mp_put_u64(out, "repeats", s->repeats);
	mp_put_str(out, "buffer_memory", s->memory ? s->memory : "");
	mp_array_init(&rows);
	for (unsigned i = 0; i < s->nrows; i++) {
		const struct bench_alloc_row *r = &s->rows[i];
		struct mp_map row;
		mp_map_init(&row);
		mp_put_u64(&row, "bytes", r->bytes);
		mp_put_str(&row, "memory", r->memory);
		mp_put_f64(&row, "alloc_p50_us", r->alloc_p50_us);
		mp_put_f64(&row, "alloc_p99_us", r->alloc_p99_us);
		mp_put_f64(&row, "free_p50_us", r->free_p50_us);
		mp_put_f64(&row, "free_p99_us", r->free_p99_us);
		mp_put_u64(&row, "held_bytes", r->held_bytes);
		mp_put_u64(&row, "held", r->held);
		mp_array_map(&rows, &row);
	}
	mp_put_array(out, "rows", &rows);
	mp_array_init(&notes);
	for (unsigned i = 0; i < s->nnotes; i++)
		mp_array_str(&notes, s->notes[i]);
	mp_put_array(out, "notes", &notes);
}

static void release_bench_alloc(struct job *job)
{
	free(job->work.spec);
	job->work.spec = NULL;
}

static const struct job_kind kind_bench_alloc = { "bench_alloc", NULL, render_bench_alloc };

struct bench_alloc_args {
	int device;
	uint64_t repeats;
	uint64_t sizes[BENCH_ALLOC_MAX_SIZES];
	unsigned nsizes;
	bool has_sizes;
};

/* The sizes asked for, or 4 KiB, 1 MiB, 64 MiB and 1 GiB. */
static int read_sizes(struct request *req, void *args, struct gpuq_error *err)
{
	static const uint64_t defaults[] = { 4ull << 10, 1ull << 20, 64ull << 20, 1ull << 30 };
	struct bench_alloc_args *a = args;
	if (a->has_sizes)
		return read_bench_sizes(req, a->sizes, BENCH_ALLOC_MAX_SIZES, &a->nsizes, err);
	memcpy(a->sizes, defaults, sizeof defaults);
	a->nsizes = sizeof defaults / sizeof defaults[0];
	return 0;
}

static const struct args_field bench_alloc_fields[] = {
	{ "device", ARGS_DEVICE, 0, ARGS_AT(struct bench_alloc_args, device) },
	{ "repeats", ARGS_U64, 0, ARGS_AT(struct bench_alloc_args, repeats), .lo = 1,
	  .hi = MAX_REPEATS },
	{ "sizes", ARGS_PRESENT, 0, ARGS_AT(struct bench_alloc_args, has_sizes), .then = read_sizes },
};
static const struct bench_alloc_args bench_alloc_defaults = { .repeats = DEFAULT_REPEATS };
const struct args_spec op_bench_alloc_args =
	ARGS_SPEC(struct bench_alloc_args, bench_alloc_fields, &bench_alloc_defaults);

static int fill_bench_alloc(struct request *req, const void *args, void *spec, int *device,
			    struct gpuq_error *err)
{
	const struct bench_alloc_args *a = args;
	struct bench_alloc_spec *s = spec;
	(void)req;
	(void)err;
	memcpy(s->sizes, a->sizes, sizeof s->sizes);
	s->nsizes = a->nsizes;
	s->repeats = (unsigned)a->repeats;
	*device = a->device;
	return 0;
}

static const struct spec_job bench_alloc_job = {
	.kind = &kind_bench_alloc,
	.work_kind = WORK_BENCH_ALLOC,
	.spec_size = sizeof(struct bench_alloc_spec),
	.what = "a benchmark",
	.fill = fill_bench_alloc,
	.release = release_bench_alloc,
};

void op_bench_alloc(struct request *req, void *args)
{
	spec_job_submit(req, &bench_alloc_job, args);
}
