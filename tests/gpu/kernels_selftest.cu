/*
 * A standalone GPU self-test of the kernels in kernels/: every launcher's
 * output, computed on the device, against the definitions in kernels/hash.h
 * computed here on the host, over awkward sizes and destination offsets. The
 * device memory is poisoned with 0xAB first, and the bytes around each output
 * must keep it (nothing written before or after).
 *
 *   nvcc -std=c++17 -arch=sm_90 -I. tests/gpu/kernels_selftest.cu \
 *        kernels/fill.cu kernels/checksum.cu -o kernels_selftest
 *   ./kernels_selftest          the standard cases (under 1 GiB of device memory)
 *   ./kernels_selftest --big    also > 4 GiB cases (about 17 GiB of device memory)
 *
 * Ends with "N passed, N failed"; exits 1 if a case failed, 2 if CUDA did.
 */
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/hash.h"
#include "kernels/kernels.h"

#define CUDA_OK(call)                                                                  \
	do {                                                                           \
		cudaError_t e_ = (call);                                               \
		if (e_ != cudaSuccess) {                                               \
			fprintf(stderr, "%s failed: %s (%s) at %s:%d\n", #call,        \
				cudaGetErrorString(e_), cudaGetErrorName(e_), __FILE__, \
				__LINE__);                                             \
			exit(2);                                                       \
		}                                                                      \
	} while (0)

static const size_t kSizes[] = { 0, 1, 7, 8, 15, 16, 17, 4096 + 1, (64u << 20) + 3 };
static const size_t kMaxSize = (64u << 20) + 3;
static const size_t kOffsets[] = { 0, 1, 3, 8, 5, 12 }; /* 5 and 12: more shifts */
static const size_t kGuard = 64;                         /* poisoned bytes either side */
static const uint8_t kPoison = 0xAB;
static const kernels_dtype kDtypes[] = { KERNELS_BYTES, KERNELS_U8,  KERNELS_I32, KERNELS_I64,
					 KERNELS_F16,   KERNELS_BF16, KERNELS_F32, KERNELS_F64 };

static int g_passed, g_failed;
static uint8_t *g_dev;            /* scratch: kGuard + offset + output + kGuard */
static std::vector<uint8_t> g_back; /* what came back from the device */

static size_t dtype_size(kernels_dtype t)
{
	switch (t) {
	case KERNELS_BYTES:
	case KERNELS_U8: return 1;
	case KERNELS_F16:
	case KERNELS_BF16: return 2;
	case KERNELS_I32:
	case KERNELS_F32: return 4;
	case KERNELS_I64:
	case KERNELS_F64: return 8;
	}
	return 0;
}

static const char *dtype_name(kernels_dtype t)
{
	static const char *names[] = { "bytes", "u8", "i32", "i64", "f16", "bf16", "f32", "f64" };
	return names[t];
}

static bool is_float(kernels_dtype t)
{
	return t == KERNELS_F16 || t == KERNELS_BF16 || t == KERNELS_F32 || t == KERNELS_F64;
}

static void fail(const char *what, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stdout, "FAIL %s: ", what);
	vfprintf(stdout, fmt, ap);
	fputc('\n', stdout);
	va_end(ap);
	g_failed++;
}

static void store_le(uint8_t *p, uint64_t v, size_t n)
{
	for (size_t b = 0; b < n; b++)
		p[b] = (uint8_t)(v >> (8 * b));
}

static uint64_t f64_bits(double d)
{
	uint64_t u;
	memcpy(&u, &d, sizeof u);
	return u;
}

/* The references, straight from the definitions in kernels/hash.h. */

static std::vector<uint8_t> ref_random(kernels_dtype t, uint64_t seed, size_t bytes)
{
	std::vector<uint8_t> v(bytes);
	if (!is_float(t)) {
		/* Byte j is byte j % 8 of word j / 8. */
		for (size_t k = 0; k * 8 < bytes; k++) {
			size_t left = bytes - k * 8;
			store_le(&v[k * 8], gpuq_random_word(seed, k), left < 8 ? left : 8);
		}
		return v;
	}
	size_t e = dtype_size(t);
	for (size_t i = 0; i < bytes / e; i++) {
		uint64_t r = gpuq_random_word(seed, i), bits = 0;
		switch (t) {
		case KERNELS_F16: bits = gpuq_uniform_f16_bits(r); break;
		case KERNELS_BF16: bits = gpuq_uniform_bf16_bits(r); break;
		case KERNELS_F32: bits = gpuq_f32_bits(gpuq_uniform_f32(r)); break;
		default: bits = f64_bits(gpuq_uniform_f64(r)); break;
		}
		store_le(&v[i * e], bits, e);
	}
	return v;
}

