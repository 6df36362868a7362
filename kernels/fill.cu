/*
 * Fill kernels: a repeated pattern, iota and the seeded random stream of
 * protocol/hash.h.
 *
 * All of them are bound by memory bandwidth, so each thread writes 16 bytes
 * with one aligned store and the grid (a few blocks per SM) strides over the
 * buffer. The bytes before the first 16-byte boundary (the head) and after the
 * last one (the tail), fewer than 16 each, are written one element at a time
 * by the first threads of the grid, so any length and, for byte types, any
 * dst alignment work.
 *
 * Two shapes of kernel:
 *  - byte streams (pattern, random for bytes/u8/i32/i64): byte j of dst is
 *    byte j % 8 of a 64-bit word W(j / 8). A 16-byte chunk that does not start
 *    on a word boundary of the stream is a funnel shift of three words.
 *  - element streams (iota, random for floats): element i is f(i), 16 / size
 *    elements per store; dst must be aligned to the element size.
 */
#include "kernels/kernels.h"

#include "kernels/grid.cuh"
#include "protocol/hash.h"

static const unsigned kThreads = 256;
/* Blocks per SM: enough resident warps to keep many stores in flight. */
static const unsigned kBlocksPerSm = 8;


/* Bytes from p to the next 16-byte boundary (0 when aligned), at most n. */
static size_t head_bytes(const void *p, size_t n)
{
	size_t h = (16u - ((uintptr_t)p & 15u)) & 15u;
	return h < n ? h : n;
}

static __device__ size_t global_thread(void)
{
	return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

static __device__ size_t grid_threads(void)
{
	return (size_t)gridDim.x * blockDim.x;
}

/* Word generators for byte streams. */
struct pattern_words {
	uint64_t w;
	__device__ uint64_t operator()(uint64_t) const { return w; }
};

struct random_words {
	uint64_t seed;
	__device__ uint64_t operator()(uint64_t k) const { return gpuq_random_word(seed, k); }
};

/* Byte j of the stream whose word k is gen(k). */
template <class Gen>
static __device__ uint8_t stream_byte(const Gen &gen, size_t j)
{
	return (uint8_t)(gen(j / 8) >> (8 * (j % 8)));
}

/*
 * Writes bytes [0, n) of the stream to dst. head = head_bytes(dst, n): the
 * chunks in between start 16-aligned in memory, at stream offset
 * head + 16 * c, so all of them share the shift head % 8.
 */
template <class Gen>
static __global__ void fill_stream_kernel(uint8_t *dst, size_t n, size_t head, Gen gen)
{
	size_t tid = global_thread();
	size_t chunks = (n - head) / 16;
	size_t tail = head + chunks * 16;
	if (tid < head)
		dst[tid] = stream_byte(gen, tid);
	if (tid < n - tail)
		dst[tail + tid] = stream_byte(gen, tail + tid);

	unsigned shift = (unsigned)(head % 8) * 8;
	for (size_t c = tid; c < chunks; c += grid_threads()) {
		size_t k = head / 8 + 2 * c;
		uint64_t w0 = gen(k), w1 = gen(k + 1), lo, hi;
		if (shift == 0) {
			lo = w0;
			hi = w1;
		} else {
			uint64_t w2 = gen(k + 2);
			lo = (w0 >> shift) | (w1 << (64 - shift));
			hi = (w1 >> shift) | (w2 << (64 - shift));
		}
		/* Little-endian: lo holds the lower 8 addresses. */
		*reinterpret_cast<ulonglong2 *>(dst + head + 16 * c) = make_ulonglong2(lo, hi);
	}
}

/* Element generators: the bits of element i, as T. */
struct iota_u8 {
	__device__ uint8_t operator()(size_t i) const { return (uint8_t)i; }
};
struct iota_u32 {
	__device__ uint32_t operator()(size_t i) const { return (uint32_t)i; }
};
struct iota_u64 {
	__device__ uint64_t operator()(size_t i) const { return (uint64_t)i; }
};
/* f16/bf16 go through (float)i, as the host backend does, so the bits agree. */
struct iota_f16 {
	__device__ uint16_t operator()(size_t i) const { return gpuq_f32_to_f16_bits((float)i); }
};
struct iota_bf16 {
	__device__ uint16_t operator()(size_t i) const { return gpuq_f32_to_bf16_bits((float)i); }
};
struct iota_f32 {
	__device__ uint32_t operator()(size_t i) const { return __float_as_uint((float)i); }
};
struct iota_f64 {
	__device__ uint64_t operator()(size_t i) const
	{
		return (uint64_t)__double_as_longlong((double)i);
	}
};

struct random_f16 {
	uint64_t seed;
	__device__ uint16_t operator()(size_t i) const
	{
		return gpuq_uniform_f16_bits(gpuq_random_word(seed, i));
	}
};
struct random_bf16 {
	uint64_t seed;
	__device__ uint16_t operator()(size_t i) const
	{
		return gpuq_uniform_bf16_bits(gpuq_random_word(seed, i));
	}
};
struct random_f32 {
	uint64_t seed;
	__device__ uint32_t operator()(size_t i) const
	{
		return __float_as_uint(gpuq_uniform_f32(gpuq_random_word(seed, i)));
	}
};
struct random_f64 {
	uint64_t seed;
	__device__ uint64_t operator()(size_t i) const
	{
		return (uint64_t)__double_as_longlong(gpuq_uniform_f64(gpuq_random_word(seed, i)));
	}
};

/*
 * Writes elements [0, count) of gen to dst (aligned to sizeof(T)). The first
 * head elements reach the 16-byte boundary; then chunks of 16 / sizeof(T).
 */
template <class T, class Gen>
static __global__ void fill_elems_kernel(T *dst, size_t count, size_t head, Gen gen)
{
	const size_t per = 16 / sizeof(T);
	size_t tid = global_thread();
	size_t chunks = (count - head) / per;
	size_t tail = head + chunks * per;
	if (tid < head)
		dst[tid] = gen(tid);
	if (tid < count - tail)
		dst[tail + tid] = gen(tail + tid);

	for (size_t c = tid; c < chunks; c += grid_threads()) {
		size_t first = head + c * per;
		union {
			T e[16 / sizeof(T)];
			uint4 v;
		} u;
#pragma unroll
		for (size_t k = 0; k < per; k++)
			u.e[k] = gen(first + k);
		*reinterpret_cast<uint4 *>(dst + first) = u.v;
	}
}

template <class Gen>
static cudaError_t launch_stream(void *dst, size_t bytes, Gen gen, cudaStream_t stream)
{
	if (bytes == 0)
		return cudaSuccess;
	unsigned blocks;
	cudaError_t e = grid_blocks(bytes / 16, kThreads, kBlocksPerSm, &blocks);
	if (e != cudaSuccess)
		return e;
	fill_stream_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint8_t *>(dst), bytes,
							   head_bytes(dst, bytes), gen);
	return cudaGetLastError();
}

