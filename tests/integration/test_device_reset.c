/*
 * A device that faults is reset and serves again, without restarting gpuqd
 * (workers/backend/device_reset.c): jobs in flight fail, buffers there are lost (and
 * say so), new jobs succeed, other devices carry on; too many faults leave it
 * unhealthy for an operator, whose reset-device brings it back. On the cuda
 * tier the fault is a real illegal address (tests/gpuqd-faults' inject_fault);
 * where that GPU's driver gives the process no new context, gpuqd
 * re-executes itself instead and the faulted device's buffer comes through
 * intact (recovered_by_reexec).
 */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/integration/fixture.h"

static char last_health[640];

/* Device index's `resets` and health, from `devices` (the health's words in last_health). */
static uint64_t device_resets(struct gpuq_client *c, int index, bool *healthy)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "devices");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "devices");
	const msgpack_object *list = reply_path(r, "devices");
	CHECK(list && list->type == MSGPACK_OBJECT_ARRAY && (int)list->via.array.size > index);
	const msgpack_object *dev = &list->via.array.ptr[index];
	const msgpack_object *resets = msg_map_get(dev, "resets");
	const msgpack_object *ok = msg_map_get(dev, "healthy");
	CHECK(resets && resets->type == MSGPACK_OBJECT_POSITIVE_INTEGER && ok);
	uint64_t n = resets->via.u64;
	*healthy = ok->via.boolean;
	const msgpack_object *h = msg_map_get(dev, "health");
	snprintf(last_health, sizeof last_health, "%.*s", h ? (int)h->via.str.size : 0,
		 h ? h->via.str.ptr : "");
	gpuq_reply_free(r);
	return n;
}

/* wait_reset's answers besides the seconds a reset took. */
#define CANNOT_RECOVER (-1.0) /* unhealthy: the driver gives the process no new context */
#define REEXECUTED (-2.0)     /* gpuqd re-executed itself for it, and the device serves */

/*
 * Waits (up to 20 s) until device index has been reset `want` times and is
 * healthy; the seconds it took. CANNOT_RECOVER when the reset ended with
 * the device unhealthy because the driver gives the process no new context
 * after the fault (the health then says to restart gpuqd); REEXECUTED when
 * gpuqd re-executed itself `want` times instead (what it does for such a
 * driver, within --reset-limit) and the device serves again.
 */
static double wait_reset(struct gpuq_client *c, int index, uint64_t want, double since)
{
	bool healthy = false;
	uint64_t n = 0;
	for (int i = 0; i < 2000; i++) {
		n = device_resets(c, index, &healthy);
		if (n >= want && healthy)
			return now_s() - since;
		if (n >= want && strstr(last_health, "restart gpuqd"))
			return CANNOT_RECOVER;
		if (healthy && ping_restarts(c, NULL) >= want)
			return REEXECUTED;
		usleep(10000);
	}
	CHECKF(false, "device %d: %llu resets, healthy %d (%s), after 20 s", index,
	       (unsigned long long)n, healthy, last_health);
	return 0;
}

static void fill_seed(struct gpuq_client *c, const char *buffer, uint64_t seed)
{
	do_fill_random(c, buffer, seed);
}

static void inject_fault(struct gpuq_client *c, int device)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "inject_fault");
	mp_put_u64(&req, "device", (uint64_t)device);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_DEVICE_ERROR, NULL);
	gpuq_reply_free(r);
}

static void reset_device(struct gpuq_client *c, int device, enum gpuq_errc want)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "reset_device");
	mp_put_u64(&req, "device", (uint64_t)device);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	if (want == GPUQ_OK)
		expect_ok(r, "reset_device");
	else
		expect_error(r, want, NULL);
	gpuq_reply_free(r);
}

static void expect_buffer_error(struct gpuq_client *c, const char *op, const char *buffer,
				enum gpuq_errc code, const char *says)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, "buffer", buffer);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, code, says);
	gpuq_reply_free(r);
}

/*
 * Where the driver gives gpuqd no new context after a fault, the device must
 * say so and fail cleanly: unhealthy, its buffer listed as lost and refused
 * with device_error, new jobs refused with no_device, the daemon serving.
 * The recovery itself cannot be tested there: skipped, saying why.
 */
