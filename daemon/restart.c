/*
 * Re-executing gpuqd in place (restart.h). Main thread only. The steps, in
 * order: restart_request checks the binary and has it read the record
 * (restart_check), then the drain (restart_step, restart_on_timer), the
 * wait for replies to be written (restart_flush), and restart_exec.
 */
#include "daemon/restart.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"
#include "daemon/recover.h"
#include "daemon/replay.h"

extern char **environ;

/* How long the replies of the last jobs may take to be written before the execve. */
#define RESTART_FLUSH_MS 1000
#define RESTART_POLL_MS 10
/* Cancelled jobs that do not stop within this are left to the execve. */
#define RESTART_CANCEL_GRACE_MS 2000
/* A binary asked to read the record that has not answered in this long is not a gpuqd that can. */
#define RESTART_CHECK_S 10

static void restart_on_signal(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;
	struct gpuq_error err;
	(void)signum;
	if (restart_request(d, NULL, "SIGUSR2", &err) != 0)
		log_error("SIGUSR2: no restart: %s", err.message);
}

int restart_init(struct daemon *d, char **argv)
{
	struct restart *r = &d->restart;
	r->argv = argv;
	r->count = d->recover.restarts;
	r->nfault = d->recover.nfault;
	memcpy(r->fault_ms, d->recover.fault_ms, sizeof r->fault_ms);
	int rc = uv_signal_init(d->loop, &r->sigusr2);
	if (rc == 0)
		rc = uv_timer_init(d->loop, &r->timer);
	if (rc == 0)
		rc = uv_signal_start(&r->sigusr2, restart_on_signal, SIGUSR2);
	if (rc < 0) {
		log_error("cannot take SIGUSR2 (restarts): %s", uv_strerror(rc));
		return -1;
	}
	r->sigusr2.data = r->timer.data = d;
	r->handles = true;
	return 0;
}

/*
 * A binary named in the request runs as gpuqd, with every buffer's
 * descriptor: it must be a file that only root or gpuqd's own user can
 * change, in a directory others cannot swap it in (sticky ones aside).
 */
static int restart_binary_trusted(const char *path, struct gpuq_error *err)
{
	struct stat st, dir;
	char parent[PATH_MAX];
	snprintf(parent, sizeof parent, "%s", path);
	char *slash = strrchr(parent, '/');
	if (!slash)
		snprintf(parent, sizeof parent, ".");
	else if (slash == parent)
		parent[1] = '\0';
	else
		*slash = '\0';
	if (stat(path, &st) != 0 || stat(parent, &dir) != 0)
		return gpuq_fail(err, GPUQ_E_NOT_FOUND, "'%s': %s", path, strerror(errno));
	bool owner_ok = st.st_uid == 0 || st.st_uid == geteuid();
	if (!owner_ok || (st.st_mode & (S_IWGRP | S_IWOTH)))
		return gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
				 "'%s' is owned by uid %d with mode %03o: gpuqd runs only a binary that "
				 "root or its own user owns and that no group or other user may write",
				 path, (int)st.st_uid, (unsigned)(st.st_mode & 0777));
	bool dir_owner_ok = dir.st_uid == 0 || dir.st_uid == geteuid();
	if (!(dir.st_mode & S_ISVTX) && (!dir_owner_ok || (dir.st_mode & (S_IWGRP | S_IWOTH))))
		return gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
				 "'%s' lies in %s, which uid %d owns with mode %03o: another user could "
				 "replace it before gpuqd runs it; install it where only root may write",
				 path, parent, (int)dir.st_uid, (unsigned)(dir.st_mode & 0777));
	return 0;
}

