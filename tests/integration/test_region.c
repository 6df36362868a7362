/*
 * Host regions: made by libgpuq (a sealed memfd, mapped here and pinned by
 * gpuqd), put and get through them bit for bit at odd offsets and sizes,
 * every refusal (an unsealed memfd, sizes, ranges, another user's region,
 * RLIMIT_MEMLOCK, the host-pinned quota), region_free waiting for the jobs
 * that use the region, and an ephemeral region going with its connection.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "workers/backend/host_patterns.h"

#define MIB (1024u * 1024u)

/* put (region -> buffer) or get (buffer -> region) through a region, waited for. */
static struct gpuq_reply *region_xfer(struct gpuq_client *c, bool put, const char *region,
				      const char *buffer, bool wait)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, put ? "put" : "get");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "region", region);
	mp_put_bool(&req, "wait", wait);
	return call(c, &req, NULL, 0);
}

static void expect_xfer(struct gpuq_client *c, bool put, const char *region, const char *buffer,
			uint64_t bytes)
{
	struct gpuq_reply *r = region_xfer(c, put, region, buffer, true);
	char path[32];
	expect_ok(r, put ? "put from a region" : "get into a region");
	CHECK_EQ(reply_u64(r, "job.result.bytes"), bytes);
	reply_str(r, "job.result.path", path, sizeof path);
	CHECK_STR(path, "region");
	gpuq_reply_free(r);
}

static void make_region(struct gpuq_client *c, const char *name, uint64_t bytes,
			struct gpuq_region *out)
{
	struct gpuq_error err;
	CHECKF(gpuq_region_create(c, name, bytes, 0, false, out, &err) == 0,
	       "region_create %s: %s", name, err.message);
	CHECK(out->ptr != NULL && out->bytes == bytes);
}

/* A buffer's bytes [off, off + n), read back through an ordinary get into a memfd. */
static void *buffer_bytes(struct gpuq_client *c, const char *buffer, size_t *n)
{
	int fd = memfd_create("readback", MFD_CLOEXEC);
	CHECK(fd >= 0);
	do_get(c, buffer, fd);
	void *p = fd_slurp(fd, n);
	close(fd);
	return p;
}

TEST(region_put_and_get_are_bit_exact_at_odd_ranges)
{
	struct daemon_proc d;
	struct gpuq_region r;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, 4 * MIB);
	make_region(c, "in", 4 * MIB, &r);
	host_fill_random(r.ptr, r.bytes, GPUQ_DTYPE_BYTES, 7);
	do_alloc(c, "b", 0, 3 * MIB);
	do_fill_random(c, "b", 9);
	/* put region[4097 : +1000003] -> b[12345 :], the region's range says how much */
	expect_xfer(c, true, "in[4097:1004100]", "b[12345:]", 1000003);
	size_t n;
	unsigned char *back = buffer_bytes(c, "b", &n);
	CHECK_EQ(n, 3 * MIB);
	CHECK(memcmp(back + 12345, (char *)r.ptr + 4097, 1000003) == 0);
	/* get b[7:1234574] -> region[1:], then a whole-buffer put back from there */
	memset(r.ptr, 0xa5, r.bytes);
	expect_xfer(c, false, "in[1:]", "b[7:1234574]", 1234567);
	CHECK(memcmp((char *)r.ptr + 1, back + 7, 1234567) == 0);
	CHECK(((unsigned char *)r.ptr)[0] == 0xa5 && ((unsigned char *)r.ptr)[1234568] == 0xa5);
	free(back);
	/* the whole region into a buffer of its size, and the device's checksum of it */
	do_alloc(c, "w", 0, 4 * MIB);
	expect_xfer(c, true, "in", "w", 4 * MIB);
	CHECK_EQ(do_checksum(c, "w"), host_checksum(r.ptr, r.bytes));
	struct gpuq_error err;
	gpuq_region_unmap(&r);
	CHECKF(gpuq_region_free(c, "in", &err) == 0, "region_free: %s", err.message);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(region_open_maps_the_same_memory_and_lists_it)
{
	struct daemon_proc d;
	struct gpuq_region r, again;
	struct gpuq_error err;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d), *c2 = client_open(&d);
	require_memlock(c, MIB);
	make_region(c, "shared", MIB, &r);
	CHECKF(gpuq_region_open(c2, "shared", &again, &err) == 0, "region_open: %s", err.message);
	strcpy(r.ptr, "written by the first process");
	CHECK_STR(again.ptr, "written by the first process");
	struct mp_map req;
	gpuq_request_begin(c2, &req, "regions");
	struct gpuq_reply *rep = call(c2, &req, NULL, 0);
	expect_ok(rep, "regions");
	const msgpack_object *list = gpuq_reply_get(rep, "regions");
	CHECK(list && list->type == MSGPACK_OBJECT_ARRAY && list->via.array.size == 1);
	CHECK_EQ(reply_u64(rep, "pinned_bytes"), MIB);
	gpuq_reply_free(rep);
	gpuq_request_begin(c2, &req, "devices");
	rep = call(c2, &req, NULL, 0);
	CHECK_EQ(reply_u64(rep, "devices.0.region_bytes"), MIB);
	gpuq_reply_free(rep);
	gpuq_region_unmap(&again);
	gpuq_region_unmap(&r);
	gpuq_close(c2);
	gpuq_close(c);
	daemon_stop(&d);
}

