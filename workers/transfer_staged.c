/*
 * The staged path: a regular file or memfd moved through the pinned staging
 * ring, its reads (put) or writes (get) done by the copy threads at the
 * file's offsets, several slots at once. Chunk k uses slot k % slots.
 *
 * Put: the worker keeps up to a ring of chunks handed to the copy threads
 * ahead of the next DMA (chunk j), reusing a slot once its event says its last
 * DMA is done; as each chunk is read, in order, it issues that slot's DMA on
 * the h2d stream. Get is the mirror on the d2h stream: a slot's DMA is issued
 * once the copy thread that wrote its previous chunk out is done, and a
 * finished DMA is handed to a copy thread to write out: by memcpy into a
 * shared mapping of the destination where the descriptor allows it (pwrites
 * to one file serialise on its inode lock; reads do not), populated first,
 * with the copy pool's store function (copy_store.h: memcpy, or
 * non-temporal stores with --copy-stores nt), else by pwrite.
 * Every chunk handed out
 * is waited for before the transfer returns, whatever happened, so that no
 * copy thread still touches a slot or a chunk afterwards.
 *
 * Worker thread, except chunk_read and chunk_write (copy threads).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workers/copy_guard.h"
#include "workers/copy_hash.h"
#include "workers/transfer_impl.h"

struct staged {
	struct xfer *x;
	struct xfer_chunk *ch; /* one per slot */
	struct copy_group group;
	uint64_t nchunks;
	uint64_t next; /* chunks handed to the copy threads so far */
};

/* Copy thread: the chunk's bytes from the source into its slot, until n or end of file. */
static void chunk_read(struct copy_task *task)
{
	struct xfer_chunk *c = (struct xfer_chunk *)task;
	struct xfer *x = c->x;
	if (x->scratch) {
		copy_fill_random_words(c->buf, c->n, x->seed, c->at / 8);
		c->got = c->n;
	}
	while (c->got < c->n) {
		ssize_t r = pread(x->fd, c->buf + c->got, c->n - c->got,
				  x->pos + (off_t)(c->at + c->got));
		if (r > 0) {
			c->got += (size_t)r;
		} else if (r == 0) {
			break;
		} else if (errno != EINTR) {
			c->error = errno;
			break;
		}
	}
	if (x->verify)
		c->sum = copy_hash_terms(c->buf, c->got, c->at / 8);
}

/*
 * Fills in the page tables for a chunk of the mapped destination in one
 * call. Left to page faults, each 4 KiB page of a 2 MiB chunk traps on its
 * own, and the traps, not the copy, set the pace (measured on a 6.18 kernel:
 * a GiB copied into a memfd mapping 2.5 times faster populated first). A
 * kernel without MADV_POPULATE_WRITE (before 5.14) says EINVAL and the
 * faults do the work; a failure of any other kind shows in the copy itself.
 */
static void populate_for_write(unsigned char *addr, size_t n)
{
	static const long populate_write = 23; /* MADV_POPULATE_WRITE, Linux 5.14 */
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)addr & ~(page - 1);
	(void)madvise((void *)start, (uintptr_t)addr + n - start, (int)populate_write);
}

/* Copy thread: the slot's bytes out to the destination at the chunk's offset. */
static void chunk_write(struct copy_task *task)
{
	struct xfer_chunk *c = (struct xfer_chunk *)task;
	struct xfer *x = c->x;
	if (x->verify)
		c->sum = copy_hash_terms(c->buf, c->n, c->at / 8);
	if (x->map_data && c->n)
		populate_for_write(x->map_data + c->at, c->n);
	if (x->map_data || x->scratch) {
		c->error = x->scratch ? 0
				      : copy_guarded_store(x->map_data + c->at, c->buf, c->n,
							   copy_pool_store(x->pool));
		c->got = c->error ? 0 : c->n;
		return;
	}
	while (c->got < c->n) {
		ssize_t w = pwrite(x->fd, c->buf + c->got, c->n - c->got,
				   x->pos + (off_t)(c->at + c->got));
		if (w > 0) {
			c->got += (size_t)w;
		} else if (w == 0) {
			c->error = EIO; /* a regular file that takes nothing */
			break;
		} else if (errno != EINTR) {
			c->error = errno;
			break;
		}
	}
}

static int staged_open(struct staged *s, struct xfer *x)
{
	memset(s, 0, sizeof *s);
	s->x = x;
	s->nchunks = (x->total + x->chunk - 1) / x->chunk;
	s->ch = calloc(x->slots, sizeof *s->ch);
	if (!s->ch)
		return gpuq_fail(x->err, GPUQ_E_OUT_OF_MEMORY, "no host memory for %u chunk records",
				 x->slots);
	copy_group_init(&s->group);
	return 0;
}

/* Waits for the chunks handed out from `from` on (those before it were waited for). */
static void staged_close(struct staged *s, uint64_t from)
{
	if (!s->ch)
		return;
	for (uint64_t k = from; k < s->next; k++)
		copy_task_wait(&s->ch[k % s->x->slots].task);
	copy_group_destroy(&s->group);
	free(s->ch);
}

