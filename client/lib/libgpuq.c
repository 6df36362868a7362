/*
 * libgpuq: one connection to gpuqd per gpuq_client.
 *
 * A client is used by one thread at a time; nothing here is shared between
 * clients except gpuq_default_socket's string, which is computed once.
 *
 * Replies may come back out of order (the daemon answers in the order it
 * finishes), so a reply read while waiting for another id is parked on the
 * client's pending list and handed out by a later gpuq_recv or gpuq_call.
 * Every reply owns a private copy of its frame: the frame reader's buffer is
 * reused by the next read, and a decoded msgpack object points into the
 * bytes it was decoded from.
 */
#include "client/lib/gpuq.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "protocol/frame.h"

/* Replies can list every buffer and job the daemon holds: be generous. */
static const struct msg_limits reply_limits = {
	.max_depth = 8,
	.max_container = 1u << 20,
	.max_total_objects = 1u << 22,
	.max_str = 16u << 20,
};

#define DEFAULT_MAX_REPLY_FRAME (64u << 20)
#define RECV_CHUNK (64u << 10)
/* Far more than a request may carry, so tests can send too many on purpose. */
#define MAX_SEND_FDS 16
/* Descriptors held between their arrival and their reply's decoding. */
#define RECV_MAX_FDS 16

/* A reply with the bytes it was decoded from and its pending-list link. */
struct reply_box {
	struct gpuq_reply pub; /* first: gpuq_reply_free converts back */
	uint8_t *bytes;
	struct reply_box *next;
};

struct gpuq_client {
	int fd;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	uint64_t next_id;
	struct frame_reader rd;
	struct reply_box *pending_head, *pending_tail;
	gpuq_event_fn event_fn;
	void *event_arg;
	unsigned timeout_ms;
	/* gpuq_request_begin remembers its map so gpuq_send knows the id cheaply. */
	const struct mp_map *begun_req;
	uint64_t begun_id;
	/* Once the stream is out of step every call fails with this error. */
	bool broken;
	struct gpuq_error broken_err;
	/*
	 * The connection ended (EOF, EPIPE, ECONNRESET) rather than going out of
	 * step; with reconnect_ms, gpuq_call connects again within that window.
	 */
	bool lost;
	unsigned reconnect_ms, reconnects;
	/*
	 * The gpuqd of the latest reconnect took the one that went away over
	 * (its ping counts recoveries), so that job ids name the same jobs.
	 */
	bool took_over;
	char begun_op[24];
	/* Descriptors received and not yet claimed by the reply frame they came with. */
	int rfds[RECV_MAX_FDS];
	int nrfds;
};

static pthread_once_t default_socket_once = PTHREAD_ONCE_INIT;
static char default_socket_path[PATH_MAX];

