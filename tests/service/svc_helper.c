/*
 * Stand-ins for the service manager's side of the protocols gpuqd speaks,
 * for tests/service.sh (no systemd runs as init in CI):
 *
 *   svc-helper notify-listen ADDR OUT
 *       Binds a datagram socket at ADDR (a path, or @NAME in the abstract
 *       namespace) and appends each notification to OUT as one line:
 *       milliseconds since start, then its assignments joined by " | ".
 *       Runs until SIGTERM.
 *
 *   svc-helper supervise SOCKET RESTARTS DELAY_MS -- COMMAND...
 *       Socket activation with restarts, as systemd does with a .socket
 *       unit and Restart=: holds a listening socket at SOCKET, runs COMMAND
 *       with it as descriptor 3 (LISTEN_FDS=1, LISTEN_PID), and when COMMAND
 *       exits runs it again after DELAY_MS, up to RESTARTS times, keeping the
 *       socket, so that clients connecting in between wait in its backlog.
 *       SIGTERM is passed on to COMMAND; then it exits.
 *
 *   svc-helper supervise-store SOCKET RESTARTS DELAY_MS MAX LOG -- COMMAND...
 *       As supervise, and also the service manager's notify socket with a
 *       descriptor store as systemd keeps one (FileDescriptorStoreMax=MAX):
 *       COMMAND gets NOTIFY_SOCKET (a path beside SOCKET) and FDSTORE=MAX;
 *       FDSTORE=1 with FDNAME= keeps the descriptors sent (one of a file
 *       already kept, same st_dev and st_ino, is ignored; past MAX they are
 *       closed), FDSTOREREMOVE=1 drops every descriptor of that name. Each
 *       start passes the listening socket as descriptor 3, then the kept
 *       descriptors in the order they were kept (LISTEN_FDS, LISTEN_FDNAMES,
 *       LISTEN_PID). Each notification is a line of LOG as notify-listen
 *       writes it, then " [N fds]" when it carried some, "[ignored: ...]"
 *       for descriptors not kept; each start, "start: N stored".
 *
 *   svc-helper notify-send ADDR TEXT [FILE]
 *       Sends TEXT ("\n" in it a newline) to the notify socket at ADDR as
 *       one datagram, with FILE opened read-write in SCM_RIGHTS if given:
 *       what a service would hand the store.
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t terminated;

static void on_term(int sig)
{
	(void)sig;
	terminated = 1;
}

static void catch_term(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_term; /* no SA_RESTART: blocking calls return EINTR */
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
}

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static socklen_t unix_address(const char *addr, struct sockaddr_un *sa)
{
	size_t len = strlen(addr);
	memset(sa, 0, sizeof *sa);
	sa->sun_family = AF_UNIX;
	if (len >= sizeof sa->sun_path) {
		fprintf(stderr, "svc-helper: address too long: %s\n", addr);
		exit(2);
	}
	memcpy(sa->sun_path, addr, len);
	if (addr[0] == '@') {
		sa->sun_path[0] = '\0';
		return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
	}
	unlink(addr);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
}

static int notify_listen(const char *addr, const char *out_path)
{
	struct sockaddr_un sa;
	socklen_t salen = unix_address(addr, &sa);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	FILE *out = fopen(out_path, "a");
	if (fd < 0 || !out || bind(fd, (struct sockaddr *)&sa, salen) < 0) {
		fprintf(stderr, "svc-helper: notify-listen %s: %s\n", addr, strerror(errno));
		return 1;
	}
	catch_term();
	double start = now_ms();
	char buf[4096];
	while (!terminated) {
		ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			perror("svc-helper: recv");
			return 1;
		}
		buf[n] = '\0';
		while (n > 0 && buf[n - 1] == '\n')
			buf[--n] = '\0';
		fprintf(out, "%.0f ", now_ms() - start);
		for (char *p = buf; *p; p++) {
			if (*p == '\n')
				fputs(" | ", out);
			else
				fputc(*p, out);
		}
		fputc('\n', out);
		fflush(out);
	}
	if (addr[0] != '@')
		unlink(addr);
	return 0;
}

