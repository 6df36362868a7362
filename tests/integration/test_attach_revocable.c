/*
 * libgpuq's revocable attachments (gpuq.h, gpuq_buffer_attach_revocable):
 * the attach returns with a use begun, uses between which nobody wants the
 * buffer need no request, a job that wants it waits for the use in progress
 * and then ends the lease, the next use says so, uses of several threads
 * overlap, and release sends nothing for a lease that has ended. The
 * checks wait for events (a job's state, a lease listed), never for a
 * time; only the test that writes through the mapping is the host
 * backend's.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "tests/integration/lease_util.h"
#include "workers/backend/host_patterns.h"

#define MIB (1024u * 1024u)

static void attach_revocable(struct gpuq_client *c, const char *buffer, bool rw,
			     struct gpuq_attachment *a)
{
	struct gpuq_error err;
	CHECKF(gpuq_buffer_attach_revocable(c, buffer, rw, a, &err) == 0, "revocable attach: %s",
	       err.message);
	CHECK(a->ptr != NULL && a->lease > 0 && a->revocable && a->uses == 1 && a->lock_fd >= 0);
}

static int begin_use(struct gpuq_attachment *a)
{
	struct gpuq_error err;
	int rc = gpuq_attachment_begin_use(a, &err);
	CHECKF(rc >= 0, "begin use: %s", err.message);
	return rc;
}

static void end_use(struct gpuq_attachment *a)
{
	struct gpuq_error err;
	CHECKF(gpuq_attachment_end_use(a, &err) == 0, "end use: %s", err.message);
}

static void release(struct gpuq_client *c, struct gpuq_attachment *a)
{
	struct gpuq_error err;
	CHECKF(gpuq_buffer_release(c, a, &err) == 0, "release: %s", err.message);
	CHECK_EQ(a->lock_fd, -1);
}

/* A gpuqd, a holder with a shareable buffer "s" of 1 MiB, and another client. */
struct holder {
	struct daemon_proc d;
	struct gpuq_client *holder, *other;
};

static void holder_start(struct holder *t)
{
	require_backend();
	daemon_start(&t->d, NULL);
	t->holder = client_open(&t->d);
	t->other = client_open(&t->d);
	lease_alloc_shareable(t->holder, "s", MIB, false);
}

static void holder_stop(struct holder *t)
{
	gpuq_close(t->other);
	gpuq_close(t->holder);
	daemon_stop(&t->d);
}

TEST(a_revocable_attachment_is_used_without_requests_until_a_job_wants_it)
{
	struct holder t;
	struct gpuq_attachment a;
	holder_start(&t);
	attach_revocable(t.holder, "s", true, &a);
	bool revocable = false;
	CHECK_EQ(lease_listed(t.other, &revocable), 1u);
	CHECK(revocable);
	/* The attach's own use holds a job off; its end lets the job end the lease. */
	uint64_t fill = lease_submit(t.other, "fill", "s");
	lease_expect_behind(t.other, fill, a.lease);
	end_use(&a);
	lease_expect_done(t.other, fill);
	CHECK_EQ(lease_listed(t.other, NULL), 0u);
	CHECK_EQ(begin_use(&a), 0); /* ended: attach again */
	release(t.holder, &a);      /* nothing to tell gpuqd */
	/* Uses while nobody wants the buffer: no request, the same lease. */
	attach_revocable(t.holder, "s", true, &a);
	end_use(&a);
	for (int i = 0; i < 50; i++) {
		CHECK_EQ(begin_use(&a), 1);
		end_use(&a);
	}
	CHECK_EQ(lease_listed(t.other, NULL), 1u);
	/* Between uses a job ends the lease at once. */
	lease_expect_done(t.other, lease_submit(t.other, "checksum", "s"));
	CHECK_EQ(begin_use(&a), 0);
	release(t.holder, &a);
	holder_stop(&t);
}

