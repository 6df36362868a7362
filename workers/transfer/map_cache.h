/*
 * Mappings of clients' files kept across transfers, per device. Worker
 * thread only: each device's worker owns its device's entries; nothing
 * here is shared between devices.
 *
 * Two kinds, never confused:
 *
 * - Pinned (path registered): a sealed memfd's mapping registered with
 *   the device. Each registered transfer pinned every page anew, which
 *   made the path slower than pageable cudaMemcpy; kept, the next
 *   transfer of the same memfd costs one copy at the pinned rate. Found
 *   again only while the memfd is what it was when the last transfer
 *   through it ended: the same file (st_dev, st_ino), seals, size and
 *   change time (st_ctim), the same range and access. The change time
 *   moves with anything that could replace the pages under the pinning
 *   (a hole punched, then written again), with write(2), and with the
 *   first write fault on each page of a new mapping; a client that
 *   rewrites its data through a mapping it keeps changes no time, and its
 *   next transfer finds the pinning kept.
 *
 * - Plain (a staged get into a memfd): a shared mapping always shows the
 *   file as it is, so it is found again by file, range and access alone.
 *   Kept, the next get into the same file neither maps nor unmaps, and its
 *   pages' table entries are still there to be written (a GiB's munmap
 *   walks 262144 of them).
 *
 * Memfds are kept mapped (files in shmem and in no directory) for
 * MAP_CACHE_IDLE_S after their last use. A writable mapping is kept only
 * of a memfd that can take no more seals (F_SEAL_SEAL set, or made without
 * MFD_ALLOW_SEALING): while it exists, a client's F_ADD_SEALS of
 * F_SEAL_WRITE would fail with EBUSY. A read-only one (a put from a
 * descriptor open for reading only) is always kept.
 *
 * A get's plain writable mapping of any other regular file (a disk file,
 * a file a path names) is kept too, but for MAP_CACHE_FILE_IDLE_S only,
 * and never pinned: each new mapping of a disk file costs a page_mkwrite
 * per page written and, at munmap, a dirty-page call per page under the
 * file's lock (docs/PERFORMANCE.md: 7 ms after a 256 MiB get's last DMA,
 * 134 ms after a 4 GiB one's on the H200 machine). Kept, the next get
 * into the same range writes through page table entries already dirty.
 * While it is kept, the file's filesystem cannot be unmounted (EBUSY) and
 * a deleted file's blocks are not freed: hence the short bound, which the
 * worker keeps while idle too (map_cache_idle_due, map_cache_expire).
 *
 * An entry that no longer matches its file is released when the file is
 * seen again.
 *
 * What is kept is bounded: MAP_CACHE_ENTRIES per device, of which one
 * plain mapping (the newest: a client that gets into a new file each
 * time holds at most its last one), a quarter of physical memory pinned
 * per device, nothing idle while the host's available memory is below
 * twice what is pinned, and nothing unused for longer than its idle limit
 * (looked at whenever the device's worker acquires or releases an entry,
 * and when the limit falls due while the worker is idle). A kept entry
 * holds its memfd's pages after its client closed it, until then.
 */
#ifndef GPUQ_MAP_CACHE_H
#define GPUQ_MAP_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "workers/backend/backend.h"
#include "workers/transfer/copy_pool.h"

#define MAP_CACHE_ENTRIES 4
#define MAP_CACHE_IDLE_S 30.0
#define MAP_CACHE_FILE_IDLE_S 1.0

struct map_entry;

/* What to map: [start, start + len) of fd, shared; writable if rw; registered with the device if pin. */
struct map_want {
	int fd;
	off_t start;
	size_t len;
	bool rw, pin;
};

/*
 * The mapping wanted: a kept one (*hit) or a new one. *entry is what
 * map_cache_release takes. pool unmaps large mappings in parallel (NULL:
 * on this thread). 0, or -1 with err (nothing held).
 */
int map_cache_acquire(struct device *dev, struct copy_pool *pool, const struct map_want *want,
		      struct map_entry **entry, void **map, bool *hit, struct gpuq_error *err);

/*
 * Done with an entry: kept for the next transfer when `keep` and the
 * bounds allow, else unregistered and unmapped (a failure to unregister
 * is returned with err; the mapping is gone either way). fd is the
 * transfer's descriptor: a pinned entry is keyed by what the file is now,
 * after the transfer's own writes.
 */
int map_cache_release(struct device *dev, struct copy_pool *pool, struct map_entry *entry, int fd,
		      bool keep, struct gpuq_error *err);

/*
 * Seconds from `now` (monotonic) until an idle entry of the device has
 * been unused for its idle limit (0: already); negative when none is kept
 * idle. map_cache_expire releases the entries whose limit has passed at
 * `now`. Worker thread, between jobs or in one.
 */
double map_cache_idle_due(const struct device *dev, double now);
void map_cache_expire(struct device *dev, struct copy_pool *pool, double now);

/* Releases every entry of the device not in use (a device closing, a test). */
void map_cache_drop(struct device *dev, struct copy_pool *pool);

/* Entries the device keeps now, in use or not (tests). */
unsigned map_cache_count(const struct device *dev);

#endif
