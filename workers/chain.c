/*
 * Kernel chains, the part every backend shares: the op table, the run entry
 * point, the counters and the plan cache (workers/chain.h says who owns
 * what). Worker thread only, except the name lookups (any thread) and
 * chain_counter_get (any thread: atomics).
 */
#include "workers/chain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/clock.h"

static const struct {
	const char *name;
	int nargs;
} chain_ops[KERNELS_CHAIN_KINDS] = {
#define CHAIN_OP_ENTRY(name, str, nargs) { str, nargs },
	KERNELS_CHAIN_OPS(CHAIN_OP_ENTRY)
#undef CHAIN_OP_ENTRY
};

static const char *const mode_names[CHAIN_MODES] = { "fused", "graph", "eager" };

const char *chain_op_name(unsigned kind)
{
	return kind < KERNELS_CHAIN_KINDS ? chain_ops[kind].name : "?";
}

int chain_op_nargs(unsigned kind)
{
	return kind < KERNELS_CHAIN_KINDS ? chain_ops[kind].nargs : -1;
}

int chain_op_find(const char *name, size_t len)
{
	for (int k = 0; k < KERNELS_CHAIN_KINDS; k++)
		if (strlen(chain_ops[k].name) == len && memcmp(chain_ops[k].name, name, len) == 0)
			return k;
	return -1;
}

const char *chain_op_list(void)
{
	static const char list[] =
#define CHAIN_OP_LIST(name, str, nargs) " " str
		KERNELS_CHAIN_OPS(CHAIN_OP_LIST)
#undef CHAIN_OP_LIST
		;
	return list + 1; /* past the first separator */
}

const char *chain_mode_name(enum chain_mode mode)
{
	return (unsigned)mode < CHAIN_MODES ? mode_names[mode] : "?";
}

int chain_mode_find(const char *name, enum chain_mode *out)
{
	for (int m = 0; m < CHAIN_MODES; m++) {
		if (strcmp(name, mode_names[m]) == 0) {
			*out = (enum chain_mode)m;
			return 0;
		}
	}
	return -1;
}

const char *chain_cache_outcome_name(enum chain_cache_outcome c)
{
	switch (c) {
	case CHAIN_CACHE_NONE: return "none";
	case CHAIN_CACHE_HIT: return "hit";
	case CHAIN_CACHE_UPDATE: return "update";
	case CHAIN_CACHE_MISS: return "miss";
	}
	return "?";
}

bool chain_dtype_supported(enum gpuq_dtype dtype)
{
	return dtype == GPUQ_DTYPE_F16 || dtype == GPUQ_DTYPE_BF16 || dtype == GPUQ_DTYPE_F32 ||
	       dtype == GPUQ_DTYPE_F64;
}

uint64_t chain_kernels(const struct chain_spec *spec)
{
	return spec->mode == CHAIN_FUSED ? 1 : (uint64_t)spec->nops * spec->repeat;
}

uint64_t chain_bytes(const struct chain_spec *spec)
{
	return chain_kernels(spec) * 2 * spec->count * gpuq_dtype_size(spec->dtype);
}

uint64_t chain_counter_get(const struct device *dev, enum chain_counter c)
{
	return atomic_load_explicit(&dev->chain_counters[c], memory_order_relaxed);
}

