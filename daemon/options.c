#include "daemon/options.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "protocol/protocol.h"

static const char usage_text[] =
	"usage: gpuqd [OPTIONS]\n"
	"\n"
	"The gpuq GPU job daemon: serves gpuq clients on a UNIX socket and runs\n"
	"their jobs on one worker thread per GPU.\n"
	"\n"
	"  --socket PATH           socket to serve (default /run/gpuq/gpuqd.sock as root,\n"
	"                          $XDG_RUNTIME_DIR/gpuq.sock otherwise)\n"
	"  --socket-group GROUP    group that may connect (the socket is mode 0660)\n"
	"  --backend cuda|host     cuda (default): the GPUs; host: memory arenas on the\n"
	"                          host, for tests and machines without a GPU\n"
	"  --devices LIST          backend devices to serve, e.g. 0,2-3 (default: all)\n"
	"  --host-devices N        devices the host backend makes (default 2)\n"
	"  --host-mem SIZE         memory of each host-backend device (default 1G)\n"
	"  --staging-slot SIZE     size of one staging slot (default 8M)\n"
	"  --staging-slots N       slots in each worker's staging ring (default 4)\n"
	"  --pool-release SIZE     CUDA pool release threshold (default 0)\n"
	"  --queue-depth N         jobs queued per device before `busy` (default 1024)\n"
	"  --spin US               how long a worker polls for work, and the main thread\n"
	"                          for a dispatched job's end, before sleeping\n"
	"                          (microseconds; default 50; 0: never)\n"
	"  --job-history N         finished jobs kept for status/wait (default 10000)\n"
	"  --shutdown-timeout MS   how long running jobs may finish at SIGTERM (default 10000)\n"
	"  --max-frame SIZE        largest request frame accepted (default 1M)\n"
	"  --log-level LEVEL       error, warn, info (default) or debug\n"
	"  --probe                 open the devices, print them, and exit\n"
	"                          (0: at least one healthy device, 69: none)\n"
	"  --help, --version\n";

enum option_id {
	OPT_SOCKET = 256, OPT_SOCKET_GROUP, OPT_BACKEND, OPT_DEVICES, OPT_HOST_DEVICES,
	OPT_HOST_MEM, OPT_STAGING_SLOT, OPT_STAGING_SLOTS, OPT_POOL_RELEASE, OPT_QUEUE_DEPTH,
	OPT_JOB_HISTORY, OPT_SPIN, OPT_SHUTDOWN_TIMEOUT, OPT_MAX_FRAME, OPT_LOG_LEVEL, OPT_PROBE,
	OPT_HELP, OPT_VERSION,
};

static const struct option long_options[] = {
	{ "socket", required_argument, NULL, OPT_SOCKET },
	{ "socket-group", required_argument, NULL, OPT_SOCKET_GROUP },
	{ "backend", required_argument, NULL, OPT_BACKEND },
	{ "devices", required_argument, NULL, OPT_DEVICES },
	{ "host-devices", required_argument, NULL, OPT_HOST_DEVICES },
	{ "host-mem", required_argument, NULL, OPT_HOST_MEM },
	{ "staging-slot", required_argument, NULL, OPT_STAGING_SLOT },
	{ "staging-slots", required_argument, NULL, OPT_STAGING_SLOTS },
	{ "pool-release", required_argument, NULL, OPT_POOL_RELEASE },
	{ "queue-depth", required_argument, NULL, OPT_QUEUE_DEPTH },
	{ "job-history", required_argument, NULL, OPT_JOB_HISTORY },
	{ "spin", required_argument, NULL, OPT_SPIN },
	{ "shutdown-timeout", required_argument, NULL, OPT_SHUTDOWN_TIMEOUT },
	{ "max-frame", required_argument, NULL, OPT_MAX_FRAME },
	{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
	{ "probe", no_argument, NULL, OPT_PROBE },
	{ "help", no_argument, NULL, OPT_HELP },
	{ "version", no_argument, NULL, OPT_VERSION },
	{ NULL, 0, NULL, 0 },
};

void options_defaults(struct options *o)
{
	memset(o, 0, sizeof *o);
	const char *runtime = getenv("XDG_RUNTIME_DIR");
	if (geteuid() != 0 && runtime && *runtime)
		snprintf(o->socket_path, sizeof o->socket_path, "%s/gpuq.sock", runtime);
	else
		snprintf(o->socket_path, sizeof o->socket_path, "/run/gpuq/gpuqd.sock");
	snprintf(o->backend, sizeof o->backend, "cuda");
	o->log_level = LOG_LEVEL_INFO;
	o->max_frame = GPUQ_DEFAULT_MAX_FRAME;
	o->queue_depth = 1024;
	o->job_history = 10000;
	o->spin_us = 50;
	o->shutdown_timeout_ms = 10000;
	o->device.staging_slot_bytes = 8u << 20;
	o->device.staging_slots = 4;
	o->device.pool_release_bytes = 0;
	o->device.host_arena_bytes = 1ull << 30;
	o->device.host_devices = 2;
}

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "gpuqd: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n(see gpuqd --help)\n");
	return -1;
}

