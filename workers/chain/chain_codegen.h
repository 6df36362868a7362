/*
 * Source for a program's own kernel: CUDA C++ that NVRTC compiles
 * (workers/chain/chain_nvrtc.h). The generated text is a body class G for the
 * loops of kernels/chain_ops.cuh (gq_elementwise, gq_reduce_tiles): the
 * program's nodes as straight-line code on named temporaries, each
 * computed and rounded with the same gq_op and gq_round the interpreted
 * kernels call, so it gives their bits. Constants stay in the kernel's
 * parameter (p.prog.c), so programs that differ only in them share a
 * kernel; the source depends on the program's shape and types alone.
 * Pure functions; any thread.
 */
#ifndef GPUQ_CHAIN_CODEGEN_H
#define GPUQ_CHAIN_CODEGEN_H

#include "workers/chain/chain_prog.h"

/* The texts of kernels/chain_ops.cuh, chain_abi.h and chain_reduce.h (workers/chain/chain_prelude.c). */
extern const char chain_prelude_ops[];
extern const char chain_prelude_abi[];
extern const char chain_prelude_reduce[];

#define CHAIN_CODEGEN_HEADERS 3
/* The headers the generated source includes, as NVRTC is handed them: names and texts. */
void chain_codegen_headers(const char *names[CHAIN_CODEGEN_HEADERS],
			   const char *texts[CHAIN_CODEGEN_HEADERS]);

/* The generated source for prog (bound and checked): malloc'd, or NULL when out of memory. */
char *chain_codegen_source(const chain_prog *prog);

/*
 * The kernel's name in the compiled module: "gq_run" (an elementwise
 * program: one parameter, struct kernels_expr) or "gq_reduce" (a tile of a
 * reduction: the program and the struct kernels_partial array of tiles).
 */
const char *chain_codegen_entry(const chain_prog *prog);

#endif
