/*
 * The CUDA backend's collectives, over NCCL. Worker threads only: every
 * function runs on the worker that owns dev, whose device is current there.
 *
 * A communicator here is struct cuda_comm: this rank's NCCL communicator and
 * a stream of its own for its collectives. backend_cuda.c's streams are
 * private to it, and every job leaves all of its device's streams idle when
 * it ends, so work on this stream is ordered after and before every other
 * job by the worker itself.
 *
 * A job's primitives (spec->tasks) are enqueued by cuda_coll_issue, each
 * with NCCL's own call (all_to_all as a send and a receive with every
 * rank), between ncclGroupStart and ncclGroupEnd when there are several or
 * the primitive is made of several calls; a lone collective is issued bare,
 * as nccl-tests issues it. The benchmark's raw loop issues the same calls.
 *
 * Communicators are non-blocking (config.blocking = 0):
 * ncclCommInitRankConfig returns at once and the worker polls
 * ncclCommGetAsyncError until the state is ncclSuccess, while coll_poll
 * watches the deadline, the collective's failure flag and the part's cancel
 * flag. Any call that returns ncclInProgress is settled the same way before
 * the next NCCL call, as NCCL requires. Completion of a collective is polled
 * with cudaStreamQuery (or cudaEventQuery), checking the communicator's
 * asynchronous error along the way.
 *
 * ncclCommAbort and ncclCommDestroy block even for non-blocking
 * communicators; within one process NCCL frees a communicator's shared
 * resources when the last of its local ranks destroys or aborts it, so
 * neither waits for the other ranks. Abort also stops kernels still running
 * (NCCL's abort flag), which is what frees the ranks of a hung collective.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "workers/clock.h"
#include "workers/log.h"
#include "workers/collective/collective_cuda.h"
#include "workers/backend/cuda_check.h"
#include "workers/backend/nccl_check.h"

_Static_assert(sizeof(ncclUniqueId) == COLL_ID_BYTES, "COLL_ID_BYTES must be NCCL_UNIQUE_ID_BYTES");

/*
 * NVLink multicast (NVLS) stays off unless the operator set NCCL_NVLS_ENABLE
 * (docs/ARCHITECTURE.md says why). This runs before main, while the process
 * has a single thread, so it cannot race with any getenv (NCCL's included).
 */
__attribute__((constructor)) static void cuda_coll_default_environment(void)
{
	setenv("NCCL_NVLS_ENABLE", "0", 0);
}

struct cuda_comm {
	ncclComm_t comm;
	cudaStream_t stream;
};

static const char *nccl_result_name(ncclResult_t r)
{
	switch (r) {
	case ncclSuccess: return "ncclSuccess";
	case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
	case ncclSystemError: return "ncclSystemError";
	case ncclInternalError: return "ncclInternalError";
	case ncclInvalidArgument: return "ncclInvalidArgument";
	case ncclInvalidUsage: return "ncclInvalidUsage";
	case ncclRemoteError: return "ncclRemoteError";
	case ncclInProgress: return "ncclInProgress";
	default: return "ncclResult?";
	}
}

int nccl_fail(struct device *dev, struct gpuq_error *err, ncclResult_t r, const char *call,
	      const char *file, int line)
{
	const char *last = ncclGetLastError(NULL);
	return gpuq_fail(err, GPUQ_E_DEVICE_ERROR, "[gpu %d] %s failed: %s (%s)%s%s at %s:%d",
			 dev->index, call, ncclGetErrorString(r), nccl_result_name(r),
			 last && *last ? ": " : "", last ? last : "", file, line);
}

void nccl_log_teardown_error(const struct device *dev, ncclResult_t r, const char *call,
			     const char *file, int line)
{
	log_warn("[gpu %d] %s failed during teardown: %s (%s) at %s:%d",
		dev->index, call, ncclGetErrorString(r), nccl_result_name(r), file, line);
}

