/*
 * Jobs queued at a re-exec are replayed by the new image (daemon/replay.c):
 * a job queued behind a running one (a put from a pipe that never ends, on
 * the same buffer) answers its waiting client on the same connection and
 * request id once gpuqd has re-executed, while the running one fails with
 * `restarted`; a detached job keeps its id; two jobs on a buffer run in
 * their order; a job whose connection does not survive (a frame half sent)
 * fails with `restarted`, and so does the job behind it on its buffer; a
 * job the new image refuses (its buffer lost) gets the refusal; a queued
 * free goes back to a ready buffer in the old image and frees it in the
 * new one; a wait on a queued job from another connection waits on; a
 * held job can be cancelled during the drain, and a shutdown then cancels
 * the held ones; a job behind a lease (which survives) is held and
 * replayed through two restarts and runs once the lease is released. The checks wait for events (a reply, a ping that counts
 * the restart, a job seen queued), and compare bytes through checksums.
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

static void fill_request(struct gpuq_client *c, struct mp_map *req, const char *buffer,
			 uint64_t seed)
{
	gpuq_request_begin(c, req, "fill");
	mp_put_str(req, "buffer", buffer);
	mp_put_str(req, "pattern", "random");
	mp_put_u64(req, "seed", seed);
}

/* A fill submitted without waiting: its job id. */
static uint64_t fill_detached(struct gpuq_client *c, const char *buffer, uint64_t seed)
{
	struct mp_map req;
	fill_request(c, &req, buffer, seed);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "detached fill");
	uint64_t id = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	return id;
}

/* A request from its own thread, whose reply is awaited there. */
struct pending {
	struct gpuq_client *c;
	const char *buffer;
	uint64_t seed, job;
	struct gpuq_reply *r;
};

static void *fill_and_wait(void *arg)
{
	struct pending *p = arg;
	struct mp_map req;
	fill_request(p->c, &req, p->buffer, p->seed);
	mp_put_bool(&req, "wait", true);
	p->r = call(p->c, &req, NULL, 0);
	return NULL;
}

static void *wait_for_job(void *arg)
{
	struct pending *p = arg;
	p->r = job_request(p->c, "wait", p->job, 0);
	return NULL;
}

/* The newest job of op in state, in `jobs`; 0 when none. */
static uint64_t find_job(struct gpuq_client *c, const char *op, const char *state)
{
	struct mp_map req;
	uint64_t found = 0;
	gpuq_request_begin(c, &req, "jobs");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "jobs");
	const msgpack_object *list = reply_path(r, "jobs");
	for (uint32_t i = 0; i < list->via.array.size; i++) {
		char path[64], got_op[32], got_state[32];
		snprintf(path, sizeof path, "jobs.%u.op", i);
		reply_str(r, path, got_op, sizeof got_op);
		snprintf(path, sizeof path, "jobs.%u.state", i);
		reply_str(r, path, got_state, sizeof got_state);
		snprintf(path, sizeof path, "jobs.%u.job", i);
		if (strcmp(got_op, op) == 0 && strcmp(got_state, state) == 0)
			found = reply_u64(r, path);
	}
	gpuq_reply_free(r);
	return found;
}

/* Waits until a job of op is queued (a request from another thread has arrived): its id. */
static uint64_t await_queued(struct gpuq_client *c, const char *op)
{
	for (int i = 0; i < 10000; i++) {
		uint64_t id = find_job(c, op, "queued");
		if (id)
			return id;
		usleep(1000);
	}
	CHECKF(false, "no %s job was ever queued", op);
	return 0;
}

/* What a fill of seed leaves in a buffer of bytes: the checksum of a reference filled so. */
static uint64_t reference_sum(struct gpuq_client *c, uint64_t bytes, uint64_t seed)
{
	do_alloc(c, "ref", 0, bytes);
	do_fill_random(c, "ref", seed);
	uint64_t sum = do_checksum(c, "ref");
	do_free(c, "ref");
	return sum;
}

