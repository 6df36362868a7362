/*
 * The per-GPU scheduler, seen from clients: independent jobs overlap, jobs
 * on one buffer keep their order, urgent jobs pass queued ones, owners share
 * a device, allocations wait for memory, and 8 clients' random jobs end with
 * the same buffers as a serial replay. The checks are on the order of
 * events (which job is still running when another is done, what the
 * daemon's own counters and job records say), not on this machine's clock:
 * CI and newcomers' machines are loaded. DMA turns are counted in the
 * host engines' trace of the copies they take (GPUQ_HOST_ENGINE_TRACE);
 * the times themselves are `gpuq bench sched`'s, on the GPU. On the host
 * backend the engines are slowed (GPUQ_HOST_ENGINE_DELAY_US) so that
 * sleeps, not this machine's cores, set the pace.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "workers/backend/host_patterns.h"
#include "workers/sched/sched_wait.h"

/* The engine delays only mean something on the host backend; the GPU is fast enough as it is. */
static void slow_engines(const char *spec)
{
	if (!test_backend_is_cuda())
		setenv("GPUQ_HOST_ENGINE_DELAY_US", spec, 1);
}

static void wait_ok(struct gpuq_client *c, uint64_t job, const char *what)
{
	struct gpuq_reply *r = job_request(c, "wait", job, 60000);
	expect_ok(r, what);
	gpuq_reply_free(r);
}

static void state_of(struct gpuq_client *c, uint64_t job, char *state, size_t size)
{
	struct gpuq_reply *r = job_request(c, "status", job, 0);
	expect_ok(r, "status");
	reply_str(r, "job.state", state, size);
	gpuq_reply_free(r);
}

/* Sends a prepared job request detached (or waiting) and returns its job id. */
static uint64_t submit(struct gpuq_client *c, struct mp_map *req, const int *fds, int nfds)
{
	struct gpuq_reply *r = call(c, req, fds, nfds);
	expect_ok(r, "job request");
	uint64_t id = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	return id;
}

/* A put from fd (a memfd the caller made beforehand, so that making it is not timed). */
static uint64_t start_put_fd(struct gpuq_client *c, const char *buffer, int fd, const char *priority)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", buffer);
	mp_put_u64(&req, "fds", 1);
	if (priority)
		mp_put_str(&req, "priority", priority);
	return submit(c, &req, &fd, 1);
}

static uint64_t start_put_memfd(struct gpuq_client *c, const char *buffer, size_t n, uint64_t seed,
				const char *priority)
{
	int fd = memfd_random(n, seed);
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", buffer);
	mp_put_u64(&req, "fds", 1);
	if (priority)
		mp_put_str(&req, "priority", priority);
	uint64_t id = submit(c, &req, &fd, 1);
	close(fd);
	return id;
}

static uint64_t start_simple(struct gpuq_client *c, const char *op, const char *buffer,
			     const char *priority)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	if (buffer)
		mp_put_str(&req, "buffer", buffer);
	if (priority)
		mp_put_str(&req, "priority", priority);
	return submit(c, &req, NULL, 0);
}

TEST(sched_a_small_job_on_another_buffer_passes_a_long_one)
{
	slow_engines("h2d:40000");
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	size_t big = test_backend_is_cuda() ? (size_t)1 << 30 : (size_t)8 << 20;
	do_alloc(c, "big", 0, big);
	do_alloc(c, "small", 0, 4096);
	do_fill_random(c, "small", 7);
	char state[16];
	/*
	 * The order of events, not a ratio of times: a checksum that waited for
	 * the put would find it done. On a machine so loaded that this client
	 * sleeps through the put's 0.16 s before the checksum is sent, the put
	 * is done anyway: then it is tried once more.
	 */
	for (int attempt = 0; attempt < 2; attempt++) {
		int src = memfd_random(big, 1);
		uint64_t put = start_put_fd(c, "big", src, NULL); /* 4 slots' DMAs at 40 ms each here */
		close(src);
		usleep(20000);
		uint64_t sum = start_simple(c, "checksum", "small", NULL);
		wait_ok(c, sum, "the checksum");
		state_of(c, put, state, sizeof state);
		wait_ok(c, put, "the put");
		if (strcmp(state, "running") == 0)
			break;
	}
	CHECKF(strcmp(state, "running") == 0, "the long put is %s when the checksum is done", state);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(sched_jobs_on_one_buffer_keep_their_order)
{
	slow_engines("h2d:20000");
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	size_t n = (size_t)6 << 20;
	do_alloc(c, "w", 0, n);
	do_fill_random(c, "w", 99);
	/* put (slow), then get, checksum and fill on the same buffer, all detached at once */
	uint64_t put = start_put_memfd(c, "w", n, 5, "low");
	int out = memfd_random(0, 0);
	struct mp_map req;
	gpuq_request_begin(c, &req, "get");
	mp_put_str(&req, "buffer", "w");
	mp_put_u64(&req, "fds", 1);
	mp_put_str(&req, "priority", "high");
	uint64_t get = submit(c, &req, &out, 1);
	uint64_t sum = start_simple(c, "checksum", "w", "high");
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", "w");
	mp_put_str(&req, "pattern", "zero");
	uint64_t fill = submit(c, &req, NULL, 0);
	uint64_t after = start_simple(c, "checksum", "w", NULL);
	uint64_t jobs[] = { put, get, sum, fill, after };
	for (int i = 0; i < 5; i++)
		wait_ok(c, jobs[i], "a job on w");
	/* the get and the first checksum saw the put's bytes; the last checksum the zeros */
	size_t got_n;
	unsigned char *got = fd_slurp(out, &got_n);
	unsigned char *want = malloc(n);
	host_fill_random(want, n, GPUQ_DTYPE_BYTES, 5);
	CHECK_EQ(got_n, n);
	CHECK(memcmp(got, want, n) == 0);
	struct gpuq_reply *r = job_request(c, "status", sum, 0);
	CHECK_EQ(reply_u64(r, "job.result.checksum"), host_checksum(want, n));
	gpuq_reply_free(r);
	memset(want, 0, n);
	r = job_request(c, "status", after, 0);
	CHECK_EQ(reply_u64(r, "job.result.checksum"), host_checksum(want, n));
	gpuq_reply_free(r);
	free(got);
	free(want);
	close(out);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * The engines a device's jobs keep busy now, from the daemon's own
 * counters (devices: scheduler.inflight_by_engine): bit 0 h2d, 1 d2h, 2 kernel.
 */
static unsigned engines_busy(struct gpuq_client *c)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "devices");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "devices");
	static const char *const engines[] = { "h2d", "d2h", "kernel" };
	unsigned busy = 0;
	for (unsigned i = 0; i < 3; i++) {
		char path[64];
		snprintf(path, sizeof path, "devices.0.scheduler.inflight_by_engine.%s", engines[i]);
		if (reply_u64(r, path) > 0)
			busy |= 1u << i;
	}
	gpuq_reply_free(r);
	return busy;
}

/* Whether every job of ids has ended. */
static bool all_done(struct gpuq_client *c, const uint64_t *ids, int n)
{
	for (int i = 0; i < n; i++) {
		char state[16];
		state_of(c, ids[i], state, sizeof state);
		if (strcmp(state, "queued") == 0 || strcmp(state, "running") == 0)
			return false;
	}
	return true;
}

/*
 * put, get and a kernel job on three buffers overlap: the daemon's own
 * counters show the three engines busy at once. Jobs run one after another
 * never show that, so the test fails then. Each job takes about 0.4 s
 * here, so even a slow client looks while all three run; one that missed
 * it (it saw no moment with all three in flight) tries once more. The
 * time saved is gpuq bench sched's to measure (together_over_longest).
 */
