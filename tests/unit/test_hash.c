/*
 * protocol/hash.h and protocol/dtype.h on the host: the float conversions against known bit
 * patterns, the uniform values, the random stream and the checksum's
 * sensitivity. The GPU computes the same functions (tests/gpu checks that);
 * these pin down the definitions themselves.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "protocol/hash.h"
#include "tests/harness.h"

static float f32_from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* binary16 bits -> float, exact for every finite value (test's own decoder). */
static float f16_to_f32(uint16_t h)
{
	float sign = (h & 0x8000u) ? -1.0f : 1.0f;
	int exp = (h >> 10) & 0x1F;
	int man = h & 0x3FF;
	if (exp == 0)
		return sign * ldexpf((float)man, -24);
	if (exp == 31)
		return man ? NAN : sign * INFINITY;
	return sign * ldexpf((float)(man | 0x400), exp - 25);
}

static float bf16_to_f32(uint16_t b)
{
	return f32_from_bits((uint32_t)b << 16);
}

/* The checksum of n bytes, by the definition in hash.h, one byte at a time. */
static uint64_t checksum_ref(const void *data, size_t n)
{
	const unsigned char *p = data;
	uint64_t sum = 0;
	for (size_t i = 0; i * 8 < n; i++) {
		uint64_t w = 0;
		for (size_t b = 0; b < 8 && i * 8 + b < n; b++)
			w |= (uint64_t)p[i * 8 + b] << (8 * b);
		sum += gpuq_checksum_term(w, i);
	}
	return gpuq_checksum_finish(sum, n);
}

TEST(f16_exact_values)
{
	CHECK_EQ(gpuq_f32_to_f16_bits(0.0f), 0x0000);
	CHECK_EQ(gpuq_f32_to_f16_bits(-0.0f), 0x8000);
	CHECK_EQ(gpuq_f32_to_f16_bits(1.0f), 0x3C00);
	CHECK_EQ(gpuq_f32_to_f16_bits(-1.0f), 0xBC00);
	CHECK_EQ(gpuq_f32_to_f16_bits(-2.0f), 0xC000);
	CHECK_EQ(gpuq_f32_to_f16_bits(0.5f), 0x3800);
	CHECK_EQ(gpuq_f32_to_f16_bits(65504.0f), 0x7BFF);
	CHECK_EQ(gpuq_f32_to_f16_bits(-65504.0f), 0xFBFF);
	CHECK_EQ(gpuq_f32_to_f16_bits(ldexpf(1.0f, -14)), 0x0400); /* smallest normal */
	CHECK_EQ(gpuq_f32_to_f16_bits(ldexpf(1.0f, -24)), 0x0001); /* smallest subnormal */
	CHECK_EQ(gpuq_f32_to_f16_bits(ldexpf(1023.0f, -24)), 0x03FF); /* largest subnormal */
}

TEST(f16_overflow_and_specials)
{
	CHECK_EQ(gpuq_f32_to_f16_bits(65519.0f), 0x7BFF);  /* below the midpoint to inf */
	CHECK_EQ(gpuq_f32_to_f16_bits(65520.0f), 0x7C00);  /* the midpoint: ties to even, inf */
	CHECK_EQ(gpuq_f32_to_f16_bits(-65520.0f), 0xFC00);
	CHECK_EQ(gpuq_f32_to_f16_bits(1e10f), 0x7C00);
	CHECK_EQ(gpuq_f32_to_f16_bits(INFINITY), 0x7C00);
	CHECK_EQ(gpuq_f32_to_f16_bits(-INFINITY), 0xFC00);
	uint16_t qnan = gpuq_f32_to_f16_bits(NAN);
	CHECK((qnan & 0x7C00) == 0x7C00 && (qnan & 0x3FF) != 0);
	/* A signalling NaN with only low payload bits must not become inf. */
	uint16_t snan = gpuq_f32_to_f16_bits(f32_from_bits(0xFF800001u));
	CHECK((snan & 0x7C00) == 0x7C00 && (snan & 0x3FF) != 0 && (snan & 0x8000));
}

