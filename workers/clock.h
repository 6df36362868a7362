/* The one clock gpuq times jobs with. Any thread. */
#ifndef GPUQ_CLOCK_H
#define GPUQ_CLOCK_H

#include <time.h>

/* CLOCK_MONOTONIC in seconds: immune to wall-clock steps. */
static inline double monotonic_seconds(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

#endif
