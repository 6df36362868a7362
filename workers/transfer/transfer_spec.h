/*
 * What a put or get asks of the worker beyond the buffer range and the
 * descriptor (struct work's dptr, length and fd): embedded in struct work
 * as `transfer`, since every put and get has one, so that a transfer needs
 * no allocation of its own. The main thread fills it before submission
 * (daemon/op_transfer.c, daemon/op_region.c); workers/transfer/ reads it.
 */
#ifndef GPUQ_TRANSFER_SPEC_H
#define GPUQ_TRANSFER_SPEC_H

#include <stdbool.h>
#include <stdint.h>

enum transfer_path { TRANSFER_PATH_AUTO, TRANSFER_PATH_STAGED, TRANSFER_PATH_REGISTERED };

/*
 * When a staged transfer's DMAs were issued, in seconds from its start
 * (transfer_put/get's entry): where the time at either end of a transfer
 * goes, for bench_copy. 0: none issued.
 */
struct transfer_timeline {
	double first_dma_s, last_dma_s;
};

struct transfer_spec {
	uint64_t offset;   /* where in the buffer */
	bool length_exact; /* put: exactly the work's `length` bytes must arrive */
	/* `verify` compares the checksums of the bytes that passed through the
	 * host and of the device range; `path` is the request's `path` field. */
	bool verify;
	enum transfer_path path;
	/* Without a descriptor (fd -1): put writes the random stream of `seed`
	 * (as fill random), get discards what it reads. For benchmarks. */
	bool scratch;
	uint64_t seed;
	/* Through a pipe, socket or device: fail with `timeout` after this long
	 * without moving a byte (--transfer-idle-timeout); 0: never. */
	unsigned idle_timeout_ms;
	/* Through a region (fd -1): the range of the region's registered mapping
	 * the bytes come from or go to, the work's `length` long; with a ring,
	 * its slots. */
	void *host;
	/*
	 * A ring (ring_slot_bytes > 0): the buffer range moves in chunks of
	 * ring_slot_bytes, chunk k through slot k % ring_slots of host, handed
	 * over with the client through the three counters at ring_counters
	 * (posted, moved, status: docs/protocol.md, "Rings").
	 */
	uint64_t ring_slot_bytes;
	unsigned ring_slots;
	uint64_t *ring_counters;
	/* Filled in when set (benchmarks); NULL otherwise. */
	struct transfer_timeline *timeline;
};

#endif
