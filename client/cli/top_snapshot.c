/*
 * gpuq top's snapshot: one poll asks ping, devices, jobs and buffers, and
 * keeps what the screen shows. The daemon's counters (engine busy seconds,
 * bytes moved, jobs run, each job's run time) only ever grow, so shares and
 * rates are the difference from the previous poll over the time between.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/cli/top.h"

const char *const top_engine_keys[TOP_ENGINES] = { "h2d", "d2h", "kernel",
						   "copy", "collective", "other" };
const char *const top_engine_titles[TOP_ENGINES] = { "H2D", "D2H", "KERNEL",
						     "COPY", "COLL", "OTHER" };

double top_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sends a request of op alone; 0 with an ok *out, or -1 with err naming op. */
static int call_op(struct gpuq_client *c, const char *op, struct gpuq_reply **out,
		   struct gpuq_error *err)
{
	struct gpuq_error e;
	struct mp_map req;

	gpuq_request_begin(c, &req, op);
	if (gpuq_call(c, &req, NULL, 0, out, &e) < 0)
		return gpuq_fail(err, e.code, "%s", e.message);
	if (gpuq_reply_ok(*out))
		return 0;
	gpuq_reply_error(*out, &e);
	gpuq_reply_free(*out);
	return gpuq_fail(err, e.code, "gpuqd refused '%s': %s", op, e.message);
}

/* The map at key inside map, or NULL. */
static const msgpack_object *field_map(const msgpack_object *map, const char *key)
{
	const msgpack_object *o = msg_map_get(map, key);

	return o && o->type == MSGPACK_OBJECT_MAP ? o : NULL;
}

/* Rates against prev's device of the same index, if it had one. */
static void device_rates(struct top_device *d, const struct top_snapshot *prev, double dt)
{
	int i, e;

	for (i = 0; prev && dt > 0 && i < prev->ndevices; i++) {
		const struct top_device *p = &prev->devices[i];

		if (p->index != d->index)
			continue;
		for (e = 0; e < TOP_ENGINES; e++) {
			double share = (d->busy_s[e] - p->busy_s[e]) / dt;

			d->busy_share[e] = share < 0 ? 0 : share > 1 ? 1 : share;
		}
		d->bytes_per_s = (double)(d->bytes_moved - p->bytes_moved) / dt;
		d->jobs_per_s = (double)(d->jobs - p->jobs) / dt;
		d->has_rates = d->bytes_moved >= p->bytes_moved && d->jobs >= p->jobs;
	}
}

static void device_read(struct top_device *d, const msgpack_object *m)
{
	const msgpack_object *sched = field_map(m, "scheduler");
	const msgpack_object *busy = sched ? field_map(sched, "busy_s") : NULL;
	const msgpack_object *counters = field_map(m, "counters");
	int e;

	d->index = field_u64(m, "index", 0);
	field_str(m, "name", d->name, sizeof d->name, "-");
	d->healthy = field_bool(m, "healthy", false);
	field_str(m, "health", d->health, sizeof d->health, d->healthy ? "ok" : "unhealthy");
	d->mem_total = field_u64(m, "mem_total", 0);
	d->mem_free = field_u64(m, "mem_free", 0);
	d->mem_used = field_u64(m, "mem_used", 0);
	d->queue_depth = field_u64(m, "queue_depth", 0);
	d->inflight = sched ? field_u64(sched, "inflight", 0) : 0;
	for (e = 0; e < TOP_ENGINES; e++)
		d->busy_s[e] = busy ? field_f64(busy, top_engine_keys[e], 0) : 0;
	d->jobs = counters ? field_u64(counters, "jobs", 0) : 0;
	d->bytes_moved = counters ? field_u64(counters, "bytes_moved", 0) : 0;
}

static int devices_read(struct top_snapshot *s, const msgpack_object *reply,
			const struct top_snapshot *prev)
{
	const msgpack_object *arr = field_array(reply, "devices");
	uint32_t i, n = arr ? arr->via.array.size : 0;

	s->devices = calloc(n ? n : 1, sizeof *s->devices);
	if (!s->devices)
		return -1;
	for (i = 0; i < n; i++) {
		struct top_device *d = &s->devices[s->ndevices];

		if (arr->via.array.ptr[i].type != MSGPACK_OBJECT_MAP)
			continue;
		device_read(d, &arr->via.array.ptr[i]);
		device_rates(d, prev, s->interval_s);
		s->ndevices++;
	}
	return 0;
}

/* The user's entry, added if new; NULL only when the array (sized to fit) is full. */
static struct top_user *user_get(struct top_snapshot *s, uint64_t owner, int cap)
{
	int i;

