#include "daemon/options.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "protocol/protocol.h"
#include "workers/chain/chain.h"
#include "workers/sched/sched.h"

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
	"  --staging-slot SIZE     size of one staging slot (default 2M)\n"
	"  --staging-slots N       slots in each worker's staging ring (default 64)\n"
	"  --copy-threads N        host threads that read and write descriptors for\n"
	"                          every worker's copies (default: online CPUs, at most 12)\n"
	"  --copy-stores KIND      how the copy threads write a get into a mapped file:\n"
	"                          nt (non-temporal stores, default) or regular (memcpy)\n"
	"  --register-min SIZE     put/get with path auto register the client's mapping\n"
	"                          instead of staging from this size (default 0: never)\n"
	"  --pool-release SIZE     CUDA pool release threshold, and the empty slabs kept\n"
	"                          for reuse (default 0)\n"
	"  --buffer-memory auto|pool|vmm  where buffers' memory comes from: vmm, slabs\n"
	"                          of exportable memory (CUDA VMM, host memfds); pool,\n"
	"                          the memory pool; auto (default): vmm where the\n"
	"                          driver supports it, else pool\n"
	"  --graph-cache N         kernel-chain plans (CUDA graphs) kept per device,\n"
	"                          least recently used out first (default 64)\n"
	"  --kernel-cache DIR      where compiled chain kernels are kept across runs\n"
	"                          (default $STATE_DIRECTORY/kernels under systemd, else\n"
	"                          $XDG_CACHE_HOME/gpuq/kernels or ~/.cache/gpuq/kernels;\n"
	"                          none: keep them in memory only)\n"
	"  --nvrtc PATH|off        the NVRTC library that compiles chain kernels (default:\n"
	"                          libnvrtc.so.13, then libnvrtc.so; off: never compile,\n"
	"                          run the interpreted kernels)\n"
	"  --collective-timeout MS how long a collective's ranks may take to start,\n"
	"                          from its submission, and the collective to run,\n"
	"                          before it fails with `timeout`\n"
	"                          (default 30000; a request may ask for another)\n"
	"  --queue-depth N         jobs queued per device before `busy` (default 1024)\n"
	"  --max-inflight N        jobs each GPU's scheduler keeps in flight at once\n"
	"                          (default 16; more urgent jobs may take up to twice)\n"
	"  --reset-limit N         a GPU that faults is reset and serves again, up to N\n"
	"                          times within --reset-window (default 3; 0: never,\n"
	"                          it stays unhealthy for an operator)\n"
	"  --reset-window S        the window of --reset-limit (seconds, default 3600)\n"
	"  --spin US               how long a worker polls for work, and the main thread\n"
	"                          for a dispatched job's end, before sleeping\n"
	"                          (microseconds; default 50; 0: never)\n"
	"  --job-history N         finished jobs kept for status/wait (default 10000)\n"
	"  --shutdown-timeout MS   how long running jobs may finish at SIGTERM (default 10000)\n"
	"  --restart-drain MS      how long running jobs may finish before gpuqd re-executes\n"
	"                          itself (`gpuq admin restart`, SIGUSR2); the rest fail\n"
	"                          with `restarted` (default 5000)\n"
	"  --fd-store auto|on|off  hand every slab's descriptor and the state record to\n"
	"                          the service manager's descriptor store, so that\n"
	"                          buffers survive a crash (auto, the default: when\n"
	"                          $FDSTORE says the store keeps descriptors)\n"
	"  --check-record FD       read the durable state record that descriptor FD holds,\n"
	"                          say what it holds, and exit (0: this gpuqd can take it\n"
	"                          over, 65: it cannot); a restart runs the new binary\n"
	"                          so before it stops serving\n"
	"  --max-frame SIZE        largest request frame accepted (default 1M)\n"
	"  --frame-timeout MS      a request frame must arrive whole within MS of its\n"
	"                          first byte, or the connection is closed (default\n"
	"                          30000; 0: no limit)\n"
	"  --transfer-idle-timeout MS  a put or get through a pipe, socket or device\n"
	"                          that moves no byte for MS fails with `timeout`\n"
	"                          (default 60000; 0: no limit)\n"
	"  --log-level LEVEL       error, warn, info (default) or debug\n"
	"  --probe                 open the devices, print them, and exit\n"
	"                          (0: at least one healthy device, 69: none)\n"
	"  --config PATH           the configuration file (default " GPUQD_DEFAULT_CONFIG ",\n"
	"                          read if it exists); the command line wins over it\n"
	"  --check-config          check the configuration, print what is wrong as\n"
	"                          FILE:LINE: message, and exit (0: fine, 1: errors)\n"
	"  --admin-group GROUP     members may see and cancel every job, stop gpuqd and\n"
	"                          run benchmarks\n"
	"  --job-deadline S        cancel a job that has run S seconds (default 0: never)\n"
	"  --job-deadline-grace S  a job still running S seconds after its deadline\n"
	"                          means a stuck worker: the systemd watchdog is\n"
	"                          withheld so that gpuqd is restarted (default 30)\n"
	"  --metrics-textfile PATH write `gpuq metrics` to PATH (atomically), for\n"
	"                          node_exporter's textfile collector\n"
	"  --metrics-interval S    how often to write it (default 15)\n"
	"  --help, --version\n";

