/*
 * Prometheus text exposition of gpuqd's state (see metrics.h). Main thread
 * only: counters are bumped as jobs finish, gauges read when rendering.
 *
 * The kernel chains' graph-cache counters come from workers/chain/chain.h (atomic,
 * readable from any thread). Communicator counts are not exported: the
 * all-reduce's communicator cache belongs to each worker and has no counter
 * the main thread may read; they belong beside the device gauges once it does.
 */
#include "daemon/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/chain/chain.h"

static const double latency_bounds[METRICS_LATENCY_BUCKETS] = {
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
	0.25,   0.5,     1,      2.5,   5,      10,    30,   60,    300,
};

static const char *const quota_limits[METRICS_QUOTA_LIMITS] = {
	"device-memory", "queued-jobs", "devices", "max-priority", "host-pinned", "connections",
	"parked-fds", "pending-frame-bytes", "reply-bytes", "benchmarks",
};

static int latency_bucket(double seconds)
{
	int b = 0;
	while (b < METRICS_LATENCY_BUCKETS && seconds > latency_bounds[b])
		b++;
	return b;
}

static struct metrics_op *op_entry(struct metrics *m, const char *op)
{
	for (int i = 0; i < m->nops; i++)
		if (m->ops[i].op == op || strcmp(m->ops[i].op, op) == 0)
			return &m->ops[i];
	if (m->nops == METRICS_MAX_OPS)
		return NULL;
	struct metrics_op *e = &m->ops[m->nops++];
	memset(e, 0, sizeof *e);
	e->op = op;
	return e;
}

static void add_path_bytes(struct metrics *m, const char *op, const char *path, uint64_t bytes)
{
	for (int i = 0; i < m->npaths; i++) {
		struct metrics_path *p = &m->paths[i];
		if (strcmp(p->op, op) == 0 && strcmp(p->path, path) == 0) {
			p->bytes += bytes;
			return;
		}
	}
	if (m->npaths < METRICS_MAX_PATHS)
		m->paths[m->npaths++] = (struct metrics_path){ op, path, bytes };
}

void metrics_job_finished(struct metrics *m, const char *op, enum gpuq_errc result,
			  double latency, const char *path, uint64_t bytes)
{
	struct metrics_op *e = op_entry(m, op);
	if (e) {
		int b = latency_bucket(latency);
		e->results[(unsigned)result < GPUQ_ERRC_COUNT ? result : GPUQ_E_INTERNAL]++;
		e->latency[b]++;
		e->latency_sum += latency;
	}
	if (path && bytes)
		add_path_bytes(m, op, path, bytes);
}

void metrics_queue_wait(struct metrics *m, int priority, double seconds)
{
	if (priority < 0 || priority >= GPUQ_PRIORITIES)
		return;
	m->queue_wait[priority][latency_bucket(seconds)]++;
	m->queue_wait_sum[priority] += seconds;
}

void metrics_quota_refusal(struct metrics *m, const char *limit)
{
	for (int i = 0; i < METRICS_QUOTA_LIMITS; i++)
		if (strcmp(quota_limits[i], limit) == 0)
			m->quota_refusals[i]++;
}

void metrics_text_free(struct metrics_text *t)
{
	free(t->data);
	memset(t, 0, sizeof *t);
}

static void emit(struct metrics_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void emit(struct metrics_text *t, const char *fmt, ...)
{
	for (int attempt = 0; attempt < 2 && !t->failed; attempt++) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(t->data ? t->data + t->len : NULL, t->data ? t->cap - t->len : 0,
				  fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->failed = 1;
			return;
		}
		if (t->data && t->len + (size_t)n < t->cap) {
			t->len += (size_t)n;
			return;
		}
		size_t cap = t->cap ? t->cap : 16384;
		while (cap <= t->len + (size_t)n)
			cap *= 2;
		char *data = realloc(t->data, cap);
		if (!data) {
			t->failed = 1;
			return;
		}
		t->data = data;
		t->cap = cap;
	}
}

/* A label value with \, " and newlines escaped, as the exposition format asks. */
static const char *escaped(const char *s, char *buf, size_t size)
{
	size_t o = 0;
	for (; *s && o + 3 < size; s++) {
		if (*s == '\\' || *s == '"') {
			buf[o++] = '\\';
			buf[o++] = *s;
		} else if (*s == '\n') {
			buf[o++] = '\\';
			buf[o++] = 'n';
		} else {
			buf[o++] = *s;
		}
	}
	buf[o] = '\0';
	return buf;
}

