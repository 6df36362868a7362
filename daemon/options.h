/* gpuqd's settings: defaults, then the command line (options.c). */
#ifndef GPUQ_OPTIONS_H
#define GPUQ_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/log.h"
#include "workers/backend.h"

#define GPUQD_VERSION "0.1.0"

struct options {
	char socket_path[108]; /* sizeof sockaddr_un.sun_path */
	char socket_group[64]; /* "" : leave the group as created */
	char backend[16];      /* "cuda" or "host" */
	int devices[GPUQ_MAX_DEVICES];
	int device_count; /* 0: every device the backend has */
	enum log_level log_level;
	size_t max_frame;
	unsigned queue_depth;         /* per worker */
	unsigned spin_us;      /* idle threads poll this long before sleeping */
	unsigned job_history;         /* finished jobs kept for status/wait */
	unsigned shutdown_timeout_ms; /* for running jobs at SIGTERM */
	struct device_config device;
	bool probe; /* open the devices, print them, exit */
};

/* Sets every default; the socket path depends on the effective uid. */
void options_defaults(struct options *o);

/*
 * Parses argv into o. Returns 0 to run, 1 when --help or --version was
 * printed (exit 0), or -1 after printing a usage error to stderr (exit 2).
 */
int options_parse(struct options *o, int argc, char **argv);

#endif
