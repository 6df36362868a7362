#include "tests/integration/fixture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "protocol/frame.h"
#include "workers/backend/host_patterns.h"

#define MAX_ARGS 48

const char *test_backend(void)
{
	const char *b = getenv("GPUQ_TEST_BACKEND");
	return b && *b ? b : "host";
}

bool test_backend_is_cuda(void)
{
	return strcmp(test_backend(), "cuda") == 0;
}

static const char *build_dir(void)
{
	const char *b = getenv("GPUQ_BUILD");
	return b && *b ? b : "build";
}

/* The probe runs once, in the harness's parent; the forked tests inherit its verdict. */
static int probe_status = -1;
static char probe_reason[512];

void fixture_probe(void)
{
	char cmd[512], line[512];
	snprintf(cmd, sizeof cmd, "%s/gpuqd --probe --backend %s 2>&1", build_dir(), test_backend());
	FILE *p = popen(cmd, "r");
	if (!p) {
		probe_status = 1;
		snprintf(probe_reason, sizeof probe_reason, "popen failed: %s", strerror(errno));
		return;
	}
	while (fgets(line, sizeof line, p))
		snprintf(probe_reason, sizeof probe_reason, "%s", line);
	probe_status = pclose(p);
	probe_reason[strcspn(probe_reason, "\n")] = '\0';
}

void require_backend(void)
{
	if (probe_status < 0)
		fixture_probe();
	if (probe_status != 0)
		SKIP("no %s device: %s", test_backend(), probe_reason);
}

double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

struct gpuq_reply *job_request(struct gpuq_client *c, const char *op, uint64_t job,
			       uint64_t timeout_ms)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_u64(&req, "job", job);
	if (timeout_ms)
		mp_put_u64(&req, "timeout_ms", timeout_ms);
	return call(c, &req, NULL, 0);
}

unsigned long fixture_daemon_nofile;

static void exec_daemon(struct daemon_proc *d, char **argv)
{
	if (fixture_daemon_nofile) {
		struct rlimit rl = { fixture_daemon_nofile, fixture_daemon_nofile };
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			_exit(126);
	}
	int log = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (log >= 0) {
		dup2(log, STDERR_FILENO);
		dup2(log, STDOUT_FILENO);
	}
	execv(argv[0], argv);
	fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

static bool can_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* The daemon binary daemon_start runs, under GPUQ_BUILD. */
const char *fixture_daemon_binary = "gpuqd";

static void daemon_spawn(struct daemon_proc *d, va_list ap)
{
	static char bin[256];
	char *argv[MAX_ARGS];
	int argc = 0;
	snprintf(bin, sizeof bin, "%s/%s", build_dir(), fixture_daemon_binary);
	argv[argc++] = bin;
	argv[argc++] = "--socket";
	argv[argc++] = d->sock;
	argv[argc++] = "--backend";
	argv[argc++] = (char *)test_backend();
	argv[argc++] = "--log-level";
	argv[argc++] = "debug";
	/* A machine's own /etc/gpuq/gpuqd.conf must not change the tests (a later --config wins). */
	argv[argc++] = "--config";
	argv[argc++] = "/dev/null";
	char *a;
	while ((a = va_arg(ap, char *)) != NULL && argc < MAX_ARGS - 1)
		argv[argc++] = a;
	argv[argc] = NULL;
	d->pid = fork();
	CHECKF(d->pid >= 0, "fork: %s", strerror(errno));
	if (d->pid == 0)
		exec_daemon(d, argv);
	double deadline = now_s() + 20;
	while (!can_connect(d->sock)) {
		if (!daemon_alive(d) || now_s() > deadline) {
			daemon_dump_log(d);
			harness_fail(__FILE__, __LINE__, "gpuqd did not start serving %s", d->sock);
		}
		usleep(5000);
	}
}

void daemon_start(struct daemon_proc *d, ...)
{
	require_backend();
	snprintf(d->dir, sizeof d->dir, "/tmp/gpuq-test-XXXXXX");
	CHECKF(mkdtemp(d->dir), "mkdtemp: %s", strerror(errno));
	chmod(d->dir, 0711); /* other uids must reach the socket */
	snprintf(d->sock, sizeof d->sock, "%s/gpuqd.sock", d->dir);
	snprintf(d->log, sizeof d->log, "%s/gpuqd.log", d->dir);
	va_list ap;
	va_start(ap, d);
	daemon_spawn(d, ap);
	va_end(ap);
}

void daemon_restart(struct daemon_proc *d, ...)
{
	va_list ap;
	va_start(ap, d);
	daemon_spawn(d, ap);
	va_end(ap);
}

bool daemon_alive(const struct daemon_proc *d)
{
	int rc = waitpid(d->pid, NULL, WNOHANG);
	if (rc < 0 && errno == ECHILD) /* asked from a forked client: not its child */
		return kill(d->pid, 0) == 0 || errno == EPERM;
	return rc == 0;
}

unsigned daemon_fd_count(const struct daemon_proc *d)
{
	char path[64];
	unsigned n = 0;
	snprintf(path, sizeof path, "/proc/%d/fd", (int)d->pid);
	DIR *dir = opendir(path);
	CHECKF(dir, "%s: %s", path, strerror(errno));
	for (struct dirent *e; (e = readdir(dir));)
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

void daemon_dump_log(const struct daemon_proc *d)
{
	FILE *f = fopen(d->log, "r");
	char line[1024];
	if (!f)
		return;
	fprintf(stderr, "    --- gpuqd log ---\n");
	while (fgets(line, sizeof line, f))
		fprintf(stderr, "    %s", line);
	fclose(f);
}

int daemon_log_count(const struct daemon_proc *d, const char *text)
{
	FILE *f = fopen(d->log, "r");
	char line[4096];
	int n = 0;
	while (f && fgets(line, sizeof line, f))
		n += strstr(line, text) != NULL;
	if (f)
		fclose(f);
	return n;
}

void daemon_stop(struct daemon_proc *d)
{
	int status = -1;
	kill(d->pid, SIGTERM);
	double deadline = now_s() + 30;
	while (waitpid(d->pid, &status, WNOHANG) == 0) {
		if (now_s() > deadline) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &status, 0);
			daemon_dump_log(d);
			harness_fail(__FILE__, __LINE__, "gpuqd did not stop within 30 s of SIGTERM");
		}
		usleep(5000);
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		daemon_dump_log(d);
		harness_fail(__FILE__, __LINE__, "gpuqd exited with status 0x%x", status);
	}
	struct stat st;
	CHECKF(stat(d->sock, &st) < 0, "gpuqd left its socket %s behind", d->sock);
	unlink(d->log);
	rmdir(d->dir);
}

