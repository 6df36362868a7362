/*
 * Integration-test fixture: a private gpuqd on a temporary socket, clients
 * that talk to it through libgpuq or raw bytes, and reply helpers.
 *
 * The backend under test comes from GPUQ_TEST_BACKEND (host or cuda); the
 * binaries from GPUQ_BUILD (default build). With the cuda backend and no
 * usable GPU every test reports itself skipped, saying why.
 */
#ifndef GPUQ_TEST_FIXTURE_H
#define GPUQ_TEST_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "client/lib/gpuq.h"
#include "tests/harness.h"

struct daemon_proc {
	pid_t pid;
	char dir[40];
	char sock[100];
	char log[128];
};

const char *test_backend(void);
bool test_backend_is_cuda(void);
/* Runs gpuqd --probe for the backend once (call from main, before the tests). */
void fixture_probe(void);
/* Skips the current test unless the probe found a device for the backend. */
void require_backend(void);

/*
 * The binary daemon_start runs, relative to GPUQ_BUILD: "gpuqd",
 * or "tests/gpuqd-faults" (the fault-injection build) for a test that sets it
 * before starting its daemon.
 */
extern const char *fixture_daemon_binary;
/* RLIMIT_NOFILE (soft and hard) for the daemons started next; 0 (the default): inherited. */
extern unsigned long fixture_daemon_nofile;
/* Starts gpuqd with the test backend and extra arguments (NULL-terminated). */
void daemon_start(struct daemon_proc *d, ...);
/* Starts gpuqd again on the same socket path and directory (after it died). */
void daemon_restart(struct daemon_proc *d, ...);
/* SIGTERM; checks a clean exit (status 0) and that the socket file is gone. */
void daemon_stop(struct daemon_proc *d);
/* How many descriptors the daemon holds now (/proc/PID/fd). */
unsigned daemon_fd_count(const struct daemon_proc *d);
/* Prints the daemon's log to stderr (for failing tests). */
void daemon_dump_log(const struct daemon_proc *d);
/* Lines of the daemon's log that contain text (0 while it has no log). */
int daemon_log_count(const struct daemon_proc *d, const char *text);
bool daemon_alive(const struct daemon_proc *d);

/* The socket's group in tests that act as other uids: every test uid is in it. */
#define NOGROUP 65534

/*
 * Starts the gpuq CLI (GPUQ_BUILD/gpuq --socket d's ARGS..., NULL-terminated)
 * in a child whose output goes to /dev/null; returns its pid.
 */
pid_t spawn_gpuq(const struct daemon_proc *d, ...);

/* Writes text to path; fails the test if it cannot. */
void write_file(const char *path, const char *text);
/* A configuration file holding text (its path in a static buffer). */
const char *config_file(const char *text);
/*
 * Starts gpuqd with that configuration (and one more argument, if any),
 * serving group nogroup, so that other uids may connect. Skips the test
 * unless it runs as root.
 */
void start_with_config(struct daemon_proc *d, const char *text, const char *more);
/* Runs fn in a child as uid with supplementary groups; fails the test if fn fails. */
void as_user(uid_t uid, const gid_t *groups, int ngroups, void (*fn)(void *), void *arg);

struct gpuq_client *client_open(const struct daemon_proc *d);

/* Sends req (consumed) and returns the reply; fails the test on transport errors. */
struct gpuq_reply *call(struct gpuq_client *c, struct mp_map *req, const int *fds, int nfds);
/* Fails the test unless r is ok (prints the error); frees nothing. */
void expect_ok(const struct gpuq_reply *r, const char *what);
/* Fails unless r failed with code and its message contains `contains` (if given). */
void expect_error(const struct gpuq_reply *r, enum gpuq_errc code, const char *contains);
/* A request about one job (status, wait, cancel), with timeout_ms when not 0. */
struct gpuq_reply *job_request(struct gpuq_client *c, const char *op, uint64_t job,
			       uint64_t timeout_ms);
/* CLOCK_MONOTONIC, in seconds. */
double now_s(void);

/* Value at a dotted path ("job.result.checksum", "devices.0.name") in the reply; fails if absent. */
uint64_t reply_u64(const struct gpuq_reply *r, const char *path);
double reply_f64(const struct gpuq_reply *r, const char *path);
/* Copies a string at path into out. */
void reply_str(const struct gpuq_reply *r, const char *path, char *out, size_t size);
const msgpack_object *reply_path(const struct gpuq_reply *r, const char *path);

/*
 * Skips the test unless the daemon's RLIMIT_MEMLOCK (which its regions count
 * against) leaves room for bytes of regions: a machine whose limit is tiny
 * (a container's 64 KiB) says so rather than failing.
 */
