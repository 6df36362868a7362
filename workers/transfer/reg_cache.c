/*
 * reg_cache: pinned mappings of sealed memfds kept between registered
 * transfers (reg_cache.h). Worker thread only: each device's entries are
 * touched by its worker alone, so there is no lock; `refs` keeps an entry
 * that a job on another fiber of the same worker still copies through.
 */
#include "workers/transfer/reg_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workers/clock.h"

struct reg_key {
	dev_t fs;
	ino_t ino;
	int seals;
	off_t size;
	struct timespec ctime;
	off_t start;
	size_t len;
	bool rw;
};

struct reg_entry {
	struct reg_key key;
	void *map;
	unsigned refs;
	bool kept;        /* in the device's table (else a one-job pinning, freed on release) */
	double last_used; /* monotonic seconds */
};

static struct reg_entry entries[GPUQ_MAX_DEVICES][REG_CACHE_ENTRIES];

static struct reg_entry *table_of(const struct device *dev)
{
	return entries[dev->index];
}

static bool key_equal(const struct reg_key *a, const struct reg_key *b)
{
	return a->fs == b->fs && a->ino == b->ino && a->seals == b->seals && a->size == b->size &&
	       a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec &&
	       a->start == b->start && a->len == b->len && a->rw == b->rw;
}

static int key_of(int fd, off_t start, size_t len, bool rw, struct reg_key *k,
		  struct gpuq_error *err)
{
	struct stat st;
	memset(k, 0, sizeof *k);
	k->seals = fcntl(fd, F_GET_SEALS);
	if (fstat(fd, &st) < 0 || k->seals < 0)
		return gpuq_fail(err, GPUQ_E_IO, "path registered: the descriptor: %s",
				 strerror(errno));
	k->fs = st.st_dev;
	k->ino = st.st_ino;
	k->size = st.st_size;
	k->ctime = st.st_ctim;
	k->start = start;
	k->len = len;
	k->rw = rw;
	return 0;
}

/* Unregisters and unmaps; the first error into err (NULL: ignored). */
static int entry_free(struct device *dev, struct reg_entry *e, struct gpuq_error *err)
{
	struct gpuq_error ignored;
	int rc = dev->ops->mem.host_unregister(dev, e->map, err ? err : &ignored);
	munmap(e->map, e->key.len);
	memset(e, 0, sizeof *e);
	return rc;
}

static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[128];
	unsigned long long kb = 0;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return (uint64_t)kb * 1024;
}

static uint64_t pinned_bytes(const struct device *dev)
{
	const struct reg_entry *t = table_of(dev);
	uint64_t n = 0;
	for (unsigned i = 0; i < REG_CACHE_ENTRIES; i++)
		n += t[i].map ? t[i].key.len : 0;
	return n;
}

/* Releases idle entries: stale ones of this file, ones unused too long, all under memory pressure. */
static void evict(struct device *dev, const struct reg_key *k)
{
	struct reg_entry *t = table_of(dev);
	double now = monotonic_seconds();
	uint64_t avail = mem_available();
	bool pressed = avail && avail < 2 * pinned_bytes(dev);
	for (unsigned i = 0; i < REG_CACHE_ENTRIES; i++) {
		struct reg_entry *e = &t[i];
		bool stale = k && e->key.fs == k->fs && e->key.ino == k->ino && !key_equal(&e->key, k);
		if (e->map && e->refs == 0 &&
		    (stale || pressed || now - e->last_used > REG_CACHE_IDLE_S))
			entry_free(dev, e, NULL);
	}
}

/* Whether a new pinning of len bytes may be kept: a free entry and room under the bounds. */
static struct reg_entry *free_entry(struct device *dev, size_t len)
{
	struct reg_entry *t = table_of(dev), *slot = NULL, *oldest = NULL;
	uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
	for (unsigned i = 0; i < REG_CACHE_ENTRIES; i++) {
		if (!t[i].map && !slot)
			slot = &t[i];
		if (t[i].map && t[i].refs == 0 && (!oldest || t[i].last_used < oldest->last_used))
			oldest = &t[i];
	}
	if (!slot && oldest) {
		entry_free(dev, oldest, NULL);
		slot = oldest;
	}
	while (slot && pinned_bytes(dev) + len > phys / 4) {
		oldest = NULL;
		for (unsigned i = 0; i < REG_CACHE_ENTRIES; i++)
			if (t[i].map && t[i].refs == 0 && (!oldest || t[i].last_used < oldest->last_used))
				oldest = &t[i];
		if (!oldest)
			return NULL;
		entry_free(dev, oldest, NULL);
	}
	return slot;
}

