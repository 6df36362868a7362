/* Launch geometry shared by the kernels in kernels/. CUDA C++ only. */
#ifndef GPUQ_GRID_CUH
#define GPUQ_GRID_CUH

#include <atomic>
#include <cuda_runtime_api.h>
#include <stddef.h>

/*
 * Blocks of `threads` for a grid-stride loop over items work items: at most
 * per_sm blocks per SM of the current device, never more than the items
 * need, at least one.
 */
static inline cudaError_t grid_blocks(size_t items, unsigned threads, unsigned per_sm,
				      unsigned *blocks)
{
	int dev, sms;
	cudaError_t e = cudaGetDevice(&dev);
	if (e != cudaSuccess)
		return e;
	e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
	if (e != cudaSuccess)
		return e;
	size_t cap = (size_t)sms * per_sm;
	size_t need = (items + threads - 1) / threads;
	size_t n = need < cap ? need : cap;
	*blocks = n > 0 ? (unsigned)n : 1u;
	return cudaSuccess;
}

/*
 * SMs of the current device, asked of CUDA once per device ordinal (in
 * each file that uses it), so that a launch inside a stream capture asks
 * CUDA nothing but the current device. Worker threads of several devices
 * may race to fill an entry; they all store the same number.
 */
static inline cudaError_t grid_current_sms(int *sms)
{
	static const int max_ordinals = 256;
	static std::atomic<int> cached[max_ordinals];
	int dev;
	cudaError_t e = cudaGetDevice(&dev);
	if (e != cudaSuccess)
		return e;
	*sms = dev >= 0 && dev < max_ordinals ? cached[dev].load(std::memory_order_relaxed) : 0;
	if (*sms > 0)
		return cudaSuccess;
	e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
	if (e == cudaSuccess && dev >= 0 && dev < max_ordinals)
		cached[dev].store(*sms, std::memory_order_relaxed);
	return e;
}

#endif