static uint64_t iota_bits(kernels_dtype t, uint64_t i)
{
	switch (t) {
	case KERNELS_F16: return gpuq_f32_to_f16_bits((float)i);
	case KERNELS_BF16: return gpuq_f32_to_bf16_bits((float)i);
	case KERNELS_F32: return gpuq_f32_bits((float)i);
	case KERNELS_F64: return f64_bits((double)i);
	default: return i; /* integers: the low bytes, i.e. wrapping */
	}
}

static std::vector<uint8_t> ref_iota(kernels_dtype t, size_t count)
{
	size_t e = dtype_size(t);
	std::vector<uint8_t> v(count * e);
	for (size_t i = 0; i < count; i++)
		store_le(&v[i * e], iota_bits(t, i), e);
	return v;
}

static std::vector<uint8_t> ref_pattern(uint64_t pattern, size_t e, size_t bytes)
{
	std::vector<uint8_t> v(bytes);
	for (size_t j = 0; j < bytes; j++)
		v[j] = (uint8_t)(pattern >> (8 * (j % e)));
	return v;
}

/* Word i is bytes 8i..8i+7, little-endian, the last one zero-padded. */
static uint64_t ref_checksum(const uint8_t *p, size_t n)
{
	uint64_t sum = 0;
	for (size_t i = 0; i * 8 < n; i++) {
		uint64_t w = 0;
		size_t left = n - i * 8;
		for (size_t b = 0; b < 8 && b < left; b++)
			w |= (uint64_t)p[i * 8 + b] << (8 * b);
		sum += gpuq_checksum_term(w, i);
	}
	return gpuq_checksum_finish(sum, n);
}

/* Poisons the scratch around an output of bytes at offset off; returns the output. */
static uint8_t *poisoned(size_t off, size_t bytes)
{
	CUDA_OK(cudaMemset(g_dev, kPoison, kGuard + off + bytes + kGuard));
	return g_dev + kGuard + off;
}

/* Checks a launcher's result: its return, the output, and the untouched guards. */
static void verify(const char *what, cudaError_t launched, size_t off,
		   const std::vector<uint8_t> &want)
{
	if (launched != cudaSuccess) {
		fail(what, "launcher returned %s", cudaGetErrorName(launched));
		return;
	}
	size_t bytes = want.size(), span = kGuard + off + bytes + kGuard;
	CUDA_OK(cudaDeviceSynchronize());
	g_back.resize(span);
	CUDA_OK(cudaMemcpy(g_back.data(), g_dev, span, cudaMemcpyDeviceToHost));
	const uint8_t *got = g_back.data() + kGuard + off;
	for (size_t i = 0; i < kGuard + off; i++)
		if (g_back[i] != kPoison)
			return fail(what, "wrote %zu bytes before the output", kGuard + off - i);
	for (size_t i = 0; i < kGuard; i++)
		if (got[bytes + i] != kPoison)
			return fail(what, "wrote past the end, at +%zu", i);
	if (bytes != 0 && memcmp(got, want.data(), bytes) != 0)
		for (size_t i = 0; i < bytes; i++)
			if (got[i] != want[i])
				return fail(what, "byte %zu of %zu is 0x%02x, want 0x%02x", i,
					    bytes, got[i], want[i]);
	g_passed++;
}

/* Offsets a dtype may be written at: any for byte streams, element-aligned otherwise. */
static bool offset_ok(size_t off, size_t e)
{
	return off % e == 0;
}

static void random_cases(void)
{
	char what[128];
	uint64_t seed = 0;
	for (kernels_dtype t : kDtypes) {
		size_t e = is_float(t) ? dtype_size(t) : 1;
		for (size_t size : kSizes) {
			size_t bytes = size - size % e;
			for (size_t off : kOffsets) {
				if (!offset_ok(off, e))
					continue;
				snprintf(what, sizeof what, "random %s bytes=%zu off=%zu seed=%llu",
					 dtype_name(t), bytes, off, (unsigned long long)seed);
				uint8_t *dst = poisoned(off, bytes);
				cudaError_t e_ = kernels_fill_random(dst, bytes, t, seed, 0);
				verify(what, e_, off, ref_random(t, seed, bytes));
				seed = seed * 31 + 0x9E37;
			}
		}
	}
}

