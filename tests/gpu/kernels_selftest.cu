/*
 * A standalone GPU self-test of the kernels in kernels/: every launcher's
 * output, computed on the device, against the definitions in protocol/hash.h
 * computed here on the host, over awkward sizes and destination offsets. The
 * device memory is poisoned with 0xAB first, and the bytes around each output
 * must keep it (nothing written before or after).
 *
 * Chains (the second half): every op in every float dtype four ways, the
 * per-op kernel, the interpreted fused kernel, the program interpreter and
 * the kernel compiled for it with NVRTC and loaded through the driver API
 * (as gpuqd does: workers/chain/chain_codegen.c, chain_nvrtc.c, chain_module.c),
 * each into poisoned memory, all four the same bits and within the stated
 * ulps of a long-double reference; every reduction compiled and interpreted,
 * the same bits as the host's reference in the stated order where the values
 * are exact, deterministic; and --math fast's error per op, measured against
 * the long-double reference and printed as the table docs/gpuq.1 quotes.
 *
 *   make build/tests/kernels_selftest   (gpu-check runs what make built)
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

#include <cmath>

#include "protocol/hash.h"
#include "kernels/kernels.h"
#include "tests/gpu/cuda_ok.h"

extern "C" {
#include "workers/chain/chain_codegen.h"
#include "workers/chain/chain_eval.h"
#include "workers/chain/chain_expr.h"
#include "workers/chain/chain_module.h"
#include "workers/chain/chain_nvrtc.h"
#include "workers/chain/chain_prog.h"
}

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

/* The references, straight from the definitions in protocol/hash.h. */

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

/* ---- Chains: the four ways to run an op, and the compiled kernels ---- */

static const size_t kChainCount = 100003; /* items of 4 and a tail of 3 */

struct op_case {
	unsigned kind;
	double a, b;    /* constants */
	double lo, hi;  /* the inputs' range */
	bool transcendental;
};

static const op_case kOpCases[] = {
	{ KERNELS_CHAIN_SIN, 0, 0, -4, 4, true },     { KERNELS_CHAIN_COS, 0, 0, -4, 4, true },
	{ KERNELS_CHAIN_TAN, 0, 0, -1.2, 1.2, true }, { KERNELS_CHAIN_EXP, 0, 0, -4, 4, true },
	{ KERNELS_CHAIN_LOG, 0, 0, 0.01, 8, true },   { KERNELS_CHAIN_LOG2, 0, 0, 0.01, 8, true },
	{ KERNELS_CHAIN_SQRT, 0, 0, 0, 8, false },    { KERNELS_CHAIN_RSQRT, 0, 0, 0.01, 8, true },
	{ KERNELS_CHAIN_ABS, 0, 0, -8, 8, false },    { KERNELS_CHAIN_NEG, 0, 0, -8, 8, false },
	{ KERNELS_CHAIN_RELU, 0, 0, -8, 8, false },   { KERNELS_CHAIN_SIGMOID, 0, 0, -4, 4, true },
	{ KERNELS_CHAIN_TANH, 0, 0, -4, 4, true },    { KERNELS_CHAIN_FLOOR, 0, 0, -8, 8, false },
	{ KERNELS_CHAIN_CEIL, 0, 0, -8, 8, false },   { KERNELS_CHAIN_ROUND, 0, 0, -8, 8, false },
	{ KERNELS_CHAIN_ADD, 1.5, 0, -4, 4, false },  { KERNELS_CHAIN_SUB, 0.75, 0, -4, 4, false },
	{ KERNELS_CHAIN_MUL, 2.5, 0, -4, 4, false },  { KERNELS_CHAIN_DIV, 3, 0, -4, 4, false },
	{ KERNELS_CHAIN_POW, 1.5, 0, 0.01, 8, true }, { KERNELS_CHAIN_MIN, 0.25, 0, -4, 4, false },
	{ KERNELS_CHAIN_MAX, -0.5, 0, -4, 4, false }, { KERNELS_CHAIN_CLAMP, -1, 1, -4, 4, false },
	{ KERNELS_CHAIN_FMA, 2.5, -1.25, -4, 4, false },
};
static const kernels_dtype kFloatTypes[] = { KERNELS_F16, KERNELS_BF16, KERNELS_F32, KERNELS_F64 };
static const char *const kOpNames[] = {
#define SELFTEST_OP_NAME(name, str, nargs) str,
	KERNELS_CHAIN_OPS(SELFTEST_OP_NAME)
#undef SELFTEST_OP_NAME
};

