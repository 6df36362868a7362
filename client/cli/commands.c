/*
 * Connecting and calling, and the commands that are answered at once rather
 * than run as jobs: ping, devices, buffers, jobs, status, wait, cancel.
 */
#include <poll.h>
#include <signal.h>
#include <string.h>

#include "client/cli/cli.h"

/* Extra time the client allows when the daemon itself enforces timeout_ms. */
#define DAEMON_TIMEOUT_GRACE_MS 5000

void cli_print_error(const struct gpuq_error *err)
{
	fprintf(stderr, "gpuq: %s: %s\n", gpuq_errc_name(err->code), err->message);
}

int cli_begin(struct cli *cli, struct mp_map *req, const char *op)
{
	struct gpuq_error err;

	if (!cli->client && gpuq_connect(cli->socket, &cli->client, &err) < 0) {
		cli_print_error(&err);
		return CLI_UNREACHABLE;
	}
	gpuq_request_begin(cli->client, req, op);
	return 0;
}

int cli_call(struct cli *cli, struct mp_map *req, const int *fds, int nfds,
	     struct gpuq_reply **out)
{
	struct gpuq_error err;
	uint64_t ms = 0;

	if (cli->has_timeout && cli->timeout_ms > 0)
		ms = cli->timeout_ms + (cli->daemon_waits ? DAEMON_TIMEOUT_GRACE_MS : 0);
	gpuq_set_timeout(cli->client, (unsigned)ms);
	if (gpuq_call(cli->client, req, fds, nfds, out, &err) < 0) {
		cli_print_error(&err);
		return CLI_UNREACHABLE;
	}
	return 0;
}

int cli_report_refusal(const struct gpuq_reply *r)
{
	struct gpuq_error err;

	gpuq_reply_error(r, &err);
	cli_print_error(&err);
	return CLI_REFUSED;
}

/*
 * Sends a request that takes no arguments beyond those already in req, and
 * prints the reply with render (or as JSON). Consumes req.
 */
int cli_call_and_render(struct cli *cli, struct mp_map *req,
			void (*render)(FILE *f, const msgpack_object *reply))
{
	struct gpuq_reply *r;
	int rc = cli_call(cli, req, NULL, 0, &r);

	if (rc != 0)
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

int cli_call_op_and_render(struct cli *cli, const char *op,
			   void (*render)(FILE *f, const msgpack_object *reply))
{
	struct mp_map req;
	int rc = cli_begin(cli, &req, op);

	return rc ? rc : cli_call_and_render(cli, &req, render);
}

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
	if ((rc = cli_call(cli, &req, NULL, 0, &r)) != 0)
		return rc;
	return cli_finish_job(cli, r);
}

static volatile sig_atomic_t hold_interrupted;

static void hold_on_signal(int sig)
{
	(void)sig;
	hold_interrupted = 1;
}

void cli_hold_stop(void)
{
	hold_interrupted = 1;
}

int cli_hold_connection(struct cli *cli, const char *what)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = hold_on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	while (!hold_interrupted) {
		struct pollfd p = { .fd = gpuq_fd(cli->client), .events = POLLIN };
		struct gpuq_reply *r;
		struct mp_map req;
		struct gpuq_error err;
		if (poll(&p, 1, -1) <= 0)
			continue; /* a signal */
		gpuq_request_begin(cli->client, &req, "ping");
		if (gpuq_call(cli->client, &req, NULL, 0, &r, &err) < 0) {
			fprintf(stderr, "gpuq: %s; %s went with the connection\n", err.message, what);
			return CLI_UNREACHABLE;
		}
		gpuq_reply_free(r);
	}
	return CLI_OK;
}
