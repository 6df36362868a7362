/*
 * The scheduler benchmark's ceiling (bench_sched): what the device's
 * engines do with a host-to-device copy, a device-to-host copy and a
 * bandwidth-bound kernel chain, each alone and all three at once on three
 * streams, with nothing of gpuq's in the way. `gpuq bench sched` measures
 * gpuqd's jobs against it in the same run. Worker thread only; the job runs
 * alone on its device (sched_queue.c: benchmarks are exclusive).
 */
#ifndef GPUQ_SCHED_BENCH_H
#define GPUQ_SCHED_BENCH_H

#include <stdint.h>

#include "workers/backend/backend.h"
#include "workers/work.h"

#define SCHED_BENCH_MAX_REPS 20

/* What each part of the run measured: medians of `reps` timed runs, in seconds. */
enum sched_bench_part { SCHED_BENCH_H2D, SCHED_BENCH_D2H, SCHED_BENCH_KERNEL, SCHED_BENCH_PARTS };

struct sched_bench {
	/* Inputs: the main thread's until submission. */
	uint64_t bytes; /* of each copy, and of the chain's f32 buffer */
	unsigned reps;
	/* Outputs. */
	double alone_s[SCHED_BENCH_PARTS];
	double together_s;
};

int sched_bench_run(struct device *dev, struct work *work);

#endif
