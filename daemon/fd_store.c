/*
 * The service manager's descriptor store (fd_store.h). Each notification
 * is one datagram to $NOTIFY_SOCKET of "FDSTORE=1\nFDNAME=NAME" with the
 * descriptor in an SCM_RIGHTS control message, or "FDSTOREREMOVE=1\n
 * FDNAME=NAME" without one. The service manager ignores a descriptor of a
 * file it already holds, and FDSTOREREMOVE removes every descriptor of the
 * name.
 *
 * Why slabs are stored from the heap, on the thread that makes or gives
 * back the slab (workers/buffer/slab.h's keeper), rather than by the main
 * thread from the buffer table: a descriptor number is only safe to send
 * while its owner holds it open; the main thread learns of a slab after
 * the worker made it and of its end after the worker closed it, and by
 * then the number may name a client's connection.
 */
#include "daemon/fd_store.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "workers/log.h"

/* A notification that the service manager does not take in this long fails (logged), never hangs a worker. */
#define FD_STORE_SEND_TIMEOUT_S 1

static void fd_store_hold_slab(void *ctx, const char *owner, uint32_t slab, int fd)
{
	char name[FD_STORE_NAME_MAX];
	fd_store_slab_name(owner, slab, name, sizeof name);
	fd_store_add(ctx, name, fd);
}

static void fd_store_release_slab(void *ctx, const char *owner, uint32_t slab)
{
	struct fd_store *s = ctx;
	char name[FD_STORE_NAME_MAX];
	if (atomic_load(&s->keep))
		return;
	fd_store_slab_name(owner, slab, name, sizeof name);
	fd_store_remove(s, name);
}

/*
 * The old name is removed first, then the slab stored under its own: the
 * service manager ignores a descriptor of a file it holds already (under
 * any name), so the other order would leave it under none. Between the two
 * datagrams only this process holds the slab; an add that fails is logged
 * and counted as any, and the record still names the buffer.
 */
static void fd_store_rename_slab(void *ctx, const char *held_as, const char *owner, uint32_t slab,
				 int fd)
{
	char name[FD_STORE_NAME_MAX];
	fd_store_slab_name(owner, slab, name, sizeof name);
	if (strcmp(name, held_as) == 0)
		return;
	fd_store_remove(ctx, held_as);
	fd_store_add(ctx, name, fd);
}

/* $FDSTORE, as systemd 254 and later set it from FileDescriptorStoreMax=: 0 when unset or malformed. */
static unsigned fd_store_size_from_env(void)
{
	const char *v = getenv("FDSTORE");
	char *end;
	if (!v || !*v)
		return 0;
	unsigned long n = strtoul(v, &end, 10);
	return *end || n > 1u << 30 ? 0 : (unsigned)n;
}

static int fd_store_socket(struct fd_store *s, const char *path)
{
	struct timeval tv = { FD_STORE_SEND_TIMEOUT_S, 0 };
	if ((path[0] != '/' && path[0] != '@') || strlen(path) >= sizeof s->path) {
		snprintf(s->why, sizeof s->why, "not used: NOTIFY_SOCKET='%.60s' is not a socket gpuqd "
			 "can use; a crash loses every buffer", path);
		return -1;
	}
	s->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s->fd < 0 || setsockopt(s->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
		snprintf(s->why, sizeof s->why, "not used: its notify socket: %s; a crash loses every "
			 "buffer", strerror(errno));
		if (s->fd >= 0)
			close(s->fd);
		s->fd = -1;
		return -1;
	}
	snprintf(s->path, sizeof s->path, "%s", path);
	return 0;
}

int fd_store_open(struct fd_store *s, enum fd_store_mode mode)
{
	const char *path = getenv("NOTIFY_SOCKET");
	memset(s, 0, sizeof *s);
	pthread_mutex_init(&s->log_lock, NULL);
	s->fd = -1;
	s->max = fd_store_size_from_env();
	if (mode == FD_STORE_OFF) {
		snprintf(s->why, sizeof s->why, "off (--fd-store off): a crash loses every buffer");
		return 0;
	}
	if (mode == FD_STORE_AUTO && s->max == 0) {
		snprintf(s->why, sizeof s->why, "not used: the service manager keeps no descriptors "
			 "($FDSTORE unset: FileDescriptorStoreMax=); a crash loses every buffer");
		return 0;
	}
	if (!path || !*path) {
		snprintf(s->why, sizeof s->why, "not used: no service manager ($NOTIFY_SOCKET unset); "
			 "a crash loses every buffer");
		return mode == FD_STORE_ON ? -1 : 0;
	}
	if (fd_store_socket(s, path) != 0)
		return -1;
	if (s->max)
		snprintf(s->why, sizeof s->why, "used: the service manager keeps up to %u descriptors",
			 s->max);
	else
		snprintf(s->why, sizeof s->why, "used (--fd-store on; $FDSTORE unset: its size unknown)");
	s->keeper = (struct slab_keeper){ .hold = fd_store_hold_slab,
					  .release = fd_store_release_slab,
					  .rename = fd_store_rename_slab,
					  .ctx = s };
	return 0;
}

bool fd_store_enabled(const struct fd_store *s)
{
	return s->fd >= 0;
}

