/*
 * The checksum kernel: the sum, modulo 2^64, of gpuq_checksum_term(w_i, i)
 * over the 8-byte little-endian words w_i of a buffer (protocol/hash.h).
 *
 * Terms can be added in any order, so each thread sums its words in a
 * grid-stride loop, a warp folds its 32 partial sums with shuffles, and one
 * lane adds the warp's total into *d_sum with an atomic.
 *
 * When src is 16-aligned each thread loads 16 bytes (two words) at a time.
 * Otherwise words are read with aligned 8-byte loads and a funnel shift where
 * both loads lie inside the buffer, and byte by byte at the edges, so nothing
 * outside [src, src + bytes) is ever read. The last word is zero-padded.
 */
#include "kernels/kernels.h"

#include "kernels/grid.cuh"
#include "protocol/hash.h"

static const unsigned kThreads = 256;
static const unsigned kBlocksPerSm = 8;


/* Word i of src[0, bytes), zero-padded past the end; any alignment. */
static __device__ uint64_t checksum_load_word(const uint8_t *src, size_t bytes, size_t i)
{
	size_t off = i * 8;
	const uint8_t *p = src + off;
	unsigned s = (unsigned)((uintptr_t)p & 7u); /* the same for every word */
	if (s == 0 && bytes - off >= 8)
		return *reinterpret_cast<const uint64_t *>(p);
	if (s != 0 && off >= s && bytes - (off - s) >= 16) {
		const uint64_t *a = reinterpret_cast<const uint64_t *>(p - s);
		return (a[0] >> (8 * s)) | (a[1] << (64 - 8 * s));
	}
	size_t left = bytes - off;
	unsigned n = left < 8 ? (unsigned)left : 8u;
	uint64_t w = 0;
	for (unsigned k = 0; k < n; k++)
		w |= (uint64_t)p[k] << (8 * k);
	return w;
}

/* Folds the warp's partial sums and adds them to *sum: every lane must call it. */
static __device__ void checksum_warp_add(unsigned long long v, unsigned long long *sum)
{
	for (int delta = 16; delta > 0; delta /= 2)
		v += __shfl_down_sync(0xFFFFFFFFu, v, delta);
	if ((threadIdx.x & 31u) == 0 && v != 0)
		atomicAdd(sum, v);
}

/* src 16-aligned: chunk c holds words 2c and 2c + 1; up to two words remain. */
static __global__ void checksum_aligned_kernel(const uint8_t *src, size_t bytes,
					       unsigned long long *sum)
{
	const ulonglong2 *chunks = reinterpret_cast<const ulonglong2 *>(src);
	size_t n = bytes / 16;
	size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	unsigned long long acc = 0;
	for (size_t c = tid; c < n; c += stride) {
		ulonglong2 v = chunks[c];
		acc += gpuq_checksum_term(v.x, 2 * c) + gpuq_checksum_term(v.y, 2 * c + 1);
	}
	size_t words = (bytes + 7) / 8;
	if (tid < words - 2 * n) {
		size_t i = 2 * n + tid;
		acc += gpuq_checksum_term(checksum_load_word(src, bytes, i), i);
	}
	checksum_warp_add(acc, sum);
}

/* Any alignment: one word per step. */
static __global__ void checksum_any_kernel(const uint8_t *src, size_t bytes,
					   unsigned long long *sum)
{
	size_t words = (bytes + 7) / 8;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	unsigned long long acc = 0;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
		acc += gpuq_checksum_term(checksum_load_word(src, bytes, i), i);
	checksum_warp_add(acc, sum);
}

extern "C" cudaError_t kernels_checksum_sum(const void *src, size_t bytes,
					    unsigned long long *d_sum, cudaStream_t stream)
{
	cudaError_t e = cudaMemsetAsync(d_sum, 0, sizeof(*d_sum), stream);
	if (e != cudaSuccess || bytes == 0)
		return e;
	const uint8_t *p = static_cast<const uint8_t *>(src);
	bool aligned = ((uintptr_t)p & 15u) == 0;
	unsigned blocks;
	e = grid_blocks(aligned ? bytes / 16 : (bytes + 7) / 8, kThreads, kBlocksPerSm, &blocks);
	if (e != cudaSuccess)
		return e;
	if (aligned)
		checksum_aligned_kernel<<<blocks, kThreads, 0, stream>>>(p, bytes, d_sum);
	else
		checksum_any_kernel<<<blocks, kThreads, 0, stream>>>(p, bytes, d_sum);
	return cudaGetLastError();
}
