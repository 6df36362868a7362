/*
 * Peers that go away while gpuqd still owes them something: job
 * completions, wait answers, wait timeouts, progress events, replies during
 * a shutdown. Each must cost that connection alone: the daemon, its other
 * clients and their jobs carry on. Every one of these once crashed gpuqd
 * (a send that failed freed the connection's waiters under a caller that
 * was still walking them); `make asan` runs them against the ASan build,
 * which turns a use-after-free into a dead daemon and a failed test.
 *
 * A client "stops reading" with shutdown(SHUT_RD): on a UNIX socket the
 * daemon's next send to it then fails with EPIPE, at once and every time,
 * which is what a killed client's socket does only some of the time.
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

#include "protocol/frame.h"
#include "tests/integration/fixture.h"

/* Sends a request without waiting for its reply. */
static void send_only(struct gpuq_client *c, struct mp_map *req)
{
	struct gpuq_error err;
	CHECKF(gpuq_send(c, req, NULL, 0, &err) == 0, "send: %s", err.message);
}

static void send_wait(struct gpuq_client *c, uint64_t job, uint64_t timeout_ms, bool progress)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "wait");
	mp_put_u64(&req, "job", job);
	if (timeout_ms)
		mp_put_u64(&req, "timeout_ms", timeout_ms);
	if (progress)
		mp_put_bool(&req, "progress", true);
	send_only(c, &req);
}

static void send_noop_wait(struct gpuq_client *c, bool progress)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "noop");
	mp_put_bool(&req, "wait", true);
	if (progress)
		mp_put_bool(&req, "progress", true);
	send_only(c, &req);
}

/*
 * A ping on c: requests are handled in order, so once it is answered every
 * request sent before it has been handled (its waiter registered).
 */
static void sync_with(struct gpuq_client *c)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "ping");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "ping");
	gpuq_reply_free(r);
}

/* The daemon lives and answers a fresh client. */
static void expect_serving(const struct daemon_proc *d)
{
	CHECKF(daemon_alive(d), "gpuqd died");
	struct gpuq_client *c = client_open(d);
	sync_with(c);
	gpuq_close(c);
}

static void stop_reading(struct gpuq_client *c)
{
	CHECKF(shutdown(gpuq_fd(c), SHUT_RD) == 0, "shutdown: %s", strerror(errno));
}

/* A send that failed closed the connection: the client's own sends now fail. */
static void expect_closed_by_daemon(struct gpuq_client *c)
{
	static const uint8_t empty_map[] = { 0, 0, 0, 1, 0x80 };
	struct gpuq_error err;
	CHECKF(gpuq_send_raw(c, empty_map, sizeof empty_map, &err) < 0,
	       "gpuqd kept a connection open after its sends to it failed");
}

/* A put of 4 bytes into a new buffer "w" from a pipe nobody writes yet: its job id. */
static uint64_t stalled_job(struct gpuq_client *owner, int p[2])
{
	do_alloc(owner, "w", 0, 4);
	return start_stalled_put(owner, "w", p);
}

/*
 * What most tests here start from: a daemon, a client whose put stalls (job),
 * and a second client, `dead`, that will stop reading while it waits.
 */
struct scene {
	struct daemon_proc d;
	struct gpuq_client *owner, *dead;
	int p[2];
	uint64_t job;
};

static void scene_start(struct scene *s)
{
	daemon_start(&s->d, "--shutdown-timeout", "200", NULL);
	s->owner = client_open(&s->d);
	s->dead = client_open(&s->d);
	s->job = stalled_job(s->owner, s->p);
}

static void scene_stop(struct scene *s)
{
	gpuq_close(s->dead);
	gpuq_close(s->owner);
	daemon_stop(&s->d);
}

/* Lets the stalled put of start_stalled_put end with n bytes. */
static void end_stalled_put(int p[2], size_t n)
{
	static const char bytes[64] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde";
	CHECK(n <= sizeof bytes);
	CHECK_EQ(write(p[1], bytes, n), n);
	close(p[1]);
}

/* The daemon still serves: a fresh client's wait for job sees it done. */
static void expect_job_done(const struct daemon_proc *d, uint64_t job)
{
	CHECKF(daemon_alive(d), "gpuqd died");
	struct gpuq_client *c = client_open(d);
	struct mp_map req;
	gpuq_request_begin(c, &req, "wait");
	mp_put_u64(&req, "job", job);
	mp_put_u64(&req, "timeout_ms", 10000);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "wait from a fresh client");
	gpuq_reply_free(r);
	gpuq_close(c);
}

/*
 * Waiters on one job from a connection that has stopped reading, beside a
 * waiter on another connection: the job's end answers all of them.
 */
static void completions_to_a_dead_reader(const struct daemon_proc *d)
{
	struct gpuq_client *owner = client_open(d);
	struct gpuq_client *dead = client_open(d);
	struct gpuq_client *live = client_open(d);
	int p[2];
	uint64_t job = stalled_job(owner, p);
	send_wait(dead, job, 0, false);
	send_wait(dead, job, 60000, true);
	send_wait(dead, job, 0, false);
	send_noop_wait(dead, false); /* queued behind the put, waited for by its request */
	send_wait(live, job, 0, false);
	sync_with(dead);
	sync_with(live);
	stop_reading(dead);
	end_stalled_put(p, 4);
	struct gpuq_reply *r;
	struct gpuq_error err;
	CHECKF(gpuq_recv(live, 0, &r, &err) == 0, "the live waiter got no answer: %s", err.message);
	expect_ok(r, "the live waiter");
	gpuq_reply_free(r);
	expect_job_done(d, job);
	gpuq_close(dead);
	gpuq_close(live);
	gpuq_close(owner);
}

