/*
 * The expression language of `run` and `reduce` (docs/protocol.md states it
 * for clients):
 *
 *   run:     STATEMENT (';' STATEMENT)*        STATEMENT: NAME '=' EXPR
 *   reduce:  REDUCTION '(' EXPR ')' | 'dot' '(' EXPR ',' EXPR ')'
 *   EXPR:    + - * / (usual precedence, left to right), unary -, ( ),
 *            numbers (finite: 2, -0.5, 1e-3), variables, and calls:
 *            every chain op as a function of its operands (sin(x),
 *            add(x, y), clamp(x, lo, hi), fma(x, a, b): x * a + b rounded
 *            once), and the casts f16() bf16() f32() f64().
 *   NAME:    a buffer: [A-Za-z_][A-Za-z0-9_.]* or `any buffer name`, either
 *            optionally followed by @GPU.
 *
 * Parsing (chain_expr_parse) checks the syntax, the functions and their
 * arities, and the limits, and lists the variables with where they first
 * appear; binding (chain_expr_bind) takes what each variable names (the
 * daemon resolves them) and checks devices, counts, dtypes and aliasing,
 * then types the program (workers/chain/chain_prog.h). Every error carries the
 * column (from 1) of what it is about. Pure functions; any thread.
 */
#ifndef GPUQ_CHAIN_EXPR_H
#define GPUQ_CHAIN_EXPR_H

#include <stdbool.h>
#include <stdint.h>

#include "workers/chain/chain_prog.h"

#define CHAIN_EXPR_TEXT_MAX 4096
#define CHAIN_EXPR_NAME_MAX 64

struct chain_expr_error {
	unsigned col; /* 1-based; 0 when the error is about the whole text */
	char msg[400];
};

struct chain_expr_var {
	char name[CHAIN_EXPR_NAME_MAX + 1];
	int device;   /* @GPU, or -1 */
	unsigned col; /* where it first appears */
	bool loaded;  /* read before any statement assigns it */
	bool stored;  /* assigned by a statement */
	unsigned stored_col;
};

struct chain_expr {
	bool reduce; /* parsed as a reduction */
	unsigned nvars;
	struct chain_expr_var vars[KERNELS_EXPR_MAX_VARS];
	chain_prog prog; /* untyped until bound: node types, var dtypes and flags unset */
	unsigned short node_col[KERNELS_EXPR_MAX_NODES];
};

/* What the daemon found a variable to be. */
struct chain_expr_binding {
	enum gpuq_dtype dtype;
	uint64_t count;
	int device;
	const void *id; /* the buffer: two variables naming one buffer are refused */
};

/* Parses text as a run (reduce false) or a reduce expression. 0, or -1 with e. */
int chain_expr_parse(const char *text, bool reduce, struct chain_expr *out,
		     struct chain_expr_error *e);

/*
 * Checks the variables as bound (b[i] for x->vars[i]) and types the program
 * in x->prog. *count is the elements a run covers: the largest count, every
 * other variable having it or one element (broadcast). 0, or -1 with e.
 */
int chain_expr_bind(struct chain_expr *x, const struct chain_expr_binding *b, uint64_t *count,
		    struct chain_expr_error *e);

#endif
