/*
 * gpuqd: start-up, the main loop and shutdown.
 *
 * Threads: the main thread runs the libuv loop (connections, requests, the
 * job and buffer tables, replies) and never calls the backend; one worker
 * thread per device owns that device (workers/worker.c). Only main() exits.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"
#include "daemon/recover_regions.h"
#include "workers/transfer/copy_pool.h"

#define EXIT_NO_DEVICE 69
#define EXIT_CONFIG 78 /* sysexits' EX_CONFIG: the unit does not restart on it */

/* The host copy threads (workers/transfer/copy_pool.h); the workers hold the pointer too. */
static struct copy_pool *copy_pool;

/* Raises resource's soft limit to its hard one; says so at debug level, or why not. */
static void raise_soft_limit(int resource, const char *name)
{
	struct rlimit rl;
	if (getrlimit(resource, &rl) < 0) {
		log_warn("getrlimit(%s): %s", name, strerror(errno));
		return;
	}
	if (rl.rlim_cur == RLIM_INFINITY || (rl.rlim_max != RLIM_INFINITY && rl.rlim_cur >= rl.rlim_max))
		return;
	rlim_t was = rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(resource, &rl) < 0)
		log_warn("cannot raise %s from %llu to %llu: %s", name, (unsigned long long)was,
			 (unsigned long long)rl.rlim_max, strerror(errno));
	else
		log_debug("%s raised from %llu to %llu", name, (unsigned long long)was,
			  (unsigned long long)rl.rlim_max);
}

/*
 * Every connection and every descriptor a client sends costs gpuqd one, and
 * a shell's soft limit (1024) is far below what a shared daemon needs; host
 * regions count against RLIMIT_MEMLOCK, whose soft limit a shell keeps at a
 * few MiB. Both soft limits go up to the hard ones (systemd's LimitNOFILE
 * and LimitMEMLOCK set both).
 */
static void raise_limits(void)
{
	raise_soft_limit(RLIMIT_NOFILE, "the descriptor limit (RLIMIT_NOFILE)");
	raise_soft_limit(RLIMIT_MEMLOCK, "the locked-memory limit (RLIMIT_MEMLOCK)");
}

static void on_signal(uv_signal_t *handle, int signum)
{
	struct daemon *d = handle->data;
	log_info("received %s; shutting down", strsignal(signum));
	daemon_shutdown(d);
}

/* The backend's device numbers this daemon serves, in gpuq index order. */
static int choose_devices(struct daemon *d, int *ordinals, int *count)
{
	struct gpuq_error err;
	int available;
	if (d->ops->device.count(&d->opt.device, &available, &err) < 0) {
		log_error("%s", err.message);
		return -1;
	}
	if (d->opt.device_count == 0) {
		for (int i = 0; i < available && i < GPUQ_MAX_DEVICES; i++)
			ordinals[i] = i;
		*count = available < GPUQ_MAX_DEVICES ? available : GPUQ_MAX_DEVICES;
		return 0;
	}
	for (int i = 0; i < d->opt.device_count; i++) {
		if (d->opt.devices[i] >= available) {
			log_error("--devices names device %d, but the %s backend has %d (0-%d)",
				  d->opt.devices[i], d->ops->name, available, available - 1);
			return -1;
		}
		ordinals[i] = d->opt.devices[i];
	}
	*count = d->opt.device_count;
	return 0;
}

static int start_workers(struct daemon *d)
{
	int ordinals[GPUQ_MAX_DEVICES], count;
	struct gpuq_error err;
	if (choose_devices(d, ordinals, &count) < 0)
		return -1;
	/* The copy threads serve every worker: they start first and stop last. */
	struct device_config config = d->opt.device;
	config.copy_pool = copy_pool = copy_pool_start(d->opt.copy_threads, &err);
	if (!copy_pool) {
		log_error("cannot start the copy threads: %s", err.message);
		return -1;
	}
	struct worker_pool_config pool = {
		.ops = d->ops, .ordinals = ordinals, .count = count, .device = &config,
		.queue_max = d->opt.queue_depth, .spin_us = d->opt.spin_us,
		.max_inflight = d->opt.max_inflight, .on_done = job_on_done,
		.on_reset = device_on_reset, .on_done_arg = d,
	};
	if (worker_pool_start(&d->pool, d->loop, &pool, &err) < 0) {
		log_error("cannot start the device workers: %s", err.message);
		return -1;
	}
	absent_learn_uuids(&d->absent, &d->pool);
	int healthy = 0;
	for (int i = 0; i < count; i++) {
		struct worker_snapshot s;
		worker_snapshot(&d->pool, i, &s);
		healthy += s.healthy;
		if (s.healthy)
			log_info("device %d (%s %d): %s, %llu MiB", i, d->ops->name, ordinals[i],
				 s.info.name, (unsigned long long)(s.info.mem_total >> 20));
		else
			log_error("device %d (%s %d) is unhealthy: %s", i, d->ops->name, ordinals[i],
				  s.health);
	}
	return healthy;
}