/* NCCL's type of a dtype (bytes move as ncclUint8) and op of a reduction. */
static int cuda_coll_types(struct device *dev, const struct coll_task *t, ncclDataType_t *type,
			   ncclRedOp_t *op, struct gpuq_error *err)
{
	static const ncclRedOp_t ops[] = { [COLL_SUM] = ncclSum, [COLL_PROD] = ncclProd,
					   [COLL_MIN] = ncclMin, [COLL_MAX] = ncclMax,
					   [COLL_AVG] = ncclAvg };
	switch (t->dtype) {
	case GPUQ_DTYPE_BYTES:
	case GPUQ_DTYPE_U8: *type = ncclUint8; break;
	case GPUQ_DTYPE_I32: *type = ncclInt32; break;
	case GPUQ_DTYPE_I64: *type = ncclInt64; break;
	case GPUQ_DTYPE_F16: *type = ncclFloat16; break;
	case GPUQ_DTYPE_BF16: *type = ncclBfloat16; break;
	case GPUQ_DTYPE_F32: *type = ncclFloat32; break;
	case GPUQ_DTYPE_F64: *type = ncclFloat64; break;
	default:
		return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] %s: dtype %s has no NCCL type",
				 dev->index, coll_prim_name(t->layout.prim), gpuq_dtype_name(t->dtype));
	}
	if ((unsigned)t->op >= sizeof ops / sizeof ops[0])
		return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] %s: op %d unknown", dev->index,
				 coll_prim_name(t->layout.prim), (int)t->op);
	*op = ops[t->op];
	return 0;
}

/* Polls a non-blocking communicator until its last call has settled. */
static int cuda_coll_settle(struct device *dev, ncclComm_t comm, struct coll_call *call,
			    const char *what, struct gpuq_error *err)
{
	for (;;) {
		ncclResult_t state = ncclSuccess;
		NCCL_TRY(dev, err, ncclCommGetAsyncError(comm, &state));
		if (state == ncclSuccess)
			return 0;
		if (state != ncclInProgress)
			return NCCL_FAIL(dev, err, state, what);
		if (coll_poll(call, err) < 0)
			return -1;
		coll_pause(call);
	}
}

/* An error NCCL met while the collective ran (a peer gone, a network fault). */
static int cuda_coll_check_async(struct device *dev, struct cuda_comm *c, struct gpuq_error *err)
{
	ncclResult_t state = ncclSuccess;
	NCCL_TRY(dev, err, ncclCommGetAsyncError(c->comm, &state));
	if (state != ncclSuccess && state != ncclInProgress)
		return NCCL_FAIL(dev, err, state, "the communicator (ncclCommGetAsyncError)");
	return 0;
}

/* all_to_all as NCCL's own tests run it: a send and a receive of block j with every rank j. */
static ncclResult_t cuda_coll_all_to_all(const struct coll_task *t, int r, ncclDataType_t type,
					 struct cuda_comm *c, const char **what)
{
	size_t n = (size_t)t->layout.count, block = n * gpuq_dtype_size(t->dtype);
	for (int j = 0; j < t->layout.nranks; j++) {
		*what = "ncclSend(in + j*count, count, type, j, comm, stream)";
		ncclResult_t res = ncclSend((const char *)t->in[r] + (size_t)j * block, n, type, j,
					    c->comm, c->stream);
		if (res != ncclSuccess && res != ncclInProgress)
			return res;
		*what = "ncclRecv(out + j*count, count, type, j, comm, stream)";
		res = ncclRecv((char *)t->out[r] + (size_t)j * block, n, type, j, c->comm, c->stream);
		if (res != ncclSuccess && res != ncclInProgress)
			return res;
	}
	return ncclSuccess;
}

/* sendrecv: the sender sends, the receiver receives (both, sending to itself). */
static ncclResult_t cuda_coll_sendrecv(const struct coll_task *t, int r, ncclDataType_t type,
				       struct cuda_comm *c, const char **what)
{
	const struct coll_layout *l = &t->layout;
	ncclResult_t res = ncclSuccess;
	if (r == l->root) {
		*what = "ncclSend(in, count, type, peer, comm, stream)";
		res = ncclSend(t->in[r], (size_t)l->count, type, l->peer, c->comm, c->stream);
	}
	if (r == l->peer && (res == ncclSuccess || res == ncclInProgress)) {
		*what = "ncclRecv(out, count, type, root, comm, stream)";
		res = ncclRecv(t->out[r], (size_t)l->count, type, l->root, c->comm, c->stream);
	}
	return res;
}