static void default_socket_init(void)
{
	const char *env = getenv("GPUQ_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char own[PATH_MAX];
	struct stat st;

	if (env && *env) {
		snprintf(default_socket_path, sizeof(default_socket_path), "%s", env);
		return;
	}
	snprintf(default_socket_path, sizeof(default_socket_path), "/run/gpuq/gpuqd.sock");
	if (geteuid() == 0 || !xdg || !*xdg)
		return;
	/* Others: their own daemon's socket if it exists, else the system service's. */
	snprintf(own, sizeof(own), "%s/gpuq.sock", xdg);
	if (stat(own, &st) == 0 || stat(default_socket_path, &st) < 0)
		snprintf(default_socket_path, sizeof(default_socket_path), "%s", own);
}

const char *gpuq_default_socket(void)
{
	pthread_once(&default_socket_once, default_socket_init);
	return default_socket_path;
}

/* The hint that follows a failed connect: what the user can do about it. */
static const char *connect_hint(int e)
{
	switch (e) {
	case ENOENT:
	case ECONNREFUSED:
		return " (is gpuqd running? set --socket or GPUQ_SOCKET)";
	case EACCES:
	case EPERM:
		return " (the socket's permissions do not let this user in)";
	default:
		return "";
	}
}

/* A connected socket to path (which fits sun_path), or -1 with errno. */
static int open_socket(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

int gpuq_connect(const char *path, struct gpuq_client **out, struct gpuq_error *err)
{
	struct sockaddr_un sa;
	struct gpuq_client *c;
	int e;

	*out = NULL;
	if (!path)
		path = gpuq_default_socket();
	if (strlen(path) >= sizeof(sa.sun_path))
		return gpuq_fail(err, GPUQ_E_IO,
				 "cannot connect to gpuqd at %s: the path is longer than "
				 "the %zu bytes a UNIX socket address holds",
				 path, sizeof(sa.sun_path) - 1);
	c = calloc(1, sizeof(*c));
	if (!c)
		return gpuq_fail(err, GPUQ_E_IO, "cannot connect to gpuqd at %s: %s",
				 path, strerror(ENOMEM));
	c->fd = open_socket(path);
	if (c->fd < 0)
		goto fail_errno;
	snprintf(c->path, sizeof(c->path), "%s", path);
	c->next_id = 1;
	frame_reader_init(&c->rd, DEFAULT_MAX_REPLY_FRAME);
	*out = c;
	return 0;

fail_errno:
	e = errno;
	free(c);
	return gpuq_fail(err, GPUQ_E_IO, "cannot connect to gpuqd at %s: %s%s", path,
			 strerror(e), connect_hint(e));
}

void gpuq_close(struct gpuq_client *c)
{
	struct reply_box *b, *next;

	if (!c)
		return;
	for (b = c->pending_head; b; b = next) {
		next = b->next;
		gpuq_reply_free(&b->pub);
	}
	for (int i = 0; i < c->nrfds; i++)
		close(c->rfds[i]);
	frame_reader_free(&c->rd);
	close(c->fd);
	free(c);
}

int gpuq_fd(const struct gpuq_client *c)
{
	return c->fd;
}

void gpuq_set_event_handler(struct gpuq_client *c, gpuq_event_fn fn, void *arg)
{
	c->event_fn = fn;
	c->event_arg = arg;
}

void gpuq_set_max_frame(struct gpuq_client *c, size_t max_frame)
{
	c->rd.max_frame = max_frame;
}

void gpuq_set_timeout(struct gpuq_client *c, unsigned timeout_ms)
{
	c->timeout_ms = timeout_ms;
}

unsigned gpuq_get_timeout(const struct gpuq_client *c)
{
	return c->timeout_ms;
}

uint64_t gpuq_request_begin(struct gpuq_client *c, struct mp_map *req, const char *op)
{
	uint64_t id = c->next_id++;

	mp_map_init(req);
	mp_put_u64(req, "v", GPUQ_PROTOCOL_VERSION);
	mp_put_u64(req, "id", id);
	mp_put_str(req, "op", op);
	c->begun_req = req;
	c->begun_id = id;
	snprintf(c->begun_op, sizeof c->begun_op, "%s", op);
	return id;
}

/*
 * Marks the stream as unusable: later calls repeat err instead of guessing.
 * The public entry points give the static functions a non-NULL err.
 */
static int client_break(struct gpuq_client *c, struct gpuq_error *err)
{
	c->broken = true;
	c->broken_err = *err;
	return -1;
}

static int client_check(struct gpuq_client *c, struct gpuq_error *err)
{
	if (!c->broken)
		return 0;
	*err = c->broken_err;
	return -1;
}

/* Space for the SCM_RIGHTS message that carries a request's descriptors. */
union fd_control {
	struct cmsghdr align;
	char buf[CMSG_SPACE(sizeof(int) * MAX_SEND_FDS)];
};

static void attach_fds(struct msghdr *mh, union fd_control *ctl, const int *fds, int nfds)
{
	struct cmsghdr *cm;

	memset(ctl, 0, sizeof(*ctl));
	mh->msg_control = ctl->buf;
	mh->msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
	cm = CMSG_FIRSTHDR(mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
	memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
}

/*
 * Writes all of data[0..len), attaching fds to the first sendmsg that moves
 * a byte: the daemon takes descriptors in arrival order, with the first byte
 * of the frame they belong to. (A sendmsg interrupted before moving a byte
 * moved no descriptor either, so the retry carries them again.)
 */
static int read_some(struct gpuq_client *c, int64_t deadline, struct gpuq_error *err);
static int decode_reply(struct gpuq_client *c, const uint8_t *payload, size_t len,
			struct reply_box **out, struct gpuq_error *err);
static int64_t now_ms(void);

/*
 * A send failed because gpuqd closed the connection. It may have said why
 * first (a connection it refused: over a quota, or out of descriptors), and
 * those bytes are still there to read: 0 with err set from that refusal, or
 * -1 when there is none.
 */
static int refusal_waiting(struct gpuq_client *c, struct gpuq_error *err)
{
	const uint8_t *payload;
	size_t len;
	struct reply_box *b;
	struct gpuq_error ignored;

	while (frame_reader_next(&c->rd, &payload, &len) == 0)
		if (read_some(c, now_ms(), &ignored) < 0)
			return -1;
	if (decode_reply(c, payload, len, &b, &ignored) < 0)
		return -1;
	int rc = b->pub.ok ? -1 : 0;
	if (rc == 0)
		gpuq_reply_error(&b->pub, err);
	gpuq_reply_free(&b->pub);
	return rc;
}

/*
 * The descriptors a request carries must be open: sendmsg would refuse them
 * (EBADF) only once the frame is on its way, and a connection whose frame
 * went out without them is out of step for good.
 */
static int check_fds(const int *fds, int nfds, struct gpuq_error *err)
{
	if (nfds > 0 && !fds)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "%d descriptors to send, but fds is NULL",
				 nfds);
	for (int i = 0; i < nfds; i++) {
		if (fcntl(fds[i], F_GETFD) < 0)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "descriptor %d (number %d of the request's %d) cannot be sent: %s",
					 fds[i], i + 1, nfds, strerror(errno));
	}
	return 0;
}

static int send_all(struct gpuq_client *c, const uint8_t *data, size_t len,
		    const int *fds, int nfds, struct gpuq_error *err)
{
	union fd_control ctl;
	size_t off = 0;

	if (nfds < 0 || nfds > MAX_SEND_FDS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "cannot send %d descriptors with one request (at most %d)",
				 nfds, MAX_SEND_FDS);
	if (check_fds(fds, nfds, err) < 0)
		return -1;
	while (off < len) {
		struct iovec iov = { (void *)(data + off), len - off };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (off == 0 && nfds > 0)
			attach_fds(&mh, &ctl, fds, nfds);
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int error = errno;
			bool gone = error == EPIPE || error == ECONNRESET, refused = false;
			if (!gone || !(refused = refusal_waiting(c, err) == 0))
				gpuq_fail(err, GPUQ_E_IO, "lost the connection to gpuqd at %s: %s",
					  c->path, strerror(error));
			/*
			 * Nothing of this frame left, and gpuqd gave no reason (a refusal
			 * would only come again): it may go again on a new connection.
			 */
			c->lost = gone && off == 0 && !refused;
			return client_break(c, err);
		}
		off += (size_t)n;
	}
	return 0;
}