	for (i = 0; i < s->nusers; i++)
		if (s->users[i].owner == owner)
			return &s->users[i];
	if (s->nusers == cap)
		return NULL;
	s->users[s->nusers].owner = owner;
	return &s->users[s->nusers++];
}

/* Adds a buffer's bytes to its owner's total on its device. */
static void memory_add(struct top_snapshot *s, const msgpack_object *b)
{
	uint64_t dev = field_u64(b, "device", 0), owner = field_u64(b, "owner", 0);
	struct top_memory *m = NULL;
	int i;

	for (i = 0; i < s->nmemory && !m; i++)
		if (s->memory[i].device == dev && s->memory[i].owner == owner)
			m = &s->memory[i];
	if (!m) {
		m = &s->memory[s->nmemory++];
		m->device = dev;
		m->owner = owner;
	}
	m->buffers++;
	m->bytes += field_u64(b, "bytes", 0);
}

/* Orders memory rows by device, then owner. */
static int memory_cmp(const void *a, const void *b)
{
	const struct top_memory *x = a, *y = b;

	if (x->device != y->device)
		return x->device < y->device ? -1 : 1;
	return x->owner < y->owner ? -1 : x->owner > y->owner;
}

static int buffers_read(struct top_snapshot *s, const msgpack_object *reply)
{
	const msgpack_object *arr = field_array(reply, "buffers");
	uint32_t i, n = arr ? arr->via.array.size : 0;

	s->memory = calloc(n ? n : 1, sizeof *s->memory);
	if (!s->memory)
		return -1;
	for (i = 0; i < n; i++)
		if (arr->via.array.ptr[i].type == MSGPACK_OBJECT_MAP)
			memory_add(s, &arr->via.array.ptr[i]);
	qsort(s->memory, (size_t)s->nmemory, sizeof *s->memory, memory_cmp);
	return 0;
}

static int seen_cmp(const void *a, const void *b)
{
	const struct top_seen *x = a, *y = b;

	return x->job < y->job ? -1 : x->job > y->job;
}

/* The job's run time at the previous poll: 0 for a job new since then. */
static double seen_run_s(const struct top_snapshot *prev, uint64_t job)
{
	struct top_seen key = { .job = job };
	const struct top_seen *hit;

	if (!prev || !prev->nseen)
		return 0;
	hit = bsearch(&key, prev->seen, (size_t)prev->nseen, sizeof key, seen_cmp);
	return hit ? hit->run_s : 0;
}

static void job_read(struct top_job *j, const msgpack_object *m)
{
	j->job = field_u64(m, "job", 0);
	j->owner = field_u64(m, "owner", 0);
	j->device = field_u64(m, "device", 0);
	field_str(m, "op", j->op, sizeof j->op, "-");
	field_str(m, "state", j->state, sizeof j->state, "-");
	field_str(m, "priority", j->priority, sizeof j->priority, "normal");
	field_str(m, "buffer", j->buffer, sizeof j->buffer, "-");
	field_str(m, "waiting_reason", j->reason, sizeof j->reason, "-");
	field_str(m, "waiting", j->waiting, sizeof j->waiting, "-");
	j->run_s = field_f64(m, "run_s", 0);
	j->age_s = field_f64(m, "queued_s", 0) + j->run_s;
}

/*
 * Every job counts towards its owner's device time; only queued and
 * running ones are kept for the jobs list. A job first seen now counts with
 * all its run time, so one that started and ended between polls counts too.
 */
static void job_account(struct top_snapshot *s, const struct top_snapshot *prev,
			const msgpack_object *m, int cap)
{
	struct top_job j;
	struct top_user *u;

	job_read(&j, m);
	s->seen[s->nseen++] = (struct top_seen){ .job = j.job, .run_s = j.run_s };
	if (!(u = user_get(s, j.owner, cap)))
		return;
	u->total_s += j.run_s;
	if (prev && s->interval_s > 0 && j.run_s > seen_run_s(prev, j.job))
		u->recent_s += j.run_s - seen_run_s(prev, j.job);
	if (strcmp(j.state, "running") == 0)
		u->running++;
	else if (strcmp(j.state, "queued") == 0)
		u->queued++;
	else
		return;
	s->jobs[s->njobs++] = j;
}

