/*
 * Expression programs without a compiler: the kernels that interpret any
 * program (kernels/chain_abi.h) when no compiled kernel can be had, the
 * last step of every reduction (folding the tiles' results, for compiled
 * and interpreted tiles alike), and the read kernel that measures the
 * reductions' bandwidth ceiling.
 *
 * The interpreter is a body for kernels/chain_ops.cuh's loops, as a
 * compiled kernel's is, so both fold a reduction in the same order; it
 * evaluates each element's nodes with an operand stack (nodes are in
 * post-order), computing each with gq_op and gq_round as the compiled code
 * does, so both give the same bits. It is a fallback: every node costs a
 * switch and local-memory traffic per element.
 *
 * The program is the kernel's __grid_constant__ parameter: the interpreter
 * indexes it at run time, which a parameter copied to each thread's local
 * memory would make slow, and every thread reads the same node at once (a
 * broadcast).
 */
#include "kernels/kernels.h"

#include <atomic>

#include "kernels/chain_ops.cuh"
#include "kernels/grid.cuh"

/* A value of dtype t at element i of p, exactly, as a double. */
static __device__ __forceinline__ double interp_load(unsigned t, const void *p, gq_u64 i)
{
	switch (t) {
	case KERNELS_EXPR_F16: return gq_io<KERNELS_EXPR_F16>::ld1(p, i);
	case KERNELS_EXPR_BF16: return gq_io<KERNELS_EXPR_BF16>::ld1(p, i);
	case KERNELS_EXPR_F32: return gq_io<KERNELS_EXPR_F32>::ld1(p, i);
	default: return gq_io<KERNELS_EXPR_F64>::ld1(p, i);
	}
}

/* Stores v, a value of dtype t (so exact in t). */
static __device__ __forceinline__ void interp_store(unsigned t, void *p, gq_u64 i, double v)
{
	switch (t) {
	case KERNELS_EXPR_F16: gq_io<KERNELS_EXPR_F16>::st1(p, i, (float)v); break;
	case KERNELS_EXPR_BF16: gq_io<KERNELS_EXPR_BF16>::st1(p, i, (float)v); break;
	case KERNELS_EXPR_F32: gq_io<KERNELS_EXPR_F32>::st1(p, i, (float)v); break;
	default: gq_io<KERNELS_EXPR_F64>::st1(p, i, v); break;
	}
}

/* Node n of g on its operands a0..a2, the variables' values var. */
static __device__ __forceinline__ double interp_node(const struct kernels_expr_prog &g,
						     const struct kernels_expr_node &n, double a0,
						     double a1, double a2, const double *var)
{
	switch (n.kind) {
	case KERNELS_EXPR_VAR: return var[n.arg[0]];
	case KERNELS_EXPR_CONST:
		return n.type == KERNELS_EXPR_F64 ? g.c[n.arg[0]] : (double)(float)g.c[n.arg[0]];
	case KERNELS_EXPR_CAST: return gq_convert(n.type, a0);
	default:
		if (n.type == KERNELS_EXPR_F64)
			return gq_op(n.op, a0, a1, a2);
		return (double)gq_round(n.type, gq_op(n.op, (float)a0, (float)a1, (float)a2));
	}
}

/*
 * Evaluates g's nodes in order with an operand stack: the statements
 * (assigning to var as each ends), or for a reduction the one or two roots
 * it leaves in st. Never inlined: every op of every type is in it, and the
 * loops call it from many places (which, inlined, took nvcc minutes).
 */