TEST(sched_a_put_a_get_and_a_fill_overlap)
{
	if (test_backend_is_cuda())
		SKIP("on the GPU, gpuq bench sched measures the overlap against the hardware's ceiling");
	slow_engines("h2d:100000,d2h:100000,compute:400000");
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	size_t n = (size_t)8 << 20; /* 4 slots: 0.4 s of copies each way */
	do_alloc(c, "a", 0, n);
	do_alloc(c, "b", 0, n);
	do_alloc(c, "k", 0, n);
	int src = memfd_random(n, 3);
	unsigned seen = 0, ever = 0; /* engines busy at one moment; at any */
	for (int attempt = 0; attempt < 2 && seen != 7; attempt++) {
		int out = memfd_random(0, 0);
		uint64_t ids[3];
		CHECK(lseek(src, 0, SEEK_SET) == 0);
		ids[0] = start_put_fd(c, "a", src, NULL);
		struct mp_map req;
		gpuq_request_begin(c, &req, "get");
		mp_put_str(&req, "buffer", "b");
		mp_put_u64(&req, "fds", 1);
		ids[1] = submit(c, &req, &out, 1);
		gpuq_request_begin(c, &req, "fill");
		mp_put_str(&req, "buffer", "k");
		mp_put_str(&req, "pattern", "zero");
		ids[2] = submit(c, &req, NULL, 0);
		/* Until all three are in flight at once, or none is left to run. */
		for (;;) {
			seen = engines_busy(c);
			ever |= seen;
			if (seen == 7 || all_done(c, ids, 3))
				break;
			usleep(1000);
		}
		for (int j = 0; j < 3; j++)
			wait_ok(c, ids[j], "together");
		close(out);
	}
	close(src);
	CHECKF(seen == 7, "the put, get and fill were never in flight at once (engines seen busy, "
	       "bits h2d d2h kernel: %#x)", ever);
	gpuq_close(c);
	daemon_stop(&d);
}

/* For each job of ids, whether it has started (is no longer queued), all from one `jobs` reply. */
static void job_snapshot(struct gpuq_client *c, const uint64_t *ids, int n, bool *started)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "jobs");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "jobs");
	const msgpack_object *list = reply_path(r, "jobs");
	CHECK(list && list->type == MSGPACK_OBJECT_ARRAY);
	for (int i = 0; i < n; i++) {
		bool found = false;
		for (uint32_t k = 0; k < list->via.array.size && !found; k++) {
			const msgpack_object *rec = &list->via.array.ptr[k];
			const msgpack_object *id = msg_map_get(rec, "job");
			const msgpack_object *state = msg_map_get(rec, "state");
			if (!id || id->type != MSGPACK_OBJECT_POSITIVE_INTEGER || id->via.u64 != ids[i])
				continue;
			CHECK(state && state->type == MSGPACK_OBJECT_STR);
			found = true;
			started[i] = !(state->via.str.size == 6 && memcmp(state->via.str.ptr, "queued", 6) == 0);
		}
		CHECKF(found, "jobs does not list job %" PRIu64, ids[i]);
	}
	gpuq_reply_free(r);
}

TEST(sched_urgent_jobs_go_first)
{
	slow_engines("compute:100000");
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=1", NULL);
	struct gpuq_client *c = client_open(&d);
	for (int i = 0; i < 4; i++) {
		char name[16];
		snprintf(name, sizeof name, "b%d", i);
		do_alloc(c, name, 0, 4096);
	}
	do_alloc(c, "w", 0, 16);
	int p[2];
	uint64_t put = start_stalled_put(c, "w", p); /* normal: the one job in flight */
	uint64_t low1 = start_simple(c, "checksum", "b0", "low");
	uint64_t low2 = start_simple(c, "checksum", "b1", "low");
	uint64_t normal = start_simple(c, "checksum", "b2", "normal");
	uint64_t high = start_simple(c, "checksum", "b3", "high");
	/* high passes the full device at once; the others wait their turn */
	wait_ok(c, high, "high");
	char state[16];
	state_of(c, low1, state, sizeof state);
	CHECK_STR(state, "queued");
	struct gpuq_reply *r = job_request(c, "status", low1, 0);
	char reason[32], prio[16];
	reply_str(r, "job.waiting_reason", reason, sizeof reason);
	reply_str(r, "job.priority", prio, sizeof prio);
	/* the device is full; whether the scheduler has looked at low 1 since normal came depends on timing */
	CHECKF(strcmp(reason, "inflight") == 0 || strcmp(reason, "queue") == 0, "low 1 waits for '%s'",
	       reason);
	CHECK_STR(prio, "low");
	gpuq_reply_free(r);
	/* the most urgent job left is the one the full device holds back, and says so */
	for (int tries = 0;; tries++) {
		r = job_request(c, "status", normal, 0);
		reply_str(r, "job.waiting_reason", reason, sizeof reason);
		gpuq_reply_free(r);
		if (strcmp(reason, "inflight") == 0 || tries == 200)
			break;
		usleep(10000);
	}
	CHECK_STR(reason, "inflight");
	close(p[1]);
	/*
	 * They start one at a time (--max-inflight=1), 0.1 s apart: normal, then
	 * low 1, then low 2. Every snapshot of their states (one `jobs` reply)
	 * must agree: a job has not started while one that goes before it is
	 * still queued. Start order is order of events, which a loaded machine
	 * does not change (a client that looks too rarely sees fewer snapshots).
	 */
	uint64_t order[3] = { normal, low1, low2 };
	for (bool started[3] = { false };;) {
		job_snapshot(c, order, 3, started);
		for (int i = 1; i < 3; i++)
			CHECKF(!started[i] || started[i - 1], "%s started while %s was queued",
			       i == 1 ? "low 1" : "low 2", i == 1 ? "normal" : "low 1");
		if (started[2])
			break;
		usleep(2000);
	}
	wait_ok(c, put, "the put");
	wait_ok(c, low2, "low 2");
	/* submitted after low 1, started before it: its wait was shorter, whatever the load */
	r = job_request(c, "status", normal, 0);
	double q_normal = reply_f64(r, "job.queued_s");
	gpuq_reply_free(r);
	r = job_request(c, "status", low1, 0);
	double q_low1 = reply_f64(r, "job.queued_s");
	gpuq_reply_free(r);
	CHECKF(q_normal < q_low1, "queued: normal %.3f s, low 1 %.3f s", q_normal, q_low1);
	close(p[0]);
	gpuq_close(c);
	daemon_stop(&d);
}

static uint64_t start_fill_zero(struct gpuq_client *c, const char *buffer, const char *priority)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "pattern", "zero");
	if (priority)
		mp_put_str(&req, "priority", priority);
	return submit(c, &req, NULL, 0);
}

/* The job's waiting_reason into reason ("" when it has none), and its waiting_job (0: none). */
static uint64_t reason_of(struct gpuq_client *c, uint64_t job, char *reason, size_t size)
{
	struct gpuq_reply *r = job_request(c, "status", job, 0);
	expect_ok(r, "status");
	reason[0] = '\0';
	if (reply_path(r, "job.waiting_reason"))
		reply_str(r, "job.waiting_reason", reason, size);
	uint64_t behind = reply_path(r, "job.waiting_job") ? reply_u64(r, "job.waiting_job") : 0;
	gpuq_reply_free(r);
	return behind;
}

/*
 * A user's jobs queued on one buffer behind a stalled put (however many)
 * do not keep that user's job on another buffer out while the device has
 * room: it starts before a later, less urgent job on a third buffer, and
 * each blocked job says which job it is behind.
 */