static int notify_send(const char *addr, const char *text, const char *file)
{
	char buf[4096], control[CMSG_SPACE(sizeof(int))];
	size_t n = 0;
	for (const char *p = text; *p && n + 1 < sizeof buf; p++) {
		if (p[0] == '\\' && p[1] == 'n') {
			buf[n++] = '\n';
			p++;
		} else {
			buf[n++] = *p;
		}
	}
	struct sockaddr_un sa;
	socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(addr) + 1);
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", addr);
	struct iovec iov = { buf, n };
	struct msghdr msg = { .msg_name = &sa, .msg_namelen = salen, .msg_iov = &iov, .msg_iovlen = 1 };
	int fd = file ? open(file, O_RDWR) : -1, sock = socket(AF_UNIX, SOCK_DGRAM, 0);
	if (sock < 0 || (file && fd < 0)) {
		fprintf(stderr, "svc-helper: notify-send %s: %s\n", file ? file : addr, strerror(errno));
		return 1;
	}
	if (fd >= 0) {
		memset(control, 0, sizeof control);
		msg.msg_control = control;
		msg.msg_controllen = sizeof control;
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof fd);
	}
	if (sendmsg(sock, &msg, 0) < 0) {
		fprintf(stderr, "svc-helper: notify-send %s: %s\n", addr, strerror(errno));
		return 1;
	}
	return 0;
}

static int listen_at(const char *path)
{
	struct sockaddr_un sa;
	socklen_t salen = unix_address(path, &sa);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, salen) < 0 || chmod(path, 0666) < 0 ||
	    listen(fd, 64) < 0) {
		fprintf(stderr, "svc-helper: listen %s: %s\n", path, strerror(errno));
		exit(1);
	}
	return fd;
}

/* The descriptor store: what systemd keeps for a service between its runs. */
struct stored {
	int fd;
	char name[256];
};

struct store {
	struct stored *fds;
	size_t n, max;
	FILE *log;
	double start;
};

static bool store_has_file(const struct store *st, int fd)
{
	struct stat a, b;
	if (fstat(fd, &a) != 0)
		return false;
	for (size_t i = 0; i < st->n; i++)
		if (fstat(st->fds[i].fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			return true;
	return false;
}

/* FDSTORE=1: keeps fds[0..n) under name, as systemd does; says in the log what it ignored. */
static void store_keep(struct store *st, const char *name, const int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (store_has_file(st, fds[i]) || st->n >= st->max) {
			fprintf(st->log, " [ignored: %s]", st->n >= st->max ? "store full" : "already kept");
			close(fds[i]);
			continue;
		}
		struct stored *grown = realloc(st->fds, (st->n + 1) * sizeof *grown);
		if (!grown) {
			close(fds[i]);
			continue;
		}
		st->fds = grown;
		st->fds[st->n].fd = fds[i];
		snprintf(st->fds[st->n].name, sizeof st->fds[st->n].name, "%s", name);
		st->n++;
	}
}

/* FDSTOREREMOVE=1: every descriptor of name goes. */
static void store_remove(struct store *st, const char *name)
{
	size_t k = 0;
	for (size_t i = 0; i < st->n; i++) {
		if (strcmp(st->fds[i].name, name) == 0)
			close(st->fds[i].fd);
		else
			st->fds[k++] = st->fds[i];
	}
	st->n = k;
}

/* The value of VAR= in a notification's text, into out ("" when absent). */
static void notify_value(const char *text, const char *var, char *out, size_t size)
{
	size_t len = strlen(var);
	out[0] = '\0';
	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		if (strncmp(p, var, len) == 0 && p[len] == '=') {
			size_t n = strcspn(p + len + 1, "\n");
			if (n >= size)
				n = size - 1;
			memcpy(out, p + len + 1, n);
			out[n] = '\0';
			return;
		}
	}
}

