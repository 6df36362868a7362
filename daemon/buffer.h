/*
 * Named buffers: device memory that outlives jobs, named by its owner.
 * The registry is the main thread's alone; workers see only pointers handed
 * to them in a struct work.
 */
#ifndef GPUQ_BUFFER_H
#define GPUQ_BUFFER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "protocol/protocol.h"

#define BUFFER_NAME_MAX 64
#define BUFFER_SHAPE_MAX 8

/*
 * The shape a client gave the buffer's elements (alloc or put `shape`):
 * gpuqd only keeps it and shows it in `buffers`, so that another process
 * reads back the array it was given. Its dimensions multiply to count.
 */
struct buffer_shape {
	bool given; /* false: no shape was given; `buffers` then shows none */
	unsigned ndim;
	uint64_t dim[BUFFER_SHAPE_MAX];
};

/* LOST: its device was reset after a fault; it names no memory, and only free takes it. */
enum buffer_state { BUFFER_ALLOCATING, BUFFER_READY, BUFFER_FREEING, BUFFER_LOST };

struct buffer {
	char name[BUFFER_NAME_MAX + 1];
	int device;
	uid_t owner;
	enum gpuq_dtype dtype;
	uint64_t count;
	uint64_t bytes;
	void *dptr; /* valid once READY */
	/* Where it lives once READY: its slab (workers/buffer/slab.h; 0: the pool) and offset there. */
	uint32_t slab;
	uint64_t slab_offset;
	/*
	 * The slab's size and descriptor (the backend's: never closed here),
	 * which a re-exec keeps open for the next image; -1 for the pool.
	 */
	uint64_t slab_bytes;
	int slab_fd;
	/* Set when it was read back from the record suspect: why (state `suspect`); a fill or a whole put clears it. */
	char *suspect;
	/* State `lost`: how ("when gpu 1 was reset after ...", "in the re-exec (...)"); NULL: unknown. */
	char *lost_why;
	enum buffer_state state;
	double created; /* CLOCK_MONOTONIC seconds */
	/*
	 * Tells this buffer from every other that had its name and device: a
	 * client that keeps a mapping of it (attach) reuses the mapping only
	 * while the generation is the same. Unique across restarts too.
	 */
	uint64_t generation;
	unsigned users; /* jobs queued or running on it */
	bool removed;   /* freed and out of the registry; the struct goes with its last user */
	uint64_t last_job; /* the latest job that used it, for `busy` messages */
	/*
	 * A shareable buffer (alloc shareable: true) is an allocation of its
	 * own that clients may attach; share_fd is the descriptor that opens
	 * it (and nothing else), sent to each client that attaches; closed
	 * when the buffer leaves the registry. -1 for a pool buffer.
	 */
	bool shareable;
	int share_fd;
	unsigned leases; /* leases held or waiting on it (daemon/lease.h) */
	/*
	 * An ephemeral buffer (alloc ephemeral: true) goes with the connection
	 * that made it: its serial, 0 for an ordinary buffer, which outlives
	 * every connection. Once that connection has closed the buffer is
	 * orphaned, and freed as soon as no job holds it.
	 */
	uint64_t conn_serial;
	bool orphaned;
	struct buffer_shape shape;
	struct buffer *next;
};

struct conn;
struct daemon;

struct buffer_table {
	struct buffer *head;
	unsigned count;
	/*
	 * Frees b, an orphaned ephemeral buffer that is READY and that nothing
	 * holds, with a job of gpuqd's own; a full queue leaves it as it was.
	 * Set at start-up (main.c) to op_buffer.c's op_free_own: the job is
	 * the free op's, which this registry stays below.
	 */
	void (*free_orphan)(struct daemon *d, struct buffer *b);
	/*
	 * Buffers of GPUs this gpuqd does not serve (daemon/absent.h), for the
	 * not_found message of a name that is one of them (NULL: none).
	 */
	const struct absent *absent;
};

const char *buffer_state_name(enum buffer_state state);

/* 0 if name is a valid buffer name, else -1 with a bad_request saying why. */
int buffer_name_check(const char *name, struct gpuq_error *err);
/* The same for a region's name (regions are named as buffers are), worded as a region's. */
int region_name_check(const char *name, struct gpuq_error *err);

/*
 * Splits "NAME" or "NAME@GPU" into name and device (-1 when absent).
 * -1 with a bad_request naming `field` when malformed.
 */
int buffer_ref_parse(const char *ref, const char *field, char name[BUFFER_NAME_MAX + 1],
		     int *device, struct gpuq_error *err);

/*
 * A reference with an optional byte range, as put, get and copy take it:
 * NAME, NAME@GPU, either followed by [START:STOP], [START:] (to the end)
 * or [:STOP] (from 0): bytes START up to STOP, STOP excluded, as a Python
 * slice reads. START and STOP are sizes (4096, 64K, 1.5G). "w0@1[4K:1M]" is
 * the 1 MiB - 4 KiB of w0 on GPU 1 from byte 4096 up to byte 1048576.
 * The parsed form keeps offset and length (STOP - START).
 */