TEST(sched_jobs_blocked_on_a_buffer_let_the_same_users_other_jobs_pass)
{
	enum { BLOCKED = 24 };
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=4", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "x", 0, 4096);
	do_alloc(c, "y1", 0, 4096);
	do_alloc(c, "y2", 0, 4096);
	int p[2];
	uint64_t put = start_stalled_put(c, "x", p);
	uint64_t fills[BLOCKED];
	for (int i = 0; i < BLOCKED; i++)
		fills[i] = start_fill_zero(c, "x", NULL);
	uint64_t normal = start_fill_zero(c, "y1", NULL);
	uint64_t low = start_fill_zero(c, "y2", "low");
	wait_ok(c, low, "the low fill on y2");
	char state[16], reason[32];
	state_of(c, normal, state, sizeof state);
	reason_of(c, normal, reason, sizeof reason);
	CHECKF(strcmp(state, "queued") != 0,
	       "the normal fill on y1 is queued (waiting_reason '%s') after a later low one ran", reason);
	for (int i = 0; i < BLOCKED; i++) {
		uint64_t behind = reason_of(c, fills[i], reason, sizeof reason);
		CHECK_STR(reason, "buffer");
		CHECK_EQ(behind, i ? fills[i - 1] : put);
	}
	close(p[1]);
	wait_ok(c, put, "the put");
	for (int i = 0; i < BLOCKED; i++)
		wait_ok(c, fills[i], "a fill on x");
	wait_ok(c, normal, "the normal fill on y1");
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * With twice --max-inflight in flight (urgent jobs took the extra room),
 * the next urgent job waits for room in flight and says so, as it does
 * below that.
 */
TEST(sched_a_job_held_at_twice_the_inflight_limit_says_inflight)
{
	struct daemon_proc d;
	daemon_start(&d, "--max-inflight=2", NULL);
	struct gpuq_client *c = client_open(&d);
	const char *priorities_of[5] = { "low", "low", "high", "high", "high" };
	int pipes[5][2];
	uint64_t puts[5];
	char names[5][16];
	for (int i = 0; i < 5; i++) { /* first: an alloc would wait for room in flight too */
		snprintf(names[i], sizeof names[i], "b%d", i);
		do_alloc(c, names[i], 0, 4096);
	}
	for (int i = 0; i < 5; i++) {
		CHECK(pipe(pipes[i]) == 0);
		puts[i] = start_put_fd(c, names[i], pipes[i][0], priorities_of[i]);
		close(pipes[i][0]);
		if (i < 4)
			wait_job_running(c, puts[i]);
	}
	char state[16], reason[32] = "";
	for (int tries = 0; tries < 200 && strcmp(reason, "inflight") != 0; tries++) {
		if (tries)
			usleep(10000);
		reason_of(c, puts[4], reason, sizeof reason);
	}
	state_of(c, puts[4], state, sizeof state);
	CHECK_STR(state, "queued");
	CHECK_STR(reason, "inflight");
	for (int i = 0; i < 5; i++)
		close(pipes[i][1]);
	for (int i = 0; i < 5; i++)
		wait_ok(c, puts[i], "a put");
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * DMA turns. The host backend's DMA engines, like a GPU's copy engines,
 * stay with one stream while it has a copy ready and ignore priorities, so
 * a transfer that keeps its queue full shuts out every other's copies. A
 * one-chunk put runs while `n` puts of TURN_BACKLOG_CHUNKS chunks each
 * (priority `backlog`) run on other buffers: the device queues at most SCHED_DMA_QUEUE (6) DMAs
 * for all of them, stops queueing theirs while the small put's waits, and
 * gives the small put its turn first, so it waits behind about 6 chunks,
 * not until the long puts end.
 *
 * Counted, not timed: the engines write each copy they take to a trace
 * (GPUQ_HOST_ENGINE_TRACE: engine, device, stream, bytes), the test marks
 * in it when it sends the small put, and counts the long puts' chunks
 * copied between the mark and the small put's own copy (its size,
 * TURN_SMALL, is no long put's). A put alone on the device moves up to
 * four read chunks in one copy (XFER_DMA_SPAN_BYTES), so a chunk is
 * counted by its bytes, and the long puts are long enough that the one
 * that runs alone first is still running when the small put comes. The slowed engines (20 ms a copy) keep this machine's
 * load out of the order; a miss is still measured again (a fresh daemon)
 * before the test fails, since a client that a loaded machine holds up
 * for SCHED_DMA_ALONE_S can find a long put alone again.
 */
#define TURN_MAX_BACKLOG 8
#define TURN_CHUNK (64u << 10)
#define TURN_BACKLOG_CHUNKS 256
#define TURN_SMALL (60u << 10)
#define TURN_CHUNK_DELAY_US "20000"
#define TURN_ATTEMPTS 3
/*
 * Copies the small put may see taken before its own, beyond the queue it
 * met: besides that queue it waits for a staging slot (the long puts hold
 * them all) and for the worker to admit it and read its chunk, a copy or
 * few on the slowed engines (10-14 beside eight long puts here, where the
 * queue is 6; 13 in three tries in a row once, on a 2-core machine). Twice
 * the queue: without turns it waits behind hundreds, and a long put alone
 * behind the rest of its 64 chunks.
 */
#define TURN_SLACK (2 * SCHED_DMA_QUEUE)

/* A trace of the host engines' copies, in a fresh file. */
struct trace {
	char path[64];
};

static void trace_start(struct trace *t)
{
	snprintf(t->path, sizeof t->path, "/tmp/gpuq-trace.XXXXXX");
	int fd = mkstemp(t->path);
	CHECKF(fd >= 0, "mkstemp: %s", strerror(errno));
	close(fd);
	if (!test_backend_is_cuda())
		setenv("GPUQ_HOST_ENGINE_TRACE", t->path, 1);
}

static void trace_stop(struct trace *t)
{
	unsetenv("GPUQ_HOST_ENGINE_TRACE");
	unlink(t->path);
}

/* Appends the mark (the engines append their lines to the same file). */
static void trace_mark(const struct trace *t)
{
	int fd = open(t->path, O_WRONLY | O_APPEND | O_CLOEXEC);
	CHECK(fd >= 0 && write(fd, "mark\n", 5) == 5);
	close(fd);
}

/*
 * One copy the trace holds: its stream and bytes; mark for the test's
 * marks; queued for the line written as the copy was queued (the others
 * are written as its engine takes it).
 */
struct traced {
	bool mark, queued;
	unsigned stream;
	size_t bytes;
};

/*
 * The copies of engine `kind` ("h2d", "d2h") on device 0 as their engine
 * took them and the marks, with `queued` also each copy as it was queued,
 * in order (malloc'd, *n of them).
 */
static struct traced *trace_read_events(const struct trace *t, const char *kind, bool queued,
					size_t *n)
{
	FILE *f = fopen(t->path, "r");
	CHECK(f != NULL);
	size_t cap = 256;
	struct traced *out = malloc(cap * sizeof *out);
	char line[128];
	CHECK(out != NULL);
	*n = 0;
	while (fgets(line, sizeof line, f)) {
		struct traced c = { false, false, 0, 0 };
		char engine[8];
		int dev;
		const char *copy = line;
		if (strncmp(line, "queued ", 7) == 0) {
			c.queued = true;
			copy += 7;
		}
		if (strcmp(line, "mark\n") == 0)
			c.mark = true;
		else if ((c.queued && !queued) ||
			 sscanf(copy, "%7s %d %u %zu", engine, &dev, &c.stream, &c.bytes) != 4 ||
			 strcmp(engine, kind) != 0 || dev != 0)
			continue;
		if (*n == cap) {
			cap *= 2;
			out = realloc(out, cap * sizeof *out);
			CHECK(out != NULL);
		}
		out[(*n)++] = c;
	}
	fclose(f);
	return out;
}

static struct traced *trace_read_kind(const struct trace *t, const char *kind, size_t *n)
{
	return trace_read_events(t, kind, false, n);
}

static struct traced *trace_read(const struct trace *t, size_t *n)
{
	return trace_read_kind(t, "h2d", n);
}

/* Chunks (TURN_CHUNK's worth) copied after mark number `mark` (0 first) and before the next copy of `bytes`. */
static int copies_ahead(const struct traced *c, size_t n, unsigned mark, size_t bytes)
{
	unsigned marks = 0;
	int ahead = -1;
	for (size_t i = 0; i < n; i++) {
		if (c[i].mark) {
			if (marks++ == mark)
				ahead = 0;
		} else if (ahead >= 0 && c[i].bytes == bytes) {
			return ahead;
		} else if (ahead >= 0) {
			ahead += (int)((c[i].bytes + TURN_CHUNK - 1) / TURN_CHUNK);
		}
	}
	CHECKF(false, "the trace has no copy of %zu bytes after mark %u", bytes, mark);
	return -1;
}

/* The one-chunk put from fd, waited for, the trace marked as it is sent. */
static void marked_put(struct gpuq_client *c, const struct trace *t, const char *buffer, int fd,
		       const char *priority)
{
	CHECK(lseek(fd, 0, SEEK_SET) == 0); /* a put reads from the descriptor's offset on */
	trace_mark(t);
	uint64_t job = start_put_fd(c, buffer, fd, priority);
	wait_ok(c, job, "the one-chunk put");
}

/* Copies of the long puts the small put waited behind: beside the backlog, then again right after. */
struct turn_counts {
	int busy, again;
};

/* A daemon whose engines are slowed and traced into t, with 64 staging slots of `slot`; its client. */
static struct gpuq_client *turn_daemon(struct daemon_proc *d, struct trace *t, const char *slot)
{
	slow_engines("h2d:" TURN_CHUNK_DELAY_US);
	trace_start(t);
	daemon_start(d, "--staging-slot", slot, "--staging-slots", "64", NULL);
	return client_open(d);
}

static struct turn_counts put_behind_backlog(int n, const char *backlog, const char *priority)
{
	struct trace t;
	struct daemon_proc d;
	struct gpuq_client *c = turn_daemon(&d, &t, "64K");
	int small = memfd_random(TURN_SMALL, 99);
	uint64_t jobs[TURN_MAX_BACKLOG];
	do_alloc(c, "small", 0, TURN_SMALL);
	for (int i = 0; i < n; i++) {
		char name[16];
		snprintf(name, sizeof name, "big%d", i);
		do_alloc(c, name, 0, TURN_BACKLOG_CHUNKS * TURN_CHUNK);
		int fd = memfd_random(TURN_BACKLOG_CHUNKS * TURN_CHUNK, (uint64_t)i);
		jobs[i] = start_put_fd(c, name, fd, backlog);
		close(fd);
	}
	usleep(150000); /* every put of the backlog runs, with its DMAs queued */
	marked_put(c, &t, "small", small, priority);
	marked_put(c, &t, "small", small, priority);
	for (int i = 0; i < n; i++) {
		char state[16];
		state_of(c, jobs[i], state, sizeof state);
		CHECKF(strcmp(state, "running") == 0, "put %d of the backlog is %s after the small one",
		       i, state);
		struct gpuq_reply *r = job_request(c, "cancel", jobs[i], 0);
		gpuq_reply_free(r);
	}
	close(small);
	gpuq_close(c);
	daemon_stop(&d);
	size_t nc;
	struct traced *copies = trace_read(&t, &nc);
	struct turn_counts counts = { copies_ahead(copies, nc, 0, TURN_SMALL),
				      copies_ahead(copies, nc, 1, TURN_SMALL) };
	free(copies);
	trace_stop(&t);
	return counts;
}

/*
 * A put alone on the device may keep SCHED_DMA_QUEUE_ALONE (16) DMAs
 * queued, so the first small put beside it waits behind about 16 of its
 * chunks, not the long put's 64; the next one, the device now shared,
 * behind about SCHED_DMA_QUEUE (6). "Now" is SCHED_DMA_ALONE_S (0.1 s)
 * after the first ends: a client that a loaded machine keeps from sending
 * the next put in time finds the long put alone again, so a miss is
 * measured again.
 */
TEST(sched_a_small_put_passes_a_long_put_on_the_copy_engine)
{
	if (test_backend_is_cuda())
		SKIP("counts DMAs on the host engines, slowed (bench sched measures the GPU)");
	struct turn_counts t = { 0, 0 };
	bool first_ok = false, next_ok = false;
	for (int attempt = 0; attempt < TURN_ATTEMPTS && !(first_ok && next_ok); attempt++) {
		t = put_behind_backlog(1, NULL, NULL);
		first_ok = t.busy <= SCHED_DMA_QUEUE_ALONE + TURN_SLACK;
		next_ok = t.again <= SCHED_DMA_QUEUE + TURN_SLACK;
	}
	CHECKF(first_ok, "a one-chunk put waited behind %d chunks of a long put that had run alone "
	       "(it may queue %d; %d tries)", t.busy, SCHED_DMA_QUEUE_ALONE, TURN_ATTEMPTS);
	CHECKF(next_ok, "the next one-chunk put waited behind %d chunks: the device, shared now, "
	       "queues %d (%d tries)", t.again, SCHED_DMA_QUEUE, TURN_ATTEMPTS);
}

/* The small put (priority `priority`) behind eight long ones waits behind the device's queue only. */
static void expect_turn_behind_backlog(const char *backlog, const char *priority)
{
	struct turn_counts t = { 0, 0 };
	for (int attempt = 0; attempt < TURN_ATTEMPTS; attempt++) {
		t = put_behind_backlog(TURN_MAX_BACKLOG, backlog, priority);
		if (t.busy <= SCHED_DMA_QUEUE + TURN_SLACK && t.again <= SCHED_DMA_QUEUE + TURN_SLACK)
			return;
	}
	CHECKF(false, "a %sone-chunk put waited behind %d, then %d chunks of eight running %sputs; "
	       "the device queues %d (%d tries)", priority ? "high-priority " : "", t.busy, t.again,
	       backlog ? "low " : "", SCHED_DMA_QUEUE, TURN_ATTEMPTS);
}

TEST(sched_a_small_put_waits_behind_the_device_dma_queue_only)
{
	if (test_backend_is_cuda())
		SKIP("counts DMAs on the host engines, slowed (bench sched measures the GPU)");
	expect_turn_behind_backlog(NULL, NULL);
}

TEST(sched_an_urgent_put_passes_the_dmas_of_low_ones)
{
	if (test_backend_is_cuda())
		SKIP("counts DMAs on the host engines, slowed (bench sched measures the GPU)");
	expect_turn_behind_backlog("low", "high");
}

/*
 * How two transfers' copies shared the engine (c: trace_read_events with
 * the queued copies): a's from the trace's start, b's from the mark (when b
 * was sent).
 * - a_sent: a's copies taken after the mark; a_first: those of them taken
 *   before b's first. Without turns a keeps its queue full and b's first
 *   copy comes after a's last.
 * - backlog_a: the most bytes of a's copies queued and not yet taken at
 *   any moment before b's first was taken: a's queue, which b's first
 *   chunk waits behind once b has it ready.
 * - before_b: a's copies taken between the queueing of b's first and its
 *   take (bytes_before_b their bytes): none queued after b's goes first.
 * - longest: the longest run of one transfer's copies taken while the
 *   other had one queued, from b's first until a or b took its last.
 * Only a_first counts copies a took while b had none ready (b's request
 * read, its first chunk filled: a goes on alone meanwhile, as it should),
 * and tests hold it to half of a_sent: on a loaded machine those moments
 * last longer, so a bound tighter than that would follow the load.
 */
struct shared_engine {
	int a_sent, a_first; /* a's copies taken after the mark; of them, before b's first */
	int before_b, longest;
	size_t bytes_before_b, backlog_a;
	size_t largest; /* the largest copy from b's first until a or b took its last */
};

static struct shared_engine engine_shared(const struct traced *c, size_t n)
{
	struct shared_engine out = { 0, 0, -1, 0, 0, 0, 0 };
	unsigned a = 0, b = 0;
	size_t mark = n, first_b = n, last_a = 0, last_b = 0, queued_b = n;
	for (size_t i = 0; i < n; i++) {
		if (c[i].mark) {
			mark = mark < i ? mark : i;
			continue;
		}
		if (c[i].queued)
			continue;
		if (!a)
			a = c[i].stream;
		else if (!b && c[i].stream != a)
			b = c[i].stream, first_b = i;
		if (c[i].stream == a)
			last_a = i;
		if (b && c[i].stream == b)
			last_b = i;
	}
	CHECKF(b != 0 && mark < first_b, "the trace shows one stream's copies only, or b's before "
	       "it was sent");
	for (size_t i = mark; i < n; i++) {
		bool a_taken = !c[i].mark && !c[i].queued && c[i].stream == a;
		out.a_sent += a_taken;
		out.a_first += a_taken && i < first_b;
	}
	size_t queued_a = 0;
	for (size_t i = 0; i < first_b; i++) {
		if (c[i].mark || c[i].stream != a)
			continue;
		queued_a = c[i].queued ? queued_a + c[i].bytes : queued_a - c[i].bytes;
		out.backlog_a = queued_a > out.backlog_a ? queued_a : out.backlog_a;
	}
	for (size_t i = mark; i < first_b && queued_b == n; i++)
		queued_b = c[i].queued && c[i].stream == b ? i : n;
	CHECKF(queued_b < first_b, "the trace shows b's first copy taken, never queued");
	out.before_b = 0;
	for (size_t i = queued_b; i < first_b; i++) {
		bool taken = !c[i].mark && !c[i].queued;
		out.before_b += taken;
		out.bytes_before_b += taken ? c[i].bytes : 0;
	}
	size_t end = last_a < last_b ? last_a : last_b;
	int waiting[2] = { 0, 0 }, run = 0; /* copies queued, not yet taken: a's, b's */
	unsigned runner = 0;
	for (size_t i = 0; i <= end; i++) {
		int who = c[i].stream == a ? 0 : c[i].stream == b ? 1 : -1;
		if (c[i].mark || who < 0)
			continue;
		waiting[who] += c[i].queued ? 1 : -1;
		if (c[i].queued || i < first_b)
			continue;
		out.largest = c[i].bytes > out.largest ? c[i].bytes : out.largest;
		bool other_waits = waiting[1 - who] > 0;
		run = !other_waits ? 0 : runner == c[i].stream ? run + 1 : 1;
		runner = other_waits ? c[i].stream : 0;
		out.longest = run > out.longest ? run : out.longest;
	}
	return out;
}

/* The bytes a transfer alone may keep queued, with slots of slot_bytes (and the tests' slack). */
static size_t turn_queue_bytes(size_t slot_bytes)
{
	return (SCHED_DMA_QUEUE_ALONE + TURN_SLACK) * slot_bytes;
}

/*
 * Whether a and b took turns: b went long before a ended, a kept its queue
 * (which b's first copy waits behind) short and none of its copies queued
 * after b's went first, then short runs.
 */
static bool took_turns(struct shared_engine e, size_t slot_bytes)
{
	return 2 * e.a_first <= e.a_sent && e.backlog_a <= turn_queue_bytes(slot_bytes) &&
	       e.before_b <= SCHED_DMA_QUEUE_ALONE + TURN_SLACK && e.longest <= 2 * SCHED_DMA_QUEUE;
}

static void expect_turns(struct shared_engine e, size_t slot_bytes, const char *a, const char *b)
{
	CHECKF(2 * e.a_first <= e.a_sent, "%d of the %d copies %s made after %s was sent went "
	       "before %s's first (half may, however long its request and first chunk take; "
	       "%d tries)", e.a_first, e.a_sent, a, b, b, TURN_ATTEMPTS);
	CHECKF(e.backlog_a <= turn_queue_bytes(slot_bytes),
	       "%s kept %zu bytes queued ahead of %s's first chunk (it may queue %zu; %d tries)", a,
	       e.backlog_a, b, turn_queue_bytes(slot_bytes), TURN_ATTEMPTS);
	CHECKF(e.before_b <= SCHED_DMA_QUEUE_ALONE + TURN_SLACK,
	       "%s's first chunk waited behind %d of %s's (it may queue %d; %d tries)", b,
	       e.before_b, a, SCHED_DMA_QUEUE_ALONE, TURN_ATTEMPTS);
	CHECKF(e.longest <= 2 * SCHED_DMA_QUEUE,
	       "one put moved %d chunks in a row while the other had chunks left (%d tries)",
	       e.longest, TURN_ATTEMPTS);
}

/* Sends a put from fd into buffer `after_us` after job a started, marking the trace as it goes; waits for both. */
static void put_beside(struct gpuq_client *c, const struct trace *t, uint64_t a, unsigned after_us,
		       const char *buffer, int fd)
{
	usleep(after_us);
	trace_mark(t);
	uint64_t b = start_put_fd(c, buffer, fd, NULL);
	wait_ok(c, a, "the first put");
	wait_ok(c, b, "the put sent beside it");
}

/* A child that writes n bytes into p[1] and exits; the read end stays here (p[1] is closed). */
static pid_t pipe_writer(int p[2], size_t n)
{
	CHECKF(pipe(p) == 0, "pipe: %s", strerror(errno));
	pid_t pid = fork();
	CHECKF(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		static char block[64 << 10];
		close(p[0]);
		memset(block, 0x3c, sizeof block);
		for (size_t done = 0; done < n;) {
			size_t want = n - done < sizeof block ? n - done : sizeof block;
			ssize_t w = write(p[1], block, want);
			if (w <= 0)
				_exit(1);
			done += (size_t)w;
		}
		_exit(0);
	}
	close(p[1]);
	return pid;
}

/*
 * Two long puts take turns: B, started once A has moved about a sixth of
 * its chunks, moves its chunks beside A's, runs of at most about
 * SCHED_DMA_QUEUE each, until one of them ends; not A's chunks alone
 * until A's end (jobs nearest their end first, which on the H200 let one
 * owner's backlog move 98 % of the bytes). B is staged, from a memfd; A
 * too, or streamed, from a pipe. A staged A, alone until B comes, moves up
 * to four chunks a copy (XFER_DMA_SPAN_BYTES), so it has twice the chunks
 * of a streamed one, to be as far from its end when B comes; a streamed A
 * has twice B's, so that half of what A moves after B is sent is well
 * above A's queue, which B's first chunk waits behind (engine_shared).
 */
static void expect_long_puts_take_turns(bool a_from_pipe)
{
	if (test_backend_is_cuda())
		SKIP("counts DMAs on the host engines, slowed (bench sched measures the GPU)");
	struct shared_engine e = { 0, 0, 0, 0, 0, 0, 0 };
	size_t a_bytes = (a_from_pipe ? 2 * 48 : 4 * 48) * TURN_CHUNK;
	for (int attempt = 0; attempt < TURN_ATTEMPTS; attempt++) {
		struct trace t;
		struct daemon_proc d;
		struct gpuq_client *c = turn_daemon(&d, &t, "64K");
		do_alloc(c, "a", 0, a_bytes);
		do_alloc(c, "b", 0, 48 * TURN_CHUNK);
		int p[2], fa, fb = memfd_random(48 * TURN_CHUNK, 2), status;
		pid_t writer = a_from_pipe ? pipe_writer(p, a_bytes) : -1;
		fa = a_from_pipe ? p[0] : memfd_random(a_bytes, 1);
		uint64_t a = start_put_fd(c, "a", fa, NULL);
		close(fa);
		put_beside(c, &t, a, 8 * 20000, "b", fb);
		close(fb);
		CHECKF(writer < 0 || (waitpid(writer, &status, 0) == writer && WIFEXITED(status) &&
				      WEXITSTATUS(status) == 0), "the pipe's writer failed");
		gpuq_close(c);
		daemon_stop(&d);
		size_t n;
		struct traced *copies = trace_read_events(&t, "h2d", true, &n);
		e = engine_shared(copies, n);
		free(copies);
		trace_stop(&t);
		if (took_turns(e, TURN_CHUNK) && e.largest <= TURN_CHUNK)
			break;
	}
	expect_turns(e, TURN_CHUNK, a_from_pipe ? "the put from a pipe" : "put a", "put b");
	CHECKF(e.largest <= TURN_CHUNK, "a copy of %zu bytes while the two puts shared the device: "
	       "a put spans slots only while it has the device to itself (%d tries)", e.largest,
	       TURN_ATTEMPTS);
}

TEST(sched_long_puts_take_turns_at_the_copy_engine)
{
	expect_long_puts_take_turns(false);
}

TEST(sched_a_streamed_put_takes_turns_with_a_staged_put)
{
	expect_long_puts_take_turns(true);
}

/* The largest copy in a trace, and how many copies of more than `chunk` bytes it holds. */
static size_t largest_copy(const struct traced *c, size_t n, size_t chunk, size_t *spans)
{
	size_t largest = 0;
	*spans = 0;
	for (size_t i = 0; i < n; i++) {
		largest = c[i].bytes > largest ? c[i].bytes : largest;
		*spans += c[i].bytes > chunk;
	}
	return largest;
}

/*
 * A put or get alone on the device moves chunks whose staging slots lie
 * side by side in one DMA, up to XFER_DMA_SPAN_SLOTS (4) of them: a DMA a
 * slot held the H200's transfers below the copy engine's rate. Beside
 * another job every DMA is one slot (expect_long_puts_take_turns). The
 * host->device engine is slowed (20 ms a copy) while the copy threads read
 * the memfd at once, so read chunks are waiting at every turn; the get
 * takes the free slots after its first in every turn. The bytes come back
 * as they went.
 */
TEST(sched_a_transfer_alone_moves_neighbouring_slots_in_one_dma)
{
	if (test_backend_is_cuda())
		SKIP("counts DMAs on the host engines, slowed (bench copy measures the GPU)");
	const size_t bytes = 48 * TURN_CHUNK;
	struct trace t;
	struct daemon_proc d;
	struct gpuq_client *c = turn_daemon(&d, &t, "64K");
	int src = memfd_random(bytes, 7), back = memfd_random(0, 0);
	do_alloc(c, "a", 0, bytes);
	CHECK(do_put(c, "a", src) == bytes);
	CHECK(do_get(c, "a", back) == bytes);
	gpuq_close(c);
	daemon_stop(&d);
	size_t n_src, n_back;
	unsigned char *want = fd_slurp(src, &n_src), *got = fd_slurp(back, &n_back);
	CHECKF(n_back == bytes && memcmp(want, got, bytes) == 0,
	       "the get gave back %zu bytes, not the %zu put (or other bytes)", n_back, bytes);
	const char *kinds[] = { "h2d", "d2h" };
	for (int k = 0; k < 2; k++) {
		size_t n, spans, total = 0;
		struct traced *copies = trace_read_kind(&t, kinds[k], &n);
		for (size_t i = 0; i < n; i++)
			total += copies[i].bytes;
		size_t largest = largest_copy(copies, n, TURN_CHUNK, &spans);
		CHECKF(total == bytes, "%s: the copies moved %zu bytes, not %zu", kinds[k], total,
		       bytes);
		CHECKF(spans > 0 && largest == 4 * TURN_CHUNK,
		       "%s: %zu copies spanned slots, the largest %zu bytes (4 slots: %u)", kinds[k],
		       spans, largest, 4 * TURN_CHUNK);
		free(copies);
	}
	free(want);
	free(got);
	close(src);
	close(back);
	trace_stop(&t);
}

/* A put from region `region` into buffer, not waited for: its job. */
static uint64_t start_region_put(struct gpuq_client *c, const char *region, const char *buffer)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "region", region);
	return submit(c, &req, NULL, 0);
}

