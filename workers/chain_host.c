/*
 * Kernel chains on the host backend: the reference for every op and dtype.
 * Worker thread only (backend.h).
 *
 * It follows the kernels' arithmetic (kernels/chain.cu): f16 and bf16 widen
 * to float, f32 computes in float, f64 in double; each op's result is
 * rounded to the element type before the next op; add, sub, mul, div and
 * fma round once each (this file is C11 without GNU extensions, where GCC
 * does not contract a * b + c). The transcendental functions are the C
 * library's, so they may differ from CUDA's by a few ulps: the GPU tests
 * compare both with a higher-precision reference, not with each other.
 *
 * The modes run as their CUDA counterparts are shaped: eager and graph one
 * pass over the buffer per op, fused one pass applying the whole list. The
 * plan cache is the same as on CUDA, with plans that hold nothing: a plan
 * records only that the chain was "instantiated", so CI tests the cache's
 * hits, updates, misses and evictions.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/hash.h"
#include "workers/backend_host.h"
#include "workers/chain.h"
#include "workers/clock.h"

/* binary16 bits -> float (exact). */
static float host_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
	if (exp == 0x1Fu) {
		bits = sign | 0x7F800000u | (man << 13);
	} else if (exp == 0) {
		float v = (float)man * (1.0f / 16777216.0f); /* man x 2^-24 */
		return sign ? -v : v;
	} else {
		bits = sign | ((exp + 112u) << 23) | (man << 13);
	}
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

