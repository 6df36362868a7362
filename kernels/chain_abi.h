/*
 * The layout of an expression program as the kernels read it: one struct
 * shared by host C code (workers/chain/chain_prog.h builds it), the kernels nvcc
 * compiles (kernels/chain_expr.cu) and the kernels gpuqd compiles at run time
 * with NVRTC (workers/chain/chain_codegen.c hands NVRTC this very text). So it is
 * plain C that every one of them reads alike: no #include, fixed-size types
 * only, and no padding that the compilers could place differently.
 *
 * A program is a list of nodes in evaluation order (a node's arguments come
 * before it), statements that assign a node's value to a variable, and for a
 * reduction the node (two for dot) whose values are reduced. Variables are
 * buffers: every element of them, or one element broadcast (BCAST).
 */
#ifndef GPUQ_CHAIN_ABI_H
#define GPUQ_CHAIN_ABI_H

#define KERNELS_EXPR_MAX_VARS 12   /* distinct buffers */
#define KERNELS_EXPR_MAX_INPUTS 8  /* variables read from memory */
#define KERNELS_EXPR_MAX_OUTPUTS 4 /* variables written: one statement each */
/* Room for the longest op list (64 ops of two constants each) as a program. */
#define KERNELS_EXPR_MAX_NODES 200
#define KERNELS_EXPR_MAX_CONSTS 128
/*
 * Nodes are in post-order: a node's operands are the values its subtrees
 * left last, so an interpreter evaluates a program with a stack of at most
 * this many values (kernels/chain_expr.cu keeps it in registers and local
 * memory).
 */
#define KERNELS_EXPR_MAX_DEPTH 24

/*
 * Elementwise kernels and the reduction tiles handle elements in items of 4
 * consecutive elements. A reduction tile is KERNELS_REDUCE_THREADS threads x
 * KERNELS_REDUCE_ITEMS items: thread j of tile t folds, in this order, items
 * t * TILE / 4 + r * THREADS + j for r = 0, 1, ..., and each item's elements
 * in order; the threads' results are then folded pairwise (j with j + 128,
 * then j + 64, ... down to 1), and the tiles' results the same way by one
 * block whose thread j folds tiles j, j + 256, ... in order. That order is
 * the definition of a reduction's result: the host backend follows it
 * exactly, so a sum of the same values gives the same bits on both.
 */
#define KERNELS_EXPR_ITEM 4
#define KERNELS_REDUCE_THREADS 256
#define KERNELS_REDUCE_ITEMS 16
#define KERNELS_REDUCE_TILE (KERNELS_REDUCE_THREADS * KERNELS_REDUCE_ITEMS * KERNELS_EXPR_ITEM)

/*
 * The chain ops: wire name and the number of constants each takes in the
 * op-list form of a chain ('add 1': one). kernels/kernels.h says what they
 * compute; kernels/chain_ops.cuh computes them.
 */
#define KERNELS_CHAIN_OPS(X)                                                   \
	X(SIN, "sin", 0)                                                       \
	X(COS, "cos", 0)                                                       \
	X(TAN, "tan", 0)                                                       \
	X(EXP, "exp", 0)                                                       \
	X(LOG, "log", 0)                                                       \
	X(LOG2, "log2", 0)                                                     \
	X(SQRT, "sqrt", 0)                                                     \
	X(RSQRT, "rsqrt", 0)                                                   \
	X(ABS, "abs", 0)                                                       \
	X(NEG, "neg", 0)                                                       \
	X(RELU, "relu", 0)                                                     \
	X(SIGMOID, "sigmoid", 0)                                               \
	X(TANH, "tanh", 0)                                                     \
	X(FLOOR, "floor", 0)                                                   \
	X(CEIL, "ceil", 0)                                                     \
	X(ROUND, "round", 0)                                                   \
	X(ADD, "add", 1)                                                       \
	X(SUB, "sub", 1)                                                       \
	X(MUL, "mul", 1)                                                       \
	X(DIV, "div", 1)                                                       \
	X(POW, "pow", 1)                                                       \
	X(MIN, "min", 1)                                                       \
	X(MAX, "max", 1)                                                       \
	X(CLAMP, "clamp", 2)                                                   \
	X(FMA, "fma", 2)

