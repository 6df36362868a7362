/*
 * What the host backend offers its other files (chain_host.c): running a
 * piece of "device" work on the compute engine of the current lane, as a
 * kernel would run, and waiting for it (a job yields meanwhile).
 */
#ifndef GPUQ_BACKEND_HOST_H
#define GPUQ_BACKEND_HOST_H

#include "workers/backend.h"

int host_backend_compute(struct device *dev, void (*fn)(void *arg), void *arg,
			 struct gpuq_error *err);

#endif
