/*
 * gpuq top's renderer: a snapshot as text (the header, then one table per
 * section: devices, memory by user, users, jobs) or as one JSON object. Both
 * show what the view's filters select; the terminal loop (top.c) fits the
 * text to the screen, so lines here are as long as their content.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli/top.h"

static bool device_shown(const struct top_view *v, uint64_t device)
{
	return v->device < 0 || (uint64_t)v->device == device;
}

static bool owner_shown(const struct top_view *v, uint64_t owner)
{
	return v->owner < 0 || (uint64_t)v->owner == owner;
}

/* "37%", or "-" before there are two polls to compare. */
static const char *percent(char *buf, size_t size, bool known, double share)
{
	if (known)
		snprintf(buf, size, "%.0f%%", share * 100);
	else
		snprintf(buf, size, "-");
	return buf;
}

static const char *rate(char *buf, size_t size, bool known, double bytes_per_s)
{
	char b[32];

	if (!known)
		return snprintf(buf, size, "-"), buf;
	snprintf(buf, size, "%s/s", human_bytes(b, sizeof b, (uint64_t)bytes_per_s, 1));
	return buf;
}

static void header_text(FILE *f, const struct top_snapshot *s, const struct top_view *v)
{
	char up[32], every[32], dev[16], user[24];

	snprintf(dev, sizeof dev, v->device < 0 ? "all" : "%d", v->device);
	snprintf(user, sizeof user, v->owner < 0 ? "all" : "%" PRId64, v->owner);
	fprintf(f, "gpuq top: %s, %s backend, up %s; rates over %s; sort %s; device %s; user %s\n",
		s->server, s->backend, human_seconds(up, sizeof up, s->uptime_s),
		s->interval_s > 0 ? human_seconds(every, sizeof every, s->interval_s) : "-",
		top_sort_name(v->sort), dev, user);
}

static void device_row(struct table *t, const struct top_device *d)
{
	char b[32];
	int e;

	table_cell(t, "%" PRIu64, d->index);
	table_cell(t, "%s", d->name);
	table_cell(t, "%s", human_bytes(b, sizeof b, d->mem_used, 1));
	table_cell(t, "%s", human_bytes(b, sizeof b, d->mem_free, 1));
	table_cell(t, "%s", human_bytes(b, sizeof b, d->mem_total, 1));
	for (e = 0; e < TOP_ENGINES; e++)
		table_cell(t, "%s", percent(b, sizeof b, d->has_rates, d->busy_share[e]));
	table_cell(t, "%" PRIu64, d->inflight);
	table_cell(t, "%" PRIu64, d->queue_depth);
	table_cell(t, "%s", rate(b, sizeof b, d->has_rates, d->bytes_per_s));
	if (d->has_rates)
		table_cell(t, "%.1f", d->jobs_per_s);
	else
		table_cell(t, "-");
	table_cell(t, "%s", d->health);
}

/* Engine columns are busy shares: the part of the interval with a job on that engine. */
static void devices_text(FILE *f, const struct top_snapshot *s, const struct top_view *v)
{
	static const struct table_col cols[] = {
		{ "GPU", true },    { "NAME", false },  { "USED", true },    { "FREE", true },
		{ "TOTAL", true },  { "H2D", true },    { "D2H", true },     { "KERNEL", true },
		{ "COPY", true },   { "COLL", true },   { "OTHER", true },   { "RUN", true },
		{ "QUEUE", true },  { "MOVED", true },  { "JOBS/S", true },  { "HEALTH", false },
	};
	struct table t;
	int i;

	table_init(&t, cols, (int)(sizeof cols / sizeof cols[0]));
	for (i = 0; i < s->ndevices; i++)
		if (device_shown(v, s->devices[i].index))
			device_row(&t, &s->devices[i]);
	table_print(&t, f);
	table_free(&t);
}

