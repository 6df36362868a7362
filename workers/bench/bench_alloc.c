/*
 * bench_alloc (bench_alloc.h): for each size, the pool and then slabs,
 * each one unmeasured alloc/free pair and `repeats` timed ones, timed with
 * the clock around each call (both are synchronous: the pool's alloc and
 * every release wait for the lane), then `held` buffers at once to see the
 * device memory they take. An exclusive job: nothing else runs meanwhile.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/bench/bench_alloc.h"
#include "workers/clock.h"

/* Buffers held at once to measure what one takes: enough to see a small one's share. */
#define BENCH_ALLOC_HELD_BYTES ((uint64_t)256 << 20)
#define BENCH_ALLOC_HELD_MAX 64

static void bench_alloc_note(struct bench_alloc_spec *s, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void bench_alloc_note(struct bench_alloc_spec *s, const char *fmt, ...)
{
	va_list ap;
	if (s->nnotes == BENCH_ALLOC_MAX_NOTES)
		return;
	va_start(ap, fmt);
	vsnprintf(s->notes[s->nnotes++], sizeof s->notes[0], fmt, ap);
	va_end(ap);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The q-th quantile (0..1) of n samples, which it sorts. */
static double quantile(double *v, unsigned n, double q)
{
	qsort(v, n, sizeof *v, cmp_double);
	unsigned i = (unsigned)(q * (double)n);
	return v[i < n ? i : n - 1];
}

/* One alloc/free pair from `from`, each call timed (seconds). */
static int bench_alloc_pair(struct device *dev, enum buffer_memory from, uint64_t bytes,
			    double *alloc_s, double *free_s, struct gpuq_error *err)
{
	void *p = NULL;
	double t0 = monotonic_seconds();
	if (dev->ops->mem.alloc_from(dev, from, bytes, &p, err) != 0)
		return -1;
	double t1 = monotonic_seconds();
	int rc = dev->ops->mem.release(dev, p, err);
	double t2 = monotonic_seconds();
	*alloc_s = t1 - t0;
	*free_s = t2 - t1;
	return rc;
}

/* The device memory `held` buffers of bytes take together, from the device's free memory. */
static int bench_alloc_held(struct device *dev, enum buffer_memory from, struct bench_alloc_row *row,
			    struct gpuq_error *err)
{
	void *held[BENCH_ALLOC_HELD_MAX];
	uint64_t n = BENCH_ALLOC_HELD_BYTES / row->bytes;
	unsigned k = 0;
	int rc = -1;
	n = n < 1 ? 1 : n > BENCH_ALLOC_HELD_MAX ? BENCH_ALLOC_HELD_MAX : n;
	if (dev->ops->device.refresh_info(dev, err) != 0)
		return -1;
	uint64_t before = dev->info.mem_free;
	for (; k < n; k++)
		if (dev->ops->mem.alloc_from(dev, from, row->bytes, &held[k], err) != 0)
			goto out;
	if (dev->ops->device.refresh_info(dev, err) != 0)
		goto out;
	row->held = k;
	row->held_bytes = before > dev->info.mem_free ? (before - dev->info.mem_free) / k : 0;
	rc = 0;
out:
	while (k-- > 0) {
		struct gpuq_error ignored;
		dev->ops->mem.release(dev, held[k], &ignored);
	}
	return rc;
}

/* One row: warm-up, repeats timed pairs, then what a buffer holds. */
static int bench_alloc_row(struct device *dev, struct bench_alloc_spec *s, enum buffer_memory from,
			   uint64_t bytes, double *a, double *f, struct gpuq_error *err)
{
	struct bench_alloc_row *row = &s->rows[s->nrows];
	double ignored_a, ignored_f;
	memset(row, 0, sizeof *row);
	row->bytes = bytes;
	row->memory = from == BUFFER_MEMORY_POOL ? "pool" : "vmm";
	if (bench_alloc_pair(dev, from, bytes, &ignored_a, &ignored_f, err) != 0)
		return -1;
	for (unsigned i = 0; i < s->repeats; i++)
		if (bench_alloc_pair(dev, from, bytes, &a[i], &f[i], err) != 0)
			return -1;
	row->alloc_p50_us = quantile(a, s->repeats, 0.5) * 1e6;
	row->alloc_p99_us = quantile(a, s->repeats, 0.99) * 1e6;
	row->free_p50_us = quantile(f, s->repeats, 0.5) * 1e6;
	row->free_p99_us = quantile(f, s->repeats, 0.99) * 1e6;
	if (bench_alloc_held(dev, from, row, err) != 0)
		return -1;
	s->nrows++;
	return 0;
}

int bench_alloc_run(struct device *dev, struct work *work)
{
	static const enum buffer_memory memories[] = { BUFFER_MEMORY_POOL, BUFFER_MEMORY_VMM };
	struct bench_alloc_spec *s = work->spec;
	double *a = calloc(s->repeats, sizeof *a), *f = calloc(s->repeats, sizeof *f);
	s->memory = dev->info.buffer_memory;
	if (!a || !f) {
		free(a);
		free(f);
		return gpuq_fail(&work->error, GPUQ_E_OUT_OF_MEMORY,
				 "bench_alloc: no host memory for %u samples", s->repeats);
	}
	for (unsigned i = 0; i < s->nsizes && !atomic_load(&work->cancel); i++) {
		for (unsigned m = 0; m < 2; m++) {
			struct gpuq_error err;
			gpuq_error_clear(&err);
			if (bench_alloc_row(dev, s, memories[m], s->sizes[i], a, f, &err) == 0)
				continue;
			if (dev->faulted) { /* nothing more can run on this device */
				work->error = err;
				free(a);
				free(f);
				return -1;
			}
			bench_alloc_note(s, "%llu bytes from %s skipped: %s",
					 (unsigned long long)s->sizes[i], m ? "slabs" : "the pool",
					 err.message);
		}
	}
	free(a);
	free(f);
	if (atomic_load(&work->cancel))
		return gpuq_fail(&work->error, GPUQ_E_CANCELLED, "bench_alloc cancelled");
	work->result.bytes = 0;
	return 0;
}
