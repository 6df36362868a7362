/*
 * Source generation for compiled chain kernels (workers/chain/chain_codegen.h).
 * Pure functions; any thread.
 */
#include "workers/chain/chain_codegen.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growing string; `failed` once an allocation failed (the text is then dropped). */
struct text {
	char *s;
	size_t len, cap;
	bool failed;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct text *t, const char *fmt, ...)
{
	va_list ap;
	for (int attempt = 0; attempt < 2 && !t->failed; attempt++) {
		va_start(ap, fmt);
		int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->failed = true;
			return;
		}
		if (t->s && t->len + (size_t)n < t->cap) {
			t->len += (size_t)n;
			return;
		}
		size_t cap = (t->cap + (size_t)n + 1) * 2;
		char *s = realloc(t->s, cap);
		if (!s) {
			t->failed = true;
			return;
		}
		t->s = s;
		t->cap = cap;
	}
}

static const char *const op_macro[KERNELS_CHAIN_KINDS] = {
#define CODEGEN_OP_MACRO(name, str, nargs) "KERNELS_CHAIN_" #name,
	KERNELS_CHAIN_OPS(CODEGEN_OP_MACRO)
#undef CODEGEN_OP_MACRO
};

static const char *type_macro(unsigned t)
{
	switch (t) {
	case KERNELS_EXPR_F16: return "KERNELS_EXPR_F16";
	case KERNELS_EXPR_BF16: return "KERNELS_EXPR_BF16";
	case KERNELS_EXPR_F32: return "KERNELS_EXPR_F32";
	default: return "KERNELS_EXPR_F64";
	}
}

/* What values of type t compute in. */
static const char *ctype(unsigned t)
{
	return t == KERNELS_EXPR_F64 ? "double" : "float";
}

void chain_codegen_headers(const char *names[CHAIN_CODEGEN_HEADERS],
			   const char *texts[CHAIN_CODEGEN_HEADERS])
{
	names[0] = "kernels/chain_ops.cuh";
	texts[0] = chain_prelude_ops;
	names[1] = "kernels/chain_abi.h";
	texts[1] = chain_prelude_abi;
	names[2] = "kernels/chain_reduce.h";
	texts[2] = chain_prelude_reduce;
}

const char *chain_codegen_entry(const chain_prog *prog)
{
	return prog->reduce == KERNELS_REDUCE_NONE ? "gq_run" : "gq_reduce";
}

/* Value `name` of type from converted to type to (kernels/chain_ops.cuh's gq_convert). */
static void put_convert(struct text *t, unsigned to, unsigned from, const char *name)
{
	if (to == KERNELS_EXPR_F64)
		put(t, from == KERNELS_EXPR_F64 ? "%s" : "(double)%s", name);
	else if (from == KERNELS_EXPR_F64)
		put(t, "gq_round(%s, (float)%s)", type_macro(to), name);
	else if (to == KERNELS_EXPR_F32)
		put(t, "%s", name);
	else
		put(t, "gq_round(%s, %s)", type_macro(to), name);
}

/* Operand a of an op node of type `type`: widened to double when the node computes in double. */
static void put_operand(struct text *t, const chain_prog *g, const struct kernels_expr_node *n,
			unsigned a)
{
	if (a >= n->nargs) {
		put(t, n->type == KERNELS_EXPR_F64 ? ", 0.0" : ", 0.0f");
		return;
	}
	unsigned from = g->node[n->arg[a]].type;
	bool widen = n->type == KERNELS_EXPR_F64 && from != KERNELS_EXPR_F64;
	put(t, "%s%sn%u", a ? ", " : "", widen ? "(double)" : "", n->arg[a]);
}

static bool var_bcast(const chain_prog *g, unsigned v)
{
	return g->var_flags[v] & KERNELS_EXPR_BCAST;
}

/* "const float n7 = ...;" for node i, element e of the arrays (a broadcast variable is one value). */
static void put_node(struct text *t, const chain_prog *g, unsigned i)
{
	const struct kernels_expr_node *n = &g->node[i];
	char name[16];
	put(t, "\t\t\tconst %s n%u = ", ctype(n->type), i);
	switch (n->kind) {
	case KERNELS_EXPR_VAR:
		put(t, var_bcast(g, n->arg[0]) ? "v%u" : "v%u[e]", n->arg[0]);
		break;
	case KERNELS_EXPR_CONST:
		put(t, "(%s)p.prog.c[%u]", ctype(n->type), n->arg[0]);
		break;
	case KERNELS_EXPR_CAST:
		snprintf(name, sizeof name, "n%u", n->arg[0]);
		put_convert(t, n->type, g->node[n->arg[0]].type, name);
		break;
	default:
		if (n->type != KERNELS_EXPR_F64)
			put(t, "gq_round(%s, ", type_macro(n->type));
		put(t, "gq_op(%s, ", op_macro[n->op]);
		for (unsigned a = 0; a < 3; a++)
			put_operand(t, g, n, a);
		put(t, n->type != KERNELS_EXPR_F64 ? "))" : ")");
		break;
	}
	put(t, ";\n");
}

