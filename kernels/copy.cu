/*
 * The SM copy: dst[0, n) = src[0, n) within one GPU, through shared memory.
 *
 * A persistent grid (as many blocks as fit on the GPU at once) strides over
 * tiles of kTile 16-byte chunks. Each block is a producer/consumer pipeline
 * kStages deep: while it stores tile t from shared memory, the cp.async
 * copies (LDGSTS, 16 bytes each, bypassing L1) of the next kStages - 1 tiles
 * are in flight, so every SM keeps tens of kilobytes of reads outstanding.
 *
 * Alignment. Stores are always 16-byte and aligned: the body is the run of
 * whole 16-byte chunks of dst. The source of dst chunk k starts p bytes past
 * a 16-byte boundary (p the same for every chunk). When p is 0 the source
 * chunks are aligned too and a tile is copied as it is; otherwise the
 * pipeline loads the aligned source chunks around the tile (one more than
 * the tile has) and each thread assembles its output chunk from two of them
 * with funnel shifts. The few bytes before the first and after the last such
 * chunk (fewer than 32 at each end) are copied one by one, so any length and
 * any pair of alignments work, and nothing outside [src, src + n) is read or
 * outside [dst, dst + n) written. src and dst must not overlap.
 */
#include "kernels/kernels.h"

#include <cuda_pipeline_primitives.h>

#include <atomic>

static const unsigned kThreads = 256;
static const unsigned kPerThread = 2;                 /* chunks each thread stores per tile */
static const unsigned kTile = kThreads * kPerThread;  /* chunks per tile: 8 KiB */
static const unsigned kStages = 4;                    /* tiles resident per block */

/* What the launcher works out once for the whole copy. */
struct copy_plan {
	uint8_t *dst;
	const uint8_t *src;
	size_t n;
	size_t head_bytes;      /* dst[0, head_bytes) is copied byte by byte */
	size_t tail_start;      /* and so is dst[tail_start, n) */
	uint4 *body_dst;        /* 16-aligned: dst + head_bytes */
	const uint4 *body_src;  /* 16-aligned: the first source chunk the body reads */
	size_t chunks;          /* whole chunks in the body */
	unsigned shift;         /* p: bytes from a source chunk's start to the data */
};

/* Output chunk from aligned source chunks a and b: bytes [p, p + 16) of a:b. */
template <unsigned Q>
static __device__ __forceinline__ uint4 shift_words(const uint4 &a, const uint4 &b, unsigned bits)
{
	const unsigned w[8] = { a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w };
	uint4 out;
	out.x = __funnelshift_r(w[Q + 0], w[Q + 1], bits);
	out.y = __funnelshift_r(w[Q + 1], w[Q + 2], bits);
	out.z = __funnelshift_r(w[Q + 2], w[Q + 3], bits);
	out.w = __funnelshift_r(w[Q + 3], w[Q + 4], bits);
	return out;
}

/* The word offset p / 4 picks a case, so that every register index is a constant. */
static __device__ __forceinline__ uint4 shift_chunk(const uint4 &a, const uint4 &b, unsigned p)
{
	unsigned bits = 8u * (p & 3u);
	switch (p >> 2) {
	case 0: return shift_words<0>(a, b, bits);
	case 1: return shift_words<1>(a, b, bits);
	case 2: return shift_words<2>(a, b, bits);
	default: return shift_words<3>(a, b, bits);
	}
}

/* Issues the cp.async copies of tile `tile` into stage (nothing past the body). */
template <bool Shifted>
static __device__ __forceinline__ void load_tile(uint4 *stage, const copy_plan &plan, size_t tile)
{
	size_t first = tile * kTile;
	if (first >= plan.chunks)
		return;
	size_t left = plan.chunks - first;
	unsigned count = left < kTile ? (unsigned)left : kTile;
	unsigned loads = count + (Shifted ? 1u : 0u);
	for (unsigned i = threadIdx.x; i < loads; i += kThreads)
		__pipeline_memcpy_async(&stage[i], &plan.body_src[first + i], sizeof(uint4));
}

/* Stores tile `tile` from stage, whose copies have landed. */
template <bool Shifted>
static __device__ __forceinline__ void store_tile(const uint4 *stage, const copy_plan &plan,
						  size_t tile)
{
	size_t first = tile * kTile;
	size_t left = plan.chunks - first;
	unsigned count = left < kTile ? (unsigned)left : kTile;
#pragma unroll
	for (unsigned u = 0; u < kPerThread; u++) {
		unsigned i = threadIdx.x + u * kThreads;
		if (i >= count)
			break;
		uint4 v = Shifted ? shift_chunk(stage[i], stage[i + 1], plan.shift) : stage[i];
		plan.body_dst[first + i] = v;
	}
}

