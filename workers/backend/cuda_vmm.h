/*
 * Device memory a client process may map (alloc shareable, attach): one
 * allocation of its own, made with the driver's virtual memory management
 * (cuMemCreate with a POSIX file-descriptor handle type, reserved and
 * mapped into gpuqd's address space with cuMemAddressReserve/cuMemMap,
 * made accessible with cuMemSetAccess) and exported once as a descriptor
 * (cuMemExportToShareableHandle) that opens this allocation and nothing
 * else: never a pool's, through which other users' buffers could be
 * reached. gpuqd never links libcuda: the functions are the driver entry
 * points the runtime hands out (cudaGetDriverEntryPointByVersion), looked
 * up once per process. Worker thread of the device only.
 */
#ifndef GPUQ_CUDA_VMM_H
#define GPUQ_CUDA_VMM_H

#include <stdint.h>

#include "workers/backend/backend.h"

struct cuda_vmm_alloc {
	unsigned long long handle; /* CUmemGenericAllocationHandle */
	unsigned long long va;     /* CUdeviceptr: where gpuqd maps it */
	uint64_t size;             /* the allocation: bytes rounded up to the granularity */
};

/*
 * Whether dev can hold its buffers in exportable slabs (--buffer-memory):
 * the driver's entry points, virtual memory management and export as a
 * POSIX descriptor; *granularity is the allocation granularity. 0, or -1
 * with err (device_error) saying what is missing.
 */
int cuda_vmm_probe(struct device *dev, uint64_t *granularity, struct gpuq_error *err);
/*
 * Allocates bytes on dev, maps it read-write for dev and for every device
 * that may read dev's pool (dev->pool_shared), and exports it: *fd is the
 * caller's to close. 0, or -1 with err (out_of_memory when the device is full).
 */
int cuda_vmm_create(struct device *dev, uint64_t bytes, struct cuda_vmm_alloc *a, int *fd,
		    struct gpuq_error *err);
/* Unmaps and releases a; the memory goes once every client has released its handle too. */
/*
 * Takes over an allocation an earlier process exported (a re-exec): fd is
 * its POSIX descriptor, bytes its size (a multiple of the granularity).
 * cuMemImportFromShareableHandle, then reserved, mapped and made
 * accessible as cuda_vmm_create does. fd stays the caller's. 0 with *a,
 * or -1 with err naming the driver call that refused.
 */
int cuda_vmm_import(struct device *dev, int fd, uint64_t bytes, struct cuda_vmm_alloc *a,
		    struct gpuq_error *err);
int cuda_vmm_destroy(struct device *dev, struct cuda_vmm_alloc *a, struct gpuq_error *err);
/*
 * The same for a device that faulted (its context is lost): each call is
 * tried and its failure ignored, since the fault was reported already and
 * must stay the reason the device shows; what the driver still takes back
 * is not leaked until the process ends.
 */
void cuda_vmm_destroy_lost(struct cuda_vmm_alloc *a);

#endif
