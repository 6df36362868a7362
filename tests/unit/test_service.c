/*
 * Unit tests for the service pieces that need no daemon: the configuration
 * file (config.c), quota rule syntax (quota.c), option names for files
 * (options.c) and the deadline scan behind the watchdog (service.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/job.h"
#include "daemon/service.h"
#include "tests/harness.h"
#include "workers/clock.h"

static char *write_config(const char *text)
{
	static char path[64];
	snprintf(path, sizeof path, "/tmp/gpuq-unit-conf-XXXXXX");
	int fd = mkstemp(path);
	CHECK(fd >= 0);
	CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
	return path;
}

/* Builds the configuration from text with the given command line after "gpuqd". */
static int build(const char *text, struct options *o, struct quota_set *q,
		 struct config_report *r, char **extra)
{
	char *argv[8] = { "gpuqd" };
	int argc = 1;
	for (; extra && extra[argc - 1]; argc++)
		argv[argc] = extra[argc - 1];
	struct options cli;
	options_defaults(&cli);
	snprintf(cli.config_path, sizeof cli.config_path, "%s", write_config(text));
	cli.config_given = true;
	int n = config_build(&cli, argc, argv, o, q, r);
	unlink(cli.config_path);
	return n;
}

static bool has_error(const struct config_report *r, const char *needle)
{
	for (int i = 0; i < r->count && i < CONFIG_MAX_ERRORS; i++)
		if (strstr(r->errors[i], needle))
			return true;
	return false;
}

TEST(config_sets_options_and_rules)
{
	static struct config_report r;
	struct options o;
	struct quota_set q;
	int n = build("# a comment\n"
		      "[gpuqd]\n"
		      "queue-depth = 64\n"
		      "log-level = debug ; inline comment\n"
		      "job-deadline = 600\n"
		      "\n"
		      "[default]\n"
		      "device-memory = 1G\n"
		      "[user:0]\n"
		      "queued-jobs = 3\n"
		      "devices = 0,2-3\n"
		      "benchmarks = yes\n",
		      &o, &q, &r, NULL);
	CHECKF(n == 0, "errors: %s", r.errors[0]);
	CHECK(r.file_read);
	CHECK_EQ(o.queue_depth, 64);
	CHECK_EQ(o.log_level, LOG_LEVEL_DEBUG);
	CHECK_EQ(o.job_deadline_s, 600);
	CHECK_EQ(q.count, 2);
	CHECK(q.rules[0].scope == QUOTA_DEFAULT && q.rules[0].has_memory);
	CHECK_EQ(q.rules[0].device_memory, 1ull << 30);
	CHECK(q.rules[1].scope == QUOTA_USER && q.rules[1].id == 0);
	CHECK_EQ(q.rules[1].queued_jobs, 3);
	CHECK_EQ(q.rules[1].devices, 0xd);
	CHECK(q.rules[1].has_benchmarks && q.rules[1].benchmarks);
	CHECK(!q.rules[0].has_benchmarks);
	CHECK(strstr(q.rules[1].where, ":9") != NULL); /* the section's line */
	quota_set_free(&q);
}

TEST(config_command_line_wins)
{
	static struct config_report r;
	struct options o;
	struct quota_set q;
	char *extra[] = { "--queue-depth", "7", NULL };
	CHECK_EQ(build("queue-depth = 64\njob-history = 5\n", &o, &q, &r, extra), 0);
	CHECK_EQ(o.queue_depth, 7);
	CHECK_EQ(o.job_history, 5);
	quota_set_free(&q);
}

TEST(config_reports_every_error_with_its_line)
{
	static struct config_report r;
	struct options o;
	struct quota_set q;
	int n = build("[gpuqd]\n"
		      "queue-dpth = 64\n"                 /* 2: unknown option */
		      "queue-depth = lots\n"              /* 3: bad value */
		      "probe = yes\n"                     /* 4: command line only */
		      "[user:no-such-user-gpuq]\n"        /* 5: unknown user */
		      "queued-jobs = 1\n"
		      "[group:0]\n"
		      "device-memory = big\n"             /* 8: bad size */
		      "colour = blue\n"                   /* 9: unknown limit */
		      "[frobs]\n"                         /* 10: unknown section */
		      "a = b\n"
		      "this line has no equals sign\n"    /* 12: syntax */
		      "[default]\n"
		      "benchmarks = maybe\n",             /* 14: yes or no */
		      &o, &q, &r, NULL);
	CHECKF(n == 9, "%d errors, first: %s", n, r.errors[0]);
	CHECK(has_error(&r, ":2: unknown option 'queue-dpth'"));
	CHECK(has_error(&r, ":3: queue-depth takes"));
	CHECK(has_error(&r, ":4: unknown option 'probe'"));
	CHECK(has_error(&r, ":5: [user:no-such-user-gpuq]: no user named"));
	CHECK(has_error(&r, ":8: device-memory takes a size"));
	CHECK(has_error(&r, ":9: unknown limit 'colour'"));
	CHECK(has_error(&r, ":10: unknown section [frobs]"));
	CHECK(has_error(&r, ":12: syntax error"));
	CHECK(has_error(&r, ":14: benchmarks takes yes or no, not 'maybe'"));
	quota_set_free(&q);
}

