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
#include <uv.h>

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
	/*
	 * A revocable lease's lock, the memfd its holder sent (-1: not
	 * revocable): gpuqd holds a POSIX lock on its byte 0 while the lease
	 * lives, the holder one on byte 1 while it uses the buffer
	 * (daemon/lease_revoke.c). Closed when the lease ends.
	 */
	int lock_fd;
	bool wanted; /* a job waits for it, and its holder was using the buffer at the last try */
	struct lease *next;
};

struct lease_table {
	struct lease *head;
	unsigned count;
	unsigned wanted;          /* leases with `wanted` set: the timer runs while there are any */
	uv_timer_t revoke_timer; /* tries the wanted leases again (lease_revoke.c) */
	bool revoke_timer_ready;
};

const char *lease_state_name(enum lease_state state);
/*
 * Ends a lease, however it ends: its ledger entry goes (the jobs behind it
 * may start), its lock (if revocable) is closed, and a held lease is freed.
 */
void lease_end(struct daemon *d, struct lease *l);
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

/* ---- revocable leases (daemon/lease_revoke.c) ---- */

/* Revocable leases a connection may hold or wait for at once (docs/protocol.md). */
#define LEASE_REVOCABLE_MAX 64u
/*
 * An attach's `revocable` lock, fd (the request's descriptor, on c): a
 * memfd, with byte 0 locked by gpuqd from now on. -1 with err when c has
 * LEASE_REVOCABLE_MAX already (busy), fd is not a memfd or another process
 * holds byte 0 (bad_request).
 */
int lease_lock_take(struct daemon *d, const struct conn *c, int fd, struct gpuq_error *err);
/*
 * A job was submitted (or replayed): the revocable leases it conflicts
 * with end now where their holders are not using the buffer, and are
 * tried again every millisecond where they are.
 */
void leases_yield(struct daemon *d, struct job *job);
/*
 * Ephemeral buffer b was orphaned (its connection closed), to be freed
 * once nothing holds it: its revocable leases end as if a job waited for
 * them, so that a client keeping one does not keep the buffer.
 */
void leases_yield_orphan(struct daemon *d, const struct buffer *b);
/* Revocable lease l was just granted by attach_job: the jobs submitted while it waited. */
void lease_yield_granted(struct daemon *d, struct lease *l, struct job *attach_job);
/* gpuqd stops: the retry timer's handle closes. */
void leases_close(struct daemon *d);

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
