/*
 * Human output of gpuqd's replies, and --json. Rendering never fails on an
 * odd reply: a missing or mistyped field prints as "-" or is left out, since
 * the reply's JSON (--json) is always there to show what came back.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/cli/cli.h"

void render_json(FILE *f, const msgpack_object *obj)
{
	msg_print_json(f, obj);
	fputc('\n', f);
}

void render_ping(FILE *f, const msgpack_object *reply)
{
	char server[128], backend[32], up[32];
	uint64_t ndev = field_u64(reply, "devices", 0);

	fprintf(f, "%s (protocol %" PRIu64 "): %s backend, %" PRIu64 " device%s, up %s, pid %" PRIu64 "\n",
		field_str(reply, "server", server, sizeof(server), "gpuqd"),
		field_u64(reply, "version", 0),
		field_str(reply, "backend", backend, sizeof(backend), "?"), ndev,
		ndev == 1 ? "" : "s",
		human_seconds(up, sizeof(up), field_f64(reply, "uptime_s", -1)),
		field_u64(reply, "pid", 0));
	uint64_t recoveries = field_u64(reply, "recoveries", 0);
	if (recoveries)
		fprintf(f, "came back from the service manager's descriptor store %" PRIu64
			" time%s (after dying, or a stop under the store), buffers kept\n", recoveries,
			recoveries == 1 ? "" : "s");
}

static void device_row(struct table *t, const msgpack_object *d)
{
	char s[128];

	table_cell(t, "%" PRIu64, field_u64(d, "index", 0));
	table_cell(t, "%s", field_str(d, "name", s, sizeof(s), "-"));
	table_cell(t, "%s", field_str(d, "backend", s, sizeof(s), "-"));
	table_cell(t, "%s", field_str(d, "compute_capability", s, sizeof(s), "-"));
	table_cell(t, "%" PRIu64, field_u64(d, "sms", 0));
	table_cell(t, "%s", human_bytes(s, sizeof(s), field_u64(d, "mem_used", 0), 1));
	table_cell(t, "%s", human_bytes(s, sizeof(s), field_u64(d, "mem_free", 0), 1));
	table_cell(t, "%s", human_bytes(s, sizeof(s), field_u64(d, "mem_total", 0), 1));
	table_cell(t, "%" PRIu64, field_u64(d, "queue_depth", 0));
	table_cell(t, "%s", field_str(d, "uuid", s, sizeof(s), "-")); /* what a buffer's GPU is known by */
	table_cell(t, "%s", field_str(d, "health", s, sizeof(s),
				     field_bool(d, "healthy", false) ? "ok" : "unhealthy"));
}

void render_devices(FILE *f, const msgpack_object *reply)
{
	static const struct table_col cols[] = {
		{ "GPU", true },   { "NAME", false },  { "BACKEND", false }, { "CC", false },
		{ "SMS", true },   { "USED", true },   { "FREE", true },     { "TOTAL", true },
		{ "QUEUE", true }, { "UUID", false }, { "HEALTH", false },
	};
	const msgpack_object *devs = field_array(reply, "devices");
	struct table t;
	uint32_t i;

	if (!devs || devs->via.array.size == 0) {
		fprintf(f, "no devices\n");
		return;
	}
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	for (i = 0; i < devs->via.array.size; i++)
		if (devs->via.array.ptr[i].type == MSGPACK_OBJECT_MAP)
			device_row(&t, &devs->via.array.ptr[i]);
	table_print(&t, f);
	table_free(&t);
	render_peer_paths(f, devs);
	render_absent(f, field_array(reply, "absent"));
}

/* Under `gpuq devices`: buffers kept for GPUs this gpuqd does not serve. */
void render_absent(FILE *f, const msgpack_object *absent)
{
	char uuid[80], size[32];

	for (uint32_t i = 0; absent && i < absent->via.array.size; i++) {
		const msgpack_object *a = &absent->via.array.ptr[i];
		uint64_t n = field_u64(a, "buffers", 0);

		fprintf(f, "kept for GPU %s, which this gpuqd does not serve: %" PRIu64 " buffer%s, %s "
			   "(back when a gpuqd serves it: gpuqd --devices; or freed by gpuq admin "
			   "drop-absent)\n",
			field_str(a, "uuid", uuid, sizeof(uuid), "?"), n, n == 1 ? "" : "s",
			human_bytes(size, sizeof(size), field_u64(a, "bytes", 0), 1));
	}
}

