/*
 * The commands about gpuqd as a service: metrics, shutdown, admin restart
 * and reset-device. The daemon decides who may.
 */
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

/* Device index's reset count and health, from `devices`; -1 when the reply cannot be had. */
static int device_state(struct cli *cli, uint64_t index, uint64_t *resets, bool *healthy,
			char *health, size_t size)
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
		*resets = field_u64(dev, "resets", 0);
		*healthy = field_bool(dev, "healthy", false);
		field_str(dev, "health", health, size, "?");
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
	uint64_t index, before = 0, resets = 0;
	bool healthy = false;
	char health[640];
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
	while (device_state(cli, index, &resets, &healthy, health, sizeof health) == 0 &&
	       resets == before && seconds_now() - start < limit)
		usleep(20000);
	if (resets == before) {
		fprintf(stderr, "gpuq reset-device: gpu %llu was not reset within %.0f s (it waits for "
				"its jobs in flight to end); `gpuq devices` shows when it is\n",
			(unsigned long long)index, limit);
		return CLI_REFUSED;
	}
	fprintf(cli->out, "gpu %llu reset in %.3f s: %s\n", (unsigned long long)index,
		seconds_now() - start, health);
	return healthy ? CLI_OK : CLI_REFUSED;
}

/* The restarts ping counts and gpuqd's pid: -1 when no reply can be had. */
static int ping_restarts(struct cli *cli, uint64_t *restarts, uint64_t *pid)
{
	struct gpuq_reply *r;
	struct mp_map req;
	int rc = cli_begin(cli, &req, "ping");
	if (rc || (rc = cli_call(cli, &req, NULL, 0, &r)) != 0)
		return -1;
	rc = gpuq_reply_ok(r) ? 0 : -1;
	*restarts = field_u64(r->root, "restarts", 0);
	*pid = field_u64(r->root, "pid", 0);
	gpuq_reply_free(r);
	return rc;
}

/* admin restart [--binary PATH]: asks, then pings on the same connection until gpuqd counts it. */
static int admin_restart(struct cli *cli)
{
	struct mp_map req;
	uint64_t before, restarts = 0, pid = 0;
	int rc = cli_begin(cli, &req, "restart");
	if (rc)
		return rc;
	if (cli->binary)
		mp_put_str(&req, "binary", cli->binary);
	double start = seconds_now(), limit = cli->has_timeout ? cli->timeout_ms / 1e3 : 60;
	if ((rc = call_counting(cli, &req, "restarts", &before)) != 0)
		return rc;
	while (ping_restarts(cli, &restarts, &pid) == 0 && restarts == before &&
	       seconds_now() - start < limit)
		usleep(20000);
	if (restarts == before) {
		fprintf(stderr, "gpuq admin restart: gpuqd did not serve again within %.0f s; its log "
				"says why\n", limit);
		return CLI_REFUSED;
	}
	fprintf(cli->out, "gpuqd restarted (restart %llu, pid %llu): serving again after %.3f s\n",
		(unsigned long long)restarts, (unsigned long long)pid, seconds_now() - start);
	return CLI_OK;
}

int cmd_admin(struct cli *cli)
{
	if (strcmp(cli->args[0], "restart") == 0)
		return admin_restart(cli);
	return cli_usage(cli, "gpuq admin takes one action, restart, not '%s'", cli->args[0]);
}
