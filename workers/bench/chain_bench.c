/*
 * The chain benchmark (workers/bench/chain_bench.h says what it measures). Worker
 * thread only. Written against the backend table, so the host backend runs
 * it too (CI checks its plumbing; its numbers say nothing about GPUs).
 *
 * The buffers are the benchmark's own: allocated from the device, filled
 * with random values in [0, 1) on the device, freed at the end whatever
 * happened. Every measured chain reads one buffer and writes another, so
 * each replay sees the same input; y = a * x + y updates y in place, by at
 * most a / 2 per replay, so its values stay small and finite.
 */
#include "workers/bench/chain_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/chain/chain.h"
#include "workers/chain/chain_expr.h"

/* sin | add 1 | sqrt | mul 2 | sub 3: defined for every input, so no replay computes NaN. */
static const struct kernels_chain_op bench_chain[CHAIN_BENCH_OPS] = {
	{ KERNELS_CHAIN_SIN, 0, 0 },  { KERNELS_CHAIN_ADD, 1, 0 }, { KERNELS_CHAIN_SQRT, 0, 0 },
	{ KERNELS_CHAIN_MUL, 2, 0 },  { KERNELS_CHAIN_SUB, 3, 0 },
};

static const unsigned launch_lengths[CHAIN_BENCH_LAUNCH_CHAINS] = { 1, 5, 20 };

const char *chain_bench_op_name(unsigned i)
{
	return i < CHAIN_BENCH_OPS ? chain_op_name(bench_chain[i].kind) : "?";
}

/* The device memory of one run: released by bench_release whatever happened. */
struct bench_buffers {
	void *small_in, *small_out; /* launch-bound and cache rounds */
	void *big_in, *big_out;     /* bandwidth-bound */
	void *a;                    /* y = a * x + y's one element (f32 0.5), in 16 bytes */
};

static int bench_alloc_filled(struct device *dev, uint64_t bytes, const struct fill_spec *fill,
			      void **ptr, struct gpuq_error *err)
{
	if (dev->ops->mem.alloc(dev, bytes, ptr, err) != 0)
		return -1;
	return fill ? dev->ops->mem.fill(dev, *ptr, bytes, fill, err) : 0;
}

static int bench_alloc(struct device *dev, const struct chain_bench *b, struct bench_buffers *m,
		       struct gpuq_error *err)
{
	struct fill_spec random = { .pattern = FILL_RANDOM, .dtype = GPUQ_DTYPE_F32, .seed = 4 };
	struct fill_spec half = { .pattern = FILL_VALUE, .dtype = GPUQ_DTYPE_F32, .value_bits = 0x3f000000 };
	uint64_t small = b->launch_count * sizeof(float);
	if (bench_alloc_filled(dev, small, &random, &m->small_in, err) != 0 ||
	    bench_alloc_filled(dev, small, &random, &m->small_out, err) != 0 ||
	    bench_alloc_filled(dev, b->bytes, &random, &m->big_in, err) != 0 ||
	    bench_alloc_filled(dev, b->bytes, &random, &m->big_out, err) != 0 ||
	    bench_alloc_filled(dev, 16, &half, &m->a, err) != 0)
		return -1;
	return 0;
}

static void bench_release(struct device *dev, struct bench_buffers *m)
{
	void *all[] = { m->small_in, m->small_out, m->big_in, m->big_out, m->a };
	struct gpuq_error ignored;
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		if (all[i] && !dev->faulted)
			dev->ops->mem.release(dev, all[i], &ignored);
}

/* A chain of the first nops ops of the bandwidth chain, cycled. */
static void bench_spec(struct chain_spec *s, enum chain_mode mode, unsigned nops, uint64_t repeat,
		       uint64_t count, const void *in, void *out)
{
	struct kernels_chain_op ops[KERNELS_CHAIN_MAX_OPS];
	memset(s, 0, sizeof *s);
	for (unsigned i = 0; i < nops; i++)
		ops[i] = bench_chain[i % CHAIN_BENCH_OPS];
	chain_spec_from_ops(s, ops, nops, GPUQ_DTYPE_F32, in, out);
	s->mode = mode;
	s->repeat = repeat;
	s->count = count;
}