static int g_major, g_minor, g_sms;

/* Element i of an array of t, exactly. */
static long double load_value(kernels_dtype t, const uint8_t *p, size_t i)
{
	return chain_eval_load((enum gpuq_dtype)t, p, i);
}

/* The unit in the last place of t at v (the smallest subnormal's at 0). */
static long double ulp_of(kernels_dtype t, long double v)
{
	int mant = t == KERNELS_F16 ? 10 : t == KERNELS_BF16 ? 7 : t == KERNELS_F32 ? 23 : 52;
	int min_exp = t == KERNELS_F16 ? -24 : t == KERNELS_BF16 ? -133 : t == KERNELS_F32 ? -149 : -1074;
	int e = v == 0 || !std::isfinite(v) ? min_exp + mant : ilogbl(v);
	return ldexpl(1.0L, e - mant < min_exp ? min_exp : e - mant);
}

/* Op oc at x in long double, its constants rounded to float unless t is f64. */
static long double ref_op(const op_case &oc, kernels_dtype t, long double x)
{
	long double a = t == KERNELS_F64 ? oc.a : (float)oc.a, b = t == KERNELS_F64 ? oc.b : (float)oc.b;
	switch (oc.kind) {
	case KERNELS_CHAIN_SIN: return sinl(x);
	case KERNELS_CHAIN_COS: return cosl(x);
	case KERNELS_CHAIN_TAN: return tanl(x);
	case KERNELS_CHAIN_EXP: return expl(x);
	case KERNELS_CHAIN_LOG: return logl(x);
	case KERNELS_CHAIN_LOG2: return log2l(x);
	case KERNELS_CHAIN_SQRT: return sqrtl(x);
	case KERNELS_CHAIN_RSQRT: return 1 / sqrtl(x);
	case KERNELS_CHAIN_ABS: return fabsl(x);
	case KERNELS_CHAIN_NEG: return -x;
	case KERNELS_CHAIN_RELU: return x > 0 ? x : 0;
	case KERNELS_CHAIN_SIGMOID: return 1 / (1 + expl(-x));
	case KERNELS_CHAIN_TANH: return tanhl(x);
	case KERNELS_CHAIN_FLOOR: return floorl(x);
	case KERNELS_CHAIN_CEIL: return ceill(x);
	case KERNELS_CHAIN_ROUND: return roundl(x);
	case KERNELS_CHAIN_ADD: return x + a;
	case KERNELS_CHAIN_SUB: return x - a;
	case KERNELS_CHAIN_MUL: return x * a;
	case KERNELS_CHAIN_DIV: return x / a;
	case KERNELS_CHAIN_POW: return powl(x, a);
	case KERNELS_CHAIN_MIN: return fminl(x, a);
	case KERNELS_CHAIN_MAX: return fmaxl(x, a);
	case KERNELS_CHAIN_CLAMP: return fminl(fmaxl(x, a), b);
	default: return x * a + b;
	}
}

/* The bound of test_chain.c: 1 ulp for correctly rounded ops and any 16-bit type, else 5. */
static double bound_ulps(const op_case &oc, kernels_dtype t)
{
	return t == KERNELS_F16 || t == KERNELS_BF16 || !oc.transcendental ? 1 : 5;
}

/* Where a chain case's input goes: past its output and the output's guard, 256-byte aligned. */
static uint8_t *chain_input_at(size_t out_bytes)
{
	size_t at = (kGuard + out_bytes + kGuard + 255) / 256 * 256;
	return g_dev + at;
}

