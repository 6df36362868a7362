/*
 * Reductions (the reduce op), both tiers. Sums follow the order
 * docs/protocol.md states (tiles of 16384 elements; thread j of 256 folds
 * items j, j + 256, ... of 4 elements; threads then tiles fold pairwise),
 * which this file implements again on its own: where the reduced values are
 * exactly what the test computes (sums of f32 values, their squares, exact
 * differences), the daemon's result must have the very same bits, on the
 * host backend and on the GPU, compiled and interpreted. Values the GPU and
 * the C library compute differently (sin) are checked against a long-double
 * reference within the stated tolerance. Also: determinism, the count
 * option, empty and one-element reductions, NaN and ties.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/integration/chain_util.h"

#define N 40003 /* two whole tiles and a partial one with a tail */
#define TILE 16384
#define THREADS 256
#define ITEMS 16

/* The stated order over v[0..n) (sq: fold v * v), in double. */
static double order_sum(const double *v, size_t n, bool sq)
{
	size_t tiles = (n + TILE - 1) / TILE;
	double top[THREADS] = { 0 }, s[THREADS];
	for (size_t t = 0; t < tiles; t++) {
		for (size_t j = 0; j < THREADS; j++) {
			double acc = 0;
			for (size_t r = 0; r < ITEMS; r++)
				for (size_t e = 0; e < 4; e++) {
					size_t i = t * TILE + (r * THREADS + j) * 4 + e;
					if (i < n)
						acc = acc + (sq ? v[i] * v[i] : v[i]);
				}
			s[j] = acc;
		}
		for (size_t w = THREADS / 2; w > 0; w /= 2)
			for (size_t j = 0; j < w; j++)
				s[j] = s[j] + s[j + w];
		top[t % THREADS] = top[t % THREADS] + s[0];
	}
	for (size_t w = THREADS / 2; w > 0; w /= 2)
		for (size_t j = 0; j < w; j++)
			top[j] = top[j] + top[j + w];
	return top[0];
}

static bool same_bits(double a, double b)
{
	return memcmp(&a, &b, sizeof a) == 0 || (isnan(a) && isnan(b));
}

/* reduce text compiled and interpreted: the same bits; returns them. */
static double reduce_both(struct gpuq_client *c, const char *text, int64_t count)
{
	double compiled = reduce_ok(c, text, NULL, count);
	double interpreted = reduce_ok(c, text, "interpreted", count);
	CHECKF(same_bits(compiled, interpreted), "%s: compiled %.17g, interpreted %.17g", text,
	       compiled, interpreted);
	return compiled;
}

static void expect_bits(struct gpuq_client *c, const char *text, int64_t count, double want)
{
	double got = reduce_both(c, text, count);
	CHECKF(same_bits(got, want), "%s (count %lld): %.17g, the stated order gives %.17g", text,
	       (long long)count, got, want);
}

TEST(chain_reduce_sums_follow_the_stated_order_bit_for_bit)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	float *x = trandom(&tdtype_f32, N, -1, 1, 41), *y = trandom(&tdtype_f32, N, -1, 1, 42);
	double *v = malloc(N * sizeof *v), *w = malloc(N * sizeof *w);
	talloc(c, "x", &tdtype_f32, N, 0);
	talloc(c, "y", &tdtype_f32, N, 0);
	tput(c, "x", x, N * 4);
	tput(c, "y", y, N * 4);
	for (size_t i = 0; i < N; i++) {
		v[i] = x[i];
		w[i] = fabsf(x[i] - y[i]); /* f32 sub, rounded once: what the kernels compute */
	}
	double sum = order_sum(v, N, false);
	expect_bits(c, "sum(x)", -1, sum);
	expect_bits(c, "mean(x)", -1, sum / N);
	expect_bits(c, "norm2(x)", -1, sqrt(order_sum(v, N, true)));
	expect_bits(c, "sum(abs(x - y))", -1, order_sum(w, N, false));
	expect_bits(c, "sum(x)", 1000, order_sum(v, 1000, false));
	expect_bits(c, "sum(x)", 16384, order_sum(v, 16384, false));
	for (size_t i = 0; i < N; i++)
		w[i] = (double)x[i] * (double)y[i];
	expect_bits(c, "dot(x, y)", -1, order_sum(w, N, false));
	/* Not associative in general: a different order would differ somewhere here. */
	double plain = 0;
	for (size_t i = 0; i < N; i++)
		plain += v[i];
	CHECKF(fabs(plain - sum) <= 1e-12 * N, "the stated order's sum is off: %.17g vs %.17g", sum, plain);
	free(v);
	free(w);
	free(x);
	free(y);
	gpuq_close(c);
	daemon_stop(&d);
}

