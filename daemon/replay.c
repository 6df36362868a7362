/*
 * Jobs queued at a re-exec, held and replayed (replay.h). Main thread
 * only: replay_hold at the restart request, replay_hand_over before the
 * execve, replay_run in the next image once its connections are served.
 */
#include "daemon/replay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"

/*
 * The hand-over is gpuqd's own: as many jobs as were queued, each request up
 * to the frame limit, nested root > jobs > job > waiters > waiter.
 */
static const struct msg_limits replay_limits = {
	.max_depth = 5, .max_container = 1u << 24, .max_total_objects = 1u << 28,
	.max_str = UINT32_MAX,
};

/* How a job that is not replayed says why (it fails with `restarted`). */
#define REPLAY_NOT "gpuqd restarted while the job was queued, and it is not replayed: "
#define REPLAY_BEHIND "it was queued behind job %llu, which shares a buffer with it and is not replayed"

/* The buffers of jobs that were not carried over, each with that job's id. */
struct replay_broken {
	struct { const void *key; uint64_t job; } *v;
	size_t n, cap;
};

/* What identifies the buffers job touches: its buffers, and the memory its works access. */
static size_t replay_keys(const struct job *job, const void **keys, size_t max)
{
	size_t n = 0;
	if (job->buffer && n < max)
		keys[n++] = job->buffer;
	if (job->buffer2 && n < max)
		keys[n++] = job->buffer2;
	for (int i = 0; i < job_nworks(job); i++) {
		const struct work *w = job_work((struct job *)job, i);
		for (unsigned k = 0; k < w->naccess && n < max; k++)
			keys[n++] = w->access[k].base;
	}
	return n;
}

#define REPLAY_KEYS_MAX (2 + GPUQ_MAX_DEVICES * WORK_MAX_ACCESS)

/* The job not carried over that job is queued behind on a shared buffer; 0 when none. */
static uint64_t replay_behind(const struct replay_broken *b, const struct job *job)
{
	const void *keys[REPLAY_KEYS_MAX];
	size_t n = replay_keys(job, keys, REPLAY_KEYS_MAX);
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < b->n; k++)
			if (keys[i] && b->v[k].key == keys[i])
				return b->v[k].job;
	return 0;
}

/* job was not carried over: the jobs behind it on its buffers are not either. */
static void replay_break(struct replay_broken *b, const struct job *job)
{
	const void *keys[REPLAY_KEYS_MAX];
	size_t n = replay_keys(job, keys, REPLAY_KEYS_MAX);
	for (size_t i = 0; i < n; i++) {
		if (!keys[i])
			continue;
		if (b->n == b->cap) {
			size_t cap = b->cap ? b->cap * 2 : 16;
			void *grown = realloc(b->v, cap * sizeof *b->v);
			if (!grown)
				return; /* no memory: the jobs behind it on these buffers may still run */
			b->v = grown;
			b->cap = cap;
		}
		b->v[b->n].key = keys[i];
		b->v[b->n++].job = job->id;
	}
}

static int replay_by_id(const void *a, const void *b)
{
	uint64_t x = (*(struct job *const *)a)->id, y = (*(struct job *const *)b)->id;
	return x < y ? -1 : x > y;
}

/* Every queued job, out of the workers' queues, in submission order: *n of them (NULL: none). */
static struct job **replay_unqueue(struct daemon *d, size_t *n)
{
	struct job **jobs = NULL;
	size_t cap = 0;
	struct work *list = worker_pool_unqueue_all(&d->pool);
	*n = 0;
	for (struct job *j = d->jobs.oldest; j; j = j->newer) /* gangs stay queued in that call */
		if (j->parts && !job_is_finished(j) && !j->held && job_unqueue(d, j)) {
			j->work.next = list;
			list = &j->work;
		}
	while (list) {
		struct work *next = list->next;
		list->next = NULL;
		if (*n == cap) {
			size_t more = cap ? cap * 2 : 64;
			struct job **grown = realloc(jobs, more * sizeof *jobs);
			if (!grown) { /* the rest fail, as they did before jobs were replayed */
				job_fail_unqueued(d, list->owner, GPUQ_E_RESTARTED, REPLAY_NOT
						  "gpuqd had no memory to hold it; submit it again");
				list = next;
				continue;
			}
			jobs = grown;
			cap = more;
		}
		jobs[(*n)++] = list->owner;
		list = next;
	}
	if (*n)
		qsort(jobs, *n, sizeof *jobs, replay_by_id);
	return jobs;
}

