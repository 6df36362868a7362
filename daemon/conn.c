/*
 * One client connection: reading frames and the descriptors that come with
 * them, sending replies, closing. Main thread only.
 *
 * A connection is read with recvmsg on a uv_poll_t rather than a uv_pipe_t,
 * because requests carry regular-file, memfd and pipe descriptors as
 * SCM_RIGHTS, and libuv's pipes pass only stream handles. Replies are
 * written directly while the socket accepts them and queued otherwise.
 *
 * Closing is deferred and idempotent (conn_close): the struct is freed only
 * from its poll handle's close callback, so it stays valid for the rest of
 * the loop iteration in which it was closed. Request handlers may close the
 * connection they are answering, and a send that fails (the peer is gone)
 * closes it without freeing anything that the code which sent may still be
 * walking.
 *
 * What a connection holds in gpuqd (itself, descriptors received ahead of
 * their request, an incomplete frame) counts against its uid's connection
 * limits (quota.h), checked as it grows.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/job.h"
#include "workers/log.h"
#include "daemon/server.h"
#include "workers/clock.h"

#define READ_CHUNK (64u * 1024u)
#define FDS_PER_RECV 16
/* An idle connection keeps a read buffer of at most this much. */
#define IDLE_BUFFER_MAX (2 * READ_CHUNK)

struct outbuf {
	struct outbuf *next;
	size_t len, off;
	int fd; /* a descriptor to pass with the frame's first byte (SCM_RIGHTS), or -1; ours to close */
	uint8_t data[];
};

static void outbuf_free(struct outbuf *o)
{
	if (o->fd >= 0)
		close(o->fd);
	free(o);
}

static void conn_update_poll(struct conn *c);
static int conn_account_output(struct conn *c);

/* Runs the close hooks of one kind, in the order registered (server.h). */
static void conn_run_hooks(struct conn *c, enum conn_hook_when when)
{
	const struct server *s = c->server;
	for (size_t i = 0; i < s->nconn_hooks; i++)
		if (s->conn_hooks[i].when == when)
			s->conn_hooks[i].run(s->daemon, c);
}

/*
 * The end of a connection, in the loop's close phase: outside every caller
 * that may be walking a job's waiters (job_complete, the progress timer, a
 * wait's timeout) or the leases (a lease_break or a device reset telling a
 * holder whose send fails), so that its CONN_CLOSED hooks may unlink and
 * free its waiters here and end its leases (which may free them and let an
 * orphaned ephemeral buffer go).
 */
static void conn_on_closed(uv_handle_t *handle)
{
	struct conn *c = handle->data;
	conn_run_hooks(c, CONN_CLOSED);
	frame_reader_free(&c->reader);
	close(c->fd);
	free(c);
}

/* Gives back what c held against its uid's limits. */
static void conn_release_quota(struct conn *c)
{
	static const struct quota_conn_held none;
	struct gpuq_error ignored;
	quota_conn_hold(c->server->daemon, c, &c->held, &none, &ignored);
}

void conn_close(struct conn *c)
{
	if (c->closed)
		return;
	c->closed = true;
	log_debug("connection %llu (pid %d, uid %d) closed", (unsigned long long)c->serial,
		  (int)c->pid, (int)c->uid);
	parked_close_all(&c->parked);
	conn_release_quota(c);
	conn_run_hooks(c, CONN_CLOSING);
	while (c->out_head) {
		struct outbuf *next = c->out_head->next;
		outbuf_free(c->out_head);
		c->out_head = next;
	}
	c->out_tail = NULL;
	c->out_bytes = 0;
	if (c->prev)
		c->prev->next = c->next;
	else
		c->server->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	uv_poll_stop(&c->poll);
	uv_close((uv_handle_t *)&c->poll, conn_on_closed);
}

/* Sends from o, its descriptor with the first byte (the client takes it with that frame). */
static ssize_t conn_send_some(struct conn *c, struct outbuf *o)
{
	if (o->fd < 0 || o->off > 0)
		return send(c->fd, o->data + o->off, o->len - o->off, MSG_NOSIGNAL);
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} control;
	struct iovec iov = { .iov_base = o->data, .iov_len = o->len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			     .msg_controllen = sizeof control.buf };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &o->fd, sizeof(int));
	ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
	if (n > 0) { /* the client holds its own copy now */
		close(o->fd);
		o->fd = -1;
	}
	return n;
}

/* Writes queued output until the socket would block. */
static void conn_flush(struct conn *c)
{
	while (c->out_head) {
		struct outbuf *o = c->out_head;
		ssize_t n = conn_send_some(c, o);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return;
			log_debug("connection %llu: send: %s", (unsigned long long)c->serial,
				  strerror(errno));
			conn_close(c);
			return;
		}
		o->off += (size_t)n;
		c->out_bytes -= (size_t)n;
		if (o->off == o->len) {
			c->out_head = o->next;
			if (!c->out_head)
				c->out_tail = NULL;
			outbuf_free(o);
		}
	}
}