/* A job's state and error in `status` (error fields empty when it has none). */
static void job_outcome(struct gpuq_client *c, uint64_t id, char *state, size_t n, char *code,
			char *message, size_t mn)
{
	struct gpuq_reply *r = job_request(c, "status", id, 0);
	expect_ok(r, "status");
	reply_str(r, "job.state", state, n);
	code[0] = message[0] = '\0';
	if (gpuq_reply_get(r, "job")) {
		const msgpack_object *job = reply_path(r, "job");
		if (msg_map_get(job, "error")) {
			reply_str(r, "job.error.code", code, 32);
			reply_str(r, "job.error.message", message, mn);
		}
	}
	gpuq_reply_free(r);
}

TEST(restart_replays_a_queued_job_its_client_waits_for)
{
	struct daemon_proc d;
	int p[2];
	pthread_t tput, tfill;
	daemon_start(&d, "--restart-drain", "100", NULL);
	struct gpuq_client *c = client_open(&d), *waiter = client_open(&d),
			  *filler = client_open(&d);
	uint64_t want = reference_sum(c, 1 * MIB, 7);
	do_alloc(c, "w", 0, 1 * MIB);
	uint64_t put = start_stalled_put(c, "w", p);
	struct pending pw = { .c = waiter, .job = put }, pf = { .c = filler, .buffer = "w", .seed = 7 };
	CHECK(pthread_create(&tput, NULL, wait_for_job, &pw) == 0);
	CHECK(pthread_create(&tfill, NULL, fill_and_wait, &pf) == 0);
	uint64_t fill = await_queued(c, "fill"); /* behind the put on w */
	usleep(20000); /* the put's wait is registered before the restart */
	restart_ok(c);
	pthread_join(tput, NULL);
	expect_error(pw.r, GPUQ_E_RESTARTED, "restart"); /* the running job, as before */
	gpuq_reply_free(pw.r);
	close(p[1]);
	pthread_join(tfill, NULL); /* answered by the new image on the same connection */
	expect_ok(pf.r, "the replayed fill");
	CHECK_EQ(reply_u64(pf.r, "job.job"), fill);
	char state[32];
	reply_str(pf.r, "job.state", state, sizeof state);
	CHECK_STR(state, "done");
	gpuq_reply_free(pf.r);
	await_restarts(c, 1);
	CHECK_EQ(do_checksum(c, "w"), want);
	gpuq_close(filler);
	gpuq_close(waiter);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_replays_a_detached_job_under_its_id)
{
	struct daemon_proc d;
	int p[2];
	daemon_start(&d, "--restart-drain", "100", NULL);
	struct gpuq_client *c = client_open(&d);
	uint64_t want = reference_sum(c, 1 * MIB, 8);
	do_alloc(c, "w", 0, 1 * MIB);
	start_stalled_put(c, "w", p);
	uint64_t fill = fill_detached(c, "w", 8);
	restart_and_await(c, 1);
	close(p[1]);
	struct gpuq_reply *r = job_request(c, "wait", fill, 0);
	expect_ok(r, "wait for the replayed fill");
	CHECK_EQ(reply_u64(r, "job.job"), fill);
	gpuq_reply_free(r);
	CHECK_EQ(do_checksum(c, "w"), want);
	uint64_t next = fill_detached(c, "w", 9); /* ids go on after the old ones */
	CHECK(next > fill);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_replays_queued_jobs_on_a_buffer_in_their_order)
{
	struct daemon_proc d;
	int p[2];
	daemon_start(&d, "--restart-drain", "100", NULL);
	struct gpuq_client *c = client_open(&d);
	uint64_t first = reference_sum(c, 1 * MIB, 11), last = reference_sum(c, 1 * MIB, 12);
	CHECK(first != last);
	do_alloc(c, "w", 0, 1 * MIB);
	start_stalled_put(c, "w", p);
	uint64_t a = fill_detached(c, "w", 11), b = fill_detached(c, "w", 12);
	restart_and_await(c, 1);
	close(p[1]);
	uint64_t ids[2] = { a, b };
	for (int i = 0; i < 2; i++) {
		struct gpuq_reply *r = job_request(c, "wait", ids[i], 0);
		expect_ok(r, "wait for a replayed fill");
		gpuq_reply_free(r);
	}
	CHECK_EQ(do_checksum(c, "w"), last); /* the later fill ran last */
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_fails_a_queued_job_whose_connection_does_not_survive)
{
	struct daemon_proc d;
	int p[2];
	char state[32], code[32], message[600], rcode[32];
	daemon_start(&d, "--restart-drain", "100", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 1 * MIB);
	start_stalled_put(c, "w", p);
	int raw = raw_connect(&d);
	struct mp_map req;
	msgpack_sbuffer sb;
	mp_map_init(&req);
	mp_put_u64(&req, "v", 1);
	mp_put_u64(&req, "id", 1);
	mp_put_str(&req, "op", "fill");
	mp_put_str(&req, "buffer", "w");
	mp_put_str(&req, "pattern", "zero");
	msgpack_sbuffer_init(&sb);
	mp_map_frame(&req, &sb);
	raw_write(raw, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	CHECK_EQ(raw_read_reply(raw, rcode, sizeof rcode), 0);
	uint64_t fill = find_job(c, "fill", "queued");
	CHECK(fill != 0);
	uint64_t behind = fill_detached(c, "w", 3); /* on the same buffer, from a clean connection */
	raw_write(raw, "\0\0", 2); /* half a frame header: this connection is not handed over */
	restart_and_await(c, 1);
	close(p[1]);
	job_outcome(c, fill, state, sizeof state, code, message, sizeof message);
	CHECK_STR(state, "failed");
	CHECK_STR(code, "restarted");
	CHECKF(strstr(message, "connection") != NULL, "message: %s", message);
	job_outcome(c, behind, state, sizeof state, code, message, sizeof message);
	CHECK_STR(state, "failed");
	CHECK_STR(code, "restarted");
	CHECKF(strstr(message, "behind job") != NULL, "message: %s", message);
	CHECK(raw_closed_by_peer(raw, 5000));
	close(raw);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_gives_a_replayed_job_the_new_images_refusal)
{
	struct daemon_proc d;
	int p[2];
	pthread_t t;
	char one[256], body[PATH_MAX + 64], real[PATH_MAX], state[32], code[32], message[600];
	require_backend();
	if (test_backend_is_cuda())
		SKIP("needs a second device that the new image does not have (--host-devices)");
	daemon_start(&d, "--restart-drain", "100", NULL); /* two host devices */
	struct gpuq_client *c = client_open(&d), *filler = client_open(&d);
	do_alloc(c, "x", 1, 1 * MIB);
	start_stalled_put(c, "x", p);
	struct pending pf = { .c = filler, .buffer = "x", .seed = 4 };
	CHECK(pthread_create(&t, NULL, fill_and_wait, &pf) == 0);
	await_queued(c, "fill");
	uint64_t detached = fill_detached(c, "x", 5);
	/* The new image has one device: the buffer on gpu 1 is kept aside there, not served. */
	const char *build = getenv("GPUQ_BUILD") ? getenv("GPUQ_BUILD") : "build";
	CHECK(realpath(build, real) != NULL);
	snprintf(body, sizeof body, "#!/bin/sh\nexec '%s/gpuqd' \"$@\" --host-devices 1\n", real);
	snprintf(one, sizeof one, "%s/gpuqd-one-device", d.dir);
	write_file(one, body);
	CHECK(chmod(one, 0755) == 0);
	struct gpuq_reply *r = restart_call(c, one);
	expect_ok(r, "restart into one device");
	gpuq_reply_free(r);
	pthread_join(t, NULL);
	expect_error(pf.r, GPUQ_E_NOT_FOUND, "'x' is on GPU HOST-1, which this gpuqd does not serve");
	gpuq_reply_free(pf.r);
	await_restarts(c, 1);
	close(p[1]);
	job_outcome(c, detached, state, sizeof state, code, message, sizeof message);
	CHECK_STR(state, "failed");
	CHECK_STR(code, "not_found");
	CHECKF(strstr(message, "refused it when it was replayed") && strstr(message, "does not serve"),
	       "message: %s", message);
	gpuq_close(filler);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_keeps_a_wait_on_a_queued_job_from_another_connection)
{
	struct daemon_proc d;
	int p[2];
	pthread_t t;
	daemon_start(&d, "--restart-drain", "100", NULL);
	struct gpuq_client *c = client_open(&d), *waiter = client_open(&d);
	uint64_t want = reference_sum(c, 1 * MIB, 21);
	do_alloc(c, "w", 0, 1 * MIB);
	start_stalled_put(c, "w", p);
	uint64_t fill = fill_detached(c, "w", 21);
	struct pending pw = { .c = waiter, .job = fill };
	CHECK(pthread_create(&t, NULL, wait_for_job, &pw) == 0);
	usleep(20000); /* the wait is registered before the restart */
	restart_ok(c);
	pthread_join(t, NULL); /* the new image answers it, on the same request */
	expect_ok(pw.r, "a wait carried over");
	CHECK_EQ(reply_u64(pw.r, "job.job"), fill);
	gpuq_reply_free(pw.r);
	close(p[1]);
	CHECK_EQ(do_checksum(c, "w"), want);
	gpuq_close(waiter);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_lets_a_held_job_be_cancelled_during_the_drain)
{
	struct daemon_proc d;
	int p[2];
	char state[32], code[32], message[600];
	daemon_start(&d, "--restart-drain", "60000", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 1 * MIB);
	start_stalled_put(c, "w", p);
	uint64_t fill = fill_detached(c, "w", 2);
	struct gpuq_reply *r = restart_call(c, NULL);
	expect_ok(r, "restart");
	CHECK_EQ(reply_u64(r, "jobs_active"), 1); /* the put the drain waits for; not the held fill */
	gpuq_reply_free(r);
	job_outcome(c, fill, state, sizeof state, code, message, sizeof message);
	CHECK_STR(state, "queued"); /* held for the new image, in no queue */
	r = job_request(c, "cancel", fill, 0);
	expect_ok(r, "cancel a held job");
	gpuq_reply_free(r);
	job_outcome(c, fill, state, sizeof state, code, message, sizeof message);
	CHECK_STR(state, "cancelled");
	close(p[1]); /* the put ends: the drain is over and gpuqd re-executes */
	await_restarts(c, 1);
	r = job_request(c, "status", fill, 0);
	expect_error(r, GPUQ_E_NOT_FOUND, "not found"); /* ended in the old image: not replayed */
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(restart_held_jobs_are_cancelled_by_a_shutdown_during_the_drain)
{
	struct daemon_proc d;
	int p[2];
	pthread_t t;
	daemon_start(&d, "--restart-drain", "60000", "--shutdown-timeout", "100", NULL);
	struct gpuq_client *c = client_open(&d), *waiter = client_open(&d);
	do_alloc(c, "w", 0, 1 * MIB);
	start_stalled_put(c, "w", p);
	uint64_t fill = fill_detached(c, "w", 2);
	restart_ok(c);
	struct pending pw = { .c = waiter, .job = fill };
	CHECK(pthread_create(&t, NULL, wait_for_job, &pw) == 0);
	usleep(20000); /* the wait is registered before the shutdown */
	CHECK(kill(d.pid, SIGTERM) == 0);
	pthread_join(t, NULL);
	expect_error(pw.r, GPUQ_E_CANCELLED, "shutting down");
	gpuq_reply_free(pw.r);
	close(p[1]);
	gpuq_close(waiter);
	gpuq_close(c);
	daemon_stop(&d); /* it exits 0: nothing held is left waiting */
}

TEST(restart_replays_a_queued_free)
{
	struct daemon_proc d;
	int p[2];
	daemon_start(&d, "--restart-drain", "100", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 1 * MIB);
	start_stalled_put(c, "w", p);
	struct mp_map req;
	gpuq_request_begin(c, &req, "free");
	mp_put_str(&req, "buffer", "w");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "a free behind the put");
	uint64_t freed = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	restart_and_await(c, 1);
	close(p[1]);
	r = job_request(c, "wait", freed, 0);
	expect_ok(r, "wait for the replayed free");
	gpuq_reply_free(r);
	CHECK(!has_buffer(c, "w", NULL)); /* the old image gave the buffer back; the new one freed it */
	do_alloc(c, "w", 0, 1 * MIB); /* the name is free again */
	gpuq_close(c);
	daemon_stop(&d);
}

/* Waits (up to 10 s) until job waits behind a lease. */
static void await_behind_lease(struct gpuq_client *c, uint64_t job)
{
	for (int i = 0; i < 10000; i++) {
		char reason[32] = "";
		struct gpuq_reply *r = job_request(c, "status", job, 0);
		expect_ok(r, "status");
		const msgpack_object *o = reply_path(r, "job.waiting_reason");
		if (o && o->type == MSGPACK_OBJECT_STR)
			snprintf(reason, sizeof reason, "%.*s", (int)o->via.str.size, o->via.str.ptr);
		gpuq_reply_free(r);
		if (strcmp(reason, "lease") == 0)
			return;
		usleep(1000);
	}
	CHECKF(false, "job %llu never waited behind a lease", (unsigned long long)job);
}

TEST(restart_replays_a_job_held_back_by_a_lease_through_two_restarts)
{
	struct daemon_proc d;
	struct gpuq_attachment a;
	struct gpuq_error err;
	char state[32], code[32], message[600];
	require_backend();
	if (test_backend_is_cuda())
		SKIP("attaches through a host mapping; tests/gpu/attach_selftest attaches on CUDA");
	daemon_start(&d, NULL);
	struct gpuq_client *holder = client_open(&d), *c = client_open(&d);
	uint64_t want = reference_sum(c, 1 * MIB, 31);
	struct mp_map req;
	gpuq_request_begin(holder, &req, "alloc");
	mp_put_str(&req, "name", "s");
	mp_put_u64(&req, "bytes", 1 * MIB);
	mp_put_bool(&req, "shareable", true);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(holder, &req, NULL, 0);
	expect_ok(r, "alloc shareable");
	gpuq_reply_free(r);
	CHECKF(gpuq_buffer_attach(holder, "s", true, &a, &err) == 0, "attach: %s", err.message);
	uint64_t fill = fill_detached(c, "s", 31);
	await_behind_lease(c, fill);
	for (uint64_t n = 1; n <= 2; n++) { /* replayed, held again by the next restart, replayed */
		restart_and_await(c, n);
		await_behind_lease(c, fill); /* behind the lease restored before any job */
	}
	job_outcome(c, fill, state, sizeof state, code, message, sizeof message);
	CHECK_STR(state, "queued");
	CHECKF(gpuq_buffer_release(holder, &a, &err) == 0, "release: %s", err.message);
	r = job_request(c, "wait", fill, 0);
	expect_ok(r, "the fill once the lease is released");
	gpuq_reply_free(r);
	CHECK_EQ(do_checksum(c, "s"), want);
	gpuq_close(c);
	gpuq_close(holder);
	daemon_stop(&d);
}

/*
 * A hand-over that cannot be read (not msgpack, a newer format, an entry
 * that is not a map) is said in the log and skipped, and gpuqd serves: a
 * bad GPUQ_INHERIT costs the held jobs, never the daemon.
 */
TEST(restart_hand_over_that_cannot_be_read_is_logged_and_gpuqd_serves)
{
	static const struct {
		const char *bytes;
		size_t n;
		const char *log;
	} cases[] = {
		{ "\xc1\xc1\xc1", 3, "the queued jobs handed over cannot be read" },
		{ "\x82\xa1v\x63\xa4jobs\x90", 10, "its format is version 99; this gpuqd reads 1" },
		{ "\x82\xa1v\x01\xa4jobs\x91\x01", 11,
		  "queued job 0 of the hand-over cannot be read: an entry is not a map" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct daemon_proc d;
		char inherit[32];
		int fd = memfd_create("gpuq-test-hand-over", 0); /* inherited by gpuqd */
		CHECK(fd >= 0 && write(fd, cases[i].bytes, cases[i].n) == (ssize_t)cases[i].n);
		snprintf(inherit, sizeof inherit, "queue:%d", fd);
		setenv("GPUQ_INHERIT", inherit, 1);
		daemon_start(&d, NULL);
		unsetenv("GPUQ_INHERIT");
		close(fd);
		struct gpuq_client *c = client_open(&d);
		CHECK_EQ(ping_restarts(c, NULL), 0);
		for (int k = 0; k < 2000 && !daemon_log_count(&d, cases[i].log); k++)
			usleep(1000);
		CHECKF(daemon_log_count(&d, cases[i].log) > 0, "case %zu: no '%s' in the log", i, cases[i].log);
		do_alloc(c, "after", 0, 4096); /* and it serves */
		gpuq_close(c);
		daemon_stop(&d);
	}
}
