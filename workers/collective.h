/*
 * All-reduce across device workers: the state the parts of one collective
 * share (struct allreduce_spec), their rendezvous, the in-process hand-off of
 * the communicator id, and each device's cache of warm communicators.
 *
 * Threads and ownership.
 *   - The main thread fills a spec (coll_spec_init, then the inputs) before
 *     the job is queued, and reads the outputs after every part is back; it
 *     touches nothing else in it.
 *   - Each part runs collective_run on its device's worker thread. The parts
 *     of one job meet in spec->sync: a mutex for the arrival and the first
 *     failure, atomics for everything that is polled. Every wait polls the
 *     part's cancel flag, the shared failure flag and a deadline, so no part
 *     waits for ever.
 *   - dev->coll (the communicator cache) belongs to the device's worker: it
 *     is made on first use and destroyed by collective_device_close, which
 *     the backend's close calls on that same thread.
 *
 * Ordering. NCCL deadlocks when ranks issue collectives in different orders.
 * The main thread queues all of a collective's parts in one step
 * (worker_submit_group) and every worker runs its queue in order, so two
 * collectives over overlapping devices are met in the same order on every
 * device they share.
 *
 * Communicators. A communicator serves one ordered list of devices (rank i is
 * devices[i]); each rank's worker keeps its own handle in its cache with the
 * communicator's generation, a number unique to one creation. At the
 * rendezvous the ranks compare generations: all equal and non-zero means the
 * warm communicator is used; anything else means every rank drops what it
 * has and a fresh one is made: rank 0 asks the backend for an id
 * (ncclGetUniqueId), hands it to the others through spec->sync, and all
 * ranks initialise together. After any failure every rank that runs aborts
 * and drops its communicator for the set, so the next use starts afresh.
 */
#ifndef GPUQ_COLLECTIVE_H
#define GPUQ_COLLECTIVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "protocol/protocol.h"
#include "workers/backend.h"
#include "workers/collective_math.h"
#include "workers/work.h"

#define COLL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES; collective_cuda.c checks it */
#define COLL_CACHE_MAX 16 /* communicators a device keeps; the least recently used goes */
#define COLL_FINALIZE_S 5.0 /* how long close lets a communicator finalize before aborting it */

/* "sum" ... "avg" (enum coll_op: collective_math.h); coll_op_from_name: 0, or -1. */
const char *coll_op_name(enum coll_op op);
int coll_op_from_name(const char *name, enum coll_op *out);
/* Whether all-reduce takes buffers of this dtype (every typed dtype; not bytes). */
bool coll_dtype_supported(enum gpuq_dtype dtype);
#define COLL_DTYPE_LIST "u8, i32, i64, f16, bf16, f32, f64"

/* An opaque communicator id, as rank 0's backend made it. */
struct coll_id {
	unsigned char bytes[COLL_ID_BYTES];
};

/* Where the parts of one collective meet. */
struct coll_sync {
	pthread_mutex_t lock; /* guards arrived, gens and error */
	int arrived;
	uint64_t gens[GPUQ_MAX_DEVICES];   /* each rank's cached generation (0: none) */
	atomic_bool rank_arrived[GPUQ_MAX_DEVICES];
	_Atomic int64_t arrive_deadline_ns; /* the first arrival + the timeout */
	/* Written by the last arrival before all_arrived is set. */
	bool need_new;
	uint64_t new_gen;
	atomic_bool all_arrived;
	/* The id hand-off: rank 0 writes id, then sets id_ready. */
	struct coll_id id;
	atomic_bool id_ready;
	/* The first failure; every part reports it as the job's cause. */
	atomic_bool failed;
	struct gpuq_error error;
	/* The host backend's collective (collective_host.c). */
	atomic_uint host_arrive, host_finish;
	atomic_uint host_rank_started[GPUQ_MAX_DEVICES];  /* ops each rank has begun */
	atomic_uint host_rank_finished[GPUQ_MAX_DEVICES]; /* ops each rank has done */
	_Atomic(void *) host_group[GPUQ_MAX_DEVICES]; /* each rank's communicator group */
};

/*
 * One all-reduce (or its benchmark) across nranks devices. The inputs are
 * the main thread's, written before the job is queued; the outputs are
 * written by the ranks and read by the main thread once every part is back.
 */
struct allreduce_spec {
	/* Inputs. */
	enum coll_op op;
	enum gpuq_dtype dtype;
	uint64_t count; /* elements per rank */
	int nranks;
	int devices[GPUQ_MAX_DEVICES]; /* rank i runs on devices[i] */
	void *in[GPUQ_MAX_DEVICES], *out[GPUQ_MAX_DEVICES]; /* in == out: in place */
	double timeout_s;      /* arrival and the collective itself */
	double init_timeout_s; /* a communicator's creation (at least timeout_s) */
	bool bench;            /* WORK_ALLREDUCE_BENCH: the raw loop below */
	unsigned warmup, iters, repeats;
	int inject_hang_rank; /* fault-injection builds: this rank hangs (-1: none) */

	struct coll_sync sync;

	/* Outputs, one per rank. */
	double seconds[GPUQ_MAX_DEVICES];  /* the collective itself */
	bool created[GPUQ_MAX_DEVICES];    /* this job made the communicator */
	uint64_t generation[GPUQ_MAX_DEVICES];
	double bench_us[GPUQ_MAX_DEVICES]; /* bench: median time of one all-reduce */
};

/* Main thread: defaults (sum, no hang) and a fresh rendezvous; destroy undoes it. */
void coll_spec_init(struct allreduce_spec *spec);
void coll_spec_destroy(struct allreduce_spec *spec);

/*
 * One rank's view of the collective while it runs, handed to the backend's
 * collective operations. deadline and phase describe the current wait.
 */
struct coll_call {
	struct allreduce_spec *spec;
	struct work *work; /* this rank's part: its cancel flag */
	struct device *dev;
	int rank;
	double deadline; /* CLOCK_MONOTONIC seconds */
	const char *phase;  /* "the collective", "the communicator's creation", ... */
	double wait_start;  /* when the current wait began (for the back-off) */
	unsigned host_ops;  /* host backend: collectives this rank has begun in this job */
};

/*
 * Worker thread: runs this device's part of an all-reduce (WORK_ALLREDUCE)
 * or of its benchmark (WORK_ALLREDUCE_BENCH). 0, or -1 with work->error set
 * to the collective's first failure.
 */
int collective_run(struct device *dev, struct work *work);

/*
 * Worker thread, from the backend's close: finalizes and destroys every
 * cached communicator (in creation order, the same on every device, so that
 * ranks of one communicator meet) and frees the cache.
 */
void collective_device_close(struct device *dev);

/*
 * For the backends' waits. coll_wait_begin starts a wait of timeout_s
 * seconds described by phase; then, each turn, coll_poll returns 0 to go on
 * or -1 with err set (the collective failed elsewhere, this part was
 * cancelled, or the deadline passed: GPUQ_E_TIMEOUT), and coll_pause spins
 * for a while and then sleeps with a growing back-off.
 */
void coll_wait_begin(struct coll_call *call, double timeout_s, const char *phase);
int coll_poll(struct coll_call *call, struct gpuq_error *err);
void coll_pause(struct coll_call *call);

/* Whether the collective has failed (on any rank). */
bool coll_failed(const struct allreduce_spec *spec);

/* "devices 0,1,3" for messages. */
void coll_format_devices(const struct allreduce_spec *spec, char *out, size_t size);

/* Any thread: the median of n samples (sorts them). */
double coll_median(double *samples, unsigned n);

#endif
