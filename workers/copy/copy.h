/*
 * Device-to-device copies: the worker side of the `copy` op. Worker threads
 * only; the main thread (daemon/op_copy.c) fills in a struct copy_spec and
 * submits one work (within a device) or a gang of two (between devices).
 *
 * Routes, as op_copy chooses them:
 *  - SAME: source and destination on one device. One work copies in chunks
 *    by the copy engine (cudaMemcpyAsync) or the SM kernel (kernels_copy)
 *    on the device's compute stream, at most two chunks in flight, so that
 *    a cancel is seen between chunks and the GPU never waits for the host.
 *  - PEER: a gang: part 0 on the source device, part 1 on the destination,
 *    with peer access. The source records an event after whatever came
 *    before on its stream and publishes it; the destination makes its
 *    stream wait for it, copies chunk by chunk (cudaMemcpyPeerAsync, read
 *    over the link), records a "done" event and publishes it; the source
 *    makes its stream wait for that, so that no later job on the source
 *    device can overwrite the source early, and both end once the copy is
 *    complete.
 *  - STAGED: a gang over two devices without peer access (or when asked):
 *    the source copies chunks into a ring of portable pinned host memory
 *    (D2H), the destination out of it (H2D), both at once, slot by slot.
 *
 * Every wait between the parts goes through their struct peer_sync (see
 * peer_sync.h): it ends on cancel, on the other part's failure, or after
 * timeout_ms without progress. With verify, each side checksums its own
 * range on its own device and the destination compares (the job fails on
 * a mismatch), so nothing differing is ever reported as a success.
 */
#ifndef GPUQ_COPY_H
#define GPUQ_COPY_H

#include <stdbool.h>
#include <stdint.h>

#include "workers/backend/backend.h"
#include "workers/copy/peer_sync.h"
#include "workers/work.h"

#define COPY_SAME_CHUNK (1ull << 30)   /* within a device: ~0.5 ms per chunk on an H200 */
#define COPY_PEER_CHUNK (256ull << 20) /* over a peer link */
#define COPY_RING_SLOT (8ull << 20)    /* host-staged: one slot of the ring */
#define COPY_RING_SLOTS 4
#define COPY_RING_SLOT_MAX (256ull << 20)
#define COPY_TIMEOUT_MS 60000          /* how long a part waits for the other */

enum copy_route { COPY_ROUTE_SAME, COPY_ROUTE_PEER, COPY_ROUTE_STAGED };

enum copy_part { COPY_PART_SRC = 0, COPY_PART_DST = 1 };

struct copy_spec {
	/* Inputs: set by the main thread before submission, read-only after. */
	enum copy_route route;
	enum copy_engine engine; /* SAME */
	const char *path;        /* what the result says: "ce", "nvlink", "host-staged"... (static) */
	const void *src;         /* the source range's first byte, on src_device */
	void *dst;               /* the destination range's first byte, on dst_device */
	uint64_t bytes;
	int src_device, dst_device;
	uint64_t chunk_bytes; /* the chunk (STAGED: the ring slot) size */
	bool verify;
	char src_label[96], dst_label[96]; /* "w0@1[4096:1048576]", for the result */
	void *timing_end; /* the benchmark's: a destination event recorded after the last chunk */

	/* Outputs (read by the main thread once the job is back). */
	uint64_t src_sum, dst_sum; /* with verify */

	/* Between the parts of a gang: everything below is under sync.lock. */
	struct peer_sync sync;
	void *src_ready;  /* PEER: the source's event, published until the source leaves */
	void *dst_done;   /* PEER: the destination's event after its last chunk */
	bool dst_waited;  /* the destination's stream waits for src_ready */
	bool src_waited;  /* the source's stream waits for dst_done */
	bool src_sum_ready;
	bool dst_started, dst_left; /* STAGED: the destination is using the ring, has stopped */
	void *ring;                 /* STAGED: COPY_RING_SLOTS slots of chunk_bytes (stride) */
	size_t ring_stride;
	uint64_t filled, drained;   /* STAGED: chunks in the ring so far, chunks out of it */
};

/*
 * Gangs: prepares the shared state for parts src_part (on src_device) and
 * dst_part; 0, or -1 when pthread objects cannot be made.
 */
int copy_spec_init_gang(struct copy_spec *s, struct work *src_part, struct work *dst_part,
			unsigned timeout_ms);
void copy_spec_destroy(struct copy_spec *s);

/* WORK_COPY (a row of workers/work_kinds.h): runs work's part of the copy in work->spec. */
int copy_run(struct device *dev, struct work *work);

/*
 * The pieces copy_run is made of, which the benchmark (workers/bench/bench_d2d.c)
 * calls so that it measures exactly what copy jobs do.
 *
 * copy_same: dst <- src on dev in chunks of `chunk` bytes, stopping between
 * chunks when work is cancelled (work may be NULL: never); stores progress
 * in work. Returns with the copy complete (or stopped) and the stream idle.
 * start and end (may be NULL) are timing events recorded right before the
 * first chunk is issued and right after the last.
 */
int copy_same(struct device *dev, struct work *work, void *dst, const void *src, uint64_t n,
	      enum copy_engine engine, uint64_t chunk, void *start, void *end,
	      struct gpuq_error *err);

/* A gang's part (COPY_PART_SRC or COPY_PART_DST) of a PEER or STAGED copy. */
int copy_gang_part(struct device *dev, struct copy_spec *s, enum copy_part part,
		   struct gpuq_error *err);

#endif
