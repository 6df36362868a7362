/*
 * Jobs and clients over time: ownership, disconnects, cancellation,
 * timeouts, full queues, bounded history and shutdown.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/integration/fixture.h"

static void expect_state(struct gpuq_client *c, uint64_t job, const char *want)
{
	struct gpuq_reply *r = job_request(c, "status", job, 0);
	expect_ok(r, "status");
	char state[16];
	reply_str(r, "job.state", state, sizeof state);
	CHECKF(strcmp(state, want) == 0, "job %llu is %s, expected %s", (unsigned long long)job,
	       state, want);
	gpuq_reply_free(r);
}

TEST(another_uid_cannot_touch_buffers_or_jobs)
{
	if (geteuid() != 0)
		SKIP("needs root to act as a second uid");
	struct daemon_proc d;
	daemon_start(&d, "--socket-group", "nogroup", NULL);
	struct gpuq_client *root = client_open(&d);
	do_alloc(root, "mine", 0, 4096);
	do_fill_random(root, "mine", 8);
	uint64_t sum = do_checksum(root, "mine");
	struct mp_map req;
	gpuq_request_begin(root, &req, "noop");
	struct gpuq_reply *r = call(root, &req, NULL, 0);
	uint64_t root_job = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	pid_t pid = fork();
	if (pid == 0) {
		CHECK(setgid(65534) == 0 && setuid(65534) == 0);
		struct gpuq_client *c = client_open(&d);
		gpuq_request_begin(c, &req, "free");
		mp_put_str(&req, "buffer", "mine");
		expect_error(call(c, &req, NULL, 0), GPUQ_E_NOT_FOUND, "mine");
		gpuq_request_begin(c, &req, "checksum");
		mp_put_str(&req, "buffer", "mine@0");
		mp_put_u64(&req, "owner", 0);
		expect_error(call(c, &req, NULL, 0), GPUQ_E_PERMISSION_DENIED, "only root");
		expect_error(job_request(c, "cancel", root_job, 0), GPUQ_E_PERMISSION_DENIED, "uid 0");
		gpuq_request_begin(c, &req, "buffers");
		r = call(c, &req, NULL, 0);
		CHECK(reply_path(r, "buffers")->via.array.size == 0);
		/* its own buffer of the same name is its own */
		do_alloc(c, "mine", 0, 64);
		_exit(0);
	}
	int status;
	waitpid(pid, &status, 0);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the second uid's checks failed");
	CHECK_EQ(do_checksum(root, "mine"), sum);
	gpuq_request_begin(root, &req, "buffers"); /* root sees both */
	r = call(root, &req, NULL, 0);
	CHECK(reply_path(r, "buffers")->via.array.size == 2);
	gpuq_reply_free(r);
	gpuq_close(root);
	daemon_stop(&d);
}