/* Under `gpuq devices`, with several devices: how a copy from each to the others travels. */
void render_peer_paths(FILE *f, const msgpack_object *devs)
{
	char path[32], note[200];

	if (!devs || devs->type != MSGPACK_OBJECT_ARRAY || devs->via.array.size < 2)
		return;
	fprintf(f, "copies between devices (gpuq copy SRC@I DST@J):\n");
	for (uint32_t i = 0; i < devs->via.array.size; i++) {
		const msgpack_object *d = &devs->via.array.ptr[i];
		const msgpack_object *paths = d->type == MSGPACK_OBJECT_MAP ?
						      msg_map_get(d, "peer_path") : NULL;

		if (!paths || paths->type != MSGPACK_OBJECT_ARRAY)
			continue;
		const char *sep = " ";

		fprintf(f, "  from %u:", i);
		for (uint32_t j = 0; j < paths->via.array.size; j++) {
			const msgpack_object *p = &paths->via.array.ptr[j];

			if (j == i || p->type != MSGPACK_OBJECT_STR)
				continue;
			snprintf(path, sizeof(path), "%.*s", (int)p->via.str.size, p->via.str.ptr);
			fprintf(f, "%sto %u %s", sep, j, path);
			sep = ", ";
		}
		fputc('\n', f);
		if (*field_str(d, "peer_path_note", note, sizeof(note), ""))
			fprintf(f, "  note (%u): %s\n", i, note);
	}
}

/* Root sees every user's buffers: show owners only when someone else's are there. */
static bool others_own_any(const msgpack_object *arr)
{
	uint32_t i;

	for (i = 0; i < arr->via.array.size; i++)
		if (field_u64(&arr->via.array.ptr[i], "owner", geteuid()) != geteuid())
			return true;
	return false;
}

static void buffer_row(struct table *t, const msgpack_object *b, bool owners)
{
	char s[128];

	table_cell(t, "%s", field_str(b, "name", s, sizeof(s), "-"));
	table_cell(t, "%" PRIu64, field_u64(b, "device", 0));
	table_cell(t, "%s", field_str(b, "dtype", s, sizeof(s), "-"));
	table_cell(t, "%" PRIu64, field_u64(b, "count", 0));
	table_cell(t, "%s", human_bytes(s, sizeof(s), field_u64(b, "bytes", 0), 1));
	table_cell(t, "%s", field_str(b, "state", s, sizeof(s), "-"));
	table_cell(t, "%s", human_seconds(s, sizeof(s), field_f64(b, "age_s", -1)));
	if (owners)
		table_cell(t, "%" PRIu64, field_u64(b, "owner", 0));
}

/* Under `gpuq buffers`: those kept for GPUs gpuqd does not serve, a line each. */
static void render_absent_buffers(FILE *f, const msgpack_object *absent)
{
	char name[160], uuid[80], size[32];

	for (uint32_t i = 0; absent && i < absent->via.array.size; i++) {
		const msgpack_object *a = &absent->via.array.ptr[i];

		fprintf(f, "%s (%s) is kept for GPU %s, which gpuqd does not serve now: back when a "
			   "gpuqd serves it\n",
			field_str(a, "name", name, sizeof(name), "?"),
			human_bytes(size, sizeof(size), field_u64(a, "bytes", 0), 1),
			field_str(a, "uuid", uuid, sizeof(uuid), "?"));
	}
}

void render_buffers(FILE *f, const msgpack_object *reply)
{
	static const struct table_col cols[] = {
		{ "NAME", false }, { "GPU", true },    { "DTYPE", false }, { "COUNT", true },
		{ "SIZE", true },  { "STATE", false }, { "AGE", true },    { "OWNER", true },
	};
	const msgpack_object *bufs = field_array(reply, "buffers");
	struct table t;
	bool owners;
	uint32_t i;

	if (!bufs || bufs->via.array.size == 0) {
		fprintf(f, "no buffers\n");
	} else {
		owners = others_own_any(bufs);
		table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])) - (owners ? 0 : 1));
		for (i = 0; i < bufs->via.array.size; i++)
			if (bufs->via.array.ptr[i].type == MSGPACK_OBJECT_MAP)
				buffer_row(&t, &bufs->via.array.ptr[i], owners);
		table_print(&t, f);
		table_free(&t);
	}
	render_absent_buffers(f, field_array(reply, "absent"));
}

