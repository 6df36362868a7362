/*
 * Kernel chains: elementwise programs over buffers (workers/chain/chain_prog.h),
 * written as an op list on one buffer ('sin | add 1') or as an expression
 * over several ('y = a * x + y'), and reductions of them to one number.
 * A program that is an op list runs as one kernel per op launched one by
 * one (eager), as those kernels captured into a CUDA graph and replayed
 * (graph), or fused; every program runs fused: one kernel compiled for it
 * with NVRTC (workers/chain/chain_jit.h), or when that cannot be had an
 * interpreting kernel, replayed from a CUDA graph.
 *
 * Who owns what. The daemon fills a struct chain_spec on the main thread
 * (daemon/op_chain.c: it validates every op first), hangs it on the job's
 * work and owns it; the worker reads it and writes its `result` between
 * worker_submit and completion, and the main thread reads the result after.
 * The graph cache (struct chain_state) belongs to the device's worker: it
 * is made at the device's first chain and released when the device closes.
 * The counters in struct device's chain_counters are the one part of that
 * state the main thread reads (the `stats` op), hence atomics.
 *
 * The cache. Each backend builds a "plan" for a chain (CUDA: the kernels
 * captured with stream capture and instantiated; host: the compiled kernel
 * it holds, so that CI exercises the same cache) and the cache keeps the
 * plans of the last config.chain_graph_cache chains, least recently used out
 * first, keyed by the program (constants as bits), mode, kernel, math,
 * count, repeat and the buffers. A chain that matches an entry in everything
 * but its buffers retargets that plan (CUDA: cudaGraphExecUpdate) instead of
 * building another. A plan of the compiled kernel holds that kernel from the
 * device's kernel cache (workers/chain/chain_jit.h) until the plan goes.
 */
#ifndef GPUQ_CHAIN_H
#define GPUQ_CHAIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "protocol/protocol.h"
#include "workers/chain/chain_prog.h"
#include "workers/backend/backend.h"
#include "workers/work.h"

/* Default and bounds of --graph-cache (plans kept per device). */
#define CHAIN_CACHE_DEFAULT 64
#define CHAIN_CACHE_MAX 4096
/* The most kernels one graph holds (ops x repeat in graph mode). */
#define CHAIN_MAX_GRAPH_KERNELS 65536
#define CHAIN_MAX_REPEAT 1000000
/* The most timed replays a benchmark asks of one chain. */
#define CHAIN_MAX_REPS 64

/*
 * Chunks. A run's work is elements x ops x repeat (element-ops; for fused
 * runs ops counts the program's operations and casts). A run of more than a
 * chunk's worth is launched chunk by chunk (chain_chunks_plan) and checks
 * its cancel flag between chunks, so that a cancel, and a deadline's,
 * stops it within about two chunks. A chunk is whole repeats over the whole
 * buffer; where one repeat is more than a chunk, a fused run splits it into
 * ranges of elements (graph and eager runs keep whole passes). Each
 * element's value after a chunk is what the next reads back exactly (every
 * node is rounded to its type), so chunks give the bytes of one launch.
 * CUDA's bound (2^34) is tens of milliseconds of an H200's f32 math and
 * under about 0.3 s of its slowest f64 op (pow); the host's (2^22) is under
 * about 0.15 s of the host backend's slowest, f64 on one core. Reductions
 * run whole: their repeat is 1 and their order of additions is fixed.
 */
#define CHAIN_CHUNK_WORK_CUDA (1ull << 34)
#define CHAIN_CHUNK_WORK_HOST (1ull << 22)
/* Element ranges of a split repeat are multiples of this (16-byte aligned for every dtype). */
#define CHAIN_CHUNK_ELEMS_ALIGN 65536

enum chain_mode { CHAIN_FUSED, CHAIN_GRAPH, CHAIN_EAGER, CHAIN_MODES };

/* How a run is cut into chunks: chunk i is repeat block i / eblocks over element block i % eblocks. */
struct chain_chunks {
	uint64_t repeat;  /* repeats a chunk (the last repeat block may have fewer) */
	uint64_t elems;   /* elements a chunk (the last element block may have fewer) */
	uint64_t eblocks; /* element blocks a repeat block */
	uint64_t n;       /* chunks in all; 1: the run is one launch, as it always was */
};

