/*
 * What the op files share: the op handler's shape, making a job for a
 * request and aiming it at buffers, rendering results several kinds
 * render alike, and submitting a job that carries a spec of its own.
 * Main thread only.
 */
#ifndef GPUQ_OP_COMMON_H
#define GPUQ_OP_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/args.h"
#include "daemon/job.h"

struct request;

/*
 * An op's handler: args is the op's argument struct, decoded and resolved
 * from its table (daemon/args.h) before the handler runs, and the caller
 * is one the op table lets call it (request.c).
 */
typedef void (*op_exec)(struct request *req, void *args);

/* A new job of kind for the caller; on failure req is answered and NULL returned. */
struct job *new_job(struct request *req, const struct job_kind *kind, enum work_kind work_kind,
		    int device);
/*
 * Holds b for the job's life and aims the work at it, as a write of the
 * whole buffer for the scheduler (which keeps jobs on one buffer in order).
 */
void job_attach_buffer(struct job *job, struct buffer *b);
/* Tells the scheduler w touches [offset, offset + length) of b, reading or writing. */
void work_add_access(struct work *w, const struct buffer *b, uint64_t offset, uint64_t length,
		     bool write);
/* The same for any memory the scheduler orders by (a region's mapping): base is its identity. */
void work_add_range(struct work *w, const void *base, uint64_t offset, uint64_t length,
		    bool write);
/* Narrows what job_attach_buffer said: the range and whether it writes. */
void work_narrow_access(struct work *w, uint64_t offset, uint64_t length, bool write);

/*
 * A `shape` field (an array of at most BUFFER_SHAPE_MAX non-negative
 * integers) checked against a buffer of count elements: 0 with *out set,
 * or -1 with a bad_request saying what is wrong. o NULL: no shape, *out
 * untouched.
 */
int shape_parse(const msgpack_object *o, uint64_t count, struct buffer_shape *out,
		struct gpuq_error *err);
/* Puts `shape` into m when one was given; nothing otherwise. */
void render_shape(struct mp_map *m, const struct buffer_shape *shape);

/* Results several kinds render alike: bytes moved, and a transfer's (bytes, time, path, check). */
void render_bytes(const struct job *job, struct mp_map *out);
void render_transfer(const struct job *job, struct mp_map *out);

/*
 * A job whose work carries a spec of its own (a benchmark's plan and rows,
 * a chain's program): the spec is allocated zeroed, filled from the
 * decoded args, given to the job and freed by `release` with it.
 */
struct spec_job {
	const struct job_kind *kind;
	enum work_kind work_kind;
	size_t spec_size;
	const char *what; /* "a benchmark": for "gpuqd has no memory for %s" */
	/* Fills spec from args and says the job's device: 0, or -1 with err. */
	int (*fill)(struct request *req, const void *args, void *spec, int *device,
		    struct gpuq_error *err);
	/* May be NULL: shapes the job once it holds spec (a gang, a buffer); 0, or -1 with err. */
	int (*shape)(struct request *req, const void *args, struct job *job, struct gpuq_error *err);
	void (*release)(struct job *job);
};

/*
 * Allocates the spec, fills it, makes the job, attaches the spec and
 * submits it; any refusal is answered and undoes what was made.
 */
void spec_job_submit(struct request *req, const struct spec_job *sj, const void *args);

/*
 * The benchmarks' `sizes` field: 1 to max byte counts of at most 1 TiB;
 * absent, 256 MiB, 1 GiB and 4 GiB.
 */
int read_bench_sizes(struct request *req, uint64_t *sizes, unsigned max, unsigned *n,
		     struct gpuq_error *err);

#endif
