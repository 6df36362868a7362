/*
 * Unit tests for the registered path's kept pinnings: workers/transfer/reg_cache.c.
 * A fake device counts registrations, so a hit shows as none made.
 */
#include "tests/harness.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "workers/transfer/reg_cache.h"

static int registered, unregistered;

static int count_register(struct device *dev, void *ptr, size_t n, unsigned how,
			  struct gpuq_error *err)
{
	(void)dev, (void)ptr, (void)n, (void)how, (void)err;
	registered++;
	return 0;
}

static int count_unregister(struct device *dev, void *ptr, struct gpuq_error *err)
{
	(void)dev, (void)ptr, (void)err;
	unregistered++;
	return 0;
}

static const struct backend_ops counting_ops = {
	.name = "counting",
	.mem.host_register = count_register,
	.mem.host_unregister = count_unregister,
};

/* A sealed memfd of n bytes, as path registered takes. */
static int sealed_memfd(size_t n)
{
	int fd = memfd_create("reg-cache-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECK(fd >= 0 && ftruncate(fd, (off_t)n) == 0);
	CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
	return fd;
}

/* One transfer's acquire and release; whether it found the pinning kept. */
static bool transfer_once(struct device *dev, int fd, size_t n)
{
	struct reg_entry *e;
	struct gpuq_error err;
	void *map;
	bool hit = false;
	CHECK(reg_cache_acquire(dev, fd, 0, n, true, &e, &map, &hit, &err) == 0);
	CHECK(map != NULL);
	usleep(5000);
	memset(map, 7, 4096); /* a get's write: its first fault sets the file's times */
	CHECK(reg_cache_release(dev, e, fd, true, &err) == 0);
	return hit;
}

TEST(a_second_registered_transfer_of_a_memfd_finds_it_pinned)
{
	struct device dev = { .index = 3, .ops = &counting_ops };
	int fd = sealed_memfd(1 << 20);
	registered = unregistered = 0;
	CHECK(!transfer_once(&dev, fd, 1 << 20));
	CHECK(transfer_once(&dev, fd, 1 << 20));
	CHECK(transfer_once(&dev, fd, 1 << 20));
	CHECK_EQ(registered, 1);
	CHECK_EQ(unregistered, 0);
	CHECK_EQ(reg_cache_count(&dev), 1);
	/* another range of it is another pinning */
	CHECK(!transfer_once(&dev, fd, 4096));
	CHECK_EQ(registered, 2);
	reg_cache_drop(&dev);
	CHECK_EQ(reg_cache_count(&dev), 0);
	CHECK_EQ(unregistered, 2);
	close(fd);
}

TEST(a_memfd_whose_seals_size_or_contents_changed_is_pinned_anew)
{
	struct device dev = { .index = 4, .ops = &counting_ops };
	size_t n = 1 << 20;
	int fd = sealed_memfd(n);
	char byte = 1;
	registered = unregistered = 0;
	CHECK(!transfer_once(&dev, fd, n));
	CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_GROW) == 0); /* seals */
	CHECK(!transfer_once(&dev, fd, n));
	CHECK_EQ(unregistered, 1); /* the stale pinning went when its file was seen again */
	CHECK(transfer_once(&dev, fd, n));
	close(fd);
	fd = sealed_memfd(n);
	CHECK(!transfer_once(&dev, fd, n));
	CHECK(ftruncate(fd, (off_t)(2 * n)) == 0); /* size */
	CHECK(!transfer_once(&dev, fd, n));
	/* write(2) (or a hole punched) may replace pages: the change time says so */
	usleep(20000);
	CHECK(pwrite(fd, &byte, 1, 0) == 1);
	CHECK(!transfer_once(&dev, fd, n));
	CHECK(transfer_once(&dev, fd, n));
	/* this memfd's one pinning, and the closed first one's, kept until idle */
	CHECK_EQ(reg_cache_count(&dev), 2);
	reg_cache_drop(&dev);
	CHECK_EQ(registered, unregistered);
	close(fd);
}

TEST(kept_pinnings_are_bounded_and_in_use_ones_never_freed)
{
	struct device dev = { .index = 5, .ops = &counting_ops };
	struct reg_entry *held[REG_CACHE_ENTRIES + 2];
	int fds[REG_CACHE_ENTRIES + 2];
	struct gpuq_error err;
	registered = unregistered = 0;
	for (unsigned i = 0; i < REG_CACHE_ENTRIES + 2; i++) {
		void *map;
		bool hit;
		fds[i] = sealed_memfd(4096);
		CHECK(reg_cache_acquire(&dev, fds[i], 0, 4096, true, &held[i], &map, &hit, &err) == 0);
		CHECK(!hit);
	}
	/* every kept entry is in use: the last two were pinned for their job alone */
	CHECK_EQ(reg_cache_count(&dev), REG_CACHE_ENTRIES);
	CHECK_EQ(unregistered, 0);
	for (unsigned i = 0; i < REG_CACHE_ENTRIES + 2; i++)
		CHECK(reg_cache_release(&dev, held[i], fds[i], true, &err) == 0);
	CHECK_EQ(unregistered, 2);
	CHECK_EQ(reg_cache_count(&dev), REG_CACHE_ENTRIES);
	/* a new file takes the least recently used entry's place */
	int extra = sealed_memfd(4096);
	CHECK(!transfer_once(&dev, extra, 4096));
	CHECK_EQ(reg_cache_count(&dev), REG_CACHE_ENTRIES);
	CHECK_EQ(unregistered, 3);
	reg_cache_drop(&dev);
	CHECK_EQ(registered, unregistered);
	for (unsigned i = 0; i < REG_CACHE_ENTRIES + 2; i++)
		close(fds[i]);
	close(extra);
}