/* "code: message" of a record's error map, or "-". */
static const char *record_error(const msgpack_object *rec, char *buf, size_t size)
{
	const msgpack_object *e = msg_map_get(rec, "error");
	char code[64], msg[400];

	if (!e || e->type != MSGPACK_OBJECT_MAP)
		return "-";
	snprintf(buf, size, "%s: %s", field_str(e, "code", code, sizeof(code), "?"),
		 field_str(e, "message", msg, sizeof(msg), ""));
	return buf;
}

static const char *record_error_code(const msgpack_object *rec, char *buf, size_t size)
{
	const msgpack_object *e = msg_map_get(rec, "error");

	if (!e || e->type != MSGPACK_OBJECT_MAP)
		return "-";
	return field_str(e, "code", buf, size, "?");
}

static void job_row(struct table *t, const msgpack_object *j)
{
	char s[128];

	table_cell(t, "%" PRIu64, field_u64(j, "job", 0));
	table_cell(t, "%s", field_str(j, "op", s, sizeof(s), "-"));
	table_cell(t, "%s", field_str(j, "state", s, sizeof(s), "-"));
	table_cell(t, "%s", field_str(j, "priority", s, sizeof(s), "-"));
	table_cell(t, "%" PRIu64, field_u64(j, "device", 0));
	table_cell(t, "%s", field_str(j, "buffer", s, sizeof(s), "-"));
	table_cell(t, "%s", human_seconds(s, sizeof(s), field_f64(j, "queued_s", -1)));
	table_cell(t, "%s", human_seconds(s, sizeof(s), field_f64(j, "run_s", -1)));
	/* Only the code (`gpuq status JOB` has the whole message), or why it waits. */
	if (msg_map_get(j, "error"))
		table_cell(t, "%s", record_error_code(j, s, sizeof(s)));
	else
		table_cell(t, "%s", field_str(j, "waiting", s, sizeof(s), "-"));
}

static unsigned job_state_bit(const msgpack_object *job)
{
	char s[16];
	const char *state = field_str(job, "state", s, sizeof(s), "");
	if (strcmp(state, "queued") == 0)
		return CLI_JOBS_QUEUED;
	if (strcmp(state, "running") == 0)
		return CLI_JOBS_RUNNING;
	return strcmp(state, "failed") == 0 ? CLI_JOBS_FAILED : 0;
}

/*
 * The daemon lists jobs oldest first; people look for the latest. The
 * selection is a shallow copy of the reply whose `jobs` array points at the
 * chosen entries, newest first, so that --json and the table show the same.
 */
void render_jobs_selected(FILE *f, const msgpack_object *reply, const struct jobs_filter *flt,
			  bool json)
{
	const msgpack_object *jobs = field_array(reply, "jobs");
	uint32_t n = jobs ? jobs->via.array.size : 0, kept = 0;
	msgpack_object *chosen = calloc(n ? n : 1, sizeof *chosen);
	msgpack_object_kv *kv = calloc(reply->via.map.size ? reply->via.map.size : 1, sizeof *kv);

	if (!chosen || !kv) {
		fprintf(stderr, "gpuq: out of memory listing %u jobs\n", n);
		free(chosen);
		free(kv);
		return;
	}
	for (uint32_t i = n; i-- > 0 && (flt->last == 0 || kept < flt->last);) {
		const msgpack_object *job = &jobs->via.array.ptr[i];
		if (job->type == MSGPACK_OBJECT_MAP && (!flt->states || (job_state_bit(job) & flt->states)))
			chosen[kept++] = *job;
	}
	msgpack_object view = *reply;
	view.via.map.ptr = kv;
	for (uint32_t i = 0; i < reply->via.map.size; i++) {
		kv[i] = reply->via.map.ptr[i];
		if (&reply->via.map.ptr[i].val == jobs) {
			kv[i].val.via.array.ptr = chosen;
			kv[i].val.via.array.size = kept;
		}
	}
	if (json)
		render_json(f, &view);
	else
		render_jobs(f, &view);
	free(chosen);
	free(kv);
}

