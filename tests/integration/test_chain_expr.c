/*
 * Expressions over several buffers (run with `expr`), both tiers: results
 * against a long-double reference that follows the stated rounding (each
 * node rounded to its type; constants to the compute type), the compiled
 * kernel against the interpreted one bit for bit, broadcasting, several
 * statements, mixed dtypes with casts, repeat, and every refusal with the
 * column it points at.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/integration/chain_util.h"

#define N 5003 /* odd: a tail after the items of 4 */

static void expect_refused(struct gpuq_reply *r, enum gpuq_errc code, const char *contains)
{
	expect_error(r, code, contains);
	gpuq_reply_free(r);
}

/* Every element of got within ulps of want (both n elements of t); NaN only where NaN is wanted. */
static void check_close(const struct tdtype *t, const char *what, const void *got,
			const long double *want, size_t n, double ulps)
{
	for (size_t i = 0; i < n; i++) {
		long double y = tload(t, got, i);
		if (isnan(want[i])) {
			CHECKF(isnan(y), "%s %s element %zu: %.9Lg, want NaN", t->name, what, i, y);
			continue;
		}
		long double err = fabsl(y - want[i]) / tulp(t, want[i]);
		CHECKF(err <= ulps, "%s %s element %zu: %.12Lg, want %.12Lg (%.2Lf ulps)", t->name, what,
		       i, y, want[i], err);
	}
}

/* Two host arrays of n elements of t hold the same bits (NaN equal to NaN). */
static void check_same(const struct tdtype *t, const char *what, const void *a, const void *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		CHECKF(same_value(t, a, b, i), "%s %s element %zu: compiled %.9Lg, interpreted %.9Lg",
		       t->name, what, i, tload(t, a, i), tload(t, b, i));
}

/*
 * text writes `out` (n elements of t) from the inputs as they are now:
 * compiled (auto), then interpreted from the same inputs (`save` holding
 * out's bytes before, restored between), returning the compiled result.
 */
static void *run_both(struct gpuq_client *c, const char *text, const char *out,
		      const struct tdtype *t, size_t n)
{
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	void *before = tget(c, out, n * t->size);
	struct gpuq_reply *r = expr_ok(c, text, &o);
	expect_compiled(r);
	gpuq_reply_free(r);
	void *compiled = tget(c, out, n * t->size);
	tput(c, out, before, n * t->size);
	o.kernel = "interpreted";
	r = expr_ok(c, text, &o);
	char kernel[32];
	reply_kernel(r, kernel, sizeof kernel);
	CHECK_STR(kernel, "interpreted");
	gpuq_reply_free(r);
	void *interpreted = tget(c, out, n * t->size);
	check_same(t, text, compiled, interpreted, n);
	free(interpreted);
	free(before);
	return compiled;
}

static void axpy_and_relu(struct gpuq_client *c, const struct tdtype *t)
{
	float a = 2.5f;
	void *x = trandom(t, N, -2, 2, 11), *y = trandom(t, N, -2, 2, 12), *bias = trandom(t, N, -1, 1, 13);
	long double *want = malloc(N * sizeof *want);
	unsigned char a1[8];
	talloc(c, "x", t, N, 0);
	talloc(c, "y", t, N, 0);
	talloc(c, "bias", t, N, 0);
	talloc(c, "out", t, N, 0);
	talloc(c, "a", t, 1, 0);
	tstore(t, a1, 0, a);
	tput(c, "a", a1, t->size);
	tput(c, "x", x, N * t->size);
	tput(c, "y", y, N * t->size);
	tput(c, "bias", bias, N * t->size);
	tfill_value(c, "out", -777);
	for (size_t i = 0; i < N; i++) /* a * x, rounded to t; + y, rounded */
		want[i] = tround(t, tround(t, tload(t, a1, 0) * tload(t, x, i)) + tload(t, y, i));
	void *got = run_both(c, "y = a * x + y", "y", t, N);
	check_close(t, "y = a * x + y", got, want, N, 1);
	free(got);
	/* out = relu(x * 0.5 + bias); the constant meets x: rounded to float (or double). */
	for (size_t i = 0; i < N; i++) {
		long double v = tround(t, tround(t, tload(t, x, i) * 0.5L) + tload(t, bias, i));
		want[i] = v > 0 ? v : 0;
	}
	got = run_both(c, "out = relu(x * 0.5 + bias)", "out", t, N);
	check_close(t, "relu", got, want, N, 1);
	free(got);
	free(want);
	free(x);
	free(y);
	free(bias);
	const char *names[] = { "x", "y", "bias", "out", "a" };
	for (size_t i = 0; i < 5; i++)
		do_free(c, names[i]);
}

