/*
 * The scheduler benchmark's ceiling (see sched_bench.h). Written against the
 * backend table, so the host backend runs it too (its engine threads stand
 * in for the GPU's; CI checks the plumbing, not the numbers).
 *
 * Three lanes of the benchmark's own carry the three parts; each part is
 * timed between events on its lane. "Together" enqueues the three at once
 * and runs from the earliest start to the latest end. The copies use
 * portable pinned host memory, the fastest a copy from the host can be; the
 * kernel is the chain benchmark's bandwidth-bound chain, fused.
 */
#include "workers/bench/sched_bench.h"

#include <stdlib.h>
#include <string.h>

#include "workers/chain/chain.h"
#include "workers/sched/sched_wait.h"

/* The same chain as `gpuq bench chain`'s bandwidth rows: sin | add 1 | sqrt | mul 2 | sub 3. */
static const struct kernels_chain_op ceiling_chain[] = {
	{ KERNELS_CHAIN_SIN, 0, 0 }, { KERNELS_CHAIN_ADD, 1, 0 }, { KERNELS_CHAIN_SQRT, 0, 0 },
	{ KERNELS_CHAIN_MUL, 2, 0 }, { KERNELS_CHAIN_SUB, 3, 0 },
};

/* The run's memory, lanes and events: released by ceiling_release whatever happened. */
struct ceiling {
	struct device *dev;
	struct sched_bench *b;
	void *a, *bb, *k;       /* device: the H2D destination, the D2H source, the chain's buffer */
	void *host_in, *host_out; /* pinned, portable */
	void *lane[SCHED_BENCH_PARTS];
	void *start[SCHED_BENCH_PARTS], *end[SCHED_BENCH_PARTS];
	struct chain_spec chain;
};

static int ceiling_setup(struct ceiling *c, struct gpuq_error *err)
{
	struct device *dev = c->dev;
	const struct backend_ops *ops = dev->ops;
	uint64_t n = c->b->bytes;
	struct fill_spec random = { .pattern = FILL_RANDOM, .dtype = GPUQ_DTYPE_F32, .seed = 11 };
	if (ops->mem.alloc(dev, n, &c->a, err) || ops->mem.alloc(dev, n, &c->bb, err) ||
	    ops->mem.alloc(dev, n, &c->k, err) || ops->mem.fill(dev, c->k, n, &random, err) ||
	    ops->mem.host_alloc_portable(dev, n, &c->host_in, err) ||
	    ops->mem.host_alloc_portable(dev, n, &c->host_out, err))
		return -1;
	memset(c->host_in, 0x5a, n); /* touched, so no first-use fault is timed */
	memset(c->host_out, 0, n);
	for (int p = 0; p < SCHED_BENCH_PARTS; p++)
		if (ops->events.lane_create(dev, GPUQ_PRIORITY_NORMAL, &c->lane[p], err) ||
		    ops->events.create(dev, true, &c->start[p], err) ||
		    ops->events.create(dev, true, &c->end[p], err))
			return -1;
	struct chain_spec *s = &c->chain;
	chain_spec_from_ops(s, ceiling_chain, sizeof ceiling_chain / sizeof ceiling_chain[0],
			    GPUQ_DTYPE_F32, c->k, c->k);
	s->mode = CHAIN_FUSED;
	s->repeat = 1;
	s->count = n / sizeof(float);
	return 0;
}

static void ceiling_release(struct ceiling *c)
{
	struct device *dev = c->dev;
	const struct backend_ops *ops = dev->ops;
	struct gpuq_error ignored;
	for (int p = 0; p < SCHED_BENCH_PARTS; p++) {
		if (c->start[p])
			ops->events.destroy(dev, c->start[p]);
		if (c->end[p])
			ops->events.destroy(dev, c->end[p]);
		if (c->lane[p])
			ops->events.lane_destroy(dev, c->lane[p]);
	}
	void *device_mem[] = { c->a, c->bb, c->k };
	for (size_t i = 0; i < 3; i++)
		if (device_mem[i] && !dev->faulted)
			ops->mem.release(dev, device_mem[i], &ignored);
	if (c->host_in)
		ops->mem.host_free_portable(dev, c->host_in);
	if (c->host_out)
		ops->mem.host_free_portable(dev, c->host_out);
}

