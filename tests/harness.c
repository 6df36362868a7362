#include "tests/harness.h"

#include <errno.h>
#include <fcntl.h>
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
/* In a test's child: where harness_skip writes its reason for the parent. */
static int skip_fd = -1;

/*
 * Skipped tests, by reason: the run ends with one line per distinct reason
 * and its count ("skipped 190 tests: no cuda device: ..."), not one line
 * per test; the RESULT line still counts every test.
 */
#define HARNESS_SKIP_REASON 512
struct skip_reason {
	char text[HARNESS_SKIP_REASON];
	int count;
	const char *first; /* the first test skipped for it */
};
static struct skip_reason skip_reasons[HARNESS_MAX_TESTS];
static int nskip_reasons;

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
	char reason[HARNESS_SKIP_REASON];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(reason, sizeof reason, fmt, ap);
	va_end(ap);
	fflush(NULL);
	if (skip_fd < 0 || write(skip_fd, reason, strlen(reason)) < 0)
		fprintf(stderr, "    skipped: %s\n", reason);
	_exit(EXIT_SKIP);
}

/* Counts one skipped test under its reason (read from the child's pipe). */
static void skip_note(const char *name, int fd)
{
	char text[HARNESS_SKIP_REASON];
	size_t n = 0;
	ssize_t got;
	while (n < sizeof text - 1 && (got = read(fd, text + n, sizeof text - 1 - n)) != 0) {
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			break;
		n += (size_t)got;
	}
	text[n] = '\0';
	if (n == 0)
		snprintf(text, sizeof text, "(no reason given)");
	for (int i = 0; i < nskip_reasons; i++)
		if (strcmp(skip_reasons[i].text, text) == 0) {
			skip_reasons[i].count++;
			return;
		}
	struct skip_reason *r = &skip_reasons[nskip_reasons++];
	memcpy(r->text, text, n + 1);
	r->count = 1;
	r->first = name;
}

/* One line per reason: how many tests it skipped (the test, when only one). */
static void skip_summary(const char *tier)
{
	for (int i = 0; i < nskip_reasons; i++) {
		const struct skip_reason *r = &skip_reasons[i];
		if (r->count == 1)
			printf("skipped 1 test (%s/%s): %s\n", tier, r->first, r->text);
		else
			printf("skipped %d tests: %s\n", r->count, r->text);
	}
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

/*
 * Runs one test in a child; returns 0 passed, 1 failed, 2 skipped. A
 * skipped test's reason comes back through a pipe (its write end closes
 * with the child and whatever the child started, which are killed).
 */
static int run_one(const struct harness_test *t)
{
	int reason[2];
	if (pipe2(reason, O_CLOEXEC) < 0) {
		fprintf(stderr, "harness: pipe: %s\n", strerror(errno));
		return 1;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "harness: fork: %s\n", strerror(errno));
		close(reason[0]);
		close(reason[1]);
		return 1;
	}
	if (pid == 0) {
		setpgid(0, 0);
		close(reason[0]);
		skip_fd = reason[1];
		alarm(timeout_seconds);
		t->fn();
		fflush(NULL);
		_exit(0);
	}
	close(reason[1]);
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	kill(-pid, SIGKILL); /* whatever the test left running */
	int skipped = WIFEXITED(status) && WEXITSTATUS(status) == EXIT_SKIP;
	if (skipped)
		skip_note(t->name, reason[0]);
	close(reason[0]);
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	if (skipped)
		return 2;
	if (WIFSIGNALED(status))
		fprintf(stderr, "    killed by signal %d%s\n", WTERMSIG(status),
			WTERMSIG(status) == SIGALRM ? " (timed out)" : "");
	return 1;
}

int harness_main(const char *tier, int argc, char **argv)
{
	int counts[3] = { 0, 0, 0 };
	const char *verdict[3] = { "ok  ", "FAIL", "skip" }; /* skip: not printed */
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
		if (r != 2) /* skips: one line per reason at the end */
			printf("%s %s/%s (%.0f ms)\n", verdict[r], tier, tests[i].name, ms);
		fflush(stdout);
	}
	skip_summary(tier);
	printf("RESULT %s: %d passed, %d failed, %d skipped\n", tier, counts[0],
	       counts[1], counts[2]);
	return counts[1] ? 1 : 0;
}