TEST(chain_expr_axpy_and_relu_every_dtype)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	axpy_and_relu(c, &tdtype_f32);
	axpy_and_relu(c, &tdtype_f16);
	axpy_and_relu(c, &tdtype_bf16);
	axpy_and_relu(c, &tdtype_f64);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * Several statements (a later one reads an earlier one's output), mixed
 * dtypes and casts: f16 h, f32 w, f64 z; t = h * w (f32), z = f64(t) / 3 +
 * h (f64), h = f16(w) - h (f16, in place).
 */
TEST(chain_expr_statements_mixed_dtypes_and_casts)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	void *h = trandom(&tdtype_f16, N, -4, 4, 21), *w = trandom(&tdtype_f32, N, -4, 4, 22);
	long double *wt = malloc(N * sizeof *wt), *wz = malloc(N * sizeof *wz), *wh = malloc(N * sizeof *wh);
	talloc(c, "h", &tdtype_f16, N, 0);
	talloc(c, "w", &tdtype_f32, N, 0);
	talloc(c, "t", &tdtype_f32, N, 0);
	talloc(c, "z", &tdtype_f64, N, 0);
	tput(c, "h", h, N * 2);
	tput(c, "w", w, N * 4);
	for (size_t i = 0; i < N; i++) {
		long double hv = tload(&tdtype_f16, h, i), wv = tload(&tdtype_f32, w, i);
		wt[i] = tround(&tdtype_f32, hv * wv);
		wz[i] = tround(&tdtype_f64, tround(&tdtype_f64, wt[i] / 3) + hv);
		/* f16(w): through f32 (already one); minus h in f16 */
		wh[i] = tround(&tdtype_f16, tround(&tdtype_f16, wv) - hv);
	}
	const char *text = "t = h * w; z = f64(t) / 3 + h; h = f16(w) - h";
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	struct gpuq_reply *r = expr_ok(c, text, &o);
	expect_compiled(r);
	const msgpack_object *outs = reply_path(r, "job.result.outputs");
	CHECK(outs && outs->type == MSGPACK_OBJECT_ARRAY && outs->via.array.size == 3);
	gpuq_reply_free(r);
	void *gt = tget(c, "t", N * 4), *gz = tget(c, "z", N * 8), *gh = tget(c, "h", N * 2);
	check_close(&tdtype_f32, "t", gt, wt, N, 1);
	check_close(&tdtype_f64, "z", gz, wz, N, 1);
	check_close(&tdtype_f16, "h", gh, wh, N, 1);
	free(gt);
	free(gz);
	free(gh);
	free(wt);
	free(wz);
	free(wh);
	free(h);
	free(w);
	gpuq_close(c);
	daemon_stop(&d);
}

/* repeat 3 is three runs, compiled and interpreted; an op-list form in graph mode matches too. */
TEST(chain_expr_repeat_and_modes)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	void *x = trandom(&tdtype_f32, N, -1, 1, 31);
	float a = 0.75f;
	talloc(c, "x", &tdtype_f32, N, 0);
	talloc(c, "y", &tdtype_f32, N, 0);
	talloc(c, "a", &tdtype_f32, 1, 0);
	tput(c, "a", &a, 4);
	tput(c, "x", x, N * 4);
	tfill_value(c, "y", 1);
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	for (int i = 0; i < 3; i++)
		gpuq_reply_free(expr_ok(c, "y = a * x + y", &o));
	void *three = tget(c, "y", N * 4);
	const char *kernels[] = { NULL, "interpreted" };
	for (int k = 0; k < 2; k++) {
		tfill_value(c, "y", 1);
		o.repeat = 3;
		o.kernel = kernels[k];
		gpuq_reply_free(expr_ok(c, "y = a * x + y", &o));
		void *got = tget(c, "y", N * 4);
		check_same(&tdtype_f32, "repeat 3", got, three, N);
		free(got);
	}
	/* x = add(sin(x), 1) is the chain 'sin | add 1': every mode, the same bits. */
	const char *modes[] = { "eager", "graph", "fused" };
	void *first = NULL;
	for (int m = 0; m < 3; m++) {
		tput(c, "x", x, N * 4);
		o = EXPR_OPTS_DEFAULT;
		o.mode = modes[m];
		o.repeat = 2;
		gpuq_reply_free(expr_ok(c, "x = add(sin(x), 1)", &o));
		void *got = tget(c, "x", N * 4);
		if (first)
			check_same(&tdtype_f32, modes[m], got, first, N);
		else
			first = got;
		if (got != first)
			free(got);
	}
	tput(c, "x", x, N * 4);
	run_ok(c, "x", "sin | add 1", "fused", 2, NULL);
	void *chain = tget(c, "x", N * 4);
	check_same(&tdtype_f32, "the op-list form", chain, first, N);
	free(chain);
	free(first);
	free(three);
	free(x);
	gpuq_close(c);
	daemon_stop(&d);
}

