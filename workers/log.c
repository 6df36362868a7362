#include "workers/log.h"
#include "workers/clock.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static _Atomic int current_level = LOG_LEVEL_INFO;
static const char *const level_names[] = { "error", "warn", "info", "debug" };
/* syslog priorities: err, warning, info, debug */
static const int level_priorities[] = { 3, 4, 6, 7 };

/*
 * Whether stderr is the journal: systemd sets JOURNAL_STREAM to the
 * device and inode of the stream it connects, and a "<N>" prefix then gives
 * each line its priority (sd-daemon(3)). The journal records the pid and
 * the time, so the line carries neither.
 */
static pthread_once_t journal_once = PTHREAD_ONCE_INIT;
static bool to_journal;

static void detect_journal(void)
{
	const char *env = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	char tail;
	if (env && sscanf(env, "%llu:%llu%c", &dev, &ino, &tail) == 2 &&
	    fstat(STDERR_FILENO, &st) == 0 && (unsigned long long)st.st_dev == dev &&
	    (unsigned long long)st.st_ino == ino)
		to_journal = true;
}

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
	pthread_once(&journal_once, detect_journal);
	int n = to_journal ? snprintf(line, sizeof line, "<%d>%s: ", level_priorities[level],
				      level_names[level])
			   : snprintf(line, sizeof line, "gpuqd[%d]: %s: ", (int)getpid(),
				      level_names[level]);
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

bool log_every_pass(struct log_every *e, double seconds, unsigned *held)
{
	double now = monotonic_seconds();
	if (e->last > 0 && now - e->last < seconds) {
		e->held++;
		return false;
	}
	*held = e->held;
	e->held = 0;
	e->last = now;
	return true;
}
