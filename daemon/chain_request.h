/*
 * What the kernel-chain requests share (chain_request.c): their options,
 * what the options allow, and the result keys. op_chain.c and op_expr.c
 * call down into it. Main thread only.
 */
#ifndef GPUQ_CHAIN_REQUEST_H
#define GPUQ_CHAIN_REQUEST_H

#include "daemon/daemon.h"
#include "workers/chain/chain.h"

/* The request's mode, repeat, kernel and math fields into spec, each with its default. */
int chain_request_read_options(struct request *req, struct chain_spec *spec,
			       struct gpuq_error *err);
/*
 * What those options allow with spec's program (set): graph and eager need
 * an op list, graph a bounded number of kernels, math fast a compiled
 * fused kernel, a reduction mode fused and no repeat.
 */
int chain_request_check(const struct chain_spec *spec, struct gpuq_error *err);
/* The result keys every run and reduce has (docs/protocol.md, run). */
void chain_request_render(const struct chain_spec *spec, uint64_t bytes, struct mp_map *out);

#endif