void conn_close_now(struct conn *c)
{
	conn_flush(c); /* best effort: replies already due */
	conn_close(c);
}

void conn_send(struct conn *c, const void *data, size_t len)
{
	conn_send_fd(c, data, len, -1);
}

/* A copy of fd for a reply to carry (-1 for none); false, with c closed, when none can be made. */
static bool conn_dup_reply_fd(struct conn *c, int fd, int *copy)
{
	*copy = -1;
	if (fd < 0)
		return true;
	*copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (*copy >= 0)
		return true;
	log_error("connection %llu: cannot duplicate a descriptor for a reply (%s); dropping it",
		  (unsigned long long)c->serial, strerror(errno));
	conn_close(c);
	return false;
}

void conn_send_fd(struct conn *c, const void *data, size_t len, int fd)
{
	int copy;
	if (c->closed || !conn_dup_reply_fd(c, fd, &copy))
		return;
	struct outbuf *o = NULL;
	if (c->out_bytes + len > CONN_MAX_OUTPUT)
		log_warn("connection %llu (pid %d) leaves over %u bytes of replies unread; dropping it",
			 (unsigned long long)c->serial, (int)c->pid, CONN_MAX_OUTPUT);
	else if (!(o = malloc(sizeof *o + len)))
		log_error("connection %llu: no memory for a %zu-byte reply; dropping it",
			  (unsigned long long)c->serial, len);
	if (!o) {
		if (copy >= 0)
			close(copy);
		conn_close(c);
		return;
	}
	o->fd = copy;
	o->next = NULL;
	o->len = len;
	o->off = 0;
	memcpy(o->data, data, len);
	if (c->out_tail)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	c->out_bytes += len;
	conn_flush(c);
	if (!c->closed && conn_account_output(c) == 0)
		conn_update_poll(c);
}

void conn_send_reply(struct conn *c, uint64_t id, bool ok, struct mp_map *body, int fd)
{
	msgpack_sbuffer frame;
	mp_put_u64(body, "id", id);
	mp_put_bool(body, "ok", ok);
	msgpack_sbuffer_init(&frame);
	mp_map_frame(body, &frame);
	conn_send_fd(c, frame.data, frame.size, fd);
	msgpack_sbuffer_destroy(&frame);
}

void conn_send_error(struct conn *c, uint64_t id, const struct gpuq_error *err)
{
	struct mp_map body;
	mp_map_init(&body);
	error_render(err, &body);
	conn_send_reply(c, id, false, &body, -1);
}

void conn_close_after_flush(struct conn *c)
{
	if (c->closed)
		return;
	c->close_after_flush = true;
	conn_update_poll(c);
}

void conn_refuse(struct conn *c, uint64_t id, const struct gpuq_error *err)
{
	log_info("connection %llu (pid %d, uid %d): %s: %s", (unsigned long long)c->serial,
		 (int)c->pid, (int)c->uid, gpuq_errc_name(err->code), err->message);
	conn_send_error(c, id, err);
	conn_close_after_flush(c);
}

/* conn_refuse with a message made here. */
static void conn_refusef(struct conn *c, enum gpuq_errc code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void conn_refusef(struct conn *c, enum gpuq_errc code, const char *fmt, ...)
{
	struct gpuq_error err;
	va_list ap;
	va_start(ap, fmt);
	gpuq_vfail(&err, code, fmt, ap);
	va_end(ap);
	conn_refuse(c, 0, &err);
}

int conn_take_fds(struct conn *c, int n, int *out, int *arrived)
{
	return parked_take(&c->parked, c->frame_at, n, out, arrived);
}

/*
 * Records what c's reading holds now (itself, its parked descriptors, its
 * incomplete frame) against its uid's limits; on refusal answers and
 * closes c. Its unread replies are conn_account_output's.
 */
static int conn_account(struct conn *c)
{
	struct gpuq_error err;
	struct quota_conn_held now = c->held;
	now.n[HOLD_CONNECTIONS] = 1;
	now.n[HOLD_PARKED_FDS] = (uint64_t)c->parked.count;
	now.n[HOLD_FRAME_BYTES] = frame_reader_pending(&c->reader);
	if (quota_conn_hold(c->server->daemon, c, &c->held, &now, &err) == 0)
		return 0;
	conn_refuse(c, 0, &err);
	return -1;
}

/*
 * Records the replies c has not read against its uid's reply-bytes limit.
 * A connection that takes the uid over it cannot be told (it does not
 * read): it is dropped, and the log says why. 0, or -1 with c closed.
 */
static int conn_account_output(struct conn *c)
{
	struct gpuq_error err;
	struct quota_conn_held now = c->held;
	now.n[HOLD_REPLY_BYTES] = c->out_bytes;
	if (now.n[HOLD_REPLY_BYTES] == c->held.n[HOLD_REPLY_BYTES] ||
	    quota_conn_hold(c->server->daemon, c, &c->held, &now, &err) == 0)
		return 0;
	log_warn("connection %llu (pid %d, uid %d) leaves its replies unread: %s; dropping it",
		 (unsigned long long)c->serial, (int)c->pid, (int)c->uid, err.message);
	conn_close(c);
	return -1;
}

/* The descriptors of one recvmsg, in order; *truncated when the kernel could not pass them all. */
static int conn_collect_fds(struct msghdr *mh, int *fds, bool *truncated)
{
	int n = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		const int *in = (const int *)CMSG_DATA(cm);
		for (size_t i = 0; i < k; i++) {
			if (n < FDS_PER_RECV)
				fds[n++] = in[i];
			else
				close(in[i]);
		}
	}
	*truncated = (mh->msg_flags & MSG_CTRUNC) != 0;
	return n;
}

