/*
 * The CUDA side of attaching (see libgpuq_cuda.h): the driver API only,
 * from libcuda.so.1 opened with dlopen, so that libgpuq links nothing of
 * CUDA. The buffer is mapped into the primary context of its GPU (the
 * context the runtime API, PyTorch and CuPy use), which stays retained
 * while the attachment lives.
 */
#include "client/lib/libgpuq_cuda.h"

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The ABI the functions are asked for: CUDA 12.0's, as gpuqd asks. */
#define IMPORT_DRIVER_ABI 12000

#define IMPORT_FUNCTIONS(X)                                                    \
	X(cuInit)                                                              \
	X(cuDeviceGetCount)                                                    \
	X(cuDeviceGet)                                                         \
	X(cuDeviceGetUuid)                                                     \
	X(cuDevicePrimaryCtxRetain)                                            \
	X(cuDevicePrimaryCtxRelease)                                           \
	X(cuCtxPushCurrent)                                                    \
	X(cuCtxPopCurrent)                                                     \
	X(cuMemGetAllocationGranularity)                                       \
	X(cuMemImportFromShareableHandle)                                      \
	X(cuMemAddressReserve)                                                 \
	X(cuMemMap)                                                            \
	X(cuMemSetAccess)                                                      \
	X(cuMemUnmap)                                                          \
	X(cuMemAddressFree)                                                    \
	X(cuMemRelease)                                                        \
	X(cuMemcpyDtoH)                                                        \
	X(cuMemHostRegister)                                                   \
	X(cuMemHostUnregister)                                                 \
	X(cuGetErrorName)

static struct {
#define IMPORT_POINTER(name) __typeof__(&name) name;
	IMPORT_FUNCTIONS(IMPORT_POINTER)
#undef IMPORT_POINTER
	char error[256]; /* why the driver cannot be used; "" once it can */
} drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
				CUdriverProcAddressQueryResult *);

