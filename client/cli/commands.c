/*
 * The commands that are answered at once rather than run as jobs: ping,
 * devices, buffers, jobs, status, wait, cancel. Calling is call.c's.
 */
#include "client/cli/cli.h"

int cmd_ping(struct cli *cli)
{
	return cli_call_op_and_render(cli, "ping", render_ping);
}

int cmd_devices(struct cli *cli)
{
	return cli_call_op_and_render(cli, "devices", render_devices);
}

int cmd_jobs(struct cli *cli)
{
	struct jobs_filter flt = { .states = cli->job_states, .last = cli->has_last ? cli->last : 0 };
	struct gpuq_reply *r;
	struct mp_map req;
	int rc = cli_begin(cli, &req, "jobs");

	if (rc || (rc = cli_call(cli, &req, NULL, 0, &r)))
		return rc;
	if (!gpuq_reply_ok(r)) {
		if (cli->json)
			render_json(stdout, r->root);
		rc = cli_report_refusal(r);
	} else {
		render_jobs_selected(cli->json ? stdout : cli->out, r->root, &flt, cli->json);
	}
	gpuq_reply_free(r);
	return rc;
}

int cmd_buffers(struct cli *cli)
{
	struct mp_map req;
	int rc = cli_begin(cli, &req, "buffers");

	if (rc)
		return rc;
	if (cli->has_device)
		mp_put_u64(&req, "device", cli->device);
	return cli_call_and_render(cli, &req, render_buffers);
}

static void render_status(FILE *f, const msgpack_object *reply)
{
	const msgpack_object *rec = msg_map_get(reply, "job");

	if (rec && rec->type == MSGPACK_OBJECT_MAP)
		render_job_record(f, rec);
}

/* status and cancel: one JOB argument. */
static int job_request(struct cli *cli, const char *op,
		       void (*render)(FILE *f, const msgpack_object *reply))
{
	struct mp_map req;
	uint64_t job;
	int rc = cli_parse_job(cli, cli->args[0], &job);

	if (rc || (rc = cli_begin(cli, &req, op)))
		return rc;
	mp_put_u64(&req, "job", job);
	return cli_call_and_render(cli, &req, render);
}

int cmd_status(struct cli *cli)
{
	return job_request(cli, "status", render_status);
}

int cmd_cancel(struct cli *cli)
{
	return job_request(cli, "cancel", render_cancel);
}

int cmd_wait(struct cli *cli)
{
	struct gpuq_reply *r;
	struct mp_map req;
	uint64_t job;
	int rc = cli_parse_job(cli, cli->args[0], &job);

	if (rc || (rc = cli_begin(cli, &req, "wait")))
		return rc;
	mp_put_u64(&req, "job", job);
	cli_put_timeout(cli, &req);
	if ((rc = progress_call(cli, &req, NULL, 0, &r)) != 0)
		return rc;
	return cli_finish_job(cli, r);
}
