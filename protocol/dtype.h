/*
 * The bit-level encodings of gpuq's element types that every layer shares:
 * float <-> binary16 and float <-> bfloat16, as the kernels, the host
 * backend, the daemon's fill values, the clients and the tests convert
 * them. Plain C, header-only, any thread; also compiled as CUDA C++, where
 * the functions are __host__ __device__.
 */
#ifndef GPUQ_DTYPE_H
#define GPUQ_DTYPE_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define GPUQ_HD __host__ __device__ __forceinline__
#else
#define GPUQ_HD static inline
#endif

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

/* binary16 bits -> float: exact (every half is a float). */
GPUQ_HD float gpuq_f16_bits_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1Fu;
	uint32_t man = h & 0x3FFu;
	uint32_t bits;
	if (exp == 0x1Fu) {
		bits = sign | 0x7F800000u | (man << 13); /* inf, or NaN with its payload */
	} else if (exp != 0) {
		bits = sign | ((exp - 15 + 127) << 23) | (man << 13);
	} else if (man == 0) {
		bits = sign; /* signed zero */
	} else {
		/* subnormal: normalise the mantissa into float's wider exponent range */
		int e = -1;
		do {
			man <<= 1;
			e++;
		} while (!(man & 0x400u));
		bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FFu) << 13);
	}
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

/* bfloat16 bits -> float: exact (bfloat16 is float's top half). */
GPUQ_HD float gpuq_bf16_bits_to_f32(uint16_t b)
{
	uint32_t bits = (uint32_t)b << 16;
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

#endif
