/*
 * What the kernel-chain requests share (chain_request.c): their options,
 * declared once for every op that takes them, what the options allow, and
 * the result keys. op_chain.c and op_expr.c call down into it. Main
 * thread only.
 */
#ifndef GPUQ_CHAIN_REQUEST_H
#define GPUQ_CHAIN_REQUEST_H

#include "daemon/daemon.h"
#include "workers/chain/chain.h"

/*
 * The options every run and reduce_expr takes (docs/protocol.md, run):
 * mode, kernel and math as their enums' values, repeat, and whether mode
 * and repeat were given (a reduction refuses them). It is the first member
 * of each chain op's argument struct, where chain_request_check_repeat
 * finds it.
 */
struct chain_options {
	int mode, kernel, math; /* enum chain_mode, chain_kernel, chain_math */
	uint64_t repeat;
	bool has_mode, has_repeat;
};

extern const char *const chain_request_modes[], *const chain_request_kernels[],
	*const chain_request_maths[];
/* The repeat field's range (1 to CHAIN_MAX_REPEAT); a `then` check of the options' rows. */
int chain_request_check_repeat(struct request *req, void *args, struct gpuq_error *err);

/* The options' rows of an argument table whose struct T has them first, as member m. */
#define CHAIN_OPTION_FIELDS(T, m)                                                               \
	{ "mode", ARGS_ENUM, 0, ARGS_AT(T, m.mode), ARGS_GIVEN(T, m.has_mode),                  \
	  .names = chain_request_modes, .strsize = 16,                                          \
	  .bad_name = "field 'mode': '%s' is not fused, graph or eager" },                      \
	{ "kernel", ARGS_ENUM, 0, ARGS_AT(T, m.kernel), .names = chain_request_kernels,         \
	  .strsize = 16, .bad_name = "field 'kernel': '%s' is not auto, compiled or interpreted" }, \
	{ "math", ARGS_ENUM, 0, ARGS_AT(T, m.math), .names = chain_request_maths, .strsize = 16, \
	  .bad_name = "field 'math': '%s' is not ieee or fast" },                               \
	{ "repeat", ARGS_U64, 0, ARGS_AT(T, m.repeat), ARGS_GIVEN(T, m.has_repeat),             \
	  .then = chain_request_check_repeat }
/* The options' defaults: fused, auto, ieee, once. */
#define CHAIN_OPTION_DEFAULTS { .mode = CHAIN_FUSED, .kernel = CHAIN_KERNEL_AUTO, \
				.math = CHAIN_MATH_IEEE, .repeat = 1 }

/* The decoded options into spec. */
void chain_request_apply(const struct chain_options *o, struct chain_spec *spec);
/*
 * What those options allow with spec's program (set): graph and eager need
 * an op list, graph a bounded number of kernels, math fast a compiled
 * fused kernel, a reduction mode fused and no repeat.
 */
int chain_request_check(const struct chain_spec *spec, struct gpuq_error *err);
/* The result keys every run and reduce has (docs/protocol.md, run). */
void chain_request_render(const struct chain_spec *spec, uint64_t bytes, struct mp_map *out);

#endif
