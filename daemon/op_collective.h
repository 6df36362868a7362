/*
 * The collective requests on the main thread, shared by their two files:
 * op_collective_read.c reads and checks what a request asks for (every
 * primitive's fields, NCCL's layouts against every rank's buffers, a
 * group's overlaps) into a plan, before anything is held or queued;
 * op_collective.c turns a plan into a job, bounds its arrival, and renders
 * its result. Main thread only.
 */
#ifndef GPUQ_OP_COLLECTIVE_H
#define GPUQ_OP_COLLECTIVE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/daemon.h"
#include "workers/collective/collective.h"

/* What a primitive's result names: its buffers as the request gave them. */
struct coll_names {
	char in[BUFFER_NAME_MAX + 64];  /* `buffer` NAME, or sendrecv's src NAME@GPU[START:STOP] */
	char out[BUFFER_NAME_MAX + 64]; /* `out` NAME (`buffer`'s in place), or sendrecv's dst */
	bool in_place;
};

/* One range of a buffer a rank's part reads or writes. */
struct coll_region {
	struct buffer *buffer;
	uint64_t lo, hi; /* bytes */
	int task;
	bool write;
};

/* A request's collectives, read and checked; nothing is held yet. */
struct coll_plan {
	uid_t owner;
	int devices[GPUQ_MAX_DEVICES], n; /* the ranks, in order */
	bool group;                       /* a group request (`ops`) */
	int ntasks;
	struct coll_task *tasks;   /* malloc'd: the job takes them */
	struct coll_names *names;  /* malloc'd: the job takes them */
	struct coll_region *regions; /* every range each rank uses, sorted by buffer */
	int nregions;
	uint64_t timeout_ms;
	uint64_t warmup, iters, repeats; /* bench */
	int hang_rank;                   /* fault-injection builds; -1: none */
};

/*
 * A collective request's top-level fields, decoded from its op's table
 * (op_collective_read.c): which op it is (the op's defaults say), the
 * owner, the ranks, the timeout, the benchmark's loop sizes and, in
 * fault-injection builds, the rank to hang. The primitives themselves (the
 * request's own fields, or each entry of a group's `ops`) are read into a
 * plan by op_collective_read, each from its map by its own table.
 */
struct coll_args {
	const char *op;      /* the job kind's name: "allreduce" ... "bench_collective" */
	bool group, bench;
	enum coll_prim prim; /* the one primitive of a request that is not a group */
	uid_t owner;
	struct args_devices devices;
	uint64_t timeout_ms, warmup, iters, repeats;
	bool has_timeout;
	uint64_t hang_rank;
	bool has_hang;
};

/*
 * Reads the primitives of a decoded request into plan: one primitive
 * (group false: its fields at the top level) or a group (`ops`, each entry
 * one primitive), checked against every rank's buffers; the args' knobs
 * go with it. 0, or -1 with err and nothing allocated.
 */
int op_collective_read(struct request *req, const struct coll_args *a, struct coll_plan *plan,
		       struct gpuq_error *err);
/* Frees what the plan still owns (tasks and names are NULL once a job took them). */
void op_collective_plan_free(struct coll_plan *plan);

#endif
