/*
 * What every job command shares: a job request asks the daemon, unless
 * --detach, to reply when the job has finished (wait, and --timeout as the
 * daemon's timeout_ms), and that reply is rendered as the job's one-line
 * summary, its id (--detach), JSON, or the refusal. Above call.c and
 * render.c; jobs.c, copy.c, chain.c and the other job commands call it.
 */
#include <inttypes.h>

#include "client/cli/cli.h"

void cli_put_timeout(struct cli *cli, struct mp_map *req)
{
	if (cli->has_timeout) {
		mp_put_u64(req, "timeout_ms", cli->timeout_ms);
		cli->daemon_waits = true;
	}
}

int cli_job_begin(struct cli *cli, struct mp_map *req, const char *op)
{
	int rc = cli_begin(cli, req, op);

	if (rc == 0 && cli->priority)
		mp_put_str(req, "priority", cli->priority);
	if (rc == 0 && cli->has_owner) /* only the commands whose ops take `owner` accept --owner */
		mp_put_u64(req, "owner", cli->owner);
	if (rc || cli->detach)
		return rc;
	mp_put_bool(req, "wait", true);
	cli_put_timeout(cli, req);
	return 0;
}

int cli_finish_job(struct cli *cli, struct gpuq_reply *r)
{
	const msgpack_object *rec = gpuq_reply_get(r, "job");
	int rc = CLI_OK;

	if (rec && rec->type != MSGPACK_OBJECT_MAP)
		rec = NULL;
	if (cli->json)
		render_json(stdout, r->root);
	if (!gpuq_reply_ok(r))
		rc = cli_report_refusal(r);
	else if (!cli->json && rec && cli->detach)
		fprintf(cli->out, "%" PRIu64 "\n", field_u64(rec, "job", 0));
	else if (!cli->json && rec)
		render_job_summary(cli->out, rec);
	gpuq_reply_free(r);
	return rc;
}
