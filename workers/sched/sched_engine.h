/*
 * The engines a work keeps busy: what `devices` and the metrics count in
 * flight (workers/sched/sched.c accounts for them). Any thread.
 */
#ifndef GPUQ_SCHED_ENGINE_H
#define GPUQ_SCHED_ENGINE_H

#include "workers/work.h"

enum sched_engine {
	SCHED_ENGINE_H2D,     /* host-to-device copies (put) */
	SCHED_ENGINE_D2H,     /* device-to-host copies (get) */
	SCHED_ENGINE_KERNEL,  /* kernels: fill, checksum, run, SM copies */
	SCHED_ENGINE_COPY,    /* copies within and between devices by the copy engine */
	SCHED_ENGINE_COLLECTIVE,
	SCHED_ENGINE_OTHER,   /* alloc, free, noop */
	SCHED_ENGINES
};
const char *sched_engine_name(enum sched_engine engine);
enum sched_engine sched_engine_of(const struct work *work);

#endif
