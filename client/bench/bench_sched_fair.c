/*
 * Part 4 of gpuq bench sched: two owners with equal weights share a device.
 * This process sends 800 equal puts from scratch: (detached, into a ring of
 * 16 ranges of a buffer of its own), then a child that has dropped to uid
 * 65534 sends 80 (into a ring of its own): from then on both have work
 * queued until the child's runs out. The scheduler lets a newcomer start
 * level with the owners already there, so the head start buys nothing;
 * sending one after the other makes sure both backlogs overlap however
 * slowly this process sends. Once the child's jobs are done, the rest of
 * this process's backlog is cancelled (it would only measure one owner).
 *
 * Device time. What the device does for a put is move its bytes, so an
 * owner's device time is taken as its share of the bytes moved while both
 * had jobs queued: each job's bytes spread evenly over its time in flight,
 * [sent + queued_s, sent + queued_s + run_s] on this clock (CLOCK_MONOTONIC
 * is one clock for both processes, and a request's send time is within a
 * round trip of the daemon's submission), clipped to the window from when
 * both had sent all their jobs to when the first of them started its last
 * one. The scheduler's own currency, the time each owner's jobs were in
 * flight (the records' run_s in the window), is shown beside it: the two
 * agree while in-flight jobs move at one pace, and part where some stall
 * in flight (waiting for a slot or an engine) while others move, which the
 * time in flight would count as device time. Spreading a job's bytes evenly
 * over its interval credits a job that stalled inside the window with bytes
 * it moved later, so the bytes share errs toward looking fair.
 *
 * The child reports to this process over a socketpair, in messages of one
 * fixed size, each sent whole. It needs the daemon's socket to admit uid
 * 65534 (gpuqd --socket-group, in a directory others may enter); where it
 * does not, and where gpuq is not root, the part is skipped, saying why.
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/bench/bench_sched.h"

#define OTHER_UID 65534
#define MAJOR_JOBS 800 /* with MINOR_JOBS, below gpuqd's default --queue-depth of 1024 */
#define MINOR_JOBS 80
#define RING 16
#define FAIR_BYTES_CUDA (256ull << 20)
#define FAIR_BYTES_HOST (4ull << 20)
#define CHILD_WAIT_MS 600000
#define REAP_S 60.0
#define TARGET_LO 40.0
#define TARGET_HI 60.0

enum fair_stage { STAGE_READY, STAGE_SENT, STAGE_DONE };

/* What the child says, at each stage. */
struct fair_msg {
	int stage;
	int ok;   /* 0: why says what went wrong */
	int skip; /* with !ok: uid 65534 may not connect, so the part is skipped */
	char why[sizeof ((struct bench_sched_part *)0)->why];
	uint64_t ids[MINOR_JOBS];
	double sent[MINOR_JOBS];
};

/* One owner's jobs: when each was sent, and its interval from its record. */
struct owner {
	unsigned n;
	uint64_t ids[MAJOR_JOBS];
	double sent[MAJOR_JOBS], start[MAJOR_JOBS], end[MAJOR_JOBS];
	double in_window; /* seconds of its jobs' run_s inside the window */
	double moved;     /* jobs' worth of bytes moved in the window (each at an even pace) */
	unsigned started_in_window;
};

struct fair {
	char buffer[64]; /* this process's ring; the child names its own alike */
	uint64_t bytes;  /* each put */
	struct owner own[2]; /* [0] this process, [1] the child */
	double window[2];
};

/* A put of the ring's next range; its send time noted just before it is sent. */
struct ring_puts {
	const char *buffer;
	uint64_t bytes;
	double *sent;
};

static uint64_t ring_put(struct bench_sched *b, struct mp_map *req, unsigned i, void *arg)
{
	struct ring_puts *p = arg;
	uint64_t id = bench_job_begin(b, req, "put", false);

	bench_job_put_scratch(req, p->buffer, (i % RING) * p->bytes, p->bytes);
	p->sent[i] = bench_now();
	return id;
}

/* ---- the second owner, in the child ---- */

static bool child_say(int sock, const struct fair_msg *m)
{
	return send(sock, m, sizeof *m, MSG_NOSIGNAL) == (ssize_t)sizeof *m;
}

