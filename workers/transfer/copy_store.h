/*
 * How a copy thread stores a slot's bytes into a client's mapping
 * (transfer_staged.c's get): a function chosen once, when the copy pool
 * starts, from what gpuqd was asked for (--copy-stores) and what the CPU
 * can do.
 *
 *   regular  memcpy. Below glibc's non-temporal threshold (a 2 MiB chunk
 *            is) every destination line is read before it is written
 *            (read for ownership): three bytes of DRAM traffic per byte.
 *   nt       non-temporal (streaming) stores, AVX2 where the CPU has it,
 *            else SSE2: no read for ownership and no cache pollution,
 *            two bytes of traffic per byte. Loads stay ordinary. Ends with
 *            an sfence, so the bytes are ordered before whatever the
 *            thread stores next (the task's done flag).
 *
 * Every function copies exactly n bytes at any alignment and returns dst.
 * Any thread.
 */
#ifndef GPUQ_COPY_STORE_H
#define GPUQ_COPY_STORE_H

#include <stddef.h>

typedef void *(*copy_store_fn)(void *restrict dst, const void *restrict src, size_t n);

enum copy_stores {
	COPY_STORES_REGULAR, /* memcpy */
	COPY_STORES_NT,      /* non-temporal stores: the default (daemon/options.c), as measured in docs/PERFORMANCE.md */
};

/* The kinds, by what the CPU runs: best is what COPY_STORES_NT picks. */
void *copy_store_regular(void *restrict dst, const void *restrict src, size_t n);
void *copy_store_nt_sse2(void *restrict dst, const void *restrict src, size_t n);
/* Only where copy_store_cpu_has("avx2") / ("avx512f"). */
void *copy_store_nt_avx2(void *restrict dst, const void *restrict src, size_t n);
void *copy_store_nt_avx512(void *restrict dst, const void *restrict src, size_t n);
int copy_store_cpu_has(const char *feature); /* "avx2" or "avx512f"; 0 for anything else */

/* The function for a kind on this CPU, and its name ("memcpy", "nt-avx2", "nt-sse2"). */
copy_store_fn copy_store_pick(enum copy_stores kind, const char **name);
/* "regular" or "nt" -> 0 and *kind; -1 otherwise. */
int copy_store_parse(const char *s, enum copy_stores *kind);

/*
 * What the next copy_pool_start picks (gpuqd's --copy-stores; the options
 * set it while parsing, main starts the pool afterwards). A running pool
 * keeps what it picked.
 */
void copy_store_request(enum copy_stores kind);
enum copy_stores copy_store_requested(void);

#endif
