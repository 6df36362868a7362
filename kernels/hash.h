/*
 * The functions that define gpuq's data patterns and checksum, shared by the
 * CUDA kernels and the host backend so that both produce the same bytes and
 * the same 64-bit hash. Plain C, also compiled as CUDA C++ (__host__ __device__).
 *
 * checksum(bytes) = mix64(S ^ mix64(n)), where n is the byte count and S is
 * the sum, modulo 2^64, over the 8-byte little-endian words w_i of the data
 * (the last one zero-padded) of mix64(w_i + (i + 1) * GOLDEN). A sum of
 * per-word terms can be computed by any number of threads in any order.
 */
#ifndef GPUQ_HASH_H
#define GPUQ_HASH_H

#include <stdint.h>

#if defined(__CUDACC__)
#define GPUQ_HD __host__ __device__ __forceinline__
#else
#define GPUQ_HD static inline
#endif

#define GPUQ_GOLDEN 0x9E3779B97F4A7C15ull

/* splitmix64's finaliser: a bijection that scrambles every bit. */
GPUQ_HD uint64_t gpuq_mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 27;
	x *= 0x94D049BB133111EBull;
	x ^= x >> 31;
	return x;
}

/* Word i of the random stream for seed: counter-based, so any thread can make any word. */
GPUQ_HD uint64_t gpuq_random_word(uint64_t seed, uint64_t i)
{
	return gpuq_mix64(seed + (i + 1) * GPUQ_GOLDEN);
}

GPUQ_HD uint64_t gpuq_checksum_term(uint64_t word, uint64_t i)
{
	return gpuq_mix64(word + (i + 1) * GPUQ_GOLDEN);
}

GPUQ_HD uint64_t gpuq_checksum_finish(uint64_t sum, uint64_t nbytes)
{
	return gpuq_mix64(sum ^ gpuq_mix64(nbytes));
}

/*
 * Uniform values in [0, 1) from a random word, exactly representable in each
 * type so that every backend produces the same bits.
 */
GPUQ_HD double gpuq_uniform_f64(uint64_t r)
{
	return (double)(r >> 11) * (1.0 / 9007199254740992.0); /* 2^-53 */
}

GPUQ_HD float gpuq_uniform_f32(uint64_t r)
{
	return (float)(r >> 40) * (1.0f / 16777216.0f); /* 2^-24 */
}

/* f16 bits of k * 2^-11 for k = r >> 53 (11 bits): exact in binary16. */
GPUQ_HD uint16_t gpuq_uniform_f16_bits(uint64_t r);
/* bf16 bits of k * 2^-8 for k = r >> 56: exact in bfloat16. */
GPUQ_HD uint16_t gpuq_uniform_bf16_bits(uint64_t r);

GPUQ_HD uint32_t gpuq_f32_bits(float f)
{
	union {
		float f;
		uint32_t u;
	} v;
	v.f = f;
	return v.u;
}

/* float -> binary16, round to nearest even; NaN stays NaN, overflow gives inf. */
GPUQ_HD uint16_t gpuq_f32_to_f16_bits(float f)
{
	uint32_t x = gpuq_f32_bits(f);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t exp = (x >> 23) & 0xFFu;
	uint32_t man = x & 0x7FFFFFu;
	if (exp == 0xFFu)
		return (uint16_t)(sign | 0x7C00u | (man ? 0x200u : 0u));
	int e = (int)exp - 127 + 15;
	if (e >= 31)
		return (uint16_t)(sign | 0x7C00u);
	if (e <= 0) {
		if (e < -10)
			return (uint16_t)sign;
		man |= 0x800000u;
		uint32_t shift = (uint32_t)(14 - e);
		uint32_t half = man >> shift;
		uint32_t rem = man & ((1u << shift) - 1u);
		uint32_t mid = 1u << (shift - 1u);
		if (rem > mid || (rem == mid && (half & 1u)))
			half++;
		return (uint16_t)(sign | half);
	}
	uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13);
	uint32_t rem = man & 0x1FFFu;
	if (rem > 0x1000u || (rem == 0x1000u && (half & 1u)))
		half++; /* a carry into the exponent is still the right rounding */
	return (uint16_t)half;
}

/* float -> bfloat16, round to nearest even; NaN stays NaN. */
GPUQ_HD uint16_t gpuq_f32_to_bf16_bits(float f)
{
	uint32_t x = gpuq_f32_bits(f);
	if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu))
		return (uint16_t)((x >> 16) | 0x40u);
	uint32_t lsb = (x >> 16) & 1u;
	x += 0x7FFFu + lsb;
	return (uint16_t)(x >> 16);
}

GPUQ_HD uint16_t gpuq_uniform_f16_bits(uint64_t r)
{
	return gpuq_f32_to_f16_bits((float)(r >> 53) * (1.0f / 2048.0f));
}

GPUQ_HD uint16_t gpuq_uniform_bf16_bits(uint64_t r)
{
	return gpuq_f32_to_bf16_bits((float)(r >> 56) * (1.0f / 256.0f));
}

#endif
