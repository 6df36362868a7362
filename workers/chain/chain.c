/*
 * Kernel chains, the part every backend shares: the op table, the run entry
 * point, the counters and the plan cache (workers/chain/chain.h says who owns
 * what). Worker thread only, except the name lookups (any thread) and
 * chain_counter_get (any thread: atomics).
 */
#include "workers/chain/chain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/chain/chain_jit.h"
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
static const char *const kernel_names[CHAIN_KERNELS] = { "auto", "compiled", "interpreted" };
static const char *const math_names[CHAIN_MATHS] = { "ieee", "fast" };

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

/* name's index in names[n], or -1. */
static int name_index(const char *const *names, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (strcmp(name, names[i]) == 0)
			return i;
	return -1;
}

const char *chain_kernel_name(enum chain_kernel k)
{
	return (unsigned)k < CHAIN_KERNELS ? kernel_names[k] : "?";
}

int chain_kernel_find(const char *name, enum chain_kernel *out)
{
	int i = name_index(kernel_names, CHAIN_KERNELS, name);
	if (i >= 0)
		*out = (enum chain_kernel)i;
	return i < 0 ? -1 : 0;
}

const char *chain_math_name(enum chain_math m)
{
	return (unsigned)m < CHAIN_MATHS ? math_names[m] : "?";
}

int chain_math_find(const char *name, enum chain_math *out)
{
	int i = name_index(math_names, CHAIN_MATHS, name);
	if (i >= 0)
		*out = (enum chain_math)i;
	return i < 0 ? -1 : 0;
}

