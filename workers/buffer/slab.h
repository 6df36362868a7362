/*
 * Slabs: device memory held in pieces that a descriptor can hold
 * (docs/ARCHITECTURE.md, Durable state). A slab is one exportable
 * allocation that a backend makes (CUDA: cuMemCreate with a POSIX
 * file-descriptor handle, reserved, mapped and made accessible; host: a
 * memfd mapped shared) and that a descriptor opens, so that a later
 * process can take the memory over. A heap hands out ranges of slabs:
 * small buffers are carved from shared slabs of `carve_bytes`, so a 4 KiB
 * buffer does not cost a whole granule; large ones, and those that
 * clients may attach, get a slab of their own rounded up to the
 * granularity.
 *
 * Carving keeps, per slab, an array of extents in address order that
 * covers it (used or free); an allocation takes the first free extent that
 * fits (first fit, across slabs in the order they were made) and splits
 * it, and a free merges the extent with free neighbours, so a slab whose
 * ranges are all freed is one free extent again. Every operation is linear
 * in the extents of a slab and the slabs of the heap: enough for the
 * thousands of buffers a device holds; a tree is the next step if not.
 *
 * Empty slabs are kept for reuse up to `keep_bytes` (the pool's release
 * threshold, --pool-release), plus one carved slab always, so that a small
 * allocation after a free costs no driver call; a creation that runs out
 * of memory first gives every kept slab back and tries again. A slab whose
 * descriptor was handed out (SLAB_EXPORTED) is never kept: its memory
 * must not reach another buffer while a client may still map it.
 *
 * Threads: a heap has a lock, since the host backend frees on its compute
 * engine's thread; the backend's create and destroy run under it. Freeing
 * is not ordered with the device's streams: the caller frees a range only
 * once the work queued on it has finished.
 */
#ifndef GPUQ_SLAB_H
#define GPUQ_SLAB_H

#include <stdbool.h>
#include <stdint.h>

#include "protocol/protocol.h"

/* Where ranges start within a slab: what cudaMalloc promises. */
#define SLAB_ALIGN 256u

/* One exportable allocation, as its backend made it. */
struct slab_mem {
	void *base;      /* where this process maps it */
	uint64_t bytes;  /* its size, a multiple of the granularity */
	int fd;          /* opens this allocation alone; destroy closes it (-1: taken away) */
	uint64_t handle; /* the backend's own (CUDA: the CUmemGenericAllocationHandle) */
};

/*
 * What a backend implements. create makes bytes (a multiple of granularity)
 * of exportable memory, mapped for the device: 0, or -1 with err
 * (out_of_memory when the device is full, in the backend's words). destroy
 * unmaps and releases it and closes its descriptor; with `lost` (the device's
 * context is gone: a fault) it asks nothing of the device and only closes
 * what this process holds.
 */
struct slab_backend {
	uint64_t granularity;
	int (*create)(void *ctx, uint64_t bytes, struct slab_mem *mem, struct gpuq_error *err);
	void (*destroy)(void *ctx, struct slab_mem *mem, bool lost);
	/*
	 * Maps a slab an earlier gpuqd made, from its descriptor fd (bytes
	 * long), for the device: 0 with *mem (mem->fd is fd), or -1 with err
	 * naming the call that refused. NULL: the backend cannot (slab_adopt
	 * says so).
	 */
	int (*import)(void *ctx, int fd, uint64_t bytes, struct slab_mem *mem, struct gpuq_error *err);
	void *ctx;
};

/* slab_alloc's flags. */
#define SLAB_OWN 1u      /* a slab of its own, never carved */
#define SLAB_EXPORTED 2u /* its descriptor goes to clients: own, and never kept after its free */

/* Where a range lives. */
struct slab_place {
	void *ptr;           /* the range's first byte */
	uint32_t slab;       /* the slab's id in its heap, from 1, never reused */
	uint64_t offset;     /* where the range starts in the slab */
	uint64_t bytes;      /* bytes asked for */
	uint64_t length;     /* bytes reserved: the request rounded up to SLAB_ALIGN, or the whole slab */
	uint64_t slab_bytes; /* the slab's size */
	int fd;              /* the slab's descriptor: the heap's, valid while the range lives */
	bool own;            /* the range is the slab's only one */
};

/* The largest empty slab of its own kept beyond --pool-release: the last one freed. */
#define SLAB_KEEP_LAST_MAX ((uint64_t)1 << 30)

struct slab_stats {
	unsigned slabs;        /* slabs held, kept ones included */
	unsigned kept;         /* empty slabs kept for reuse */
	uint64_t mapped_bytes; /* the size of every slab held */
	uint64_t used_bytes;   /* bytes handed out (ranges, as reserved) */
	uint64_t created, destroyed; /* slabs made and given back since the heap began */
};

struct slab_heap;