/* A program's kernel compiled with NVRTC for this GPU and loaded; false (a failure counted) if not. */
static bool compiled_module(const char *what, const chain_prog *p, bool fast, chain_module *m)
{
	const char *names[CHAIN_CODEGEN_HEADERS], *texts[CHAIN_CODEGEN_HEADERS];
	char arch[24], why[2048];
	bool ptx;
	chain_image img;
	cudaError_t e;
	const chain_nvrtc_status *nv = chain_nvrtc_load("");
	if (!nv->available) {
		fail(what, "NVRTC is not available: %s", nv->why);
		return false;
	}
	if (chain_nvrtc_arch(g_major, g_minor, arch, sizeof arch, &ptx, why, sizeof why) < 0) {
		fail(what, "%s", why);
		return false;
	}
	char *src = chain_codegen_source(p);
	chain_codegen_headers(names, texts);
	int rc = chain_nvrtc_compile(src, CHAIN_CODEGEN_HEADERS, names, texts, arch, ptx, fast, &img,
				     why, sizeof why);
	free(src);
	if (rc != 0) {
		fail(what, "NVRTC: %s", why);
		return false;
	}
	rc = chain_module_load(img.data, m, &e, why, sizeof why);
	free(img.data);
	if (rc != 0)
		fail(what, "load: %s", why);
	return rc == 0;
}

/* One wave of an elementwise module (as workers/chain/chain_cuda.c launches it). */
static cudaError_t launch_compiled_run(const chain_module &m, kernels_expr &x)
{
	void *params[1] = { &x };
	uint64_t pairs = (x.count / KERNELS_EXPR_ITEM + 1) / 2;
	uint64_t need = (pairs + KERNELS_REDUCE_THREADS - 1) / KERNELS_REDUCE_THREADS;
	uint64_t wave = (uint64_t)g_sms * (uint64_t)m.blocks_per_sm;
	return chain_module_launch(&m, (unsigned)(need < 1 ? 1 : need < wave ? need : wave), params, 0);
}

/* count random values of t in [lo, hi) from seed. */
static std::vector<uint8_t> chain_input(kernels_dtype t, size_t count, double lo, double hi,
					 uint64_t seed)
{
	std::vector<uint8_t> v(count * dtype_size(t));
	for (size_t i = 0; i < count; i++)
		chain_eval_store((enum gpuq_dtype)t, v.data(), i,
				 lo + (hi - lo) * gpuq_uniform_f64(gpuq_random_word(seed, i)));
	return v;
}

/* The bytes of a poisoned output after `launched`, guards checked; empty on failure. */
static std::vector<uint8_t> chain_output(const char *what, cudaError_t launched, size_t bytes)
{
	if (launched != cudaSuccess) {
		fail(what, "launch returned %s", cudaGetErrorName(launched));
		return std::vector<uint8_t>();
	}
	CUDA_OK(cudaDeviceSynchronize());
	std::vector<uint8_t> back(kGuard + bytes + kGuard);
	CUDA_OK(cudaMemcpy(back.data(), g_dev, back.size(), cudaMemcpyDeviceToHost));
	for (size_t i = 0; i < kGuard; i++)
		if (back[i] != kPoison || back[kGuard + bytes + i] != kPoison) {
			fail(what, "wrote outside its output (guard byte %zu)", i);
			return std::vector<uint8_t>();
		}
	return std::vector<uint8_t>(back.begin() + kGuard, back.begin() + kGuard + bytes);
}

/* Element i of out (t) against the reference at in[i]; the first bad one fails the case. */
static bool check_op_values(const char *what, const op_case &oc, kernels_dtype t,
			    const std::vector<uint8_t> &in, const std::vector<uint8_t> &out)
{
	double bound = bound_ulps(oc, t);
	for (size_t i = 0; i < kChainCount; i++) {
		long double x = load_value(t, in.data(), i), y = load_value(t, out.data(), i);
		long double want = ref_op(oc, t, x), err = fabsl(y - want) / ulp_of(t, want);
		if (!(err <= bound)) {
			fail(what, "element %zu: x = %.9Lg gives %.9Lg, reference %.12Lg: %.2Lf ulps "
			     "(bound %.0f)", i, x, y, want, err, bound);
			return false;
		}
	}
	return true;
}

/* out holds the per-op kernel's bits, element for element (NaN for NaN); else a failure. */
static bool same_elements(const char *what, kernels_dtype t, const std::vector<uint8_t> &out,
			  const std::vector<uint8_t> &per_op)
{
	size_t e = dtype_size(t);
	for (size_t i = 0; i < kChainCount; i++) {
		long double a = load_value(t, out.data(), i), b = load_value(t, per_op.data(), i);
		if (memcmp(&out[i * e], &per_op[i * e], e) != 0 && !(std::isnan(a) && std::isnan(b))) {
			fail(what, "element %zu: %.9Lg, the per-op kernel gives %.9Lg", i, a, b);
			return false;
		}
	}
	return true;
}

