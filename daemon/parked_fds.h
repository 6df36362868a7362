/*
 * Descriptors a connection has received (SCM_RIGHTS) that no request has
 * taken yet, each with the byte range [from, to) of the stream read that
 * brought it. Main thread only.
 *
 * The protocol sends a request's descriptors on the sendmsg that carries its
 * frame's first byte, and the kernel ends a recvmsg right after the bytes
 * that carried descriptors, so a frame that starts at stream offset S takes
 * only descriptors whose read held S (from <= S < to), in arrival order.
 * Several frames may start in one read (a client that batches), which is why
 * descriptors are not closed at once: once a frame ending at E has been
 * handled, those whose read ended at or before E can belong to no later
 * frame, and are closed (parked_drop_through), their count reported so that
 * the connection can be refused as out of step.
 */
#ifndef GPUQ_PARKED_FDS_H
#define GPUQ_PARKED_FDS_H

#include <stdint.h>

/* At most this many per connection; a client further ahead is out of step. */
#define PARKED_MAX 64

struct parked_fd {
	int fd;
	uint64_t from, to;
};

struct parked_fds {
	struct parked_fd fd[PARKED_MAX];
	int count;
};

/*
 * Keeps fds[0..n), which arrived with the read of stream bytes [from, to).
 * Returns 0, or the number that did not fit (those are closed).
 */
int parked_keep(struct parked_fds *p, const int *fds, int n, uint64_t from, uint64_t to);

/*
 * Takes n descriptors for the frame whose first byte is at stream offset
 * start, oldest first, into out. 0, or -1 taking none when fewer than n
 * arrived with that byte (*have says how many did).
 */
int parked_take(struct parked_fds *p, uint64_t start, int n, int *out, int *have);

/* Closes the descriptors whose read ended at or before end; returns how many. */
int parked_drop_through(struct parked_fds *p, uint64_t end);

/* Closes every descriptor held. */
void parked_close_all(struct parked_fds *p);

#endif
