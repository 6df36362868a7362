/*
 * The listening socket: binding or adopting it, accepting (and backing off
 * at the descriptor limit instead of spinning), the timer that enforces
 * --frame-timeout over every connection, and closing them all. Main thread
 * only; each connection's own life is conn.c's.
 */
#include "daemon/server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"

#define ACCEPT_PAUSE_MS 100 /* at the descriptor limit: how long to stop accepting */
#define FD_LOG_EVERY_S 10.0 /* at most one line about it per this many seconds */
/* Incomplete frames are checked for --frame-timeout every eighth of it, 10 ms to a second. */
#define SCAN_MIN_MS 10
#define SCAN_MAX_MS 1000

/* How many connections are open, and the uid that holds the most of them. */
static unsigned server_census(const struct server *s, uid_t *top_uid, unsigned *top)
{
	unsigned total = 0;
	*top = 0;
	*top_uid = 0;
	for (const struct conn *c = s->conns; c; c = c->next) {
		total++;
		unsigned mine = 0;
		for (const struct conn *o = s->conns; o && *top < total; o = o->next)
			mine += o->uid == c->uid;
		if (mine > *top) {
			*top = mine;
			*top_uid = c->uid;
		}
	}
	return total;
}

/*
 * Logs, at most once per FD_LOG_EVERY_S, that gpuqd is at a descriptor
 * limit, naming the real cause: how many connections hold descriptors, and
 * whose are the most.
 */
static void server_log_fd_limit(struct server *s, const char *doing, int error)
{
	unsigned held, top;
	uid_t top_uid;
	if (!log_every_pass(&s->fd_log, FD_LOG_EVERY_S, &held))
		return;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		rl.rlim_cur = 0; /* unknown: the line says 0 */
	unsigned conns = server_census(s, &top_uid, &top);
	log_warn("%s: %s: %s (RLIMIT_NOFILE %llu); %u client connections are open, %u of them uid %d's. "
		 "Not accepting for %d ms at a time (%u more times since the last such line); raise "
		 "LimitNOFILE, or bound each user's connections with the quota `connections`",
		 doing, strerror(error),
		 error == ENFILE ? "the system's file table is full" : "gpuqd is at its descriptor limit",
		 (unsigned long long)rl.rlim_cur, conns, top, (int)top_uid, ACCEPT_PAUSE_MS, held);
}

bool server_out_of_descriptors(struct server *s, const char *doing)
{
	int probe = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 0);
	if (probe >= 0) {
		close(probe);
		return false;
	}
	if (errno != EMFILE && errno != ENFILE)
		return false;
	server_log_fd_limit(s, doing, errno);
	return true;
}

static void server_on_listen(uv_poll_t *handle, int status, int events);

static void server_on_accept_timer(uv_timer_t *timer)
{
	struct server *s = timer->data;
	if (!s->listening)
		return;
	int rc = uv_poll_start(&s->listen_poll, UV_READABLE, server_on_listen);
	if (rc < 0)
		log_error("cannot accept connections again: uv_poll_start: %s", uv_strerror(rc));
}

/*
 * Out of descriptors (or kernel memory): accepting again at once would spin,
 * since the backlog stays readable. Stop polling the socket for a moment;
 * clients wait in the backlog meanwhile, and are served once descriptors
 * are free again.
 */
static void server_pause_accepting(struct server *s, int error)
{
	server_log_fd_limit(s, "accept", error);
	int rc = uv_timer_start(&s->accept_timer, server_on_accept_timer, ACCEPT_PAUSE_MS, 0);
	if (rc < 0) /* without the timer nothing would restart it: keep polling instead */
		log_error("cannot pause accepting: uv_timer_start: %s", uv_strerror(rc));
	else
		uv_poll_stop(&s->listen_poll);
}

/*
 * The one reply a client gets when gpuqd has no descriptor to serve it:
 * `busy`, id 0, as docs/protocol.md says. Best effort: a fresh socket has
 * room for it, and the client's first read finds it.
 */
static void server_send_busy(int fd, const char *why)
{
	struct mp_map body, e;
	msgpack_sbuffer frame;
	mp_map_init(&body);
	mp_map_init(&e);
	mp_put_str(&e, "code", gpuq_errc_name(GPUQ_E_BUSY));
	mp_put_str(&e, "message", why);
	mp_put_map(&body, "error", &e);
	mp_put_u64(&body, "id", 0);
	mp_put_bool(&body, "ok", false);
	msgpack_sbuffer_init(&frame);
	mp_map_frame(&body, &frame);
	ssize_t n = send(fd, frame.data, frame.size, MSG_NOSIGNAL | MSG_DONTWAIT);
	(void)n; /* a client that cannot take it is gone or full: it is closed all the same */
	msgpack_sbuffer_destroy(&frame);
}

/*
 * At the descriptor limit: gives up the reserve descriptor to accept each
 * client waiting in the backlog and refuse it at once, then takes the
 * reserve back. false when there was no reserve to give up (or it could
 * not be taken back), and the caller must pause instead.
 */
