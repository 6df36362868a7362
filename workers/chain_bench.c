/*
 * The chain benchmark (workers/chain_bench.h says what it measures). Worker
 * thread only. Written against the backend table, so the host backend runs
 * it too (CI checks its plumbing; its numbers say nothing about GPUs).
 *
 * The buffers are the benchmark's own: allocated from the device, filled
 * with random values in [0, 1) on the device, freed at the end whatever
 * happened. Every measured chain reads one buffer and writes another, so
 * each replay sees the same input.
 */
#include "workers/chain_bench.h"

#include <stdlib.h>
#include <string.h>

#include "workers/chain.h"

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
};

static int bench_alloc_filled(struct device *dev, uint64_t bytes, bool fill, void **ptr,
			      struct gpuq_error *err)
{
	struct fill_spec random = { .pattern = FILL_RANDOM, .dtype = GPUQ_DTYPE_F32, .seed = 4 };
	if (dev->ops->alloc(dev, bytes, ptr, err) != 0)
		return -1;
	return fill ? dev->ops->fill(dev, *ptr, bytes, &random, err) : 0;
}

static int bench_alloc(struct device *dev, const struct chain_bench *b, struct bench_buffers *m,
		       struct gpuq_error *err)
{
	uint64_t small = b->launch_count * sizeof(float);
	if (bench_alloc_filled(dev, small, true, &m->small_in, err) != 0 ||
	    bench_alloc_filled(dev, small, true, &m->small_out, err) != 0 ||
	    bench_alloc_filled(dev, b->bytes, true, &m->big_in, err) != 0 ||
	    bench_alloc_filled(dev, b->bytes, false, &m->big_out, err) != 0)
		return -1;
	return 0;
}

static void bench_release(struct device *dev, struct bench_buffers *m)
{
	void *all[] = { m->small_in, m->small_out, m->big_in, m->big_out };
	struct gpuq_error ignored;
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		if (all[i] && !dev->faulted)
			dev->ops->release(dev, all[i], &ignored);
}

/* A chain of the first nops ops of the bandwidth chain, cycled. */
static void bench_spec(struct chain_spec *s, enum chain_mode mode, unsigned nops, uint64_t repeat,
		       uint64_t count, const void *in, void *out)
{
	memset(s, 0, sizeof *s);
	s->dtype = GPUQ_DTYPE_F32;
	s->mode = mode;
	s->nops = nops;
	for (unsigned i = 0; i < nops; i++)
		s->ops[i] = bench_chain[i % CHAIN_BENCH_OPS];
	s->repeat = repeat;
	s->count = count;
	s->in = in;
	s->out = out;
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

static int bench_bandwidth(struct device *dev, struct chain_bench *b, const struct bench_buffers *m,
			   struct gpuq_error *err)
{
	uint64_t count = b->bytes / sizeof(float);
	struct chain_spec s;
	double warm;
	if (dev->ops->chain_copy_time(dev, m->big_out, m->big_in, b->bytes, 1, &warm, err) != 0 ||
	    dev->ops->chain_copy_time(dev, m->big_out, m->big_in, b->bytes, b->reps, &b->copy_s,
				      err) != 0)
		return -1;
	for (unsigned i = 0; i < CHAIN_BENCH_OPS; i++) {
		bench_spec(&s, CHAIN_EAGER, 1, 1, count, m->big_in, m->big_out);
		s.ops[0] = bench_chain[i];
		if (bench_time(dev, &s, b->reps, &b->op_s[i], err) != 0)
			return -1;
	}
	const enum chain_mode modes[] = { CHAIN_EAGER, CHAIN_GRAPH, CHAIN_FUSED };
	double *out[] = { &b->eager_s, &b->graph_s, &b->fused_s };
	for (unsigned k = 0; k < 3; k++) {
		bench_spec(&s, modes[k], CHAIN_BENCH_OPS, 1, count, m->big_in, m->big_out);
		if (bench_time(dev, &s, b->reps, out[k], err) != 0)
			return -1;
	}
	return 0;
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
	for (unsigned r = 0; r < CHAIN_BENCH_CACHE_ROUNDS; r++) {
		bench_spec(&s, mode, CHAIN_BENCH_OPS, 1, b->launch_count, m->small_in, m->small_out);
		s.ops[CHAIN_BENCH_OPS - 1].a = 3 + (r + 1) / 1024.0;
		for (unsigned step = 0; step < 3; step++) {
			if (step == 1) {
				s.in = m->small_out;
				s.out = m->small_in;
			}
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
	if (bench_launch(dev, b, m, err) != 0 || bench_bandwidth(dev, b, m, err) != 0 ||
	    bench_cache_mode(dev, CHAIN_GRAPH, b, m, &b->cache[0], err) != 0 ||
	    bench_cache_mode(dev, CHAIN_FUSED, b, m, &b->cache[1], err) != 0)
		return -1;
	return bench_rerun(dev, b, m, err);
}

int chain_bench_run(struct device *dev, struct work *work)
{
	struct chain_bench *b = work->spec;
	struct bench_buffers m = { NULL, NULL, NULL, NULL };
	if (!b || b->reps < 1 || b->reps > CHAIN_MAX_REPS || b->bytes < 16 || b->bytes % 16 ||
	    b->launch_count < 1 || b->launch_repeat < 1 || !dev->ops->chain_copy_time)
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
