/*
 * Moving bytes between a client's descriptor and device memory through the
 * worker's staging ring. Worker thread only.
 *
 * This is the simple chunked version: one thread reads (or writes) the
 * descriptor while the ring's other slots are in flight on the copy streams,
 * so reading slot k+1 overlaps the DMA of slot k. The pipelined copy job
 * replaces these two functions, nothing else.
 */
#ifndef GPUQ_TRANSFER_H
#define GPUQ_TRANSFER_H

#include "workers/backend.h"
#include "workers/work.h"

/*
 * Descriptor -> dev memory at work->dptr + work->offset. Reads work->length
 * bytes exactly when work->length_exact, else up to work->length bytes and
 * then requires end of file. Sets result.bytes/path; 0 or -1 with work->error.
 */
int transfer_put(struct device *dev, struct work *work);

/* Device memory -> descriptor: work->length bytes from dptr + offset, in order. */
int transfer_get(struct device *dev, struct work *work);

#endif
