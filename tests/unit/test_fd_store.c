/*
 * daemon/fd_store.c and daemon/listen_fds.c: the notifications sent to the
 * service manager's descriptor store (their text, the descriptor in
 * SCM_RIGHTS, nothing sent when the store is off), the slab names both
 * ways, and the descriptors passed back sorted by LISTEN_FDNAMES (the
 * socket, the record, the slabs; anything else closed).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/fd_store.h"
#include "daemon/listen_fds.h"
#include "tests/harness.h"

/* A datagram socket bound at a fresh path, standing in for $NOTIFY_SOCKET. */
static int notify_socket(char *path, size_t n)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(path, n, "/tmp/gpuq-unit-store-%d", (int)getpid());
	unlink(path);
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
	return fd;
}

/* One notification: its text into text, the descriptor it carried (-1: none). */
static int receive(int sock, char *text, size_t n)
{
	char control[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { text, n - 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = sizeof control };
	ssize_t got = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	CHECK(got >= 0);
	text[got > 0 ? got : 0] = '\0';
	int fd = -1;
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	if (c && c->cmsg_type == SCM_RIGHTS)
		memcpy(&fd, CMSG_DATA(c), sizeof fd);
	return fd;
}

static bool same_file(int a, int b)
{
	struct stat x, y;
	return fstat(a, &x) == 0 && fstat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

TEST(fd_store_sends_each_descriptor_by_name)
{
	char path[108], text[512];
	int sock = notify_socket(path, sizeof path);
	struct fd_store s;
	setenv("NOTIFY_SOCKET", path, 1);
	setenv("FDSTORE", "2", 1);
	CHECK_EQ(fd_store_open(&s, FD_STORE_AUTO), 0);
	CHECK(fd_store_enabled(&s));
	CHECK_EQ(s.max, 2);
	int memfd = memfd_create("slab", MFD_CLOEXEC);
	CHECK(memfd >= 0);
	s.keeper.hold(s.keeper.ctx, "GPU-1a", 42, memfd); /* what a heap does as it makes a slab */
	int got = receive(sock, text, sizeof text);
	CHECK(strcmp(text, "FDSTORE=1\nFDNAME=gpuq-slab-GPU-1a-42") == 0);
	CHECK(got >= 0 && same_file(got, memfd));
	close(got);
	s.keeper.release(s.keeper.ctx, "GPU-1a", 42);
	CHECK_EQ(receive(sock, text, sizeof text), -1);
	CHECK(strcmp(text, "FDSTOREREMOVE=1\nFDNAME=gpuq-slab-GPU-1a-42") == 0);
	/*
	 * A slab an older gpuqd stored by its index: the old name goes first
	 * (the store ignores a file it holds already), then its uuid's.
	 */
	s.keeper.rename(s.keeper.ctx, "gpuq-slab-1-5", "GPU-1a", 5, memfd);
	CHECK_EQ(receive(sock, text, sizeof text), -1);
	CHECK(strcmp(text, "FDSTOREREMOVE=1\nFDNAME=gpuq-slab-1-5") == 0);
	got = receive(sock, text, sizeof text);
	CHECK(strcmp(text, "FDSTORE=1\nFDNAME=gpuq-slab-GPU-1a-5") == 0);
	CHECK(got >= 0 && same_file(got, memfd));
	close(got);
	s.keeper.rename(s.keeper.ctx, "gpuq-slab-GPU-1a-5", "GPU-1a", 5, memfd); /* its own name: nothing sent */
	CHECK_EQ(atomic_load(&s.stored), 2);
	CHECK_EQ(atomic_load(&s.removed), 2);
	fd_store_keep(&s); /* stopping: the slabs stay */
	s.keeper.release(s.keeper.ctx, "GPU-1a", 43);
	char none;
	CHECK(recv(sock, &none, 1, MSG_DONTWAIT) < 0);
	fd_store_close(&s);
	close(memfd);
	close(sock);
	unlink(path);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("FDSTORE");
}

TEST(fd_store_is_used_only_when_asked_or_sized)
{
	struct fd_store s;
	setenv("NOTIFY_SOCKET", "/tmp/gpuq-unit-nowhere", 1);
	unsetenv("FDSTORE");
	CHECK_EQ(fd_store_open(&s, FD_STORE_AUTO), 0); /* systemd 252: no $FDSTORE */
	CHECK(!fd_store_enabled(&s));
	CHECK(strstr(s.why, "FileDescriptorStoreMax=") != NULL);
	CHECK_EQ(fd_store_add(&s, "x", 0), 0); /* a no-op */
	CHECK_EQ(fd_store_open(&s, FD_STORE_ON), 0);
	CHECK(fd_store_enabled(&s));
	fd_store_close(&s);
	setenv("FDSTORE", "64", 1);
	CHECK_EQ(fd_store_open(&s, FD_STORE_OFF), 0);
	CHECK(!fd_store_enabled(&s));
	CHECK(strstr(s.why, "a crash loses every buffer") != NULL);
	unsetenv("NOTIFY_SOCKET");
	CHECK_EQ(fd_store_open(&s, FD_STORE_ON), -1); /* no service manager to hold them */
	CHECK(!fd_store_enabled(&s));
	unsetenv("FDSTORE");
}

TEST(fd_store_slab_names_both_ways)
{
	char name[FD_STORE_NAME_MAX], owner[SLAB_OWNER_MAX];
	uint32_t id;
	const char *uuid = "GPU-5ee4a5e1-0f6c-b2d3-7a1e-93b1e2f0c8d4";
	fd_store_slab_name(uuid, 4000000000u, name, sizeof name);
	CHECK(strcmp(name, "gpuq-slab-GPU-5ee4a5e1-0f6c-b2d3-7a1e-93b1e2f0c8d4-4000000000") == 0);
	CHECK_EQ(fd_store_parse_slab(name, owner, sizeof owner, &id), 1);
	CHECK(strcmp(owner, uuid) == 0);
	CHECK_EQ(id, 4000000000u);
	fd_store_slab_name_of_index(3, 7, name, sizeof name); /* what gpuqd before uuids stored */
	CHECK(strcmp(name, "gpuq-slab-3-7") == 0);
	CHECK_EQ(fd_store_parse_slab(name, owner, sizeof owner, &id), 1);
	CHECK(strcmp(owner, "3") == 0);
	CHECK_EQ(id, 7);
	CHECK_EQ(fd_store_parse_slab("gpuq-slab-HOST-1-2", owner, sizeof owner, &id), 1);
	CHECK(strcmp(owner, "HOST-1") == 0);
	CHECK_EQ(id, 2);
	const char *bad[] = { "gpuq-record", "gpuq-slab-", "gpuq-slab-1", "gpuq-slab-1-", "gpuq-slab--2",
			      "gpuq-slab-1-0", "gpuq-slab-1-2x", "gpuq-slab-1-99999999999",
			      "gpuq-slab-a b-1", "gpuq-slab-1--2", "gpuq-slab-1-+2" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		CHECKF(fd_store_parse_slab(bad[i], owner, sizeof owner, &id) == 0, "'%s' read as a slab",
		       bad[i]);
	char small[4];
	CHECK_EQ(fd_store_parse_slab("gpuq-slab-HOST-1-2", small, sizeof small, &id), 0); /* no room: not ours */
}

/* In a child (it takes descriptors 3 and on): what listen_fds_collect makes of them. */
static int collect_in_child(void)
{
	int lsock = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (lsock < 0 || bind(lsock, (struct sockaddr *)&sa, sizeof(sa_family_t)) != 0 ||
	    listen(lsock, 1) != 0) /* an autobound abstract address */
		return 10;
	int fds[5] = { lsock, memfd_create("rec", 0), memfd_create("a", 0), memfd_create("b", 0),
		       memfd_create("junk", 0) };
	int high[5];
	for (int i = 0; i < 5; i++)
		high[i] = fcntl(fds[i], F_DUPFD, 100);
	for (int i = 0; i < 5; i++)
		if (dup2(high[i], LISTEN_FDS_START + i) < 0)
			return 11;
	char pid[16];
	snprintf(pid, sizeof pid, "%d", (int)getpid());
	setenv("LISTEN_PID", pid, 1);
	setenv("LISTEN_FDS", "5", 1);
	setenv("LISTEN_FDNAMES", "gpuqd.socket:gpuq-record:gpuq-slab-0-1:gpuq-slab-GPU-a1-7:other", 1);
	struct listen_fds l;
	if (listen_fds_collect(&l) != 0)
		return 12;
	if (l.listen_fd != 3 || l.record_fd != 4 || l.nslabs != 2 || l.others != 1)
		return 13;
	if (strcmp(l.slabs[0].owner, "0") != 0 || l.slabs[0].id != 1 || l.slabs[0].fd != 5 ||
	    strcmp(l.slabs[1].owner, "GPU-a1") != 0 || l.slabs[1].id != 7 || l.slabs[1].fd != 6)
		return 14;
	if (fcntl(7, F_GETFD) >= 0 || getenv("LISTEN_FDS")) /* the other closed; the variables unset */
		return 15;
	if (!(fcntl(5, F_GETFD) & FD_CLOEXEC))
		return 16;
	if (listen_fds_take(&l) != 3 || l.listen_fd != -1)
		return 17;
	listen_fds_free(&l);
	return fcntl(4, F_GETFD) >= 0 ? 18 : 0; /* what nobody took is closed */
}

TEST(listen_fds_sorts_the_socket_and_the_store)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		_exit(collect_in_child());
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's check %d failed",
	       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* Two sockets cannot both be served: refused with a message that says so. */
static int two_sockets_in_child(void)
{
	for (int i = 0; i < 2; i++) {
		int s = socket(AF_UNIX, SOCK_STREAM, 0);
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof(sa_family_t)) != 0 || listen(s, 1) != 0)
			return 10;
		int h = fcntl(s, F_DUPFD, 100);
		if (dup2(h, LISTEN_FDS_START + i) < 0)
			return 11;
	}
	char pid[16];
	snprintf(pid, sizeof pid, "%d", (int)getpid());
	setenv("LISTEN_PID", pid, 1);
	setenv("LISTEN_FDS", "2", 1);
	struct listen_fds l;
	if (listen_fds_collect(&l) != -1 || !strstr(l.error, "gpuqd serves exactly one"))
		return 12;
	return 0;
}

TEST(listen_fds_refuses_two_sockets)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		_exit(two_sockets_in_child());
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's check %d failed",
	       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}