/* A misaligned dst would fault the context, so it is refused here instead. */
template <class T, class Gen>
static cudaError_t launch_elems(void *dst, size_t count, Gen gen, cudaStream_t stream)
{
	if ((uintptr_t)dst % sizeof(T) != 0)
		return cudaErrorInvalidValue;
	if (count == 0)
		return cudaSuccess;
	unsigned blocks;
	cudaError_t e = grid_blocks(count / (16 / sizeof(T)), kThreads, kBlocksPerSm, &blocks);
	if (e != cudaSuccess)
		return e;
	size_t head = head_bytes(dst, count * sizeof(T)) / sizeof(T);
	fill_elems_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T *>(dst), count, head,
							    gen);
	return cudaGetLastError();
}

/* The element size of a dtype, or 0 for a value outside the enum. */
static size_t dtype_size(enum kernels_dtype dtype)
{
	switch (dtype) {
	case KERNELS_BYTES:
	case KERNELS_U8:
		return 1;
	case KERNELS_F16:
	case KERNELS_BF16:
		return 2;
	case KERNELS_I32:
	case KERNELS_F32:
		return 4;
	case KERNELS_I64:
	case KERNELS_F64:
		return 8;
	}
	return 0;
}

extern "C" cudaError_t kernels_fill_pattern(void *dst, size_t bytes, uint64_t pattern,
					    unsigned elem_size, cudaStream_t stream)
{
	/* The element repeated across a 64-bit word: byte j % 8 of it is byte j % elem_size. */
	uint64_t w;
	switch (elem_size) {
	case 1:
		w = (pattern & 0xFFu) * 0x0101010101010101ull;
		break;
	case 2:
		w = (pattern & 0xFFFFu) * 0x0001000100010001ull;
		break;
	case 4:
		w = (pattern & 0xFFFFFFFFu) * 0x0000000100000001ull;
		break;
	case 8:
		w = pattern;
		break;
	default:
		return cudaErrorInvalidValue;
	}
	if (bytes % elem_size != 0)
		return cudaErrorInvalidValue;
	return launch_stream(dst, bytes, pattern_words{w}, stream);
}

extern "C" cudaError_t kernels_fill_iota(void *dst, size_t count, enum kernels_dtype dtype,
					 cudaStream_t stream)
{
	size_t size = dtype_size(dtype);
	if (size == 0 || count > SIZE_MAX / size)
		return cudaErrorInvalidValue;
	switch (dtype) {
	case KERNELS_BYTES:
	case KERNELS_U8:
		return launch_elems<uint8_t>(dst, count, iota_u8{}, stream);
	case KERNELS_I32:
		return launch_elems<uint32_t>(dst, count, iota_u32{}, stream);
	case KERNELS_I64:
		return launch_elems<uint64_t>(dst, count, iota_u64{}, stream);
	case KERNELS_F16:
		return launch_elems<uint16_t>(dst, count, iota_f16{}, stream);
	case KERNELS_BF16:
		return launch_elems<uint16_t>(dst, count, iota_bf16{}, stream);
	case KERNELS_F32:
		return launch_elems<uint32_t>(dst, count, iota_f32{}, stream);
	case KERNELS_F64:
		return launch_elems<uint64_t>(dst, count, iota_f64{}, stream);
	}
	return cudaErrorInvalidValue;
}

/* Float types need bytes to be whole elements; the byte-stream types take any length. */
extern "C" cudaError_t kernels_fill_random(void *dst, size_t bytes, enum kernels_dtype dtype,
					   uint64_t seed, cudaStream_t stream)
{
	size_t size = dtype_size(dtype);
	if (size == 0)
		return cudaErrorInvalidValue;
	switch (dtype) {
	case KERNELS_BYTES:
	case KERNELS_U8:
	case KERNELS_I32:
	case KERNELS_I64:
		return launch_stream(dst, bytes, random_words{seed}, stream);
	default:
		break;
	}
	if (bytes % size != 0)
		return cudaErrorInvalidValue;
	switch (dtype) {
	case KERNELS_F16:
		return launch_elems<uint16_t>(dst, bytes / 2, random_f16{seed}, stream);
	case KERNELS_BF16:
		return launch_elems<uint16_t>(dst, bytes / 2, random_bf16{seed}, stream);
	case KERNELS_F32:
		return launch_elems<uint32_t>(dst, bytes / 4, random_f32{seed}, stream);
	case KERNELS_F64:
		return launch_elems<uint64_t>(dst, bytes / 8, random_f64{seed}, stream);
	default:
		return cudaErrorInvalidValue;
	}
}
