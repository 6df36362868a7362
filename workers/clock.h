/* The one clock gpuq times jobs with, and the deadlines its timed waits take. Any thread. */
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

/*
 * The time `seconds` from now on `clock`, as the timed waits of pthreads
 * take it: CLOCK_MONOTONIC for a condition variable made with that clock,
 * CLOCK_REALTIME for pthread_timedjoin_np.
 */
static inline struct timespec deadline_after(clockid_t clock, double seconds)
{
	struct timespec t;
	clock_gettime(clock, &t);
	double ns = (double)t.tv_nsec + seconds * 1e9;
	t.tv_sec += (time_t)(ns / 1e9);
	t.tv_nsec = (long)(ns - (double)(time_t)(ns / 1e9) * 1e9);
	return t;
}

#endif
