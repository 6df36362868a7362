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

/*
 * Populates the pages of [dst, dst + n) for writing (one system call rather
 * than a fault per page), then copies src there. 0, or EFAULT when the
 * mapping behind dst no longer has a page to write to.
 */
int copy_guarded(void *dst, const void *src, size_t n);

#endif
