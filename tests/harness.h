/*
 * A small test harness shared by the unit and integration tiers.
 *
 * TEST(name) { ... } registers a test at load time. harness_main runs each
 * in a forked child under a timeout, so a crash or a hang fails one test and
 * not the run, and prints one line per test that passed or failed, one
 * line per distinct reason for skipping with its count
 * ("skipped 190 tests: no cuda device: ..."), and a closing summary:
 *   "RESULT <tier>: N passed, N failed, N skipped"
 * which tests/run.sh adds up. Arguments select tests by substring.
 */
#ifndef GPUQ_TEST_HARNESS_H
#define GPUQ_TEST_HARNESS_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef void (*harness_fn)(void);

void harness_register(const char *name, harness_fn fn, const char *file);
int harness_main(const char *tier, int argc, char **argv);
/* Per-test timeout in seconds (default 30). */
void harness_set_timeout(unsigned seconds);

_Noreturn void harness_fail(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
_Noreturn void harness_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define TEST(name)                                                             \
	static void test_##name(void);                                         \
	__attribute__((constructor)) static void register_##name(void)         \
	{                                                                      \
		harness_register(#name, test_##name, __FILE__);                \
	}                                                                      \
	static void test_##name(void)

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond))                                                   \
			harness_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);  \
	} while (0)

#define CHECKF(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond))                                                   \
			harness_fail(__FILE__, __LINE__, __VA_ARGS__);         \
	} while (0)

#define CHECK_EQ(a, b)                                                         \
	do {                                                                   \
		uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);               \
		if (a_ != b_)                                                  \
			harness_fail(__FILE__, __LINE__,                       \
				     "%s == %s: %" PRIu64 " != %" PRIu64, #a,  \
				     #b, a_, b_);                              \
	} while (0)

#define CHECK_STR(a, b)                                                        \
	do {                                                                   \
		const char *a_ = (a), *b_ = (b);                               \
		if (!a_ || !b_ || strcmp(a_, b_) != 0)                         \
			harness_fail(__FILE__, __LINE__,                       \
				     "%s == %s: \"%s\" != \"%s\"", #a, #b,     \
				     a_ ? a_ : "(null)", b_ ? b_ : "(null)"); \
	} while (0)

#define SKIP(...) harness_skip(__VA_ARGS__)

#endif