static bool server_refuse_backlog(struct server *s, int error)
{
	if (s->reserve_fd < 0)
		return false;
	char why[256];
	struct rlimit rl;
	uid_t top_uid;
	unsigned top;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		rl.rlim_cur = 0;
	snprintf(why, sizeof why,
		 "gpuqd is at its descriptor limit (%s; RLIMIT_NOFILE %llu) with %u client connections "
		 "open: try again later",
		 error == ENFILE ? "the system's file table is full" : "every one is in use",
		 (unsigned long long)rl.rlim_cur, server_census(s, &top_uid, &top));
	server_log_fd_limit(s, "accept (clients refused with busy)", error);
	close(s->reserve_fd);
	for (;;) {
		int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0 && errno == EINTR)
			continue;
		if (fd < 0)
			break;
		server_send_busy(fd, why);
		close(fd);
	}
	s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return s->reserve_fd >= 0;
}

static void server_on_listen(uv_poll_t *handle, int status, int events)
{
	(void)events;
	struct server *s = handle->data;
	unsigned held;
	if (status < 0) {
		if (log_every_pass(&s->accept_log, FD_LOG_EVERY_S, &held))
			log_error("listening socket: %s (%u more since the last such line)",
				  uv_strerror(status), held);
		return;
	}
	for (;;) {
		int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			conn_open(s, fd);
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if ((errno == EMFILE || errno == ENFILE) && server_refuse_backlog(s, errno))
			return;
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
			server_pause_accepting(s, errno);
			return;
		}
		if (errno != EAGAIN && log_every_pass(&s->accept_log, FD_LOG_EVERY_S, &held))
			log_warn("accept: %s (%u more since the last such line)", strerror(errno), held);
		return;
	}
}

/* How often to scan, so that a frame is closed at most an eighth of its timeout late. */
static uint64_t scan_interval_ms(unsigned frame_timeout_ms)
{
	uint64_t ms = frame_timeout_ms ? frame_timeout_ms / 8 : SCAN_MAX_MS;
	return ms < SCAN_MIN_MS ? SCAN_MIN_MS : ms > SCAN_MAX_MS ? SCAN_MAX_MS : ms;
}

/*
 * Closes connections whose incomplete frame has waited past --frame-timeout,
 * and follows a reload of it from the next scan on.
 */
static void server_on_scan(uv_timer_t *timer)
{
	struct server *s = timer->data;
	unsigned timeout_ms = s->daemon->opt.frame_timeout_ms;
	double now = monotonic_seconds();
	for (struct conn *c = s->conns, *next; c; c = next) {
		next = c->next;
		conn_check_frame_timeout(c, now, timeout_ms);
	}
	uv_timer_set_repeat(timer, scan_interval_ms(timeout_ms));
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
	s->reserve_fd = -1;
}

/*
 * Polls the listening fd and starts the timers (accept back-off, frame
 * scan); on failure closes fd.
 */
static int server_start_accepting(struct server *s, int fd, char *msg, size_t msgsize)
{
	int rc = uv_poll_init(s->loop, &s->listen_poll, fd);
	if (rc < 0) {
		snprintf(msg, msgsize, "uv_poll on %s: %s", s->path, uv_strerror(rc));
		close(fd);
		if (!s->adopted)
			unlink(s->path);
		return -1;
	}
	s->listen_poll.data = s;
	s->listen_fd = fd;
	s->listening = true;
	s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if ((rc = uv_timer_init(s->loop, &s->accept_timer)) < 0) {
		snprintf(msg, msgsize, "uv_timer_init: %s", uv_strerror(rc));
		server_stop_listening(s);
		return -1;
	}
	if ((rc = uv_timer_init(s->loop, &s->scan_timer)) < 0) {
		snprintf(msg, msgsize, "uv_timer_init: %s", uv_strerror(rc));
		uv_close((uv_handle_t *)&s->accept_timer, NULL);
		server_stop_listening(s);
		return -1;
	}
	s->accept_timer.data = s->scan_timer.data = s;
	s->timers = true;
	uint64_t scan_every = scan_interval_ms(s->daemon->opt.frame_timeout_ms);
	rc = uv_poll_start(&s->listen_poll, UV_READABLE, server_on_listen);
	if (rc == 0)
		rc = uv_timer_start(&s->scan_timer, server_on_scan, scan_every, scan_every);
	if (rc < 0) {
		snprintf(msg, msgsize, "uv_poll on %s: %s", s->path, uv_strerror(rc));
		server_stop_listening(s);
		return -1;
	}
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
	return server_start_accepting(s, fd, msg, msgsize); /* removes the socket file on failure */
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
	if (s->reserve_fd >= 0)
		close(s->reserve_fd);
	s->reserve_fd = -1;
}

void server_stop_listening(struct server *s)
{
	if (!s->listening)
		return;
	s->listening = false;
	uv_poll_stop(&s->listen_poll);
	if (s->timers)
		uv_timer_stop(&s->accept_timer);
	uv_close((uv_handle_t *)&s->listen_poll, server_on_listen_closed);
	if (!s->adopted && unlink(s->path) < 0 && errno != ENOENT)
		log_warn("cannot remove %s: %s", s->path, strerror(errno));
}

struct conn *server_conn_of_serial(struct server *s, uint64_t serial)
{
	for (struct conn *c = s->conns; c; c = c->next)
		if (c->serial == serial && !c->closed)
			return c;
	return NULL;
}

void server_close_all(struct server *s)
{
	while (s->conns)
		conn_close_now(s->conns);
	if (s->timers) {
		s->timers = false;
		uv_close((uv_handle_t *)&s->accept_timer, NULL);
		uv_close((uv_handle_t *)&s->scan_timer, NULL);
	}
}
