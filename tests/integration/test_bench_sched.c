/*
 * The bench_sched job, as docs/protocol.md specifies it: its result's
 * fields and how they relate, its refusals, and that it runs alone on its
 * device (after what is in flight there, before what comes after it).
 * gpuq bench sched itself is run by tests/cli.sh (host) and tests/bench.sh
 * (make gpu-check).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/fixture.h"

static struct gpuq_reply *bench_sched_call(struct gpuq_client *c, uint64_t bytes, uint64_t reps,
					   bool wait)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "bench_sched");
	mp_put_u64(&req, "bytes", bytes);
	mp_put_u64(&req, "reps", reps);
	if (wait)
		mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

static struct gpuq_reply *status_of(struct gpuq_client *c, uint64_t job)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "status");
	mp_put_u64(&req, "job", job);
	return call(c, &req, NULL, 0);
}

static struct gpuq_reply *wait_for(struct gpuq_client *c, uint64_t job)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "wait");
	mp_put_u64(&req, "job", job);
	mp_put_u64(&req, "timeout_ms", 60000);
	return call(c, &req, NULL, 0);
}

static bool close_to(double a, double b)
{
	return fabs(a - b) <= 1e-9 * (fabs(a) + fabs(b)) + 1e-12;
}

/* One part's map: seconds > 0 and gbps = factor x bytes / seconds / 1e9. */
static double check_part(const struct gpuq_reply *r, const char *part, uint64_t bytes, int factor)
{
	char path[64];
	snprintf(path, sizeof path, "job.result.%s.seconds", part);
	double s = reply_f64(r, path);
	snprintf(path, sizeof path, "job.result.%s.gbps", part);
	double gbps = reply_f64(r, path);
	CHECKF(s > 0, "%s took %g s", part, s);
	CHECKF(close_to(gbps, (double)factor * (double)bytes / s / 1e9), "%s: %g GB/s in %g s",
	       part, gbps, s);
	return s;
}

TEST(bench_sched_reports_each_part_alone_and_together)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	uint64_t bytes = test_backend_is_cuda() ? 64ull << 20 : 1ull << 20;
	uint64_t free_before = device_mem_free(c, 0);
	struct gpuq_reply *r = bench_sched_call(c, bytes, 2, true);
	expect_ok(r, "bench_sched");
	CHECK_EQ(reply_u64(r, "job.result.device"), 0);
	CHECK_EQ(reply_u64(r, "job.result.bytes"), bytes);
	CHECK_EQ(reply_u64(r, "job.result.reps"), 2);
	double h2d = check_part(r, "h2d", bytes, 1);
	double d2h = check_part(r, "d2h", bytes, 1);
	double kernel = check_part(r, "kernel", bytes, 2); /* read and written */
	double longest = fmax(h2d, fmax(d2h, kernel));
	double together = reply_f64(r, "job.result.together_s");
	CHECK(together > 0);
	CHECKF(close_to(reply_f64(r, "job.result.serial_s"), h2d + d2h + kernel),
	       "serial_s %g is not %g + %g + %g", reply_f64(r, "job.result.serial_s"), h2d, d2h,
	       kernel);
	CHECK(close_to(reply_f64(r, "job.result.together_over_longest"), together / longest));
	gpuq_reply_free(r);
	/* Its memory is gone with it (the host arena counts exactly). */
	if (!test_backend_is_cuda())
		CHECK_EQ(device_mem_free(c, 0), free_before);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(bench_sched_refuses_what_it_cannot_measure)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	expect_error(bench_sched_call(c, 1000, 1, true), GPUQ_E_BAD_REQUEST,
		     "field 'bytes': 1000 is not a multiple of 4096 from 1 MiB to 64 GiB");
	expect_error(bench_sched_call(c, (1ull << 20) + 1, 1, true), GPUQ_E_BAD_REQUEST,
		     "field 'bytes'");
	expect_error(bench_sched_call(c, 128ull << 30, 1, true), GPUQ_E_BAD_REQUEST,
		     "field 'bytes'");
	expect_error(bench_sched_call(c, 1ull << 20, 0, true), GPUQ_E_BAD_REQUEST,
		     "field 'reps': 0 is not 1 to 20");
	expect_error(bench_sched_call(c, 1ull << 20, 21, true), GPUQ_E_BAD_REQUEST, "field 'reps'");
	struct mp_map req;
	gpuq_request_begin(c, &req, "bench_sched");
	mp_put_u64(&req, "device", 99);
	expect_error(call(c, &req, NULL, 0), GPUQ_E_NOT_FOUND, "device 99 does not exist");
	gpuq_request_begin(c, &req, "bench_sched");
	mp_put_str(&req, "bytes", "4G");
	expect_error(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "'bytes'");
	/* The daemon goes on. */
	struct gpuq_reply *r = bench_sched_call(c, 1ull << 20, 1, true);
	expect_ok(r, "bench_sched after the refusals");
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

static void check_waits_exclusive(struct gpuq_client *c, uint64_t job, const char *what)
{
	struct gpuq_reply *r = status_of(c, job);
	char state[16], reason[32];
	reply_str(r, "job.state", state, sizeof state);
	reply_str(r, "job.waiting_reason", reason, sizeof reason);
	CHECKF(strcmp(state, "queued") == 0 && strcmp(reason, "exclusive") == 0,
	       "%s is %s (waiting: '%s'), not queued behind the benchmark's exclusive run", what,
	       state, reason);
	gpuq_reply_free(r);
}

TEST(bench_sched_runs_alone_on_its_device)
{
	/* Slow copies on the host backend, so the benchmark is still running when looked at. */
	if (!test_backend_is_cuda())
		setenv("GPUQ_HOST_ENGINE_DELAY_US", "h2d:50000", 1);
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 16);
	do_alloc(c, "other", 0, 4096);
	int p[2];
	uint64_t put = start_stalled_put(c, "w", p);
	/* Submitted while a job is in flight: it waits for it. */
	struct gpuq_reply *r = bench_sched_call(c, 1ull << 20, 2, false);
	expect_ok(r, "bench_sched, detached");
	uint64_t bench = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	check_waits_exclusive(c, bench, "the benchmark");
	close(p[1]);
	gpuq_reply_free(wait_for(c, put)); /* ends one way or another once its pipe closes */
	close(p[0]);
	/* While it runs, a job on another buffer waits for it. */
	if (!test_backend_is_cuda()) {
		char state[16] = "queued";
		for (int i = 0; i < 2000 && strcmp(state, "queued") == 0; i++) {
			r = status_of(c, bench);
			reply_str(r, "job.state", state, sizeof state);
			gpuq_reply_free(r);
			if (strcmp(state, "queued") == 0)
				usleep(1000);
		}
		CHECK_STR(state, "running");
		struct mp_map req;
		gpuq_request_begin(c, &req, "checksum");
		mp_put_str(&req, "buffer", "other");
		r = call(c, &req, NULL, 0);
		expect_ok(r, "checksum, detached");
		uint64_t after = reply_u64(r, "job.job");
		gpuq_reply_free(r);
		check_waits_exclusive(c, after, "a checksum sent while it runs");
		r = wait_for(c, after);
		expect_ok(r, "the checksum after the benchmark");
		gpuq_reply_free(r);
	}
	r = wait_for(c, bench);
	expect_ok(r, "the benchmark");
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}
