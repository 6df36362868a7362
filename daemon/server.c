/*
 * The listening socket and client connections. Main thread only.
 *
 * A connection is freed only from its poll handle's close callback, so a
 * struct conn stays valid for the rest of the loop iteration in which it was
 * closed: request handlers may close the connection they are answering, and
 * a send that fails (the peer is gone) closes it without freeing anything
 * that the code which sent may still be walking (see conn_destroy).
 */
#include "daemon/server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/log.h"

#define READ_CHUNK (64u * 1024u)
#define FDS_PER_RECV 16

struct outbuf {
	struct outbuf *next;
	size_t len, off;
	uint8_t data[];
};

static void conn_update_poll(struct conn *c);

/*
 * The end of a connection, in the loop's close phase: outside every caller
 * that may be walking a job's waiters (job_complete, the progress timer, a
 * wait's timeout), so its waiters can be unlinked and freed here.
 */
static void conn_on_closed(uv_handle_t *handle)
{
	struct conn *c = handle->data;
	waiters_drop_conn(c);
	for (int i = 0; i < c->nfds; i++)
		close(c->fds[i]);
	c->nfds = 0;
	frame_reader_free(&c->reader);
	close(c->fd);
	free(c);
}

/*
 * Closes c, deferred and idempotent: from here on nothing is read from or
 * sent to it (conn_send drops what it is given), and the struct stays valid
 * until conn_on_closed has detached its waiters. Any handler, send or timer
 * may call it, however deep in a walk over jobs and waiters it is.
 */
