/*
 * Which GPU each device index serves, and the buffers of GPUs this gpuqd
 * does not serve (docs/ARCHITECTURE.md, Durable state, "GPUs by uuid").
 *
 * gpuq's device index is a position in --devices (or CUDA_VISIBLE_DEVICES'
 * order), so the next gpuqd may give index 0 to another GPU. The state
 * record names each buffer's GPU by its uuid too, and a gpuqd taking the
 * record over puts each buffer back on the device that is that GPU now.
 * A buffer whose GPU it does not serve (left out of --devices, gone, or
 * one that did not open) is absent: not listed, its slab's descriptor kept
 * open here (and in the service manager's store) and its entry written
 * into every generation of the record, so that a later gpuqd that serves
 * the GPU again takes it over with its bytes. `devices` and the metrics
 * say what is held that way.
 *
 * Main thread only.
 */
#ifndef GPUQ_ABSENT_H
#define GPUQ_ABSENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/state_record.h"
#include "workers/backend/backend.h"

struct absent {
	/* The GPU each index serves: its uuid, "" until its device opened. */
	char uuid[GPUQ_MAX_DEVICES][SLAB_OWNER_MAX];
	int devices;
	/* Buffers of GPUs not served, as the record had them; slab_fd is ours (-1: none). */
	struct state_buffer *buffers;
	size_t n;
};

/* What absent buffers one GPU has (`devices`' `absent`, the metrics). */
struct absent_gpu {
	char uuid[SLAB_OWNER_MAX];
	unsigned buffers;
	uint64_t bytes;
};

struct worker_pool;

/*
 * Reads each device's uuid (those that opened) from the workers, once they
 * have opened: a device that failed its first open stays unhealthy until
 * gpuqd restarts, and a reset does not change which GPU a device is.
 */
void absent_learn_uuids(struct absent *a, struct worker_pool *pool);
/* The uuid of the GPU device index serves: "" when unknown (it never opened) or out of range. */
const char *absent_uuid_of(const struct absent *a, int index);
/* The index that serves the GPU whose uuid is uuid: -1 when none does (uuid "": none). */
int absent_index_of(const struct absent *a, const char *uuid);

/*
 * The index that serves the GPU a record entry names now: by its uuid
 * (-1: no device is that GPU), or its index device where the record has
 * no uuid (written before records had them). After the workers opened.
 */
int absent_device_now(const struct absent *a, const char *uuid, int device);
/*
 * Keeps b (its uuid set) absent, its slab's descriptor fd (-1: none) kept
 * open here; buffers of one slab share one descriptor, and a lost one holds
 * none (fd closed). 0, or -1 when the host is out of memory (fd is then the
 * caller's still).
 */
int absent_add(struct absent *a, const struct state_buffer *b, int fd);
/* The absent buffer name of owner: NULL when there is none. */
const struct state_buffer *absent_find(const struct absent *a, uid_t owner, const char *name);
/* The absent buffers, copied for the record: 0, or -1 when out of memory. */
int absent_copy(const struct absent *a, struct state_buffer **out, size_t *n);
/* Their distinct slab descriptors: how many there are. */
unsigned absent_slabs(const struct absent *a);
struct fd_store;
/*
 * Hands their slabs to the service manager's store, under their own names:
 * for an image whose predecessor kept nothing there (it did not use it).
 */
void absent_store(const struct absent *a, struct fd_store *store);
/*
 * Lets go of the buffers kept for the GPU uuid: their entries go, their
 * slabs leave the store (when it is used) and their descriptors close, so
 * that the memory they held on that GPU is freed. Into *buffers and
 * *bytes what went (0: none kept for that uuid).
 */
void absent_drop(struct absent *a, const char *uuid, struct fd_store *store, unsigned *buffers,
		 uint64_t *bytes);
/* A re-exec hands their descriptors over (inherit) or takes them back (its execve failed). */
void absent_inherit(const struct absent *a, int inherit);
/* Absent buffers by GPU into out (at most max): how many GPUs. */
size_t absent_by_gpu(const struct absent *a, struct absent_gpu *out, size_t max);
/* Closes the descriptors and forgets the buffers (gpuqd ends: the store, if any, keeps them). */
void absent_free(struct absent *a);

#endif