/*
 * Enqueues rank r's calls for one primitive, with NCCL's arguments: the
 * root's input for broadcast (the others pass their output, as ncclBcast
 * does), NULL for reduce's output off the root (nccl.h allows it).
 */
static ncclResult_t cuda_coll_enqueue(const struct coll_task *t, int r, ncclDataType_t type,
				      ncclRedOp_t op, struct cuda_comm *c, const char **what)
{
	const struct coll_layout *l = &t->layout;
	size_t n = (size_t)l->count;
	switch (l->prim) {
	case COLL_ALLREDUCE:
		*what = "ncclAllReduce(in, out, count, type, op, comm, stream)";
		return ncclAllReduce(t->in[r], t->out[r], n, type, op, c->comm, c->stream);
	case COLL_REDUCE_SCATTER:
		*what = "ncclReduceScatter(in, out, recvcount, type, op, comm, stream)";
		return ncclReduceScatter(t->in[r], t->out[r], n, type, op, c->comm, c->stream);
	case COLL_ALL_GATHER:
		*what = "ncclAllGather(in, out, sendcount, type, comm, stream)";
		return ncclAllGather(t->in[r], t->out[r], n, type, c->comm, c->stream);
	case COLL_BROADCAST:
		*what = "ncclBroadcast(in, out, count, type, root, comm, stream)";
		return ncclBroadcast(r == l->root ? t->in[r] : t->out[r], t->out[r], n, type, l->root,
				     c->comm, c->stream);
	case COLL_REDUCE:
		*what = "ncclReduce(in, out, count, type, op, root, comm, stream)";
		return ncclReduce(t->in[r], r == l->root ? t->out[r] : NULL, n, type, op, l->root,
				  c->comm, c->stream);
	case COLL_SENDRECV: return cuda_coll_sendrecv(t, r, type, c, what);
	case COLL_ALL_TO_ALL: return cuda_coll_all_to_all(t, r, type, c, what);
	}
	*what = "an unknown primitive";
	return ncclInvalidArgument;
}

/*
 * Whether the job's calls go between ncclGroupStart and ncclGroupEnd:
 * several primitives (a group request), or one made of several calls that
 * must progress together (all_to_all's sends and receives, a send to
 * oneself). A lone collective is issued bare, as nccl-tests issues it.
 */
static bool cuda_coll_grouped(const struct coll_spec *spec)
{
	enum coll_prim p = spec->tasks[0].layout.prim;
	return spec->ntasks > 1 || p == COLL_SENDRECV || p == COLL_ALL_TO_ALL;
}

/* Enqueues every primitive of the job once, as one group where it needs one. */
static int cuda_coll_issue(struct device *dev, struct cuda_comm *c, struct coll_call *call,
			   struct gpuq_error *err)
{
	const struct coll_spec *spec = call->spec;
	bool grouped = cuda_coll_grouped(spec);
	ncclResult_t res = ncclSuccess;
	const char *what = "ncclGroupEnd()";
	if (grouped)
		NCCL_TRY(dev, err, ncclGroupStart());
	for (int i = 0; i < spec->ntasks && (res == ncclSuccess || res == ncclInProgress); i++) {
		ncclDataType_t type = ncclUint8;
		ncclRedOp_t op = ncclSum;
		if (cuda_coll_types(dev, &spec->tasks[i], &type, &op, err) < 0) {
			if (grouped)
				NCCL_LOG(dev, ncclGroupEnd());
			return -1;
		}
		res = cuda_coll_enqueue(&spec->tasks[i], call->rank, type, op, c, &what);
	}
	if (grouped) {
		/* Always closed, even after a failed call: NCCL cleans the group up there. */
		ncclResult_t end = ncclGroupEnd();
		if (res == ncclSuccess || res == ncclInProgress) {
			res = end;
			what = "ncclGroupEnd()";
		}
	}
	if (res == ncclInProgress)
		return cuda_coll_settle(dev, c->comm, call, what, err);
	if (res != ncclSuccess)
		return NCCL_FAIL(dev, err, res, what);
	return 0;
}

