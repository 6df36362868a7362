/*
 * What the host backend offers its other files (chain_host.c): running a
 * piece of "device" work on the compute engine of the current lane, as a
 * kernel would run, and waiting for it (a job yields meanwhile).
 */
#ifndef GPUQ_BACKEND_HOST_H
#define GPUQ_BACKEND_HOST_H

#include "workers/backend/backend.h"
#include "workers/backend/host_engine.h"

/* Enqueues fn(op) on engine `kind` of the current lane, not waited for. */
int host_backend_enqueue(struct device *dev, enum host_engine_kind kind, host_op_fn fn,
			 const struct host_op *op, struct gpuq_error *err);
int host_backend_compute(struct device *dev, void (*fn)(void *arg), void *arg,
			 struct gpuq_error *err);

#endif
