/*
 * Host regions: a client's memfd that gpuqd maps and pins once (on a
 * device's worker, workers/transfer/region_pin.h) and keeps under a name of its
 * owner's until region_free (or, for an ephemeral region, until the
 * connection that made it closes). put and get move bytes between a range
 * of it and a buffer with one DMA. The registry is the main thread's alone;
 * workers see only the mapping's address in a work, and `users` (atomic),
 * which a region_free's work waits on.
 */
#ifndef GPUQ_REGION_H
#define GPUQ_REGION_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/buffer.h"
#include "protocol/protocol.h"

enum region_state { REGION_PINNING, REGION_READY, REGION_FREEING };

struct region {
	char name[BUFFER_NAME_MAX + 1];
	int device;         /* whose worker pinned it, on whose NUMA node */
	uid_t owner;
	uint64_t bytes;
	int fd;             /* gpuqd's own descriptor of the client's memfd (region_open hands it out) */
	void *map;          /* gpuqd's mapping, pinned; set once READY */
	enum region_state state;
	double created;     /* CLOCK_MONOTONIC seconds */
	double pin_s;       /* how long mapping and pinning took */
	int numa_node;      /* the node its pages were asked for (-1: none) */
	_Atomic unsigned users; /* jobs queued or running that move bytes through it */
	bool removed;       /* out of the registry; the struct goes with its last user */
	uint64_t conn_serial; /* ephemeral: the connection that made it (0: none) */
	bool orphaned;      /* ephemeral, and that connection has closed */
	uint64_t last_job;  /* the latest job that used it, for `busy` messages */
	struct region *next;
};

struct conn;
struct daemon;
struct job;

struct region_table {
	struct region *head;
	unsigned count;
	uint64_t pinned; /* bytes of every region in the table: what RLIMIT_MEMLOCK is checked against */
	/*
	 * Frees r, an orphaned ephemeral region that is READY and that no job
	 * uses, with a region_free job of gpuqd's own; a full queue leaves it
	 * READY. Set at start-up (main.c) to op_region.c's op_region_free_own:
	 * the job is the region_free op's, which this registry stays below.
	 */
	void (*free_orphan)(struct daemon *d, struct region *r);
};

const char *region_state_name(enum region_state state);

/* The region of owner called name, or NULL. */
struct region *region_find(struct region_table *t, uid_t owner, const char *name);
/*
 * The same, or NULL with not_found listing the owner's regions (as many as
 * fit, then how many more), as "your regions" when the caller is the
 * owner, else as uid N's.
 */
struct region *region_resolve(struct region_table *t, uid_t owner, uid_t caller, const char *name,
			      struct gpuq_error *err);
/* A new region in state PINNING, owning fd; NULL when memory runs out (fd is not closed). */
struct region *region_add(struct region_table *t, const char *name, int device, uid_t owner,
			  uint64_t bytes, int fd);
/* Takes r out of the registry (closing its descriptor); the struct goes with its last user. */
void region_remove(struct region_table *t, struct region *r);
/* A job lets go of r; frees a removed region's struct with its last user. */
void region_unhold(struct region *r);
/* 0 if jobs may move bytes through r now; -1 with `busy` saying why not. */
int region_check_usable(const struct region *r, struct gpuq_error *err);
/* Bytes of owner's regions (the host-pinned quota), and of the regions on device. */
uint64_t region_bytes_of(const struct region_table *t, uid_t owner);
uint64_t region_bytes_on(const struct region_table *t, int device, unsigned *count);

/*
 * Whether bytes more can be pinned under the daemon's RLIMIT_MEMLOCK
 * (regions counted, the staging rings not: the driver does not charge them).
 * -1 with out_of_memory naming the limit and LimitMEMLOCK= when not.
 */
int region_check_memlock(const struct region_table *t, const char *name, uint64_t bytes,
			 struct gpuq_error *err);
/* The daemon's RLIMIT_MEMLOCK in *bytes; false when it has none. */
bool region_memlock_limit(uint64_t *bytes);

/*
 * Ephemeral regions: regions_drop_conn orphans those of a connection that
 * closed (its CONN_CLOSED hook, server.h) and frees each that no job uses;
 * region_free_if_orphaned frees one once no job uses it (r may be NULL).
 */
void regions_drop_conn(struct daemon *d, struct conn *c);
void region_free_if_orphaned(struct daemon *d, struct region *r);
/*
 * A job lets go of its region (job_release): a region_free waiting for it
 * is woken, an orphaned ephemeral one freed once idle.
 */
void region_job_release(struct daemon *d, struct job *job);

/*
 * A re-exec (daemon/restart.c): keep true clears close-on-exec on every
 * region's descriptor so that the new image inherits it (false: sets it
 * again, the execve having failed). A descriptor that cannot be handed over
 * is logged; the new image then finds its region lost.
 */
void regions_inherit(struct region_table *t, bool keep);
/*
 * A re-exec, once the inherited connections serve again: an ephemeral
 * region taken over stays with its connection if that connection came
 * along, else it is freed as if the connection had closed.
 */
void regions_adopt_conns(struct daemon *d);

#endif
