/*
 * The host's arithmetic for chains and expression programs: what the host
 * backend computes, and the reference the tests check the GPU against.
 * It follows kernels/chain_ops.cuh step for step: f16 and bf16 widen to
 * float, f32 computes in float, f64 in double, each node's result is rounded
 * to its type, add/sub/mul/div/fma round once each (C11 without GNU
 * extensions: GCC does not contract a * b + c), and a reduction folds in the
 * order kernels/chain_abi.h defines. The transcendental functions are the C
 * library's, so they may differ from CUDA's by a few ulps: the GPU tests
 * compare both with a higher-precision reference, and a reduction of such
 * values within a stated tolerance. Pure functions; any thread.
 */
#ifndef GPUQ_CHAIN_EVAL_H
#define GPUQ_CHAIN_EVAL_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "protocol/protocol.h"

/* Element i of a buffer of dtype t (a float type), exactly, as a double. */
double chain_eval_load(enum gpuq_dtype t, const void *p, uint64_t i);
/* Stores v (a value of type t) with round to nearest even (f16, bf16 through float). */
void chain_eval_store(enum gpuq_dtype t, void *p, uint64_t i, double v);
/* v (any type's value) converted to type t, as kernels/chain_ops.cuh's gq_convert. */
double chain_eval_convert(unsigned t, double v);
/* Op kind on operands of type t (their values in doubles), computed and rounded as t. */
double chain_eval_op(unsigned t, unsigned kind, double x, double a, double b);

/* Runs the elementwise program e (all its buffers host memory) over e->count elements. */
void chain_eval_run(const struct kernels_expr *e);
/* The reduction program e over e->count elements: its one partial, before finishing. */
struct kernels_partial chain_eval_reduce(const struct kernels_expr *e);
/* The tiles a reduction of count elements has. */
uint64_t chain_eval_tiles(uint64_t count);

#endif
