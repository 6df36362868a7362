/*
 * Shareable buffers and leases: a client attaches a buffer (on the host
 * backend its memfd-backed arena piece, mapped here), and the scheduler
 * honours the lease: daemon jobs that write wait behind any lease, jobs
 * that read pass a read lease and wait behind a read-write one, each with
 * waiting_reason `lease`; free waits too. A lease ends by release, by its
 * connection closing (a client killed while holding it) and by lease_break,
 * which tells the holder. An ephemeral buffer whose connection closes while
 * it is attached stays until its last lease ends; gpuqd stops cleanly with
 * a lease held. On the CUDA tier the same tests run through the driver's
 * import (libgpuq_cuda.c), with checks made by daemon jobs.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "tests/integration/lease_util.h"
#include "workers/backend/host_patterns.h"

#define MIB (1024u * 1024u)

static void release(struct gpuq_client *c, struct gpuq_attachment *a)
{
	struct gpuq_error err;
	CHECKF(gpuq_buffer_release(c, a, &err) == 0, "release: %s", err.message);
}

/* A request of op with one number field, which must succeed. */
static void request_ok(struct gpuq_client *c, const char *op, const char *key, uint64_t value,
		       const char *what)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_u64(&req, key, value);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, what);
	gpuq_reply_free(r);
}

/* An attachment whose lease gpuqd has ended: unmapped here, and its release finds no lease. */
static void unmap_ended(struct gpuq_client *c, struct gpuq_attachment *a)
{
	struct gpuq_error err;
	CHECK(gpuq_buffer_release(c, a, &err) < 0);
	CHECKF(err.code == GPUQ_E_NOT_FOUND, "release of an ended lease: %s", err.message);
}


static bool job_finished(struct gpuq_client *c, uint64_t job)
{
	struct gpuq_reply *r = job_request(c, "status", job, 0);
	char state[16];
	reply_str(r, "job.state", state, sizeof state);
	gpuq_reply_free(r);
	return strcmp(state, "done") == 0;
}

TEST(read_write_lease_holds_daemon_jobs_until_released)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	require_backend();
	if (test_backend_is_cuda())
		SKIP("writes through a host mapping; the GPU program tests/gpu/attach_selftest does this on CUDA");
	daemon_start(&d, NULL);
	struct gpuq_client *holder = client_open(&d), *other = client_open(&d);
	lease_alloc_shareable(holder, "s", MIB, false);
	do_fill_random(holder, "s", 5);
	uint64_t before = do_checksum(holder, "s");
	lease_attach(holder, "s", true, &a);
	CHECK_EQ(a.bytes, MIB);
	CHECK_EQ(host_checksum(a.ptr, MIB), before); /* the daemon's bytes, mapped here */
	uint64_t check = lease_submit(other, "checksum", "s"); /* reads, behind a read-write lease */
	lease_expect_behind(other, check, a.lease);
	host_fill_pattern(a.ptr, MIB, 0x5a, 1);
	uint64_t written = host_checksum(a.ptr, MIB);
	release(holder, &a);
	CHECK_EQ(lease_job_checksum(other, check), written); /* sees the client's writes */
	gpuq_close(other);
	gpuq_close(holder);
	daemon_stop(&d);
}

TEST(read_leases_let_readers_pass_and_hold_writers)
{
	struct daemon_proc d;
	struct gpuq_attachment r1, r2;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c1 = client_open(&d), *c2 = client_open(&d), *other = client_open(&d);
	lease_alloc_shareable(c1, "s", MIB, false);
	do_fill_random(c1, "s", 6);
	uint64_t sum = do_checksum(c1, "s");
	lease_attach(c1, "s", false, &r1);
	lease_attach(c2, "s", false, &r2); /* a second reader while the first holds its lease */
	CHECK(!r1.read_write && !r2.read_write);
	CHECK_EQ(do_checksum(other, "s"), sum); /* a reading job runs at once */
	uint64_t fill = lease_submit(other, "fill", "s");
	lease_expect_behind(other, fill, r1.lease);
	release(c1, &r1);
	lease_expect_behind(other, fill, r2.lease);
	struct mp_map req;
	gpuq_request_begin(other, &req, "leases");
	struct gpuq_reply *l = call(other, &req, NULL, 0);
	CHECK_EQ(reply_path(l, "leases")->via.array.size, 1);
	CHECK_EQ(reply_u64(l, "leases.0.pid"), (uint64_t)getpid());
	char mode[16];
	reply_str(l, "leases.0.mode", mode, sizeof mode);
	CHECK_STR(mode, "read");
	gpuq_reply_free(l);
	release(c2, &r2);
	lease_expect_done(other, fill);
	gpuq_close(other);
	gpuq_close(c2);
	gpuq_close(c1);
	daemon_stop(&d);
}

