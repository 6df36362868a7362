/*
 * How a reduction folds values (kernels/chain_abi.h defines the order):
 * one definition that the kernels (kernels/chain_ops.cuh, nvcc and NVRTC
 * alike) and the host backend (workers/chain/chain_eval.c) both compile, so both
 * fold the same values to the same bits. Plain C for gcc, CUDA C++ for nvcc
 * and NVRTC; no #include but chain_abi.h. The device rounds with the
 * explicit intrinsics so that nvcc never contracts v * v + acc into an fma;
 * C11 (not GNU C) never contracts either.
 */
#ifndef GPUQ_CHAIN_REDUCE_H
#define GPUQ_CHAIN_REDUCE_H

#include "kernels/chain_abi.h"

#ifdef __CUDACC__
#define KERNELS_REDUCE_FN static __device__ __forceinline__
#define KERNELS_REDUCE_ADD(a, b) __dadd_rn((a), (b))
#define KERNELS_REDUCE_MUL(a, b) __dmul_rn((a), (b))
#else
#define KERNELS_REDUCE_FN static inline
#define KERNELS_REDUCE_ADD(a, b) ((a) + (b))
#define KERNELS_REDUCE_MUL(a, b) ((a) * (b))
#endif

KERNELS_REDUCE_FN struct kernels_partial kernels_partial_of(double v, unsigned long long i)
{
	struct kernels_partial r;
	r.v = v;
	r.i = i;
	return r;
}

/* Where a fold starts: +inf for min, -inf for max and argmax (index past every element), else 0. */
KERNELS_REDUCE_FN struct kernels_partial kernels_reduce_identity(unsigned kind)
{
	const double inf = 1.0 / 0.0;
	switch (kind) {
	case KERNELS_REDUCE_MIN: return kernels_partial_of(inf, 0);
	case KERNELS_REDUCE_MAX: return kernels_partial_of(-inf, 0);
	case KERNELS_REDUCE_ARGMAX: return kernels_partial_of(-inf, ~0ull);
	default: return kernels_partial_of(0.0, 0);
	}
}

/*
 * Two partial results as one. min and max propagate NaN (the first met in
 * the order); argmax prefers a NaN, then the larger value, then the smaller
 * index, so that it is the index of the first NaN if there is one, else the
 * first index of the largest value; count_nonzero adds counts; the rest add.
 */
KERNELS_REDUCE_FN struct kernels_partial kernels_reduce_merge(unsigned kind, struct kernels_partial a,
							      struct kernels_partial b)
{
	int an = a.v != a.v, bn = b.v != b.v;
	switch (kind) {
	case KERNELS_REDUCE_MIN: return an || (!bn && !(b.v < a.v)) ? a : b;
	case KERNELS_REDUCE_MAX: return an || (!bn && !(b.v > a.v)) ? a : b;
	case KERNELS_REDUCE_COUNT_NONZERO: return kernels_partial_of(0.0, a.i + b.i);
	case KERNELS_REDUCE_ARGMAX:
		if (an || bn) {
			if (an && bn)
				return a.i <= b.i ? a : b;
			return an ? a : b;
		}
		if (a.v != b.v)
			return a.v > b.v ? a : b;
		return a.i <= b.i ? a : b;
	default: return kernels_partial_of(KERNELS_REDUCE_ADD(a.v, b.v), 0);
	}
}

/* Element i's value v folded into acc (norm2 folds v * v; count_nonzero counts v != 0, NaN too). */
KERNELS_REDUCE_FN struct kernels_partial kernels_reduce_fold(unsigned kind, struct kernels_partial acc,
							     double v, unsigned long long i)
{
	switch (kind) {
	case KERNELS_REDUCE_NORM2:
		return kernels_partial_of(KERNELS_REDUCE_ADD(acc.v, KERNELS_REDUCE_MUL(v, v)), 0);
	case KERNELS_REDUCE_COUNT_NONZERO: return kernels_partial_of(0.0, acc.i + (v != 0.0));
	default: return kernels_reduce_merge(kind, acc, kernels_partial_of(v, i));
	}
}

#endif