template <bool Shifted>
static __global__ void __launch_bounds__(kThreads) copy_kernel(const copy_plan plan)
{
	__shared__ uint4 stages[kStages][kTile + 1];
	size_t gid = (size_t)blockIdx.x * kThreads + threadIdx.x;
	size_t gstride = (size_t)gridDim.x * kThreads;
	for (size_t i = gid; i < plan.head_bytes; i += gstride)
		plan.dst[i] = plan.src[i];
	for (size_t i = plan.tail_start + gid; i < plan.n; i += gstride)
		plan.dst[i] = plan.src[i];

	size_t tiles = (plan.chunks + kTile - 1) / kTile;
	/* Prologue: the first kStages - 1 tiles in flight, one commit group each. */
#pragma unroll
	for (unsigned s = 0; s + 1 < kStages; s++) {
		load_tile<Shifted>(stages[s], plan, blockIdx.x + (size_t)s * gridDim.x);
		__pipeline_commit();
	}
	unsigned it = 0;
	for (size_t t = blockIdx.x; t < tiles; t += gridDim.x, it++) {
		/* This thread's copies of tile t are in; the barrier makes everyone's
		 * visible and tells that the stage loaded next is no longer read. */
		__pipeline_wait_prior(kStages - 2);
		__syncthreads();
		load_tile<Shifted>(stages[(it + kStages - 1) % kStages], plan,
				   t + (size_t)(kStages - 1) * gridDim.x);
		__pipeline_commit(); /* possibly empty: keeps one group per tile */
		store_tile<Shifted>(stages[it % kStages], plan, t);
	}
	__pipeline_wait_prior(0);
}

/*
 * Splits the copy into byte-copied edges and a body of whole dst chunks whose
 * source chunks (and, when shifted, the one after) lie inside [src, src + n).
 */
static copy_plan plan_copy(void *dst, const void *src, size_t n)
{
	copy_plan plan;
	uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
	size_t head = (16u - (d & 15u)) & 15u;
	if (head > n)
		head = n;
	size_t whole = (n - head) / 16;
	unsigned p = (unsigned)((s + head) & 15u);
	size_t lo = 0, hi = whole;
	if (p != 0) {
		/* chunk k reads the aligned chunks at s + head - p + 16k and the next one */
		lo = head < p ? 1 : 0;
		size_t room = n + p - head; /* bytes from the first aligned chunk to src + n */
		hi = room >= 32 ? (room - 32) / 16 + 1 : 0;
		if (hi > whole)
			hi = whole;
	}
	plan.dst = static_cast<uint8_t *>(dst);
	plan.src = static_cast<const uint8_t *>(src);
	plan.n = n;
	plan.shift = p;
	if (hi <= lo) { /* too short for a body: all bytes one by one */
		plan.head_bytes = plan.tail_start = n;
		plan.chunks = 0;
		plan.body_dst = NULL;
		plan.body_src = NULL;
		return plan;
	}
	plan.head_bytes = head + 16 * lo;
	plan.tail_start = head + 16 * hi;
	plan.chunks = hi - lo;
	plan.body_dst = reinterpret_cast<uint4 *>(d + plan.head_bytes);
	plan.body_src = reinterpret_cast<const uint4 *>(s + head + 16 * lo - p);
	return plan;
}

/*
 * Blocks that fit on the current device at once: multiprocessors times
 * resident blocks, asked once per device and kernel (each device's launches
 * come from its own worker thread; the cache only saves the calls' time).
 */
template <bool Shifted>
static cudaError_t resident_blocks(size_t *out)
{
	static const int kCached = 128;
	static std::atomic<long long> cache[kCached];
	int dev, sms, per_sm;
	cudaError_t e = cudaGetDevice(&dev);
	if (e != cudaSuccess)
		return e;
	long long known = dev < kCached ? cache[dev].load(std::memory_order_relaxed) : 0;
	if (known > 0) {
		*out = (size_t)known;
		return cudaSuccess;
	}
	e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
	if (e == cudaSuccess)
		e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, copy_kernel<Shifted>,
								  (int)kThreads, 0);
	if (e != cudaSuccess)
		return e;
	*out = (size_t)sms * (size_t)(per_sm > 0 ? per_sm : 1);
	if (dev < kCached)
		cache[dev].store((long long)*out, std::memory_order_relaxed);
	return cudaSuccess;
}

template <bool Shifted>
static cudaError_t launch_copy(const copy_plan &plan, cudaStream_t stream)
{
	size_t cap;
	cudaError_t e = resident_blocks<Shifted>(&cap);
	if (e != cudaSuccess)
		return e;
	size_t tiles = (plan.chunks + kTile - 1) / kTile;
	size_t blocks = tiles < cap ? tiles : cap;
	if (blocks == 0)
		blocks = 1; /* edges only */
	copy_kernel<Shifted><<<(unsigned)blocks, kThreads, 0, stream>>>(plan);
	return cudaGetLastError();
}

extern "C" cudaError_t kernels_copy(void *dst, const void *src, size_t bytes, cudaStream_t stream)
{
	if (bytes == 0)
		return cudaSuccess;
	if (!dst || !src)
		return cudaErrorInvalidValue;
	copy_plan plan = plan_copy(dst, src, bytes);
	return plan.shift ? launch_copy<true>(plan, stream) : launch_copy<false>(plan, stream);
}
