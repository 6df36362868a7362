/*
 * Expression programs: types, equality, and the two-way mapping to op lists
 * (workers/chain/chain_prog.h). Pure functions; any thread.
 */
#include "workers/chain/chain_prog.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const reduce_names[KERNELS_REDUCE_KINDS] = {
	[KERNELS_REDUCE_NONE] = "none",
	[KERNELS_REDUCE_SUM] = "sum",
	[KERNELS_REDUCE_MIN] = "min",
	[KERNELS_REDUCE_MAX] = "max",
	[KERNELS_REDUCE_MEAN] = "mean",
	[KERNELS_REDUCE_NORM2] = "norm2",
	[KERNELS_REDUCE_DOT] = "dot",
	[KERNELS_REDUCE_COUNT_NONZERO] = "count_nonzero",
	[KERNELS_REDUCE_ARGMAX] = "argmax",
};

/* Constants each op takes in the op-list form (kernels/chain_abi.h's list). */
static const unsigned char op_consts[KERNELS_CHAIN_KINDS] = {
#define PROG_OP_CONSTS(name, str, nargs) nargs,
	KERNELS_CHAIN_OPS(PROG_OP_CONSTS)
#undef PROG_OP_CONSTS
};

unsigned chain_prog_reduce_find(const char *name, size_t len)
{
	for (unsigned k = 1; k < KERNELS_REDUCE_KINDS; k++)
		if (strlen(reduce_names[k]) == len && memcmp(reduce_names[k], name, len) == 0)
			return k;
	return KERNELS_REDUCE_NONE;
}

const char *chain_prog_reduce_name(unsigned kind)
{
	return kind < KERNELS_REDUCE_KINDS ? reduce_names[kind] : "?";
}

bool chain_prog_reduce_is_int(unsigned kind)
{
	return kind == KERNELS_REDUCE_COUNT_NONZERO || kind == KERNELS_REDUCE_ARGMAX;
}

bool chain_prog_is_float(unsigned type)
{
	return type == KERNELS_EXPR_F16 || type == KERNELS_EXPR_BF16 || type == KERNELS_EXPR_F32;
}

unsigned chain_prog_promote(unsigned a, unsigned b)
{
	if (a == 0 || a == b)
		return b;
	if (b == 0)
		return a;
	if (a == KERNELS_EXPR_F64 || b == KERNELS_EXPR_F64)
		return KERNELS_EXPR_F64;
	return KERNELS_EXPR_F32; /* f32 with f16 or bf16, or f16 with bf16 */
}

/* The used parts of two programs, field by field: padding and unused slots never count. */
bool chain_prog_equal(const chain_prog *a, const chain_prog *b)
{
	if (a->nvars != b->nvars || a->nnodes != b->nnodes || a->nconsts != b->nconsts ||
	    a->nstmts != b->nstmts || a->reduce != b->reduce)
		return false;
	if (memcmp(a->c, b->c, a->nconsts * sizeof a->c[0]) != 0 ||
	    memcmp(a->var_dtype, b->var_dtype, a->nvars) != 0 ||
	    memcmp(a->var_flags, b->var_flags, a->nvars) != 0 ||
	    memcmp(a->stmt_var, b->stmt_var, a->nstmts) != 0 ||
	    memcmp(a->stmt_node, b->stmt_node, a->nstmts * sizeof a->stmt_node[0]) != 0 ||
	    memcmp(a->reduce_arg, b->reduce_arg, sizeof a->reduce_arg) != 0)
		return false;
	for (unsigned n = 0; n < a->nnodes; n++) {
		const struct kernels_expr_node *x = &a->node[n], *y = &b->node[n];
		if (x->kind != y->kind || x->op != y->op || x->type != y->type ||
		    x->nargs != y->nargs || memcmp(x->arg, y->arg, x->nargs * sizeof x->arg[0]) != 0)
			return false;
	}
	return true;
}

static unsigned prog_node(chain_prog *p, unsigned kind, unsigned op, unsigned type)
{
	struct kernels_expr_node *n = &p->node[p->nnodes];
	memset(n, 0, sizeof *n);
	n->kind = (unsigned char)kind;
	n->op = (unsigned char)op;
	n->type = (unsigned char)type;
	return p->nnodes++;
}

static unsigned prog_const(chain_prog *p, double v, unsigned type)
{
	unsigned n = prog_node(p, KERNELS_EXPR_CONST, 0, type);
	p->node[n].nargs = 1;
	p->node[n].arg[0] = p->nconsts;
	p->c[p->nconsts++] = v;
	return n;
}

