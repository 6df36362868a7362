/*
 * Kernel chains, numerically: every op on every float dtype against a
 * long-double reference computed here, on random inputs put into the
 * buffer; every output element written (the output is poisoned first); the
 * fused kernel compiled for the chain, the interpreted fused kernel, graph
 * and eager agreeing bit for bit; repeat and out. Both tiers: the host
 * backend in CI, the CUDA backend in make gpu-check (where the fused run
 * must have been compiled).
 *
 * Error bounds, in units in the last place of the result's dtype, against
 * the reference at the exact input (constants rounded to float as gpuqd
 * uses them for f16, bf16 and f32):
 *   - correctly rounded ops (abs neg relu floor ceil round add sub mul div
 *     min max clamp fma sqrt): 1 ulp (they are within half an ulp; the other
 *     half covers a result just across a power of two);
 *   - sin cos tan exp log log2 rsqrt sigmoid tanh pow, f32 and f64: 5 ulps
 *     (CUDA documents at most 1 to 4 ulps for these from the correctly
 *     rounded result, so 4.5 from the exact one; sigmoid is exp, an add and
 *     a division, under 4; glibc is within 1 or 2);
 *   - every op in f16 and bf16: 1 ulp (computed in float, then rounded
 *     once to the element type).
 * No fast-math anywhere: gpuqd's kernels use CUDA's IEEE-accurate functions.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/integration/chain_util.h"

#define OPS_COUNT 3003 /* odd tails and an odd number of 16-byte vectors for every dtype */
#define POISON (-777.0)

struct op_case {
	const char *op;
	double lo, hi;   /* the inputs' range */
	bool transcendental;
};

static const struct op_case op_cases[] = {
	{ "sin", -4, 4, true },        { "cos", -4, 4, true },       { "tan", -1.2, 1.2, true },
	{ "exp", -4, 4, true },        { "log", 0.01, 8, true },     { "log2", 0.01, 8, true },
	{ "sqrt", 0, 8, false },       { "rsqrt", 0.01, 8, true },   { "abs", -8, 8, false },
	{ "neg", -8, 8, false },       { "relu", -8, 8, false },     { "sigmoid", -4, 4, true },
	{ "tanh", -4, 4, true },       { "floor", -8, 8, false },    { "ceil", -8, 8, false },
	{ "round", -8, 8, false },     { "add 1.5", -4, 4, false },  { "sub 0.75", -4, 4, false },
	{ "mul 2.5", -4, 4, false },   { "div 3", -4, 4, false },    { "pow 1.5", 0.01, 8, true },
	{ "min 0.25", -4, 4, false },  { "max -0.5", -4, 4, false }, { "clamp -1 1", -4, 4, false },
	{ "fma 2.5 -1.25", -4, 4, false },
};

static const char *const modes[] = { "fused", "graph", "eager" };
/* Each op's runs: fused with its compiled kernel, fused interpreted, graph, eager. */
static const char *const op_modes[] = { "fused", "fused", "graph", "eager" };
static const char *const op_kernels[] = { NULL, "interpreted", NULL, NULL };
static const char *const op_names[] = { "compiled", "interpreted", "graph", "eager" };

static double bound_ulps(const struct tdtype *t, const struct op_case *oc)
{
	if (t->dtype == GPUQ_DTYPE_F16 || t->dtype == GPUQ_DTYPE_BF16)
		return 1;
	return oc->transcendental ? 5 : 1;
}

/* Checks every element of out against the reference of oc at in. */
static void check_against_reference(const struct tdtype *t, const struct op_case *oc,
				    const void *in, const void *out, size_t n)
{
	double bound = bound_ulps(t, oc);
	for (size_t i = 0; i < n; i++) {
		long double x = tload(t, in, i), y = tload(t, out, i);
		long double want = ref_op(t, oc->op, x);
		long double err = fabsl(y - want) / tulp(t, want);
		CHECKF(err <= bound,
		       "%s '%s' element %zu: x = %.9Lg gives %.9Lg, reference %.12Lg: %.2Lf ulps "
		       "(bound %.0f)%s",
		       t->name, oc->op, i, x, y, want, err, bound,
		       y == (long double)tround(t, POISON) ? " (never written: still the poison)" : "");
	}
}

