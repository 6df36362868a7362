/*
 * libgpuq: the C client of gpuqd. The gpuq CLI is built on it.
 *
 * A gpuq_client is one connection; it is not thread-safe (use one per
 * thread). Requests are msgpack maps built with protocol/msg.h's mp_map
 * helpers; gpuq_request_begin starts one with `v`, `id` and `op` filled in.
 *
 *     struct gpuq_client *c;
 *     struct gpuq_error err;
 *     if (gpuq_connect(NULL, &c, &err) < 0) ...
 *     struct mp_map req;
 *     gpuq_request_begin(c, &req, "alloc");
 *     mp_put_str(&req, "name", "w0");
 *     mp_put_u64(&req, "bytes", 1 << 20);
 *     mp_put_bool(&req, "wait", true);
 *     struct gpuq_reply *r;
 *     if (gpuq_call(c, &req, NULL, 0, &r, &err) < 0) ...   (transport failure)
 *     if (!gpuq_reply_ok(r)) ... gpuq_reply_error(r, &err) ...
 *     gpuq_reply_free(r);
 */
#ifndef GPUQ_CLIENT_H
#define GPUQ_CLIENT_H

#include <msgpack.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/msg.h"
#include "protocol/protocol.h"

struct gpuq_client;

#define GPUQ_REPLY_MAX_FDS 4

struct gpuq_reply {
	struct msg msg;            /* the decoded frame */
	const msgpack_object *root; /* its map */
	uint64_t id;
	bool ok;
	/*
	 * Descriptors that came with the reply (its `fds` key: an attach's
	 * buffer handle, a region_open's memfd), in arrival order; -1 once taken
	 * (gpuq_reply_take_fd). gpuq_reply_free closes those not taken.
	 */
	int fds[GPUQ_REPLY_MAX_FDS];
	int nfds;
};

/*
 * The socket path used when none is given: $GPUQ_SOCKET if set, else
 * /run/gpuq/gpuqd.sock for root, else $XDG_RUNTIME_DIR/gpuq.sock (a user's
 * own daemon) unless it does not exist and /run/gpuq/gpuqd.sock (the system
 * service's) does, falling back to /run/gpuq/gpuqd.sock when
 * XDG_RUNTIME_DIR is unset. Static storage.
 */
const char *gpuq_default_socket(void);

/* Connects (path NULL: the default). 0, or -1 with err (code GPUQ_E_IO). */
int gpuq_connect(const char *path, struct gpuq_client **out, struct gpuq_error *err);
void gpuq_close(struct gpuq_client *c);
int gpuq_fd(const struct gpuq_client *c);

/* Starts a request map with v, id (a fresh one) and op. Returns the id. */
uint64_t gpuq_request_begin(struct gpuq_client *c, struct mp_map *req, const char *op);

/*
 * Finishes and sends req (consuming it) with nfds descriptors attached, then
 * reads frames until the reply with the request's id arrives. Frames with
 * other ids (replies to earlier gpuq_send calls) are kept and returned by
 * later gpuq_recv/gpuq_call for their ids; event frames (key "event") are
 * passed to the event callback, if one is set, and dropped otherwise.
 * Returns 0 with *reply set (the caller frees it), or -1 with err on a
 * transport failure (daemon gone, bad frame from the daemon). fds holds
 * nfds open descriptors (NULL when nfds is 0); one that cannot be sent is
 * GPUQ_E_BAD_REQUEST before anything goes, and the connection serves on.
 */
int gpuq_call(struct gpuq_client *c, struct mp_map *req, const int *fds, int nfds,
	      struct gpuq_reply **reply, struct gpuq_error *err);