static void print_probe(struct daemon *d)
{
	for (int i = 0; i < d->pool.count; i++) {
		struct worker_snapshot s;
		worker_snapshot(&d->pool, i, &s);
		printf("%d\t%s\t%s\t%s\tcc %d.%d\t%llu MiB\t%s\tbuffers: %s\n", i, d->ops->name,
		       s.info.name, s.info.pci_bus_id, s.info.cc_major, s.info.cc_minor,
		       (unsigned long long)(s.info.mem_total >> 20), s.healthy ? "healthy" : s.health,
		       s.info.buffer_memory ? s.info.buffer_memory : "-");
	}
}

static int run_probe(struct daemon *d, int healthy)
{
	print_probe(d);
	fd_store_keep(&d->fd_store);
	if (worker_pool_stop(&d->pool, 5000) == 0)
		copy_pool_stop(copy_pool);
	uv_run(d->loop, UV_RUN_DEFAULT);
	return healthy > 0 ? 0 : EXIT_NO_DEVICE;
}

/*
 * What the service manager passed (the socket, its store's descriptors),
 * sorted before recover.c plans, and whether gpuqd hands its
 * slabs and record to the store. 0, or -1 (logged) when what was passed
 * cannot be served.
 */
static int start_store(struct daemon *d)
{
	if (listen_fds_collect(&d->passed) != 0) {
		log_error("%s", d->passed.error);
		return -1;
	}
	if (fd_store_open(&d->fd_store, d->opt.fd_store) != 0)
		log_warn("the service manager's descriptor store (--fd-store): %s", d->fd_store.why);
	else
		log_info("the service manager's descriptor store: %s", d->fd_store.why);
	if (fd_store_enabled(&d->fd_store))
		d->opt.device.slab_keeper = &d->fd_store.keeper;
	return 0;
}

static int init_handles(struct daemon *d)
{
	int rc = uv_signal_init(d->loop, &d->sigterm);
	if (rc == 0)
		rc = uv_signal_init(d->loop, &d->sigint);
	if (rc == 0)
		rc = uv_timer_init(d->loop, &d->shutdown_timer);
	if (rc == 0)
		rc = uv_signal_start(&d->sigterm, on_signal, SIGTERM);
	if (rc == 0)
		rc = uv_signal_start(&d->sigint, on_signal, SIGINT);
	if (rc < 0)
		log_error("cannot set up signal handling: %s", uv_strerror(rc));
	d->sigterm.data = d->sigint.data = d;
	return rc;
}

/*
 * uv_run, except that for --spin microseconds after a job is dispatched the
 * loop polls instead of sleeping: a short job's completion is then picked up
 * without the wake-up of a sleeping thread, which costs more than the job.
 */
static void run_loop(struct daemon *d)
{
	double spin = d->opt.spin_us / 1e6;
	for (;;) {
		if (!uv_run(d->loop, UV_RUN_NOWAIT))
			return;
		if (d->jobs.active > 0 && monotonic_seconds() - d->last_dispatch < spin) {
			__builtin_ia32_pause();
			continue;
		}
		if (!uv_run(d->loop, UV_RUN_ONCE))
			return;
	}
}

/*
 * What a connection's end lets go of, in this order (server.h says when
 * each kind runs). Its ephemeral buffers are orphaned at once; the rest
 * waits for the close callback, outside every walk over waiters and leases
 * that the code which closed it may be in: its waiters are detached, the
 * rings in its ephemeral regions cancelled and those regions orphaned, then
 * its leases end (which may let an orphaned buffer go).
 */
