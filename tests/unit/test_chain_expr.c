/*
 * Unit tests for the expression language (workers/chain/chain_expr.c) and
 * programs (workers/chain/chain_prog.c): what parses, what binds, the types
 * every node gets, the op-list form, and every refusal with its column.
 */
#include <stdio.h>
#include <string.h>

#include "tests/harness.h"
#include "workers/chain/chain_expr.h"

static struct chain_expr x;

static void parse_ok(const char *text, bool reduce)
{
	struct chain_expr_error e;
	CHECKF(chain_expr_parse(text, reduce, &x, &e) == 0, "'%s': column %u: %s", text, e.col, e.msg);
}

/* The parse of text fails at column col with a message containing want. */
static void parse_fails(const char *text, bool reduce, unsigned col, const char *want)
{
	struct chain_expr_error e;
	CHECKF(chain_expr_parse(text, reduce, &x, &e) < 0, "'%s' parsed", text);
	CHECKF(e.col == col && strstr(e.msg, want), "'%s': column %u: %s (want column %u, '%s')",
	       text, e.col, e.msg, col, want);
}

static unsigned var_index(const char *name)
{
	for (unsigned v = 0; v < x.nvars; v++)
		if (strcmp(x.vars[v].name, name) == 0)
			return v;
	harness_fail(__FILE__, __LINE__, "no variable '%s'", name);
}

/* Binds every variable as dtype t with count n, on device 0, each its own buffer. */
static int bind_all(enum gpuq_dtype t, uint64_t n, struct chain_expr_error *e)
{
	static char ids[KERNELS_EXPR_MAX_VARS];
	struct chain_expr_binding b[KERNELS_EXPR_MAX_VARS];
	uint64_t count;
	for (unsigned v = 0; v < x.nvars; v++)
		b[v] = (struct chain_expr_binding){ t, n, 0, &ids[v] };
	return chain_expr_bind(&x, b, &count, e);
}

TEST(chain_expr_parses_statements_and_variables)
{
	parse_ok("y = a * x + y", false);
	CHECK_EQ(x.nvars, 3);
	unsigned a = var_index("a"), xv = var_index("x"), y = var_index("y");
	CHECK(x.vars[a].loaded && !x.vars[a].stored);
	CHECK(x.vars[xv].loaded && !x.vars[xv].stored);
	CHECK(x.vars[y].loaded && x.vars[y].stored);
	CHECK_EQ(x.vars[y].col, 13);
	CHECK_EQ(x.prog.nstmts, 1);
	CHECK_EQ(x.prog.nnodes, 5); /* a x * y + */
	CHECK_EQ(x.prog.node[4].op, KERNELS_CHAIN_ADD);
	CHECK_EQ(x.prog.node[2].op, KERNELS_CHAIN_MUL);
	/* A later statement reads the earlier one's output from registers, not memory. */
	parse_ok("t = x * 2; y = t + 1;", false);
	CHECK(!x.vars[var_index("t")].loaded && x.vars[var_index("t")].stored);
	CHECK_EQ(x.prog.nstmts, 2);
	/* Names with @GPU, dots, and backquotes for the rest. */
	parse_ok("`w-1`@1 = model.w0@1 * -2.5e-1", false);
	CHECK_STR(x.vars[0].name, "model.w0");
	CHECK_EQ(x.vars[0].device, 1);
	CHECK_STR(x.vars[1].name, "w-1");
	CHECK_EQ(x.prog.c[0], -0.25);
	/* Precedence: 1 + 2 * 3 multiplies first; unary minus of a variable is neg. */
	parse_ok("y = 1 + 2 * -x", false);
	CHECK_EQ(x.prog.node[x.prog.stmt_node[0]].op, KERNELS_CHAIN_ADD);
	CHECK_EQ(x.prog.node[3].op, KERNELS_CHAIN_NEG);
}