/* A put from fd (sealed_memfd) into buffer by path registered, not waited for. */
static uint64_t start_registered_put(struct gpuq_client *c, const char *buffer, int fd)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "path", "registered");
	mp_put_u64(&req, "fds", 1);
	return submit(c, &req, &fd, 1);
}

/*
 * A put from pinned memory, through a region or a registered memfd, takes
 * DMA turns as well: it moves in chunks of eight staging slots
 * (xfer_pinned), and a staged put started beside it moves its chunks
 * between the pinned put's, in runs of about SCHED_DMA_QUEUE, not after
 * its end. As one DMA (before) a region's copy held the copy engine for all
 * its bytes: 20 ms for a GiB on the H200; a registered put's, for 64 MiB
 * at a time. The turns count bytes: the staged put's first chunk waits
 * behind about SCHED_DMA_QUEUE_ALONE slots' worth of the pinned put's, not
 * that many of its eight-slot chunks (17 of them, 1 MiB here, when the
 * queue counted DMAs).
 */
static void expect_pinned_put_takes_turns(bool region)
{
	if (test_backend_is_cuda())
		SKIP("counts DMAs on the host engines, slowed (bench sched measures the GPU)");
	/* slots of 8 KiB: the pinned put's 64 chunks (4 MiB) fit the 8 MiB RLIMIT_MEMLOCK of CI */
	const size_t pinned_chunk = 64 << 10, pinned_chunks = 64;
	const size_t slot = 8 << 10, bytes = pinned_chunks * pinned_chunk, staged = 48 * slot;
	const char *what = region ? "the region's put" : "the registered put";
	struct shared_engine e = { 0, 0, 0, 0, 0, 0, 0 };
	size_t pinned_copies = 0;
	for (int attempt = 0; attempt < TURN_ATTEMPTS; attempt++) {
		struct trace t;
		struct daemon_proc d;
		struct gpuq_region r;
		struct gpuq_error err;
		struct gpuq_client *c = turn_daemon(&d, &t, "8K");
		require_memlock(c, bytes);
		int fa = sealed_memfd(bytes, 1);
		if (region) {
			CHECKF(gpuq_region_create(c, "r", bytes, 0, false, &r, &err) == 0,
			       "region_create: %s", err.message);
			memset(r.ptr, 0x5a, bytes);
		}
		do_alloc(c, "a", 0, bytes);
		do_alloc(c, "b", 0, staged);
		int fb = memfd_random(staged, 2);
		uint64_t a = region ? start_region_put(c, "r", "a") : start_registered_put(c, "a", fa);
		put_beside(c, &t, a, 4 * 20000, "b", fb);
		close(fa);
		close(fb);
		if (region)
			gpuq_region_unmap(&r);
		gpuq_close(c);
		daemon_stop(&d);
		size_t n;
		struct traced *copies = trace_read_events(&t, "h2d", true, &n);
		pinned_copies = 0;
		for (size_t i = 0; i < n; i++)
			pinned_copies += !copies[i].mark && !copies[i].queued &&
					 copies[i].bytes == pinned_chunk;
		e = engine_shared(copies, n);
		free(copies);
		trace_stop(&t);
		if (pinned_copies == pinned_chunks && took_turns(e, slot))
			break;
	}
	CHECKF(pinned_copies == pinned_chunks, "%s moved as %zu copies of %zu bytes, not %zu of "
	       "eight staging slots", what, pinned_copies, pinned_chunk, pinned_chunks);
	expect_turns(e, slot, what, "the staged put");
}

