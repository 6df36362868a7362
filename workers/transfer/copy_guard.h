/*
 * memcpy into a client's file mapping, safe against the file shrinking
 * underneath: a shared mapping of a file that another process truncates
 * raises SIGBUS on the next touch of a page past the new end, which would
 * kill gpuqd. copy_guarded turns that into an error for the one copy.
 * Any thread.
 */
#ifndef GPUQ_COPY_GUARD_H
#define GPUQ_COPY_GUARD_H

#include <stddef.h>

#include "workers/transfer/copy_store.h"

/*
 * Populates the pages of [dst, dst + n) for writing (one system call rather
 * than a fault per page), then copies src there. 0, or EFAULT when the
 * mapping behind dst no longer has a page to write to.
 */
int copy_guarded(void *dst, const void *src, size_t n);

/*
 * The same with store (copy_store.h) doing the copy, and no populating:
 * the caller has done that (or chosen not to).
 */
int copy_guarded_store(void *dst, const void *src, size_t n, copy_store_fn store);

#endif