static const struct conn_hook conn_hooks[] = {
	{ CONN_CLOSING, buffers_drop_conn },
	{ CONN_CLOSED, waiters_drop_conn },
	{ CONN_CLOSED, rings_drop_conn },
	{ CONN_CLOSED, regions_drop_conn },
	{ CONN_CLOSED, leases_drop_conn },
};

/*
 * What lower layers call back, so that calls go one way: each is set once
 * here, before the loop runs, to the function of the layer above.
 */
static void register_hooks(struct daemon *d)
{
	d->server.on_frame = request_handle;
	d->server.conn_hooks = conn_hooks;
	d->server.nconn_hooks = sizeof conn_hooks / sizeof conn_hooks[0];
	d->buffers.free_orphan = op_free_own;
	d->buffers.absent = &d->absent; /* not_found names a buffer kept for a GPU not served */
	d->regions.free_orphan = op_region_free_own;
	d->jobs.hooks = (struct job_hooks){ .started = service_job_started,
					    .finished = service_job_finished,
					    .shutdown_step = daemon_shutdown,
					    .restart_step = restart_step };
}

static void daemon_free(struct daemon *d)
{
	/* Workers that did not stop may still hand the copy threads work: then leave them. */
	if (!d->pool.workers)
		copy_pool_stop(copy_pool);
	while (d->buffers.head)
		buffer_remove(&d->buffers, d->buffers.head);
	while (d->regions.head) /* their mappings go with the process */
		region_remove(&d->regions, d->regions.head);
	job_table_destroy(&d->jobs);
	durable_free(d);
	absent_free(&d->absent);
	fd_store_close(&d->fd_store);
	int rc = uv_loop_close(d->loop);
	if (rc < 0)
		log_warn("uv_loop_close: %s", uv_strerror(rc));
}

int main(int argc, char **argv)
{
	static struct daemon daemon;
	struct daemon *d = &daemon;
	options_defaults(&d->opt);
	int rc = options_parse(&d->opt, argc, argv);
	if (rc != 0)
		return rc > 0 ? 0 : 2;
	if (d->opt.check_record_fd >= 0) /* a restart asks first whether this binary can take over */
		return recover_check_record(d->opt.check_record_fd);
	rc = service_configure(d, argc, argv); /* the file, then the command line again */
	if (rc != 0)
		return rc > 0 ? 0 : d->opt.check_config ? 1 : EXIT_CONFIG;
	signal(SIGPIPE, SIG_IGN);
	raise_limits();
	d->loop = uv_default_loop();
	d->ops = backend_by_name(d->opt.backend);
	d->started = monotonic_seconds();
	job_table_init(&d->jobs, d->opt.job_history);
	if (start_store(d) != 0)
		return 1;
	recover_begin(d); /* a re-exec, or a death under the store: the workers adopt the slabs as they open */
	d->fd_store.keeper.adopted_unheld = !d->recover.stored;

	int healthy = start_workers(d);
	if (healthy < 0)
		return EXIT_NO_DEVICE;
	recover_buffers(d);
	if (d->opt.probe)
		return run_probe(d, healthy);
	if (healthy == 0)
		log_error("no healthy device; serving anyway so that clients see why");
	char msg[512] = "";
	if (init_handles(d) < 0 || service_listen(d, msg, sizeof msg) < 0) {
		if (msg[0])
			log_error("%s", msg);
		fd_store_keep(&d->fd_store); /* what it took over stays for the next start */
		worker_pool_stop(&d->pool, 5000);
		return 1;
	}
	register_hooks(d);
	restart_init(d, argv);
	durable_start(d, d->recover.record, d->recover.stored);
	d->recover.record = NULL;
	listen_fds_free(&d->passed); /* what nobody took */
	log_info("gpuqd %s serving %s with %d %s devices (pid %d)", GPUQD_VERSION,
		 d->server.path, d->pool.count, d->ops->name, (int)getpid());
	if (service_start(d) < 0) {
		daemon_shutdown(d);
		uv_run(d->loop, UV_RUN_DEFAULT);
		return 1;
	}
	recover_conns(d); /* the previous image's clients, answered again on their connections */
	recover_holders(d); /* their ephemeral regions and leases stay with them; the others' end */
	recover_jobs(d); /* the jobs queued at the re-exec, replayed on their connections */
	run_loop(d);
	daemon_free(d);
	log_info("stopped");
	return 0;
}