static __device__ __noinline__ void interp_eval(const struct kernels_expr_prog &g, double *var, double *st)
{
	unsigned depth = 0, s = 0;
	for (unsigned i = 0; i < g.nnodes; i++) {
		const struct kernels_expr_node &n = g.node[i];
		unsigned k = n.kind == KERNELS_EXPR_OP || n.kind == KERNELS_EXPR_CAST ? n.nargs : 0;
		double a0 = k > 0 ? st[depth - k] : 0.0;
		double a1 = k > 1 ? st[depth - k + 1] : 0.0;
		double a2 = k > 2 ? st[depth - k + 2] : 0.0;
		depth -= k;
		st[depth++] = interp_node(g, n, a0, a1, a2, var);
		if (s < g.nstmts && g.stmt_node[s] == i) {
			var[g.stmt_var[s]] = gq_convert(g.var_dtype[g.stmt_var[s]], st[0]);
			depth = 0;
			s++;
		}
	}
}

struct interp {
	struct regs {
	};
	struct bcast {
		double v[KERNELS_EXPR_MAX_VARS];
	};
	static __device__ __forceinline__ void load_bcast(const struct kernels_expr &p, bcast &b)
	{
		for (unsigned k = 0; k < p.prog.nvars; k++)
			if (p.prog.var_flags[k] & KERNELS_EXPR_BCAST)
				b.v[k] = interp_load(p.prog.var_dtype[k], p.var[k], 0);
	}
	static __device__ __forceinline__ void load(const struct kernels_expr &, gq_u64, gq_u64, regs &)
	{
	}
	static __device__ __forceinline__ void load_item(const struct kernels_expr &, gq_u64, regs &)
	{
	}
	/* The variables' values at element i (0 for those only written). */
	static __device__ __forceinline__ void vars_at(const struct kernels_expr &p, gq_u64 i,
						       const bcast &b, double *var)
	{
		for (unsigned k = 0; k < p.prog.nvars; k++) {
			unsigned f = p.prog.var_flags[k];
			var[k] = !(f & KERNELS_EXPR_LOAD) ? 0.0
				 : (f & KERNELS_EXPR_BCAST) ? b.v[k]
							    : interp_load(p.prog.var_dtype[k], p.var[k], i);
		}
	}
	static __device__ __noinline__ void one(const struct kernels_expr &p, gq_u64 i, const bcast &b)
	{
		double var[KERNELS_EXPR_MAX_VARS], st[KERNELS_EXPR_MAX_DEPTH];
		vars_at(p, i, b, var);
		for (gq_u64 r = 0; r < p.repeat; r++)
			interp_eval(p.prog, var, st);
		for (unsigned k = 0; k < p.prog.nvars; k++)
			if (p.prog.var_flags[k] & KERNELS_EXPR_STORE)
				interp_store(p.prog.var_dtype[k], p.store[k], i, var[k]);
	}
	static __device__ void items(const struct kernels_expr &p, gq_u64 i0, const regs &, gq_u64 i1,
				     const regs &, bool has1, const bcast &b)
	{
		for (unsigned e = 0; e < KERNELS_EXPR_ITEM; e++)
			one(p, i0 * KERNELS_EXPR_ITEM + e, b);
		for (unsigned e = 0; has1 && e < KERNELS_EXPR_ITEM; e++)
			one(p, i1 * KERNELS_EXPR_ITEM + e, b);
	}
	static __device__ __noinline__ double value1(const struct kernels_expr &p, gq_u64 i,
						     const bcast &b)
	{
		double var[KERNELS_EXPR_MAX_VARS], st[KERNELS_EXPR_MAX_DEPTH];
		vars_at(p, i, b, var);
		interp_eval(p.prog, var, st);
		return p.prog.reduce == KERNELS_REDUCE_DOT ? __dmul_rn(st[0], st[1]) : st[0];
	}
	static __device__ void values(const struct kernels_expr &p, gq_u64 it, const regs &,
				      const bcast &b, double *v)
	{
		for (unsigned e = 0; e < KERNELS_EXPR_ITEM; e++)
			v[e] = value1(p, it * KERNELS_EXPR_ITEM + e, b);
	}
};

static __global__ void __launch_bounds__(KERNELS_REDUCE_THREADS)
	expr_run_kernel(const __grid_constant__ struct kernels_expr p)
{
	gq_elementwise<interp>(p);
}

