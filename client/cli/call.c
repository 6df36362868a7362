/*
 * Connecting and calling: every command's way to the daemon. A request is
 * begun (connecting first if need be), sent, and its reply rendered or its
 * refusal printed; cli_hold_connection keeps the connection open for what
 * goes with it. Below the command files, above render.c.
 *
 * The connection rides through a gpuqd restarted on the same socket
 * (libgpuq's gpuq_set_reconnect): a request that reads and changes nothing
 * goes again on a new connection, a job in flight fails saying it was not
 * sent again, and gpuq says on stderr, once per new connection, that gpuqd
 * restarted. A held connection never reconnects: what it holds went with it.
 */
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "client/cli/cli.h"

/* Extra time the client allows when the daemon itself enforces timeout_ms. */
#define DAEMON_TIMEOUT_GRACE_MS 5000
/* How long gpuq tries to connect again when gpuqd goes away, without --timeout. */
#define CLI_RECONNECT_MS 10000

void cli_print_error(const struct gpuq_error *err)
{
	fprintf(stderr, "gpuq: %s: %s\n", gpuq_errc_name(err->code), err->message);
}

int cli_connect(struct cli *cli)
{
	struct gpuq_error err;

	if (cli->client)
		return 0;
	if (gpuq_connect(cli->socket, &cli->client, &err) < 0) {
		cli_print_error(&err);
		return CLI_UNREACHABLE;
	}
	gpuq_set_reconnect(cli->client, cli->has_timeout && cli->timeout_ms > 0
						? (unsigned)cli->timeout_ms : CLI_RECONNECT_MS);
	return 0;
}

/*
 * Says once per new connection that gpuqd restarted, with the pid (and the
 * restart count of a gpuqd that re-executed itself) its ping gives.
 */
void cli_say_reconnected(struct cli *cli)
{
	struct gpuq_reply *r = NULL;
	struct gpuq_error err;
	struct mp_map req;

	if (!cli->client || gpuq_reconnects(cli->client) == cli->reconnects_said)
		return;
	if (isatty(STDERR_FILENO)) /* a progress bar may be on this line: the notice replaces it */
		fputs("\r\033[K", stderr);
	gpuq_request_begin(cli->client, &req, "ping");
	if (gpuq_call(cli->client, &req, NULL, 0, &r, &err) == 0 && gpuq_reply_ok(r)) {
		uint64_t restarts = field_u64(r->root, "restarts", 0);
		uint64_t pid = field_u64(r->root, "pid", 0);
		if (restarts)
			fprintf(stderr, "gpuq: gpuqd restarted (restart %llu, pid %llu); reconnected\n",
				(unsigned long long)restarts, (unsigned long long)pid);
		else
			fprintf(stderr, "gpuq: gpuqd restarted (pid %llu); reconnected\n",
				(unsigned long long)pid);
	} else {
		fprintf(stderr, "gpuq: gpuqd restarted; reconnected\n");
	}
	gpuq_reply_free(r);
	cli->reconnects_said = gpuq_reconnects(cli->client); /* the ping's own too */
}

int cli_begin(struct cli *cli, struct mp_map *req, const char *op)
{
	int rc = cli_connect(cli);

	if (rc == 0)
		gpuq_request_begin(cli->client, req, op);
	return rc;
}

int cli_call(struct cli *cli, struct mp_map *req, const int *fds, int nfds,
	     struct gpuq_reply **out)
{
	struct gpuq_error err;
	uint64_t ms = 0;

	if (cli->has_timeout && cli->timeout_ms > 0)
		ms = cli->timeout_ms + (cli->daemon_waits ? DAEMON_TIMEOUT_GRACE_MS : 0);
	gpuq_set_timeout(cli->client, (unsigned)ms);
	int rc = gpuq_call(cli->client, req, fds, nfds, out, &err);
	cli_say_reconnected(cli);
	if (rc < 0) {
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
	if (err.code == GPUQ_E_RESTARTED) /* only jobs fail so: say what gpuq did about it */
		fprintf(stderr, "gpuq: the job was not sent again (gpuq never resends a job by "
				"itself); it may be submitted again\n");
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
	gpuq_set_reconnect(cli->client, 0); /* a new connection would hold nothing */
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