/* One op on one dtype: each way into a poisoned out buffer; all four agree. */
static void check_op(struct gpuq_client *c, const struct tdtype *t, const struct op_case *oc,
		     uint64_t seed)
{
	size_t bytes = OPS_COUNT * t->size;
	void *in = trandom(t, OPS_COUNT, oc->lo, oc->hi, seed), *outs[4];
	tput(c, "x", in, bytes);
	for (int m = 0; m < 4; m++) {
		tfill_value(c, "y", POISON);
		struct gpuq_reply *r = run_chain_kernel(c, "x", oc->op, op_modes[m], 0, "y", op_kernels[m]);
		expect_ok(r, oc->op);
		if (m == 0)
			expect_compiled(r);
		gpuq_reply_free(r);
		outs[m] = tget(c, "y", bytes);
		check_against_reference(t, oc, in, outs[m], OPS_COUNT);
	}
	for (int m = 1; m < 4; m++)
		for (size_t i = 0; i < OPS_COUNT; i++)
			CHECKF(same_value(t, outs[0], outs[m], i),
			       "%s '%s' element %zu: compiled gives %.9Lg, %s %.9Lg", t->name, oc->op, i,
			       tload(t, outs[0], i), op_names[m], tload(t, outs[m], i));
	for (int m = 0; m < 4; m++)
		free(outs[m]);
	free(in);
}

static void check_every_op(const struct tdtype *t)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	talloc(c, "x", t, OPS_COUNT, 0);
	talloc(c, "y", t, OPS_COUNT, 0);
	for (size_t k = 0; k < sizeof op_cases / sizeof op_cases[0]; k++)
		check_op(c, t, &op_cases[k], 100 + k);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(chain_every_op_f32)
{
	check_every_op(&tdtype_f32);
}

TEST(chain_every_op_f64)
{
	check_every_op(&tdtype_f64);
}

TEST(chain_every_op_f16)
{
	check_every_op(&tdtype_f16);
}

TEST(chain_every_op_bf16)
{
	check_every_op(&tdtype_bf16);
}

/*
 * The chain in place, against the reference with each op's result
 * rounded to the dtype (gpuqd's semantics). Errors add up along the chain,
 * and sub 3 cancels (results near -0.3 from values near 2.7), so the bound
 * is 16 ulps of the result plus 4 of 1.0. Inputs stay in [-1, 3): near
 * x = -pi/2, 1 + sin x is tiny and sqrt would magnify the ulp by which two
 * correct sinf differ (glibc's and CUDA's) a thousandfold.
 */
static void check_five_ops(struct gpuq_client *c, const struct tdtype *t, const char *mode)
{
	static const char *const ops[] = { "sin", "add 1", "sqrt", "mul 2", "sub 3" };
	const size_t n = 10007;
	void *in = trandom(t, n, -1, 3, 9);
	talloc(c, "five", t, n, 0);
	tput(c, "five", in, n * t->size);
	run_ok(c, "five", "sin | add 1 | sqrt | mul 2 | sub 3", mode, 0, NULL);
	void *out = tget(c, "five", n * t->size);
	for (size_t i = 0; i < n; i++) {
		long double x = tload(t, in, i), want = x;
		for (size_t k = 0; k < 5; k++)
			want = tround(t, ref_op(t, ops[k], want));
		long double y = tload(t, out, i);
		long double bound = 16 * tulp(t, want) + 4 * tulp(t, 1.0L);
		CHECKF(fabsl(y - want) <= bound, "%s %s chain element %zu: x = %.9Lg gives %.9Lg, want %.12Lg",
		       t->name, mode, i, x, y, want);
	}
	free(in);
	free(out);
	do_free(c, "five");
}