/*
 * Reconnecting (off by default): when the connection ends (gpuqd restarted,
 * crashed and came back under systemd), gpuq_call connects to the same
 * socket again, trying for up to window_ms until a new connection answers
 * a ping (a gpuqd still dying may take a connection and close it), and
 *   - sends again a request that never left, whatever it is;
 *   - sends again one that was in flight only when it reads and changes
 *     nothing and carries no descriptor: ping, devices, buffers, jobs,
 *     status, wait, stats, quota, metrics, regions, leases; a status or
 *     wait (which name a job by its id) only to a gpuqd that took the old
 *     one over (its ping counts recoveries): one started afresh numbers its
 *     jobs from 1 again, so the id may name one of its own (GPUQ_E_IO);
 *   - fails any other in flight (a job may have run) with GPUQ_E_IO saying
 *     so, the client connected again for the next call.
 * gpuq_send, gpuq_recv and gpuq_send_raw never reconnect. What belonged to
 * the old connection (an ephemeral buffer, a lease, an event subscription)
 * is not carried over. gpuq_reconnects counts the new connections that answered.
 */
void gpuq_set_reconnect(struct gpuq_client *c, unsigned window_ms);
unsigned gpuq_reconnects(const struct gpuq_client *c);

/* Sends without waiting; returns 0 or -1. Match the reply with gpuq_recv. */
int gpuq_send(struct gpuq_client *c, struct mp_map *req, const int *fds, int nfds,
	      struct gpuq_error *err);
/* Waits for the reply to request id (0: the next reply of any id). */
int gpuq_recv(struct gpuq_client *c, uint64_t id, struct gpuq_reply **reply,
	      struct gpuq_error *err);

/* Sends raw bytes as they are (tests use it to send malformed frames). */
int gpuq_send_raw(struct gpuq_client *c, const void *data, size_t len,
		  struct gpuq_error *err);

typedef void (*gpuq_event_fn)(const msgpack_object *event, void *arg);
void gpuq_set_event_handler(struct gpuq_client *c, gpuq_event_fn fn, void *arg);

/* Largest reply frame accepted (default 64 MiB). */
void gpuq_set_max_frame(struct gpuq_client *c, size_t max_frame);

/*
 * Makes gpuq_recv/gpuq_call give up after timeout_ms (0, the default: wait
 * forever) with GPUQ_E_TIMEOUT. The connection stays usable: a reply that
 * arrives later is returned by a later gpuq_recv for its id.
 */
void gpuq_set_timeout(struct gpuq_client *c, unsigned timeout_ms);
unsigned gpuq_get_timeout(const struct gpuq_client *c);

bool gpuq_reply_ok(const struct gpuq_reply *r);
/* Fills err from the reply's error map (code GPUQ_OK if ok). */
void gpuq_reply_error(const struct gpuq_reply *r, struct gpuq_error *err);
/* The value under key in the reply's root map, or NULL; msg_get_* on r->root check types. */
const msgpack_object *gpuq_reply_get(const struct gpuq_reply *r, const char *key);
/* The reply's i-th descriptor, now the caller's to close; -1 if there is none (or it was taken). */
int gpuq_reply_take_fd(struct gpuq_reply *r, int i);
void gpuq_reply_free(struct gpuq_reply *r);

/*
 * Host regions (docs/protocol.md, region_create): host memory that gpuqd
 * maps and pins once, which this process maps too and reads and writes
 * directly; `put`/`get` with `region` ("NAME[START:STOP]") move bytes
 * between it and a buffer with one DMA.
 *
 *     struct gpuq_region r;
 *     gpuq_region_create(c, "in", 64 << 20, 0, false, &r, &err);
 *     memcpy(r.ptr, data, n);          then put with "region": "in[0:N]"
 *     gpuq_region_unmap(&r);           gpuq_region_free(c, "in", &err);
 *
 * create makes a memfd of bytes (a multiple of the page size), seals it
 * against shrinking, maps it here and hands it to gpuqd on `device` (whose
 * NUMA node its pages are asked for), waiting until it is pinned; with
 * ephemeral the region goes when this connection closes. open maps an
 * existing region of the caller's (gpuqd sends its memfd). unmap undoes this
 * process's mapping only; free asks gpuqd to let the region go (after the
 * jobs that use it). 0, or -1 with err (the daemon's refusal, or why here).
 */