TEST(f16_rounding_ties_to_even)
{
	/* 1 + 2^-11 is halfway between 0x3C00 and 0x3C01: to the even 0x3C00. */
	CHECK_EQ(gpuq_f32_to_f16_bits(1.0f + ldexpf(1.0f, -11)), 0x3C00);
	/* 1 + 3 * 2^-11 is halfway between 0x3C01 and 0x3C02: to the even 0x3C02. */
	CHECK_EQ(gpuq_f32_to_f16_bits(1.0f + ldexpf(3.0f, -11)), 0x3C02);
	/* Just above a tie rounds up. */
	CHECK_EQ(gpuq_f32_to_f16_bits(1.0f + ldexpf(1.0f, -11) + ldexpf(1.0f, -20)), 0x3C01);
	CHECK_EQ(gpuq_f32_to_f16_bits(1.0f + ldexpf(1.0f, -10)), 0x3C01);
	CHECK_EQ(gpuq_f32_to_f16_bits(-(1.0f + ldexpf(3.0f, -11))), 0xBC02);
	/* 2049 is halfway between 2048 and 2050 (spacing 2 there): to 2048. */
	CHECK_EQ(gpuq_f32_to_f16_bits(2049.0f), 0x6800);
	CHECK_EQ(gpuq_f32_to_f16_bits(2051.0f), 0x6802);
	/* A carry out of the mantissa moves to the next binade. */
	CHECK_EQ(gpuq_f32_to_f16_bits(2047.5f), 0x6800);
}

TEST(f16_subnormal_rounding)
{
	CHECK_EQ(gpuq_f32_to_f16_bits(ldexpf(1.0f, -25)), 0x0000);  /* tie: to even 0 */
	CHECK_EQ(gpuq_f32_to_f16_bits(-ldexpf(1.0f, -25)), 0x8000);
	CHECK_EQ(gpuq_f32_to_f16_bits(ldexpf(3.0f, -26)), 0x0001);  /* above the tie */
	CHECK_EQ(gpuq_f32_to_f16_bits(ldexpf(3.0f, -25)), 0x0002);  /* 1.5 ulp: tie to even 2 */
	CHECK_EQ(gpuq_f32_to_f16_bits(ldexpf(5.0f, -25)), 0x0002);  /* 2.5 ulp: tie to even 2 */
	CHECK_EQ(gpuq_f32_to_f16_bits(ldexpf(1.0f, -26)), 0x0000);
	CHECK_EQ(gpuq_f32_to_f16_bits(1e-10f), 0x0000);
	CHECK_EQ(gpuq_f32_to_f16_bits(-1e-10f), 0x8000);
	/* Halfway between the largest subnormal and the smallest normal: to 0x0400. */
	CHECK_EQ(gpuq_f32_to_f16_bits(ldexpf(2047.0f, -25)), 0x0400);
}

/* Every finite f16 value converts to itself. */
TEST(f16_round_trip_all)
{
	for (uint32_t h = 0; h < 0x10000u; h++) {
		if ((h & 0x7C00u) == 0x7C00u)
			continue;
		uint16_t back = gpuq_f32_to_f16_bits(f16_to_f32((uint16_t)h));
		CHECKF(back == h, "f16 0x%04x came back as 0x%04x", (unsigned)h, (unsigned)back);
	}
}

