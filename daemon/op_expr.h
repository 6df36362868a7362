/*
 * Expressions over buffers (op_expr.c): run with `expr`, which op_run
 * hands over. Main thread only.
 */
#ifndef GPUQ_OP_EXPR_H
#define GPUQ_OP_EXPR_H

#include "daemon/daemon.h"

void op_run_expr(struct request *req);

#endif