static int jobs_read(struct top_snapshot *s, const msgpack_object *reply,
		     const struct top_snapshot *prev, int cap)
{
	const msgpack_object *arr = field_array(reply, "jobs");
	uint32_t i, n = arr ? arr->via.array.size : 0;

	s->jobs = calloc(n ? n : 1, sizeof *s->jobs);
	s->seen = calloc(n ? n : 1, sizeof *s->seen);
	if (!s->jobs || !s->seen)
		return -1;
	for (i = 0; i < n; i++)
		if (arr->via.array.ptr[i].type == MSGPACK_OBJECT_MAP)
			job_account(s, prev, &arr->via.array.ptr[i], cap);
	qsort(s->seen, (size_t)s->nseen, sizeof *s->seen, seen_cmp);
	return 0;
}

/* Users are those with jobs and those with buffers only (so `u` can pick them). */
static int users_read(struct top_snapshot *s, const struct gpuq_reply *jobs,
		      const struct gpuq_reply *bufs, const struct top_snapshot *prev)
{
	const msgpack_object *ja = field_array(jobs->root, "jobs");
	const msgpack_object *ba = field_array(bufs->root, "buffers");
	int cap = (int)((ja ? ja->via.array.size : 0) + (ba ? ba->via.array.size : 0));
	int i;

	s->users = calloc(cap ? (size_t)cap : 1, sizeof *s->users);
	if (!s->users || jobs_read(s, jobs->root, prev, cap) < 0 || buffers_read(s, bufs->root) < 0)
		return -1;
	for (i = 0; i < s->nmemory; i++)
		user_get(s, s->memory[i].owner, cap);
	return 0;
}

static void ping_read(struct top_snapshot *s, const msgpack_object *reply)
{
	field_str(reply, "server", s->server, sizeof s->server, "gpuqd");
	field_str(reply, "backend", s->backend, sizeof s->backend, "?");
	s->uptime_s = field_f64(reply, "uptime_s", 0);
}

int top_snapshot_poll(struct gpuq_client *c, const struct top_snapshot *prev,
		      struct top_snapshot *next, struct gpuq_error *err)
{
	static const char *const ops[] = { "ping", "devices", "jobs", "buffers" };
	struct gpuq_reply *r[4] = { NULL };
	int i, rc = 0;

	memset(next, 0, sizeof *next);
	for (i = 0; i < 4 && rc == 0; i++)
		rc = call_op(c, ops[i], &r[i], err);
	if (rc == 0) {
		next->polled_at = top_now_s();
		next->interval_s = prev && prev->polled_at > 0 ? next->polled_at - prev->polled_at : 0;
		ping_read(next, r[0]->root);
		if (devices_read(next, r[1]->root, prev) < 0 || users_read(next, r[2], r[3], prev) < 0)
			rc = gpuq_fail(err, GPUQ_E_INTERNAL, "out of memory reading a snapshot");
	}
	for (i = 0; i < 4; i++)
		if (r[i])
			gpuq_reply_free(r[i]);
	if (rc < 0)
		top_snapshot_free(next);
	return rc;
}

void top_snapshot_free(struct top_snapshot *s)
{
	free(s->devices);
	free(s->memory);
	free(s->jobs);
	free(s->users);
	free(s->seen);
	memset(s, 0, sizeof *s);
}

const char *top_sort_name(enum top_sort sort)
{
	static const char *const names[TOP_SORTS] = { "priority", "age", "device", "owner" };

	return sort < TOP_SORTS ? names[sort] : "?";
}

/* high 0, normal 1, low 2; running before queued within a priority. */
static int urgency(const struct top_job *j)
{
	int p = strcmp(j->priority, "high") == 0 ? 0 : strcmp(j->priority, "low") == 0 ? 2 : 1;

	return p * 2 + (strcmp(j->state, "running") == 0 ? 0 : 1);
}

static enum top_sort sort_key;

static int job_cmp(const void *a, const void *b)
{
	const struct top_job *x = a, *y = b;
	int64_t d = 0;

	if (sort_key == TOP_SORT_PRIORITY)
		d = urgency(x) - urgency(y);
	else if (sort_key == TOP_SORT_DEVICE)
		d = (int64_t)x->device - (int64_t)y->device;
	else if (sort_key == TOP_SORT_OWNER)
		d = (int64_t)x->owner - (int64_t)y->owner;
	if (d == 0) /* and TOP_SORT_AGE: the oldest (lowest id) first */
		d = x->job < y->job ? -1 : x->job > y->job;
	return d < 0 ? -1 : d > 0;
}

void top_snapshot_sort(struct top_snapshot *s, enum top_sort sort)
{
	sort_key = sort; /* qsort passes no context; one thread */
	qsort(s->jobs, (size_t)s->njobs, sizeof *s->jobs, job_cmp);
}