/*
 * The descriptors that came with the stream bytes [from, to), parked for
 * the frame that starts among those bytes. A truncated set (the kernel
 * passes fewer than were sent when gpuqd is out of descriptors, or when one
 * message carries more than FDS_PER_RECV) puts the stream out of step: the
 * client is told which of the two happened. 0, or -1 with c refused.
 */
static int conn_keep_fds(struct conn *c, struct msghdr *mh, uint64_t from, uint64_t to)
{
	int fds[FDS_PER_RECV];
	bool truncated;
	int n = conn_collect_fds(mh, fds, &truncated);
	if (truncated) {
		for (int i = 0; i < n; i++)
			close(fds[i]);
		if (server_out_of_descriptors(c->server, "receiving a client's descriptors"))
			conn_refusef(c, GPUQ_E_BUSY,
				     "gpuqd has run out of file descriptors, so the descriptors sent with this request were lost; "
				     "try again later (the operator can raise LimitNOFILE or the connection quotas)");
		else
			conn_refusef(c, GPUQ_E_BAD_FRAME,
				     "more than %d descriptors in one message; a request carries at most %d",
				     FDS_PER_RECV, GPUQ_MAX_FDS_PER_REQUEST);
		return -1;
	}
	if (n == 0)
		return 0;
	if (parked_keep(&c->parked, fds, n, from, to) > 0) {
		conn_refusef(c, GPUQ_E_BAD_FRAME,
			     "more than %d descriptors arrived ahead of the requests that take them; "
			     "the stream is out of step", PARKED_MAX);
		return -1;
	}
	return conn_account(c);
}

/* After a frame ending at `end`: descriptors no request declared put the stream out of step. */
static void conn_drop_stray_fds(struct conn *c, uint64_t end)
{
	int stray = parked_drop_through(&c->parked, end);
	if (stray > 0 && !c->closed)
		conn_refusef(c, GPUQ_E_BAD_FRAME,
			     "%d descriptors arrived with requests that do not declare them (field 'fds'); "
			     "they were closed, and the stream is out of step", stray);
}

static void conn_handle_frames(struct conn *c)
{
	const uint8_t *payload;
	size_t len;
	int rc;
	while (!c->closed && !c->close_after_flush &&
	       (rc = frame_reader_next(&c->reader, &payload, &len)) != 0) {
		if (rc < 0) {
			conn_refusef(c, GPUQ_E_BAD_FRAME,
				     "frame of %zu bytes exceeds this daemon's limit of %zu (--max-frame); closing",
				     len, c->server->max_frame);
			return;
		}
		uint64_t end = c->frame_at + GPUQ_FRAME_HEADER_BYTES + len;
		c->server->on_frame(c->server->daemon, c, payload, len);
		c->frame_at = end;
		conn_drop_stray_fds(c, end);
	}
}

/*
 * After a read: when the incomplete frame now pending began (for
 * --frame-timeout), its bytes against the uid's limit, and the read buffer
 * of a connection with nothing pending cut back to an idle one's.
 */
static void conn_note_partial(struct conn *c)
{
	size_t pending = frame_reader_pending(&c->reader);
	if (pending == 0) {
		c->frame_since = 0;
		if (c->reader.cap > IDLE_BUFFER_MAX)
			frame_reader_free(&c->reader);
	} else if (c->frame_since == 0 || c->partial_at != c->frame_at) {
		c->frame_since = monotonic_seconds();
		c->partial_at = c->frame_at;
	}
	conn_account(c);
}

