/*
 * The pipelined copy at the sizes that matter on a GPU, bit-exact both ways:
 * 1 byte, 4 KiB + 1, one staging slot - 1, + 0 and + 1 (the default 2 MiB
 * slot), and 3 GiB + 17. Through a memfd (the copy threads, mapped writes),
 * a pipe (in order), and with --verify. On the cuda backend (make
 * gpu-check), and on the host backend only with GPUQ_TEST_BIG=1.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "workers/backend/host_patterns.h"

#define SLOT ((size_t)2 << 20) /* gpuqd's default --staging-slot */

static void require_big(void)
{
	const char *big = getenv("GPUQ_TEST_BIG");
	if (!test_backend_is_cuda() && !(big && strcmp(big, "1") == 0))
		SKIP("GPU-sized copies run on the cuda backend (make gpu-check) or with GPUQ_TEST_BIG=1");
}

static uint64_t transfer(struct gpuq_client *c, const char *op, const char *buffer, int fd,
			 char *path, size_t path_size)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, "buffer", buffer);
	mp_put_bool(&req, "verify", true);
	mp_put_bool(&req, "wait", true);
	mp_put_u64(&req, "fds", 1);
	struct gpuq_reply *r = call(c, &req, &fd, 1);
	expect_ok(r, op);
	uint64_t n = reply_u64(r, "job.result.bytes");
	reply_str(r, "job.result.path", path, path_size);
	gpuq_reply_free(r);
	return n;
}

/* memfd -> device -> memfd, compared byte for byte. */
static void memfd_round_trip(struct gpuq_client *c, size_t size, uint64_t seed)
{
	char path[32];
	int src = memfd_random(size, seed);
	unsigned char *want = mmap(NULL, size, PROT_READ, MAP_SHARED, src, 0);
	CHECK(want != MAP_FAILED);
	do_alloc(c, "big", 0, size);
	CHECK_EQ(transfer(c, "put", "big", src, path, sizeof path), size);
	CHECK_STR(path, "staged");
	CHECK_EQ(do_checksum(c, "big"), host_checksum(want, size));
	int dst = memfd_create("dst", MFD_CLOEXEC);
	CHECK_EQ(transfer(c, "get", "big", dst, path, sizeof path), size);
	CHECK_STR(path, "staged");
	unsigned char *got = mmap(NULL, size, PROT_READ, MAP_SHARED, dst, 0);
	CHECK(got != MAP_FAILED);
	CHECKF(memcmp(want, got, size) == 0, "%zu-byte memfd round trip differs", size);
	munmap(want, size);
	munmap(got, size);
	close(src);
	close(dst);
	do_free(c, "big");
}

/* device -> pipe -> device, through a child that echoes what it reads. */
static void pipe_round_trip(struct gpuq_client *c, size_t size, uint64_t seed)
{
	char path[32];
	int src = memfd_random(size, seed);
	unsigned char *want = mmap(NULL, size, PROT_READ, MAP_SHARED, src, 0);
	CHECK(want != MAP_FAILED);
	do_alloc(c, "p", 0, size);
	do_put(c, "p", src);
	int out[2];
	CHECK(pipe(out) == 0);
	pid_t child = fork();
	if (child == 0) {
		close(out[1]);
		unsigned char *got = malloc(size + 1);
		size_t k = 0;
		ssize_t r;
		while ((r = read(out[0], got + k, size + 1 - k)) > 0)
			k += (size_t)r;
		_exit(k == size && memcmp(got, want, size) == 0 ? 0 : 1);
	}
	close(out[0]);
	CHECK_EQ(transfer(c, "get", "p", out[1], path, sizeof path), size);
	CHECK_STR(path, "streamed");
	close(out[1]);
	int status;
	waitpid(child, &status, 0);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%zu bytes read from the pipe differ", size);
	munmap(want, size);
	close(src);
	do_free(c, "p");
}

TEST(big_copy_small_and_slot_sized_round_trips)
{
	require_big();
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t sizes[] = { 1, 4096 + 1, SLOT - 1, SLOT, SLOT + 1, 7 * SLOT + 3 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		memfd_round_trip(c, sizes[i], 900 + i);
		pipe_round_trip(c, sizes[i], 950 + i);
	}
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(big_copy_3GiB_plus_17_bit_exact)
{
	require_big();
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "4G", NULL);
	struct gpuq_client *c = client_open(&d);
	memfd_round_trip(c, (3ull << 30) + 17, 2027);
	gpuq_close(c);
	daemon_stop(&d);
}