static void check_expr_refusals(struct gpuq_client *c)
{
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	expect_refused(expr_call(c, "run", "y = a * q + y", &o), GPUQ_E_NOT_FOUND,
		       "expression column 9: buffer 'q' not found");
	expect_refused(expr_call(c, "run", "y = a * x +", &o), GPUQ_E_BAD_REQUEST,
		       "expression column 12: the expression ends");
	expect_refused(expr_call(c, "run", "y = frob(x)", &o), GPUQ_E_BAD_REQUEST,
		       "column 5: unknown function 'frob'");
	expect_refused(expr_call(c, "run", "y = short + x", &o), GPUQ_E_BAD_REQUEST,
		       "column 5: 'short' has 99 elements but 'x' (column 13) has 100");
	expect_refused(expr_call(c, "run", "y = ints + x", &o), GPUQ_E_BAD_REQUEST,
		       "column 5: 'ints' is i32");
	expect_refused(expr_call(c, "run", "a = x + y", &o), GPUQ_E_BAD_REQUEST,
		       "'a' has 1 element but the expression covers 100");
	expect_refused(expr_call(c, "run", "y = x + y@0", &o), GPUQ_E_BAD_REQUEST,
		       "'y' and 'y@0' (column 9) are the same buffer");
	expect_refused(expr_call(c, "run", "y = x + x1 + x2 + x3 + x4 + x5 + x6 + x7 + a", &o),
		       GPUQ_E_BAD_REQUEST, "too many inputs");
	o.mode = "graph";
	expect_refused(expr_call(c, "run", "y = a * x + y", &o), GPUQ_E_BAD_REQUEST,
		       "mode graph runs one kernel per op");
	o.mode = NULL;
	o.math = "fast";
	o.kernel = "interpreted";
	expect_refused(expr_call(c, "run", "y = x", &o), GPUQ_E_BAD_REQUEST, "math fast needs a compiled");
	o = EXPR_OPTS_DEFAULT;
	o.kernel = "jit";
	expect_refused(expr_call(c, "run", "y = x", &o), GPUQ_E_BAD_REQUEST, "'jit' is not auto");
	o = EXPR_OPTS_DEFAULT;
	o.mode = "graph";
	expect_refused(expr_call(c, "reduce_expr", "sum(x)", &o), GPUQ_E_BAD_REQUEST, "a reduction runs fused");
	o = EXPR_OPTS_DEFAULT;
	o.count = 101;
	expect_refused(expr_call(c, "reduce_expr", "sum(x)", &o), GPUQ_E_BAD_REQUEST,
		       "'count': 101 is more than the expression's 100");
	o = EXPR_OPTS_DEFAULT;
	expect_refused(expr_call(c, "reduce_expr", "y = x", &o), GPUQ_E_BAD_REQUEST, "a reduce expression is");
	o.device = 9;
	expect_refused(expr_call(c, "run", "y = x", &o), GPUQ_E_NOT_FOUND, "device 9 does not exist");
	/* expr and the op-list form together */
	struct mp_map req;
	gpuq_request_begin(c, &req, "run");
	mp_put_str(&req, "expr", "y = x");
	mp_put_str(&req, "buffer", "x");
	expect_refused(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "either 'expr', or 'buffer'");
	gpuq_request_begin(c, &req, "reduce_expr");
	expect_refused(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "field 'expr'");
}

TEST(chain_expr_refusals_point_at_the_column)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const char *names[] = { "x", "y", "x1", "x2", "x3", "x4", "x5", "x6", "x7" };
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		talloc(c, names[i], &tdtype_f32, 100, 0);
	talloc(c, "a", &tdtype_f32, 1, 0);
	talloc(c, "short", &tdtype_f32, 99, 0);
	talloc(c, "ints", &(struct tdtype){ "i32", GPUQ_DTYPE_I32, 4, 0, 0 }, 100, 0);
	check_expr_refusals(c);
	if (device_count(c) >= 2) { /* one device per expression */
		talloc(c, "far", &tdtype_f32, 100, 1);
		struct expr_opts o = EXPR_OPTS_DEFAULT;
		expect_refused(expr_call(c, "run", "y = x + far", &o), GPUQ_E_BAD_REQUEST,
			       "column 9: 'far' is on gpu 1 but 'x' (column 5) is on gpu 0");
		/* x is on both: without @GPU it is ambiguous, --device picks where to look. */
		talloc(c, "x", &tdtype_f32, 100, 1);
		expect_refused(expr_call(c, "run", "far = x * 2", &o), GPUQ_E_BAD_REQUEST, "column 7:");
		o.device = 1;
		gpuq_reply_free(expr_ok(c, "far = x * 2", &o));
		do_free(c, "x@1");
	}
	/* Refusals moved nothing and held nothing: every buffer is free to go. */
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		do_free(c, names[i]);
	gpuq_close(c);
	daemon_stop(&d);
}

