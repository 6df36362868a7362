#include "daemon/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static _Atomic int current_level = LOG_LEVEL_INFO;
static const char *const level_names[] = { "error", "warn", "info", "debug" };

void log_set_level(enum log_level level)
{
	atomic_store(&current_level, (int)level);
}

enum log_level log_get_level(void)
{
	return (enum log_level)atomic_load(&current_level);
}

int log_level_from_name(const char *name, enum log_level *out)
{
	for (int i = 0; i <= LOG_LEVEL_DEBUG; i++) {
		if (strcmp(name, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -1;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	if ((int)level > atomic_load(&current_level))
		return;
	char line[2048];
	int n = snprintf(line, sizeof line, "gpuqd[%d]: %s: ", (int)getpid(), level_names[level]);
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof line - 2)
		len = sizeof line - 2;
	line[len++] = '\n';
	/* One write per line: concurrent loggers never interleave within a line. */
	ssize_t ignored = write(STDERR_FILENO, line, len);
	(void)ignored;
}