TEST(sched_a_region_put_takes_turns_with_a_staged_put)
{
	expect_pinned_put_takes_turns(true);
}

TEST(sched_a_registered_put_takes_turns_with_a_staged_put)
{
	expect_pinned_put_takes_turns(false);
}

static uint64_t start_run_expr(struct gpuq_client *c, const char *text)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "run");
	mp_put_str(&req, "expr", text);
	return submit(c, &req, NULL, 0);
}

TEST(sched_a_device_runs_one_chain_at_a_time_and_other_jobs_pass)
{
	if (test_backend_is_cuda())
		SKIP("a GPU runs a chain faster than a second one can be seen waiting");
	slow_engines("compute:300000");
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc_typed(c, "x", 0, "f32", 1024);
	do_alloc_typed(c, "y", 0, "f32", 1024);
	do_alloc(c, "z", 0, 4096);
	uint64_t first = start_run_expr(c, "x = x + 1");
	uint64_t second = start_run_expr(c, "y = y * 2");
	uint64_t put = start_put_memfd(c, "z", 4096, 3, NULL); /* no chain: it passes both */
	wait_ok(c, put, "the put");
	struct gpuq_reply *r = job_request(c, "status", second, 0);
	char state[16], reason[32];
	reply_str(r, "job.state", state, sizeof state);
	reply_str(r, "job.waiting_reason", reason, sizeof reason);
	CHECK_STR(state, "queued");
	CHECK_STR(reason, "chain");
	CHECK(reply_u64(r, "job.waiting_job") == first);
	gpuq_reply_free(r);
	state_of(c, first, state, sizeof state);
	CHECK_STR(state, "running");
	wait_ok(c, first, "the first chain");
	wait_ok(c, second, "the second chain");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(sched_quota_caps_the_priority_a_user_may_ask_for)
{
	if (geteuid() != 0)
		SKIP("needs root to act as another uid");
	char path[64];
	snprintf(path, sizeof path, "/tmp/gpuq-test-prio-%d", (int)getpid());
	FILE *f = fopen(path, "w");
	CHECK(f && fputs("[default]\nmax-priority = normal\nweight = 2\n", f) >= 0 && fclose(f) == 0);
	struct daemon_proc d;
	daemon_start(&d, "--socket-group", "nogroup", "--config", path, NULL);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		CHECK(setgid(65534) == 0 && setuid(65534) == 0);
		struct gpuq_client *c = client_open(&d);
		struct mp_map req;
		gpuq_request_begin(c, &req, "noop");
		mp_put_str(&req, "priority", "high");
		expect_error(call(c, &req, NULL, 0), GPUQ_E_PERMISSION_DENIED, "max-priority normal");
		gpuq_request_begin(c, &req, "noop");
		mp_put_str(&req, "priority", "low");
		mp_put_bool(&req, "wait", true);
		struct gpuq_reply *r = call(c, &req, NULL, 0);
		expect_ok(r, "a low-priority noop");
		gpuq_reply_free(r);
		gpuq_close(c);
		_exit(0);
	}
	int status;
	waitpid(pid, &status, 0);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the checks as uid 65534 failed");
	struct gpuq_client *root = client_open(&d); /* root is never limited */
	struct mp_map req;
	gpuq_request_begin(root, &req, "noop");
	mp_put_str(&req, "priority", "high");
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(root, &req, NULL, 0);
	expect_ok(r, "root's high-priority noop");
	gpuq_reply_free(r);
	gpuq_request_begin(root, &req, "noop");
	mp_put_str(&req, "priority", "urgent");
	expect_error(call(root, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "'urgent' is not a priority");
	gpuq_close(root);
	daemon_stop(&d);
	unlink(path);
}

static void capped_at_low_asks_for_nothing(void *arg)
{
	const struct daemon_proc *d = arg;
	struct gpuq_client *c = client_open(d);
	struct mp_map req;
	gpuq_request_begin(c, &req, "noop");
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "a noop that asks for no priority, under max-priority low");
	char priority[16];
	reply_str(r, "job.priority", priority, sizeof priority);
	CHECK_STR(priority, "low");
	gpuq_reply_free(r);
	gpuq_request_begin(c, &req, "noop");
	mp_put_str(&req, "priority", "normal"); /* asked for explicitly: refused */
	expect_error(call(c, &req, NULL, 0), GPUQ_E_PERMISSION_DENIED, "max-priority low");
	gpuq_close(c);
}