TEST(a_read_attachment_lets_readers_pass_and_a_release_ends_a_live_lease)
{
	struct holder t;
	struct gpuq_attachment a;
	holder_start(&t);
	do_fill_random(t.holder, "s", 3);
	uint64_t sum = do_checksum(t.holder, "s");
	attach_revocable(t.holder, "s", false, &a);
	end_use(&a);
	CHECK_EQ(lease_job_checksum(t.other, lease_submit(t.other, "checksum", "s")), sum);
	CHECK_EQ(begin_use(&a), 1); /* a reader left it alone */
	end_use(&a);
	release(t.holder, &a); /* a live lease: released, and gone from the list */
	CHECK_EQ(lease_listed(t.other, NULL), 0u);
	holder_stop(&t);
}

TEST(writes_made_during_a_use_are_what_the_next_job_reads)
{
	struct holder t;
	struct gpuq_attachment a;
	if (test_backend_is_cuda())
		SKIP("writes through a host mapping; the CUDA tier's attachments are device memory");
	holder_start(&t);
	attach_revocable(t.holder, "s", true, &a);
	host_fill_pattern(a.ptr, MIB, 0x3c, 1);
	uint64_t written = host_checksum(a.ptr, MIB);
	uint64_t check = lease_submit(t.other, "checksum", "s");
	lease_expect_behind(t.other, check, a.lease);
	end_use(&a);
	CHECK_EQ(lease_job_checksum(t.other, check), written);
	release(t.holder, &a);
	holder_stop(&t);
}

/* Whether this process holds byte 1 of lock (the use byte), as another process sees it. */
static bool use_byte_held(int lock)
{
	pid_t pid = fork();
	if (pid == 0) /* a failed check in the child exits 1 */
		_exit(lease_byte_locked_elsewhere(lock, 1) ? 0 : 2);
	int status = -1;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status));
	CHECK(WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 2);
	return WEXITSTATUS(status) == 0;
}

static void *begin_use_elsewhere(void *attachment)
{
	struct gpuq_error err;
	intptr_t rc = gpuq_attachment_begin_use(attachment, &err);
	return (void *)rc;
}

TEST(uses_of_several_threads_overlap_and_the_last_to_end_lets_a_job_in)
{
	struct holder t;
	struct gpuq_attachment a;
	holder_start(&t);
	attach_revocable(t.holder, "s", true, &a);
	pthread_t other_thread;
	void *began;
	CHECK_EQ(pthread_create(&other_thread, NULL, begin_use_elsewhere, &a), 0);
	CHECK_EQ(pthread_join(other_thread, &began), 0);
	CHECK_EQ((intptr_t)began, 1);
	CHECK_EQ(a.uses, 2u);
	uint64_t fill = lease_submit(t.other, "fill", "s");
	lease_expect_behind(t.other, fill, a.lease);
	/* One use ended, one in progress: the use byte stays taken, so gpuqd
	 * cannot end the lease. */
	end_use(&a);
	CHECK_EQ(a.uses, 1u);
	CHECK(use_byte_held(a.lock_fd));
	uint64_t check = lease_submit(t.other, "checksum", "s");
	lease_expect_behind(t.other, check, a.lease);
	CHECK_EQ(lease_listed(t.other, NULL), 1u);
	lease_expect_behind(t.other, fill, a.lease);
	end_use(&a); /* the last: gpuqd's next try ends the lease */
	CHECK_EQ(a.uses, 0u);
	lease_expect_done(t.other, fill);
	lease_expect_done(t.other, check);
	CHECK_EQ(begin_use(&a), 0);
	release(t.holder, &a);
	release(t.holder, &a); /* a second release: nothing to do */
	CHECK_EQ(begin_use(&a), 0);
	holder_stop(&t);
}

TEST(plain_attachments_are_always_usable)
{
	struct holder t;
	struct gpuq_attachment plain;
	struct gpuq_error err;
	holder_start(&t);
	lease_attach(t.holder, "s", true, &plain);
	CHECK(!plain.revocable && plain.lock_fd == -1);
	CHECK_EQ(begin_use(&plain), 1);
	CHECKF(gpuq_attachment_end_use(&plain, &err) == 0, "%s", err.message);
	CHECKF(gpuq_buffer_release(t.holder, &plain, &err) == 0, "%s", err.message);
	CHECK_EQ(lease_listed(t.holder, NULL), 0u);
	holder_stop(&t);
}
