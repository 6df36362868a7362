/*
 * The commands about gpuqd as a service: metrics and shutdown. They send a
 * request with no arguments; the daemon decides who may.
 */
#include "client/cli.h"

static void render_metrics(FILE *f, const msgpack_object *reply)
{
	const msgpack_object *text = msg_map_get(reply, "text");

	if (text && text->type == MSGPACK_OBJECT_STR)
		fwrite(text->via.str.ptr, 1, text->via.str.size, f);
}

static void render_shutdown(FILE *f, const msgpack_object *reply)
{
	uint64_t active = field_u64(reply, "jobs_active", 0);
	uint64_t ms = field_u64(reply, "shutdown_timeout_ms", 0);

	if (active)
		fprintf(f, "gpuqd is stopping; its %llu unfinished jobs have %llu ms to end\n",
			(unsigned long long)active, (unsigned long long)ms);
	else
		fprintf(f, "gpuqd is stopping\n");
}

/* A request with nothing but its op, rendered by render (or as JSON). */
static int service_request(struct cli *cli, const char *op,
			   void (*render)(FILE *f, const msgpack_object *reply))
{
	struct gpuq_reply *r;
	struct mp_map req;
	int rc = cli_begin(cli, &req, op);

	if (rc || (rc = cli_call(cli, &req, NULL, 0, &r)) != 0)
		return rc;
	if (cli->json)
		render_json(stdout, r->root);
	if (!gpuq_reply_ok(r))
		rc = cli_report_refusal(r);
	else if (!cli->json)
		render(cli->out, r->root);
	gpuq_reply_free(r);
	return rc;
}

int cmd_metrics(struct cli *cli)
{
	return service_request(cli, "metrics", render_metrics);
}

int cmd_shutdown(struct cli *cli)
{
	return service_request(cli, "shutdown", render_shutdown);
}
