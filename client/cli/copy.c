/*
 * gpuq copy SRC DST: a device-to-device copy job (the daemon's `copy` op),
 * within one GPU or between two, and the one line that says what it did.
 * Only syntax is handled here: the daemon checks the buffers, the ranges
 * and the options, picks the path and reports it.
 */
#include <inttypes.h>
#include <string.h>

#include "client/cli/cli.h"

int cmd_copy(struct cli *cli)
{
	struct progress_bar bar;
	struct gpuq_reply *r;
	struct mp_map req;
	char label[160];
	int rc = cli_job_begin(cli, &req, "copy");

	if (rc)
		return rc;
	mp_put_str(&req, "src", cli->args[0]);
	mp_put_str(&req, "dst", cli->args[1]);
	if (cli->engine)
		mp_put_str(&req, "engine", cli->engine);
	if (cli->verify)
		mp_put_bool(&req, "verify", true);
	if (cli->path)
		mp_put_str(&req, "path", cli->path);
	snprintf(label, sizeof(label), "copy %s", cli->args[0]);
	if (!cli->detach)
		progress_begin(cli, &req, &bar, label);
	rc = cli_call(cli, &req, NULL, 0, &r);
	if (!cli->detach)
		progress_end(cli, &bar);
	return rc ? rc : cli_finish_job(cli, r);
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