TEST(chain_expr_refusals_point_at_the_column)
{
	parse_fails("y = a * foo(x)", false, 9, "unknown function 'foo'");
	parse_fails("y = 2x", false, 6, "write '2 * x'");
	parse_fails("y = a * x + ", false, 13, "ends where a value should be");
	parse_fails("y = (x + 1", false, 11, "expected ')'");
	parse_fails("y = sin(x, 2)", false, 5, "takes 1 argument, not 2");
	parse_fails("y = clamp(x, 0)", false, 5, "takes 3 arguments, not 2");
	parse_fails("y = x $ 2", false, 7, "unexpected '$'");
	parse_fails("sin | add 1", false, 5, "'|' belongs to the op-list form");
	parse_fails("y = x; y = x + 1", false, 8, "assigned twice (columns 1 and 8)");
	parse_fails("y = 1e999", false, 5, "not a finite number");
	parse_fails("y = x@", false, 6, "needs a GPU number");
	parse_fails("y = `x", false, 5, "no closing '`'");
	parse_fails("y = `.x`", false, 5, "not a buffer name");
	parse_fails("y = sum(x)", false, 5, "outermost call of a reduce expression");
	parse_fails("sin(x)", false, 4, "expected '='");
	parse_fails("y = x x", false, 7, "expected an operator, ';' or the end");
	parse_fails("", false, 0, "empty");
	/* Nine inputs: the ninth is named. */
	parse_fails("y = a + b + c + d + e + f + g + h + i", false, 37, "the 9th");
	parse_fails("a = 1; b = 1; c = 1; d = 1; e = 1", false, 29, "too many outputs");
	/* Reductions: the whole expression, one of the kinds, its arity. */
	parse_fails("sum(x) + 1", true, 8, "nothing may follow sum(...)");
	parse_fails("x + 1", true, 1, "a reduce expression is");
	parse_fails("frob(x)", true, 1, "'frob' is not a reduction");
	parse_fails("dot(x)", true, 1, "dot() takes 2 arguments, not 1");
	parse_fails("y = x", true, 1, "a reduce expression is");
	parse_fails("sum(2)", true, 1, "names no buffer");
}

TEST(chain_expr_reductions_and_min_max_by_arity)
{
	parse_ok("sum(abs(x - y))", true);
	CHECK_EQ(x.prog.reduce, KERNELS_REDUCE_SUM);
	CHECK_EQ(x.prog.nstmts, 0);
	parse_ok("dot(a, b * 2)", true);
	CHECK_EQ(x.prog.reduce, KERNELS_REDUCE_DOT);
	CHECK(x.prog.reduce_arg[0] != x.prog.reduce_arg[1]);
	parse_ok("min(x)", true);
	CHECK_EQ(x.prog.reduce, KERNELS_REDUCE_MIN);
	parse_ok("max(min(x, y))", true); /* elementwise min of two, reduced by max */
	CHECK_EQ(x.prog.reduce, KERNELS_REDUCE_MAX);
	CHECK_EQ(x.prog.node[x.prog.reduce_arg[0]].op, KERNELS_CHAIN_MIN);
}