static void header(struct metrics_text *t, const char *name, const char *type, const char *help)
{
	emit(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram's series: buckets (not cumulative) with their sum, under name{label="value"}. */
static void emit_histogram(struct metrics_text *t, const char *name, const char *label,
			   const char *value, const uint64_t *buckets, double sum)
{
	uint64_t cum = 0;
	for (int b = 0; b < METRICS_LATENCY_BUCKETS; b++) {
		cum += buckets[b];
		emit(t, "%s_bucket{%s=\"%s\",le=\"%g\"} %llu\n", name, label, value, latency_bounds[b],
		     (unsigned long long)cum);
	}
	cum += buckets[METRICS_LATENCY_BUCKETS];
	emit(t, "%s_bucket{%s=\"%s\",le=\"+Inf\"} %llu\n", name, label, value, (unsigned long long)cum);
	emit(t, "%s_sum{%s=\"%s\"} %.9g\n", name, label, value, sum);
	emit(t, "%s_count{%s=\"%s\"} %llu\n", name, label, value, (unsigned long long)cum);
}

static void render_queue_wait(const struct metrics *m, struct metrics_text *t)
{
	header(t, "gpuq_queue_wait_seconds", "histogram",
	       "Seconds from a job's submission to its start on its worker, by priority.");
	for (int p = 0; p < GPUQ_PRIORITIES; p++)
		emit_histogram(t, "gpuq_queue_wait_seconds", "priority",
			       gpuq_priority_name((enum gpuq_priority)p), m->queue_wait[p],
			       m->queue_wait_sum[p]);
}

static void render_jobs(struct daemon *d, struct metrics_text *t)
{
	const struct metrics *m = &d->svc.metrics;
	header(t, "gpuq_jobs_total", "counter",
	       "Jobs finished, by op and result (ok, or the error code).");
	for (int i = 0; i < m->nops; i++)
		for (int r = 0; r < GPUQ_ERRC_COUNT; r++)
			if (m->ops[i].results[r])
				emit(t, "gpuq_jobs_total{op=\"%s\",result=\"%s\"} %llu\n", m->ops[i].op,
				     gpuq_errc_name((enum gpuq_errc)r),
				     (unsigned long long)m->ops[i].results[r]);
	header(t, "gpuq_job_latency_seconds", "histogram",
	       "Seconds from a job's submission to its end, by op.");
	for (int i = 0; i < m->nops; i++)
		emit_histogram(t, "gpuq_job_latency_seconds", "op", m->ops[i].op, m->ops[i].latency,
			       m->ops[i].latency_sum);
	render_queue_wait(m, t);
	header(t, "gpuq_bytes_moved_total", "counter",
	       "Bytes moved by jobs, by op and path (how the bytes travelled).");
	for (int i = 0; i < m->npaths; i++)
		emit(t, "gpuq_bytes_moved_total{op=\"%s\",path=\"%s\"} %llu\n", m->paths[i].op,
		     m->paths[i].path, (unsigned long long)m->paths[i].bytes);
}

static void render_queues(struct daemon *d, struct metrics_text *t, const unsigned *depth)
{
	unsigned queued = 0, conns = 0;
	for (int i = 0; i < d->pool.count; i++)
		queued += depth[i];
	for (const struct conn *c = d->server.conns; c; c = c->next)
		conns++;
	unsigned running = d->jobs.active > queued ? d->jobs.active - queued : 0;
	header(t, "gpuq_jobs", "gauge", "Jobs now queued on a worker, or running.");
	emit(t, "gpuq_jobs{state=\"queued\"} %u\ngpuq_jobs{state=\"running\"} %u\n", queued,
	     running);
	header(t, "gpuq_queue_depth", "gauge", "Jobs queued on each device's worker.");
	for (int i = 0; i < d->pool.count; i++)
		emit(t, "gpuq_queue_depth{gpu=\"%d\"} %u\n", i, depth[i]);
	header(t, "gpuq_connections", "gauge", "Client connections open.");
	emit(t, "gpuq_connections %u\n", conns);
}

/* Buffers kept for GPUs this gpuqd does not serve (daemon/absent.h), by GPU. */
static void render_absent(struct daemon *d, struct metrics_text *t)
{
	struct absent_gpu gpus[GPUQ_MAX_DEVICES];
	size_t n = absent_by_gpu(&d->absent, gpus, GPUQ_MAX_DEVICES);
	char b[2 * SLAB_OWNER_MAX];
	header(t, "gpuq_absent_buffers", "gauge",
	       "Buffers kept for a GPU this gpuqd does not serve, by its uuid: they come back under "
	       "a gpuqd that serves it.");
	for (size_t i = 0; i < n; i++)
		emit(t, "gpuq_absent_buffers{uuid=\"%s\"} %u\n", escaped(gpus[i].uuid, b, sizeof b),
		     gpus[i].buffers);
	header(t, "gpuq_absent_bytes", "gauge",
	       "Bytes of the buffers kept for a GPU this gpuqd does not serve, by its uuid.");
	for (size_t i = 0; i < n; i++)
		emit(t, "gpuq_absent_bytes{uuid=\"%s\"} %llu\n", escaped(gpus[i].uuid, b, sizeof b),
		     (unsigned long long)gpus[i].bytes);
}

/* Each device's scheduler: jobs in flight, per engine, and how long each engine was busy. */
static void render_engines(struct daemon *d, struct metrics_text *t,
			   const struct worker_snapshot *snap)
{
	header(t, "gpuq_restarts_total", "counter",
	       "Times gpuqd re-executed itself in place (restart, SIGUSR2), its buffers kept.");
	emit(t, "gpuq_restarts_total %u\n", d->restart.count);
	header(t, "gpuq_store_recoveries_total", "counter",
	       "Times gpuqd came back with its buffers from the service manager's descriptor store "
	       "(after dying, or a stop under the store).");
	emit(t, "gpuq_store_recoveries_total %llu\n", (unsigned long long)d->recover.recoveries);
	header(t, "gpuq_store_failures_total", "counter",
	       "Descriptors gpuqd failed to hand to, or remove from, the service manager's store.");
	emit(t, "gpuq_store_failures_total %llu\n",
	     (unsigned long long)atomic_load(&d->fd_store.failures));
	header(t, "gpuq_store_over_limit", "gauge",
	       "Descriptors gpuqd holds beyond the store's FileDescriptorStoreMax=: the store drops "
	       "them, and a crash loses their buffers.");
	emit(t, "gpuq_store_over_limit %u\n", fd_store_over_limit(&d->fd_store));
	render_absent(d, t);
	header(t, "gpuq_device_resets_total", "counter",
	       "Times each device was reset (after a fault, or asked) and opened again.");
	for (int i = 0; i < d->pool.count; i++)
		emit(t, "gpuq_device_resets_total{gpu=\"%d\"} %u\n", i, snap[i].resets);
	header(t, "gpuq_jobs_inflight", "gauge", "Jobs each device's scheduler has in flight.");
	for (int i = 0; i < d->pool.count; i++)
		emit(t, "gpuq_jobs_inflight{gpu=\"%d\"} %u\n", i, snap[i].sched.inflight);
	header(t, "gpuq_engine_inflight", "gauge",
	       "Jobs in flight per engine (h2d, d2h, kernel, copy, collective, other).");
	for (int i = 0; i < d->pool.count; i++)
		for (int e = 0; e < SCHED_ENGINES; e++)
			emit(t, "gpuq_engine_inflight{gpu=\"%d\",engine=\"%s\"} %u\n", i,
			     sched_engine_name((enum sched_engine)e), snap[i].sched.inflight_by_engine[e]);
	header(t, "gpuq_engine_busy_seconds_total", "counter",
	       "Seconds each engine had at least one job in flight (its rate is the busy fraction).");
	for (int i = 0; i < d->pool.count; i++)
		for (int e = 0; e < SCHED_ENGINES; e++)
			emit(t, "gpuq_engine_busy_seconds_total{gpu=\"%d\",engine=\"%s\"} %.6f\n", i,
			     sched_engine_name((enum sched_engine)e), snap[i].sched.busy_seconds[e]);
}

/* Per-device gauges from the worker snapshots and the buffer registry. */
static void render_devices(struct daemon *d, struct metrics_text *t,
			   const struct worker_snapshot *snap)
{
	uint64_t held[GPUQ_MAX_DEVICES] = { 0 }, count[GPUQ_MAX_DEVICES] = { 0 };
	char a[512], b[128], c[128];
	for (const struct buffer *buf = d->buffers.head; buf; buf = buf->next) {
		if (buf->device >= 0 && buf->device < GPUQ_MAX_DEVICES) {
			held[buf->device] += buf->bytes;
			count[buf->device]++;
		}
	}
	header(t, "gpuq_device_info", "gauge", "The devices gpuqd serves (value 1).");
	for (int i = 0; i < d->pool.count; i++)
		emit(t, "gpuq_device_info{gpu=\"%d\",backend=\"%s\",name=\"%s\",uuid=\"%s\",pci_bus_id=\"%s\"} 1\n",
		     i, d->ops->name, escaped(snap[i].info.name, a, sizeof a),
		     escaped(snap[i].info.uuid, b, sizeof b), escaped(snap[i].info.pci_bus_id, c, sizeof c));
	header(t, "gpuq_device_healthy", "gauge",
	       "1 if the device's worker takes jobs, 0 if it is unhealthy (gpuq devices says why).");
	for (int i = 0; i < d->pool.count; i++)
		emit(t, "gpuq_device_healthy{gpu=\"%d\"} %d\n", i, snap[i].healthy ? 1 : 0);
	header(t, "gpuq_device_memory_total_bytes", "gauge", "Device memory, as the driver reports it.");
	for (int i = 0; i < d->pool.count; i++)
		emit(t, "gpuq_device_memory_total_bytes{gpu=\"%d\"} %llu\n", i,
		     (unsigned long long)snap[i].info.mem_total);
	header(t, "gpuq_device_memory_free_bytes", "gauge", "Free device memory, as the driver reports it.");
	for (int i = 0; i < d->pool.count; i++)
		emit(t, "gpuq_device_memory_free_bytes{gpu=\"%d\"} %llu\n", i,
		     (unsigned long long)snap[i].info.mem_free);
	header(t, "gpuq_pool_bytes", "gauge",
	       "Bytes held by gpuq's buffers in each device's memory pool.");
	for (int i = 0; i < d->pool.count; i++)
		emit(t, "gpuq_pool_bytes{gpu=\"%d\"} %llu\n", i, (unsigned long long)held[i]);
	header(t, "gpuq_buffers", "gauge", "Named buffers on each device.");
	for (int i = 0; i < d->pool.count; i++)
		emit(t, "gpuq_buffers{gpu=\"%d\"} %llu\n", i, (unsigned long long)count[i]);
#define RENDER_COUNTER(name)                                                              \
	header(t, "gpuq_device_" #name "_total", "counter",                             \
	       "The worker's " #name " counter (gpuq devices --json shows the same).");   \
	for (int i = 0; i < d->pool.count; i++)                                          \
		emit(t, "gpuq_device_" #name "_total{gpu=\"%d\"} %llu\n", i,               \
		     (unsigned long long)snap[i].counters.name);
	WORKER_COUNTERS(RENDER_COUNTER)
#undef RENDER_COUNTER
	render_engines(d, t, snap);
}

/* Zero-copy sharing: regions pinned per device (and against RLIMIT_MEMLOCK), leases per device and mode. */
static void render_sharing(struct daemon *d, struct metrics_text *t)
{
	uint64_t limit;
	unsigned n;
	header(t, "gpuq_region_bytes", "gauge", "Host memory pinned for regions, by the device that pinned it.");
	for (int i = 0; i < d->pool.count; i++)
		emit(t, "gpuq_region_bytes{gpu=\"%d\"} %llu\n", i,
		     (unsigned long long)region_bytes_on(&d->regions, i, &n));
	header(t, "gpuq_regions", "gauge", "Host regions, by the device that pinned them.");
	for (int i = 0; i < d->pool.count; i++) {
		region_bytes_on(&d->regions, i, &n);
		emit(t, "gpuq_regions{gpu=\"%d\"} %u\n", i, n);
	}
	/* Always present (+Inf when unlimited), so that a dashboard's query of it has a series. */
	header(t, "gpuq_memlock_limit_bytes", "gauge",
	       "gpuqd's RLIMIT_MEMLOCK, which regions count against (+Inf: unlimited).");
	if (region_memlock_limit(&limit))
		emit(t, "gpuq_memlock_limit_bytes %llu\n", (unsigned long long)limit);
	else
		emit(t, "gpuq_memlock_limit_bytes +Inf\n");
	header(t, "gpuq_leases", "gauge", "Leases held on shareable buffers, by device and mode.");
	for (int i = 0; i < d->pool.count; i++) {
		unsigned rw = 0, ro = 0;
		for (const struct lease *l = d->leases.head; l; l = l->next)
			if (l->state == LEASE_HELD && l->buffer->device == i)
				*(l->write ? &rw : &ro) += 1;
		emit(t, "gpuq_leases{gpu=\"%d\",mode=\"read-write\"} %u\n", i, rw);
		emit(t, "gpuq_leases{gpu=\"%d\",mode=\"read\"} %u\n", i, ro);
	}
}

/* The kernel chains' counters per device; graph_entries and kernel_entries are the caches' sizes now. */
static void render_chain(struct daemon *d, struct metrics_text *t)
{
	static const char *const names[] = {
#define CHAIN_NAME(name) #name,
		CHAIN_COUNTERS(CHAIN_NAME)
#undef CHAIN_NAME
	};
	for (int c = 0; c < CHAIN_COUNTER_COUNT; c++) {
		bool gauge = strcmp(names[c], "graph_entries") == 0 ||
			     strcmp(names[c], "kernel_entries") == 0;
		char name[96];
		snprintf(name, sizeof name, "gpuq_chain_%s%s", names[c], gauge ? "" : "_total");
		header(t, name, gauge ? "gauge" : "counter",
		       gauge ? "Kernel-chain plans (CUDA graphs) or compiled kernels in each device's cache."
			     : "The device's kernel-chain counter of that name (gpuq stats shows the same).");
		for (int i = 0; i < d->pool.count; i++)
			emit(t, "%s{gpu=\"%d\"} %llu\n", name, i,
			     (unsigned long long)chain_counter_get(&d->pool.workers[i].dev,
								   (enum chain_counter)c));
	}
}

static void render_service(struct daemon *d, struct metrics_text *t)
{
	const struct metrics *m = &d->svc.metrics;
	header(t, "gpuq_quota_refusals_total", "counter",
	       "Requests refused by a quota rule, by the limit that refused them.");
	for (int i = 0; i < METRICS_QUOTA_LIMITS; i++)
		emit(t, "gpuq_quota_refusals_total{limit=\"%s\"} %llu\n", quota_limits[i],
		     (unsigned long long)m->quota_refusals[i]);
	header(t, "gpuq_job_deadline_cancels_total", "counter",
	       "Jobs cancelled because they ran past --job-deadline.");
	emit(t, "gpuq_job_deadline_cancels_total %llu\n", (unsigned long long)m->deadline_cancels);
	header(t, "gpuq_stuck_jobs", "gauge",
	       "Jobs still running past their deadline and its grace: a stuck worker (the watchdog is withheld).");
	emit(t, "gpuq_stuck_jobs %u\n", d->svc.stuck_jobs);
	header(t, "gpuq_config_reloads_total", "counter",
	       "Configuration reloads (SIGHUP), by result.");
	emit(t, "gpuq_config_reloads_total{result=\"ok\"} %llu\n", (unsigned long long)m->reloads_ok);
	emit(t, "gpuq_config_reloads_total{result=\"failed\"} %llu\n",
	     (unsigned long long)m->reloads_failed);
}

int metrics_render(struct daemon *d, struct metrics_text *t)
{
	static struct worker_snapshot snap[GPUQ_MAX_DEVICES]; /* large; main thread only */
	unsigned depth[GPUQ_MAX_DEVICES];
	for (int i = 0; i < d->pool.count; i++) {
		worker_snapshot(&d->pool, i, &snap[i]);
		depth[i] = snap[i].queue_depth;
	}
	header(t, "gpuq_build_info", "gauge", "gpuqd's version and backend (value 1).");
	emit(t, "gpuq_build_info{version=\"%s\",backend=\"%s\"} 1\n", GPUQD_VERSION, d->ops->name);
	header(t, "gpuq_uptime_seconds", "gauge", "Seconds since gpuqd started.");
	emit(t, "gpuq_uptime_seconds %.3f\n", monotonic_seconds() - d->started);
	render_jobs(d, t);
	render_queues(d, t, depth);
	render_devices(d, t, snap);
	render_sharing(d, t);
	render_chain(d, t);
	render_service(d, t);
	return t->failed ? -1 : 0;
}

static int write_all(int fd, const char *data, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, data, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		data += n;
		len -= (size_t)n;
	}
	return 0;
}

int metrics_write_textfile(struct daemon *d, const char *path, char *msg, size_t msgsize)
{
	struct metrics_text t = { 0 };
	char tmp[300];
	snprintf(tmp, sizeof tmp, "%s.tmp", path); /* the collector reads *.prom only */
	if (metrics_render(d, &t) < 0) {
		metrics_text_free(&t);
		snprintf(msg, msgsize, "no memory to render the metrics");
		return -1;
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	/* 0644 whatever the umask (the unit's is 0077): node_exporter runs as another user. */
	int rc = fd < 0 || fchmod(fd, 0644) < 0 || write_all(fd, t.data, t.len) < 0 ? -1 : 0;
	if (rc < 0)
		snprintf(msg, msgsize, "writing %s: %s", tmp, strerror(errno));
	if (fd >= 0 && close(fd) < 0 && rc == 0) {
		snprintf(msg, msgsize, "writing %s: %s", tmp, strerror(errno));
		rc = -1;
	}
	if (rc == 0 && rename(tmp, path) < 0) {
		snprintf(msg, msgsize, "renaming %s to %s: %s", tmp, path, strerror(errno));
		rc = -1;
	}
	if (rc < 0 && fd >= 0)
		unlink(tmp);
	metrics_text_free(&t);
	return rc;
}