static void conn_destroy(struct conn *c)
{
	if (c->closed)
		return;
	c->closed = true;
	log_debug("connection %llu (pid %d, uid %d) closed", (unsigned long long)c->serial,
		  (int)c->pid, (int)c->uid);
	while (c->out_head) {
		struct outbuf *next = c->out_head->next;
		free(c->out_head);
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

/* Writes queued output until the socket would block. */
static void conn_flush(struct conn *c)
{
	while (c->out_head) {
		struct outbuf *o = c->out_head;
		ssize_t n = send(c->fd, o->data + o->off, o->len - o->off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return;
			log_debug("connection %llu: send: %s", (unsigned long long)c->serial,
				  strerror(errno));
			conn_destroy(c);
			return;
		}
		o->off += (size_t)n;
		c->out_bytes -= (size_t)n;
		if (o->off == o->len) {
			c->out_head = o->next;
			if (!c->out_head)
				c->out_tail = NULL;
			free(o);
		}
	}
}

void conn_send(struct conn *c, const void *data, size_t len)
{
	if (c->closed)
		return;
	if (c->out_bytes + len > CONN_MAX_OUTPUT) {
		log_warn("connection %llu (pid %d) leaves over %u bytes of replies unread; dropping it",
			 (unsigned long long)c->serial, (int)c->pid, CONN_MAX_OUTPUT);
		conn_destroy(c);
		return;
	}
	struct outbuf *o = malloc(sizeof *o + len);
	if (!o) {
		log_error("connection %llu: no memory for a %zu-byte reply; dropping it",
			  (unsigned long long)c->serial, len);
		conn_destroy(c);
		return;
	}
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
	if (!c->closed)
		conn_update_poll(c);
}

void conn_close_after_flush(struct conn *c)
{
	if (c->closed)
		return;
	c->close_after_flush = true;
	conn_update_poll(c);
}

int conn_take_fds(struct conn *c, int n, int *out)
{
	if (n > c->nfds)
		return -1;
	memcpy(out, c->fds, sizeof(int) * (size_t)n);
	memmove(c->fds, c->fds + n, sizeof(int) * (size_t)(c->nfds - n));
	c->nfds -= n;
	return 0;
}

/* Keeps descriptors from SCM_RIGHTS; false if the client sent more than we hold. */
static bool conn_keep_fds(struct conn *c, struct msghdr *mh)
{
	bool ok = true;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int *fds = (int *)CMSG_DATA(cm);
		for (size_t i = 0; i < n; i++) {
			if (c->nfds < CONN_MAX_PENDING_FDS) {
				c->fds[c->nfds++] = fds[i];
			} else {
				close(fds[i]);
				ok = false;
			}
		}
	}
	return ok && !(mh->msg_flags & MSG_CTRUNC);
}

static void conn_handle_frames(struct conn *c)
{
	const uint8_t *payload;
	size_t len;
	int rc;
	while (!c->closed && !c->close_after_flush &&
	       (rc = frame_reader_next(&c->reader, &payload, &len)) != 0) {
		if (rc < 0) {
			request_refuse_oversize(c, len, c->server->max_frame);
			return;
		}
		request_handle(c->server->daemon, c, payload, len);
	}
}

static void conn_read(struct conn *c)
{
	uint8_t *space = frame_reader_space(&c->reader, READ_CHUNK);
	if (!space) {
		log_error("connection %llu: no memory to read into; dropping it",
			  (unsigned long long)c->serial);
		conn_destroy(c);
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
			conn_destroy(c);
		return;
	}
	if (!conn_keep_fds(c, &mh)) {
		log_warn("connection %llu (pid %d) sent more descriptors than requests use; dropping it",
			 (unsigned long long)c->serial, (int)c->pid);
		conn_destroy(c);
		return;
	}
	if (n == 0) {
		if (frame_reader_pending(&c->reader))
			log_debug("connection %llu closed inside a frame (%zu bytes unread)",
				  (unsigned long long)c->serial, frame_reader_pending(&c->reader));
		conn_destroy(c);
		return;
	}
	frame_reader_commit(&c->reader, (size_t)n);
	conn_handle_frames(c);
}

static void conn_on_poll(uv_poll_t *handle, int status, int events)
{
	struct conn *c = handle->data;
	if (status < 0) {
		conn_destroy(c);
		return;
	}
	if (events & UV_WRITABLE)
		conn_flush(c);
	if (!c->closed && (events & UV_READABLE) && !c->close_after_flush)
		conn_read(c);
	if (!c->closed)
		conn_update_poll(c);
}

static void conn_update_poll(struct conn *c)
{
	int events = (c->close_after_flush ? 0 : UV_READABLE) | (c->out_head ? UV_WRITABLE : 0);
	if (events == 0) {
		conn_destroy(c); /* closing, and everything is written */
		return;
	}
	if (events != c->poll_events) {
		uv_poll_start(&c->poll, events, conn_on_poll);
		c->poll_events = events;
	}
}

static void server_accept_one(struct server *s, int fd)
{
	struct conn *c = calloc(1, sizeof *c);
	struct ucred cred;
	socklen_t len = sizeof cred;
	if (!c || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		log_error("cannot take a new connection: %s", c ? strerror(errno) : "out of memory");
		free(c);
		close(fd);
		return;
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
		log_error("uv_poll_init for a new connection: %s", uv_strerror(rc));
		close(fd);
		free(c);
		return;
	}
	c->poll.data = c;
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	log_debug("connection %llu from pid %d (uid %d)", (unsigned long long)c->serial,
		  (int)c->pid, (int)c->uid);
	conn_update_poll(c);
}

static void server_on_listen(uv_poll_t *handle, int status, int events)
{
	(void)events;
	struct server *s = handle->data;
	if (status < 0) {
		log_error("listening socket: %s", uv_strerror(status));
		return;
	}
	for (;;) {
		int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			server_accept_one(s, fd);
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if (errno != EAGAIN)
			log_warn("accept: %s", strerror(errno));
		return;
	}
}

/* 0 if nothing lives at path (a stale socket is removed); -1 otherwise. */
static int clear_stale_socket(const char *path, char *msg, size_t msgsize)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : (snprintf(msg, msgsize, "%s: %s", path, strerror(errno)), -1);
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(msg, msgsize, "%s exists and is not a socket; refusing to replace it", path);
		return -1;
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	int live = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
	if (fd >= 0)
		close(fd);
	if (live) {
		snprintf(msg, msgsize, "another gpuqd is already serving %s", path);
		return -1;
	}
	if (unlink(path) < 0 && errno != ENOENT) {
		snprintf(msg, msgsize, "cannot remove the stale socket %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

static int socket_set_group(const char *path, const char *group, char *msg, size_t msgsize)
{
	struct group *g = getgrnam(group);
	if (!g) {
		snprintf(msg, msgsize, "--socket-group: no group named '%s'", group);
		return -1;
	}
	if (chown(path, (uid_t)-1, g->gr_gid) < 0) {
		snprintf(msg, msgsize, "chown %s to group %s: %s", path, group, strerror(errno));
		return -1;
	}
	return 0;
}

static int bind_socket(const char *path, const char *group, char *msg, size_t msgsize)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(msg, msgsize, "socket: %s", strerror(errno));
		return -1;
	}
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	/* The umask keeps the socket from ever being wider than 0660. */
	mode_t old = umask(0117);
	int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
	umask(old);
	if (rc < 0 || chmod(path, 0660) < 0 || (group[0] && socket_set_group(path, group, msg, msgsize) < 0) ||
	    listen(fd, 256) < 0) {
		if (!msg[0])
			snprintf(msg, msgsize, "cannot serve %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

static void server_init(struct server *s, struct daemon *d, uv_loop_t *loop, size_t max_frame,
			char *msg)
{
	memset(s, 0, sizeof *s);
	msg[0] = '\0';
	s->daemon = d;
	s->loop = loop;
	s->max_frame = max_frame;
	s->listen_fd = -1;
}

/* Polls the listening fd; on failure closes it. */
static int server_start_accepting(struct server *s, int fd, char *msg, size_t msgsize)
{
	int rc = uv_poll_init(s->loop, &s->listen_poll, fd);
	if (rc == 0)
		rc = uv_poll_start(&s->listen_poll, UV_READABLE, server_on_listen);
	if (rc < 0) {
		snprintf(msg, msgsize, "uv_poll on %s: %s", s->path, uv_strerror(rc));
		close(fd);
		return -1;
	}
	s->listen_poll.data = s;
	s->listen_fd = fd;
	s->listening = true;
	return 0;
}

int server_listen(struct server *s, struct daemon *d, uv_loop_t *loop, const char *path,
		  const char *group, size_t max_frame, char *msg, size_t msgsize)
{
	server_init(s, d, loop, max_frame, msg);
	snprintf(s->path, sizeof s->path, "%s", path);
	if (clear_stale_socket(path, msg, msgsize) < 0)
		return -1;
	int fd = bind_socket(path, group, msg, msgsize);
	if (fd < 0)
		return -1;
	if (server_start_accepting(s, fd, msg, msgsize) < 0) {
		unlink(path);
		return -1;
	}
	return 0;
}

int server_adopt(struct server *s, struct daemon *d, uv_loop_t *loop, int fd,
		 size_t max_frame, char *msg, size_t msgsize)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof sa;
	server_init(s, d, loop, max_frame, msg);
	s->adopted = true;
	if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sun_path[0])
		snprintf(s->path, sizeof s->path, "%s", sa.sun_path);
	else
		snprintf(s->path, sizeof s->path, "(socket %d from the service manager)", fd);
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		snprintf(msg, msgsize, "%s: fcntl: %s", s->path, strerror(errno));
		close(fd);
		return -1;
	}
	return server_start_accepting(s, fd, msg, msgsize);
}

static void server_on_listen_closed(uv_handle_t *handle)
{
	struct server *s = handle->data;
	close(s->listen_fd);
	s->listen_fd = -1;
}

void server_stop_listening(struct server *s)
{
	if (!s->listening)
		return;
	s->listening = false;
	uv_poll_stop(&s->listen_poll);
	uv_close((uv_handle_t *)&s->listen_poll, server_on_listen_closed);
	if (!s->adopted && unlink(s->path) < 0 && errno != ENOENT)
		log_warn("cannot remove %s: %s", s->path, strerror(errno));
}

void server_close_all(struct server *s)
{
	while (s->conns) {
		struct conn *c = s->conns;
		conn_flush(c); /* best effort: replies already due */
		conn_destroy(c);
	}
}
