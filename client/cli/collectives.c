/*
 * The collective commands: allreduce, reduce-scatter, all-gather,
 * broadcast, reduce and all-to-all (one request named after the command,
 * over buffer NAME on the devices in rank order), sendrecv SRC DST, and
 * group (several of them as one NCCL group); and the --devices syntax,
 * which bench collective shares. Requests are built with libgpuq's
 * gpuq_collective_*; whether the buffers exist and fit is the daemon's to
 * say.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli/cli.h"

#define GROUP_MAX 64    /* the daemon's limit: it names the fix when more come */
#define GROUP_TOKENS 16 /* words in one group entry */

/* The daemon's device count, from ping; -(exit code) after printing why. */
static int daemon_device_count(struct cli *cli)
{
	struct gpuq_reply *r;
	struct mp_map req;
	int rc = cli_begin(cli, &req, "ping");

	if (rc || (rc = cli_call(cli, &req, NULL, 0, &r)))
		return -rc;
	if (!gpuq_reply_ok(r)) {
		rc = cli_report_refusal(r);
		gpuq_reply_free(r);
		return -rc;
	}
	rc = (int)field_u64(r->root, "devices", 0);
	gpuq_reply_free(r);
	if (rc == 0) {
		fprintf(stderr, "gpuq: gpuqd serves no devices\n");
		return -CLI_REFUSED;
	}
	return rc;
}

/* One token of a --devices list: "N" or "A-B" (A <= B). 0, or -1. */
static int parse_device_token(const char *tok, uint64_t *lo, uint64_t *hi)
{
	char a[32];
	const char *dash = strchr(tok, '-');

	if (!dash) {
		if (cli_parse_uint(tok, lo) < 0)
			return -1;
		*hi = *lo;
		return 0;
	}
	if ((size_t)(dash - tok) >= sizeof(a))
		return -1;
	memcpy(a, tok, (size_t)(dash - tok));
	a[dash - tok] = '\0';
	if (cli_parse_uint(a, lo) < 0 || cli_parse_uint(dash + 1, hi) < 0 || *hi < *lo)
		return -1;
	return 0;
}

int cli_parse_devices(struct cli *cli, const char *list, int *devices, int max)
{
	char copy[256], *tok, *save;
	uint64_t lo, hi;
	int n = 0;

	if (strcmp(list, "all") == 0) {
		int count = daemon_device_count(cli);

		for (n = 0; n < count && n < max; n++)
			devices[n] = n;
		return count < 0 ? count : n;
	}
	snprintf(copy, sizeof(copy), "%s", list);
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (parse_device_token(tok, &lo, &hi) < 0 || hi >= (uint64_t)max)
			return -cli_usage(cli, "--devices '%s': '%s' is not a device or an ascending "
					       "range of devices (0 to %d); give all, 0-3 or 3,1,0",
					  list, tok, max - 1);
		for (uint64_t d = lo; d <= hi; d++) {
			if (n == max)
				return -cli_usage(cli, "--devices '%s' lists more than %d devices",
						  list, max);
			devices[n++] = (int)d;
		}
	}
	if (n == 0)
		return -cli_usage(cli, "--devices '%s' lists no device", list);
	return n;
}

const char *cli_collective_op(const char *name)
{
	static const char *const ops[][2] = {
		{ "allreduce", "allreduce" },   { "all-reduce", "allreduce" },
		{ "reduce-scatter", "reduce_scatter" }, { "reduce_scatter", "reduce_scatter" },
		{ "all-gather", "all_gather" }, { "all_gather", "all_gather" },
		{ "broadcast", "broadcast" },   { "reduce", "reduce" },
		{ "sendrecv", "sendrecv" },     { "all-to-all", "all_to_all" },
		{ "all_to_all", "all_to_all" },
	};

	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (strcmp(name, ops[i][0]) == 0)
			return ops[i][1];
	return NULL;
}

