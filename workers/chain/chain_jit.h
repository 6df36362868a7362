/*
 * Each device's compiled chain kernels: the cache that a fused plan's
 * kernel comes from (workers/chain/chain.h). A kernel is found in memory (this
 * device compiled or loaded it before), else on disk (--kernel-cache:
 * workers/chain/chain_diskcache.h), else compiled with NVRTC for the device's
 * architecture (workers/chain/chain_nvrtc.h, workers/chain/chain_codegen.h) and stored
 * on disk; then the backend loads it (CUDA: a module, workers/chain/chain_module.h;
 * the host backend loads nothing, and compiles for sm_90 so that CI
 * exercises everything up to the load).
 *
 * Entries are shared by the plans that use them (refs) and kept, least
 * recently used out first, up to --graph-cache entries that no plan uses.
 * Owned by the device's worker thread, made with the chain state and freed
 * with it; the counters it bumps (kernel_*) are the device's atomics.
 */
#ifndef GPUQ_CHAIN_JIT_H
#define GPUQ_CHAIN_JIT_H

#include <stdbool.h>
#include <stddef.h>

#include "workers/chain/chain.h"
#include "workers/chain/chain_nvrtc.h"

struct chain_jit;
struct chain_jit_entry;

/* What the backend does with an image (both NULL: nothing, as the host). */
struct chain_jit_loader {
	int (*load)(struct device *dev, const void *image, size_t size, void **loaded,
		    struct gpuq_error *err);
	void (*unload)(struct device *dev, void *loaded);
};

struct chain_jit *chain_jit_new(unsigned capacity);
/* Unloads and frees every entry, used or not (the device is closing). */
void chain_jit_free(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l);

/*
 * The compiled kernel of prog for this device in math mode, held for the
 * caller (chain_jit_release gives it back). 0 with *entry and info (source,
 * compile_s, arch); 1 when no compiled kernel can be had (NVRTC missing or
 * failing, an architecture it does not know, a load the driver refused):
 * info->note says why; -1 with err when host memory runs out.
 */
int chain_jit_get(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l,
		  const chain_prog *prog, enum chain_math math, struct chain_jit_entry **entry,
		  struct chain_kernel_info *info, struct gpuq_error *err);
void chain_jit_release(struct chain_jit *j, struct chain_jit_entry *e);
/* What the backend's load made of the entry's image. */
void *chain_jit_loaded(const struct chain_jit_entry *e);

/*
 * The benchmark's compile costs for prog, made unique so that no cache
 * knows it: compiling it with NVRTC (and storing it), reading it back from
 * disk and loading it (what a new daemon does), and finding it in memory,
 * each in seconds; the entry and its file are removed after. *load_s is
 * what opening NVRTC took, once per process. 0, 1 (note: no compiling
 * here) or -1 with err.
 */
struct chain_jit_costs {
	double nvrtc_s, disk_s, memory_s, load_s;
	char note[320];
};
int chain_jit_measure(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l,
		      const chain_prog *prog, struct chain_jit_costs *out, struct gpuq_error *err);

#endif
