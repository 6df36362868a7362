/*
 * The registered path: the client's memfd is mapped, the mapping registered
 * with the device (pinned), and copied directly by the copy engine in
 * chunks that take DMA turns, as a region's are (xfer_pinned), checking
 * for a cancel between them. Worker thread only.
 *
 * Only a memfd sealed against shrinking (F_SEAL_SHRINK) qualifies: gpuqd's
 * own threads touch the mapping (the host backend's copies, --verify's
 * hashing), and a file another process could truncate underneath would turn
 * that into SIGBUS in the daemon. A regular file is always staged.
 *
 * Registering pins every page first, which costs far more per byte than
 * staging does for a transfer seen once (on the H200, a registered put of
 * 1 GiB pinned anew ran at 0.09-0.15 of pinned memory's rate); so the
 * pinning is kept for the next transfer of the same memfd (map_cache.h),
 * which then runs at the copy engine's rate. `gpuq bench copy` measures
 * it (its warm-up pins, the timed runs find the pinning kept), and
 * --register-min (off by default) says from what size path auto takes it.
 * A region (put/get through `region`) is that done once, when the region is
 * made: it moves as a ring whose every chunk is posted (transfer_ring.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "workers/transfer/map_cache.h"
#include "workers/transfer/transfer.h"
#include "workers/transfer/transfer_impl.h"

int transfer_check_registrable(int fd, bool put, struct gpuq_error *err)
{
	int fd_flags = fcntl(fd, F_GETFL);
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "path registered needs a memfd sealed against shrinking "
				 "(memfd_create with MFD_ALLOW_SEALING, then F_ADD_SEALS F_SEAL_SHRINK), "
				 "so that gpuqd can map it safely; use path auto or staged");
	if (!put && ((fd_flags & O_ACCMODE) != O_RDWR || (fd_flags & O_APPEND)))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "path registered for get needs the memfd open for reading and "
				 "writing, without O_APPEND (it is mapped to be written)");
	return 0;
}

struct reg_map {
	struct map_entry *entry; /* the pinning (map_cache.h); NULL: none held */
	char *data;              /* the transfer's first byte in its mapping */
};

/* The pinned mapping of [pos, pos + total) of the descriptor: kept from before, or made now. */
static int reg_map_open(struct xfer *x, struct reg_map *m)
{
	long page = sysconf(_SC_PAGESIZE);
	off_t start = x->pos - x->pos % page;
	size_t lead = (size_t)(x->pos - start);
	size_t len = (lead + x->total + (size_t)page - 1) / (size_t)page * (size_t)page;
	struct map_want want = { .fd = x->fd, .start = start, .len = len,
				 .rw = (x->fd_flags & O_ACCMODE) == O_RDWR, .pin = true };
	void *map;
	bool kept;
	memset(m, 0, sizeof *m);
	if (map_cache_acquire(x->dev, x->pool, &want, &m->entry, &map, &kept, x->err) < 0)
		return -1;
	m->data = (char *)map + lead;
	return 0;
}

/* Gives the pinning back to the cache; a failure to unregister fails a transfer that went well. */
static void reg_map_close(struct xfer *x, struct reg_map *m, int *rc)
{
	struct gpuq_error unreg_err;
	if (m->entry && map_cache_release(x->dev, x->pool, m->entry, x->fd, true, &unreg_err) < 0 && *rc == 0) {
		*x->err = unreg_err;
		*rc = -1;
	}
}

int xfer_put_registered(struct xfer *x)
{
	struct reg_map m;
	if (x->total == 0)
		return 0;
	int rc = reg_map_open(x, &m);
	if (rc == 0)
		rc = xfer_pinned(x, true, m.data);
	reg_map_close(x, &m, &rc);
	return rc;
}

/* The destination grows to hold the range first (sealed against shrinking, not growing). */
int xfer_get_registered(struct xfer *x)
{
	struct reg_map m;
	off_t end = x->pos + (off_t)x->total;
	if (x->total == 0)
		return 0;
	if (x->size < end && ftruncate(x->fd, end) < 0)
		return gpuq_fail(x->err, GPUQ_E_IO,
				 "path registered: cannot extend the destination to %lld bytes: %s",
				 (long long)end, strerror(errno));
	int rc = reg_map_open(x, &m);
	if (rc == 0)
		rc = xfer_pinned(x, false, m.data);
	reg_map_close(x, &m, &rc);
	return rc;
}