static void cannot_recover_in_process(struct daemon_proc *d, struct gpuq_client *c,
				      const char *buffer)
{
	char health[sizeof last_health];
	snprintf(health, sizeof health, "%s", last_health);
	CHECKF(strstr(health, "cudaErrorDevicesUnavailable"), "unhealthy for another reason: %s", health);
	if (buffer)
		expect_buffer_error(c, "checksum", buffer, GPUQ_E_DEVICE_ERROR, NULL);
	struct mp_map req;
	gpuq_request_begin(c, &req, "noop");
	mp_put_bool(&req, "wait", true);
	expect_error(call(c, &req, NULL, 0), GPUQ_E_NO_DEVICE, NULL);
	gpuq_request_begin(c, &req, "ping");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "ping after the device was given up");
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(d);
	SKIP("this GPU's driver gives a process no new context after a fault, so gpuqd cannot "
	     "recover it in place (checked: the device says to restart gpuqd, its buffers are "
	     "lost, jobs are refused): %s", health);
}

/*
 * Where the driver gives gpuqd no new context after a fault, gpuqd
 * re-executes itself: the client keeps its connection, the device serves
 * again, the faulted device's buffers came through intact (their slabs'
 * descriptors outlived the faulted context; the same checksums as before
 * the fault: a small one carved from a shared slab, a large one with a slab
 * of its own), and new work runs. Prints the time from the fault to that buffer
 * verified.
 */
static void recovered_by_reexec(struct daemon_proc *d, struct gpuq_client *c, const char *buffer,
				uint64_t sum, uint64_t big_sum, double fault_at)
{
	fprintf(stderr, "    device 0 came back by re-executing gpuqd (%s)\n", test_backend());
	if (buffer) {
		CHECK_EQ(do_checksum(c, buffer), sum);
		CHECK_EQ(do_checksum(c, "big"), big_sum);
		fprintf(stderr, "    fault to serving again, the faulted device's buffer verified "
			"(re-exec, %s): %.3f s\n", test_backend(), now_s() - fault_at);
	}
	do_alloc(c, "after", 0, 1 << 20);
	int fd = memfd_random(1 << 20, 9);
	CHECK_EQ(do_put(c, "after", fd), 1 << 20);
	close(fd);
	CHECK(do_checksum(c, "after") != 0);
	do_free(c, "after");
	gpuq_close(c);
	daemon_stop(d);
}

TEST(device_reset_after_a_fault_serves_again_and_reports_lost_buffers)
{
	fixture_daemon_binary = "tests/gpuqd-faults";
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int other = device_count(c) > 1 ? 1 : -1;
	do_alloc(c, "before", 0, 1 << 20);
	fill_seed(c, "before", 5);
	if (other >= 0) {
		do_alloc(c, "elsewhere", other, 4096);
		fill_seed(c, "elsewhere", 6);
	}
	uint64_t elsewhere = other >= 0 ? do_checksum(c, "elsewhere") : 0;
	uint64_t before = do_checksum(c, "before");
	do_alloc(c, "big", 0, 64 << 20);
	fill_seed(c, "big", 8);
	uint64_t big = do_checksum(c, "big");
	double t0 = now_s();
	inject_fault(c, 0);
	double took = wait_reset(c, 0, 1, t0);
	if (took == REEXECUTED) {
		recovered_by_reexec(&d, c, "before", before, big, t0);
		return;
	}
	if (took < 0)
		cannot_recover_in_process(&d, c, "before");
	fprintf(stderr, "    fault to healthy on device 0 (%s): %.3f s\n", test_backend(), took);
	CHECKF(took < 10, "the reset took %.3f s", took);
	/* the buffer is listed, lost, refused with device_error, and freeable */
	struct mp_map req;
	gpuq_request_begin(c, &req, "buffers");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	const msgpack_object *list = reply_path(r, "buffers");
	bool lost = false;
	for (uint32_t i = 0; list && i < list->via.array.size; i++) {
		const msgpack_object *name = msg_map_get(&list->via.array.ptr[i], "name");
		const msgpack_object *st = msg_map_get(&list->via.array.ptr[i], "state");
		lost = lost || (name && st && name->via.str.size == 6 &&
				memcmp(name->via.str.ptr, "before", 6) == 0 && st->via.str.size == 4 &&
				memcmp(st->via.str.ptr, "lost", 4) == 0);
	}
	gpuq_reply_free(r);
	CHECKF(lost, "buffer 'before' is not listed as lost");
	expect_buffer_error(c, "checksum", "before", GPUQ_E_DEVICE_ERROR,
			    "was lost when gpu 0 was reset after a sticky fault: ");
	do_free(c, "before");
	/* new work on the reset device: alloc, put, run, checksum, all-reduce */
	do_alloc(c, "after", 0, 1 << 20);
	int fd = memfd_random(1 << 20, 9);
	CHECK_EQ(do_put(c, "after", fd), 1 << 20);
	close(fd);
	uint64_t sum = do_checksum(c, "after");
	CHECK(sum != 0);
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "f");
	mp_put_u64(&req, "count", 1024);
	mp_put_str(&req, "dtype", "f32");
	mp_put_bool(&req, "wait", true);
	gpuq_reply_free(call(c, &req, NULL, 0));
	gpuq_request_begin(c, &req, "run");
	mp_put_str(&req, "buffer", "f");
	struct mp_array ops, op;
	mp_array_init(&ops);
	mp_array_init(&op);
	mp_array_str(&op, "add");
	mp_array_f64(&op, 1);
	mp_array_array(&ops, &op);
	mp_put_array(&req, "ops", &ops);
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "a chain on the reset device");
	gpuq_reply_free(r);
	gpuq_request_begin(c, &req, "allreduce");
	mp_put_str(&req, "buffer", "f");
	struct mp_array devices;
	mp_array_init(&devices);
	mp_array_u64(&devices, 0);
	mp_put_array(&req, "devices", &devices);
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "an all-reduce on the reset device (a fresh communicator)");
	gpuq_reply_free(r);
	if (other >= 0) /* the other device never noticed */
		CHECK_EQ(do_checksum(c, "elsewhere"), elsewhere);
	gpuq_request_begin(c, &req, "metrics");
	r = call(c, &req, NULL, 0);
	char text[65536];
	reply_str(r, "text", text, sizeof text);
	gpuq_reply_free(r);
	CHECKF(strstr(text, "gpuq_device_resets_total{gpu=\"0\"} 1\n"), "the metric counts the reset");
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A lost buffer's refusal says which reset lost it: a fault's or the one an
 * administrator asked for; a later reset leaves a buffer lost before with
 * its own cause.
 */
