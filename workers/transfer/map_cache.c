/*
 * map_cache: clients' mappings kept between transfers (map_cache.h).
 * Worker thread only: each device's entries are touched by its worker
 * alone, so there is no lock; `refs` keeps an entry that a job on another
 * fiber of the same worker still copies through. Large mappings are
 * unmapped by the copy threads, in parts.
 */
#include "workers/transfer/map_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "workers/clock.h"
#include "workers/host_memory.h"

struct map_key {
	dev_t fs;
	ino_t ino;
	int seals;
	off_t size;
	struct timespec ctime;
	off_t start;
	size_t len;
	bool rw, pin;
	bool unseen;     /* in shmem and in no directory: a memfd (or a deleted tmpfs file) */
	bool file;       /* any other regular file */
};

struct map_entry {
	struct map_key key;
	void *map;
	unsigned refs;
	bool kept;        /* in the device's table (else a one-job pinning, freed on release) */
	double last_used; /* monotonic seconds */
};

static struct map_entry entries[GPUQ_MAX_DEVICES][MAP_CACHE_ENTRIES];

static struct map_entry *table_of(const struct device *dev)
{
	return entries[dev->index];
}

/* The same mapping; for a pinning, of the memfd as it was (map_cache.h). */
static bool key_equal(const struct map_key *a, const struct map_key *b)
{
	if (a->fs != b->fs || a->ino != b->ino || a->start != b->start || a->len != b->len ||
	    a->rw != b->rw || a->pin != b->pin)
		return false;
	return !a->pin || (a->seals == b->seals && a->size == b->size &&
			   a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec);
}

static int key_of(int fd, off_t start, size_t len, bool rw, bool pin, struct map_key *k,
		  struct gpuq_error *err)
{
	struct stat st;
	memset(k, 0, sizeof *k);
	if (fstat(fd, &st) < 0)
		return gpuq_fail(err, GPUQ_E_IO, "the client's descriptor: %s", strerror(errno));
	k->seals = fcntl(fd, F_GET_SEALS); /* -1: a file that takes no seals */
	struct statfs fs;
	k->unseen = st.st_nlink == 0 && fstatfs(fd, &fs) == 0 &&
		    ((unsigned long)fs.f_type & 0xffffffffUL) == 0x01021994UL; /* TMPFS_MAGIC */
	k->file = S_ISREG(st.st_mode) && !k->unseen;
	k->fs = st.st_dev;
	k->ino = st.st_ino;
	k->size = st.st_size;
	k->ctime = st.st_ctim;
	k->start = start;
	k->len = len;
	k->rw = rw;
	k->pin = pin;
	return 0;
}

struct unmap_part {
	struct copy_task task; /* first */
	void *addr;
	size_t len;
};

static void part_unmap(struct copy_task *task)
{
	struct unmap_part *p = (struct unmap_part *)task;
	munmap(p->addr, p->len);
}

/*
 * Unmapping a populated mapping walks every page table entry (about 70 ns a
 * page: 18 ms a GiB where a GiB of DMA takes 19 ms). Split across the copy
 * threads, the walks run side by side: munmap holds the address-space lock
 * exclusively only to detach its range, and zaps the pages under the shared
 * lock.
 */
static void unmap_parallel(struct copy_pool *pool, void *map, size_t len)
{
	enum { MAX_PARTS = 64 };
	struct unmap_part parts[MAX_PARTS];
	struct copy_group group;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	unsigned n = pool ? copy_pool_threads(pool) : 0;
	n = n < 1 ? 1 : n > MAX_PARTS ? MAX_PARTS : n;
	size_t part = (len / n + page - 1) / page * page;
	unsigned count = 0;
	if (n == 1 || len < ((size_t)64 << 20)) {
		munmap(map, len);
		return;
	}
	copy_group_init(&group);
	for (size_t at = 0; at < len; at += part, count++) {
		parts[count].addr = (char *)map + at;
		parts[count].len = len - at < part ? len - at : part;
		parts[count].task.fn = part_unmap;
		parts[count].task.group = &group;
		copy_pool_submit(pool, &parts[count].task);
	}
	for (unsigned i = 0; i < count; i++)
		copy_task_wait(&parts[i].task);
	copy_group_destroy(&group);
}

