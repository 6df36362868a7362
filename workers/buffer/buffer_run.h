/*
 * Runners of the kinds that act on one buffer as a whole: noop, alloc,
 * free, fill, checksum (their rows are in workers/work_kinds.h). Worker
 * thread only, each on a fiber of the device's scheduler; 0, or -1 with
 * work->error set.
 */
#ifndef GPUQ_BUFFER_RUN_H
#define GPUQ_BUFFER_RUN_H

#include "workers/backend/backend.h"
#include "workers/work.h"

int buffer_run_noop(struct device *dev, struct work *work);
/*
 * work->length bytes at work->dptr, from the pool or, with
 * work->shareable, on their own with a handle to export
 * (result.share_fd). Waits up to work->wait_memory_ms for memory that other
 * jobs release.
 */
int buffer_run_alloc(struct device *dev, struct work *work);
/* Gives work->dptr back; allocations waiting for memory try again. */
int buffer_run_free(struct device *dev, struct work *work);
/* Writes work->fill over work->length bytes at work->dptr. */
int buffer_run_fill(struct device *dev, struct work *work);
/* The checksum of work->length bytes at work->dptr, into result.checksum. */
int buffer_run_checksum(struct device *dev, struct work *work);

#endif
