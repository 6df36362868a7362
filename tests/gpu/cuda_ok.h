/*
 * CUDA_OK(call), for the standalone GPU self-tests: a CUDA call that must
 * succeed, or the test prints the call, the error and file:line and exits 2
 * (the self-tests' "CUDA failed" status).
 */
#ifndef GPUQ_TESTS_CUDA_OK_H
#define GPUQ_TESTS_CUDA_OK_H

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CUDA_OK(call)                                                                  \
	do {                                                                           \
		cudaError_t e_ = (call);                                               \
		if (e_ != cudaSuccess) {                                               \
			fprintf(stderr, "%s failed: %s (%s) at %s:%d\n", #call,        \
				cudaGetErrorString(e_), cudaGetErrorName(e_), __FILE__, \
				__LINE__);                                             \
			exit(2);                                                       \
		}                                                                      \
	} while (0)

#endif