pid_t spawn_gpuq(const struct daemon_proc *d, ...)
{
	char gpuq[256];
	char *argv[MAX_ARGS];
	int argc = 0;
	snprintf(gpuq, sizeof gpuq, "%s/gpuq", build_dir());
	argv[argc++] = gpuq;
	argv[argc++] = "--socket";
	argv[argc++] = (char *)d->sock;
	va_list ap;
	va_start(ap, d);
	char *a;
	while ((a = va_arg(ap, char *)) != NULL && argc < MAX_ARGS - 1)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;
	pid_t pid = fork();
	CHECKF(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		dup2(null, STDOUT_FILENO);
		dup2(null, STDERR_FILENO);
		execv(gpuq, argv);
		_exit(127);
	}
	return pid;
}

void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	CHECKF(f && fputs(text, f) >= 0 && fclose(f) == 0, "writing %s: %s", path, strerror(errno));
}

const char *config_file(const char *text)
{
	static char path[64];
	snprintf(path, sizeof path, "/tmp/gpuq-test-conf-%d", (int)getpid());
	write_file(path, text);
	return path;
}

void start_with_config(struct daemon_proc *d, const char *text, const char *more)
{
	if (geteuid() != 0)
		SKIP("needs root to act as other uids");
	const char *path = config_file(text);
	if (more)
		daemon_start(d, "--socket-group", "nogroup", "--config", path, more, NULL);
	else
		daemon_start(d, "--socket-group", "nogroup", "--config", path, NULL);
}

void as_user(uid_t uid, const gid_t *groups, int ngroups, void (*fn)(void *), void *arg)
{
	pid_t pid = fork();
	CHECKF(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		CHECKF(setgroups((size_t)ngroups, groups) == 0 && setgid(NOGROUP) == 0 && setuid(uid) == 0,
		       "becoming uid %d: %s", (int)uid, strerror(errno));
		fn(arg);
		_exit(0);
	}
	int status;
	waitpid(pid, &status, 0);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the checks as uid %d failed", (int)uid);
}