void replay_hold(struct daemon *d)
{
	struct replay_broken broken = { 0 };
	size_t n = 0;
	unsigned held = 0, failed = 0;
	struct job **jobs = replay_unqueue(d, &n);
	for (size_t i = 0; i < n; i++) {
		struct job *job = jobs[i];
		char why[400];
		uint64_t behind = replay_behind(&broken, job);
		if (job->request && !behind) {
			job->held = true;
			held++;
			continue;
		}
		if (behind)
			snprintf(why, sizeof why, REPLAY_BEHIND, (unsigned long long)behind);
		else
			snprintf(why, sizeof why, "%s", job->why_kept_not ? job->why_kept_not
					  : "it was gpuqd's own (the next image does that work itself)");
		replay_break(&broken, job);
		char message[sizeof why + 120];
		snprintf(message, sizeof message, REPLAY_NOT "%s; submit it again", why);
		job_fail_unqueued(d, job, GPUQ_E_RESTARTED, message);
		failed++;
	}
	free(jobs);
	free(broken.v);
	job_evict_history(&d->jobs);
	if (held)
		durable_touch(d); /* held jobs write nothing in this image: their buffers' flags go */
	if (n)
		log_info("restart: %u queued jobs held for the next image to replay, %u failed "
			 "(`restarted`)", held, failed);
}

unsigned replay_held(const struct daemon *d)
{
	unsigned n = 0;
	for (const struct job *j = d->jobs.oldest; j; j = j->newer)
		n += j->held;
	return n;
}

/* The open connection with that serial, or NULL. */
static struct conn *replay_conn(struct daemon *d, uint64_t serial)
{
	for (struct conn *c = d->server.conns; c; c = c->next)
		if (c->serial == serial && !c->closed)
			return c;
	return NULL;
}

/* Whether w is the job's own request waiting for its outcome (wait: true). */
static bool replay_is_submitter(const struct job *job, const struct waiter *w)
{
	return w->conn->serial == job->request->conn && w->request_id == job->request->id;
}

/* The job's waiters whose connections survive; *replied: its own request was answered already. */
static void replay_put_waiters(const struct job *job, bool (*survives)(const struct conn *c),
			       struct mp_map *out, bool *replied)
{
	struct mp_array list;
	mp_array_init(&list);
	*replied = true;
	for (const struct waiter *w = job->waiters; w; w = w->job_next) {
		if (replay_is_submitter(job, w)) {
			*replied = false;
			continue;
		}
		if (w->conn->closed || !survives(w->conn))
			continue;
		struct mp_map m;
		mp_map_init(&m);
		mp_put_u64(&m, "conn", w->conn->serial);
		mp_put_u64(&m, "id", w->request_id);
		mp_put_bool(&m, "progress", w->progress);
		/* what is left of its timeout (at least 1 ms: 0 would mean none) */
		if (w->timer_armed) {
			uint64_t left = uv_timer_get_due_in(&w->timer);
			mp_put_u64(&m, "timeout_ms", left ? left : 1);
		}
		mp_array_map(&list, &m);
	}
	mp_put_array(out, "waiters", &list);
}

/* Why a held job is not carried over after all (its connection, a job ahead of it); NULL: it is. */
static const char *replay_fail_why(struct daemon *d, const struct job *job,
				   bool (*survives)(const struct conn *c),
				   const struct replay_broken *broken, char *why, size_t size)
{
	const struct conn *c = replay_conn(d, job->request->conn);
	uint64_t behind = replay_behind(broken, job);
	if (!c || !survives(c))
		snprintf(why, size, REPLAY_NOT "its connection (%llu) %s; submit it again",
			 (unsigned long long)job->request->conn,
			 c ? "did not go to the next image (a request half sent on it, or replies "
			     "not yet written)" : "had closed");
	else if (behind)
		snprintf(why, size, REPLAY_NOT REPLAY_BEHIND "; submit it again",
			 (unsigned long long)behind);
	else
		return NULL;
	return why;
}

