/*
 * gpuqd's state, owned by the main thread: the loop, the options, the worker
 * pool, the job and buffer tables and the server. Workers never see it.
 */
#ifndef GPUQ_DAEMON_H
#define GPUQ_DAEMON_H

#include <stdbool.h>
#include <uv.h>

#include "daemon/args.h"
#include "daemon/buffer.h"
#include "daemon/job.h"
#include "daemon/lease.h"
#include "daemon/op_common.h"
#include "daemon/region.h"
#include "daemon/options.h"
#include "daemon/server.h"
#include "daemon/service.h"
#include "protocol/msg.h"
#include "workers/clock.h"
#include "workers/worker.h"

struct daemon {
	uv_loop_t *loop;
	struct options opt;
	const struct backend_ops *ops;
	struct worker_pool pool;
	struct job_table jobs;
	struct buffer_table buffers;
	struct region_table regions; /* host regions (daemon/region.h) */
	struct lease_table leases;   /* clients' leases on shareable buffers (daemon/lease.h) */
	struct server server;
	double started;
	double last_dispatch; /* when the latest job went to a worker (run_loop's spin) */
	bool stopping;
	uv_signal_t sigterm, sigint;
	uv_timer_t shutdown_timer;
	bool shutdown_timer_armed;
	bool shutdown_cancel_sent;
	struct service svc; /* configuration, systemd, quotas, metrics */
};

/* One request being handled: what handlers need to read it and answer. */
struct request {
	struct daemon *d;
	struct conn *conn;
	uint64_t id;
	const msgpack_object *map;
	int fds[GPUQ_MAX_FDS_PER_REQUEST];
	int nfds; /* a handler that keeps fds[i] sets it to -1 */
};

typedef void (*request_handler)(struct request *req);

/* reply.c: answers req. reply_ok adds id and ok to body and sends it. */
void reply_ok(struct request *req, struct mp_map *body);
/* reply_ok with descriptor fd attached (SCM_RIGHTS, with the frame's first byte); fd stays the caller's. */
void reply_ok_fd(struct request *req, struct mp_map *body, int fd);
void reply_to_fd(struct conn *c, uint64_t id, bool ok, struct mp_map *body, int fd);
void reply_error(struct request *req, const struct gpuq_error *err);
void reply_error_to(struct conn *c, uint64_t id, const struct gpuq_error *err);
void reply_to(struct conn *c, uint64_t id, bool ok, struct mp_map *body);

/*
 * The ops declared as data (request.c's op table): each has its argument
 * table (op_NAME_args, daemon/args.h) and a handler that receives the
 * decoded struct (op_exec, daemon/op_common.h).
 */
/* op_buffer.c */
extern const struct args_spec op_noop_args, op_alloc_args, op_free_args, op_checksum_args,
	op_fill_args;
void op_noop(struct request *req, void *args);
void op_alloc(struct request *req, void *args);
void op_free(struct request *req, void *args);
void op_checksum(struct request *req, void *args);
void op_fill(struct request *req, void *args);
/* op_transfer.c: put and get share a handler; their defaults say which */
extern const struct args_spec op_put_args, op_get_args;
void op_transfer(struct request *req, void *args);
/*
 * The benchmarks (request.c lets root, the admin group and those a quota
 * rule grants it call them): op_bench_copy.c, op_bench_d2d.c,
 * op_bench_sched.c, and bench_chain in op_chain.c.
 */
extern const struct args_spec op_bench_copy_args, op_bench_d2d_args, op_bench_sched_args,
	op_bench_chain_args;
void op_bench_copy(struct request *req, void *args);
void op_bench_d2d(struct request *req, void *args);
void op_bench_sched(struct request *req, void *args);
void op_bench_chain(struct request *req, void *args);
/* op_chain.c: stats (per-device counters) */
extern const struct args_spec op_stats_args;
void op_stats(struct request *req, void *args);
/* op_copy.c: device-to-device copies */
extern const struct args_spec op_copy_args;
void op_copy(struct request *req, void *args);
/*
 * op_chain.c: run (an op list on a buffer, or an expression: op_expr.c);
 * op_expr.c: reduce_expr (an expression over buffers to one number)
 */