/*
 * Whether keeping the mapping can stand in no client's way. A memfd's (a
 * file in no directory on shmem), for MAP_CACHE_IDLE_S: adding
 * F_SEAL_WRITE to a memfd fails (EBUSY) while a writable shared mapping of
 * it exists, so a writable one is kept only of a memfd that can take no
 * more seals (sealed with F_SEAL_SEAL, or made without MFD_ALLOW_SEALING).
 * Any other regular file's only as a get's plain writable mapping, and
 * only for MAP_CACHE_FILE_IDLE_S (map_cache.h says why and what it costs).
 */
static bool keepable(const struct map_key *k)
{
	if (k->file)
		return k->rw && !k->pin;
	return k->unseen && (!k->rw || k->seals < 0 || (k->seals & F_SEAL_SEAL));
}

/* How long an entry may stay unused. */
static double idle_limit(const struct map_key *k)
{
	return k->file ? MAP_CACHE_FILE_IDLE_S : MAP_CACHE_IDLE_S;
}

/* Unregisters (a pinning) and unmaps; the first error into err (NULL: ignored). */
static int entry_free(struct device *dev, struct copy_pool *pool, struct map_entry *e,
		      struct gpuq_error *err)
{
	struct gpuq_error ignored;
	struct map_entry gone = *e;
	/* out of the table first: the unmapping yields, and another job may look meanwhile */
	memset(e, 0, sizeof *e);
	int rc = gone.key.pin ? dev->ops->mem.host_unregister(dev, gone.map, err ? err : &ignored) : 0;
	unmap_parallel(pool, gone.map, gone.key.len);
	return rc;
}

static uint64_t pinned_bytes(const struct device *dev)
{
	const struct map_entry *t = table_of(dev);
	uint64_t n = 0;
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES; i++)
		n += t[i].map && t[i].key.pin ? t[i].key.len : 0;
	return n;
}

/* Releases idle entries: stale ones of this file, ones unused too long, all under memory pressure. */
static void evict(struct device *dev, struct copy_pool *pool, const struct map_key *k, double now)
{
	struct map_entry *t = table_of(dev);
	uint64_t avail = host_memory_available();
	bool pressed = avail && avail < 2 * pinned_bytes(dev);
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES; i++) {
		struct map_entry *e = &t[i];
		bool stale = k && e->key.fs == k->fs && e->key.ino == k->ino && e->key.pin == k->pin &&
			     !key_equal(&e->key, k);
		if (e->map && e->refs == 0 &&
		    (stale || pressed || now >= e->last_used + idle_limit(&e->key)))
			entry_free(dev, pool, e, NULL);
	}
}

/* The idle entry to give up first: another plain one (one is kept), else the least recently used. */
static struct map_entry *victim(struct device *dev, bool pin)
{
	struct map_entry *t = table_of(dev), *oldest = NULL;
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES; i++) {
		if (!t[i].map || t[i].refs)
			continue;
		if (!pin && !t[i].key.pin)
			return &t[i];
		if (!oldest || t[i].last_used < oldest->last_used)
			oldest = &t[i];
	}
	return oldest;
}

/*
 * An empty entry for a new mapping of len bytes to be kept in, once the
 * bounds allow it (idle entries are given up for it); NULL when they do
 * not. Looks again after each release, which may yield.
 */
static struct map_entry *free_entry(struct device *dev, struct copy_pool *pool, size_t len,
				    bool pin)
{
	struct map_entry *t = table_of(dev);
	uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
	for (;;) {
		struct map_entry *slot = NULL, *v = victim(dev, pin);
		for (unsigned i = 0; i < MAP_CACHE_ENTRIES && !slot; i++)
			if (!t[i].map)
				slot = &t[i];
		bool room = !pin || pinned_bytes(dev) + len <= phys / 4;
		bool plain_kept = !pin && v && !v->key.pin;
		if (slot && room && !plain_kept)
			return slot;
		if (!v)
			return NULL;
		entry_free(dev, pool, v, NULL);
	}
}