/* One op in one dtype: per-op, interpreted fused, program interpreter, compiled; all the same bits. */
static void chain_op_case(const op_case &oc, kernels_dtype t, uint64_t seed)
{
	static const char *const ways[] = { "per-op", "fused", "interpreter", "compiled" };
	char what[128];
	size_t bytes = kChainCount * dtype_size(t);
	std::vector<uint8_t> in = chain_input(t, kChainCount, oc.lo, oc.hi, seed), outs[4];
	struct kernels_chain_op op = { oc.kind, oc.a, oc.b };
	kernels_expr x;
	chain_module m;
	memset(&x, 0, sizeof x);
	chain_prog_from_ops(&x.prog, &op, 1, (enum gpuq_dtype)t);
	uint8_t *d_in = chain_input_at(bytes);
	CUDA_OK(cudaMemcpy(d_in, in.data(), bytes, cudaMemcpyHostToDevice));
	x.var[0] = d_in;
	x.store[0] = g_dev + kGuard;
	x.count = kChainCount;
	x.repeat = 1;
	snprintf(what, sizeof what, "chain %s %s", kOpNames[oc.kind], dtype_name(t));
	bool have_module = compiled_module(what, &x.prog, false, &m);
	for (int w = 0; w < 4; w++) {
		snprintf(what, sizeof what, "chain %s %s %s", kOpNames[oc.kind], dtype_name(t), ways[w]);
		uint8_t *out = poisoned(0, bytes);
		cudaError_t e = w == 0 ? kernels_chain_op(d_in, out, kChainCount, t, &op, 0)
				: w == 1 ? kernels_chain_fused(d_in, out, kChainCount, t, &op, 1, 1, 0)
				: w == 2 ? kernels_expr_run(&x, 0)
				: have_module ? launch_compiled_run(m, x) : cudaErrorInvalidSource;
		if (w == 3 && !have_module)
			continue;
		outs[w] = chain_output(what, e, bytes);
		if (outs[w].empty() || !check_op_values(what, oc, t, in, outs[w]))
			continue;
		if (w > 0 && !outs[0].empty() && !same_elements(what, t, outs[w], outs[0]))
			continue;
		g_passed++;
	}
	if (have_module)
		chain_module_unload(&m, 0);
}

static void chain_op_cases(void)
{
	uint64_t seed = 500;
	for (kernels_dtype t : kFloatTypes)
		for (const op_case &oc : kOpCases)
			chain_op_case(oc, t, seed++);
}

/* ---- --math fast: each op's largest error against the long-double reference ---- */

struct fast_error {
	long double ulps, abs;
};

/* The fast compiled kernel's largest error for op oc in dtype t (both -1 when it could not run). */
static fast_error fast_error_of(const op_case &oc, kernels_dtype t, uint64_t seed)
{
	fast_error r = { -1, -1 };
	char what[128];
	size_t bytes = kChainCount * dtype_size(t);
	std::vector<uint8_t> in = chain_input(t, kChainCount, oc.lo, oc.hi, seed);
	struct kernels_chain_op op = { oc.kind, oc.a, oc.b };
	kernels_expr x;
	chain_module m;
	memset(&x, 0, sizeof x);
	chain_prog_from_ops(&x.prog, &op, 1, (enum gpuq_dtype)t);
	snprintf(what, sizeof what, "fast %s %s", kOpNames[oc.kind], dtype_name(t));
	if (!compiled_module(what, &x.prog, true, &m))
		return r;
	uint8_t *d_in = chain_input_at(bytes);
	CUDA_OK(cudaMemcpy(d_in, in.data(), bytes, cudaMemcpyHostToDevice));
	x.var[0] = d_in;
	x.store[0] = poisoned(0, bytes);
	x.count = kChainCount;
	x.repeat = 1;
	std::vector<uint8_t> out = chain_output(what, launch_compiled_run(m, x), bytes);
	chain_module_unload(&m, 0);
	if (out.empty())
		return r;
	r.ulps = r.abs = 0;
	for (size_t i = 0; i < kChainCount; i++) {
		long double want = ref_op(oc, t, load_value(t, in.data(), i)), y = load_value(t, out.data(), i);
		long double err = fabsl(y - want);
		if (!std::isfinite(y) && std::isfinite(want)) {
			fail(what, "element %zu: %.9Lg where the reference is %.9Lg", i, y, want);
			return r;
		}
		r.abs = err > r.abs ? err : r.abs;
		r.ulps = err / ulp_of(t, want) > r.ulps ? err / ulp_of(t, want) : r.ulps;
	}
	g_passed++;
	return r;
}

