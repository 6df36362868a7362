/*
 * The C face of gpuq's CUDA kernels. Every __global__ function is static in
 * its kernels/NAME.cu file; host code calls these launchers, which enqueue work
 * on the given stream, check the launch (cudaGetLastError) and return its
 * error. Nothing here synchronises unless it says so.
 */
#ifndef GPUQ_KERNELS_H
#define GPUQ_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types, numbered as enum gpuq_dtype in protocol/protocol.h. */
enum kernels_dtype {
	KERNELS_BYTES = 0,
	KERNELS_U8 = 1,
	KERNELS_I32 = 2,
	KERNELS_I64 = 3,
	KERNELS_F16 = 4,
	KERNELS_BF16 = 5,
	KERNELS_F32 = 6,
	KERNELS_F64 = 7,
};

/*
 * Fills bytes at dst with a pattern of elem_size bytes (1, 2, 4 or 8; the
 * low elem_size bytes of pattern, little-endian) repeated. bytes must be a
 * multiple of elem_size and dst aligned to it.
 */
cudaError_t kernels_fill_pattern(void *dst, size_t bytes, uint64_t pattern,
				 unsigned elem_size, cudaStream_t stream);

/* Element i of dst (count elements of dtype) becomes i, converted to dtype. */
cudaError_t kernels_fill_iota(void *dst, size_t count, enum kernels_dtype dtype,
			      cudaStream_t stream);

/*
 * Fills dst as protocol/hash.h defines: for BYTES/U8/I32/I64, byte j is byte
 * (j % 8) of gpuq_random_word(seed, j / 8); for floats, element i is
 * gpuq_uniform_*(gpuq_random_word(seed, i)).
 */
cudaError_t kernels_fill_random(void *dst, size_t bytes, enum kernels_dtype dtype,
				uint64_t seed, cudaStream_t stream);

/*
 * Adds the checksum terms of src[0..bytes) (see protocol/hash.h) into *d_sum,
 * a device word the launcher zeroes first on the same stream. The caller
 * copies it back and applies gpuq_checksum_finish(sum, bytes).
 * src may have any alignment.
 */
cudaError_t kernels_checksum_sum(const void *src, size_t bytes,
				 unsigned long long *d_sum, cudaStream_t stream);

/*
 * The SM copy (kernels/copy.cu): dst[0, bytes) = src[0, bytes) on the current
 * device, by a persistent grid streaming through shared memory with cp.async.
 * Any alignment of either pointer and any length; the ranges must not overlap.
 */
cudaError_t kernels_copy(void *dst, const void *src, size_t bytes, cudaStream_t stream);

/*
 * ---- Elementwise chains (kernels/chain.cu) ----
 *
 * A chain op maps each element x to f(x, a, b). The ops, their names on the
 * wire and their argument counts are one list (kernels/chain_abi.h, which
 * NVRTC reads too); workers/chain/chain.c and the daemon's validation read it, so
 * host and device number them alike.
 * Float element types only (f16, bf16, f32, f64): f16 and bf16 compute in
 * float, and every op rounds its result to the element type, so a chain run
 * as one kernel per op and as one fused kernel gives the same bits. Math is
 * IEEE-accurate (no fast-math); add, sub, mul, div and fma never contract.
 */
#include "kernels/chain_abi.h" /* the op list: KERNELS_CHAIN_OPS, enum kernels_chain_kind */

/* The most ops one chain (and one fused kernel's parameters) holds. */
#define KERNELS_CHAIN_MAX_OPS 64

/* One op: kind and its constants (a: add sub mul div pow min max, clamp's LO, fma's A; b: clamp's HI, fma's B). */
struct kernels_chain_op {
	uint32_t kind; /* enum kernels_chain_kind */
	double a, b;   /* rounded to float for f16, bf16 and f32 */
};

/*
 * Loads every chain kernel on the current device and works out its launch
 * geometry, so that no kernel is first loaded during a stream capture and
 * no occupancy query runs in one. Call once per device, before capturing.
 */
cudaError_t kernels_chain_prepare(void);

