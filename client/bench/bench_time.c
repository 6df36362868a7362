/* The benches' clock and median (see bench_time.h). Any thread. */
#include <stdlib.h>
#include <time.h>

#include "client/bench/bench_time.h"

double bench_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double bench_median(double *v, unsigned n)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof v[0], compare_doubles);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