template <unsigned K>
static __global__ void __launch_bounds__(KERNELS_REDUCE_THREADS)
	expr_reduce_kernel(const __grid_constant__ struct kernels_expr p, struct kernels_partial *out)
{
	gq_reduce_tiles<interp, K>(p, out);
}

/* The tile kernel of each reduction (index: the kind; 0 unused). */
typedef void (*reduce_kernel_fn)(const struct kernels_expr, struct kernels_partial *);
static const reduce_kernel_fn reduce_kernels[KERNELS_REDUCE_KINDS] = {
	NULL,
	expr_reduce_kernel<KERNELS_REDUCE_SUM>,
	expr_reduce_kernel<KERNELS_REDUCE_MIN>,
	expr_reduce_kernel<KERNELS_REDUCE_MAX>,
	expr_reduce_kernel<KERNELS_REDUCE_MEAN>,
	expr_reduce_kernel<KERNELS_REDUCE_NORM2>,
	expr_reduce_kernel<KERNELS_REDUCE_DOT>,
	expr_reduce_kernel<KERNELS_REDUCE_COUNT_NONZERO>,
	expr_reduce_kernel<KERNELS_REDUCE_ARGMAX>,
};

static __global__ void __launch_bounds__(KERNELS_REDUCE_THREADS)
	reduce_combine_kernel(unsigned kind, const struct kernels_partial *in, gq_u64 n,
			      struct kernels_partial *out)
{
	gq_reduce_combine(kind, in, n, out);
}

/*
 * The reductions' ceiling: 16-byte loads, four in flight per thread, XOR-ed
 * together; *sink is written only when the XOR has a value no test data
 * gives, so the loads cannot be dropped and nothing else is written.
 */
static __global__ void __launch_bounds__(KERNELS_REDUCE_THREADS)
	read_kernel(const uint4 *src, gq_u64 nvec, unsigned long long *sink)
{
	gq_u64 tid = (gq_u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (gq_u64)gridDim.x * blockDim.x;
	unsigned x = 0;
	gq_u64 v = tid;
	for (; v + 3 * stride < nvec; v += 4 * stride) {
		uint4 a = src[v], b = src[v + stride], c = src[v + 2 * stride], d = src[v + 3 * stride];
		x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
		     d.z ^ d.w;
	}
	for (; v < nvec; v += stride) {
		uint4 a = src[v];
		x ^= a.x ^ a.y ^ a.z ^ a.w;
	}
	if (x == 0x9e3779b9u && tid == ~0ull)
		*sink = x;
}

/* Blocks of a kernel per SM, asked once (as kernels/chain.cu does). */
template <class K>
static cudaError_t per_sm(K kernel, std::atomic<int> &cached, int *out)
{
	int n = cached.load(std::memory_order_relaxed);
	if (n == 0) {
		cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel,
									      KERNELS_REDUCE_THREADS, 0);
		if (e != cudaSuccess)
			return e;
		n = n < 1 ? 1 : n;
		cached.store(n, std::memory_order_relaxed);
	}
	*out = n;
	return cudaSuccess;
}

static std::atomic<int> g_run_per_sm, g_read_per_sm, g_combine_per_sm;
static std::atomic<int> g_reduce_per_sm[KERNELS_REDUCE_KINDS];

/* One wave of `kernel` (per_sm blocks on each of the device's SMs), or fewer when items need fewer. */
static cudaError_t wave(int per_sm_blocks, gq_u64 items, unsigned *blocks)
{
	int sms;
	cudaError_t e = grid_current_sms(&sms);
	if (e != cudaSuccess)
		return e;
	gq_u64 need = (items + KERNELS_REDUCE_THREADS - 1) / KERNELS_REDUCE_THREADS;
	gq_u64 cap = (gq_u64)sms * (gq_u64)per_sm_blocks;
	*blocks = (unsigned)(need < 1 ? 1 : need < cap ? need : cap);
	return cudaSuccess;
}

