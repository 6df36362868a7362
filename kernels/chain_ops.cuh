/*
 * What the elementwise ops compute, and the loops every expression kernel
 * runs, in one text for every kernel that computes them: kernels/chain.cu
 * (the per-op and interpreted fused chain kernels) and kernels/chain_expr.cu
 * (the program interpreter and the reductions) include it, and gpuqd hands
 * this very text to NVRTC in front of every kernel it compiles
 * (workers/chain/chain_codegen.c). One text is what makes a compiled kernel give
 * the same bits as the interpreted ones: the same functions, the same
 * rounding, the same order of a reduction.
 *
 * It must compile under NVRTC without a file system: it includes only
 * kernels/chain_abi.h and kernels/chain_reduce.h (handed to NVRTC by name), uses only what NVRTC
 * provides built in (the math functions, the intrinsics, uint2/uint4), and
 * converts f16 and bf16 with the PTX instructions cuda_fp16.h and
 * cuda_bf16.h use themselves. CUDA C++ only; host code never includes it.
 *
 * Numbers. f16 and bf16 values compute in float, f32 in float, f64 in
 * double; a node's result is rounded to its type. add, sub, mul, div and fma
 * are the explicitly rounded intrinsics, so no compiler contracts a mul and
 * an add into an fma. With GPUQ_FAST_MATH defined (NVRTC's -use_fast_math,
 * `--math fast`) the float functions are CUDA's fast intrinsics instead;
 * double is never affected.
 */
#ifndef GPUQ_CHAIN_OPS_CUH
#define GPUQ_CHAIN_OPS_CUH

#include "kernels/chain_abi.h"
#include "kernels/chain_reduce.h"

typedef unsigned long long gq_u64;

/* ---- f16 and bf16 <-> float: exact widening, round-to-nearest-even narrowing ---- */

static __device__ __forceinline__ float gq_f16_to_f32(unsigned short h)
{
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
	return f;
}

static __device__ __forceinline__ unsigned short gq_f32_to_f16(float f)
{
	unsigned short h;
	asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
	return h;
}

static __device__ __forceinline__ float gq_bf16_to_f32(unsigned short b)
{
	float f;
#if __CUDA_ARCH__ >= 900
	asm("cvt.f32.bf16 %0, %1;" : "=f"(f) : "h"(b));
#else
	asm("mov.b32 %0, {0, %1};" : "=f"(f) : "h"(b));
#endif
	return f;
}