void render_jobs(FILE *f, const msgpack_object *reply)
{
	static const struct table_col cols[] = {
		{ "JOB", true },     { "OP", false },    { "STATE", false },           { "PRIO", false },
		{ "GPU", true },     { "BUFFER", false }, { "QUEUED", true },          { "RUN", true },
		{ "ERROR/WAITING", false },
	};
	const msgpack_object *jobs = field_array(reply, "jobs");
	struct table t;
	uint32_t i;

	if (!jobs || jobs->via.array.size == 0) {
		fprintf(f, "no jobs\n");
		return;
	}
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	for (i = 0; i < jobs->via.array.size; i++)
		if (jobs->via.array.ptr[i].type == MSGPACK_OBJECT_MAP)
			job_row(&t, &jobs->via.array.ptr[i]);
	table_print(&t, f);
	table_free(&t);
}

/* Decimal units, as GB/s is: small transfers would all read "0.00 GB/s". */
static void human_rate(char *buf, size_t size, double gbps)
{
	static const char *const units[] = { "GB/s", "MB/s", "kB/s", "B/s" };
	int u = 0;

	while (gbps < 1 && u < 3) {
		gbps *= 1e3;
		u++;
	}
	snprintf(buf, size, "%.2f %s", gbps, units[u]);
}

/* put and get: "put w0: 1.00 GiB in 0.52 s (2.06 GB/s, staged)". */
static void summary_transfer(FILE *f, const char *op, const char *buf,
			     const msgpack_object *res)
{
	char size[32], secs[32], path[32], rate[32];
	uint64_t bytes = field_u64(res, "bytes", 0);
	double s = field_f64(res, "seconds", 0);
	double gbps = field_f64(res, "gbps", s > 0 ? (double)bytes / s / 1e9 : 0);

	human_rate(rate, sizeof(rate), gbps);
	fprintf(f, "%s %s: %s in %s (%s, %s%s)\n", op, buf,
		human_bytes(size, sizeof(size), bytes, 2), human_seconds(secs, sizeof(secs), s),
		rate, field_str(res, "path", path, sizeof(path), "-"),
		field_bool(res, "verified", false) ? ", verified" : "");
}

static void summary_alloc(FILE *f, const char *buf, const msgpack_object *rec,
			  const msgpack_object *res)
{
	char name[80], dtype[16], size[32];

	field_str(res, "name", name, sizeof(name), buf);
	field_str(res, "dtype", dtype, sizeof(dtype), "bytes");
	fprintf(f, "alloc %s@%" PRIu64 ": %s", name,
		field_u64(res, "device", field_u64(rec, "device", 0)),
		human_bytes(size, sizeof(size), field_u64(res, "bytes", 0), 2));
	if (strcmp(dtype, "bytes") != 0)
		fprintf(f, " (%" PRIu64 " x %s)", field_u64(res, "count", 0), dtype);
	fputc('\n', f);
}

/* "copy a@0[0:1048576] -> b@1[0:1048576]: 1.00 MiB in 41 µs (25.6 GB/s) by nvlink, verified" */
void render_copy_summary(FILE *f, const msgpack_object *res)
{
	char src[128], dst[128], path[32], engine[8], size[32], secs[32];

	field_str(res, "src", src, sizeof(src), "?");
	field_str(res, "dst", dst, sizeof(dst), "?");
	field_str(res, "path", path, sizeof(path), "?");
	field_str(res, "engine", engine, sizeof(engine), "");
	human_bytes(size, sizeof(size), field_u64(res, "bytes", 0), 2);
	human_seconds(secs, sizeof(secs), field_f64(res, "seconds", -1));
	fprintf(f, "copy %s -> %s: %s in %s (%.1f GB/s) by %s", src, dst, size, secs,
		field_f64(res, "gbps", 0), path);
	if (engine[0] && strcmp(engine, path) != 0)
		fprintf(f, " (engine %s)", engine);
	if (field_bool(res, "verified", false))
		fprintf(f, ", verified (checksum 0x%016" PRIx64 ")", field_u64(res, "checksum", 0));
	fputc('\n', f);
}

