/*
 * What a connection may hold in gpuqd, and for how long: descriptors
 * belong to the request whose first byte they came with; an incomplete
 * frame has --frame-timeout to arrive; each uid's connections, parked
 * descriptors and partial-frame bytes are bounded by quota rules; and a
 * daemon at its descriptor limit backs off instead of spinning, and tells
 * clients why it cannot take their descriptors.
 */
#include <poll.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "protocol/frame.h"
#include "tests/integration/fixture.h"

/* Reads one reply from a raw socket and checks its code and that its message mentions `mentions`. */
static void expect_raw(int fd, const char *want_code, const char *mentions)
{
	char code[32], message[600];
	CHECKF(raw_read_error(fd, code, sizeof code, message, sizeof message) == 0,
	       "no reply (wanted %s)", want_code);
	CHECKF(strcmp(code, want_code) == 0, "got %s (%s), wanted %s", code, message, want_code);
	CHECKF(!mentions || strstr(message, mentions), "\"%s\" does not mention \"%s\"", message,
	       mentions);
}

/* A put request frame for buffer, declaring one descriptor. */
static void put_frame(msgpack_sbuffer *sb, uint64_t id, const char *buffer)
{
	struct mp_map req;
	mp_map_init(&req);
	mp_put_u64(&req, "v", 1);
	mp_put_u64(&req, "id", id);
	mp_put_str(&req, "op", "put");
	mp_put_str(&req, "buffer", buffer);
	mp_put_u64(&req, "fds", 1);
	mp_put_bool(&req, "wait", true);
	msgpack_sbuffer_init(sb);
	mp_map_frame(&req, sb);
}

/* True once nobody holds the read end of p (gpuqd closed its copy). */
static bool read_end_closed(int p[2])
{
	for (int i = 0; i < 200; i++) {
		if (write(p[1], "x", 1) < 0 && errno == EPIPE)
			return true;
		usleep(10000);
	}
	return false;
}

TEST(descriptors_that_no_request_declares_are_closed_and_refused)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	signal(SIGPIPE, SIG_IGN);
	int p[2];
	CHECK(pipe(p) == 0);
	int fd = raw_connect(&d);
	msgpack_sbuffer ping, put;
	raw_frame(&ping, 1, "ping", 0);
	put_frame(&put, 2, "w");
	/* the pipe rides on the ping, which declares none; the put that follows declares one */
	raw_send_fds(fd, ping.data, ping.size, &p[0], 1);
	close(p[0]);
	/* gpuqd may have refused and closed already (the ping alone came with the pipe): no matter */
	(void)send(fd, put.data, put.size, MSG_NOSIGNAL);
	expect_raw(fd, "ok", NULL); /* the ping */
	expect_raw(fd, "bad_frame", "do not declare them");
	CHECKF(raw_closed_by_peer(fd, 2000), "the connection stayed open");
	CHECKF(read_end_closed(p), "gpuqd kept the stray descriptor");
	msgpack_sbuffer_destroy(&ping);
	msgpack_sbuffer_destroy(&put);
	close(fd);
	close(p[1]);
	daemon_stop(&d);
}

