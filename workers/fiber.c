/*
 * Fibers on ucontext (see fiber.h). One thread's fibers and its scheduler
 * context: `current` is the fiber running on this thread, NULL while the
 * scheduler runs. Only the thread that made a fiber switches to or from it.
 *
 * swapcontext also saves and restores the signal mask (one system call per
 * switch, well under a microsecond); jobs switch at chunk boundaries and
 * waits, so that cost is noise beside a DMA of a staging slot.
 */
#include "workers/fiber.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FIBER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define FIBER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FIBER_TSAN 1
#endif
#endif

#ifdef FIBER_ASAN
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
				     size_t *size_old);
#endif
#ifdef FIBER_TSAN
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
#endif

struct fiber {
	ucontext_t ctx;
	ucontext_t *back;  /* the scheduler's context while this fiber runs */
	fiber_fn fn;
	void *arg;
	bool done;
	void *map;          /* guard page + stack */
	size_t map_bytes;
	void *stack;
	size_t stack_bytes;
#ifdef FIBER_TSAN
	void *tsan_fiber, *tsan_back;
#endif
#ifdef FIBER_ASAN
	void *asan_fake_stack;          /* the scheduler's, saved while the fiber runs */
	const void *back_bottom;        /* the scheduler's stack, as ASan reported it */
	size_t back_size;
#endif
};

static _Thread_local struct fiber *current;

struct fiber *fiber_current(void)
{
	return current;
}

/* Entering the fiber (first time or after a yield): tell the sanitizers where we are. */
static void sanitizer_entered(struct fiber *f)
{
#ifdef FIBER_ASAN
	__sanitizer_finish_switch_fiber(NULL, &f->back_bottom, &f->back_size);
#else
	(void)f;
#endif
}

static void fiber_trampoline(void)
{
	struct fiber *f = current;
	sanitizer_entered(f);
	f->fn(f->arg);
	f->done = true;
#ifdef FIBER_ASAN
	/* The fiber's stack dies here: no fake stack to keep (NULL). */
	__sanitizer_start_switch_fiber(NULL, f->back_bottom, f->back_size);
#endif
#ifdef FIBER_TSAN
	__tsan_switch_to_fiber(f->tsan_back, 0);
#endif
	current = NULL;
	setcontext(f->back);
}

static void fiber_prepare(struct fiber *f, fiber_fn fn, void *arg)
{
	f->fn = fn;
	f->arg = arg;
	f->done = false;
	getcontext(&f->ctx);
	f->ctx.uc_stack.ss_sp = f->stack;
	f->ctx.uc_stack.ss_size = f->stack_bytes;
	f->ctx.uc_link = NULL;
	makecontext(&f->ctx, fiber_trampoline, 0);
}

struct fiber *fiber_create(fiber_fn fn, void *arg, size_t stack_bytes)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	if (stack_bytes == 0)
		stack_bytes = FIBER_STACK_BYTES;
#ifdef FIBER_ASAN
	stack_bytes *= 4; /* redzones and the instrumentation's frames */
#endif
	stack_bytes = (stack_bytes + page - 1) / page * page;
	struct fiber *f = calloc(1, sizeof *f);
	if (!f)
		return NULL;
	f->map_bytes = stack_bytes + page;
	f->map = mmap(NULL, f->map_bytes, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
	if (f->map == MAP_FAILED) {
		int e = errno;
		free(f);
		errno = e;
		return NULL;
	}
	if (mprotect(f->map, page, PROT_NONE) != 0) { /* the guard: stacks grow down */
		int e = errno;
		munmap(f->map, f->map_bytes);
		free(f);
		errno = e;
		return NULL;
	}
	f->stack = (char *)f->map + page;
	f->stack_bytes = stack_bytes;
#ifdef FIBER_TSAN
	f->tsan_fiber = __tsan_create_fiber(0);
#endif
	fiber_prepare(f, fn, arg);
	return f;
}

void fiber_restart(struct fiber *f, fiber_fn fn, void *arg)
{
	fiber_prepare(f, fn, arg);
}

void fiber_destroy(struct fiber *f)
{
	if (!f)
		return;
#ifdef FIBER_TSAN
	__tsan_destroy_fiber(f->tsan_fiber);
#endif
	munmap(f->map, f->map_bytes);
	free(f);
}

bool fiber_resume(struct fiber *f)
{
	ucontext_t here;
	f->back = &here;
	current = f;
#ifdef FIBER_TSAN
	f->tsan_back = __tsan_get_current_fiber();
	__tsan_switch_to_fiber(f->tsan_fiber, 0);
#endif
#ifdef FIBER_ASAN
	__sanitizer_start_switch_fiber(&f->asan_fake_stack, f->stack, f->stack_bytes);
#endif
	swapcontext(&here, &f->ctx);
#ifdef FIBER_ASAN
	__sanitizer_finish_switch_fiber(f->asan_fake_stack, NULL, NULL);
#endif
	current = NULL;
	return f->done;
}

void fiber_yield(void)
{
	struct fiber *f = current;
	if (!f)
		return;
#ifdef FIBER_ASAN
	void *fake = NULL;
	__sanitizer_start_switch_fiber(&fake, f->back_bottom, f->back_size);
#endif
#ifdef FIBER_TSAN
	__tsan_switch_to_fiber(f->tsan_back, 0);
#endif
	current = NULL;
	swapcontext(&f->ctx, f->back);
	/* Resumed: fiber_resume set current again. */
#ifdef FIBER_ASAN
	__sanitizer_finish_switch_fiber(fake, &f->back_bottom, &f->back_size);
#endif
}
