#include "tests/harness.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HARNESS_MAX_TESTS 512
#define EXIT_SKIP 77

struct harness_test {
	const char *name;
	const char *file;
	harness_fn fn;
};

static struct harness_test tests[HARNESS_MAX_TESTS];
static int ntests;
static unsigned timeout_seconds = 30;

void harness_register(const char *name, harness_fn fn, const char *file)
{
	if (ntests == HARNESS_MAX_TESTS) {
		fprintf(stderr, "harness: more than %d tests\n", HARNESS_MAX_TESTS);
		exit(2);
	}
	tests[ntests++] = (struct harness_test){ name, file, fn };
}

void harness_set_timeout(unsigned seconds)
{
	timeout_seconds = seconds;
}

void harness_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "    %s:%d: ", file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stderr);
	_exit(1);
}

void harness_skip(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "    skipped: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stderr);
	_exit(EXIT_SKIP);
}

static bool selected(const char *name, int argc, char **argv)
{
	if (argc <= 1)
		return true;
	for (int i = 1; i < argc; i++)
		if (strstr(name, argv[i]))
			return true;
	return false;
}

static int compare_tests(const void *a, const void *b)
{
	const struct harness_test *x = a, *y = b;
	int c = strcmp(x->file, y->file);
	return c ? c : strcmp(x->name, y->name);
}

/* Runs one test in a child; returns 0 passed, 1 failed, 2 skipped. */
static int run_one(const struct harness_test *t)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "harness: fork: %s\n", strerror(errno));
		return 1;
	}
	if (pid == 0) {
		setpgid(0, 0);
		alarm(timeout_seconds);
		t->fn();
		fflush(NULL);
		_exit(0);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	kill(-pid, SIGKILL); /* whatever the test left running */
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_SKIP)
		return 2;
	if (WIFSIGNALED(status))
		fprintf(stderr, "    killed by signal %d%s\n", WTERMSIG(status),
			WTERMSIG(status) == SIGALRM ? " (timed out)" : "");
	return 1;
}

int harness_main(const char *tier, int argc, char **argv)
{
	int counts[3] = { 0, 0, 0 };
	const char *verdict[3] = { "ok  ", "FAIL", "skip" };
	qsort(tests, (size_t)ntests, sizeof tests[0], compare_tests);
	for (int i = 0; i < ntests; i++) {
		if (!selected(tests[i].name, argc, argv))
			continue;
		struct timespec a, b;
		clock_gettime(CLOCK_MONOTONIC, &a);
		int r = run_one(&tests[i]);
		clock_gettime(CLOCK_MONOTONIC, &b);
		double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 +
			    (double)(b.tv_nsec - a.tv_nsec) / 1e6;
		counts[r]++;
		printf("%s %s/%s (%.0f ms)\n", verdict[r], tier, tests[i].name, ms);
		fflush(stdout);
	}
	printf("RESULT %s: %d passed, %d failed, %d skipped\n", tier, counts[0],
	       counts[1], counts[2]);
	return counts[1] ? 1 : 0;
}