static __device__ __forceinline__ unsigned short gq_f32_to_bf16(float f)
{
#if __CUDA_ARCH__ >= 800
	unsigned short b;
	asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
	return b;
#else
	unsigned u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (unsigned short)((u >> 16) | 0x40u); /* NaN stays a quiet NaN */
	return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

/* x (a float value) rounded to dtype t, as storing and loading it would; f64 is its own. */
static __device__ __forceinline__ float gq_round(unsigned t, float x)
{
	if (t == KERNELS_EXPR_F16)
		return gq_f16_to_f32(gq_f32_to_f16(x));
	if (t == KERNELS_EXPR_BF16)
		return gq_bf16_to_f32(gq_f32_to_bf16(x));
	return x;
}

/*
 * The value x of any type (held as a double, which holds every type's
 * values exactly) converted to dtype t: f64 keeps it, f32 rounds once, f16
 * and bf16 go through f32 (rounded to f32, then to the 16-bit type).
 */
static __device__ __forceinline__ double gq_convert(unsigned t, double x)
{
	if (t == KERNELS_EXPR_F64)
		return x;
	return (double)gq_round(t, (float)x);
}

/* ---- The ops (kernels/kernels.h's list), in float and in double ---- */

#ifdef GPUQ_FAST_MATH
#define GQ_SINF __sinf
#define GQ_COSF __cosf
#define GQ_TANF __tanf
#define GQ_EXPF __expf
#define GQ_LOGF __logf
#define GQ_LOG2F __log2f
#define GQ_POWF __powf
#define GQ_FDIV __fdividef
static __device__ __forceinline__ float gq_tanhf(float x)
{
	float y;
	asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}
#else
#define GQ_SINF sinf
#define GQ_COSF cosf
#define GQ_TANF tanf
#define GQ_EXPF expf
#define GQ_LOGF logf
#define GQ_LOG2F log2f
#define GQ_POWF powf
#define GQ_FDIV __fdiv_rn
static __device__ __forceinline__ float gq_tanhf(float x)
{
	return tanhf(x);
}
#endif

/*
 * Op k on x with operands a and b (ignored by the ops that take fewer).
 * relu sends NaN and -0 to +0; sigmoid is 1 / (1 + exp(-x)); round halves
 * away from zero; clamp is min(max(x, a), b); fma is x * a + b rounded once.
 * Called with a constant k, the switch folds away.
 */
static __device__ __forceinline__ float gq_op(unsigned k, float x, float a, float b)
{
	switch (k) {
	case KERNELS_CHAIN_SIN: return GQ_SINF(x);
	case KERNELS_CHAIN_COS: return GQ_COSF(x);
	case KERNELS_CHAIN_TAN: return GQ_TANF(x);
	case KERNELS_CHAIN_EXP: return GQ_EXPF(x);
	case KERNELS_CHAIN_LOG: return GQ_LOGF(x);
	case KERNELS_CHAIN_LOG2: return GQ_LOG2F(x);
	case KERNELS_CHAIN_SQRT: return sqrtf(x);
	case KERNELS_CHAIN_RSQRT: return rsqrtf(x);
	case KERNELS_CHAIN_ABS: return fabsf(x);
	case KERNELS_CHAIN_NEG: return -x;
	case KERNELS_CHAIN_RELU: return x > 0.0f ? x : 0.0f;
	case KERNELS_CHAIN_SIGMOID: return GQ_FDIV(1.0f, __fadd_rn(1.0f, GQ_EXPF(-x)));
	case KERNELS_CHAIN_TANH: return gq_tanhf(x);
	case KERNELS_CHAIN_FLOOR: return floorf(x);
	case KERNELS_CHAIN_CEIL: return ceilf(x);
	case KERNELS_CHAIN_ROUND: return roundf(x);
	case KERNELS_CHAIN_ADD: return __fadd_rn(x, a);
	case KERNELS_CHAIN_SUB: return __fsub_rn(x, a);
	case KERNELS_CHAIN_MUL: return __fmul_rn(x, a);
	case KERNELS_CHAIN_DIV: return GQ_FDIV(x, a);
	case KERNELS_CHAIN_POW: return GQ_POWF(x, a);
	case KERNELS_CHAIN_MIN: return fminf(x, a);
	case KERNELS_CHAIN_MAX: return fmaxf(x, a);
	case KERNELS_CHAIN_CLAMP: return fminf(fmaxf(x, a), b);
	case KERNELS_CHAIN_FMA: return __fmaf_rn(x, a, b);
	}
	return x;
}

static __device__ __forceinline__ double gq_op(unsigned k, double x, double a, double b)
{
	switch (k) {
	case KERNELS_CHAIN_SIN: return sin(x);
	case KERNELS_CHAIN_COS: return cos(x);
	case KERNELS_CHAIN_TAN: return tan(x);
	case KERNELS_CHAIN_EXP: return exp(x);
	case KERNELS_CHAIN_LOG: return log(x);
	case KERNELS_CHAIN_LOG2: return log2(x);
	case KERNELS_CHAIN_SQRT: return sqrt(x);
	case KERNELS_CHAIN_RSQRT: return rsqrt(x);
	case KERNELS_CHAIN_ABS: return fabs(x);
	case KERNELS_CHAIN_NEG: return -x;
	case KERNELS_CHAIN_RELU: return x > 0.0 ? x : 0.0;
	case KERNELS_CHAIN_SIGMOID: return __ddiv_rn(1.0, __dadd_rn(1.0, exp(-x)));
	case KERNELS_CHAIN_TANH: return tanh(x);
	case KERNELS_CHAIN_FLOOR: return floor(x);
	case KERNELS_CHAIN_CEIL: return ceil(x);
	case KERNELS_CHAIN_ROUND: return round(x);
	case KERNELS_CHAIN_ADD: return __dadd_rn(x, a);
	case KERNELS_CHAIN_SUB: return __dsub_rn(x, a);
	case KERNELS_CHAIN_MUL: return __dmul_rn(x, a);
	case KERNELS_CHAIN_DIV: return __ddiv_rn(x, a);
	case KERNELS_CHAIN_POW: return pow(x, a);
	case KERNELS_CHAIN_MIN: return fmin(x, a);
	case KERNELS_CHAIN_MAX: return fmax(x, a);
	case KERNELS_CHAIN_CLAMP: return fmin(fmax(x, a), b);
	case KERNELS_CHAIN_FMA: return __fma_rn(x, a, b);
	}
	return x;
}

/* ---- Memory: items of 4 elements of each element type ---- */

struct gq_raw32 {
	uint4 a, b;
};

/*
 * gq_io<T>: elements of dtype T. C is what they compute in; raw holds one
 * item (4 elements) as loaded; ld4/st4 move item `item` (aligned: buffers
 * are 16-byte aligned and an item is 8, 16 or 32 bytes), ld1/st1 element i.
 */
template <int T> struct gq_io;

template <> struct gq_io<KERNELS_EXPR_F32> {
	typedef float C;
	typedef uint4 raw;
	static __device__ __forceinline__ raw ld4(const void *p, gq_u64 item)
	{
		return static_cast<const uint4 *>(p)[item];
	}
	static __device__ __forceinline__ void cvt4(const raw &r, C *x)
	{
		x[0] = __uint_as_float(r.x);
		x[1] = __uint_as_float(r.y);
		x[2] = __uint_as_float(r.z);
		x[3] = __uint_as_float(r.w);
	}
	static __device__ __forceinline__ void st4(void *p, gq_u64 item, const C *x)
	{
		static_cast<uint4 *>(p)[item] = make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]),
							  __float_as_uint(x[2]), __float_as_uint(x[3]));
	}
	static __device__ __forceinline__ C ld1(const void *p, gq_u64 i)
	{
		return static_cast<const float *>(p)[i];
	}
	static __device__ __forceinline__ void st1(void *p, gq_u64 i, C x)
	{
		static_cast<float *>(p)[i] = x;
	}
};