extern const struct args_spec op_run_args, op_reduce_expr_args;
void op_run(struct request *req, void *args);
void op_reduce_expr(struct request *req, void *args);

/* op_info.c: what the main thread answers from its own state */
extern const struct args_spec op_ping_args, op_devices_args, op_buffers_args;
void op_ping(struct request *req, void *args);
void op_devices(struct request *req, void *args);
void op_buffers(struct request *req, void *args);
/* op_jobs.c: the jobs, and one job's status, wait and cancel */
extern const struct args_spec op_jobs_args, op_status_args, op_wait_args, op_cancel_args;
void op_jobs(struct request *req, void *args);
void op_status(struct request *req, void *args);
void op_wait(struct request *req, void *args);
void op_cancel(struct request *req, void *args);

/* Ops that still read their request by hand (request_handler). */
/*
 * How a copy from device src to device dst travels: "self" when they are
 * one, the peer link's name ("nvlink", "pcie-p2p", "p2p", "same-gpu",
 * "host-memcpy") when dst can read src's buffers directly (*direct), else
 * "host-staged".
 */
const char *copy_peer_path(struct daemon *d, int src, int dst, bool *direct);
/* op_info.c: a device's `scheduler` map (jobs in flight per engine, busy time), for devices and stats. */
void render_scheduler(const struct worker_snapshot *s, struct mp_map *out);
/* progress.c: progress events for waiters that asked (`progress: true`). */
void progress_watch(struct daemon *d);
void progress_close(struct daemon *d);
/* Marks w (a waiter just registered) for progress events if the request asked (`progress: true`). */
void progress_request(struct daemon *d, struct waiter *w, bool wanted);
/*
 * op_region.c: host regions (region_create, region_free, regions,
 * region_open) and put/get through one (`region` instead of a descriptor).
 */
extern const struct args_spec op_region_create_args, op_region_free_args, op_regions_args,
	op_region_open_args;
void op_region_create(struct request *req, void *args);
void op_region_free(struct request *req, void *args);
void op_regions(struct request *req, void *args);
void op_region_open(struct request *req, void *args);
/*
 * The put/get side of a region: the `region` field's text
 * ("NAME[OFFSET:LENGTH]"; NULL when the request names none, given false
 * when it is nil) resolved and checked against the transfer. put: the
 * region's range is the source and decides *length unless the buffer's
 * range gives one (both
 * given: they must agree); get: *length is the buffer range's and the
 * region's range must hold it. b (at buffer_offset) is the buffer, which a
 * refusal names when it is the side too small. 1 with *span, 0 when the
 * request names no region, -1 with err. region_transfer_hold then holds
 * the region for the job (whose work.length is set) and aims its work at
 * the range.
 */
struct region_span {
	struct region *region;
	uint64_t offset;
};
int region_transfer_read(struct request *req, const char *text, bool given, bool put,
			 const struct buffer *b, uint64_t buffer_offset, uint64_t *length,
			 bool buffer_has_length, struct region_span *span, struct gpuq_error *err);
void region_transfer_hold(struct job *job, const struct region_span *span, bool put);
/* A job lets go of its region (job_release), freeing an orphaned ephemeral one when idle. */
void region_job_release(struct daemon *d, struct job *job);
/*
 * op_lease.c: attach (a lease on a shareable buffer, the buffer's handle
 * sent with the reply), release, leases, lease_break.
 */
extern const struct args_spec op_attach_args, op_release_args, op_leases_args,
	op_lease_break_args;
void op_attach(struct request *req, void *args);
void op_release(struct request *req, void *args);
void op_leases(struct request *req, void *args);
void op_lease_break(struct request *req, void *args);
void lease_break_denied(struct request *req, struct gpuq_error *err);
/* A connection closed: the leases it holds (or waits for) end. */
void leases_drop_conn(struct daemon *d, struct conn *c);
/* Device index was reset: the leases on its buffers end (their holders are told). */
void leases_drop_device(struct daemon *d, int device);
/*
 * op_collective.c: every collective op (allreduce ... all_to_all, group,
 * bench_allreduce, bench_collective): NCCL's primitives, one part per
 * device queued in one step; each op's argument defaults say which.
 */