TEST(config_missing_file)
{
	static struct config_report r;
	struct options cli, o;
	struct quota_set q;
	char *argv[] = { "gpuqd", NULL };
	options_defaults(&cli);
	snprintf(cli.config_path, sizeof cli.config_path, "/nonexistent/gpuqd.conf");
	CHECK_EQ(config_build(&cli, 1, argv, &o, &q, &r), 0); /* the default path may be absent */
	CHECK(!r.file_read);
	cli.config_given = true;
	CHECK_EQ(config_build(&cli, 1, argv, &o, &q, &r), 1); /* a named one may not */
	CHECK(has_error(&r, "/nonexistent/gpuqd.conf: No such file"));
}

TEST(config_unknown_groups)
{
	static struct config_report r;
	struct options o;
	struct quota_set q;
	CHECK_EQ(build("admin-group = no-such-group-gpuq\n", &o, &q, &r, NULL), 1);
	CHECK(has_error(&r, ":1: admin-group: no group named 'no-such-group-gpuq'"));
	char *extra[] = { "--admin-group", "root", NULL };
	CHECK_EQ(build("admin-group = no-such-group-gpuq\n", &o, &q, &r, extra), 0);
	CHECK(q.has_admin && q.admin_gid == 0);
}

TEST(options_set_by_name)
{
	struct options o;
	char msg[256];
	options_defaults(&o);
	CHECK_EQ(options_set(&o, "spin", "10", msg, sizeof msg), 0);
	CHECK_EQ(o.spin_us, 10);
	CHECK_EQ(options_set(&o, "spin", "x", msg, sizeof msg), -1);
	CHECKF(strncmp(msg, "spin takes", 10) == 0, "message: %s", msg);
	CHECK_EQ(options_set(&o, "config", "/x", msg, sizeof msg), -2);
	CHECK_EQ(options_set(&o, "nope", "1", msg, sizeof msg), -2);
	CHECK(strstr(options_names(), "queue-depth") && !strstr(options_names(), "check-config"));
}

TEST(quota_devices_text)
{
	char buf[64];
	CHECK_STR(quota_devices_text(0, buf, sizeof buf), "none");
	CHECK_STR(quota_devices_text(0xd, buf, sizeof buf), "0,2-3");
	CHECK_STR(quota_devices_text(1ull << 63, buf, sizeof buf), "63");
	CHECK_STR(quota_devices_text(UINT64_MAX, buf, sizeof buf), "0-63");
}

/* A job in the table that a worker has been running since `ago` seconds. */
static struct job *running_job(struct job_table *t, double ago)
{
	static const struct job_kind kind = { "put", NULL, NULL };
	struct job *j = job_create(t, &kind, 1000, 1000, 1);
	CHECK(j);
	j->work.device = 0;
	j->work.started_at = monotonic_seconds() - ago;
	atomic_store(&j->work.phase, WORK_RUNNING);
	return j;
}

TEST(deadline_scan_cancels_then_finds_stuck_workers)
{
	static struct job_table t;
	struct deadline_scan scan;
	job_table_init(&t, 100);
	struct job *young = running_job(&t, 5);
	struct job *late = running_job(&t, 15);
	struct job *stuck = running_job(&t, 50);
	struct job *queued = running_job(&t, 100);
	atomic_store(&queued->work.phase, WORK_QUEUED);

	service_scan_deadlines(&t, monotonic_seconds(), 0, 30, &scan); /* no deadline: nothing */
	CHECK_EQ(scan.over, 0);
	CHECK(!atomic_load(&late->work.cancel));

	service_scan_deadlines(&t, monotonic_seconds(), 10, 30, &scan);
	CHECK_EQ(scan.over, 2);
	CHECK_EQ(scan.cancelled, 2);
	CHECK_EQ(scan.stuck, 1);
	CHECK(scan.stuck_job == stuck);
	CHECK(!atomic_load(&young->work.cancel));
	CHECK(atomic_load(&late->work.cancel) && atomic_load(&stuck->work.cancel));
	CHECK(!atomic_load(&queued->work.cancel));

	/* Asked once: a second scan cancels nothing new but still sees the stuck one. */
	service_scan_deadlines(&t, monotonic_seconds(), 10, 30, &scan);
	CHECK_EQ(scan.cancelled, 0);
	CHECK_EQ(scan.stuck, 1);
	job_table_destroy(&t);
}
