/*
 * Driver API entry points without linking libcuda: the runtime hands out
 * the driver's functions (cudaGetDriverEntryPointByVersion). gpuqd asks for
 * CUDA 12.0's ABI, which every driver it runs on has. Any thread.
 */
#ifndef GPUQ_CUDA_DRIVER_H
#define GPUQ_CUDA_DRIVER_H

#include <cuda_runtime_api.h>

#define CUDA_DRIVER_ABI 12000

/* The driver's function `name` in *fn; cudaErrorSymbolNotFound when this driver lacks it. */
static inline cudaError_t cuda_driver_entry(const char *name, void **fn)
{
	enum cudaDriverEntryPointQueryResult q;
	cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, CUDA_DRIVER_ABI, cudaEnableDefault, &q);
	if (e == cudaSuccess && (q != cudaDriverEntryPointSuccess || !*fn))
		e = cudaErrorSymbolNotFound;
	return e;
}

#endif
