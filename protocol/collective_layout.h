/*
 * The shapes of NCCL's primitives, as nccl.h defines them: which elements
 * each rank reads and writes for a given count, what in place means, the
 * size and bus factor nccl-tests reports, and, for the reference, which
 * input elements make each output element. Plain C, header-only, any
 * thread: the daemon checks buffers against it before any rank starts, and
 * the tests and the benchmark check results with it. The host backend
 * (workers/collective/collective_host.c) runs the primitives with code of its own, so that the
 * two check each other.
 *
 * `count` is NCCL's count argument: the elements of allreduce, broadcast,
 * reduce and sendrecv; reduce_scatter's recvcount (each rank's input holds
 * nranks x count); all_gather's sendcount (each output holds nranks x
 * count); all_to_all's count per peer (input and output hold nranks x
 * count, block j of rank r's input going to block r of rank j's output).
 */
#ifndef GPUQ_COLLECTIVE_LAYOUT_H
#define GPUQ_COLLECTIVE_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "protocol/collective_math.h"

enum coll_prim {
	COLL_ALLREDUCE,
	COLL_REDUCE_SCATTER,
	COLL_ALL_GATHER,
	COLL_BROADCAST,
	COLL_REDUCE,
	COLL_SENDRECV,   /* root sends, peer receives */
	COLL_ALL_TO_ALL, /* grouped send/recv between every pair */
};
#define COLL_PRIM_COUNT 7
#define COLL_PRIM_LIST "allreduce, reduce_scatter, all_gather, broadcast, reduce, sendrecv, all_to_all"

/* The protocol's name of a primitive (its request op). */
static inline const char *coll_prim_name(enum coll_prim p)
{
	switch (p) {
	case COLL_ALLREDUCE: return "allreduce";
	case COLL_REDUCE_SCATTER: return "reduce_scatter";
	case COLL_ALL_GATHER: return "all_gather";
	case COLL_BROADCAST: return "broadcast";
	case COLL_REDUCE: return "reduce";
	case COLL_SENDRECV: return "sendrecv";
	case COLL_ALL_TO_ALL: return "all_to_all";
	}
	return "unknown";
}

/* 0 with *out, or -1 when name is no primitive. */
static inline int coll_prim_from_name(const char *name, enum coll_prim *out)
{
	for (int p = 0; p < COLL_PRIM_COUNT; p++) {
		if (strcmp(name, coll_prim_name((enum coll_prim)p)) == 0) {
			*out = (enum coll_prim)p;
			return 0;
		}
	}
	return -1;
}

/* Whether the primitive combines elements with a reduction op. */
static inline bool coll_prim_reduces(enum coll_prim p)
{
	return p == COLL_ALLREDUCE || p == COLL_REDUCE_SCATTER || p == COLL_REDUCE;
}

/* Whether the primitive has a root rank (sendrecv's sender is its `root`). */
static inline bool coll_prim_has_root(enum coll_prim p)
{
	return p == COLL_BROADCAST || p == COLL_REDUCE;
}

/* One primitive's shape. */
struct coll_layout {
	enum coll_prim prim;
	int nranks;
	uint64_t count; /* NCCL's count argument (above) */
	int root;       /* broadcast, reduce: the root rank; sendrecv: the sender */
	int peer;       /* sendrecv: the receiver */
};

/* Elements rank r reads from its input (0: it reads none). */
static inline uint64_t coll_in_count(const struct coll_layout *l, int r)
{
	uint64_t n = (uint64_t)l->nranks;
	switch (l->prim) {
	case COLL_REDUCE_SCATTER:
	case COLL_ALL_TO_ALL: return n * l->count;
	case COLL_BROADCAST:
	case COLL_SENDRECV: return r == l->root ? l->count : 0;
	default: return l->count;
	}
}

/* Elements rank r writes to its output (0: it writes none). */
static inline uint64_t coll_out_count(const struct coll_layout *l, int r)
{
	uint64_t n = (uint64_t)l->nranks;
	switch (l->prim) {
	case COLL_ALL_GATHER:
	case COLL_ALL_TO_ALL: return n * l->count;
	case COLL_REDUCE: return r == l->root ? l->count : 0;
	case COLL_SENDRECV: return r == l->peer ? l->count : 0;
	default: return l->count;
	}
}

