/*
 * sd_listen_fds' protocol (systemd's sd_listen_fds_with_names(3)): the
 * service manager passes descriptors as 3, 4, ... and says so with
 * LISTEN_PID (the process meant), LISTEN_FDS (how many) and
 * LISTEN_FDNAMES (their names, colon-separated). It passes a socket unit's
 * sockets first, then what the service's descriptor store holds
 * (FDSTORE=1 with FDNAME=, daemon/fd_store.h). gpuqd serves one socket.
 */
#include "daemon/listen_fds.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/fd_store.h"
#include "workers/log.h"

static void unset_listen_env(void)
{
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
}

/* Whether fd is a socket (anything else passed is a stored descriptor). */
static bool is_socket(int fd)
{
	int type = 0;
	socklen_t len = sizeof type;
	return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0;
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

/* The i-th name of LISTEN_FDNAMES into out ("" when there are fewer names). */
static void nth_name(const char *names, long i, char *out, size_t size)
{
	const char *p = names ? names : "";
	for (long k = 0; k < i && p; k++) {
		p = strchr(p, ':');
		p = p ? p + 1 : NULL;
	}
	size_t n = p ? strcspn(p, ":") : 0;
	if (n >= size)
		n = size - 1;
	memcpy(out, p ? p : "", n);
	out[n] = '\0';
}

static int add_slab(struct listen_fds *l, const char *owner, uint32_t id, int fd)
{
	struct listen_slab *grown = realloc(l->slabs, (l->nslabs + 1) * sizeof *grown);
	if (!grown)
		return -1;
	l->slabs = grown;
	struct listen_slab *slab = &l->slabs[l->nslabs++];
	*slab = (struct listen_slab){ .id = id, .fd = fd };
	snprintf(slab->owner, sizeof slab->owner, "%s", owner);
	return 0;
}

/* Sorts one passed descriptor, fd, named name: kept in l, or closed. -1 with l->error. */
static int sort_one(struct listen_fds *l, int fd, const char *name)
{
	char owner[SLAB_OWNER_MAX];
	uint32_t id;
	if (is_socket(fd)) {
		if (l->listen_fd >= 0) {
			snprintf(l->error, sizeof l->error,
				 "the service manager passed several sockets (descriptors %d and %d); "
				 "gpuqd serves exactly one (one ListenStream= in gpuqd.socket)", l->listen_fd, fd);
			return -1;
		}
		if (check_listener(fd, l->error, sizeof l->error) < 0)
			return -1;
		l->listen_fd = fd;
	} else if (strcmp(name, FD_STORE_RECORD) == 0 && l->record_fd < 0) {
		l->record_fd = fd;
	} else if (fd_store_parse_slab(name, owner, sizeof owner, &id)) {
		if (add_slab(l, owner, id, fd) != 0) {
			snprintf(l->error, sizeof l->error, "no memory to list the stored slabs");
			return -1;
		}
	} else {
		log_warn("descriptor %d passed by the service manager ('%s') is none of gpuqd's; closed",
			 fd, name[0] ? name : "unnamed");
		l->others++;
		close(fd);
		return 0;
	}
	if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		snprintf(l->error, sizeof l->error, "descriptor %d passed by the service manager: "
			 "fcntl: %s", fd, strerror(errno));
		return -1;
	}
	return 0;
}

int listen_fds_collect(struct listen_fds *l)
{
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	const char *names = getenv("LISTEN_FDNAMES");
	char *end, name[256];
	memset(l, 0, sizeof *l);
	l->listen_fd = l->record_fd = -1;
	if (!pid || !fds)
		return 0;
	long p = strtol(pid, &end, 10);
	if (*end || p != (long)getpid())
		return 0; /* meant for another process (our parent's, say) */
	long n = strtol(fds, &end, 10);
	if (*end || n <= 0 || n > 1 << 20) {
		unset_listen_env();
		return 0;
	}
	int rc = 0;
	for (long i = 0; i < n; i++) {
		nth_name(names, i, name, sizeof name);
		if (rc == 0)
			rc = sort_one(l, LISTEN_FDS_START + (int)i, name);
		else
			close(LISTEN_FDS_START + (int)i); /* refused: gpuqd does not start */
	}
	unset_listen_env();
	return rc;
}

int listen_fds_take(struct listen_fds *l)
{
	int fd = l->listen_fd;
	l->listen_fd = -1;
	return fd;
}

void listen_fds_free(struct listen_fds *l)
{
	if (l->listen_fd >= 0)
		close(l->listen_fd);
	if (l->record_fd >= 0)
		close(l->record_fd);
	for (size_t i = 0; i < l->nslabs; i++)
		if (l->slabs[i].fd >= 0)
			close(l->slabs[i].fd);
	free(l->slabs);
	memset(l, 0, sizeof *l);
	l->listen_fd = l->record_fd = -1;
}