struct gpuq_client *client_open(const struct daemon_proc *d)
{
	struct gpuq_client *c;
	struct gpuq_error err;
	if (gpuq_connect(d->sock, &c, &err) < 0)
		harness_fail(__FILE__, __LINE__, "connect: %s", err.message);
	return c;
}

struct gpuq_reply *call(struct gpuq_client *c, struct mp_map *req, const int *fds, int nfds)
{
	struct gpuq_reply *r;
	struct gpuq_error err;
	if (gpuq_call(c, req, fds, nfds, &r, &err) < 0)
		harness_fail(__FILE__, __LINE__, "gpuq_call: %s: %s", gpuq_errc_name(err.code),
			     err.message);
	return r;
}

void expect_ok(const struct gpuq_reply *r, const char *what)
{
	struct gpuq_error err;
	if (!gpuq_reply_ok(r)) {
		gpuq_reply_error(r, &err);
		harness_fail(__FILE__, __LINE__, "%s failed: %s: %s", what, gpuq_errc_name(err.code),
			     err.message);
	}
}

void expect_error(const struct gpuq_reply *r, enum gpuq_errc code, const char *contains)
{
	struct gpuq_error err;
	CHECKF(!gpuq_reply_ok(r), "expected error %s, got ok", gpuq_errc_name(code));
	gpuq_reply_error(r, &err);
	CHECKF(err.code == code, "expected %s, got %s: %s", gpuq_errc_name(code),
	       gpuq_errc_name(err.code), err.message);
	CHECKF(!contains || strstr(err.message, contains),
	       "error message \"%s\" does not mention \"%s\"", err.message, contains);
}

const msgpack_object *reply_path(const struct gpuq_reply *r, const char *path)
{
	char buf[128];
	snprintf(buf, sizeof buf, "%s", path);
	const msgpack_object *o = r->root;
	for (char *save = NULL, *key = strtok_r(buf, ".", &save); key; key = strtok_r(NULL, ".", &save)) {
		char *end;
		unsigned long i = strtoul(key, &end, 10);
		if (o && o->type == MSGPACK_OBJECT_ARRAY && !*end && end != key) { /* "devices.0.name" */
			o = i < o->via.array.size ? &o->via.array.ptr[i] : NULL;
			continue;
		}
		if (!o || o->type != MSGPACK_OBJECT_MAP)
			return NULL;
		o = msg_map_get(o, key);
	}
	return o;
}

uint64_t reply_u64(const struct gpuq_reply *r, const char *path)
{
	const msgpack_object *o = reply_path(r, path);
	CHECKF(o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER, "reply has no unsigned '%s'", path);
	return o->via.u64;
}

double reply_f64(const struct gpuq_reply *r, const char *path)
{
	const msgpack_object *o = reply_path(r, path);
	CHECKF(o && (o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32),
	       "reply has no float '%s'", path);
	return o->via.f64;
}

void reply_str(const struct gpuq_reply *r, const char *path, char *out, size_t size)
{
	const msgpack_object *o = reply_path(r, path);
	CHECKF(o && o->type == MSGPACK_OBJECT_STR, "reply has no string '%s'", path);
	snprintf(out, size, "%.*s", (int)o->via.str.size, o->via.str.ptr);
}

int device_count(struct gpuq_client *c)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "ping");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "ping");
	int n = (int)reply_u64(r, "devices");
	gpuq_reply_free(r);
	return n;
}

uint64_t device_mem_free(struct gpuq_client *c, int device)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "devices");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "devices");
	const msgpack_object *devs = reply_path(r, "devices");
	CHECKF(devs && devs->type == MSGPACK_OBJECT_ARRAY && (int)devs->via.array.size > device,
	       "devices lists no device %d", device);
	const msgpack_object *v = msg_map_get(&devs->via.array.ptr[device], "mem_free");
	CHECKF(v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER, "device %d has no mem_free", device);
	uint64_t n = v->via.u64;
	gpuq_reply_free(r);
	return n;
}

uint64_t quota_used(struct gpuq_client *c, const char *what)
{
	char path[128];
	snprintf(path, sizeof path, "users.0.used.%s", what);
	struct mp_map req;
	gpuq_request_begin(c, &req, "quota");
	mp_put_u64(&req, "uid", (uint64_t)getuid());
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "quota");
	uint64_t used = reply_u64(r, path);
	gpuq_reply_free(r);
	return used;
}