/* The binary to run: the one named, or this one (its path, even once replaced on disk). */
static int restart_binary(const char *binary, char *out, size_t size, struct gpuq_error *err)
{
	struct stat st;
	if (binary) {
		snprintf(out, size, "%s", binary);
	} else {
		ssize_t n = readlink("/proc/self/exe", out, size - 1);
		if (n < 0)
			return gpuq_fail(err, GPUQ_E_INTERNAL, "cannot find gpuqd's own binary: "
				       "readlink /proc/self/exe: %s", strerror(errno));
		out[n] = '\0';
		char *deleted = strstr(out, " (deleted)"); /* replaced by an upgrade: run the new file */
		if (deleted && deleted[10] == '\0')
			*deleted = '\0';
	}
	if (stat(out, &st) != 0 || !S_ISREG(st.st_mode) || access(out, X_OK) != 0)
		return gpuq_fail(err, GPUQ_E_NOT_FOUND,
				 "'%s' is not an executable file (%s); name the gpuqd binary to run",
				 out, errno ? strerror(errno) : "not a regular file");
	return binary ? restart_binary_trusted(out, err) : 0;
}

/* Waits for pid up to RESTART_CHECK_S, polling; kills it past that. 0 with *status, or -1. */
static int restart_reap(pid_t pid, int *status)
{
	for (int waited_ms = 0; waited_ms < RESTART_CHECK_S * 1000; waited_ms++) {
		pid_t got = waitpid(pid, status, WNOHANG);
		if (got == pid || (got < 0 && errno != EINTR))
			return got == pid ? 0 : -1;
		usleep(1000);
	}
	kill(pid, SIGKILL);
	while (waitpid(pid, status, 0) < 0 && errno == EINTR)
		;
	return -1;
}

/*
 * Runs argv (argv[0] the binary) with record_fd as descriptor 3 when it is
 * not -1, its stdout gone, and waits for it up to RESTART_CHECK_S: 0 when
 * it exited 0; 1 when it did not, how (size n) then saying so with the
 * first line of its stderr ("exited 65: ..."); -1 with err when it could
 * not be run or did not answer.
 */
static int restart_run_check(char **argv, int record_fd, char *how, size_t n,
			     struct gpuq_error *err)
{
	char said[256] = "";
	int status = 0;
	int out = memfd_create("gpuq-restart-check", MFD_CLOEXEC);
	if (out < 0)
		return gpuq_fail(err, GPUQ_E_IO, "memfd_create for '%s': %s", argv[0], strerror(errno));
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	if (record_fd >= 0)
		posix_spawn_file_actions_adddup2(&fa, record_fd, 3); /* dup2 clears close-on-exec */
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, out, 2);
	pid_t pid;
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc != 0) {
		close(out);
		return gpuq_fail(err, GPUQ_E_IO, "cannot run '%s': %s", argv[0], strerror(rc));
	}
	rc = restart_reap(pid, &status);
	ssize_t got = pread(out, said, sizeof said - 1, 0);
	close(out);
	said[got > 0 ? got : 0] = '\0';
	said[strcspn(said, "\n")] = '\0';
	if (rc != 0)
		return gpuq_fail(err, GPUQ_E_TIMEOUT,
				 "'%s %s' did not answer within %d s (killed); is it gpuqd? "
				 "gpuqd keeps serving", argv[0], argv[1] ? argv[1] : "", RESTART_CHECK_S);
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	snprintf(how, n, "%s %d%s%s", WIFEXITED(status) ? "exited" : "died of signal",
		 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), said[0] ? ": " : "",
		 said);
	return 1;
}

/*
 * Runs `binary --check-record 3` on the record as it stands now: 0 when
 * the binary says it can take it over, else -1 with err. Waits for it
 * (a binary reading a record exits at once; the loop pauses meanwhile),
 * up to RESTART_CHECK_S.
 */
static int restart_check_record(struct daemon *d, const char *binary, struct gpuq_error *err)
{
	int fd = durable_record_fd(d);
	if (fd < 0 || durable_flush(d) != 0)
		return gpuq_fail(err, GPUQ_E_INTERNAL,
				 "gpuqd has no durable state record to hand over (the log says why)");
	char *argv[] = { (char *)binary, "--check-record", "3", NULL };
	char how[320];
	int rc = restart_run_check(argv, fd, how, sizeof how, err);
	if (rc <= 0)
		return rc;
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			 "'%s' cannot take over this gpuqd's state record (--check-record %s); "
			 "gpuqd keeps serving", binary, how);
}

