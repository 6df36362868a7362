/*
 * What clients hold through a re-exec (daemon/recover_regions.c): a host
 * region is listed again with its bytes, pinned on its device, and moves
 * the client's memory both ways, written after the restart; its quota
 * usage is the same. An ephemeral region stays with a connection that came
 * through and goes with one that did not (a connection with half a frame
 * read is not handed over). A lease is listed again under its id and
 * holder, still holds back the jobs it held back, sees the holder's writes
 * made after the restart, and ends when its holder exits after the restart
 * or did not come through. The checks wait for events, never for a time.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "tests/integration/lease_util.h"
#include "workers/backend/host_patterns.h"

#define MIB (1024u * 1024u)

/* A connection with half a frame sent: the restart does not hand it over (restart_conn_clean). */
static void leave_half_a_frame(struct gpuq_client *c)
{
	static const unsigned char half[2] = { 0, 0 }; /* of a 4-byte length prefix */
	raw_write(gpuq_fd(c), half, sizeof half);
}

/* The index of region name in `regions`, or -1; *r keeps the reply (the caller frees it). */
static int region_index(struct gpuq_client *c, const char *name, struct gpuq_reply **r)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "regions");
	*r = call(c, &req, NULL, 0);
	expect_ok(*r, "regions");
	const msgpack_object *list = reply_path(*r, "regions");
	for (uint32_t i = 0; i < list->via.array.size; i++) {
		char path[48], got[80];
		snprintf(path, sizeof path, "regions.%u.name", i);
		reply_str(*r, path, got, sizeof got);
		if (strcmp(got, name) == 0)
			return (int)i;
	}
	return -1;
}

static bool region_listed(struct gpuq_client *c, const char *name)
{
	struct gpuq_reply *r;
	int i = region_index(c, name, &r);
	gpuq_reply_free(r);
	return i >= 0;
}

/* Waits (up to 2 s) until region name is no longer listed. */
static bool region_goes(struct gpuq_client *c, const char *name)
{
	for (int i = 0; i < 200; i++) {
		if (!region_listed(c, name))
			return true;
		usleep(10000);
	}
	return false;
}

/* put (region -> buffer) or get (buffer -> region), waited for, which must move bytes. */
static void xfer(struct gpuq_client *c, bool put, const char *region, const char *buffer,
		 uint64_t bytes)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, put ? "put" : "get");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "region", region);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, put ? "put from a region" : "get into a region");
	CHECK_EQ(reply_u64(r, "job.result.bytes"), bytes);
	gpuq_reply_free(r);
}

TEST(restart_keeps_regions_on_their_device_with_their_quota)
{
	struct daemon_proc d;
	struct gpuq_region r;
	struct gpuq_error err;
	struct gpuq_reply *rep;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, 4 * MIB);
	int device = device_count(c) > 1 ? 1 : 0;
	CHECKF(gpuq_region_create(c, "in", 4 * MIB, device, false, &r, &err) == 0, "%s", err.message);
	do_alloc(c, "b", device, 4 * MIB);
	uint64_t pinned = quota_used(c, "host_pinned");
	CHECK_EQ(pinned, 4 * MIB);
	char path[48], state[16];
	int i = region_index(c, "in", &rep);
	snprintf(path, sizeof path, "regions.%d.age_s", i);
	double age = reply_f64(rep, path), t1 = now_s();
	gpuq_reply_free(rep);
	restart_and_await(c, 1);
	double t2 = now_s();
	i = region_index(c, "in", &rep);
	CHECK(i >= 0);
	snprintf(path, sizeof path, "regions.%d.age_s", i);
	CHECK(reply_f64(rep, path) >= age + (t2 - t1) - 1e-6); /* counted from its creation, not the restart */
	snprintf(path, sizeof path, "regions.%d.bytes", i);
	CHECK_EQ(reply_u64(rep, path), 4 * MIB);
	snprintf(path, sizeof path, "regions.%d.device", i);
	CHECK_EQ(reply_u64(rep, path), (uint64_t)device);
	snprintf(path, sizeof path, "regions.%d.state", i);
	reply_str(rep, path, state, sizeof state);
	CHECK_STR(state, "ready");
	CHECK_EQ(reply_u64(rep, "pinned_bytes"), 4 * MIB);
	gpuq_reply_free(rep);
	CHECK_EQ(quota_used(c, "host_pinned"), pinned);
	/* written through this process's mapping after the restart, seen by a job */
	host_fill_random(r.ptr, r.bytes, GPUQ_DTYPE_BYTES, 11);
	xfer(c, true, "in", "b", 4 * MIB);
	CHECK_EQ(do_checksum(c, "b"), host_checksum(r.ptr, r.bytes));
	/* and a job's bytes land in this process's memory */
	do_fill_random(c, "b", 12);
	memset(r.ptr, 0, r.bytes);
	xfer(c, false, "in", "b", 4 * MIB);
	CHECK_EQ(host_checksum(r.ptr, r.bytes), do_checksum(c, "b"));
	CHECKF(gpuq_region_free(c, "in", &err) == 0, "region_free after the restart: %s", err.message);
	CHECK(!region_listed(c, "in"));
	CHECK_EQ(quota_used(c, "host_pinned"), 0);
	gpuq_region_unmap(&r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_keeps_an_ephemeral_region_only_with_its_connection)
{
	struct daemon_proc d;
	struct gpuq_region kept, gone;
	struct gpuq_error err;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *stays = client_open(&d), *cut = client_open(&d), *other = client_open(&d);
	require_memlock(stays, 2 * MIB);
	CHECKF(gpuq_region_create(stays, "kept", MIB, 0, true, &kept, &err) == 0, "%s", err.message);
	CHECKF(gpuq_region_create(cut, "gone", MIB, 0, true, &gone, &err) == 0, "%s", err.message);
	leave_half_a_frame(cut); /* before the restart is asked, so read before the execve (turns later) */
	CHECK(region_listed(other, "gone"));
	restart_and_await(other, 1);
	CHECK(region_goes(other, "gone"));
	CHECK(region_listed(other, "kept"));
	strcpy(kept.ptr, "still the client's memory");
	gpuq_close(stays); /* the connection that came through still owns it */
	CHECK(region_goes(other, "kept"));
	CHECK_STR(kept.ptr, "still the client's memory");
	gpuq_region_unmap(&kept);
	gpuq_region_unmap(&gone);
	gpuq_close(cut);
	gpuq_close(other);
	daemon_stop(&d);
}

