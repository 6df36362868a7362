/*
 * The expression language: a lexer, a recursive-descent parser that builds
 * the program's nodes in evaluation order (an operand before the node that
 * uses it), and the binder that checks the variables against their buffers
 * and types every node (workers/chain/chain_expr.h, workers/chain/chain_prog.h). Pure
 * functions; any thread.
 */
#include "workers/chain/chain_expr.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum tok_kind {
	TOK_END, TOK_NUM, TOK_NAME, TOK_LPAREN, TOK_RPAREN, TOK_COMMA, TOK_SEMI, TOK_EQ,
	TOK_PLUS, TOK_MINUS, TOK_STAR, TOK_SLASH,
};

struct token {
	enum tok_kind kind;
	unsigned col;
	double num;
	bool quoted; /* `name` */
	char name[CHAIN_EXPR_NAME_MAX + 1];
	int device;
};

struct parser {
	const char *s;
	size_t pos;
	struct token tok;
	struct chain_expr *x;
	struct chain_expr_error *e;
	unsigned nloaded, nstored;
};

static int fail_at(struct chain_expr_error *e, unsigned col, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail_at(struct chain_expr_error *e, unsigned col, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	e->col = col;
	vsnprintf(e->msg, sizeof e->msg, fmt, ap);
	va_end(ap);
	return -1;
}

/* ---- Lexer ---- */

static bool name_char(char c, bool first)
{
	return isalpha((unsigned char)c) || c == '_' || (!first && (isdigit((unsigned char)c) || c == '.'));
}

/* A buffer name's rule (daemon/buffer.h): A-Z a-z 0-9 _ . -, not starting with . or -. */
static bool buffer_name_ok(const char *n)
{
	if (!*n || *n == '.' || *n == '-')
		return false;
	for (; *n; n++)
		if (!isalnum((unsigned char)*n) && *n != '_' && *n != '.' && *n != '-')
			return false;
	return true;
}

/* The optional @GPU after a name. */
static int lex_device(struct parser *p, struct token *t)
{
	t->device = -1;
	if (p->s[p->pos] != '@')
		return 0;
	size_t at = p->pos++;
	if (!isdigit((unsigned char)p->s[p->pos]))
		return fail_at(p->e, (unsigned)at + 1, "'@' after '%s' needs a GPU number, as in %s@1",
			       t->name, t->name);
	long d = 0;
	while (isdigit((unsigned char)p->s[p->pos]) && d < 100000)
		d = d * 10 + (p->s[p->pos++] - '0');
	t->device = (int)d;
	return 0;
}

static int lex_name(struct parser *p, struct token *t)
{
	size_t start = p->pos, len;
	if (p->s[p->pos] == '`') {
		const char *close = strchr(p->s + p->pos + 1, '`');
		if (!close)
			return fail_at(p->e, t->col, "this name has no closing '`'");
		start = p->pos + 1;
		len = (size_t)(close - (p->s + start));
		p->pos = (size_t)(close - p->s) + 1;
		t->quoted = true;
	} else {
		while (name_char(p->s[p->pos], p->pos == start))
			p->pos++;
		len = p->pos - start;
	}
	if (len == 0 || len > CHAIN_EXPR_NAME_MAX)
		return fail_at(p->e, t->col, "a buffer name has 1 to %d characters, not %zu",
			       CHAIN_EXPR_NAME_MAX, len);
	memcpy(t->name, p->s + start, len);
	t->name[len] = '\0';
	if (!buffer_name_ok(t->name))
		return fail_at(p->e, t->col,
			       "'%s' is not a buffer name (A-Z a-z 0-9 _ . -, not starting with . or -)",
			       t->name);
	t->kind = TOK_NAME;
	return lex_device(p, t);
}

static int lex_number(struct parser *p, struct token *t)
{
	char *end;
	errno = 0;
	t->num = strtod(p->s + p->pos, &end);
	if (end == p->s + p->pos)
		return fail_at(p->e, t->col, "expected a number");
	if (!isfinite(t->num))
		return fail_at(p->e, t->col, "%.*s is not a finite number",
			       (int)(end - (p->s + p->pos)), p->s + p->pos);
	p->pos = (size_t)(end - p->s);
	if (name_char(p->s[p->pos], true))
		return fail_at(p->e, (unsigned)p->pos + 1, "a number runs into a name here; "
			       "write '2 * x', not '2x'");
	t->kind = TOK_NUM;
	return 0;
}

static const struct {
	char c;
	enum tok_kind kind;
} punct[] = {
	{ '(', TOK_LPAREN }, { ')', TOK_RPAREN }, { ',', TOK_COMMA }, { ';', TOK_SEMI },
	{ '=', TOK_EQ },     { '+', TOK_PLUS },   { '-', TOK_MINUS }, { '*', TOK_STAR },
	{ '/', TOK_SLASH },
};

/* Reads the next token into p->tok. */
static int lex(struct parser *p)
{
	struct token *t = &p->tok;
	while (isspace((unsigned char)p->s[p->pos]))
		p->pos++;
	memset(t, 0, sizeof *t);
	t->col = (unsigned)p->pos + 1;
	char c = p->s[p->pos];
	if (c == '\0') {
		t->kind = TOK_END;
		return 0;
	}
	if (isdigit((unsigned char)c) || (c == '.' && isdigit((unsigned char)p->s[p->pos + 1])))
		return lex_number(p, t);
	if (name_char(c, true) || c == '`')
		return lex_name(p, t);
	for (size_t i = 0; i < sizeof punct / sizeof punct[0]; i++) {
		if (punct[i].c == c) {
			t->kind = punct[i].kind;
			p->pos++;
			return 0;
		}
	}
	if (c == '|')
		return fail_at(p->e, t->col, "'|' belongs to the op-list form, which names its buffer "
			       "apart: gpuq run BUF 'sin | add 1' (or write x = add(sin(x), 1))");
	return fail_at(p->e, t->col, "unexpected '%c'", c);
}

static int expect(struct parser *p, enum tok_kind kind, const char *what)
{
	if (p->tok.kind != kind)
		return fail_at(p->e, p->tok.col, "expected %s", what);
	return lex(p);
}

/* ---- Nodes and variables ---- */

static int new_node(struct parser *p, unsigned col, unsigned kind, unsigned op, unsigned *out)
{
	chain_prog *g = &p->x->prog;
	if (g->nnodes >= KERNELS_EXPR_MAX_NODES)
		return fail_at(p->e, col, "the expression is too long: at most %d values and operations",
			       KERNELS_EXPR_MAX_NODES);
	struct kernels_expr_node *n = &g->node[g->nnodes];
	memset(n, 0, sizeof *n);
	n->kind = (unsigned char)kind;
	n->op = (unsigned char)op;
	p->x->node_col[g->nnodes] = (unsigned short)(col > 65535 ? 65535 : col);
	*out = g->nnodes++;
	return 0;
}

static int new_const(struct parser *p, unsigned col, double v, unsigned *out)
{
	chain_prog *g = &p->x->prog;
	if (g->nconsts >= KERNELS_EXPR_MAX_CONSTS)
		return fail_at(p->e, col, "the expression has more than %d numbers",
			       KERNELS_EXPR_MAX_CONSTS);
	if (new_node(p, col, KERNELS_EXPR_CONST, 0, out) < 0)
		return -1;
	g->node[*out].nargs = 1;
	g->node[*out].arg[0] = g->nconsts;
	g->c[g->nconsts++] = v;
	return 0;
}

/* The variable a NAME token names, added at its first appearance. */
static int find_var(struct parser *p, const struct token *t, unsigned *out)
{
	struct chain_expr *x = p->x;
	for (unsigned v = 0; v < x->nvars; v++) {
		if (strcmp(x->vars[v].name, t->name) == 0 && x->vars[v].device == t->device) {
			*out = v;
			return 0;
		}
	}
	if (x->nvars >= KERNELS_EXPR_MAX_VARS)
		return fail_at(p->e, t->col, "too many buffers: an expression names at most %d",
			       KERNELS_EXPR_MAX_VARS);
	struct chain_expr_var *v = &x->vars[x->nvars];
	memset(v, 0, sizeof *v);
	snprintf(v->name, sizeof v->name, "%s", t->name);
	v->device = t->device;
	v->col = t->col;
	*out = x->nvars++;
	x->prog.nvars = (unsigned char)x->nvars;
	return 0;
}

/* A variable read: an input, unless a statement before this one assigned it. */
static int var_ref(struct parser *p, const struct token *t, unsigned *node)
{
	unsigned v;
	if (find_var(p, t, &v) < 0 || new_node(p, t->col, KERNELS_EXPR_VAR, 0, node) < 0)
		return -1;
	p->x->prog.node[*node].nargs = 1;
	p->x->prog.node[*node].arg[0] = (unsigned short)v;
	struct chain_expr_var *var = &p->x->vars[v];
	if (!var->stored && !var->loaded) {
		if (p->nloaded == KERNELS_EXPR_MAX_INPUTS)
			return fail_at(p->e, t->col, "too many inputs: an expression reads at most %d "
				       "buffers ('%s' would be the %dth)",
				       KERNELS_EXPR_MAX_INPUTS, t->name, KERNELS_EXPR_MAX_INPUTS + 1);
		var->loaded = true;
		p->nloaded++;
	}
	return 0;
}

/* ---- Functions ---- */

enum fn_class { FN_NONE, FN_OP, FN_CAST, FN_REDUCE };

static const struct {
	const char *name;
	unsigned arity;
} op_fns[KERNELS_CHAIN_KINDS] = {
#define EXPR_OP_FN(name, str, nargs) { str, 1 + nargs },
	KERNELS_CHAIN_OPS(EXPR_OP_FN)
#undef EXPR_OP_FN
};

static const struct {
	const char *name;
	unsigned type;
} cast_fns[] = {
	{ "f16", KERNELS_EXPR_F16 }, { "bf16", KERNELS_EXPR_BF16 },
	{ "f32", KERNELS_EXPR_F32 }, { "f64", KERNELS_EXPR_F64 },
};

/*
 * What a call of name with nargs arguments is: min and max of one argument
 * are the reductions, of two the elementwise ops. *what is the op, the
 * cast's type or the reduction; *arity what it takes.
 */
static enum fn_class fn_lookup(const char *name, unsigned nargs, unsigned *what, unsigned *arity)
{
	unsigned r = chain_prog_reduce_find(name, strlen(name));
	bool minmax = r == KERNELS_REDUCE_MIN || r == KERNELS_REDUCE_MAX;
	if (r != KERNELS_REDUCE_NONE && (!minmax || nargs == 1)) {
		*what = r;
		*arity = r == KERNELS_REDUCE_DOT ? 2 : 1;
		return FN_REDUCE;
	}
	for (unsigned k = 0; k < KERNELS_CHAIN_KINDS; k++) {
		if (strcmp(op_fns[k].name, name) == 0) {
			*what = k;
			*arity = op_fns[k].arity;
			return FN_OP;
		}
	}
	for (size_t i = 0; i < sizeof cast_fns / sizeof cast_fns[0]; i++) {
		if (strcmp(cast_fns[i].name, name) == 0) {
			*what = cast_fns[i].type;
			*arity = 1;
			return FN_CAST;
		}
	}
	return FN_NONE;
}

static int parse_expr(struct parser *p, unsigned *node);

/* The arguments of a call, from after '(' through ')'. */
static int parse_args(struct parser *p, const struct token *fn, unsigned *args, unsigned *nargs)
{
	*nargs = 0;
	if (p->tok.kind == TOK_RPAREN)
		return lex(p);
	for (;;) {
		if (*nargs == 3)
			return fail_at(p->e, p->tok.col, "%s() takes at most 3 arguments", fn->name);
		if (parse_expr(p, &args[(*nargs)++]) < 0)
			return -1;
		if (p->tok.kind == TOK_RPAREN)
			return lex(p);
		if (expect(p, TOK_COMMA, "',' or ')'") < 0)
			return -1;
	}
}

static int call_fail_unknown(struct parser *p, const struct token *fn)
{
	char list[512];
	size_t used = 0;
	for (unsigned k = 0; k < KERNELS_CHAIN_KINDS && used < sizeof list; k++)
		used += (size_t)snprintf(list + used, sizeof list - used, "%s ", op_fns[k].name);
	return fail_at(p->e, fn->col, "unknown function '%s' (functions: %sf16 bf16 f32 f64; "
		       "reductions: sum min max mean norm2 dot count_nonzero argmax)",
		       fn->name, list);
}

/* name(args...): the '(' is the current token. */
static int parse_call(struct parser *p, const struct token *fn, unsigned *node)
{
	unsigned args[3], nargs, what, arity;
	if (fn->quoted || fn->device >= 0)
		return fail_at(p->e, fn->col, "'%s%s' is a buffer, not a function", fn->name,
			       fn->device >= 0 ? "@..." : "");
	if (lex(p) < 0 || parse_args(p, fn, args, &nargs) < 0)
		return -1;
	enum fn_class cls = fn_lookup(fn->name, nargs, &what, &arity);
	if (cls == FN_NONE)
		return call_fail_unknown(p, fn);
	if (cls == FN_REDUCE)
		return fail_at(p->e, fn->col,
			       "%s() reduces a whole buffer to one number: it can only be the "
			       "outermost call of a reduce expression, as in gpuq reduce 'sum(abs(x - y))'",
			       fn->name);
	if (nargs != arity)
		return fail_at(p->e, fn->col, "%s() takes %u argument%s, not %u", fn->name, arity,
			       arity == 1 ? "" : "s", nargs);
	if (new_node(p, fn->col, cls == FN_OP ? KERNELS_EXPR_OP : KERNELS_EXPR_CAST,
		     cls == FN_OP ? what : 0, node) < 0)
		return -1;
	struct kernels_expr_node *n = &p->x->prog.node[*node];
	if (cls == FN_CAST)
		n->type = (unsigned char)what; /* fixed: binding never changes it */
	n->nargs = (unsigned char)nargs;
	for (unsigned a = 0; a < nargs; a++)
		n->arg[a] = (unsigned short)args[a];
	return 0;
}

/* ---- Expressions ---- */

static int parse_unary(struct parser *p, unsigned *node);

static int parse_primary(struct parser *p, unsigned *node)
{
	struct token t = p->tok;
	switch (t.kind) {
	case TOK_NUM:
		return new_const(p, t.col, t.num, node) < 0 ? -1 : lex(p);
	case TOK_LPAREN:
		if (lex(p) < 0 || parse_expr(p, node) < 0)
			return -1;
		return expect(p, TOK_RPAREN, "')'");
	case TOK_NAME:
		if (lex(p) < 0)
			return -1;
		if (p->tok.kind == TOK_LPAREN)
			return parse_call(p, &t, node);
		return var_ref(p, &t, node);
	case TOK_END:
		return fail_at(p->e, t.col, "the expression ends where a value should be");
	default:
		return fail_at(p->e, t.col, "expected a number, a buffer, a call or '('");
	}
}

/* -x is neg(x); a minus before a number makes a negative constant. */
static int parse_unary(struct parser *p, unsigned *node)
{
	struct token t = p->tok;
	if (t.kind == TOK_PLUS)
		return lex(p) < 0 ? -1 : parse_unary(p, node);
	if (t.kind != TOK_MINUS)
		return parse_primary(p, node);
	if (lex(p) < 0)
		return -1;
	if (p->tok.kind == TOK_NUM) {
		double v = -p->tok.num;
		return new_const(p, t.col, v, node) < 0 ? -1 : lex(p);
	}
	unsigned x;
	if (parse_unary(p, &x) < 0 || new_node(p, t.col, KERNELS_EXPR_OP, KERNELS_CHAIN_NEG, node) < 0)
		return -1;
	p->x->prog.node[*node].nargs = 1;
	p->x->prog.node[*node].arg[0] = (unsigned short)x;
	return 0;
}

static int binary_node(struct parser *p, unsigned col, unsigned op, unsigned l, unsigned r,
		       unsigned *node)
{
	if (new_node(p, col, KERNELS_EXPR_OP, op, node) < 0)
		return -1;
	struct kernels_expr_node *n = &p->x->prog.node[*node];
	n->nargs = 2;
	n->arg[0] = (unsigned short)l;
	n->arg[1] = (unsigned short)r;
	return 0;
}

static int parse_term(struct parser *p, unsigned *node)
{
	if (parse_unary(p, node) < 0)
		return -1;
	while (p->tok.kind == TOK_STAR || p->tok.kind == TOK_SLASH) {
		struct token op = p->tok;
		unsigned r;
		if (lex(p) < 0 || parse_unary(p, &r) < 0 ||
		    binary_node(p, op.col, op.kind == TOK_STAR ? KERNELS_CHAIN_MUL : KERNELS_CHAIN_DIV,
				*node, r, node) < 0)
			return -1;
	}
	return 0;
}

static int parse_expr(struct parser *p, unsigned *node)
{
	if (parse_term(p, node) < 0)
		return -1;
	while (p->tok.kind == TOK_PLUS || p->tok.kind == TOK_MINUS) {
		struct token op = p->tok;
		unsigned r;
		if (lex(p) < 0 || parse_term(p, &r) < 0 ||
		    binary_node(p, op.col, op.kind == TOK_PLUS ? KERNELS_CHAIN_ADD : KERNELS_CHAIN_SUB,
				*node, r, node) < 0)
			return -1;
	}
	return 0;
}

/* ---- Statements and the top ---- */

static int parse_statement(struct parser *p)
{
	struct chain_expr *x = p->x;
	struct token target = p->tok;
	unsigned v, root;
	if (target.kind != TOK_NAME)
		return fail_at(p->e, target.col, "expected OUT = EXPRESSION, as in 'y = a * x + y'");
	if (lex(p) < 0)
		return -1;
	if (p->tok.kind != TOK_EQ)
		return fail_at(p->e, p->tok.col, p->tok.kind == TOK_LPAREN
				 ? "expected '=': a run assigns to a buffer (y = %s(...)); "
				   "reductions run with gpuq reduce"
				 : "expected '=' after the output '%s'", target.name);
	if (lex(p) < 0 || parse_expr(p, &root) < 0 || find_var(p, &target, &v) < 0)
		return -1;
	struct chain_expr_var *var = &x->vars[v];
	if (var->stored)
		return fail_at(p->e, target.col, "'%s' is assigned twice (columns %u and %u); "
			       "each output gets one statement", target.name, var->stored_col, target.col);
	if (p->nstored == KERNELS_EXPR_MAX_OUTPUTS)
		return fail_at(p->e, target.col, "too many outputs: an expression writes at most %d buffers",
			       KERNELS_EXPR_MAX_OUTPUTS);
	var->stored = true;
	var->stored_col = target.col;
	x->prog.stmt_var[p->nstored] = (unsigned char)v;
	x->prog.stmt_node[p->nstored] = (unsigned short)root;
	x->prog.nstmts = (unsigned char)++p->nstored;
	return 0;
}

static int parse_run(struct parser *p)
{
	for (;;) {
		if (parse_statement(p) < 0)
			return -1;
		if (p->tok.kind == TOK_END)
			return 0;
		if (p->tok.kind != TOK_SEMI)
			return fail_at(p->e, p->tok.col, "expected an operator, ';' or the end");
		if (lex(p) < 0)
			return -1;
		if (p->tok.kind == TOK_END)
			return 0;
	}
}

static int parse_reduce(struct parser *p)
{
	struct token fn = p->tok;
	unsigned args[3], nargs, what, arity;
	static const char usage[] = "a reduce expression is sum, min, max, mean, norm2, "
				    "count_nonzero or argmax of an expression, or dot(a, b), "
				    "as in 'sum(abs(x - y))'";
	if (fn.kind != TOK_NAME || lex(p) < 0)
		return fn.kind != TOK_NAME ? fail_at(p->e, fn.col, "%s", usage) : -1;
	if (p->tok.kind != TOK_LPAREN || fn.quoted || fn.device >= 0)
		return fail_at(p->e, fn.col, "%s", usage);
	if (lex(p) < 0 || parse_args(p, &fn, args, &nargs) < 0)
		return -1;
	if (fn_lookup(fn.name, nargs, &what, &arity) != FN_REDUCE)
		return fail_at(p->e, fn.col, "'%s' is not a reduction: %s", fn.name, usage);
	if (nargs != arity)
		return fail_at(p->e, fn.col, "%s() takes %u argument%s, not %u", fn.name, arity,
			       arity == 1 ? "" : "s", nargs);
	if (p->tok.kind != TOK_END)
		return fail_at(p->e, p->tok.col, "the reduction must be the whole expression: "
			       "nothing may follow %s(...)", fn.name);
	p->x->prog.reduce = (unsigned char)what;
	p->x->prog.reduce_arg[0] = (unsigned short)args[0];
	p->x->prog.reduce_arg[1] = (unsigned short)(nargs == 2 ? args[1] : args[0]);
	if (p->x->nvars == 0)
		return fail_at(p->e, fn.col, "the expression names no buffer: nothing to reduce");
	return 0;
}

int chain_expr_parse(const char *text, bool reduce, struct chain_expr *out,
		     struct chain_expr_error *e)
{
	struct parser p = { .s = text, .x = out, .e = e };
	memset(out, 0, sizeof *out);
	memset(e, 0, sizeof *e);
	out->reduce = reduce;
	size_t len = strlen(text);
	if (len == 0)
		return fail_at(e, 0, "the expression is empty");
	if (len > CHAIN_EXPR_TEXT_MAX)
		return fail_at(e, 0, "the expression is %zu bytes; at most %d", len, CHAIN_EXPR_TEXT_MAX);
	if (lex(&p) < 0)
		return -1;
	return reduce ? parse_reduce(&p) : parse_run(&p);
}

/* ---- Binding: devices, counts, dtypes, aliasing, then types ---- */

/* "y", or "y@0" as it was written. */
static const char *var_label(const struct chain_expr_var *v, char *buf, size_t n)
{
	if (v->device >= 0)
		snprintf(buf, n, "%s@%d", v->name, v->device);
	else
		snprintf(buf, n, "%s", v->name);
	return buf;
}

static int bind_check_var(const struct chain_expr *x, const struct chain_expr_binding *b,
			  unsigned v, struct chain_expr_error *e)
{
	char l1[CHAIN_EXPR_NAME_MAX + 16], l2[CHAIN_EXPR_NAME_MAX + 16];
	const struct chain_expr_var *var = &x->vars[v];
	if (!gpuq_dtype_is_float(b[v].dtype))
		return fail_at(e, var->col, "'%s' is %s; expressions run on f16, bf16, f32 and f64 buffers",
			       var->name, gpuq_dtype_name(b[v].dtype));
	for (unsigned w = 0; w < v; w++) {
		const struct chain_expr_var *o = &x->vars[w];
		if (b[w].device != b[v].device)
			return fail_at(e, var->col,
				       "'%s' is on gpu %d but '%s' (column %u) is on gpu %d; an "
				       "expression runs on one device", var->name, b[v].device,
				       o->name, o->col, b[w].device);
		if (b[w].id == b[v].id)
			return fail_at(e, var->col, "'%s' and '%s' (column %u) are the same buffer; "
				       "name it one way", var_label(var, l1, sizeof l1),
				       var_label(o, l2, sizeof l2), o->col);
	}
	return 0;
}

/* Every variable has the run's count, or one element and only read (broadcast). */
static int bind_counts(const struct chain_expr *x, const struct chain_expr_binding *b,
		       uint64_t *count, struct chain_expr_error *e)
{
	unsigned big = 0;
	for (unsigned v = 1; v < x->nvars; v++)
		if (b[v].count > b[big].count)
			big = v;
	*count = b[big].count;
	for (unsigned v = 0; v < x->nvars; v++) {
		const struct chain_expr_var *var = &x->vars[v];
		if (b[v].count != *count && b[v].count != 1)
			return fail_at(e, var->col,
				       "'%s' has %llu elements but '%s' (column %u) has %llu; variables "
				       "need the same count, or one element to broadcast",
				       var->name, (unsigned long long)b[v].count, x->vars[big].name,
				       x->vars[big].col, (unsigned long long)*count);
		if (var->stored && b[v].count != *count)
			return fail_at(e, var->stored_col,
				       "'%s' has 1 element but the expression covers %llu ('%s'); "
				       "an output needs them all", var->name,
				       (unsigned long long)*count, x->vars[big].name);
	}
	return 0;
}

static void bind_vars(struct chain_expr *x, const struct chain_expr_binding *b, uint64_t count)
{
	for (unsigned v = 0; v < x->nvars; v++) {
		const struct chain_expr_var *var = &x->vars[v];
		x->prog.var_dtype[v] = (unsigned char)b[v].dtype;
		x->prog.var_flags[v] = (unsigned char)((var->loaded ? KERNELS_EXPR_LOAD : 0) |
						       (var->stored ? KERNELS_EXPR_STORE : 0) |
						       (b[v].count == 1 && count > 1 ? KERNELS_EXPR_BCAST : 0));
	}
}

/*
 * Types, bottom-up (a variable's dtype, a cast's target, the promotion of
 * an op's operands; constants untyped), then top-down: what is still
 * untyped takes its parent's type, a statement's root its output's, a
 * reduction's f64. Every node has one parent, so one pass each way does.
 */
static void bind_types(chain_prog *g)
{
	unsigned char ctx[KERNELS_EXPR_MAX_NODES] = { 0 };
	for (unsigned n = 0; n < g->nnodes; n++) {
		struct kernels_expr_node *nd = &g->node[n];
		if (nd->kind == KERNELS_EXPR_VAR)
			nd->type = g->var_dtype[nd->arg[0]];
		else if (nd->kind == KERNELS_EXPR_CONST)
			nd->type = 0;
		else if (nd->kind == KERNELS_EXPR_OP)
			for (unsigned a = 0; a < nd->nargs; a++)
				nd->type = (unsigned char)chain_prog_promote(nd->type, g->node[nd->arg[a]].type);
	}
	for (unsigned s = 0; s < g->nstmts; s++)
		ctx[g->stmt_node[s]] = g->var_dtype[g->stmt_var[s]];
	if (g->reduce != KERNELS_REDUCE_NONE)
		ctx[g->reduce_arg[0]] = ctx[g->reduce_arg[1]] = KERNELS_EXPR_F64;
	for (unsigned n = g->nnodes; n-- > 0;) {
		struct kernels_expr_node *nd = &g->node[n];
		if (nd->type == 0)
			nd->type = ctx[n] ? ctx[n] : KERNELS_EXPR_F64;
		if (nd->kind == KERNELS_EXPR_OP || nd->kind == KERNELS_EXPR_CAST)
			for (unsigned a = 0; a < nd->nargs; a++)
				ctx[nd->arg[a]] = nd->type;
		for (unsigned a = nd->nargs; a < 3; a++)
			nd->arg[a] = 0;
	}
}

/*
 * A number that meets f16, bf16 or f32 values is rounded to float, as an op
 * list's constants are: one that overflows float is refused as it is there,
 * rather than becoming infinity.
 */
static int bind_check_consts(const struct chain_expr *x, struct chain_expr_error *e)
{
	const chain_prog *g = &x->prog;
	for (unsigned n = 0; n < g->nnodes; n++) {
		const struct kernels_expr_node *nd = &g->node[n];
		double v = nd->kind == KERNELS_EXPR_CONST ? g->c[nd->arg[0]] : 0;
		if (!chain_prog_is_float(nd->type) || !gpuq_f32_overflows(v))
			continue;
		char text[32], limit[32];
		gpuq_format_number(text, sizeof text, v, false);
		gpuq_format_number(limit, sizeof limit, FLT_MAX, true);
		return fail_at(e, x->node_col[n],
			       "the number %s is beyond float's range (%s), in which %s "
			       "expressions take their constants",
			       text, limit, gpuq_dtype_name((enum gpuq_dtype)nd->type));
	}
	return 0;
}

int chain_expr_bind(struct chain_expr *x, const struct chain_expr_binding *b, uint64_t *count,
		    struct chain_expr_error *e)
{
	memset(e, 0, sizeof *e);
	for (unsigned v = 0; v < x->nvars; v++)
		if (bind_check_var(x, b, v, e) < 0)
			return -1;
	if (bind_counts(x, b, count, e) < 0)
		return -1;
	bind_vars(x, b, *count);
	bind_types(&x->prog);
	unsigned at;
	char why[200];
	if (chain_prog_check(&x->prog, &at, why, sizeof why) < 0)
		return fail_at(e, at < x->prog.nnodes ? x->node_col[at] : 0,
			       "the expression nests too deeply or is malformed: %s", why);
	return bind_check_consts(x, e);
}