/*
 * Runs `binary ARGS... --check-config` with the arguments the new image
 * will get: a configuration file that would stop it from starting (edited
 * since gpuqd read it) refuses the restart, rather than end gpuqd.
 */
static int restart_check_config(struct daemon *d, const char *binary, struct gpuq_error *err)
{
	char **kept = d->restart.argv;
	int argc = 0;
	while (kept[argc])
		argc++;
	char **argv = calloc((size_t)argc + 2, sizeof *argv);
	if (!argv)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no memory to check the configuration");
	argv[0] = (char *)binary;
	for (int i = 1; i < argc; i++)
		argv[i] = kept[i];
	argv[argc > 0 ? argc : 1] = "--check-config";
	char how[320];
	int rc = restart_run_check(argv, -1, how, sizeof how, err);
	free(argv);
	if (rc <= 0)
		return rc;
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			 "the new image would not start: '%s --check-config' with gpuqd's arguments "
			 "%s; mend the configuration (gpuqd --check-config lists what is wrong); "
			 "gpuqd keeps serving", binary, how);
}

/* The jobs the drain waits for: those running (held ones wait for the next image). */
static unsigned restart_running(const struct daemon *d)
{
	return d->jobs.active - replay_held(d);
}

static void restart_on_start(uv_timer_t *t)
{
	restart_step(t->data);
}

int restart_request(struct daemon *d, const char *binary, const char *reason,
		    struct gpuq_error *err)
{
	struct restart *r = &d->restart;
	char path[PATH_MAX];
	if (d->stopping)
		return gpuq_fail(err, GPUQ_E_SHUTTING_DOWN, "gpuqd is shutting down; no restart");
	if (r->active)
		return gpuq_fail(err, GPUQ_E_BUSY, "a restart is already under way (%s, %.1f s ago)",
				 r->reason, monotonic_seconds() - r->since);
	errno = 0;
	if (restart_binary(binary, path, sizeof path, err) != 0 ||
	    restart_check_record(d, path, err) != 0 || restart_check_config(d, path, err) != 0)
		return -1;
	snprintf(r->binary, sizeof r->binary, "%s", path);
	snprintf(r->reason, sizeof r->reason, "%s", reason);
	r->active = true;
	r->cancel_sent = false;
	r->since = monotonic_seconds();
	replay_hold(d); /* the queued jobs wait for the next image, or fail saying why */
	log_info("restarting (%s) into %s: %u jobs may run for up to %u ms (--restart-drain)",
		 reason, path, restart_running(d), d->opt.restart_drain_ms);
	r->flush_since = 0;
	uv_timer_start(&r->timer, restart_on_start, 0, 0); /* after this request's reply */
	return 0;
}

/* Clears close-on-exec on fd (it goes to the new image); false when it is not open. */
static bool restart_keep(int fd)
{
	int flags = fd >= 0 ? fcntl(fd, F_GETFD) : -1;
	return flags >= 0 && fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) == 0;
}

/* Appends ",fmt..." to the GPUQ_INHERIT value in buf. */
static void restart_env_add(char *buf, size_t size, size_t *n, const char *fmt, long long a,
			    long long b)
{
	if (*n >= size)
		return;
	*n += (size_t)snprintf(buf + *n, size - *n, fmt, *n ? "," : "", a, b);
}

/* Whether c can go to the new image: nothing half read from it, nothing of its own unsent. */
static bool restart_conn_clean(const struct conn *c)
{
	return !c->closed && !c->close_after_flush && c->out_bytes == 0 && c->frame_since == 0 &&
	       frame_reader_pending(&c->reader) == 0 && c->parked.count == 0;
}

/*
 * What the new image inherits, descriptors made inheritable: GPUQ_INHERIT's
 * value into buf. queue_fd: the held jobs (daemon/replay.h), -1 when none.
 */