/* Prints the table docs/gpuq.1 quotes: max ulps (and absolute error) per op, f32 f16 bf16. */
static void fast_math_table(void)
{
	printf("\n--math fast: largest error over %zu inputs per op (inputs' ranges as the "
	       "integration tests'); f64 is never affected\n", kChainCount);
	printf("| op | f32 ulps | f32 abs | f16 ulps | bf16 ulps |\n|---|---|---|---|---|\n");
	uint64_t seed = 900;
	for (const op_case &oc : kOpCases) {
		fast_error f32 = fast_error_of(oc, KERNELS_F32, seed++);
		fast_error f16 = fast_error_of(oc, KERNELS_F16, seed++);
		fast_error bf16 = fast_error_of(oc, KERNELS_BF16, seed++);
		printf("| %s | %.1Lf | %.2Lg | %.1Lf | %.1Lf |\n", kOpNames[oc.kind], f32.ulps, f32.abs,
		       f16.ulps, bf16.ulps);
	}
	printf("\n");
}

/* ---- Reductions ---- */

/* text bound with x, y of count f32 at d_x, d_y. */
static bool reduce_prog(const char *text, kernels_expr &x, void *d_x, void *d_y, size_t count)
{
	static chain_expr ex;
	chain_expr_error e;
	chain_expr_binding b[KERNELS_EXPR_MAX_VARS];
	uint64_t n;
	if (chain_expr_parse(text, true, &ex, &e) != 0) {
		fail(text, "column %u: %s", e.col, e.msg);
		return false;
	}
	memset(&x, 0, sizeof x);
	for (unsigned v = 0; v < ex.nvars; v++) {
		x.var[v] = x.store[v] = strcmp(ex.vars[v].name, "x") == 0 ? d_x : d_y;
		b[v] = { GPUQ_DTYPE_F32, count, 0, x.var[v] };
	}
	if (chain_expr_bind(&ex, b, &n, &e) != 0) {
		fail(text, "column %u: %s", e.col, e.msg);
		return false;
	}
	x.prog = ex.prog;
	x.count = count;
	x.repeat = 1;
	return true;
}

/* The reduction's partial on the GPU: compiled (module) or interpreted. */
static bool reduce_on_gpu(const kernels_expr &x, const chain_module *m, kernels_partial *out)
{
	kernels_partial *tiles = reinterpret_cast<kernels_partial *>(g_dev);
	uint64_t ntiles = kernels_reduce_tiles(x.count);
	kernels_expr copy = x;
	void *params[2] = { &copy, &tiles };
	CUDA_OK(cudaMemset(tiles, kPoison, (ntiles + 1) * sizeof *tiles));
	cudaError_t e = m ? (ntiles ? chain_module_launch(m, (unsigned)ntiles, params, 0) : cudaSuccess)
			  : kernels_expr_reduce(&x, tiles, 0);
	if (e == cudaSuccess)
		e = kernels_reduce_combine(x.prog.reduce, tiles, ntiles, tiles + ntiles, 0);
	if (e != cudaSuccess) {
		fail("reduce", "launch returned %s", cudaGetErrorName(e));
		return false;
	}
	CUDA_OK(cudaDeviceSynchronize());
	CUDA_OK(cudaMemcpy(out, tiles + ntiles, sizeof *out, cudaMemcpyDeviceToHost));
	return true;
}

static bool same_partial(const kernels_partial &a, const kernels_partial &b)
{
	return a.i == b.i && (memcmp(&a.v, &b.v, sizeof a.v) == 0 || (std::isnan(a.v) && std::isnan(b.v)));
}

