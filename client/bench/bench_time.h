/*
 * What every bench times with: the monotonic clock in seconds, and the
 * median of a set of timings. Any thread.
 */
#ifndef GPUQ_BENCH_TIME_H
#define GPUQ_BENCH_TIME_H

/* CLOCK_MONOTONIC, in seconds. */
double bench_now(void);
/* The median of v[0..n) (sorts v); 0 when n is 0. */
double bench_median(double *v, unsigned n);

#endif
