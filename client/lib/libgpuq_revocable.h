/*
 * The lock of a revocable lease (docs/protocol.md, "Revocable leases"), as
 * libgpuq_share.c's attach and release use it; the uses themselves are
 * gpuq_attachment_begin_use and gpuq_attachment_end_use (gpuq.h).
 */
#ifndef GPUQ_LIBGPUQ_REVOCABLE_H
#define GPUQ_LIBGPUQ_REVOCABLE_H

#include <stdbool.h>

#include "client/lib/gpuq.h"

/* A new lock: a memfd with byte 1 locked (in use from before the attach); -1 and err. */
int revocable_lock_new(struct gpuq_error *err);
/* Whether gpuqd still holds byte 0 of lock, so that its lease lives. */
bool revocable_lease_lives(int lock);

#endif
