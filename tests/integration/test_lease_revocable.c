/*
 * Revocable leases (docs/protocol.md, "Revocable leases"): the holder
 * keeps its lease between uses, and gpuqd ends it as soon as a job waits
 * for it while the holder is not using the buffer (byte 1 of the lock
 * unlocked), or once the holder lets go. gpuqd holds byte 0 while the
 * lease lives, through a re-exec, and holds nothing once it is gone. This
 * process is the holder: its POSIX locks conflict with gpuqd's. The checks
 * wait for events (a job's state, a lease listed), never for a time; the
 * tests need no mapping of the buffer, so they run on CUDA as well.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "tests/integration/lease_util.h"

#define MIB (1024u * 1024u)

static bool lock_byte(int fd, off_t byte, short type)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1 };
	return fcntl(fd, F_SETLK, &fl) == 0;
}

/* A lease's lock as a client makes one: a memfd, byte 1 locked (in use) before the attach. */
static int new_lock(void)
{
	int fd = memfd_create("gpuq-test-lease-lock", MFD_CLOEXEC);
	CHECK(fd >= 0);
	CHECK(lock_byte(fd, 1, F_WRLCK));
	return fd;
}

static void use_begin(int lock)
{
	CHECK(lock_byte(lock, 1, F_WRLCK));
}

static void use_end(int lock)
{
	CHECK(lock_byte(lock, 1, F_UNLCK));
}

static void attach_request(struct gpuq_client *c, struct mp_map *req, const char *buffer, bool rw)
{
	gpuq_request_begin(c, req, "attach");
	mp_put_str(req, "buffer", buffer);
	mp_put_str(req, "mode", rw ? "read-write" : "read");
	mp_put_bool(req, "revocable", true);
	mp_put_bool(req, "wait", true);
}

/* A revocable lease's id, from its attach's reply (which says it is revocable). */
static uint64_t granted(struct gpuq_reply *r)
{
	expect_ok(r, "revocable attach");
	CHECK(reply_path(r, "job.result.revocable")->via.boolean);
	CHECK_EQ(r->nfds, 1); /* the buffer's handle */
	uint64_t lease = reply_u64(r, "job.result.lease");
	gpuq_reply_free(r);
	return lease;
}

static uint64_t attach_revocable(struct gpuq_client *c, const char *buffer, bool rw, int lock)
{
	struct mp_map req;
	attach_request(c, &req, buffer, rw);
	mp_put_u64(&req, "fds", 1);
	uint64_t lease = granted(call(c, &req, &lock, 1));
	CHECK(lease_byte_locked_elsewhere(lock, 0));
	return lease;
}

static void job_state(struct gpuq_client *c, uint64_t job, char *state, size_t size)
{
	struct gpuq_reply *r = job_request(c, "status", job, 0);
	reply_str(r, "job.state", state, size);
	gpuq_reply_free(r);
}

/* Waits (up to 2 s) for job to be done; false if it never is. */
static bool ends_done(struct gpuq_client *c, uint64_t job)
{
	char state[16] = "";
	for (int i = 0; i < 200; i++) {
		job_state(c, job, state, sizeof state);
		if (strcmp(state, "done") == 0)
			return true;
		CHECKF(strcmp(state, "queued") == 0 || strcmp(state, "running") == 0,
		       "job %llu ended %s", (unsigned long long)job, state);
		usleep(10000);
	}
	return false;
}

/*
 * A gpuqd, a holder with a revocable lease on its buffer "s" (1 MiB;
 * ephemeral or not), just granted, byte 1 still locked (the first use),
 * and another client.
 */
struct revocable {
	struct daemon_proc d;
	struct gpuq_client *holder, *other;
	int lock;
	uint64_t lease;
};

static void revocable_start(struct revocable *t, bool rw, bool ephemeral)
{
	require_backend();
	daemon_start(&t->d, NULL);
	t->holder = client_open(&t->d);
	t->other = client_open(&t->d);
	lease_alloc_shareable(t->holder, "s", MIB, ephemeral);
	t->lock = new_lock();
	t->lease = attach_revocable(t->holder, "s", rw, t->lock);
}

static void revocable_stop(struct revocable *t)
{
	close(t->lock);
	gpuq_close(t->other);
	gpuq_close(t->holder);
	daemon_stop(&t->d);
}