static void iota_cases(void)
{
	char what[128];
	for (kernels_dtype t : kDtypes) {
		size_t e = dtype_size(t);
		for (size_t count : kSizes) {
			for (size_t off : kOffsets) {
				if (!offset_ok(off, e))
					continue;
				snprintf(what, sizeof what, "iota %s count=%zu off=%zu", dtype_name(t),
					 count, off);
				uint8_t *dst = poisoned(off, count * e);
				cudaError_t e_ = kernels_fill_iota(dst, count, t, 0);
				verify(what, e_, off, ref_iota(t, count));
			}
		}
	}
}

static void pattern_cases(void)
{
	char what[128];
	static const unsigned sizes[] = { 1, 2, 4, 8 };
	uint64_t pattern = 0x0123456789ABCDEFull;
	for (unsigned e : sizes) {
		for (size_t size : kSizes) {
			size_t bytes = size - size % e;
			for (size_t off : kOffsets) {
				if (!offset_ok(off, e))
					continue;
				snprintf(what, sizeof what, "pattern elem=%u bytes=%zu off=%zu", e,
					 bytes, off);
				uint8_t *dst = poisoned(off, bytes);
				cudaError_t e_ = kernels_fill_pattern(dst, bytes, pattern, e, 0);
				verify(what, e_, off, ref_pattern(pattern, e, bytes));
				pattern = gpuq_mix64(pattern);
			}
		}
	}
}

/* The device sum of a host buffer placed at src, against the reference. */
static void checksum_one(const char *what, const uint8_t *host, uint8_t *src, size_t bytes,
			 unsigned long long *d_sum)
{
	unsigned long long sum;
	CUDA_OK(cudaMemcpy(src, host, bytes, cudaMemcpyHostToDevice));
	CUDA_OK(cudaMemset(d_sum, kPoison, sizeof *d_sum)); /* the launcher must zero it */
	cudaError_t e = kernels_checksum_sum(src, bytes, d_sum, 0);
	if (e != cudaSuccess)
		return fail(what, "launcher returned %s", cudaGetErrorName(e));
	CUDA_OK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
	uint64_t got = gpuq_checksum_finish(sum, bytes), want = ref_checksum(host, bytes);
	if (got != want)
		return fail(what, "checksum %016llx, want %016llx", (unsigned long long)got,
			    (unsigned long long)want);
	g_passed++;
}

static void checksum_cases(void)
{
	char what[128];
	unsigned long long *d_sum;
	CUDA_OK(cudaMalloc(&d_sum, sizeof *d_sum));
	std::vector<uint8_t> data = ref_random(KERNELS_BYTES, 0xC0FFEE, kMaxSize);
	for (size_t size : kSizes) {
		for (size_t off : kOffsets) {
			snprintf(what, sizeof what, "checksum bytes=%zu off=%zu", size, off);
			checksum_one(what, data.data(), g_dev + kGuard + off, size, d_sum);
		}
	}
	/* A zero buffer still has a non-trivial sum: every term depends on its index. */
	std::vector<uint8_t> zeros(4096 + 1);
	checksum_one("checksum zeros bytes=4097", zeros.data(), g_dev + kGuard, zeros.size(), d_sum);
	CUDA_OK(cudaFree(d_sum));
}

/* Misuse the launchers must refuse without writing anything or leaving an error behind. */
static void refusal_one(const char *what, cudaError_t e)
{
	CUDA_OK(cudaDeviceSynchronize());
	cudaError_t last = cudaGetLastError();
	if (e != cudaErrorInvalidValue)
		return fail(what, "returned %s, want cudaErrorInvalidValue", cudaGetErrorName(e));
	if (last != cudaSuccess)
		return fail(what, "left %s behind", cudaGetErrorName(last));
	verify(what, cudaSuccess, 1, std::vector<uint8_t>()); /* guards intact */
}

static void refusal_cases(void)
{
	uint8_t *dst = poisoned(1, 0);
	refusal_one("refuse iota f32 at a misaligned dst", kernels_fill_iota(dst, 4, KERNELS_F32, 0));
	refusal_one("refuse random f32 of 6 bytes", kernels_fill_random(dst - 1, 6, KERNELS_F32, 1, 0));
	refusal_one("refuse pattern of elem 3", kernels_fill_pattern(dst, 6, 1, 3, 0));
	refusal_one("refuse pattern of 6 bytes of elem 4", kernels_fill_pattern(dst - 1, 6, 1, 4, 0));
	refusal_one("refuse dtype 99", kernels_fill_iota(dst, 4, (kernels_dtype)99, 0));
}

