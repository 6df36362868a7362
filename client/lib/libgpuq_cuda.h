/*
 * Importing an attached buffer into this process's CUDA context, for
 * libgpuq_share.c. libcuda.so.1 is opened with dlopen at the first attach
 * (so that libgpuq needs no CUDA until then) and its functions are taken
 * with cuGetProcAddress, once per process.
 */
#ifndef GPUQ_LIBGPUQ_CUDA_H
#define GPUQ_LIBGPUQ_CUDA_H

#include "client/lib/gpuq.h"

/*
 * Imports fd (a POSIX file-descriptor handle of one allocation) on the GPU
 * whose UUID is uuid ("GPU-..."), maps it read-write or read-only into this
 * process's address space and sets a->ptr, a->map_bytes, a->handle and
 * a->cuda_device. fd stays the caller's. 0, or -1 with err.
 */
int gpuq_cuda_import(struct gpuq_attachment *a, int fd, const char *uuid, struct gpuq_error *err);
/* gpuq_attachment_read on CUDA: cuMemcpyDtoH (into dst registered first, with pinned), timed. */
int gpuq_cuda_read(const struct gpuq_attachment *a, uint64_t offset, void *dst, size_t n,
		   bool pinned, double *seconds, struct gpuq_error *err);
/* Unmaps and releases what gpuq_cuda_import made. */
int gpuq_cuda_unimport(struct gpuq_attachment *a, struct gpuq_error *err);

#endif