static void restart_handover(struct daemon *d, int queue_fd, char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = '\0';
	if (restart_keep(durable_record_fd(d)))
		restart_env_add(buf, size, &n, "%srecord:%lld", durable_record_fd(d), 0);
	if (restart_keep(queue_fd))
		restart_env_add(buf, size, &n, "%squeue:%lld", queue_fd, 0);
	else if (queue_fd >= 0)
		log_error("the queued jobs' hand-over (descriptor %d) cannot be inherited: %s; the new "
			  "image will not replay them", queue_fd, strerror(errno));
	if (restart_keep(d->server.listen_fd))
		restart_env_add(buf, size, &n, "%slisten:%lld:%lld", d->server.listen_fd,
				d->server.adopted);
	restart_env_add(buf, size, &n, "%srestarts:%lld", (long long)d->restart.count + 1, 0);
	restart_env_add(buf, size, &n, "%sjobs:%lld", (long long)d->jobs.next_id, 0);
	if (fd_store_enabled(&d->fd_store)) /* the next image stores none of it again */
		restart_env_add(buf, size, &n, "%sstored:%lld", 1, 0);
	for (unsigned i = 0; i < d->restart.nfault; i++)
		restart_env_add(buf, size, &n, "%sfault:%lld", (long long)d->restart.fault_ms[i], 0);
	for (struct buffer *b = d->buffers.head; b; b = b->next)
		if (b->slab_fd >= 0 && b->state == BUFFER_READY)
			restart_keep(b->slab_fd);
	absent_inherit(&d->absent, 1); /* the record names their descriptors too */
	regions_inherit(&d->regions, true); /* the record names their descriptors */
	for (struct lease *l = d->leases.head; l; l = l->next) /* and the revocable leases' locks */
		if (l->state == LEASE_HELD)
			restart_keep(l->lock_fd);
	for (struct conn *c = d->server.conns; c; c = c->next)
		if (restart_conn_clean(c) && restart_keep(c->fd))
			restart_env_add(buf, size, &n, "%sconn:%lld:%lld", c->fd, (long long)c->serial);
}

/* Every descriptor handed over is closed on exec again (the execve failed). */
static void restart_take_back(struct daemon *d)
{
	int fds[2] = { durable_record_fd(d), d->server.listen_fd };
	for (int i = 0; i < 2; i++)
		if (fds[i] >= 0)
			fcntl(fds[i], F_SETFD, FD_CLOEXEC);
	for (struct buffer *b = d->buffers.head; b; b = b->next)
		if (b->slab_fd >= 0)
			fcntl(b->slab_fd, F_SETFD, FD_CLOEXEC);
	absent_inherit(&d->absent, 0);
	regions_inherit(&d->regions, false);
	for (struct lease *l = d->leases.head; l; l = l->next)
		if (l->lock_fd >= 0)
			fcntl(l->lock_fd, F_SETFD, FD_CLOEXEC);
	for (struct conn *c = d->server.conns; c; c = c->next)
		fcntl(c->fd, F_SETFD, FD_CLOEXEC);
}

static void restart_flush(uv_timer_t *t);

/*
 * The held jobs go first (their hand-over ends them here, so the last
 * generation of the record is written without them); if it cannot be
 * written they failed instead, and their replies are written before the
 * execve. An execve that fails replays them in this image.
 */
static void restart_exec(struct daemon *d)
{
	struct restart *r = &d->restart;
	static char inherit[65536];
	int queue_fd = -1;
	if (replay_hand_over(d, restart_conn_clean, &queue_fd) != 0) {
		r->flush_since = 0;
		uv_timer_start(&r->timer, restart_flush, 0, 0);
		return;
	}
	durable_flush(d); /* the last generation: every job has ended */
	restart_handover(d, queue_fd, inherit, sizeof inherit);
	setenv(RECOVER_ENV, inherit, 1);
	log_info("re-executing %s (%s) after %.3f s of draining", r->binary, r->reason,
		 monotonic_seconds() - r->since);
	execve(r->binary, r->argv, environ);
	log_error("the restart failed: execve %s: %s; gpuqd keeps serving", r->binary, strerror(errno));
	unsetenv(RECOVER_ENV);
	restart_take_back(d);
	r->active = false;
	replay_run(d, queue_fd, "the failed re-exec");
}