enum kernels_chain_kind {
#define KERNELS_CHAIN_ENUM(name, str, nargs) KERNELS_CHAIN_##name,
	KERNELS_CHAIN_OPS(KERNELS_CHAIN_ENUM)
#undef KERNELS_CHAIN_ENUM
	KERNELS_CHAIN_KINDS
};

/* Node kinds. */
#define KERNELS_EXPR_VAR 0   /* arg[0]: the variable */
#define KERNELS_EXPR_CONST 1 /* arg[0]: the constant */
#define KERNELS_EXPR_OP 2    /* op: enum kernels_chain_kind; arg[0..2]: its operands (nodes) */
#define KERNELS_EXPR_CAST 3  /* arg[0]: the node converted to `type` */

/* Variable flags. */
#define KERNELS_EXPR_LOAD 1  /* read from memory before the first statement */
#define KERNELS_EXPR_STORE 2 /* written to memory after the last statement */
#define KERNELS_EXPR_BCAST 4 /* one element, the same for every element of the others */

/* Reductions (0: none, an elementwise program). */
#define KERNELS_REDUCE_NONE 0
#define KERNELS_REDUCE_SUM 1
#define KERNELS_REDUCE_MIN 2
#define KERNELS_REDUCE_MAX 3
#define KERNELS_REDUCE_MEAN 4
#define KERNELS_REDUCE_NORM2 5
#define KERNELS_REDUCE_DOT 6
#define KERNELS_REDUCE_COUNT_NONZERO 7
#define KERNELS_REDUCE_ARGMAX 8
#define KERNELS_REDUCE_KINDS 9

/* Element types, numbered as enum gpuq_dtype (f16, bf16, f32, f64). */
#define KERNELS_EXPR_F16 4
#define KERNELS_EXPR_BF16 5
#define KERNELS_EXPR_F32 6
#define KERNELS_EXPR_F64 7

struct kernels_expr_node {
	unsigned char kind; /* KERNELS_EXPR_VAR ... */
	unsigned char op;   /* KERNELS_EXPR_OP: the chain op */
	unsigned char type; /* the node's value: KERNELS_EXPR_F16 ... */
	unsigned char nargs;
	unsigned short arg[3];
};

struct kernels_expr_prog {
	double c[KERNELS_EXPR_MAX_CONSTS]; /* constants, rounded to a node's compute type where used */
	struct kernels_expr_node node[KERNELS_EXPR_MAX_NODES];
	unsigned char var_dtype[KERNELS_EXPR_MAX_VARS];
	unsigned char var_flags[KERNELS_EXPR_MAX_VARS];
	unsigned char nvars, nnodes, nconsts, nstmts;
	unsigned char reduce; /* KERNELS_REDUCE_* */
	unsigned char pad[3];
	unsigned char stmt_var[KERNELS_EXPR_MAX_OUTPUTS];
	unsigned short stmt_node[KERNELS_EXPR_MAX_OUTPUTS]; /* statement s evaluates the nodes after stmt_node[s - 1] up to this one */
	unsigned short reduce_arg[2];
};

/*
 * A program with its buffers: the one parameter of every expression kernel
 * (under 4 KiB). A variable is loaded from var[k] and stored to store[k]:
 * the same buffer, except for the op-list form's `out` (x = f(x) read from
 * one buffer and written to another, the whole list repeat times).
 */
struct kernels_expr {
	void *var[KERNELS_EXPR_MAX_VARS];
	void *store[KERNELS_EXPR_MAX_VARS];
	unsigned long long count;  /* elements */
	unsigned long long repeat; /* the statements, this many times per element */
	struct kernels_expr_prog prog;
};

/*
 * A reduction's partial result: v the value (sum, min, max) or, for argmax,
 * the largest; i the element count (count_nonzero) or the index (argmax).
 */
struct kernels_partial {
	double v;
	unsigned long long i;
};

#endif