enum option_id {
	OPT_SOCKET = 256, OPT_SOCKET_GROUP, OPT_BACKEND, OPT_DEVICES, OPT_HOST_DEVICES,
	OPT_HOST_MEM, OPT_STAGING_SLOT, OPT_STAGING_SLOTS, OPT_POOL_RELEASE, OPT_QUEUE_DEPTH,
	OPT_JOB_HISTORY, OPT_SPIN, OPT_SHUTDOWN_TIMEOUT, OPT_MAX_FRAME, OPT_LOG_LEVEL, OPT_PROBE,
	OPT_HELP, OPT_VERSION,
	OPT_COPY_THREADS, OPT_REGISTER_MIN, OPT_COPY_STORES,
	OPT_GRAPH_CACHE, OPT_KERNEL_CACHE, OPT_NVRTC,
	OPT_COLLECTIVE_TIMEOUT,
	OPT_CONFIG, OPT_CHECK_CONFIG, OPT_ADMIN_GROUP, OPT_JOB_DEADLINE, OPT_JOB_DEADLINE_GRACE,
	OPT_METRICS_TEXTFILE, OPT_METRICS_INTERVAL,
	OPT_MAX_INFLIGHT, OPT_RESET_LIMIT, OPT_RESET_WINDOW,
	OPT_FRAME_TIMEOUT, OPT_TRANSFER_IDLE_TIMEOUT, OPT_BUFFER_MEMORY,
	OPT_RESTART_DRAIN, OPT_CHECK_RECORD, OPT_FD_STORE,
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
	{ "buffer-memory", required_argument, NULL, OPT_BUFFER_MEMORY },
	{ "queue-depth", required_argument, NULL, OPT_QUEUE_DEPTH },
	{ "job-history", required_argument, NULL, OPT_JOB_HISTORY },
	{ "spin", required_argument, NULL, OPT_SPIN },
	{ "shutdown-timeout", required_argument, NULL, OPT_SHUTDOWN_TIMEOUT },
	{ "restart-drain", required_argument, NULL, OPT_RESTART_DRAIN },
	{ "check-record", required_argument, NULL, OPT_CHECK_RECORD },
	{ "fd-store", required_argument, NULL, OPT_FD_STORE },
	{ "max-frame", required_argument, NULL, OPT_MAX_FRAME },
	{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
	{ "probe", no_argument, NULL, OPT_PROBE },
	{ "help", no_argument, NULL, OPT_HELP },
	{ "version", no_argument, NULL, OPT_VERSION },
	{ "copy-threads", required_argument, NULL, OPT_COPY_THREADS },
	{ "register-min", required_argument, NULL, OPT_REGISTER_MIN },
	{ "copy-stores", required_argument, NULL, OPT_COPY_STORES },
	{ "graph-cache", required_argument, NULL, OPT_GRAPH_CACHE },
	{ "kernel-cache", required_argument, NULL, OPT_KERNEL_CACHE },
	{ "nvrtc", required_argument, NULL, OPT_NVRTC },
	{ "collective-timeout", required_argument, NULL, OPT_COLLECTIVE_TIMEOUT },
	{ "config", required_argument, NULL, OPT_CONFIG },
	{ "check-config", no_argument, NULL, OPT_CHECK_CONFIG },
	{ "admin-group", required_argument, NULL, OPT_ADMIN_GROUP },
	{ "job-deadline", required_argument, NULL, OPT_JOB_DEADLINE },
	{ "job-deadline-grace", required_argument, NULL, OPT_JOB_DEADLINE_GRACE },
	{ "metrics-textfile", required_argument, NULL, OPT_METRICS_TEXTFILE },
	{ "metrics-interval", required_argument, NULL, OPT_METRICS_INTERVAL },
	{ "max-inflight", required_argument, NULL, OPT_MAX_INFLIGHT },
	{ "reset-limit", required_argument, NULL, OPT_RESET_LIMIT },
	{ "reset-window", required_argument, NULL, OPT_RESET_WINDOW },
	{ "frame-timeout", required_argument, NULL, OPT_FRAME_TIMEOUT },
	{ "transfer-idle-timeout", required_argument, NULL, OPT_TRANSFER_IDLE_TIMEOUT },
	{ NULL, 0, NULL, 0 },
};

/*
 * The kernel cache's default: under the service's state directory (systemd's
 * StateDirectory= sets $STATE_DIRECTORY, a list: the first), else the user's
 * cache directory; none when there is neither.
 */
static void default_kernel_cache(char *dir, size_t size)
{
	const char *state = getenv("STATE_DIRECTORY"), *xdg = getenv("XDG_CACHE_HOME");
	const char *home = getenv("HOME");
	if (state && *state == '/')
		snprintf(dir, size, "%.*s/kernels", (int)strcspn(state, ":"), state);
	else if (xdg && *xdg == '/')
		snprintf(dir, size, "%s/gpuq/kernels", xdg);
	else if (home && *home == '/')
		snprintf(dir, size, "%s/.cache/gpuq/kernels", home);
	else
		dir[0] = '\0';
}

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
	o->max_inflight = SCHED_DEFAULT_INFLIGHT;
	o->device.reset_limit = 3;
	o->device.reset_window_s = 3600;
	o->job_history = 10000;
	o->spin_us = 50;
	o->shutdown_timeout_ms = 10000;
	o->restart_drain_ms = 5000;
	o->check_record_fd = -1;
	o->device.staging_slot_bytes = 2u << 20;
	o->device.staging_slots = 64; /* two transfers at once each get the 32 one needs alone */
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	o->copy_threads = cpus < 1 ? 1 : cpus > 12 ? 12 : (unsigned)cpus;
	/* Measured on the H200 machine: a get into a memfd 13-27% faster than memcpy. */
	o->copy_stores = COPY_STORES_NT;
	copy_store_request(o->copy_stores);
	o->device.pool_release_bytes = 0;
	o->device.host_arena_bytes = 1ull << 30;
	o->device.host_devices = 2;
	o->device.chain_graph_cache = CHAIN_CACHE_DEFAULT;
	default_kernel_cache(o->device.kernel_cache_dir, sizeof o->device.kernel_cache_dir);
	o->collective_timeout_ms = 30000;
	snprintf(o->config_path, sizeof o->config_path, "%s", GPUQD_DEFAULT_CONFIG);
	o->job_deadline_grace_s = 30;
	o->metrics_interval_s = 15;
	o->frame_timeout_ms = 30000;
	o->transfer_idle_timeout_ms = 60000;
}

