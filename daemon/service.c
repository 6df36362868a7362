/*
 * gpuqd as a system service (see service.h): configuration and reload,
 * socket activation, notification, deadlines and the watchdog, metrics
 * files, and the bookkeeping that quotas and metrics need as jobs come and
 * go. Main thread only.
 */
#include "daemon/service.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/listen_fds.h"
#include "workers/log.h"

#define TICK_MS 1000

static void print_count(const char *name, uint64_t n)
{
	if (n == QUOTA_UNLIMITED)
		printf(" %s unlimited", name);
	else
		printf(" %s %llu", name, (unsigned long long)n);
}

/*
 * The keys a rule sets that are not connection holds, each as "KEY VALUE"
 * in the file's own words; whether it printed any. Every key quota.c
 * reads belongs here or in the holds, so that --check-config shows all.
 */
static bool print_rule_limits(const struct quota_rule *r)
{
	char devices[256];
	if (r->has_memory)
		printf(" device-memory %llu bytes", (unsigned long long)r->device_memory);
	if (r->has_pinned)
		printf(" host-pinned %llu bytes", (unsigned long long)r->host_pinned);
	if (r->has_jobs)
		printf(" queued-jobs %llu", (unsigned long long)r->queued_jobs);
	if (r->has_devices)
		printf(" devices %s", quota_devices_text(r->devices, devices, sizeof devices));
	if (r->has_priority)
		printf(" max-priority %s", gpuq_priority_name((enum gpuq_priority)r->max_priority));
	if (r->has_weight)
		printf(" weight %g", r->weight);
	if (r->has_benchmarks)
		printf(" benchmarks %s", r->benchmarks ? "yes" : "no");
	return r->has_memory || r->has_pinned || r->has_jobs || r->has_devices ||
	       r->has_priority || r->has_weight || r->has_benchmarks;
}

static void print_rule(const struct quota_rule *r)
{
	printf("  %s (%s):", r->label, r->where);
	bool any = print_rule_limits(r);
	for (int k = 0; k < HOLD_KINDS; k++) {
		if (r->has_hold[k])
			print_count(quota_hold_name((enum quota_hold)k), r->hold[k]);
		any |= r->has_hold[k];
	}
	if (!any)
		printf(" no limits");
	printf("\n");
}

/* --check-config: errors on stderr as FILE:LINE: message; a summary on stdout if none. */
static int check_config_report(const struct options *o, const struct quota_set *q,
			       const struct config_report *r)
{
	for (int i = 0; i < r->count && i < CONFIG_MAX_ERRORS; i++)
		fprintf(stderr, "%s\n", r->errors[i]);
	if (r->count > CONFIG_MAX_ERRORS)
		fprintf(stderr, "(%d more errors)\n", r->count - CONFIG_MAX_ERRORS);
	if (r->count)
		return -1;
	if (r->file_read)
		printf("%s: ok\n", o->config_path);
	else
		printf("%s: no such file; the defaults and the command line apply\n", o->config_path);
	printf("admin group: %s\n", q->has_admin ? q->admin_group : "none (root alone)");
	printf("quota rules: %d\n", q->count);
	for (int i = 0; i < q->count; i++)
		print_rule(&q->rules[i]);
	fflush(stdout);
	return 1;
}

int service_configure(struct daemon *d, int argc, char **argv)
{
	static struct config_report report; /* large; used once */
	struct service *s = &d->svc;
	struct options cli = d->opt;
	char msg[512];
	s->argc = argc;
	s->argv = argv;
	s->notify.fd = -1;
	int errors = config_build(&cli, argc, argv, &d->opt, &s->quotas, &report);
	if (cli.check_config)
		return check_config_report(&d->opt, &s->quotas, &report);
	log_set_level(d->opt.log_level);
	if (errors) {
		for (int i = 0; i < errors && i < CONFIG_MAX_ERRORS; i++)
			log_error("%s", report.errors[i]);
		log_error("the configuration has %d errors (gpuqd --check-config lists them); not starting",
			  errors);
		return -1;
	}
	if (report.file_read)
		log_info("configuration from %s: %d quota rules, admin group %s", d->opt.config_path,
			 s->quotas.count, s->quotas.has_admin ? s->quotas.admin_group : "none");
	if (notify_open(&s->notify, msg, sizeof msg) < 0)
		log_warn("%s", msg);
	notify_send(&s->notify, "STATUS=starting: opening the devices");
	return 0;
}