/* Tells this process (if it still listens) what went wrong, and ends. */
static _Noreturn void child_fail(int sock, struct fair_msg *m, int skip, const char *why)
{
	m->ok = 0;
	m->skip = skip;
	snprintf(m->why, sizeof m->why, "%s", why);
	child_say(sock, m);
	_exit(1);
}

/* Becomes uid 65534 and connects as it; the part's state says why not. */
static void child_connect(struct bench_sched *b, int sock, struct fair_msg *m)
{
	struct gpuq_error err;
	char why[600];

	if (setgroups(0, NULL) < 0 || setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0) {
		snprintf(why, sizeof why, "cannot become uid %d: %s", OTHER_UID, strerror(errno));
		child_fail(sock, m, 0, why);
	}
	if (gpuq_connect(b->cli->socket, &b->c, &err) < 0) {
		snprintf(why, sizeof why, "uid %d, the second owner, cannot use gpuqd: %.300s; start "
					  "gpuqd with --socket-group GROUP (a group of uid %d, such "
					  "as nogroup) and its socket in a directory others may enter",
			 OTHER_UID, err.message, OTHER_UID);
		child_fail(sock, m, 1, why);
	}
	gpuq_set_timeout(b->c, CHILD_WAIT_MS);
}

/*
 * The child: allocates its ring, says it is ready, waits for the go (this
 * process's puts are sent), sends its puts, says which (and when), then
 * frees its ring (which waits for them) and says it is done. Once the ring
 * exists it is freed whatever happens. Never returns.
 */
static _Noreturn void fair_child(const struct bench_sched *parent, const struct fair *f,
				 int sock)
{
	struct bench_sched_part part = { .name = "fairness", .title = "fairness" };
	struct bench_sched b = *parent;
	struct ring_puts puts;
	struct fair_msg m;
	char name[64], go;
	bool going;

	memset(&m, 0, sizeof m);
	b.part = &part;
	b.c = NULL;
	child_connect(&b, sock, &m);
	bench_job_name(&b, "fair", name, sizeof name);
	if (bench_job_alloc(&b, name, RING * f->bytes, false) < 0)
		child_fail(sock, &m, 0, part.why);
	m.ok = 1;
	going = child_say(sock, &m) && recv(sock, &go, 1, 0) == 1;
	if (going) {
		puts = (struct ring_puts){ name, f->bytes, m.sent };
		m.stage = STAGE_SENT;
		if (bench_job_submit_all(&b, MINOR_JOBS, ring_put, m.ids, &puts) < 0) {
			m.ok = 0;
			snprintf(m.why, sizeof m.why, "%s", part.why);
		}
		going = child_say(sock, &m) && m.ok;
	}
	bench_job_free(&b, name);
	m.stage = STAGE_DONE;
	_exit(going && child_say(sock, &m) ? 0 : 1);
}

/* ---- this process ---- */

/*
 * The child's next message, which must be of stage: 0, 1 when the child
 * could not connect (the part is skipped), or -1 with the part failed. *m
 * is all zeros unless a whole message arrived (a failing child's says
 * which jobs it had sent).
 */
static int read_child(struct bench_sched *b, int sock, enum fair_stage stage, struct fair_msg *m)
{
	struct pollfd p = { .fd = sock, .events = POLLIN };
	size_t got = 0;

	memset(m, 0, sizeof *m);
	while (got < sizeof *m) {
		int n = poll(&p, 1, CHILD_WAIT_MS);
		ssize_t r = n > 0 ? recv(sock, (char *)m + got, sizeof *m - got, 0) : -1;

		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0 || r <= 0)
			memset(m, 0, sizeof *m);
		if (n == 0)
			return bench_sched_fail(b, "the second owner (uid %d) said nothing for %d s",
						OTHER_UID, CHILD_WAIT_MS / 1000);
		if (r <= 0)
			return bench_sched_fail(b, "the second owner's process (uid %d) ended early",
						OTHER_UID);
		got += (size_t)r;
	}
	if (!m->ok && m->skip) {
		bench_sched_skip(b, "%s", m->why);
		return 1;
	}
	if (!m->ok)
		return bench_sched_fail(b, "as uid %d: %s", OTHER_UID, m->why);
	if (m->stage != (int)stage)
		return bench_sched_fail(b, "the second owner's process is out of step");
	return 0;
}