/* One held job's entry (replay.h); a job not carried over adds its buffers to broken. */
static void replay_put_job(struct daemon *d, const struct job *job,
			   bool (*survives)(const struct conn *c), struct replay_broken *broken,
			   struct mp_array *list)
{
	char why[400];
	bool replied = true;
	const char *fail = replay_fail_why(d, job, survives, broken, why, sizeof why);
	const struct conn *c = replay_conn(d, job->request->conn);
	struct mp_map m;
	mp_map_init(&m);
	mp_put_u64(&m, "job", job->id);
	mp_put_str(&m, "op", job->kind->op);
	mp_put_u64(&m, "conn", job->request->conn);
	mp_put_u64(&m, "id", job->request->id);
	mp_put_u64(&m, "uid", (uint64_t)(c ? c->uid : job->owner));
	mp_put_u64(&m, "gid", (uint64_t)(c ? c->gid : job->gid));
	mp_put_i64(&m, "pid", (int64_t)(c ? c->pid : job->pid));
	mp_put_f64(&m, "submitted", job->submitted);
	replay_put_waiters(job, survives, &m, &replied);
	mp_put_bool(&m, "replied", replied);
	if (fail) {
		mp_put_str(&m, "fail", fail);
		replay_break(broken, job);
	} else {
		mp_put_bin(&m, "request", job->request->bytes, job->request->len);
	}
	mp_array_map(list, &m);
}

/* A new memfd holding data[0..len) (close-on-exec: the restart clears it): 0 with *fd, or -1 with err. */
static int replay_write(const void *data, size_t len, int *fd, struct gpuq_error *err)
{
	int m = memfd_create("gpuq-queue", MFD_CLOEXEC);
	if (m < 0)
		return gpuq_fail(err, GPUQ_E_IO, "memfd_create: %s", strerror(errno));
	for (size_t done = 0; done < len;) {
		ssize_t w = write(m, (const char *)data + done, len - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			gpuq_fail(err, GPUQ_E_IO, "writing %zu bytes into the memfd: %s", len,
				  w < 0 ? strerror(errno) : "no progress");
			close(m);
			return -1;
		}
		done += (size_t)w;
	}
	*fd = m;
	return 0;
}

/* The hand-over could not be written: the held jobs fail here, their waiters told. */
static void replay_fail_held(struct daemon *d, const struct gpuq_error *err)
{
	char why[sizeof err->message + 200];
	snprintf(why, sizeof why, REPLAY_NOT "the hand-over to the next image could not be written "
		 "(%s); submit it again", err->message);
	for (struct job *j = d->jobs.oldest, *next; j; j = next) {
		next = j->newer;
		if (j->held)
			job_fail_unqueued(d, j, GPUQ_E_RESTARTED, why);
	}
	job_evict_history(&d->jobs);
}

int replay_hand_over(struct daemon *d, bool (*survives)(const struct conn *c), int *fd)
{
	struct replay_broken broken = { 0 };
	struct gpuq_error err;
	struct mp_map top;
	struct mp_array list;
	msgpack_sbuffer sb;
	unsigned n = replay_held(d);
	*fd = -1;
	if (n == 0)
		return 0;
	mp_map_init(&top);
	mp_array_init(&list);
	for (struct job *j = d->jobs.oldest; j; j = j->newer) /* submission order */
		if (j->held)
			replay_put_job(d, j, survives, &broken, &list);
	free(broken.v);
	mp_put_u64(&top, "v", REPLAY_VERSION);
	mp_put_array(&top, "jobs", &list);
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&top, &sb);
	int rc = replay_write(sb.data, sb.size, fd, &err);
	msgpack_sbuffer_destroy(&sb);
	if (rc != 0) {
		log_error("the %u queued jobs cannot be handed to the next image: %s; they fail with "
			  "`restarted`", n, err.message);
		replay_fail_held(d, &err);
		return -1;
	}
	for (struct job *j = d->jobs.oldest, *next; j; j = next) {
		next = j->newer;
		if (j->held)
			job_hand_over(d, j);
	}
	log_info("restart: %u queued jobs handed to the next image", n);
	return 0;
}

/* One job of the hand-over, as its map says. */
struct replay_entry {
	uint64_t job, conn, id, uid, gid;
	int64_t pid;
	double submitted;
	bool replied;
	char op[32];
	char fail[400]; /* empty: carried */
	const void *request;
	size_t request_len;
	const msgpack_object *waiters;
};

