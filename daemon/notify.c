/*
 * sd_notify's protocol (systemd's sd_notify(3)): each notification is one
 * datagram of newline-separated VARIABLE=value assignments sent to the
 * AF_UNIX socket named by $NOTIFY_SOCKET, a path or, with a leading '@',
 * a name in the abstract namespace. $WATCHDOG_USEC asks for WATCHDOG=1 at
 * least that often, when $WATCHDOG_PID is unset or names this process.
 * Main thread only.
 */
#include "daemon/notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

bool notify_enabled(const struct notify *n)
{
	return n->fd >= 0;
}

/* WATCHDOG_USEC, if it is meant for this process; 0 otherwise. */
static uint64_t read_watchdog(char *msg, size_t msgsize)
{
	const char *usec = getenv("WATCHDOG_USEC");
	const char *pid = getenv("WATCHDOG_PID");
	char *end;
	if (!usec || !*usec)
		return 0;
	if (pid && *pid && strtol(pid, &end, 10) != (long)getpid())
		return 0;
	unsigned long long v = strtoull(usec, &end, 10);
	if (*end || v == 0) {
		snprintf(msg, msgsize, "WATCHDOG_USEC='%s' is not a positive number; no watchdog",
			 usec);
		return 0;
	}
	return v;
}

int notify_open(struct notify *n, char *msg, size_t msgsize)
{
	memset(n, 0, sizeof *n);
	n->fd = -1;
	msg[0] = '\0';
	const char *path = getenv("NOTIFY_SOCKET");
	if (!path || !*path)
		return 0;
	if ((path[0] != '/' && path[0] != '@') || strlen(path) >= sizeof n->path) {
		snprintf(msg, msgsize,
			 "NOTIFY_SOCKET='%s' is neither an absolute path nor an @abstract name of at most %zu bytes; not notifying",
			 path, sizeof n->path - 1);
		return -1;
	}
	n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (n->fd < 0) {
		snprintf(msg, msgsize, "socket for NOTIFY_SOCKET: %s", strerror(errno));
		return -1;
	}
	snprintf(n->path, sizeof n->path, "%s", path);
	n->watchdog_usec = read_watchdog(msg, msgsize);
	return msg[0] ? -1 : 0;
}

void notify_close(struct notify *n)
{
	if (n->fd >= 0)
		close(n->fd);
	n->fd = -1;
}

int notify_send(const struct notify *n, const char *state)
{
	if (n->fd < 0)
		return 0;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len = strlen(n->path);
	memcpy(sa.sun_path, n->path, len);
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = '\0'; /* abstract: the length, not a NUL, ends the name */
	socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len +
				      (n->path[0] == '@' ? 0 : 1));
	ssize_t sent;
	do
		sent = sendto(n->fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
	while (sent < 0 && errno == EINTR);
	return sent < 0 ? -1 : 0;
}
