/*
 * The client's own kernel in tests/gpu/attach_selftest.c: what a process
 * that attached a gpuq buffer runs on it (a PyTorch or CuPy kernel would do
 * the same). Each 32-bit word w at index i becomes w * 2654435761 + i.
 */
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

static __global__ void attach_bump(uint32_t *w, size_t n)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		w[i] = w[i] * 2654435761u + (uint32_t)i;
}

extern "C" cudaError_t attach_test_bump(uint32_t *words, size_t n)
{
	attach_bump<<<1024, 256>>>(words, n);
	return cudaGetLastError();
}