/* Which fused kernel a run asks for: compiled when it can be had (auto), or one of them. */
enum chain_kernel { CHAIN_KERNEL_AUTO, CHAIN_KERNEL_COMPILED, CHAIN_KERNEL_INTERPRETED, CHAIN_KERNELS };
/* IEEE-accurate (every kernel), or CUDA's fast intrinsics (compiled kernels only). */
enum chain_math { CHAIN_MATH_IEEE, CHAIN_MATH_FAST, CHAIN_MATHS };

/* How a run found its plan. Eager runs use none. */
enum chain_cache_outcome { CHAIN_CACHE_NONE, CHAIN_CACHE_HIT, CHAIN_CACHE_UPDATE, CHAIN_CACHE_MISS };

/*
 * Where a run's compiled kernel came from: its cached plan held it, the
 * device's kernel cache in memory, the disk cache, or NVRTC just now.
 */
enum chain_source { CHAIN_SOURCE_NONE, CHAIN_SOURCE_PLAN, CHAIN_SOURCE_MEMORY, CHAIN_SOURCE_DISK,
		    CHAIN_SOURCE_NVRTC };

/* How a plan's fused kernel was made; the plan keeps it, a run reports it. */
struct chain_kernel_info {
	bool compiled;          /* the program's own kernel (else the interpreting one) */
	enum chain_math math;   /* what the kernel computes with */
	enum chain_source source;
	double compile_s;       /* compiling, or reading and loading, or finding it */
	char arch[24];          /* what it was compiled for: "sm_90" */
	char note[320];         /* why a compiled kernel was wanted and not had; "" */
	bool host_evaluated;    /* the host backend ran the program on its CPU, not this kernel */
};

struct chain_result {
	enum chain_cache_outcome cache;
	bool instantiated;  /* a plan was built (a miss, or an update that could not be applied) */
	uint64_t kernels;   /* kernels one replay runs */
	double prepare_s;   /* host time to find, build or retarget the plan */
	double device_s;    /* median over the replays of one replay's time on the device */
	double device_min_s;
	struct chain_kernel_info kernel; /* fused runs */
	struct kernels_partial value;    /* a reduction's result, before finishing (chain_reduce_finish) */
};

struct chain_spec {
	/* Inputs: the main thread's until submission. */
	chain_prog prog;       /* what runs (chain_spec_set_program, chain_spec_from_ops) */
	enum chain_mode mode;
	enum chain_kernel kernel;
	enum chain_math math;
	uint64_t repeat;       /* the statements (the whole list) this many times */
	uint64_t count;        /* elements */
	void *var[KERNELS_EXPR_MAX_VARS];   /* the program's buffers */
	void *store[KERNELS_EXPR_MAX_VARS]; /* where each is written: var[k], or the op list's out */
	/* The op-list form, when the program is one (graph and eager need it). */
	bool has_ops;
	enum gpuq_dtype dtype; /* f16, bf16, f32 or f64 */
	unsigned nops;         /* 1..KERNELS_CHAIN_MAX_OPS */
	struct kernels_chain_op ops[KERNELS_CHAIN_MAX_OPS];
	const void *in;
	void *out;             /* == in for in place */
	unsigned reps;   /* replays, each timed (the benchmark); 0 means 1 */
	const atomic_bool *cancel; /* set by chain_run: runs stop at a chunk (eager: a pass) boundary */
	/* Output: the worker's until completion. */
	struct chain_result result;
};

/* Counters the stats op shows, per device (X-macro: one list feeds both sides). */
#define CHAIN_COUNTERS(X)                                                      \
	X(runs)                                                                \
	X(kernels)                                                             \
	X(graph_hits)                                                          \
	X(graph_misses)                                                        \
	X(graph_updates)                                                       \
	X(graph_instantiations)                                                \
	X(graph_evictions)                                                     \
	X(graph_entries)                                                       \
	X(kernel_compiles)                                                     \
	X(kernel_disk_hits)                                                    \
	X(kernel_memory_hits)                                                  \
	X(kernel_disk_rejects)                                                 \
	X(kernel_fallbacks)                                                    \
	X(kernel_entries)

enum chain_counter {
#define CHAIN_COUNTER_ENUM(name) CHAIN_COUNTER_##name,
	CHAIN_COUNTERS(CHAIN_COUNTER_ENUM)
#undef CHAIN_COUNTER_ENUM
	CHAIN_COUNTER_COUNT
};
_Static_assert(CHAIN_COUNTER_COUNT <= DEVICE_CHAIN_COUNTERS,
	       "struct device must have room for every chain counter");

