/*
 * bench_alloc: alloc and free latency on one device, from the pool and
 * from slabs in the same run (docs/protocol.md, `bench_alloc`), and the
 * device memory a buffer of each size takes from each. Worker thread only;
 * the daemon owns the spec (work.spec) and reads its rows once the work
 * comes back.
 */
#ifndef GPUQ_BENCH_ALLOC_H
#define GPUQ_BENCH_ALLOC_H

#include <stdint.h>

#include "workers/backend/backend.h"
#include "workers/work.h"

#define BENCH_ALLOC_MAX_SIZES 8
#define BENCH_ALLOC_MAX_ROWS (2 * BENCH_ALLOC_MAX_SIZES)
#define BENCH_ALLOC_MAX_NOTES 16

struct bench_alloc_row {
	uint64_t bytes;
	const char *memory; /* "pool" or "vmm" (static) */
	double alloc_p50_us, alloc_p99_us, free_p50_us, free_p99_us;
	/*
	 * Device memory one buffer took: the drop of the device's free memory
	 * while `held` buffers of this size were allocated at once, divided by
	 * held (pool chunks and carved slabs are shared, so small sizes show
	 * their share, and 0 when a kept slab or cached chunk served them).
	 */
	uint64_t held_bytes;
	unsigned held;
};

struct bench_alloc_spec {
	/* Inputs, from the request. */
	uint64_t sizes[BENCH_ALLOC_MAX_SIZES];
	unsigned nsizes;
	unsigned repeats; /* timed alloc/free pairs per size and memory, after one warm-up */
	/* Outputs. */
	struct bench_alloc_row rows[BENCH_ALLOC_MAX_ROWS];
	unsigned nrows;
	char notes[BENCH_ALLOC_MAX_NOTES][200];
	unsigned nnotes;
	const char *memory; /* what the device's buffers come from ("vmm" or "pool") */
};

/* Runs the benchmark described by work->spec. 0, or -1 with work->error. */
int bench_alloc_run(struct device *dev, struct work *work);

#endif
