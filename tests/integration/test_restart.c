/*
 * gpuqd re-executing itself in place (daemon/restart.c, daemon/recover.c):
 * on `restart` and SIGUSR2 the same process (same pid) serves again on the
 * same socket and the same client connections, every buffer's bytes kept
 * (the same checksums) without a copy; a job running past --restart-drain
 * fails with `restarted` and leaves the buffer it wrote `suspect` until a
 * fill; a submission during the drain gets `restarted`; a binary that
 * cannot read the record is refused and the old image serves on; another
 * binary that can (an upgrade) takes over. The checks wait for events
 * (a reply, a ping that counts the restart), never for a time.
 */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/fixture.h"

#define MIB (1024ull * 1024)

TEST(restart_keeps_buffers_connections_and_pid)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	bool ephemeral = false;
	do_alloc(c, "small", 0, 1 * MIB);
	do_alloc(c, "big", 0, 64 * MIB);
	do_fill_random(c, "small", 1);
	do_fill_random(c, "big", 2);
	uint64_t sum_small = do_checksum(c, "small"), sum_big = do_checksum(c, "big");
	uint64_t pid = 0, quota = quota_used(c, "device_memory.0");
	CHECK_EQ(quota, 65 * MIB);
	CHECK_EQ(ping_restarts(c, &pid), 0);
	struct gpuq_reply *r = restart_call(c, NULL);
	expect_ok(r, "restart");
	CHECK(reply_path(r, "restarting")->via.boolean);
	gpuq_reply_free(r);
	await_restarts(c, 1); /* on the same connection: it was handed over */
	uint64_t pid2 = 0;
	ping_restarts(c, &pid2);
	CHECK_EQ(pid2, pid);
	CHECK_EQ(quota_used(c, "device_memory.0"), quota); /* quota usage follows the buffers taken over */
	CHECK_EQ(do_checksum(c, "small"), sum_small);
	CHECK_EQ(do_checksum(c, "big"), sum_big);
	CHECK(has_buffer(c, "big", &ephemeral));
	do_alloc(c, "after", 0, 1 * MIB); /* the adopted slabs' heap still hands out memory */
	do_free(c, "small");
	do_free(c, "after");
	CHECK_EQ(do_checksum(c, "big"), sum_big);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_on_sigusr2_twice)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 4 * MIB);
	do_fill_random(c, "w", 3);
	uint64_t sum = do_checksum(c, "w");
	CHECK(kill(d.pid, SIGUSR2) == 0);
	await_restarts(c, 1);
	CHECK(kill(d.pid, SIGUSR2) == 0);
	await_restarts(c, 2);
	CHECK_EQ(do_checksum(c, "w"), sum);
	struct gpuq_client *fresh = client_open(&d); /* the listening socket was handed over too */
	CHECK_EQ(do_checksum(fresh, "w"), sum);
	gpuq_close(fresh);
	gpuq_close(c);
	daemon_stop(&d);
}

struct waited {
	struct gpuq_client *c;
	uint64_t job;
	struct gpuq_reply *r;
};

static void *wait_job(void *arg)
{
	struct waited *w = arg;
	w->r = job_request(w->c, "wait", w->job, 0);
	return NULL;
}

