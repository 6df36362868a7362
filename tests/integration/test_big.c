/*
 * Gigabyte-scale data, bit-exact. These run on the cuda backend (make
 * gpu-check) and on the host backend only when GPUQ_TEST_BIG=1, so that
 * `make test` stays quick on small machines.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "workers/backend/host_patterns.h"

static void require_big(void)
{
	const char *big = getenv("GPUQ_TEST_BIG");
	if (!test_backend_is_cuda() && !(big && strcmp(big, "1") == 0))
		SKIP("gigabyte tests run on the cuda backend (make gpu-check) or with GPUQ_TEST_BIG=1");
}

static void *map_fd(int fd, size_t n, int prot)
{
	void *p = mmap(NULL, n, prot, MAP_SHARED, fd, 0);
	CHECK(p != MAP_FAILED);
	return p;
}

static void round_trip(struct gpuq_client *c, size_t size, uint64_t seed)
{
	int src = memfd_random(size, seed);
	unsigned char *want = map_fd(src, size, PROT_READ);
	uint64_t want_sum = host_checksum(want, size);
	do_alloc(c, "big", 0, size);
	CHECK_EQ(do_put(c, "big", src), size);
	CHECK_EQ(do_checksum(c, "big"), want_sum);
	int dst = memfd_create("dst", MFD_CLOEXEC);
	CHECK_EQ(do_get(c, "big", dst), size);
	unsigned char *got = map_fd(dst, size, PROT_READ);
	CHECKF(memcmp(want, got, size) == 0, "%zu-byte round trip differs", size);
	munmap(want, size);
	munmap(got, size);
	close(src);
	close(dst);
	do_free(c, "big");
}

TEST(big_put_get_1GiB_bit_exact)
{
	require_big();
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "2G", NULL);
	struct gpuq_client *c = client_open(&d);
	round_trip(c, (1ull << 30) + 17, 2026);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(big_random_fill_checksum_equals_host_backend)
{
	require_big();
	const size_t size = (1ull << 30) + 5;
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "2G", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "r", 0, size);
	do_fill_random(c, "r", 314159);
	unsigned char *ref = malloc(size);
	CHECK(ref);
	host_fill_random(ref, size, GPUQ_DTYPE_BYTES, 314159);
	CHECK_EQ(do_checksum(c, "r"), host_checksum(ref, size));
	free(ref);
	gpuq_close(c);
	daemon_stop(&d);
}
