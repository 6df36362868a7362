/*
 * What outlives what: an ordinary buffer outlives every connection (a
 * killed client's buffers stay until freed); an ephemeral one goes with the
 * connection that made it, once no job holds it; a freed buffer's bytes do
 * not outlive it (a new buffer reads as zeros, whoever had the memory
 * before); and a get that fails on a full filesystem says so and leaves the
 * file as long as it was.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "tests/integration/lease_util.h"

static struct gpuq_reply *alloc_ephemeral(struct gpuq_client *c, const char *name, bool ephemeral)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "bytes", 4096);
	mp_put_bool(&req, "ephemeral", ephemeral);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

TEST(ordinary_buffers_outlive_the_client_that_made_them)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct gpuq_client *c = client_open(&d);
		do_alloc(c, "kept", 0, 4096);
		do_fill_random(c, "kept", 11);
		kill(getpid(), SIGKILL); /* no goodbye */
	}
	waitpid(pid, NULL, 0);
	struct gpuq_client *c = client_open(&d);
	bool ephemeral = true;
	CHECK(has_buffer(c, "kept", &ephemeral));
	CHECK(!ephemeral);
	int ref = memfd_random(4096, 11);
	do_alloc(c, "ref", 0, 4096);
	do_put(c, "ref", ref);
	CHECK_EQ(do_checksum(c, "kept"), do_checksum(c, "ref"));
	close(ref);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(ephemeral_buffers_go_with_their_connection)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *maker = client_open(&d), *other = client_open(&d);
	struct gpuq_reply *r = alloc_ephemeral(maker, "tmp", true);
	expect_ok(r, "alloc ephemeral");
	CHECK(reply_path(r, "job.result.ephemeral")->via.boolean);
	gpuq_reply_free(r);
	bool ephemeral = false;
	CHECK(has_buffer(other, "tmp", &ephemeral) && ephemeral);
	CHECK_EQ(do_checksum(other, "tmp"), do_checksum(maker, "tmp")); /* the owner's, by name */
	gpuq_close(maker);
	CHECKF(buffer_goes(other, "tmp"), "the ephemeral buffer outlived its connection");
	/* its name is free again, and the device memory given back */
	r = alloc_ephemeral(other, "tmp", false);
	expect_ok(r, "alloc the name again");
	gpuq_reply_free(r);
	gpuq_close(other);
	daemon_stop(&d);
}

TEST(an_ephemeral_buffer_in_use_goes_when_its_last_job_ends)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *maker = client_open(&d), *user = client_open(&d);
	struct gpuq_reply *r = alloc_ephemeral(maker, "w", true);
	expect_ok(r, "alloc ephemeral");
	gpuq_reply_free(r);
	int p[2];
	uint64_t put = start_stalled_put(user, "w", p);
	gpuq_close(maker);
	usleep(300000);
	CHECKF(has_buffer(user, "w", NULL), "freed while a job still held it");
	CHECK_EQ(write(p[1], "abcd", 4), 4);
	close(p[1]);
	struct mp_map req;
	gpuq_request_begin(user, &req, "wait");
	mp_put_u64(&req, "job", put);
	r = call(user, &req, NULL, 0);
	expect_ok(r, "the put into it");
	gpuq_reply_free(r);
	CHECKF(buffer_goes(user, "w"), "not freed when its last job ended");
	gpuq_close(user);
	daemon_stop(&d);
}

/*
 * gpuq alloc --ephemeral holds its buffer until sig ends it: killed, or
 * interrupted (then it exits 0, closing its connection itself).
 */
static void gpuq_alloc_ephemeral_ended_by(int sig)
{
	struct daemon_proc d;
	int status;
	daemon_start(&d, NULL);
	pid_t pid = spawn_gpuq(&d, "alloc", "held", "--bytes", "4K", "--ephemeral", NULL);
	struct gpuq_client *c = client_open(&d);
	bool there = false;
	for (int i = 0; i < 300 && !there; i++) {
		there = has_buffer(c, "held", NULL);
		if (!there)
			usleep(10000);
	}
	CHECKF(there, "gpuq alloc --ephemeral made no buffer");
	usleep(200000);
	CHECKF(waitpid(pid, NULL, WNOHANG) == 0, "gpuq alloc --ephemeral did not stay");
	CHECK(has_buffer(c, "held", NULL));
	kill(pid, sig);
	CHECK(waitpid(pid, &status, 0) == pid);
	if (sig != SIGKILL)
		CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		       "gpuq alloc --ephemeral did not end cleanly on signal %d (status 0x%x)", sig, status);
	CHECKF(buffer_goes(c, "held"), "the buffer outlived the gpuq that held it");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(gpuq_alloc_ephemeral_holds_the_buffer_until_it_is_killed)
{
	gpuq_alloc_ephemeral_ended_by(SIGKILL);
}

TEST(gpuq_alloc_ephemeral_interrupted_lets_the_buffer_go)
{
	gpuq_alloc_ephemeral_ended_by(SIGINT);
}

