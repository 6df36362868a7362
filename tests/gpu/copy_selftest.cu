/*
 * A standalone GPU self-test of the SM copy kernel (kernels/copy.cu,
 * kernels_copy): every source alignment 0..15 against every destination
 * alignment 0..15, for every length 0..70 and for lengths around the
 * kernel's tile and chunk boundaries, and a few large copies, each checked
 * byte for byte against the source, with the destination poisoned (0xAB)
 * first and the bytes around the copy required to keep the poison.
 *
 *   nvcc -std=c++17 -arch=sm_90 -I. tests/gpu/copy_selftest.cu kernels/copy.cu -o copy_selftest
 *   ./copy_selftest           the cases (about 2.5 GiB of device memory)
 *   ./copy_selftest --bench   then 4 GiB: the SM copy against cudaMemcpyAsync, median of 9
 *
 * Ends with "N passed, N failed"; exits 1 if a case failed, 2 if CUDA did.
 */
#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "protocol/hash.h"
#include "kernels/kernels.h"
#include "tests/gpu/cuda_ok.h"

static const size_t kGuard = 64;       /* poisoned bytes either side of the destination */
static const uint8_t kPoison = 0xAB;
static const size_t kBig = (1ull << 30) + 5; /* the largest case */

static int g_passed, g_failed;
static uint8_t *g_src, *g_dst;      /* device: kBig + 16, and kGuard + 16 + kBig + kGuard */
static std::vector<uint8_t> g_host; /* the source's bytes */
static uint8_t *g_back;             /* pinned: what came back */
static cudaStream_t g_stream;

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stdout, "FAIL ");
	vfprintf(stdout, fmt, ap);
	fputc('\n', stdout);
	va_end(ap);
	g_failed++;
}

/*
 * One case: src + a -> dst + kGuard + b, n bytes. The window read back is
 * the destination range with kGuard bytes before (plus b) and after.
 */
static void run_case(size_t a, size_t b, size_t n)
{
	size_t window = kGuard + b + n + kGuard;
	CUDA_OK(cudaMemsetAsync(g_dst, kPoison, window, g_stream));
	CUDA_OK(kernels_copy(g_dst + kGuard + b, g_src + a, n, g_stream));
	CUDA_OK(cudaMemcpyAsync(g_back, g_dst, window, cudaMemcpyDeviceToHost, g_stream));
	CUDA_OK(cudaStreamSynchronize(g_stream));
	const uint8_t *out = g_back + kGuard + b;
	for (size_t i = 0; i < kGuard + b; i++)
		if (g_back[i] != kPoison) {
			fail("src+%zu dst+%zu n=%zu: byte %zd before the copy is %02x", a, b, n,
			     (ptrdiff_t)i - (ptrdiff_t)(kGuard + b), g_back[i]);
			return;
		}
	if (memcmp(out, g_host.data() + a, n) != 0) {
		size_t i = 0;
		while (out[i] == g_host[a + i])
			i++;
		fail("src+%zu dst+%zu n=%zu: byte %zu is %02x, not %02x", a, b, n, i, out[i],
		     g_host[a + i]);
		return;
	}
	for (size_t i = 0; i < kGuard; i++)
		if (out[n + i] != kPoison) {
			fail("src+%zu dst+%zu n=%zu: byte %zu after the copy is %02x", a, b, n, i,
			     out[n + i]);
			return;
		}
	g_passed++;
}

/* Medians of reps timed runs (after one warm-up) of a copy of n bytes, in seconds. */
template <class F>
static double time_median(F copy, int reps)
{
	cudaEvent_t start, end;
	CUDA_OK(cudaEventCreate(&start));
	CUDA_OK(cudaEventCreate(&end));
	std::vector<double> t;
	for (int r = 0; r <= reps; r++) {
		CUDA_OK(cudaEventRecord(start, g_stream));
		CUDA_OK(copy());
		CUDA_OK(cudaEventRecord(end, g_stream));
		CUDA_OK(cudaEventSynchronize(end));
		float ms;
		CUDA_OK(cudaEventElapsedTime(&ms, start, end));
		if (r > 0)
			t.push_back(ms / 1e3);
	}
	CUDA_OK(cudaEventDestroy(start));
	CUDA_OK(cudaEventDestroy(end));
	std::sort(t.begin(), t.end());
	return t[t.size() / 2];
}