/* The socket the previous image listened on (a re-exec: daemon/recover.h). */
static int service_listen_inherited(struct daemon *d, char *msg, size_t msgsize)
{
	int fd = d->recover.listen_fd;
	d->recover.listen_fd = -1;
	fcntl(fd, F_SETFD, FD_CLOEXEC);
	if (server_adopt(&d->server, d, d->loop, fd, d->opt.max_frame, msg, msgsize) < 0)
		return -1;
	d->server.adopted = d->recover.listen_adopted; /* a socket gpuqd bound is still its own to remove */
	log_info("serving %s again after a re-exec", d->server.path);
	return 0;
}

int service_listen(struct daemon *d, char *msg, size_t msgsize)
{
	if (d->recover.listen_fd >= 0)
		return service_listen_inherited(d, msg, msgsize);
	int fd = listen_fds_take(&d->passed);
	if (fd < 0)
		return server_listen(&d->server, d, d->loop, d->opt.socket_path, d->opt.socket_group,
				     d->opt.max_frame, msg, msgsize);
	if (server_adopt(&d->server, d, d->loop, fd, d->opt.max_frame, msg, msgsize) < 0)
		return -1;
	log_info("serving %s, passed by the service manager (socket activation; --socket is not used)",
		 d->server.path);
	return 0;
}

/* "2 GPUs, 1 unhealthy (gpu 1: ...); 1 job running, 3 queued" (and what is stuck, or kept aside). */
static void status_text(struct daemon *d, char *buf, size_t size)
{
	static struct worker_snapshot snap; /* large; main thread only */
	int healthy = 0;
	unsigned queued = 0;
	char bad[160] = "";
	for (int i = 0; i < d->pool.count; i++) {
		worker_snapshot(&d->pool, i, &snap);
		healthy += snap.healthy;
		queued += snap.queue_depth;
		if (!snap.healthy && !bad[0])
			snprintf(bad, sizeof bad, " (gpu %d: %.100s)", i, snap.health);
	}
	unsigned running = d->jobs.active > queued ? d->jobs.active - queued : 0;
	size_t n = (size_t)snprintf(buf, size, "%s%d %s", d->stopping ? "stopping: " : "",
				    d->pool.count, strcmp(d->ops->name, "host") == 0 ? "host devices (no GPU)" : "GPUs");
	if (healthy < d->pool.count && n < size)
		n += (size_t)snprintf(buf + n, size - n, ", %d unhealthy%s", d->pool.count - healthy, bad);
	if (n < size)
		n += (size_t)snprintf(buf + n, size - n, "; %u jobs running, %u queued", running, queued);
	if (d->svc.stuck_jobs && n < size)
		n += (size_t)snprintf(buf + n, size - n, "; %u stuck past their deadline",
				      d->svc.stuck_jobs);
	if (d->absent.n && n < size) /* buffers of GPUs not served: gpuq devices says which */
		snprintf(buf + n, size - n, "; %zu buffers kept for GPUs not served", d->absent.n);
}

static void status_update(struct daemon *d, const char *prefix)
{
	struct service *s = &d->svc;
	char text[256], msg[300];
	if (!notify_enabled(&s->notify))
		return;
	status_text(d, text, sizeof text);
	if (!prefix[0] && strcmp(text, s->status) == 0)
		return;
	snprintf(s->status, sizeof s->status, "%s", text);
	snprintf(msg, sizeof msg, "%sSTATUS=%s", prefix, text);
	if (notify_send(&s->notify, msg) < 0)
		log_warn("cannot notify the service manager at %s: %m", s->notify.path);
}