/* options_set keeps the message instead of printing it (a file's errors carry file:line). */
static bool capture_errors;
static char captured_error[512];

static int usage_error(const char *fmt, const char *arg)
{
	char msg[512];
	snprintf(msg, sizeof msg, fmt, arg);
	if (capture_errors) {
		snprintf(captured_error, sizeof captured_error, "%s", msg);
		return -1;
	}
	fprintf(stderr, "gpuqd: %s\n(see gpuqd --help)\n", msg);
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
			return usage_error("--staging-slots takes 2 to 256, not '%s'", arg);
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
	case OPT_MAX_INFLIGHT:
		if (parse_uint(arg, 1, SCHED_MAX_INFLIGHT, &n) < 0)
			return usage_error("--max-inflight takes 1 to 256, not '%s'", arg);
		o->max_inflight = (unsigned)n;
		return 0;
	case OPT_RESET_LIMIT:
		if (parse_uint(arg, 0, 7, &n) < 0)
			return usage_error("--reset-limit takes 0 to 7 resets, not '%s'", arg);
		o->device.reset_limit = (unsigned)n;
		return 0;
	case OPT_RESET_WINDOW:
		if (parse_uint(arg, 1, 30u * 24 * 3600, &n) < 0)
			return usage_error("--reset-window takes seconds (1 to 2592000), not '%s'", arg);
		o->device.reset_window_s = (unsigned)n;
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
	case OPT_RESTART_DRAIN:
		if (parse_uint(arg, 0, 3600000, &n) < 0)
			return usage_error("--restart-drain takes milliseconds (0 to 3600000), not '%s'", arg);
		o->restart_drain_ms = (unsigned)n;
		return 0;
	case OPT_COPY_THREADS:
		if (parse_uint(arg, 0, 256, &n) < 0)
			return usage_error("--copy-threads takes 0 to 256 (0: the workers read and write "
					   "descriptors themselves), not '%s'", arg);
		o->copy_threads = (unsigned)n;
		return 0;
	case OPT_REGISTER_MIN:
		if (parse_size_opt(arg, 0, UINT64_MAX, &o->device.register_min_bytes) < 0)
			return usage_error("--register-min takes a size such as 256M (0: never), not '%s'", arg);
		return 0;
	case OPT_GRAPH_CACHE:
		if (parse_uint(arg, 1, CHAIN_CACHE_MAX, &n) < 0)
			return usage_error("--graph-cache takes 1 to 4096 plans per device, not '%s'", arg);
		o->device.chain_graph_cache = (unsigned)n;
		return 0;
	case OPT_COLLECTIVE_TIMEOUT:
		if (parse_uint(arg, 1, 3600000, &n) < 0)
			return usage_error("--collective-timeout takes milliseconds (1 to 3600000), not '%s'", arg);
		o->collective_timeout_ms = (unsigned)n;
		return 0;
	case OPT_MAX_FRAME:
		if (parse_size_opt(arg, GPUQ_MIN_MAX_FRAME, 1u << 30, &size) < 0)
			return usage_error("--max-frame takes a size from 4K to 1G, not '%s'", arg);
		o->max_frame = (size_t)size;
		return 0;
	case OPT_JOB_DEADLINE:
	case OPT_JOB_DEADLINE_GRACE:
		if (parse_uint(arg, 0, 30u * 24 * 3600, &n) < 0)
			return usage_error(id == OPT_JOB_DEADLINE
						   ? "--job-deadline takes seconds (0: none, up to 2592000), not '%s'"
						   : "--job-deadline-grace takes seconds (0 to 2592000), not '%s'",
					   arg);
		*(id == OPT_JOB_DEADLINE ? &o->job_deadline_s : &o->job_deadline_grace_s) = (unsigned)n;
		return 0;
	case OPT_FRAME_TIMEOUT:
		if (parse_uint(arg, 0, 3600000, &n) < 0)
			return usage_error("--frame-timeout takes milliseconds (0: none, up to 3600000), not '%s'", arg);
		o->frame_timeout_ms = (unsigned)n;
		return 0;
	case OPT_TRANSFER_IDLE_TIMEOUT:
		if (parse_uint(arg, 0, 86400000, &n) < 0)
			return usage_error("--transfer-idle-timeout takes milliseconds (0: none, up to 86400000), not '%s'",
					   arg);
		o->transfer_idle_timeout_ms = (unsigned)n;
		return 0;
	case OPT_METRICS_INTERVAL:
		if (parse_uint(arg, 1, 86400, &n) < 0)
			return usage_error("--metrics-interval takes seconds (1 to 86400), not '%s'", arg);
		o->metrics_interval_s = (unsigned)n;
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
	case OPT_CONFIG:
		if (!*arg || strlen(arg) >= sizeof o->config_path)
			return usage_error("--config needs a path of 1 to 255 bytes, not '%s'", arg);
		snprintf(o->config_path, sizeof o->config_path, "%s", arg);
		o->config_given = true;
		return 0;
	case OPT_CHECK_CONFIG:
		o->check_config = true;
		return 0;
	case OPT_CHECK_RECORD: {
		unsigned long fd;
		if (parse_uint(arg, 0, 1u << 20, &fd) < 0)
			return usage_error("--check-record takes a descriptor number, not '%s'", arg);
		o->check_record_fd = (int)fd;
		return 0;
	}
	case OPT_ADMIN_GROUP:
		if (strlen(arg) >= sizeof o->admin_group)
			return usage_error("--admin-group needs a group name of at most 63 bytes, not '%s'", arg);
		snprintf(o->admin_group, sizeof o->admin_group, "%s", arg);
		return 0;
	case OPT_BUFFER_MEMORY:
		if (strcmp(arg, "auto") == 0)
			o->device.buffer_memory = BUFFER_MEMORY_AUTO;
		else if (strcmp(arg, "pool") == 0)
			o->device.buffer_memory = BUFFER_MEMORY_POOL;
		else if (strcmp(arg, "vmm") == 0)
			o->device.buffer_memory = BUFFER_MEMORY_VMM;
		else
			return usage_error("--buffer-memory is auto, pool or vmm, not '%s'", arg);
		return 0;
	case OPT_FD_STORE:
		if (strcmp(arg, "auto") == 0)
			o->fd_store = FD_STORE_AUTO;
		else if (strcmp(arg, "on") == 0)
			o->fd_store = FD_STORE_ON;
		else if (strcmp(arg, "off") == 0)
			o->fd_store = FD_STORE_OFF;
		else
			return usage_error("--fd-store is auto, on or off, not '%s'", arg);
		return 0;
	case OPT_COPY_STORES: /* what the copy pool picks when it starts, after the options */
		if (copy_store_parse(arg, &o->copy_stores) < 0)
			return usage_error("--copy-stores is regular or nt, not '%s'", arg);
		copy_store_request(o->copy_stores);
		return 0;
	case OPT_KERNEL_CACHE:
		if (strcmp(arg, "none") == 0) {
			o->device.kernel_cache_dir[0] = '\0';
			return 0;
		}
		if (*arg != '/' || strlen(arg) >= sizeof o->device.kernel_cache_dir - 96)
			return usage_error("--kernel-cache needs an absolute directory of at most 159 "
					   "bytes, or none, not '%s'", arg);
		snprintf(o->device.kernel_cache_dir, sizeof o->device.kernel_cache_dir, "%s", arg);
		return 0;
	case OPT_NVRTC:
		if (strlen(arg) >= sizeof o->device.nvrtc)
			return usage_error("--nvrtc needs a library path of at most 255 bytes, or off, "
					   "not '%s'", arg);
		snprintf(o->device.nvrtc, sizeof o->device.nvrtc, "%s", arg);
		return 0;
	case OPT_METRICS_TEXTFILE:
		if (strlen(arg) >= sizeof o->metrics_textfile || (*arg && *arg != '/'))
			return usage_error("--metrics-textfile needs an absolute path of at most 255 bytes (or nothing), not '%s'",
					   arg);
		snprintf(o->metrics_textfile, sizeof o->metrics_textfile, "%s", arg);
		return 0;
	}
	return set_number(id, arg, o);
}

