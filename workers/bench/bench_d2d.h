/*
 * bench_d2d: device-to-device copy throughput, measured by a job on the
 * workers (so that operators can run it on a live server), each gpuq path
 * beside its raw ceiling in the same run:
 *
 *   D2D (one device):   cudaMemcpyAsync, one call        (the ceiling)
 *                        gpuq CE, gpuq SM                  (copy_same, as copy jobs run it)
 *   peer I->J (pairs):  cudaMemcpyPeerAsync, one call     (the ceiling)
 *                        gpuq peer path                    (where peer access exists)
 *                        gpuq host-staged                  (always)
 *
 * Method: fresh random data in the source; the destination poisoned before
 * each method; one unmeasured warm-up run, then `repeats` runs timed with
 * events on the destination's stream (from before the copy to right after
 * its last chunk), median taken; the destination's checksum compared with
 * the source's after each method. On the host backend the same code runs
 * with memcpy and host clocks, and says so in the method names.
 *
 * With peer pairs the job is a gang over every device: the part on
 * `device` measures D2D while the others wait; then each pair's two parts
 * measure it while the rest wait at the next pair. Worker threads only,
 * but for the spec, which the main thread fills in (daemon/op_bench_d2d.c).
 */
#ifndef GPUQ_BENCH_D2D_H
#define GPUQ_BENCH_D2D_H

#include <stdbool.h>
#include <stdint.h>

#include "workers/bench/bench_row.h"
#include "workers/copy/copy.h"
#include "workers/copy/peer_sync.h"
#include "workers/work.h"

#define BENCH_D2D_MAX_SIZES 8
#define BENCH_D2D_MAX_PAIRS 64
#define BENCH_D2D_MAX_ROWS 512
#define BENCH_D2D_MAX_REPEATS 100
#define BENCH_D2D_MAX_NOTES 8

/* The row form of bench_copy (workers/bench/bench_copy.h), so that one table shows both. */
struct bench_d2d_pair {
	int src, dst;          /* part indexes (= device indexes: parts are every device) */
	bool direct;           /* peer access: the gpuq peer row runs */
	const char *path;      /* the peer route's name ("nvlink", ..., "host-memcpy") */
};

struct bench_d2d {
	/* Inputs (main thread, before submission). */
	int device; /* where the D2D rows run */
	uint64_t sizes[BENCH_D2D_MAX_SIZES];
	unsigned nsizes, repeats;
	uint64_t seed;
	bool host; /* the host backend: memcpy and host clocks */
	struct bench_d2d_pair pairs[BENCH_D2D_MAX_PAIRS];
	unsigned npairs;
	unsigned timeout_ms;

	/* Between the parts (a gang's; a single part uses none of it). */
	struct peer_sync sync;   /* every part; the lock also guards what follows */
	unsigned pair_arrived, pair_generation; /* the two-part barrier of a pair */
	struct copy_spec pair;   /* the pair's current gpuq copy, made anew for each run */
	void *pair_src, *pair_dst; /* the pair's buffers */
	uint64_t pair_sum;       /* and its checksum */

	/* Output, in order. */
	struct bench_row rows[BENCH_D2D_MAX_ROWS];
	unsigned nrows;
	char notes[BENCH_D2D_MAX_NOTES][200]; /* what was left out or is unknown, and why */
	unsigned nnotes;
};

/* Gangs: sets up the shared state (parts: the gang's works, one per device). */
int bench_d2d_init_gang(struct bench_d2d *b, struct work *const *parts, int nparts);
void bench_d2d_destroy(struct bench_d2d *b);

/* WORK_BENCH_D2D (a row of workers/work_kinds.h): runs work's part of the benchmark in work->spec. */
int bench_d2d_run(struct device *dev, struct work *work);

#endif
