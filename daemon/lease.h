/*
 * Leases: a client process that attaches a shareable buffer maps the
 * device memory into its own CUDA context (or, on the host backend, the
 * memfd the arena piece lives in) and holds a lease on it, read or
 * read-write, until it releases it, its connection closes, or root or the
 * admin group breaks it. The scheduler honours a lease as it honours a job:
 * each lease is a ledger entry on the buffer's device holding a read or
 * write access on the whole buffer (workers/sched/sched_queue.h sched_hold), so
 * daemon jobs that conflict with it wait behind it (waiting_reason
 * `lease`), and jobs that only read pass a read lease. The table is the
 * main thread's; the entry (`hold`) is the worker's ledger's between the
 * grant and sched_unhold.
 */
#ifndef GPUQ_LEASE_H
#define GPUQ_LEASE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "workers/work.h"

struct buffer;
struct conn;
struct daemon;
struct gpuq_error;
struct job;

enum lease_state {
	LEASE_WAITING, /* its attach job is queued: earlier jobs on the buffer come first */
	LEASE_HELD,    /* granted: the client maps the buffer */
	LEASE_ENDED,   /* released, broken or lost before the grant; freed with its attach job */
};

struct lease {
	uint64_t id; /* its attach job's id */
	struct buffer *buffer; /* held (users++) while the lease lives */
	bool write;
	enum lease_state state;
	struct conn *conn; /* the holder's connection; NULL once closed */
	uint64_t conn_serial; /* its serial, which a re-exec keeps (the record's `conn`) */
	uint64_t request_id; /* the attach request the grant answers */
	uid_t uid;
	pid_t pid;
	double since; /* CLOCK_MONOTONIC seconds of the grant */
	struct work hold; /* the ledger entry (sched_hold) */
	struct lease *next;
};

struct lease_table {
	struct lease *head;
	unsigned count;
};

const char *lease_state_name(enum lease_state state);
/* The lease with this id, or NULL. */
struct lease *lease_find(struct lease_table *t, uint64_t id);
/* A connection closed: the leases it holds (or waits for) end (its CONN_CLOSED hook, server.h). */
void leases_drop_conn(struct daemon *d, struct conn *c);
/* Device index was reset: the leases on its buffers end (their holders are told). */
void leases_drop_device(struct daemon *d, int device);
/*
 * An attach job's request request_id on c stopped waiting (its timeout_ms
 * ran out; err holds the reply's `timeout`, "it goes on"): if that is the
 * attach's own request, the attach is given up, its lease ended and the
 * job cancelled, and err says so instead. A `wait` of another request's
 * leaves the attach going on.
 */
void lease_attach_timed_out(struct daemon *d, struct job *job, const struct conn *c,
			    uint64_t request_id, struct gpuq_error *err);

/*
 * A re-exec: the lease `from` says (id, write, uid, pid, conn_serial, since), which
 * the previous image had granted on b, held again in b's device's ledger
 * (worker_hold) before any job of this image is queued, with no connection
 * until leases_adopt_conns. NULL with err when it cannot be.
 */
struct lease *lease_adopt(struct daemon *d, struct buffer *b, const struct lease *from,
			  struct gpuq_error *err);
/*
 * A re-exec, once the inherited connections serve again: each lease taken
 * over goes back to its holder's connection, or ends as if the holder had
 * disconnected when that connection did not come along.
 */
void leases_adopt_conns(struct daemon *d);

#endif
