/*
 * Moving bytes between a client's descriptor and device memory: the
 * pipelined copy. Worker thread only.
 *
 * A regular file or memfd is read (put) or written (get) at its offsets by
 * the copy threads (copy_pool.h), several pinned staging slots at once, while
 * the worker issues each filled slot's DMA on the h2d stream (or each
 * drained slot's on the d2h stream) and reuses a slot once its event says the
 * copy is done: path "staged". Pipes, sockets, terminals and O_APPEND files
 * are read or written in order by the worker through the same slots, polled
 * so that a stalled client cannot hold a cancel off: path "streamed". A
 * memfd sealed against shrinking may instead be mapped, registered with the
 * device and copied directly: path "registered" (asked for, or chosen for
 * transfers of --register-min bytes or more).
 *
 * Every path stores progress in work->progress_bytes/total at each chunk,
 * stops at the next chunk once work->cancel is set, and with
 * work->transfer.verify compares the checksum of the bytes that passed
 * through the host with the device's checksum of the range (protocol/hash.h).
 * A put or get's own parameters are work->transfer (transfer_spec.h).
 */
#ifndef GPUQ_TRANSFER_H
#define GPUQ_TRANSFER_H

#include "workers/backend/backend.h"
#include "workers/work.h"

/*
 * Descriptor -> device memory at work->dptr + work->transfer.offset. Reads
 * work->length bytes exactly when work->transfer.length_exact, else up to
 * work->length bytes and then requires end of file. Sets result.bytes/path
 * (and result.checksum with verify); 0 or -1 with work->error.
 */
int transfer_put(struct device *dev, struct work *work);

/* Device memory -> descriptor: work->length bytes from dptr + offset, in order. */
int transfer_get(struct device *dev, struct work *work);

/*
 * 0 when fd qualifies for path registered (a memfd sealed against
 * shrinking; for get also open for reading and writing, without O_APPEND),
 * else -1 with a bad_request saying why. Any thread; it never blocks.
 */
int transfer_check_registrable(int fd, bool put, struct gpuq_error *err);

#endif