TEST(a_revocable_lease_not_in_use_ends_when_a_job_waits_for_it)
{
	struct revocable t;
	bool revocable = false;
	revocable_start(&t, true, false);
	CHECK_EQ(lease_listed(t.other, &revocable), 1);
	CHECK(revocable);
	use_end(t.lock); /* the first use is over */
	CHECK(ends_done(t.other, lease_submit(t.other, "fill", "s")));
	CHECK_EQ(lease_listed(t.other, NULL), 0);
	use_begin(t.lock); /* what a holder does before its next use: */
	CHECK(!lease_byte_locked_elsewhere(t.lock, 0)); /* the lease has ended */
	struct gpuq_error err;
	struct mp_map req;
	gpuq_request_begin(t.holder, &req, "release");
	mp_put_u64(&req, "lease", t.lease);
	struct gpuq_reply *r = call(t.holder, &req, NULL, 0);
	gpuq_reply_error(r, &err);
	CHECK_EQ(err.code, GPUQ_E_NOT_FOUND);
	gpuq_reply_free(r);
	revocable_stop(&t);
}

TEST(a_job_waits_while_the_holder_uses_the_buffer)
{
	struct revocable t;
	revocable_start(&t, true, false);
	uint64_t fill = lease_submit(t.other, "fill", "s");
	lease_expect_behind(t.other, fill, t.lease); /* byte 1 held since before the attach */
	CHECK_EQ(lease_listed(t.other, NULL), 1);
	use_end(t.lock);
	CHECK(ends_done(t.other, fill)); /* the timer tried again */
	CHECK(!lease_byte_locked_elsewhere(t.lock, 0));
	CHECK_EQ(lease_listed(t.other, NULL), 0);
	revocable_stop(&t);
}

TEST(a_revocable_read_lease_lets_readers_pass_and_yields_to_a_writer)
{
	struct revocable t;
	revocable_start(&t, false, false);
	use_end(t.lock);
	CHECK(ends_done(t.other, lease_submit(t.other, "checksum", "s")));
	CHECK_EQ(lease_listed(t.other, NULL), 1); /* a reader does not end it */
	CHECK(lease_byte_locked_elsewhere(t.lock, 0));
	CHECK(ends_done(t.other, lease_submit(t.other, "fill", "s")));
	CHECK_EQ(lease_listed(t.other, NULL), 0);
	revocable_stop(&t);
}

TEST(the_holders_own_job_ends_its_revocable_lease)
{
	struct revocable t;
	revocable_start(&t, true, false);
	use_end(t.lock);
	CHECK(ends_done(t.holder, lease_submit(t.holder, "fill", "s")));
	CHECK_EQ(lease_listed(t.holder, NULL), 0);
	revocable_stop(&t);
}

/*
 * A job submitted while the revocable attach waited behind another lease
 * waits for the holder's first use after the grant, then runs: the grant
 * looks at the jobs queued since.
 */
TEST(a_job_queued_behind_a_waiting_revocable_attach_runs_after_the_first_use)
{
	struct daemon_proc d;
	struct gpuq_attachment first;
	struct gpuq_error err;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *holder = client_open(&d), *waiter = client_open(&d),
			   *other = client_open(&d);
	lease_alloc_shareable(holder, "s", MIB, false);
	lease_attach(holder, "s", true, &first); /* an ordinary lease, ahead of the revocable one */
	int lock = new_lock();
	struct mp_map req;
	attach_request(waiter, &req, "s", true);
	mp_put_u64(&req, "fds", 1);
	CHECKF(gpuq_send(waiter, &req, &lock, 1, &err) == 0, "send attach: %s", err.message);
	CHECK_EQ(lease_listed(other, NULL), 2); /* held, and waiting */
	uint64_t fill = lease_submit(other, "fill", "s");
	CHECKF(gpuq_buffer_release(holder, &first, &err) == 0, "release: %s", err.message);
	struct gpuq_reply *r;
	CHECKF(gpuq_recv(waiter, 0, &r, &err) == 0, "attach reply: %s", err.message);
	uint64_t lease = granted(r);
	lease_expect_behind(other, fill, lease); /* byte 1 is still the holder's */
	use_end(lock);
	CHECK(ends_done(other, fill));
	CHECK_EQ(lease_listed(other, NULL), 0);
	close(lock);
	gpuq_close(other);
	gpuq_close(waiter);
	gpuq_close(holder);
	daemon_stop(&d);
}

/*
 * An orphaned ephemeral buffer goes once nothing holds it: another
 * client's revocable lease on it ends when its holder is not using it.
 */
