/*
 * Every kind of work a device worker runs, one row each: the single place
 * that says what a kind is called, which function runs it and how the
 * scheduler treats it. `enum work_kind` (workers/work.h), the runner lookup
 * and the name (workers/work_kinds.c), the engine (sched_engine_of) and the
 * admission flags (sched_work_exclusive, sched_work_lane_ordered) are all
 * expanded from this list, so none of them has a switch to keep in step.
 *
 * Adding a job kind: one row here + one runner file in the right workers/
 * sub-folder (+ the daemon op that submits it, daemon/op_*.c, with its
 * struct job_kind for the reply).
 *
 * Columns:
 *  - kind: WORK_<kind> is its enum constant, in the rows' order (it never
 *    travels; NOOP stays first, so that a zeroed work is a noop);
 *  - name: what logs and internal errors call it;
 *  - runner: `int runner(struct device *, struct work *)`, run on a fiber of
 *    the device's scheduler (workers/sched/sched.h): 0, or -1 with
 *    work->error set. NULL: never run (the scheduler grants an attach
 *    itself; run_work fails anything else without a runner as internal).
 *    workers/work_kinds.c includes each runner's header;
 *  - engine: the engine it keeps busy, SCHED_ENGINE_<engine>
 *    (workers/sched/sched.h), for `devices` and the metrics;
 *  - flags: WORK_KIND_EXCLUSIVE (runs alone on its device: a benchmark),
 *    WORK_KIND_LANE_ORDERED (every device operation goes on its own lane, so
 *    that ordering against other works is a stream wait; a gang part never
 *    is, whatever its kind), or 0.
 *
 * A kind's own parameters travel in work->spec (owned by the job), except
 * put/get's, which are small and embedded (work->transfer).
 *
 * A few rules still name particular kinds in code, because they are about
 * those kinds alone: the scheduler settles a noop without dependencies and
 * an attach without running them (sched.c), lets one chain at a time on a
 * device (sched_queue.c, admissible), and the worker counts the bytes of
 * put, get and copy and refreshes memory figures after alloc and free
 * (worker.c). A new kind that shares one of those traits is to become a
 * flag here rather than another name there.
 */
#ifndef GPUQ_WORK_KINDS_H
#define GPUQ_WORK_KINDS_H

enum work_kind_flag {
	WORK_KIND_EXCLUSIVE = 1u << 0,
	WORK_KIND_LANE_ORDERED = 1u << 1,
};

/* clang-format off */
#define WORK_KINDS(X)                                                                                     \
	/* kind             name                runner                engine      flags */                \
	X(NOOP,             "noop",             buffer_run_noop,      OTHER,      WORK_KIND_LANE_ORDERED) \
	X(ALLOC,            "alloc",            buffer_run_alloc,     OTHER,      0)                      \
	X(FREE,             "free",             buffer_run_free,      OTHER,      WORK_KIND_LANE_ORDERED) \
	X(PUT,              "put",              transfer_put,         H2D,        WORK_KIND_LANE_ORDERED) \
	X(GET,              "get",              transfer_get,         D2H,        WORK_KIND_LANE_ORDERED) \
	X(FILL,             "fill",             buffer_run_fill,      KERNEL,     WORK_KIND_LANE_ORDERED) \
	X(CHECKSUM,         "checksum",         buffer_run_checksum,  KERNEL,     WORK_KIND_LANE_ORDERED) \
	/* bench_copy: host<->device paths measured on one device */                                      \
	X(BENCH_COPY,       "bench_copy",       bench_copy_run,       OTHER,      WORK_KIND_EXCLUSIVE)    \
	/* copy: one part of a device-to-device copy (spec: struct copy_spec) */                          \
	X(COPY,             "copy",             copy_run,             COPY,       WORK_KIND_LANE_ORDERED) \
	/* bench_d2d: one part of the D2D/peer benchmark (spec: struct bench_d2d) */                      \
	X(BENCH_D2D,        "bench_d2d",        bench_d2d_run,        OTHER,      WORK_KIND_EXCLUSIVE)    \
	/* run: an elementwise chain on a buffer (spec: struct chain_spec) */                             \
	X(CHAIN,            "run",              chain_run,            KERNEL,     WORK_KIND_LANE_ORDERED) \
	/* bench_chain: the chain benchmark (spec: struct chain_bench) */                                 \
	X(BENCH_CHAIN,      "bench_chain",      chain_bench_run,      OTHER,      WORK_KIND_EXCLUSIVE)    \
	/* allreduce ... group: one rank's part (spec: struct coll_spec) */                               \
	X(COLLECTIVE,       "collective",       collective_run,       COLLECTIVE, 0)                      \
	/* bench_collective: the raw loop on the same communicator */                                     \
	X(COLLECTIVE_BENCH, "bench_collective", collective_run,       COLLECTIVE, WORK_KIND_EXCLUSIVE)    \
	/* bench_sched: the raw ceiling of overlapping engines (spec: struct sched_bench) */              \
	X(BENCH_SCHED,      "bench_sched",      sched_bench_run,      OTHER,      WORK_KIND_EXCLUSIVE)    \
	/* bench_alloc: alloc/free latency, pool against slabs (spec: struct bench_alloc_spec) */         \
	X(BENCH_ALLOC,      "bench_alloc",      bench_alloc_run,      OTHER,      WORK_KIND_EXCLUSIVE)    \
	/* inject_fault: tests/gpuqd-faults only (the production gpuqd has no runner) */                  \
	X(FAULT,            "inject_fault",     fault_inject_run,     OTHER,      0)                      \
	/* region_create: map the client's memfd, place and pin it */                                     \
	X(REGION_MAP,       "region_create",    region_pin_run_map,   OTHER,      0)                      \
	/* region_free: once no job uses it, unpin and unmap it */                                        \
	X(REGION_UNMAP,     "region_free",      region_pin_run_unmap, OTHER,      0)                      \
	/* attach: a lease's place in the ledger (sched_queue.h), granted, never run */                   \
	X(ATTACH,           "attach",           NULL,                 OTHER,      0)
/* clang-format on */

#endif