static struct gpuq_reply *create_raw(struct gpuq_client *c, const char *name, uint64_t bytes,
				     int fd)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "region_create");
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "bytes", bytes);
	mp_put_bool(&req, "wait", true);
	if (fd >= 0)
		mp_put_u64(&req, "fds", 1);
	return call(c, &req, fd >= 0 ? &fd : NULL, fd >= 0);
}

static void expect_refused(struct gpuq_reply *r, enum gpuq_errc code, const char *contains)
{
	expect_error(r, code, contains);
	gpuq_reply_free(r);
}

TEST(region_refusals_name_the_problem)
{
	struct daemon_proc d;
	struct gpuq_region r;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, MIB);
	int loose = memfd_create("loose", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECK(loose >= 0 && ftruncate(loose, MIB) == 0);
	expect_refused(create_raw(c, "x", MIB, loose), GPUQ_E_BAD_REQUEST, "sealed against shrinking");
	CHECK(fcntl(loose, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
	expect_refused(create_raw(c, "x", 1000, loose), GPUQ_E_BAD_REQUEST, "multiple of the page size");
	expect_refused(create_raw(c, "x", 2 * MIB, loose), GPUQ_E_BAD_REQUEST, "fewer than the");
	expect_refused(create_raw(c, "x", MIB, -1), GPUQ_E_BAD_REQUEST, "exactly one descriptor");
	expect_refused(create_raw(c, ".x", MIB, loose), GPUQ_E_BAD_REQUEST,
		       "region name '.x' must not start with '.' or '-'");
	close(loose);
	make_region(c, "r", MIB, &r);
	int fd = dup(r.fd);
	expect_refused(create_raw(c, "r", MIB, fd), GPUQ_E_EXISTS, "already exists");
	close(fd);
	do_alloc(c, "b", 0, MIB);
	expect_refused(region_xfer(c, true, "nope", "b", true), GPUQ_E_NOT_FOUND, "your regions: r");
	expect_refused(region_xfer(c, true, "r[1M:1048577]", "b", true), GPUQ_E_BAD_REQUEST, "outside region");
	expect_refused(region_xfer(c, true, "r[0:100]", "b[0:99]", true), GPUQ_E_BAD_REQUEST,
		       "one length");
	expect_refused(region_xfer(c, true, "r", "b[1:]", true), GPUQ_E_BAD_REQUEST,
		       "buffer 'b@0' has room for 1048575 bytes from offset 1, but region 'r' gives "
		       "1048576");
	expect_refused(region_xfer(c, false, "r[4096:]", "b", true), GPUQ_E_BAD_REQUEST,
		       "outside region");
	expect_refused(region_xfer(c, true, "r@0", "b", true), GPUQ_E_BAD_REQUEST, "names a device");
	expect_refused(region_xfer(c, true, "-r[0:8]", "b", true), GPUQ_E_BAD_REQUEST,
		       "region name '-r' must not start");
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "b");
	mp_put_str(&req, "region", "r");
	mp_put_str(&req, "path", "staged");
	expect_refused(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "path region");
	/* nil is absent: a put whose region is nil is one without, and needs a descriptor */
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "b");
	mp_put_nil(&req, "region");
	expect_refused(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "exactly one descriptor");
	gpuq_region_unmap(&r);
	gpuq_close(c);
	daemon_stop(&d);
}

