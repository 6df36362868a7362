/*
 * workers/collective_math.h and the collective's names: the f16/bf16
 * decoders against an independent definition and as exact inverses of
 * kernels/hash.h's encoders, the random elements against host_fill_random,
 * the integer reference's wrapping and rounding, and the float check's
 * tolerance at its edges.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tests/harness.h"
#include "workers/collective.h"
#include "workers/collective_math.h"
#include "workers/host_patterns.h"

TEST(collective_f16_decoder_is_exact_and_inverts_the_encoder)
{
	for (uint32_t h = 0; h < 0x10000u; h++) {
		float f = gpuq_f16_bits_to_f32((uint16_t)h);
		int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
		float sign = (h & 0x8000u) ? -1.0f : 1.0f;
		if (exp == 31) {
			CHECKF(man ? isnan(f) : f == sign * INFINITY, "0x%04x decodes to %g", h, f);
			continue;
		}
		float want = exp ? sign * ldexpf((float)(man | 0x400), exp - 25)
				 : sign * ldexpf((float)man, -24);
		CHECKF(f == want && signbit(f) == signbit(want), "0x%04x decodes to %a, not %a", h,
		       f, want);
		CHECKF(gpuq_f32_to_f16_bits(f) == h, "0x%04x does not survive a round trip", h);
	}
}

TEST(collective_bf16_decoder_inverts_the_encoder)
{
	for (uint32_t b = 0; b < 0x10000u; b++) {
		float f = gpuq_bf16_bits_to_f32((uint16_t)b);
		if (isnan(f))
			continue;
		CHECKF(gpuq_f32_to_bf16_bits(f) == b, "bf16 0x%04x does not survive a round trip", b);
	}
}

TEST(collective_random_elements_are_what_fill_random_writes)
{
	static const enum gpuq_dtype types[] = { GPUQ_DTYPE_U8,  GPUQ_DTYPE_I32, GPUQ_DTYPE_I64,
						 GPUQ_DTYPE_F16, GPUQ_DTYPE_BF16, GPUQ_DTYPE_F32,
						 GPUQ_DTYPE_F64 };
	unsigned char buf[8 * 333];
	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
		size_t sz = gpuq_dtype_size(types[t]), n = sizeof buf / sz;
		host_fill_random(buf, n * sz, types[t], 4242);
		for (size_t i = 0; i < n; i++) {
			uint64_t got = 0;
			memcpy(&got, buf + i * sz, sz);
			CHECKF(got == coll_random_element(types[t], 4242, i), "%s element %zu differs",
			       gpuq_dtype_name(types[t]), i);
		}
	}
}

TEST(collective_integer_reference_wraps_and_truncates_as_nccl)
{
	uint64_t in[3];
	in[0] = 200, in[1] = 100, in[2] = 1;
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_U8, COLL_SUM, 3, in), (200 + 100 + 1) & 0xFF);
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_U8, COLL_AVG, 3, in), ((200 + 100 + 1) & 0xFF) / 3);
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_U8, COLL_MAX, 3, in), 200);
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_U8, COLL_PROD, 2, in), (200 * 100) & 0xFF);
	in[0] = (uint32_t)-7, in[1] = 2, in[2] = 0;
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I32, COLL_AVG, 2, in), (uint32_t)-2); /* -5/2 -> -2 */
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I32, COLL_MIN, 2, in), (uint32_t)-7);
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I32, COLL_MAX, 3, in), 2);
	in[0] = 0x7FFFFFFFu, in[1] = 1;
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I32, COLL_SUM, 2, in), 0x80000000u);
	in[0] = (uint64_t)INT64_MIN, in[1] = (uint64_t)INT64_MIN;
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I64, COLL_SUM, 2, in), 0);
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I64, COLL_MIN, 2, in), (uint64_t)INT64_MIN);
}

static uint64_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

TEST(collective_float_check_takes_rounding_and_nothing_more)
{
	uint64_t in[2] = { f32_bits(0.1f), f32_bits(0.2f) };
	float sum = 0.1f + 0.2f;
	CHECK(coll_check_element(GPUQ_DTYPE_F32, COLL_SUM, 2, in, f32_bits(sum)));
	CHECK(coll_check_element(GPUQ_DTYPE_F32, COLL_SUM, 2, in, f32_bits(nextafterf(sum, 1))));
	CHECK(!coll_check_element(GPUQ_DTYPE_F32, COLL_SUM, 2, in, f32_bits(sum * 1.001f)));
	CHECK(!coll_check_element(GPUQ_DTYPE_F32, COLL_SUM, 2, in, f32_bits(NAN)));
	CHECK(coll_check_element(GPUQ_DTYPE_F32, COLL_MIN, 2, in, in[0]));
	CHECK(!coll_check_element(GPUQ_DTYPE_F32, COLL_MIN, 2, in, f32_bits(nextafterf(0.1f, 1))));
	CHECK(coll_check_element(GPUQ_DTYPE_F32, COLL_AVG, 2, in, f32_bits(sum / 2)));
	uint64_t h[2] = { gpuq_f32_to_f16_bits(0.5f), gpuq_f32_to_f16_bits(0.25f) };
	CHECK(coll_check_element(GPUQ_DTYPE_F16, COLL_PROD, 2, h, gpuq_f32_to_f16_bits(0.125f)));
	CHECK(!coll_check_element(GPUQ_DTYPE_F16, COLL_PROD, 2, h, gpuq_f32_to_f16_bits(0.13f)));
}

TEST(collective_op_names_round_trip)
{
	enum coll_op op;
	for (int i = COLL_SUM; i <= COLL_AVG; i++) {
		CHECK(coll_op_from_name(coll_op_name((enum coll_op)i), &op) == 0);
		CHECK_EQ(op, i);
	}
	CHECK(coll_op_from_name("mean", &op) < 0);
	CHECK(!coll_dtype_supported(COLL_ALLREDUCE, GPUQ_DTYPE_BYTES));
	CHECK(coll_dtype_supported(COLL_BROADCAST, GPUQ_DTYPE_BYTES));
	CHECK(coll_dtype_supported(COLL_REDUCE_SCATTER, GPUQ_DTYPE_BF16));
}
