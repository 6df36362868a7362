/*
 * The host backend's engines: what stands in for a GPU's copy engines and
 * SMs, so that the scheduler's overlap, ordering and priorities are real on
 * machines without a GPU (CI) and the tests can measure them.
 *
 * A host device has one thread per engine (host-to-device copies,
 * device-to-host copies, copies within and between devices, kernels) and
 * streams: ordered queues of operations, as CUDA streams are. An operation
 * runs on its engine's thread once everything before it in its stream has
 * run; events mark a point in a stream, and a stream may wait for another's
 * event (of any host device), as cudaStreamWaitEvent does. Streams of one
 * device run side by side on different engines; on the kernel engine the
 * most urgent stream goes first; a DMA engine (host-to-device,
 * device-to-host) stays with its last stream while that has a copy ready,
 * else takes the copy queued first, whatever its stream, as a GPU's do.
 *
 * Threads: operations are enqueued by the device's worker thread; engine
 * threads run them and tell the device's scheduler (dev->waits->notify) when one
 * completes. One lock serves every host device (it is a test backend).
 */
#ifndef GPUQ_HOST_ENGINE_H
#define GPUQ_HOST_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"

struct device;
struct host_engines;
struct host_stream;
struct host_op;

enum host_engine_kind {
	HOST_ENGINE_H2D,
	HOST_ENGINE_D2H,
	HOST_ENGINE_COPY,
	HOST_ENGINE_COMPUTE,
	HOST_ENGINES
};

/* What an operation does on its engine thread; `op` carries what it was given. */
typedef void (*host_op_fn)(struct host_op *op);

struct host_op {
	host_op_fn fn;
	void *dst;
	const void *src;
	size_t n;
	void *arg; /* anything else the function needs; it must outlive the operation */
};

/* A point in a stream; complete once the stream has run everything before it. */
struct host_event {
	struct host_stream *stream; /* NULL: never recorded, so complete */
	uint64_t seq;
	double at; /* when it completed (CLOCK_MONOTONIC seconds) */
};

/* Starts dev's engine threads (dev->sched is told of completions). */
struct host_engines *host_engines_start(struct device *dev, struct gpuq_error *err);
/* Waits for every stream to drain, stops the threads and frees the streams. */
void host_engines_stop(struct host_engines *e);

struct host_stream *host_stream_create(struct host_engines *e, int priority);
void host_stream_destroy(struct host_stream *s);

/* Enqueues fn(op) on engine `kind` in stream s (op is copied). -1 when out of memory. */
int host_stream_enqueue(struct host_stream *s, enum host_engine_kind kind, host_op_fn fn,
			const struct host_op *op);
/* Marks the stream's present end in ev. -1 when out of memory. */
int host_stream_record(struct host_stream *s, struct host_event *ev);
/* Makes s wait (without blocking anyone) until ev is complete. -1 when out of memory. */
int host_stream_wait_event(struct host_stream *s, struct host_event *ev);

bool host_event_done(const struct host_event *ev);

#endif