/* One notification from the socket: logged, and the store changed as it says. */
static void store_receive(struct store *st, int sock)
{
	char buf[4096], control[CMSG_SPACE(sizeof(int) * 64)], value[256], name[256];
	struct iovec iov = { buf, sizeof buf - 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = sizeof control };
	ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0)
		return;
	buf[n] = '\0';
	int fds[64];
	size_t nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nfds < 64; i++)
				memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	fprintf(st->log, "%.0f ", now_ms() - st->start);
	for (char *p = buf; *p; p++)
		fputs(*p == '\n' ? " | " : (char[]){ *p, 0 }, st->log);
	if (nfds)
		fprintf(st->log, " [%zu fds]", nfds);
	notify_value(buf, "FDNAME", name, sizeof name);
	if (!name[0])
		snprintf(name, sizeof name, "stored");
	notify_value(buf, "FDSTORE", value, sizeof value);
	if (strcmp(value, "1") == 0)
		store_keep(st, name, fds, nfds);
	else
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
	notify_value(buf, "FDSTOREREMOVE", value, sizeof value);
	if (strcmp(value, "1") == 0)
		store_remove(st, name);
	fputc('\n', st->log);
	fflush(st->log);
}

/*
 * In the child: the socket as 3, the stored descriptors from 4, by way of
 * numbers above them all so that no dup2 overwrites one still to be moved.
 */
static void store_pass(const struct store *st, int lfd)
{
	char names[65536] = "gpuqd.socket", count[32];
	int high = 1024 + (int)st->n;
	int moved = fcntl(lfd, F_DUPFD_CLOEXEC, high);
	for (size_t i = 0; i < st->n; i++)
		st->fds[i].fd = fcntl(st->fds[i].fd, F_DUPFD_CLOEXEC, high);
	dup2(moved, 3);
	for (size_t i = 0; i < st->n; i++) {
		dup2(st->fds[i].fd, 4 + (int)i);
		size_t len = strlen(names);
		snprintf(names + len, sizeof names - len, ":%s", st->fds[i].name);
	}
	for (int fd = 3; fd < 4 + (int)st->n; fd++)
		fcntl(fd, F_SETFD, 0);
	snprintf(count, sizeof count, "%zu", st->n + 1);
	setenv("LISTEN_FDS", count, 1);
	setenv("LISTEN_FDNAMES", names, 1);
}