/* The id of a request map that gpuq_request_begin did not start (or reused). */
static uint64_t frame_request_id(const msgpack_sbuffer *sb)
{
	struct gpuq_error ignored;
	struct msg m;
	uint64_t id = 0;

	if (sb->size <= GPUQ_FRAME_HEADER_BYTES)
		return 0;
	if (msg_decode(&m, sb->data + GPUQ_FRAME_HEADER_BYTES,
		       sb->size - GPUQ_FRAME_HEADER_BYTES, &reply_limits, &ignored) < 0)
		return 0;
	if (msg_get_u64(m.root, "id", &id, &ignored) != 1)
		id = 0;
	msg_free(&m);
	return id;
}

/* Frames req, sends it with fds and returns its id in *id (0 if it has none). */
static int send_request(struct gpuq_client *c, struct mp_map *req, const int *fds,
			int nfds, uint64_t *id, struct gpuq_error *err)
{
	bool begun = req == c->begun_req;
	msgpack_sbuffer sb;
	int rc;

	c->begun_req = NULL;
	if (client_check(c, err) < 0) {
		mp_map_destroy(req);
		return -1;
	}
	msgpack_sbuffer_init(&sb);
	mp_map_frame(req, &sb);
	*id = begun ? c->begun_id : frame_request_id(&sb);
	rc = send_all(c, (const uint8_t *)sb.data, sb.size, fds, nfds, err);
	msgpack_sbuffer_destroy(&sb);
	return rc;
}

