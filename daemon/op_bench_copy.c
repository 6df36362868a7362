/*
 * bench_copy: a job that measures the host<->device copy paths on one device
 * (workers/bench/bench_copy.c), so that operators can run it on a live server.
 * The request is checked here; the job owns the spec, whose rows the result
 * renders until the job leaves the history. Main thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "workers/bench/bench_copy.h"

#define DEFAULT_REPEATS 5
#define MAX_REPEATS 100

void bench_rows_render(const struct bench_row *rows, unsigned n, struct mp_map *out)
{
	struct mp_array list;
	mp_array_init(&list);
	for (unsigned i = 0; i < n; i++) {
		const struct bench_row *r = &rows[i];
		struct mp_map row;
		mp_map_init(&row);
		mp_put_str(&row, "group", r->group);
		mp_put_u64(&row, "bytes", r->bytes);
		mp_put_str(&row, "method", r->method);
		mp_put_str(&row, "role", r->role);
		if (r->path)
			mp_put_str(&row, "path", r->path);
		mp_put_f64(&row, "gbps", r->gbps);
		mp_put_f64(&row, "ceiling", r->ceiling);
		mp_put_f64(&row, "ratio", r->ceiling > 0 ? r->gbps / r->ceiling : 0);
		if (r->host_ceiling > 0) {
			/* a get is as fast as the slower of its halves: the DMA and the host's writes */
			double get = r->ceiling > 0 && r->ceiling < r->host_ceiling ? r->ceiling
										   : r->host_ceiling;
			mp_put_f64(&row, "host_ceiling", r->host_ceiling);
			mp_put_f64(&row, "host_ratio", r->gbps / r->host_ceiling);
			mp_put_f64(&row, "get_ceiling", get);
			mp_put_f64(&row, "get_ratio", r->gbps / get);
		}
		if (r->first_dma_ms > 0) {
			mp_put_f64(&row, "first_dma_ms", r->first_dma_ms);
			mp_put_f64(&row, "after_last_dma_ms", r->after_last_dma_ms);
		}
		mp_put_bool(&row, "verified", r->verified);
		mp_array_map(&list, &row);
	}
	mp_put_array(out, "rows", &list);
}

static void render_bench_copy(const struct job *job, struct mp_map *out)
{
	const struct bench_copy_spec *s = job->work.spec;
	struct mp_array notes;
	mp_put_i64(out, "device", job->work.device);
	mp_put_u64(out, "repeats", s->repeats);
	mp_put_u64(out, "copy_threads", s->copy_threads);
	mp_put_u64(out, "slot_bytes", s->slot_bytes);
	mp_put_u64(out, "slots", s->slots);
	bench_rows_render(s->rows, s->nrows, out);
	mp_array_init(&notes);
	for (unsigned i = 0; i < s->nnotes; i++)
		mp_array_str(&notes, s->notes[i]);
	mp_put_array(out, "notes", &notes);
	struct mp_array pins;
	mp_array_init(&pins);
	for (unsigned i = 0; i < s->npins; i++) {
		const struct bench_copy_pin *p = &s->pins[i];
		if (!p->bytes)
			continue; /* pinning failed: a note says why */
		struct mp_map m;
		mp_map_init(&m);
		mp_put_u64(&m, "bytes", p->bytes);
		mp_put_f64(&m, "pin_s", p->pin_s);
		mp_put_u64(&m, "break_even_h2d", (uint64_t)p->break_even[0]);
		mp_put_u64(&m, "break_even_d2h", (uint64_t)p->break_even[1]);
		mp_array_map(&pins, &m);
	}
	mp_put_array(out, "region_pin", &pins);
}

static void release_bench_copy(struct job *job)
{
	free(job->work.spec);
	job->work.spec = NULL;
}

static const struct job_kind kind_bench_copy = { "bench_copy", NULL, render_bench_copy };

struct bench_copy_args {
	int device;
	uint64_t repeats;
	uint64_t sizes[BENCH_COPY_MAX_SIZES];
	unsigned nsizes;
	bool has_sizes;
};

static int check_repeats(struct request *req, void *args, struct gpuq_error *err)
{
	const struct bench_copy_args *a = args;
	(void)req;
	if (a->repeats < 1 || a->repeats > MAX_REPEATS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'repeats': %llu is not 1 to %d",
				 (unsigned long long)a->repeats, MAX_REPEATS);
	return 0;
}

static int read_sizes(struct request *req, void *args, struct gpuq_error *err)
{
	struct bench_copy_args *a = args;
	return read_bench_sizes(req, a->sizes, BENCH_COPY_MAX_SIZES, &a->nsizes, err);
}

static const struct args_field bench_copy_fields[] = {
	{ "device", ARGS_DEVICE, 0, ARGS_AT(struct bench_copy_args, device) },
	{ "repeats", ARGS_U64, 0, ARGS_AT(struct bench_copy_args, repeats), .then = check_repeats },
	{ "sizes", ARGS_PRESENT, 0, ARGS_AT(struct bench_copy_args, has_sizes), .then = read_sizes },
};
static const struct bench_copy_args bench_copy_defaults = { .repeats = DEFAULT_REPEATS };
const struct args_spec op_bench_copy_args =
	ARGS_SPEC(struct bench_copy_args, bench_copy_fields, &bench_copy_defaults);

static int fill_bench_copy(struct request *req, const void *args, void *spec, int *device,
			   struct gpuq_error *err)
{
	const struct bench_copy_args *a = args;
	struct bench_copy_spec *s = spec;
	(void)req;
	(void)err;
	memcpy(s->sizes, a->sizes, sizeof s->sizes);
	s->nsizes = a->nsizes;
	s->repeats = (unsigned)a->repeats;
	*device = a->device;
	return 0;
}

static const struct spec_job bench_copy_job = {
	.kind = &kind_bench_copy,
	.work_kind = WORK_BENCH_COPY,
	.spec_size = sizeof(struct bench_copy_spec),
	.what = "a benchmark",
	.fill = fill_bench_copy,
	.release = release_bench_copy,
};

void op_bench_copy(struct request *req, void *args)
{
	spec_job_submit(req, &bench_copy_job, args);
}