TEST(chain_five_ops_in_place_match_reference)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const struct tdtype *types[] = { &tdtype_f32, &tdtype_f64, &tdtype_f16, &tdtype_bf16 };
	for (size_t k = 0; k < 4; k++)
		for (int m = 0; m < 3; m++)
			check_five_ops(c, types[k], modes[m]);
	gpuq_close(c);
	daemon_stop(&d);
}

/* repeat N == N runs of the chain, bit for bit, in every mode and into out. */
static void check_repeat(struct gpuq_client *c, const struct tdtype *t)
{
	const size_t n = 4099;
	const char *chain = "mul 0.5 | add 1 | sin | fma 1.5 -0.25";
	void *in = trandom(t, n, -2, 2, 31);
	talloc(c, "rx", t, n, 0);
	talloc(c, "ry", t, n, 0);
	talloc(c, "rz", t, n, 0);
	tput(c, "rx", in, n * t->size);
	/* rz: three runs of one pass each, from rx */
	run_ok(c, "rx", chain, "eager", 1, "rz");
	run_ok(c, "rz", chain, "eager", 1, NULL);
	run_ok(c, "rz", chain, "eager", 1, NULL);
	void *want = tget(c, "rz", n * t->size);
	for (int m = 0; m < 3; m++) {
		tfill_value(c, "ry", POISON);
		run_ok(c, "rx", chain, modes[m], 3, "ry");
		void *got = tget(c, "ry", n * t->size);
		for (size_t i = 0; i < n; i++)
			CHECKF(same_value(t, want, got, i),
			       "%s repeat 3 (%s) element %zu: %.9Lg, three runs give %.9Lg", t->name,
			       modes[m], i, tload(t, got, i), tload(t, want, i));
		free(got);
	}
	void *after = tget(c, "rx", n * t->size);
	CHECKF(memcmp(after, in, n * t->size) == 0, "%s: run --out changed its input", t->name);
	free(after);
	free(want);
	free(in);
	do_free(c, "rx");
	do_free(c, "ry");
	do_free(c, "rz");
}

TEST(chain_repeat_equals_successive_runs)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	check_repeat(c, &tdtype_f32);
	check_repeat(c, &tdtype_f16);
	check_repeat(c, &tdtype_f64);
	gpuq_close(c);
	daemon_stop(&d);
}

/* --out at awkward sizes: the input is untouched, every output element written. */
TEST(chain_out_writes_every_element_and_keeps_input)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t sizes[] = { 1, 2, 3, 5, 7, 8, 9, 4097, (1u << 20) + 3 };
	for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
		size_t n = sizes[s];
		talloc(c, "ox", &tdtype_f32, n, 0);
		talloc(c, "oy", &tdtype_f32, n, 0);
		do_fill_random(c, "ox", 50 + s);
		uint64_t sum = do_checksum(c, "ox");
		float *in = tget(c, "ox", n * 4);
		for (int m = 0; m < 3; m++) {
			tfill_value(c, "oy", POISON);
			run_ok(c, "ox", "add 1 | mul 3", modes[m], 0, "oy");
			float *out = tget(c, "oy", n * 4);
			for (size_t i = 0; i < n; i++)
				CHECKF(out[i] == (in[i] + 1.0f) * 3.0f,
				       "%zu elements, %s: element %zu is %g, want %g", n, modes[m], i,
				       (double)out[i], (double)((in[i] + 1.0f) * 3.0f));
			free(out);
		}
		CHECK_EQ(do_checksum(c, "ox"), sum);
		free(in);
		do_free(c, "ox");
		do_free(c, "oy"); /* the run released it: free is not refused as busy */
	}
	gpuq_close(c);
	daemon_stop(&d);
}
