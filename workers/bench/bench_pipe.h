/*
 * Pipes for bench_copy: a thread that drains a pipe's read end as a
 * client's reader would, and the host's own speed at pushing bytes through
 * such a pipe (the ceiling of a get into a pipe). Worker thread only.
 */
#ifndef GPUQ_BENCH_PIPE_H
#define GPUQ_BENCH_PIPE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"

/* A pipe of 1 MiB (where the system allows) whose read end a thread drains. */
struct pipe_drain {
	pthread_t thread;
	int fds[2];
	bool hash;          /* sum what is read (slower: for checks, not timed runs) */
	uint64_t sum, read; /* checksum terms of the bytes read, and their count */
};

int pipe_drain_start(struct pipe_drain *p, bool hash, struct gpuq_error *err);
/* Closes the write end, waits for the reader to see its end, closes the rest. */
void pipe_drain_stop(struct pipe_drain *p);

enum bench_pipe_means {
	BENCH_PIPE_WRITE,  /* blocking writes of a slot's size, as a plain program writes */
	BENCH_PIPE_POLLED, /* non-blocking: poll, then a write of the pipe's free room (the streamed path's way) */
};

/*
 * Writes n bytes of src through a new drained pipe by `means`, in chunks of
 * `chunk`; *seconds from the first write to the last. With checksum, the
 * reader hashes what it reads and *checksum is gpuq's checksum of it. 0,
 * or -1 with err.
 */
int bench_pipe_write(const void *src, size_t n, size_t chunk, enum bench_pipe_means means,
		     double *seconds, uint64_t *checksum, struct gpuq_error *err);

#endif