static bool var_loaded_full(const chain_prog *g, unsigned v)
{
	return (g->var_flags[v] & KERNELS_EXPR_LOAD) && !var_bcast(g, v);
}

/* The raw registers of loaded full variables, and the broadcast ones' values. */
static void put_storage(struct text *t, const chain_prog *g)
{
	put(t, "\tstruct regs {\n");
	for (unsigned v = 0; v < g->nvars; v++)
		if (var_loaded_full(g, v))
			put(t, "\t\tgq_io<%s>::raw v%u;\n", type_macro(g->var_dtype[v]), v);
	put(t, "\t};\n\tstruct bcast {\n");
	for (unsigned v = 0; v < g->nvars; v++)
		if (var_bcast(g, v))
			put(t, "\t\t%s v%u;\n", ctype(g->var_dtype[v]), v);
	put(t, "\t};\n");
	put(t, "\tstatic __device__ __forceinline__ void load_bcast(const kernels_expr &p, bcast &b)\n"
	       "\t{\n\t\t(void)p;\n\t\t(void)b;\n");
	for (unsigned v = 0; v < g->nvars; v++)
		if (var_bcast(g, v))
			put(t, "\t\tb.v%u = gq_io<%s>::ld1(p.var[%u], 0);\n", v, type_macro(g->var_dtype[v]), v);
	put(t, "\t}\n");
	put(t, "\tstatic __device__ __forceinline__ void load_item(const kernels_expr &p, gq_u64 item, "
	       "regs &r)\n\t{\n\t\t(void)p;\n\t\t(void)item;\n\t\t(void)r;\n");
	for (unsigned v = 0; v < g->nvars; v++)
		if (var_loaded_full(g, v))
			put(t, "\t\tr.v%u = gq_io<%s>::ld4(p.var[%u], item);\n", v,
			    type_macro(g->var_dtype[v]), v);
	put(t, "\t}\n\tstatic __device__ __forceinline__ void load(const kernels_expr &p, gq_u64 item, "
	       "gq_u64 nitems, regs &r)\n\t{\n\t\tr = regs();\n\t\tif (item < nitems)\n"
	       "\t\t\tload_item(p, item, r);\n\t}\n");
}

/* "float (&v0)[N], const double v1": each variable's N elements, a broadcast one's value. */
static void put_params(struct text *t, const chain_prog *g)
{
	for (unsigned v = 0; v < g->nvars; v++)
		put(t, var_bcast(g, v) ? ", const %s v%u" : ", %s (&v%u)[N]", ctype(g->var_dtype[v]), v);
}

/* ", x0, b.v1": the arrays and broadcast values a call of elem passes. */
static void put_args(struct text *t, const chain_prog *g)
{
	for (unsigned v = 0; v < g->nvars; v++)
		put(t, var_bcast(g, v) ? ", b.v%u" : ", x%u", v);
}

/*
 * The statements, repeat times, on N elements: the repeat loop outside the
 * elements', so that the elements' arithmetic interleaves (what the
 * interpreted chain kernel does by applying each op to all its values).
 */
static void put_run_elem(struct text *t, const chain_prog *g)
{
	put(t, "\ttemplate <int N>\n\tstatic __device__ __forceinline__ void elem(const kernels_expr &p");
	put_params(t, g);
	put(t, ")\n\t{\n\t\tfor (gq_u64 rep = 0; rep < p.repeat; rep++) {\n#pragma unroll\n"
	       "\t\tfor (int e = 0; e < N; e++) {\n");
	unsigned n = 0;
	for (unsigned s = 0; s < g->nstmts; s++) {
		unsigned var = g->stmt_var[s], root = g->stmt_node[s];
		char name[16];
		put(t, "\t\t{\n");
		for (; n <= root; n++)
			put_node(t, g, n);
		put(t, "\t\t\tv%u[e] = ", var);
		snprintf(name, sizeof name, "n%u", root);
		put_convert(t, g->var_dtype[var], g->node[root].type, name);
		put(t, ";\n\t\t}\n");
	}
	put(t, "\t\t}\n\t\t}\n\t}\n");
}

/* Each full variable's n elements: from raw registers (r0, r1), loaded at i (n == 1), or zeros. */
static void put_locals(struct text *t, const chain_prog *g, unsigned n)
{
	for (unsigned v = 0; v < g->nvars; v++) {
		const char *c = ctype(g->var_dtype[v]), *tm = type_macro(g->var_dtype[v]);
		if (var_bcast(g, v))
			continue;
		if (!var_loaded_full(g, v))
			put(t, "\t\t%s x%u[%u] = {};\n", c, v, n);
		else if (n == 1)
			put(t, "\t\t%s x%u[1] = { gq_io<%s>::ld1(p.var[%u], i) };\n", c, v, tm, v);
		else
			put(t, "\t\t%s x%u[%u];\n\t\tgq_io<%s>::cvt4(r0.v%u, x%u);\n", c, v, n, tm, v, v);
		if (n == 8 && var_loaded_full(g, v))
			put(t, "\t\tgq_io<%s>::cvt4(r1.v%u, x%u + 4);\n", tm, v, v);
	}
}