TEST(free_of_a_leased_buffer_waits_for_the_release)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *holder = client_open(&d), *other = client_open(&d);
	lease_alloc_shareable(holder, "s", MIB, false);
	lease_attach(holder, "s", false, &a);
	uint64_t freeing = lease_submit(other, "free", "s");
	lease_expect_behind(other, freeing, a.lease);
	CHECK(!job_finished(other, freeing));
	release(holder, &a);
	lease_expect_done(other, freeing);
	gpuq_close(other);
	gpuq_close(holder);
	daemon_stop(&d);
}

TEST(a_client_killed_holding_a_lease_loses_it)
{
	struct daemon_proc d;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	lease_alloc_shareable(c, "s", MIB, false);
	int ready[2];
	CHECK(pipe(ready) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) { /* attaches, says so, and waits to be killed */
		struct gpuq_client *child = client_open(&d);
		struct gpuq_attachment a;
		lease_attach(child, "s", true, &a);
		CHECK(write(ready[1], &a.lease, sizeof a.lease) == sizeof a.lease);
		pause();
		_exit(0);
	}
	uint64_t lease = 0;
	CHECK(read(ready[0], &lease, sizeof lease) == sizeof lease);
	uint64_t fill = lease_submit(c, "fill", "s");
	lease_expect_behind(c, fill, lease);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	lease_expect_done(c, fill);
	close(ready[0]);
	close(ready[1]);
	gpuq_close(c);
	daemon_stop(&d);
}

static void on_event(const msgpack_object *event, void *arg)
{
	char *seen = arg;
	const msgpack_object *e = msg_map_get(event, "event");
	if (e && e->type == MSGPACK_OBJECT_STR)
		snprintf(seen, 32, "%.*s", (int)e->via.str.size, e->via.str.ptr);
}

TEST(lease_break_lets_jobs_proceed_and_tells_the_holder)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	char seen[32] = "";
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *holder = client_open(&d), *admin = client_open(&d);
	gpuq_set_event_handler(holder, on_event, seen);
	lease_alloc_shareable(holder, "s", MIB, false);
	lease_attach(holder, "s", true, &a);
	uint64_t fill = lease_submit(admin, "fill", "s");
	lease_expect_behind(admin, fill, a.lease);
	request_ok(admin, "lease_break", "lease", a.lease, "lease_break by root");
	lease_expect_done(admin, fill);
	struct mp_map req;
	gpuq_request_begin(holder, &req, "ping"); /* the event comes before this reply */
	gpuq_reply_free(call(holder, &req, NULL, 0));
	CHECK_STR(seen, "lease_broken");
	unmap_ended(holder, &a);
	gpuq_close(admin);
	gpuq_close(holder);
	daemon_stop(&d);
}

TEST(attach_refusals)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	struct gpuq_error err;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "pool", 0, MIB);
	CHECK(gpuq_buffer_attach(c, "pool", true, &a, &err) < 0);
	CHECKF(err.code == GPUQ_E_BAD_REQUEST && strstr(err.message, "not shareable"), "%s", err.message);
	CHECK(gpuq_buffer_attach(c, "missing", true, &a, &err) < 0 && err.code == GPUQ_E_NOT_FOUND);
	struct mp_map req;
	gpuq_request_begin(c, &req, "release");
	mp_put_u64(&req, "lease", 999);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_NOT_FOUND, "lease 999");
	gpuq_reply_free(r);
	lease_alloc_shareable(c, "s", MIB, false);
	gpuq_request_begin(c, &req, "attach");
	mp_put_str(&req, "buffer", "s");
	mp_put_str(&req, "mode", "write");
	r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_BAD_REQUEST, "read or read-write");
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