int options_parse(struct options *o, int argc, char **argv)
{
	int id;
	opterr = 0;
	optind = 0; /* a full restart of getopt: the service reparses argv on reload */
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

/* Options that act rather than set (or that name the file itself) stay on the command line. */
static bool command_line_only(int id)
{
	return id == OPT_PROBE || id == OPT_HELP || id == OPT_VERSION || id == OPT_CONFIG ||
	       id == OPT_CHECK_CONFIG || id == OPT_CHECK_RECORD;
}

int options_set(struct options *o, const char *name, const char *value, char *msg,
		size_t msgsize)
{
	for (const struct option *opt = long_options; opt->name; opt++) {
		if (strcmp(opt->name, name) != 0 || command_line_only(opt->val))
			continue;
		capture_errors = true;
		int rc = set_option(opt->val, value, o);
		capture_errors = false;
		if (rc < 0) {
			/* "--queue-depth takes ..." reads as "queue-depth takes ..." in a file */
			const char *m = captured_error;
			snprintf(msg, msgsize, "%s", strncmp(m, "--", 2) == 0 ? m + 2 : m);
			return -1;
		}
		return 0;
	}
	return -2;
}

const char *options_names(void)
{
	static char names[1024];
	size_t used = 0;
	if (names[0])
		return names;
	for (const struct option *opt = long_options; opt->name; opt++)
		if (!command_line_only(opt->val) && used < sizeof names)
			used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
						 used ? ", " : "", opt->name);
	return names;
}
