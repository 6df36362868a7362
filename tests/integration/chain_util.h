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
/* The same, failing the test unless the job is done. */
void run_ok(struct gpuq_client *c, const char *buffer, const char *chain, const char *mode,
	    uint64_t repeat, const char *out);

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