int gpuq_send(struct gpuq_client *c, struct mp_map *req, const int *fds, int nfds,
	      struct gpuq_error *err)
{
	struct gpuq_error local;
	uint64_t id;

	if (!err)
		err = &local;
	return send_request(c, req, fds, nfds, &id, err);
}

int gpuq_send_raw(struct gpuq_client *c, const void *data, size_t len,
		  struct gpuq_error *err)
{
	struct gpuq_error local;

	if (!err)
		err = &local;
	if (client_check(c, err) < 0)
		return -1;
	return send_all(c, data, len, NULL, 0, err);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * Waits until the socket is readable or the deadline (-1: none) passes.
 * A timeout leaves the stream in step: a late reply is read by the next call.
 */
static int wait_readable(struct gpuq_client *c, int64_t deadline, struct gpuq_error *err)
{
	struct pollfd p = { .fd = c->fd, .events = POLLIN };
	int n;

	if (deadline < 0)
		return 0;
	for (;;) {
		int64_t left = deadline - now_ms();

		n = poll(&p, 1, left > 0 ? (int)(left > INT_MAX ? INT_MAX : left) : 0);
		if (n > 0)
			return 0;
		if (n == 0)
			return gpuq_fail(err, GPUQ_E_TIMEOUT,
					 "no reply from gpuqd at %s within %u ms",
					 c->path, c->timeout_ms);
		if (errno != EINTR)
			return gpuq_fail(err, GPUQ_E_IO, "cannot wait for gpuqd at %s: %s",
					 c->path, strerror(errno));
	}
}

/*
 * recv that keeps the descriptors a reply brings (SCM_RIGHTS, with its
 * frame's first byte), in arrival order, for the reply to claim when it is
 * decoded. Descriptors beyond what the client holds are closed: the reply
 * that claims them then finds fewer than it says.
 */
static ssize_t recv_with_fds(struct gpuq_client *c, void *space, size_t len)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * GPUQ_REPLY_MAX_FDS)];
		struct cmsghdr align;
	} control;
	struct iovec iov = { space, len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			     .msg_controllen = sizeof control.buf };
	ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return n;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int fds[GPUQ_REPLY_MAX_FDS];
		memcpy(fds, CMSG_DATA(cm), k * sizeof(int));
		for (size_t i = 0; i < k; i++) {
			if (c->nrfds < RECV_MAX_FDS)
				c->rfds[c->nrfds++] = fds[i];
			else
				close(fds[i]);
		}
	}
	return n;
}

/* A decoded reply claims the descriptors its `fds` key says came with it. */
static int claim_fds(struct gpuq_client *c, struct reply_box *b, struct gpuq_error *err)
{
	uint64_t want = 0;
	struct gpuq_error ignored;

	for (int i = 0; i < GPUQ_REPLY_MAX_FDS; i++)
		b->pub.fds[i] = -1;
	if (msg_get_u64(b->pub.root, "fds", &want, &ignored) != 1 || want == 0)
		return 0;
	if (want > GPUQ_REPLY_MAX_FDS || want > (uint64_t)c->nrfds) {
		gpuq_fail(err, GPUQ_E_IO,
			  "gpuqd at %s sent a reply with %llu descriptors but %d arrived with it",
			  c->path, (unsigned long long)want, c->nrfds);
		return client_break(c, err);
	}
	b->pub.nfds = (int)want;
	memcpy(b->pub.fds, c->rfds, sizeof(int) * (size_t)want);
	memmove(c->rfds, c->rfds + want, sizeof(int) * (size_t)(c->nrfds - (int)want));
	c->nrfds -= (int)want;
	return 0;
}