TEST(chain_expr_binding_checks_devices_counts_dtypes_aliasing)
{
	static char ids[3];
	struct chain_expr_error e;
	struct chain_expr_binding b[3];
	uint64_t n;
	parse_ok("y = a * x + y", false); /* vars: a x y */
	b[0] = (struct chain_expr_binding){ GPUQ_DTYPE_F32, 1, 0, &ids[0] };
	b[1] = (struct chain_expr_binding){ GPUQ_DTYPE_F32, 100, 0, &ids[1] };
	b[2] = (struct chain_expr_binding){ GPUQ_DTYPE_F32, 100, 0, &ids[2] };
	CHECK(chain_expr_bind(&x, b, &n, &e) == 0);
	CHECK_EQ(n, 100);
	CHECK(x.prog.var_flags[0] & KERNELS_EXPR_BCAST);
	CHECK(!(x.prog.var_flags[1] & KERNELS_EXPR_BCAST));
	b[1].device = 1;
	CHECK(chain_expr_bind(&x, b, &n, &e) < 0 && e.col == 9 && strstr(e.msg, "is on gpu 1"));
	b[1].device = 0;
	b[1].count = 50;
	CHECK(chain_expr_bind(&x, b, &n, &e) < 0 && e.col == 9 && strstr(e.msg, "has 50 elements"));
	b[1].count = 100;
	b[1].dtype = GPUQ_DTYPE_I32;
	CHECK(chain_expr_bind(&x, b, &n, &e) < 0 && e.col == 9 && strstr(e.msg, "'x' is i32"));
	b[1].dtype = GPUQ_DTYPE_F32;
	b[1].id = b[2].id; /* x and y the same buffer */
	CHECK(chain_expr_bind(&x, b, &n, &e) < 0 && e.col == 13 && strstr(e.msg, "same buffer"));
	b[1].id = &ids[1];
	b[2].count = 1; /* the output would be broadcast */
	b[1].count = 100;
	b[0].count = 100;
	CHECK(chain_expr_bind(&x, b, &n, &e) < 0 && e.col == 1 && strstr(e.msg, "needs them all"));
	/* Too deep: 25 values pending before the first add can be done. */
	char deep[512] = "y = x";
	for (int i = 0; i < 25; i++)
		strcat(deep, " + (x");
	for (int i = 0; i < 25; i++)
		strcat(deep, ")");
	parse_ok(deep, false);
	CHECK(bind_all(GPUQ_DTYPE_F32, 8, &e) < 0 && strstr(e.msg, "nests too deeply") && e.col > 0);
}

/* Type of node n after binding every variable as in types[]. */
static unsigned bound_type(const char *text, const enum gpuq_dtype *types, unsigned n)
{
	static char ids[KERNELS_EXPR_MAX_VARS];
	struct chain_expr_binding b[KERNELS_EXPR_MAX_VARS];
	struct chain_expr_error e;
	uint64_t count;
	parse_ok(text, strncmp(text, "sum", 3) == 0 || strncmp(text, "dot", 3) == 0);
	for (unsigned v = 0; v < x.nvars; v++)
		b[v] = (struct chain_expr_binding){ types[v], 10, 0, &ids[v] };
	CHECKF(chain_expr_bind(&x, b, &count, &e) == 0, "'%s': %s", text, e.msg);
	return x.prog.node[n].type;
}

TEST(chain_expr_types_follow_the_promotion_rules)
{
	const enum gpuq_dtype f16_bf16_f32[] = { GPUQ_DTYPE_F16, GPUQ_DTYPE_BF16, GPUQ_DTYPE_F32 };
	const enum gpuq_dtype f32_f64_f32[] = { GPUQ_DTYPE_F32, GPUQ_DTYPE_F64, GPUQ_DTYPE_F32 };
	const enum gpuq_dtype f16s[] = { GPUQ_DTYPE_F16, GPUQ_DTYPE_F16 };
	/* vars a, b, out: a + b is node 2 */
	CHECK_EQ(bound_type("out = a + b", f16_bf16_f32, 2), KERNELS_EXPR_F32);
	CHECK_EQ(bound_type("out = a + b", f32_f64_f32, 2), KERNELS_EXPR_F64);
	/* A constant takes what it meets: a * 0.5 stays f16 (computed in float). */
	CHECK_EQ(bound_type("out = a * 0.5", f16s, 1), KERNELS_EXPR_F16);
	CHECK_EQ(bound_type("out = a * 0.5", f16s, 2), KERNELS_EXPR_F16);
	/* Constants alone take the output's type; a cast fixes its own. */
	CHECK_EQ(bound_type("out = sin(2)", f16s, 1), KERNELS_EXPR_F16);
	CHECK_EQ(bound_type("out = f32(a) + a", f16s, 3), KERNELS_EXPR_F32);
	CHECK_EQ(bound_type("out = f64(a)", f16s, 1), KERNELS_EXPR_F64);
	/* sin(1) takes its parent's f16; a reduced value of constants alone computes in f64. */
	CHECK_EQ(bound_type("sum(a * sin(1))", f16s, 2), KERNELS_EXPR_F16);
	CHECK_EQ(bound_type("dot(a, sin(2))", f16s, 2), KERNELS_EXPR_F64);
}