struct buffer_ref {
	char name[BUFFER_NAME_MAX + 1];
	int device;      /* -1 when no @GPU was given */
	bool has_range;  /* a [...] part was given */
	uint64_t offset; /* 0 unless given */
	bool has_length; /* false: to the end of the buffer */
	uint64_t length;
};

/* Splits ref as above; -1 with a bad_request naming `field` when malformed. */
int buffer_ref_parse_range(const char *ref, const char *field, struct buffer_ref *out,
			   struct gpuq_error *err);
/* The same for a reference to a region (put's and get's `region`): its name errors say so. */
int region_ref_parse_range(const char *ref, const char *field, struct buffer_ref *out,
			   struct gpuq_error *err);

/*
 * Checks [offset, offset + length) against b's size; without has_length the
 * range runs to the end of b. Sets *out_length. -1 with a bad_request naming
 * the buffer, its size and the range when it does not lie inside b.
 */
int buffer_range_check(const struct buffer *b, uint64_t offset, bool has_length,
		       uint64_t length, uint64_t *out_length, struct gpuq_error *err);

/* The buffer of owner called name on device, or NULL. */
struct buffer *buffer_find(struct buffer_table *t, uid_t owner, const char *name, int device);

/*
 * Resolves a reference for owner: device -1 means "wherever it is", which
 * must be exactly one place. not_found lists the owner's buffers on that
 * device (as many as fit, then how many more), as "your buffers" when the
 * caller is the owner, else as uid N's, and tells root (caller 0) of
 * another uid's buffer of that name and how to name it (`owner`); an
 * ambiguous name lists the devices holding it.
 */
struct buffer *buffer_resolve(struct buffer_table *t, uid_t owner, uid_t caller, const char *name,
			      int device, struct gpuq_error *err);

/*
 * The names a not_found lists ("w0@0, w1@0, grads@1", or regions' "r0,
 * r1"), in out: each that fits whole, then "and N more" for the rest, room
 * for which is kept while more follow; "none" for none. total: how many
 * buffer_names_add will be given.
 */
struct buffer_names {
	char *out;
	size_t size, used;
	unsigned left, more;
};
void buffer_names_begin(struct buffer_names *l, char *out, size_t size, unsigned total);
/* name, with @device unless device is -1 */
void buffer_names_add(struct buffer_names *l, const char *name, int device);
void buffer_names_end(struct buffer_names *l);
/* Whose names a not_found lists: "your", or "uid 1000's" when root looked in another's. */
void buffer_whose(uid_t owner, uid_t caller, char *out, size_t size);

/* A new buffer in state ALLOCATING, or NULL when memory runs out. */
struct buffer *buffer_add(struct buffer_table *t, const char *name, int device, uid_t owner,
			  enum gpuq_dtype dtype, uint64_t count, uint64_t bytes);
/*
 * Takes b out of the registry. A job may still hold it (one that ended on
 * the device before the free but not yet on the host, such as a get still
 * writing out): the struct is then freed by the last buffer_unhold.
 */
/* b may hold a half-written job's bytes: listed `suspect`, with why, until written whole. */
void buffer_mark_suspect(struct buffer *b, const char *why);
/* b was written whole (a fill, a put of every byte): no longer suspect. */
void buffer_clear_suspect(struct buffer *b);
void buffer_remove(struct buffer_table *t, struct buffer *b);
/* A job lets go of b (users--), freeing a removed buffer's struct with its last user. */
void buffer_unhold(struct buffer *b);

/* Bytes held by buffers on device. */
uint64_t buffer_bytes_on(const struct buffer_table *t, int device);
/* Buffers listed on device (lost ones included). */
/*
 * A free of b failed: b serves again as it was, unless a device reset
 * marked it lost meanwhile (the free was queued, or refused because of
 * that reset): its memory is gone, and it stays lost, never READY.
 */
void buffer_free_failed(struct buffer *b);
unsigned buffer_count_on(const struct buffer_table *t, int device);
/*
 * Device was reset: its buffers name no memory any more, and their refusals
 * say `why` ("when gpu 1 was reset after ..."). Returns how many were
 * marked lost (those lost before keep their own cause).
 */
unsigned buffer_mark_lost(struct buffer_table *t, int device, const char *why);

/* 0 if jobs may use b now; -1 with `busy` saying why not. */
int buffer_check_usable(const struct buffer *b, struct gpuq_error *err);

/*
 * Ephemeral buffers (alloc ephemeral: true): buffers_drop_conn orphans those
 * of a connection that closes (its CONN_CLOSING hook, server.h) and frees
 * each that nothing holds;
 * buffer_free_if_orphaned frees one once nothing holds it (b may be NULL);
 * buffers_free_orphans retries every one (a full queue refused a free).
 */
void buffers_drop_conn(struct daemon *d, struct conn *c);
void buffer_free_if_orphaned(struct daemon *d, struct buffer *b);
void buffers_free_orphans(struct daemon *d);
/*
 * A job or a lease lets go of b (buffer_unhold); then, with free_orphan, an
 * orphaned ephemeral buffer that nothing else holds is freed. b may be
 * freed here: the caller reads it no more.
 */
void buffer_let_go(struct daemon *d, struct buffer *b, bool free_orphan);

#endif