TEST(restart_fails_running_jobs_restarted_and_marks_their_buffers_suspect)
{
	struct daemon_proc d;
	int p[2];
	daemon_start(&d, "--restart-drain", "100", NULL);
	struct gpuq_client *c = client_open(&d), *waiter = client_open(&d);
	do_alloc(c, "w", 0, 1 * MIB);
	do_alloc(c, "other", 0, 1 * MIB);
	uint64_t job = start_stalled_put(c, "w", p);
	struct waited w = { waiter, job, NULL };
	pthread_t t;
	CHECK(pthread_create(&t, NULL, wait_job, &w) == 0);
	usleep(20000); /* the wait is registered before the restart (a late one is refused, not lost) */
	restart_ok(c);
	pthread_join(t, NULL);
	expect_error(w.r, GPUQ_E_RESTARTED, "restart");
	gpuq_reply_free(w.r);
	close(p[1]);
	await_restarts(c, 1);
	char state[32], why[300];
	buffer_state(c, "w", state, sizeof state, why, sizeof why);
	CHECK_STR(state, "suspect");
	CHECKF(strstr(why, "writing") != NULL, "suspect reason: %s", why);
	buffer_state(c, "other", state, sizeof state, NULL, 0);
	CHECK_STR(state, "ready");
	do_checksum(c, "w"); /* a suspect buffer is readable */
	do_fill_random(c, "w", 9); /* written whole: sound again */
	buffer_state(c, "w", state, sizeof state, NULL, 0);
	CHECK_STR(state, "ready");
	gpuq_close(waiter);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_refuses_jobs_during_the_drain)
{
	struct daemon_proc d;
	int p[2];
	daemon_start(&d, "--restart-drain", "60000", NULL);
	struct gpuq_client *c = client_open(&d), *other = client_open(&d);
	do_alloc(c, "w", 0, 1 * MIB);
	do_alloc(c, "x", 0, 1 * MIB);
	start_stalled_put(c, "w", p);
	restart_ok(c);
	struct mp_map req;
	gpuq_request_begin(other, &req, "fill");
	mp_put_str(&req, "buffer", "x");
	mp_put_str(&req, "pattern", "zero");
	struct gpuq_reply *r = call(other, &req, NULL, 0);
	expect_error(r, GPUQ_E_RESTARTED, "restarting");
	gpuq_reply_free(r);
	r = restart_call(other, NULL);
	expect_error(r, GPUQ_E_BUSY, "already under way");
	gpuq_reply_free(r);
	close(p[1]); /* the put ends: the drain is over and gpuqd re-executes */
	await_restarts(other, 1);
	gpuq_close(other);
	gpuq_close(c);
	daemon_stop(&d);
}

/* A shell script at dir/name: `body` after the shebang line. */
static void script(const struct daemon_proc *d, const char *name, const char *body, char *path,
		   size_t n)
{
	char text[1024];
	snprintf(path, n, "%s/%s", d->dir, name);
	snprintf(text, sizeof text, "#!/bin/sh\n%s\n", body);
	write_file(path, text);
	CHECK(chmod(path, 0755) == 0);
}

TEST(restart_refuses_a_binary_that_cannot_read_the_record)
{
	struct daemon_proc d;
	char older[256], body[512];
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 1 * MIB);
	/* An older gpuqd: its --check-record refuses a record of a newer version. */
	script(&d, "gpuqd-older", "echo 'record version 2: this gpuqd reads 1' >&2; exit 65", older,
	       sizeof older);
	struct gpuq_reply *r = restart_call(c, older);
	expect_error(r, GPUQ_E_BAD_REQUEST, "cannot take over");
	gpuq_reply_free(r);
	snprintf(body, sizeof body, "%s/nothing-here", d.dir);
	r = restart_call(c, body);
	expect_error(r, GPUQ_E_NOT_FOUND, "not an executable file");
	gpuq_reply_free(r);
	CHECK_EQ(ping_restarts(c, NULL), 0); /* the old image serves on */
	CHECK(has_buffer(c, "w", NULL));
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_into_another_binary_that_reads_the_record)
{
	struct daemon_proc d;
	char newer[256], body[PATH_MAX + 32];
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 2 * MIB);
	do_fill_random(c, "w", 5);
	uint64_t sum = do_checksum(c, "w");
	/* An upgrade: another file that runs a gpuqd able to read the record. */
	const char *build = getenv("GPUQ_BUILD") ? getenv("GPUQ_BUILD") : "build";
	char real[PATH_MAX];
	CHECK(realpath(build, real) != NULL);
	snprintf(body, sizeof body, "exec '%s/gpuqd' \"$@\"", real);
	script(&d, "gpuqd-newer", body, newer, sizeof newer);
	struct gpuq_reply *r = restart_call(c, newer);
	expect_ok(r, "restart into another binary");
	char binary[256];
	reply_str(r, "binary", binary, sizeof binary);
	CHECK_STR(binary, newer);
	gpuq_reply_free(r);
	await_restarts(c, 1);
	CHECK_EQ(do_checksum(c, "w"), sum);
	gpuq_close(c);
	daemon_stop(&d);
}

static void fault_device_1(struct gpuq_client *c, const char *name)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", name);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_DEVICE_ERROR, "simulated");
	gpuq_reply_free(r);
}

