/*
 * What the service manager passes at start-up (sd_listen_fds' environment
 * protocol, spoken directly; see notify.h for why): the listening socket
 * of gpuqd.socket, and what gpuqd handed its descriptor store before it
 * ended (daemon/fd_store.h): the state record and the slabs. Main thread,
 * at start-up, before recover.c plans the takeover (the passed descriptors
 * are open from the start, so nothing opened earlier takes their numbers).
 */
#ifndef GPUQ_LISTEN_FDS_H
#define GPUQ_LISTEN_FDS_H

#include <stddef.h>
#include <stdint.h>

#include "workers/buffer/slab.h"

/* The first descriptor passed (SD_LISTEN_FDS_START). */
#define LISTEN_FDS_START 3

/* A slab's descriptor from the store, by the name fd_store gave it. */
struct listen_slab {
	char owner[SLAB_OWNER_MAX]; /* the device's uuid; its index, in names older gpuqd gave */
	uint32_t id;
	int fd;
};

struct listen_fds {
	int listen_fd;  /* the listening socket; -1: none passed */
	int record_fd;  /* the store's `gpuq-record`; -1: none */
	struct listen_slab *slabs; /* the store's `gpuq-slab-UUID-ID`, in the order passed */
	size_t nslabs;
	unsigned others;   /* passed descriptors that were none of these (closed) */
	char error[512];   /* what was passed that cannot be served ("": nothing wrong) */
};

/*
 * Reads LISTEN_PID (must be this process), LISTEN_FDS and LISTEN_FDNAMES
 * and sorts the descriptors passed: the one listening AF_UNIX stream
 * socket (systemd passes socket units' first), the store's by their names,
 * and anything else, which is logged and closed. Every descriptor kept is
 * made close-on-exec. Unsets the variables, so that no child takes them
 * for its own. Returns 0 (l filled; nothing passed leaves it empty), or -1
 * with l->error when what was passed cannot be served (several sockets, a
 * socket that does not listen).
 */
int listen_fds_collect(struct listen_fds *l);
/* The listening socket passed (made l's no longer): -1 when none. */
int listen_fds_take(struct listen_fds *l);
/* Closes whatever of l nobody took, and frees it. */
void listen_fds_free(struct listen_fds *l);

#endif
