/*
 * The functions that define gpuq's data patterns and checksum, shared by the
 * CUDA kernels, the host backend, the daemon and the tests so that all produce
 * the same bytes and the same 64-bit hash (docs/protocol.md, Data patterns).
 * Plain C, also compiled as CUDA C++ (__host__ __device__, protocol/dtype.h).
 *
 * checksum(bytes) = mix64(S ^ mix64(n)), where n is the byte count and S is
 * the sum, modulo 2^64, over the 8-byte little-endian words w_i of the data
 * (the last one zero-padded) of mix64(w_i + (i + 1) * GOLDEN). A sum of
 * per-word terms can be computed by any number of threads in any order.
 */
#ifndef GPUQ_HASH_H
#define GPUQ_HASH_H

#include <stdint.h>

#include "protocol/dtype.h"

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
GPUQ_HD uint16_t gpuq_uniform_f16_bits(uint64_t r)
{
	return gpuq_f32_to_f16_bits((float)(r >> 53) * (1.0f / 2048.0f));
}

/* bf16 bits of k * 2^-8 for k = r >> 56: exact in bfloat16. */
GPUQ_HD uint16_t gpuq_uniform_bf16_bits(uint64_t r)
{
	return gpuq_f32_to_bf16_bits((float)(r >> 56) * (1.0f / 256.0f));
}

#endif
