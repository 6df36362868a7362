/*
 * Zero-copy sharing on the command line: host regions (region create/free,
 * regions), attaching a shareable buffer (attach, which holds its lease
 * until interrupted), and the leases (leases, lease break). put and get
 * through a region are jobs.c's (FILE region:NAME[START:STOP]).
 */
#include <inttypes.h>
#include <string.h>

#include "client/cli/cli.h"

/* Prints why a libgpuq call failed; the exit status that goes with it. */
static int share_failed(const struct gpuq_error *err)
{
	cli_print_error(err);
	return err->code == GPUQ_E_IO ? CLI_UNREACHABLE : CLI_REFUSED;
}

static int connect_cli(struct cli *cli)
{
	struct gpuq_error err;
	if (!cli->client && gpuq_connect(cli->socket, &cli->client, &err) < 0) {
		cli_print_error(&err);
		return CLI_UNREACHABLE;
	}
	return 0;
}

static int region_create(struct cli *cli, const char *name)
{
	struct gpuq_region r;
	struct gpuq_error err;
	char size[32];
	int rc = connect_cli(cli);
	if (rc)
		return rc;
	if (!cli->has_bytes)
		return cli_usage(cli, "region create needs --bytes SIZE");
	if (gpuq_region_create(cli->client, name, cli->bytes, cli->has_device ? (int)cli->device : 0,
			       cli->ephemeral, &r, &err) < 0)
		return share_failed(&err);
	fprintf(cli->out, "region %s: %s pinned%s\n", name,
		human_bytes(size, sizeof size, r.bytes, 2),
		cli->ephemeral ? "; held until interrupted (ephemeral)" : "");
	fflush(cli->out);
	rc = cli->ephemeral ? cli_hold_connection(cli, "the region") : CLI_OK;
	gpuq_region_unmap(&r);
	return rc;
}

static void render_region_freed(FILE *f, const msgpack_object *reply)
{
	const msgpack_object *job = msg_map_get(reply, "job");
	const msgpack_object *result = job ? msg_map_get(job, "result") : NULL;
	char name[96];
	fprintf(f, "region %s freed\n",
		result ? field_str(result, "name", name, sizeof name, "?") : "?");
}

/* The request itself, not libgpuq's call: root frees another user's region (--owner). */
static int region_free(struct cli *cli, const char *name)
{
	struct mp_map req;
	int rc = cli_job_begin(cli, &req, "region_free");
	if (rc)
		return rc;
	mp_put_str(&req, "name", name);
	return cli_call_and_render(cli, &req, render_region_freed);
}

int cmd_region(struct cli *cli)
{
	if (cli->nargs != 2)
		return cli_usage(cli, "give create NAME or free NAME");
	if (strcmp(cli->args[0], "create") == 0) {
		if (cli->has_owner)
			return cli_usage(cli, "--owner goes with region free: a region is made "
					      "by the process that maps it");
		return region_create(cli, cli->args[1]);
	}
	if (strcmp(cli->args[0], "free") == 0)
		return region_free(cli, cli->args[1]);
	return cli_usage(cli, "unknown region command '%s' (create, free)", cli->args[0]);
}


static void render_regions(FILE *f, const msgpack_object *reply)
{
	static const struct table_col cols[] = {
		{ "NAME", false }, { "GPU", true }, { "SIZE", true },  { "STATE", false },
		{ "NODE", true },  { "JOBS", true }, { "PINNED IN", true }, { "OWNER", true },
	};
	const msgpack_object *list = field_array(reply, "regions");
	char s[64];
	struct table t;
	if (!list || list->via.array.size == 0) {
		fprintf(f, "no regions\n");
		return;
	}
	table_init(&t, cols, (int)(sizeof cols / sizeof cols[0]));
	for (uint32_t i = 0; i < list->via.array.size; i++) {
		const msgpack_object *r = &list->via.array.ptr[i];
		bool eph = field_bool(r, "ephemeral", false);
		table_cell(&t, "%s%s", field_str(r, "name", s, sizeof s, "-"), eph ? " (ephemeral)" : "");
		table_cell(&t, "%" PRIu64, field_u64(r, "device", 0));
		table_cell(&t, "%s", human_bytes(s, sizeof s, field_u64(r, "bytes", 0), 1));
		table_cell(&t, "%s", field_str(r, "state", s, sizeof s, "-"));
		int64_t node = (int64_t)field_f64(r, "numa_node", -1);
		table_cell(&t, "%s", node < 0 ? "-" : (snprintf(s, sizeof s, "%" PRId64, node), s));
		table_cell(&t, "%" PRIu64, field_u64(r, "jobs", 0));
		table_cell(&t, "%s", human_seconds(s, sizeof s, field_f64(r, "pin_s", -1)));
		table_cell(&t, "%" PRIu64, field_u64(r, "owner", 0));
	}
	table_print(&t, f);
	table_free(&t);
	fprintf(f, "%s pinned for regions", human_bytes(s, sizeof s, field_u64(reply, "pinned_bytes", 0), 1));
	if (msg_map_get(reply, "memlock_limit"))
		fprintf(f, " of gpuqd's RLIMIT_MEMLOCK %s",
			human_bytes(s, sizeof s, field_u64(reply, "memlock_limit", 0), 1));
	fputc('\n', f);
}