TEST(bf16_values)
{
	CHECK_EQ(gpuq_f32_to_bf16_bits(1.0f), 0x3F80);
	CHECK_EQ(gpuq_f32_to_bf16_bits(-1.0f), 0xBF80);
	CHECK_EQ(gpuq_f32_to_bf16_bits(3.0f), 0x4040);
	CHECK_EQ(gpuq_f32_to_bf16_bits(0.0f), 0x0000);
	CHECK_EQ(gpuq_f32_to_bf16_bits(-0.0f), 0x8000);
	CHECK_EQ(gpuq_f32_to_bf16_bits(INFINITY), 0x7F80);
	CHECK_EQ(gpuq_f32_to_bf16_bits(-INFINITY), 0xFF80);
	CHECK_EQ(gpuq_f32_to_bf16_bits(f32_from_bits(0x7F7FFFFFu)), 0x7F80); /* FLT_MAX rounds up */
	uint16_t qnan = gpuq_f32_to_bf16_bits(NAN);
	CHECK((qnan & 0x7F80) == 0x7F80 && (qnan & 0x7F) != 0);
	uint16_t snan = gpuq_f32_to_bf16_bits(f32_from_bits(0x7F800001u));
	CHECK((snan & 0x7F80) == 0x7F80 && (snan & 0x7F) != 0);
}

TEST(bf16_rounding_ties_to_even)
{
	/* bf16 keeps 7 mantissa bits: 1 + 2^-8 is a tie between 0x3F80 and 0x3F81. */
	CHECK_EQ(gpuq_f32_to_bf16_bits(1.0f + ldexpf(1.0f, -8)), 0x3F80);
	CHECK_EQ(gpuq_f32_to_bf16_bits(1.0f + ldexpf(3.0f, -8)), 0x3F82);
	CHECK_EQ(gpuq_f32_to_bf16_bits(1.0f + ldexpf(1.0f, -8) + ldexpf(1.0f, -20)), 0x3F81);
	CHECK_EQ(gpuq_f32_to_bf16_bits(-(1.0f + ldexpf(3.0f, -8))), 0xBF82);
	CHECK_EQ(gpuq_f32_to_bf16_bits(257.0f), 0x4380); /* 256..258 tie: 256 */
	CHECK_EQ(gpuq_f32_to_bf16_bits(259.0f), 0x4382); /* 258..260 tie: 260 */
}

TEST(uniform_ranges)
{
	CHECK(gpuq_uniform_f64(0) == 0.0);
	CHECK(gpuq_uniform_f64(UINT64_MAX) < 1.0);
	CHECK(gpuq_uniform_f64(UINT64_MAX) == 1.0 - ldexp(1.0, -53));
	CHECK(gpuq_uniform_f32(0) == 0.0f);
	CHECK(gpuq_uniform_f32(UINT64_MAX) < 1.0f);
	CHECK(gpuq_uniform_f32(UINT64_MAX) == 1.0f - ldexpf(1.0f, -24));
	CHECK_EQ(gpuq_uniform_f16_bits(UINT64_MAX), 0x3BFF); /* 2047/2048 */
	CHECK_EQ(gpuq_uniform_bf16_bits(UINT64_MAX), 0x3F7F); /* 255/256 */
	for (uint64_t i = 0; i < 100000; i++) {
		uint64_t r = gpuq_random_word(42, i);
		double d = gpuq_uniform_f64(r);
		float f = gpuq_uniform_f32(r);
		CHECKF(d >= 0.0 && d < 1.0, "f64 %g from word %" PRIu64, d, i);
		CHECKF(f >= 0.0f && f < 1.0f, "f32 %g from word %" PRIu64, (double)f, i);
		float h = f16_to_f32(gpuq_uniform_f16_bits(r));
		float b = bf16_to_f32(gpuq_uniform_bf16_bits(r));
		CHECKF(h >= 0.0f && h < 1.0f, "f16 %g from word %" PRIu64, (double)h, i);
		CHECKF(b >= 0.0f && b < 1.0f, "bf16 %g from word %" PRIu64, (double)b, i);
	}
}