TEST(client_disconnecting_mid_job_loses_nothing)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 5);
	int p[2];
	uint64_t job = start_stalled_put(c, "w", p);
	gpuq_close(c); /* gone while its job runs */
	CHECK_EQ(write(p[1], "hello", 5), 5);
	close(p[1]);
	c = client_open(&d);
	struct gpuq_reply *r = job_request(c, "wait", job, 10000);
	expect_ok(r, "wait after reconnecting");
	CHECK_EQ(reply_u64(r, "job.result.bytes"), 5);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(cancel_queued_and_running_jobs)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL); /* one job in flight: the rest queue */
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 4096);
	int p[2];
	uint64_t running = start_stalled_put(c, "w", p);
	struct mp_map req;
	gpuq_request_begin(c, &req, "noop"); /* queued behind the stalled put */
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	uint64_t queued = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	r = job_request(c, "cancel", queued, 0);
	expect_ok(r, "cancel queued");
	gpuq_reply_free(r);
	expect_state(c, queued, "cancelled");
	r = job_request(c, "cancel", running, 0);
	expect_ok(r, "cancel running");
	gpuq_reply_free(r);
	r = job_request(c, "wait", running, 5000);
	expect_error(r, GPUQ_E_CANCELLED, "cancelled");
	gpuq_reply_free(r);
	close(p[1]);
	do_free(c, "w"); /* the buffer is released by the cancelled job */
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(wait_timeout_leaves_the_job_running)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 3);
	int p[2];
	uint64_t job = start_stalled_put(c, "w", p);
	struct gpuq_reply *r = job_request(c, "wait", job, 100);
	expect_error(r, GPUQ_E_TIMEOUT, "goes on");
	CHECK_EQ(reply_u64(r, "job.job"), job); /* the record says which job to wait for */
	gpuq_reply_free(r);
	expect_state(c, job, "running");
	CHECK_EQ(write(p[1], "abc", 3), 3);
	close(p[1]);
	r = job_request(c, "wait", job, 10000);
	expect_ok(r, "wait");
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(full_queue_answers_busy)
{
	struct daemon_proc d;
	daemon_start(&d, "--queue-depth", "2", "--max-inflight=1", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 16);
	int p[2];
	start_stalled_put(c, "w", p); /* running: the queue itself is empty */
	for (int i = 0; i < 2; i++) {
		struct mp_map req;
		gpuq_request_begin(c, &req, "noop");
		struct gpuq_reply *r = call(c, &req, NULL, 0);
		expect_ok(r, "queued noop");
		gpuq_reply_free(r);
	}
	struct mp_map req;
	gpuq_request_begin(c, &req, "noop");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_BUSY, "queue is full");
	gpuq_reply_free(r);
	if (device_count(c) > 1) { /* another device is not affected */
		gpuq_request_begin(c, &req, "noop");
		mp_put_u64(&req, "device", 1);
		mp_put_bool(&req, "wait", true);
		r = call(c, &req, NULL, 0);
		expect_ok(r, "noop on device 1");
		gpuq_reply_free(r);
	}
	close(p[1]);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(job_history_is_bounded)
{
	struct daemon_proc d;
	daemon_start(&d, "--job-history", "3", NULL);
	struct gpuq_client *c = client_open(&d);
	for (int i = 0; i < 6; i++) {
		struct mp_map req;
		gpuq_request_begin(c, &req, "noop");
		mp_put_bool(&req, "wait", true);
		gpuq_reply_free(call(c, &req, NULL, 0));
	}
	struct gpuq_reply *r = job_request(c, "status", 1, 0);
	expect_error(r, GPUQ_E_NOT_FOUND, "job 1");
	gpuq_reply_free(r);
	expect_state(c, 6, "done");
	gpuq_close(c);
	daemon_stop(&d);
}

