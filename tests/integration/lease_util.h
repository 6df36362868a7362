/*
 * Helpers for the tests of leases (test_lease.c, and the re-exec's in
 * test_restart_held.c): shareable buffers, attaching them, jobs queued
 * behind a lease and what they found.
 */
#ifndef GPUQ_TEST_LEASE_UTIL_H
#define GPUQ_TEST_LEASE_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "client/lib/gpuq.h"

/* A shareable buffer of bytes (ephemeral: freed with c's connection); checks the reply says so. */
void lease_alloc_shareable(struct gpuq_client *c, const char *name, uint64_t bytes, bool ephemeral);
/* Attaches buffer (rw: read-write) into *a: mapped, under a lease, host memory on the host backend. */
void lease_attach(struct gpuq_client *c, const char *buffer, bool rw, struct gpuq_attachment *a);
/* A job of op on buffer (a fill writes 7s), not waited for; returns its id. */
uint64_t lease_submit(struct gpuq_client *c, const char *op, const char *buffer);
/* Waits (up to 2 s) until job is queued behind lease, and fails the test if it never is. */
void lease_expect_behind(struct gpuq_client *c, uint64_t job, uint64_t lease);
/* Waits for job's end, which must be ok; its result's checksum (0 when it has none). */
uint64_t lease_job_checksum(struct gpuq_client *c, uint64_t job);
/* Waits for job's end, which must be ok. */
void lease_expect_done(struct gpuq_client *c, uint64_t job);
/* The leases c sees; *first_revocable (may be NULL): whether the first listed is revocable. */
unsigned lease_listed(struct gpuq_client *c, bool *first_revocable);
/* Whether a process other than the caller holds a lock on byte of fd (a revocable lease's lock). */
bool lease_byte_locked_elsewhere(int fd, off_t byte);

#endif