TEST(chain_prog_op_list_form)
{
	struct chain_expr_error e;
	struct kernels_chain_op ops[KERNELS_CHAIN_MAX_OPS];
	unsigned nops, var;
	parse_ok("x = add(sin(x), 1)", false);
	CHECK(bind_all(GPUQ_DTYPE_F32, 8, &e) == 0);
	CHECK(chain_prog_as_ops(&x.prog, ops, &nops, &var));
	CHECK_EQ(nops, 2);
	CHECK_EQ(ops[0].kind, KERNELS_CHAIN_SIN);
	CHECK_EQ(ops[1].kind, KERNELS_CHAIN_ADD);
	CHECK_EQ(ops[1].a, 1);
	parse_ok("x = clamp(2 * x, -1, 1)", false); /* 2 * x commutes into mul 2 */
	CHECK(bind_all(GPUQ_DTYPE_F16, 8, &e) == 0);
	CHECK(chain_prog_as_ops(&x.prog, ops, &nops, &var) && nops == 2);
	CHECK(ops[0].kind == KERNELS_CHAIN_MUL && ops[0].a == 2);
	CHECK(ops[1].kind == KERNELS_CHAIN_CLAMP && ops[1].a == -1 && ops[1].b == 1);
	const char *not_lists[] = { "x = 1 - x", "y = sin(x)", "x = x + x", "x = f32(x)",
				    "x = sin(x); y = x" };
	for (size_t i = 0; i < sizeof not_lists / sizeof not_lists[0]; i++) {
		parse_ok(not_lists[i], false);
		CHECK(bind_all(GPUQ_DTYPE_F32, 8, &e) == 0);
		CHECKF(!chain_prog_as_ops(&x.prog, ops, &nops, &var), "'%s' has an op list", not_lists[i]);
	}
	/* The op list's own program is the same as the expression's. */
	chain_prog from;
	struct kernels_chain_op two[2] = { { KERNELS_CHAIN_SIN, 0, 0 }, { KERNELS_CHAIN_ADD, 1, 0 } };
	chain_prog_from_ops(&from, two, 2, GPUQ_DTYPE_F32);
	parse_ok("x = add(sin(x), 1)", false);
	CHECK(bind_all(GPUQ_DTYPE_F32, 8, &e) == 0);
	CHECK(chain_prog_equal(&from, &x.prog));
	x.prog.c[0] = -1.0;
	CHECK(!chain_prog_equal(&from, &x.prog));
}

TEST(chain_prog_check_refuses_malformed_programs)
{
	struct chain_expr_error e;
	unsigned at;
	char why[200];
	parse_ok("y = a * x + y", false);
	CHECK(bind_all(GPUQ_DTYPE_F32, 8, &e) == 0);
	CHECK(chain_prog_check(&x.prog, &at, why, sizeof why) == 0);
	chain_prog bad = x.prog;
	bad.node[2].arg[1] = 0; /* a * a: not the values the stack holds */
	CHECK(chain_prog_check(&bad, &at, why, sizeof why) < 0 && at == 2);
	bad = x.prog;
	bad.node[2].type = KERNELS_EXPR_F16; /* computes in f16 from f32 operands: fine; f64 is not */
	bad.node[0].type = KERNELS_EXPR_F64;
	CHECK(chain_prog_check(&bad, &at, why, sizeof why) < 0);
	bad = x.prog;
	bad.var_flags[var_index("y")] &= (unsigned char)~KERNELS_EXPR_LOAD; /* y read before it holds a value */
	CHECK(chain_prog_check(&bad, &at, why, sizeof why) < 0 && strstr(why, "holds no value"));
	bad = x.prog;
	bad.node[4].op = KERNELS_CHAIN_CLAMP; /* three operands wanted, two given */
	CHECK(chain_prog_check(&bad, &at, why, sizeof why) < 0 && at == 4);
}
