/*
 * gpuqd as a service: quotas and rights (as other uids, so root only),
 * metrics, configuration reload on SIGHUP, job deadlines and the log line
 * of each finished job. The systemd protocols themselves (socket
 * activation, notification, watchdog) are tested by tests/service.sh.
 */
#include <errno.h>
#include <grp.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/chain_util.h"
#include "tests/integration/fixture.h"

static struct gpuq_reply *alloc(struct gpuq_client *c, const char *name, int device, uint64_t bytes)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "device", (uint64_t)device);
	mp_put_u64(&req, "bytes", bytes);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

static struct gpuq_reply *simple(struct gpuq_client *c, const char *op)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	return call(c, &req, NULL, 0);
}

static struct gpuq_reply *on_job(struct gpuq_client *c, const char *op, uint64_t job)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_u64(&req, "job", job);
	if (strcmp(op, "wait") == 0)
		mp_put_u64(&req, "timeout_ms", 10000);
	return call(c, &req, NULL, 0);
}

static uint64_t noop_on(struct gpuq_client *c, int device, enum gpuq_errc want, const char *contains)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "noop");
	mp_put_u64(&req, "device", (uint64_t)device);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	uint64_t id = 0;
	if (want == GPUQ_OK) {
		expect_ok(r, "noop");
		id = reply_u64(r, "job.job");
	} else {
		expect_error(r, want, contains);
	}
	gpuq_reply_free(r);
	return id;
}

/* The metrics text (a fresh malloc'd string). */
static char *metrics_text(struct gpuq_client *c)
{
	struct gpuq_reply *r = simple(c, "metrics");
	expect_ok(r, "metrics");
	const msgpack_object *t = reply_path(r, "text");
	CHECK(t && t->type == MSGPACK_OBJECT_STR);
	char *s = strndup(t->via.str.ptr, t->via.str.size);
	gpuq_reply_free(r);
	return s;
}

static void expect_metric(const char *text, const char *line)
{
	CHECKF(strstr(text, line), "metrics lack \"%s\"", line);
}

/* Polls the metrics until line appears (a reload or a deadline takes a moment). */
static void await_metric(struct gpuq_client *c, const char *line)
{
	for (int i = 0; i < 500; i++) {
		char *t = metrics_text(c);
		bool found = strstr(t, line) != NULL;
		free(t);
		if (found)
			return;
		usleep(10000);
	}
	harness_fail(__FILE__, __LINE__, "metrics never showed \"%s\"", line);
}

struct quota_args {
	const struct daemon_proc *d;
};

/* nobody, no other group: the [default] rule. */
static void default_rule_limits_memory(void *arg)
{
	const struct quota_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_reply *r = alloc(c, "a", 0, 48 << 10);
	expect_ok(r, "alloc within the quota");
	gpuq_reply_free(r);
	r = alloc(c, "b", 0, 16 << 10); /* exactly the limit */
	expect_ok(r, "alloc up to the quota");
	gpuq_reply_free(r);
	r = alloc(c, "c", 0, 1);
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "quota [default]");
	gpuq_reply_free(r);
	r = alloc(c, "c", 1, 4096); /* per device: device 1 is empty */
	expect_ok(r, "alloc on another device");
	gpuq_reply_free(r);
	gpuq_close(c);
}

/* In group 4242: devices 1 only, two jobs at once. */
static void group_rule_limits_devices_and_jobs(void *arg)
{
	const struct quota_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_reply *r = alloc(c, "w", 0, 64);
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "quota [group:4242]");
	gpuq_reply_free(r);
	noop_on(c, 0, GPUQ_E_PERMISSION_DENIED, "allows uid 65534 devices 1, not device 0");
	r = alloc(c, "w", 1, 64);
	expect_ok(r, "alloc on an allowed device");
	gpuq_reply_free(r);
	int p[2];
	uint64_t put = start_stalled_put(c, "w@1", p);
	uint64_t queued = noop_on(c, 1, GPUQ_OK, NULL);
	noop_on(c, 1, GPUQ_E_PERMISSION_DENIED, "queued-jobs 2 reached");
	close(p[1]); /* the put ends (short), the noop runs: room again */
	gpuq_reply_free(on_job(c, "wait", put));
	gpuq_reply_free(on_job(c, "wait", queued));
	noop_on(c, 1, GPUQ_OK, NULL);
	gpuq_close(c);
}

