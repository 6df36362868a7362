/*
 * The registered path's pinnings, kept across jobs: a sealed memfd put or
 * got again through path registered finds its mapping still registered, so
 * the second transfer costs one copy at the pinned rate instead of a
 * pinning of every page first (which made the path slower than pageable
 * cudaMemcpy). Worker thread only: each device's worker owns its device's
 * entries; nothing here is shared between devices.
 *
 * An entry is found again only while the memfd is what it was when the
 * last transfer through it ended: the same file (st_dev, st_ino), seals,
 * size and change time (st_ctim), the same range and access. The change
 * time moves with anything that could replace the pages under the
 * pinning (a hole punched, then written again), with write(2), and with
 * the first write fault on each page of a new mapping; a client that
 * rewrites its data through a mapping it keeps changes no time, and its
 * next transfer finds the pinning kept. An entry that no longer matches
 * is released when its file is seen again.
 *
 * What is kept is bounded: REG_CACHE_ENTRIES per device, a quarter of
 * physical memory per device, none while the host's available memory is
 * below twice what is pinned, and none unused for REG_CACHE_IDLE_S (looked
 * at whenever the device's worker opens or closes a registered transfer).
 * A kept entry holds the memfd's pages after its client closed it, until
 * then.
 */
#ifndef GPUQ_REG_CACHE_H
#define GPUQ_REG_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "workers/backend/backend.h"

#define REG_CACHE_ENTRIES 4
#define REG_CACHE_IDLE_S 30.0

struct reg_entry;

/*
 * A mapping of [start, start + len) of fd (MAP_SHARED; writable if rw),
 * registered with the device: a kept one (*hit) or a new one. *entry is
 * what reg_cache_release takes. 0, or -1 with err (nothing held).
 */
int reg_cache_acquire(struct device *dev, int fd, off_t start, size_t len, bool rw,
		      struct reg_entry **entry, void **map, bool *hit, struct gpuq_error *err);

/*
 * Done with an entry: kept for the next transfer when `keep` and the
 * bounds allow, else unregistered and unmapped (a failure to unregister
 * is returned with err, the mapping is gone either way). fd is the
 * transfer's descriptor: the entry is keyed by what the file is now,
 * after the transfer's own writes.
 */
int reg_cache_release(struct device *dev, struct reg_entry *entry, int fd, bool keep,
		      struct gpuq_error *err);

/* Releases every entry of the device not in use (a device closing, a test). */
void reg_cache_drop(struct device *dev);

/* Entries the device keeps now, in use or not (tests). */
unsigned reg_cache_count(const struct device *dev);

#endif
