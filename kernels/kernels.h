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

#ifdef __cplusplus
}
#endif

#endif