/* Whether every connection's replies have been written. */
static bool restart_flushed(struct daemon *d)
{
	for (const struct conn *c = d->server.conns; c; c = c->next)
		if (!c->closed && c->out_bytes > 0)
			return false;
	return true;
}

static void restart_flush(uv_timer_t *t)
{
	struct daemon *d = t->data;
	struct restart *r = &d->restart;
	if (d->stopping) { /* a shutdown came during the drain: it wins */
		r->active = false;
		return;
	}
	if (r->flush_since == 0)
		r->flush_since = monotonic_seconds();
	if (!restart_flushed(d) && (monotonic_seconds() - r->flush_since) * 1e3 < RESTART_FLUSH_MS) {
		uv_timer_start(t, restart_flush, RESTART_POLL_MS, 0);
		return;
	}
	restart_exec(d);
}

static void restart_on_timer(uv_timer_t *t)
{
	struct daemon *d = t->data;
	struct restart *r = &d->restart;
	if (restart_running(d) == 0 || r->cancel_sent) {
		restart_flush(t);
		return;
	}
	log_warn("%u jobs still running after --restart-drain; they fail with `restarted`",
		 restart_running(d));
	r->cancel_sent = true;
	jobs_cancel_running(d);
	uv_timer_start(t, restart_on_timer, RESTART_CANCEL_GRACE_MS, 0);
}

void restart_step(struct daemon *d)
{
	struct restart *r = &d->restart;
	if (!r->active)
		return;
	if (restart_running(d) > 0) {
		if (!r->cancel_sent) { /* the drain's bound, from the request on */
			double left = d->opt.restart_drain_ms - (monotonic_seconds() - r->since) * 1e3;
			uv_timer_start(&r->timer, restart_on_timer, left > 0 ? (uint64_t)left : 0, 0);
		}
		return;
	}
	uv_timer_stop(&r->timer);
	restart_flush(&r->timer);
}

/* Fault restarts asked within the last window_s seconds. */
static unsigned restart_faults_within(const struct restart *r, uint64_t now_ms, unsigned window_s)
{
	unsigned n = 0;
	for (unsigned i = 0; i < r->nfault; i++)
		n += now_ms - r->fault_ms[i] < (uint64_t)window_s * 1000;
	return n;
}

bool restart_after_fault(struct daemon *d, int index)
{
	struct restart *r = &d->restart;
	struct gpuq_error err;
	char reason[96];
	uint64_t now_ms = (uint64_t)(monotonic_seconds() * 1e3);
	unsigned limit = d->opt.device.reset_limit, window = d->opt.device.reset_window_s;
	unsigned recent = restart_faults_within(r, now_ms, window);
	if (r->active)
		return true; /* one under way brings this device back too */
	if (recent >= limit) {
		log_error("gpu %d needs a new gpuqd process after a fault, but %u restarts after faults "
			  "within %u s is the limit (--reset-limit, --reset-window): it stays unhealthy "
			  "for an operator (gpuq admin restart)", index, recent, window);
		return false;
	}
	snprintf(reason, sizeof reason, "gpu %d needs a new process after a fault", index);
	if (restart_request(d, NULL, reason, &err) != 0) {
		log_error("gpu %d needs a new process after a fault, and the restart failed: %s", index,
			  err.message);
		return false;
	}
	if (r->nfault == sizeof r->fault_ms / sizeof r->fault_ms[0]) /* the oldest goes */
		memmove(r->fault_ms, r->fault_ms + 1, --r->nfault * sizeof r->fault_ms[0]);
	r->fault_ms[r->nfault++] = now_ms;
	return true;
}

void restart_close(struct daemon *d)
{
	struct restart *r = &d->restart;
	if (!r->handles)
		return;
	r->handles = false;
	uv_close((uv_handle_t *)&r->sigusr2, NULL);
	uv_close((uv_handle_t *)&r->timer, NULL);
}