/* Enqueues part p, between its events, on its own lane (then back on the job's). */
static int ceiling_enqueue(struct ceiling *c, int p, struct gpuq_error *err)
{
	struct device *dev = c->dev;
	const struct backend_ops *ops = dev->ops;
	void *own = dev->lane;
	uint64_t n = c->b->bytes;
	dev->lane = c->lane[p];
	int rc = ops->events.record(dev, c->start[p], err);
	if (rc == 0 && p == SCHED_BENCH_H2D)
		rc = ops->copy.ring_h2d(dev, c->a, c->host_in, n, err);
	else if (rc == 0 && p == SCHED_BENCH_D2H)
		rc = ops->copy.ring_d2h(dev, c->host_out, c->bb, n, err);
	else if (rc == 0)
		rc = ops->chain.enqueue(dev, &c->chain, err);
	if (rc == 0)
		rc = ops->events.record(dev, c->end[p], err);
	dev->lane = own;
	return rc;
}

/* Runs the parts in mask at once; *seconds from the earliest start to the latest end. */
static int ceiling_run(struct ceiling *c, unsigned mask, double *seconds, struct gpuq_error *err)
{
	const struct backend_ops *ops = c->dev->ops;
	int first = -1;
	for (int p = 0; p < SCHED_BENCH_PARTS; p++)
		if (mask >> p & 1) {
			if (ceiling_enqueue(c, p, err) != 0)
				return -1;
			first = first < 0 ? p : first;
		}
	*seconds = 0;
	for (int p = 0; p < SCHED_BENCH_PARTS; p++) {
		double t;
		if (!(mask >> p & 1))
			continue;
		if (ops->events.sync(c->dev, c->end[p], err) != 0 ||
		    ops->events.elapsed(c->dev, c->start[first], c->end[p], &t, err) != 0)
			return -1;
		*seconds = t > *seconds ? t : *seconds;
	}
	return 0;
}

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* One unmeasured run of everything, then `reps` of each part alone and of all three at once. */
static int ceiling_measure(struct ceiling *c, struct gpuq_error *err)
{
	struct sched_bench *b = c->b;
	double t[SCHED_BENCH_PARTS + 1][SCHED_BENCH_MAX_REPS], ignored;
	if (ceiling_run(c, 7, &ignored, err) != 0)
		return -1;
	for (unsigned r = 0; r < b->reps; r++) {
		for (int p = 0; p < SCHED_BENCH_PARTS; p++)
			if (ceiling_run(c, 1u << p, &t[p][r], err) != 0)
				return -1;
		if (ceiling_run(c, 7, &t[SCHED_BENCH_PARTS][r], err) != 0)
			return -1;
		sched_checkpoint();
	}
	for (int p = 0; p <= SCHED_BENCH_PARTS; p++) {
		qsort(t[p], b->reps, sizeof t[p][0], compare_doubles);
		double median = t[p][b->reps / 2];
		if (p < SCHED_BENCH_PARTS)
			b->alone_s[p] = median;
		else
			b->together_s = median;
	}
	return 0;
}

int sched_bench_run(struct device *dev, struct work *work)
{
	struct ceiling c;
	memset(&c, 0, sizeof c);
	c.dev = dev;
	c.b = work->spec;
	if (!c.b || c.b->reps < 1 || c.b->reps > SCHED_BENCH_MAX_REPS)
		return gpuq_fail(&work->error, GPUQ_E_INTERNAL, "[gpu %d] bench_sched: no valid spec",
				 dev->index);
	int rc = ceiling_setup(&c, &work->error);
	if (rc == 0)
		rc = ceiling_measure(&c, &work->error);
	ceiling_release(&c);
	work->result.bytes = rc == 0 ? 3 * c.b->bytes : 0;
	return rc;
}
