/*
 * The arithmetic of the reducing collectives that the daemon, the tests
 * and the benchmark share: the reduction ops and their names, the elements
 * `fill random` makes, and the reference an output element is checked
 * against. Plain C, header-only, any thread.
 *
 * The reference is computed independently of the host backend's reduction
 * (workers/collective/collective_host_reduce.c): integers exactly, with NCCL's semantics (sums and
 * products wrap; avg divides the wrapped sum by n, truncating toward zero;
 * min and max compare signed for i32/i64, unsigned for u8), floats in double,
 * with a tolerance for the dtype's rounding in whatever order the backend
 * reduced.
 */
#ifndef GPUQ_COLLECTIVE_MATH_H
#define GPUQ_COLLECTIVE_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "protocol/dtype.h"
#include "protocol/hash.h"
#include "protocol/protocol.h"

enum coll_op { COLL_SUM, COLL_PROD, COLL_MIN, COLL_MAX, COLL_AVG };

/* The ops' names, as requests give them. */
#define COLL_OP_LIST "sum, prod, min, max, avg"

static inline const char *coll_op_name(enum coll_op op)
{
	switch (op) {
	case COLL_SUM: return "sum";
	case COLL_PROD: return "prod";
	case COLL_MIN: return "min";
	case COLL_MAX: return "max";
	case COLL_AVG: return "avg";
	}
	return "unknown";
}

/* 0 with *out, or -1 when name is no op. */
static inline int coll_op_from_name(const char *name, enum coll_op *out)
{
	for (int op = COLL_SUM; op <= COLL_AVG; op++) {
		if (strcmp(name, coll_op_name((enum coll_op)op)) == 0) {
			*out = (enum coll_op)op;
			return 0;
		}
	}
	return -1;
}

/* f16, bf16, f32 and f64 (protocol.h). */
static inline bool coll_dtype_is_float(enum gpuq_dtype t)
{
	return gpuq_dtype_is_float(t);
}

/*
 * Element i of a buffer of dtype t filled with `fill random seed`, as its raw
 * bits (little-endian, in the low bytes): protocol/hash.h's definition, the
 * same on every backend.
 */
static inline uint64_t coll_random_element(enum gpuq_dtype t, uint64_t seed, uint64_t i)
{
	switch (t) {
	case GPUQ_DTYPE_F16: return gpuq_uniform_f16_bits(gpuq_random_word(seed, i));
	case GPUQ_DTYPE_BF16: return gpuq_uniform_bf16_bits(gpuq_random_word(seed, i));
	case GPUQ_DTYPE_F32: return gpuq_f32_bits(gpuq_uniform_f32(gpuq_random_word(seed, i)));
	case GPUQ_DTYPE_F64: {
		double d = gpuq_uniform_f64(gpuq_random_word(seed, i));
		uint64_t u;
		memcpy(&u, &d, sizeof u);
		return u;
	}
	case GPUQ_DTYPE_I64: return gpuq_random_word(seed, i);
	case GPUQ_DTYPE_I32: return (gpuq_random_word(seed, i / 2) >> (32 * (i % 2))) & 0xFFFFFFFFu;
	default: return (gpuq_random_word(seed, i / 8) >> (8 * (i % 8))) & 0xFFu; /* u8, bytes */
	}
}

/* A float element's bits as a double (exact). */
static inline double coll_float_value(enum gpuq_dtype t, uint64_t bits)
{
	switch (t) {
	case GPUQ_DTYPE_F16: return gpuq_f16_bits_to_f32((uint16_t)bits);
	case GPUQ_DTYPE_BF16: return gpuq_bf16_bits_to_f32((uint16_t)bits);
	case GPUQ_DTYPE_F32: {
		uint32_t u = (uint32_t)bits;
		float f;
		memcpy(&f, &u, sizeof f);
		return f;
	}
	default: {
		double d;
		memcpy(&d, &bits, sizeof d);
		return d;
	}
	}
}