/* The one line for a job in state done, by op. */
static void summary_done(FILE *f, const char *op, const char *buf,
			 const msgpack_object *rec, const msgpack_object *res)
{
	char size[32], run[32], queued[32];
	uint64_t bytes = field_u64(res, "bytes", 0);

	human_bytes(size, sizeof(size), bytes, 2);
	human_seconds(run, sizeof(run), field_f64(rec, "run_s", -1));
	if (strcmp(op, "put") == 0 || strcmp(op, "get") == 0)
		summary_transfer(f, op, buf, res);
	else if (strcmp(op, "copy") == 0)
		render_copy_summary(f, res);
	else if (strcmp(op, "alloc") == 0)
		summary_alloc(f, buf, rec, res);
	else if (strcmp(op, "checksum") == 0)
		fprintf(f, "checksum %s: 0x%016" PRIx64 " (%s)\n", buf,
			field_u64(res, "checksum", 0), size);
	else if (strcmp(op, "free") == 0)
		fprintf(f, "free %s: %s released\n", buf, size);
	else if (strcmp(op, "fill") == 0)
		fprintf(f, "fill %s: %s in %s\n", buf, size, run);
	else if (strcmp(op, "noop") == 0)
		fprintf(f, "noop gpu %" PRIu64 ": job %" PRIu64 " ran in %s (queued %s)\n",
			field_u64(res, "device", field_u64(rec, "device", 0)),
			field_u64(rec, "job", 0), run,
			human_seconds(queued, sizeof(queued), field_f64(rec, "queued_s", -1)));
	else
		fprintf(f, "%s: job %" PRIu64 " done in %s\n", op, field_u64(rec, "job", 0), run);
}

void render_job_summary(FILE *f, const msgpack_object *rec)
{
	char op[32], buf[96], state[32], err[512];
	const msgpack_object *res = msg_map_get(rec, "result");

	field_str(rec, "op", op, sizeof(op), "?");
	field_str(rec, "buffer", buf, sizeof(buf), "-");
	field_str(rec, "state", state, sizeof(state), "?");
	if (strcmp(state, "done") == 0 && res && res->type == MSGPACK_OBJECT_MAP) {
		summary_done(f, op, buf, rec, res);
		return;
	}
	fprintf(f, "job %" PRIu64 " (%s %s): %s", field_u64(rec, "job", 0), op, buf, state);
	if (msg_map_get(rec, "error"))
		fprintf(f, ": %s", record_error(rec, err, sizeof(err)));
	fputc('\n', f);
}

void render_job_record(FILE *f, const msgpack_object *rec)
{
	char s[512];
	const msgpack_object *res = msg_map_get(rec, "result");

	fprintf(f, "job     %" PRIu64 "\n", field_u64(rec, "job", 0));
	fprintf(f, "op      %s\n", field_str(rec, "op", s, sizeof(s), "-"));
	fprintf(f, "state   %s\n", field_str(rec, "state", s, sizeof(s), "-"));
	if (msg_map_get(rec, "waiting"))
		fprintf(f, "waiting %s\n", field_str(rec, "waiting", s, sizeof(s), "-"));
	fprintf(f, "priority %s\n", field_str(rec, "priority", s, sizeof(s), "normal"));
	fprintf(f, "owner   %" PRIu64 "\n", field_u64(rec, "owner", 0));
	fprintf(f, "device  %" PRIu64 "\n", field_u64(rec, "device", 0));
	fprintf(f, "buffer  %s\n", field_str(rec, "buffer", s, sizeof(s), "-"));
	fprintf(f, "queued  %s\n", human_seconds(s, sizeof(s), field_f64(rec, "queued_s", -1)));
	fprintf(f, "run     %s\n", human_seconds(s, sizeof(s), field_f64(rec, "run_s", -1)));
	if (res && res->type == MSGPACK_OBJECT_MAP) {
		fprintf(f, "result  ");
		render_job_summary(f, rec);
	}
	if (msg_map_get(rec, "error"))
		fprintf(f, "error   %s\n", record_error(rec, s, sizeof(s)));
}

void render_cancel(FILE *f, const msgpack_object *reply)
{
	const msgpack_object *rec = msg_map_get(reply, "job");
	char state[32];
	uint64_t job;

	if (!rec || rec->type != MSGPACK_OBJECT_MAP)
		return;
	job = field_u64(rec, "job", 0);
	field_str(rec, "state", state, sizeof(state), "?");
	if (!field_bool(reply, "cancel_requested", false))
		fprintf(f, "job %" PRIu64 " had already finished (%s); nothing to cancel\n",
			job, state);
	else if (strcmp(state, "cancelled") == 0)
		fprintf(f, "job %" PRIu64 " cancelled\n", job);
	else
		fprintf(f, "job %" PRIu64 " is %s: it stops at its next chunk, or ends first "
			   "if it is not cut into chunks (`gpuq wait %" PRIu64 "` waits for that)\n",
			job, state, job);
}
