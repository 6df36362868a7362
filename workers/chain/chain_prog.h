/*
 * Expression programs (kernels/chain_abi.h's struct kernels_expr_prog): what
 * a `run` or a `reduce` computes, whichever way it was written. The daemon
 * builds one from an expression (workers/chain/chain_expr.h) or from an op list
 * ('sin | add 1' is the program x = add(sin(x), 1)); the worker runs it
 * compiled (workers/chain/chain_codegen.h), interpreted (kernels/chain_expr.cu), or
 * on the host (workers/chain/chain_eval.h). Pure functions; any thread.
 *
 * Types. Every value has a dtype: f16, bf16, f32 or f64. f16, bf16 and f32
 * compute in float, f64 in double, and each node's result is rounded to its
 * type. An operation on values of different types computes in their
 * promotion: the same type; f64 with anything; f32 with f16 or bf16; f16
 * with bf16 gives f32. A constant takes the type of what it meets (rounded
 * to float for f16, bf16 and f32, as the op-list form always did); a node
 * made of constants alone takes the type its parent gives it (an output's,
 * or f64 in a reduction). Casts (f16(x) ...) convert explicitly, and an
 * assignment converts to its output's type; conversions to f16 and bf16 go
 * through f32.
 */
#ifndef GPUQ_CHAIN_PROG_H
#define GPUQ_CHAIN_PROG_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "protocol/protocol.h"

typedef struct kernels_expr_prog chain_prog;

/* The reduction called name (sum, min, ... argmax), or KERNELS_REDUCE_NONE. */
unsigned chain_prog_reduce_find(const char *name, size_t len);
const char *chain_prog_reduce_name(unsigned kind);
/* Whether a reduction's result is an integer (count_nonzero, argmax). */
bool chain_prog_reduce_is_int(unsigned kind);

/* The compute type's promotion of two types (0 stands for an untyped constant). */
unsigned chain_prog_promote(unsigned a, unsigned b);
/* True for f16, bf16 and f32: values computed in float. */
bool chain_prog_is_float(unsigned type);

/* Whether two programs compute the same thing (constants compared as bits). */
bool chain_prog_equal(const chain_prog *a, const chain_prog *b);

/*
 * The program of an op list on a buffer of dtype: x = op_n(...op_1(x)), x
 * variable 0 (its store pointer says where the result goes: the op-list
 * form's `out`).
 */
void chain_prog_from_ops(chain_prog *p, const struct kernels_chain_op *ops, unsigned nops,
			 enum gpuq_dtype dtype);
/*
 * The op list of a program that is one: one statement x = f(x) applying
 * unary ops and ops with constant arguments, one after another, to one
 * variable of full count, all in its type (what graph and eager modes and
 * the interpreted chain kernel run, the whole list repeat times: the same
 * as the program repeated). True with ops, *nops and *var; false when the
 * program is anything else.
 */
bool chain_prog_as_ops(const chain_prog *p, struct kernels_chain_op *ops, unsigned *nops,
		       unsigned *var);

/*
 * Checks everything the evaluators rely on: limits, valid kinds, ops and
 * types, operands in post-order within KERNELS_EXPR_MAX_DEPTH, every
 * variable read either loaded or assigned before, statements (or a
 * reduction) covering the nodes. 0, or -1 with why and *at (the node it is
 * about, or nnodes for the program as a whole).
 */
int chain_prog_check(const chain_prog *p, unsigned *at, char *why, size_t n);

/* Bytes one pass reads and writes: loaded variables read, stored written (count elements). */
uint64_t chain_prog_bytes(const chain_prog *p, uint64_t count);

#endif
