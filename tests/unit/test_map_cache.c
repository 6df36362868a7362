/*
 * Unit tests for the mappings kept across transfers: workers/transfer/map_cache.c.
 * A fake device counts registrations, so a hit shows as none made.
 */
#include "tests/harness.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "workers/clock.h"
#include "workers/transfer/map_cache.h"

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

/* A memfd of n bytes sealed against shrinking, as path registered takes; open to more seals, or not. */
static int memfd_sealed(size_t n, bool final)
{
	int fd = memfd_create("map-cache-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECK(fd >= 0 && ftruncate(fd, (off_t)n) == 0);
	CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | (final ? F_SEAL_SEAL : 0)) == 0);
	return fd;
}

static int sealed_memfd(size_t n)
{
	return memfd_sealed(n, true);
}

/* One transfer's acquire and release; whether it found the mapping kept. */
static bool transfer_rw(struct device *dev, int fd, size_t n, bool pin, bool rw)
{
	struct map_want want = { .fd = fd, .start = 0, .len = n, .rw = rw, .pin = pin };
	struct map_entry *e;
	struct gpuq_error err;
	void *map;
	bool hit = false;
	CHECK(map_cache_acquire(dev, NULL, &want, &e, &map, &hit, &err) == 0);
	CHECK(map != NULL);
	usleep(5000);
	if (rw)
		memset(map, 7, 4096); /* a get's write: its first fault sets the file's times */
	CHECK(map_cache_release(dev, NULL, e, fd, true, &err) == 0);
	return hit;
}

static bool transfer_as(struct device *dev, int fd, size_t n, bool pin)
{
	return transfer_rw(dev, fd, n, pin, true);
}

static bool transfer_once(struct device *dev, int fd, size_t n)
{
	return transfer_as(dev, fd, n, true);
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
	CHECK_EQ(map_cache_count(&dev), 1);
	/* another range of it is another pinning */
	CHECK(!transfer_once(&dev, fd, 4096));
	CHECK_EQ(registered, 2);
	map_cache_drop(&dev, NULL);
	CHECK_EQ(map_cache_count(&dev), 0);
	CHECK_EQ(unregistered, 2);
	close(fd);
}

TEST(a_memfd_whose_seals_size_or_contents_changed_is_pinned_anew)
{
	struct device dev = { .index = 4, .ops = &counting_ops };
	size_t n = 1 << 20;
	int fd = memfd_sealed(n, false); /* read-only pinnings of it are kept: a put's */
	char byte = 1;
	registered = unregistered = 0;
	CHECK(!transfer_rw(&dev, fd, n, true, false));
	CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_GROW) == 0); /* seals */
	CHECK(!transfer_rw(&dev, fd, n, true, false));
	CHECK_EQ(unregistered, 1); /* the stale pinning went when its file was seen again */
	CHECK(transfer_rw(&dev, fd, n, true, false));
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
	CHECK_EQ(map_cache_count(&dev), 2);
	map_cache_drop(&dev, NULL);
	CHECK_EQ(registered, unregistered);
	close(fd);
}

TEST(kept_pinnings_are_bounded_and_in_use_ones_never_freed)
{
	struct device dev = { .index = 5, .ops = &counting_ops };
	struct map_entry *held[MAP_CACHE_ENTRIES + 2];
	int fds[MAP_CACHE_ENTRIES + 2];
	struct gpuq_error err;
	registered = unregistered = 0;
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES + 2; i++) {
		void *map;
		bool hit;
		fds[i] = sealed_memfd(4096);
		struct map_want want = { .fd = fds[i], .len = 4096, .rw = true, .pin = true };
		CHECK(map_cache_acquire(&dev, NULL, &want, &held[i], &map, &hit, &err) == 0);
		CHECK(!hit);
	}
	/* every kept entry is in use: the last two were pinned for their job alone */
	CHECK_EQ(map_cache_count(&dev), MAP_CACHE_ENTRIES);
	CHECK_EQ(unregistered, 0);
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES + 2; i++)
		CHECK(map_cache_release(&dev, NULL, held[i], fds[i], true, &err) == 0);
	CHECK_EQ(unregistered, 2);
	CHECK_EQ(map_cache_count(&dev), MAP_CACHE_ENTRIES);
	/* a new file takes the least recently used entry's place */
	int extra = sealed_memfd(4096);
	CHECK(!transfer_once(&dev, extra, 4096));
	CHECK_EQ(map_cache_count(&dev), MAP_CACHE_ENTRIES);
	CHECK_EQ(unregistered, 3);
	map_cache_drop(&dev, NULL);
	CHECK_EQ(registered, unregistered);
	for (unsigned i = 0; i < MAP_CACHE_ENTRIES + 2; i++)
		close(fds[i]);
	close(extra);
}