const char *chain_source_name(enum chain_source s)
{
	switch (s) {
	case CHAIN_SOURCE_NONE: return "none";
	case CHAIN_SOURCE_PLAN: return "graph";
	case CHAIN_SOURCE_MEMORY: return "memory";
	case CHAIN_SOURCE_DISK: return "disk";
	case CHAIN_SOURCE_NVRTC: return "nvrtc";
	}
	return "?";
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

void chain_spec_set_program(struct chain_spec *spec, const chain_prog *prog, void *const *var)
{
	unsigned x;
	spec->prog = *prog;
	memset(spec->var, 0, sizeof spec->var);
	memcpy(spec->var, var, prog->nvars * sizeof var[0]);
	memcpy(spec->store, spec->var, sizeof spec->store);
	spec->has_ops = chain_prog_as_ops(prog, spec->ops, &spec->nops, &x);
	if (spec->has_ops) {
		spec->dtype = (enum gpuq_dtype)prog->var_dtype[x];
		spec->in = var[x];
		spec->out = var[x];
	}
}

void chain_spec_from_ops(struct chain_spec *spec, const struct kernels_chain_op *ops,
			 unsigned nops, enum gpuq_dtype dtype, const void *in, void *out)
{
	chain_prog prog;
	void *var[1] = { (void *)in };
	chain_prog_from_ops(&prog, ops, nops, dtype);
	chain_spec_set_program(spec, &prog, var);
	spec->store[0] = out;
	spec->out = out;
}

bool chain_spec_is_reduce(const struct chain_spec *spec)
{
	return spec->prog.reduce != KERNELS_REDUCE_NONE;
}

uint64_t chain_kernels(const struct chain_spec *spec)
{
	if (spec->mode == CHAIN_FUSED)
		return chain_spec_is_reduce(spec) ? 2 : 1;
	return (uint64_t)spec->nops * spec->repeat;
}

/* A chunk's cost per element and repeat: the ops a pass runs, or the program's operations and casts. */
static uint64_t chunk_cost(const struct chain_spec *spec)
{
	uint64_t ops = 0;
	if (spec->mode != CHAIN_FUSED)
		return spec->nops ? spec->nops : 1;
	for (unsigned n = 0; n < spec->prog.nnodes; n++)
		ops += spec->prog.node[n].kind == KERNELS_EXPR_OP ||
		       spec->prog.node[n].kind == KERNELS_EXPR_CAST;
	return ops ? ops : 1;
}

void chain_chunks_plan(const struct chain_spec *spec, uint64_t work, struct chain_chunks *k)
{
	uint64_t count = spec->count, repeat = spec->repeat ? spec->repeat : 1;
	uint64_t cost = chunk_cost(spec), per_repeat = count * cost;
	k->repeat = repeat;
	k->elems = count;
	if (count == 0 || chain_spec_is_reduce(spec) || per_repeat <= work / repeat) {
		k->eblocks = 1;
		k->n = 1;
		return;
	}
	if (per_repeat <= work) {
		k->repeat = work / per_repeat;
	} else {
		k->repeat = 1;
		if (spec->mode == CHAIN_FUSED) {
			uint64_t e = work / cost / CHAIN_CHUNK_ELEMS_ALIGN * CHAIN_CHUNK_ELEMS_ALIGN;
			k->elems = e > CHAIN_CHUNK_ELEMS_ALIGN ? e : CHAIN_CHUNK_ELEMS_ALIGN;
			if (k->elems > count)
				k->elems = count;
		}
	}
	k->eblocks = (count + k->elems - 1) / k->elems;
	k->n = (repeat + k->repeat - 1) / k->repeat * k->eblocks;
}

void chain_chunk_spec(const struct chain_spec *spec, const struct chain_chunks *k, uint64_t i,
		      struct chain_spec *out)
{
	uint64_t rb = i / k->eblocks, e0 = i % k->eblocks * k->elems;
	*out = *spec;
	out->repeat = spec->repeat - rb * k->repeat < k->repeat ? spec->repeat - rb * k->repeat
								  : k->repeat;
	out->count = spec->count - e0 < k->elems ? spec->count - e0 : k->elems;
	for (unsigned v = 0; v < spec->prog.nvars; v++) {
		if (spec->prog.var_flags[v] & KERNELS_EXPR_BCAST)
			continue;
		char *at = (char *)spec->store[v] +
			   e0 * gpuq_dtype_size((enum gpuq_dtype)spec->prog.var_dtype[v]);
		out->var[v] = at;
		out->store[v] = at;
	}
	if (spec->has_ops) {
		out->out = (char *)spec->out + e0 * gpuq_dtype_size(spec->dtype);
		out->in = out->out;
	}
}

bool chain_chunks_copy_first(const struct chain_spec *spec)
{
	return spec->has_ops && spec->in != spec->out;
}

int chain_chunks_cancelled(struct gpuq_error *err, const struct chain_spec *spec,
			   const struct chain_chunks *k, uint64_t done)
{
	return gpuq_fail(err, GPUQ_E_CANCELLED,
			 "run cancelled after %llu of %llu chunks (a chunk is at most %llu of the "
			 "%llu repeats over %llu of the %llu elements); the buffers it writes hold "
			 "the chunks that ran",
			 (unsigned long long)done, (unsigned long long)k->n,
			 (unsigned long long)k->repeat, (unsigned long long)spec->repeat,
			 (unsigned long long)k->elems, (unsigned long long)spec->count);
}

uint64_t chain_bytes(const struct chain_spec *spec)
{
	if (spec->mode == CHAIN_FUSED)
		return chain_prog_bytes(&spec->prog, spec->count);
	return chain_kernels(spec) * 2 * spec->count * gpuq_dtype_size(spec->dtype);
}

double chain_reduce_finish(unsigned kind, const struct kernels_partial *p, uint64_t count)
{
	switch (kind) {
	case KERNELS_REDUCE_MEAN: return count ? p->v / (double)count : NAN;
	case KERNELS_REDUCE_NORM2: return sqrt(p->v);
	case KERNELS_REDUCE_COUNT_NONZERO: return (double)p->i;
	case KERNELS_REDUCE_ARGMAX: return count ? (double)p->i : -1;
	default: return p->v;
	}
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
	struct chain_jit *jit;
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
	if (cs) {
		cs->entries = calloc(cap, sizeof *cs->entries);
		cs->jit = chain_jit_new(cap);
	}
	if (!cs || !cs->entries || !cs->jit) {
		if (cs) {
			free(cs->entries);
			free(cs->jit);
		}
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

struct chain_jit *chain_state_jit(const struct chain_state *cs)
{
	return cs->jit;
}

static struct chain_jit_loader chain_loader(const struct chain_state *cs)
{
	struct chain_jit_loader l = { cs->ops->load, cs->ops->unload };
	return l;
}

/* A fallback's note says what was wanted: the compiled kernel, and fast math if asked. */
static void kernel_fallback_note(const struct chain_spec *spec, struct chain_kernel_info *info)
{
	size_t used = strlen(info->note);
	if (spec->math == CHAIN_MATH_FAST && used < sizeof info->note)
		snprintf(info->note + used, sizeof info->note - used,
			 "; it computes IEEE (math fast needs a compiled kernel)");
}

int chain_kernel_resolve(struct device *dev, const struct chain_spec *spec,
			 struct chain_jit_entry **entry, struct chain_kernel_info *info,
			 struct gpuq_error *err)
{
	struct chain_state *cs = dev->chain;
	memset(info, 0, sizeof *info);
	*entry = NULL;
	if (spec->mode != CHAIN_FUSED || spec->kernel == CHAIN_KERNEL_INTERPRETED)
		return 0;
	struct chain_jit_loader l = chain_loader(cs);
	int rc = chain_jit_get(dev, cs->jit, &l, &spec->prog, spec->math, entry, info, err);
	if (rc <= 0) {
		info->compiled = rc == 0;
		info->math = rc == 0 ? spec->math : CHAIN_MATH_IEEE;
		return rc;
	}
	chain_counter_add(dev, CHAIN_COUNTER_kernel_fallbacks, 1);
	if (spec->kernel == CHAIN_KERNEL_COMPILED)
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR,
				 "[gpu %d] kernel compiled was asked for and cannot be had: %s "
				 "(kernel auto runs the interpreted kernel instead)", dev->index, info->note);
	kernel_fallback_note(spec, info);
	info->source = CHAIN_SOURCE_NONE;
	return 0;
}

int chain_kernel_costs(struct device *dev, const chain_prog *prog, struct chain_jit_costs *out,
		       struct gpuq_error *err)
{
	if (!dev->chain)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] no chain state", dev->index);
	struct chain_jit_loader l = chain_loader(dev->chain);
	return chain_jit_measure(dev, dev->chain->jit, &l, prog, out, err);
}

void chain_kernel_release(struct device *dev, struct chain_jit_entry *entry)
{
	if (entry && dev->chain)
		chain_jit_release(dev->chain->jit, entry);
}

void *chain_state_close(struct device *dev)
{
	struct chain_state *cs = dev->chain;
	if (!cs)
		return NULL;
	for (unsigned i = 0; i < cs->n; i++)
		cs->ops->destroy(dev, cs->entries[i].plan);
	struct chain_jit_loader l = chain_loader(cs);
	chain_jit_free(dev, cs->jit, &l); /* after the plans: their graphs use its kernels */
	void *impl = cs->impl;
	free(cs->entries);
	free(cs);
	dev->chain = NULL;
	atomic_store(&dev->chain_counters[CHAIN_COUNTER_graph_entries], 0);
	return impl;
}

/*
 * Everything that shapes the plan except the buffers. Constants compare as
 * bits (chain_prog_equal): mul 0 and mul -0 are different chains.
 */
static bool same_shape(const struct chain_spec *a, const struct chain_spec *b)
{
	return a->mode == b->mode && a->kernel == b->kernel && a->math == b->math &&
	       a->count == b->count && a->repeat == b->repeat && chain_prog_equal(&a->prog, &b->prog);
}

static bool same_buffers(const struct chain_spec *a, const struct chain_spec *b)
{
	size_t n = a->prog.nvars * sizeof a->var[0];
	return memcmp(a->var, b->var, n) == 0 && memcmp(a->store, b->store, n) == 0;
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
	if (e && same_buffers(&e->key, spec)) {
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
	if (cs->ops->kernel_info) {
		spec->result.kernel = *cs->ops->kernel_info(e->plan);
		if (!spec->result.instantiated && spec->result.kernel.compiled) {
			spec->result.kernel.source = CHAIN_SOURCE_PLAN; /* nothing was looked up */
			spec->result.kernel.compile_s = 0;
		}
	}
	return 0;
}

/* Buffers the kernels may address: there, and aligned for their vector accesses. */
static bool spec_buffers_ok(const struct chain_spec *spec)
{
	for (unsigned v = 0; v < spec->prog.nvars; v++)
		if (!spec->var[v] || !spec->store[v] ||
		    ((uintptr_t)spec->var[v] | (uintptr_t)spec->store[v]) % 16 != 0)
			return false;
	return !spec->has_ops || (spec->in && spec->out && ((uintptr_t)spec->in | (uintptr_t)spec->out) % 16 == 0);
}

/* What the backends rely on: checked here once, so that a bug fails a job, not a context. */
static int chain_check_spec(const struct device *dev, const struct chain_spec *spec,
			    struct gpuq_error *err)
{
	unsigned at;
	char why[200] = "";
	bool ok = chain_prog_check(&spec->prog, &at, why, sizeof why) == 0 && spec->repeat >= 1 &&
		  (unsigned)spec->mode < CHAIN_MODES && (unsigned)spec->kernel < CHAIN_KERNELS &&
		  (unsigned)spec->math < CHAIN_MATHS && spec->reps <= CHAIN_MAX_REPS &&
		  spec_buffers_ok(spec) && (spec->mode == CHAIN_FUSED || spec->has_ops) &&
		  (!chain_spec_is_reduce(spec) || (spec->mode == CHAIN_FUSED && spec->repeat == 1));
	if (spec->has_ops) {
		ok = ok && spec->nops >= 1 && spec->nops <= KERNELS_CHAIN_MAX_OPS &&
		     chain_dtype_supported(spec->dtype);
		for (unsigned i = 0; ok && i < spec->nops; i++)
			ok = spec->ops[i].kind < KERNELS_CHAIN_KINDS;
	}
	if (ok)
		return 0;
	return gpuq_fail(err, GPUQ_E_INTERNAL,
			 "[gpu %d] chain: inconsistent spec (%u ops, repeat %llu, mode %d, "
			 "program: %s): a bug in gpuqd's validation",
			 dev->index, spec->nops, (unsigned long long)spec->repeat, (int)spec->mode,
			 why[0] ? why : "checked");
}

int chain_execute(struct device *dev, struct chain_spec *spec, const atomic_bool *cancel,
		  struct gpuq_error *err)
{
	if (!dev->ops->chain.run)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] the %s backend cannot run chains",
				 dev->index, dev->ops->name);
	if (chain_check_spec(dev, spec, err) != 0)
		return -1;
	memset(&spec->result, 0, sizeof spec->result);
	spec->cancel = cancel;
	if (dev->ops->chain.run(dev, spec, err) != 0)
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
