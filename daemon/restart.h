/*
 * Re-executing gpuqd in place (docs/ARCHITECTURE.md, Durable state, "The
 * re-exec"): on `restart` (an admin request, `gpuq admin restart`), SIGUSR2
 * or a device that needs a new process after a fault, gpuqd stops taking
 * jobs (a submission gets `restarted`), holds the queued ones for the next
 * image to replay (daemon/replay.h; those it cannot carry fail with
 * `restarted`), lets the running ones finish within --restart-drain (then
 * cancels them: they end `restarted` too), waits for the replies to be
 * written, hands the held jobs over, writes the last generation of the
 * state record, and execve's the binary (its own, or the one named) with
 * the record, every slab's descriptor, the listening socket, the client
 * connections and the held jobs inherited (daemon/recover.h reads them
 * back). Before any of that it runs the binary
 * with --check-record: one that cannot read the record is refused and this
 * image keeps serving, as it does when the execve itself fails.
 *
 * Main thread only.
 */
#ifndef GPUQ_RESTART_H
#define GPUQ_RESTART_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "protocol/protocol.h"

struct daemon;

struct restart {
	bool active;      /* draining toward the execve */
	bool cancel_sent; /* the drain ran out: the running jobs were cancelled */
	bool handles;     /* sigusr2 and timer are initialised */
	char binary[PATH_MAX];
	char reason[96];
	double since;     /* when it was asked for (CLOCK_MONOTONIC seconds) */
	double flush_since; /* when the last job had ended (0: not yet) */
	uv_signal_t sigusr2;
	uv_timer_t timer;
	char **argv;      /* main's, handed to the new image as they were */
	unsigned count;   /* re-execs since gpuqd first started (carried across them) */
	/* When the latest restarts after a fault were asked (CLOCK_MONOTONIC ms: the same clock across an execve). */
	uint64_t fault_ms[8];
	unsigned nfault;
};

/* Takes SIGUSR2 (a restart of the binary itself) and keeps argv for the execve. 0, or -1 logged. */
int restart_init(struct daemon *d, char **argv);
/*
 * Starts a restart into binary (NULL: gpuqd's own) for reason ("admin
 * request", ...). 0 once the drain has begun (the rest happens as jobs
 * end); -1 with err, gpuqd serving on: one is under way, gpuqd is stopping,
 * the binary is not an executable file, or it cannot read the record.
 */
int restart_request(struct daemon *d, const char *binary, const char *reason,
		    struct gpuq_error *err);
/*
 * Device index faulted and only a new process gets a context on it: a
 * restart of gpuqd's own binary, unless --reset-limit such restarts
 * happened within --reset-window (counted across re-execs): then the
 * device stays unhealthy for an operator (logged). True when a restart is
 * under way (this one or another), which takes the device's buffers over.
 */
bool restart_after_fault(struct daemon *d, int index);
/* A job ended during a restart's drain: the execve follows the last one. */
void restart_step(struct daemon *d);
/* Shutdown: closes the handles. */
void restart_close(struct daemon *d);

#endif
