/*
 * The host's arithmetic for chains and expression programs
 * (workers/chain/chain_eval.h). Pure functions; any thread.
 */
#include "workers/chain/chain_eval.h"

#include <math.h>

#include "kernels/chain_reduce.h"
#include "protocol/dtype.h"
#include "protocol/hash.h"

double chain_eval_load(enum gpuq_dtype t, const void *p, uint64_t i)
{
	switch (t) {
	case GPUQ_DTYPE_F16: return gpuq_f16_bits_to_f32(((const uint16_t *)p)[i]);
	case GPUQ_DTYPE_BF16: return gpuq_bf16_bits_to_f32(((const uint16_t *)p)[i]);
	case GPUQ_DTYPE_F32: return ((const float *)p)[i];
	default: return ((const double *)p)[i];
	}
}

void chain_eval_store(enum gpuq_dtype t, void *p, uint64_t i, double v)
{
	switch (t) {
	case GPUQ_DTYPE_F16: ((uint16_t *)p)[i] = gpuq_f32_to_f16_bits((float)v); break;
	case GPUQ_DTYPE_BF16: ((uint16_t *)p)[i] = gpuq_f32_to_bf16_bits((float)v); break;
	case GPUQ_DTYPE_F32: ((float *)p)[i] = (float)v; break;
	default: ((double *)p)[i] = v; break;
	}
}

/* A float value rounded to t, as storing and loading it would. */
static double eval_round(unsigned t, float v)
{
	switch (t) {
	case KERNELS_EXPR_F16: return gpuq_f16_bits_to_f32(gpuq_f32_to_f16_bits(v));
	case KERNELS_EXPR_BF16: return gpuq_bf16_bits_to_f32(gpuq_f32_to_bf16_bits(v));
	default: return v;
	}
}

double chain_eval_convert(unsigned t, double v)
{
	return t == KERNELS_EXPR_F64 ? v : eval_round(t, (float)v);
}

/* The ops in float, as kernels/chain_ops.cuh defines them. */
static float eval_opf(unsigned kind, float x, float a, float b)
{
	switch (kind) {
	case KERNELS_CHAIN_SIN: return sinf(x);
	case KERNELS_CHAIN_COS: return cosf(x);
	case KERNELS_CHAIN_TAN: return tanf(x);
	case KERNELS_CHAIN_EXP: return expf(x);
	case KERNELS_CHAIN_LOG: return logf(x);
	case KERNELS_CHAIN_LOG2: return log2f(x);
	case KERNELS_CHAIN_SQRT: return sqrtf(x);
	case KERNELS_CHAIN_RSQRT: return 1.0f / sqrtf(x);
	case KERNELS_CHAIN_ABS: return fabsf(x);
	case KERNELS_CHAIN_NEG: return -x;
	case KERNELS_CHAIN_RELU: return x > 0.0f ? x : 0.0f;
	case KERNELS_CHAIN_SIGMOID: return 1.0f / (1.0f + expf(-x));
	case KERNELS_CHAIN_TANH: return tanhf(x);
	case KERNELS_CHAIN_FLOOR: return floorf(x);
	case KERNELS_CHAIN_CEIL: return ceilf(x);
	case KERNELS_CHAIN_ROUND: return roundf(x);
	case KERNELS_CHAIN_ADD: return x + a;
	case KERNELS_CHAIN_SUB: return x - a;
	case KERNELS_CHAIN_MUL: return x * a;
	case KERNELS_CHAIN_DIV: return x / a;
	case KERNELS_CHAIN_POW: return powf(x, a);
	case KERNELS_CHAIN_MIN: return fminf(x, a);
	case KERNELS_CHAIN_MAX: return fmaxf(x, a);
	case KERNELS_CHAIN_CLAMP: return fminf(fmaxf(x, a), b);
	case KERNELS_CHAIN_FMA: return fmaf(x, a, b);
	}
	return x;
}