/* > 4 GiB: size_t indexing through the grid-stride loops and both checksum paths. */
static void big_random_and_checksum(void)
{
	const size_t n = (4ull << 30) + 3, off = 1;
	const uint64_t seed = 77;
	uint8_t *d;
	unsigned long long *d_sum, sum;
	CUDA_OK(cudaMalloc(&d, n + 2 * kGuard));
	CUDA_OK(cudaMalloc(&d_sum, sizeof *d_sum));
	CUDA_OK(cudaMemset(d, kPoison, n + 2 * kGuard));
	cudaError_t e = kernels_fill_random(d + kGuard + off, n - off, KERNELS_BYTES, seed, 0);
	if (e != cudaSuccess) {
		fail("big random", "launcher returned %s", cudaGetErrorName(e));
	} else {
		std::vector<uint8_t> h(n - off);
		CUDA_OK(cudaMemcpy(h.data(), d + kGuard + off, n - off, cudaMemcpyDeviceToHost));
		std::vector<uint8_t> want = ref_random(KERNELS_BYTES, seed, h.size());
		if (memcmp(h.data(), want.data(), h.size()) != 0)
			fail("big random 4 GiB+2 at off 1", "the bytes differ");
		else
			g_passed++;
		want = std::vector<uint8_t>();
		/* off 1: the unaligned path; from byte 15 on the source is 16-aligned. */
		for (size_t skip : { (size_t)0, (size_t)15 }) {
			const char *what = skip ? "big checksum, 16-aligned" : "big checksum, unaligned";
			e = kernels_checksum_sum(d + kGuard + off + skip, h.size() - skip, d_sum, 0);
			if (e != cudaSuccess) {
				fail(what, "launcher returned %s", cudaGetErrorName(e));
				continue;
			}
			CUDA_OK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
			uint64_t got = gpuq_checksum_finish(sum, h.size() - skip);
			uint64_t want = ref_checksum(h.data() + skip, h.size() - skip);
			if (got != want)
				fail(what, "%016llx, want %016llx", (unsigned long long)got,
				     (unsigned long long)want);
			else
				g_passed++;
		}
	}
	CUDA_OK(cudaFree(d_sum));
	CUDA_OK(cudaFree(d));
}

/* i32 iota past 2^32 elements wraps; checked around the wrap and at both ends. */
static void big_iota_i32(void)
{
	const size_t count = (1ull << 32) + 17;
	uint32_t *d;
	CUDA_OK(cudaMalloc(&d, count * 4));
	cudaError_t e = kernels_fill_iota(d, count, KERNELS_I32, 0);
	if (e != cudaSuccess)
		return fail("big iota i32", "launcher returned %s", cudaGetErrorName(e));
	CUDA_OK(cudaDeviceSynchronize());
	const size_t starts[] = { 0, (1ull << 32) - 4096, count - 4096 };
	std::vector<uint32_t> h(4096);
	for (size_t s : starts) {
		CUDA_OK(cudaMemcpy(h.data(), d + s, 4096 * 4, cudaMemcpyDeviceToHost));
		for (size_t i = 0; i < 4096; i++)
			if (h[i] != (uint32_t)(s + i)) {
				CUDA_OK(cudaFree(d));
				return fail("big iota i32", "element %zu is %u", s + i, h[i]);
			}
	}
	g_passed++;
	CUDA_OK(cudaFree(d));
}

int main(int argc, char **argv)
{
	bool big = argc > 1 && strcmp(argv[1], "--big") == 0;
	size_t scratch = kGuard + 16 + 8 * kMaxSize + kGuard;
	CUDA_OK(cudaSetDevice(0));
	CUDA_OK(cudaMalloc(&g_dev, scratch));
	random_cases();
	iota_cases();
	pattern_cases();
	checksum_cases();
	refusal_cases();
	CUDA_OK(cudaFree(g_dev));
	if (big) {
		big_random_and_checksum();
		big_iota_i32();
	}
	printf("%d passed, %d failed\n", g_passed, g_failed);
	return g_failed ? 1 : 0;
}