/*
 * One reduction compiled and interpreted on the GPU, twice each, against the
 * host's reference (workers/chain/chain_eval.c, the same order): the same bits
 * where exact (exact true), else within tol relative.
 */
static void reduce_case(const char *text, bool exact, size_t count, const std::vector<float> &hx,
			const std::vector<float> &hy, void *d_x, void *d_y)
{
	kernels_expr dx, hxe;
	chain_module m;
	kernels_partial want, got[4];
	if (!reduce_prog(text, dx, d_x, d_y, count) || !reduce_prog(text, hxe, (void *)hx.data(),
								     (void *)hy.data(), count))
		return;
	want = chain_eval_reduce(&hxe);
	bool have = compiled_module(text, &dx.prog, false, &m);
	for (int k = 0; k < 4; k++)
		if ((k < 2 && !have) || !reduce_on_gpu(dx, k < 2 ? &m : NULL, &got[k]))
			got[k] = want, got[k].v = NAN;
	if (have)
		chain_module_unload(&m, 0);
	for (int k = 1; k < 4; k++)
		if (!same_partial(got[0], got[k]))
			return fail(text, "run %d gives %.17g (%llu), the first %.17g (%llu): not deterministic "
				    "or compiled != interpreted", k, got[k].v, got[k].i, got[0].v, got[0].i);
	double tol = exact ? 0 : 1e-6 * fabs(want.v);
	/* == first: the infinities an empty min or max gives differ by NaN, not by nothing */
	if (got[0].i != want.i || !(got[0].v == want.v || fabs(got[0].v - want.v) <= tol ||
				     (std::isnan(got[0].v) && std::isnan(want.v))))
		return fail(text, "%.17g (%llu), the host's reference %.17g (%llu)", got[0].v, got[0].i,
			    want.v, want.i);
	g_passed++;
}

static void reduce_cases(void)
{
	const size_t n = (1u << 20) + 3;
	std::vector<float> hx(n), hy(n);
	for (size_t i = 0; i < n; i++) {
		hx[i] = (float)(gpuq_uniform_f64(gpuq_random_word(61, i)) * 2 - 1);
		hy[i] = (float)(gpuq_uniform_f64(gpuq_random_word(62, i)) * 2 - 1);
	}
	hx[12345] = 7; /* the max, twice: argmax is the first */
	hx[700000] = 7;
	hy[99] = NAN;  /* NaN as stated: sum and max of y are NaN, argmax(y) is 99 */
	uint8_t *d = g_dev + (8u << 20);
	void *d_x = d, *d_y = d + (n * 4 + 255) / 256 * 256;
	CUDA_OK(cudaMemcpy(d_x, hx.data(), n * 4, cudaMemcpyHostToDevice));
	CUDA_OK(cudaMemcpy(d_y, hy.data(), n * 4, cudaMemcpyHostToDevice));
	static const char *const exact[] = { "sum(x)", "mean(x)", "norm2(x)", "dot(x, x)", "min(x)",
					     "max(x)", "argmax(x)", "count_nonzero(x)",
					     "sum(abs(x - y))", "sum(y)", "max(y)", "argmax(y)" };
	for (const char *t : exact) {
		reduce_case(t, true, n, hx, hy, d_x, d_y);
		reduce_case(t, true, 0, hx, hy, d_x, d_y);      /* empty */
		reduce_case(t, true, 1, hx, hy, d_x, d_y);      /* one element */
		reduce_case(t, true, 16385, hx, hy, d_x, d_y);  /* a tile and one */
	}
	reduce_case("sum(sin(x) * exp(x))", false, n, hx, hy, d_x, d_y);
}

static void chain_cases(void)
{
	cudaDeviceProp prop;
	CUDA_OK(cudaGetDeviceProperties(&prop, 0));
	g_major = prop.major;
	g_minor = prop.minor;
	g_sms = prop.multiProcessorCount;
	CUDA_OK(kernels_chain_prepare());
	CUDA_OK(kernels_expr_prepare());
	chain_op_cases();
	reduce_cases();
	fast_math_table();
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
	chain_cases();
	CUDA_OK(cudaFree(g_dev));
	if (big) {
		big_random_and_checksum();
		big_iota_i32();
	}
	printf("%d passed, %d failed\n", g_passed, g_failed);
	return g_failed ? 1 : 0;
}
