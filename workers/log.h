/*
 * gpuqd's log: one line per event on stderr, "gpuqd[pid]: level: message".
 * Any thread may log; each line is written with one call, so lines from
 * different threads do not interleave.
 */
#ifndef GPUQ_LOG_H
#define GPUQ_LOG_H

#include <stdbool.h>

enum log_level { LOG_LEVEL_ERROR, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* 0 and *out set for "error", "warn", "info", "debug"; -1 otherwise. */
int log_level_from_name(const char *name, enum log_level *out);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * A condition that can recur thousands of times a second (accept failing
 * at the descriptor limit) is logged through a log_every: one line per
 * `seconds` passes, and says how many were held back since the last. Each
 * struct belongs to one thread.
 */
struct log_every {
	double last;   /* when a line last passed; 0: never */
	unsigned held; /* lines held back since */
};
/* True when a line may be logged now; then *held is how many were held back before it. */
bool log_every_pass(struct log_every *e, double seconds, unsigned *held);

#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
