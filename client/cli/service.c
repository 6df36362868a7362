/*
 * The commands about gpuqd as a service: metrics, shutdown, admin restart,
 * admin drop-absent and reset-device. The daemon decides who may.
 */
#include <inttypes.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/cli/cli.h"

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

int cmd_metrics(struct cli *cli)
{
	return cli_call_op_and_render(cli, "metrics", render_metrics);
}

int cmd_shutdown(struct cli *cli)
{
	return cli_call_op_and_render(cli, "shutdown", render_shutdown);
}

/* What `devices` says of one device's resets. */
struct reset_seen {
	uint64_t resets;
	bool healthy;
	char health[640];
	uint64_t regions, unpinned; /* host regions the last reset pinned again, and not */
};

/* Device index's resets and health, from `devices`; -1 when the reply cannot be had. */
static int device_state(struct cli *cli, uint64_t index, struct reset_seen *seen)
{
	struct gpuq_reply *r;
	struct mp_map req;
	int rc = cli_begin(cli, &req, "devices");
	if (rc || (rc = cli_call(cli, &req, NULL, 0, &r)) != 0)
		return -1;
	const msgpack_object *list = field_array(r->root, "devices");
	rc = -1;
	if (list && index < list->via.array.size) {
		const msgpack_object *dev = &list->via.array.ptr[index];
		seen->resets = field_u64(dev, "resets", 0);
		seen->healthy = field_bool(dev, "healthy", false);
		field_str(dev, "health", seen->health, sizeof seen->health, "?");
		seen->regions = field_u64(dev, "last_reset_regions", 0);
		seen->unpinned = field_u64(dev, "last_reset_unpinned", 0);
		rc = 0;
	}
	gpuq_reply_free(r);
	return rc;
}

static double seconds_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/*
 * Sends req and reads the counter `key` of its reply (the one the request
 * moves: resets, restarts) into *before. 0, or the exit status of a refusal
 * (printed) or a lost connection.
 */
static int call_counting(struct cli *cli, struct mp_map *req, const char *key, uint64_t *before)
{
	struct gpuq_reply *r;
	int rc = cli_call(cli, req, NULL, 0, &r);
	if (rc)
		return rc;
	if (!gpuq_reply_ok(r))
		rc = cli_report_refusal(r);
	*before = field_u64(r->root, key, 0);
	gpuq_reply_free(r);
	return rc;
}

/*
 * Asks for the reset, then watches `devices` until the device's reset count
 * moves (--timeout, default 60 s): the reset waits for the device's jobs in
 * flight, which gpuqd cancels.
 */
int cmd_reset_device(struct cli *cli)
{
	uint64_t index, before = 0;
	struct reset_seen seen = { .resets = 0 };
	struct mp_map req;
	if (cli_parse_uint(cli->args[0], &index) < 0)
		return cli_usage(cli, "GPU '%s' is not a device index; `gpuq devices` lists them",
				 cli->args[0]);
	int rc = cli_begin(cli, &req, "reset_device");
	if (rc)
		return rc;
	mp_put_u64(&req, "device", index);
	if ((rc = call_counting(cli, &req, "resets", &before)) != 0)
		return rc;
	double start = seconds_now(), limit = cli->has_timeout ? cli->timeout_ms / 1e3 : 60;
	while (device_state(cli, index, &seen) == 0 && seen.resets == before &&
	       seconds_now() - start < limit)
		usleep(20000);
	if (seen.resets == before) {
		fprintf(stderr, "gpuq reset-device: gpu %llu was not reset within %.0f s (it waits for "
				"its jobs in flight to end); `gpuq devices` shows when it is\n",
			(unsigned long long)index, limit);
		return CLI_REFUSED;
	}
	fprintf(cli->out, "gpu %llu reset in %.3f s: %s", (unsigned long long)index,
		seconds_now() - start, seen.health);
	if (seen.regions)
		fprintf(cli->out, "; %llu host region%s pinned again", (unsigned long long)seen.regions,
			seen.regions == 1 ? "" : "s");
	if (seen.unpinned)
		fprintf(cli->out, "; %llu host region%s could not be pinned again (gpuqd's log says "
				  "why): copies through %s go at pageable speed until freed and made again",
			(unsigned long long)seen.unpinned, seen.unpinned == 1 ? "" : "s",
			seen.unpinned == 1 ? "it" : "them");
	fputc('\n', cli->out);
	return seen.healthy ? CLI_OK : CLI_REFUSED;
}

/* What one ping of admin restart's wait saw of gpuqd. */
struct restart_seen {
	bool answered;     /* a gpuqd answered the ping */
	uint64_t pid;      /* its pid and restart count, when it answered */
	uint64_t restarts;
};

/*
 * Pings gpuqd, connecting again for up to window_ms if the connection went
 * (a new image that died, a gpuqd started again in its place). Quiet: the
 * wait says what it saw once it ends.
 */
static void restart_ping(struct cli *cli, unsigned window_ms, struct restart_seen *seen)
{
	struct gpuq_reply *r = NULL;
	struct gpuq_error err;
	struct mp_map req;

	gpuq_set_reconnect(cli->client, window_ms ? window_ms : 1);
	gpuq_set_timeout(cli->client, window_ms ? window_ms : 1);
	gpuq_request_begin(cli->client, &req, "ping");
	seen->answered = gpuq_call(cli->client, &req, NULL, 0, &r, &err) == 0 && gpuq_reply_ok(r);
	if (seen->answered) {
		seen->restarts = field_u64(r->root, "restarts", 0);
		seen->pid = field_u64(r->root, "pid", 0);
	}
	gpuq_reply_free(r);
}