/* Two requests in one sendmsg, with both descriptors: each takes its own, in order. */
TEST(batched_requests_take_their_descriptors_in_order)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "a", 0, 4096);
	do_alloc(c, "b", 0, 4096);
	int src[2] = { memfd_random(4096, 1), memfd_random(4096, 2) };
	msgpack_sbuffer fa, fb;
	put_frame(&fa, 1, "a");
	put_frame(&fb, 2, "b");
	char both[1024];
	CHECK(fa.size + fb.size <= sizeof both);
	memcpy(both, fa.data, fa.size);
	memcpy(both + fa.size, fb.data, fb.size);
	int fd = raw_connect(&d);
	raw_send_fds(fd, both, fa.size + fb.size, src, 2);
	expect_raw(fd, "ok", NULL);
	expect_raw(fd, "ok", NULL);
	for (int i = 0; i < 2; i++) { /* the same bytes put one request at a time */
		char name[16];
		snprintf(name, sizeof name, "ref%d", i);
		do_alloc(c, name, 0, 4096);
		int ref = memfd_random(4096, (uint64_t)i + 1);
		CHECK_EQ(do_put(c, name, ref), 4096);
		close(ref);
	}
	CHECK_EQ(do_checksum(c, "a"), do_checksum(c, "ref0"));
	CHECK_EQ(do_checksum(c, "b"), do_checksum(c, "ref1"));
	CHECK(do_checksum(c, "a") != do_checksum(c, "b"));
	close(src[0]);
	close(src[1]);
	close(fd);
	msgpack_sbuffer_destroy(&fa);
	msgpack_sbuffer_destroy(&fb);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(descriptors_sent_after_the_first_byte_put_the_stream_out_of_step)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 4096);
	int src = memfd_random(4096, 3);
	msgpack_sbuffer f;
	put_frame(&f, 7, "w");
	int fd = raw_connect(&d);
	raw_write(fd, f.data, 6); /* the first bytes without it */
	usleep(50000);
	raw_send_fds(fd, f.data + 6, f.size - 6, &src, 1);
	expect_raw(fd, "bad_frame", "arrived with its first byte");
	CHECK(raw_closed_by_peer(fd, 2000));
	close(fd);
	close(src);
	msgpack_sbuffer_destroy(&f);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(an_incomplete_frame_times_out)
{
	struct daemon_proc d;
	daemon_start(&d, "--frame-timeout", "300", NULL);
	struct gpuq_client *bystander = client_open(&d);
	int fd = raw_connect(&d);
	uint8_t hdr[4];
	frame_put_header(hdr, 100);
	raw_write(fd, hdr, 4);
	raw_write(fd, "\x83\xa1v\x01", 4); /* 8 of 104 bytes, then nothing */
	expect_raw(fd, "bad_frame", "--frame-timeout");
	CHECK(raw_closed_by_peer(fd, 2000));
	close(fd);
	/* a connection that sends nothing at all holds no frame, and stays */
	fd = raw_connect(&d);
	usleep(1500000);
	msgpack_sbuffer ping;
	raw_frame(&ping, 3, "ping", 0);
	raw_write(fd, ping.data, ping.size);
	expect_raw(fd, "ok", NULL);
	msgpack_sbuffer_destroy(&ping);
	close(fd);
	CHECK(device_count(bystander) > 0);
	gpuq_close(bystander);
	daemon_stop(&d);
}

struct limit_args {
	const struct daemon_proc *d;
};

static void connections_are_bounded(void *arg)
{
	const struct daemon_proc *d = ((struct limit_args *)arg)->d;
	int fds[4];
	msgpack_sbuffer ping;
	raw_frame(&ping, 1, "ping", 0);
	for (int i = 0; i < 3; i++) {
		fds[i] = raw_connect(d);
		raw_write(fds[i], ping.data, ping.size);
		expect_raw(fds[i], "ok", NULL);
	}
	fds[3] = raw_connect(d);
	expect_raw(fds[3], "permission_denied", "connections");
	CHECK(raw_closed_by_peer(fds[3], 2000));
	close(fds[3]);
	/* libgpuq reports the refusal even when its first send finds the connection closed */
	struct gpuq_client *c = client_open(d);
	usleep(100000);
	struct mp_map req;
	struct gpuq_reply *r;
	struct gpuq_error err;
	gpuq_request_begin(c, &req, "ping");
	if (gpuq_call(c, &req, NULL, 0, &r, &err) == 0) {
		gpuq_reply_error(r, &err);
		gpuq_reply_free(r);
	}
	CHECKF(err.code == GPUQ_E_PERMISSION_DENIED && strstr(err.message, "connections 3 exceeded"),
	       "the refused client saw %s: %s", gpuq_errc_name(err.code), err.message);
	gpuq_close(c);
	close(fds[0]); /* one fewer: a new one is taken */
	usleep(100000);
	fds[0] = raw_connect(d);
	raw_write(fds[0], ping.data, ping.size);
	expect_raw(fds[0], "ok", NULL);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	msgpack_sbuffer_destroy(&ping);
}

TEST(connections_per_uid_are_a_quota)
{
	struct daemon_proc d;
	start_with_config(&d, "[default]\nconnections = 3\n", NULL);
	struct limit_args a = { &d };
	as_user(65534, NULL, 0, connections_are_bounded, &a);
	/* root is never limited */
	struct gpuq_client *c[5];
	for (int i = 0; i < 5; i++)
		c[i] = client_open(&d);
	for (int i = 0; i < 5; i++) {
		CHECK(device_count(c[i]) > 0);
		gpuq_close(c[i]);
	}
	daemon_stop(&d);
}