/* One op of the chain alone, eager. */
static void bench_op_spec(struct chain_spec *s, unsigned i, uint64_t count, const void *in, void *out)
{
	memset(s, 0, sizeof *s);
	chain_spec_from_ops(s, &bench_chain[i], 1, GPUQ_DTYPE_F32, in, out);
	s->mode = CHAIN_EAGER;
	s->repeat = 1;
	s->count = count;
}

/*
 * The program of text (a run, or a reduction) over f32 buffers: variable
 * `x` is x, `y` is y, `a` the one-element a, each of count elements but a.
 */
static int bench_expr_spec(struct device *dev, struct chain_spec *s, const char *text, bool reduce,
			   const struct bench_buffers *m, uint64_t count, struct gpuq_error *err)
{
	struct chain_expr x;
	struct chain_expr_error e;
	struct chain_expr_binding bind[KERNELS_EXPR_MAX_VARS];
	void *var[KERNELS_EXPR_MAX_VARS];
	uint64_t n;
	if (chain_expr_parse(text, reduce, &x, &e) < 0)
		goto bug;
	for (unsigned v = 0; v < x.nvars; v++) {
		const char *name = x.vars[v].name;
		var[v] = !strcmp(name, "a") ? m->a : !strcmp(name, "y") ? m->big_out : m->big_in;
		bind[v] = (struct chain_expr_binding){ GPUQ_DTYPE_F32, var[v] == m->a ? 1 : count,
						       dev->index, var[v] };
	}
	if (chain_expr_bind(&x, bind, &n, &e) < 0)
		goto bug;
	memset(s, 0, sizeof *s);
	chain_spec_set_program(s, &x.prog, var);
	s->mode = CHAIN_FUSED;
	s->repeat = 1;
	s->count = count;
	return 0;
bug:
	return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] bench_chain: '%s': column %u: %s",
			 dev->index, text, e.col, e.msg);
}

/* One unmeasured replay (which builds the plan), then reps timed: *seconds is their median. */
static int bench_time(struct device *dev, struct chain_spec *s, unsigned reps, double *seconds,
		      struct gpuq_error *err)
{
	s->reps = 1;
	if (chain_execute(dev, s, NULL, err) != 0)
		return -1;
	s->reps = reps;
	if (chain_execute(dev, s, NULL, err) != 0)
		return -1;
	*seconds = s->result.device_s;
	return 0;
}

static int bench_launch(struct device *dev, struct chain_bench *b, const struct bench_buffers *m,
			struct gpuq_error *err)
{
	struct chain_spec s;
	for (unsigned i = 0; i < CHAIN_BENCH_LAUNCH_CHAINS; i++) {
		struct chain_bench_launch *l = &b->launch[i];
		l->nops = launch_lengths[i];
		bench_spec(&s, CHAIN_EAGER, l->nops, b->launch_repeat, b->launch_count, m->small_in,
			   m->small_out);
		l->kernels = chain_kernels(&s);
		if (bench_time(dev, &s, b->reps, &l->eager_s, err) != 0)
			return -1;
		s.mode = CHAIN_GRAPH;
		if (bench_time(dev, &s, b->reps, &l->graph_s, err) != 0)
			return -1;
	}
	return 0;
}

/* A compiled row: it must have run the compiled kernel, else the report says why not. */
static void bench_note_kernel(struct chain_bench *b, const struct chain_spec *s)
{
	if (s->result.kernel.compiled)
		return;
	b->compiled = false;
	if (!b->note[0])
		snprintf(b->note, sizeof b->note, "%s", s->result.kernel.note);
}

/* The 5-op chain fused: interpreted, then compiled, each output's checksum compared. */
static int bench_fused(struct device *dev, struct chain_bench *b, const struct bench_buffers *m,
		       struct gpuq_error *err)
{
	uint64_t count = b->bytes / sizeof(float), sums[2];
	const enum chain_kernel kernels[2] = { CHAIN_KERNEL_INTERPRETED, CHAIN_KERNEL_AUTO };
	double *out[2] = { &b->fused_s, &b->compiled_s };
	struct chain_spec s;
	for (unsigned k = 0; k < 2; k++) {
		bench_spec(&s, CHAIN_FUSED, CHAIN_BENCH_OPS, 1, count, m->big_in, m->big_out);
		s.kernel = kernels[k];
		if (bench_time(dev, &s, b->reps, out[k], err) != 0 ||
		    dev->ops->mem.checksum(dev, m->big_out, b->bytes, &sums[k], err) != 0)
			return -1;
	}
	bench_note_kernel(b, &s);
	b->compiled_same_bits = sums[0] == sums[1];
	return 0;
}

