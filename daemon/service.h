/*
 * gpuqd as a system service: the configuration (file, reload on SIGHUP),
 * socket activation, readiness/status/watchdog notification, job deadlines,
 * quotas' bookkeeping and metrics. It is glue on the main thread between
 * the daemon and config.c, notify.c, listen_fds.c, quota.c and metrics.c.
 *
 * Timers: a one-second tick refreshes STATUS= and enforces --job-deadline;
 * the watchdog timer, at half of WATCHDOG_USEC, sends WATCHDOG=1 unless a
 * job has outlived its deadline and grace (a stuck worker), so that systemd
 * restarts a wedged daemon; the textfile timer writes --metrics-textfile.
 *
 * Main thread only.
 */
#ifndef GPUQ_SERVICE_H
#define GPUQ_SERVICE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/metrics.h"
#include "daemon/notify.h"
#include "daemon/quota.h"

struct daemon;
struct job;
struct job_table;

struct service {
	struct notify notify;
	struct quota_set quotas; /* live rules; replaced whole on reload */
	struct quota_usage usage;
	struct metrics metrics;
	int argc;
	char **argv; /* re-applied on reload: the command line wins */
	uv_signal_t sighup;
	uv_timer_t tick, watchdog, textfile, stop;
	bool started; /* the handles above are initialised */
	unsigned stuck_jobs;
	uint64_t stuck_logged; /* the stuck job last logged (once each) */
	char status[256];      /* the last STATUS= sent */
};

/*
 * Builds d->opt and the quotas from the command line and the configuration
 * file, and opens the notification socket. Returns 0 to go on, 1 when
 * --check-config found nothing wrong (exit 0), -1 on errors, which are
 * printed as FILE:LINE: message (exit 1).
 */
int service_configure(struct daemon *d, int argc, char **argv);

/*
 * Serves the socket the service manager passed (socket activation), or
 * binds --socket. 0, or -1 with msg.
 */
int service_listen(struct daemon *d, char *msg, size_t msgsize);

/* Every worker has opened (or failed): READY=1, STATUS=, and the timers and SIGHUP. */
int service_start(struct daemon *d);

/* The shutdown has begun: STOPPING=1. */
void service_stopping(struct daemon *d);
/* The last step of the shutdown: closes the service's handles. */
void service_close(struct daemon *d);

/* Asks for the orderly shutdown from a request handler (after it has answered). */
void service_request_shutdown(struct daemon *d);

/*
 * job_submit handed job to its worker; job_complete recorded its end (the
 * job table's hooks, set at start-up).
 */
void service_job_started(struct daemon *d, const struct job *job);
void service_job_finished(struct daemon *d, const struct job *job);

struct deadline_scan {
	unsigned over;       /* jobs running past the deadline (each asked to stop) */
	unsigned cancelled;  /* of which asked to stop by this scan */
	unsigned stuck;      /* running past deadline + grace */
	const struct job *stuck_job; /* the longest-running stuck one */
	double stuck_for;    /* its seconds running */
};

/*
 * Enforces the deadline over t at time now: every running job older than
 * deadline_s is asked to stop (its cancel flag); one still running
 * grace_s after that counts as stuck. deadline_s 0: no deadline.
 */
void service_scan_deadlines(struct job_table *t, double now, unsigned deadline_s,
			    unsigned grace_s, struct deadline_scan *out);

#endif