/* A get of w (1 MiB) into fd: its reply. */
static struct gpuq_reply *get_into(struct gpuq_client *c, int fd)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "get");
	mp_put_str(&req, "buffer", "w");
	mp_put_u64(&req, "fds", 1);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, &fd, 1);
}

/* Sizes that the memory's allocators reuse: heap chunks, slab ranges, whole slabs. */
static const uint64_t reused_sizes[] = { 4096, 65536 + 8, 3 * 1024 * 1024 + 5 };
#define NREUSED (sizeof reused_sizes / sizeof reused_sizes[0])

struct secrets {
	const struct daemon_proc *d;
	bool shareable;
};

/* Another user's data, in buffers that are then freed: their memory goes back for reuse. */
static void leave_freed_secrets(void *arg)
{
	const struct secrets *s = arg;
	struct gpuq_client *c = client_open(s->d);
	for (size_t i = 0; i < NREUSED; i++) {
		char name[16];
		snprintf(name, sizeof name, "secret%zu", i);
		if (s->shareable)
			lease_alloc_shareable(c, name, reused_sizes[i], false);
		else
			do_alloc(c, name, 0, reused_sizes[i]);
		do_fill_random(c, name, 40 + i);
		do_free(c, name);
	}
	gpuq_close(c);
}

/* Reads `name` back whole and checks that every byte is zero. */
static void check_reads_as_zeros(struct gpuq_client *c, const char *name, uint64_t bytes)
{
	int fd = memfd_create("gpuq-zero-check", MFD_CLOEXEC);
	CHECK(fd >= 0);
	CHECK_EQ(do_get(c, name, fd), bytes);
	size_t n;
	unsigned char *got = fd_slurp(fd, &n);
	CHECK_EQ(n, bytes);
	size_t nonzero = 0, first = n;
	for (size_t i = 0; i < n; i++) {
		if (got[i] && nonzero++ == 0)
			first = i;
	}
	CHECKF(nonzero == 0, "new buffer %s (%llu bytes) holds %zu bytes of what was there before, "
	       "the first at %zu", name, (unsigned long long)bytes, nonzero, first);
	free(got);
	close(fd);
}

static void new_buffers_read_as_zeros(const char *memory, bool shareable)
{
	struct daemon_proc d;
	/* the other user reaches the socket through the group that as_user gives it */
	daemon_start(&d, "--buffer-memory", memory, "--socket-group", "nogroup", NULL);
	struct secrets s = { &d, shareable };
	as_user(65534, NULL, 0, leave_freed_secrets, &s);
	struct gpuq_client *c = client_open(&d);
	for (size_t i = 0; i < NREUSED; i++) {
		char name[16];
		snprintf(name, sizeof name, "new%zu", i);
		if (shareable)
			lease_alloc_shareable(c, name, reused_sizes[i], false);
		else
			do_alloc(c, name, 0, reused_sizes[i]);
		check_reads_as_zeros(c, name, reused_sizes[i]);
	}
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(a_new_buffer_from_the_pool_shows_nothing_of_a_freed_one)
{
	new_buffers_read_as_zeros("pool", false);
}

TEST(a_new_buffer_from_a_slab_shows_nothing_of_a_freed_one)
{
	new_buffers_read_as_zeros(test_backend_is_cuda() ? "auto" : "vmm", false);
}

TEST(a_new_shareable_buffer_shows_nothing_of_a_freed_one)
{
	new_buffers_read_as_zeros(test_backend_is_cuda() ? "auto" : "vmm", true);
}

static off_t size_of(int fd)
{
	struct stat st;
	CHECK(fstat(fd, &st) == 0);
	return st.st_size;
}

TEST(a_get_onto_a_full_filesystem_says_so_and_restores_the_length)
{
	char dir[] = "/tmp/gpuq-full-XXXXXX";
	CHECK(mkdtemp(dir));
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
	    mount("tmpfs", dir, "tmpfs", 0, "size=64k") < 0)
		SKIP("cannot mount a small tmpfs here: %s", strerror(errno));
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 1 << 20);
	do_fill_random(c, "w", 5);
	const int modes[] = { O_RDWR, O_WRONLY }; /* mapped and written; pwritten */
	for (int i = 0; i < 2; i++) {
		char path[64];
		snprintf(path, sizeof path, "%s/out%d", dir, i);
		int fd = open(path, modes[i] | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		CHECK(fd >= 0);
		CHECK_EQ(write(fd, "0123456789", 10), 10);
		CHECK(lseek(fd, 0, SEEK_SET) == 0);
		struct gpuq_reply *r = get_into(c, fd);
		expect_error(r, GPUQ_E_IO, "No space left on device");
		gpuq_reply_free(r);
		CHECKF(size_of(fd) == 10, "the destination is %lld bytes, not the 10 it had",
		       (long long)size_of(fd));
		close(fd);
		unlink(path);
	}
	gpuq_close(c);
	daemon_stop(&d);
	umount(dir);
	rmdir(dir);
}