/* As uid 65534: root's region is not there to name, and naming its owner is refused. */
static void stranger_checks(const struct daemon_proc *d)
{
	struct gpuq_client *c = client_open(d);
	struct gpuq_region r;
	struct gpuq_error err;
	CHECK(gpuq_region_open(c, "mine", &r, &err) < 0 && err.code == GPUQ_E_NOT_FOUND);
	struct mp_map req;
	gpuq_request_begin(c, &req, "region_open");
	mp_put_str(&req, "name", "mine");
	mp_put_u64(&req, "owner", 0);
	expect_refused(call(c, &req, NULL, 0), GPUQ_E_PERMISSION_DENIED,
		       "only root may name another owner's regions (you are uid 65534)");
	gpuq_request_begin(c, &req, "regions");
	struct gpuq_reply *rep = call(c, &req, NULL, 0);
	CHECK_EQ(reply_path(rep, "regions")->via.array.size, 0);
	gpuq_reply_free(rep);
	gpuq_close(c);
}

TEST(region_of_another_user_is_refused)
{
	struct daemon_proc d;
	struct gpuq_region r;
	require_backend();
	if (geteuid() != 0)
		SKIP("needs root to act as another uid");
	daemon_start(&d, "--socket-group", "nogroup", NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, MIB);
	make_region(c, "mine", MIB, &r);
	chmod(d.dir, 0711);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		CHECK(setgid(65534) == 0 && setuid(65534) == 0);
		stranger_checks(&d);
		_exit(0);
	}
	int status;
	waitpid(pid, &status, 0);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the checks as uid 65534 failed");
	gpuq_region_unmap(&r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(region_over_memlock_names_the_limit)
{
	struct daemon_proc d;
	struct gpuq_region r;
	struct gpuq_error err;
	require_backend();
	if (test_backend_is_cuda()) /* the check is the main thread's, the same for both backends */
		SKIP("lowers RLIMIT_MEMLOCK, which a CUDA daemon's driver is better left without");
	struct rlimit lim = { 3 * MIB, 3 * MIB }; /* the daemon inherits it */
	CHECKF(setrlimit(RLIMIT_MEMLOCK, &lim) == 0, "setrlimit: %s", strerror(errno));
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	CHECK(gpuq_region_create(c, "big", 4 * MIB, 0, false, &r, &err) < 0);
	CHECK_EQ(err.code, GPUQ_E_OUT_OF_MEMORY);
	CHECKF(strstr(err.message, "LimitMEMLOCK=") && strstr(err.message, "RLIMIT_MEMLOCK"),
	       "message: %s", err.message);
	make_region(c, "two", 2 * MIB, &r);
	struct gpuq_region more;
	CHECK(gpuq_region_create(c, "more", 2 * MIB, 0, false, &more, &err) < 0);
	CHECKF(strstr(err.message, "to 4.0 MiB"), "the total is named: %s", err.message);
	gpuq_region_unmap(&r);
	CHECKF(gpuq_region_free(c, "two", &err) == 0, "region_free: %s", err.message);
	make_region(c, "more", 2 * MIB, &more); /* the freed bytes count no more */
	gpuq_region_unmap(&more);
	gpuq_close(c);
	daemon_stop(&d);
}

static uint64_t job_of(struct gpuq_reply *r)
{
	uint64_t id = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	return id;
}

TEST(region_free_waits_for_the_jobs_that_use_it)
{
	struct daemon_proc d;
	struct gpuq_region r;
	require_backend();
	if (test_backend_is_cuda())
		SKIP("times one slow copy with the host engines' delay");
	setenv("GPUQ_HOST_ENGINE_DELAY_US", "h2d:300000", 1);
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, MIB);
	make_region(c, "r", MIB, &r);
	host_fill_random(r.ptr, r.bytes, GPUQ_DTYPE_BYTES, 3);
	do_alloc(c, "b", 0, MIB);
	uint64_t put = job_of(region_xfer(c, true, "r", "b", false));
	struct mp_map req;
	gpuq_request_begin(c, &req, "region_free");
	mp_put_str(&req, "name", "r");
	uint64_t freeing = job_of(call(c, &req, NULL, 0));
	expect_refused(region_xfer(c, true, "r", "b", true), GPUQ_E_BUSY, "being freed");
	struct gpuq_reply *w = job_request(c, "wait", freeing, 0);
	expect_ok(w, "region_free");
	gpuq_reply_free(w);
	w = job_request(c, "wait", put, 0);
	expect_ok(w, "the put the free waited for");
	gpuq_reply_free(w);
	CHECK_EQ(do_checksum(c, "b"), host_checksum(r.ptr, r.bytes));
	gpuq_region_unmap(&r);
	gpuq_close(c);
	daemon_stop(&d);
}