static double eval_opd(unsigned kind, double x, double a, double b)
{
	switch (kind) {
	case KERNELS_CHAIN_SIN: return sin(x);
	case KERNELS_CHAIN_COS: return cos(x);
	case KERNELS_CHAIN_TAN: return tan(x);
	case KERNELS_CHAIN_EXP: return exp(x);
	case KERNELS_CHAIN_LOG: return log(x);
	case KERNELS_CHAIN_LOG2: return log2(x);
	case KERNELS_CHAIN_SQRT: return sqrt(x);
	case KERNELS_CHAIN_RSQRT: return 1.0 / sqrt(x);
	case KERNELS_CHAIN_ABS: return fabs(x);
	case KERNELS_CHAIN_NEG: return -x;
	case KERNELS_CHAIN_RELU: return x > 0.0 ? x : 0.0;
	case KERNELS_CHAIN_SIGMOID: return 1.0 / (1.0 + exp(-x));
	case KERNELS_CHAIN_TANH: return tanh(x);
	case KERNELS_CHAIN_FLOOR: return floor(x);
	case KERNELS_CHAIN_CEIL: return ceil(x);
	case KERNELS_CHAIN_ROUND: return round(x);
	case KERNELS_CHAIN_ADD: return x + a;
	case KERNELS_CHAIN_SUB: return x - a;
	case KERNELS_CHAIN_MUL: return x * a;
	case KERNELS_CHAIN_DIV: return x / a;
	case KERNELS_CHAIN_POW: return pow(x, a);
	case KERNELS_CHAIN_MIN: return fmin(x, a);
	case KERNELS_CHAIN_MAX: return fmax(x, a);
	case KERNELS_CHAIN_CLAMP: return fmin(fmax(x, a), b);
	case KERNELS_CHAIN_FMA: return fma(x, a, b);
	}
	return x;
}

double chain_eval_op(unsigned t, unsigned kind, double x, double a, double b)
{
	if (t == KERNELS_EXPR_F64)
		return eval_opd(kind, x, a, b);
	return eval_round(t, eval_opf(kind, (float)x, (float)a, (float)b));
}

/* ---- Programs ---- */

static double eval_node(const struct kernels_expr_prog *g, const struct kernels_expr_node *n,
			const double *v, const double *var)
{
	switch (n->kind) {
	case KERNELS_EXPR_VAR: return var[n->arg[0]];
	case KERNELS_EXPR_CONST:
		return n->type == KERNELS_EXPR_F64 ? g->c[n->arg[0]] : (double)(float)g->c[n->arg[0]];
	case KERNELS_EXPR_CAST: return chain_eval_convert(n->type, v[n->arg[0]]);
	default: return chain_eval_op(n->type, n->op, v[n->arg[0]], v[n->arg[1]], v[n->arg[2]]);
	}
}

/* The statements once, in order: each evaluates its nodes, then assigns. */
static void eval_statements(const struct kernels_expr_prog *g, double *var, double *v)
{
	unsigned n = 0;
	for (unsigned s = 0; s < g->nstmts; s++) {
		for (; n <= g->stmt_node[s]; n++)
			v[n] = eval_node(g, &g->node[n], v, var);
		var[g->stmt_var[s]] = chain_eval_convert(g->var_dtype[g->stmt_var[s]], v[g->stmt_node[s]]);
	}
}

/* The loaded variables' values at element i. */
static void eval_load_vars(const struct kernels_expr *e, uint64_t i, double *var)
{
	const struct kernels_expr_prog *g = &e->prog;
	for (unsigned k = 0; k < g->nvars; k++)
		if (g->var_flags[k] & KERNELS_EXPR_LOAD)
			var[k] = chain_eval_load((enum gpuq_dtype)g->var_dtype[k], e->var[k],
						 (g->var_flags[k] & KERNELS_EXPR_BCAST) ? 0 : i);
}

