/*
 * Compiled chain kernels on a CUDA device, through the driver API: an image
 * from NVRTC (workers/chain/chain_nvrtc.h) loaded as a module, and its kernel
 * launched. gpuqd links the CUDA runtime statically and never links
 * libcuda: the driver's functions come from cudaGetDriverEntryPointByVersion,
 * looked up once per process. A module lives in the device's primary
 * context, so only the device's worker thread (where that context is
 * current) loads, launches and unloads it; loading happens outside any
 * stream capture, launching may be captured into a graph.
 */
#ifndef GPUQ_CHAIN_MODULE_H
#define GPUQ_CHAIN_MODULE_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>

struct chain_module {
	void *module;   /* CUmodule */
	void *function; /* CUfunction: gq_run or gq_reduce */
	bool reduce;    /* which of them */
	int blocks_per_sm;
};

/*
 * Loads image (CUBIN, or PTX the driver compiles) into the current context
 * and finds its kernel. 0; or -1 with *e (the driver's error as the
 * runtime numbers it: sticky errors are the same numbers) and why.
 */
int chain_module_load(const void *image, struct chain_module *m, cudaError_t *e, char *why,
		      size_t whysize);
/* Unloads m (teardown: a failure is only logged). */
void chain_module_unload(struct chain_module *m, int device_index);

/*
 * Launches m's kernel: grid blocks of KERNELS_REDUCE_THREADS threads on
 * stream, params as cuLaunchKernel takes them. cudaSuccess or the error.
 */
cudaError_t chain_module_launch(const struct chain_module *m, unsigned grid, void **params,
				cudaStream_t stream);

/* The driver's text for e ("CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid"). */
const char *chain_module_error(cudaError_t e, char *buf, size_t size);

#endif