/* uid 65533 in group 4242: its user rule's memory limit, the group's devices. */
static void user_rule_wins_for_what_it_sets(void *arg)
{
	const struct quota_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_reply *r = alloc(c, "big", 1, 512 << 10);
	expect_ok(r, "alloc under the user rule");
	gpuq_reply_free(r);
	r = alloc(c, "more", 1, 600 << 10);
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "quota [user:65533]");
	gpuq_reply_free(r);
	noop_on(c, 0, GPUQ_E_PERMISSION_DENIED, "[group:4242]");
	gpuq_close(c);
}

TEST(quotas_by_default_group_and_user)
{
	struct daemon_proc d;
	start_with_config(&d,
			  "[default]\n"
			  "device-memory = 64K\n"
			  "\n"
			  "[group:4242]\n"
			  "devices = 1\n"
			  "queued-jobs = 2\n"
			  "\n"
			  "[user:65533]\n"
			  "device-memory = 1M\n",
			  "--max-inflight=1"); /* the noop queues behind the stalled put */
	struct gpuq_client *probe = client_open(&d);
	if (device_count(probe) < 2)
		SKIP("the rules under test name device 1 (the host backend has it; this machine has one GPU)");
	gpuq_close(probe);
	struct quota_args a = { &d };
	gid_t g4242 = 4242;
	as_user(65534, NULL, 0, default_rule_limits_memory, &a);
	as_user(65534, &g4242, 1, group_rule_limits_devices_and_jobs, &a);
	as_user(65533, &g4242, 1, user_rule_wins_for_what_it_sets, &a);
	struct gpuq_client *root = client_open(&d); /* root is never limited */
	struct gpuq_reply *r = alloc(root, "huge", 0, 4 << 20);
	expect_ok(r, "root's alloc");
	gpuq_reply_free(r);
	char *t = metrics_text(root);
	expect_metric(t, "gpuq_quota_refusals_total{limit=\"device-memory\"} 2\n");
	expect_metric(t, "gpuq_quota_refusals_total{limit=\"devices\"} 3\n");
	expect_metric(t, "gpuq_quota_refusals_total{limit=\"queued-jobs\"} 1\n");
	free(t);
	gpuq_close(root);
	daemon_stop(&d);
}

static struct gpuq_reply *quota_of(struct gpuq_client *c, int64_t uid)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "quota");
	if (uid >= 0)
		mp_put_u64(&req, "uid", (uint64_t)uid);
	return call(c, &req, NULL, 0);
}

static bool reply_nil(const struct gpuq_reply *r, const char *path)
{
	const msgpack_object *o = reply_path(r, path);
	return o && o->type == MSGPACK_OBJECT_NIL;
}

/* uid 65534 sees its rules' limits and its alloc, and no one else's quota. */
static void quota_shows_own_limits_and_usage(void *arg)
{
	const struct quota_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_reply *r = alloc(c, "q", 0, 256 << 10);
	expect_ok(r, "alloc");
	gpuq_reply_free(r);
	r = quota_of(c, -1);
	expect_ok(r, "quota");
	CHECK_EQ(reply_path(r, "users")->via.array.size, 1u);
	CHECK_EQ(reply_u64(r, "users.0.uid"), 65534u);
	CHECK_EQ(reply_u64(r, "users.0.limits.device_memory"), 1u << 20); /* [default] */
	CHECK_EQ(reply_u64(r, "users.0.limits.queued_jobs"), 3u);
	CHECK_EQ(reply_u64(r, "users.0.limits.connections"), 7u); /* its user rule */
	CHECK_EQ(reply_u64(r, "users.0.limits.parked_fds"), 256u); /* the built-in default */
	CHECK(reply_nil(r, "users.0.limits.host_pinned"));       /* no rule: unlimited */
	CHECK(reply_nil(r, "users.0.limits.reply_bytes"));       /* set to unlimited */
	char prio[16];
	reply_str(r, "users.0.limits.max_priority", prio, sizeof prio);
	CHECK(strcmp(prio, "normal") == 0);
	CHECK_EQ(reply_u64(r, "users.0.used.device_memory.0"), 256u << 10);
	CHECK_EQ(reply_u64(r, "users.0.used.device_memory.1"), 0u);
	CHECK_EQ(reply_u64(r, "users.0.used.connections"), 1u);
	CHECK_EQ(reply_u64(r, "users.0.used.queued_jobs"), 0u);
	gpuq_reply_free(r);
	r = quota_of(c, 65534);
	expect_ok(r, "quota of its own uid");
	gpuq_reply_free(r);
	r = quota_of(c, 0);
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "may see its own quota, not uid 0's");
	gpuq_reply_free(r);
	gpuq_close(c);
}