void chain_counter_add(struct device *dev, enum chain_counter c, uint64_t n)
{
	atomic_fetch_add_explicit(&dev->chain_counters[c], n, memory_order_relaxed);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

double chain_median(double *v, unsigned n)
{
	qsort(v, n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * The cache: at most `cap` entries, each a plan and the spec it was made
 * for. Lookups scan it (64 entries by default): a chain costs far more than
 * comparing a few fields of each entry.
 */
struct chain_entry {
	struct chain_spec key; /* inputs only; result unused */
	void *plan;
	uint64_t used; /* the cache's clock at the last use: the least is evicted */
};

struct chain_state {
	const struct chain_plan_ops *ops;
	void *impl;
	struct chain_entry *entries;
	unsigned n, cap;
	uint64_t clock;
};

struct chain_state *chain_state_get(struct device *dev, const struct chain_plan_ops *ops,
				    struct gpuq_error *err)
{
	if (dev->chain)
		return dev->chain;
	unsigned cap = dev->config.chain_graph_cache;
	if (cap == 0)
		cap = CHAIN_CACHE_DEFAULT;
	struct chain_state *cs = calloc(1, sizeof *cs);
	if (cs)
		cs->entries = calloc(cap, sizeof *cs->entries);
	if (!cs || !cs->entries) {
		free(cs);
		gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
			  "[gpu %d] no host memory for a chain cache of %u entries (--graph-cache)",
			  dev->index, cap);
		return NULL;
	}
	cs->ops = ops;
	cs->cap = cap;
	dev->chain = cs;
	return cs;
}

void *chain_state_impl(const struct chain_state *cs)
{
	return cs->impl;
}

void chain_state_set_impl(struct chain_state *cs, void *impl)
{
	cs->impl = impl;
}

void *chain_state_close(struct device *dev)
{
	struct chain_state *cs = dev->chain;
	if (!cs)
		return NULL;
	for (unsigned i = 0; i < cs->n; i++)
		cs->ops->destroy(dev, cs->entries[i].plan);
	void *impl = cs->impl;
	free(cs->entries);
	free(cs);
	dev->chain = NULL;
	atomic_store(&dev->chain_counters[CHAIN_COUNTER_graph_entries], 0);
	return impl;
}

/* Constants compare as bits: mul 0 and mul -0 are different chains. */
static bool same_ops(const struct chain_spec *a, const struct chain_spec *b)
{
	if (a->nops != b->nops)
		return false;
	for (unsigned i = 0; i < a->nops; i++) {
		const struct kernels_chain_op *x = &a->ops[i], *y = &b->ops[i];
		if (x->kind != y->kind || memcmp(&x->a, &y->a, sizeof x->a) != 0 ||
		    memcmp(&x->b, &y->b, sizeof x->b) != 0)
			return false;
	}
	return true;
}

/* Everything that shapes the plan except the buffers. */
static bool same_shape(const struct chain_spec *a, const struct chain_spec *b)
{
	return a->mode == b->mode && a->dtype == b->dtype && a->count == b->count &&
	       a->repeat == b->repeat && same_ops(a, b);
}

static struct chain_entry *cache_find_shape(struct chain_state *cs, const struct chain_spec *spec)
{
	for (unsigned i = 0; i < cs->n; i++)
		if (same_shape(&cs->entries[i].key, spec))
			return &cs->entries[i];
	return NULL;
}

static void cache_key_set(struct chain_entry *e, const struct chain_spec *spec)
{
	e->key = *spec;
	memset(&e->key.result, 0, sizeof e->key.result);
	e->key.cancel = NULL;
}

/* A free entry, evicting the least recently used one when the cache is full. */
static struct chain_entry *cache_slot(struct device *dev, struct chain_state *cs)
{
	if (cs->n < cs->cap)
		return &cs->entries[cs->n++];
	struct chain_entry *lru = &cs->entries[0];
	for (unsigned i = 1; i < cs->n; i++)
		if (cs->entries[i].used < lru->used)
			lru = &cs->entries[i];
	cs->ops->destroy(dev, lru->plan);
	lru->plan = NULL;
	chain_counter_add(dev, CHAIN_COUNTER_graph_evictions, 1);
	return lru;
}

static void cache_drop(struct chain_state *cs, struct chain_entry *e)
{
	*e = cs->entries[--cs->n];
}

/* Builds a plan for spec into a fresh entry. */
static int cache_build(struct device *dev, struct chain_state *cs, struct chain_spec *spec,
		       struct chain_entry **out, struct gpuq_error *err)
{
	void *plan = NULL;
	if (cs->ops->build(dev, spec, &plan, err) != 0)
		return -1;
	struct chain_entry *e = cache_slot(dev, cs);
	cache_key_set(e, spec);
	e->plan = plan;
	spec->result.instantiated = true;
	chain_counter_add(dev, CHAIN_COUNTER_graph_instantiations, 1);
	*out = e;
	return 0;
}

/*
 * Retargets e to spec's buffers; when the backend cannot, replaces e's plan
 * with a new one (counted as an instantiation, not an update). A plan whose
 * retargeting failed is dropped: CUDA promises to leave an executable graph
 * unchanged only when it declines an update, not after other errors.
 */
static int cache_retarget(struct device *dev, struct chain_state *cs, struct chain_entry *e,
			  struct chain_spec *spec, struct chain_entry **out, struct gpuq_error *err)
{
	int rc = cs->ops->retarget(dev, e->plan, spec, err);
	if (rc < 0) {
		cs->ops->destroy(dev, e->plan);
		cache_drop(cs, e);
		return -1;
	}
	if (rc == 0) {
		cache_key_set(e, spec);
		chain_counter_add(dev, CHAIN_COUNTER_graph_updates, 1);
		*out = e;
		return 0;
	}
	cs->ops->destroy(dev, e->plan);
	cache_drop(cs, e);
	return cache_build(dev, cs, spec, out, err);
}

static void cache_count_entries(struct device *dev, const struct chain_state *cs)
{
	atomic_store(&dev->chain_counters[CHAIN_COUNTER_graph_entries], cs->n);
}

int chain_cache_get(struct device *dev, struct chain_state *cs, struct chain_spec *spec,
		    void **plan, struct gpuq_error *err)
{
	double start = monotonic_seconds();
	struct chain_entry *e = cache_find_shape(cs, spec);
	int rc = 0;
	spec->result.instantiated = false;
	if (e && e->key.in == spec->in && e->key.out == spec->out) {
		spec->result.cache = CHAIN_CACHE_HIT;
		chain_counter_add(dev, CHAIN_COUNTER_graph_hits, 1);
	} else if (e) {
		spec->result.cache = CHAIN_CACHE_UPDATE;
		rc = cache_retarget(dev, cs, e, spec, &e, err);
	} else {
		spec->result.cache = CHAIN_CACHE_MISS;
		chain_counter_add(dev, CHAIN_COUNTER_graph_misses, 1);
		rc = cache_build(dev, cs, spec, &e, err);
	}
	cache_count_entries(dev, cs);
	spec->result.prepare_s = monotonic_seconds() - start;
	if (rc != 0)
		return -1;
	e->used = ++cs->clock;
	*plan = e->plan;
	return 0;
}

/* What the backends rely on: checked here once, so that a bug fails a job, not a context. */
static int chain_check_spec(const struct device *dev, const struct chain_spec *spec,
			    struct gpuq_error *err)
{
	bool ok = spec->nops >= 1 && spec->nops <= KERNELS_CHAIN_MAX_OPS && spec->repeat >= 1 &&
		  (unsigned)spec->mode < CHAIN_MODES && chain_dtype_supported(spec->dtype) &&
		  spec->in && spec->out && spec->reps <= CHAIN_MAX_REPS &&
		  ((uintptr_t)spec->in | (uintptr_t)spec->out) % 16 == 0;
	for (unsigned i = 0; ok && i < spec->nops; i++)
		ok = spec->ops[i].kind < KERNELS_CHAIN_KINDS;
	if (ok)
		return 0;
	return gpuq_fail(err, GPUQ_E_INTERNAL,
			 "[gpu %d] chain: inconsistent spec (%u ops, repeat %llu, mode %d, dtype %s, "
			 "in %p, out %p, %u reps): a bug in gpuqd's validation",
			 dev->index, spec->nops, (unsigned long long)spec->repeat, (int)spec->mode,
			 gpuq_dtype_name(spec->dtype), spec->in, (void *)spec->out, spec->reps);
}

int chain_execute(struct device *dev, struct chain_spec *spec, const atomic_bool *cancel,
		  struct gpuq_error *err)
{
	if (!dev->ops->chain)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] the %s backend cannot run chains",
				 dev->index, dev->ops->name);
	if (chain_check_spec(dev, spec, err) != 0)
		return -1;
	memset(&spec->result, 0, sizeof spec->result);
	spec->cancel = cancel;
	if (dev->ops->chain(dev, spec, err) != 0)
		return -1;
	unsigned reps = spec->reps ? spec->reps : 1;
	chain_counter_add(dev, CHAIN_COUNTER_runs, 1);
	chain_counter_add(dev, CHAIN_COUNTER_kernels, chain_kernels(spec) * reps);
	return 0;
}

int chain_run(struct device *dev, struct work *work)
{
	struct chain_spec *spec = work->spec;
	if (!spec)
		return gpuq_fail(&work->error, GPUQ_E_INTERNAL, "[gpu %d] run: the job has no chain",
				 dev->index);
	if (chain_execute(dev, spec, &work->cancel, &work->error) != 0)
		return -1;
	work->result.bytes = chain_bytes(spec);
	return 0;
}
