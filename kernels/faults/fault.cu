/*
 * The fault-injection build's kernel (tests/gpuqd-faults only, never the
 * production gpuqd): one thread writes through a pointer no allocation
 * holds, which is an illegal address on every GPU gpuq supports and leaves
 * the context unusable, as a buggy kernel or an uncorrectable ECC error
 * would. gpu-check uses it to run a device reset from end to end.
 */
#include "kernels/faults/fault.h"

static __global__ void fault_write(volatile unsigned *bad)
{
	*bad = 0xdeadbeefu;
}

extern "C" cudaError_t kernels_fault_write(cudaStream_t stream)
{
	/*
	 * The null page: the host never maps it (mmap_min_addr) and CUDA's
	 * unified address space never hands it out, so the store faults on
	 * every driver. (A store to the top of the 49-bit space, used before,
	 * completed without a fault in some runs on the H200.)
	 * A kernel argument, so that the compiler cannot see the null and
	 * replace the store with a trap.
	 */
	volatile unsigned *bad = (volatile unsigned *)(uintptr_t)0x40;
	fault_write<<<1, 1, 0, stream>>>(bad);
	return cudaGetLastError();
}
