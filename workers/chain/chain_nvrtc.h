/*
 * NVRTC, loaded at run time: gpuqd links nothing of it, so a machine
 * without the CUDA toolkit's libnvrtc runs chains with the interpreted
 * kernels and says so. The library is opened once per process, on the
 * first compile (dlopen of libnvrtc.so.13, then libnvrtc.so, or the path
 * --nvrtc names; --nvrtc off never opens one). Any thread: the loading is
 * guarded by pthread_once, and NVRTC compiles separate programs on
 * separate threads safely.
 */
#ifndef GPUQ_CHAIN_NVRTC_H
#define GPUQ_CHAIN_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

struct chain_nvrtc_status {
	bool available;
	int major, minor; /* NVRTC's version, the toolkit's */
	char library[256]; /* what was opened */
	char why[384];     /* when not available: what was tried and what failed */
	double load_s;     /* what opening it took (seconds) */
};

/*
 * Loads NVRTC if it has not been (`option`: "" to search the loader's
 * path, a library's path, or "off"; only the first call's counts) and
 * returns what came of it.
 */
const struct chain_nvrtc_status *chain_nvrtc_load(const char *option);

/* A compiled kernel: CUBIN for the GPU's own architecture, or PTX the driver compiles. */
struct chain_image {
	void *data; /* malloc'd */
	size_t size;
	bool ptx;
	char arch[24]; /* "sm_90", or "compute_90" for PTX */
};

/*
 * The architecture to compile for on a GPU of compute capability major.minor:
 * itself ("sm_90", CUBIN) when NVRTC supports it, else PTX for the newest
 * virtual architecture NVRTC has below it ("compute_120"), which the driver
 * compiles at load. -1 with why when NVRTC supports nothing that old.
 */
int chain_nvrtc_arch(int major, int minor, char *arch, size_t size, bool *ptx, char *why,
		     size_t whysize);

/*
 * Compiles source (with headers, as names[i] -> texts[i]) for arch (from
 * chain_nvrtc_arch), fast selecting -use_fast_math. 0 with *out (its data
 * malloc'd), or -1 with why (NVRTC's log, shortened, for a compile error).
 */
int chain_nvrtc_compile(const char *source, int nheaders, const char *const *names,
			const char *const *texts, const char *arch, bool ptx, bool fast,
			struct chain_image *out, char *why, size_t whysize);

#endif