/* Names and argument counts of the ops (kernels/kernels.h's list). */
const char *chain_op_name(unsigned kind);
int chain_op_nargs(unsigned kind);
/* The kind called name, or -1. */
int chain_op_find(const char *name, size_t len);
/* "sin cos tan ..." for error messages. Static storage. */
const char *chain_op_list(void);

const char *chain_mode_name(enum chain_mode mode);
/* 0 and *out when name is a mode, else -1. */
int chain_mode_find(const char *name, enum chain_mode *out);
const char *chain_cache_outcome_name(enum chain_cache_outcome c);
const char *chain_kernel_name(enum chain_kernel k);
int chain_kernel_find(const char *name, enum chain_kernel *out);
const char *chain_math_name(enum chain_math m);
int chain_math_find(const char *name, enum chain_math *out);
const char *chain_source_name(enum chain_source s);

/* Whether chains run on elements of dtype. */
bool chain_dtype_supported(enum gpuq_dtype dtype);

/*
 * Sets spec's program (prog: bound, and checked by chain_prog_check) and
 * its buffers (each written where it is read), and the op-list form when
 * the program is one. count, repeat, mode, kernel and math are the
 * caller's to set.
 */
void chain_spec_set_program(struct chain_spec *spec, const chain_prog *prog, void *const *var);
/* Sets spec's program from an op list on buffer in of dtype, into out (== in: in place). */
void chain_spec_from_ops(struct chain_spec *spec, const struct kernels_chain_op *ops,
			 unsigned nops, enum gpuq_dtype dtype, const void *in, void *out);
/* Whether spec is a reduction. */
bool chain_spec_is_reduce(const struct chain_spec *spec);

/* Kernels one replay of spec runs: ops x repeat, or 1 fused (2 for a reduction). */
uint64_t chain_kernels(const struct chain_spec *spec);
/*
 * Bytes one replay reads and writes: 2 x count x size per kernel of the
 * op-list modes; fused, each loaded buffer read and each stored one written.
 */
uint64_t chain_bytes(const struct chain_spec *spec);
/* A reduction's number from its partial: the sum, mean, norm, ... as a double. */
double chain_reduce_finish(unsigned kind, const struct kernels_partial *p, uint64_t count);

/* How spec is cut into chunks of at most work element-ops (CHAIN_CHUNK_WORK_*). */
void chain_chunks_plan(const struct chain_spec *spec, uint64_t work, struct chain_chunks *k);
/*
 * Chunk i of a chunked spec (k->n > 1), into out: its repeats over its
 * elements, every buffer in place (the caller first copies an op list's
 * input to its out, so that every chunk reads where it writes), broadcast
 * operands as they are. Chunk 0 of a run with one element block is what a
 * chunked plan captures.
 */
void chain_chunk_spec(const struct chain_spec *spec, const struct chain_chunks *k, uint64_t i,
		      struct chain_spec *out);
/* Whether the chunked spec must first copy its input to its output (an op list out of place). */
bool chain_chunks_copy_first(const struct chain_spec *spec);
/* Fails err with `cancelled`, saying how far the run got: done of k->n chunks. */
int chain_chunks_cancelled(struct gpuq_error *err, const struct chain_spec *spec,
			   const struct chain_chunks *k, uint64_t done);

/* Any thread: the device's counters, and adding to one (the worker). */
uint64_t chain_counter_get(const struct device *dev, enum chain_counter c);
void chain_counter_add(struct device *dev, enum chain_counter c, uint64_t n);

/*
 * What a backend supplies to the cache. build makes a plan for spec; retarget
 * points a plan at spec's buffers (everything else equal) and returns 0, 1
 * when the plan cannot be retargeted (the cache then builds a new one), or
 * -1 with err; destroy releases a plan; kernel_info says how the plan's
 * fused kernel was made. load and unload put a compiled kernel's image on
 * the device and take it off (NULL: the backend runs none, as the host).
 * All on the worker thread.
 */
