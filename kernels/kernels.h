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
 * Fills dst as kernels/hash.h defines: for BYTES/U8/I32/I64, byte j is byte
 * (j % 8) of gpuq_random_word(seed, j / 8); for floats, element i is
 * gpuq_uniform_*(gpuq_random_word(seed, i)).
 */
cudaError_t kernels_fill_random(void *dst, size_t bytes, enum kernels_dtype dtype,
				uint64_t seed, cudaStream_t stream);

/*
 * Adds the checksum terms of src[0..bytes) (see kernels/hash.h) into *d_sum,
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
 * wire and their argument counts are this one list; workers/chain.c and the
 * daemon's validation read it, so host and device number them alike.
 * Float element types only (f16, bf16, f32, f64): f16 and bf16 compute in
 * float, and every op rounds its result to the element type, so a chain run
 * as one kernel per op and as one fused kernel gives the same bits. Math is
 * IEEE-accurate (no fast-math); add, sub, mul, div and fma never contract.
 */
#define KERNELS_CHAIN_OPS(X)                                                   \
	X(SIN, "sin", 0)                                                       \
	X(COS, "cos", 0)                                                       \
	X(TAN, "tan", 0)                                                       \
	X(EXP, "exp", 0)                                                       \
	X(LOG, "log", 0)                                                       \
	X(LOG2, "log2", 0)                                                     \
	X(SQRT, "sqrt", 0)                                                     \
	X(RSQRT, "rsqrt", 0)                                                   \
	X(ABS, "abs", 0)                                                       \
	X(NEG, "neg", 0)                                                       \
	X(RELU, "relu", 0)                                                     \
	X(SIGMOID, "sigmoid", 0)                                               \
	X(TANH, "tanh", 0)                                                     \
	X(FLOOR, "floor", 0)                                                   \
	X(CEIL, "ceil", 0)                                                     \
	X(ROUND, "round", 0)                                                   \
	X(ADD, "add", 1)                                                       \
	X(SUB, "sub", 1)                                                       \
	X(MUL, "mul", 1)                                                       \
	X(DIV, "div", 1)                                                       \
	X(POW, "pow", 1)                                                       \
	X(MIN, "min", 1)                                                       \
	X(MAX, "max", 1)                                                       \
	X(CLAMP, "clamp", 2)                                                   \
	X(FMA, "fma", 2)

enum kernels_chain_kind {
#define KERNELS_CHAIN_ENUM(name, str, nargs) KERNELS_CHAIN_##name,
	KERNELS_CHAIN_OPS(KERNELS_CHAIN_ENUM)
#undef KERNELS_CHAIN_ENUM
	KERNELS_CHAIN_KINDS
};

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

#ifdef __cplusplus
}
#endif

#endif