/* The history keeps the jobs that finished last: a long job that ends after later short ones is kept. */
TEST(job_history_keeps_the_last_to_finish)
{
	struct daemon_proc d;
	daemon_start(&d, "--job-history", "3", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 16);
	int p[2];
	uint64_t put = start_stalled_put(c, "w", p);
	uint64_t first_noop = 0;
	for (int i = 0; i < 5; i++) {
		struct mp_map req;
		gpuq_request_begin(c, &req, "noop");
		mp_put_bool(&req, "wait", true);
		struct gpuq_reply *r = call(c, &req, NULL, 0);
		expect_ok(r, "noop");
		if (i == 0)
			first_noop = reply_u64(r, "job.job");
		gpuq_reply_free(r);
	}
	close(p[1]); /* the put ends, after the noops */
	gpuq_reply_free(job_request(c, "wait", put, 0));
	struct gpuq_reply *r = job_request(c, "status", put, 0);
	expect_ok(r, "status of the job that finished last");
	gpuq_reply_free(r);
	r = job_request(c, "status", first_noop + 2, 0); /* the third noop: 4th to last to finish */
	expect_error(r, GPUQ_E_NOT_FOUND, NULL);
	gpuq_reply_free(r);
	expect_state(c, first_noop + 4, "done");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(sigterm_cancels_stuck_jobs_and_exits_cleanly)
{
	struct daemon_proc d;
	daemon_start(&d, "--shutdown-timeout", "200", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 16);
	int p[2];
	uint64_t job = start_stalled_put(c, "w", p);
	struct mp_map req;
	gpuq_request_begin(c, &req, "wait");
	mp_put_u64(&req, "job", job);
	struct gpuq_error err;
	CHECK(gpuq_send(c, &req, NULL, 0, &err) == 0);
	daemon_stop(&d); /* checks exit status 0 and the socket removed */
	struct gpuq_reply *r;
	if (gpuq_recv(c, 0, &r, &err) == 0) {
		expect_error(r, GPUQ_E_CANCELLED, NULL);
		gpuq_reply_free(r);
	}
	close(p[1]);
	gpuq_close(c);
}

TEST(stale_socket_replaced_live_daemon_kept)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	/* a second daemon on the same path must refuse to start */
	char cmd[512];
	const char *build = getenv("GPUQ_BUILD") ? getenv("GPUQ_BUILD") : "build";
	snprintf(cmd, sizeof cmd, "%s/gpuqd --backend host --socket %s 2>/dev/null", build, d.sock);
	CHECK(system(cmd) != 0);
	struct gpuq_client *c = client_open(&d); /* the first still serves */
	gpuq_close(c);
	struct stat st;
	CHECK(stat(d.sock, &st) == 0 && S_ISSOCK(st.st_mode));
	CHECKF((st.st_mode & 0777) == 0660, "socket mode %o, not 0660", st.st_mode & 0777);
	kill(d.pid, SIGKILL); /* leaves a stale socket file */
	waitpid(d.pid, NULL, 0);
	CHECK(stat(d.sock, &st) == 0);
	daemon_restart(&d, NULL); /* same path: the stale file is replaced */
	c = client_open(&d);
	gpuq_close(c);
	daemon_stop(&d);
}

static struct gpuq_reply *gang_noop(struct gpuq_client *c, bool wait)
{
	struct mp_map req;
	struct mp_array devices;
	gpuq_request_begin(c, &req, "noop");
	mp_array_init(&devices);
	mp_array_u64(&devices, 0);
	mp_array_u64(&devices, 1);
	mp_put_array(&req, "devices", &devices);
	mp_put_bool(&req, "wait", wait);
	return call(c, &req, NULL, 0);
}

TEST(gang_jobs_run_on_every_device_and_cancel_whole)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL); /* one job in flight: the rest queue */
	struct gpuq_client *c = client_open(&d);
	if (device_count(c) < 2)
		SKIP("needs two devices (the host backend has them; this machine has one GPU)");
	struct gpuq_reply *r = gang_noop(c, true);
	expect_ok(r, "gang noop");
	const msgpack_object *devs = reply_path(r, "job.devices");
	CHECK(devs && devs->type == MSGPACK_OBJECT_ARRAY && devs->via.array.size == 2);
	gpuq_reply_free(r);
	/* queued behind a stalled put on device 0: the whole gang waits, then cancels whole */
	do_alloc(c, "w", 0, 16);
	int p[2];
	start_stalled_put(c, "w", p);
	r = gang_noop(c, false);
	expect_ok(r, "queued gang");
	uint64_t gang = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	usleep(50000); /* device 1's part may have run; the job is not over until part 0 is */
	expect_state(c, gang, "running");
	r = job_request(c, "cancel", gang, 0);
	expect_ok(r, "cancel gang");
	gpuq_reply_free(r);
	close(p[1]); /* the put ends; part 0 starts, sees the cancel, and the gang ends cancelled */
	r = job_request(c, "wait", gang, 5000);
	expect_error(r, GPUQ_E_CANCELLED, NULL);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}