/* run or reduce_expr with `expr` text on `device` (any uint64), waiting. */
static struct gpuq_reply *expr_on_device(struct gpuq_client *c, const char *op, const char *text,
					 uint64_t device)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, "expr", text);
	mp_put_u64(&req, "device", device);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

/*
 * An op list is an expression (docs/protocol.md, run): what one refuses,
 * the other does too. A constant beyond float's range in float arithmetic,
 * mode and repeat in a reduction, a device the daemon does not have.
 */
TEST(chain_expr_refuses_what_the_op_list_refuses)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	talloc(c, "x", &tdtype_f32, 100, 0);
	talloc(c, "y", &tdtype_f32, 100, 0);
	talloc(c, "z", &tdtype_f64, 100, 0);
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	expect_refused(run_chain(c, "x", "mul 1e300", "fused", 1, NULL), GPUQ_E_BAD_REQUEST,
		       "op 1 'mul': argument 1 is 1e+300, beyond float's range");
	expect_refused(expr_call(c, "run", "y = x * 1e300", &o), GPUQ_E_BAD_REQUEST,
		       "expression column 9: the number 1e+300 is beyond float's range (3.4028235e+38), "
		       "in which f32 expressions take their constants");
	/* just beyond: both numbers whole, as %g's six digits printed them the same */
	expect_refused(run_chain(c, "x", "mul 3.4028236e38", "fused", 1, NULL), GPUQ_E_BAD_REQUEST,
		       "op 1 'mul': argument 1 is 3.4028236e+38, beyond float's range (3.4028235e+38)");
	expect_refused(expr_call(c, "run", "y = x * 3.4028236e38", &o), GPUQ_E_BAD_REQUEST,
		       "expression column 9: the number 3.4028236e+38 is beyond float's range "
		       "(3.4028235e+38)");
	expect_refused(expr_call(c, "run", "y = clamp(x, -1e39, 1)", &o), GPUQ_E_BAD_REQUEST,
		       "expression column 14: the number -1e+39 is beyond float's range");
	expect_refused(expr_call(c, "reduce_expr", "sum(x * 1e300)", &o), GPUQ_E_BAD_REQUEST,
		       "expression column 9: the number 1e+300");
	gpuq_reply_free(expr_ok(c, "z = z * 1e300", &o)); /* f64 keeps its constants double */
	gpuq_reply_free(expr_ok(c, "y = f32(z * 1e300)", &o));
	/* a reduction runs fused, once: mode and repeat are refused even at their defaults */
	o.mode = "fused";
	expect_refused(expr_call(c, "reduce_expr", "sum(x)", &o), GPUQ_E_BAD_REQUEST,
		       "a reduction runs fused once: leave out 'mode' and 'repeat'");
	o = EXPR_OPTS_DEFAULT;
	o.repeat = 1;
	expect_refused(expr_call(c, "reduce_expr", "sum(x)", &o), GPUQ_E_BAD_REQUEST,
		       "a reduction runs fused once");
	/* nil is absent (docs/protocol.md, Requests): expr nil is the op-list form, buffer nil no conflict */
	struct mp_map req;
	struct mp_array ops, sin_op;
	gpuq_request_begin(c, &req, "run");
	mp_put_nil(&req, "expr");
	mp_put_str(&req, "buffer", "x");
	mp_array_init(&ops);
	mp_array_init(&sin_op);
	mp_array_str(&sin_op, "sin");
	mp_array_array(&ops, &sin_op);
	mp_put_array(&req, "ops", &ops);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "run with expr nil and an op list");
	gpuq_reply_free(r);
	gpuq_request_begin(c, &req, "run");
	mp_put_str(&req, "expr", "y = x");
	mp_put_nil(&req, "buffer");
	mp_put_nil(&req, "out");
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "run with an expression and buffer nil");
	gpuq_reply_free(r);
	/* 2^64-1 is a device number like any other, not "no device" */
	const uint64_t devices[] = { UINT64_MAX, UINT64_MAX - 1, 99 };
	for (int i = 0; i < 3; i++) {
		char want[64];
		snprintf(want, sizeof want, "device %llu does not exist",
			 (unsigned long long)devices[i]);
		expect_refused(expr_on_device(c, "run", "y = x", devices[i]), GPUQ_E_NOT_FOUND, want);
		expect_refused(expr_on_device(c, "reduce_expr", "sum(x)", devices[i]),
			       GPUQ_E_NOT_FOUND, want);
	}
	gpuq_close(c);
	daemon_stop(&d);
}