/* "0,1,3" from a reply's devices array. */
static const char *devices_text(const msgpack_object *arr, char *buf, size_t size)
{
	size_t used = 0;

	buf[0] = '\0';
	if (!arr || arr->type != MSGPACK_OBJECT_ARRAY)
		return "-";
	for (uint32_t i = 0; i < arr->via.array.size && used < size; i++)
		used += (size_t)snprintf(buf + used, size - used, "%s%" PRIu64, i ? "," : "",
					 arr->via.array.ptr[i].via.u64);
	return buf;
}

/*
 * What one primitive did: "sum of 1000 x f32 (3.9 KiB) in place",
 * "1000 x f32 (3.9 KiB) from root rank 1 (device 3) into b",
 * "a@0[0:4000] -> b@1[0:4000]: 1000 x f32 (3.9 KiB)".
 */
static void render_shape(FILE *f, const msgpack_object *res)
{
	char a[160], b[160], op[16], dtype[16], size[32];

	field_str(res, "collective", op, sizeof(op), "?");
	if (strcmp(op, "sendrecv") == 0)
		fprintf(f, "%s -> %s: ", field_str(res, "src", a, sizeof(a), "?"),
			field_str(res, "dst", b, sizeof(b), "?"));
	if (msg_map_get(res, "reduce"))
		fprintf(f, "%s of ", field_str(res, "reduce", op, sizeof(op), "?"));
	fprintf(f, "%" PRIu64 " x %s (%s)", field_u64(res, "count", 0),
		field_str(res, "dtype", dtype, sizeof(dtype), "?"),
		human_bytes(size, sizeof(size), field_u64(res, "bytes", 0), 1));
	if (msg_map_get(res, "root"))
		fprintf(f, ", root rank %" PRIu64 " (device %" PRIu64 ")", field_u64(res, "root", 0),
			field_u64(res, "root_device", 0));
	if (!msg_map_get(res, "in_place"))
		return;
	if (field_bool(res, "in_place", true))
		fprintf(f, " in place");
	else
		fprintf(f, " into %s", field_str(res, "out", b, sizeof(b), "?"));
}

/* "; 41 µs, 0.20 GB/s algbw, 0.20 GB/s busbw, communicator created" */
static void render_rates(FILE *f, const msgpack_object *res)
{
	char secs[32], comm[16];

	fprintf(f, ": %s, %.2f GB/s algbw, %.2f GB/s busbw, communicator %s\n",
		human_seconds(secs, sizeof(secs), field_f64(res, "seconds", -1)),
		field_f64(res, "algbw_gbps", 0), field_f64(res, "busbw_gbps", 0),
		field_str(res, "communicator", comm, sizeof(comm), "?"));
}

/*
 * "allreduce grads over devices 0,1: sum of 1000 x f32 (3.9 KiB) in place:
 * 41 µs, ...", or for a group a line for the group and one per primitive.
 */
static void render_collective(FILE *f, const msgpack_object *rec)
{
	const msgpack_object *res = msg_map_get(rec, "result");
	const msgpack_object *ops = res ? msg_map_get(res, "ops") : NULL;
	char op[32], name[160], devs[256], size[32];

	if (!res || res->type != MSGPACK_OBJECT_MAP) {
		render_job_summary(f, rec);
		return;
	}
	field_str(res, "collective", op, sizeof(op), "?");
	devices_text(msg_map_get(res, "devices"), devs, sizeof(devs));
	if (!ops || ops->type != MSGPACK_OBJECT_ARRAY) {
		fprintf(f, "%s", op);
		if (msg_map_get(res, "buffer"))
			fprintf(f, " %s", field_str(res, "buffer", name, sizeof(name), "?"));
		fprintf(f, " over devices %s: ", devs);
		render_shape(f, res);
		render_rates(f, res);
		return;
	}
	fprintf(f, "group of %" PRIu32 " over devices %s: %s", ops->via.array.size, devs,
		human_bytes(size, sizeof(size), field_u64(res, "bytes", 0), 1));
	render_rates(f, res);
	for (uint32_t i = 0; i < ops->via.array.size; i++) {
		const msgpack_object *o = &ops->via.array.ptr[i];

		fprintf(f, "  %s", field_str(o, "collective", op, sizeof(op), "?"));
		if (msg_map_get(o, "buffer"))
			fprintf(f, " %s", field_str(o, "buffer", name, sizeof(name), "?"));
		fprintf(f, ": ");
		render_shape(f, o);
		fprintf(f, "\n");
	}
}