/* Whether the caller has a buffer called name; *ephemeral says how it was made. */
bool has_buffer(struct gpuq_client *c, const char *name, bool *ephemeral)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "buffers");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	const msgpack_object *list = reply_path(r, "buffers");
	bool found = false;
	for (uint32_t i = 0; list && i < list->via.array.size; i++) {
		const msgpack_object *b = &list->via.array.ptr[i];
		const msgpack_object *n = msg_map_get(b, "name");
		if (n && n->via.str.size == strlen(name) && !memcmp(n->via.str.ptr, name, strlen(name))) {
			const msgpack_object *e = msg_map_get(b, "ephemeral");
			CHECKF(e && e->type == MSGPACK_OBJECT_BOOLEAN, "buffers has no 'ephemeral'");
			if (ephemeral)
				*ephemeral = e->via.boolean;
			found = true;
		}
	}
	gpuq_reply_free(r);
	return found;
}

/* Waits up to 3 s for name to be gone. */
bool buffer_goes(struct gpuq_client *c, const char *name)
{
	for (int i = 0; i < 300; i++) {
		if (!has_buffer(c, name, NULL))
			return true;
		usleep(10000);
	}
	return false;
}

static struct gpuq_reply *job_call(struct gpuq_client *c, const char *op, const char *buffer,
				   const int *fds, int nfds)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, "buffer", buffer);
	mp_put_bool(&req, "wait", true);
	if (nfds)
		mp_put_u64(&req, "fds", (uint64_t)nfds);
	return call(c, &req, fds, nfds);
}

/* An alloc of bytes (dtype NULL) or of count elements of dtype, waited for. */
static void alloc_waited(struct gpuq_client *c, const char *name, int device, const char *dtype,
			 uint64_t size)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "device", (uint64_t)device);
	mp_put_u64(&req, dtype ? "count" : "bytes", size);
	if (dtype)
		mp_put_str(&req, "dtype", dtype);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "alloc");
	if (!dtype)
		CHECK_EQ(reply_u64(r, "job.result.bytes"), size);
	gpuq_reply_free(r);
}

void do_alloc(struct gpuq_client *c, const char *name, int device, uint64_t bytes)
{
	alloc_waited(c, name, device, NULL, bytes);
}

void do_alloc_typed(struct gpuq_client *c, const char *name, int device, const char *dtype,
		    uint64_t count)
{
	alloc_waited(c, name, device, dtype, count);
}

void do_fill_random(struct gpuq_client *c, const char *buffer, uint64_t seed)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "pattern", "random");
	mp_put_u64(&req, "seed", seed);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "fill random");
	gpuq_reply_free(r);
}

uint64_t do_checksum(struct gpuq_client *c, const char *buffer)
{
	struct gpuq_reply *r = job_call(c, "checksum", buffer, NULL, 0);
	expect_ok(r, "checksum");
	uint64_t sum = reply_u64(r, "job.result.checksum");
	gpuq_reply_free(r);
	return sum;
}

void do_free(struct gpuq_client *c, const char *buffer)
{
	struct gpuq_reply *r = job_call(c, "free", buffer, NULL, 0);
	expect_ok(r, "free");
	gpuq_reply_free(r);
}

uint64_t do_put(struct gpuq_client *c, const char *buffer, int fd)
{
	struct gpuq_reply *r = job_call(c, "put", buffer, &fd, 1);
	expect_ok(r, "put");
	uint64_t n = reply_u64(r, "job.result.bytes");
	gpuq_reply_free(r);
	return n;
}

uint64_t do_get(struct gpuq_client *c, const char *buffer, int fd)
{
	struct gpuq_reply *r = job_call(c, "get", buffer, &fd, 1);
	expect_ok(r, "get");
	uint64_t n = reply_u64(r, "job.result.bytes");
	gpuq_reply_free(r);
	return n;
}

static void job_state_of(struct gpuq_client *c, uint64_t job, char *state, size_t size)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "status");
	mp_put_u64(&req, "job", job);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "status");
	reply_str(r, "job.state", state, size);
	gpuq_reply_free(r);
}

uint64_t start_running_transfer(struct gpuq_client *c, const char *op, const char *buffer, int fd)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, "buffer", buffer);
	mp_put_u64(&req, "fds", 1);
	struct gpuq_reply *r = call(c, &req, &fd, 1);
	expect_ok(r, op);
	uint64_t id = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	wait_job_running(c, id);
	return id;
}