/* A user capped at low whose jobs ask for no priority gets low, not a refusal of every job. */
TEST(sched_quota_cap_is_the_default_priority_of_a_capped_user)
{
	struct daemon_proc d;
	start_with_config(&d, "[default]\nmax-priority = low\n", NULL);
	as_user(65534, NULL, 0, capped_at_low_asks_for_nothing, &d);
	struct gpuq_client *root = client_open(&d); /* root: normal by default */
	struct mp_map req;
	gpuq_request_begin(root, &req, "noop");
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(root, &req, NULL, 0);
	char priority[16];
	reply_str(r, "job.priority", priority, sizeof priority);
	CHECK_STR(priority, "normal");
	gpuq_reply_free(r);
	gpuq_close(root);
	daemon_stop(&d);
}

/* One owner floods a device; another's few jobs still get every other turn. */
static void flood(const struct daemon_proc *d, int jobs, const char *buffer, uint64_t *last)
{
	struct gpuq_client *c = client_open(d);
	for (int i = 0; i < jobs; i++)
		*last = start_simple(c, "checksum", buffer, NULL);
	gpuq_close(c);
}

TEST(sched_owners_share_a_device)
{
	if (geteuid() != 0)
		SKIP("needs root to act as another uid");
	if (test_backend_is_cuda())
		SKIP("a GPU runs these jobs faster than clients submit them; gpuq bench sched measures shares there");
	slow_engines("compute:20000");
	struct daemon_proc d;
	daemon_start(&d, "--socket-group", "nogroup", "--max-inflight=1", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "mine", 0, 4096);
	int p[2];
	CHECK(pipe(p) == 0);
	pid_t pid = fork(); /* uid 65534: 4 jobs, submitted after root's 40 */
	CHECK(pid >= 0);
	if (pid == 0) {
		CHECK(setgid(65534) == 0 && setuid(65534) == 0);
		struct gpuq_client *o = client_open(&d);
		struct mp_map req;
		gpuq_request_begin(o, &req, "alloc");
		mp_put_str(&req, "name", "theirs");
		mp_put_u64(&req, "bytes", 4096);
		mp_put_bool(&req, "wait", true);
		gpuq_reply_free(call(o, &req, NULL, 0));
		char go;
		CHECK(read(p[0], &go, 1) == 1);
		uint64_t last = 0;
		flood(&d, 4, "theirs", &last);
		struct gpuq_reply *r = job_request(o, "wait", last, 60000);
		expect_ok(r, "the other owner's last job");
		gpuq_reply_free(r);
		gpuq_close(o);
		_exit(0);
	}
	uint64_t last = 0;
	flood(&d, 40, "mine", &last);
	CHECK(write(p[1], "g", 1) == 1);
	int status;
	waitpid(pid, &status, 0); /* the other owner's 4 jobs are done */
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the other owner's jobs failed");
	/* by then root's flood is far from done: turns alternated, they did not queue behind it */
	char state[16];
	state_of(c, last, state, sizeof state);
	CHECKF(strcmp(state, "queued") == 0, "root's last job is %s when the other owner is done",
	       state);
	/* (the 20th, not an earlier one: the other owner's client needs a moment to submit on a busy machine) */
	struct gpuq_reply *r = job_request(c, "status", last - 20, 0);
	reply_str(r, "job.state", state, sizeof state);
	gpuq_reply_free(r);
	CHECKF(strcmp(state, "queued") == 0, "root's 20th job is %s already", state);
	wait_ok(c, last, "root's last job");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(sched_an_alloc_waits_for_memory_another_job_frees)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "1M", NULL);
	struct gpuq_client *c = client_open(&d);
	if (test_backend_is_cuda())
		SKIP("a GPU's memory is too large to fill in a test: the host backend's arena stands in");
	do_alloc(c, "first", 0, 768 << 10);
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "second");
	mp_put_u64(&req, "bytes", 512 << 10);
	mp_put_u64(&req, "wait_memory_ms", 20000);
	uint64_t waiting = submit(c, &req, NULL, 0);
	usleep(100000);
	struct gpuq_reply *r = job_request(c, "status", waiting, 0);
	char state[16], reason[32];
	reply_str(r, "job.state", state, sizeof state);
	reply_str(r, "job.waiting_reason", reason, sizeof reason);
	CHECK_STR(state, "running");
	CHECK_STR(reason, "memory");
	gpuq_reply_free(r);
	do_free(c, "first");
	wait_ok(c, waiting, "the waiting alloc, once memory was freed");
	/* without enough freed in time: out_of_memory, saying how long it waited */
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "third");
	mp_put_u64(&req, "bytes", 768 << 10);
	mp_put_u64(&req, "wait_memory_ms", 200);
	mp_put_bool(&req, "wait", true);
	double t0 = now_s();
	r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_OUT_OF_MEMORY, "cannot allocate"); /* the allocator's own words first */
	expect_error(r, GPUQ_E_OUT_OF_MEMORY, "; waited 200 ms");
	gpuq_reply_free(r);
	CHECKF(now_s() - t0 >= 0.19, "it gave up after %.3f s", now_s() - t0);
	/* more than the whole device: no free can make room, so it fails without waiting */
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "huge");
	mp_put_u64(&req, "bytes", 2 << 20);
	mp_put_u64(&req, "wait_memory_ms", 60000);
	mp_put_bool(&req, "wait", true);
	t0 = now_s();
	r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_OUT_OF_MEMORY, "cannot allocate");
	struct gpuq_error said;
	gpuq_reply_error(r, &said);
	CHECKF(!strstr(said.message, "waited"), "it waited: %s", said.message);
	gpuq_reply_free(r);
	CHECKF(now_s() - t0 < 30, "it took %.1f s of its 60 s wait", now_s() - t0);
	/* and without wait_memory_ms, at once */
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "third");
	mp_put_u64(&req, "bytes", 768 << 10);
	mp_put_bool(&req, "wait", true);
	expect_error(call(c, &req, NULL, 0), GPUQ_E_OUT_OF_MEMORY, "cannot allocate");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(sched_cancel_and_shutdown_with_jobs_in_flight)
{
	slow_engines("h2d:50000,d2h:50000");
	struct daemon_proc d;
	/* two slots: a put has at most two chunks ahead of a cancel */
	daemon_start(&d, "--shutdown-timeout", "300", "--staging-slots", "2", NULL);
	struct gpuq_client *c = client_open(&d);
	size_t n = test_backend_is_cuda() ? (size_t)1 << 30 : (size_t)16 << 20;
	uint64_t jobs[4];
	int src[4];
	for (int i = 0; i < 4; i++) {
		char name[16];
		snprintf(name, sizeof name, "w%d", i);
		do_alloc(c, name, 0, n);
		src[i] = memfd_random(n, (uint64_t)i);
	}
	for (int i = 0; i < 4; i++) {
		char name[16];
		snprintf(name, sizeof name, "w%d", i);
		jobs[i] = start_put_fd(c, name, src[i], NULL);
		close(src[i]);
	}
	usleep(50000);
	struct gpuq_reply *r = job_request(c, "cancel", jobs[0], 0);
	expect_ok(r, "cancel a job in flight");
	gpuq_reply_free(r);
	r = job_request(c, "wait", jobs[0], 10000);
	expect_error(r, GPUQ_E_CANCELLED, NULL);
	gpuq_reply_free(r);
	daemon_stop(&d); /* the rest are in flight: they finish or are cancelled, and gpuqd exits 0 */
	gpuq_close(c);
}

