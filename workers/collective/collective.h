/*
 * Collectives across device workers: the state the parts of one collective
 * job share (struct coll_spec: one primitive, or a group of them run as one
 * NCCL group), their rendezvous, the in-process hand-off of the
 * communicator id, and each device's cache of warm communicators.
 *
 * Threads and ownership.
 *   - The main thread fills a spec (coll_spec_init, then the inputs) before
 *     the job is queued, and reads the outputs after every part is back; it
 *     touches nothing else in it, but for coll_fail_withdrawn (the arrival
 *     deadline, which takes the sync lock).
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
#include "workers/backend/backend.h"
#include "protocol/collective_layout.h"
#include "protocol/collective_math.h"
#include "workers/work.h"

#define COLL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES; collective_cuda.c checks it */
#define COLL_CACHE_MAX 16 /* communicators a device keeps; the least recently used goes */
#define COLL_FINALIZE_S 5.0 /* how long close lets a communicator finalize before aborting it */
#define COLL_GROUP_MAX 64 /* primitives in one group (an all-to-all of 8 ranks as 64 sendrecvs) */

/*
 * Whether a primitive takes buffers of this dtype: reducing primitives every
 * typed dtype (not bytes), the others every dtype (bytes move as u8).
 */
bool coll_dtype_supported(enum coll_prim prim, enum gpuq_dtype dtype);
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
 * One primitive of a collective job, with each rank's buffers: in[r] and
 * out[r] point at rank r's first element, NULL where the layout has the
 * rank read or write nothing (broadcast's input off the root, reduce's
 * output off it, sendrecv's buffers off its two ends). In place they point
 * into one buffer as coll_in_place_offsets says.
 */
struct coll_task {
	struct coll_layout layout;
	enum coll_op op; /* reducing primitives */
	enum gpuq_dtype dtype;
	void *in[GPUQ_MAX_DEVICES], *out[GPUQ_MAX_DEVICES];
};

/*
 * One collective job (or its benchmark) across nranks devices: ntasks
 * primitives on the communicator of devices, issued by every rank as one
 * group. The inputs are the main thread's, written before the job is
 * queued; the outputs are written by the ranks and read by the main thread
 * once every part is back.
 */
struct coll_spec {
	/* Inputs. */
	int nranks;
	int devices[GPUQ_MAX_DEVICES]; /* rank i runs on devices[i] */
	struct coll_task *tasks;       /* ntasks (1 to COLL_GROUP_MAX), owned by the job */
	int ntasks;
	bool group;                    /* a group request (messages say "group") */
	double timeout_s;       /* the collective itself, from its launch */
	double init_timeout_s;  /* a communicator's creation (at least timeout_s) */
	double arrive_deadline; /* CLOCK_MONOTONIC seconds: submission + timeout */
	bool bench;             /* WORK_COLLECTIVE_BENCH: the raw loop below */
	unsigned warmup, iters, repeats;
	int inject_hang_rank; /* fault-injection builds: this rank hangs (-1: none) */

	struct coll_sync sync;

	/* Outputs, one per rank. */
	double seconds[GPUQ_MAX_DEVICES];  /* the collective itself */
	bool created[GPUQ_MAX_DEVICES];    /* this job made the communicator */
	uint64_t generation[GPUQ_MAX_DEVICES];
	double bench_us[GPUQ_MAX_DEVICES]; /* bench: median time of one run of the group */
};

/* Main thread: no tasks, no hang, and a fresh rendezvous; destroy undoes it. */
void coll_spec_init(struct coll_spec *spec);
void coll_spec_destroy(struct coll_spec *spec);

/* What the job is called in messages: its primitive's name, or "group". */
const char *coll_spec_name(const struct coll_spec *spec);

/*
 * One rank's view of the collective while it runs, handed to the backend's
 * collective operations. deadline and phase describe the current wait.
 */
struct coll_call {
	struct coll_spec *spec;
	struct work *work; /* this rank's part: its cancel flag */
	struct device *dev;
	int rank;
	double deadline; /* CLOCK_MONOTONIC seconds */
	const char *phase;  /* "the collective", "the communicator's creation", ... */
	double wait_start;  /* when the current wait began (for the back-off) */
	unsigned host_ops;  /* host backend: collectives this rank has begun in this job */
};

/*
 * Worker thread: runs this device's part of a collective (WORK_COLLECTIVE)
 * or of its benchmark (WORK_COLLECTIVE_BENCH). 0, or -1 with work->error
 * set to the collective's first failure.
 */
int collective_run(struct device *dev, struct work *work);

/*
 * Worker thread, from the backend's close: finalizes and destroys every
 * cached communicator (in creation order, the same on every device, so that
 * ranks of one communicator meet) and frees the cache.
 */
void collective_device_close(struct device *dev);

/*
 * Main thread, at the arrival deadline: the ranks marked in withdrawn were
 * still queued and have been taken out of their queues. Records their
 * timeout as the collective's failure (so that the ranks that started stop
 * at their next poll) and sets err to the collective's first failure, which
 * each withdrawn part reports.
 */
void coll_fail_withdrawn(struct coll_spec *spec, const bool *withdrawn, struct gpuq_error *err);

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
bool coll_failed(const struct coll_spec *spec);

/* "allreduce over devices 0,1,3" for messages. */
void coll_format_devices(const struct coll_spec *spec, char *out, size_t size);

/* Any thread: the median of n samples (sorts them). */
double coll_median(double *samples, unsigned n);

#endif