static int entry_pin(struct device *dev, int fd, const struct map_key *k, struct map_entry *e,
		     struct gpuq_error *err)
{
	void *map = mmap(NULL, k->len, k->rw ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd,
			 k->start);
	if (map == MAP_FAILED)
		return gpuq_fail(err, GPUQ_E_IO, "cannot map the client's file: %s", strerror(errno));
	if (k->pin && dev->ops->mem.host_register(dev, map, k->len,
						  k->rw ? 0 : BACKEND_REGISTER_READ_ONLY, err) < 0) {
		munmap(map, k->len);
		return -1;
	}
	e->key = *k;
	e->map = map;
	return 0;
}

int map_cache_acquire(struct device *dev, struct copy_pool *pool, const struct map_want *want,
		      struct map_entry **entry, void **map, bool *hit, struct gpuq_error *err)
{
	struct map_entry *t = table_of(dev), *e = NULL;
	struct map_key k;
	int fd = want->fd;
	if (key_of(fd, want->start, want->len, want->rw, want->pin, &k, err) < 0)
		return -1;
	evict(dev, pool, &k, monotonic_seconds());
	*hit = false;
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES && !e; i++)
		if (t[i].map && key_equal(&t[i].key, &k))
			e = &t[i];
	if (e) {
		*hit = true;
	} else if ((e = free_entry(dev, pool, want->len, want->pin)) != NULL) {
		if (entry_pin(dev, fd, &k, e, err) < 0)
			return -1;
		e->kept = true;
	} else {
		/* every entry is in use, or the bounds say no: a mapping for this job alone */
		e = calloc(1, sizeof *e);
		if (!e)
			return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory to map a file",
					 dev->index);
		if (entry_pin(dev, fd, &k, e, err) < 0) {
			free(e);
			return -1;
		}
		e->kept = false;
	}
	e->refs++;
	e->last_used = monotonic_seconds();
	*entry = e;
	*map = e->map;
	return 0;
}

int map_cache_release(struct device *dev, struct copy_pool *pool, struct map_entry *e, int fd,
		      bool keep, struct gpuq_error *err)
{
	struct gpuq_error ignored;
	struct map_key now;
	e->refs--;
	e->last_used = monotonic_seconds();
	/*
	 * The transfer's own first writes through the mapping (a get, or the
	 * pinning itself) set the file's times: what it is now is what the
	 * next transfer must find.
	 */
	if (keep && key_of(fd, e->key.start, e->key.len, e->key.rw, e->key.pin, &now, &ignored) == 0 &&
	    keepable(&now))
		e->key = now;
	else
		keep = false;
	if (!e->kept) { /* a mapping for one job, on the heap */
		int rc = entry_free(dev, pool, e, err);
		free(e);
		return rc;
	}
	if (e->refs == 0 && (!keep || dev->faulted))
		return entry_free(dev, pool, e, err);
	evict(dev, pool, NULL, monotonic_seconds());
	return 0;
}

double map_cache_idle_due(const struct device *dev, double now)
{
	const struct map_entry *t = table_of(dev);
	double due = -1;
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES; i++) {
		if (!t[i].map || t[i].refs)
			continue;
		double in = t[i].last_used + idle_limit(&t[i].key) - now;
		in = in > 0 ? in : 0;
		due = due < 0 || in < due ? in : due;
	}
	return due;
}

void map_cache_expire(struct device *dev, struct copy_pool *pool, double now)
{
	struct map_entry *t = table_of(dev);
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES; i++)
		if (t[i].map && t[i].refs == 0 && now >= t[i].last_used + idle_limit(&t[i].key))
			entry_free(dev, pool, &t[i], NULL);
}

void map_cache_drop(struct device *dev, struct copy_pool *pool)
{
	struct map_entry *t = table_of(dev);
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES; i++)
		if (t[i].map && t[i].refs == 0)
			entry_free(dev, pool, &t[i], NULL);
}

unsigned map_cache_count(const struct device *dev)
{
	const struct map_entry *t = table_of(dev);
	unsigned n = 0;
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES; i++)
		n += t[i].map != NULL;
	return n;
}