/* A job's interval on this clock; [0, 0] for one cancelled before it started. */
static int record_interval(struct bench_sched *b, const struct gpuq_reply *r, unsigned i,
			   void *arg)
{
	struct owner *o = arg;
	const msgpack_object *rec = bench_job_record(r);
	double run_s = field_f64(rec, "run_s", 0);
	char state[16];

	(void)b;
	field_str(rec, "state", state, sizeof state, "?");
	if (strcmp(state, "done") != 0 && run_s <= 0) {
		o->start[i] = o->end[i] = 0;
		return 0;
	}
	o->start[i] = o->sent[i] + field_f64(rec, "queued_s", 0);
	o->end[i] = o->start[i] + run_s;
	return 0;
}

/*
 * Go, both owners' puts, the child's waited for and the rest of this
 * process's cancelled, then every job's interval from its record.
 */
static int fair_race(struct bench_sched *b, struct fair *f, int sock)
{
	struct ring_puts puts = { f->buffer, f->bytes, f->own[0].sent };
	struct fair_msg m;
	int rc;

	if ((rc = read_child(b, sock, STAGE_READY, &m)) != 0)
		return rc;
	f->own[0].n = MAJOR_JOBS;
	if (bench_job_submit_all(b, MAJOR_JOBS, ring_put, f->own[0].ids, &puts) < 0)
		return -1;
	if (send(sock, "g", 1, MSG_NOSIGNAL) != 1)
		return bench_sched_fail(b, "cannot tell the second owner to start: %s",
					strerror(errno));
	rc = read_child(b, sock, STAGE_SENT, &m);
	if (m.stage == STAGE_SENT) /* also when it failed: what it sent is to be cancelled */
		memcpy(f->own[1].ids, m.ids, sizeof m.ids);
	if (rc != 0)
		return rc;
	f->own[1].n = MINOR_JOBS;
	memcpy(f->own[1].sent, m.sent, sizeof m.sent);
	if (bench_job_wait_all(b, f->own[1].ids, MINOR_JOBS) < 0 ||
	    bench_job_cancel_all(b, f->own[0].ids, MAJOR_JOBS) < 0 ||
	    (rc = read_child(b, sock, STAGE_DONE, &m)) != 0)
		return rc ? rc : -1;
	for (int k = 0; k < 2; k++)
		if (bench_job_records(b, f->own[k].ids, f->own[k].n, record_interval,
				      &f->own[k]) < 0)
			return -1;
	return 0;
}

static double owner_last(const double *v, unsigned n)
{
	double last = 0;

	for (unsigned i = 0; i < n; i++)
		last = v[i] > last ? v[i] : last;
	return last;
}

/* The window in which both had jobs queued, and each one's time in flight within it. */
static int fair_shares(struct bench_sched *b, struct fair *f)
{
	double w0 = 0, w1 = 0;

	for (int k = 0; k < 2; k++) {
		double sent = owner_last(f->own[k].sent, f->own[k].n);
		double start = owner_last(f->own[k].start, f->own[k].n);

		w0 = k == 0 || sent > w0 ? sent : w0;
		w1 = k == 0 || start < w1 ? start : w1;
	}
	f->window[0] = w0;
	f->window[1] = w1;
	if (w1 <= w0)
		return bench_sched_fail(b, "no time when both owners had sent all their jobs and "
					   "still had some queued (one started its last job %.3f s "
					   "before the other had sent its last)", w0 - w1);
	for (int k = 0; k < 2; k++) {
		struct owner *o = &f->own[k];

		for (unsigned i = 0; i < o->n; i++) {
			double from = o->start[i] > w0 ? o->start[i] : w0;
			double to = o->end[i] < w1 ? o->end[i] : w1;

			o->in_window += to > from ? to - from : 0;
			if (to > from && o->end[i] > o->start[i])
				o->moved += (to - from) / (o->end[i] - o->start[i]);
			o->started_in_window += o->start[i] >= w0 && o->start[i] <= w1;
		}
	}
	return 0;
}

