/*
 * copy_guarded (see copy_guard.h). One SIGBUS handler for the process,
 * installed on first use: on a thread that is inside copy_guarded it jumps
 * back there; anywhere else it restores the default action and returns, so
 * that the fault repeats and ends the process as it would have without us.
 */
#include "workers/transfer/copy_guard.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* volatile: the compiler must not drop the stores around memcpy, which it knows touches nothing else. */
static _Thread_local sigjmp_buf *volatile guard_env;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static uintptr_t page_mask; /* set once, under guard_once */

static void on_sigbus(int sig)
{
	if (guard_env)
		siglongjmp(*guard_env, 1);
	signal(sig, SIG_DFL);
}

static void guard_install(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_sigbus;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
	page_mask = (uintptr_t)sysconf(_SC_PAGESIZE) - 1;
}

/* The copy of copy_guarded and copy_guarded_store, populating first or not. */
static int guarded(void *dst, const void *src, size_t n, copy_store_fn store, int populate)
{
	sigjmp_buf env;
	pthread_once(&guard_once, guard_install);
	uintptr_t start = (uintptr_t)dst & ~page_mask;
	if (sigsetjmp(env, 1)) {
		guard_env = NULL;
		return EFAULT;
	}
	guard_env = &env;
	/*
	 * Where it fails (a kernel before 5.14, a page gone) the copy faults the
	 * pages in itself, and a page that is gone lands in on_sigbus.
	 */
	if (populate)
		(void)madvise((void *)start, (uintptr_t)dst + n - start, MADV_POPULATE_WRITE);
	store(dst, src, n);
	guard_env = NULL;
	return 0;
}

int copy_guarded(void *dst, const void *src, size_t n)
{
	return guarded(dst, src, n, copy_store_regular, 1);
}

int copy_guarded_store(void *dst, const void *src, size_t n, copy_store_fn store)
{
	return guarded(dst, src, n, store, 0);
}
