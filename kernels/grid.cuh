/* Launch geometry shared by the kernels in kernels/. CUDA C++ only. */
#ifndef GPUQ_GRID_CUH
#define GPUQ_GRID_CUH

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

#endif