/*
 * A device whose driver gives the process no new context after a fault
 * (simulated on the host backend) has gpuqd re-execute itself, keeping
 * every buffer, the faulted device's own included (its bytes read back);
 * past --reset-limit such restarts within the window it stays unhealthy
 * for an operator, and its buffers are lost.
 */
TEST(restart_after_a_fault_that_needs_a_new_process_up_to_the_limit)
{
	struct daemon_proc d;
	if (test_backend_is_cuda())
		SKIP("a driver that refuses a new context cannot be made on purpose; the host tier "
		     "covers this, tests/gpuqd-faults' inject_fault reaches it on an H200");
	setenv("GPUQ_HOST_FAULT_DEVICE", "1", 1);
	setenv("GPUQ_HOST_FAULT_NEEDS_RESTART", "1", 1);
	daemon_start(&d, "--host-devices", "2", "--reset-limit", "1", NULL);
	unsetenv("GPUQ_HOST_FAULT_DEVICE");
	unsetenv("GPUQ_HOST_FAULT_NEEDS_RESTART");
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "kept", 0, 2 * MIB);
	do_fill_random(c, "kept", 11);
	uint64_t sum = do_checksum(c, "kept");
	do_alloc(c, "f", 1, 1 * MIB);
	int src = memfd_random(1 * MIB, 7);
	do_put(c, "f@1", src);
	fault_device_1(c, "f@1");
	await_restarts(c, 1);
	CHECK_EQ(do_checksum(c, "kept"), sum);
	/* the faulted device's own buffer came through too: its slab's descriptor outlived the context */
	int back = memfd_create("back", MFD_CLOEXEC);
	CHECK(back >= 0 && ftruncate(back, (off_t)MIB) == 0);
	CHECK_EQ(do_get(c, "f@1", back), 1 * MIB);
	size_t n1 = 0, n2 = 0;
	void *want = fd_slurp(src, &n1), *got = fd_slurp(back, &n2);
	CHECK(n1 == MIB && n2 == MIB && memcmp(want, got, MIB) == 0);
	free(want);
	free(got);
	close(src);
	close(back);
	char state[16];
	buffer_state(c, "f", state, sizeof state, NULL, 0);
	CHECK_STR(state, "ready"); /* the job that faulted only read it */
	do_alloc(c, "g", 1, 1 * MIB); /* gpu 1 serves again, in the new image */
	fault_device_1(c, "g@1"); /* the new image's first checksum there faults again */
	for (int i = 0; i < 10000 && !daemon_log_count(&d, "stays unhealthy for an operator"); i++)
		usleep(1000);
	CHECK(daemon_log_count(&d, "stays unhealthy for an operator") > 0);
	/* no restart this time: the device's buffers are lost (listed, refused, freeable) */
	struct mp_map req;
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", "f@1");
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_DEVICE_ERROR, NULL);
	gpuq_reply_free(r);
	do_free(c, "f@1");
	CHECK_EQ(ping_restarts(c, NULL), 1);
	CHECK_EQ(do_checksum(c, "kept"), sum);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A buffer in the memory pool cannot be taken over: it is listed lost, and
 * its refusal says that the restart lost it, and why (not a device reset).
 */
TEST(restart_loses_a_pool_buffer_and_says_why)
{
	struct daemon_proc d;
	daemon_start(&d, "--buffer-memory", "pool", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "p", 0, 1 * MIB);
	CHECK(kill(d.pid, SIGUSR2) == 0);
	await_restarts(c, 1);
	char state[16];
	buffer_state(c, "p", state, sizeof state, NULL, 0);
	CHECK_STR(state, "lost");
	struct mp_map req;
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", "p");
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_DEVICE_ERROR, "buffer 'p@0' was lost in the re-exec (its memory was in "
					     "the memory pool, which no restart takes over)");
	gpuq_reply_free(r);
	CHECK(kill(d.pid, SIGUSR2) == 0); /* a second re-exec keeps what the first said */
	await_restarts(c, 2);
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", "p");
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_DEVICE_ERROR, "buffer 'p@0' was lost in the re-exec (its memory was in "
					     "the memory pool, which no restart takes over)");
	gpuq_reply_free(r);
	do_free(c, "p");
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A buffer that a device reset lost stays lost through a re-exec, with its
 * cause: the reset's new slabs reuse the lost one's slab id, and the
 * record's offset in it must not make the lost buffer a view of another
 * buffer's memory.
 */