static pid_t spawn_stored(int lfd, struct store *st, const char *notify_path, char **argv)
{
	fprintf(st->log, "%.0f start: %zu stored\n", now_ms() - st->start, st->n);
	fflush(st->log);
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	char pidbuf[32], max[32];
	store_pass(st, lfd);
	snprintf(pidbuf, sizeof pidbuf, "%d", (int)getpid());
	snprintf(max, sizeof max, "%zu", st->max);
	setenv("LISTEN_PID", pidbuf, 1);
	setenv("NOTIFY_SOCKET", notify_path, 1);
	setenv("FDSTORE", max, 1);
	execv(argv[0], argv);
	fprintf(stderr, "svc-helper: exec %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

/* Runs the child until it exits, taking its notifications meanwhile: its wait status. */
static int store_wait(struct store *st, int sock, pid_t pid)
{
	int status = 0;
	for (;;) {
		pid_t got = waitpid(pid, &status, WNOHANG);
		if (got == pid)
			break;
		if (terminated)
			kill(pid, SIGTERM);
		struct pollfd p = { sock, POLLIN, 0 };
		if (poll(&p, 1, 20) > 0)
			store_receive(st, sock);
	}
	return status;
}

static int supervise_store(const char *path, int restarts, int delay_ms, size_t max,
			   const char *log_path, char **argv)
{
	char notify_path[108];
	struct sockaddr_un sa;
	snprintf(notify_path, sizeof notify_path, "%s.notify", path);
	socklen_t salen = unix_address(notify_path, &sa);
	int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct store st = { .max = max, .log = fopen(log_path, "a"), .start = now_ms() };
	if (sock < 0 || !st.log || bind(sock, (struct sockaddr *)&sa, salen) < 0) {
		fprintf(stderr, "svc-helper: supervise-store %s: %s\n", notify_path, strerror(errno));
		return 1;
	}
	int lfd = listen_at(path);
	fcntl(lfd, F_SETFD, FD_CLOEXEC);
	catch_term();
	for (int run = 0; run <= restarts && !terminated; run++) {
		pid_t pid = spawn_stored(lfd, &st, notify_path, argv);
		fprintf(stderr, "svc-helper: started pid %d (run %d)\n", (int)pid, run + 1);
		int status = store_wait(&st, sock, pid);
		fprintf(stderr, "svc-helper: pid %d exited with status 0x%x\n", (int)pid, status);
		for (struct pollfd p = { sock, POLLIN, 0 }; poll(&p, 1, 0) > 0;)
			store_receive(&st, sock); /* what it sent just before it ended */
		if (run < restarts && !terminated) {
			struct timespec d = { delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L };
			nanosleep(&d, NULL);
		}
	}
	unlink(path);
	unlink(notify_path);
	for (size_t i = 0; i < st.n; i++)
		close(st.fds[i].fd);
	free(st.fds);
	fclose(st.log);
	return 0;
}

static pid_t spawn(int lfd, char **argv)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	char pidbuf[32];
	if (lfd != 3) {
		dup2(lfd, 3);
		close(lfd);
	}
	fcntl(3, F_SETFD, 0);
	snprintf(pidbuf, sizeof pidbuf, "%d", (int)getpid());
	setenv("LISTEN_PID", pidbuf, 1);
	setenv("LISTEN_FDS", "1", 1);
	setenv("LISTEN_FDNAMES", "gpuqd.socket", 1);
	execv(argv[0], argv);
	fprintf(stderr, "svc-helper: exec %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

static int supervise(const char *path, int restarts, int delay_ms, char **argv)
{
	int lfd = listen_at(path);
	catch_term();
	for (int run = 0; run <= restarts && !terminated; run++) {
		pid_t pid = spawn(lfd, argv);
		int status = 0;
		fprintf(stderr, "svc-helper: started pid %d (run %d)\n", (int)pid, run + 1);
		while (waitpid(pid, &status, 0) < 0) {
			if (errno != EINTR)
				return 1;
			if (terminated)
				kill(pid, SIGTERM);
		}
		fprintf(stderr, "svc-helper: pid %d exited with status 0x%x\n", (int)pid, status);
		if (run < restarts && !terminated) {
			struct timespec d = { delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L };
			nanosleep(&d, NULL);
		}
	}
	unlink(path);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "notify-listen") == 0)
		return notify_listen(argv[2], argv[3]);
	if (argc >= 7 && strcmp(argv[1], "supervise") == 0 && strcmp(argv[5], "--") == 0)
		return supervise(argv[2], atoi(argv[3]), atoi(argv[4]), argv + 6);
	if ((argc == 4 || argc == 5) && strcmp(argv[1], "notify-send") == 0)
		return notify_send(argv[2], argv[3], argc == 5 ? argv[4] : NULL);
	if (argc >= 9 && strcmp(argv[1], "supervise-store") == 0 && strcmp(argv[7], "--") == 0)
		return supervise_store(argv[2], atoi(argv[3]), atoi(argv[4]), (size_t)atol(argv[5]),
				       argv[6], argv + 8);
	fprintf(stderr, "usage: svc-helper notify-listen ADDR OUT\n"
			"       svc-helper supervise SOCKET RESTARTS DELAY_MS -- COMMAND...\n"
			"       svc-helper supervise-store SOCKET RESTARTS DELAY_MS MAX LOG -- COMMAND...\n"
			"       svc-helper notify-send ADDR TEXT [FILE]\n");
	return 2;
}