void wait_job_running(struct gpuq_client *c, uint64_t job)
{
	char state[16] = "queued";
	for (int i = 0; i < 2000 && strcmp(state, "queued") == 0; i++) {
		job_state_of(c, job, state, sizeof state);
		if (strcmp(state, "queued") == 0)
			usleep(1000);
	}
	CHECKF(strcmp(state, "running") == 0, "job %llu is %s, not running",
	       (unsigned long long)job, state);
}

void do_reset_device(struct gpuq_client *c, int device)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "reset_device");
	mp_put_u64(&req, "device", (uint64_t)device);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "reset_device");
	gpuq_reply_free(r);
}

uint64_t start_stalled_put(struct gpuq_client *c, const char *buffer, int p[2])
{
	CHECK(pipe(p) == 0);
	uint64_t id = start_running_transfer(c, "put", buffer, p[0]);
	close(p[0]);
	return id;
}

int memfd_random(size_t n, uint64_t seed)
{
	int fd = memfd_create("gpuq-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECKF(fd >= 0, "memfd_create: %s", strerror(errno));
	CHECKF(ftruncate(fd, (off_t)n) == 0, "ftruncate: %s", strerror(errno));
	if (n) {
		void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		CHECKF(p != MAP_FAILED, "mmap: %s", strerror(errno));
		host_fill_random(p, n, GPUQ_DTYPE_BYTES, seed);
		munmap(p, n);
	}
	return fd;
}

int sealed_memfd(size_t n, uint64_t seed)
{
	int fd = memfd_random(n, seed);
	CHECKF(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, "F_ADD_SEALS: %s", strerror(errno));
	return fd;
}

void *fd_slurp(int fd, size_t *n)
{
	struct stat st;
	CHECKF(fstat(fd, &st) == 0, "fstat: %s", strerror(errno));
	*n = (size_t)st.st_size;
	char *buf = malloc(*n ? *n : 1);
	CHECK(buf);
	size_t got = 0;
	while (got < *n) {
		ssize_t r = pread(fd, buf + got, *n - got, (off_t)got);
		CHECKF(r > 0, "pread: %s", r < 0 ? strerror(errno) : "end of file");
		got += (size_t)r;
	}
	return buf;
}

int raw_connect(const struct daemon_proc *d)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", d->sock);
	CHECKF(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect %s: %s",
	       d->sock, strerror(errno));
	return fd;
}

void raw_write(int fd, const void *data, size_t len)
{
	size_t put = 0;
	while (put < len) {
		ssize_t w = send(fd, (const char *)data + put, len - put, MSG_NOSIGNAL);
		CHECKF(w > 0, "send: %s", strerror(errno));
		put += (size_t)w;
	}
}

void raw_send_fds(int fd, const void *data, size_t len, const int *fds, int n)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 16)];
		struct cmsghdr align;
	} control;
	struct iovec iov = { (void *)data, len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	CHECK(n > 0 && n <= 16);
	mh.msg_control = control.buf;
	mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
	memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)n);
	ssize_t sent = sendmsg(fd, &mh, MSG_NOSIGNAL);
	CHECKF(sent == (ssize_t)len, "sendmsg with %d descriptors: %s", n,
	       sent < 0 ? strerror(errno) : "short");
}

void raw_frame(msgpack_sbuffer *sb, uint64_t id, const char *op, size_t pad)
{
	struct mp_map req;
	mp_map_init(&req);
	mp_put_u64(&req, "v", 1);
	mp_put_u64(&req, "id", id);
	mp_put_str(&req, "op", op);
	if (pad > 0) {
		char *text = malloc(pad);
		CHECK(text);
		memset(text, 'x', pad);
		mp_put_strn(&req, "pad", text, pad);
		free(text);
	}
	msgpack_sbuffer_init(sb);
	mp_map_frame(&req, sb);
}

static bool read_exact(int fd, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		CHECKF(poll(&p, 1, 10000) == 1, "no reply from gpuqd within 10 s");
		ssize_t r = read(fd, (char *)buf + got, n - got);
		if (r <= 0)
			return false;
		got += (size_t)r;
	}
	return true;
}

