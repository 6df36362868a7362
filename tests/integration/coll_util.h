/*
 * What the collective tests share: typed buffers on given devices, requests
 * built with libgpuq's gpuq_collective_* calls, and the check of every
 * output element against the reference (protocol/collective_layout.h names
 * the input elements each one is made of; protocol/collective_math.h says
 * whether it is right), from the seeds the inputs were filled with.
 */
#ifndef GPUQ_TEST_COLL_UTIL_H
#define GPUQ_TEST_COLL_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/integration/fixture.h"
#include "protocol/collective_layout.h"

extern const enum gpuq_dtype coll_typed_dtypes[7]; /* every dtype but bytes */

double coll_now(void);
/*
 * How late after its timeout a collective's failure may answer: the
 * failures these bounds catch never answer at all, and a loaded machine
 * may keep gpuqd or this client from a core for a second or more.
 */
#define COLL_LATE_S 5.0

/* alloc NAME@device as count x t; fill it with fill random seed; free it. */
void coll_alloc(struct gpuq_client *c, const char *name, int device, enum gpuq_dtype t,
		uint64_t count);
void coll_fill(struct gpuq_client *c, const char *name, int device, uint64_t seed);
void coll_free(struct gpuq_client *c, const char *name, int device);
/* The bytes of NAME@device, read back with get (malloc'd; *n bytes). */
unsigned char *coll_read_back(struct gpuq_client *c, const char *name, int device, size_t *n);

/* Up to want ranks (0..n-1): the host backend's devices, or the GPUs there are. */
int coll_ranks(struct gpuq_client *c, int want, int *devices);

/* A collective job (wait unless detach), and a group of nops of them. */
struct gpuq_reply *coll_run(struct gpuq_client *c, const struct gpuq_collective *op,
			    const int *devices, int n, bool detach);
struct gpuq_reply *coll_run_group(struct gpuq_client *c, const struct gpuq_collective *ops,
				  int nops, const int *devices, int n);
void coll_expect_error(struct gpuq_reply *r, enum gpuq_errc code, const char *contains);
/* A job's state, from status; wait for a job (at most timeout_ms). */
void coll_job_state(struct gpuq_client *c, uint64_t job, char *state, size_t size);
struct gpuq_reply *coll_wait(struct gpuq_client *c, uint64_t job, uint64_t timeout_ms);

/*
 * Where a primitive's data is: each rank's input is buffer `in` from
 * element in_at, its output buffer `out` from element out_at (ranges, as
 * sendrecv's); out NULL: in place, in `in` as coll_in_place_offsets lays it
 * out.
 */
struct coll_bufs {
	const char *in, *out;
	uint64_t in_at, out_at;
};

/*
 * Checks every rank's output of the primitive l ran over devices, each
 * rank's input buffer having been filled with seeds[rank]: elements the
 * layout writes must be the reference's; with rest, every other element of
 * an out-of-place output must still be fill random `rest`.
 */
void coll_check(struct gpuq_client *c, const struct coll_layout *l, enum gpuq_dtype t,
		enum coll_op op, const int *devices, const struct coll_bufs *b,
		const uint64_t *seeds, uint64_t rest);

/* "NAME@DEV[OFF:LEN]" in bytes, for count elements of size elt from element at. */
void coll_range(char *out, size_t size, const char *name, int device, uint64_t at,
		uint64_t count, size_t elt);

#endif