struct chain_plan_ops {
	int (*build)(struct device *dev, const struct chain_spec *spec, void **plan,
		     struct gpuq_error *err);
	int (*retarget)(struct device *dev, void *plan, const struct chain_spec *spec,
			struct gpuq_error *err);
	void (*destroy)(struct device *dev, void *plan);
	const struct chain_kernel_info *(*kernel_info)(const void *plan);
	int (*load)(struct device *dev, const void *image, size_t size, void **loaded,
		    struct gpuq_error *err);
	void (*unload)(struct device *dev, void *loaded);
};

struct chain_state;

/*
 * The device's chain state, made on first use with the backend's plan ops
 * and its private part (impl, freed by the caller of chain_state_close).
 * NULL with err when out of memory.
 */
struct chain_state *chain_state_get(struct device *dev, const struct chain_plan_ops *ops,
				    struct gpuq_error *err);
void *chain_state_impl(const struct chain_state *cs);
void chain_state_set_impl(struct chain_state *cs, void *impl);
/* The device's kernel cache (workers/chain/chain_jit.h), made with the state. */
struct chain_jit *chain_state_jit(const struct chain_state *cs);

struct chain_jit_entry;
/*
 * A plan's fused kernel, for spec (fused mode): the compiled one from the
 * kernel cache (*entry, which the plan holds until chain_kernel_release),
 * or none (*entry NULL: the interpreting kernel runs, info->note says why
 * when a compiled one was wanted). Fails only when spec asked for kernel
 * compiled and it cannot be had, or on a device error.
 */
int chain_kernel_resolve(struct device *dev, const struct chain_spec *spec,
			 struct chain_jit_entry **entry, struct chain_kernel_info *info,
			 struct gpuq_error *err);
void chain_kernel_release(struct device *dev, struct chain_jit_entry *entry);
struct chain_jit_costs;
/* The benchmark's compile costs of prog's kernel (workers/chain/chain_jit.h: chain_jit_measure). */
int chain_kernel_costs(struct device *dev, const chain_prog *prog, struct chain_jit_costs *out,
		       struct gpuq_error *err);
/* Destroys every cached plan and the state; returns impl for the backend to free. */
void *chain_state_close(struct device *dev);

/*
 * The plan for spec: a cached one (a hit), a retargeted one (an update) or a
 * new one (a miss), evicting the least recently used plan when the cache is
 * full. Fills spec->result.cache, .instantiated and .prepare_s, and counts.
 */
int chain_cache_get(struct device *dev, struct chain_state *cs, struct chain_spec *spec,
		    void **plan, struct gpuq_error *err);

/*
 * Worker thread: checks spec, runs it on the device's backend (a run stops
 * at its next chunk boundary once *cancel is set, an eager one at its next
 * pass: `cancelled`) and counts it.
 */
int chain_execute(struct device *dev, struct chain_spec *spec, const atomic_bool *cancel,
		  struct gpuq_error *err);
/* Worker thread: runs a WORK_CHAIN (a row of workers/work_kinds.h); result.bytes is chain_bytes. */
int chain_run(struct device *dev, struct work *work);

/* Backends' implementations, referenced from their tables. */
int chain_cuda_run(struct device *dev, struct chain_spec *spec, struct gpuq_error *err);
/* The fused kernel of spec on the current lane, not waited for (backend.h's chain_enqueue). */
int chain_cuda_enqueue(struct device *dev, const struct chain_spec *spec, struct gpuq_error *err);
int chain_cuda_copy_time(struct device *dev, void *dst, const void *src, uint64_t bytes,
			 unsigned reps, double *seconds, struct gpuq_error *err);
int chain_cuda_read_time(struct device *dev, const void *src, uint64_t bytes, unsigned reps,
			 double *seconds, struct gpuq_error *err);
void chain_cuda_close(struct device *dev);
int chain_host_run(struct device *dev, struct chain_spec *spec, struct gpuq_error *err);
int chain_host_enqueue(struct device *dev, const struct chain_spec *spec, struct gpuq_error *err);
int chain_host_copy_time(struct device *dev, void *dst, const void *src, uint64_t bytes,
			 unsigned reps, double *seconds, struct gpuq_error *err);
int chain_host_read_time(struct device *dev, const void *src, uint64_t bytes, unsigned reps,
			 double *seconds, struct gpuq_error *err);
void chain_host_close(struct device *dev);

/* The median of n (> 0) values, sorting them in place. */
double chain_median(double *v, unsigned n);

#endif
