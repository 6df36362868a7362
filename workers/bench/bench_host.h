/*
 * The host half of a get, alone: bench_copy's ceiling rows for gets into
 * memfds and files. The copy threads write a source already in host memory
 * into a descriptor the way a staged get does (by mapping it and storing
 * into the populated pages, or by pwrite at offsets), with no device work,
 * so that a get's rate can be read against what the host itself allows for
 * that kind of destination. Worker thread only (the copy threads do the
 * writes).
 */
#ifndef GPUQ_BENCH_HOST_H
#define GPUQ_BENCH_HOST_H

#include <stddef.h>

#include "protocol/protocol.h"
#include "workers/transfer/copy_pool.h"

enum bench_host_means {
	BENCH_HOST_MAP,    /* a shared mapping, populated and stored into by chunk, unmapped in parts */
	BENCH_HOST_PWRITE, /* pwrite of each chunk at its offset */
	BENCH_HOST_KEPT,   /* populated and stored into through a mapping made before, kept after */
};

/*
 * Writes n bytes of src to fd at offsets [0, n) by `means`, the chunks
 * spread over the pool's threads; grows the file to n first where it is
 * shorter (a fresh destination, as a get grows it). `kept` is the shared
 * mapping of fd's [0, n) that BENCH_HOST_KEPT writes through (else
 * unused). *seconds is the whole: from the first call to the last page
 * unmapped. 0, or -1 with err.
 */
int bench_host_write(struct copy_pool *pool, int fd, const void *src, size_t n,
		     enum bench_host_means means, void *kept, double *seconds,
		     struct gpuq_error *err);

#endif