static void import_lookup(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	get_proc_fn get = lib ? (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
	CUdriverProcAddressQueryResult q;
	if (!get) {
		snprintf(drv.error, sizeof drv.error,
			 "libcuda.so.1 cannot be loaded (%s): attaching on a CUDA daemon needs the NVIDIA driver here",
			 lib ? "no cuGetProcAddress_v2" : dlerror());
		return;
	}
#define IMPORT_LOOKUP(name)                                                               \
	if (get(#name, (void **)&drv.name, IMPORT_DRIVER_ABI, CU_GET_PROC_ADDRESS_DEFAULT, &q) != \
		    CUDA_SUCCESS ||                                                       \
	    !drv.name) {                                                                  \
		snprintf(drv.error, sizeof drv.error, "the driver has no %s", #name);     \
		return;                                                                   \
	}
	IMPORT_FUNCTIONS(IMPORT_LOOKUP)
#undef IMPORT_LOOKUP
	CUresult rc = drv.cuInit(0);
	if (rc != CUDA_SUCCESS)
		snprintf(drv.error, sizeof drv.error, "cuInit failed (CUresult %d)", (int)rc);
}

static int import_fail(CUresult rc, const char *call, struct gpuq_error *err)
{
	const char *name = NULL;
	drv.cuGetErrorName(rc, &name);
	return gpuq_fail(err, rc == CUDA_ERROR_OUT_OF_MEMORY ? GPUQ_E_OUT_OF_MEMORY : GPUQ_E_DEVICE_ERROR,
			 "attach: %s failed: %s", call, name ? name : "unknown CUresult");
}

#define IMPORT_TRY(call, label)                                                \
	do {                                                                   \
		CUresult rc_ = (call);                                         \
		if (rc_ != CUDA_SUCCESS) {                                     \
			import_fail(rc_, #call, err);                          \
			goto label;                                            \
		}                                                              \
	} while (0)

/* The device whose UUID gpuqd named, in this process's numbering (CUDA_VISIBLE_DEVICES may differ). */
static int find_device(const char *uuid, CUdevice *dev, int *ordinal, struct gpuq_error *err)
{
	int n = 0;
	IMPORT_TRY(drv.cuDeviceGetCount(&n), fail);
	for (int i = 0; i < n; i++) {
		CUuuid u;
		char text[64];
		IMPORT_TRY(drv.cuDeviceGet(dev, i), fail);
		IMPORT_TRY(drv.cuDeviceGetUuid(&u, *dev), fail);
		gpuq_format_uuid(text, sizeof text, (const unsigned char *)u.bytes);
		if (strcmp(text, uuid) == 0) {
			*ordinal = i;
			return 0;
		}
	}
	return gpuq_fail(err, GPUQ_E_NO_DEVICE,
			 "attach: gpuqd's device %s is not among the %d GPUs this process sees "
			 "(CUDA_VISIBLE_DEVICES?)",
			 uuid, n);
fail:
	return -1;
}

int gpuq_cuda_import(struct gpuq_attachment *a, int fd, const char *uuid, struct gpuq_error *err)
{
	CUdevice dev;
	CUcontext ctx = NULL, popped;
	CUmemGenericAllocationHandle handle = 0;
	CUdeviceptr va = 0;
	size_t granularity = 0;
	uint64_t size = 0;
	bool mapped = false;
	int ordinal = -1;
	pthread_once(&drv_once, import_lookup);
	if (drv.error[0])
		return gpuq_fail(err, GPUQ_E_NO_DEVICE, "attach: %s", drv.error);
	if (find_device(uuid, &dev, &ordinal, err) < 0)
		return -1;
	IMPORT_TRY(drv.cuDevicePrimaryCtxRetain(&ctx, dev), fail);
	IMPORT_TRY(drv.cuCtxPushCurrent(ctx), fail);
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ordinal },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	IMPORT_TRY(drv.cuMemGetAllocationGranularity(&granularity, &prop,
						     CU_MEM_ALLOC_GRANULARITY_MINIMUM), popfail);
	size = (a->bytes + granularity - 1) / granularity * granularity; /* as gpuqd allocated it */
	IMPORT_TRY(drv.cuMemImportFromShareableHandle(&handle, (void *)(uintptr_t)fd,
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), popfail);
	IMPORT_TRY(drv.cuMemAddressReserve(&va, size, granularity, 0, 0), popfail);
	IMPORT_TRY(drv.cuMemMap(va, size, 0, handle, 0), popfail);
	mapped = true;
	CUmemAccessDesc desc = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ordinal },
				 .flags = a->read_write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
							: CU_MEM_ACCESS_FLAGS_PROT_READ };
	IMPORT_TRY(drv.cuMemSetAccess(va, size, &desc, 1), popfail);
	drv.cuCtxPopCurrent(&popped);
	a->ptr = (void *)(uintptr_t)va;
	a->map_bytes = size;
	a->handle = handle;
	a->cuda_device = ordinal;
	return 0;
popfail:
	if (mapped)
		drv.cuMemUnmap(va, size);
	if (va)
		drv.cuMemAddressFree(va, size);
	if (handle)
		drv.cuMemRelease(handle);
	drv.cuCtxPopCurrent(&popped);
fail:
	if (ctx)
		drv.cuDevicePrimaryCtxRelease(dev);
	return -1;
}

int gpuq_cuda_unimport(struct gpuq_attachment *a, struct gpuq_error *err)
{
	CUdeviceptr va = (CUdeviceptr)(uintptr_t)a->ptr;
	CUdevice dev;
	CUresult rc;
	int status = 0;
	if ((rc = drv.cuMemUnmap(va, a->map_bytes)) != CUDA_SUCCESS)
		status = import_fail(rc, "cuMemUnmap", err);
	if ((rc = drv.cuMemAddressFree(va, a->map_bytes)) != CUDA_SUCCESS && status == 0)
		status = import_fail(rc, "cuMemAddressFree", err);
	if ((rc = drv.cuMemRelease(a->handle)) != CUDA_SUCCESS && status == 0)
		status = import_fail(rc, "cuMemRelease", err);
	if (drv.cuDeviceGet(&dev, a->cuda_device) == CUDA_SUCCESS)
		drv.cuDevicePrimaryCtxRelease(dev);
	a->handle = 0;
	return status;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int gpuq_cuda_read(const struct gpuq_attachment *a, uint64_t offset, void *dst, size_t n,
		   bool pinned, double *seconds, struct gpuq_error *err)
{
	CUdevice dev;
	CUcontext ctx = NULL, popped;
	bool registered = false;
	int rc = -1;
	IMPORT_TRY(drv.cuDeviceGet(&dev, a->cuda_device), out);
	IMPORT_TRY(drv.cuDevicePrimaryCtxRetain(&ctx, dev), out);
	IMPORT_TRY(drv.cuCtxPushCurrent(ctx), out);
	if (pinned) {
		IMPORT_TRY(drv.cuMemHostRegister(dst, n, 0), pop);
		registered = true;
	}
	double start = now_s();
	IMPORT_TRY(drv.cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)a->ptr + offset, n), pop);
	if (seconds)
		*seconds = now_s() - start;
	rc = 0;
pop:
	if (registered)
		drv.cuMemHostUnregister(dst);
	drv.cuCtxPopCurrent(&popped);
out:
	if (ctx)
		drv.cuDevicePrimaryCtxRelease(dev);
	return rc;
}
