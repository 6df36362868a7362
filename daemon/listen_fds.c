/*
 * sd_listen_fds' protocol (systemd's sd_listen_fds(3)): the service manager
 * passes listening sockets as descriptors 3, 4, ... and says so with
 * LISTEN_PID (the process meant) and LISTEN_FDS (how many); LISTEN_FDNAMES
 * may name them. gpuqd serves one socket, so it takes exactly one.
 */
#include "daemon/listen_fds.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void unset_listen_env(void)
{
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
}

/* 0 if fd is a listening AF_UNIX stream socket; -1 with msg otherwise. */
static int check_listener(int fd, char *msg, size_t msgsize)
{
	int type = 0, listening = 0;
	socklen_t len = sizeof type;
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof ss;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &sslen) < 0) {
		snprintf(msg, msgsize, "descriptor %d passed by the service manager: %s", fd,
			 strerror(errno));
		return -1;
	}
	len = sizeof listening;
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0)
		listening = 0;
	if (ss.ss_family != AF_UNIX || type != SOCK_STREAM || !listening) {
		snprintf(msg, msgsize,
			 "descriptor %d passed by the service manager is not a listening AF_UNIX stream socket "
			 "(gpuqd.socket needs ListenStream=PATH and Accept=no)",
			 fd);
		return -1;
	}
	return 0;
}

int listen_fds_take(char *msg, size_t msgsize)
{
	const char *pid = getenv("LISTEN_PID");
	const char *fds = getenv("LISTEN_FDS");
	char *end;
	msg[0] = '\0';
	if (!pid || !fds)
		return -1;
	long p = strtol(pid, &end, 10);
	if (*end || p != (long)getpid())
		return -1; /* meant for another process (our parent's, say) */
	long n = strtol(fds, &end, 10);
	unset_listen_env();
	if (*end || n <= 0)
		return -1;
	if (n != 1) {
		snprintf(msg, msgsize,
			 "the service manager passed %ld sockets; gpuqd serves exactly one (one ListenStream= in gpuqd.socket)",
			 n);
		return -2;
	}
	int fd = LISTEN_FDS_START;
	if (check_listener(fd, msg, msgsize) < 0)
		return -2;
	int flags = fcntl(fd, F_GETFD);
	if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0) {
		snprintf(msg, msgsize, "descriptor %d: fcntl: %s", fd, strerror(errno));
		return -2;
	}
	return fd;
}
