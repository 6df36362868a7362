/*
 * What a job may ask of its device's scheduler (workers/sched/sched.h runs
 * the jobs): waits that yield the job's fiber instead of blocking the
 * worker thread, sleeps and pauses, staging slots, DMA turns, the memory
 * epoch, publishing the job's tail, and what the job running now is.
 *
 * Jobs (the runners of workers/work_kinds.h and the files they call) include this header;
 * backends do not name these functions but reach them through the table
 * in dev->waits (backend.h's struct device_waits, sched_device_waits
 * below). The functions here call nothing of the scheduler's loop
 * (sched.c) and no job: they only switch fibers (workers/sched/fiber.h)
 * and read and change the scheduler's state (sched_state.h).
 *
 * Threads: the worker thread of the device, on a job's fiber (outside a
 * job, waits poll on the calling thread), except sched_notify and
 * sched_notify_locked, which any thread may call.
 */
#ifndef GPUQ_SCHED_WAIT_H
#define GPUQ_SCHED_WAIT_H

#include <stdbool.h>
#include <stdint.h>

#include "workers/backend/backend.h"
#include "workers/sched/sched_queue.h"

struct sched;

/* The hooks the backends wait and notify through: set in every struct device before it opens. */
extern const struct device_waits sched_device_waits;

/* The scheduler of the calling worker thread; NULL on other threads. */
struct sched *sched_self(void);
/* The priority of the job running on this thread (enum gpuq_priority); normal outside jobs. */
int sched_current_priority(void);
/* True on a job's fiber (waits yield); false on the worker's own stack or elsewhere (waits poll). */
bool sched_in_job(void);
/*
 * Yields until ready(arg) is true. The scheduler evaluates ready itself, so
 * a waiting job costs no switch. sched_wait_device is for what the device
 * will finish by itself soon (an event, a DMA): while a job waits so, the
 * worker keeps polling. sched_wait_host is for what other threads finish
 * and announce with sched_notify (a copy thread's task, another device's
 * part, memory released), or what may take long: the worker may sleep
 * meanwhile, re-checking every few milliseconds. `why` is what `jobs`
 * shows while it waits (SCHED_NOT_WAITING: nothing to say). Outside a job
 * both poll on the calling thread. ready must become true eventually
 * (include the job's cancel flag where the wait could last).
 */
void sched_wait_device(bool (*ready)(void *arg), void *arg);
void sched_wait_host(bool (*ready)(void *arg), void *arg, enum sched_wait why);
/*
 * Sleeps for about `seconds` without holding up other jobs (a job yields; the
 * worker may sleep if nothing else moves). Outside a job: nanosleep.
 */
void sched_sleep(double seconds);
/* Yields once after issuing work, so that other jobs (and admissions) get their turn. */
void sched_checkpoint(void);
/* Yields once without having done anything: for loops that poll what no predicate can say. */
void sched_pause(void);
/*
 * The job has issued all the device work it will issue on its lane: later
 * works on its buffers may start and wait for it on the device. Jobs that
 * never say so are waited for until they finish.
 */
void sched_publish_tail(struct device *dev);
/*
 * Whether the running job is its device's only business now: nothing else
 * in flight, nothing queued that might start, no notification pending.
 * It may then block in a system call for a millisecond or so (a
 * submission waits that long at most). False outside jobs.
 */
bool sched_alone(void);
/* The job running on dev's worker now, or NULL (outside jobs, or another thread). */
struct sched_job;
struct sched_job *sched_running_job(struct device *dev);
/*
 * Any thread: something a job of s may be waiting for has happened (a
 * copy thread finished a task, another device's part published something).
 * Ends the scheduler's idle sleep. s may be NULL.
 */
void sched_notify(struct sched *s);
/* The same with the worker's lock already held. */
void sched_notify_locked(struct sched *s);

