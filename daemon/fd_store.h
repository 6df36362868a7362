/*
 * The service manager's file-descriptor store (systemd's
 * sd_pid_notify_with_fds(3) and sd_notify(3): FDSTORE=1, FDNAME=,
 * FDSTOREREMOVE=1), spoken directly as notify.h speaks sd_notify: each
 * slab's descriptor and the state record's memfd are handed to the service
 * manager, which keeps them open while gpuqd dies and restarts and passes
 * them back (LISTEN_FDS, LISTEN_FDNAMES: listen_fds.h), so that a crash
 * loses no buffer (docs/ARCHITECTURE.md, Durable state).
 *
 * Names: `gpuq-record` (the record, one for the service's life) and
 * `gpuq-slab-UUID-ID` (slab ID of the device whose uuid is UUID, as the
 * record names it): by uuid rather than by gpuq's index, which the next
 * gpuqd may give another GPU (--devices changed), so that no two slabs
 * ever share a name, and FDSTOREREMOVE never drops another device's.
 * A gpuqd of record version 1 named them `gpuq-slab-INDEX-ID`; a slab taken
 * over under such a name is stored again under its own (slab_keeper.rename).
 *
 * Threads: fd_store_open and fd_store_close on the main thread, before the
 * workers start and after they stop; fd_store_add and fd_store_remove from
 * any thread (one datagram per call on a socket of its own: sendmsg of a
 * datagram is atomic), by the thread that owns the descriptor at that
 * moment, so that its number cannot name anything else by then.
 */
#ifndef GPUQ_FD_STORE_H
#define GPUQ_FD_STORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/log.h"
#include "workers/buffer/slab.h"

/* --fd-store: auto is on when the service manager says the store's size ($FDSTORE > 0). */
enum fd_store_mode { FD_STORE_AUTO, FD_STORE_ON, FD_STORE_OFF };

#define FD_STORE_RECORD "gpuq-record"
#define FD_STORE_SLAB_PREFIX "gpuq-slab-"
/* Room for any name gpuqd gives: the prefix, a uuid of up to 63 bytes, '-', the id. */
#define FD_STORE_NAME_MAX SLAB_NAME_MAX

struct fd_store {
	int fd;             /* datagram socket to $NOTIFY_SOCKET; -1: the store is not used */
	char path[108];     /* $NOTIFY_SOCKET as given ('@': abstract) */
	unsigned max;       /* $FDSTORE: how many descriptors it keeps (0: not said) */
	char why[160];      /* why it is used or not, for the log and --probe */
	atomic_uint held;   /* descriptors stored and not removed by this image */
	atomic_ullong stored, removed, failures;
	atomic_bool warned_full;
	atomic_bool keep; /* gpuqd is stopping: slabs given back stay in the store (fd_store_keep) */
	pthread_mutex_t log_lock; /* guards every */
	struct log_every every;  /* failures, logged at most every 10 s */
	struct slab_keeper keeper; /* the slab heaps' hooks into this store */
};

/*
 * Decides whether the store is used (mode, $NOTIFY_SOCKET, $FDSTORE) and
 * opens its socket. 0 (s->why says which), or -1 with s->why when `on`
 * cannot be had (no $NOTIFY_SOCKET): gpuqd then serves without it.
 */
int fd_store_open(struct fd_store *s, enum fd_store_mode mode);
bool fd_store_enabled(const struct fd_store *s);
/* Hands fd to the store under name: 0, or -1 (logged at most every 10 s, counted). */
int fd_store_add(struct fd_store *s, const char *name, int fd);
/* Removes every descriptor named name from the store: 0, or -1 (logged, counted). */
int fd_store_remove(struct fd_store *s, const char *name);
/*
 * From now on the heaps' releases are ignored: gpuqd is stopping (or could
 * not start), and the slabs its workers give back as they stop stay in the
 * store for the next gpuqd, which takes over those its record names and
 * removes the rest. Call before the workers stop.
 */
void fd_store_keep(struct fd_store *s);
/* Descriptors held beyond $FDSTORE (which the store drops): 0 when within it, or unsaid. */
unsigned fd_store_over_limit(struct fd_store *s);
/* n descriptors this image took over are in the store already (counted against $FDSTORE). */
void fd_store_count_held(struct fd_store *s, unsigned n);
/* The name of slab id of the device owner names (its uuid; an index, in the old names), into buf (size n). */
void fd_store_slab_name(const char *owner, uint32_t id, char *buf, size_t n);
/* The name gpuqd gave device index device's slab id before records named GPUs by uuid. */
void fd_store_slab_name_of_index(int device, uint32_t id, char *buf, size_t n);
/* Whether name is a slab's: 1 with owner (size n) and *id, or 0. */
int fd_store_parse_slab(const char *name, char *owner, size_t n, uint32_t *id);
void fd_store_close(struct fd_store *s);

#endif
