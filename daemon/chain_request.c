/*
 * What every kernel-chain request shares, whichever way it is written:
 * op_chain.c (run with an op list) and op_expr.c (run with an expression,
 * reduce_expr) both call down into it, so that neither calls the other
 * back. Main thread only.
 */
#include <inttypes.h>
#include <stdio.h>

#include "daemon/chain_request.h"

const char *const chain_request_modes[] = { "fused", "graph", "eager", NULL };
const char *const chain_request_kernels[] = { "auto", "compiled", "interpreted", NULL };
const char *const chain_request_maths[] = { "ieee", "fast", NULL };

int chain_request_check_repeat(struct request *req, void *args, struct gpuq_error *err)
{
	const struct chain_options *o = args; /* first in every chain op's arguments */
	(void)req;
	if (o->repeat < 1 || o->repeat > CHAIN_MAX_REPEAT)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'repeat': %" PRIu64 " is not 1 to %d",
				 o->repeat, CHAIN_MAX_REPEAT);
	return 0;
}

void chain_request_apply(const struct chain_options *o, struct chain_spec *spec)
{
	spec->mode = (enum chain_mode)o->mode;
	spec->kernel = (enum chain_kernel)o->kernel;
	spec->math = (enum chain_math)o->math;
	spec->repeat = o->repeat;
}

int chain_request_check(const struct chain_spec *spec, struct gpuq_error *err)
{
	bool reduce = chain_spec_is_reduce(spec);
	if (reduce && (spec->mode != CHAIN_FUSED || spec->repeat != 1))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "a reduction runs fused once: leave out 'mode' and 'repeat'");
	if (spec->mode != CHAIN_FUSED && !spec->has_ops)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "mode %s runs one kernel per op, which only a chain of ops on one "
				 "buffer has (as x = add(sin(x), 1), or 'sin | add 1'); run this "
				 "expression in mode fused", chain_mode_name(spec->mode));
	if (spec->mode == CHAIN_GRAPH && spec->repeat * spec->nops > CHAIN_MAX_GRAPH_KERNELS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "graph mode captures ops x repeat = %" PRIu64 " kernels into one graph, "
				 "more than %d; lower 'repeat' or use mode fused",
				 spec->repeat * spec->nops, CHAIN_MAX_GRAPH_KERNELS);
	if (spec->math == CHAIN_MATH_FAST &&
	    (spec->mode != CHAIN_FUSED || spec->kernel == CHAIN_KERNEL_INTERPRETED))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "math fast needs a compiled kernel: mode fused with kernel auto or "
				 "compiled (the interpreted and per-op kernels compute IEEE only)");
	return 0;
}

/*
 * How the fused kernel was had: compiled (from where, for what, in how long)
 * or interpreted, and why; and on the host backend, that the CPU ran the
 * program instead.
 */
static void render_kernel(const struct chain_spec *s, struct mp_map *out)
{
	const struct chain_kernel_info *k = &s->result.kernel;
	if (s->mode != CHAIN_FUSED)
		return;
	mp_put_str(out, "kernel", k->compiled ? "compiled" : "interpreted");
	mp_put_str(out, "math", chain_math_name(k->math));
	if (k->compiled) {
		mp_put_str(out, "kernel_source", chain_source_name(k->source));
		mp_put_str(out, "arch", k->arch);
		mp_put_f64(out, "compile_ms", k->compile_s * 1e3);
	}
	if (k->note[0])
		mp_put_str(out, "kernel_note", k->note);
}

void chain_request_render(const struct chain_spec *s, uint64_t bytes, struct mp_map *out)
{
	const struct chain_result *r = &s->result;
	mp_put_str(out, "mode", chain_mode_name(s->mode));
	mp_put_str(out, "graph", chain_cache_outcome_name(r->cache));
	mp_put_bool(out, "instantiated", r->instantiated);
	render_kernel(s, out);
	if (r->kernel.host_evaluated) /* absent on CUDA, where kernels and graphs ran */
		mp_put_str(out, "evaluated", "host");
	if (s->has_ops) {
		mp_put_u64(out, "ops", s->nops);
		mp_put_str(out, "dtype", gpuq_dtype_name(s->dtype));
	}
	mp_put_u64(out, "repeat", s->repeat);
	mp_put_u64(out, "kernels", r->kernels);
	mp_put_u64(out, "count", s->count);
	mp_put_u64(out, "bytes", bytes);
	mp_put_f64(out, "prepare_s", r->prepare_s);
	mp_put_f64(out, "device_s", r->device_s);
	mp_put_f64(out, "gbps", r->device_s > 0 ? (double)bytes / r->device_s / 1e9 : 0);
}
