/*
 * The store functions of copy_store.h. The non-temporal copies align the
 * destination to a cache line with an ordinary copy of the head, stream
 * whole 64-byte lines (so that each write-combining buffer fills and goes
 * out as one line write, never a partial one), fence, and copy the tail
 * ordinarily. Sources may have any alignment (unaligned loads).
 */
#include "workers/transfer/copy_store.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define LINE 64u

void *copy_store_regular(void *restrict dst, const void *restrict src, size_t n)
{
	return memcpy(dst, src, n);
}

/* Bytes to copy ordinarily before dst is line-aligned (at most n). */
static size_t head_bytes(const void *dst, size_t n)
{
	size_t head = (size_t)(-(uintptr_t)dst & (LINE - 1));
	return head < n ? head : n;
}

void *copy_store_nt_sse2(void *restrict dst, const void *restrict src, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *s = src;
	size_t head = head_bytes(d, n);
	memcpy(d, s, head);
	d += head, s += head, n -= head;
	for (; n >= LINE; d += LINE, s += LINE, n -= LINE) {
		__m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
		_mm_stream_si128((__m128i *)(void *)d, a);
		_mm_stream_si128((__m128i *)(void *)(d + 16), b);
		_mm_stream_si128((__m128i *)(void *)(d + 32), c);
		_mm_stream_si128((__m128i *)(void *)(d + 48), e);
	}
	_mm_sfence();
	memcpy(d, s, n);
	return dst;
}

__attribute__((target("avx2"))) void *copy_store_nt_avx2(void *restrict dst,
							  const void *restrict src, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *s = src;
	size_t head = head_bytes(d, n);
	memcpy(d, s, head);
	d += head, s += head, n -= head;
	for (; n >= 2 * LINE; d += 2 * LINE, s += 2 * LINE, n -= 2 * LINE) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(const void *)s);
		__m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(s + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(s + 64));
		__m256i e = _mm256_loadu_si256((const __m256i *)(const void *)(s + 96));
		_mm256_stream_si256((__m256i *)(void *)d, a);
		_mm256_stream_si256((__m256i *)(void *)(d + 32), b);
		_mm256_stream_si256((__m256i *)(void *)(d + 64), c);
		_mm256_stream_si256((__m256i *)(void *)(d + 96), e);
	}
	if (n >= LINE) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(const void *)s);
		__m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(s + 32));
		_mm256_stream_si256((__m256i *)(void *)d, a);
		_mm256_stream_si256((__m256i *)(void *)(d + 32), b);
		d += LINE, s += LINE, n -= LINE;
	}
	_mm_sfence();
	_mm256_zeroupper();
	memcpy(d, s, n);
	return dst;
}

__attribute__((target("avx512f"))) void *copy_store_nt_avx512(void *restrict dst,
							       const void *restrict src, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *s = src;
	size_t head = head_bytes(d, n);
	memcpy(d, s, head);
	d += head, s += head, n -= head;
	for (; n >= 2 * LINE; d += 2 * LINE, s += 2 * LINE, n -= 2 * LINE) {
		__m512i a = _mm512_loadu_si512((const void *)s);
		__m512i b = _mm512_loadu_si512((const void *)(s + 64));
		_mm512_stream_si512((void *)d, a);
		_mm512_stream_si512((void *)(d + 64), b);
	}
	if (n >= LINE) {
		_mm512_stream_si512((void *)d, _mm512_loadu_si512((const void *)s));
		d += LINE, s += LINE, n -= LINE;
	}
	_mm_sfence();
	_mm256_zeroupper();
	memcpy(d, s, n);
	return dst;
}

int copy_store_cpu_has(const char *feature)
{
	__builtin_cpu_init();
	if (strcmp(feature, "avx2") == 0)
		return __builtin_cpu_supports("avx2");
	if (strcmp(feature, "avx512f") == 0)
		return __builtin_cpu_supports("avx512f");
	return 0;
}

copy_store_fn copy_store_pick(enum copy_stores kind, const char **name)
{
	const char *unused;
	if (!name)
		name = &unused;
	if (kind == COPY_STORES_NT && copy_store_cpu_has("avx2")) {
		*name = "nt-avx2";
		return copy_store_nt_avx2;
	}
	if (kind == COPY_STORES_NT) {
		*name = "nt-sse2"; /* every x86-64 has SSE2 */
		return copy_store_nt_sse2;
	}
	*name = "memcpy";
	return copy_store_regular;
}

int copy_store_parse(const char *s, enum copy_stores *kind)
{
	if (strcmp(s, "regular") == 0)
		*kind = COPY_STORES_REGULAR;
	else if (strcmp(s, "nt") == 0)
		*kind = COPY_STORES_NT;
	else
		return -1;
	return 0;
}

static _Atomic int requested = COPY_STORES_NT; /* gpuqd's default too: see options.c */

void copy_store_request(enum copy_stores kind)
{
	atomic_store(&requested, (int)kind);
}

enum copy_stores copy_store_requested(void)
{
	return (enum copy_stores)atomic_load(&requested);
}