struct gpuq_region {
	char name[65];
	void *ptr;      /* this process's mapping of the region */
	uint64_t bytes;
	int fd;         /* the memfd */
};

int gpuq_region_create(struct gpuq_client *c, const char *name, uint64_t bytes, int device,
		       bool ephemeral, struct gpuq_region *out, struct gpuq_error *err);
int gpuq_region_open(struct gpuq_client *c, const char *name, struct gpuq_region *out,
		     struct gpuq_error *err);
void gpuq_region_unmap(struct gpuq_region *r);
int gpuq_region_free(struct gpuq_client *c, const char *name, struct gpuq_error *err);

/*
 * Attaching a shareable buffer (docs/protocol.md, attach): gpuqd answers,
 * once earlier jobs on the buffer are done, with a descriptor that opens
 * that buffer's device memory alone; libgpuq imports it into this process's
 * CUDA context (the primary context of the GPU the daemon's device is,
 * found by UUID; libcuda.so.1 is opened with dlopen, so programs that never
 * attach need no CUDA) and maps it: ptr is a device pointer this process's
 * kernels, cudaMemcpy, CuPy or PyTorch may use. The host backend's stand-in
 * maps the memfd the buffer lives in (host is true, ptr host memory).
 *
 * The attachment holds a lease: read-write, daemon jobs on the buffer wait
 * until it is released; read (read_write false), jobs that only read it go
 * on, and the mapping is read-only. Release after this process's own work
 * on the buffer is complete (cudaStreamSynchronize): release unmaps here,
 * then tells gpuqd. A lease also ends when the connection closes, or when
 * root or the admin group breaks it (an event frame `lease_broken` says so).
 * Under gpuq_set_timeout the attach waits at most that long: gpuqd is told
 * (timeout_ms) and gives it up then, granting no lease, and the call fails
 * with GPUQ_E_TIMEOUT.
 */
struct gpuq_attachment {
	void *ptr;          /* device pointer (CUdeviceptr), or host memory with host */
	uint64_t bytes;
	enum gpuq_dtype dtype;
	uint64_t count;
	uint64_t lease;     /* the lease's id (leases lists it) */
	bool read_write;
	bool host;          /* the host backend: ptr is host memory */
	int cuda_device;    /* the CUDA device ordinal in this process (-1 with host) */
	double import_s;    /* the import and mapping alone, after gpuqd answered */
	bool revocable;     /* gpuq_buffer_attach_revocable's: gpuqd may end it between uses */
	/* libgpuq's own */
	uint64_t map_bytes;
	unsigned long long handle;
	int lock_fd;        /* a revocable lease's lock, else -1 */
	unsigned uses;      /* a revocable lease's uses begun and not ended, of every thread */
	pthread_mutex_t use_mutex; /* orders uses' beginnings and ends (revocable only) */
};

int gpuq_buffer_attach(struct gpuq_client *c, const char *buffer, bool read_write,
		       struct gpuq_attachment *out, struct gpuq_error *err);
/* The same, of another user's buffer: root's (the request's `owner`, a uid). */
int gpuq_buffer_attach_as(struct gpuq_client *c, const char *buffer, uint64_t owner,
			  bool read_write, struct gpuq_attachment *out, struct gpuq_error *err);
/*
 * Copies n bytes at offset of the attached buffer into dst here (CUDA:
 * cuMemcpyDtoH; with pinned, dst is registered with the driver first, so the
 * copy runs as cudaMemcpy into pinned memory does). *seconds (may be NULL):
 * the copy alone. For checks and benchmarks; programs use their own CUDA.
 */
int gpuq_attachment_read(const struct gpuq_attachment *a, uint64_t offset, void *dst, size_t n,
			 bool pinned, double *seconds, struct gpuq_error *err);
int gpuq_buffer_release(struct gpuq_client *c, struct gpuq_attachment *a, struct gpuq_error *err);