/*
 * In place, one buffer holds rank r's input and output: the input starts at
 * element *in_at and the output at *out_at of it (reduce_scatter's output is
 * block r of the input; all_gather's input is block r of the output). False
 * where NCCL has no in-place form (sendrecv, all_to_all).
 */
static inline bool coll_in_place_offsets(const struct coll_layout *l, int r, uint64_t *in_at,
					 uint64_t *out_at)
{
	*in_at = *out_at = 0;
	if (l->prim == COLL_SENDRECV || l->prim == COLL_ALL_TO_ALL)
		return false;
	if (l->prim == COLL_REDUCE_SCATTER)
		*out_at = (uint64_t)r * l->count;
	if (l->prim == COLL_ALL_GATHER)
		*in_at = (uint64_t)r * l->count;
	return true;
}

/*
 * The reference: element i of rank r's output is made of *n input
 * elements, element index[k] of rank ranks[k]'s input for k < *n, reduced
 * with the op (reducing primitives) or copied (*n is 1). False when rank r
 * writes no element i. ranks and index hold nranks entries.
 */
static inline bool coll_sources(const struct coll_layout *l, int r, uint64_t i, int *n,
				int *ranks, uint64_t *index)
{
	if (i >= coll_out_count(l, r))
		return false;
	uint64_t c = l->count;
	*n = 1;
	switch (l->prim) {
	case COLL_ALLREDUCE:
	case COLL_REDUCE:
	case COLL_REDUCE_SCATTER:
		*n = l->nranks;
		for (int k = 0; k < l->nranks; k++) {
			ranks[k] = k;
			index[k] = l->prim == COLL_REDUCE_SCATTER ? (uint64_t)r * c + i : i;
		}
		return true;
	case COLL_ALL_GATHER:
		ranks[0] = (int)(i / c);
		index[0] = i % c;
		return true;
	case COLL_BROADCAST:
	case COLL_SENDRECV:
		ranks[0] = l->root;
		index[0] = i;
		return true;
	case COLL_ALL_TO_ALL:
		ranks[0] = (int)(i / c);
		index[0] = (uint64_t)r * c + i % c;
		return true;
	}
	return false;
}

/* nccl-tests' size of one run, in elements: what its algbw divides by the time. */
static inline uint64_t coll_size_elements(const struct coll_layout *l)
{
	bool blocks = l->prim == COLL_REDUCE_SCATTER || l->prim == COLL_ALL_GATHER ||
		      l->prim == COLL_ALL_TO_ALL;
	return blocks ? l->count * (uint64_t)l->nranks : l->count;
}

/*
 * nccl-tests' bus factor (busbw = algbw x factor): 2(n-1)/n for allreduce,
 * (n-1)/n for reduce_scatter, all_gather and all_to_all, 1 for broadcast,
 * reduce and sendrecv.
 */
static inline double coll_bus_factor(enum coll_prim p, int nranks)
{
	double n = nranks;
	switch (p) {
	case COLL_ALLREDUCE: return 2.0 * (n - 1) / n;
	case COLL_REDUCE_SCATTER:
	case COLL_ALL_GATHER:
	case COLL_ALL_TO_ALL: return (n - 1) / n;
	default: return 1.0;
	}
}

/*
 * Whether out is a right output element made of in[0..n) (coll_sources):
 * the reduction's reference for reducing primitives, the very bits of the
 * one source for the others.
 */
static inline bool coll_check_output(enum coll_prim p, enum gpuq_dtype t, enum coll_op op, int n,
				     const uint64_t *in, uint64_t out)
{
	if (coll_prim_reduces(p))
		return coll_check_element(t, op, n, in, out);
	size_t size = gpuq_dtype_size(t);
	uint64_t mask = size >= 8 ? UINT64_MAX : (UINT64_C(1) << (8 * size)) - 1;
	return n == 1 && (in[0] & mask) == (out & mask);
}

#endif