/* Sends a collective job request and renders its reply. */
static int finish_collective(struct cli *cli, struct mp_map *req)
{
	struct gpuq_reply *r;
	const msgpack_object *rec;
	int rc;

	if (cli->has_coll_timeout)
		mp_put_u64(req, "collective_timeout_ms", cli->coll_timeout_ms);
	if ((rc = progress_call(cli, req, NULL, 0, &r)) != 0)
		return rc;
	rec = gpuq_reply_get(r, "job");
	if (!cli->json && !cli->detach && gpuq_reply_ok(r) && rec &&
	    rec->type == MSGPACK_OBJECT_MAP) {
		render_collective(cli->out, rec);
		gpuq_reply_free(r);
		return CLI_OK;
	}
	return cli_finish_job(cli, r);
}

/* A job request as cli_job_begin makes one, with the fields libgpuq puts for c. */
static int begin_job(struct cli *cli, struct mp_map *req, const struct gpuq_collective *c,
		     const int *devices, int n)
{
	struct mp_array arr;
	int rc = cli_job_begin(cli, req, c->op);

	if (rc != 0)
		return rc;
	if (n > 0) {
		mp_array_init(&arr);
		for (int i = 0; i < n; i++)
			mp_array_u64(&arr, (uint64_t)devices[i]);
		mp_put_array(req, "devices", &arr);
	}
	gpuq_collective_put(req, c);
	return 0;
}

/* --devices, when given; the count, 0 when absent, or -(exit code). Checks --count too. */
static int read_devices(struct cli *cli, int *devices)
{
	if (cli->has_count && cli->count == 0)
		return -cli_usage(cli, "--count 0: give 1 or more elements, or leave it out");
	if (!cli->devices)
		return 0;
	return cli_parse_devices(cli, cli->devices, devices, 256);
}

int cmd_collective(struct cli *cli)
{
	struct gpuq_collective c = { .op = cli_collective_op(cli->cmd->name), .root = -1 };
	int devices[256], n, rc;
	struct mp_map req;

	if ((n = read_devices(cli, devices)) < 0)
		return -n;
	c.buffer = cli->args[0];
	c.out = cli->out_buffer;
	c.reduce = cli->redop;
	c.root = cli->has_root ? (int)(cli->root > INT_MAX ? INT_MAX : cli->root) : -1;
	c.count = cli->has_count ? cli->count : 0;
	if ((rc = begin_job(cli, &req, &c, devices, n)) != 0)
		return rc;
	return finish_collective(cli, &req);
}

int cmd_sendrecv(struct cli *cli)
{
	struct gpuq_collective c = { .op = "sendrecv", .root = -1 };
	int devices[256], n, rc;
	struct mp_map req;

	if ((n = read_devices(cli, devices)) < 0)
		return -n;
	c.src = cli->args[0];
	c.dst = cli->args[1];
	c.count = cli->has_count ? cli->count : 0;
	if ((rc = begin_job(cli, &req, &c, devices, n)) != 0)
		return rc;
	return finish_collective(cli, &req);
}

/* An option of a group entry and its value; 0, or CLI_USAGE. */
static int group_option(struct cli *cli, const char *entry, const char *opt, const char *val,
			struct gpuq_collective *c)
{
	uint64_t v;

