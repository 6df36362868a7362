/*
 * gpuqd's state, owned by the main thread: the loop, the options, the worker
 * pool, the job and buffer tables and the server. Workers never see it.
 */
#ifndef GPUQ_DAEMON_H
#define GPUQ_DAEMON_H

#include <stdbool.h>
#include <uv.h>

#include "daemon/buffer.h"
#include "daemon/job.h"
#include "daemon/lease.h"
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

/* op_info.c, op_buffer.c, op_jobs.c: one handler per op. */
void op_ping(struct request *req);
void op_devices(struct request *req);
void op_buffers(struct request *req);
void op_noop(struct request *req);
void op_alloc(struct request *req);
void op_free(struct request *req);
void op_fill(struct request *req);
void op_checksum(struct request *req);
void op_put(struct request *req);
void op_get(struct request *req);
void op_jobs(struct request *req);
void op_status(struct request *req);
void op_wait(struct request *req);
void op_cancel(struct request *req);
void op_bench_copy(struct request *req);
/* op_copy.c, op_bench_d2d.c: device-to-device copies and their benchmark */
void op_copy(struct request *req);
void op_bench_d2d(struct request *req);
/*
 * How a copy from device src to device dst travels: "self" when they are
 * one, the peer link's name ("nvlink", "pcie-p2p", "p2p", "same-gpu",
 * "host-memcpy") when dst can read src's buffers directly (*direct), else
 * "host-staged".
 */
const char *copy_peer_path(struct daemon *d, int src, int dst, bool *direct);
/* op_buffer.c: the buffer named by `field`, with an optional [OFFSET:LENGTH] range in *ref. */
struct buffer *read_buffer_ref(struct request *req, const char *field, struct buffer_ref *ref,
			       struct gpuq_error *err);
/* op_info.c: a device's `scheduler` map (jobs in flight per engine, busy time), for devices and stats. */
void render_scheduler(const struct worker_snapshot *s, struct mp_map *out);
/* progress.c: progress events for waiters that asked (`progress: true`). */
void progress_watch(struct daemon *d);
void progress_close(struct daemon *d);
/* Marks w (a waiter just registered) for progress events if the request asked (`progress: true`). */
void progress_request(struct daemon *d, struct waiter *w, bool wanted);
/* op_chain.c: run (a kernel chain on a buffer), stats (per-device counters), bench_chain */
void op_run(struct request *req);
void op_stats(struct request *req);
void op_bench_chain(struct request *req);
/*
 * op_region.c: host regions (region_create, region_free, regions,
 * region_open) and put/get through one (`region` instead of a descriptor).
 */
void op_region_create(struct request *req);
void op_region_free(struct request *req);
void op_regions(struct request *req);
void op_region_open(struct request *req);
/*
 * The put/get side of a region: the `region` field ("NAME[OFFSET:LENGTH]")
 * resolved and checked against the transfer. put: the region's range is the
 * source and decides *length unless the buffer's range gives one (both
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
int region_transfer_read(struct request *req, bool put, const struct buffer *b,
			 uint64_t buffer_offset, uint64_t *length, bool buffer_has_length,
			 struct region_span *span, struct gpuq_error *err);
void region_transfer_hold(struct job *job, const struct region_span *span, bool put);
/* A job lets go of its region (job_release), freeing an orphaned ephemeral one when idle. */
void region_job_release(struct daemon *d, struct job *job);
/*
 * op_lease.c: attach (a lease on a shareable buffer, the buffer's handle
 * sent with the reply), release, leases, lease_break.
 */
void op_attach(struct request *req);
void op_release(struct request *req);
void op_leases(struct request *req);
void op_lease_break(struct request *req);
/* A connection closed: the leases it holds (or waits for) end. */
void leases_drop_conn(struct daemon *d, struct conn *c);
/* Device index was reset: the leases on its buffers end (their holders are told). */
void leases_drop_device(struct daemon *d, int device);
/*
 * op_collective.c: every collective op (allreduce ... all_to_all, group,
 * bench_allreduce, bench_collective): NCCL's primitives, one part per
 * device queued in one step; the request's `op` says which.
 */
void op_collective(struct request *req);
/* op_bench_sched.c: the overlap ceiling `gpuq bench sched` compares the scheduler with */
void op_bench_sched(struct request *req);
/* op_expr.c: reduce_expr (an expression over buffers to one number) */
void op_reduce_expr(struct request *req);
void op_metrics(struct request *req);
/* op_admin.c: an administrator's device reset, and what follows any reset (the pool's callback) */
void op_reset_device(struct request *req);
/* daemon/faults/op_fault.c: tests/gpuqd-faults only */
void op_inject_fault(struct request *req);
void device_on_reset(int index, void *arg);
void op_shutdown(struct request *req);

/* op_buffer.c: pieces shared by the job-creating handlers. */
extern const struct job_kind kind_put, kind_get;
/* A new job of kind for the caller; on failure req is answered and NULL returned. */
struct job *new_job(struct request *req, const struct job_kind *kind, enum work_kind work_kind,
		    int device);
/*
 * Holds b for the job's life and aims the work at it, as a write of the
 * whole buffer for the scheduler (which keeps jobs on one buffer in order).
 */
void job_attach_buffer(struct job *job, struct buffer *b);
/* Tells the scheduler w touches [offset, offset + length) of b, reading or writing. */
void work_add_access(struct work *w, const struct buffer *b, uint64_t offset, uint64_t length,
		     bool write);
/* The same for any memory the scheduler orders by (a region's mapping): base is its identity. */
void work_add_range(struct work *w, const void *base, uint64_t offset, uint64_t length,
		    bool write);
/* Narrows what job_attach_buffer said: the range and whether it writes. */
void work_narrow_access(struct work *w, uint64_t offset, uint64_t length, bool write);
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
/*
 * The request's `devices` field (distinct device indexes): 1 with devices/n
 * set, 0 when absent, -1 with err.
 */
int read_device_list(struct request *req, int *devices, int *n, struct gpuq_error *err);
/*
 * The benchmarks' `sizes` field: 1 to max byte counts of at most 1 TiB;
 * absent, 256 MiB, 1 GiB and 4 GiB.
 */
int read_bench_sizes(struct request *req, uint64_t *sizes, unsigned max, unsigned *n,
		     struct gpuq_error *err);
struct bench_row;
/* op_bench_copy.c: a copy benchmark's rows, as bench_copy and bench_d2d reply them. */
void bench_rows_render(const struct bench_row *rows, unsigned n, struct mp_map *out);
/* The `device` field: absent means 0; not_found unless it names one of this daemon's devices. */
int read_device(struct request *req, int *device, struct gpuq_error *err);
/* Whose namespace buffer names are resolved in: the caller's, or for root, `owner`. */
int read_owner(struct request *req, uid_t *owner, struct gpuq_error *err);
/* The buffer named by the request's `buffer` field, resolved and usable, or NULL with err. */
struct buffer *read_buffer(struct request *req, struct gpuq_error *err);

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

#endif