static unsigned regions_listed(struct gpuq_client *c)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "regions");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	unsigned n = reply_path(r, "regions")->via.array.size;
	gpuq_reply_free(r);
	return n;
}

TEST(ephemeral_region_goes_with_its_connection)
{
	struct daemon_proc d;
	struct gpuq_region eph, kept;
	struct gpuq_error err;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *maker = client_open(&d), *other = client_open(&d);
	require_memlock(maker, 2 * MIB);
	CHECKF(gpuq_region_create(maker, "eph", MIB, 0, true, &eph, &err) == 0, "%s", err.message);
	make_region(maker, "kept", MIB, &kept);
	CHECK_EQ(regions_listed(other), 2);
	gpuq_close(maker);
	unsigned n = 2;
	for (int i = 0; i < 200 && n != 1; i++) {
		usleep(10000);
		n = regions_listed(other);
	}
	CHECK_EQ(n, 1);
	strcpy(eph.ptr, "this process's mapping outlives the region");
	gpuq_region_unmap(&eph);
	gpuq_region_unmap(&kept);
	gpuq_close(other);
	daemon_stop(&d);
}

/* devices.0's reply map, once device 0 has been reset `want` times and serves again. */
static struct gpuq_reply *device0_after_resets(struct gpuq_client *c, uint64_t want)
{
	for (int i = 0; i < 2000; i++) {
		struct mp_map req;
		gpuq_request_begin(c, &req, "devices");
		struct gpuq_reply *r = call(c, &req, NULL, 0);
		expect_ok(r, "devices");
		const msgpack_object *ok = reply_path(r, "devices.0.healthy");
		if (reply_u64(r, "devices.0.resets") >= want && ok && ok->via.boolean)
			return r;
		gpuq_reply_free(r);
		usleep(10000);
	}
	CHECKF(false, "device 0 was not reset and serving again within 20 s");
	return NULL;
}

/*
 * A reset takes the pinning of the device's regions with its context (on
 * CUDA a region no longer registered copies at pageable speed, under the
 * same path): the new context pins them again, and `devices` counts them.
 */
TEST(a_region_is_pinned_again_after_its_devices_reset)
{
	struct daemon_proc d;
	struct gpuq_region r;
	require_backend();
	if (geteuid() != 0)
		SKIP("reset_device is root's (or the admin group's)");
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, 2 * MIB);
	make_region(c, "rp", MIB, &r);
	host_fill_random(r.ptr, r.bytes, GPUQ_DTYPE_BYTES, 11);
	struct mp_map req;
	gpuq_request_begin(c, &req, "reset_device");
	mp_put_u64(&req, "device", 0);
	struct gpuq_reply *reply = call(c, &req, NULL, 0);
	expect_ok(reply, "reset_device");
	gpuq_reply_free(reply);
	reply = device0_after_resets(c, 1);
	CHECK_EQ(reply_u64(reply, "devices.0.last_reset_regions"), 1);
	CHECK_EQ(reply_u64(reply, "devices.0.last_reset_unpinned"), 0);
	gpuq_reply_free(reply);
	do_alloc(c, "afterwards", 0, MIB);
	expect_xfer(c, true, "rp", "afterwards", MIB);
	CHECK_EQ(do_checksum(c, "afterwards"), host_checksum(r.ptr, r.bytes));
	/* freed after the reset: unpinned in the new context, and gone from the list */
	struct gpuq_error err;
	gpuq_region_unmap(&r);
	CHECKF(gpuq_region_free(c, "rp", &err) == 0, "region_free: %s", err.message);
	gpuq_request_begin(c, &req, "reset_device");
	mp_put_u64(&req, "device", 0);
	expect_ok(reply = call(c, &req, NULL, 0), "reset_device");
	gpuq_reply_free(reply);
	reply = device0_after_resets(c, 2);
	CHECK_EQ(reply_u64(reply, "devices.0.last_reset_regions"), 0);
	gpuq_reply_free(reply);
	gpuq_close(c);
	daemon_stop(&d);
}