void chain_eval_run(const struct kernels_expr *e)
{
	const struct kernels_expr_prog *g = &e->prog;
	double var[KERNELS_EXPR_MAX_VARS] = { 0 }, v[KERNELS_EXPR_MAX_NODES];
	for (uint64_t i = 0; i < e->count; i++) {
		eval_load_vars(e, i, var);
		for (uint64_t r = 0; r < e->repeat; r++)
			eval_statements(g, var, v);
		for (unsigned k = 0; k < g->nvars; k++)
			if (g->var_flags[k] & KERNELS_EXPR_STORE)
				chain_eval_store((enum gpuq_dtype)g->var_dtype[k], e->store[k], i, var[k]);
	}
}

/* ---- Reductions: kernels/chain_reduce.h's folds, in kernels/chain_abi.h's order ---- */

static void reduce_tree(unsigned kind, struct kernels_partial *s)
{
	for (unsigned w = KERNELS_REDUCE_THREADS / 2; w > 0; w >>= 1)
		for (unsigned j = 0; j < w; j++)
			s[j] = kernels_reduce_merge(kind, s[j], s[j + w]);
}

/* Element i's value: the reduced node's, or for dot the product of both. */
static double reduce_value(const struct kernels_expr *e, uint64_t i, double *var, double *v)
{
	const struct kernels_expr_prog *g = &e->prog;
	unsigned last = g->reduce_arg[0] > g->reduce_arg[1] ? g->reduce_arg[0] : g->reduce_arg[1];
	eval_load_vars(e, i, var);
	for (unsigned n = 0; n <= last; n++)
		v[n] = eval_node(g, &g->node[n], v, var);
	if (g->reduce == KERNELS_REDUCE_DOT)
		return v[g->reduce_arg[0]] * v[g->reduce_arg[1]];
	return v[g->reduce_arg[0]];
}

uint64_t chain_eval_tiles(uint64_t count)
{
	return (count + KERNELS_REDUCE_TILE - 1) / KERNELS_REDUCE_TILE;
}

static struct kernels_partial reduce_tile(const struct kernels_expr *e, uint64_t tile)
{
	unsigned kind = e->prog.reduce;
	struct kernels_partial s[KERNELS_REDUCE_THREADS];
	double var[KERNELS_EXPR_MAX_VARS] = { 0 }, v[KERNELS_EXPR_MAX_NODES];
	uint64_t base = tile * (KERNELS_REDUCE_TILE / KERNELS_EXPR_ITEM);
	for (unsigned j = 0; j < KERNELS_REDUCE_THREADS; j++) {
		struct kernels_partial acc = kernels_reduce_identity(kind);
		for (unsigned g = 0; g < KERNELS_REDUCE_ITEMS; g++) {
			uint64_t item = base + (uint64_t)g * KERNELS_REDUCE_THREADS + j;
			for (unsigned k = 0; k < KERNELS_EXPR_ITEM; k++) {
				uint64_t i = item * KERNELS_EXPR_ITEM + k;
				if (i < e->count)
					acc = kernels_reduce_fold(kind, acc, reduce_value(e, i, var, v), i);
			}
		}
		s[j] = acc;
	}
	reduce_tree(kind, s);
	return s[0];
}

struct kernels_partial chain_eval_reduce(const struct kernels_expr *e)
{
	unsigned kind = e->prog.reduce;
	uint64_t tiles = chain_eval_tiles(e->count);
	struct kernels_partial s[KERNELS_REDUCE_THREADS];
	for (unsigned j = 0; j < KERNELS_REDUCE_THREADS; j++)
		s[j] = kernels_reduce_identity(kind);
	for (uint64_t t = 0; t < tiles; t++) {
		unsigned j = (unsigned)(t % KERNELS_REDUCE_THREADS);
		s[j] = kernels_reduce_merge(kind, s[j], reduce_tile(e, t));
	}
	reduce_tree(kind, s);
	return s[0];
}
