/*
 * Elementwise chain kernels: one kernel per op (templated on element type and
 * op, so each compiles to straight-line code), and one fused kernel that
 * applies a whole op list in registers.
 *
 * Both are bound by memory bandwidth when the chain is short, so they share
 * one loop shape: a grid-stride loop over 16-byte vectors in which each thread
 * handles two vectors (a grid-stride apart, so that a warp's accesses stay
 * coalesced) per step, and loads the next step's pair before computing this
 * one, keeping bytes in flight while it computes; the count % (16 / size)
 * trailing elements are done one each by the first threads. The grid is exactly one wave: the SM count times the blocks of
 * this kernel that fit on an SM, so no SM is left with a second, partial
 * wave while the others idle.
 *
 * Numbers: f16 and bf16 are widened to float, f32 stays float, f64 double.
 * Every op's result is rounded to the element type before the next op reads
 * it (a no-op for f32 and f64), which is what a kernel per op does by
 * storing it, so the fused kernel gives the same bits. What each op computes
 * and how values convert is kernels/chain_ops.cuh, shared with the
 * expression kernels and the kernels compiled at run time: add, sub, mul,
 * div and fma are the explicitly rounded intrinsics, so nvcc never contracts
 * a mul and a following add into one fma, and the host reference
 * (workers/chain/chain_eval.c) can follow the same arithmetic. The transcendental
 * functions are CUDA's IEEE-accurate ones (this file is never built with
 * --use_fast_math).
 */
#include "kernels/kernels.h"

#include <atomic>
#include <cstring>

#include "kernels/chain_ops.cuh"
#include "kernels/grid.cuh"


static const unsigned kThreads = 256;
static const unsigned kVectorsPerThread = 2;

/* Storage and arithmetic of each element type: bits in memory, C in registers. */
struct f32_traits {
	static const int min_blocks = 5; /* per SM: see chain_kernel */
	typedef float bits;
	typedef float C;
	static __device__ C load(bits v) { return v; }
	static __device__ bits store(C c) { return c; }
};
struct f64_traits {
	static const int min_blocks = 4; /* per SM: see chain_kernel */
	typedef double bits;
	typedef double C;
	static __device__ C load(bits v) { return v; }
	static __device__ bits store(C c) { return c; }
};
struct f16_traits {
	static const int min_blocks = 5; /* per SM: see chain_kernel */
	typedef unsigned short bits;
	typedef float C;
	static __device__ C load(bits v) { return gq_f16_to_f32(v); }
	static __device__ bits store(C c) { return gq_f32_to_f16(c); }
};
struct bf16_traits {
	static const int min_blocks = 5; /* per SM: see chain_kernel */
	typedef unsigned short bits;
	typedef float C;
	static __device__ C load(bits v) { return gq_bf16_to_f32(v); }
	static __device__ bits store(C c) { return gq_f32_to_bf16(c); }
};

/* The value an element of Tr holds after c is stored in it. */
template <class Tr>
static __device__ __forceinline__ typename Tr::C round_to(typename Tr::C c)
{
	return Tr::load(Tr::store(c));
}

/*
 * Op K on x with constants a and b: kernels/chain_ops.cuh's gq_op, which
 * the expression kernels and the kernels compiled at run time use too.
 */
template <int K, class C>
static __device__ __forceinline__ C op_apply(C x, C a, C b)
{
	return gq_op(K, x, a, b);
}

/* Op K on each of the N values in registers, each rounded to the element type. */
template <class Tr, int K, int N>
static __device__ __forceinline__ void op_apply_all(typename Tr::C (&x)[N], typename Tr::C a,
						    typename Tr::C b)
{
#pragma unroll
	for (int k = 0; k < N; k++)
		x[k] = round_to<Tr>(op_apply<K>(x[k], a, b));
}

/* The per-op kernel's work: op K with its two constants. */
template <class Tr, int K>
struct single_op {
	typename Tr::C a, b;
	template <int N>
	__device__ void operator()(typename Tr::C (&x)[N]) const
	{
		op_apply_all<Tr, K, N>(x, a, b);
	}
};

/*
 * The fused kernel's op list, passed by value as a kernel parameter (at most
 * 64 ops: 1.1 KiB for double, well inside the 4 KiB parameter space). Every
 * thread reads the same entry at the same time, a broadcast from the
 * constant bank that holds kernel parameters.
 */
template <class C>
struct fused_list {
	unsigned nops;
	unsigned long long repeat;
	unsigned char kind[KERNELS_CHAIN_MAX_OPS];
	C a[KERNELS_CHAIN_MAX_OPS];
	C b[KERNELS_CHAIN_MAX_OPS];
};

/*
 * The fused kernel's work: the list, repeat times. The switch is outside the
 * loop over values so that choosing an op costs once per op per thread, not
 * once per element.
 */