/* Reads from the socket into the frame reader; 0, or -1 with err. */
static int read_some(struct gpuq_client *c, int64_t deadline, struct gpuq_error *err)
{
	uint8_t *space;
	ssize_t n;

	if (wait_readable(c, deadline, err) < 0)
		return -1;
	space = frame_reader_space(&c->rd, RECV_CHUNK);
	if (!space)
		return gpuq_fail(err, GPUQ_E_IO, "reading from gpuqd at %s: %s", c->path,
				 strerror(ENOMEM));
	do
		n = recv_with_fds(c, space, RECV_CHUNK);
	while (n < 0 && errno == EINTR);
	if (n > 0) {
		frame_reader_commit(&c->rd, (size_t)n);
		return 0;
	}
	int error = n < 0 ? errno : 0;
	if (n == 0 && frame_reader_pending(&c->rd) > 0)
		gpuq_fail(err, GPUQ_E_IO,
			  "gpuqd at %s closed the connection in the middle of a reply "
			  "(%zu bytes of it arrived)",
			  c->path, frame_reader_pending(&c->rd));
	else if (n == 0)
		gpuq_fail(err, GPUQ_E_IO, "gpuqd at %s closed the connection", c->path);
	else
		gpuq_fail(err, GPUQ_E_IO, "lost the connection to gpuqd at %s: %s",
			  c->path, strerror(error));
	c->lost = n == 0 || error == ECONNRESET;
	return client_break(c, err);
}

/* Takes the next frame as a reply box owning a copy of its bytes. */
static int decode_reply(struct gpuq_client *c, const uint8_t *payload, size_t len,
			struct reply_box **out, struct gpuq_error *err)
{
	struct reply_box *b = calloc(1, sizeof(*b));
	struct gpuq_error derr;

	if (!b || !(b->bytes = malloc(len ? len : 1))) {
		free(b);
		return gpuq_fail(err, GPUQ_E_IO, "reading from gpuqd at %s: %s", c->path,
				 strerror(ENOMEM));
	}
	memcpy(b->bytes, payload, len);
	if (msg_decode(&b->pub.msg, b->bytes, len, &reply_limits, &derr) < 0) {
		free(b->bytes);
		free(b);
		gpuq_fail(err, GPUQ_E_IO, "gpuqd at %s sent a reply that cannot be read: %s",
			  c->path, derr.message);
		return client_break(c, err);
	}
	b->pub.root = b->pub.msg.root;
	if (msg_get_u64(b->pub.root, "id", &b->pub.id, &derr) != 1)
		b->pub.id = 0;
	if (msg_get_bool(b->pub.root, "ok", &b->pub.ok, &derr) != 1)
		b->pub.ok = false;
	if (claim_fds(c, b, err) < 0) {
		gpuq_reply_free(&b->pub);
		return -1;
	}
	*out = b;
	return 0;
}

/* Reads until one whole frame is in and returns it decoded. */
static int read_reply(struct gpuq_client *c, int64_t deadline, struct reply_box **out,
		      struct gpuq_error *err)
{
	const uint8_t *payload;
	size_t len;
	int rc;

	while ((rc = frame_reader_next(&c->rd, &payload, &len)) == 0)
		if (read_some(c, deadline, err) < 0)
			return -1;
	if (rc < 0) {
		gpuq_fail(err, GPUQ_E_IO,
			  "gpuqd at %s sent a %zu-byte reply, more than this client "
			  "accepts (%zu; see gpuq_set_max_frame)",
			  c->path, len, c->rd.max_frame);
		return client_break(c, err);
	}
	return decode_reply(c, payload, len, out, err);
}

/* Removes and returns the first parked reply for id (0: any), or NULL. */
static struct reply_box *pending_take(struct gpuq_client *c, uint64_t id)
{
	struct reply_box **pp, *prev = NULL;

	for (pp = &c->pending_head; *pp; prev = *pp, pp = &(*pp)->next) {
		struct reply_box *b = *pp;

		if (id != 0 && b->pub.id != id)
			continue;
		*pp = b->next;
		if (c->pending_tail == b)
			c->pending_tail = prev;
		b->next = NULL;
		return b;
	}
	return NULL;
}

static void pending_park(struct gpuq_client *c, struct reply_box *b)
{
	b->next = NULL;
	if (c->pending_tail)
		c->pending_tail->next = b;
	else
		c->pending_head = b;
	c->pending_tail = b;
}

/*
 * A reply with id 0 answers a request the daemon could not read (a bad
 * frame, after which it closes the connection); it is given to whoever is
 * waiting, since it most likely concerns their request.
 */
int gpuq_recv(struct gpuq_client *c, uint64_t id, struct gpuq_reply **reply,
	      struct gpuq_error *err)
{
	int64_t deadline = c->timeout_ms ? now_ms() + c->timeout_ms : -1;
	struct reply_box *b = pending_take(c, id);
	struct gpuq_error local;