TEST(an_orphaned_ephemeral_buffer_goes_once_its_revocable_lease_is_not_in_use)
{
	struct daemon_proc d;
	bool ephemeral = false;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *maker = client_open(&d), *holder = client_open(&d);
	lease_alloc_shareable(maker, "e", MIB, true);
	int lock = new_lock();
	attach_revocable(holder, "e", true, lock);
	gpuq_close(maker); /* orphans it while the holder is in its first use */
	CHECK(has_buffer(holder, "e", &ephemeral) && ephemeral);
	CHECK_EQ(lease_listed(holder, NULL), 1);
	use_end(lock);
	CHECKF(buffer_goes(holder, "e"), "the orphaned buffer stayed under an idle revocable lease");
	CHECK_EQ(lease_listed(holder, NULL), 0);
	close(lock);
	gpuq_close(holder);
	daemon_stop(&d);
}

static void expect_refused(struct gpuq_client *c, const int *fds, int nfds, const char *why)
{
	struct mp_map req;
	attach_request(c, &req, "s", true);
	mp_put_u64(&req, "fds", (uint64_t)nfds);
	struct gpuq_reply *r = call(c, &req, fds, nfds);
	expect_error(r, GPUQ_E_BAD_REQUEST, why);
	gpuq_reply_free(r);
}

TEST(revocable_attach_refusals)
{
	struct daemon_proc d;
	int pipefd[2];
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	lease_alloc_shareable(c, "s", MIB, false);
	expect_refused(c, NULL, 0, "needs its lock, a memfd");
	CHECK(pipe(pipefd) == 0);
	expect_refused(c, &pipefd[0], 1, "must be a memfd");
	int lock = memfd_create("gpuq-test-lease-lock", MFD_CLOEXEC);
	CHECK(lock >= 0 && lock_byte(lock, 0, F_WRLCK)); /* the byte that is gpuqd's */
	expect_refused(c, &lock, 1, "byte 0 of the lock is locked by another process");
	CHECK_EQ(lease_listed(c, NULL), 0);
	close(lock);
	close(pipefd[0]);
	close(pipefd[1]);
	gpuq_close(c);
	daemon_stop(&d);
}

/* Each revocable lease keeps a descriptor in gpuqd: a connection holds at most 64. */
TEST(a_connection_holds_at_most_64_revocable_leases)
{
	struct daemon_proc d;
	int locks[65];
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d), *other = client_open(&d);
	lease_alloc_shareable(c, "s", MIB, false);
	for (int i = 0; i < 64; i++) /* read leases: held side by side */
		attach_revocable(c, "s", false, locks[i] = new_lock());
	locks[64] = new_lock();
	struct mp_map req;
	attach_request(c, &req, "s", false);
	mp_put_u64(&req, "fds", 1);
	struct gpuq_reply *r = call(c, &req, &locks[64], 1);
	expect_error(r, GPUQ_E_BUSY, "64 revocable leases, the most one may hold");
	gpuq_reply_free(r);
	CHECK(!lease_byte_locked_elsewhere(locks[64], 0));
	attach_revocable(other, "s", false, locks[64]); /* another connection's count is its own */
	CHECK_EQ(lease_listed(c, NULL), 65);
	for (int i = 0; i < 65; i++)
		close(locks[i]);
	gpuq_close(other);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(a_revocable_lease_and_its_lock_come_through_a_restart)
{
	struct revocable t;
	bool revocable = false;
	revocable_start(&t, true, false);
	restart_and_await(t.other, 1);
	CHECK_EQ(lease_listed(t.other, &revocable), 1);
	CHECK(revocable);
	CHECK(lease_byte_locked_elsewhere(t.lock, 0)); /* the new image holds it */
	uint64_t fill = lease_submit(t.other, "fill", "s");
	lease_expect_behind(t.other, fill, t.lease);
	use_end(t.lock);
	CHECK(ends_done(t.other, fill));
	CHECK(!lease_byte_locked_elsewhere(t.lock, 0));
	revocable_stop(&t);
}

TEST(a_gpuqd_killed_leaves_the_lock_unlocked)
{
	struct revocable t;
	revocable_start(&t, true, true);
	CHECK(kill(t.d.pid, SIGKILL) == 0);
	CHECK(waitpid(t.d.pid, NULL, 0) == t.d.pid);
	CHECK(!lease_byte_locked_elsewhere(t.lock, 0)); /* a holder's next use finds its lease ended */
	daemon_restart(&t.d, NULL);
	revocable_stop(&t);
}