TEST(quota_op_shows_limits_and_usage)
{
	struct daemon_proc d;
	start_with_config(&d,
			  "[default]\n"
			  "device-memory = 1M\n"
			  "queued-jobs = 3\n"
			  "\n"
			  "[user:65534]\n"
			  "connections = 7\n"
			  "reply-bytes = unlimited\n"
			  "max-priority = normal\n",
			  NULL);
	struct gpuq_client *root = client_open(&d);
	if (device_count(root) < 2)
		SKIP("the test reads device 1's usage (the host backend has it; this machine has one GPU)");
	struct quota_args a = { &d };
	as_user(65534, NULL, 0, quota_shows_own_limits_and_usage, &a);
	struct gpuq_reply *r = quota_of(root, -1); /* root: itself and 65534 (a rule, a buffer) */
	expect_ok(r, "root's quota");
	CHECK_EQ(reply_path(r, "users")->via.array.size, 2u);
	CHECK_EQ(reply_u64(r, "users.0.uid"), 0u);
	CHECK(reply_nil(r, "users.0.limits.device_memory")); /* root is never limited */
	CHECK(reply_nil(r, "users.0.limits.connections"));
	CHECK_EQ(reply_u64(r, "users.1.uid"), 65534u);
	CHECK_EQ(reply_u64(r, "users.1.used.device_memory.0"), 256u << 10);
	gpuq_reply_free(r);
	r = quota_of(root, 65534);
	expect_ok(r, "root asks for one uid");
	CHECK_EQ(reply_path(r, "users")->via.array.size, 1u);
	CHECK_EQ(reply_u64(r, "users.0.limits.connections"), 7u);
	CHECK(!reply_path(r, "users.0.groups_known")->via.boolean); /* no connection open */
	gpuq_reply_free(r);
	gpuq_close(root);
	daemon_stop(&d);
}

struct admin_args {
	const struct daemon_proc *d;
	uint64_t job;
};

static void stranger_cannot_see_or_stop(void *arg)
{
	struct admin_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_reply *r = on_job(c, "cancel", a->job);
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "rule");
	gpuq_reply_free(r);
	r = simple(c, "jobs");
	CHECK_EQ(reply_path(r, "jobs")->via.array.size, 0);
	gpuq_reply_free(r);
	r = simple(c, "shutdown");
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "members of group '4243'");
	gpuq_reply_free(r);
	gpuq_close(c);
}

static void admin_sees_and_cancels(void *arg)
{
	struct admin_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_reply *r = simple(c, "jobs");
	expect_ok(r, "jobs");
	CHECK(reply_path(r, "jobs")->via.array.size >= 1);
	gpuq_reply_free(r);
	r = on_job(c, "cancel", a->job);
	expect_ok(r, "the admin's cancel");
	gpuq_reply_free(r);
	r = on_job(c, "wait", a->job);
	expect_error(r, GPUQ_E_CANCELLED, NULL);
	gpuq_reply_free(r);
	gpuq_close(c);
}

static void admin_stops_the_daemon(void *arg)
{
	struct admin_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_reply *r = simple(c, "shutdown");
	expect_ok(r, "the admin's shutdown");
	CHECK(reply_path(r, "stopping")->via.boolean);
	gpuq_reply_free(r);
	gpuq_close(c);
}

static void owner_starts_a_job(void *arg)
{
	struct admin_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_reply *r = alloc(c, "w", 0, 64);
	expect_ok(r, "alloc");
	gpuq_reply_free(r);
	int p[2];
	uint64_t id = start_stalled_put(c, "w", p);
	/* Hand the id to the parent through the pipe-less way: the exit status carries nothing,
	 * so the job's id is predictable instead (alloc, then the put). */
	CHECK_EQ(id, a->job);
	/* Keep the pipe open until the admin has cancelled: this child lingers. */
	gpuq_close(c);
	pause();
}

/* uid 65534 under [default] host-pinned = 1M: regions up to it, then a refusal naming the rule. */
static void pinned_quota_limits_regions(void *arg)
{
	const struct quota_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_region r, more;
	struct gpuq_error err;
	CHECKF(gpuq_region_create(c, "r", 768 << 10, 0, false, &r, &err) == 0, "region: %s",
	       err.message);
	CHECK(gpuq_region_create(c, "more", 512 << 10, 0, false, &more, &err) < 0);
	CHECK_EQ(err.code, GPUQ_E_PERMISSION_DENIED);
	CHECKF(strstr(err.message, "quota [default]") && strstr(err.message, "host-pinned"),
	       "message: %s", err.message);
	gpuq_region_unmap(&r);
	gpuq_close(c);
}