/* Every k gives exactly k * 2^-11 (f16) or k * 2^-8 (bf16), whatever the low bits. */
TEST(uniform_half_types_exact)
{
	for (uint64_t k = 0; k < 2048; k++) {
		uint64_t r = (k << 53) | (gpuq_random_word(7, k) >> 11);
		float v = f16_to_f32(gpuq_uniform_f16_bits(r));
		CHECKF(v == ldexpf((float)k, -11), "f16 of k=%" PRIu64 " is %.9g", k, (double)v);
	}
	for (uint64_t k = 0; k < 256; k++) {
		uint64_t r = (k << 56) | (gpuq_random_word(7, k) >> 8);
		float v = bf16_to_f32(gpuq_uniform_bf16_bits(r));
		CHECKF(v == ldexpf((float)k, -8), "bf16 of k=%" PRIu64 " is %.9g", k, (double)v);
	}
}

/* The random stream is splitmix64: seed 0 gives its well-known first outputs. */
TEST(random_word_is_splitmix64)
{
	CHECK_EQ(gpuq_random_word(0, 0), 0xE220A8397B1DCDAFull);
	CHECK_EQ(gpuq_random_word(0, 1), 0x6E789E6AA1B965F4ull);
	CHECK_EQ(gpuq_random_word(0, 2), 0x06C45D188009454Full);
	CHECK(gpuq_random_word(1, 0) != gpuq_random_word(0, 0));
	CHECK_EQ(gpuq_mix64(0), 0);
}

TEST(checksum_same_bytes_same_hash)
{
	unsigned char a[100], b[100];
	for (size_t i = 0; i < sizeof a; i++)
		a[i] = (unsigned char)gpuq_random_word(3, i);
	memcpy(b, a, sizeof a);
	CHECK_EQ(checksum_ref(a, sizeof a), checksum_ref(b, sizeof b));
	CHECK_EQ(checksum_ref(a, sizeof a), checksum_ref(a, sizeof a));
}

TEST(checksum_every_bit_flip_changes_it)
{
	unsigned char buf[67];
	for (size_t i = 0; i < sizeof buf; i++)
		buf[i] = (unsigned char)gpuq_random_word(5, i);
	uint64_t base = checksum_ref(buf, sizeof buf);
	for (size_t bit = 0; bit < 8 * sizeof buf; bit++) {
		buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
		uint64_t flipped = checksum_ref(buf, sizeof buf);
		buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
		CHECKF(flipped != base, "flipping bit %zu left the checksum unchanged", bit);
	}
	CHECK_EQ(checksum_ref(buf, sizeof buf), base);
}

TEST(checksum_length_and_position_matter)
{
	/* "a" and "a\0" pad to the same word: only the length tells them apart. */
	CHECK(checksum_ref("a", 1) != checksum_ref("a\0", 2));
	CHECK(checksum_ref("", 0) != checksum_ref("\0", 1));
	unsigned char zeros[16] = { 0 };
	CHECK(checksum_ref(zeros, 8) != checksum_ref(zeros, 16));
	/* The same two words in the other order. */
	uint64_t w[2] = { 0x0123456789ABCDEFull, 0xFEDCBA9876543210ull };
	uint64_t s[2] = { w[1], w[0] };
	CHECK(checksum_ref(w, sizeof w) != checksum_ref(s, sizeof s));
}

/* The sum is order-free: any split into partial sums gives the same result. */
TEST(checksum_partial_sums_commute)
{
	uint64_t words[33], forward = 0, backward = 0, halves[2] = { 0, 0 };
	for (size_t i = 0; i < 33; i++)
		words[i] = gpuq_random_word(9, i);
	for (size_t i = 0; i < 33; i++) {
		forward += gpuq_checksum_term(words[i], i);
		backward += gpuq_checksum_term(words[32 - i], 32 - i);
		halves[i % 2] += gpuq_checksum_term(words[i], i);
	}
	CHECK_EQ(forward, backward);
	CHECK_EQ(forward, halves[0] + halves[1]);
	CHECK_EQ(gpuq_checksum_finish(forward, sizeof words), checksum_ref(words, sizeof words));
}