/* The longest any of the job's works has been running now, or -1 if none is running. */
static double job_running_for(const struct job *j, double now)
{
	int n = j->parts ? j->nparts : 1;
	double ran = -1;
	for (int i = 0; i < n; i++) {
		const struct work *w = j->parts ? &j->parts[i] : &j->work;
		if (atomic_load(&w->phase) == WORK_RUNNING && now - w->started_at > ran)
			ran = now - w->started_at;
	}
	return ran;
}

void service_scan_deadlines(struct job_table *t, double now, unsigned deadline_s,
			    unsigned grace_s, struct deadline_scan *out)
{
	memset(out, 0, sizeof *out);
	if (deadline_s == 0)
		return;
	for (struct job *j = t->oldest; j; j = j->newer) {
		if (job_is_finished(j))
			continue;
		double ran = job_running_for(j, now);
		if (ran <= deadline_s)
			continue;
		out->over++;
		const atomic_bool *flag = j->parts ? &j->parts[0].cancel : &j->work.cancel;
		if (!atomic_load(flag)) {
			job_request_cancel(j); /* waiting jobs look at it within SCHED_HOST_RECHECK_S */
			out->cancelled++;
			log_warn("job %llu (%s on device %d, uid %d) has run %.0f s, past job-deadline %u s; cancelling it",
				 (unsigned long long)j->id, j->kind->op, job_device(j, 0), (int)j->owner,
				 ran, deadline_s);
		}
		if (ran <= (double)deadline_s + grace_s)
			continue;
		out->stuck++;
		if (ran > out->stuck_for) {
			out->stuck_job = j;
			out->stuck_for = ran;
		}
	}
}

/* Scans the deadlines and logs a newly stuck job once. */
static void check_deadlines(struct daemon *d, struct deadline_scan *scan)
{
	struct service *s = &d->svc;
	service_scan_deadlines(&d->jobs, monotonic_seconds(), d->opt.job_deadline_s,
			       d->opt.job_deadline_grace_s, scan);
	s->metrics.deadline_cancels += scan->cancelled;
	s->stuck_jobs = scan->stuck;
	if (!scan->stuck_job || scan->stuck_job->id == s->stuck_logged)
		return;
	s->stuck_logged = scan->stuck_job->id;
	log_error("job %llu (%s on device %d) has run %.0f s, past job-deadline %u s and its %u s grace, and ignores cancellation: "
		  "the worker of device %d is stuck; %s",
		  (unsigned long long)scan->stuck_job->id, scan->stuck_job->kind->op,
		  job_device(scan->stuck_job, 0), scan->stuck_for, d->opt.job_deadline_s,
		  d->opt.job_deadline_grace_s, job_device(scan->stuck_job, 0),
		  s->notify.watchdog_usec ? "withholding the watchdog so that systemd restarts gpuqd"
					  : "restart gpuqd");
}

static void on_tick(uv_timer_t *t)
{
	struct daemon *d = t->data;
	struct deadline_scan scan;
	check_deadlines(d, &scan);
	buffers_free_orphans(d); /* those a full queue kept from being freed */
	status_update(d, "");
}

static void on_watchdog(uv_timer_t *t)
{
	struct daemon *d = t->data;
	struct deadline_scan scan;
	check_deadlines(d, &scan);
	if (scan.stuck == 0 && notify_send(&d->svc.notify, "WATCHDOG=1") < 0)
		log_warn("cannot ping the watchdog at %s: %m", d->svc.notify.path);
}

static void on_textfile(uv_timer_t *t)
{
	struct daemon *d = t->data;
	struct metrics *m = &d->svc.metrics;
	char msg[sizeof m->textfile_error];
	if (metrics_write_textfile(d, d->opt.metrics_textfile, msg, sizeof msg) == 0) {
		if (m->textfile_error[0])
			log_info("writing %s works again", d->opt.metrics_textfile);
		m->textfile_error[0] = '\0';
		return;
	}
	m->textfile_errors++;
	if (strcmp(msg, m->textfile_error) != 0) /* each new error once, not every interval */
		log_error("metrics textfile: %s", msg);
	snprintf(m->textfile_error, sizeof m->textfile_error, "%s", msg);
}