TEST(host_pinned_quota_limits_regions)
{
	struct daemon_proc d;
	start_with_config(&d, "[default]\nhost-pinned = 1M\n", NULL);
	struct gpuq_client *probe = client_open(&d);
	require_memlock(probe, 3 << 20);
	gpuq_close(probe);
	struct quota_args a = { &d };
	as_user(65534, NULL, 0, pinned_quota_limits_regions, &a);
	struct gpuq_client *root = client_open(&d); /* root is never limited */
	struct gpuq_region big;
	struct gpuq_error err;
	CHECKF(gpuq_region_create(root, "big", 2 << 20, 0, false, &big, &err) == 0, "root: %s",
	       err.message);
	gpuq_region_unmap(&big);
	gpuq_close(root);
	daemon_stop(&d);
}

/* A small bench_sched (a benchmark any device can run at once), waiting. */
static struct gpuq_reply *small_benchmark(struct gpuq_client *c, uint64_t reps)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "bench_sched");
	mp_put_u64(&req, "bytes", 1 << 20);
	mp_put_u64(&req, "reps", reps);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

static void benchmark_refused_without_a_rule(void *arg)
{
	const struct quota_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	/* a malformed request is told so first, whoever sends it */
	expect_error(small_benchmark(c, 0), GPUQ_E_BAD_REQUEST, "field 'reps'");
	expect_error(small_benchmark(c, 1), GPUQ_E_PERMISSION_DENIED,
		     "bench_sched holds whole devices, so it is for root, the admin group (4243) and "
		     "users whose quota rule sets benchmarks = yes; uid 65532 is none of these");
	gpuq_close(c);
}

static void benchmark_refused_by_a_rule(void *arg)
{
	const struct quota_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	expect_error(small_benchmark(c, 1), GPUQ_E_PERMISSION_DENIED,
		     "quota [user:65531] (");
	struct mp_map req;
	gpuq_request_begin(c, &req, "bench_copy");
	mp_put_bool(&req, "wait", true);
	expect_error(call(c, &req, NULL, 0), GPUQ_E_PERMISSION_DENIED,
		     "benchmarks = no; uid 65531 may not run bench_copy");
	gpuq_close(c);
}

static void benchmark_allowed(void *arg)
{
	const struct quota_args *a = arg;
	struct gpuq_client *c = client_open(a->d);
	struct gpuq_reply *r = small_benchmark(c, 1);
	expect_ok(r, "a benchmark with the right");
	gpuq_reply_free(r);
	gpuq_close(c);
}

/*
 * Benchmarks hold whole devices, so they are for root, the admin group and
 * users a rule grants them (benchmarks = yes); anyone else is refused,
 * with what would grant it.
 */
TEST(benchmarks_need_the_right)
{
	struct daemon_proc d;
	start_with_config(&d, "[gpuqd]\nadmin-group = 4243\n"
			      "[user:65533]\nbenchmarks = yes\n"
			      "[user:65531]\nbenchmarks = no\n", NULL);
	struct quota_args a = { &d };
	gid_t admin = 4243;
	as_user(65532, NULL, 0, benchmark_refused_without_a_rule, &a);
	as_user(65531, NULL, 0, benchmark_refused_by_a_rule, &a);
	as_user(65533, NULL, 0, benchmark_allowed, &a);
	as_user(65530, &admin, 1, benchmark_allowed, &a);
	struct gpuq_client *root = client_open(&d);
	struct gpuq_reply *r = small_benchmark(root, 1);
	expect_ok(r, "root's benchmark");
	gpuq_reply_free(r);
	gpuq_close(root);
	daemon_stop(&d);
}