TEST(a_lost_buffer_says_which_reset_lost_it)
{
	fixture_daemon_binary = "tests/gpuqd-faults";
	struct daemon_proc d;
	char asked[128];
	if (geteuid() != 0)
		SKIP("asks for a reset, which only root and the admin group may");
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "faulted", 0, 4096);
	inject_fault(c, 0);
	double took = wait_reset(c, 0, 1, now_s());
	if (took == REEXECUTED) { /* the buffer came through the re-exec: not lost */
		gpuq_close(c);
		daemon_stop(&d);
		SKIP("device 0 came back by re-executing gpuqd, which keeps its buffers");
	}
	if (took < 0)
		cannot_recover_in_process(&d, c, "faulted");
	do_alloc(c, "asked", 0, 4096);
	reset_device(c, 0, GPUQ_OK);
	wait_reset(c, 0, 2, now_s());
	expect_buffer_error(c, "checksum", "faulted", GPUQ_E_DEVICE_ERROR,
			    "was lost when gpu 0 was reset after a sticky fault: ");
	snprintf(asked, sizeof asked,
		 "buffer 'asked@0' was lost when gpu 0 was reset after an administrator's request "
		 "(uid %d); free it", (int)geteuid());
	expect_buffer_error(c, "checksum", "asked", GPUQ_E_DEVICE_ERROR, asked);
	do_free(c, "faulted");
	do_free(c, "asked");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(device_past_its_reset_limit_stays_unhealthy_until_an_operator_resets_it)
{
	fixture_daemon_binary = "tests/gpuqd-faults";
	struct daemon_proc d;
	daemon_start(&d, "--reset-limit", "1", "--reset-window", "600", NULL);
	struct gpuq_client *c = client_open(&d);
	inject_fault(c, 0);
	double took = wait_reset(c, 0, 1, now_s());
	if (took == REEXECUTED) {
		/* the second fault within the window: no second re-exec, left for an operator */
		inject_fault(c, 0);
		bool healthy = true;
		for (int i = 0; i < 200 && healthy; i++, usleep(10000))
			device_resets(c, 0, &healthy);
		CHECK(!healthy);
		CHECK_EQ(ping_restarts(c, NULL), 1);
		struct mp_map req;
		gpuq_request_begin(c, &req, "noop");
		mp_put_bool(&req, "wait", true);
		expect_error(call(c, &req, NULL, 0), GPUQ_E_NO_DEVICE, NULL);
		gpuq_close(c);
		daemon_stop(&d);
		return;
	}
	if (took < 0)
		cannot_recover_in_process(&d, c, NULL);
	inject_fault(c, 0); /* the second within the window: left for an operator */
	bool healthy = true;
	for (int i = 0; i < 200 && healthy; i++, usleep(10000))
		device_resets(c, 0, &healthy);
	CHECK(!healthy);
	struct mp_map req;
	gpuq_request_begin(c, &req, "noop");
	mp_put_bool(&req, "wait", true);
	expect_error(call(c, &req, NULL, 0), GPUQ_E_NO_DEVICE, "reset-limit");
	reset_device(c, 0, GPUQ_OK);
	wait_reset(c, 0, 2, now_s());
	do_alloc(c, "again", 0, 4096);
	gpuq_close(c);
	daemon_stop(&d);
}