/*
 * Waits until the stream (or the event done, when given) has completed,
 * polling the communicator's asynchronous error, the deadline, the
 * collective's failure and the part's cancel flag.
 */
static int cuda_coll_wait(struct device *dev, struct cuda_comm *c, cudaEvent_t done,
			  struct coll_call *call, struct gpuq_error *err)
{
	bool polled = false;
	for (unsigned turn = 1;; turn++) {
		cudaError_t e = done ? cudaEventQuery(done) : cudaStreamQuery(c->stream);
		if (e == cudaSuccess)
			break;
		if (e != cudaErrorNotReady)
			return CUDA_FAIL(dev, err, e,
					 done ? "cudaEventQuery(done)" : "cudaStreamQuery(stream)");
		polled = true;
		if (turn % 16 == 0 && cuda_coll_check_async(dev, c, err) < 0)
			return -1;
		if (coll_poll(call, err) < 0)
			return -1;
		coll_pause(call);
	}
	if (polled)
		(void)cudaGetLastError(); /* "not ready" is no error for later launch checks */
	return cuda_coll_check_async(dev, c, err);
}

int cuda_coll_unique_id(struct device *dev, struct coll_id *id, struct gpuq_error *err)
{
	ncclUniqueId uid;
	NCCL_TRY(dev, err, ncclGetUniqueId(&uid));
	memcpy(id->bytes, &uid, sizeof uid);
	return 0;
}

static void cuda_coll_free(struct device *dev, struct cuda_comm *c)
{
	if (c->stream)
		CUDA_LOG(dev, cudaStreamDestroy(c->stream));
	free(c);
}

void cuda_coll_comm_abort(struct device *dev, void *comm)
{
	struct cuda_comm *c = comm;
	if (!c)
		return;
	if (c->comm)
		NCCL_LOG(dev, ncclCommAbort(c->comm));
	cuda_coll_free(dev, c);
}

int cuda_coll_comm_init(struct device *dev, struct coll_call *call, const struct coll_id *id,
			void **comm, struct gpuq_error *err)
{
	struct cuda_comm *c = calloc(1, sizeof *c);
	if (!c)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "[gpu %d] no host memory for a communicator", dev->index);
	ncclUniqueId uid;
	memcpy(&uid, id->bytes, sizeof uid);
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	config.blocking = 0;
	CUDA_TRY_GOTO(dev, err, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), fail);
	ncclResult_t r = ncclCommInitRankConfig(&c->comm, call->spec->nranks, uid, call->rank,
						&config);
	if (r != ncclSuccess && r != ncclInProgress) {
		NCCL_FAIL(dev, err, r, "ncclCommInitRankConfig(&comm, nranks, id, rank, {blocking = 0})");
		goto fail;
	}
	if (cuda_coll_settle(dev, c->comm, call, "ncclCommInitRankConfig", err) < 0)
		goto fail;
	*comm = c;
	return 0;
fail:
	cuda_coll_comm_abort(dev, c);
	return -1;
}

/* Finalizes within COLL_FINALIZE_S; false when it failed or took too long. */
static bool cuda_coll_finalize(struct device *dev, struct cuda_comm *c)
{
	ncclResult_t r = ncclCommFinalize(c->comm);
	if (r != ncclSuccess && r != ncclInProgress) {
		nccl_log_teardown_error(dev, r, "ncclCommFinalize(comm)", __FILE__, __LINE__);
		return false;
	}
	double deadline = monotonic_seconds() + COLL_FINALIZE_S;
	for (;;) {
		ncclResult_t state = ncclSuccess;
		r = ncclCommGetAsyncError(c->comm, &state);
		if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
			nccl_log_teardown_error(dev, r != ncclSuccess ? r : state,
						"ncclCommFinalize(comm), then ncclCommGetAsyncError",
						__FILE__, __LINE__);
			return false;
		}
		if (state == ncclSuccess)
			return true;
		if (monotonic_seconds() > deadline) {
			log_warn("[gpu %d] ncclCommFinalize did not finish within %.0f s; "
				 "aborting the communicator",
				dev->index, COLL_FINALIZE_S);
			return false;
		}
		struct timespec t = { 0, 100000 };
		nanosleep(&t, NULL);
	}
}