TEST(admin_group_sees_cancels_and_stops)
{
	struct daemon_proc d;
	start_with_config(&d, "[gpuqd]\nadmin-group = 4243\n", NULL);
	struct admin_args a = { &d, 2 }; /* job 1: the owner's alloc; job 2: its put */
	pid_t owner = fork();
	CHECK(owner >= 0);
	if (owner == 0) {
		CHECK(setgid(NOGROUP) == 0 && setgroups(0, NULL) == 0 && setuid(65534) == 0);
		owner_starts_a_job(&a);
		_exit(0);
	}
	struct gpuq_client *root = client_open(&d);
	for (int i = 0; i < 2000; i++) { /* until the put runs */
		struct gpuq_reply *r = on_job(root, "status", 2);
		char state[16] = "";
		if (gpuq_reply_ok(r))
			reply_str(r, "job.state", state, sizeof state);
		gpuq_reply_free(r);
		if (strcmp(state, "running") == 0)
			break;
		usleep(2000);
	}
	gid_t admin = 4243;
	as_user(65532, NULL, 0, stranger_cannot_see_or_stop, &a);
	as_user(65533, &admin, 1, admin_sees_and_cancels, &a);
	kill(owner, SIGKILL);
	waitpid(owner, NULL, 0);
	gpuq_close(root);
	as_user(65533, &admin, 1, admin_stops_the_daemon, &a);
	int status = -1;
	for (int i = 0; i < 3000 && waitpid(d.pid, &status, WNOHANG) == 0; i++)
		usleep(5000);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "gpuqd did not exit 0 (0x%x)", status);
	CHECK(daemon_log_count(&d, "shutdown requested by uid 65533") > 0);
	unlink(d.log);
	rmdir(d.dir);
}

/* Every sample line is NAME{LABELS} VALUE (a number, +Inf, -Inf or NaN), and every family has HELP and TYPE. */
static void check_exposition(const char *text)
{
	regex_t sample;
	CHECK(regcomp(&sample, "^[a-zA-Z_:][a-zA-Z0-9_:]*(\\{[a-z_]+=\"[^\"]*\"(,[a-z_]+=\"[^\"]*\")*\\})? "
			       "([-+0-9.e]+|[+-]Inf|NaN)$",
		      REG_EXTENDED | REG_NOSUB) == 0);
	char *copy = strdup(text), *save = NULL;
	int samples = 0;
	for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0)
			continue;
		CHECKF(regexec(&sample, line, 0, NULL, 0) == 0, "not an exposition line: %s", line);
		samples++;
	}
	CHECK(samples > 20);
	free(copy);
	regfree(&sample);
}

TEST(metrics_and_the_job_log)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int last = device_count(c) - 1; /* 1 on the host backend; 0 on a one-GPU machine */
	char line[128];
	do_alloc(c, "w", 0, 4096);
	int src = memfd_random(4096, 3);
	CHECK_EQ(do_put(c, "w", src), 4096);
	close(src);
	gpuq_reply_free(on_job(c, "wait", noop_on(c, last, GPUQ_OK, NULL)));
	int p[2];
	uint64_t stalled = start_stalled_put(c, "w", p);
	gpuq_reply_free(on_job(c, "cancel", stalled));
	gpuq_reply_free(on_job(c, "wait", stalled));
	close(p[1]);
	char *t = metrics_text(c);
	check_exposition(t);
	expect_metric(t, "gpuq_build_info{version=\"");
	expect_metric(t, "gpuq_jobs_total{op=\"alloc\",result=\"ok\"} 1\n");
	expect_metric(t, "gpuq_jobs_total{op=\"put\",result=\"ok\"} 1\n");
	expect_metric(t, "gpuq_jobs_total{op=\"put\",result=\"cancelled\"} 1\n");
	expect_metric(t, "# TYPE gpuq_job_latency_seconds histogram\n");
	expect_metric(t, "gpuq_job_latency_seconds_bucket{op=\"put\",le=\"+Inf\"} 2\n");
	expect_metric(t, "gpuq_job_latency_seconds_count{op=\"noop\"} 1\n");
	expect_metric(t, "gpuq_bytes_moved_total{op=\"put\",path=\"");
	expect_metric(t, "gpuq_jobs{state=\"running\"} 0\n");
	snprintf(line, sizeof line, "gpuq_queue_depth{gpu=\"%d\"} 0\n", last);
	expect_metric(t, line);
	expect_metric(t, "gpuq_pool_bytes{gpu=\"0\"} 4096\n");
	expect_metric(t, "gpuq_buffers{gpu=\"0\"} 1\n");
	snprintf(line, sizeof line, "gpuq_device_healthy{gpu=\"%d\"} 1\n", last);
	expect_metric(t, line);
	expect_metric(t, "gpuq_device_jobs_total{gpu=\"0\"}");
	expect_metric(t, "gpuq_connections 1\n");
	expect_metric(t, "# TYPE gpuq_chain_graph_entries gauge\n");
	snprintf(line, sizeof line, "gpuq_chain_graph_hits_total{gpu=\"%d\"} 0\n", last);
	expect_metric(t, line);
	free(t);
	CHECK(daemon_log_count(&d, "op=put gpus=0 bytes=4096 ") > 0);
	CHECK(daemon_log_count(&d, "result=ok buffer=w@0") > 0);
	CHECK(daemon_log_count(&d, "op=put gpus=0 bytes=0 ") > 0);
	CHECK(daemon_log_count(&d, "result=cancelled buffer=w@0 error=\"") > 0);
	gpuq_close(c);
	daemon_stop(&d);
}

