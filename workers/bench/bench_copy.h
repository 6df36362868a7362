/*
 * bench_copy: the host<->device paths measured on one device, in one run, so
 * that every ratio compares numbers taken together (docs/protocol.md,
 * `bench_copy`). Worker thread only; the daemon owns the spec (work.spec)
 * and reads its rows once the work comes back.
 */
#ifndef GPUQ_BENCH_COPY_H
#define GPUQ_BENCH_COPY_H

#include <stdbool.h>
#include <stdint.h>

#include "workers/bench/bench_row.h"
#include "workers/backend/backend.h"
#include "workers/work.h"

#define BENCH_COPY_MAX_SIZES 8
/* every method of both directions at every size (bench_copy.c: at most 32 methods a direction) */
#define BENCH_COPY_MAX_ROWS (BENCH_COPY_MAX_SIZES * 64)
#define BENCH_COPY_MAX_NOTES 32

struct bench_copy_spec {
	/* Inputs, from the request. */
	uint64_t sizes[BENCH_COPY_MAX_SIZES];
	unsigned nsizes;
	unsigned repeats; /* timed repeats per measurement, after one warm-up */
	/* Outputs. */
	struct bench_row rows[BENCH_COPY_MAX_ROWS];
	unsigned nrows;
	char notes[BENCH_COPY_MAX_NOTES][200]; /* what was skipped, and why */
	unsigned nnotes;
	/*
	 * Per size, what a region costs: pinning it once (mmap, place,
	 * populate, cudaHostRegister portable) and the transfer size from which
	 * pinning plus one region copy beats one copy of the staged memfd path
	 * (0: the region is not faster, never).
	 */
	struct bench_copy_pin {
		uint64_t bytes;
		double pin_s;
		double break_even[2]; /* H2D, D2H: bytes */
	} pins[BENCH_COPY_MAX_SIZES];
	unsigned npins;
	unsigned copy_threads; /* the settings measured */
	uint64_t slot_bytes;
	unsigned slots;
};

/* Runs the benchmark described by work->spec. 0, or -1 with work->error. */
int bench_copy_run(struct device *dev, struct work *work);

#endif