/* ---- 8 clients, random jobs, and a serial replay of each buffer ---- */

#define STRESS_CLIENTS 8
#define STRESS_BUFFERS 2 /* per client */
#define STRESS_BYTES 8192

struct stress_client {
	const struct daemon_proc *d;
	int index, jobs;
	unsigned seed;
	unsigned char model[STRESS_BUFFERS][STRESS_BYTES]; /* what each buffer holds, replayed */
};

static void stress_name(const struct stress_client *s, int b, char *out, size_t size)
{
	snprintf(out, size, "s%d_%d", s->index, b);
}

static const char *const priorities[] = { "low", "normal", "high" };

/* A put of random bytes into [off, off + len) of buffer b. */
static uint64_t stress_put(struct gpuq_client *c, struct stress_client *s, int b, size_t off,
			   size_t len)
{
	char name[48];
	stress_name(s, b, name, 16);
	snprintf(name + strlen(name), sizeof name - strlen(name), "[%zu:%zu]", off, off + len);
	uint64_t seed = rand_r(&s->seed);
	int fd = memfd_random(len, seed);
	host_fill_random(s->model[b] + off, len, GPUQ_DTYPE_BYTES, seed);
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", name);
	mp_put_u64(&req, "fds", 1);
	mp_put_str(&req, "priority", priorities[rand_r(&s->seed) % 3]);
	uint64_t id = submit(c, &req, &fd, 1);
	close(fd);
	return id;
}