template <class Tr>
struct fused_ops {
	fused_list<typename Tr::C> list;
	template <int N>
	__device__ void operator()(typename Tr::C (&x)[N]) const
	{
		for (unsigned long long r = 0; r < list.repeat; r++) {
			for (unsigned i = 0; i < list.nops; i++) {
				typename Tr::C a = list.a[i], b = list.b[i];
				switch (list.kind[i]) {
#define FUSED_CASE(name, str, nargs)                                                       \
	case KERNELS_CHAIN_##name:                                                         \
		op_apply_all<Tr, KERNELS_CHAIN_##name, N>(x, a, b);                       \
		break;
					KERNELS_CHAIN_OPS(FUSED_CASE)
#undef FUSED_CASE
				}
			}
		}
	}
};

/* 16 bytes of elements, as one load or store. */
template <class Tr>
union vec16 {
	uint4 v;
	typename Tr::bits e[16 / sizeof(typename Tr::bits)];
};

template <class Tr, int P>
static __device__ __forceinline__ void widen(const vec16<Tr> &in, typename Tr::C *x)
{
#pragma unroll
	for (int k = 0; k < P; k++)
		x[k] = Tr::load(in.e[k]);
}

template <class Tr, int P>
static __device__ __forceinline__ void narrow(const typename Tr::C *x, vec16<Tr> &out)
{
#pragma unroll
	for (int k = 0; k < P; k++)
		out.e[k] = Tr::store(x[k]);
}

/* Vectors v and v + stride of src (the second only if it exists; else zeros). */
template <class Tr>
static __device__ __forceinline__ void load_pair(const uint4 *src, size_t v, size_t stride,
						 size_t nvec, vec16<Tr> &r0, vec16<Tr> &r1)
{
	r0.v = v < nvec ? src[v] : make_uint4(0, 0, 0, 0);
	r1.v = v + stride < nvec ? src[v + stride] : make_uint4(0, 0, 0, 0);
}

/*
 * out = work(in) over count elements (see the file comment for the loop's
 * shape). Each thread loads its next pair of vectors before it computes the
 * current one, so that a long chain's arithmetic overlaps the loads it will
 * need next; nvcc cannot hoist those loads itself, since in and out may be
 * the same memory: each element is read and then written by the same thread
 * (and the prefetched vectors are this thread's own), so neither pointer is
 * declared __restrict__. The launch bounds ask for 5 resident blocks per SM
 * (4 for f64): left to itself, ptxas squeezes the fused kernel into 40
 * registers by spilling the prefetched vectors to local memory.
 */
template <class Tr, class Work>
static __global__ void __launch_bounds__(kThreads, Tr::min_blocks)
	chain_kernel(const typename Tr::bits *in, typename Tr::bits *out, size_t count, Work work)
{
	typedef typename Tr::C C;
	const int P = 16 / sizeof(typename Tr::bits);
	size_t nvec = count / P;
	size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	size_t step = kVectorsPerThread * stride;
	const uint4 *vin = reinterpret_cast<const uint4 *>(in);
	uint4 *vout = reinterpret_cast<uint4 *>(out);

	vec16<Tr> r0, r1;
	load_pair<Tr>(vin, tid, stride, nvec, r0, r1);
	for (size_t v = tid; v < nvec; v += step) {
		vec16<Tr> n0, n1;
		load_pair<Tr>(vin, v + step, stride, nvec, n0, n1);
		C x[2 * P];
		widen<Tr, P>(r0, x);
		widen<Tr, P>(r1, x + P);
		work(x);
		narrow<Tr, P>(x, r0);
		narrow<Tr, P>(x + P, r1);
		vout[v] = r0.v;
		if (v + stride < nvec)
			vout[v + stride] = r1.v;
		r0 = n0;
		r1 = n1;
	}
	size_t first_tail = nvec * P;
	if (tid < count - first_tail) {
		C x[1] = { Tr::load(in[first_tail + tid]) };
		work(x);
		out[first_tail + tid] = Tr::store(x[0]);
	}
}

/*
 * Blocks of kThreads of this kernel that fit on one SM, asked once per
 * kernel and kept: the answer depends only on the kernel and the GPU's
 * architecture. Worker threads of several devices may race to fill it; they
 * all store the same number.
 */
template <class Tr, class Work>
static cudaError_t blocks_per_sm(int *out)
{
	static std::atomic<int> cached(0);
	int n = cached.load(std::memory_order_relaxed);
	if (n == 0) {
		cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
			&n, chain_kernel<Tr, Work>, (int)kThreads, 0);
		if (e != cudaSuccess)
			return e;
		if (n < 1)
			n = 1;
		cached.store(n, std::memory_order_relaxed);
	}
	*out = n;
	return cudaSuccess;
}