template <> struct gq_io<KERNELS_EXPR_F64> {
	typedef double C;
	typedef gq_raw32 raw;
	static __device__ __forceinline__ raw ld4(const void *p, gq_u64 item)
	{
		const uint4 *v = static_cast<const uint4 *>(p) + 2 * item;
		raw r;
		r.a = v[0];
		r.b = v[1];
		return r;
	}
	static __device__ __forceinline__ void cvt4(const raw &r, C *x)
	{
		x[0] = __hiloint2double((int)r.a.y, (int)r.a.x);
		x[1] = __hiloint2double((int)r.a.w, (int)r.a.z);
		x[2] = __hiloint2double((int)r.b.y, (int)r.b.x);
		x[3] = __hiloint2double((int)r.b.w, (int)r.b.z);
	}
	static __device__ __forceinline__ void st4(void *p, gq_u64 item, const C *x)
	{
		uint4 *v = static_cast<uint4 *>(p) + 2 * item;
		v[0] = make_uint4((unsigned)__double2loint(x[0]), (unsigned)__double2hiint(x[0]),
				  (unsigned)__double2loint(x[1]), (unsigned)__double2hiint(x[1]));
		v[1] = make_uint4((unsigned)__double2loint(x[2]), (unsigned)__double2hiint(x[2]),
				  (unsigned)__double2loint(x[3]), (unsigned)__double2hiint(x[3]));
	}
	static __device__ __forceinline__ C ld1(const void *p, gq_u64 i)
	{
		return static_cast<const double *>(p)[i];
	}
	static __device__ __forceinline__ void st1(void *p, gq_u64 i, C x)
	{
		static_cast<double *>(p)[i] = x;
	}
};