static int entry_pin(struct device *dev, int fd, const struct reg_key *k, struct reg_entry *e,
		     struct gpuq_error *err)
{
	void *map = mmap(NULL, k->len, k->rw ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd,
			 k->start);
	if (map == MAP_FAILED)
		return gpuq_fail(err, GPUQ_E_IO, "path registered: cannot map the memfd: %s",
				 strerror(errno));
	if (dev->ops->mem.host_register(dev, map, k->len, k->rw ? 0 : BACKEND_REGISTER_READ_ONLY,
					err) < 0) {
		munmap(map, k->len);
		return -1;
	}
	e->key = *k;
	e->map = map;
	return 0;
}

int reg_cache_acquire(struct device *dev, int fd, off_t start, size_t len, bool rw,
		      struct reg_entry **entry, void **map, bool *hit, struct gpuq_error *err)
{
	static struct reg_entry one_job[GPUQ_MAX_DEVICES][REG_CACHE_ENTRIES];
	struct reg_entry *t = table_of(dev), *e = NULL;
	struct reg_key k;
	if (key_of(fd, start, len, rw, &k, err) < 0)
		return -1;
	evict(dev, &k);
	*hit = false;
	for (unsigned i = 0; i < REG_CACHE_ENTRIES && !e; i++)
		if (t[i].map && key_equal(&t[i].key, &k))
			e = &t[i];
	if (e) {
		*hit = true;
	} else if ((e = free_entry(dev, len)) != NULL) {
		if (entry_pin(dev, fd, &k, e, err) < 0)
			return -1;
		e->kept = true;
	} else {
		/* every entry is in use: a pinning for this job alone, in a spare record */
		for (unsigned i = 0; i < REG_CACHE_ENTRIES && !e; i++)
			if (!one_job[dev->index][i].map)
				e = &one_job[dev->index][i];
		if (!e)
			return gpuq_fail(err, GPUQ_E_BUSY,
					 "[gpu %d] path registered: %d transfers are pinned already; "
					 "retry, or use path staged", dev->index, 2 * REG_CACHE_ENTRIES);
		if (entry_pin(dev, fd, &k, e, err) < 0)
			return -1;
		e->kept = false;
	}
	e->refs++;
	e->last_used = monotonic_seconds();
	*entry = e;
	*map = e->map;
	return 0;
}

int reg_cache_release(struct device *dev, struct reg_entry *e, int fd, bool keep,
		      struct gpuq_error *err)
{
	struct gpuq_error ignored;
	struct reg_key now;
	e->refs--;
	e->last_used = monotonic_seconds();
	/*
	 * The transfer's own first writes through the mapping (a get, or the
	 * pinning itself) set the file's times: what it is now is what the
	 * next transfer must find.
	 */
	if (keep && key_of(fd, e->key.start, e->key.len, e->key.rw, &now, &ignored) == 0)
		e->key = now;
	else
		keep = false;
	if (e->refs == 0 && (!keep || !e->kept || dev->faulted))
		return entry_free(dev, e, err);
	evict(dev, NULL);
	return 0;
}

void reg_cache_drop(struct device *dev)
{
	struct reg_entry *t = table_of(dev);
	for (unsigned i = 0; i < REG_CACHE_ENTRIES; i++)
		if (t[i].map && t[i].refs == 0)
			entry_free(dev, &t[i], NULL);
}

unsigned reg_cache_count(const struct device *dev)
{
	const struct reg_entry *t = table_of(dev);
	unsigned n = 0;
	for (unsigned i = 0; i < REG_CACHE_ENTRIES; i++)
		n += t[i].map != NULL;
	return n;
}
