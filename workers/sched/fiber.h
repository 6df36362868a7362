/*
 * Fibers: cooperative execution contexts on one thread, so that a device's
 * worker thread can keep several jobs in flight while staying the only
 * thread that calls CUDA for its device (workers/sched/sched.c).
 *
 * A fiber runs a function on a stack of its own until the function calls
 * fiber_yield, which switches back to the thread's scheduler context; the
 * scheduler resumes it later with fiber_resume. A fiber is only ever resumed
 * on the thread that created it. Stacks are mmap'ed with a guard page below
 * them, so an overflow faults instead of corrupting a neighbour.
 *
 * Under AddressSanitizer and ThreadSanitizer every switch is announced to the
 * sanitizer (their fiber interfaces), so both keep working across switches.
 */
#ifndef GPUQ_FIBER_H
#define GPUQ_FIBER_H

#include <stdbool.h>
#include <stddef.h>

struct fiber;

typedef void (*fiber_fn)(void *arg);

/*
 * A fiber that will run fn(arg) when first resumed, on a stack of
 * stack_bytes (0: the default, FIBER_STACK_BYTES). NULL when the stack
 * cannot be mapped (errno says why).
 */
struct fiber *fiber_create(fiber_fn fn, void *arg, size_t stack_bytes);
/*
 * Reuses a finished fiber for another function: the stack stays mapped.
 * Only a fiber whose function has returned may be restarted.
 */
void fiber_restart(struct fiber *f, fiber_fn fn, void *arg);
/* Frees a fiber that is not running (never started, or finished). */
void fiber_destroy(struct fiber *f);

/*
 * From the scheduler (not a fiber): runs f until it yields or its function
 * returns. Returns true when the function has returned (the fiber is done).
 */
bool fiber_resume(struct fiber *f);
/* From inside a fiber: back to whoever resumed it. */
void fiber_yield(void);
/* The fiber running on this thread, or NULL in the scheduler's own context. */
struct fiber *fiber_current(void);

/* The default stack: generous, since CUDA, NCCL and libc calls run on it; pages are touched lazily. */
#define FIBER_STACK_BYTES ((size_t)1 << 20)

#endif