static int bench_bandwidth(struct device *dev, struct chain_bench *b, const struct bench_buffers *m,
			   struct gpuq_error *err)
{
	uint64_t count = b->bytes / sizeof(float);
	struct chain_spec s;
	double warm;
	if (dev->ops->chain.copy_time(dev, m->big_out, m->big_in, b->bytes, 1, &warm, err) != 0 ||
	    dev->ops->chain.copy_time(dev, m->big_out, m->big_in, b->bytes, b->reps, &b->copy_s,
				      err) != 0)
		return -1;
	for (unsigned i = 0; i < CHAIN_BENCH_OPS; i++) {
		bench_op_spec(&s, i, count, m->big_in, m->big_out);
		if (bench_time(dev, &s, b->reps, &b->op_s[i], err) != 0)
			return -1;
	}
	const enum chain_mode modes[] = { CHAIN_EAGER, CHAIN_GRAPH };
	double *out[] = { &b->eager_s, &b->graph_s };
	for (unsigned k = 0; k < 2; k++) {
		bench_spec(&s, modes[k], CHAIN_BENCH_OPS, 1, count, m->big_in, m->big_out);
		if (bench_time(dev, &s, b->reps, out[k], err) != 0)
			return -1;
	}
	return bench_fused(dev, b, m, err);
}

/* A reduction of x, compiled (auto) unless `kernel` says otherwise: its time and value. */
static int bench_reduce(struct device *dev, struct chain_bench *b, const struct bench_buffers *m,
			const char *text, enum chain_kernel kernel, double *seconds, double *value,
			struct kernels_partial *raw, struct gpuq_error *err)
{
	struct chain_spec s;
	uint64_t count = b->bytes / sizeof(float);
	if (bench_expr_spec(dev, &s, text, true, m, count, err) != 0)
		return -1;
	s.kernel = kernel;
	if (bench_time(dev, &s, b->reps, seconds, err) != 0)
		return -1;
	if (kernel == CHAIN_KERNEL_AUTO)
		bench_note_kernel(b, &s);
	*raw = s.result.value;
	*value = chain_reduce_finish(s.prog.reduce, &s.result.value, count);
	return 0;
}

/* y = a * x + y; sum(x) and norm2(x) beside the read kernel; the compiled sum's bits. */
static int bench_expressions(struct device *dev, struct chain_bench *b,
			     const struct bench_buffers *m, struct gpuq_error *err)
{
	struct chain_spec s;
	struct kernels_partial sum, interp;
	double warm, value;
	if (bench_expr_spec(dev, &s, "y = a * x + y", false, m, b->bytes / sizeof(float), err) != 0 ||
	    bench_time(dev, &s, b->reps, &b->axpy_s, err) != 0)
		return -1;
	bench_note_kernel(b, &s);
	if (dev->ops->chain.read_time(dev, m->big_in, b->bytes, 1, &warm, err) != 0 ||
	    dev->ops->chain.read_time(dev, m->big_in, b->bytes, b->reps, &b->read_s, err) != 0 ||
	    bench_reduce(dev, b, m, "sum(x)", CHAIN_KERNEL_AUTO, &b->sum_s, &b->sum, &sum, err) != 0 ||
	    bench_reduce(dev, b, m, "norm2(x)", CHAIN_KERNEL_AUTO, &b->norm2_s, &b->norm2, &interp,
			 err) != 0 ||
	    bench_reduce(dev, b, m, "sum(x)", CHAIN_KERNEL_INTERPRETED, &warm, &value, &interp, err) != 0)
		return -1;
	b->sum_same_bits = memcmp(&sum.v, &interp.v, sizeof sum.v) == 0;
	return 0;
}

/* The 5-op chain's kernel: compiled, from disk, from memory (when kernels compile here at all). */
static int bench_compile(struct device *dev, struct chain_bench *b, const struct bench_buffers *m,
			 struct gpuq_error *err)
{
	struct chain_spec s;
	if (!b->compiled)
		return 0;
	bench_spec(&s, CHAIN_FUSED, CHAIN_BENCH_OPS, 1, b->launch_count, m->small_in, m->small_out);
	int rc = chain_kernel_costs(dev, &s.prog, &b->compile, err);
	if (rc == 1 && !b->note[0])
		snprintf(b->note, sizeof b->note, "%s", b->compile.note);
	return rc < 0 ? -1 : 0;
}

