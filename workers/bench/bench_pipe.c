/*
 * The pipes of bench_copy (bench_pipe.h). The drain reads up to 1 MiB at a
 * time; hashing, it keeps a partial word back so that each hashed part
 * starts on a word, as the checksum's terms need.
 */
#include "workers/bench/bench_pipe.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "protocol/hash.h"
#include "workers/clock.h"
#include "workers/transfer/copy_hash.h"

#define PIPE_BYTES (1 << 20)
#define SINK_BYTES (1 << 20)

static void *drain_main(void *arg)
{
	struct pipe_drain *p = arg;
	char small[4096], *sink = malloc(SINK_BYTES);
	size_t size = sink ? SINK_BYTES : sizeof small, carry = 0;
	if (!sink)
		sink = small;
	for (;;) {
		ssize_t got = read(p->fds[0], sink + carry, size - carry);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			break;
		size_t have = carry + (size_t)got, whole = p->hash ? have - have % 8 : have;
		if (p->hash)
			p->sum += copy_hash_terms(sink, whole, p->read / 8);
		p->read += whole;
		carry = have - whole;
		memmove(sink, sink + whole, carry);
	}
	if (carry) {
		p->sum += copy_hash_terms(sink, carry, p->read / 8);
		p->read += carry;
	}
	if (sink != small)
		free(sink);
	return NULL;
}

int pipe_drain_start(struct pipe_drain *p, bool hash, struct gpuq_error *err)
{
	memset(p, 0, sizeof *p);
	p->hash = hash;
	if (pipe2(p->fds, O_CLOEXEC) < 0)
		return gpuq_fail(err, GPUQ_E_IO, "bench: pipe: %s", strerror(errno));
	(void)fcntl(p->fds[1], F_SETPIPE_SZ, PIPE_BYTES); /* less where pipe-max-size is lower */
	errno = pthread_create(&p->thread, NULL, drain_main, p);
	if (errno == 0)
		return 0;
	int e = errno;
	close(p->fds[0]);
	close(p->fds[1]);
	return gpuq_fail(err, GPUQ_E_IO, "bench: pipe reader: %s", strerror(e));
}

void pipe_drain_stop(struct pipe_drain *p)
{
	close(p->fds[1]);
	pthread_join(p->thread, NULL);
	close(p->fds[0]);
}

/* How much one non-blocking write may carry: the pipe's free room, a page at least. */
static size_t free_room(int fd, long pipe_size, size_t want)
{
	int unread = 0;
	long room = pipe_size > 0 && ioctl(fd, FIONREAD, &unread) == 0 ? pipe_size - unread : 0;
	size_t n = room > 4096 ? (size_t)room : 4096;
	return want < n ? want : n;
}

/* Writes n bytes of src to fd by means; 0, or -1 with err. */
static int write_all(int fd, const char *src, size_t n, size_t chunk, enum bench_pipe_means means,
		     struct gpuq_error *err)
{
	long pipe_size = fcntl(fd, F_GETPIPE_SZ);
	if (means == BENCH_PIPE_POLLED && fcntl(fd, F_SETFL, O_NONBLOCK) < 0)
		return gpuq_fail(err, GPUQ_E_IO, "bench: pipe: O_NONBLOCK: %s", strerror(errno));
	for (size_t done = 0; done < n;) {
		size_t want = n - done < chunk ? n - done : chunk;
		if (means == BENCH_PIPE_POLLED) {
			struct pollfd pfd = { .fd = fd, .events = POLLOUT };
			if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
				return gpuq_fail(err, GPUQ_E_IO, "bench: poll on a pipe: %s",
						 strerror(errno));
			want = free_room(fd, pipe_size, want);
		}
		ssize_t w = write(fd, src + done, want);
		if (w < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (w <= 0)
			return gpuq_fail(err, GPUQ_E_IO, "bench: writing a pipe after %zu bytes: %s", done,
					 w < 0 ? strerror(errno) : "nothing written");
		done += (size_t)w;
	}
	return 0;
}

int bench_pipe_write(const void *src, size_t n, size_t chunk, enum bench_pipe_means means,
		     double *seconds, uint64_t *checksum, struct gpuq_error *err)
{
	struct pipe_drain drain;
	if (pipe_drain_start(&drain, checksum != NULL, err) < 0)
		return -1;
	double start = monotonic_seconds();
	int rc = write_all(drain.fds[1], src, n, chunk, means, err);
	*seconds = monotonic_seconds() - start;
	pipe_drain_stop(&drain);
	if (rc == 0 && checksum)
		*checksum = drain.read == n ? gpuq_checksum_finish(drain.sum, n) : ~0ull;
	return rc;
}