extern "C" cudaError_t kernels_expr_prepare(void)
{
	int n;
	cudaError_t e = grid_current_sms(&n);
	if (e == cudaSuccess)
		e = per_sm(expr_run_kernel, g_run_per_sm, &n);
	for (unsigned k = 1; k < KERNELS_REDUCE_KINDS && e == cudaSuccess; k++)
		e = per_sm(reduce_kernels[k], g_reduce_per_sm[k], &n); /* loads it: none may load in a capture */
	if (e == cudaSuccess)
		e = per_sm(reduce_combine_kernel, g_combine_per_sm, &n);
	if (e == cudaSuccess)
		e = per_sm(read_kernel, g_read_per_sm, &n);
	return e;
}

static bool expr_aligned(const struct kernels_expr *x)
{
	for (unsigned k = 0; k < x->prog.nvars; k++)
		if (!x->var[k] || !x->store[k] || ((uintptr_t)x->var[k] | (uintptr_t)x->store[k]) % 16 != 0)
			return false;
	return x->prog.nvars <= KERNELS_EXPR_MAX_VARS;
}

extern "C" cudaError_t kernels_expr_run(const struct kernels_expr *x, cudaStream_t stream)
{
	if (!expr_aligned(x) || x->prog.reduce != KERNELS_REDUCE_NONE)
		return cudaErrorInvalidValue;
	if (x->count == 0)
		return cudaSuccess;
	expr_run_kernel<<<kernels_elementwise_blocks(x->count), KERNELS_REDUCE_THREADS, 0, stream>>>(*x);
	return cudaGetLastError();
}

extern "C" cudaError_t kernels_expr_reduce(const struct kernels_expr *x, struct kernels_partial *tiles,
					   cudaStream_t stream)
{
	if (!expr_aligned(x) || x->prog.reduce == KERNELS_REDUCE_NONE ||
	    x->prog.reduce >= KERNELS_REDUCE_KINDS || !tiles)
		return cudaErrorInvalidValue;
	gq_u64 ntiles = kernels_reduce_tiles(x->count);
	if (ntiles == 0)
		return cudaSuccess;
	int n, sms;
	cudaError_t e = per_sm(reduce_kernels[x->prog.reduce], g_reduce_per_sm[x->prog.reduce], &n);
	if (e == cudaSuccess)
		e = grid_current_sms(&sms);
	if (e != cudaSuccess)
		return e;
	gq_u64 blocks = kernels_reduce_blocks(ntiles, (gq_u64)sms * (gq_u64)n);
	reduce_kernels[x->prog.reduce]<<<(unsigned)blocks, KERNELS_REDUCE_THREADS, 0, stream>>>(*x, tiles);
	return cudaGetLastError();
}

extern "C" cudaError_t kernels_reduce_combine(unsigned kind, const struct kernels_partial *tiles,
					      uint64_t ntiles, struct kernels_partial *out,
					      cudaStream_t stream)
{
	if (kind == KERNELS_REDUCE_NONE || kind >= KERNELS_REDUCE_KINDS || !out || (ntiles && !tiles))
		return cudaErrorInvalidValue;
	reduce_combine_kernel<<<1, KERNELS_REDUCE_THREADS, 0, stream>>>(kind, tiles, ntiles, out);
	return cudaGetLastError();
}

extern "C" cudaError_t kernels_read(const void *src, size_t bytes, unsigned long long *sink,
				    cudaStream_t stream)
{
	if ((uintptr_t)src % 16 != 0 || !sink)
		return cudaErrorInvalidValue;
	if (bytes < 16)
		return cudaSuccess;
	int n;
	unsigned blocks;
	cudaError_t e = per_sm(read_kernel, g_read_per_sm, &n);
	if (e == cudaSuccess)
		e = wave(n, bytes / 16, &blocks);
	if (e != cudaSuccess)
		return e;
	read_kernel<<<blocks, KERNELS_REDUCE_THREADS, 0, stream>>>(static_cast<const uint4 *>(src),
								   bytes / 16, sink);
	return cudaGetLastError();
}
