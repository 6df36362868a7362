/*
 * gpuq quota: the limits gpuqd's quota rules set for a user, beside what
 * the user holds now. The daemon works out the limits; this only lays
 * them out.
 */
#include <inttypes.h>

#include "client/cli/cli.h"

/* The limit at key: "unlimited" for nil, a size or a count otherwise. */
static const char *limit_text(const msgpack_object *limits, const char *key, bool size,
			      char *buf, size_t bufsize)
{
	const msgpack_object *v = msg_map_get(limits, key);
	if (!v || v->type == MSGPACK_OBJECT_NIL)
		return "unlimited";
	if (size)
		return human_bytes(buf, bufsize, field_u64(limits, key, 0), 1);
	snprintf(buf, bufsize, "%" PRIu64, field_u64(limits, key, 0));
	return buf;
}

static const char *used_text(const msgpack_object *used, const char *key, bool size, char *buf,
			     size_t bufsize)
{
	if (size)
		return human_bytes(buf, bufsize, field_u64(used, key, 0), 1);
	snprintf(buf, bufsize, "%" PRIu64, field_u64(used, key, 0));
	return buf;
}

/* The devices a user may use: "all" for nil, else the list ("none" when empty). */
static const char *devices_text(const msgpack_object *limits, char *buf, size_t size)
{
	const msgpack_object *v = msg_map_get(limits, "devices");
	size_t used = 0;
	if (!v || v->type != MSGPACK_OBJECT_ARRAY)
		return "all";
	buf[0] = '\0';
	for (uint32_t i = 0; i < v->via.array.size && used < size; i++)
		used += (size_t)snprintf(buf + used, size - used, "%s%" PRIu64, i ? "," : "",
					 v->via.array.ptr[i].via.u64);
	return used ? buf : "none";
}

/* The limits that are counted, in the order rows show them: key, name, whether a size. */
static const struct quota_row {
	const char *key, *name;
	bool size;
} quota_rows[] = {
	{ "host_pinned", "host-pinned", true },
	{ "queued_jobs", "queued-jobs", false },
	{ "connections", "connections", false },
	{ "parked_fds", "parked-fds", false },
	{ "pending_frame_bytes", "pending-frame-bytes", true },
	{ "reply_bytes", "reply-bytes", true },
};

static void render_user(FILE *f, const msgpack_object *u)
{
	static const struct table_col cols[] = {
		{ "LIMIT", false }, { "ALLOWED", true }, { "USED", true },
	};
	const msgpack_object *limits = msg_map_get(u, "limits"), *used = msg_map_get(u, "used");
	const msgpack_object *mem = used ? field_array(used, "device_memory") : NULL;
	char a[64], b[64], s[96];
	struct table t;
	if (!limits || limits->type != MSGPACK_OBJECT_MAP || !used ||
	    used->type != MSGPACK_OBJECT_MAP)
		return;
	fprintf(f, "uid %" PRIu64 "%s\n", field_u64(u, "uid", 0),
		field_bool(u, "groups_known", true)
			? ""
			: " (no connection open: its group rules are not known)");
	table_init(&t, cols, 3);
	for (uint32_t i = 0; mem && i < mem->via.array.size; i++) {
		table_cell(&t, "device-memory gpu%u", (unsigned)i);
		table_cell(&t, "%s", limit_text(limits, "device_memory", true, a, sizeof a));
		table_cell(&t, "%s", human_bytes(b, sizeof b, mem->via.array.ptr[i].via.u64, 1));
	}
	for (size_t i = 0; i < sizeof quota_rows / sizeof quota_rows[0]; i++) {
		const struct quota_row *r = &quota_rows[i];
		table_cell(&t, "%s", r->name);
		table_cell(&t, "%s", limit_text(limits, r->key, r->size, a, sizeof a));
		table_cell(&t, "%s", used_text(used, r->key, r->size, b, sizeof b));
	}
	table_cell(&t, "devices");
	table_cell(&t, "%s", devices_text(limits, s, sizeof s));
	table_cell(&t, "-");
	table_cell(&t, "max-priority");
	table_cell(&t, "%s", field_str(limits, "max_priority", s, sizeof s, "high"));
	table_cell(&t, "-");
	table_cell(&t, "weight");
	table_cell(&t, "%g", field_f64(limits, "weight", 1));
	table_cell(&t, "-");
	table_cell(&t, "benchmarks");
	table_cell(&t, "%s", field_bool(limits, "benchmarks", false) ? "yes" : "no");
	table_cell(&t, "-");
	table_print(&t, f);
	table_free(&t);
}

static void render_quota(FILE *f, const msgpack_object *reply)
{
	const msgpack_object *users = field_array(reply, "users");
	if (!users || users->via.array.size == 0) {
		fprintf(f, "no users\n");
		return;
	}
	for (uint32_t i = 0; i < users->via.array.size; i++) {
		if (i)
			fputc('\n', f);
		if (users->via.array.ptr[i].type == MSGPACK_OBJECT_MAP)
			render_user(f, &users->via.array.ptr[i]);
	}
}

int cmd_quota(struct cli *cli)
{
	struct mp_map req;
	int rc = cli_begin(cli, &req, "quota");
	if (rc)
		return rc;
	if (cli->has_uid)
		mp_put_u64(&req, "uid", cli->uid);
	return cli_call_and_render(cli, &req, render_quota);
}
