#include "workers/backend/host_patterns.h"

#include <string.h>

#include "protocol/hash.h"

void host_fill_pattern(void *dst, size_t bytes, uint64_t pattern, size_t elem_size)
{
	unsigned char *p = dst;
	unsigned char elem[8];
	for (size_t b = 0; b < 8; b++)
		elem[b] = (unsigned char)(pattern >> (8 * b));
	if (elem_size == 1) {
		memset(p, elem[0], bytes);
		return;
	}
	for (size_t i = 0; i + elem_size <= bytes; i += elem_size)
		memcpy(p + i, elem, elem_size);
}

static void store_le(unsigned char *p, uint64_t v, size_t n)
{
	for (size_t b = 0; b < n; b++)
		p[b] = (unsigned char)(v >> (8 * b));
}

/* One element of value i (iota) in dtype's representation. */
static uint64_t iota_bits(uint64_t i, enum gpuq_dtype dtype)
{
	switch (dtype) {
	case GPUQ_DTYPE_F16: return gpuq_f32_to_f16_bits((float)i);
	case GPUQ_DTYPE_BF16: return gpuq_f32_to_bf16_bits((float)i);
	case GPUQ_DTYPE_F32: return gpuq_f32_bits((float)i);
	case GPUQ_DTYPE_F64: {
		double d = (double)i;
		uint64_t u;
		memcpy(&u, &d, sizeof u);
		return u;
	}
	default: return i; /* integers and bytes: the low bytes, i.e. wrapping */
	}
}

void host_fill_iota(void *dst, size_t count, enum gpuq_dtype dtype)
{
	size_t size = gpuq_dtype_size(dtype);
	unsigned char *p = dst;
	for (size_t i = 0; i < count; i++)
		store_le(p + i * size, iota_bits(i, dtype), size);
}

static uint64_t uniform_bits(uint64_t r, enum gpuq_dtype dtype)
{
	switch (dtype) {
	case GPUQ_DTYPE_F16: return gpuq_uniform_f16_bits(r);
	case GPUQ_DTYPE_BF16: return gpuq_uniform_bf16_bits(r);
	case GPUQ_DTYPE_F32: return gpuq_f32_bits(gpuq_uniform_f32(r));
	default: {
		double d = gpuq_uniform_f64(r);
		uint64_t u;
		memcpy(&u, &d, sizeof u);
		return u;
	}
	}
}

void host_fill_random(void *dst, size_t bytes, enum gpuq_dtype dtype, uint64_t seed)
{
	unsigned char *p = dst;
	if (gpuq_dtype_is_float(dtype)) {
		size_t size = gpuq_dtype_size(dtype);
		for (size_t i = 0; i < bytes / size; i++)
			store_le(p + i * size, uniform_bits(gpuq_random_word(seed, i), dtype), size);
		return;
	}
	size_t words = bytes / 8;
	for (size_t i = 0; i < words; i++)
		store_le(p + i * 8, gpuq_random_word(seed, i), 8);
	if (bytes % 8)
		store_le(p + words * 8, gpuq_random_word(seed, words), bytes % 8);
}

uint64_t host_checksum(const void *src, size_t bytes)
{
	const unsigned char *p = src;
	size_t words = bytes / 8;
	uint64_t sum = 0;
	for (size_t i = 0; i < words; i++) {
		uint64_t w;
		memcpy(&w, p + i * 8, 8); /* little-endian host, as the definition says */
		sum += gpuq_checksum_term(w, i);
	}
	if (bytes % 8) {
		uint64_t w = 0;
		memcpy(&w, p + words * 8, bytes % 8);
		sum += gpuq_checksum_term(w, words);
	}
	return gpuq_checksum_finish(sum, bytes);
}