static float host_bf16_to_f32(uint16_t b)
{
	uint32_t bits = (uint32_t)b << 16;
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

/* Element i of a buffer of dtype t, exactly, as a double. */
static double host_load(enum gpuq_dtype t, const void *p, uint64_t i)
{
	switch (t) {
	case GPUQ_DTYPE_F16: return host_f16_to_f32(((const uint16_t *)p)[i]);
	case GPUQ_DTYPE_BF16: return host_bf16_to_f32(((const uint16_t *)p)[i]);
	case GPUQ_DTYPE_F32: return ((const float *)p)[i];
	default: return ((const double *)p)[i];
	}
}

/* Stores v (a float value unless t is f64) with round to nearest even. */
static void host_store(enum gpuq_dtype t, void *p, uint64_t i, double v)
{
	switch (t) {
	case GPUQ_DTYPE_F16: ((uint16_t *)p)[i] = gpuq_f32_to_f16_bits((float)v); break;
	case GPUQ_DTYPE_BF16: ((uint16_t *)p)[i] = gpuq_f32_to_bf16_bits((float)v); break;
	case GPUQ_DTYPE_F32: ((float *)p)[i] = (float)v; break;
	default: ((double *)p)[i] = v; break;
	}
}

/* v rounded to the element type, as storing and loading it would. */
static double host_round(enum gpuq_dtype t, double v)
{
	switch (t) {
	case GPUQ_DTYPE_F16: return host_f16_to_f32(gpuq_f32_to_f16_bits((float)v));
	case GPUQ_DTYPE_BF16: return host_bf16_to_f32(gpuq_f32_to_bf16_bits((float)v));
	case GPUQ_DTYPE_F32: return (float)v;
	default: return v;
	}
}

/* The ops in float, as kernels/chain.cu defines them. */
static float host_opf(unsigned kind, float x, float a, float b)
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

static double host_opd(unsigned kind, double x, double a, double b)
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

/* One op on one value of dtype t, rounded to t. */
static double host_apply(enum gpuq_dtype t, const struct kernels_chain_op *op, double x)
{
	if (t == GPUQ_DTYPE_F64)
		return host_opd(op->kind, x, op->a, op->b);
	return host_round(t, host_opf(op->kind, (float)x, (float)op->a, (float)op->b));
}

/* Eager and graph: a pass over the buffer per op, the first from in. */
static bool host_passes(const struct chain_spec *spec)
{
	for (uint64_t p = 0; p < spec->repeat; p++) {
		if (p > 0 && spec->mode == CHAIN_EAGER && spec->cancel && atomic_load(spec->cancel))
			return false;
		for (unsigned i = 0; i < spec->nops; i++) {
			const void *src = p == 0 && i == 0 ? spec->in : spec->out;
			for (uint64_t j = 0; j < spec->count; j++)
				host_store(spec->dtype, spec->out, j,
					   host_apply(spec->dtype, &spec->ops[i],
						      host_load(spec->dtype, src, j)));
		}
	}
	return true;
}

/* Fused: every op, repeat times, on each element in turn. */
static void host_fused(const struct chain_spec *spec)
{
	for (uint64_t j = 0; j < spec->count; j++) {
		double x = host_load(spec->dtype, spec->in, j);
		for (uint64_t p = 0; p < spec->repeat; p++)
			for (unsigned i = 0; i < spec->nops; i++)
				x = host_apply(spec->dtype, &spec->ops[i], x);
		host_store(spec->dtype, spec->out, j, x);
	}
}

/* A host plan holds nothing; it only has to be something the cache can own. */
static int host_plan_build(struct device *dev, const struct chain_spec *spec, void **plan,
			   struct gpuq_error *err)
{
	(void)spec;
	*plan = malloc(1);
	if (!*plan)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: no memory for a chain plan", dev->index);
	return 0;
}

static int host_plan_retarget(struct device *dev, void *plan, const struct chain_spec *spec,
			      struct gpuq_error *err)
{
	(void)dev;
	(void)plan;
	(void)spec;
	(void)err;
	return 0;
}

static void host_plan_destroy(struct device *dev, void *plan)
{
	(void)dev;
	free(plan);
}

static const struct chain_plan_ops host_plan_ops = {
	.build = host_plan_build,
	.retarget = host_plan_retarget,
	.destroy = host_plan_destroy,
};

/* One run's replays, as the compute engine runs them (the device's "kernels"). */
struct host_replays {
	struct chain_spec *spec;
	unsigned n;
	double t[CHAIN_MAX_REPS];
	bool stopped;
	/* the baseline copy's */
	void *dst;
	const void *src;
	uint64_t bytes;
};

static void host_chain_replays(void *arg)
{
	struct host_replays *r = arg;
	for (unsigned i = 0; i < r->n && !r->stopped; i++) {
		double start = monotonic_seconds();
		if (r->spec->mode == CHAIN_FUSED)
			host_fused(r->spec);
		else
			r->stopped = !host_passes(r->spec);
		r->t[i] = monotonic_seconds() - start;
	}
}

int chain_host_run(struct device *dev, struct chain_spec *spec, struct gpuq_error *err)
{
	struct chain_state *cs = chain_state_get(dev, &host_plan_ops, err);
	struct host_replays r = { .spec = spec, .n = spec->reps ? spec->reps : 1 };
	void *plan;
	if (!cs)
		return -1;
	spec->result.cache = CHAIN_CACHE_NONE;
	if (spec->mode != CHAIN_EAGER && chain_cache_get(dev, cs, spec, &plan, err) != 0)
		return -1;
	if (host_backend_compute(dev, host_chain_replays, &r, err) != 0)
		return -1;
	if (r.stopped)
		return gpuq_fail(err, GPUQ_E_CANCELLED,
				 "run cancelled: the eager passes stopped at a pass boundary");
	spec->result.kernels = chain_kernels(spec);
	spec->result.device_s = chain_median(r.t, r.n);
	spec->result.device_min_s = r.t[0];
	return 0;
}

static void host_fused_op(struct host_op *op)
{
	host_fused(op->arg);
}

int chain_host_enqueue(struct device *dev, const struct chain_spec *spec, struct gpuq_error *err)
{
	struct host_op op = { .arg = (void *)spec };
	return host_backend_enqueue(dev, HOST_ENGINE_COMPUTE, host_fused_op, &op, err);
}

static void host_copy_replays(void *arg)
{
	struct host_replays *r = arg;
	for (unsigned i = 0; i < r->n; i++) {
		double start = monotonic_seconds();
		memcpy(r->dst, r->src, r->bytes);
		r->t[i] = monotonic_seconds() - start;
	}
}

int chain_host_copy_time(struct device *dev, void *dst, const void *src, uint64_t bytes,
			 unsigned reps, double *seconds, struct gpuq_error *err)
{
	struct host_replays r = { .n = reps, .dst = dst, .src = src, .bytes = bytes };
	if (reps < 1 || reps > CHAIN_MAX_REPS)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "host device %d: copy timing: %u reps (1..%d)",
				 dev->index, reps, CHAIN_MAX_REPS);
	if (host_backend_compute(dev, host_copy_replays, &r, err) != 0)
		return -1;
	*seconds = chain_median(r.t, reps);
	return 0;
}

void chain_host_close(struct device *dev)
{
	chain_state_close(dev);
}