void cuda_coll_comm_destroy(struct device *dev, void *comm)
{
	struct cuda_comm *c = comm;
	if (!c)
		return;
	if (c->comm && cuda_coll_finalize(dev, c))
		NCCL_LOG(dev, ncclCommDestroy(c->comm));
	else if (c->comm)
		NCCL_LOG(dev, ncclCommAbort(c->comm));
	cuda_coll_free(dev, c);
}

int cuda_coll_run(struct device *dev, void *comm, struct coll_call *call, struct gpuq_error *err)
{
	struct cuda_comm *c = comm;
	if (cuda_coll_issue(dev, c, call, err) < 0)
		return -1;
	return cuda_coll_wait(dev, c, NULL, call, err);
}

/* One timed batch: iters runs of the job's primitives back to back between two events. */
static int cuda_coll_batch(struct device *dev, struct cuda_comm *c, struct coll_call *call,
			   cudaEvent_t start, cudaEvent_t stop, double *us, struct gpuq_error *err)
{
	const struct coll_spec *spec = call->spec;
	coll_wait_begin(call, spec->timeout_s, "the benchmark loop");
	CUDA_TRY(dev, err, cudaEventRecord(start, c->stream));
	for (unsigned i = 0; i < spec->iters; i++)
		if (cuda_coll_issue(dev, c, call, err) < 0)
			return -1;
	CUDA_TRY(dev, err, cudaEventRecord(stop, c->stream));
	if (cuda_coll_wait(dev, c, stop, call, err) < 0)
		return -1;
	float ms = 0;
	CUDA_TRY(dev, err, cudaEventElapsedTime(&ms, start, stop));
	*us = (double)ms * 1e3 / (spec->iters ? spec->iters : 1);
	return 0;
}

/*
 * The baseline: the job's NCCL calls in a raw loop on this communicator,
 * the same calls cuda_coll_run makes, timed with CUDA events: warm-up, then
 * `repeats` batches of `iters`; the median batch's time per run goes to
 * spec->bench_us[rank].
 */
int cuda_coll_bench(struct device *dev, void *comm, struct coll_call *call,
		    struct gpuq_error *err)
{
	struct cuda_comm *c = comm;
	struct coll_spec *spec = call->spec;
	cudaEvent_t start = NULL, stop = NULL;
	double *samples = calloc(spec->repeats ? spec->repeats : 1, sizeof *samples);
	int rc = -1;
	if (!samples)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] bench: no memory for %u samples",
				 dev->index, spec->repeats);
	CUDA_TRY_GOTO(dev, err, cudaEventCreate(&start), out);
	CUDA_TRY_GOTO(dev, err, cudaEventCreate(&stop), out);
	for (unsigned w = 0; w < spec->warmup; w++)
		if (cuda_coll_issue(dev, c, call, err) < 0)
			goto out;
	if (cuda_coll_wait(dev, c, NULL, call, err) < 0)
		goto out;
	for (unsigned rep = 0; rep < spec->repeats; rep++)
		if (cuda_coll_batch(dev, c, call, start, stop, &samples[rep], err) < 0)
			goto out;
	spec->bench_us[call->rank] = coll_median(samples, spec->repeats);
	rc = 0;
out:
	if (stop)
		CUDA_LOG(dev, cudaEventDestroy(stop));
	if (start)
		CUDA_LOG(dev, cudaEventDestroy(start));
	free(samples);
	return rc;
}