/* Chunk k's record, set up for its slot (not yet handed out). */
static struct xfer_chunk *chunk_prepare(struct staged *s, uint64_t k, copy_task_fn fn)
{
	struct xfer *x = s->x;
	unsigned slot = (unsigned)(k % x->slots);
	struct xfer_chunk *c = &s->ch[slot];
	memset(c, 0, sizeof *c);
	c->task.fn = fn;
	c->task.group = &s->group;
	c->x = x;
	c->buf = x->dev->staging[slot];
	c->at = k * x->chunk;
	c->n = x->total - c->at < x->chunk ? (size_t)(x->total - c->at) : x->chunk;
	return c;
}

/*
 * Why a write into the mapped destination failed (copy_guard turned its
 * SIGBUS into an error): the file shrank under the mapping, or its
 * filesystem could not back the pages (full, or over a quota), which
 * fallocate over the chunk's range then reports as the system's own error.
 */
static int chunk_mapped_error(struct xfer *x, const struct xfer_chunk *c)
{
	struct stat st;
	off_t at = x->pos + (off_t)c->at;
	if (fstat(x->fd, &st) == 0 && st.st_size < at + (off_t)c->n)
		return gpuq_fail(x->err, GPUQ_E_IO,
				 "writing the destination at byte %llu: the file shrank while it "
				 "was written", (unsigned long long)c->at);
	int error = fallocate(x->fd, 0, at, (off_t)c->n) < 0 ? errno : 0;
	if (error == 0 || error == EOPNOTSUPP || error == ENOSYS)
		return gpuq_fail(x->err, GPUQ_E_IO,
				 "writing the destination at byte %llu: the mapped write failed though "
				 "the file holds that range (is its filesystem full?)",
				 (unsigned long long)c->at);
	return gpuq_fail(x->err, GPUQ_E_IO, "writing the destination at byte %llu: %s",
			 (unsigned long long)c->at, strerror(error));
}

/* A finished chunk: its read or write error, or a source that ended early. */
static int chunk_check(struct xfer *x, const struct xfer_chunk *c, bool put)
{
	if (c->error && !put && x->map_data)
		return chunk_mapped_error(x, c);
	if (c->error)
		return gpuq_fail(x->err, GPUQ_E_IO, "%s the %s at byte %llu: %s",
				 put ? "reading" : "writing", put ? "source" : "destination",
				 (unsigned long long)(c->at + c->got), strerror(c->error));
	if (c->got < c->n)
		return gpuq_fail(x->err, GPUQ_E_IO,
				 "the source ended after %llu of the %llu bytes %s",
				 (unsigned long long)(c->at + c->got), (unsigned long long)x->total,
				 x->work->length_exact ? "asked for" : "it held when the put started");
	return 0;
}

/*
 * Hands reads to the copy threads while their slots are free, up to a ring
 * ahead of chunk j, the next to DMA. A slot's last DMA (that of chunk
 * next - slots, before j) is issued already; it is waited for only when
 * chunk j itself needs the slot.
 */
static int put_fill_ring(struct staged *s, uint64_t j)
{
	struct xfer *x = s->x;
	struct device *dev = x->dev;
	while (s->next < s->nchunks && s->next < j + x->slots) {
		unsigned slot = (unsigned)(s->next % x->slots);
		if (s->next >= x->slots) {
			bool ready = true;
			if (s->next > j && dev->ops->slot_ready(dev, slot, &ready, x->err) < 0)
				return -1;
			if (!ready)
				break;
			if (s->next == j && dev->ops->slot_wait(dev, slot, x->err) < 0)
				return -1;
		}
		struct xfer_chunk *c = chunk_prepare(s, s->next++, chunk_read);
		copy_pool_submit(x->pool, &c->task);
	}
	return 0;
}

int xfer_put_staged(struct xfer *x)
{
	struct staged s;
	int rc = staged_open(&s, x);
	uint64_t j = 0;
	for (; j < s.nchunks && rc == 0; j++) {
		if ((rc = xfer_cancelled(x)) != 0 || (rc = put_fill_ring(&s, j)) != 0)
			break;
		struct xfer_chunk *c = &s.ch[j % x->slots];
		copy_task_wait(&c->task);
		if ((rc = chunk_check(x, c, true)) != 0)
			break;
		rc = x->dev->ops->h2d_async(x->dev, x->base + c->at, (unsigned)(j % x->slots), c->n,
					    x->err);
		if (rc == 0) {
			x->sum += c->sum;
			x->done += c->n;
			xfer_progress(x);
		}
	}
	staged_close(&s, j);
	return xfer_drain_slots(x, rc);
}

/* A chunk a copy thread has written out: its outcome, counted once. */
static int get_collect(struct staged *s, struct xfer_chunk *c)
{
	struct xfer *x = s->x;
	copy_task_wait(&c->task);
	if (chunk_check(x, c, false) < 0)
		return -1;
	x->sum += c->sum;
	x->done += c->n;
	xfer_progress(x);
	return 0;
}

