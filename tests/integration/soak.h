/*
 * The soak test (test_soak.c): SOAK_CLIENTS client processes run mixed jobs
 * against one gpuqd while the test kills them at random (mid-put, mid-get,
 * mid-wait), they disconnect and reconnect, and the daemon reloads on
 * SIGHUP. Each client owns SOAK_SLOTS buffers and records in shared memory,
 * before every job that changes one, what the buffer may hold afterwards,
 * so that whoever looks next (the client that replaces a killed one, or
 * the test at the end) can check every surviving buffer's bytes.
 */
#ifndef GPUQ_TEST_SOAK_H
#define GPUQ_TEST_SOAK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "tests/integration/fixture.h"

#define SOAK_CLIENTS 64
#define SOAK_SLOTS 4
#define SOAK_UID 65534

/* What a slot's buffer holds, as far as anyone can know. */
enum soak_state {
	SLOT_NONE,       /* no buffer */
	SLOT_ALLOCATING, /* an alloc was (maybe) sent */
	SLOT_STABLE,     /* it holds bytes whose checksum is `expected` */
	SLOT_PENDING,    /* a job that writes `pending`'s bytes was (maybe) sent: either */
	SLOT_UNKNOWN,    /* a job that may have stopped part way was (maybe) sent */
	SLOT_FREEING,    /* a free was (maybe) sent */
};

struct soak_slot {
	char name[16]; /* "c12b3" */
	int device;
	uint32_t bytes;
	bool ephemeral;
	uint64_t conn_tag; /* the connection that made an ephemeral buffer */
	_Atomic int state;
	uint64_t expected, pending;
};

enum soak_op {
	OP_FILL, OP_PUT_MEMFD, OP_PUT_PIPE, OP_PUT_SLOW, OP_GET_MEMFD, OP_GET_PIPE, OP_CHECKSUM,
	OP_COPY, OP_NOOP, OP_WAIT, OP_DISCONNECT, OP_REALLOC, OP_COUNT
};

/* Shared (MAP_SHARED) between the test and every client process. */
struct soak_shared {
	const struct daemon_proc *d;
	int devices;
	atomic_int stop;
	atomic_uint errors;
	atomic_flag error_taken;
	char first_error[600];
	atomic_uint ops[OP_COUNT];
	atomic_uint recoveries;
	_Atomic uint64_t next_tag; /* connection tags, unique in the run */
	struct soak_slot slots[SOAK_CLIENTS][SOAK_SLOTS];
};

/* soak_client.c: client k's life, until sh->stop (then it exits 0) or a SIGKILL. */
_Noreturn void soak_client(struct soak_shared *sh, int k, unsigned seed);
/* The checksum of bytes of the random stream of seed (fill random, memfd_random). */
uint64_t soak_stream_sum(uint32_t bytes, uint64_t seed);
/* Records a failure (the first one's message is kept). */
void soak_fail(struct soak_shared *sh, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * Waits until no job of the daemon's is queued or running on buffer label
 * ("c12b3@0"), or on any buffer when label is NULL; false after 20 s.
 */
bool soak_wait_quiet(struct gpuq_client *c, const char *label);

#endif
