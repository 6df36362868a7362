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
 */
#include <errno.h>
#include <fcntl.h>
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
	fprintf(stderr, "usage: svc-helper notify-listen ADDR OUT\n"
			"       svc-helper supervise SOCKET RESTARTS DELAY_MS -- COMMAND...\n");
	return 2;
}