	if (!val)
		return cli_usage(cli, "'%s': %s needs a value", entry, opt);
	if (strcmp(opt, "--out") == 0) {
		c->out = val;
	} else if (strcmp(opt, "--op") == 0) {
		c->reduce = val;
	} else if (strcmp(opt, "--root") == 0) {
		if (cli_parse_uint(val, &v) < 0 || v > INT_MAX)
			return cli_usage(cli, "'%s': --root '%s' is not a rank", entry, val);
		c->root = (int)v;
	} else if (strcmp(opt, "--count") == 0) {
		if (gpuq_parse_size(val, &v) < 0 || v == 0)
			return cli_usage(cli, "'%s': --count '%s' is not a count of 1 or more",
					 entry, val);
		c->count = v;
	} else {
		return cli_usage(cli, "'%s': '%s' is not an option of a group entry (--out, --op, "
				      "--root, --count)", entry, opt);
	}
	return 0;
}

/*
 * One group entry, "OP NAME [--out NAME2] [--op R] [--root N] [--count N]"
 * or "sendrecv SRC DST [--count N]", split at blanks into words (kept in
 * words, which the entry's strings point into). 0, or CLI_USAGE.
 */
static int parse_group_entry(struct cli *cli, const char *entry, char *words,
			     struct gpuq_collective *c)
{
	char *tok[GROUP_TOKENS], *save;
	int n = 0, pos = 0, rc = 0;

	for (char *t = strtok_r(words, " \t", &save); t && n < GROUP_TOKENS;
	     t = strtok_r(NULL, " \t", &save))
		tok[n++] = t;
	if (n == 0 || !(c->op = cli_collective_op(tok[0])))
		return cli_usage(cli, "'%s' does not start with a collective (allreduce, "
				      "reduce-scatter, all-gather, broadcast, reduce, sendrecv, "
				      "all-to-all)", entry);
	bool p2p = strcmp(c->op, "sendrecv") == 0;
	const char **names[2] = { p2p ? &c->src : &c->buffer, p2p ? &c->dst : NULL };
	for (int i = 1; i < n && rc == 0; i++) {
		if (strncmp(tok[i], "--", 2) == 0) {
			rc = group_option(cli, entry, tok[i], i + 1 < n ? tok[i + 1] : NULL, c);
			i++; /* its value */
		} else if (pos < 2 && names[pos]) {
			*names[pos++] = tok[i];
		} else {
			rc = cli_usage(cli, "'%s': unexpected word '%s'", entry, tok[i]);
		}
	}
	if (rc == 0 && pos < (p2p ? 2 : 1))
		rc = cli_usage(cli, "'%s' names no %s", entry, p2p ? "SRC and DST" : "buffer");
	return rc;
}

int cmd_group(struct cli *cli)
{
	static struct gpuq_collective c[GROUP_MAX];
	static char words[GROUP_MAX][512];
	int devices[256], n, rc;
	struct mp_map req;

	if (!cli->devices)
		return cli_usage(cli, "a group needs --devices (the ranks every entry runs on)");
	if ((n = read_devices(cli, devices)) < 0)
		return -n;
	if (cli->nargs > GROUP_MAX)
		return cli_usage(cli, "%d entries; a group holds at most %d", cli->nargs, GROUP_MAX);
	for (int i = 0; i < cli->nargs; i++) {
		c[i] = (struct gpuq_collective){ .root = -1 };
		snprintf(words[i], sizeof(words[i]), "%s", cli->args[i]);
		if ((rc = parse_group_entry(cli, cli->args[i], words[i], &c[i])) != 0)
			return rc;
	}
	struct gpuq_collective none = { .op = "group", .root = -1 };
	if ((rc = begin_job(cli, &req, &none, devices, n)) != 0)
		return rc;
	gpuq_group_put(&req, c, cli->nargs);
	return finish_collective(cli, &req);
}