/* The state in job's record, from `status`. */
static void job_state(struct gpuq_client *c, uint64_t job, char *state, size_t size)
{
	struct gpuq_reply *r = job_request(c, "status", job, 0);
	reply_str(r, "job.state", state, size);
	gpuq_reply_free(r);
}

/*
 * An attach whose timeout_ms runs out is given up, as protocol.md says: its
 * reply says so (not "wait again"), its lease is gone from `leases` at once
 * and its job ends cancelled, and a job queued behind it waits only for the
 * lease that is held.
 */
TEST(an_attach_that_times_out_is_given_up)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	char state[16];
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *holder = client_open(&d), *late = client_open(&d);
	lease_alloc_shareable(holder, "s", MIB, false);
	lease_attach(holder, "s", true, &a);
	struct mp_map req;
	gpuq_request_begin(late, &req, "attach");
	mp_put_str(&req, "buffer", "s");
	mp_put_u64(&req, "timeout_ms", 300);
	struct gpuq_reply *r = call(late, &req, NULL, 0);
	expect_error(r, GPUQ_E_TIMEOUT, "is given up: its lease is not granted");
	struct gpuq_error err;
	gpuq_reply_error(r, &err);
	CHECKF(!strstr(err.message, "wait again"), "the reply suggests waiting: %s", err.message);
	uint64_t attach = reply_u64(r, "job.job");
	reply_str(r, "job.state", state, sizeof state);
	CHECK_STR(state, "cancelled");
	gpuq_reply_free(r);
	CHECK_EQ(lease_listed(late, NULL), 1); /* the holder's alone */
	r = job_request(late, "wait", attach, 0);
	expect_error(r, GPUQ_E_CANCELLED, "its client stopped waiting");
	gpuq_reply_free(r);
	uint64_t fill = lease_submit(late, "fill", "s");
	lease_expect_behind(late, fill, a.lease);
	release(holder, &a);
	lease_expect_done(late, fill);
	job_state(late, attach, state, sizeof state);
	CHECK_STR(state, "cancelled");
	CHECK_EQ(lease_listed(late, NULL), 0);
	gpuq_close(late);
	gpuq_close(holder);
	daemon_stop(&d);
}

/*
 * gpuq_buffer_attach under gpuq_set_timeout: the library's own timeout used
 * to leave the attach queued in gpuqd, which granted the lease once the
 * holder let go, to a caller that had given up (and never learnt the
 * lease's id), so the buffer's writers waited as long as it stayed
 * connected. gpuqd is told the timeout, and gives the attach up.
 */
TEST(a_library_attach_that_times_out_leaves_no_lease)
{
	struct daemon_proc d;
	struct gpuq_attachment a, b;
	struct gpuq_error err;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *holder = client_open(&d), *late = client_open(&d);
	lease_alloc_shareable(holder, "s", MIB, false);
	lease_attach(holder, "s", true, &a);
	gpuq_set_timeout(late, 300);
	CHECK(gpuq_buffer_attach(late, "s", true, &b, &err) < 0);
	CHECKF(err.code == GPUQ_E_TIMEOUT && strstr(err.message, "given up"), "%s: %s",
	       gpuq_errc_name(err.code), err.message);
	gpuq_set_timeout(late, 0);
	release(holder, &a);
	uint64_t fill = lease_submit(holder, "fill", "s"); /* behind no lease */
	lease_expect_done(holder, fill);
	CHECK_EQ(lease_listed(late, NULL), 0);
	gpuq_close(late);
	gpuq_close(holder);
	daemon_stop(&d);
}

TEST(an_attached_ephemeral_buffer_stays_until_its_lease_ends)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *maker = client_open(&d), *holder = client_open(&d);
	lease_alloc_shareable(maker, "e", MIB, true);
	lease_attach(holder, "e", true, &a);
	gpuq_close(maker); /* orphans it: freed once nothing holds it, and the lease does */
	usleep(300000);
	bool ephemeral = false;
	CHECKF(has_buffer(holder, "e", &ephemeral) && ephemeral,
	       "an ephemeral buffer was freed while a client still mapped it");
	uint64_t fill = lease_submit(holder, "fill", "e");
	lease_expect_behind(holder, fill, a.lease); /* usable by name meanwhile, behind the lease */
	release(holder, &a);
	lease_expect_done(holder, fill);
	CHECKF(buffer_goes(holder, "e"), "the orphaned buffer stayed after its lease and jobs ended");
	gpuq_close(holder);
	daemon_stop(&d);
}

