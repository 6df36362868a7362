/*
 * libgpuq's reconnecting (gpuq_set_reconnect): a gpuqd killed and started
 * again on the same socket, as systemd restarts a crashed one. Requests
 * that never left go again; a read-only request in flight goes again; a
 * job in flight is not repeated, and says so; without reconnecting the
 * client keeps today's behaviour (the call fails, the stream stays broken).
 */
#include <pthread.h>
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/fixture.h"

/* SIGKILL, as the OOM killer or a segfault ends a daemon: no goodbye, socket file left. */
static void daemon_kill(struct daemon_proc *d)
{
	CHECK(kill(d->pid, SIGKILL) == 0);
	CHECK(waitpid(d->pid, NULL, 0) == d->pid);
}

static int ping(struct gpuq_client *c, struct gpuq_error *err)
{
	struct mp_map req;
	struct gpuq_reply *r;
	gpuq_request_begin(c, &req, "ping");
	if (gpuq_call(c, &req, NULL, 0, &r, err) < 0)
		return -1;
	int ok = gpuq_reply_ok(r) ? 0 : -1;
	gpuq_reply_free(r);
	return ok;
}

TEST(reconnect_off_by_default_keeps_the_lost_connection_an_error)
{
	struct daemon_proc d;
	struct gpuq_error err;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	CHECK(ping(c, &err) == 0);
	daemon_kill(&d);
	daemon_restart(&d, NULL);
	CHECK(ping(c, &err) < 0);
	CHECK_EQ(err.code, GPUQ_E_IO);
	CHECK(ping(c, &err) < 0); /* broken stays broken */
	CHECK_EQ(gpuq_reconnects(c), 0);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(reconnect_sends_a_request_that_never_left_to_the_new_daemon)
{
	struct daemon_proc d;
	struct gpuq_error err;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	gpuq_set_reconnect(c, 20000);
	CHECK(ping(c, &err) == 0);
	daemon_kill(&d);
	daemon_restart(&d, NULL);
	CHECKF(ping(c, &err) == 0, "ping after the restart: %s", err.message);
	CHECK_EQ(gpuq_reconnects(c), 1);
	/* a job that never left goes too: the new daemon runs it */
	do_alloc(c, "after", 0, 4096);
	CHECK_EQ(gpuq_reconnects(c), 1);
	gpuq_close(c);
	daemon_stop(&d);
}

struct in_flight {
	struct gpuq_client *c;
	const char *op;
	uint64_t job;
	int rc;
	struct gpuq_error err;
	struct gpuq_reply *reply;
};

/* A request that waits in the daemon: `wait` on a job, or a fill queued behind it. */
static void *call_in_flight(void *arg)
{
	struct in_flight *f = arg;
	struct mp_map req;
	gpuq_request_begin(f->c, &req, f->op);
	if (strcmp(f->op, "wait") == 0) {
		mp_put_u64(&req, "job", f->job);
	} else {
		mp_put_str(&req, "buffer", "w");
		mp_put_str(&req, "pattern", "zero");
		mp_put_bool(&req, "wait", true);
	}
	f->rc = gpuq_call(f->c, &req, NULL, 0, &f->reply, &f->err);
	return NULL;
}

/* Whether job is queued in the daemon (false while it does not exist yet). */
static bool job_queued(struct gpuq_client *c, uint64_t job)
{
	struct mp_map req;
	struct gpuq_reply *r;
	struct gpuq_error err;
	char state[16] = "";
	gpuq_request_begin(c, &req, "status");
	mp_put_u64(&req, "job", job);
	CHECK(gpuq_call(c, &req, NULL, 0, &r, &err) == 0);
	if (gpuq_reply_ok(r))
		reply_str(r, "job.state", state, sizeof state);
	gpuq_reply_free(r);
	return strcmp(state, "queued") == 0;
}

/* Kills and restarts the daemon under f's call once f's request is in it. */
static void restart_under(struct daemon_proc *d, struct gpuq_client *watcher, struct in_flight *f,
			  int waiters_before)
{
	pthread_t t;
	CHECK(pthread_create(&t, NULL, call_in_flight, f) == 0);
	/* the request is in the daemon once it shows: a queued fill, or one more waiter */
	for (int i = 0; i < 5000; i++) {
		if (strcmp(f->op, "fill") == 0 && job_queued(watcher, f->job + 1))
			break;
		/* nothing shows a waiter: give it time; sent or not, it must end the same way */
		if (strcmp(f->op, "wait") == 0 && i > waiters_before)
			break;
		usleep(1000);
	}
	daemon_kill(d);
	daemon_restart(d, NULL);
	CHECK(pthread_join(t, NULL) == 0);
}

TEST(reconnect_repeats_a_read_in_flight_but_never_a_job)
{
	struct daemon_proc d;
	struct gpuq_error err;
	int p[2];
	daemon_start(&d, NULL);
	struct gpuq_client *owner = client_open(&d), *c = client_open(&d);
	gpuq_set_reconnect(c, 20000);
	do_alloc(owner, "w", 0, 4);
	uint64_t put = start_stalled_put(owner, "w", p);

	/* a fill queued behind the stalled put, in flight when the daemon dies */
	struct in_flight fill = { .c = c, .op = "fill", .job = put };
	restart_under(&d, owner, &fill, 0);
	CHECK(fill.rc < 0);
	CHECK_EQ(fill.err.code, GPUQ_E_IO);
	CHECKF(strstr(fill.err.message, "in flight") && strstr(fill.err.message, "(fill)") &&
		       strstr(fill.err.message, "not sent again"),
	       "%s", fill.err.message);
	CHECK_EQ(gpuq_reconnects(c), 1);
	CHECKF(ping(c, &err) == 0, "the client serves again: %s", err.message);

	/*
	 * A wait in flight is not asked of a gpuqd started afresh (no descriptor
	 * store: it took nothing over): it numbers its jobs from 1 again, so the
	 * job's id may name one of its own, whose end the wait would report.
	 */
	gpuq_close(owner);
	close(p[1]);
	owner = client_open(&d);
	do_alloc(owner, "w", 0, 4);
	put = start_stalled_put(owner, "w", p);
	struct in_flight wait = { .c = c, .op = "wait", .job = put };
	restart_under(&d, owner, &wait, 1000); /* a second to send it: it is in flight */
	CHECKF(wait.rc < 0, "the wait was asked of the new gpuqd");
	CHECK_EQ(wait.err.code, GPUQ_E_IO);
	CHECKF(strstr(wait.err.message, "started afresh") &&
		       strstr(wait.err.message, "not asked again"),
	       "%s", wait.err.message);
	/* at least one more: a connection may be made again more than once within the window */
	CHECKF(gpuq_reconnects(c) >= 2, "%u reconnects", gpuq_reconnects(c));

	close(p[1]);
	gpuq_close(owner);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A stand-in for a gpuqd that is dying on a socket of its own, then one
 * that serves: the first connection reads one request and closes (the
 * gpuqd that went away), the second is closed at once (a dying gpuqd that
 * still took it), the third answers every request ok.
 */
struct dying_server {
	int listen_fd;
	unsigned answered;
};

/* Reads one frame of fd into buf (at most n bytes); its length, or -1 at its end. */
static ssize_t read_frame(int fd, char *buf, size_t n)
{
	unsigned char len[4];
	if (read(fd, len, 4) != 4)
		return -1;
	size_t want = (size_t)len[0] << 24 | (size_t)len[1] << 16 | (size_t)len[2] << 8 | len[3];
	size_t got = 0;
	for (ssize_t r; got < want && want <= n; got += (size_t)r)
		if ((r = read(fd, buf + got, want - got)) <= 0)
			return -1;
	return got == want ? (ssize_t)want : -1;
}

/* Answers the request in buf (its frame payload) with {v, id, ok: true}. */
static void answer_ok(int fd, const char *buf, size_t n)
{
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	CHECK(msgpack_unpack_next(&u, buf, n, NULL) == MSGPACK_UNPACK_SUCCESS);
	const msgpack_object *id = msg_map_get(&u.data, "id");
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 3);
	msgpack_pack_str_with_body(&pk, "v", 1);
	msgpack_pack_uint64(&pk, GPUQ_PROTOCOL_VERSION);
	msgpack_pack_str_with_body(&pk, "id", 2);
	msgpack_pack_uint64(&pk, id ? id->via.u64 : 0);
	msgpack_pack_str_with_body(&pk, "ok", 2);
	msgpack_pack_true(&pk);
	unsigned char len[4] = { (unsigned char)(sb.size >> 24), (unsigned char)(sb.size >> 16),
				 (unsigned char)(sb.size >> 8), (unsigned char)sb.size };
	raw_write(fd, len, 4);
	raw_write(fd, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	msgpack_unpacked_destroy(&u);
}

static void *dying_server_run(void *arg)
{
	struct dying_server *s = arg;
	char buf[4096];
	for (int conn = 0; conn < 3; conn++) {
		int fd = accept(s->listen_fd, NULL, NULL);
		CHECK(fd >= 0);
		ssize_t n = conn == 1 ? -1 : read_frame(fd, buf, sizeof buf);
		while (conn == 2 && n > 0) {
			answer_ok(fd, buf, (size_t)n);
			s->answered++;
			n = read_frame(fd, buf, sizeof buf);
		}
		close(fd);
	}
	return NULL;
}

/*
 * A connection counts only once it answered: one taken by a gpuqd that is
 * still dying (closed at once) is dropped for the next, and the read in
 * flight goes on the one that answers. One reconnect, not two.
 */
TEST(reconnect_skips_a_connection_that_never_answers)
{
	char path[] = "/tmp/gpuq-dying-XXXXXX";
	CHECK(mkdtemp(path) != NULL);
	char sock[sizeof path + 8];
	snprintf(sock, sizeof sock, "%s/s", path);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
	struct dying_server s = { socket(AF_UNIX, SOCK_STREAM, 0), 0 };
	CHECK(s.listen_fd >= 0 && bind(s.listen_fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
	      listen(s.listen_fd, 4) == 0);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, dying_server_run, &s) == 0);
	struct gpuq_client *c = NULL;
	struct gpuq_error err;
	CHECK(gpuq_connect(sock, &c, &err) == 0);
	gpuq_set_reconnect(c, 5000);
	CHECKF(ping(c, &err) == 0, "the ping in flight went again on a connection that answers: %s",
	       err.message);
	CHECK_EQ(gpuq_reconnects(c), 1);
	gpuq_close(c);
	pthread_join(t, NULL); /* the server has read all it will: its count is final */
	CHECK_EQ(s.answered, 2); /* the new connection's own ping, then the one in flight */
	close(s.listen_fd);
	unlink(sock);
	rmdir(path);
}