/* f16 and bf16: 16-bit elements, an item is 8 bytes; only the conversion differs. */
template <int T> struct gq_io16 {
	typedef float C;
	typedef uint2 raw;
	static __device__ __forceinline__ float widen(unsigned short h)
	{
		return T == KERNELS_EXPR_F16 ? gq_f16_to_f32(h) : gq_bf16_to_f32(h);
	}
	static __device__ __forceinline__ unsigned narrow(float f)
	{
		return T == KERNELS_EXPR_F16 ? gq_f32_to_f16(f) : gq_f32_to_bf16(f);
	}
	static __device__ __forceinline__ raw ld4(const void *p, gq_u64 item)
	{
		return static_cast<const uint2 *>(p)[item];
	}
	static __device__ __forceinline__ void cvt4(const raw &r, C *x)
	{
		x[0] = widen((unsigned short)(r.x & 0xffffu));
		x[1] = widen((unsigned short)(r.x >> 16));
		x[2] = widen((unsigned short)(r.y & 0xffffu));
		x[3] = widen((unsigned short)(r.y >> 16));
	}
	static __device__ __forceinline__ void st4(void *p, gq_u64 item, const C *x)
	{
		static_cast<uint2 *>(p)[item] = make_uint2(narrow(x[0]) | narrow(x[1]) << 16,
							   narrow(x[2]) | narrow(x[3]) << 16);
	}
	static __device__ __forceinline__ C ld1(const void *p, gq_u64 i)
	{
		return widen(static_cast<const unsigned short *>(p)[i]);
	}
	static __device__ __forceinline__ void st1(void *p, gq_u64 i, C x)
	{
		static_cast<unsigned short *>(p)[i] = (unsigned short)narrow(x);
	}
};
template <> struct gq_io<KERNELS_EXPR_F16> : gq_io16<KERNELS_EXPR_F16> {};
template <> struct gq_io<KERNELS_EXPR_BF16> : gq_io16<KERNELS_EXPR_BF16> {};

/* ---- The elementwise loop ---- */

/*
 * out = program(in) over p.count elements, for a body G that supplies:
 *   G::regs, G::load(p, item, nitems, regs): the raw items of the variables
 *     it reads (zeros past nitems); G::load_item(p, item, regs) the same
 *     for an item known to exist, without the check;
 *   G::bcast, G::load_bcast(p, bcast): the broadcast variables, once;
 *   G::items(p, i0, r0, i1, r1, has1, bcast): computes item i0 and, when
 *     has1, item i1, from their registers, and stores them: the body gets
 *     both, 8 elements, so that it can interleave their arithmetic;
 *   G::one(p, i, bcast): computes and stores element i (the count % 4 tail).
 * Each thread takes two items a block's width apart (so that a warp's
 * accesses stay coalesced): block b the 2 x blockDim items from
 * b x 2 x blockDim. The grid covers them all (kernels.h's
 * kernels_elementwise_blocks), and only a grid larger than a launch allows
 * loops. Such a grid outran a resident wave looping over the buffer, even
 * one that loaded its next items before computing these: on the H200 the
 * 5-op chain ran at 0.97 of a device-to-device copy this way, 0.89 as a
 * looping wave (the blocks the hardware starts as others finish keep more
 * loads in flight).
 */
