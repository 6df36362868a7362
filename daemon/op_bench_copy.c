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

static int read_bench_copy(struct request *req, struct bench_copy_spec *s, int *device,
			   struct gpuq_error *err)
{
	uint64_t d = 0, repeats = DEFAULT_REPEATS;
	if (msg_get_u64(req->map, "device", &d, err) < 0 ||
	    msg_get_u64(req->map, "repeats", &repeats, err) < 0 ||
	    read_bench_sizes(req, s->sizes, BENCH_COPY_MAX_SIZES, &s->nsizes, err) < 0)
		return -1;
	if (d >= (uint64_t)req->d->pool.count)
		return gpuq_fail(err, GPUQ_E_NOT_FOUND, "device %llu does not exist (devices: 0-%d)",
				 (unsigned long long)d, req->d->pool.count - 1);
	if (repeats < 1 || repeats > MAX_REPEATS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'repeats': %llu is not 1 to %d",
				 (unsigned long long)repeats, MAX_REPEATS);
	s->repeats = (unsigned)repeats;
	*device = (int)d;
	return 0;
}

void op_bench_copy(struct request *req)
{
	struct gpuq_error err;
	int device = 0;
	struct bench_copy_spec *spec = calloc(1, sizeof *spec);
	if (!spec) {
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for a benchmark");
		reply_error(req, &err);
		return;
	}
	if (read_bench_copy(req, spec, &device, &err) < 0) {
		free(spec);
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, &kind_bench_copy, WORK_BENCH_COPY, device);
	if (!job) {
		free(spec);
		return;
	}
	job->work.spec = spec;
	job->release = release_bench_copy;
	job_submit(req, job);
}
