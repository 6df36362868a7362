/*
 * The durable state record (docs/ARCHITECTURE.md, Durable state): what a
 * later gpuqd needs to take over the buffers this one holds, kept in a
 * memfd that outlives the process as long as a descriptor does (the
 * re-exec and the service manager's descriptor store, later stages).
 *
 * Format. A memfd holds two slot headers at fixed places (slot 0 at byte
 * 0, slot 1 at byte 64) and, elsewhere in the file, each slot's payload.
 * A header (struct state_record_header, host byte order: gpuqd runs on
 * little-endian x86-64) carries a magic, the format version, a
 * generation, where its payload lies, its length and checksum, and a
 * checksum of the header itself. Generation g + 1 is written into the
 * slot that does not hold g, payload first and header last, each slot
 * in an area of its own (a payload that outgrows its area gets a new one
 * at the end of the file), so writing g + 1 never touches g: a crash in
 * the middle leaves g readable. A reader takes the slot of the highest
 * generation whose header and payload checksums hold; a record whose
 * newest intact header says a newer format version is refused, never
 * read as an older one.
 *
 * The payload is msgpack: a map of `version`, `backend`, `devices`,
 * `buffers`, `regions`, `leases`, `quota` and `absent` (state_snapshot_encode
 * says each field), so that fields can be added without a new version; a
 * new version is for what an older reader must not misread.
 *
 * Devices are named twice: by gpuq's index (`device`), which means another
 * GPU to a gpuqd started with other --devices, and by the GPU's `uuid`,
 * which a reader goes by where the record has it. `absent` lists buffers
 * of GPUs the writer did not serve (their memory kept, for a gpuqd that
 * serves the GPU again: daemon/absent.h), in the fields of `buffers`.
 *
 * Threads: the main thread only (it owns every table the record copies).
 */
#ifndef GPUQ_STATE_RECORD_H
#define GPUQ_STATE_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "daemon/buffer.h"
#include "workers/buffer/slab.h"
#include "protocol/protocol.h"

/*
 * 2: slabs are stored under their GPU's uuid and buffers of GPUs not served
 * are kept in `absent` (daemon/absent.h); a gpuqd that reads only 1 would
 * lose both, so it refuses the record (a restart into it is refused)
 * rather than take it over. Version 1 records read as before.
 */
#define STATE_RECORD_VERSION 2u
#define STATE_RECORD_MAGIC "GPUQREC" /* 8 bytes with its NUL */
#define STATE_RECORD_SLOTS 2

struct state_record_header {
	char magic[8];
	uint32_t version;
	uint32_t slot;         /* where this header lives: 0 or 1 */
	uint64_t generation;   /* 1, 2, ...: 0 never written */
	uint64_t offset;       /* where the payload lies in the memfd */
	uint64_t capacity;     /* the payload's area there */
	uint64_t length;       /* bytes of payload */
	uint64_t checksum;     /* of the payload (protocol/hash.h) */
	uint64_t header_check; /* of every byte above */
};
_Static_assert(sizeof(struct state_record_header) == 64, "a slot header is 64 bytes");

/* What the record says, copied out of the daemon's tables. */
struct state_buffer {
	char name[BUFFER_NAME_MAX + 1];
	uint32_t owner;
	int device;
	enum gpuq_dtype dtype;
	uint64_t count, bytes;
	uint32_t slab;        /* its slab (workers/buffer/slab.h), 0: the pool, no slab */
	uint64_t slab_offset; /* where it starts in the slab */
	uint64_t slab_bytes;  /* the slab's size (0: unknown, a record before re-exec could read it) */
	int slab_fd;          /* the slab's descriptor, as numbered in this process (-1: none) */
	bool shareable, ephemeral;
	uint64_t conn_serial; /* an ephemeral buffer's connection (its serial survives a re-exec) */
	char state[16];       /* buffer_state_name's word, or "suspect" */
	char suspect[200];    /* state "suspect": why */
	char lost[400];       /* state "lost": how, as its refusals word it ("when gpu 1 was reset after ...") */
	char shape[200];      /* the shape a client gave it, "2,3,4" ("": none) */
	char uuid[SLAB_OWNER_MAX]; /* its GPU's ("": a record from before uuids; go by device) */
	/*
	 * Jobs that were writing it when the record was written (from their
	 * submission to their end): a reader that finds it non-zero marks the
	 * buffer suspect, since those jobs died with the process.
	 */
	unsigned writers;
};

