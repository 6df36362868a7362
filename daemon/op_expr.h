/*
 * Expressions over buffers (op_expr.c): the arguments of the expression
 * form, which run (op_chain.c) and reduce_expr share, their rows for an
 * argument table, and the submission of a decoded expression. Main thread
 * only.
 */
#ifndef GPUQ_OP_EXPR_H
#define GPUQ_OP_EXPR_H

#include "daemon/chain_request.h"
#include "workers/chain/chain_expr.h"

/*
 * An expression request, decoded: its text parsed into x as `device`
 * decodes, and its variables resolved and bound as `owner` decodes (the
 * buffers in held[], not yet held). It is the first member of the
 * argument struct of run and reduce_expr, where the rows' checks find it.
 */
struct expr_args {
	struct chain_options opts; /* first: chain_request_check_repeat finds it */
	bool form;   /* the expression form: reduce_expr, or run with `expr` */
	bool reduce; /* reduce_expr */
	bool has_ops, has_buffer, has_out; /* run: the op-list form's keys, which it refuses */
	char text[CHAIN_EXPR_TEXT_MAX + 1];
	int device;
	bool has_device;
	uid_t owner;
	uint64_t count; /* elements the expression covers; reduce_expr's `count` may lower it */
	bool has_count;
	struct chain_expr x;
	struct buffer *held[KERNELS_EXPR_MAX_VARS];
};

bool expr_form(const void *args);
/* The `then` checks of the rows below: the text is parsed, the variables bound. */
int expr_check_alone(struct request *req, void *args, struct gpuq_error *err);
int expr_parse(struct request *req, void *args, struct gpuq_error *err);
int expr_bind(struct request *req, void *args, struct gpuq_error *err);

/*
 * The expression's rows of an argument table whose struct T has a struct
 * expr_args first, as member m; `missing` is the refusal of a request
 * without `expr`. Decoded only in the expression form.
 */
#define EXPR_FIELDS(T, m, missing_)                                                          \
	{ "expr", ARGS_STR, ARGS_REQUIRED, ARGS_AT(T, m.text), .missing = (missing_),        \
	  .when = expr_form },                                                               \
	{ "device", ARGS_DEVICE, 0, ARGS_AT(T, m.device), ARGS_GIVEN(T, m.has_device),       \
	  .when = expr_form, .then = expr_parse },                                           \
	{ "owner", ARGS_OWNER, 0, ARGS_AT(T, m.owner), .when = expr_form, .then = expr_bind }

/* Makes the job for a decoded expression (run's expression form) and submits it. */
void expr_submit(struct request *req, const struct expr_args *a);

#endif