static void fair_report(struct bench_sched *b, const struct fair *f)
{
	static const char *const who[] = { "first", "second" };
	double inflight = f->own[0].in_window + f->own[1].in_window;
	double moved = f->own[0].moved + f->own[1].moved;
	char key[48], what[64];

	bench_sched_say(b, "both had jobs queued for %.3f s; in that window:\n",
			f->window[1] - f->window[0]);
	bench_sched_figure(b, "bytes", (double)f->bytes);
	bench_sched_figure(b, "window_s", f->window[1] - f->window[0]);
	for (int k = 0; k < 2; k++) {
		const struct owner *o = &f->own[k];
		double bytes = moved > 0 ? 100 * o->moved / moved : 0;
		double time = inflight > 0 ? 100 * o->in_window / inflight : 0;

		bench_sched_say(b, "  owner uid %d (%u jobs): %.1f %% of the bytes moved; %.1f %% "
				   "of the time in flight (%.3f s of run_s); %u jobs started\n",
				k ? OTHER_UID : (int)geteuid(), o->n, bytes, time, o->in_window,
				o->started_in_window);
		snprintf(key, sizeof key, "%s_bytes_pct", who[k]);
		bench_sched_figure(b, key, bytes);
		snprintf(key, sizeof key, "%s_inflight_pct", who[k]);
		bench_sched_figure(b, key, time);
		snprintf(key, sizeof key, "%s_run_s", who[k]);
		bench_sched_figure(b, key, o->in_window);
		snprintf(key, sizeof key, "%s_started", who[k]);
		bench_sched_figure(b, key, o->started_in_window);
		snprintf(what, sizeof what, "owner of %u jobs: %% of bytes", o->n);
		bench_sched_target(b, what, bytes, TARGET_LO, TARGET_HI, "50 +- 10");
	}
}

/*
 * Waits for the child to end: at once when all went well; after this side
 * failed, it frees its ring first (its jobs were cancelled), given REAP_S.
 */
static void reap_child(pid_t pid)
{
	double deadline = bench_now() + REAP_S;
	int status;
	pid_t got;

	while ((got = waitpid(pid, &status, WNOHANG)) == 0 && bench_now() < deadline)
		usleep(10000);
	if (got == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
	}
}

static int fair_with_child(struct bench_sched *b, struct fair *f)
{
	int sv[2], rc;
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return bench_sched_fail(b, "socketpair: %s", strerror(errno));
	fflush(NULL); /* the child must not print what this process has buffered */
	pid = fork();
	if (pid == 0) {
		close(sv[0]);
		fair_child(b, f, sv[1]);
	}
	close(sv[1]);
	if (pid < 0) {
		close(sv[0]);
		return bench_sched_fail(b, "fork: %s", strerror(errno));
	}
	rc = fair_race(b, f, sv[0]);
	if (rc < 0) { /* what either owner still has queued (root may cancel both) */
		bench_job_cancel_all(b, f->own[0].ids, MAJOR_JOBS);
		bench_job_cancel_all(b, f->own[1].ids, MINOR_JOBS);
	}
	close(sv[0]);
	reap_child(pid);
	if (rc < 0) { /* the child's ring, if the child could not free it (root may) */
		char ring[96];

		bench_job_name(b, "fair", ring, sizeof ring);
		bench_job_free_as(b, ring, OTHER_UID);
	}
	return rc;
}

int bench_fair_share(struct bench_sched *b)
{
	struct fair *f;
	char size[32];
	int rc;

	if (geteuid() != 0) {
		bench_sched_skip(b, "a second owner needs a second uid: run gpuq as root, and it "
				    "forks a child that drops to uid %d", OTHER_UID);
		return 0;
	}
	if (!(f = calloc(1, sizeof *f)))
		return bench_sched_fail(b, "out of memory");
	/* Two rings in a quarter of the device. */
	f->bytes = bench_sched_fit(b->cuda ? FAIR_BYTES_CUDA : FAIR_BYTES_HOST, 8 * RING,
				   b->mem_total);
	bench_job_name(b, "fair", f->buffer, sizeof f->buffer);
	bench_sched_say(b, "\n(4) fairness: owners uid %d and uid %d, equal weights, send %d and then %d "
			   "puts of %s from scratch: (detached, each into %d ranges of a buffer of "
			   "its own)\n",
			(int)geteuid(), OTHER_UID, MAJOR_JOBS, MINOR_JOBS,
			human_bytes(size, sizeof size, f->bytes, 0), RING);
	rc = bench_job_alloc(b, f->buffer, RING * f->bytes, false);
	if (rc == 0)
		rc = fair_with_child(b, f);
	if (rc == 0)
		rc = fair_shares(b, f);
	if (rc == 0)
		fair_report(b, f);
	bench_job_free(b, f->buffer);
	free(f);
	return rc < 0 ? -1 : 0;
}