int raw_read_error(int fd, char *code, size_t size, char *message, size_t msize)
{
	uint8_t hdr[4];
	if (!read_exact(fd, hdr, 4))
		return -1;
	uint32_t len = frame_get_header(hdr);
	CHECKF(len < (1u << 24), "reply frame of %u bytes", len);
	char *buf = malloc(len);
	CHECK(buf && read_exact(fd, buf, len));
	struct msg m;
	struct gpuq_error err;
	CHECKF(msg_decode(&m, buf, len, &msg_request_limits, &err) == 0, "reply: %s", err.message);
	const msgpack_object *e = msg_map_get(m.root, "error");
	const msgpack_object *c = e && e->type == MSGPACK_OBJECT_MAP ? msg_map_get(e, "code") : NULL;
	const msgpack_object *t = e && e->type == MSGPACK_OBJECT_MAP ? msg_map_get(e, "message") : NULL;
	if (c && c->type == MSGPACK_OBJECT_STR)
		snprintf(code, size, "%.*s", (int)c->via.str.size, c->via.str.ptr);
	else
		snprintf(code, size, "ok");
	if (message && msize)
		snprintf(message, msize, "%.*s", t && t->type == MSGPACK_OBJECT_STR ? (int)t->via.str.size : 0,
			 t && t->type == MSGPACK_OBJECT_STR ? t->via.str.ptr : "");
	msg_free(&m);
	free(buf);
	return 0;
}

int raw_read_reply(int fd, char *code, size_t size)
{
	return raw_read_error(fd, code, size, NULL, 0);
}

bool raw_closed_by_peer(int fd, int timeout_ms)
{
	char buf[256];
	double deadline = now_s() + timeout_ms / 1000.0;
	while (now_s() < deadline) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 50) == 1) {
			ssize_t r = read(fd, buf, sizeof buf);
			if (r == 0 || (r < 0 && errno == ECONNRESET))
				return true;
		}
	}
	return false;
}

void require_memlock(struct gpuq_client *c, uint64_t bytes)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "regions");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	const msgpack_object *limit = reply_path(r, "memlock_limit");
	uint64_t have = limit && limit->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? limit->via.u64 : UINT64_MAX;
	gpuq_reply_free(r);
	if (have < bytes)
		SKIP("gpuqd's RLIMIT_MEMLOCK here is %llu bytes, less than the %llu of regions this test "
		     "pins (raise it: ulimit -l)", (unsigned long long)have, (unsigned long long)bytes);
}

struct gpuq_reply *restart_call(struct gpuq_client *c, const char *binary)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "restart");
	if (binary)
		mp_put_str(&req, "binary", binary);
	return call(c, &req, NULL, 0);
}

uint64_t ping_restarts(struct gpuq_client *c, uint64_t *pid)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "ping");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "ping");
	const msgpack_object *n = gpuq_reply_get(r, "restarts");
	uint64_t restarts = n && n->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? n->via.u64 : 0;
	if (pid)
		*pid = reply_u64(r, "pid");
	gpuq_reply_free(r);
	return restarts;
}

void await_restarts(struct gpuq_client *c, uint64_t want)
{
	for (int i = 0; i < 10000; i++) {
		if (ping_restarts(c, NULL) >= want)
			return;
		usleep(1000);
	}
	CHECKF(false, "gpuqd never counted %llu restarts", (unsigned long long)want);
}

void restart_ok(struct gpuq_client *c)
{
	struct gpuq_reply *r = restart_call(c, NULL);
	expect_ok(r, "restart");
	gpuq_reply_free(r);
}

void restart_and_await(struct gpuq_client *c, uint64_t want)
{
	restart_ok(c);
	await_restarts(c, want);
}

void buffer_state(struct gpuq_client *c, const char *name, char *state, size_t n, char *why,
		  size_t wn)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "buffers");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "buffers");
	const msgpack_object *list = reply_path(r, "buffers");
	snprintf(state, n, "absent");
	if (why)
		why[0] = '\0';
	for (uint32_t i = 0; i < list->via.array.size; i++) {
		char path[64], got[80];
		snprintf(path, sizeof path, "buffers.%u.name", i);
		reply_str(r, path, got, sizeof got);
		if (strcmp(got, name) != 0)
			continue;
		snprintf(path, sizeof path, "buffers.%u.state", i);
		reply_str(r, path, state, n);
		snprintf(path, sizeof path, "buffers.%u.suspect", i);
		if (why && strcmp(state, "suspect") == 0)
			reply_str(r, path, why, wn);
	}
	gpuq_reply_free(r);
}
