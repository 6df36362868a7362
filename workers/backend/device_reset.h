/*
 * Recovering a device without restarting gpuqd: after a sticky fault (an
 * illegal address, a kernel trap, an ECC error: the CUDA context is lost),
 * or when an administrator asks (gpuq reset-device). Because one worker
 * thread owns the device, it can do what a whole-process restart does, for
 * that device only, while the other devices keep serving:
 *
 *  1. the scheduler stops admitting; the jobs in flight end (a lost
 *     context fails every call, so they fail with device_error; an asked
 *     reset cancels them first);
 *  2. the device is marked unhealthy ("being reset"), so no job is queued;
 *  3. queued jobs that touch buffers fail (their memory is gone); the rest
 *     (noop, alloc) stay queued and run on the new context;
 *  4. the lanes, NCCL communicators (aborted), staging ring, pool and the
 *     backend's state are released, the device reset (cudaDeviceReset) and
 *     opened again;
 *  5. health is "ok" again, unless the device was reset more than
 *     reset_limit times within reset_window_s (then it stays unhealthy for
 *     an operator, who may ask for a reset);
 *  6. the main thread is told (the resets counter and the async handle): it
 *     marks the device's buffers lost, and other devices drop what they
 *     held of it (peer access, communicators) when they next go idle.
 *
 * A faulted context's slabs keep their descriptors through step 4
 * (dev->kept): when the driver gives the process no new context
 * (needs_restart), gpuqd re-executes itself and the new image takes those
 * buffers over intact; otherwise they are closed here and the buffers lost.
 *
 * Worker thread only, and only with no job in flight.
 */
#ifndef GPUQ_DEVICE_RESET_H
#define GPUQ_DEVICE_RESET_H

#include <stdbool.h>
#include <stddef.h>

struct device;
struct worker;
struct sched;

/* Whether w's device must be reset now: it faulted, or a reset was asked. */
bool device_reset_due(struct worker *w);
/* Resets w's device as above; 0 once it serves again, -1 when it stays unhealthy. */
int device_reset_run(struct worker *w, struct sched *s);
/* The health a device shows while it is reset for `cause` (the worker's and a snapshot's). */
void device_reset_health(char *health, size_t size, const char *cause);
/*
 * Closes the slab descriptors a faulted context left (dev->kept): its
 * buffers' memory goes. The worker calls it at its end; a reset, once the
 * device opens again or when no re-exec will take them.
 */
void device_close_kept(struct device *dev);

#endif