/*
 * out[i] = op(in[i]) for i < count elements of dtype (a float type). in may
 * equal out (in place); both must be 16-byte aligned.
 */
cudaError_t kernels_chain_op(const void *in, void *out, size_t count, enum kernels_dtype dtype,
			     const struct kernels_chain_op *op, cudaStream_t stream);

/*
 * One kernel that applies ops[0..nops) in order, the whole list repeat
 * times, to each element in registers: out[i] = chain^repeat(in[i]). The op
 * list travels as the kernel's parameters. in may equal out; both 16-byte
 * aligned; 1 <= nops <= KERNELS_CHAIN_MAX_OPS.
 */
cudaError_t kernels_chain_fused(const void *in, void *out, size_t count, enum kernels_dtype dtype,
				const struct kernels_chain_op *ops, unsigned nops, uint64_t repeat,
				cudaStream_t stream);

/*
 * ---- Expression programs (kernels/chain_expr.cu) ----
 *
 * The interpreting kernels of kernels/chain_abi.h's programs: what runs
 * when no kernel compiled for the program can be had (workers/chain/chain_jit.h).
 * Every buffer of x 16-byte aligned; x is copied into the launch.
 */

/* Loads the expression kernels and works out their geometry, before any capture (as kernels_chain_prepare). */
cudaError_t kernels_expr_prepare(void);

/* The elementwise program x over x->count elements (x->repeat times per element). */
cudaError_t kernels_expr_run(const struct kernels_expr *x, cudaStream_t stream);

/*
 * Blocks of an elementwise expression kernel over count elements: one pair
 * of items per thread of KERNELS_REDUCE_THREADS (kernels/chain_ops.cuh's
 * gq_elementwise), at most KERNELS_MAX_GRID; the kernel loops beyond.
 */
#define KERNELS_MAX_GRID (1u << 30)
static inline unsigned kernels_elementwise_blocks(uint64_t count)
{
	uint64_t span = 2 * KERNELS_REDUCE_THREADS;
	uint64_t need = (count / KERNELS_EXPR_ITEM + span - 1) / span;
	return need < 1 ? 1 : need > KERNELS_MAX_GRID ? KERNELS_MAX_GRID : (unsigned)need;
}

/* Tiles of a reduction of count elements (kernels/chain_abi.h). */
static inline uint64_t kernels_reduce_tiles(uint64_t count)
{
	return (count + KERNELS_REDUCE_TILE - 1) / KERNELS_REDUCE_TILE;
}

/*
 * Blocks of a reduction's persistent tile kernel for ntiles tiles, given
 * `wave` blocks resident at once: at most one wave, and as few as give
 * every block the same number of tiles as the busiest one, so that no
 * block runs a tile alone at the end (16384 tiles on a wave of 1056: 1024
 * blocks of 16 tiles, not 1056 of 15 or 16).
 */
static inline uint64_t kernels_reduce_blocks(uint64_t ntiles, uint64_t wave)
{
	if (ntiles == 0)
		return 0;
	uint64_t per_block = (ntiles + (wave ? wave : 1) - 1) / (wave ? wave : 1);
	return (ntiles + per_block - 1) / per_block;
}

/* The reduction program x's tiles: tiles[t] for each of kernels_reduce_tiles(x->count). */
cudaError_t kernels_expr_reduce(const struct kernels_expr *x, struct kernels_partial *tiles,
				cudaStream_t stream);

/*
 * The tiles' results folded into *out in the fixed order, for compiled and
 * interpreted tiles alike; with no tiles, *out is the reduction's identity.
 */
cudaError_t kernels_reduce_combine(unsigned kind, const struct kernels_partial *tiles,
				   uint64_t ntiles, struct kernels_partial *out, cudaStream_t stream);

/*
 * Reads bytes at src (16-byte aligned; a multiple of 16 is read) and does
 * nothing with them that costs bandwidth: the reductions' ceiling. *sink is
 * a device word it may write.
 */
cudaError_t kernels_read(const void *src, size_t bytes, unsigned long long *sink,
			 cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