/*
 * Staging slots, shared by the jobs in flight on a device. acquire takes a
 * free slot for the calling job: with wait, it yields until one is free and
 * the job's turn (higher priority first; no job holds more than its share
 * while others wait); without wait it returns -1 at once when it cannot.
 * release gives one back (its DMA must be complete).
 */
int sched_slot_acquire(struct device *dev, bool wait, unsigned *slot);
void sched_slot_release(struct device *dev, unsigned slot);

/*
 * DMA turns. A GPU's copy engine runs the copies queued on it in the order
 * they were queued, whatever their streams and priorities, and may keep to
 * one stream while it has copies queued. So the transfers of a device
 * (staged, streamed, rings, and from pinned memory) take turns at queueing
 * theirs: at most SCHED_DMA_QUEUE staging
 * slots' worth of bytes queued per direction on the device (and no more
 * than that many of the default 2 MiB slots hold); a job queues
 * one beside another job's queued DMAs only when it has none queued itself
 * (so a stream that keeps its queue full never shuts out another's copy);
 * and a job waiting for a turn outranks the jobs that are not, by priority,
 * then whichever took its last turn earlier. A small or urgent job's DMA
 * thus waits behind about SCHED_DMA_QUEUE slots' worth of bytes (or one
 * DMA of a region's, if that is larger), whatever is running.
 *
 * A job that has had the device to itself for SCHED_DMA_ALONE_S may queue
 * up to SCHED_DMA_QUEUE_ALONE slots' worth: a get into page cache went faster with more
 * DMAs queued ahead of its writes (docs/PERFORMANCE.md, "DMA turns", has
 * the H200's figures), and no one waited behind them. The first job to
 * come after such a stretch waits behind up to that many chunks once; from
 * then on the device is shared and the queue is SCHED_DMA_QUEUE again.
 *
 * sched_dma_turn (job: sched_running_job's; NULL outside jobs, when every
 * turn is given): whether job may queue a DMA in dir now; if not,
 * it counts as waiting for a turn until it queues one or leaves. A
 * predicate may call it (worker thread). sched_dma_queued: the job queued a
 * DMA through slot; it is done when the slot's DMA is ready or the slot is
 * released; it counts as a whole slot's bytes. sched_dma_own: the job has
 * DMAs of `bytes` in all queued in dir on its own lane that go through no
 * staging slot (a ring's, through the client's region), which it counts
 * itself as they end; they take turns as slot DMAs do, and are forgotten
 * when the job ends. sched_dma_leave: the job queues no more
 * (it waits for no turn). sched_dma_alone: whether the job has the device
 * to itself (the queue of SCHED_DMA_QUEUE_ALONE): a DMA it queues on a
 * turn may then span several slots (a slot DMA per slot would hold it
 * below the copy engine's rate), since no one waits behind it.
 */
#define SCHED_DMA_QUEUE 6
#define SCHED_DMA_QUEUE_ALONE 16
#define SCHED_DMA_QUEUE_MAX_BYTES (SCHED_DMA_QUEUE * (2ull << 20))
#define SCHED_DMA_QUEUE_ALONE_MAX_BYTES (SCHED_DMA_QUEUE_ALONE * (2ull << 20))
#define SCHED_DMA_ALONE_S 0.1
enum sched_dma { SCHED_DMA_H2D, SCHED_DMA_D2H, SCHED_DMA_DIRS };
bool sched_dma_turn(struct sched_job *job, enum sched_dma dir);
void sched_dma_queued(struct sched_job *job, unsigned slot, enum sched_dma dir);
void sched_dma_own(struct sched_job *job, enum sched_dma dir, uint64_t bytes);
void sched_dma_leave(struct sched_job *job);
bool sched_dma_alone(const struct sched_job *job);

/* Device memory was released on the device: jobs waiting for memory try again. */
void sched_memory_released(struct device *dev);
/* A counter that changes whenever memory is released (for memory-wait predicates). */
uint64_t sched_memory_epoch(struct device *dev);

#endif