static int parse_uint(const char *s, unsigned long lo, unsigned long hi, unsigned long *out)
{
	char *end;
	if (!*s || *s == '-')
		return -1;
	unsigned long v = strtoul(s, &end, 10);
	if (*end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* "0,2-3" -> {0,2,3}; rejects duplicates and descending ranges. */
static int parse_device_list(const char *s, struct options *o)
{
	char buf[256], *save = NULL;
	snprintf(buf, sizeof buf, "%s", s);
	o->device_count = 0;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		unsigned long lo, hi;
		char *dash = strchr(tok, '-');
		if (dash)
			*dash = '\0';
		if (parse_uint(tok, 0, GPUQ_MAX_DEVICES - 1, &lo) < 0 ||
		    parse_uint(dash ? dash + 1 : tok, lo, GPUQ_MAX_DEVICES - 1, &hi) < 0)
			return -1;
		for (unsigned long d = lo; d <= hi; d++) {
			for (int i = 0; i < o->device_count; i++)
				if (o->devices[i] == (int)d)
					return -1;
			if (o->device_count == GPUQ_MAX_DEVICES)
				return -1;
			o->devices[o->device_count++] = (int)d;
		}
	}
	return o->device_count > 0 ? 0 : -1;
}

static int parse_size_opt(const char *arg, uint64_t lo, uint64_t hi, uint64_t *out)
{
	return gpuq_parse_size(arg, out) == 0 && *out >= lo && *out <= hi ? 0 : -1;
}

static int set_number(int id, const char *arg, struct options *o)
{
	unsigned long n;
	uint64_t size;
	switch (id) {
	case OPT_HOST_DEVICES:
		if (parse_uint(arg, 1, GPUQ_MAX_DEVICES, &n) < 0)
			return usage_error("--host-devices takes 1 to 64, not '%s'", arg);
		o->device.host_devices = (int)n;
		return 0;
	case OPT_HOST_MEM:
		if (parse_size_opt(arg, 4096, UINT64_MAX / 2, &o->device.host_arena_bytes) < 0)
			return usage_error("--host-mem takes a size such as 512M or 4G, not '%s'", arg);
		return 0;
	case OPT_STAGING_SLOT:
		if (parse_size_opt(arg, 4096, 1ull << 30, &size) < 0)
			return usage_error("--staging-slot takes a size from 4K to 1G, not '%s'", arg);
		o->device.staging_slot_bytes = (size_t)size;
		return 0;
	case OPT_STAGING_SLOTS:
		if (parse_uint(arg, 2, GPUQ_MAX_STAGING_SLOTS, &n) < 0)
			return usage_error("--staging-slots takes 2 to 16, not '%s'", arg);
		o->device.staging_slots = (unsigned)n;
		return 0;
	case OPT_POOL_RELEASE:
		if (parse_size_opt(arg, 0, UINT64_MAX, &o->device.pool_release_bytes) < 0)
			return usage_error("--pool-release takes a size, not '%s'", arg);
		return 0;
	case OPT_QUEUE_DEPTH:
		if (parse_uint(arg, 1, 1u << 20, &n) < 0)
			return usage_error("--queue-depth takes 1 to 1048576, not '%s'", arg);
		o->queue_depth = (unsigned)n;
		return 0;
	case OPT_JOB_HISTORY:
		if (parse_uint(arg, 1, 1u << 24, &n) < 0)
			return usage_error("--job-history takes 1 to 16777216, not '%s'", arg);
		o->job_history = (unsigned)n;
		return 0;
	case OPT_SPIN:
		if (parse_uint(arg, 0, 100000, &n) < 0)
			return usage_error("--spin takes microseconds (0 to 100000), not '%s'", arg);
		o->spin_us = (unsigned)n;
		return 0;
	case OPT_SHUTDOWN_TIMEOUT:
		if (parse_uint(arg, 0, 3600000, &n) < 0)
			return usage_error("--shutdown-timeout takes milliseconds (0 to 3600000), not '%s'", arg);
		o->shutdown_timeout_ms = (unsigned)n;
		return 0;
	case OPT_MAX_FRAME:
		if (parse_size_opt(arg, GPUQ_MIN_MAX_FRAME, 1u << 30, &size) < 0)
			return usage_error("--max-frame takes a size from 4K to 1G, not '%s'", arg);
		o->max_frame = (size_t)size;
		return 0;
	}
	return usage_error("internal: option %s has no parser", arg);
}

static int set_option(int id, const char *arg, struct options *o)
{
	switch (id) {
	case OPT_SOCKET:
		if (!*arg || strlen(arg) >= sizeof o->socket_path)
			return usage_error("--socket needs a path of 1 to 107 bytes, not '%s'", arg);
		snprintf(o->socket_path, sizeof o->socket_path, "%s", arg);
		return 0;
	case OPT_SOCKET_GROUP:
		snprintf(o->socket_group, sizeof o->socket_group, "%s", arg);
		return 0;
	case OPT_BACKEND:
		if (strcmp(arg, "cuda") != 0 && strcmp(arg, "host") != 0)
			return usage_error("--backend is cuda or host, not '%s'", arg);
		snprintf(o->backend, sizeof o->backend, "%s", arg);
		return 0;
	case OPT_DEVICES:
		if (parse_device_list(arg, o) < 0)
			return usage_error("--devices takes a list such as 0,2-3 (no repeats), not '%s'", arg);
		return 0;
	case OPT_LOG_LEVEL:
		if (log_level_from_name(arg, &o->log_level) < 0)
			return usage_error("--log-level is error, warn, info or debug, not '%s'", arg);
		return 0;
	case OPT_PROBE:
		o->probe = true;
		return 0;
	}
	return set_number(id, arg, o);
}

int options_parse(struct options *o, int argc, char **argv)
{
	int id;
	opterr = 0;
	while ((id = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
		if (id == OPT_HELP) {
			fputs(usage_text, stdout);
			return 1;
		}
		if (id == OPT_VERSION) {
			printf("gpuqd %s (protocol %d)\n", GPUQD_VERSION, GPUQ_PROTOCOL_VERSION);
			return 1;
		}
		if (id == '?' || id == ':')
			return usage_error("unknown option or missing argument: %s",
					   argv[optind - 1]);
		if (set_option(id, optarg, o) < 0)
			return -1;
	}
	if (optind < argc)
		return usage_error("unexpected argument '%s'", argv[optind]);
	return 0;
}