template <class G>
static __device__ __forceinline__ void gq_elementwise(const struct kernels_expr &p)
{
	const gq_u64 count = p.count, nitems = count / KERNELS_EXPR_ITEM;
	const gq_u64 width = blockDim.x, span = 2 * width;
	typename G::bcast b;
	G::load_bcast(p, b);
	for (gq_u64 i0 = blockIdx.x * span + threadIdx.x; i0 < nitems; i0 += gridDim.x * span) {
		const gq_u64 i1 = i0 + width;
		typename G::regs r0, r1;
		G::load_item(p, i0, r0);
		G::load(p, i1, nitems, r1);
		G::items(p, i0, r0, i1, r1, i1 < nitems, b);
	}
	const gq_u64 tid = (gq_u64)blockIdx.x * width + threadIdx.x, first_tail = nitems * KERNELS_EXPR_ITEM;
	if (tid < count - first_tail)
		G::one(p, first_tail + tid, b);
}

/* ---- Reductions (kernels/chain_abi.h defines the order) ---- */

/* The block's partials in s[] folded pairwise into s[0] (the fixed tree). */
static __device__ __forceinline__ void gq_reduce_tree(unsigned kind, struct kernels_partial *s)
{
	const unsigned j = threadIdx.x;
	__syncthreads();
	for (unsigned w = KERNELS_REDUCE_THREADS / 2; w > 0; w >>= 1) {
		if (j < w)
			s[j] = kernels_reduce_merge(kind, s[j], s[j + w]);
		__syncthreads();
	}
}

/*
 * Group q (items 4q .. 4q + 3 of thread j) of full tile t into r. Without
 * a bounds check: a check per load makes ptxas issue the next group's loads
 * after the current group's folds, and then nothing is in flight meanwhile.
 */
template <class G>
static __device__ __forceinline__ void gq_reduce_load(const struct kernels_expr &p, gq_u64 t, int q,
						      typename G::regs *r)
{
	const gq_u64 first = t * (KERNELS_REDUCE_TILE / KERNELS_EXPR_ITEM) + threadIdx.x;
#pragma unroll
	for (int k = 0; k < 4; k++)
		G::load_item(p, first + (gq_u64)(4 * q + k) * KERNELS_REDUCE_THREADS, r[k]);
}

/* Group q of full tile t, loaded in r, folded into acc: each item, then its elements, in order. */
template <class G, unsigned K>
static __device__ __forceinline__ void gq_reduce_fold(const struct kernels_expr &p, gq_u64 t, int q,
						      const typename G::regs *r,
						      const typename G::bcast &b,
						      struct kernels_partial &acc)
{
	const gq_u64 first = t * (KERNELS_REDUCE_TILE / KERNELS_EXPR_ITEM) + threadIdx.x;
#pragma unroll
	for (int k = 0; k < 4; k++) {
		double v[KERNELS_EXPR_ITEM];
		gq_u64 item = first + (gq_u64)(4 * q + k) * KERNELS_REDUCE_THREADS;
		G::values(p, item, r[k], b, v);
#pragma unroll
		for (int e = 0; e < KERNELS_EXPR_ITEM; e++)
			acc = kernels_reduce_fold(K, acc, v[e], item * KERNELS_EXPR_ITEM + e);
	}
}

/* Tile t, the last and not full: every element checked against the count. */
template <class G, unsigned K>
static __device__ __forceinline__ struct kernels_partial gq_reduce_last(const struct kernels_expr &p,
									gq_u64 t,
									const typename G::bcast &b)
{
	struct kernels_partial acc = kernels_reduce_identity(K);
	const gq_u64 first = t * (KERNELS_REDUCE_TILE / KERNELS_EXPR_ITEM) + threadIdx.x;
	for (int g = 0; g < KERNELS_REDUCE_ITEMS; g++) {
		gq_u64 item = first + (gq_u64)g * KERNELS_REDUCE_THREADS;
		for (int e = 0; e < KERNELS_EXPR_ITEM; e++) {
			gq_u64 i = item * KERNELS_EXPR_ITEM + e;
			if (i < p.count)
				acc = kernels_reduce_fold(K, acc, G::value1(p, i, b), i);
		}
	}
	return acc;
}