/* min, max, argmax, count_nonzero: exact; ties go to the first index. */
TEST(chain_reduce_min_max_argmax_count_exact)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	double *x = trandom(&tdtype_f64, N, -3, 3, 43);
	x[100] = x[30000] = 5; /* the largest, twice: argmax is the first */
	x[200] = -7;
	for (size_t i = 0; i < N; i += 97)
		x[i] = 0;
	talloc(c, "x", &tdtype_f64, N, 0);
	tput(c, "x", x, N * 8);
	uint64_t zeros = 0;
	for (size_t i = 0; i < N; i++)
		zeros += x[i] == 0;
	expect_bits(c, "max(x)", -1, 5);
	expect_bits(c, "min(x)", -1, -7);
	expect_bits(c, "argmax(x)", -1, 100);
	expect_bits(c, "argmax(-x)", -1, 200);
	expect_bits(c, "count_nonzero(x)", -1, (double)(N - zeros));
	expect_bits(c, "count_nonzero(x)", 98, 96); /* 0 and 97 are zero */
	tfill_value(c, "x", 2.5);
	expect_bits(c, "argmax(x)", -1, 0);
	expect_bits(c, "max(x * x)", -1, 6.25);
	free(x);
	gpuq_close(c);
	daemon_stop(&d);
}

/* Values computed differently on the GPU and the host: within the stated tolerance. */
TEST(chain_reduce_transcendental_within_tolerance_and_deterministic)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	float *x = trandom(&tdtype_f32, N, -4, 4, 44);
	talloc(c, "x", &tdtype_f32, N, 0);
	tput(c, "x", x, N * 4);
	long double exact = 0, mass = 0;
	for (size_t i = 0; i < N; i++) {
		exact += sinl(x[i]);
		mass += fabsl(sinl(x[i]));
	}
	double first = reduce_both(c, "sum(sin(x))", -1);
	/* Each sinf within 2 ulps of f32 (2^-22 relative), each f64 add within 2^-53 of what it adds. */
	long double bound = mass * (ldexpl(1, -22) + N * ldexpl(1, -53));
	CHECKF(fabsl(first - exact) <= bound, "sum(sin(x)) = %.17g, exact %.17Lg (bound %.3Lg)", first,
	       exact, bound);
	for (int i = 0; i < 3; i++)
		CHECK(same_bits(reduce_ok(c, "sum(sin(x))", NULL, -1), first));
	free(x);
	gpuq_close(c);
	daemon_stop(&d);
}

/* Empty (count 0) and one-element reductions; NaN as stated. */
TEST(chain_reduce_empty_one_element_and_nan)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	talloc(c, "x", &tdtype_f32, 30000, 0);
	talloc(c, "one", &tdtype_f32, 1, 0);
	do_fill_random(c, "x", 45);
	tfill_value(c, "one", -3);
	expect_bits(c, "sum(x)", 0, 0);
	expect_bits(c, "norm2(x)", 0, 0);
	expect_bits(c, "dot(x, x)", 0, 0);
	expect_bits(c, "count_nonzero(x)", 0, 0);
	expect_bits(c, "min(x)", 0, INFINITY);
	expect_bits(c, "max(x)", 0, -INFINITY);
	expect_bits(c, "argmax(x)", 0, -1);
	CHECK(isnan(reduce_both(c, "mean(x)", 0)));
	expect_bits(c, "sum(one)", -1, -3);
	expect_bits(c, "norm2(one)", -1, 3);
	expect_bits(c, "argmax(one)", -1, 0);
	float first = (float)reduce_ok(c, "max(x)", NULL, 1); /* element 0 */
	expect_bits(c, "min(one * x)", 1, (double)(-3.0f * first)); /* one broadcasts; f32 product */
	float *v = tget(c, "x", 30000 * 4);
	v[7] = v[20000] = NAN;
	v[9] = 0;
	tput(c, "x", v, 30000 * 4);
	CHECK(isnan(reduce_both(c, "sum(x)", -1)));
	CHECK(isnan(reduce_both(c, "mean(x)", -1)));
	CHECK(isnan(reduce_both(c, "min(x)", -1)));
	CHECK(isnan(reduce_both(c, "max(x)", -1)));
	expect_bits(c, "argmax(x)", -1, 7); /* the first NaN */
	uint64_t nonzero = 0;
	for (size_t i = 0; i < 30000; i++)
		nonzero += v[i] != 0; /* NaN counts */
	expect_bits(c, "count_nonzero(x)", -1, (double)nonzero);
	expect_bits(c, "max(x)", 7, reduce_ok(c, "max(x)", "interpreted", 7)); /* before the NaN */
	free(v);
	gpuq_close(c);
	daemon_stop(&d);
}