static uint64_t device_total(const struct top_snapshot *s, uint64_t index)
{
	int i;

	for (i = 0; i < s->ndevices; i++)
		if (s->devices[i].index == index)
			return s->devices[i].mem_total;
	return 0;
}

static void memory_text(FILE *f, const struct top_snapshot *s, const struct top_view *v)
{
	static const struct table_col cols[] = {
		{ "GPU", true }, { "USER", true }, { "BUFFERS", true }, { "BYTES", true }, { "OF GPU", true },
	};
	struct table t;
	char b[32];
	int i;

	fprintf(f, "\nmemory by user\n");
	table_init(&t, cols, 5);
	for (i = 0; i < s->nmemory; i++) {
		const struct top_memory *m = &s->memory[i];
		uint64_t total = device_total(s, m->device);

		if (!device_shown(v, m->device) || !owner_shown(v, m->owner))
			continue;
		table_cell(&t, "%" PRIu64, m->device);
		table_cell(&t, "%" PRIu64, m->owner);
		table_cell(&t, "%" PRIu64, m->buffers);
		table_cell(&t, "%s", human_bytes(b, sizeof b, m->bytes, 1));
		table_cell(&t, "%.1f%%", total ? 100.0 * (double)m->bytes / (double)total : 0.0);
	}
	if (t.ncells)
		table_print(&t, f);
	else
		fprintf(f, "no buffers\n");
	table_free(&t);
}

/* Device time: each user's share of what every user got during the interval. */
static void users_text(FILE *f, const struct top_snapshot *s, const struct top_view *v)
{
	static const struct table_col cols[] = {
		{ "USER", true }, { "RUNNING", true }, { "QUEUED", true },
		{ "DEVICE TIME", true }, { "SHARE", true }, { "ALL LISTED JOBS", true },
	};
	double recent = 0;
	struct table t;
	char b[32];
	int i;

	for (i = 0; i < s->nusers; i++)
		recent += s->users[i].recent_s;
	fprintf(f, "\nusers (device time over the interval, and of every job gpuqd lists)\n");
	table_init(&t, cols, 6);
	for (i = 0; i < s->nusers; i++) {
		const struct top_user *u = &s->users[i];

		if (!owner_shown(v, u->owner))
			continue;
		table_cell(&t, "%" PRIu64, u->owner);
		table_cell(&t, "%" PRIu64, u->running);
		table_cell(&t, "%" PRIu64, u->queued);
		if (s->interval_s <= 0)
			table_cell(&t, "-");
		else
			table_cell(&t, "%s", u->recent_s > 0 ? human_seconds(b, sizeof b, u->recent_s) : "0");
		table_cell(&t, "%s", percent(b, sizeof b, recent > 0, recent > 0 ? u->recent_s / recent : 0));
		table_cell(&t, "%s", human_seconds(b, sizeof b, u->total_s));
	}
	if (t.ncells)
		table_print(&t, f);
	else
		fprintf(f, "no users\n");
	table_free(&t);
}

static bool job_shown(const struct top_view *v, const struct top_job *j)
{
	return device_shown(v, j->device) && owner_shown(v, j->owner);
}

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *const priorities[] = { "high", "normal", "low" };
/* The protocol's waiting reasons, in the order the summary names them. */
static const char *const reasons[] = { "queue", "buffer", "gang", "exclusive", "inflight",
				       "chain", "staging", "memory", "peers", "lease", "region" };

static int name_index(const char *const *names, int n, const char *name)
{
	int i;

	for (i = 0; i < n; i++)
		if (strcmp(names[i], name) == 0)
			return i;
	return -1;
}