TEST(job_completions_to_a_peer_that_stopped_reading)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	completions_to_a_dead_reader(&d);
	daemon_stop(&d);
}

TEST(wait_timeouts_to_a_peer_that_stopped_reading)
{
	struct scene s;
	scene_start(&s);
	for (int i = 0; i < 4; i++)
		send_wait(s.dead, s.job, 100 + 10 * (uint64_t)(i % 2), i == 1);
	sync_with(s.dead);
	stop_reading(s.dead);
	usleep(400000); /* every timeout has fired, each answer failed to send */
	CHECKF(daemon_alive(&s.d), "gpuqd died when wait timeouts were sent to a dead reader");
	expect_closed_by_daemon(s.dead);
	end_stalled_put(s.p, 4);
	expect_job_done(&s.d, s.job);
	scene_stop(&s);
}

TEST(progress_events_to_a_peer_that_stopped_reading)
{
	struct scene s;
	scene_start(&s);
	struct gpuq_client *live = client_open(&s.d);
	send_wait(s.dead, s.job, 0, true);
	send_wait(s.dead, s.job, 0, true);
	send_wait(live, s.job, 0, true);
	send_wait(s.dead, s.job, 0, true);
	sync_with(s.dead);
	sync_with(live);
	stop_reading(s.dead);
	usleep(1600000); /* progress events start after a second of running */
	CHECKF(daemon_alive(&s.d), "gpuqd died sending progress events to a dead reader");
	end_stalled_put(s.p, 4);
	struct gpuq_reply *r;
	struct gpuq_error err;
	CHECKF(gpuq_recv(live, 0, &r, &err) == 0, "the live waiter got no answer: %s", err.message);
	expect_ok(r, "the live waiter");
	gpuq_reply_free(r);
	expect_job_done(&s.d, s.job);
	gpuq_close(live);
	scene_stop(&s);
}

/* Clients that send a waiting job request and close before its answer. */
TEST(clients_closing_right_after_a_waiting_request)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	for (int i = 0; i < 300; i++) {
		struct gpuq_client *c = client_open(&d);
		send_noop_wait(c, i % 3 == 0);
		if (i % 2)
			stop_reading(c);
		usleep((useconds_t)(i % 5) * 100); /* before, during or after its job */
		gpuq_close(c);
	}
	expect_serving(&d);
	daemon_stop(&d);
}

/*
 * A connection that never reads: the answers it is owed pile up in gpuqd
 * (timeouts, progress, completions) until it closes with all of them
 * unsent and its waiters and timers still armed.
 */
TEST(peer_that_never_reads_then_vanishes)
{
	struct scene s;
	scene_start(&s);
	int fd = raw_connect(&s.d);
	for (int i = 0; i < 3000; i++) {
		struct mp_map req;
		msgpack_sbuffer frame;
		mp_map_init(&req);
		mp_put_u64(&req, "v", 1);
		mp_put_u64(&req, "id", (uint64_t)i + 1);
		mp_put_str(&req, "op", i % 10 ? "wait" : "noop");
		mp_put_u64(&req, "job", s.job);
		mp_put_bool(&req, "wait", true);
		mp_put_u64(&req, "timeout_ms", i % 2 ? 1 : 60000);
		mp_put_bool(&req, "progress", i % 3 == 0);
		msgpack_sbuffer_init(&frame);
		mp_map_frame(&req, &frame);
		raw_write(fd, frame.data, frame.size);
		msgpack_sbuffer_destroy(&frame);
	}
	usleep(1300000); /* timeouts answered, progress events due, nothing read */
	CHECKF(daemon_alive(&s.d), "gpuqd died while a client did not read");
	close(fd);
	end_stalled_put(s.p, 4);
	expect_job_done(&s.d, s.job);
	scene_stop(&s);
}

/*
 * `gpuq noop` killed 0-2 ms after it starts: sometimes before it sent,
 * sometimes while its job runs, sometimes as the answer goes out.
 */
TEST(killed_cli_clients)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	for (int i = 0; i < 150; i++) {
		pid_t pid = spawn_gpuq(&d, "noop", NULL);
		struct timespec t = { 0, (long)(i % 3) * 1000000L + (i % 7) * 100000L };
		nanosleep(&t, NULL);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	expect_serving(&d);
	daemon_stop(&d);
}

/* Any local user may do all of this: the daemon's other users must not notice. */
TEST(unprivileged_dead_peers_cannot_crash_the_daemon)
{
	if (geteuid() != 0)
		SKIP("needs root to act as uid 65534");
	struct daemon_proc d;
	daemon_start(&d, "--socket-group", "nogroup", NULL);
	struct gpuq_client *root = client_open(&d);
	do_alloc(root, "keep", 0, 4096);
	do_fill_random(root, "keep", 3);
	uint64_t sum = do_checksum(root, "keep");
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		CHECK(setgid(65534) == 0 && setuid(65534) == 0);
		completions_to_a_dead_reader(&d);
		_exit(0);
	}
	int status;
	waitpid(pid, &status, 0);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "uid 65534's client failed");
	CHECKF(daemon_alive(&d), "gpuqd died");
	CHECK_EQ(do_checksum(root, "keep"), sum);
	gpuq_close(root);
	daemon_stop(&d);
}

/* SIGTERM while dead readers wait on a job that must be cancelled. */
TEST(shutdown_with_dead_readers_waiting)
{
	struct scene s;
	scene_start(&s);
	send_wait(s.dead, s.job, 0, true);
	send_wait(s.dead, s.job, 60000, false);
	send_noop_wait(s.dead, true);
	sync_with(s.dead);
	stop_reading(s.dead);
	daemon_stop(&s.d); /* exit status 0, socket removed */
	close(s.p[1]);
	gpuq_close(s.dead);
	gpuq_close(s.owner);
}