TEST(restart_keeps_a_buffer_lost_to_a_reset_lost_and_says_why)
{
	struct daemon_proc d;
	char state[16], why[128];
	if (geteuid() != 0)
		SKIP("asks for a reset, which only root and the admin group may");
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "old", 0, 4096);
	do_fill_random(c, "old", 2);
	struct mp_map req;
	struct gpuq_reply *r;
	do_reset_device(c, 0);
	buffer_state(c, "old", state, sizeof state, NULL, 0);
	for (int i = 0; i < 500 && strcmp(state, "lost") != 0; i++, usleep(10000))
		buffer_state(c, "old", state, sizeof state, NULL, 0);
	CHECK_STR(state, "lost");
	do_alloc(c, "new", 0, 4096); /* a new slab of the new context, with the lost one's id */
	do_fill_random(c, "new", 3);
	uint64_t sum = do_checksum(c, "new");
	CHECK(kill(d.pid, SIGUSR2) == 0);
	await_restarts(c, 1);
	buffer_state(c, "old", state, sizeof state, NULL, 0);
	CHECK_STR(state, "lost");
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", "old");
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, NULL, 0);
	snprintf(why, sizeof why, "buffer 'old@0' was lost when gpu 0 was reset after an "
		 "administrator's request (uid %d)", (int)geteuid());
	expect_error(r, GPUQ_E_DEVICE_ERROR, why);
	gpuq_reply_free(r);
	CHECK_EQ(do_checksum(c, "new"), sum);
	do_free(c, "old");
	do_free(c, "new");
	gpuq_close(c);
	daemon_stop(&d);
}

/* What a buffer is survives too: its dtype, count and shape. */
TEST(restart_keeps_dtype_count_and_shape)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	struct mp_array shape;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "t");
	mp_put_u64(&req, "count", 24);
	mp_put_str(&req, "dtype", "f32");
	mp_array_init(&shape);
	mp_array_u64(&shape, 2);
	mp_array_u64(&shape, 3);
	mp_array_u64(&shape, 4);
	mp_put_array(&req, "shape", &shape);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "alloc with a shape");
	gpuq_reply_free(r);
	CHECK(kill(d.pid, SIGUSR2) == 0);
	await_restarts(c, 1);
	gpuq_request_begin(c, &req, "buffers");
	r = call(c, &req, NULL, 0);
	expect_ok(r, "buffers");
	char dtype[16];
	reply_str(r, "buffers.0.dtype", dtype, sizeof dtype);
	CHECK_STR(dtype, "f32");
	CHECK_EQ(reply_u64(r, "buffers.0.count"), 24);
	CHECK_EQ(reply_path(r, "buffers.0.shape")->via.array.size, 3);
	CHECK_EQ(reply_u64(r, "buffers.0.shape.2"), 4);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

/* A binary that never answers --check-record is given up on; gpuqd serves on. */
TEST(restart_gives_up_on_a_binary_that_does_not_answer)
{
	struct daemon_proc d;
	char stuck[256];
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	script(&d, "gpuqd-stuck", "exec sleep 3600", stuck, sizeof stuck);
	struct gpuq_reply *r = restart_call(c, stuck);
	expect_error(r, GPUQ_E_TIMEOUT, "did not answer");
	gpuq_reply_free(r);
	CHECK_EQ(ping_restarts(c, NULL), 0);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A binary named in a restart runs as gpuqd with every buffer: one that
 * another user could change (its mode, its directory's) is refused, and
 * gpuqd serves on.
 */
TEST(restart_refuses_a_binary_others_could_change)
{
	struct daemon_proc d;
	char path[320], dir[300];
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 1 * MIB);
	const char *build = getenv("GPUQ_BUILD") ? getenv("GPUQ_BUILD") : "build";
	char real[PATH_MAX], body[PATH_MAX + 32];
	CHECK(realpath(build, real) != NULL);
	snprintf(body, sizeof body, "exec '%s/gpuqd' \"$@\"", real);
	script(&d, "gpuqd-writable", body, path, sizeof path);
	CHECK(chmod(path, 0757) == 0);
	struct gpuq_reply *r = restart_call(c, path);
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "with mode 757: gpuqd runs only a binary that");
	gpuq_reply_free(r);
	snprintf(dir, sizeof dir, "%s/open", d.dir);
	CHECK(mkdir(dir, 0755) == 0 && chmod(dir, 0777) == 0);
	snprintf(path, sizeof path, "%s/gpuqd", dir);
	write_file(path, "#!/bin/sh\nexit 0\n");
	CHECK(chmod(path, 0755) == 0);
	r = restart_call(c, path);
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "another user could replace it");
	gpuq_reply_free(r);
	CHECK_EQ(ping_restarts(c, NULL), 0);
	CHECK(has_buffer(c, "w", NULL));
	gpuq_close(c);
	daemon_stop(&d);
}