void require_memlock(struct gpuq_client *c, uint64_t bytes);
/* How many devices the daemon serves (from ping). */
int device_count(struct gpuq_client *c);
/* A device's free memory as `devices` reports it (the host arena counts exactly). */
uint64_t device_mem_free(struct gpuq_client *c, int device);
/* What the caller's quota says it uses: `quota`'s users.0.used.<what> (e.g. "host_pinned"). */
uint64_t quota_used(struct gpuq_client *c, const char *what);
/* Whether the caller has a buffer called name; *ephemeral (may be NULL) says how it was made. */
bool has_buffer(struct gpuq_client *c, const char *name, bool *ephemeral);
/*
 * name's state in `buffers` ("absent" when not listed) into state, and,
 * when why is not NULL, a suspect one's reason into why ("" when none).
 */
void buffer_state(struct gpuq_client *c, const char *name, char *state, size_t n, char *why,
		  size_t wn);
/* Waits up to 3 s for the caller's buffer name to be gone; false if it stays. */
bool buffer_goes(struct gpuq_client *c, const char *name);

/* One-call conveniences for the common jobs (all with wait: true; fail the test if refused). */
void do_alloc(struct gpuq_client *c, const char *name, int device, uint64_t bytes);
/* count elements of dtype ("f32", ...) */
void do_alloc_typed(struct gpuq_client *c, const char *name, int device, const char *dtype,
		    uint64_t count);
void do_fill_random(struct gpuq_client *c, const char *buffer, uint64_t seed);
uint64_t do_checksum(struct gpuq_client *c, const char *buffer);
void do_free(struct gpuq_client *c, const char *buffer);
/* put/get through fd; returns the bytes the job reports. */
uint64_t do_put(struct gpuq_client *c, const char *buffer, int fd);
uint64_t do_get(struct gpuq_client *c, const char *buffer, int fd);

/*
 * Submits op (put or get) of buffer with descriptor fd, not waited for;
 * returns its job id once the worker runs it (fails the test if it does not
 * start running within 2 s). fd stays the caller's.
 */
uint64_t start_running_transfer(struct gpuq_client *c, const char *op, const char *buffer, int fd);
/* Waits (up to 2 s) until job runs, and fails the test if it does not. */
void wait_job_running(struct gpuq_client *c, uint64_t job);
/* reset_device of device, which must be accepted (root and the admin group). */
void do_reset_device(struct gpuq_client *c, int device);
/*
 * Starts a put into buffer from a pipe that nobody writes, so that it runs
 * until the test writes or closes p[1]; returns its job id once the worker
 * runs it (fails the test if it does not start running within 2 s).
 */
uint64_t start_stalled_put(struct gpuq_client *c, const char *buffer, int p[2]);

/* A memfd holding n random bytes from seed (offset 0); the caller closes it. */
int memfd_random(size_t n, uint64_t seed);
/* The same, sealed against shrinking (what path registered takes). */
int sealed_memfd(size_t n, uint64_t seed);
/* Reads a whole fd from offset 0 into a fresh malloc'd buffer of *n bytes. */
void *fd_slurp(int fd, size_t *n);

/* A `restart` request (binary: another gpuqd to run, or NULL), its reply. */
struct gpuq_reply *restart_call(struct gpuq_client *c, const char *binary);
/* The re-execs ping counts (0 before the first); *pid (may be NULL) gets gpuqd's pid. */
uint64_t ping_restarts(struct gpuq_client *c, uint64_t *pid);
/* Pings on c (a connection the re-exec hands over) until gpuqd counts want re-execs; up to 10 s. */
void await_restarts(struct gpuq_client *c, uint64_t want);
/* A `restart` of gpuqd's own binary on c, which must be accepted. */
void restart_ok(struct gpuq_client *c);
/* restart_ok, then await_restarts(c, want). */
void restart_and_await(struct gpuq_client *c, uint64_t want);

/* Raw socket access for malformed-frame tests. */
int raw_connect(const struct daemon_proc *d);
void raw_write(int fd, const void *data, size_t len);
/* One sendmsg of data with n descriptors attached (SCM_RIGHTS); fails the test unless all of it went. */
void raw_send_fds(int fd, const void *data, size_t len, const int *fds, int n);
/* A request frame {v: 1, id, op} (and pad: a string of pad bytes when pad > 0) into sb. */
void raw_frame(msgpack_sbuffer *sb, uint64_t id, const char *op, size_t pad);
/* Reads one reply frame and returns its error code name in code (or "ok"); -1 on EOF. */
int raw_read_reply(int fd, char *code, size_t size);
/* raw_read_reply, and the error's message into message ("" for ok). */
int raw_read_error(int fd, char *code, size_t size, char *message, size_t msize);
/* True once the daemon has closed fd (read returns 0 within timeout_ms). */
bool raw_closed_by_peer(int fd, int timeout_ms);

#endif