static void parked_descriptors_are_bounded(void *arg)
{
	const struct daemon_proc *d = ((struct limit_args *)arg)->d;
	int p[2];
	CHECK(pipe(p) == 0);
	int three[3] = { p[0], p[0], p[1] };
	msgpack_sbuffer f;
	put_frame(&f, 1, "w");
	int fd = raw_connect(d);
	raw_send_fds(fd, f.data, 6, three, 3); /* an incomplete frame holding 3 */
	expect_raw(fd, "permission_denied", "parked-fds");
	CHECK(raw_closed_by_peer(fd, 2000));
	close(fd);
	close(p[0]);
	close(p[1]);
	msgpack_sbuffer_destroy(&f);
}

static void partial_frames_are_bounded(void *arg)
{
	const struct daemon_proc *d = ((struct limit_args *)arg)->d;
	msgpack_sbuffer big;
	raw_frame(&big, 9, "ping", 6000);
	int a = raw_connect(d), b = raw_connect(d);
	raw_write(a, big.data, 5000);
	usleep(100000);
	raw_write(b, big.data, 4000); /* 9000 bytes pending in all, over 8K */
	expect_raw(b, "permission_denied", "pending-frame-bytes");
	CHECK(raw_closed_by_peer(b, 2000));
	raw_write(a, big.data + 5000, big.size - 5000); /* the first completes */
	expect_raw(a, "ok", NULL);
	close(a);
	close(b);
	msgpack_sbuffer_destroy(&big);
}

/* A connection that never reads its replies is dropped once they pass reply-bytes; others go on. */
static void unread_replies_are_bounded(void *arg)
{
	const struct daemon_proc *d = ((struct limit_args *)arg)->d;
	int quiet = raw_connect(d);
	int small = 4096;
	CHECK(setsockopt(quiet, SOL_SOCKET, SO_RCVBUF, &small, sizeof small) == 0);
	msgpack_sbuffer devices;
	raw_frame(&devices, 1, "devices", 0);
	bool dropped = false;
	for (int i = 0; i < 20000 && !dropped; i++) /* about 1 KiB of reply each */
		dropped = send(quiet, devices.data, devices.size, MSG_NOSIGNAL) < 0;
	CHECKF(dropped, "a connection that reads nothing was never dropped");
	close(quiet);
	struct gpuq_client *c = client_open(d); /* the uid's other connections are served */
	CHECK(device_count(c) > 0);
	gpuq_close(c);
	msgpack_sbuffer_destroy(&devices);
}

TEST(parked_descriptors_partial_frames_and_unread_replies_per_uid_are_quotas)
{
	struct daemon_proc d;
	start_with_config(&d, "[default]\nparked-fds = 2\npending-frame-bytes = 8K\nreply-bytes = 1M\n",
			  NULL);
	struct limit_args a = { &d };
	as_user(65534, NULL, 0, parked_descriptors_are_bounded, &a);
	as_user(65534, NULL, 0, partial_frames_are_bounded, &a);
	as_user(65534, NULL, 0, unread_replies_are_bounded, &a);
	CHECKF(daemon_log_count(&d, "reply-bytes 1.0 MiB exceeded") == 1, "the drop is not logged, with its rule");
	struct gpuq_client *c = client_open(&d);
	CHECK(device_count(c) > 0);
	gpuq_close(c);
	daemon_stop(&d);
}

/* CPU seconds (user + system) gpuqd has used, from /proc/PID/stat. */
static double daemon_cpu_seconds(const struct daemon_proc *d)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)d->pid);
	FILE *f = fopen(path, "r");
	CHECK(f);
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *p = strrchr(buf, ')'); /* after the command name */
	unsigned long long utime = 0, stime = 0;
	CHECK(p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
			  &stime) == 2);
	return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

