/*
 * Unit tests for workers/copy/peer_sync.c: the waits between a gang's parts end
 * when what they wait for comes, and otherwise on every way out the header
 * promises (cancel, another part's failure, a part that ended or left, the
 * timeout), and the barrier lets everyone through together.
 */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"
#include "workers/clock.h"
#include "workers/copy/peer_sync.h"

struct gang {
	struct work works[2];
	struct work *parts[2];
	struct peer_sync sync;
	bool flag;
};

static void gang_init(struct gang *g, unsigned timeout_ms)
{
	memset(g, 0, sizeof *g);
	for (int i = 0; i < 2; i++) {
		g->works[i].device = i;
		atomic_store(&g->works[i].phase, WORK_RUNNING);
		g->parts[i] = &g->works[i];
	}
	CHECK(peer_sync_init(&g->sync, g->parts, 2, timeout_ms) == 0);
}

static bool flag_set(void *arg)
{
	return ((struct gang *)arg)->flag;
}

/* Part 0 waits for the flag; returns the wait's result and its error. */
static int wait_flag(struct gang *g, bool cleanup, struct gpuq_error *err)
{
	peer_sync_lock(&g->sync);
	int rc = cleanup ? peer_sync_wait_cleanup(&g->sync, 0, flag_set, g, "the flag", err)
			 : peer_sync_wait(&g->sync, 0, flag_set, g, "the flag", err);
	peer_sync_unlock(&g->sync);
	return rc;
}

TEST(peer_sync_wait_returns_when_ready_and_times_out_otherwise)
{
	struct gang g;
	struct gpuq_error err;
	gang_init(&g, 60);
	g.flag = true;
	CHECK(wait_flag(&g, false, &err) == 0);
	g.flag = false;
	double t0 = monotonic_seconds();
	CHECK(wait_flag(&g, false, &err) < 0);
	double waited = monotonic_seconds() - t0;
	CHECK_EQ(err.code, GPUQ_E_TIMEOUT);
	CHECKF(strstr(err.message, "gpu 0 waited 60 ms for the flag"), "%s", err.message);
	CHECKF(waited >= 0.055 && waited < 2.0, "waited %.3f s for a 60 ms timeout", waited);
	peer_sync_destroy(&g.sync);
}

TEST(peer_sync_wait_ends_on_cancel_failure_and_an_ended_part)
{
	struct gang g;
	struct gpuq_error err;
	gang_init(&g, 10000);
	atomic_store(&g.works[0].cancel, true);
	CHECK(wait_flag(&g, false, &err) < 0);
	CHECK_EQ(err.code, GPUQ_E_CANCELLED);
	CHECKF(strstr(err.message, "job cancelled while waiting for the flag"), "%s", err.message);
	atomic_store(&g.works[0].cancel, false);

	peer_sync_fail(&g.sync, 1);
	CHECK(wait_flag(&g, false, &err) < 0);
	CHECK_EQ(err.code, GPUQ_E_CANCELLED);
	CHECKF(strstr(err.message, "gpu 1's part of this job failed"), "%s", err.message);
	CHECK(peer_sync_check(&g.sync, 0, &err) < 0);
	peer_sync_destroy(&g.sync);

	gang_init(&g, 10000);
	gpuq_fail(&g.works[1].error, GPUQ_E_NO_DEVICE, "device 1 is unhealthy");
	atomic_store(&g.works[1].phase, WORK_FINISHED);
	CHECK(wait_flag(&g, false, &err) < 0);
	CHECK_EQ(err.code, GPUQ_E_CANCELLED);
	CHECKF(strstr(err.message, "ended before gpu 0 got the flag (it said: device 1 is unhealthy)"),
	       "%s", err.message);
	CHECK(wait_flag(&g, true, &err) < 0); /* a cleanup wait ends too: nobody is left */
	peer_sync_destroy(&g.sync);
}

TEST(peer_sync_cleanup_wait_outlasts_cancel_until_the_other_part_leaves)
{
	struct gang g;
	struct gpuq_error err;
	gang_init(&g, 100);
	atomic_store(&g.works[0].cancel, true);
	peer_sync_fail(&g.sync, 0);
	double t0 = monotonic_seconds();
	CHECK(wait_flag(&g, true, &err) < 0); /* cancel and abort do not end it: the timeout does */
	CHECK_EQ(err.code, GPUQ_E_TIMEOUT);
	CHECK(monotonic_seconds() - t0 >= 0.09);
	peer_sync_leave(&g.sync, 1);
	CHECK(wait_flag(&g, true, &err) < 0);
	CHECK_EQ(err.code, GPUQ_E_CANCELLED);
	peer_sync_destroy(&g.sync);
}

struct barrier_arg {
	struct gang *g;
	int self;
	int rc;
	int passes;
};

static void *barrier_thread(void *p)
{
	struct barrier_arg *a = p;
	struct gpuq_error err;
	for (int i = 0; i < 100 && a->rc == 0; i++) {
		a->rc = peer_sync_barrier(&a->g->sync, a->self, &err);
		a->passes += a->rc == 0;
	}
	return NULL;
}

TEST(peer_sync_barrier_is_reusable)
{
	struct gang g;
	gang_init(&g, 10000);
	struct barrier_arg a[2] = { { &g, 0, 0, 0 }, { &g, 1, 0, 0 } };
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&t[i], NULL, barrier_thread, &a[i]) == 0);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	CHECK_EQ(a[0].passes, 100);
	CHECK_EQ(a[1].passes, 100);
	peer_sync_destroy(&g.sync);
}