void chain_prog_from_ops(chain_prog *p, const struct kernels_chain_op *ops, unsigned nops,
			 enum gpuq_dtype dtype)
{
	memset(p, 0, sizeof *p);
	unsigned t = (unsigned)dtype;
	p->nvars = 1;
	p->var_dtype[0] = (unsigned char)t;
	p->var_flags[0] = KERNELS_EXPR_LOAD | KERNELS_EXPR_STORE;
	unsigned x = prog_node(p, KERNELS_EXPR_VAR, 0, t);
	p->node[x].nargs = 1;
	for (unsigned i = 0; i < nops; i++) {
		unsigned k = ops[i].kind, nc = op_consts[k], args[3] = { x, x, x };
		if (nc >= 1)
			args[1] = prog_const(p, ops[i].a, t);
		if (nc >= 2)
			args[2] = prog_const(p, ops[i].b, t);
		x = prog_node(p, KERNELS_EXPR_OP, k, t);
		p->node[x].nargs = (unsigned char)(1 + nc);
		for (unsigned a = 0; a <= nc; a++)
			p->node[x].arg[a] = (unsigned short)args[a];
	}
	p->nstmts = 1;
	p->stmt_var[0] = 0;
	p->stmt_node[0] = (unsigned short)x;
}

/* Operand a of node n is a constant of the node's type: its value in *v. */
static bool const_arg(const chain_prog *p, const struct kernels_expr_node *n, unsigned a, double *v)
{
	const struct kernels_expr_node *c = &p->node[n->arg[a]];
	if (c->kind != KERNELS_EXPR_CONST || c->type != n->type)
		return false;
	*v = p->c[c->arg[0]];
	return true;
}

/*
 * Node n as one op of the list, with its chained operand in *from; x + 2
 * and 2 * x both read as "add 2", "mul 2" (IEEE add and mul commute), but
 * 2 - x has no op-list form.
 */
static bool as_op(const chain_prog *p, unsigned n, struct kernels_chain_op *op, unsigned *from)
{
	const struct kernels_expr_node *nd = &p->node[n];
	if (nd->kind != KERNELS_EXPR_OP || nd->nargs != 1 + op_consts[nd->op])
		return false;
	unsigned chained = 0;
	double a = 0, b = 0;
	if (nd->nargs == 2 && (nd->op == KERNELS_CHAIN_ADD || nd->op == KERNELS_CHAIN_MUL) &&
	    const_arg(p, nd, 0, &a))
		chained = 1;
	else if ((nd->nargs >= 2 && !const_arg(p, nd, 1, &a)) ||
		 (nd->nargs == 3 && !const_arg(p, nd, 2, &b)))
		return false;
	if (p->node[nd->arg[chained]].type != nd->type)
		return false;
	op->kind = nd->op;
	op->a = a;
	op->b = b;
	*from = nd->arg[chained];
	return true;
}

bool chain_prog_as_ops(const chain_prog *p, struct kernels_chain_op *ops, unsigned *nops,
		       unsigned *var)
{
	if (p->reduce != KERNELS_REDUCE_NONE || p->nstmts != 1)
		return false;
	unsigned out = p->stmt_var[0], n = p->stmt_node[0], count = 0;
	struct kernels_chain_op rev[KERNELS_CHAIN_MAX_OPS];
	while (p->node[n].kind == KERNELS_EXPR_OP) {
		if (count == KERNELS_CHAIN_MAX_OPS || !as_op(p, n, &rev[count], &n))
			return false;
		count++;
	}
	const struct kernels_expr_node *leaf = &p->node[n];
	if (count == 0 || leaf->kind != KERNELS_EXPR_VAR)
		return false;
	if (leaf->arg[0] != out || leaf->type != p->var_dtype[out] ||
	    (p->var_flags[out] & KERNELS_EXPR_BCAST))
		return false;
	for (unsigned i = 0; i < count; i++)
		ops[i] = rev[count - 1 - i];
	*nops = count;
	*var = out;
	return true;
}

uint64_t chain_prog_bytes(const chain_prog *p, uint64_t count)
{
	uint64_t per = 0;
	for (unsigned v = 0; v < p->nvars; v++) {
		if (p->var_flags[v] & KERNELS_EXPR_BCAST)
			continue;
		unsigned uses = !!(p->var_flags[v] & KERNELS_EXPR_LOAD) +
				!!(p->var_flags[v] & KERNELS_EXPR_STORE);
		per += uses * gpuq_dtype_size((enum gpuq_dtype)p->var_dtype[v]);
	}
	return per * count;
}

static int check_fail(unsigned *at, unsigned node, char *why, size_t n, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

static int check_fail(unsigned *at, unsigned node, char *why, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, n, fmt, ap);
	va_end(ap);
	*at = node;
	return -1;
}

static bool valid_type(unsigned t)
{
	return t == KERNELS_EXPR_F16 || t == KERNELS_EXPR_BF16 || t == KERNELS_EXPR_F32 ||
	       t == KERNELS_EXPR_F64;
}

static int check_vars(const chain_prog *p, unsigned *at, char *why, size_t n)
{
	unsigned loads = 0, stores = 0;
	for (unsigned v = 0; v < p->nvars; v++) {
		unsigned f = p->var_flags[v];
		if (!valid_type(p->var_dtype[v]))
			return check_fail(at, p->nnodes, why, n, "variable %u has dtype %u", v, p->var_dtype[v]);
		if ((f & KERNELS_EXPR_STORE) && (f & KERNELS_EXPR_BCAST))
			return check_fail(at, p->nnodes, why, n, "variable %u is broadcast and written", v);
		loads += !!(f & KERNELS_EXPR_LOAD);
		stores += !!(f & KERNELS_EXPR_STORE);
	}
	if (loads > KERNELS_EXPR_MAX_INPUTS || stores > KERNELS_EXPR_MAX_OUTPUTS)
		return check_fail(at, p->nnodes, why, n, "%u inputs and %u outputs", loads, stores);
	return 0;
}

