/*
 * libgpuq's reconnecting (gpuq_set_reconnect): a gpuqd killed and started
 * again on the same socket, as systemd restarts a crashed one. Requests
 * that never left go again; a read-only request in flight goes again; a
 * job in flight is not repeated, and says so; without reconnecting the
 * client keeps today's behaviour (the call fails, the stream stays broken).
 */
#include <pthread.h>
#include <signal.h>
#include <string.h>
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

	/* a wait in flight goes again: the new daemon never heard of the job */
	gpuq_close(owner);
	close(p[1]);
	owner = client_open(&d);
	do_alloc(owner, "w", 0, 4);
	put = start_stalled_put(owner, "w", p);
	struct in_flight wait = { .c = c, .op = "wait", .job = put };
	restart_under(&d, owner, &wait, 300);
	CHECKF(wait.rc == 0, "the wait was not repeated: %s", wait.err.message);
	gpuq_reply_error(wait.reply, &err);
	CHECK_EQ(err.code, GPUQ_E_NOT_FOUND);
	gpuq_reply_free(wait.reply);
	/* at least one more: a connection may be made again more than once within the window */
	CHECKF(gpuq_reconnects(c) >= 2, "%u reconnects", gpuq_reconnects(c));

	close(p[1]);
	gpuq_close(owner);
	gpuq_close(c);
	daemon_stop(&d);
}