/* The leases listed; the first one's id, pid and mode into the pointers given. */
static unsigned leases_listed(struct gpuq_client *c, uint64_t *id, uint64_t *pid, char *mode,
			      size_t n)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "leases");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "leases");
	unsigned count = reply_path(r, "leases")->via.array.size;
	if (count > 0 && id) {
		*id = reply_u64(r, "leases.0.lease");
		*pid = reply_u64(r, "leases.0.pid");
		reply_str(r, "leases.0.mode", mode, n);
	}
	gpuq_reply_free(r);
	return count;
}

/* How long the first lease listed has been held, as gpuqd says. */
static double lease_held_s(struct gpuq_client *c)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "leases");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "leases");
	double held = reply_f64(r, "leases.0.held_s");
	gpuq_reply_free(r);
	return held;
}

TEST(restart_keeps_a_lease_what_it_holds_back_and_the_holders_writes)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	struct gpuq_error err;
	char mode[16];
	uint64_t id = 0, pid = 0;
	require_backend();
	if (test_backend_is_cuda())
		SKIP("writes through a host mapping; tests/gpu/attach_selftest attaches on CUDA");
	daemon_start(&d, NULL);
	struct gpuq_client *holder = client_open(&d), *other = client_open(&d);
	lease_alloc_shareable(holder, "s", MIB, false);
	lease_attach(holder, "s", true, &a);
	double held = lease_held_s(other), t1 = now_s();
	restart_and_await(other, 1);
	double t2 = now_s(); /* counted from the grant, not from the restart (which came after t1): */
	CHECK(lease_held_s(other) >= held + (t2 - t1) - 1e-6);
	CHECK_EQ(leases_listed(other, &id, &pid, mode, sizeof mode), 1);
	CHECK_EQ(id, a.lease);
	CHECK_EQ(pid, (uint64_t)getpid());
	CHECK_STR(mode, "read-write");
	uint64_t check = lease_submit(other, "checksum", "s"); /* reads: held back by a read-write lease */
	lease_expect_behind(other, check, a.lease);
	host_fill_pattern(a.ptr, MIB, 0x3c, 1); /* the holder's mapping, written after the restart */
	uint64_t written = host_checksum(a.ptr, MIB);
	CHECKF(gpuq_buffer_release(holder, &a, &err) == 0, "release after the restart: %s",
	       err.message);
	CHECK_EQ(lease_job_checksum(other, check), written);
	CHECK_EQ(leases_listed(other, NULL, NULL, NULL, 0), 0);
	gpuq_close(other);
	gpuq_close(holder);
	daemon_stop(&d);
}

TEST(restart_lease_ends_when_its_holder_exits_after_it)
{
	struct daemon_proc d;
	int ready[2];
	char mode[16];
	uint64_t id = 0, pid = 0, lease = 0;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	lease_alloc_shareable(c, "s", MIB, false);
	CHECK(pipe(ready) == 0);
	pid_t child = fork();
	CHECK(child >= 0);
	if (child == 0) { /* attaches, says so, and waits to be killed */
		struct gpuq_client *holder = client_open(&d);
		struct gpuq_attachment a;
		lease_attach(holder, "s", true, &a);
		CHECK(write(ready[1], &a.lease, sizeof a.lease) == sizeof a.lease);
		pause();
		_exit(0);
	}
	CHECK(read(ready[0], &lease, sizeof lease) == sizeof lease);
	restart_and_await(c, 1);
	CHECK_EQ(leases_listed(c, &id, &pid, mode, sizeof mode), 1);
	CHECK_EQ(id, lease);
	CHECK_EQ(pid, (uint64_t)child);
	uint64_t fill = lease_submit(c, "fill", "s");
	lease_expect_behind(c, fill, lease);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	lease_job_checksum(c, fill); /* its connection closed: the lease ended, the fill ran */
	CHECK_EQ(leases_listed(c, NULL, NULL, NULL, 0), 0);
	close(ready[0]);
	close(ready[1]);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_ends_the_lease_of_a_holder_that_did_not_come_through)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *holder = client_open(&d), *other = client_open(&d);
	lease_alloc_shareable(other, "s", MIB, false);
	lease_attach(holder, "s", true, &a);
	leave_half_a_frame(holder); /* not handed over: the holder is gone for the new image */
	CHECK_EQ(leases_listed(other, NULL, NULL, NULL, 0), 1);
	restart_and_await(other, 1);
	CHECK_EQ(leases_listed(other, NULL, NULL, NULL, 0), 0);
	lease_job_checksum(other, lease_submit(other, "fill", "s")); /* nothing holds it back */
	gpuq_close(other);
	gpuq_close(holder);
	daemon_stop(&d);
}