extern const struct args_spec op_allreduce_args, op_reduce_scatter_args, op_all_gather_args,
	op_broadcast_args, op_reduce_args, op_sendrecv_args, op_all_to_all_args, op_group_args,
	op_bench_allreduce_args, op_bench_collective_args;
void op_collective(struct request *req, void *args);
/*
 * op_admin.c: metrics; an administrator's device reset and shutdown (with
 * the wording of their refusal to others), and what follows any reset
 * (the pool's callback)
 */
extern const struct args_spec op_metrics_args, op_reset_device_args, op_shutdown_args;
void op_metrics(struct request *req, void *args);
void op_reset_device(struct request *req, void *args);
void reset_device_denied(struct request *req, struct gpuq_error *err);
void op_shutdown(struct request *req, void *args);
void shutdown_denied(struct request *req, struct gpuq_error *err);
void device_on_reset(int index, void *arg);
/* daemon/faults/op_fault.c: tests/gpuqd-faults only */
extern const struct args_spec op_inject_fault_args;
void op_inject_fault(struct request *req, void *args);

/*
 * Ephemeral buffers (alloc ephemeral: true): buffers_drop_conn orphans those
 * of a connection that closed and frees each that nothing holds;
 * buffer_free_if_orphaned frees one once nothing holds it (b may be NULL);
 * buffers_free_orphans retries every one (a full queue refused a free).
 */
void buffers_drop_conn(struct daemon *d, uint64_t conn_serial);
void buffer_free_if_orphaned(struct daemon *d, struct buffer *b);
void buffers_free_orphans(struct daemon *d);
/*
 * A job or a lease lets go of b (buffer_unhold); then, with free_orphan, an
 * orphaned ephemeral buffer that nothing else holds is freed. b may be
 * freed here: the caller reads it no more.
 */
void buffer_let_go(struct daemon *d, struct buffer *b, bool free_orphan);
struct bench_row;
/* op_bench_copy.c: a copy benchmark's rows, as bench_copy and bench_d2d reply them. */
void bench_rows_render(const struct bench_row *rows, unsigned n, struct mp_map *out);
/*
 * op_jobs.c: the common path of every job request. Submits job to its
 * worker and answers req now (queued) or registers a waiter (wait: true).
 * On refusal the job is discarded, its buffer released and req answered.
 */
void job_submit(struct request *req, struct job *job);
/*
 * Submits a job of gpuqd's own, which no client asked for or waits on (the
 * free of an orphaned ephemeral buffer or region): normal priority, weight
 * 1, outside quotas. 0, or -1 with err (a full queue): the caller undoes
 * what it prepared and discards the job.
 */
int job_submit_own(struct daemon *d, struct job *job, struct gpuq_error *err);
/* Main thread: the worker pool's completion callback. */
void job_on_done(struct work *work, void *arg);
/*
 * A job whose work needs no device (the free of a buffer a reset lost):
 * done at once, on the main thread, and answered with its record.
 */
void job_finish_now(struct request *req, struct job *job);
/* Cancels every queued job (shutdown), answering their waiters. */
void jobs_cancel_queued(struct daemon *d);
/* Asks every running job to stop at its next chunk. */
void jobs_cancel_running(struct daemon *d);
/* Asks one running job to stop at its next chunk, and wakes its workers to see it. */
void job_cancel_running(struct daemon *d, struct job *job);
/* The same for every running job with a part on device. */
void jobs_cancel_running_on(struct daemon *d, int device);

/* Starts the orderly shutdown (main.c). */
void daemon_shutdown(struct daemon *d);

/*
 * request.c: 0 if the op table is well formed: each row has a handler
 * (and, declared as data, a spec args_spec_check accepts), names are
 * unique, and unknown_op's list of them fits its message. Else -1 with
 * err. For the unit tests.
 */
int request_check_ops(struct gpuq_error *err);

#endif
