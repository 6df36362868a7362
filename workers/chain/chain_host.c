/*
 * Kernel chains on the host backend: the reference for every op, dtype,
 * program and reduction, computed with workers/chain/chain_eval.h's arithmetic
 * (which follows the kernels'). Worker thread only (backend.h).
 *
 * The modes run as their CUDA counterparts are shaped: eager and graph one
 * pass over the buffer per op, fused one pass applying the whole program
 * (a reduction folding in the kernels' order). The plan cache is the same
 * as on CUDA; a plan holds no graph, only the compiled kernel it got from
 * the device's kernel cache: the host backend compiles every fused program
 * with NVRTC (for sm_90) when it can, and keeps it in memory and on disk as
 * the CUDA backend does, but evaluates the program itself (it has no GPU to
 * load the kernel on). So CI tests the cache's hits, updates, misses and
 * evictions, and the compile, disk and memory paths of the kernels, up to
 * the load. Runs of more than CHAIN_CHUNK_WORK_HOST run in chunks as on
 * CUDA (workers/chain/chain.h), the cancel flag looked at between them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/backend/backend_host.h"
#include "workers/chain/chain.h"
#include "workers/chain/chain_eval.h"
#include "workers/clock.h"

/* One op on one value of dtype t, rounded to t. */
static double host_apply(enum gpuq_dtype t, const struct kernels_chain_op *op, double x)
{
	return chain_eval_op((unsigned)t, op->kind, x, op->a, op->b);
}

/*
 * Eager and graph: a pass over the buffer per op, the first from in. A
 * cancel stops eager runs between passes, graph runs between chunks (every
 * k->repeat passes). Returns the passes run when stopped, else repeat.
 */
static uint64_t host_passes(const struct chain_spec *spec, const struct chain_chunks *k)
{
	for (uint64_t p = 0; p < spec->repeat; p++) {
		bool boundary = spec->mode == CHAIN_EAGER || p % k->repeat == 0;
		if (p > 0 && boundary && spec->cancel && atomic_load(spec->cancel))
			return p;
		for (unsigned i = 0; i < spec->nops; i++) {
			const void *src = p == 0 && i == 0 ? spec->in : spec->out;
			for (uint64_t j = 0; j < spec->count; j++)
				chain_eval_store(spec->dtype, spec->out, j,
						 host_apply(spec->dtype, &spec->ops[i],
							    chain_eval_load(spec->dtype, src, j)));
		}
	}
	return spec->repeat;
}

/* Fused: the whole program on each element in turn, or its reduction. */
static void host_fused(struct chain_spec *spec)
{
	struct kernels_expr e;
	memset(&e, 0, sizeof e);
	memcpy(e.var, spec->var, sizeof e.var);
	memcpy(e.store, spec->store, sizeof e.store);
	e.count = spec->count;
	e.repeat = spec->repeat;
	e.prog = spec->prog;
	if (chain_spec_is_reduce(spec))
		spec->result.value = chain_eval_reduce(&e);
	else
		chain_eval_run(&e);
}

/* A host plan: the compiled kernel it holds (or none), and how it was had. */
struct host_plan {
	struct chain_jit_entry *kernel;
	struct chain_kernel_info info;
};

static int host_plan_build(struct device *dev, const struct chain_spec *spec, void **plan,
			   struct gpuq_error *err)
{
	struct host_plan *p = calloc(1, sizeof *p);
	if (!p)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: no memory for a chain plan", dev->index);
	if (chain_kernel_resolve(dev, spec, &p->kernel, &p->info, err) != 0) {
		free(p);
		return -1;
	}
	p->info.host_evaluated = true; /* the kernel is cached, never loaded: the reply says so */
	if (p->info.math == CHAIN_MATH_FAST) { /* compiled (and cached) as asked, but never run here */
		p->info.math = CHAIN_MATH_IEEE;
		snprintf(p->info.note, sizeof p->info.note,
			 "the host backend computes IEEE; math fast applies on GPUs");
	}
	*plan = p;
	return 0;
}

static int host_plan_retarget(struct device *dev, void *plan, const struct chain_spec *spec,
			      struct gpuq_error *err)
{
	(void)dev;
	(void)plan;
	(void)spec;
	(void)err;
	return 0;
}

static void host_plan_destroy(struct device *dev, void *plan)
{
	struct host_plan *p = plan;
	if (!p)
		return;
	chain_kernel_release(dev, p->kernel);
	free(p);
}

static const struct chain_kernel_info *host_plan_kernel(const void *plan)
{
	return &((const struct host_plan *)plan)->info;
}

static const struct chain_plan_ops host_plan_ops = {
	.build = host_plan_build,
	.retarget = host_plan_retarget,
	.destroy = host_plan_destroy,
	.kernel_info = host_plan_kernel,
};

/*
 * Fused, in chunks: the input copied to the output first when out of
 * place, then each chunk in place, a cancel looked at between them.
 * Returns the chunks run when stopped, else k->n.
 */