/* The reference result of an integer reduction of in[0..n), as raw bits. */
static inline uint64_t coll_reference_int(enum gpuq_dtype t, enum coll_op op, int n,
					  const uint64_t *in)
{
	if (t == GPUQ_DTYPE_I64 || t == GPUQ_DTYPE_I32) {
		bool wide = t == GPUQ_DTYPE_I64;
		uint64_t mask = wide ? UINT64_MAX : 0xFFFFFFFFu, acc = in[0] & mask;
		for (int r = 1; r < n; r++) {
			uint64_t x = in[r] & mask;
			int64_t sa = wide ? (int64_t)acc : (int32_t)(uint32_t)acc;
			int64_t sx = wide ? (int64_t)x : (int32_t)(uint32_t)x;
			if (op == COLL_SUM || op == COLL_AVG)
				acc = (acc + x) & mask;
			else if (op == COLL_PROD)
				acc = (acc * x) & mask;
			else if ((op == COLL_MIN) == (sx < sa))
				acc = x;
		}
		if (op == COLL_AVG)
			acc = (uint64_t)((wide ? (int64_t)acc : (int32_t)(uint32_t)acc) / n) & mask;
		return acc;
	}
	uint8_t acc = (uint8_t)in[0];
	for (int r = 1; r < n; r++) {
		uint8_t x = (uint8_t)in[r];
		if (op == COLL_SUM || op == COLL_AVG)
			acc = (uint8_t)(acc + x);
		else if (op == COLL_PROD)
			acc = (uint8_t)(acc * x);
		else if ((op == COLL_MIN) == (x < acc))
			acc = x;
	}
	return op == COLL_AVG ? (uint8_t)(acc / n) : acc;
}

/* The unit roundoff of a float dtype, and the magnitude of its smallest subnormal. */
static inline double coll_epsilon(enum gpuq_dtype t)
{
	switch (t) {
	case GPUQ_DTYPE_F16: return ldexp(1, -11);
	case GPUQ_DTYPE_BF16: return ldexp(1, -8);
	case GPUQ_DTYPE_F32: return ldexp(1, -24);
	default: return ldexp(1, -53);
	}
}

static inline double coll_tiny(enum gpuq_dtype t)
{
	switch (t) {
	case GPUQ_DTYPE_F16: return ldexp(1, -24);
	case GPUQ_DTYPE_BF16: return ldexp(1, -133);
	case GPUQ_DTYPE_F32: return ldexp(1, -149);
	default: return ldexp(1, -1074);
	}
}

/*
 * Whether out is a right result of a float reduction of in[0..n): within
 * 2(n + 2) unit roundoffs of the inputs' magnitude (the rounding of n - 1
 * steps, of avg's 1/n and of its products, in any order), min and max
 * exactly.
 */
static inline bool coll_check_float(enum gpuq_dtype t, enum coll_op op, int n,
				    const uint64_t *in, uint64_t out)
{
	double ref = 0, mag = 0, got = coll_float_value(t, out);
	for (int r = 0; r < n; r++) {
		double x = coll_float_value(t, in[r]);
		if (op == COLL_SUM || op == COLL_AVG) {
			ref += x;
			mag += fabs(x);
		} else if (op == COLL_PROD) {
			ref = r ? ref * x : x;
		} else {
			ref = r == 0 ? x : op == COLL_MIN ? fmin(ref, x) : fmax(ref, x);
		}
	}
	if (op == COLL_AVG) {
		ref /= n;
		mag /= n;
	}
	if (op == COLL_PROD)
		mag = fabs(ref);
	double tol = op == COLL_MIN || op == COLL_MAX
			     ? 0
			     : 2.0 * (n + 2) * coll_epsilon(t) * mag + n * coll_tiny(t);
	return isfinite(got) && fabs(got - ref) <= tol;
}

/* Whether out is the right result of a reduction of in[0..n) in dtype t. */
static inline bool coll_check_element(enum gpuq_dtype t, enum coll_op op, int n,
				      const uint64_t *in, uint64_t out)
{
	if (coll_dtype_is_float(t))
		return coll_check_float(t, op, n, in, out);
	return coll_reference_int(t, op, n, in) == out;
}

#endif
