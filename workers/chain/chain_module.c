/*
 * The driver API for compiled chain kernels (workers/chain/chain_module.h).
 * cuda.h supplies types and prototypes only: every function is the pointer
 * the runtime hands out for it, so nothing links libcuda.
 */
#include "workers/chain/chain_module.h"
#include "workers/log.h"

#include <cuda.h>
#include <pthread.h>
#include <stdio.h>

#include "kernels/chain_abi.h"
#include "workers/backend/cuda_driver.h"

#define MODULE_FUNCTIONS(X)                                                    \
	X(cuModuleLoadData)                                                    \
	X(cuModuleUnload)                                                      \
	X(cuModuleGetFunction)                                                 \
	X(cuLaunchKernel)                                                      \
	X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                         \
	X(cuGetErrorName)                                                      \
	X(cuGetErrorString)

static struct {
#define MODULE_POINTER(name) __typeof__(&name) name;
	MODULE_FUNCTIONS(MODULE_POINTER)
#undef MODULE_POINTER
	cudaError_t error; /* why the lookup failed; cudaSuccess once it has worked */
	char missing[64];
} drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void module_lookup(void)
{
#define MODULE_LOOKUP(name)                                                    \
	drv.error = cuda_driver_entry(#name, (void **)&drv.name);              \
	if (drv.error != cudaSuccess) {                                        \
		snprintf(drv.missing, sizeof drv.missing, "%s", #name);        \
		return;                                                        \
	}
	MODULE_FUNCTIONS(MODULE_LOOKUP)
#undef MODULE_LOOKUP
}

const char *chain_module_error(cudaError_t e, char *buf, size_t size)
{
	const char *name = NULL, *text = NULL;
	if (drv.error == cudaSuccess && drv.cuGetErrorName) {
		drv.cuGetErrorName((CUresult)e, &name);
		drv.cuGetErrorString((CUresult)e, &text);
	}
	snprintf(buf, size, "%s: %s", name ? name : cudaGetErrorName(e),
		 text ? text : cudaGetErrorString(e));
	return buf;
}

static int module_fail(CUresult rc, const char *call, cudaError_t *e, char *why, size_t whysize)
{
	char text[160];
	*e = (cudaError_t)rc;
	snprintf(why, whysize, "%s failed: %s", call, chain_module_error(*e, text, sizeof text));
	return -1;
}

/* gq_run, else gq_reduce: a module holds one of them. */
static int module_function(struct chain_module *m, cudaError_t *e, char *why, size_t whysize)
{
	CUfunction f;
	CUresult rc = drv.cuModuleGetFunction(&f, (CUmodule)m->module, "gq_run");
	m->reduce = rc == CUDA_ERROR_NOT_FOUND;
	if (m->reduce)
		rc = drv.cuModuleGetFunction(&f, (CUmodule)m->module, "gq_reduce");
	if (rc != CUDA_SUCCESS)
		return module_fail(rc, "cuModuleGetFunction(gq_run or gq_reduce)", e, why, whysize);
	m->function = f;
	rc = drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(&m->blocks_per_sm, f,
							     KERNELS_REDUCE_THREADS, 0);
	if (rc != CUDA_SUCCESS)
		return module_fail(rc, "cuOccupancyMaxActiveBlocksPerMultiprocessor", e, why, whysize);
	if (m->blocks_per_sm < 1)
		m->blocks_per_sm = 1;
	return 0;
}

int chain_module_load(const void *image, struct chain_module *m, cudaError_t *e, char *why,
		      size_t whysize)
{
	pthread_once(&drv_once, module_lookup);
	m->module = m->function = NULL;
	if (drv.error != cudaSuccess) {
		*e = drv.error;
		snprintf(why, whysize, "the driver entry point %s cannot be had: %s", drv.missing,
			 cudaGetErrorString(drv.error));
		return -1;
	}
	CUmodule mod;
	CUresult rc = drv.cuModuleLoadData(&mod, image);
	if (rc != CUDA_SUCCESS)
		return module_fail(rc, "cuModuleLoadData", e, why, whysize);
	m->module = mod;
	if (module_function(m, e, why, whysize) == 0)
		return 0;
	drv.cuModuleUnload(mod);
	m->module = NULL;
	return -1;
}

void chain_module_unload(struct chain_module *m, int device_index)
{
	if (!m->module)
		return;
	CUresult rc = drv.cuModuleUnload((CUmodule)m->module);
	if (rc != CUDA_SUCCESS) {
		char text[160];
		log_warn("[gpu %d] cuModuleUnload failed during teardown: %s",
			device_index, chain_module_error((cudaError_t)rc, text, sizeof text));
	}
	m->module = m->function = NULL;
}

cudaError_t chain_module_launch(const struct chain_module *m, unsigned grid, void **params,
				cudaStream_t stream)
{
	CUresult rc = drv.cuLaunchKernel((CUfunction)m->function, grid, 1, 1, KERNELS_REDUCE_THREADS,
					 1, 1, 0, (CUstream)stream, params, NULL);
	return (cudaError_t)rc;
}
