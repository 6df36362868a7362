/*
 * What the kernel-chain ops share: op_chain.c (run with an op list, stats,
 * bench_chain) and op_expr.c (run with an expression, reduce). Main thread
 * only.
 */
#ifndef GPUQ_OP_CHAIN_H
#define GPUQ_OP_CHAIN_H

#include "daemon/daemon.h"
#include "workers/chain/chain.h"

/* The request's mode, repeat, kernel and math fields into spec, each with its default. */
int op_chain_read_options(struct request *req, struct chain_spec *spec, struct gpuq_error *err);
/*
 * What those options allow with spec's program (set): graph and eager need
 * an op list, graph a bounded number of kernels, math fast a compiled
 * fused kernel, a reduction mode fused and no repeat.
 */
int op_chain_check(const struct chain_spec *spec, struct gpuq_error *err);
/* The result keys every run and reduce has (docs/protocol.md, run). */
void op_chain_render(const struct chain_spec *spec, uint64_t bytes, struct mp_map *out);

/* op_expr.c: run with `expr` (op_run hands it over). */
void op_run_expr(struct request *req);

#endif
