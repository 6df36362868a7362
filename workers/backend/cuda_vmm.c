/*
 * Shareable device memory through the driver's virtual memory management
 * (see cuda_vmm.h). cuda.h supplies types and prototypes only: every
 * function is the pointer the runtime hands out for it.
 */
#include "workers/backend/cuda_vmm.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "workers/backend/cuda_check.h"
#include "workers/backend/cuda_driver.h"

#define VMM_FUNCTIONS(X)                                                       \
	X(cuMemGetAllocationGranularity)                                       \
	X(cuMemCreate)                                                         \
	X(cuMemAddressReserve)                                                 \
	X(cuMemMap)                                                            \
	X(cuMemSetAccess)                                                      \
	X(cuMemExportToShareableHandle)                                        \
	X(cuMemImportFromShareableHandle)                                      \
	X(cuMemUnmap)                                                          \
	X(cuMemAddressFree)                                                    \
	X(cuMemRelease)                                                        \
	X(cuDeviceGet)                                                         \
	X(cuDeviceGetAttribute)                                                \
	X(cuGetErrorName)

static struct {
#define VMM_POINTER(name) __typeof__(&name) name;
	VMM_FUNCTIONS(VMM_POINTER)
#undef VMM_POINTER
	cudaError_t error; /* why the lookup failed; cudaSuccess once it has worked */
	char missing[64];
} drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void vmm_lookup(void)
{
#define VMM_LOOKUP(name)                                                       \
	drv.error = cuda_driver_entry(#name, (void **)&drv.name);              \
	if (drv.error != cudaSuccess) {                                        \
		snprintf(drv.missing, sizeof drv.missing, "%s", #name);        \
		return;                                                        \
	}
	VMM_FUNCTIONS(VMM_LOOKUP)
#undef VMM_LOOKUP
}

/* A driver call's failure: out_of_memory for CUDA_ERROR_OUT_OF_MEMORY, else the device's error. */
static int vmm_fail(struct device *dev, struct gpuq_error *err, CUresult rc, const char *call,
		    const char *file, int line)
{
	const char *name = NULL;
	drv.cuGetErrorName(rc, &name);
	if (rc == CUDA_ERROR_OUT_OF_MEMORY)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "[gpu %d] out of device memory: %s failed (%s); free a buffer on gpu %d or ask for less",
				 dev->index, call, name ? name : "?", dev->index);
	return cuda_fail(dev, err, (cudaError_t)rc, call, file, line);
}

#define VMM_TRY(dev, err, call, label)                                         \
	do {                                                                   \
		CUresult rc_ = (call);                                         \
		if (rc_ != CUDA_SUCCESS) {                                     \
			vmm_fail((dev), (err), rc_, #call, __FILE__, __LINE__); \
			goto label;                                            \
		}                                                              \
	} while (0)

static void vmm_prop(const struct device *dev, CUmemAllocationProp *prop)
{
	memset(prop, 0, sizeof *prop);
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev->ordinal;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/*
 * Read-write access for the device and for each other GPU that may read its
 * buffers (copies, collectives), each physical GPU once.
 */
static unsigned vmm_access(const struct device *dev, CUmemAccessDesc *desc)
{
	unsigned n = 0;
	for (int j = -1; j < dev->device_count && j < GPUQ_MAX_DEVICES; j++) {
		int ordinal = j < 0 ? dev->ordinal : dev->ordinals[j];
		bool seen = false;
		if (j >= 0 && !dev->pool_shared[j])
			continue;
		for (unsigned k = 0; k < n; k++)
			seen = seen || desc[k].location.id == ordinal;
		if (seen)
			continue;
		memset(&desc[n], 0, sizeof desc[n]);
		desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		desc[n].location.id = ordinal;
		desc[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		n++;
	}
	return n;
}

/* The driver's entry points, or why they cannot be had (device_error). */
static int vmm_ready(struct device *dev, struct gpuq_error *err)
{
	pthread_once(&drv_once, vmm_lookup);
	if (drv.error != cudaSuccess)
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR,
				 "[gpu %d] shareable buffers need the driver entry point %s, which cannot be had: %s",
				 dev->index, drv.missing, cudaGetErrorString(drv.error));
	return 0;
}

/* A device attribute's value through the driver, or -1 with err. */
static int vmm_attribute(struct device *dev, CUdevice_attribute attr, int *value,
			 struct gpuq_error *err)
{
	CUdevice cu = 0;
	VMM_TRY(dev, err, drv.cuDeviceGet(&cu, dev->ordinal), fail);
	VMM_TRY(dev, err, drv.cuDeviceGetAttribute(value, attr, cu), fail);
	return 0;
fail:
	return -1;
}

int cuda_vmm_probe(struct device *dev, uint64_t *granularity, struct gpuq_error *err)
{
	CUmemAllocationProp prop;
	size_t g = 0;
	int vmm = 0, posix_fd = 0;
	if (vmm_ready(dev, err) != 0)
		return -1;
	if (vmm_attribute(dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, &vmm, err) != 0 ||
	    vmm_attribute(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
			  &posix_fd, err) != 0)
		return -1;
	if (!vmm || !posix_fd)
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR,
				 "[gpu %d] the driver does not support %s on CUDA device %d",
				 dev->index,
				 !vmm ? "virtual memory management (cuMemCreate)"
				      : "exporting allocations as POSIX file descriptors",
				 dev->ordinal);
	vmm_prop(dev, &prop);
	VMM_TRY(dev, err, drv.cuMemGetAllocationGranularity(&g, &prop,
							   CU_MEM_ALLOC_GRANULARITY_MINIMUM), fail);
	*granularity = g;
	return 0;
fail:
	return -1;
}

int cuda_vmm_create(struct device *dev, uint64_t bytes, struct cuda_vmm_alloc *a, int *fd,
		    struct gpuq_error *err)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc desc[GPUQ_MAX_DEVICES + 1];
	CUmemGenericAllocationHandle handle = 0;
	CUdeviceptr va = 0;
	size_t granularity = 0;
	uint64_t size = 0;
	bool mapped = false;
	int exported = -1;
	memset(a, 0, sizeof *a);
	*fd = -1;
	if (vmm_ready(dev, err) != 0)
		return -1;
	vmm_prop(dev, &prop);
	VMM_TRY(dev, err, drv.cuMemGetAllocationGranularity(&granularity, &prop,
							   CU_MEM_ALLOC_GRANULARITY_MINIMUM), fail);
	size = (bytes + granularity - 1) / granularity * granularity;
	VMM_TRY(dev, err, drv.cuMemCreate(&handle, size, &prop, 0), fail);
	VMM_TRY(dev, err, drv.cuMemAddressReserve(&va, size, granularity, 0, 0), fail);
	VMM_TRY(dev, err, drv.cuMemMap(va, size, 0, handle, 0), fail);
	mapped = true;
	VMM_TRY(dev, err, drv.cuMemSetAccess(va, size, desc, vmm_access(dev, desc)), fail);
	VMM_TRY(dev, err, drv.cuMemExportToShareableHandle(&exported, handle,
							  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		fail);
	*a = (struct cuda_vmm_alloc){ handle, va, size };
	*fd = exported;
	return 0;
fail:
	if (mapped)
		drv.cuMemUnmap(va, size);
	if (va)
		drv.cuMemAddressFree(va, size);
	if (handle)
		drv.cuMemRelease(handle);
	return -1;
}

void cuda_vmm_destroy_lost(struct cuda_vmm_alloc *a)
{
	if (!a->handle || drv.error != cudaSuccess || !drv.cuMemUnmap)
		return;
	(void)drv.cuMemUnmap(a->va, a->size);
	(void)drv.cuMemAddressFree(a->va, a->size);
	(void)drv.cuMemRelease(a->handle);
	(void)cudaGetLastError();
	memset(a, 0, sizeof *a);
}

int cuda_vmm_destroy(struct device *dev, struct cuda_vmm_alloc *a, struct gpuq_error *err)
{
	int rc = 0;
	CUresult r;
	if (!a->handle)
		return 0;
	if ((r = drv.cuMemUnmap(a->va, a->size)) != CUDA_SUCCESS)
		rc = vmm_fail(dev, err, r, "cuMemUnmap(va, size)", __FILE__, __LINE__);
	if ((r = drv.cuMemAddressFree(a->va, a->size)) != CUDA_SUCCESS && rc == 0)
		rc = vmm_fail(dev, err, r, "cuMemAddressFree(va, size)", __FILE__, __LINE__);
	if ((r = drv.cuMemRelease(a->handle)) != CUDA_SUCCESS && rc == 0)
		rc = vmm_fail(dev, err, r, "cuMemRelease(handle)", __FILE__, __LINE__);
	memset(a, 0, sizeof *a);
	return rc;
}

int cuda_vmm_import(struct device *dev, int fd, uint64_t bytes, struct cuda_vmm_alloc *a,
		    struct gpuq_error *err)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc desc[GPUQ_MAX_DEVICES + 1];
	CUmemGenericAllocationHandle handle = 0;
	CUdeviceptr va = 0;
	size_t granularity = 0;
	bool mapped = false;
	memset(a, 0, sizeof *a);
	if (vmm_ready(dev, err) != 0)
		return -1;
	vmm_prop(dev, &prop);
	VMM_TRY(dev, err, drv.cuMemGetAllocationGranularity(&granularity, &prop,
							   CU_MEM_ALLOC_GRANULARITY_MINIMUM), fail);
	if (granularity == 0 || bytes % granularity != 0)
		return gpuq_fail(err, GPUQ_E_IO,
				 "[gpu %d] a slab of %llu bytes to adopt is not a multiple of the "
				 "granularity (%zu bytes): the record does not match this device",
				 dev->index, (unsigned long long)bytes, granularity);
	/* The POSIX handle type takes the descriptor's number itself, cast to a pointer. */
	VMM_TRY(dev, err, drv.cuMemImportFromShareableHandle(&handle, (void *)(intptr_t)fd,
							    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		fail);
	VMM_TRY(dev, err, drv.cuMemAddressReserve(&va, bytes, granularity, 0, 0), fail);
	VMM_TRY(dev, err, drv.cuMemMap(va, bytes, 0, handle, 0), fail);
	mapped = true;
	VMM_TRY(dev, err, drv.cuMemSetAccess(va, bytes, desc, vmm_access(dev, desc)), fail);
	*a = (struct cuda_vmm_alloc){ handle, va, bytes };
	return 0;
fail:
	if (mapped)
		drv.cuMemUnmap(va, bytes);
	if (va)
		drv.cuMemAddressFree(va, bytes);
	if (handle)
		drv.cuMemRelease(handle);
	return -1;
}