static int replay_entry_read(const msgpack_object *o, struct replay_entry *e,
			     struct gpuq_error *err)
{
	memset(e, 0, sizeof *e);
	if (o->type != MSGPACK_OBJECT_MAP)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "an entry is not a map");
	if (msg_get_u64(o, "job", &e->job, err) <= 0 || msg_get_u64(o, "conn", &e->conn, err) < 0 ||
	    msg_get_u64(o, "id", &e->id, err) < 0 || msg_get_u64(o, "uid", &e->uid, err) < 0 ||
	    msg_get_u64(o, "gid", &e->gid, err) < 0 || msg_get_i64(o, "pid", &e->pid, err) < 0 ||
	    msg_get_f64(o, "submitted", &e->submitted, err) < 0 ||
	    msg_get_bool(o, "replied", &e->replied, err) < 0 ||
	    msg_get_str(o, "op", e->op, sizeof e->op, err) < 0 ||
	    msg_get_str(o, "fail", e->fail, sizeof e->fail, err) < 0 ||
	    msg_get_array(o, "waiters", &e->waiters, err) < 0)
		return e->job ? -1 : gpuq_fail(err, GPUQ_E_BAD_REQUEST, "an entry has no job id");
	const msgpack_object *req = msg_map_get(o, "request");
	if (req && req->type == MSGPACK_OBJECT_BIN) {
		e->request = req->via.bin.ptr;
		e->request_len = req->via.bin.size;
	} else if (!e->fail[0]) {
		snprintf(e->fail, sizeof e->fail, REPLAY_NOT "the hand-over holds no request for it; "
			 "submit it again");
	}
	return 0;
}

/* A job of this image's own kind: a record of a job that was not replayed keeps its op's name. */
struct replay_kind {
	struct job_kind kind;
	char op[32];
};

static void replay_kind_free(struct job *job)
{
	free((void *)job->kind); /* the replay_kind, whose first member it is */
}

/* Answers the waiters e names: with job's outcome when it has ended, else when it ends. */
static void replay_waiters(struct daemon *d, struct job *job, const struct replay_entry *e)
{
	for (uint32_t i = 0; e->waiters && i < e->waiters->via.array.size; i++) {
		const msgpack_object *w = &e->waiters->via.array.ptr[i];
		struct gpuq_error err;
		uint64_t serial = 0, id = 0, timeout = 0;
		bool progress = false;
		if (w->type != MSGPACK_OBJECT_MAP || msg_get_u64(w, "conn", &serial, &err) <= 0 ||
		    msg_get_u64(w, "id", &id, &err) <= 0 || msg_get_bool(w, "progress", &progress, &err) < 0 ||
		    msg_get_u64(w, "timeout_ms", &timeout, &err) < 0)
			continue;
		struct conn *c = replay_conn(d, serial);
		if (!c)
			continue;
		if (job_is_finished(job)) {
			reply_outcome(c, id, job);
			continue;
		}
		struct request req = { .d = d, .conn = c, .id = id };
		struct wait_options o = { .wait = true, .progress = progress, .timeout_ms = timeout };
		wait_for(&req, job, &o);
	}
}

/*
 * The job e names did not run in this image: recorded under its id as
 * failed with code and why, so that `status` and `wait` find it; its
 * waiters are told, and its own request too unless it was answered.
 */
static void replay_record_failed(struct daemon *d, const struct replay_entry *e, bool answer,
				 enum gpuq_errc code, const char *why)
{
	struct replay_kind *k = calloc(1, sizeof *k);
	struct job *job = NULL;
	if (k) {
		snprintf(k->op, sizeof k->op, "%s", e->op[0] ? e->op : "?");
		k->kind.op = k->op;
		d->jobs.reuse.id = e->job;
		d->jobs.reuse.submitted = e->submitted;
		job = job_create(&d->jobs, &k->kind, (uid_t)e->uid, (gid_t)e->gid, (pid_t)e->pid);
		d->jobs.reuse.id = 0;
	}
	log_warn("job %llu (%s, uid %llu): %s", (unsigned long long)e->job, e->op,
		 (unsigned long long)e->uid, why);
	if (!job) {
		free(k);
		log_error("job %llu: no memory to record that it failed", (unsigned long long)e->job);
		return;
	}
	job->release = replay_kind_free;
	gpuq_fail(&job->work.error, code, "%s", why);
	job_mark_finished(&d->jobs, job);
	struct conn *c = replay_conn(d, e->conn);
	if (answer && c)
		reply_outcome(c, e->id, job);
	replay_waiters(d, job, e);
	job_evict_history(&d->jobs);
}

/*
 * Submits e's request again on connection c, under its old id: the job,
 * or NULL with err saying why this image did not take it (its refusal,
 * which the client has had on its request id unless e->replied).
 */
static struct job *replay_submit(struct daemon *d, struct conn *c, const struct replay_entry *e,
				 struct gpuq_error *err)
{
	struct gpuq_error bad;
	d->jobs.reuse.id = e->job;
	d->jobs.reuse.submitted = e->submitted;
	reply_watch(c, e->id, e->replied, err);
	int rc = request_replay(d, c, e->request, e->request_len, e->replied, &bad);
	reply_watch_end();
	d->jobs.reuse.id = 0;
	if (rc < 0) {
		*err = bad;
		return NULL;
	}
	struct job *job = job_find(&d->jobs, e->job);
	if (!job && err->code == GPUQ_OK)
		gpuq_fail(err, GPUQ_E_INTERNAL, "this image made no job of its request (its log may "
			  "say why)");
	return job;
}

