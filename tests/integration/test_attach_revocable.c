/*
 * libgpuq's revocable attachments (gpuq.h, gpuq_buffer_attach_revocable):
 * the attach returns with a use begun, uses between which nobody wants the
 * buffer need no request, a job that wants it waits for the use in progress
 * and then ends the lease, the next use says so, and release sends nothing
 * for a lease that has ended. The checks wait for events (a job's state, a
 * lease listed), never for a time; only the test that writes through the
 * mapping is the host backend's.
 */
#include <stdio.h>
#include <string.h>
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
	CHECK(a->ptr != NULL && a->lease > 0 && a->revocable && a->in_use && a->lock_fd >= 0);
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
	CHECK(!a->in_use);
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

TEST(uses_do_not_overlap_and_plain_attachments_are_always_usable)
{
	struct holder t;
	struct gpuq_attachment a, plain;
	struct gpuq_error err;
	holder_start(&t);
	lease_alloc_shareable(t.holder, "p", MIB, false);
	attach_revocable(t.holder, "s", true, &a);
	CHECK_EQ(gpuq_attachment_begin_use(&a, &err), -1); /* the attach's use has not ended */
	CHECK_EQ(err.code, GPUQ_E_BAD_REQUEST);
	CHECK(strstr(err.message, "end it first") != NULL);
	end_use(&a);
	lease_attach(t.holder, "p", true, &plain);
	CHECK(!plain.revocable && plain.lock_fd == -1);
	CHECK_EQ(begin_use(&plain), 1);
	CHECKF(gpuq_attachment_end_use(&plain, &err) == 0, "%s", err.message);
	CHECKF(gpuq_buffer_release(t.holder, &plain, &err) == 0, "%s", err.message);
	release(t.holder, &a);
	CHECK_EQ(lease_listed(t.holder, NULL), 0u);
	holder_stop(&t);
}
