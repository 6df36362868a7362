/*
 * gpuq allreduce: one `allreduce` request naming the buffer, the devices in
 * rank order and the op; and the --devices syntax, which bench allreduce
 * shares. Whether the buffers exist and agree is the daemon's to say.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli.h"

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

/* "allreduce g over devices 0,1: sum of 1000 x f32 (3.9 KiB) in place, 41 µs, ..." */
static void render_allreduce(FILE *f, const msgpack_object *rec)
{
	const msgpack_object *res = msg_map_get(rec, "result");
	char name[80], out[80], op[16], dtype[16], devs[256], size[32], secs[32], comm[16];

	if (!res || res->type != MSGPACK_OBJECT_MAP) {
		render_job_summary(f, rec);
		return;
	}
	field_str(res, "buffer", name, sizeof(name), "-");
	field_str(res, "out", out, sizeof(out), "-");
	fprintf(f, "allreduce %s over devices %s: %s of %" PRIu64 " x %s (%s each) ", name,
		devices_text(msg_map_get(res, "devices"), devs, sizeof(devs)),
		field_str(res, "reduce", op, sizeof(op), "?"), field_u64(res, "count", 0),
		field_str(res, "dtype", dtype, sizeof(dtype), "?"),
		human_bytes(size, sizeof(size), field_u64(res, "bytes", 0), 1));
	if (field_bool(res, "in_place", true))
		fprintf(f, "in place");
	else
		fprintf(f, "into %s", out);
	fprintf(f, ": %s, %.2f GB/s algbw, %.2f GB/s busbw, communicator %s\n",
		human_seconds(secs, sizeof(secs), field_f64(res, "seconds", -1)),
		field_f64(res, "algbw_gbps", 0), field_f64(res, "busbw_gbps", 0),
		field_str(res, "communicator", comm, sizeof(comm), "?"));
}

int cmd_allreduce(struct cli *cli)
{
	int devices[256], n = 0, rc;
	struct gpuq_reply *r;
	struct mp_array arr;
	struct mp_map req;
	const msgpack_object *rec;

	if (cli->devices && (n = cli_parse_devices(cli, cli->devices, devices, 256)) < 0)
		return -n;
	if ((rc = cli_job_begin(cli, &req, "allreduce")) != 0)
		return rc;
	mp_put_str(&req, "buffer", cli->args[0]);
	if (n > 0) {
		mp_array_init(&arr);
		for (int i = 0; i < n; i++)
			mp_array_u64(&arr, (uint64_t)devices[i]);
		mp_put_array(&req, "devices", &arr);
	}
	if (cli->redop)
		mp_put_str(&req, "reduce", cli->redop);
	if (cli->out_buffer)
		mp_put_str(&req, "out", cli->out_buffer);
	if (cli->has_count)
		mp_put_u64(&req, "count", cli->count);
	if (cli->has_coll_timeout)
		mp_put_u64(&req, "collective_timeout_ms", cli->coll_timeout_ms);
	if ((rc = cli_call(cli, &req, NULL, 0, &r)) != 0)
		return rc;
	rec = gpuq_reply_get(r, "job");
	if (!cli->json && !cli->detach && gpuq_reply_ok(r) && rec &&
	    rec->type == MSGPACK_OBJECT_MAP) {
		render_allreduce(cli->out, rec);
		gpuq_reply_free(r);
		return CLI_OK;
	}
	return cli_finish_job(cli, r);
}