/* One entry: true when its job was submitted again. */
static bool replay_one(struct daemon *d, const struct replay_entry *e)
{
	struct conn *c = replay_conn(d, e->conn);
	struct gpuq_error err;
	char why[sizeof err.message + 200];
	if (e->fail[0]) {
		replay_record_failed(d, e, !e->replied, GPUQ_E_RESTARTED, e->fail);
		return false;
	}
	if (!c || c->uid != (uid_t)e->uid || c->gid != (gid_t)e->gid) {
		snprintf(why, sizeof why, REPLAY_NOT "its connection %s; submit it again",
			 c ? "has other credentials now" : "was not taken over by the new image");
		replay_record_failed(d, e, !e->replied, GPUQ_E_RESTARTED, why);
		return false;
	}
	struct job *job = replay_submit(d, c, e, &err);
	if (!job) {
		snprintf(why, sizeof why, "gpuqd restarted while the job was queued, and the new image "
			 "refused it when it was replayed: %s", err.message);
		replay_record_failed(d, e, false, err.code == GPUQ_OK ? GPUQ_E_RESTARTED : err.code, why);
		return false;
	}
	replay_waiters(d, job, e);
	return true;
}

/* fd's whole content (malloc'd, *len bytes), then fd closed; NULL with err. */
static void *replay_slurp(int fd, size_t *len, struct gpuq_error *err)
{
	struct stat st;
	char *buf = NULL;
	if (fstat(fd, &st) != 0)
		gpuq_fail(err, GPUQ_E_IO, "fstat: %s", strerror(errno));
	else if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1)))
		gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no memory for %lld bytes", (long long)st.st_size);
	for (size_t done = 0; buf && done < (size_t)st.st_size;) {
		ssize_t r = pread(fd, buf + done, (size_t)st.st_size - done, (off_t)done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			gpuq_fail(err, GPUQ_E_IO, "reading it: %s", r < 0 ? strerror(errno) : "it ended early");
			free(buf);
			buf = NULL;
		} else {
			done += (size_t)r;
		}
	}
	*len = buf ? (size_t)st.st_size : 0;
	close(fd);
	return buf;
}

/* The hand-over's list of jobs in m, checked: NULL with err. */
static const msgpack_object *replay_list(const struct msg *m, struct gpuq_error *err)
{
	uint64_t v = 0;
	const msgpack_object *jobs = NULL;
	if (msg_get_u64(m->root, "v", &v, err) <= 0 || v != REPLAY_VERSION) {
		gpuq_fail(err, GPUQ_E_UNSUPPORTED_VERSION, "its format is version %llu; this gpuqd "
			  "reads %d", (unsigned long long)v, REPLAY_VERSION);
		return NULL;
	}
	if (msg_get_array(m->root, "jobs", &jobs, err) <= 0) {
		gpuq_fail(err, GPUQ_E_BAD_REQUEST, "it has no list of jobs");
		return NULL;
	}
	return jobs;
}

void replay_run(struct daemon *d, int fd, const char *what)
{
	struct gpuq_error err;
	struct msg m;
	size_t len = 0;
	unsigned replayed = 0, failed = 0;
	if (fd < 0)
		return;
	void *buf = replay_slurp(fd, &len, &err);
	if (!buf || msg_decode(&m, buf, len, &replay_limits, &err) != 0) {
		log_error("%s: the queued jobs handed over cannot be read (%s); they are not replayed",
			  what, err.message);
		free(buf);
		return;
	}
	const msgpack_object *jobs = replay_list(&m, &err);
	for (uint32_t i = 0; jobs && i < jobs->via.array.size; i++) {
		struct replay_entry e;
		if (replay_entry_read(&jobs->via.array.ptr[i], &e, &err) != 0) {
			log_error("%s: queued job %u of the hand-over cannot be read: %s", what, i,
				  err.message);
			failed++;
		} else if (replay_one(d, &e)) {
			replayed++;
		} else {
			failed++;
		}
	}
	if (!jobs)
		log_error("%s: the queued jobs handed over cannot be read (%s); they are not replayed",
			  what, err.message);
	log_info("%s: %u queued jobs replayed, %u failed", what, replayed, failed);
	msg_free(&m);
	free(buf);
}