/*
 * Issues DMAs into the slots whose writers are done, up to a ring ahead of
 * chunk w, the next to hand to a writer. The writer of a slot's previous
 * chunk (issued - slots, before w) is waited for only when chunk w itself
 * needs the slot. *collected counts the chunks whose writes were checked.
 */
static int get_fill_ring(struct staged *s, uint64_t w, uint64_t *issued, uint64_t *collected)
{
	struct xfer *x = s->x;
	while (*issued < s->nchunks && *issued < w + x->slots) {
		unsigned slot = (unsigned)(*issued % x->slots);
		if (*issued >= x->slots) {
			if (*issued > w && !copy_task_done(&s->ch[slot].task))
				break;
			if (get_collect(s, &s->ch[slot]) < 0)
				return -1;
			(*collected)++;
		}
		struct xfer_chunk *c = chunk_prepare(s, (*issued)++, chunk_write);
		if (x->dev->ops->d2h_async(x->dev, slot, x->base + c->at, c->n, x->err) < 0)
			return -1;
	}
	return 0;
}

/*
 * Maps the destination range when the descriptor allows it (open for
 * reading and writing), growing the file to hold the range first; else the
 * copy threads pwrite. A file that cannot be mapped is simply pwritten.
 */
static void get_map_destination(struct xfer *x)
{
	long page = sysconf(_SC_PAGESIZE);
	off_t end = x->pos + (off_t)x->total, start = x->pos - x->pos % page;
	if (x->scratch || (x->fd_flags & O_ACCMODE) != O_RDWR || x->total == 0 ||
	    (x->size < end && ftruncate(x->fd, end) < 0))
		return;
	size_t len = (size_t)(end - start + page - 1) / (size_t)page * (size_t)page;
	void *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, x->fd, start);
	if (map == MAP_FAILED)
		return;
	x->map = map;
	x->map_len = len;
	x->map_data = x->map + (x->pos - start);
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
static void unmap_destination(struct xfer *x)
{
	enum { MAX_PARTS = 64 };
	struct unmap_part parts[MAX_PARTS];
	struct copy_group group;
	long page = sysconf(_SC_PAGESIZE);
	unsigned n = copy_pool_threads(x->pool);
	n = n < 1 ? 1 : n > MAX_PARTS ? MAX_PARTS : n;
	size_t part = (x->map_len / n + (size_t)page - 1) / (size_t)page * (size_t)page;
	unsigned count = 0;
	copy_group_init(&group);
	for (size_t at = 0; at < x->map_len; at += part, count++) {
		parts[count].addr = x->map + at;
		parts[count].len = x->map_len - at < part ? x->map_len - at : part;
		parts[count].task.fn = part_unmap;
		parts[count].task.group = &group;
		copy_pool_submit(x->pool, &parts[count].task);
	}
	for (unsigned i = 0; i < count; i++)
		copy_task_wait(&parts[i].task);
	copy_group_destroy(&group);
	x->map = x->map_data = NULL;
}

/*
 * A get that failed leaves the destination no longer than it was: the
 * mapped path grew it to the whole range first, and pwrites may have grown
 * it part way. If that fails too, the job's error says so.
 */
static void get_restore_length(struct xfer *x)
{
	struct stat st;
	int rc;
	if (x->scratch || fstat(x->fd, &st) < 0 || st.st_size <= x->size)
		return;
	while ((rc = ftruncate(x->fd, x->size)) < 0 && errno == EINTR)
		;
	size_t used = strlen(x->err->message);
	if (rc < 0 && used < sizeof x->err->message)
		snprintf(x->err->message + used, sizeof x->err->message - used,
			 "; restoring the destination's length of %lld bytes failed too: %s",
			 (long long)x->size, strerror(errno));
}

int xfer_get_staged(struct xfer *x)
{
	struct staged s;
	uint64_t issued = 0, collected = 0;
	get_map_destination(x);
	int rc = staged_open(&s, x);
	for (uint64_t w = 0; w < s.nchunks && rc == 0; w++) {
		if ((rc = xfer_cancelled(x)) != 0 ||
		    (rc = get_fill_ring(&s, w, &issued, &collected)) != 0)
			break;
		unsigned slot = (unsigned)(w % x->slots);
		if ((rc = x->dev->ops->slot_wait(x->dev, slot, x->err)) != 0)
			break;
		copy_pool_submit(x->pool, &s.ch[slot].task);
		s.next = w + 1;
	}
	/* The last ring of writes: checked in order, stopping at the first failure. */
	for (; collected < s.next && rc == 0; collected++)
		rc = get_collect(&s, &s.ch[collected % x->slots]);
	if (rc == 0 && x->done < x->total && !atomic_load(&x->work->cancel))
		rc = gpuq_fail(x->err, GPUQ_E_INTERNAL, "get: %llu of %llu bytes written",
			       (unsigned long long)x->done, (unsigned long long)x->total);
	staged_close(&s, collected);
	if (x->map)
		unmap_destination(x);
	rc = xfer_drain_slots(x, rc);
	if (rc != 0)
		get_restore_length(x);
	return rc;
}