static uint64_t host_fused_chunks(const struct chain_spec *spec, const struct chain_chunks *k)
{
	struct chain_spec c;
	if (chain_chunks_copy_first(spec))
		memmove(spec->out, spec->in, spec->count * gpuq_dtype_size(spec->dtype));
	for (uint64_t i = 0; i < k->n; i++) {
		if (i > 0 && spec->cancel && atomic_load(spec->cancel))
			return i;
		chain_chunk_spec(spec, k, i, &c);
		host_fused(&c);
	}
	return k->n;
}

/* One run's replays, as the compute engine runs them (the device's "kernels"). */
struct host_replays {
	struct chain_spec *spec;
	struct chain_chunks chunks;
	unsigned n;
	double t[CHAIN_MAX_REPS];
	bool stopped;
	uint64_t done; /* chunks (eager: passes) run when stopped */
	/* the baseline copy's */
	void *dst;
	const void *src;
	uint64_t bytes;
};

static void host_chain_replays(void *arg)
{
	struct host_replays *r = arg;
	const struct chain_chunks *k = &r->chunks;
	for (unsigned i = 0; i < r->n && !r->stopped; i++) {
		double start = monotonic_seconds();
		if (r->spec->mode == CHAIN_FUSED && k->n == 1) {
			host_fused(r->spec);
		} else if (r->spec->mode == CHAIN_FUSED) {
			r->done = host_fused_chunks(r->spec, k);
			r->stopped = r->done < k->n;
		} else {
			r->done = host_passes(r->spec, k);
			r->stopped = r->done < r->spec->repeat;
			if (r->spec->mode == CHAIN_GRAPH)
				r->done /= k->repeat;
		}
		r->t[i] = monotonic_seconds() - start;
	}
}

int chain_host_run(struct device *dev, struct chain_spec *spec, struct gpuq_error *err)
{
	struct chain_state *cs = chain_state_get(dev, &host_plan_ops, err);
	struct host_replays r = { .spec = spec, .n = spec->reps ? spec->reps : 1 };
	void *plan;
	if (!cs)
		return -1;
	chain_chunks_plan(spec, CHAIN_CHUNK_WORK_HOST, &r.chunks);
	spec->result.cache = CHAIN_CACHE_NONE;
	if (spec->mode != CHAIN_EAGER && chain_cache_get(dev, cs, spec, &plan, err) != 0)
		return -1;
	if (host_backend_compute(dev, host_chain_replays, &r, err) != 0)
		return -1;
	if (r.stopped && spec->mode == CHAIN_EAGER)
		return gpuq_fail(err, GPUQ_E_CANCELLED,
				 "run cancelled after %llu of %llu passes: the eager passes stopped at a "
				 "pass boundary; the buffer it writes holds the passes that ran",
				 (unsigned long long)r.done, (unsigned long long)spec->repeat);
	if (r.stopped)
		return chain_chunks_cancelled(err, spec, &r.chunks, r.done);
	spec->result.kernels = chain_kernels(spec);
	spec->result.kernel.host_evaluated = true; /* every mode: no graph, no kernel ran */
	spec->result.device_s = chain_median(r.t, r.n);
	spec->result.device_min_s = r.t[0];
	return 0;
}

static void host_fused_op(struct host_op *op)
{
	host_fused(op->arg);
}

int chain_host_enqueue(struct device *dev, const struct chain_spec *spec, struct gpuq_error *err)
{
	struct host_op op = { .arg = (void *)spec };
	return host_backend_enqueue(dev, HOST_ENGINE_COMPUTE, host_fused_op, &op, err);
}

static void host_copy_replays(void *arg)
{
	struct host_replays *r = arg;
	for (unsigned i = 0; i < r->n; i++) {
		double start = monotonic_seconds();
		memcpy(r->dst, r->src, r->bytes);
		r->t[i] = monotonic_seconds() - start;
	}
}

int chain_host_copy_time(struct device *dev, void *dst, const void *src, uint64_t bytes,
			 unsigned reps, double *seconds, struct gpuq_error *err)
{
	struct host_replays r = { .n = reps, .dst = dst, .src = src, .bytes = bytes };
	if (reps < 1 || reps > CHAIN_MAX_REPS)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "host device %d: copy timing: %u reps (1..%d)",
				 dev->index, reps, CHAIN_MAX_REPS);
	if (host_backend_compute(dev, host_copy_replays, &r, err) != 0)
		return -1;
	*seconds = chain_median(r.t, reps);
	return 0;
}

int chain_host_read_time(struct device *dev, const void *src, uint64_t bytes, unsigned reps,
			 double *seconds, struct gpuq_error *err)
{
	double t[CHAIN_MAX_REPS];
	volatile uint64_t sink = 0;
	if (reps < 1 || reps > CHAIN_MAX_REPS)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "host device %d: read timing: %u reps (1..%d)",
				 dev->index, reps, CHAIN_MAX_REPS);
	for (unsigned r = 0; r < reps; r++) {
		double start = monotonic_seconds();
		uint64_t x = 0, w;
		for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
			memcpy(&w, (const char *)src + i, 8);
			x ^= w;
		}
		sink = x;
		t[r] = monotonic_seconds() - start;
	}
	(void)sink;
	*seconds = chain_median(t, reps);
	return 0;
}

void chain_host_close(struct device *dev)
{
	chain_state_close(dev);
}