TEST(a_daemon_at_its_descriptor_limit_backs_off_and_says_why)
{
	struct daemon_proc d;
	daemon_start(&d, NULL); /* what the backend needs: the CUDA driver's descriptors vary */
	unsigned base = daemon_fd_count(&d);
	daemon_stop(&d);
	fixture_daemon_nofile = base + 48;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 4096);
	int idle[80], nidle = 0;
	for (; nidle < 80; nidle++) /* past the limit they are refused, not left in the backlog */
		idle[nidle] = raw_connect(&d);
	usleep(200000);
	double cpu = daemon_cpu_seconds(&d);
	usleep(1000000);
	cpu = daemon_cpu_seconds(&d) - cpu;
	CHECKF(cpu < 0.3, "gpuqd used %.2f s of CPU in 1 s at its descriptor limit", cpu);
	CHECKF(daemon_log_count(&d, "descriptor limit") <= 2, "the log line is not rate-limited");
	CHECKF(daemon_log_count(&d, "uid 0's") >= 1, "the log does not name whose connections they are");
	/* the connections past the limit were each answered busy (id 0) and closed at once */
	int refused = 0;
	for (int i = 0; i < nidle; i++) {
		struct pollfd p = { .fd = idle[i], .events = POLLIN };
		char code[32], message[256];
		if (poll(&p, 1, 0) != 1 || raw_read_error(idle[i], code, sizeof code, message,
							   sizeof message) < 0)
			continue;
		CHECK_STR(code, "busy");
		CHECKF(strstr(message, "descriptor limit"), "busy says: %s", message);
		refused++;
	}
	CHECKF(refused >= 20, "%d of %d connections past a limit of %u descriptors were refused",
	       refused, nidle, base + 48);
	CHECKF(raw_closed_by_peer(idle[nidle - 1], 2000), "the last connection was not closed");
	/* a working client's put: its descriptor cannot be received, and it is told why */
	int src = memfd_random(4096, 5);
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "w");
	mp_put_u64(&req, "fds", 1);
	mp_put_bool(&req, "wait", true);
	expect_error(call(c, &req, &src, 1), GPUQ_E_BUSY, "out of file descriptors");
	gpuq_close(c);
	for (int i = 0; i < nidle; i++)
		close(idle[i]);
	usleep(300000); /* the daemon accepts again and serves */
	c = client_open(&d);
	CHECK_EQ(do_put(c, "w", src), 4096);
	close(src);
	gpuq_close(c);
	daemon_stop(&d);
}

/* A put or get job through fd that is waited for; its reply. */
static struct gpuq_reply *transfer_waited(struct gpuq_client *c, const char *op, int fd)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, "buffer", "w");
	mp_put_u64(&req, "fds", 1);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, &fd, 1);
}

TEST(streamed_transfers_that_move_nothing_time_out)
{
	struct daemon_proc d;
	daemon_start(&d, "--transfer-idle-timeout", "300", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 4 << 20);
	int sv[2], p[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	CHECK(write(sv[1], "abc", 3) == 3); /* a few bytes, then silence */
	struct gpuq_reply *r = transfer_waited(c, "put", sv[0]);
	expect_error(r, GPUQ_E_TIMEOUT, "the source (a socket) yielded no byte for 300 ms");
	CHECKF(strstr(reply_path(r, "error.message")->via.str.ptr, "after 3 bytes"),
	       "the message does not say how far it got");
	gpuq_reply_free(r);
	CHECK(pipe(p) == 0); /* a reader that never reads: 4 MiB cannot fit in the pipe */
	r = transfer_waited(c, "get", p[1]);
	expect_error(r, GPUQ_E_TIMEOUT, "the destination (a pipe) took no byte");
	gpuq_reply_free(r);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	CHECK(ep >= 0);
	r = transfer_waited(c, "put", ep);
	expect_error(r, GPUQ_E_TIMEOUT, "anonymous inode");
	gpuq_reply_free(r);
	/* a slow source that keeps moving is never idle */
	close(p[0]);
	close(p[1]);
	CHECK(pipe(p) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		for (int i = 0; i < 8; i++) {
			usleep(100000);
			CHECK(write(p[1], "0123456789", 10) == 10);
		}
		_exit(0);
	}
	close(p[1]);
	r = transfer_waited(c, "put", p[0]);
	expect_ok(r, "a slow put that keeps moving");
	CHECK_EQ(reply_u64(r, "job.result.bytes"), 80);
	gpuq_reply_free(r);
	waitpid(pid, NULL, 0);
	close(p[0]);
	close(ep);
	close(sv[0]);
	close(sv[1]);
	gpuq_close(c);
	daemon_stop(&d);
}
