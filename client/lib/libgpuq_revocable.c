/*
 * Revocable leases on libgpuq's side (gpuq.h, docs/protocol.md "Revocable
 * leases"): the lease's lock is a memfd this process makes and sends with
 * the attach. gpuqd holds a POSIX record lock on byte 0 for as long as the
 * lease lives; this process locks byte 1 for the length of each use, and
 * gpuqd ends the lease by taking byte 1 when a job wants the buffer. Record
 * locks are the process's, not a thread's: byte 1 is taken by the first of
 * the uses in progress to begin and let go by the last to end, which the
 * attachment's count of uses, under its mutex, tells apart.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/lib/libgpuq_revocable.h"

#define BYTE_GPUQD 0 /* gpuqd's, while the lease lives */
#define BYTE_USE 1   /* this process's, while it uses the buffer */

static int lock_byte(int fd, off_t byte, short type)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1 };
	return fcntl(fd, F_SETLK, &fl);
}

int revocable_lock_new(struct gpuq_error *err)
{
	int fd = memfd_create("gpuq-lease-lock", MFD_CLOEXEC);
	if (fd < 0)
		return gpuq_fail(err, GPUQ_E_IO, "cannot make a revocable lease's lock (memfd): %s",
				 strerror(errno));
	if (lock_byte(fd, BYTE_USE, F_WRLCK) < 0) {
		int e = errno;
		close(fd);
		return gpuq_fail(err, GPUQ_E_IO, "cannot lock a revocable lease's lock: %s",
				 strerror(e));
	}
	return fd;
}

bool revocable_lease_lives(int lock)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = BYTE_GPUQD,
			    .l_len = 1 };
	/* F_GETLK answers F_UNLCK when no other process holds the byte. */
	return lock >= 0 && fcntl(lock, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

/* A use's beginning under the attachment's mutex: byte 1 taken by the first use. */
static int begin_use_locked(struct gpuq_attachment *a, struct gpuq_error *err)
{
	if (a->uses == 0 && lock_byte(a->lock_fd, BYTE_USE, F_WRLCK) < 0) {
		if (errno == EACCES || errno == EAGAIN)
			return 0; /* gpuqd holds it: it is revoking the lease */
		return gpuq_fail(err, GPUQ_E_IO, "cannot lock the lease's lock: %s", strerror(errno));
	}
	/* Another use in progress keeps gpuqd from revoking, not the lease from
	 * ending otherwise (broken, the device reset, gpuqd gone). */
	if (!revocable_lease_lives(a->lock_fd)) {
		if (a->uses == 0)
			lock_byte(a->lock_fd, BYTE_USE, F_UNLCK);
		return 0;
	}
	a->uses++;
	return 1;
}

int gpuq_attachment_begin_use(struct gpuq_attachment *a, struct gpuq_error *err)
{
	if (!a->revocable)
		return a->ptr ? 1 : 0; /* a plain lease lives until released */
	if (a->lock_fd < 0)
		return 0; /* released */
	pthread_mutex_lock(&a->use_mutex);
	int rc = begin_use_locked(a, err);
	pthread_mutex_unlock(&a->use_mutex);
	return rc;
}

int gpuq_attachment_end_use(struct gpuq_attachment *a, struct gpuq_error *err)
{
	if (!a->revocable || a->lock_fd < 0)
		return 0;
	int rc = 0;
	pthread_mutex_lock(&a->use_mutex);
	if (a->uses > 0 && --a->uses == 0 && lock_byte(a->lock_fd, BYTE_USE, F_UNLCK) < 0)
		rc = gpuq_fail(err, GPUQ_E_IO, "cannot unlock the lease's lock: %s", strerror(errno));
	pthread_mutex_unlock(&a->use_mutex);
	return rc;
}
