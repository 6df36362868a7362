/*
 * Taking over what the previous gpuqd image left (docs/ARCHITECTURE.md,
 * Durable state, "The re-exec"): a gpuqd that daemon/restart.c re-executed
 * finds GPUQ_INHERIT in its environment, naming the descriptors it
 * inherited: the state record, the listening socket and the client
 * connections (the slabs' and the regions' descriptors are named by the
 * record itself). It reads the record, has each worker adopt its device's
 * slabs (and pin its regions again: recover_regions.h) as the device
 * opens, and lists the buffers again, then serves on the same socket and
 * the same connections.
 *
 * GPUQ_INHERIT is a comma-separated list of `record:FD`, `listen:FD:ADOPTED`
 * (ADOPTED 1: the socket was the service manager's), `restarts:N`,
 * `jobs:NEXT_ID`, `fault:MS` (each recent restart after a fault),
 * `conn:FD:SERIAL`, `queue:FD` (the jobs queued at the re-exec, which
 * daemon/replay.h submits again once the connections are served:
 * recover_jobs) and `stored:1` (the previous image kept the record and
 * every slab in the service manager's descriptor store). It is gpuqd's own
 * and is unset once read.
 *
 * Without GPUQ_INHERIT, a record among the descriptors the service manager
 * passed (its store, daemon/listen_fds.h) means gpuqd died: the same plan
 * runs on that record, each slab's descriptor found in the store by
 * (device, slab id), since the record's descriptor numbers were the dead
 * process's. Connections, host regions and leases did not survive.
 *
 * Main thread only, at start-up.
 */
#ifndef GPUQ_RECOVER_H
#define GPUQ_RECOVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/backend/backend.h"

#define RECOVER_ENV "GPUQ_INHERIT"
/* --check-record's exit status for a record this binary cannot read (sysexits' EX_DATAERR). */
#define RECOVER_EXIT_REFUSED 65

struct daemon;
struct state_snapshot;

struct recover_conn {
	int fd;
	uint64_t serial;
};

struct state_record;

struct recover {
	bool active; /* GPUQ_INHERIT was given */
	bool from_store; /* no re-exec: gpuqd died, and the service manager's store had its record */
	bool after_stop; /* from the store, after a clean stop rather than a death */
	bool stored; /* what the previous image handed over is in the service manager's store already */
	struct state_record *record; /* the record taken over, for durable_start; NULL: none */
	int record_fd, listen_fd;
	int queue_fd; /* the held jobs' memfd (daemon/replay.h); -1: none */
	bool listen_adopted;
	unsigned restarts; /* re-execs so far, this one included */
	uint64_t next_job; /* the job id the previous image would have given next */
	unsigned suspect, lost; /* of the buffers taken over */
	unsigned moved; /* buffers whose GPU has another index now */
	uint64_t recoveries; /* times gpuqd came back from the store after dying, this one included */
	uint64_t fault_ms[8]; /* when the latest restarts after a fault were asked (restart.h) */
	unsigned nfault;
	struct recover_conn *conns;
	size_t nconns;
	struct state_snapshot *snap; /* NULL: no record could be read */
	struct device_adopt_list adopt;
};

/*
 * Before the workers start: reads GPUQ_INHERIT and the record it names,
 * and sets d->opt.device.adopt so that the workers take the slabs over.
 * A record that cannot be read is logged; gpuqd then serves without its
 * buffers (the binary's --check-record said it could, so this is rare).
 */
void recover_begin(struct daemon *d);
/* After the workers have opened: lists the buffers the record names again (lost where their slab was not taken). */
void recover_buffers(struct daemon *d);
/* Once serving: the inherited connections, served again under their old serials. */
void recover_conns(struct daemon *d);
/*
 * Last, once the connections have their regions and leases back: the jobs
 * queued at the re-exec, submitted again on their connections
 * (daemon/replay.h).
 */
void recover_jobs(struct daemon *d);
/* --check-record FD: says what the record holds; 0, or RECOVER_EXIT_REFUSED. */
int recover_check_record(int fd);

#endif
