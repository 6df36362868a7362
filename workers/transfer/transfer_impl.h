/*
 * What the three transfer paths share (transfer.c, transfer_staged.c,
 * transfer_registered.c). Not for use outside them.
 *
 * A struct xfer lives on the worker's stack for one put or get; the worker
 * owns it. Copy threads read its constant fields (fd, pos, verify) while
 * they run a chunk of it, and write only into their own chunk.
 */
#ifndef GPUQ_TRANSFER_IMPL_H
#define GPUQ_TRANSFER_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "workers/backend/backend.h"
#include "workers/sched/sched_wait.h"
#include "workers/transfer/copy_pool.h"
#include "workers/transfer/map_cache.h"
#include "workers/work.h"

/* How the bytes move; the job's result names it (`path`). */
enum xfer_path {
	XFER_STAGED,     /* copy threads pread/pwrite pinned slots in parallel, DMA per slot */
	XFER_STREAMED,   /* in order through the slots, read/written by the worker itself */
	XFER_REGISTERED, /* the client's mapping is pinned and copied directly */
	XFER_REGION,     /* a region, pinned when it was made (work->transfer.host): DMAs of 8 slots */
	XFER_RING,       /* a region's slots, handed over with the client chunk by chunk (transfer_ring.c) */
};

struct xfer {
	struct device *dev;
	struct work *work;
	struct gpuq_error *err;
	struct copy_pool *pool;
	struct sched_job *job; /* the running job, for its DMA turns (sched.h); NULL outside jobs */
	char *base;      /* the device range's start: dptr + offset */
	int fd;
	int fd_flags;    /* fcntl F_GETFL */
	bool regular;    /* a regular file or a memfd */
	mode_t mode;     /* its file type (st_mode), for the streamed path */
	bool tty;        /* a terminal */
	int pipe_size;   /* a pipe's capacity (F_GETPIPE_SZ); 0 otherwise or unknown */
	off_t size;      /* regular: its size when the job started */
	off_t pos;       /* regular: the descriptor's offset when the job started */
	uint64_t total;  /* bytes to move; a put without length moves up to this many */
	size_t chunk;    /* bytes per staging slot, a multiple of 8 */
	unsigned slots;  /* staging slots it may hold at once: the ring's; a put's, XFER_READ_AHEAD_BYTES' */
	bool verify;
	bool scratch;    /* no descriptor: put the random stream of seed, get into nothing */
	uint64_t seed;
	enum xfer_path path;
	uint64_t done;   /* bytes moved so far */
	bool publish_tail; /* tell the scheduler once the last DMA is issued (no device work follows) */
	double moved_at; /* streamed: when a byte last moved (or the transfer began) */
	double started;  /* when the transfer began (monotonic seconds) */
	uint64_t sum;    /* checksum terms of the bytes that passed through the host */
	bool eof;        /* streamed put: the source ended */
	/*
	 * Staged get into a descriptor open for reading and writing: the
	 * destination range mapped shared, written by memcpy (parallel pwrites
	 * to one file serialise on its inode lock). NULL: pwrite.
	 */
	unsigned char *map;
	size_t map_len;
	struct map_entry *map_entry; /* map's record in the device's kept mappings (map_cache.h) */
	unsigned char *map_data; /* the transfer's first byte in map */
};

/*
 * A staged chunk's bytes are read or written by several copy threads at
 * once, each taking a part of about XFER_PART_BYTES. Whole-slot tasks left
 * a get's DMAs waiting for slots and a put's first DMAs waiting for reads
 * (12 threads start 12 slots together; each took ~0.4 ms). On the H200
 * machine, 2 MiB slots, gets into a memfd's pages at 0.76-0.78 of pinned
 * went to 0.90-0.92 with 1 MiB parts, puts at 256 MiB from 0.77 to 0.84;
 * 512 KiB parts gained less and 256 KiB ones lost (docs/PERFORMANCE.md).
 */
#define XFER_PART_BYTES ((size_t)1 << 20)
#define XFER_MAX_PARTS 16

struct xfer_chunk;

/* One copy thread's share of a chunk: bytes [off, off + n) of it. */
struct xfer_part {
	struct copy_task task; /* first: the task is the part */
	struct xfer_chunk *chunk;
	size_t off, n;
	size_t got;   /* bytes read or written */
	int error;    /* errno of a failed read or write, else 0 */
	uint64_t sum; /* checksum terms of its bytes (verify) */
};

/* One slot's worth of a staged transfer, handed to the copy threads in parts. */
struct xfer_chunk {
	struct xfer_part part[XFER_MAX_PARTS];
	unsigned nparts;
	struct xfer *x;
	unsigned slot;      /* the staging slot it holds (sched_slot_acquire) */
	unsigned char *buf; /* that slot's memory */
	uint64_t at;        /* offset within the transfer */
	size_t n;           /* bytes to read or write */
	/* Once every part is done (chunk_gather): */
	size_t got;         /* bytes read or written before the first short part */
	int error;          /* the first part's error, else 0 */
	uint64_t sum;       /* checksum terms of buf[0, got) (verify) */
};

/* transfer.c */
/* Slots a put may hold: of a ring of `ring` (2 to 256) slots of `chunk` bytes, XFER_READ_AHEAD_BYTES' worth, two at least. */
unsigned xfer_put_slots(unsigned ring, size_t chunk);
int xfer_cancelled(struct xfer *x);
void xfer_progress(struct xfer *x);
/* The last DMA is issued: later jobs on the buffer may start (sched_publish_tail). */
void xfer_issued_all(struct xfer *x);
/* A staged DMA was issued: notes the first and the last in the work's timeline, if it has one. */
void xfer_dma_issued(struct xfer *x);
/*
 * Whether the job may queue a DMA in dir now (sched_dma_turn); with wait,
 * yields until it may (for a transfer with nothing else in flight to wait
 * for) and returns true.
 */
bool xfer_dma_turn(struct xfer *x, enum sched_dma dir, bool wait);

/* transfer_staged.c */
/*
 * A staged transfer of total bytes through slots of chunk bytes: how many
 * pieces, and piece k's offset and size (smaller pieces at both ends, see
 * transfer_staged.c). Pieces are in order, contiguous, at most a slot.
 */
uint64_t xfer_piece_count(uint64_t total, size_t chunk);
void xfer_piece(uint64_t total, size_t chunk, uint64_t k, uint64_t *at, size_t *n);
int xfer_put_staged(struct xfer *x);
int xfer_get_staged(struct xfer *x);

/* transfer_registered.c (and transfer_check_registrable, transfer.h) */
int xfer_put_registered(struct xfer *x);
int xfer_get_registered(struct xfer *x);
/* transfer_ring.c: a region's slots, handed over with the client through its counters. */
int xfer_ring(struct xfer *x, bool put);
/*
 * The whole range at host, pinned (a region's, the registered path's
 * mapping) <-> the device range, in chunks that take DMA turns.
 */
int xfer_pinned(struct xfer *x, bool put, void *host);

#endif