TEST(a_plain_mapping_is_kept_whatever_the_file_went_through)
{
	struct device dev = { .index = 6, .ops = &counting_ops };
	size_t n = 1 << 20;
	int fd = sealed_memfd(n);
	char byte = 1;
	registered = unregistered = 0;
	CHECK(!transfer_as(&dev, fd, n, false));
	/* a shared mapping shows the file as it is: written, resealed, grown */
	usleep(20000);
	CHECK(pwrite(fd, &byte, 1, 0) == 1);
	CHECK(ftruncate(fd, (off_t)(2 * n)) == 0);
	CHECK(transfer_as(&dev, fd, n, false));
	/* never taken for a pinning, nor a pinning for it */
	CHECK(!transfer_as(&dev, fd, n, true));
	CHECK(transfer_as(&dev, fd, n, false));
	CHECK_EQ(registered, 1);
	CHECK_EQ(map_cache_count(&dev), 2);
	map_cache_drop(&dev, NULL);
	CHECK_EQ(unregistered, 1);
	CHECK_EQ(map_cache_count(&dev), 0);
	close(fd);
}

TEST(a_file_a_path_names_is_kept_mapped_for_a_get_a_second_at_most)
{
	struct device dev = { .index = 8, .ops = &counting_ops };
	char path[] = "map-cache-file-XXXXXX";
	int fd = mkostemp(path, O_CLOEXEC);
	CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0);
	registered = unregistered = 0;
	/* never pinned for longer than a transfer */
	CHECK(!transfer_as(&dev, fd, 1 << 20, true));
	CHECK(!transfer_as(&dev, fd, 1 << 20, true));
	CHECK_EQ(registered, 2);
	CHECK_EQ(unregistered, 2);
	CHECK_EQ(map_cache_count(&dev), 0);
	/* a get's writable mapping: kept, and found again */
	CHECK(!transfer_as(&dev, fd, 1 << 20, false));
	CHECK(transfer_as(&dev, fd, 1 << 20, false));
	CHECK_EQ(map_cache_count(&dev), 1);
	/* the idle worker is told when to release it, and releases it then */
	double now = monotonic_seconds();
	double due = map_cache_idle_due(&dev, now);
	CHECK(due >= 0 && due <= MAP_CACHE_FILE_IDLE_S);
	map_cache_expire(&dev, NULL, now);
	CHECK_EQ(map_cache_count(&dev), 1);
	map_cache_expire(&dev, NULL, now + MAP_CACHE_FILE_IDLE_S + 0.5);
	CHECK_EQ(map_cache_count(&dev), 0);
	CHECK(map_cache_idle_due(&dev, now) < 0);
	unlink(path);
	close(fd);
}

TEST(a_memfd_stays_mapped_until_its_longer_idle_limit)
{
	struct device dev = { .index = 9, .ops = &counting_ops };
	size_t n = 1 << 20;
	int fd = sealed_memfd(n);
	CHECK(!transfer_as(&dev, fd, n, false));
	double now = monotonic_seconds();
	CHECK(map_cache_idle_due(&dev, now) > MAP_CACHE_FILE_IDLE_S);
	map_cache_expire(&dev, NULL, now + MAP_CACHE_FILE_IDLE_S + 0.5);
	CHECK_EQ(map_cache_count(&dev), 1);
	map_cache_expire(&dev, NULL, now + MAP_CACHE_IDLE_S + 0.5);
	CHECK_EQ(map_cache_count(&dev), 0);
	close(fd);
}

TEST(a_writable_mapping_never_stands_in_the_way_of_a_seal)
{
	struct device dev = { .index = 7, .ops = &counting_ops };
	size_t n = 1 << 20;
	int open_fd = memfd_sealed(n, false), plain = memfd_create("m", MFD_CLOEXEC);
	CHECK(plain >= 0 && ftruncate(plain, (off_t)n) == 0);
	registered = unregistered = 0;
	CHECK(!transfer_as(&dev, open_fd, n, true));
	CHECK(!transfer_as(&dev, open_fd, n, false));
	CHECK_EQ(map_cache_count(&dev), 0); /* neither kept: it may still be sealed */
	CHECK(fcntl(open_fd, F_ADD_SEALS, F_SEAL_WRITE) == 0);
	/* a memfd made without MFD_ALLOW_SEALING takes no seals: kept */
	CHECK(!transfer_as(&dev, plain, n, false));
	CHECK(transfer_as(&dev, plain, n, false));
	map_cache_drop(&dev, NULL);
	CHECK_EQ(registered, unregistered);
	close(open_fd);
	close(plain);
}