/* A get of buffer b, checked against the model when it ends: ordering, seen from outside. */
struct pending_get {
	uint64_t job;
	int fd;
	unsigned char want[STRESS_BYTES];
};

static uint64_t stress_job(struct gpuq_client *c, struct stress_client *s, struct pending_get *g,
			   bool *is_get)
{
	int b = rand_r(&s->seed) % STRESS_BUFFERS, kind = rand_r(&s->seed) % 6;
	char name[48], other[16];
	stress_name(s, b, name, sizeof name);
	stress_name(s, 1 - b, other, sizeof other);
	size_t off = (size_t)(rand_r(&s->seed) % (STRESS_BYTES / 8)) * 8;
	size_t len = STRESS_BYTES - off;
	struct mp_map req;
	*is_get = false;
	switch (kind) {
	case 0:
		return stress_put(c, s, b, off, len);
	case 1: { /* fill random: the whole buffer */
		uint64_t seed = rand_r(&s->seed);
		host_fill_random(s->model[b], STRESS_BYTES, GPUQ_DTYPE_BYTES, seed);
		gpuq_request_begin(c, &req, "fill");
		mp_put_str(&req, "buffer", name);
		mp_put_str(&req, "pattern", "random");
		mp_put_u64(&req, "seed", seed);
		break;
	}
	case 2: /* copy the other buffer's first len bytes here, at off */
		memmove(s->model[b] + off, s->model[1 - b], len);
		gpuq_request_begin(c, &req, "copy");
		snprintf(name + strlen(name), sizeof name - strlen(name), "[%zu:]", off);
		snprintf(other + strlen(other), sizeof other - strlen(other), "[:%zu]", len);
		mp_put_str(&req, "src", other);
		mp_put_str(&req, "dst", name);
		break;
	case 3:
		gpuq_request_begin(c, &req, "checksum");
		mp_put_str(&req, "buffer", name);
		break;
	default: /* get: to be compared with what the buffer holds at this point */
		g->fd = memfd_random(0, 0);
		memcpy(g->want, s->model[b], STRESS_BYTES);
		*is_get = true;
		gpuq_request_begin(c, &req, "get");
		mp_put_str(&req, "buffer", name);
		mp_put_u64(&req, "fds", 1);
		mp_put_str(&req, "priority", priorities[rand_r(&s->seed) % 3]);
		g->job = submit(c, &req, &g->fd, 1);
		return g->job;
	}
	mp_put_str(&req, "priority", priorities[rand_r(&s->seed) % 3]);
	return submit(c, &req, NULL, 0);
}

static void check_get(struct gpuq_client *c, struct pending_get *g)
{
	wait_ok(c, g->job, "a get");
	size_t n;
	unsigned char *got = fd_slurp(g->fd, &n);
	CHECK_EQ(n, STRESS_BYTES);
	CHECKF(memcmp(got, g->want, STRESS_BYTES) == 0, "get job %llu saw bytes out of order",
	       (unsigned long long)g->job);
	free(got);
	close(g->fd);
}

static void stress_run(struct stress_client *s)
{
	struct gpuq_client *c = client_open(s->d);
	static struct pending_get gets[64];
	int ngets = 0;
	uint64_t last = 0;
	char name[16];
	for (int b = 0; b < STRESS_BUFFERS; b++) {
		stress_name(s, b, name, sizeof name);
		do_alloc(c, name, 0, STRESS_BYTES);
		memset(s->model[b], 0, STRESS_BYTES);
		struct mp_map req;
		gpuq_request_begin(c, &req, "fill");
		mp_put_str(&req, "buffer", name);
		mp_put_str(&req, "pattern", "zero");
		mp_put_bool(&req, "wait", true);
		gpuq_reply_free(call(c, &req, NULL, 0));
	}
	for (int i = 0; i < s->jobs; i++) {
		bool is_get;
		last = stress_job(c, s, &gets[ngets], &is_get);
		ngets += is_get;
		if (ngets == 64 || i == s->jobs - 1) { /* check the gets in flight, in order */
			for (int k = 0; k < ngets; k++)
				check_get(c, &gets[k]);
			ngets = 0;
		}
	}
	wait_ok(c, last, "the last job");
	for (int b = 0; b < STRESS_BUFFERS; b++) { /* the final bytes equal the serial replay */
		stress_name(s, b, name, sizeof name);
		CHECKF(do_checksum(c, name) == host_checksum(s->model[b], STRESS_BYTES),
		       "client %d's buffer %s differs from its serial replay", s->index, name);
	}
	gpuq_close(c);
}

TEST(sched_stress_random_jobs_from_8_clients_match_a_serial_replay)
{
	alarm(240); /* longer than the tier's default: 10,000 jobs */
	struct daemon_proc d;
	daemon_start(&d, "--queue-depth", "20000", NULL); /* every client's jobs may be queued at once */
	int per_client = 10000 / STRESS_CLIENTS;
	pid_t pids[STRESS_CLIENTS];
	for (int i = 0; i < STRESS_CLIENTS; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0);
		if (pids[i] == 0) {
			static struct stress_client s;
			s = (struct stress_client){ .d = &d, .index = i, .jobs = per_client,
						    .seed = 1000u + (unsigned)i };
			stress_run(&s);
			_exit(0);
		}
	}
	int failed = 0;
	for (int i = 0; i < STRESS_CLIENTS; i++) {
		int status;
		waitpid(pids[i], &status, 0);
		failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	CHECKF(failed == 0, "%d of %d clients found their buffers wrong (see above)", failed,
	       STRESS_CLIENTS);
	daemon_stop(&d);
}