	if (!err)
		err = &local;
	*reply = NULL;
	while (!b) {
		if (client_check(c, err) < 0 || read_reply(c, deadline, &b, err) < 0)
			return -1;
		if (msg_map_get(b->pub.root, "event")) {
			if (c->event_fn)
				c->event_fn(b->pub.root, c->event_arg);
			gpuq_reply_free(&b->pub);
			b = NULL;
		} else if (id != 0 && b->pub.id != id && b->pub.id != 0) {
			pending_park(c, b);
			b = NULL;
		}
	}
	*reply = &b->pub;
	return 0;
}

void gpuq_set_reconnect(struct gpuq_client *c, unsigned window_ms)
{
	c->reconnect_ms = window_ms;
}

unsigned gpuq_reconnects(const struct gpuq_client *c)
{
	return c->reconnects;
}

/*
 * Requests that read and change nothing, sent again on a new connection
 * when the old one ended with them in flight. Jobs never are: one may have
 * run (or be running) in the gpuqd that went away.
 */
static bool retry_safe(const char *op)
{
	static const char *const safe[] = { "ping",  "devices", "buffers", "jobs",
					    "status", "wait",   "stats",   "quota",
					    "metrics", "regions", "leases" };
	for (size_t i = 0; i < sizeof safe / sizeof safe[0]; i++)
		if (strcmp(op, safe[i]) == 0)
			return true;
	return false;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/*
 * Opens a new connection to the same socket in place of the lost one. The
 * replies parked for the old connection stay; what was half read of it
 * goes. 0, or -1 when no gpuqd listens there (yet).
 */
static int reconnect_once(struct gpuq_client *c)
{
	int fd = open_socket(c->path);
	if (fd < 0)
		return -1;
	close(c->fd);
	c->fd = fd;
	for (int i = 0; i < c->nrfds; i++)
		close(c->rfds[i]);
	c->nrfds = 0;
	frame_reader_free(&c->rd);
	frame_reader_init(&c->rd, c->rd.max_frame);
	c->broken = c->lost = false;
	return 0;
}

/*
 * Whether the new connection is served: a ping answered. A gpuqd that owns
 * its socket and is still dying may take a connection and then close it,
 * so a connection only counts once it answered (the ping is never retried
 * itself: reconnect_ms is off for it).
 */
static bool reconnect_answered(struct gpuq_client *c)
{
	struct mp_map req;
	struct gpuq_reply *r = NULL;
	struct gpuq_error err;
	unsigned window = c->reconnect_ms;
	c->reconnect_ms = 0;
	gpuq_request_begin(c, &req, "ping");
	int rc = gpuq_call(c, &req, NULL, 0, &r, &err);
	c->reconnect_ms = window;
	bool ok = rc == 0 && gpuq_reply_ok(r);
	const msgpack_object *recoveries = ok ? gpuq_reply_get(r, "recoveries") : NULL;
	c->took_over = recoveries && recoveries->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
		       recoveries->via.u64 > 0;
	gpuq_reply_free(r);
	return ok;
}

/* wait and status name a job by its id: a read, but of one gpuqd's jobs. */
static bool names_a_job(const char *op)
{
	return strcmp(op, "wait") == 0 || strcmp(op, "status") == 0;
}

/*
 * Connects again to the same socket, trying for up to reconnect_ms (a gpuqd
 * restarting under systemd takes a moment to listen again) until a
 * connection answers a ping. 0, or -1 leaving err as the lost connection's.
 */
static int reconnect(struct gpuq_client *c)
{
	int64_t deadline = now_ms() + c->reconnect_ms;
	unsigned pause = 10;
	while (reconnect_once(c) < 0 || !reconnect_answered(c)) {
		if (now_ms() >= deadline)
			return -1;
		sleep_ms(pause);
		pause = pause < 200 ? pause * 2 : 200;
	}
	c->reconnects++;
	return 0;
}

/* Sends the framed request and reads its reply; *sent says whether it left. */
static int call_once(struct gpuq_client *c, const msgpack_sbuffer *sb, uint64_t id,
		     const int *fds, int nfds, bool *sent, struct gpuq_reply **reply,
		     struct gpuq_error *err)
{
	*sent = false;
	if (client_check(c, err) < 0 ||
	    send_all(c, (const uint8_t *)sb->data, sb->size, fds, nfds, err) < 0)
		return -1;
	*sent = true;
	return gpuq_recv(c, id, reply, err);
}

int gpuq_call(struct gpuq_client *c, struct mp_map *req, const int *fds, int nfds,
	      struct gpuq_reply **reply, struct gpuq_error *err)
{
	struct gpuq_error local;
	bool begun = req == c->begun_req, sent;
	char op[sizeof c->begun_op];
	msgpack_sbuffer sb;
	int rc;

	if (!err)
		err = &local;
	*reply = NULL;
	snprintf(op, sizeof op, "%s", begun ? c->begun_op : "");
	c->begun_req = NULL;
	msgpack_sbuffer_init(&sb);
	mp_map_frame(req, &sb);
	uint64_t id = begun ? c->begun_id : frame_request_id(&sb);
	/* Once for a request that never left, once more for one safe to repeat. */
	for (int tries = 0;; tries++) {
		rc = call_once(c, &sb, id, fds, nfds, &sent, reply, err);
		if (rc == 0 || !c->lost || !c->reconnect_ms || tries == 2)
			break;
		bool again = !sent || (retry_safe(op) && nfds == 0);
		if (reconnect(c) < 0)
			break;
		if (!again) {
			gpuq_fail(err, GPUQ_E_IO,
				  "gpuqd at %s went away with request %llu (%s) in flight and a "
				  "gpuqd answers there again; it is not sent again, as it may have "
				  "run (gpuq jobs shows what did)",
				  c->path, (unsigned long long)id, op[0] ? op : "?");
			break;
		}
		if (sent && names_a_job(op) && !c->took_over) {
			gpuq_fail(err, GPUQ_E_IO,
				  "gpuqd at %s went away with a %s in flight, and the gpuqd that "
				  "answers there now was started afresh (it took nothing over): the "
				  "job went with the old one, and the %s is not asked again, as the "
				  "new gpuqd numbers its own jobs from 1 and may have one of that id",
				  c->path, op, op);
			break;
		}
	}
	msgpack_sbuffer_destroy(&sb);
	return rc;
}

bool gpuq_reply_ok(const struct gpuq_reply *r)
{
	return r && r->ok;
}

/* Copies a string field of map into out (truncating), or "" when absent. */
static void copy_str_field(const msgpack_object *map, const char *key, char *out,
			   size_t outsz)
{
	const msgpack_object *o = msg_map_get(map, key);

	if (o && o->type == MSGPACK_OBJECT_STR)
		snprintf(out, outsz, "%.*s", (int)o->via.str.size, o->via.str.ptr);
	else
		out[0] = '\0';
}

void gpuq_reply_error(const struct gpuq_reply *r, struct gpuq_error *err)
{
	const msgpack_object *e;
	char code[64];

	gpuq_error_clear(err);
	if (gpuq_reply_ok(r))
		return;
	e = msg_map_get(r->root, "error");
	if (!e || e->type != MSGPACK_OBJECT_MAP) {
		gpuq_fail(err, GPUQ_E_INTERNAL,
			  "gpuqd replied ok=false without an error map (reply id %llu)",
			  (unsigned long long)r->id);
		return;
	}
	copy_str_field(e, "code", code, sizeof(code));
	err->code = gpuq_errc_from_name(code, strlen(code));
	copy_str_field(e, "message", err->message, sizeof(err->message));
}

const msgpack_object *gpuq_reply_get(const struct gpuq_reply *r, const char *key)
{
	return msg_map_get(r->root, key);
}

int gpuq_reply_take_fd(struct gpuq_reply *r, int i)
{
	int fd;

	if (!r || i < 0 || i >= r->nfds)
		return -1;
	fd = r->fds[i];
	r->fds[i] = -1;
	return fd;
}

void gpuq_reply_free(struct gpuq_reply *r)
{
	struct reply_box *b = (struct reply_box *)r;

	if (!b)
		return;
	for (int i = 0; i < b->pub.nfds; i++)
		if (b->pub.fds[i] >= 0)
			close(b->pub.fds[i]);
	msg_free(&b->pub.msg);
	free(b->bytes);
	free(b);
}
