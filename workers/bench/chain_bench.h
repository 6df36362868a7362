/*
 * The chain benchmark (`gpuq bench chain`), run as one job on a device's
 * worker so that it measures chains as the daemon runs them, with every
 * baseline in the same run:
 *
 *   launch-bound: launch_count f32 elements, chains of 1, 5 and 20 ops,
 *     launch_repeat passes: eager (kernels launched one by one) against
 *     graph (the same kernels replayed from one CUDA graph);
 *   bandwidth-bound: `bytes` of f32 and the chain
 *     sin | add 1 | sqrt | mul 2 | sub 3: each op's kernel alone, the chain
 *     eager, graph, fused with the interpreted kernel and fused with its
 *     compiled kernel (whose output must equal the interpreted one's, bit
 *     for bit: compared by checksum), and cudaMemcpy device to device;
 *   expressions: y = a * x + y over `bytes` of f32 (a one-element buffer):
 *     three streams of memory against the copy's two;
 *   reductions: sum(x) and norm2(x) over `bytes` of f32 against a kernel
 *     that only reads them (the compiled sum must equal the interpreted
 *     one, bit for bit);
 *   compile costs: the 5-op chain's kernel compiled by NVRTC, read back
 *     from the disk cache and loaded (as a new daemon would), and found in
 *     memory; and what opening NVRTC took the first time;
 *   the cache: building a plan (capture + instantiate) against retargeting
 *     one (capture + cudaGraphExecUpdate) against finding one (a hit).
 *
 * Times are device times between events (the host clock on the host
 * backend), the median of `reps` replays after one unmeasured replay.
 * The daemon fills the inputs and owns the struct; the worker fills the
 * outputs.
 */
#ifndef GPUQ_CHAIN_BENCH_H
#define GPUQ_CHAIN_BENCH_H

#include <stdint.h>

#include "workers/backend/backend.h"
#include "workers/chain/chain_jit.h"
#include "workers/work.h"

#define CHAIN_BENCH_LAUNCH_CHAINS 3 /* chains of 1, 5 and 20 ops */
#define CHAIN_BENCH_OPS 5           /* the bandwidth chain's length */
#define CHAIN_BENCH_CACHE_ROUNDS 9  /* plans built, retargeted and hit per mode */

struct chain_bench_launch {
	unsigned nops;
	uint64_t kernels; /* in one replay: nops x launch_repeat */
	double eager_s, graph_s; /* one replay */
};

/* Plan preparation times of one mode: the medians over the rounds. */
struct chain_bench_cache {
	double instantiate_s, update_s, hit_s;
};

struct chain_bench {
	/* Inputs. */
	uint64_t bytes;         /* the bandwidth-bound buffer (f32): a multiple of 16 */
	uint64_t launch_count;  /* elements of the launch-bound buffers */
	uint64_t launch_repeat; /* passes of the launch-bound chains */
	unsigned reps;          /* timed replays of each measurement */

	/* Outputs. */
	struct chain_bench_launch launch[CHAIN_BENCH_LAUNCH_CHAINS];
	double copy_s;                /* cudaMemcpy D2D of `bytes` */
	double op_s[CHAIN_BENCH_OPS]; /* each op's kernel alone, eager */
	double eager_s, graph_s, fused_s; /* the chain, one replay; fused: the interpreted kernel */
	double compiled_s;                /* the chain fused, its compiled kernel */
	double axpy_s;                    /* y = a * x + y */
	double read_s, sum_s, norm2_s;    /* the read kernel; sum(x) and norm2(x) */
	double sum, norm2;                /* their results */
	/* The compiled rows ran compiled kernels (else note says why) and gave the interpreted bits. */
	bool compiled, compiled_same_bits, sum_same_bits;
	char note[320];
	struct chain_jit_costs compile;   /* when `compiled` */
	struct chain_bench_cache cache[2]; /* [0] graph mode, [1] fused */
	uint64_t cached_rerun_instantiations; /* must be 0 */
};

/* The bandwidth chain's op names, for the report. */
const char *chain_bench_op_name(unsigned i);

/* Worker thread: runs a WORK_BENCH_CHAIN (a row of workers/work_kinds.h). */
int chain_bench_run(struct device *dev, struct work *work);

#endif