/* One node's own fields; *assigned holds the variables assigned so far. */
static int check_node(const chain_prog *p, unsigned i, unsigned assigned, unsigned *at, char *why,
		      size_t n)
{
	const struct kernels_expr_node *nd = &p->node[i];
	if (!valid_type(nd->type))
		return check_fail(at, i, why, n, "node %u has type %u", i, nd->type);
	switch (nd->kind) {
	case KERNELS_EXPR_VAR:
		if (nd->nargs != 1 || nd->arg[0] >= p->nvars || nd->type != p->var_dtype[nd->arg[0]] ||
		    (!(p->var_flags[nd->arg[0]] & KERNELS_EXPR_LOAD) && !(assigned & 1u << nd->arg[0])))
			return check_fail(at, i, why, n, "node %u reads variable %u, which holds no value",
					  i, nd->arg[0]);
		return 0;
	case KERNELS_EXPR_CONST:
		return nd->nargs == 1 && nd->arg[0] < p->nconsts
			       ? 0 : check_fail(at, i, why, n, "node %u: no constant %u", i, nd->arg[0]);
	case KERNELS_EXPR_CAST: return nd->nargs == 1 ? 0 : check_fail(at, i, why, n, "cast %u", i);
	case KERNELS_EXPR_OP:
		if (nd->op >= KERNELS_CHAIN_KINDS || nd->nargs != 1 + op_consts[nd->op])
			return check_fail(at, i, why, n, "node %u: op %u with %u operands", i, nd->op,
					  nd->nargs);
		for (unsigned a = 0; a < nd->nargs; a++)
			if (chain_prog_is_float(nd->type) && p->node[nd->arg[a]].type == KERNELS_EXPR_F64)
				return check_fail(at, i, why, n, "node %u computes in float from f64", i);
		return 0;
	}
	return check_fail(at, i, why, n, "node %u has kind %u", i, nd->kind);
}

/* The operand stack as an interpreter keeps it: each node's operands are its top entries. */
static int check_stack(const chain_prog *p, unsigned *at, char *why, size_t n)
{
	unsigned short stack[KERNELS_EXPR_MAX_DEPTH];
	unsigned depth = 0, s = 0, assigned = 0;
	for (unsigned i = 0; i < p->nnodes; i++) {
		const struct kernels_expr_node *nd = &p->node[i];
		if (check_node(p, i, assigned, at, why, n) < 0)
			return -1;
		unsigned operands = nd->kind == KERNELS_EXPR_OP || nd->kind == KERNELS_EXPR_CAST ? nd->nargs : 0;
		if (operands > depth)
			return check_fail(at, i, why, n, "node %u has %u operands on a stack of %u", i,
					  operands, depth);
		for (unsigned a = 0; a < operands; a++)
			if (nd->arg[a] != stack[depth - operands + a])
				return check_fail(at, i, why, n, "node %u's operands are not in post-order", i);
		depth -= operands;
		if (depth == KERNELS_EXPR_MAX_DEPTH)
			return check_fail(at, i, why, n, "more than %d values pending", KERNELS_EXPR_MAX_DEPTH);
		stack[depth++] = (unsigned short)i;
		if (s < p->nstmts && p->stmt_node[s] == i) {
			if (depth != 1 || p->stmt_var[s] >= p->nvars)
				return check_fail(at, i, why, n, "statement %u leaves %u values", s, depth);
			assigned |= 1u << p->stmt_var[s++];
			depth = 0;
		}
	}
	bool dot = p->reduce == KERNELS_REDUCE_DOT;
	if (p->reduce == KERNELS_REDUCE_NONE ? depth != 0 || s != p->nstmts
	    : depth != 1u + dot || stack[0] != p->reduce_arg[0] || stack[depth - 1] != p->reduce_arg[1])
		return check_fail(at, p->nnodes, why, n, "the statements or the reduction do not "
				  "cover the nodes");
	return 0;
}

int chain_prog_check(const chain_prog *p, unsigned *at, char *why, size_t n)
{
	*at = p->nnodes;
	if (p->nvars > KERNELS_EXPR_MAX_VARS || p->nnodes < 1 || p->nnodes > KERNELS_EXPR_MAX_NODES ||
	    p->nconsts > KERNELS_EXPR_MAX_CONSTS || p->nstmts > KERNELS_EXPR_MAX_OUTPUTS ||
	    p->reduce >= KERNELS_REDUCE_KINDS || (p->reduce == KERNELS_REDUCE_NONE) != (p->nstmts > 0))
		return check_fail(at, p->nnodes, why, n, "%u variables, %u nodes, %u constants, "
				  "%u statements, reduction %u", p->nvars, p->nnodes, p->nconsts,
				  p->nstmts, p->reduce);
	if (check_vars(p, at, why, n) < 0)
		return -1;
	return check_stack(p, at, why, n);
}
