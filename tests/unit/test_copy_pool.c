/* Unit tests for the copy threads and what runs on them: workers/copy_*.c. */
#include "tests/harness.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "workers/transfer/copy_guard.h"
#include "workers/transfer/copy_hash.h"
#include "workers/transfer/copy_pool.h"
#include "workers/backend/host_patterns.h"

struct add_task {
	struct copy_task task; /* first */
	unsigned value;
	unsigned *out;
};

static void run_add(struct copy_task *task)
{
	struct add_task *t = (struct add_task *)task;
	*t->out = t->value * 2;
}

TEST(copy_pool_runs_every_task_with_and_without_threads)
{
	const unsigned counts[] = { 0, 1, 4 };
	for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
		struct gpuq_error err;
		struct copy_pool *pool = copy_pool_start(counts[k], &err);
		CHECKF(pool, "copy_pool_start(%u): %s", counts[k], err.message);
		CHECK_EQ(copy_pool_threads(pool), counts[k]);
		struct copy_group group;
		copy_group_init(&group);
		struct add_task tasks[200];
		unsigned out[200] = { 0 };
		for (unsigned round = 0; round < 3; round++) { /* tasks are reused, as transfers do */
			for (unsigned i = 0; i < 200; i++) {
				tasks[i] = (struct add_task){ .value = i + round, .out = &out[i] };
				tasks[i].task.fn = run_add;
				tasks[i].task.group = &group;
				copy_pool_submit(pool, &tasks[i].task);
			}
			for (unsigned i = 0; i < 200; i++) {
				copy_task_wait(&tasks[i].task);
				CHECK(copy_task_done(&tasks[i].task));
				CHECK_EQ(out[i], 2 * (i + round));
			}
		}
		copy_group_destroy(&group);
		copy_pool_stop(pool);
	}
	copy_pool_stop(NULL);
}

TEST(copy_hash_matches_the_checksum_definition)
{
	struct gpuq_error err;
	struct copy_pool *pool = copy_pool_start(3, &err);
	CHECK(pool);
	const size_t sizes[] = { 0, 1, 7, 8, 9, 4097, (8u << 20) + 3, (40u << 20) + 5 };
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		size_t n = sizes[k];
		unsigned char *a = malloc(n + 1), *b = malloc(n + 1);
		CHECK(a && b);
		host_fill_random(a, n, GPUQ_DTYPE_BYTES, 77 + k);
		copy_fill_random_parallel(pool, b, n, 77 + k);
		CHECKF(memcmp(a, b, n) == 0, "parallel random fill of %zu bytes differs", n);
		uint64_t want = host_checksum(a, n);
		CHECK_EQ(copy_hash_parallel(pool, a, n), want);
		/* The sum of parts hashed separately (word-aligned cuts) is the whole's. */
		size_t cut = n / 16 * 8;
		uint64_t sum = copy_hash_terms(a, cut, 0) + copy_hash_terms(a + cut, n - cut, cut / 8);
		CHECK_EQ(copy_hash_terms_parallel(pool, a, n), sum);
		free(a);
		free(b);
	}
	copy_pool_stop(pool);
}

TEST(copy_guarded_survives_a_file_that_shrank)
{
	long page = sysconf(_SC_PAGESIZE);
	int fd = memfd_create("guard", MFD_CLOEXEC);
	CHECK(fd >= 0 && ftruncate(fd, 2 * page) == 0);
	unsigned char *map = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(map != MAP_FAILED);
	unsigned char src[64];
	memset(src, 0xab, sizeof src);
	CHECK_EQ(copy_guarded(map + page + 10, src, sizeof src), 0);
	CHECK(map[page + 10] == 0xab);
	CHECK(ftruncate(fd, page) == 0); /* what another process could do to a client's file */
	CHECK_EQ(copy_guarded(map + page + 10, src, sizeof src), EFAULT);
	CHECK_EQ(copy_guarded(map + 10, src, sizeof src), 0); /* the rest still works */
	CHECK(map[10] == 0xab);
	munmap(map, 2 * (size_t)page);
	close(fd);
}
