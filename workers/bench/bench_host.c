/*
 * bench_host: a get's host half without the device (bench_host.h). Each
 * copy thread takes the next 2 MiB chunk (a staging slot's size) until none
 * is left, as the copy threads of a staged get take finished slots; the
 * mapping, like a get's, is asked for huge pages and unmapped in one part
 * per thread; a disk file's new blocks are allocated first, as a get
 * allocates them.
 *
 * Worker thread; part_write and part_unmap run on the copy threads.
 */
#include "workers/bench/bench_host.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "workers/clock.h"
#include "workers/transfer/copy_guard.h"

#define HOST_CHUNK ((size_t)2 << 20)
#define MAX_PARTS 64
#define POPULATE_WRITE 23 /* MADV_POPULATE_WRITE, Linux 5.14 */

struct host_job {
	int fd;
	enum bench_host_means means;
	const unsigned char *src;
	unsigned char *map;
	size_t n, unmap_part;
	copy_store_fn store;
	atomic_size_t next;
	atomic_int error; /* the first errno */
};

struct host_part {
	struct copy_task task; /* first */
	struct host_job *job;
	unsigned index;
};

static void job_error(struct host_job *j, int error)
{
	int none = 0;
	atomic_compare_exchange_strong(&j->error, &none, error);
}

static void chunk_pwrite(struct host_job *j, size_t at, size_t len)
{
	for (size_t done = 0; done < len;) {
		ssize_t w = pwrite(j->fd, j->src + at + done, len - done, (off_t)(at + done));
		if (w > 0)
			done += (size_t)w;
		else if (w == 0 || errno != EINTR)
			return job_error(j, w == 0 ? EIO : errno);
	}
}

static void part_write(struct copy_task *task)
{
	struct host_job *j = ((struct host_part *)task)->job;
	for (;;) {
		size_t at = atomic_fetch_add(&j->next, 1) * HOST_CHUNK;
		if (at >= j->n)
			return;
		size_t len = j->n - at < HOST_CHUNK ? j->n - at : HOST_CHUNK;
		if (j->means == BENCH_HOST_PWRITE) {
			chunk_pwrite(j, at, len);
			continue;
		}
		(void)madvise(j->map + at, len, POPULATE_WRITE);
		int e = copy_guarded_store(j->map + at, j->src + at, len, j->store);
		if (e)
			job_error(j, e);
	}
}

static void part_unmap(struct copy_task *task)
{
	struct host_part *p = (struct host_part *)task;
	struct host_job *j = p->job;
	size_t at = (size_t)p->index * j->unmap_part;
	if (at < j->n)
		munmap(j->map + at, j->n - at < j->unmap_part ? j->n - at : j->unmap_part);
}

/* A disk file's new blocks allocated at once, as a get does (transfer_staged.c, get_reserve). */
static void reserve_blocks(int fd, off_t from, off_t end)
{
	struct statfs fs;
	if (fstatfs(fd, &fs) < 0 || ((unsigned long)fs.f_type & 0xffffffffUL) == 0x01021994UL)
		return; /* shmem: the pages themselves, one by one */
	(void)fallocate(fd, 0, from, end - from);
}

/* Runs fn once per copy thread (once inline without threads) and waits for all. */
static void run_parts(struct copy_pool *pool, struct host_job *j, copy_task_fn fn, unsigned n)
{
	struct host_part parts[MAX_PARTS];
	struct copy_group group;
	copy_group_init(&group);
	for (unsigned i = 0; i < n; i++) {
		parts[i] = (struct host_part){ .job = j, .index = i };
		parts[i].task.fn = fn;
		parts[i].task.group = &group;
		copy_pool_submit(pool, &parts[i].task);
	}
	for (unsigned i = 0; i < n; i++)
		copy_task_wait(&parts[i].task);
	copy_group_destroy(&group);
}

int bench_host_write(struct copy_pool *pool, int fd, const void *src, size_t n,
		     enum bench_host_means means, void *kept, double *seconds,
		     struct gpuq_error *err)
{
	struct host_job j = { .fd = fd, .means = means, .src = src, .n = n,
			      .store = copy_pool_store(pool) };
	unsigned threads = copy_pool_threads(pool);
	long page = sysconf(_SC_PAGESIZE);
	struct stat st;
	threads = threads < 1 ? 1 : threads > MAX_PARTS ? MAX_PARTS : threads;
	double start = monotonic_seconds();
	if (fstat(fd, &st) < 0 || (st.st_size < (off_t)n && ftruncate(fd, (off_t)n) < 0))
		return gpuq_fail(err, GPUQ_E_IO, "bench: growing the destination: %s", strerror(errno));
	if (st.st_size < (off_t)n)
		reserve_blocks(fd, st.st_size, (off_t)n);
	if (means == BENCH_HOST_MAP) {
		void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED)
			return gpuq_fail(err, GPUQ_E_IO, "bench: mapping the destination: %s",
					 strerror(errno));
		j.map = m;
		(void)madvise(j.map, n, MADV_HUGEPAGE); /* as a get asks (transfer_staged.c) */
		j.unmap_part = (n / threads + (size_t)page - 1) / (size_t)page * (size_t)page;
	}
	if (means == BENCH_HOST_KEPT)
		j.map = kept;
	run_parts(pool, &j, part_write, threads);
	if (j.map && means == BENCH_HOST_MAP)
		run_parts(pool, &j, part_unmap, threads);
	*seconds = monotonic_seconds() - start;
	if (atomic_load(&j.error))
		return gpuq_fail(err, GPUQ_E_IO, "bench: writing the destination: %s",
				 strerror(atomic_load(&j.error)));
	return 0;
}
