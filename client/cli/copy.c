/*
 * gpuq copy SRC DST: a device-to-device copy job (the daemon's `copy` op),
 * within one GPU or between two. Only syntax is handled here: the daemon
 * checks the buffers, the ranges and the options, picks the path and
 * reports it; render.c's render_copy_summary says what the job did.
 */
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