static void conn_read(struct conn *c)
{
	uint8_t *space = frame_reader_space(&c->reader, READ_CHUNK);
	if (!space) {
		log_error("connection %llu: no memory to read into; dropping it",
			  (unsigned long long)c->serial);
		conn_close(c);
		return;
	}
	union {
		char buf[CMSG_SPACE(sizeof(int) * FDS_PER_RECV)];
		struct cmsghdr align;
	} control;
	struct iovec iov = { .iov_base = space, .iov_len = READ_CHUNK };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = control.buf, .msg_controllen = sizeof control.buf };
	ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0) {
		if (errno != EAGAIN && errno != EINTR)
			conn_close(c);
		return;
	}
	if (conn_keep_fds(c, &mh, c->stream_in, c->stream_in + (uint64_t)n) < 0)
		return;
	if (n == 0) {
		if (frame_reader_pending(&c->reader))
			log_debug("connection %llu closed inside a frame (%zu bytes unread)",
				  (unsigned long long)c->serial, frame_reader_pending(&c->reader));
		conn_close(c);
		return;
	}
	frame_reader_commit(&c->reader, (size_t)n);
	c->stream_in += (uint64_t)n;
	conn_handle_frames(c);
	if (!c->closed && !c->close_after_flush)
		conn_note_partial(c);
}

static void conn_on_poll(uv_poll_t *handle, int status, int events)
{
	struct conn *c = handle->data;
	if (status < 0) {
		conn_close(c);
		return;
	}
	if (events & UV_WRITABLE) {
		conn_flush(c);
		if (!c->closed)
			conn_account_output(c); /* less is never refused */
	}
	if (!c->closed && (events & UV_READABLE) && !c->close_after_flush)
		conn_read(c);
	if (!c->closed)
		conn_update_poll(c);
}

static void conn_update_poll(struct conn *c)
{
	int events = (c->close_after_flush ? 0 : UV_READABLE) | (c->out_head ? UV_WRITABLE : 0);
	if (events == 0) {
		conn_close(c); /* closing, and everything is written */
		return;
	}
	if (events != c->poll_events) {
		uv_poll_start(&c->poll, events, conn_on_poll);
		c->poll_events = events;
	}
}

void conn_check_frame_timeout(struct conn *c, double now, unsigned timeout_ms)
{
	if (c->closed || c->close_after_flush || c->frame_since == 0 || timeout_ms == 0 ||
	    (now - c->frame_since) * 1000 < timeout_ms)
		return;
	conn_refusef(c, GPUQ_E_BAD_FRAME,
		     "an incomplete frame: %zu bytes of it arrived, and no more within %u ms of its first byte "
		     "(--frame-timeout); closing",
		     frame_reader_pending(&c->reader), timeout_ms);
}

/* The peer's credentials and the poll handle; 0, or -1 having logged why. */
static int conn_init(struct conn *c, struct server *s, int fd)
{
	struct ucred cred;
	socklen_t len = sizeof cred;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		log_error("cannot take a new connection: SO_PEERCRED: %s", strerror(errno));
		return -1;
	}
	c->server = s;
	c->fd = fd;
	c->serial = ++s->next_serial;
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->pid = cred.pid;
	frame_reader_init(&c->reader, s->max_frame);
	int rc = uv_poll_init(s->loop, &c->poll, fd);
	if (rc < 0) {
		log_error("cannot take a new connection: uv_poll_init: %s", uv_strerror(rc));
		return -1;
	}
	c->poll.data = c;
	return 0;
}

/* A connection on fd, listed and polled: NULL (fd closed) having logged why not. */
static struct conn *conn_start(struct server *s, int fd)
{
	struct conn *c = calloc(1, sizeof *c);
	if (!c) {
		log_error("cannot take a new connection: out of memory");
		close(fd);
		return NULL;
	}
	if (conn_init(c, s, fd) < 0) {
		close(fd);
		free(c);
		return NULL;
	}
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	log_debug("connection %llu from pid %d (uid %d)", (unsigned long long)c->serial,
		  (int)c->pid, (int)c->uid);
	conn_update_poll(c);
	return c;
}

void conn_open(struct server *s, int fd)
{
	struct conn *c = conn_start(s, fd);
	if (c)
		conn_account(c); /* over the uid's connections limit: refused with a reply */
}

void conn_adopt(struct server *s, int fd, uint64_t serial)
{
	int flags = fcntl(fd, F_GETFD);
	if (flags >= 0)
		fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
	struct conn *c = conn_start(s, fd);
	if (!c)
		return;
	c->serial = serial; /* its ephemeral buffers name it so in the record */
	if (s->next_serial < serial)
		s->next_serial = serial;
	conn_account(c);
}
