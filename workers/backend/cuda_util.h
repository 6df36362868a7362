/*
 * The CUDA backend's device state and lanes, and the helpers that every
 * CUDA file of workers/ shares: the stream device work goes on now, waits
 * for events that yield to the scheduler instead of blocking the worker,
 * and the failure reporting behind cuda_check.h's macros. Nothing here
 * calls the backend's table or the chain, collective or job code above
 * it: backend_cuda.c, chain_cuda.c, collective_cuda.c, cuda_vmm.c and
 * fault_inject.c call down into this file, and it waits through the
 * scheduler's hooks in dev->waits (backend.h), never by name.
 *
 * Threads: the device's worker thread only (backend.h).
 */
#ifndef GPUQ_CUDA_UTIL_H
#define GPUQ_CUDA_UTIL_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#include "protocol/protocol.h"
#include "workers/backend/backend.h"
#include "workers/backend/cuda_check.h"

struct slab_heap;

/*
 * A lane (backend.h): one job's stream, the event its waits are on, and its
 * own checksum words, so that jobs in flight together share nothing.
 */
struct cuda_lane {
	cudaStream_t stream;
	cudaEvent_t done;
	unsigned long long *d_sum, *h_sum;
};

/* What dev->impl holds on the CUDA backend: made by backend_cuda.c's open, freed by its close. */
struct cuda_state {
	cudaStream_t compute, h2d, d2h;
	cudaEvent_t sync_done; /* what waits on the device's own streams (outside jobs) use */
	cudaMemPool_t pool;
	void *staging; /* one pinned block holding every slot */
	size_t ring_mapped; /* bytes mmap'ed on the GPU's node and registered; 0: cudaHostAlloc */
	cudaEvent_t slot_done[GPUQ_MAX_STAGING_SLOTS];
	unsigned long long *d_sum; /* the checksum kernel's accumulator */
	unsigned long long *h_sum; /* pinned: where d_sum is copied back */
	bool peer_enabled[GPUQ_MAX_DEVICES]; /* by gpuq index: what close disables */
	/* Live allocations from the pool, so that close can free what clients left. */
	void **live;
	size_t nlive, live_cap;
	/*
	 * Slabs (workers/buffer/slab.h, each a cuda_vmm.h allocation): every
	 * shareable buffer's, and every buffer's when use_slabs (--buffer-memory);
	 * close gives back what is left. slab_oom: the last slab creation ran
	 * out of device memory (the driver said so), so that alloc can word it.
	 */
	struct slab_heap *slabs;
	bool use_slabs;
	bool slab_oom;
};


/* The stream device work goes on: the running job's lane, else the device's own `fallback`. */
static inline cudaStream_t cuda_stream(const struct device *dev, cudaStream_t fallback)
{
	const struct cuda_lane *lane = dev->lane;
	return lane ? lane->stream : fallback;
}

/* The stream device work goes on now: the running job's lane, or the device's compute stream outside jobs. */
static inline cudaStream_t cuda_current_stream(const struct device *dev)
{
	const struct cuda_state *st = dev->impl;
	return cuda_stream(dev, st->compute);
}

/* An event being waited for, and what CUDA last said of it. */
struct cuda_event_poll {
	cudaEvent_t event;
	cudaError_t result;
};

/*
 * A wait's predicate: the event is complete, or CUDA reports an error
 * instead (p->result says which). Inline: event_query and every poll of a
 * wait look through it.
 */
static inline bool cuda_event_settled(void *arg)
{
	struct cuda_event_poll *p = arg;
	p->result = cudaEventQuery(p->event);
	if (p->result != cudaErrorNotReady)
		return true;
	(void)cudaGetLastError(); /* "not ready" is an answer, not an error to report later */
	return false;
}

/*
 * Waits for event without blocking the worker: a job yields to the
 * scheduler until the event is complete (code outside jobs polls). 0, or
 * -1 with err set (cuda_fail's) when CUDA reports an error instead.
 */
int cuda_wait_event(struct device *dev, cudaEvent_t event, const char *what, struct gpuq_error *err);
/* Waits for everything enqueued so far on the current stream (the lane's, or compute). */
int cuda_sync(struct device *dev, struct gpuq_error *err);

#endif
