/*
 * gpuqd's configuration file: INI, parsed with inih. Section [gpuqd] (or no
 * section) sets any option the command line has, by its long name
 * (`queue-depth = 256`); sections [default], [user:NAME] and [group:NAME]
 * are quota rules (quota.h). The command line wins over the file.
 *
 * Errors are collected, each as "FILE:LINE: message", so that
 * gpuqd --check-config reports all of them at once. Main thread only.
 */
#ifndef GPUQ_CONFIG_H
#define GPUQ_CONFIG_H

#include <stdbool.h>

#include "daemon/options.h"
#include "daemon/quota.h"

#define CONFIG_MAX_ERRORS 32

struct config_report {
	int count; /* errors found; the first CONFIG_MAX_ERRORS are kept */
	char errors[CONFIG_MAX_ERRORS][640];
	bool file_read; /* a file was read (false: none at the default path) */
};

void config_error(struct config_report *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * Builds the configuration: defaults, then the file at cli->config_path
 * (which must exist if cli->config_given), then the command line again
 * (argv), then resolves the groups it names. Fills o and q (q starts empty;
 * the caller frees it) and returns the number of errors in r.
 */
int config_build(const struct options *cli, int argc, char **argv, struct options *o,
		 struct quota_set *q, struct config_report *r);

#endif
