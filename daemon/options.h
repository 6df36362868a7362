/* gpuqd's settings: defaults, then the command line (options.c). */
#ifndef GPUQ_OPTIONS_H
#define GPUQ_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/fd_store.h"
#include "workers/log.h"
#include "workers/backend/backend.h"
#include "workers/transfer/copy_store.h"

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
	unsigned max_inflight;        /* jobs each worker keeps in flight (workers/sched/sched.h) */
	unsigned spin_us;      /* idle threads poll this long before sleeping */
	unsigned job_history;         /* finished jobs kept for status/wait */
	unsigned shutdown_timeout_ms; /* for running jobs at SIGTERM */
	unsigned restart_drain_ms;    /* for running jobs before a re-exec (daemon/restart.h) */
	int check_record_fd;          /* --check-record: -1, or the record to check, then exit */
	enum fd_store_mode fd_store;  /* --fd-store (daemon/fd_store.h) */
	struct device_config device;
	bool probe; /* open the devices, print them, exit */
	unsigned copy_threads; /* host copy threads shared by the workers (workers/transfer/copy_pool.c) */
	enum copy_stores copy_stores; /* how they store into a get's mapping (workers/transfer/copy_store.h) */
	unsigned collective_timeout_ms; /* an all-reduce's default timeout (and its init's floor) */
	char config_path[256];         /* --config, or the default if it exists */
	bool config_given;             /* --config was on the command line: it must exist */
	bool check_config;             /* --check-config: report and exit */
	char admin_group[64];          /* "" : root alone administers */
	unsigned job_deadline_s;       /* 0: none; then jobs are cancelled (service.c) */
	unsigned job_deadline_grace_s; /* after the deadline, before a worker is stuck */
	char metrics_textfile[256];    /* "" : none */
	unsigned metrics_interval_s;
	unsigned frame_timeout_ms;         /* an incomplete request frame's time to arrive; 0: none */
	unsigned transfer_idle_timeout_ms; /* a streamed put/get without progress; 0: none */
};

#define GPUQD_DEFAULT_CONFIG "/etc/gpuq/gpuqd.conf"


/* Sets every default; the socket path depends on the effective uid. */
void options_defaults(struct options *o);

/*
 * Parses argv into o. Returns 0 to run, 1 when --help or --version was
 * printed (exit 0), or -1 after printing a usage error to stderr (exit 2).
 */
int options_parse(struct options *o, int argc, char **argv);

/*
 * Sets the option called name (its long name without "--") from a
 * configuration file. Returns 0; -1 with msg when the value is wrong; -2
 * when no option that a file may set has that name (--config,
 * --check-config, --probe, --help and --version are the command line's).
 */
int options_set(struct options *o, const char *name, const char *value, char *msg,
		size_t msgsize);
/* The names options_set takes, comma-separated, for error messages. Static storage. */
const char *options_names(void);

#endif
