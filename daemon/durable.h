/*
 * The daemon's durable state record, kept up to date (docs/ARCHITECTURE.md,
 * Durable state): the tables' state (buffers, regions, leases, quota usage,
 * the jobs writing each buffer) copied into daemon/state_record.h's memfd
 * whenever it changed, once per turn of the main loop. A later gpuqd reads
 * it back (daemon/recover.h: after a re-exec, or from the service
 * manager's descriptor store after gpuqd died).
 *
 * Main thread only. Callers say that something changed: job_life.c as a
 * job is handed to its workers and as it ends (durable_job_submitting,
 * durable_job_ended), op_lease.c as a lease ends and op_admin.c as a
 * device's buffers are lost (durable_touch); the record is rewritten from
 * the tables before the loop next waits, so a burst of changes costs one
 * write. A job that writes a buffer is the exception: the record that flags
 * it is written before its worker can start it, so that no crash finds
 * the buffer half written and unflagged.
 */
#ifndef GPUQ_DURABLE_H
#define GPUQ_DURABLE_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

struct daemon;
struct job;
struct state_record;
struct state_snapshot;

struct durable {
	struct state_record *record; /* NULL: none could be made (logged), or not started */
	uv_prepare_t flush;
	bool dirty, started;
	bool stopped; /* the last generation, written as gpuqd stops cleanly */
	uint64_t failures; /* writes that failed (each logged, at most once per 10 s) */
	uint64_t ids_reserved; /* job ids below it may be given out: what the record says */
};

/*
 * Writes the record's first generation of this image: in adopted (the
 * previous image's, daemon/recover.h), else in a new one; without one gpuqd
 * serves on (logged). With the service manager's store in use, the record
 * is handed to it, unless held says it is there already.
 */
void durable_start(struct daemon *d, struct state_record *adopted, bool held);
/* The state changed: the record is rewritten before the loop next waits. */
void durable_touch(struct daemon *d);
/*
 * job (in the table, queued) goes to its workers next: a job that writes
 * a buffer has the record rewritten now; one that touches buffers, regions
 * or leases otherwise, before the loop waits; a noop changes nothing.
 */
void durable_job_submitting(struct daemon *d, struct job *job);
/* job ended, or never reached a worker (call before its buffers are let go). */
void durable_job_ended(struct daemon *d, struct job *job);
/* Writes the tables now (a re-exec's last generation): 0, or -1 (logged; no record). */
int durable_flush(struct daemon *d);
/* The record's memfd, which a re-exec hands the next image; -1 when there is none. */
int durable_record_fd(const struct daemon *d);
/* Writes what is pending and stops the loop's handle (shutdown); the record stays open. */
void durable_close(struct daemon *d);
/* Closes the record (after the loop has ended). */
void durable_free(struct daemon *d);

/*
 * The tables as the record holds them, into *s (state_snapshot_free
 * releases it). 0, or -1 when the host is out of memory.
 */
int durable_snapshot(struct daemon *d, struct state_snapshot *s);

#endif