static void alloc_one_more(void *arg)
{
	struct gpuq_client *c = client_open(arg);
	struct gpuq_reply *r = alloc(c, "more", 0, 4096);
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "device-memory 4.0 KiB");
	gpuq_reply_free(r);
	gpuq_close(c);
}

static void alloc_first(void *arg)
{
	struct gpuq_client *c = client_open(arg);
	struct gpuq_reply *r = alloc(c, "first", 0, 4096);
	expect_ok(r, "alloc before the reload");
	gpuq_reply_free(r);
	gpuq_close(c);
}

TEST(sighup_reloads_quotas_and_keeps_them_on_errors)
{
	struct daemon_proc d;
	start_with_config(&d, "[gpuqd]\nqueue-depth = 8\n", NULL);
	as_user(65534, NULL, 0, alloc_first, &d);
	const char *path = config_file("[gpuqd]\nqueue-depth = 8\nspin = 7\n\n[default]\ndevice-memory = 4K\n");
	kill(d.pid, SIGHUP);
	struct gpuq_client *root = client_open(&d);
	await_metric(root, "gpuq_config_reloads_total{result=\"ok\"} 1\n");
	as_user(65534, NULL, 0, alloc_one_more, &d);
	CHECK(daemon_log_count(&d, "reload: spin changed; that takes effect when gpuqd restarts") > 0);

	write_file(path, "[default]\ndevice-memory = lots\n");
	kill(d.pid, SIGHUP);
	await_metric(root, "gpuq_config_reloads_total{result=\"failed\"} 1\n");
	CHECK(daemon_log_count(&d, ":2: device-memory takes a size") > 0);
	as_user(65534, NULL, 0, alloc_one_more, &d); /* the running configuration stays */
	gpuq_close(root);
	unlink(path);
	daemon_stop(&d);
}

TEST(job_deadline_cancels_a_job_that_runs_too_long)
{
	struct daemon_proc d;
	daemon_start(&d, "--job-deadline", "1", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 64);
	int p[2];
	uint64_t id = start_stalled_put(c, "w", p);
	struct gpuq_reply *r = on_job(c, "wait", id);
	expect_error(r, GPUQ_E_CANCELLED, NULL);
	CHECK(reply_f64(r, "job.run_s") >= 1.0);
	gpuq_reply_free(r);
	close(p[1]);
	char *t = metrics_text(c);
	expect_metric(t, "gpuq_job_deadline_cancels_total 1\n");
	expect_metric(t, "gpuq_stuck_jobs 0\n");
	free(t);
	CHECK(daemon_log_count(&d, "past job-deadline 1 s; cancelling it") > 0);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A fused run far longer than its deadline (hours of host work) stops at a
 * chunk boundary when the deadline cancels it, so no worker is stuck and
 * the watchdog is never withheld for it.
 */
TEST(job_deadline_cancels_a_long_fused_run_before_its_grace_runs_out)
{
	struct daemon_proc d;
	daemon_start(&d, "--job-deadline", "1", "--job-deadline-grace", "2", "--host-mem", "256M",
		     NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t count = test_backend_is_cuda() ? (64u << 20) : (1u << 20);
	talloc(c, "x", &tdtype_f32, count, 0);
	tfill_value(c, "x", 0);
	uint64_t id = run_chain_detached(c, "x", "sin | cos", "fused", 1000000, NULL);
	struct gpuq_reply *r = job_request(c, "wait", id, 30000);
	expect_error(r, GPUQ_E_CANCELLED, "run cancelled");
	CHECK(reply_f64(r, "job.run_s") >= 1.0);
	gpuq_reply_free(r);
	char *t = metrics_text(c);
	expect_metric(t, "gpuq_job_deadline_cancels_total 1\n");
	expect_metric(t, "gpuq_stuck_jobs 0\n");
	free(t);
	CHECK(daemon_log_count(&d, "past job-deadline 1 s; cancelling it") > 0);
	CHECK(daemon_log_count(&d, "stuck") == 0);
	gpuq_close(c);
	daemon_stop(&d);
}