/* 4 GiB, aligned and misaligned, against cudaMemcpyAsync; the results are checked too. */
static void bench(void)
{
	const size_t n = 4ull << 30;
	uint8_t *src, *dst;
	unsigned long long *sum;
	CUDA_OK(cudaMalloc(&src, n + 16));
	CUDA_OK(cudaMalloc(&dst, n + 16));
	CUDA_OK(cudaMalloc(&sum, sizeof *sum));
	CUDA_OK(kernels_fill_random(src, n + 16, KERNELS_BYTES, 99, g_stream));
	struct {
		const char *name;
		size_t a, b;
	} cases[] = { { "aligned", 0, 0 }, { "src+3 dst+9 (shifted)", 3, 9 } };
	for (auto &c : cases) {
		double ce = time_median([&] { return cudaMemcpyAsync(dst + c.b, src + c.a, n,
								     cudaMemcpyDeviceToDevice, g_stream); }, 9);
		CUDA_OK(cudaMemsetAsync(dst, 0, n + 16, g_stream));
		double sm = time_median([&] { return kernels_copy(dst + c.b, src + c.a, n, g_stream); }, 9);
		unsigned long long s1, s2;
		CUDA_OK(kernels_checksum_sum(src + c.a, n, sum, g_stream));
		CUDA_OK(cudaMemcpyAsync(&s1, sum, sizeof s1, cudaMemcpyDeviceToHost, g_stream));
		CUDA_OK(cudaStreamSynchronize(g_stream));
		CUDA_OK(kernels_checksum_sum(dst + c.b, n, sum, g_stream));
		CUDA_OK(cudaMemcpyAsync(&s2, sum, sizeof s2, cudaMemcpyDeviceToHost, g_stream));
		CUDA_OK(cudaStreamSynchronize(g_stream));
		printf("bench 4 GiB %-22s cudaMemcpyAsync %7.1f GB/s   SM copy %7.1f GB/s   ratio %.3f   %s\n",
		       c.name, n / ce / 1e9, n / sm / 1e9, ce / sm, s1 == s2 ? "verified" : "MISMATCH");
		if (s1 == s2)
			g_passed++;
		else
			fail("bench %s: the 4 GiB SM copy differs from its source", c.name);
	}
	CUDA_OK(cudaFree(src));
	CUDA_OK(cudaFree(dst));
	CUDA_OK(cudaFree(sum));
}

int main(int argc, char **argv)
{
	bool do_bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
	CUDA_OK(cudaSetDevice(0));
	CUDA_OK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
	g_host.resize(kBig + 16);
	for (size_t k = 0; k * 8 < g_host.size(); k++) {
		uint64_t w = gpuq_random_word(2026, k);
		size_t left = g_host.size() - k * 8;
		memcpy(&g_host[k * 8], &w, left < 8 ? left : 8);
	}
	CUDA_OK(cudaMalloc(&g_src, g_host.size()));
	CUDA_OK(cudaMalloc(&g_dst, kGuard + 16 + kBig + kGuard));
	CUDA_OK(cudaMallocHost(&g_back, kGuard + 16 + kBig + kGuard));
	CUDA_OK(cudaMemcpy(g_src, g_host.data(), g_host.size(), cudaMemcpyHostToDevice));

	/* Every alignment pair, every short length: head, tail and shift logic. */
	for (size_t a = 0; a < 16; a++)
		for (size_t b = 0; b < 16; b++)
			for (size_t n = 0; n <= 70; n++)
				run_case(a, b, n);
	/* Around the tile (8 KiB), a stage, a thread's pair of chunks, and many tiles. */
	const size_t mid[] = { 127,  128,  129,  4095, 4097, 8191,  8192,  8193, 8192 + 16,
			       3 * 8192 + 5, 65536 + 15, (1u << 20) + 13 };
	for (size_t a = 0; a < 16; a++)
		for (size_t b = 0; b < 16; b++)
			for (size_t n : mid)
				run_case(a, b, n);
	/* Large: many tiles per block of the persistent grid. */
	const size_t pairs[][2] = { { 0, 0 }, { 1, 6 }, { 15, 3 }, { 8, 8 }, { 4, 0 } };
	for (auto &p : pairs)
		run_case(p[0], p[1], (64u << 20) + 7);
	run_case(3, 12, kBig);
	run_case(0, 0, kBig);
	CUDA_OK(cudaGetLastError());

	CUDA_OK(cudaFree(g_src));
	CUDA_OK(cudaFree(g_dst));
	CUDA_OK(cudaFreeHost(g_back));
	if (do_bench)
		bench();
	CUDA_OK(cudaStreamDestroy(g_stream));
	printf("%d passed, %d failed\n", g_passed, g_failed);
	return g_failed ? 1 : 0;
}