static void put_stores(struct text *t, const chain_prog *g, unsigned n)
{
	for (unsigned v = 0; v < g->nvars; v++) {
		if (!(g->var_flags[v] & KERNELS_EXPR_STORE))
			continue;
		const char *tm = type_macro(g->var_dtype[v]);
		if (n == 1) {
			put(t, "\t\tgq_io<%s>::st1(p.store[%u], i, x%u[0]);\n", tm, v, v);
			continue;
		}
		put(t, "\t\tgq_io<%s>::st4(p.store[%u], i0, x%u);\n", tm, v, v);
		put(t, "\t\tif (has1)\n\t\t\tgq_io<%s>::st4(p.store[%u], i1, x%u + 4);\n", tm, v, v);
	}
}

static void put_run(struct text *t, const chain_prog *g)
{
	put_run_elem(t, g);
	put(t, "\tstatic __device__ __forceinline__ void items(const kernels_expr &p, gq_u64 i0, "
	       "const regs &r0, gq_u64 i1, const regs &r1, bool has1, const bcast &b)\n"
	       "\t{\n\t\t(void)r0;\n\t\t(void)r1;\n\t\t(void)b;\n");
	put_locals(t, g, 8);
	put(t, "\t\telem<8>(p");
	put_args(t, g);
	put(t, ");\n");
	put_stores(t, g, 8);
	put(t, "\t}\n\tstatic __device__ __forceinline__ void one(const kernels_expr &p, gq_u64 i, "
	       "const bcast &b)\n\t{\n\t\t(void)b;\n");
	put_locals(t, g, 1);
	put(t, "\t\telem<1>(p");
	put_args(t, g);
	put(t, ");\n");
	put_stores(t, g, 1);
	put(t, "\t}\n};\n\nextern \"C\" __global__ void __launch_bounds__(KERNELS_REDUCE_THREADS)\n"
	       "gq_run(const __grid_constant__ kernels_expr p)\n{\n\tgq_elementwise<G>(p);\n}\n");
}

/* The reduced values of N elements: the root's, or for dot the two roots' product in double. */
static void put_reduce(struct text *t, const chain_prog *g)
{
	unsigned a = g->reduce_arg[0], b = g->reduce_arg[1];
	put(t, "\ttemplate <int N>\n\tstatic __device__ __forceinline__ void elem(const kernels_expr &p");
	put_params(t, g);
	put(t, ", double (&out)[N])\n\t{\n\t\t(void)p;\n#pragma unroll\n"
	       "\t\tfor (int e = 0; e < N; e++) {\n");
	for (unsigned n = 0; n < g->nnodes; n++)
		put_node(t, g, n);
	if (g->reduce == KERNELS_REDUCE_DOT)
		put(t, "\t\t\tout[e] = __dmul_rn((double)n%u, (double)n%u);\n", a, b);
	else
		put(t, "\t\t\tout[e] = (double)n%u;\n", a);
	put(t, "\t\t}\n\t}\n");
	put(t, "\tstatic __device__ __forceinline__ void values(const kernels_expr &p, gq_u64 it, "
	       "const regs &r0, const bcast &b, double *v)\n\t{\n\t\t(void)it;\n\t\t(void)r0;\n"
	       "\t\t(void)b;\n\t\tdouble out[4];\n");
	put_locals(t, g, 4);
	put(t, "\t\telem<4>(p");
	put_args(t, g);
	put(t, ", out);\n\t\tfor (int e = 0; e < 4; e++)\n\t\t\tv[e] = out[e];\n\t}\n"
	       "\tstatic __device__ __forceinline__ double value1(const kernels_expr &p, gq_u64 i, "
	       "const bcast &b)\n\t{\n\t\t(void)b;\n\t\tdouble out[1];\n");
	put_locals(t, g, 1);
	put(t, "\t\telem<1>(p");
	put_args(t, g);
	put(t, ", out);\n\t\treturn out[0];\n\t}\n};\n\n"
	       "extern \"C\" __global__ void __launch_bounds__(KERNELS_REDUCE_THREADS)\n"
	       "gq_reduce(const __grid_constant__ kernels_expr p, kernels_partial *out)\n{\n"
	       "\tgq_reduce_tiles<G, %u>(p, out);\n}\n", g->reduce);
}

char *chain_codegen_source(const chain_prog *prog)
{
	struct text t = { NULL, 0, 0, false };
	put(&t, "// A gpuq expression kernel, generated (workers/chain/chain_codegen.c).\n"
		"#include \"kernels/chain_ops.cuh\"\n\nstruct G {\n");
	put_storage(&t, prog);
	if (prog->reduce == KERNELS_REDUCE_NONE)
		put_run(&t, prog);
	else
		put_reduce(&t, prog);
	if (t.failed) {
		free(t.s);
		return NULL;
	}
	return t.s;
}
