/*
 * Fibers (see fiber.h). One thread's fibers and its scheduler context:
 * `current` is the fiber running on this thread, NULL while the scheduler
 * runs. Only the thread that made a fiber switches to or from it.
 *
 * On x86-64 a switch is a few instructions of our own (context_switch
 * below): it saves what the ABI says a call preserves, swaps stack
 * pointers and returns on the other stack. ucontext's swapcontext, used on
 * other machines, also saves and restores the signal mask, a system call
 * at every switch: two per wait of a job, three per job started, which an
 * all-reduce of a few bytes (a few microseconds of device time) felt.
 * Fibers never change the signal mask, so they need not carry one.
 */
#include "workers/sched/fiber.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
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

/* ---- the switch itself ---- */

#if defined(__x86_64__)
/*
 * A context is the stack pointer it was left at; its stack holds, from that
 * address up, MXCSR and the x87 control word (8 bytes), r15, r14, r13, r12,
 * rbx, rbp and the address to return to. gpuq_fiber_switch(save, to) pushes
 * those, stores the stack pointer in *save, loads `to` and pops the other
 * context's: it returns into whatever that context was doing.
 */
typedef void *fiber_context;
void gpuq_fiber_switch(fiber_context *save, fiber_context to);
__asm__(".text\n"
	".p2align 4\n"
	".globl gpuq_fiber_switch\n"
	".hidden gpuq_fiber_switch\n"
	".type gpuq_fiber_switch, @function\n"
	"gpuq_fiber_switch:\n"
	"	pushq %rbp\n"
	"	pushq %rbx\n"
	"	pushq %r12\n"
	"	pushq %r13\n"
	"	pushq %r14\n"
	"	pushq %r15\n"
	"	subq $8, %rsp\n"
	"	stmxcsr (%rsp)\n"
	"	fnstcw 4(%rsp)\n"
	"	movq %rsp, (%rdi)\n"
	"	movq %rsi, %rsp\n"
	"	ldmxcsr (%rsp)\n"
	"	fldcw 4(%rsp)\n"
	"	addq $8, %rsp\n"
	"	popq %r15\n"
	"	popq %r14\n"
	"	popq %r13\n"
	"	popq %r12\n"
	"	popq %rbx\n"
	"	popq %rbp\n"
	"	ret\n"
	".size gpuq_fiber_switch, .-gpuq_fiber_switch\n");

static void context_switch(fiber_context *save, fiber_context *to)
{
	gpuq_fiber_switch(save, *to);
}

/*
 * A context that starts entry() on the stack [stack, stack + bytes): the
 * frame gpuq_fiber_switch pops, returning into entry as if it had been
 * called (the stack pointer 8 past a 16-byte boundary), with a null return
 * address above it for debuggers' backtraces. entry must never return.
 */
static void context_make(fiber_context *ctx, void *stack, size_t bytes, void (*entry)(void))
{
	uintptr_t top = ((uintptr_t)stack + bytes) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)(top - 16);
	sp[1] = 0;                         /* entry's own return address: none */
	sp[0] = (uint64_t)(uintptr_t)entry; /* where gpuq_fiber_switch returns */
	sp -= 7;                           /* rbp, rbx, r12-r15: zero */
	for (int i = 1; i < 7; i++)
		sp[i] = 0;
	uint32_t mxcsr;
	uint16_t fpu_cw;
	__asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
	__asm__ volatile("fnstcw %0" : "=m"(fpu_cw));
	sp[0] = (uint64_t)mxcsr | (uint64_t)fpu_cw << 32; /* the creating thread's modes */
	*ctx = sp;
}
#else
typedef ucontext_t fiber_context;

static void context_switch(fiber_context *save, fiber_context *to)
{
	swapcontext(save, to);
}

static void context_make(fiber_context *ctx, void *stack, size_t bytes, void (*entry)(void))
{
	getcontext(ctx);
	ctx->uc_stack.ss_sp = stack;
	ctx->uc_stack.ss_size = bytes;
	ctx->uc_link = NULL;
	makecontext(ctx, entry, 0);
}
#endif

struct fiber {
	fiber_context ctx;
	fiber_context *back;  /* the scheduler's context while this fiber runs */
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
	context_switch(&f->ctx, f->back); /* for good: a restart makes a new context */
}

static void fiber_prepare(struct fiber *f, fiber_fn fn, void *arg)
{
	f->fn = fn;
	f->arg = arg;
	f->done = false;
	context_make(&f->ctx, f->stack, f->stack_bytes, fiber_trampoline);
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
	fiber_context here;
	f->back = &here;
	current = f;
#ifdef FIBER_TSAN
	f->tsan_back = __tsan_get_current_fiber();
	__tsan_switch_to_fiber(f->tsan_fiber, 0);
#endif
#ifdef FIBER_ASAN
	__sanitizer_start_switch_fiber(&f->asan_fake_stack, f->stack, f->stack_bytes);
#endif
	context_switch(&here, &f->ctx);
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
	context_switch(&f->ctx, f->back);
	/* Resumed: fiber_resume set current again. */
#ifdef FIBER_ASAN
	__sanitizer_finish_switch_fiber(fake, &f->back_bottom, &f->back_size);
#endif
}