/* Sends text, with fd in SCM_RIGHTS when fd >= 0: 0, or -1 with errno. */
static int fd_store_send(const struct fd_store *s, const char *text, int fd)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len = strlen(s->path);
	memcpy(sa.sun_path, s->path, len);
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = '\0'; /* abstract: the length, not a NUL, ends the name */
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} control;
	struct iovec iov = { (void *)text, strlen(text) };
	struct msghdr msg = { .msg_name = &sa,
			      .msg_namelen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len +
							 (s->path[0] == '@' ? 0 : 1)),
			      .msg_iov = &iov, .msg_iovlen = 1 };
	if (fd >= 0) {
		memset(&control, 0, sizeof control);
		msg.msg_control = control.buf;
		msg.msg_controllen = sizeof control.buf;
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof fd);
	}
	ssize_t sent;
	do
		sent = sendmsg(s->fd, &msg, MSG_NOSIGNAL);
	while (sent < 0 && errno == EINTR);
	return sent < 0 ? -1 : 0;
}

/* A notification that failed: counted, logged at most every 10 s (from any thread). */
static int fd_store_failed(struct fd_store *s, const char *what, const char *name)
{
	unsigned held;
	int e = errno;
	atomic_fetch_add(&s->failures, 1);
	pthread_mutex_lock(&s->log_lock); /* a log_every is one thread's at a time */
	bool pass = log_every_pass(&s->every, 10, &held);
	pthread_mutex_unlock(&s->log_lock);
	if (pass)
		log_error("the service manager's descriptor store: %s '%s' failed: %s; the state record "
			  "still names it, but a crash now loses it (%u more such failures)", what, name,
			  strerror(e), held);
	return -1;
}

int fd_store_add(struct fd_store *s, const char *name, int fd)
{
	char text[320];
	if (s->fd < 0)
		return 0;
	snprintf(text, sizeof text, "FDSTORE=1\nFDNAME=%s", name);
	if (fd_store_send(s, text, fd) != 0)
		return fd_store_failed(s, "storing", name);
	atomic_fetch_add(&s->stored, 1);
	unsigned held = atomic_fetch_add(&s->held, 1) + 1;
	if (s->max && held > s->max && !atomic_exchange(&s->warned_full, true))
		log_warn("the service manager's descriptor store keeps %u descriptors "
			 "(FileDescriptorStoreMax=), and gpuqd now holds %u: it drops the newest, whose "
			 "buffers a crash would lose; raise FileDescriptorStoreMax=", s->max, held);
	return 0;
}

int fd_store_remove(struct fd_store *s, const char *name)
{
	char text[320];
	if (s->fd < 0)
		return 0;
	snprintf(text, sizeof text, "FDSTOREREMOVE=1\nFDNAME=%s", name);
	if (fd_store_send(s, text, -1) != 0)
		return fd_store_failed(s, "removing", name);
	atomic_fetch_add(&s->removed, 1);
	unsigned held = atomic_load(&s->held);
	while (held > 0 && !atomic_compare_exchange_weak(&s->held, &held, held - 1))
		;
	return 0;
}

void fd_store_keep(struct fd_store *s)
{
	atomic_store(&s->keep, true);
}

unsigned fd_store_over_limit(struct fd_store *s)
{
	unsigned held = atomic_load(&s->held);
	return s->fd >= 0 && s->max && held > s->max ? held - s->max : 0;
}

void fd_store_count_held(struct fd_store *s, unsigned n)
{
	atomic_fetch_add(&s->held, n);
}

void fd_store_slab_name(const char *owner, uint32_t id, char *buf, size_t n)
{
	snprintf(buf, n, FD_STORE_SLAB_PREFIX "%s-%u", owner, id);
}

void fd_store_slab_name_of_index(int device, uint32_t id, char *buf, size_t n)
{
	snprintf(buf, n, FD_STORE_SLAB_PREFIX "%d-%u", device, id);
}

/* What systemd takes in a name (fdname_is_valid): printable ASCII, no ':'; and no '-' at either end. */
static bool fd_store_owner_ok(const char *owner, size_t len)
{
	if (len == 0 || owner[0] == '-' || owner[len - 1] == '-')
		return false;
	for (size_t i = 0; i < len; i++)
		if (owner[i] <= ' ' || owner[i] > '~' || owner[i] == ':')
			return false;
	return true;
}

int fd_store_parse_slab(const char *name, char *owner, size_t n, uint32_t *id)
{
	size_t plen = strlen(FD_STORE_SLAB_PREFIX);
	const char *dash = strrchr(name, '-'), *p;
	char *end;
	if (strncmp(name, FD_STORE_SLAB_PREFIX, plen) != 0 || dash < name + plen)
		return 0;
	size_t len = (size_t)(dash - (name + plen));
	if (!fd_store_owner_ok(name + plen, len) || len >= n)
		return 0;
	p = dash + 1;
	if (*p < '0' || *p > '9')
		return 0;
	unsigned long long v = strtoull(p, &end, 10);
	if (*end || v == 0 || v > UINT32_MAX)
		return 0;
	memcpy(owner, name + plen, len);
	owner[len] = '\0';
	*id = (uint32_t)v;
	return 1;
}

void fd_store_close(struct fd_store *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
}