static void start_textfile(struct daemon *d)
{
	uv_timer_stop(&d->svc.textfile);
	if (d->opt.metrics_textfile[0])
		uv_timer_start(&d->svc.textfile, on_textfile, 0, d->opt.metrics_interval_s * 1000ull);
}

/*
 * What a reload applies: the options a running daemon can change (the log
 * level, the limits, deadlines, metrics file, admin group) from the new
 * ones, and every other option as it runs, each change of which is said to
 * need a restart. New options are restart-only until they are listed here.
 */
static struct options live_options(const struct options *old, const struct options *o)
{
	struct options live = *old;
	live.log_level = o->log_level;
	live.queue_depth = o->queue_depth;
	live.job_history = o->job_history;
	live.max_frame = o->max_frame;
	live.shutdown_timeout_ms = o->shutdown_timeout_ms;
	live.job_deadline_s = o->job_deadline_s;
	live.job_deadline_grace_s = o->job_deadline_grace_s;
	memcpy(live.admin_group, o->admin_group, sizeof live.admin_group);
	memcpy(live.metrics_textfile, o->metrics_textfile, sizeof live.metrics_textfile);
	live.metrics_interval_s = o->metrics_interval_s;
	live.frame_timeout_ms = o->frame_timeout_ms;
	live.transfer_idle_timeout_ms = o->transfer_idle_timeout_ms;
	if (memcmp(&live, o, sizeof live) == 0)
		return live;
	static const char *const names[] = { "socket", "socket-group", "backend", "devices",
					      "spin", "the device settings (host-*, staging-*, pool-release, ...)" };
	bool changed[] = {
		strcmp(o->socket_path, old->socket_path) != 0,
		strcmp(o->socket_group, old->socket_group) != 0,
		strcmp(o->backend, old->backend) != 0,
		o->device_count != old->device_count ||
			memcmp(o->devices, old->devices, sizeof o->devices) != 0,
		o->spin_us != old->spin_us,
		memcmp(&o->device, &old->device, sizeof o->device) != 0,
	};
	bool named = false;
	for (size_t i = 0; i < sizeof changed / sizeof changed[0]; i++) {
		if (changed[i])
			log_warn("reload: %s changed; that takes effect when gpuqd restarts", names[i]);
		named |= changed[i];
	}
	if (!named)
		log_warn("reload: options that only a restart applies changed; they take effect when gpuqd restarts");
	return live;
}

/* SIGHUP: a new configuration, all or nothing. */
static void service_reload(struct daemon *d)
{
	static struct config_report report;
	struct service *s = &d->svc;
	struct options o;
	struct quota_set q;
	char msg[128];
	snprintf(msg, sizeof msg, "RELOADING=1\nMONOTONIC_USEC=%llu",
		 (unsigned long long)(monotonic_seconds() * 1e6));
	notify_send(&s->notify, msg);
	int errors = config_build(&d->opt, s->argc, s->argv, &o, &q, &report);
	if (errors) {
		for (int i = 0; i < errors && i < CONFIG_MAX_ERRORS; i++)
			log_error("reload: %s", report.errors[i]);
		log_error("reload: %d errors; the running configuration stays", errors);
		quota_set_free(&q);
		s->metrics.reloads_failed++;
		status_update(d, "READY=1\n");
		return;
	}
	o = live_options(&d->opt, &o);
	log_set_level(o.log_level);
	d->pool.queue_max = o.queue_depth;
	d->jobs.history_max = o.job_history;
	job_evict_history(&d->jobs);
	d->server.max_frame = o.max_frame;
	quota_set_free(&s->quotas);
	s->quotas = q;
	d->opt = o;
	start_textfile(d);
	s->metrics.reloads_ok++;
	log_info("reloaded %s: %d quota rules, admin group %s, job-deadline %u s",
		 report.file_read ? d->opt.config_path : "(no configuration file)", q.count,
		 q.has_admin ? q.admin_group : "none", o.job_deadline_s);
	status_update(d, "READY=1\n");
}

