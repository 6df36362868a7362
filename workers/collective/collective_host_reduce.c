/*
 * The host backend's reductions (collective_host.c runs them among the
 * ranks' threads). Any thread: pure functions of their arguments.
 *
 * Semantics, as NCCL's: each element is reduced in rank order in the
 * dtype's own precision, rounding after every step (f16 and bf16 through
 * float and protocol/hash.h's conversions, which is exact: float has more
 * than twice their precision); integers wrap; min and max of floats ignore
 * NaNs (fmin/fmax); avg of floats multiplies each input by 1/n (rounded to
 * the dtype) before the sum, as NCCL's PreMulSum does; avg of integers
 * divides the wrapped sum by n, truncating toward zero.
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "protocol/hash.h"
#include "workers/collective/collective_host.h"

/* Integers: wrapping arithmetic in the low `size` bytes, signed or not. */
static uint64_t int_mask(size_t size)
{
	return size == 8 ? UINT64_MAX : (UINT64_C(1) << (8 * size)) - 1;
}

static int64_t int_signed(uint64_t v, size_t size)
{
	uint64_t sign = UINT64_C(1) << (8 * size - 1);
	return (int64_t)((v ^ sign) - sign); /* sign-extends from bit 8*size-1 */
}

static uint64_t int_step(enum coll_op op, uint64_t a, uint64_t b, size_t size, bool is_signed)
{
	uint64_t mask = int_mask(size);
	switch (op) {
	case COLL_SUM:
	case COLL_AVG: return (a + b) & mask;
	case COLL_PROD: return (a * b) & mask;
	case COLL_MIN:
	case COLL_MAX: {
		bool less = is_signed ? int_signed(a, size) < int_signed(b, size) : a < b;
		return (op == COLL_MIN) == less ? a : b;
	}
	}
	return a;
}

static void reduce_int(const struct host_reduction *h, uint64_t count)
{
	size_t size = gpuq_dtype_size(h->dtype);
	bool is_signed = h->dtype != GPUQ_DTYPE_U8;
	uint64_t mask = int_mask(size);
	for (uint64_t i = 0; i < count; i++) {
		uint64_t acc = 0, x = 0;
		memcpy(&acc, (const char *)h->src[0] + i * size, size); /* little-endian */
		for (int r = 1; r < h->nsrc; r++) {
			memcpy(&x, (const char *)h->src[r] + i * size, size);
			acc = int_step(h->op, acc, x, size, is_signed);
		}
		if (h->op == COLL_AVG && is_signed)
			acc = (uint64_t)(int_signed(acc, size) / h->nsrc) & mask;
		else if (h->op == COLL_AVG)
			acc /= (uint64_t)h->nsrc;
		for (int d = 0; d < h->ndst; d++)
			memcpy((char *)h->dst[d] + i * size, &acc, size);
	}
}

/* Floats: values carried as double, rounded to the dtype after every step. */
static double float_round(double v, enum gpuq_dtype dtype)
{
	switch (dtype) {
	case GPUQ_DTYPE_F16: return gpuq_f16_bits_to_f32(gpuq_f32_to_f16_bits((float)v));
	case GPUQ_DTYPE_BF16: return gpuq_bf16_bits_to_f32(gpuq_f32_to_bf16_bits((float)v));
	case GPUQ_DTYPE_F32: return (float)v;
	default: return v;
	}
}

static double float_load(const void *base, uint64_t i, enum gpuq_dtype dtype)
{
	const char *p = base;
	uint16_t h;
	float f;
	double d;
	switch (dtype) {
	case GPUQ_DTYPE_F16: memcpy(&h, p + i * 2, 2); return gpuq_f16_bits_to_f32(h);
	case GPUQ_DTYPE_BF16: memcpy(&h, p + i * 2, 2); return gpuq_bf16_bits_to_f32(h);
	case GPUQ_DTYPE_F32: memcpy(&f, p + i * 4, 4); return f;
	default: memcpy(&d, p + i * 8, 8); return d;
	}
}

static void float_store(void *base, uint64_t i, enum gpuq_dtype dtype, double v)
{
	char *p = base;
	uint16_t h;
	float f = (float)v;
	switch (dtype) {
	case GPUQ_DTYPE_F16: h = gpuq_f32_to_f16_bits(f); memcpy(p + i * 2, &h, 2); return;
	case GPUQ_DTYPE_BF16: h = gpuq_f32_to_bf16_bits(f); memcpy(p + i * 2, &h, 2); return;
	case GPUQ_DTYPE_F32: memcpy(p + i * 4, &f, 4); return;
	default: memcpy(p + i * 8, &v, 8); return;
	}
}

static double float_step(enum coll_op op, double a, double b, enum gpuq_dtype dtype)
{
	switch (op) {
	case COLL_SUM:
	case COLL_AVG: return float_round(a + b, dtype);
	case COLL_PROD: return float_round(a * b, dtype);
	case COLL_MIN: return fmin(a, b);
	case COLL_MAX: return fmax(a, b);
	}
	return a;
}

static void reduce_float(const struct host_reduction *h, uint64_t count)
{
	enum gpuq_dtype t = h->dtype;
	double scale = float_round(1.0 / h->nsrc, t);
	bool avg = h->op == COLL_AVG;
	for (uint64_t i = 0; i < count; i++) {
		double acc = float_load(h->src[0], i, t);
		if (avg)
			acc = float_round(acc * scale, t);
		for (int r = 1; r < h->nsrc; r++) {
			double x = float_load(h->src[r], i, t);
			acc = float_step(h->op, acc, avg ? float_round(x * scale, t) : x, t);
		}
		for (int d = 0; d < h->ndst; d++)
			float_store(h->dst[d], i, t, acc);
	}
}

void host_reduce(const struct host_reduction *h, uint64_t count)
{
	if (coll_dtype_is_float(h->dtype))
		reduce_float(h, count);
	else
		reduce_int(h, count);
}
