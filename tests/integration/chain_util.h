/*
 * Helpers for the kernel-chain tests (test_chain.c, test_chain_api.c):
 * typed buffers moved through put and get, chains sent in the protocol's
 * list form, and a reference in long double (at least float64) computed
 * here, independently of gpuqd's own host backend.
 */
#ifndef GPUQ_TEST_CHAIN_UTIL_H
#define GPUQ_TEST_CHAIN_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/integration/fixture.h"

/* A float element type as the tests see it. */
struct tdtype {
	const char *name;
	enum gpuq_dtype dtype;
	size_t size;
	int mant;    /* fraction bits: 23, 52, 10, 7 */
	int min_exp; /* exponent of the smallest subnormal: -149, -1074, -24, -133 */
};

extern const struct tdtype tdtype_f32, tdtype_f64, tdtype_f16, tdtype_bf16;

/* Element i of a host array of t, exactly. */
long double tload(const struct tdtype *t, const void *p, size_t i);
/* Stores v rounded to t (through float for f16 and bf16). */
void tstore(const struct tdtype *t, void *p, size_t i, long double v);
/* The unit in the last place of t at v (the smallest subnormal's at 0). */
long double tulp(const struct tdtype *t, long double v);
/* v rounded to t, as storing and loading it would. */
long double tround(const struct tdtype *t, long double v);

/* Allocates NAME as count elements of t on device (waits; fails the test if refused). */
void talloc(struct gpuq_client *c, const char *name, const struct tdtype *t, uint64_t count,
	    int device);
/* Writes n elements of host data into the buffer (put from a memfd). */
void tput(struct gpuq_client *c, const char *name, const void *data, size_t bytes);
/* Reads the buffer's bytes into a fresh malloc'd array. */
void *tget(struct gpuq_client *c, const char *name, size_t bytes);
/* fill value V: every element of the buffer becomes v. */
void tfill_value(struct gpuq_client *c, const char *name, double v);
/* n uniform values in [lo, hi) from seed, stored as t (the caller frees). */
void *trandom(const struct tdtype *t, size_t n, double lo, double hi, uint64_t seed);

/*
 * Sends a run request. chain is text as gpuq takes it ('add 1 | sqrt'),
 * turned into [["add", 1], ["sqrt"]] here; mode and out may be NULL,
 * repeat 0 leaves it out. The caller frees the reply.
 */
struct gpuq_reply *run_chain(struct gpuq_client *c, const char *buffer, const char *chain,
			     const char *mode, uint64_t repeat, const char *out);
/* The same with the `kernel` field (NULL: left out, auto). */
struct gpuq_reply *run_chain_kernel(struct gpuq_client *c, const char *buffer, const char *chain,
				    const char *mode, uint64_t repeat, const char *out,
				    const char *kernel);
/* The same without waiting: submits it and returns the job. */
uint64_t run_chain_detached(struct gpuq_client *c, const char *buffer, const char *chain,
			    const char *mode, uint64_t repeat, const char *out);
/* The same, failing the test unless the job is done. */
void run_ok(struct gpuq_client *c, const char *buffer, const char *chain, const char *mode,
	    uint64_t repeat, const char *out);

/* Options of an expression request; zeroed ones are left out. */
struct expr_opts {
	const char *mode, *kernel, *math;
	uint64_t repeat;
	int device;     /* -1: leave out */
	int64_t count;  /* reduce; -1: leave out */
};
#define EXPR_OPTS_DEFAULT ((struct expr_opts){ NULL, NULL, NULL, 0, -1, -1 })

/* Sends op ("run" or "reduce") with `expr` text and o, waiting. The caller frees the reply. */
struct gpuq_reply *expr_call(struct gpuq_client *c, const char *op, const char *text,
			     const struct expr_opts *o);
/* run text, failing the test unless done; returns the reply (the caller frees it). */
struct gpuq_reply *expr_ok(struct gpuq_client *c, const char *text, const struct expr_opts *o);
/* reduce text with kernel (NULL: auto), failing unless done: the value and its raw bits. */
double reduce_ok(struct gpuq_client *c, const char *text, const char *kernel, int64_t count);
/* The job's result.kernel ("compiled" or "interpreted"). */
void reply_kernel(const struct gpuq_reply *r, char *out, size_t size);
/*
 * Whether a fused run that wanted a compiled kernel may have run the
 * interpreted one: only where this machine has no NVRTC (the note says so)
 * and GPUQ_REQUIRE_GPU (make gpu-check) is not set. Fails the test otherwise.
 */
void expect_compiled(const struct gpuq_reply *r);

/* A device's chain counter (stats), e.g. "graph_instantiations". */
uint64_t chain_stat(struct gpuq_client *c, int device, const char *counter);

/*
 * The reference value of one op (text as in a chain, "add 1.5") at x, in
 * long double, with its constants rounded to float unless t is f64 (as
 * gpuqd uses them).
 */
long double ref_op(const struct tdtype *t, const char *op, long double x);

/* True when a and b hold the same bits, or are both NaN. */
bool same_value(const struct tdtype *t, const void *a, const void *b, size_t i);

#endif