/*
 * Someone outside the process that holds slabs' descriptors too (the
 * service manager's descriptor store, daemon/fd_store.h), so that the
 * memory outlives a crash. The heap calls hold as a slab is made (or a
 * kept one serves again) and release as a slab becomes empty (kept or
 * given back), under its lock, from whichever thread made or freed into
 * the slab: at that moment the descriptor is the heap's and open, so its
 * number cannot name anything else. Adopted
 * slabs are held already (they came from the keeper, or from an image
 * that gave them to it) unless adopted_unheld says otherwise. NULL hooks:
 * none.
 */
/* The longest owner a keeper names slabs by (a device's uuid), with its NUL. */
#define SLAB_OWNER_MAX 64
/* The longest name a keeper gives a slab, with its NUL: room for an owner, an id and a prefix. */
#define SLAB_NAME_MAX 96

struct slab_keeper {
	void (*hold)(void *ctx, const char *owner, uint32_t slab, int fd);
	void (*release)(void *ctx, const char *owner, uint32_t slab);
	/*
	 * An adopted slab that the keeper holds under another name (one an
	 * older gpuqd gave it) is held under its own from now on: called by
	 * the worker that adopted it, before it serves, its descriptor open.
	 * NULL: names never change.
	 */
	void (*rename)(void *ctx, const char *held_as, const char *owner, uint32_t slab, int fd);
	void *ctx;
	bool adopted_unheld; /* the previous image kept nothing: adopted slabs are held as made ones */
};

/*
 * A heap over be's slabs: carve_bytes (rounded up to the granularity) is
 * the size of the slabs small buffers share; keep_bytes as above. NULL when
 * the host is out of memory.
 */
struct slab_heap *slab_heap_create(const struct slab_backend *be, uint64_t carve_bytes,
				   uint64_t keep_bytes);

/*
 * Slabs this heap makes from now on are held by keeper (copied; NULL:
 * none), named by owner: the device's uuid, which stays its name when
 * another gpuqd serves the device under another index. Call before the
 * heap serves.
 */
void slab_heap_set_keeper(struct slab_heap *h, const struct slab_keeper *keeper, const char *owner);
/*
 * Gives every slab back (destroy with `lost`), the keeper releasing each
 * first, and frees the heap. h may be NULL. (A keeper that should keep
 * the slabs of a gpuqd that stops ignores the release: daemon/fd_store.h.)
 */
void slab_heap_destroy(struct slab_heap *h, bool lost);
/*
 * A faulted context's heap: every slab is unmapped as far as the driver
 * lets (destroy with `lost`), but the descriptors of those holding buffers
 * stay open, and with the keeper (their names in the descriptor store), so
 * that the memory outlives the context for a re-exec (docs/ARCHITECTURE.md,
 * Durable state). Empty slabs are given back whole. Returns what was kept
 * (NULL: nothing, or no host memory to list it, and then nothing is kept);
 * frees the heap. h may be NULL.
 */
struct slab_kept;
struct slab_kept *slab_heap_destroy_keeping(struct slab_heap *h);
/* The kept slabs go after all: the keeper lets each go, then its descriptor closes. k may be NULL. */
void slab_kept_close(struct slab_kept *k);

/*
 * A range of at least bytes (0 takes SLAB_ALIGN) with flags SLAB_*: carved when small
 * (at most a quarter of a carved slab) and not SLAB_OWN, else a slab of its
 * own. 0 with *out filled, or -1 with err (the backend's, or out_of_memory
 * for the host's own bookkeeping).
 */
int slab_alloc(struct slab_heap *h, uint64_t bytes, unsigned flags, struct slab_place *out,
	       struct gpuq_error *err);
/*
 * Frees the range that starts at ptr; a slab left empty is kept or given
 * back (above). 0, or -1 when no range starts at ptr (nothing changes).
 * *bytes (may be NULL) gets the bytes its allocation asked for.
 */
int slab_free(struct slab_heap *h, void *ptr, uint64_t *bytes);
/* Where the range that starts at ptr lives: 0, or -1 when no range starts there. */
int slab_place_of(struct slab_heap *h, const void *ptr, struct slab_place *out);
void slab_heap_stats(struct slab_heap *h, struct slab_stats *out);

/* A range that an adopted slab held in the process that made it. */
struct slab_range {
	uint64_t offset; /* where it starts in the slab (a multiple of SLAB_ALIGN) */
	uint64_t bytes;  /* what its allocation asked for */
};

/*
 * Takes over a slab an earlier gpuqd made (a re-exec: docs/ARCHITECTURE.md,
 * Durable state): imports it from fd (bytes long) under its old id, with
 * ranges[0..n) used as they were; the rest of the slab is free. A slab with
 * one range from offset 0 that is larger than a quarter of a carved slab,
 * or `exported`, is a slab of its own, as slab_alloc would have made it.
 * The heap takes fd whatever happens: 0 with *base (where the slab now
 * lies; a range's pointer is base + offset), fd closed with the slab; -1
 * with err, fd closed: the id is taken, a range lies outside the slab or
 * overlaps another, or the backend refused.
 */
int slab_adopt(struct slab_heap *h, uint32_t id, int fd, uint64_t bytes, bool exported,
	       const struct slab_range *ranges, size_t n, void **base, struct gpuq_error *err);

#endif