/*
 * Asks for the restart: gpuqd's pid and restart count before it in *before.
 * 0, or the exit status of a refusal (printed) or a lost connection.
 */
static int restart_request(struct cli *cli, struct restart_seen *before)
{
	struct mp_map req;
	int rc = cli_begin(cli, &req, "ping");
	if (rc)
		return rc;
	struct gpuq_reply *r;
	if ((rc = cli_call(cli, &req, NULL, 0, &r)) != 0)
		return rc;
	before->pid = field_u64(r->root, "pid", 0);
	gpuq_reply_free(r);
	if ((rc = cli_begin(cli, &req, "restart")) != 0)
		return rc;
	if (cli->binary)
		mp_put_str(&req, "binary", cli->binary);
	return call_counting(cli, &req, "restarts", &before->restarts);
}

/*
 * Why the wait for the restart failed, from what the last ping saw; returns
 * the exit status. A new image that never served leaves no gpuqd (3); one
 * that was replaced leaves another process (1); one still draining has not
 * counted the restart yet (1).
 */
static int restart_failed(const struct cli *cli, const struct restart_seen *before,
			  const struct restart_seen *seen, double limit)
{
	fprintf(stderr, "gpuq admin restart: gpuqd (pid %llu, restart %llu before this one): ",
		(unsigned long long)before->pid, (unsigned long long)before->restarts);
	if (!seen->answered) {
		fprintf(stderr, "no gpuqd answered at %s within %.0f s (--timeout); the new image did "
				"not serve, and its buffers went with it unless a descriptor store "
				"keeps them; gpuqd's log says why\n", cli->socket ? cli->socket :
				gpuq_default_socket(), limit);
		return CLI_UNREACHABLE;
	}
	if (seen->pid != before->pid) {
		fprintf(stderr, "a new gpuqd (pid %llu, not %llu; restart count %llu) answers instead: "
				"the re-exec did not serve and gpuqd was started again, keeping only "
				"what a descriptor store held; the old image's log says why\n",
			(unsigned long long)seen->pid, (unsigned long long)before->pid,
			(unsigned long long)seen->restarts);
		return CLI_REFUSED;
	}
	fprintf(stderr, "it still counts %llu restarts after %.0f s (--timeout): it has not "
			"re-executed yet (its --restart-drain, or a job that does not stop); `gpuq "
			"ping` shows when it has\n", (unsigned long long)seen->restarts, limit);
	return CLI_REFUSED;
}

/*
 * admin restart [--binary PATH]: asks, then pings until the same gpuqd (a
 * re-exec keeps its pid) counts one more restart, for up to --timeout
 * (default 60 s). A gpuqd of another pid will never be that one: it ends
 * the wait at once.
 */
static int admin_restart(struct cli *cli)
{
	struct restart_seen before = { .answered = true }, seen = { 0 };
	double limit = cli->has_timeout && cli->timeout_ms > 0 ? cli->timeout_ms / 1e3 : 60;
	double start = seconds_now();
	int rc = restart_request(cli, &before);
	if (rc)
		return rc;
	for (;;) {
		double left = limit - (seconds_now() - start);
		restart_ping(cli, left > 0 ? (unsigned)(left * 1e3) : 0, &seen);
		if (seen.answered && seen.pid == before.pid && seen.restarts > before.restarts)
			break;
		if ((seen.answered && seen.pid != before.pid) || seconds_now() - start >= limit)
			return restart_failed(cli, &before, &seen, limit);
		usleep(20000);
	}
	fprintf(cli->out, "gpuqd restarted (restart %llu, pid %llu): serving again after %.3f s\n",
		(unsigned long long)seen.restarts, (unsigned long long)seen.pid,
		seconds_now() - start);
	return CLI_OK;
}

static void render_dropped(FILE *f, const msgpack_object *reply)
{
	char uuid[80], size[32];
	uint64_t n = field_u64(reply, "buffers", 0);
	fprintf(f, "dropped %" PRIu64 " buffer%s (%s) kept for GPU %s: their memory there is freed\n",
		n, n == 1 ? "" : "s", human_bytes(size, sizeof(size), field_u64(reply, "bytes", 0), 1),
		field_str(reply, "uuid", uuid, sizeof(uuid), "?"));
}

/* admin drop-absent UUID: the buffers kept for a GPU gpuqd does not serve go. */
static int admin_drop_absent(struct cli *cli)
{
	struct mp_map req;
	if (cli->nargs != 2)
		return cli_usage(cli, "gpuq admin drop-absent takes the GPU's uuid (`gpuq devices` "
				 "names those whose buffers are kept)");
	int rc = cli_begin(cli, &req, "drop_absent");
	if (rc)
		return rc;
	mp_put_str(&req, "uuid", cli->args[1]);
	return cli_call_and_render(cli, &req, render_dropped);
}

int cmd_admin(struct cli *cli)
{
	if (strcmp(cli->args[0], "restart") == 0 && cli->nargs == 1)
		return admin_restart(cli);
	if (strcmp(cli->args[0], "drop-absent") == 0)
		return admin_drop_absent(cli);
	return cli_usage(cli, "gpuq admin takes an action: restart, or drop-absent UUID; not '%s'",
			 cli->args[0]);
}