template <class Tr, class Work>
static cudaError_t launch(const void *in, void *out, size_t count, const Work &work,
			  cudaStream_t stream)
{
	if (((uintptr_t)in | (uintptr_t)out) % 16 != 0)
		return cudaErrorInvalidValue; /* a misaligned vector access would fault the context */
	if (count == 0)
		return cudaSuccess;
	int per_sm, sms;
	cudaError_t e = blocks_per_sm<Tr, Work>(&per_sm);
	if (e == cudaSuccess)
		e = grid_current_sms(&sms);
	if (e != cudaSuccess)
		return e;
	const size_t P = 16 / sizeof(typename Tr::bits);
	size_t items = (count / P + kVectorsPerThread - 1) / kVectorsPerThread;
	size_t need = (items + kThreads - 1) / kThreads, wave = (size_t)sms * (size_t)per_sm;
	unsigned blocks = (unsigned)(need < 1 ? 1 : need < wave ? need : wave);
	chain_kernel<Tr, Work><<<blocks, kThreads, 0, stream>>>(
		static_cast<const typename Tr::bits *>(in), static_cast<typename Tr::bits *>(out),
		count, work);
	return cudaGetLastError();
}

template <class Tr>
static cudaError_t launch_op(const void *in, void *out, size_t count,
			     const struct kernels_chain_op *op, cudaStream_t stream)
{
	typedef typename Tr::C C;
	C a = (C)op->a, b = (C)op->b;
	switch (op->kind) {
#define OP_CASE(name, str, nargs)                                                          \
	case KERNELS_CHAIN_##name:                                                         \
		return launch<Tr>(in, out, count, single_op<Tr, KERNELS_CHAIN_##name>{ a, b },  \
				  stream);
		KERNELS_CHAIN_OPS(OP_CASE)
#undef OP_CASE
	}
	return cudaErrorInvalidValue;
}

template <class Tr>
static cudaError_t launch_fused(const void *in, void *out, size_t count,
				const struct kernels_chain_op *ops, unsigned nops, uint64_t repeat,
				cudaStream_t stream)
{
	typedef typename Tr::C C;
	if (nops < 1 || nops > KERNELS_CHAIN_MAX_OPS)
		return cudaErrorInvalidValue;
	fused_ops<Tr> work;
	memset(&work, 0, sizeof work);
	work.list.nops = nops;
	work.list.repeat = repeat;
	for (unsigned i = 0; i < nops; i++) {
		if (ops[i].kind >= KERNELS_CHAIN_KINDS)
			return cudaErrorInvalidValue;
		work.list.kind[i] = (unsigned char)ops[i].kind;
		work.list.a[i] = (C)ops[i].a;
		work.list.b[i] = (C)ops[i].b;
	}
	return launch<Tr>(in, out, count, work, stream);
}

/* Loads each kernel of Tr and fills its occupancy cache. */
template <class Tr>
static cudaError_t prepare_type(void)
{
	int n;
	cudaError_t e;
#define PREPARE_OP(name, str, nargs)                                                       \
	e = blocks_per_sm<Tr, single_op<Tr, KERNELS_CHAIN_##name> >(&n);                  \
	if (e != cudaSuccess)                                                              \
		return e;
	KERNELS_CHAIN_OPS(PREPARE_OP)
#undef PREPARE_OP
	return blocks_per_sm<Tr, fused_ops<Tr> >(&n);
}

extern "C" cudaError_t kernels_chain_prepare(void)
{
	int sms;
	cudaError_t e = grid_current_sms(&sms);
	if (e == cudaSuccess)
		e = prepare_type<f32_traits>();
	if (e == cudaSuccess)
		e = prepare_type<f16_traits>();
	if (e == cudaSuccess)
		e = prepare_type<bf16_traits>();
	if (e == cudaSuccess)
		e = prepare_type<f64_traits>();
	return e;
}

extern "C" cudaError_t kernels_chain_op(const void *in, void *out, size_t count,
					enum kernels_dtype dtype, const struct kernels_chain_op *op,
					cudaStream_t stream)
{
	switch (dtype) {
	case KERNELS_F32: return launch_op<f32_traits>(in, out, count, op, stream);
	case KERNELS_F16: return launch_op<f16_traits>(in, out, count, op, stream);
	case KERNELS_BF16: return launch_op<bf16_traits>(in, out, count, op, stream);
	case KERNELS_F64: return launch_op<f64_traits>(in, out, count, op, stream);
	default: return cudaErrorInvalidValue;
	}
}

extern "C" cudaError_t kernels_chain_fused(const void *in, void *out, size_t count,
					   enum kernels_dtype dtype,
					   const struct kernels_chain_op *ops, unsigned nops,
					   uint64_t repeat, cudaStream_t stream)
{
	switch (dtype) {
	case KERNELS_F32: return launch_fused<f32_traits>(in, out, count, ops, nops, repeat, stream);
	case KERNELS_F16: return launch_fused<f16_traits>(in, out, count, ops, nops, repeat, stream);
	case KERNELS_BF16:
		return launch_fused<bf16_traits>(in, out, count, ops, nops, repeat, stream);
	case KERNELS_F64: return launch_fused<f64_traits>(in, out, count, ops, nops, repeat, stream);
	default: return cudaErrorInvalidValue;
	}
}