static void stranger_may_not_reset(const struct daemon_proc *d)
{
	struct gpuq_client *c = client_open(d);
	reset_device(c, 0, GPUQ_E_PERMISSION_DENIED);
	gpuq_close(c);
}

TEST(reset_device_is_an_administrators_and_cancels_what_runs)
{
	struct daemon_proc d;
	daemon_start(&d, "--socket-group", "nogroup", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 64);
	int p[2];
	uint64_t put = start_stalled_put(c, "w", p);
	double t0 = now_s();
	reset_device(c, 0, GPUQ_OK);
	struct mp_map req;
	gpuq_request_begin(c, &req, "wait");
	mp_put_u64(&req, "job", put);
	mp_put_u64(&req, "timeout_ms", 10000);
	expect_error(call(c, &req, NULL, 0), GPUQ_E_CANCELLED, NULL);
	wait_reset(c, 0, 1, t0);
	char why[128]; /* not "after a fault": the refusal says which cause it was */
	snprintf(why, sizeof why, "was lost when gpu 0 was reset after an administrator's request (uid %d);",
		 (int)geteuid());
	expect_buffer_error(c, "checksum", "w", GPUQ_E_DEVICE_ERROR, why);
	reset_device(c, 99, GPUQ_E_NOT_FOUND);
	if (geteuid() == 0) {
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			CHECK(setgid(65534) == 0 && setuid(65534) == 0);
			stranger_may_not_reset(&d);
			_exit(0);
		}
		int status;
		waitpid(pid, &status, 0);
		CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "uid 65534 could reset a device");
	}
	close(p[1]);
	close(p[0]);
	gpuq_close(c);
	daemon_stop(&d);
}


/*
 * A device that did not open when gpuqd started has no worker: its jobs are
 * refused with no_device, a reset says a restart is the way back, and the
 * restart (the device's trouble gone meanwhile) opens it, keeping the other
 * device's buffers.
 */
TEST(a_device_that_never_opened_comes_back_with_a_restart)
{
	struct daemon_proc d;
	char flag[] = "/tmp/gpuq-test-fail-open-XXXXXX", env[64];
	bool healthy = true;
	if (test_backend_is_cuda())
		SKIP("a GPU that does not open cannot be made on purpose; the host tier covers this");
	int fd = mkstemp(flag);
	CHECK(fd >= 0);
	close(fd);
	snprintf(env, sizeof env, "1:%s", flag);
	setenv("GPUQ_HOST_FAIL_OPEN", env, 1);
	daemon_start(&d, "--host-devices", "2", NULL);
	unsetenv("GPUQ_HOST_FAIL_OPEN");
	struct gpuq_client *c = client_open(&d);
	device_resets(c, 1, &healthy);
	CHECK(!healthy);
	CHECKF(strstr(last_health, "simulated open failure") != NULL, "health: %s", last_health);
	do_alloc(c, "kept", 0, 4096);
	do_fill_random(c, "kept", 5);
	uint64_t sum = do_checksum(c, "kept");
	struct mp_map req;
	gpuq_request_begin(c, &req, "noop");
	mp_put_u64(&req, "device", 1);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_NO_DEVICE, "simulated open failure");
	gpuq_reply_free(r);
	if (geteuid() == 0) {
		gpuq_request_begin(c, &req, "reset_device");
		mp_put_u64(&req, "device", 1);
		r = call(c, &req, NULL, 0);
		expect_error(r, GPUQ_E_NO_DEVICE, "gpuq admin restart");
		gpuq_reply_free(r);
	}
	unlink(flag); /* the trouble is gone: the restarted gpuqd opens the device */
	restart_and_await(c, 1);
	device_resets(c, 1, &healthy);
	CHECKF(healthy, "health after the restart: %s", last_health);
	do_alloc(c, "new", 1, 4096);
	CHECK_EQ(do_checksum(c, "kept"), sum);
	gpuq_close(c);
	daemon_stop(&d);
}
