/*
 * The texts of kernels/chain_ops.cuh, chain_abi.h and chain_reduce.h, linked into
 * gpuqd as they are in the source tree, each with a NUL at its end: NVRTC
 * compiles every generated kernel with them (workers/chain/chain_codegen.h), so a
 * compiled kernel computes with exactly the code the interpreted kernels were
 * built from. The assembler reads the files (paths from the repository root,
 * where make runs); the Makefile makes this object depend on them.
 */
#include "workers/chain/chain_codegen.h"

#define CHAIN_PRELUDE_TEXT(symbol, path)                                       \
	".section .rodata\n"                                                   \
	".globl " symbol "\n"                                                  \
	".type " symbol ", @object\n"                                          \
	".balign 16\n" symbol ":\n"                                            \
	".incbin \"" path "\"\n"                                               \
	".byte 0\n"                                                            \
	".size " symbol ", . - " symbol "\n"                                   \
	".previous\n"

__asm__(CHAIN_PRELUDE_TEXT("chain_prelude_ops", "kernels/chain_ops.cuh")
	CHAIN_PRELUDE_TEXT("chain_prelude_abi", "kernels/chain_abi.h")
	CHAIN_PRELUDE_TEXT("chain_prelude_reduce", "kernels/chain_reduce.h"));
