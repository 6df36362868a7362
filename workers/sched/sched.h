/*
 * The per-GPU scheduler: what a device's worker thread does with the works
 * queued on it (workers/worker.c queues them).
 *
 * The worker thread stays the only thread that calls the backend for its
 * device, but it no longer runs one job to completion: it admits several
 * works at once, each on a fiber (workers/sched/fiber.h) with a lane of its own (a
 * stream: backend.h's lane_create), and resumes them in turn. A job that
 * must wait (for a DMA, a kernel, a copy thread, another device's part, a
 * staging slot, memory) yields with a predicate instead of blocking, and the
 * scheduler resumes it once the predicate holds, so that copies in both
 * directions and kernels of independent jobs are on the GPU's engines at
 * the same time.
 *
 * Admission (which queued work starts next) decides:
 *  - order where it matters: a work that touches a buffer range another,
 *    earlier, work also touches (one of them writing) waits until that work
 *    has issued all its device work (its "tail"); the later work's lane then
 *    waits for the earlier one's tail event on the device, with no host
 *    round trip. Works that cannot express that (gang parts, works using
 *    streams of their own) wait for the earlier work to finish;
 *  - gangs (collectives, peer copies): one gang part in flight per device,
 *    in submission order, so that gangs never cross on two devices;
 *  - exclusive works (benchmarks) run alone; chains (run, reduce_expr) one
 *    at a time, since the chain state they use is the device's;
 *  - priority: higher first; within a priority, owners in weighted fair
 *    share (the owner with the least device time per weight goes first),
 *    each owner's works in submission order;
 *  - at most `max_inflight` works in flight, which a work of higher
 *    priority than everything in flight may exceed up to twice.
 *
 * This header is the loop's, for the worker (workers/worker.c) and the
 * daemon: making and freeing a scheduler, running it, its figures. What a
 * job may call while it runs (the waits, slots, DMA turns...) is in
 * workers/sched/sched_wait.h, which this header includes. Calls go one way:
 * the loop (sched.c) runs the jobs (run_work, workers/work_kinds.c, through the table of job kinds), and the jobs
 * call down into the waits (sched_wait.c), which call neither.
 *
 * Threads: the scheduler's state belongs to its worker thread, except what
 * worker.c guards with the worker's lock (the queues, which the main thread
 * fills and empties) and sched_notify, which any thread may call.
 */
#ifndef GPUQ_SCHED_H
#define GPUQ_SCHED_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "workers/backend/backend.h"
#include "workers/sched/sched_engine.h"
#include "workers/sched/sched_hooks.h"
#include "workers/sched/sched_queue.h"
#include "workers/sched/sched_wait.h"
#include "workers/work.h"

struct worker;
struct fiber;


/* What the worker's snapshot carries of its scheduler (copied under the worker's lock). */
struct sched_stats {
	unsigned inflight;
	unsigned inflight_by_engine[SCHED_ENGINES];
	double busy_seconds[SCHED_ENGINES]; /* time with at least one such work in flight */
	unsigned max_inflight;
};

#define SCHED_DEFAULT_INFLIGHT 16
#define SCHED_MAX_INFLIGHT 256

struct sched;
/*
 * Worker thread, after the device opened: the scheduler of w's device
 * (NULL: out of memory), which calls w back through hooks (copied).
 */
struct sched *sched_create(struct worker *w, const struct sched_hooks *hooks,
			   unsigned max_inflight);
/*
 * Worker thread, before the device closes: frees the lanes and fibers. The
 * struct itself stays until sched_free (main thread, after the worker thread
 * has been joined), so that a late sched_notify from another thread never
 * touches freed memory.
 */
void sched_release(struct sched *s);
void sched_free(struct sched *s);
/* Worker thread, with nothing in flight: frees the lanes (a device reset makes new ones). */
void sched_drop_lanes(struct sched *s);
/*
 * Worker thread: admits and runs works until the worker is told to stop
 * and nothing is queued or in flight. The worker's lock must not be held.
 */
void sched_run(struct sched *s);
/* Any thread, under the worker's lock: the scheduler's figures. */
void sched_stats(struct sched *s, struct sched_stats *out);

#endif