/* "jobs: 1 running, 2 queued; ... high 0/1, normal 1/1, low 0/0; waiting: buffer 2" */
static void jobs_summary(FILE *f, const struct top_snapshot *s, const struct top_view *v)
{
	int run[NELEM(priorities)] = { 0 }, queued[NELEM(priorities)] = { 0 };
	int waiting[NELEM(reasons)] = { 0 }, nrun = 0, nqueued = 0, nwaiting = 0, i, k;

	for (i = 0; i < s->njobs; i++) {
		const struct top_job *j = &s->jobs[i];

		if (!job_shown(v, j))
			continue;
		k = name_index(priorities, NELEM(priorities), j->priority);
		if (k >= 0 && strcmp(j->state, "running") == 0) {
			run[k]++;
			nrun++;
		} else if (k >= 0) {
			queued[k]++;
			nqueued++;
		}
		if ((k = name_index(reasons, NELEM(reasons), j->reason)) >= 0) {
			waiting[k]++;
			nwaiting++;
		}
	}
	fprintf(f, "\njobs: %d running, %d queued; by priority (running/queued):", nrun, nqueued);
	for (k = 0; k < NELEM(priorities); k++)
		fprintf(f, "%s %s %d/%d", k ? "," : "", priorities[k], run[k], queued[k]);
	fprintf(f, "; waiting:");
	for (k = 0; k < NELEM(reasons); k++)
		if (waiting[k])
			fprintf(f, " %s %d", reasons[k], waiting[k]);
	fprintf(f, "%s\n", nwaiting ? "" : " none");
}

static void jobs_text(FILE *f, const struct top_snapshot *s, const struct top_view *v)
{
	static const struct table_col cols[] = {
		{ "JOB", true },  { "OP", false },  { "STATE", false }, { "PRIO", false },
		{ "GPU", true },  { "USER", true }, { "BUFFER", false }, { "AGE", true },
		{ "WAITING", false },
	};
	struct table t;
	char b[32];
	int i;

	jobs_summary(f, s, v);
	table_init(&t, cols, 9);
	for (i = 0; i < s->njobs; i++) {
		const struct top_job *j = &s->jobs[i];

		if (!job_shown(v, j))
			continue;
		table_cell(&t, "%" PRIu64, j->job);
		table_cell(&t, "%s", j->op);
		table_cell(&t, "%s", j->state);
		table_cell(&t, "%s", j->priority);
		table_cell(&t, "%" PRIu64, j->device);
		table_cell(&t, "%" PRIu64, j->owner);
		table_cell(&t, "%s", j->buffer);
		table_cell(&t, "%s", human_seconds(b, sizeof b, j->age_s));
		if (strcmp(j->reason, "-") == 0)
			table_cell(&t, "-");
		else
			table_cell(&t, "%s: %s", j->reason, j->waiting);
	}
	if (t.ncells)
		table_print(&t, f);
	table_free(&t);
}

void top_view_text(FILE *f, const struct top_snapshot *s, const struct top_view *v)
{
	header_text(f, s, v);
	devices_text(f, s, v);
	memory_text(f, s, v);
	users_text(f, s, v);
	jobs_text(f, s, v);
}

static void device_json(struct mp_array *arr, const struct top_device *d)
{
	struct mp_map m, busy;
	int e;

	mp_map_init(&m);
	mp_map_init(&busy);
	mp_put_u64(&m, "index", d->index);
	mp_put_str(&m, "name", d->name);
	mp_put_bool(&m, "healthy", d->healthy);
	mp_put_str(&m, "health", d->health);
	mp_put_u64(&m, "mem_total", d->mem_total);
	mp_put_u64(&m, "mem_free", d->mem_free);
	mp_put_u64(&m, "mem_used", d->mem_used);
	mp_put_u64(&m, "inflight", d->inflight);
	mp_put_u64(&m, "queue_depth", d->queue_depth);
	for (e = 0; e < TOP_ENGINES && d->has_rates; e++)
		mp_put_f64(&busy, top_engine_keys[e], d->busy_share[e]);
	mp_put_map(&m, "busy_share", &busy);
	if (d->has_rates) {
		mp_put_f64(&m, "bytes_per_s", d->bytes_per_s);
		mp_put_f64(&m, "jobs_per_s", d->jobs_per_s);
	}
	mp_array_map(arr, &m);
}