struct state_region {
	char name[BUFFER_NAME_MAX + 1];
	uint32_t owner;
	int device;
	uint64_t bytes;
	int fd; /* gpuqd's descriptor of the client's memfd, as numbered in this process */
	bool ephemeral;
	uint64_t conn_serial; /* an ephemeral region's connection (0: none, or a record before it was kept) */
	uint64_t created_ms;  /* CLOCK_MONOTONIC, which a re-exec keeps (0: unknown) */
	char uuid[SLAB_OWNER_MAX]; /* its device's GPU ("": unknown; go by device) */
};

struct state_lease {
	uint64_t id; /* its attach job's id */
	char buffer[BUFFER_NAME_MAX + 1];
	uint32_t buffer_owner;
	int device;
	uint32_t uid; /* the holder */
	int32_t pid;
	bool write;
	uint64_t conn_serial; /* the holder's connection: the lease ends when it closes (0: unknown) */
	uint64_t since_ms;    /* the grant, CLOCK_MONOTONIC, which a re-exec keeps (0: unknown) */
	char uuid[SLAB_OWNER_MAX]; /* its buffer's GPU ("": unknown; go by device) */
	bool revocable; /* then lock_fd is its lock, as numbered in this process */
	int lock_fd;
};

/* A user's quota usage: the bytes its buffers and regions hold. */
struct state_quota {
	uint32_t uid;
	uint64_t buffer_bytes, region_bytes;
};

struct state_snapshot {
	char backend[16];
	int devices;
	uint64_t recoveries; /* times gpuqd came back from the descriptor store after dying (0 when absent) */
	uint64_t job_ids_below; /* every job id given out so far is below it (0 when absent) */
	bool stopped; /* written as gpuqd stopped cleanly, not died (false when absent) */
	struct state_buffer *buffers;
	size_t nbuffers;
	struct state_region *regions;
	size_t nregions;
	struct state_lease *leases;
	size_t nleases;
	struct state_quota *quotas;
	size_t nquotas;
	/*
	 * Buffers of GPUs the writer did not serve, by uuid (device -1): their
	 * slabs kept (slab_fd, in the store) for a gpuqd that serves the GPU.
	 */
	struct state_buffer *absent;
	size_t nabsent;
};

/*
 * Why a buffer read back from a record is suspect, into why (size n): NULL
 * when it is not. A buffer that jobs were writing when the record was
 * written may hold half their bytes; the reader lists it, lets it be read,
 * and says so in its state, never as fine.
 */
const char *state_buffer_suspect(const struct state_buffer *b, char *why, size_t n);

/* Packs s into out (an initialised sbuffer). */
void state_snapshot_encode(const struct state_snapshot *s, msgpack_sbuffer *out);
/*
 * Unpacks a payload into *s (zeroed first; state_snapshot_free releases
 * it). 0, or -1 with err (io_error) naming what is malformed.
 */
int state_snapshot_decode(const void *data, size_t len, struct state_snapshot *s,
			  struct gpuq_error *err);
void state_snapshot_free(struct state_snapshot *s);

/* A record this process writes: its memfd and the generation it wrote last. */
struct state_record;

/* A new, empty record in a memfd of its own. NULL with err (io_error). */
struct state_record *state_record_create(struct gpuq_error *err);
/* The memfd, the record's (close with state_record_close). */
int state_record_fd(const struct state_record *r);
/* The generation written last (0: none). */
uint64_t state_record_generation(const struct state_record *r);
/* Writes payload as the next generation (above). 0, or -1 with err (io_error). */
int state_record_write(struct state_record *r, const void *payload, size_t len,
		       struct gpuq_error *err);
void state_record_close(struct state_record *r);
/*
 * Takes over the record in fd (handed over by a re-exec, or kept by the
 * service manager's descriptor store through a crash), so that one memfd
 * serves the service's whole life and a copy of it held elsewhere never
 * goes stale: the next generation written follows the newest intact one
 * and goes into the other slot, in an area of its own (whatever that slot
 * held, torn or older, is never read again). Takes fd whatever happens: a
 * record, or NULL with err (unsupported_version for a newer format,
 * io_error for one no slot of which checks out or that cannot be read; fd
 * closed). A record never written is taken over at generation 0.
 */
struct state_record *state_record_adopt(int fd, struct gpuq_error *err);

/*
 * Reads the newest intact generation of the record in fd (any record,
 * this process's or one handed over): 0 with *payload (malloc'd, the
 * caller's), *len and *generation; 1 when the record was never written;
 * -1 with err: unsupported_version for a newer format, io_error for a
 * record no slot of which checks out, or one that cannot be read.
 */
int state_record_read(int fd, void **payload, size_t *len, uint64_t *generation,
		      struct gpuq_error *err);

#endif
