/*
 * gpuqd's state, owned by the main thread: the loop, the options, the worker
 * pool, the job and buffer tables and the server. Workers never see it.
 *
 * What a file of daemon/ offers is declared in its own header (job.h,
 * job_life.h, buffer.h, region.h, lease.h, server.h, reply.h, progress.h,
 * service.h ...); what is left here is the request and what request.c and
 * the op_*.c files, which have no headers of their own, offer each other.
 */
#ifndef GPUQ_DAEMON_H
#define GPUQ_DAEMON_H

#include <stdbool.h>
#include <uv.h>

#include "daemon/absent.h"
#include "daemon/args.h"
#include "daemon/buffer.h"
#include "daemon/durable.h"
#include "daemon/fd_store.h"
#include "daemon/job.h"
#include "daemon/listen_fds.h"
#include "daemon/job_life.h"
#include "daemon/lease.h"
#include "daemon/op_common.h"
#include "daemon/region.h"
#include "daemon/options.h"
#include "daemon/progress.h"
#include "daemon/recover.h"
#include "daemon/restart.h"
#include "daemon/reply.h"
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
	struct durable durable; /* the durable state record (daemon/durable.h) */
	struct recover recover; /* what a re-exec handed this image (daemon/recover.h) */
	struct restart restart; /* a re-exec under way (daemon/restart.h) */
	struct fd_store fd_store; /* the service manager's descriptor store (daemon/fd_store.h) */
	struct listen_fds passed; /* what the service manager passed at start (daemon/listen_fds.h) */
	struct absent absent; /* each index's GPU, and buffers of GPUs not served (daemon/absent.h) */
};

/* One request being handled: what handlers need to read it and answer. */
struct request {
	struct daemon *d;
	struct conn *conn;
	uint64_t id;
	const msgpack_object *map;
	int fds[GPUQ_MAX_FDS_PER_REQUEST];
	int nfds; /* a handler that keeps fds[i] sets it to -1 */
	/* A replay whose client already has its answer (daemon/replay.h): the job does not wait. */
	bool quiet;
};

/* request.c: handles one complete frame from c (the server's on_frame). */
void request_handle(struct daemon *d, struct conn *c, const uint8_t *payload, size_t len);
/*
 * request.c: handles a request the previous image took and held (a
 * re-exec, daemon/replay.h) as if c had just sent it, descriptors aside
 * (a request that carried some was not held). quiet: the client already
 * had its answer (replay.c keeps the replies back; the job does not wait).
 * 0 once handled (answered or refused as any request), or -1 with err
 * when the bytes do not decode as a request.
 */
int request_replay(struct daemon *d, struct conn *c, const uint8_t *payload, size_t len,
		   bool quiet, struct gpuq_error *err);

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
 * A connection's end: a put or get through a ring in one of its ephemeral
 * regions can never move again (the region goes with the connection, and
 * with it whoever raised the counters), so it is cancelled now rather than
 * hold its buffer until --transfer-idle-timeout.
 */
void rings_drop_conn(struct daemon *d, struct conn *c);
/*
 * The benchmarks (request.c lets root, the admin group and those a quota
 * rule grants it call them): op_bench_copy.c, op_bench_d2d.c,
 * op_bench_sched.c, op_bench_alloc.c, and bench_chain in op_chain.c.
 */
extern const struct args_spec op_bench_copy_args, op_bench_d2d_args, op_bench_sched_args,
	op_bench_chain_args, op_bench_alloc_args;
void op_bench_alloc(struct request *req, void *args);
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
/* op_quota.c: the limits that govern a uid and what it holds now */
extern const struct args_spec op_quota_args;
void op_quota(struct request *req, void *args);

/*
 * How a copy from device src to device dst travels: "self" when they are
 * one, the peer link's name ("nvlink", "pcie-p2p", "p2p", "same-gpu",
 * "host-memcpy") when dst can read src's buffers directly (*direct), else
 * "host-staged".
 */
const char *copy_peer_path(struct daemon *d, int src, int dst, bool *direct);
/* op_info.c: a device's `scheduler` map (jobs in flight per engine, busy time), for devices and stats. */
void render_scheduler(const struct worker_snapshot *s, struct mp_map *out);
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
 * ("NAME[START:STOP]"; NULL when the request names none, given false
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
/*
 * The region side of a ring (docs/protocol.md, "Rings"): the `region`
 * field's range (to the region's end when it gives none) holds whole slots
 * of ring->slot_bytes, two or more, and the counters (ring->counters, a byte
 * offset) lie in the region outside it. Sets *span and ring->slots; 1, or
 * -1 with err. region_ring_hold holds the region for the job and aims its
 * work at the slots and the counters.
 */
struct region_ring {
	uint64_t slot_bytes, counters;
	unsigned slots;
};
int region_ring_read(struct request *req, const char *text, bool given,
		     struct region_ring *ring, struct region_span *span, struct gpuq_error *err);
void region_ring_hold(struct job *job, const struct region_span *span,
		      const struct region_ring *ring, bool put);
/* The free of an orphaned ephemeral region (the region table's free_orphan). */
void op_region_free_own(struct daemon *d, struct region *r);
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
 * op_admin.c: metrics; an administrator's device reset, shutdown and drop
 * of the buffers kept for a GPU not served (with the wording of their
 * refusal to others), and what follows any reset (the pool's callback)
 */
extern const struct args_spec op_metrics_args, op_reset_device_args, op_shutdown_args;
void op_metrics(struct request *req, void *args);
void op_reset_device(struct request *req, void *args);
void reset_device_denied(struct request *req, struct gpuq_error *err);
void op_shutdown(struct request *req, void *args);
extern const struct args_spec op_restart_args;
void op_restart(struct request *req, void *args);
void restart_denied(struct request *req, struct gpuq_error *err);
void shutdown_denied(struct request *req, struct gpuq_error *err);
void device_on_reset(int index, void *arg);
extern const struct args_spec op_drop_absent_args;
void op_drop_absent(struct request *req, void *args);
void drop_absent_denied(struct request *req, struct gpuq_error *err);
/* daemon/faults/op_fault.c: tests/gpuqd-faults only */
extern const struct args_spec op_inject_fault_args;
void op_inject_fault(struct request *req, void *args);

/* op_buffer.c: the free of an orphaned ephemeral buffer (the buffer table's free_orphan). */
void op_free_own(struct daemon *d, struct buffer *b);
struct bench_row;
/* op_bench_copy.c: a copy benchmark's rows, as bench_copy and bench_d2d reply them. */
void bench_rows_render(const struct bench_row *rows, unsigned n, struct mp_map *out);
/*
 * shutdown.c: starts the orderly shutdown (a signal, the shutdown op), and
 * takes its next step when called again (each job that ends while it is
 * under way: the job table's shutdown_step).
 */
void daemon_shutdown(struct daemon *d);

/*
 * request.c: 0 if the op table is well formed: each row has a handler
 * (and, declared as data, a spec args_spec_check accepts), names are
 * unique, and unknown_op's list of them fits its message. Else -1 with
 * err. For the unit tests.
 */
int request_check_ops(struct gpuq_error *err);

#endif