static void memory_json(struct mp_array *arr, const struct top_memory *mem)
{
	struct mp_map m;

	mp_map_init(&m);
	mp_put_u64(&m, "device", mem->device);
	mp_put_u64(&m, "owner", mem->owner);
	mp_put_u64(&m, "buffers", mem->buffers);
	mp_put_u64(&m, "bytes", mem->bytes);
	mp_array_map(arr, &m);
}

static void user_json(struct mp_array *arr, const struct top_user *u, double interval_s)
{
	struct mp_map m;

	mp_map_init(&m);
	mp_put_u64(&m, "owner", u->owner);
	mp_put_u64(&m, "running", u->running);
	mp_put_u64(&m, "queued", u->queued);
	if (interval_s > 0)
		mp_put_f64(&m, "device_s", u->recent_s);
	mp_put_f64(&m, "total_s", u->total_s);
	mp_array_map(arr, &m);
}

static void job_json(struct mp_array *arr, const struct top_job *j)
{
	struct mp_map m;

	mp_map_init(&m);
	mp_put_u64(&m, "job", j->job);
	mp_put_str(&m, "op", j->op);
	mp_put_str(&m, "state", j->state);
	mp_put_str(&m, "priority", j->priority);
	mp_put_u64(&m, "device", j->device);
	mp_put_u64(&m, "owner", j->owner);
	mp_put_str(&m, "buffer", j->buffer);
	mp_put_f64(&m, "age_s", j->age_s);
	if (strcmp(j->reason, "-") != 0) {
		mp_put_str(&m, "waiting_reason", j->reason);
		mp_put_str(&m, "waiting", j->waiting);
	}
	mp_array_map(arr, &m);
}

/* The snapshot's sections as arrays of maps, filtered as the text is. */
static void sections_json(struct mp_map *root, const struct top_snapshot *s,
			  const struct top_view *v)
{
	struct mp_array devs, mem, users, jobs;
	int i;

	mp_array_init(&devs);
	mp_array_init(&mem);
	mp_array_init(&users);
	mp_array_init(&jobs);
	for (i = 0; i < s->ndevices; i++)
		if (device_shown(v, s->devices[i].index))
			device_json(&devs, &s->devices[i]);
	for (i = 0; i < s->nmemory; i++)
		if (device_shown(v, s->memory[i].device) && owner_shown(v, s->memory[i].owner))
			memory_json(&mem, &s->memory[i]);
	for (i = 0; i < s->nusers; i++)
		if (owner_shown(v, s->users[i].owner))
			user_json(&users, &s->users[i], s->interval_s);
	for (i = 0; i < s->njobs; i++)
		if (job_shown(v, &s->jobs[i]))
			job_json(&jobs, &s->jobs[i]);
	mp_put_array(root, "devices", &devs);
	mp_put_array(root, "memory", &mem);
	mp_put_array(root, "users", &users);
	mp_put_array(root, "jobs", &jobs);
}

void top_view_json(FILE *f, const struct top_snapshot *s, const struct top_view *v)
{
	msgpack_sbuffer out;
	msgpack_unpacked up;
	struct mp_map root;

	mp_map_init(&root);
	mp_put_str(&root, "server", s->server);
	mp_put_str(&root, "backend", s->backend);
	mp_put_f64(&root, "uptime_s", s->uptime_s);
	mp_put_f64(&root, "interval_s", s->interval_s);
	mp_put_str(&root, "sort", top_sort_name(v->sort));
	sections_json(&root, s, v);
	msgpack_sbuffer_init(&out);
	mp_map_finish(&root, &out);
	msgpack_unpacked_init(&up);
	if (msgpack_unpack_next(&up, out.data, out.size, NULL) == MSGPACK_UNPACK_SUCCESS)
		render_json(f, &up.data);
	msgpack_unpacked_destroy(&up);
	msgpack_sbuffer_destroy(&out);
}