/*
 * Rounds of: a chain never seen (its last constant differs each round): a
 * miss that builds a plan; the same chain on swapped buffers: an update;
 * again: a hit. Prepare times only; the replays are not timed.
 */
static int bench_cache_mode(struct device *dev, enum chain_mode mode, const struct chain_bench *b,
			    const struct bench_buffers *m, struct chain_bench_cache *out,
			    struct gpuq_error *err)
{
	double t[3][CHAIN_BENCH_CACHE_ROUNDS];
	struct chain_spec s;
	struct kernels_chain_op ops[CHAIN_BENCH_OPS];
	memcpy(ops, bench_chain, sizeof ops);
	for (unsigned r = 0; r < CHAIN_BENCH_CACHE_ROUNDS; r++) {
		ops[CHAIN_BENCH_OPS - 1].a = 3 + (r + 1) / 1024.0;
		for (unsigned step = 0; step < 3; step++) {
			bool swap = step > 0;
			memset(&s, 0, sizeof s);
			chain_spec_from_ops(&s, ops, CHAIN_BENCH_OPS, GPUQ_DTYPE_F32,
					    swap ? m->small_out : m->small_in,
					    swap ? m->small_in : m->small_out);
			s.mode = mode;
			s.repeat = 1;
			s.count = b->launch_count;
			if (chain_execute(dev, &s, NULL, err) != 0)
				return -1;
			t[step][r] = s.result.prepare_s;
		}
	}
	out->instantiate_s = chain_median(t[0], CHAIN_BENCH_CACHE_ROUNDS);
	out->update_s = chain_median(t[1], CHAIN_BENCH_CACHE_ROUNDS);
	out->hit_s = chain_median(t[2], CHAIN_BENCH_CACHE_ROUNDS);
	return 0;
}

/* A chain run twice: the second run must not build a plan. */
static int bench_rerun(struct device *dev, struct chain_bench *b, const struct bench_buffers *m,
		       struct gpuq_error *err)
{
	struct chain_spec s;
	bench_spec(&s, CHAIN_GRAPH, CHAIN_BENCH_OPS, 2, b->launch_count, m->small_in, m->small_out);
	if (chain_execute(dev, &s, NULL, err) != 0)
		return -1;
	uint64_t before = chain_counter_get(dev, CHAIN_COUNTER_graph_instantiations);
	if (chain_execute(dev, &s, NULL, err) != 0)
		return -1;
	b->cached_rerun_instantiations =
		chain_counter_get(dev, CHAIN_COUNTER_graph_instantiations) - before;
	return 0;
}

static int bench_all(struct device *dev, struct chain_bench *b, const struct bench_buffers *m,
		     struct gpuq_error *err)
{
	b->compiled = true;
	if (bench_launch(dev, b, m, err) != 0 || bench_bandwidth(dev, b, m, err) != 0 ||
	    bench_expressions(dev, b, m, err) != 0 || bench_compile(dev, b, m, err) != 0 ||
	    bench_cache_mode(dev, CHAIN_GRAPH, b, m, &b->cache[0], err) != 0 ||
	    bench_cache_mode(dev, CHAIN_FUSED, b, m, &b->cache[1], err) != 0)
		return -1;
	return bench_rerun(dev, b, m, err);
}

int chain_bench_run(struct device *dev, struct work *work)
{
	struct chain_bench *b = work->spec;
	struct bench_buffers m = { NULL, NULL, NULL, NULL, NULL };
	if (!b || b->reps < 1 || b->reps > CHAIN_MAX_REPS || b->bytes < 16 || b->bytes % 16 ||
	    b->launch_count < 1 || b->launch_repeat < 1 || !dev->ops->chain.copy_time ||
	    !dev->ops->chain.read_time)
		return gpuq_fail(&work->error, GPUQ_E_INTERNAL,
				 "[gpu %d] bench_chain: inconsistent parameters or backend: a bug in gpuqd",
				 dev->index);
	int rc = bench_alloc(dev, b, &m, &work->error);
	if (rc == 0)
		rc = bench_all(dev, b, &m, &work->error);
	bench_release(dev, &m);
	work->result.bytes = b->bytes;
	return rc;
}
