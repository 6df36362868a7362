/*
 * A unit of work handed from the main thread to a device worker.
 *
 * The main thread fills in the inputs and submits it; from then until it
 * comes back through the completion queue the worker owns every field except
 * `cancel`, which the main thread may set at any time, and `phase`, which both
 * read atomically. The daemon embeds a struct work in each job.
 */
#ifndef GPUQ_WORK_H
#define GPUQ_WORK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "protocol/protocol.h"
#include "workers/backend/backend.h"
#include "workers/transfer/transfer_spec.h"
#include "workers/work_kinds.h"

/* One per row of workers/work_kinds.h, which says everything else about each. */
enum work_kind {
#define WORK_KIND_ENUM(kind, name, runner, engine, flags) WORK_##kind,
	WORK_KINDS(WORK_KIND_ENUM)
#undef WORK_KIND_ENUM
	WORK_KIND_COUNT
};

enum work_phase { WORK_QUEUED, WORK_RUNNING, WORK_FINISHED };

/*
 * A range of a buffer a work reads or writes: what the scheduler keeps in
 * order (workers/sched/sched.h). base is the buffer's device memory (its identity
 * while it lives), [off, off + len) the range.
 */
struct work_access {
	const void *base;
	uint64_t off, len;
	bool write;
};
#define WORK_MAX_ACCESS 16

struct work_result {
	uint64_t bytes;     /* bytes allocated, freed, moved, filled or hashed */
	uint64_t checksum;  /* WORK_CHECKSUM */
	double seconds;     /* time spent in the job on the worker */
	const char *path;   /* how bytes moved: "staged", ... (static string) */
	int numa_node;      /* WORK_REGION_MAP: the node the region's pages were asked for (-1: none) */
	int share_fd;       /* WORK_ALLOC with shareable: the exported handle, the daemon's to close */
	/*
	 * WORK_ALLOC: where the buffer lives (workers/buffer/slab.h): its
	 * slab's id (0: the pool, no slab) and its offset there, for the
	 * daemon's durable record.
	 */
	uint32_t slab;
	uint64_t slab_offset;
	uint64_t slab_bytes; /* the slab's size */
	int slab_fd;         /* the slab's descriptor: the backend's, open while the buffer lives */
};

struct work {
	enum work_kind kind;
	int device;

	/* Inputs. */
	void *dptr;        /* the buffer's device memory (WORK_ALLOC: set by the worker) */
	uint64_t length;   /* PUT/GET/FILL/CHECKSUM: bytes; ALLOC/FREE: the buffer's size */
	/* PUT/GET: the client's descriptor (-1: scratch or a region); REGION_MAP:
	 * the region's memfd. The daemon closes it when the job ends. */
	int fd;
	struct fill_spec fill;
	void *spec; /* a kind's own parameters (e.g. a chain), owned by the job */
	struct transfer_spec transfer; /* PUT/GET's own parameters (workers/transfer/transfer_spec.h) */
	/*
	 * REGION_MAP/UNMAP: the region's mapping is dptr, its size length, and
	 * UNMAP first waits until *users (the jobs the main thread still counts
	 * on the region) is 0.
	 */
	const _Atomic unsigned *users;
	/* ALLOC: a buffer that clients may attach, allocated on its own (backend.h alloc_shareable). */
	bool shareable;
	/* ATTACH: the lease's ledger entry, put in the attach's place once it is admitted (sched_queue.h). */
	struct work *hold;
	/*
	 * Progress of a long job: bytes moved so far and the total (0: unknown,
	 * as for a pipe). The worker stores them at each chunk; the main thread's
	 * progress timer (daemon/progress.c) reads them for progress events.
	 */
	_Atomic uint64_t progress_bytes;
	_Atomic uint64_t progress_total;
	/*
	 * PUT: a DMA into the buffer was issued, so a put that fails from now
	 * on may have written part of it (the main thread marks it suspect).
	 */
	atomic_bool dma_issued;

	/*
	 * Scheduling, set by the main thread before submission: the priority
	 * (enum gpuq_priority), whose share it draws on and with what weight,
	 * the buffer ranges it touches, and for alloc how long it may wait for
	 * memory (0: fail at once).
	 */
	int priority;
	uid_t owner_uid;
	double weight;
	uint64_t job_id; /* the job's id, for waiting reasons ("behind job 12") */
	struct work_access access[WORK_MAX_ACCESS];
	unsigned naccess;
	uint64_t wait_memory_ms;
	/*
	 * The device's resets the main thread had taken stock of when it queued
	 * the work (worker_enqueue): one that names buffers and comes to run
	 * after a later reset is refused, its buffers' memory gone with it.
	 */
	unsigned resets_known;

	/*
	 * The scheduler's (workers/sched/sched.c): the submission order, the ledger
	 * links (under the worker's lock), the lane and tail event while in
	 * flight. `waiting` and `waiting_job` say why the work waits, for the
	 * main thread to show (atomics: read without the lock).
	 */
	uint64_t seq;
	struct work *ledger_prev, *ledger_next;
	int sched_state; /* sched.c's enum */
	void *tail_event;
	void *_Atomic sched; /* the struct sched running it, once admitted (for sched_notify) */
	_Atomic int waiting;          /* enum sched_wait */
	_Atomic uint64_t waiting_job; /* the job it waits behind, where there is one */
	/*
	 * Admission's note of a queued work it found kept out (sched_queue.c):
	 * `blocker` is the earlier work whose presence, as it is now, keeps
	 * this one out (NULL: none known), and admission passes over this work
	 * until the blocker changes. The works a work keeps out so are its
	 * `held_back` list, linked through held_next and held_prev.
	 */
	struct work *blocker, *held_back, *held_next, *held_prev;

	/* Shared. */
	atomic_bool cancel;
	_Atomic int phase;  /* enum work_phase */
	double started_at;  /* CLOCK_MONOTONIC seconds; written before phase becomes RUNNING */

	/* Outputs, valid once the work comes back. */
	struct gpuq_error error; /* code GPUQ_OK on success */
	struct work_result result;

	/*
	 * Gangs: a job that runs on several devices at once (a collective, a peer
	 * copy) has one work per device, queued in one step by
	 * worker_submit_group. gang_size is how many; 1 for an ordinary job.
	 */
	unsigned gang_size;
	void *owner; /* the daemon's job; the worker never touches it */

	/* Queue link; owned by whichever queue holds the work. */
	struct work *next;
};

const char *work_kind_name(enum work_kind kind);

#endif
