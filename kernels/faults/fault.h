/* The fault-injection build's kernel launcher (kernels/faults/fault.cu). */
#ifndef GPUQ_KERNELS_FAULT_H
#define GPUQ_KERNELS_FAULT_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Launches one thread that writes through an unmapped pointer: a sticky illegal-address fault. */
cudaError_t kernels_fault_write(cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