struct restart_as_admin {
	const struct daemon_proc *d;
	const char *binary;
};

static void admin_names_a_binary(void *arg)
{
	const struct restart_as_admin *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_reply *r = restart_call(c, a->binary);
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "only root may name the binary a restart runs");
	gpuq_reply_free(r);
	gpuq_close(c);
}

/* The admin group restarts gpuqd's own binary; naming another is root's. */
TEST(restart_binary_is_roots_to_name)
{
	struct daemon_proc d;
	start_with_config(&d, "[gpuqd]\nadmin-group = 4243\n", NULL);
	struct restart_as_admin a = { &d, "/bin/true" };
	gid_t admin = 4243;
	as_user(65533, &admin, 1, admin_names_a_binary, &a);
	struct gpuq_client *c = client_open(&d);
	CHECK_EQ(ping_restarts(c, NULL), 0);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * The configuration file, edited since gpuqd read it, would stop the new
 * image from starting: the restart is refused saying why, and gpuqd
 * serves on with its buffers.
 */
TEST(restart_refuses_a_configuration_the_new_image_would_refuse)
{
	struct daemon_proc d;
	start_with_config(&d, "[gpuqd]\nlog-level = info\n", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 1 * MIB);
	do_fill_random(c, "w", 3);
	uint64_t sum = do_checksum(c, "w");
	config_file("[gpuqd]\nlog-level = verbose\n");
	struct gpuq_reply *r = restart_call(c, NULL);
	expect_error(r, GPUQ_E_BAD_REQUEST, "the new image would not start");
	expect_error(r, GPUQ_E_BAD_REQUEST, "log-level"); /* the file's first error, named */
	gpuq_reply_free(r);
	CHECK_EQ(ping_restarts(c, NULL), 0);
	CHECK_EQ(do_checksum(c, "w"), sum);
	config_file("[gpuqd]\nlog-level = info\n"); /* mended: the restart goes through */
	r = restart_call(c, NULL);
	expect_ok(r, "restart once the configuration is mended");
	gpuq_reply_free(r);
	await_restarts(c, 1);
	CHECK_EQ(do_checksum(c, "w"), sum);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A reset asked for while a restart drains is refused (busy), not taken
 * and then cut short by the execve: its device's slabs would have left
 * the descriptor store while its buffers stayed listed ready.
 */
TEST(restart_drain_refuses_a_device_reset)
{
	struct daemon_proc d;
	int p[2];
	daemon_start(&d, "--restart-drain", "30000", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 1 * MIB);
	do_alloc(c, "kept", 0, 1 * MIB);
	do_fill_random(c, "kept", 4);
	uint64_t sum = do_checksum(c, "kept");
	start_stalled_put(c, "w", p); /* the drain waits for it */
	restart_ok(c);
	struct mp_map req;
	gpuq_request_begin(c, &req, "reset_device");
	mp_put_u64(&req, "device", 0);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_BUSY, "gpuqd is restarting");
	gpuq_reply_free(r);
	close(p[1]); /* the put ends: the drain, then the re-exec */
	await_restarts(c, 1);
	gpuq_request_begin(c, &req, "devices");
	r = call(c, &req, NULL, 0);
	expect_ok(r, "devices");
	CHECK_EQ(reply_u64(r, "devices.0.resets"), 0);
	gpuq_reply_free(r);
	CHECK_EQ(do_checksum(c, "kept"), sum);
	do_reset_device(c, 0); /* once it serves again, the reset is taken */
	gpuq_close(c);
	daemon_stop(&d);
}