static void on_sighup(uv_signal_t *h, int signum)
{
	(void)signum;
	struct daemon *d = h->data;
	if (d->stopping)
		return;
	log_info("SIGHUP: reloading the configuration");
	service_reload(d);
}

int service_start(struct daemon *d)
{
	struct service *s = &d->svc;
	uv_timer_t *timers[] = { &s->tick, &s->watchdog, &s->textfile, &s->stop };
	for (size_t i = 0; i < sizeof timers / sizeof timers[0]; i++) {
		uv_timer_init(d->loop, timers[i]);
		timers[i]->data = d;
	}
	int rc = uv_signal_init(d->loop, &s->sighup);
	s->sighup.data = d;
	s->started = true;
	if (rc == 0)
		rc = uv_signal_start(&s->sighup, on_sighup, SIGHUP);
	if (rc < 0) {
		log_error("cannot handle SIGHUP: %s", uv_strerror(rc));
		return -1;
	}
	uv_timer_start(&s->tick, on_tick, TICK_MS, TICK_MS);
	if (s->notify.watchdog_usec) {
		uint64_t ms = s->notify.watchdog_usec / 2000;
		uv_timer_start(&s->watchdog, on_watchdog, 0, ms ? ms : 1);
		log_info("watchdog: pinging every %llu ms (WATCHDOG_USEC=%llu)", (unsigned long long)(ms ? ms : 1),
			 (unsigned long long)s->notify.watchdog_usec);
	}
	start_textfile(d);
	status_update(d, "READY=1\n");
	return 0;
}

void service_stopping(struct daemon *d)
{
	if (d->svc.started)
		status_update(d, "STOPPING=1\n");
}

static void close_if_open(uv_handle_t *h)
{
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

/*
 * A stopped gpuqd's last metrics would be exported as if it served
 * (healthy devices, buffers) for as long as the file stays: it goes, so
 * that the collector reports the metrics absent.
 */
static void remove_textfile(struct daemon *d)
{
	const char *path = d->opt.metrics_textfile;
	if (!path[0])
		return;
	if (unlink(path) == 0)
		log_info("removed %s: gpuqd stops serving", path);
	else if (errno != ENOENT)
		log_warn("cannot remove the metrics textfile %s: %s", path, strerror(errno));
}

void service_close(struct daemon *d)
{
	struct service *s = &d->svc;
	if (s->started) {
		close_if_open((uv_handle_t *)&s->sighup);
		close_if_open((uv_handle_t *)&s->tick);
		close_if_open((uv_handle_t *)&s->watchdog);
		close_if_open((uv_handle_t *)&s->textfile);
		close_if_open((uv_handle_t *)&s->stop);
		remove_textfile(d);
	}
	notify_close(&s->notify);
	quota_set_free(&s->quotas);
	quota_usage_free(&s->usage);
}

static void on_stop(uv_timer_t *t)
{
	daemon_shutdown(t->data);
}

void service_request_shutdown(struct daemon *d)
{
	if (d->svc.started)
		uv_timer_start(&d->svc.stop, on_stop, 0, 0);
	else
		daemon_shutdown(d);
}

void service_job_started(struct daemon *d, const struct job *job)
{
	quota_job_started(&d->svc.usage, job->owner);
}

void service_job_finished(struct daemon *d, const struct job *job)
{
	quota_job_ended(&d->svc.usage, job->owner);
	metrics_job_finished(&d->svc.metrics, job->kind->op, job->error.code,
			     job->finished - job->submitted, job->work.result.path,
			     job->work.result.bytes);
	const struct work *first = job->parts ? &job->parts[0] : &job->work;
	if (first->started_at > 0) /* it reached its worker (not cancelled while queued) */
		metrics_queue_wait(&d->svc.metrics, job->priority, first->started_at - job->submitted);
}