int cmd_regions(struct cli *cli)
{
	return cli_call_op_and_render(cli, "regions", render_regions);
}

static void render_leases(FILE *f, const msgpack_object *reply)
{
	static const struct table_col cols[] = {
		{ "LEASE", true }, { "BUFFER", false }, { "MODE", false }, { "STATE", false },
		{ "UID", true },   { "PID", true },     { "HELD", true },
	};
	const msgpack_object *list = field_array(reply, "leases");
	char s[96];
	struct table t;
	if (!list || list->via.array.size == 0) {
		fprintf(f, "no leases\n");
		return;
	}
	table_init(&t, cols, (int)(sizeof cols / sizeof cols[0]));
	for (uint32_t i = 0; i < list->via.array.size; i++) {
		const msgpack_object *l = &list->via.array.ptr[i];
		table_cell(&t, "%" PRIu64, field_u64(l, "lease", 0));
		table_cell(&t, "%s", field_str(l, "buffer", s, sizeof s, "-"));
		table_cell(&t, "%s", field_str(l, "mode", s, sizeof s, "-"));
		/* A revocable lease ends by itself once a job waits for it: worth telling apart. */
		table_cell(&t, "%s%s", field_str(l, "state", s, sizeof s, "-"),
			   field_bool(l, "revocable", false) ? " (revocable)" : "");
		table_cell(&t, "%" PRIu64, field_u64(l, "uid", 0));
		table_cell(&t, "%" PRIu64, field_u64(l, "pid", 0));
		table_cell(&t, "%s", human_seconds(s, sizeof s, field_f64(l, "held_s", -1)));
	}
	table_print(&t, f);
	table_free(&t);
}

int cmd_leases(struct cli *cli)
{
	return cli_call_op_and_render(cli, "leases", render_leases);
}

static void render_broken(FILE *f, const msgpack_object *reply)
{
	fprintf(f, "lease %" PRIu64 " broken; its holder is told\n", field_u64(reply, "lease", 0));
}

int cmd_lease(struct cli *cli)
{
	struct mp_map req;
	uint64_t id;
	if (cli->nargs != 2 || strcmp(cli->args[0], "break") != 0)
		return cli_usage(cli, "give break LEASE");
	if (cli_parse_uint(cli->args[1], &id) < 0)
		return cli_usage(cli, "LEASE is a number (gpuq leases lists them), not '%s'", cli->args[1]);
	int rc = cli_begin(cli, &req, "lease_break");
	if (rc)
		return rc;
	mp_put_u64(&req, "lease", id);
	return cli_call_and_render(cli, &req, render_broken);
}

static void on_lease_event(const msgpack_object *event, void *arg)
{
	char kind[32], why[256];
	bool *broken = arg;
	field_str(event, "event", kind, sizeof kind, "?");
	if (strcmp(kind, "lease_broken") != 0)
		return;
	fprintf(stderr, "gpuq attach: lease %" PRIu64 " broken: %s\n", field_u64(event, "lease", 0),
		field_str(event, "reason", why, sizeof why, "?"));
	*broken = true;
	cli_hold_stop();
}

/* Attaches BUF and holds the lease until interrupted (for shells and tests). */
int cmd_attach(struct cli *cli)
{
	struct gpuq_attachment a;
	struct gpuq_error err;
	char size[32];
	int rc = connect_cli(cli);
	if (rc)
		return rc;
	bool broken = false; /* by lease_break or a device reset: a script tells it from its own stop */
	gpuq_set_event_handler(cli->client, on_lease_event, &broken);
	/* libgpuq tells gpuqd, which gives the attach up then */
	gpuq_set_timeout(cli->client, cli->has_timeout && cli->timeout_ms > 0
					      ? (unsigned)cli->timeout_ms : 0);
	if ((cli->has_owner ? gpuq_buffer_attach_as(cli->client, cli->args[0], cli->owner,
						    !cli->read_only, &a, &err)
			    : gpuq_buffer_attach(cli->client, cli->args[0], !cli->read_only, &a, &err)) < 0)
		return share_failed(&err);
	fprintf(cli->out, "lease %" PRIu64 ": %s (%s) %s at %p (%s), mapped in %.3f ms; "
		"held until interrupted\n", a.lease, cli->args[0],
		human_bytes(size, sizeof size, a.bytes, 2), a.read_write ? "read-write" : "read-only",
		a.ptr, a.host ? "host memory: the host backend" : "a device pointer", a.import_s * 1e3);
	fflush(cli->out);
	if (cli_hold_connection(cli, "the lease") != CLI_OK)
		return CLI_UNREACHABLE;
	if (gpuq_buffer_release(cli->client, &a, &err) < 0 && err.code != GPUQ_E_NOT_FOUND)
		return share_failed(&err);
	return broken ? CLI_REFUSED : CLI_OK;
}