TEST(a_connection_that_closes_attached_to_its_own_ephemeral_buffer_frees_it)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *maker = client_open(&d), *other = client_open(&d);
	lease_alloc_shareable(maker, "e", MIB, true);
	lease_attach(maker, "e", true, &a);
	CHECK_EQ(lease_listed(other, NULL), 1);
	gpuq_close(maker); /* its lease ends, then nothing holds the orphan */
	CHECKF(buffer_goes(other, "e"), "an ephemeral buffer outlived its connection and its lease");
	CHECK_EQ(lease_listed(other, NULL), 0);
	unmap_ended(other, &a);
	gpuq_close(other);
	daemon_stop(&d);
}

TEST(gpuqd_stops_cleanly_while_a_lease_is_held)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	struct gpuq_error err;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	lease_alloc_shareable(c, "s", MIB, false);
	lease_attach(c, "s", false, &a);
	daemon_stop(&d); /* the lease ends as the connection closes, after the workers stopped */
	CHECK(gpuq_buffer_release(c, &a, &err) < 0); /* unmaps here; gpuqd is gone */
	gpuq_close(c);
}

/*
 * A holder that stops reading (shutdown SHUT_RD: sends to it fail at once)
 * holds two leases; breaking one fails the event's send, which closes its
 * connection in the middle of lease_break. Both leases end, the daemon
 * lives, and the jobs behind them run.
 */
TEST(breaking_a_lease_of_a_holder_that_stopped_reading)
{
	struct daemon_proc d;
	struct gpuq_attachment a, b;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *holder = client_open(&d), *admin = client_open(&d);
	lease_alloc_shareable(admin, "s", MIB, false);
	lease_alloc_shareable(admin, "t", MIB, false);
	lease_attach(holder, "s", true, &a);
	lease_attach(holder, "t", true, &b);
	uint64_t fill_s = lease_submit(admin, "fill", "s"), fill_t = lease_submit(admin, "fill", "t");
	lease_expect_behind(admin, fill_s, a.lease);
	lease_expect_behind(admin, fill_t, b.lease);
	CHECK(shutdown(gpuq_fd(holder), SHUT_RD) == 0);
	request_ok(admin, "lease_break", "lease", a.lease, "lease_break of a holder that does not read");
	lease_expect_done(admin, fill_s);
	lease_expect_done(admin, fill_t); /* the holder's connection closed: its other lease ended too */
	CHECK_EQ(lease_listed(admin, NULL), 0);
	CHECKF(daemon_alive(&d), "gpuqd died");
	unmap_ended(admin, &a);
	unmap_ended(admin, &b);
	gpuq_close(admin);
	gpuq_close(holder);
	daemon_stop(&d);
}

/*
 * A reset of the device ends its leases (the holder is told) after its
 * buffers are marked lost: an orphaned ephemeral buffer whose last lease
 * that was is dropped as lost, and the device serves again.
 */
TEST(a_device_reset_ends_the_lease_on_an_orphaned_ephemeral_buffer)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	char seen[32] = "";
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *maker = client_open(&d), *holder = client_open(&d);
	gpuq_set_event_handler(holder, on_event, seen);
	lease_alloc_shareable(maker, "e", MIB, true);
	lease_attach(holder, "e", true, &a);
	gpuq_close(maker);
	request_ok(holder, "reset_device", "device", 0, "reset_device");
	CHECKF(buffer_goes(holder, "e"), "the orphan stayed after the reset ended its lease");
	CHECK_STR(seen, "lease_broken");
	CHECK_EQ(lease_listed(holder, NULL), 0);
	unmap_ended(holder, &a);
	do_alloc(holder, "after", 0, MIB);
	do_fill_random(holder, "after", 5);
	int ref = memfd_random(MIB, 5);
	do_alloc(holder, "ref", 0, MIB);
	do_put(holder, "ref", ref);
	CHECK_EQ(do_checksum(holder, "after"), do_checksum(holder, "ref"));
	close(ref);
	gpuq_close(holder);
	daemon_stop(&d);
}