/*
 * A revocable attach (docs/protocol.md, "Revocable leases"): for a program
 * that uses a buffer now and then and keeps its attachment between uses
 * without holding anyone up. gpuqd ends such a lease by itself when a job
 * wants the buffer while no use is in progress; between uses this process
 * sends nothing. It returns with a use begun, so that the first use cannot
 * be revoked: end it with gpuq_attachment_end_use once that work is done.
 * Refused by a gpuqd without revocable leases (GPUQ_E_BAD_REQUEST) and past
 * 64 on one connection (GPUQ_E_BUSY): a plain attach does then.
 *
 * A use: gpuq_attachment_begin_use returns 1 when the lease lives and the
 * buffer may be used, until gpuq_attachment_end_use, called once this
 * process's work on it has finished (cudaStreamSynchronize); 0 when the
 * lease has ended (revoked, released, broken, the device reset, gpuqd gone):
 * release the attachment and attach again; -1 on a failure. Uses of one
 * attachment may overlap, from any threads: gpuqd cannot end the lease
 * until the last use in progress has ended. On a plain attachment a use
 * always begins. gpuq_buffer_release of a revocable attachment, once every
 * use has ended, unmaps it and ends the lease if it still lives (one that
 * ended needs no request).
 */
int gpuq_buffer_attach_revocable(struct gpuq_client *c, const char *buffer, bool read_write,
				 struct gpuq_attachment *out, struct gpuq_error *err);
int gpuq_attachment_begin_use(struct gpuq_attachment *a, struct gpuq_error *err);
int gpuq_attachment_end_use(struct gpuq_attachment *a, struct gpuq_error *err);

/*
 * Collectives (docs/protocol.md): one primitive's fields, for a request of
 * its own or for an entry of a group's `ops`. Requests built with these are
 * sent like any other (gpuq_call, or gpuq_send with `wait` added).
 *
 *     struct gpuq_collective ag = { .op = "all_gather", .buffer = "shard",
 *                                   .out = "full" };
 *     int devices[] = { 0, 1, 2, 3 };
 *     gpuq_collective_begin(c, &req, &ag, devices, 4);
 *     mp_put_bool(&req, "wait", true);
 *     gpuq_call(c, &req, NULL, 0, &r, &err);
 */
struct gpuq_collective {
	const char *op;      /* allreduce reduce_scatter all_gather broadcast reduce sendrecv all_to_all */
	const char *buffer;  /* NAME: the input on every rank (not sendrecv) */
	const char *out;     /* NAME2: the output; NULL: in place */
	const char *src;     /* sendrecv: NAME@GPU[START:STOP] it sends from */
	const char *dst;     /* sendrecv: NAME@GPU[START:STOP] it receives into */
	const char *reduce;  /* reducing primitives: sum prod min max avg; NULL: sum */
	int root;            /* broadcast, reduce: the root rank; -1: rank 0 */
	uint64_t count;      /* NCCL's count; 0: the default from the buffers */
};

/* Adds c's fields but `op` to m (a request, or a group entry). */
void gpuq_collective_put(struct mp_map *m, const struct gpuq_collective *c);
/* Adds a group's `ops` to m: one entry (op and fields) per collective of c[0..nops). */
void gpuq_group_put(struct mp_map *m, const struct gpuq_collective *c, int nops);
/*
 * Starts a request for the collective c over devices[0..ndevices), in rank
 * order (ndevices 0: leave `devices` out for the daemon's default).
 * Returns the request id.
 */
uint64_t gpuq_collective_begin(struct gpuq_client *cl, struct mp_map *req,
			       const struct gpuq_collective *c, const int *devices, int ndevices);
/*
 * Starts a group request (op "group", or "bench_collective" for its
 * benchmark) running the nops collectives c[] as one NCCL group over
 * devices[0..ndevices). Returns the request id.
 */
uint64_t gpuq_group_begin(struct gpuq_client *cl, struct mp_map *req, const char *op,
			  const struct gpuq_collective *c, int nops, const int *devices,
			  int ndevices);

#endif