/*
 * The tiles of a reduction of kind K (blocks of KERNELS_REDUCE_THREADS):
 * out[t] is tile t's result. The grid is persistent: block b computes tiles
 * b, b + gridDim.x, ..., each exactly as one block per tile would (the
 * order is the tile's, not the grid's), so the grid's size never changes a
 * result. Blocks stay resident so that no block's start or its tree leaves
 * the memory system idle: a thread keeps the next group of 4 items (the
 * next tile's first, at a tile's end) loading while it folds the current
 * one and while the block folds its tree. The body G supplies
 * regs/load/bcast/load_bcast as for gq_elementwise, and
 *   G::values(p, item, regs, bcast, v): the 4 values of an item, as doubles;
 *   G::value1(p, i, bcast): the value of element i.
 * K is a constant so that each fold compiles to its one case.
 */
template <class G, unsigned K>
static __device__ __forceinline__ void gq_reduce_tiles(const struct kernels_expr &p,
						       struct kernels_partial *out)
{
	__shared__ struct kernels_partial s[KERNELS_REDUCE_THREADS];
	const gq_u64 ntiles = (p.count + KERNELS_REDUCE_TILE - 1) / KERNELS_REDUCE_TILE;
	const gq_u64 nfull = p.count / KERNELS_REDUCE_TILE;
	typename G::bcast b;
	typename G::regs cur[4], next[4];
	G::load_bcast(p, b);
	if (blockIdx.x < nfull)
		gq_reduce_load<G>(p, blockIdx.x, 0, cur);
	for (gq_u64 t = blockIdx.x; t < ntiles; t += gridDim.x) {
		struct kernels_partial acc = kernels_reduce_identity(K);
		if (t < nfull) {
			/* The next tile's first group, or (none full) this one's again, unused. */
			const gq_u64 then = t + gridDim.x < nfull ? t + gridDim.x : t;
#pragma unroll
			for (int q = 0; q < KERNELS_REDUCE_ITEMS / 4; q++) {
				if (q + 1 < KERNELS_REDUCE_ITEMS / 4)
					gq_reduce_load<G>(p, t, q + 1, next);
				else
					gq_reduce_load<G>(p, then, 0, next);
				gq_reduce_fold<G, K>(p, t, q, cur, b, acc);
#pragma unroll
				for (int k = 0; k < 4; k++)
					cur[k] = next[k];
			}
		} else {
			acc = gq_reduce_last<G, K>(p, t, b);
		}
		s[threadIdx.x] = acc;
		gq_reduce_tree(K, s);
		if (threadIdx.x == 0)
			out[t] = s[0];
	}
}

/*
 * The tiles' results in[0..n) folded into out[0] (one block of
 * KERNELS_REDUCE_THREADS). Thread j folds tiles j, j + THREADS, ... in that
 * order; it loads them 8 at a time before folding them, since one load per
 * fold would wait out the memory latency n / THREADS times in a row.
 */
static __device__ __forceinline__ void gq_reduce_combine(unsigned kind, const struct kernels_partial *in,
							 gq_u64 n, struct kernels_partial *out)
{
	__shared__ struct kernels_partial s[KERNELS_REDUCE_THREADS];
	const unsigned j = threadIdx.x;
	struct kernels_partial acc = kernels_reduce_identity(kind);
	for (gq_u64 t = j; t < n; t += 8 * KERNELS_REDUCE_THREADS) {
		struct kernels_partial v[8];
#pragma unroll
		for (int k = 0; k < 8; k++)
			if (t + (gq_u64)k * KERNELS_REDUCE_THREADS < n)
				v[k] = in[t + (gq_u64)k * KERNELS_REDUCE_THREADS];
#pragma unroll
		for (int k = 0; k < 8; k++)
			if (t + (gq_u64)k * KERNELS_REDUCE_THREADS < n)
				acc = kernels_reduce_merge(kind, acc, v[k]);
	}
	s[j] = acc;
	gq_reduce_tree(kind, s);
	if (j == 0)
		out[0] = s[0];
}

#endif
