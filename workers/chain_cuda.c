/*
 * Kernel chains on the CUDA backend. Worker thread only (backend.h).
 *
 * A device's chain state (workers/chain.c) holds, besides the plan cache, a
 * struct chain_cuda: the stream chains are captured on. Runs replay on the
 * job's lane (the scheduler's stream for the job, backend.h), so that
 * chains of several jobs in flight run side by side, each timed by events
 * of its own (struct chain_timing, on the job's stack).
 *
 * Plans. A graph-mode plan is the chain's per-op kernels (ops x repeat of
 * them) captured with stream capture in thread-local mode, so that another
 * thread's CUDA calls cannot invalidate the capture, and instantiated. A
 * fused plan is the one fused kernel, captured the same way. Retargeting to
 * other buffers captures the chain again and applies it with
 * cudaGraphExecUpdate, which keeps the executable graph (and its upload)
 * and changes only the kernel parameters. Eager runs launch the same
 * kernels directly and use no plan.
 *
 * Every launch path ends by waiting for the lane (yielding to the
 * scheduler meanwhile), also on failure, so that no kernel of this job
 * still runs when the job is reported finished.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "workers/chain.h"
#include "workers/cuda_check.h"
#include "workers/sched.h"

struct chain_cuda {
	bool ready; /* kernels loaded and stream made */
	cudaStream_t stream; /* for stream capture only: a capture never yields, so one serves all */
};

/* The events that time one run's replays. */
struct chain_timing {
	unsigned n; /* pairs made */
	cudaEvent_t start[CHAIN_MAX_REPS], stop[CHAIN_MAX_REPS];
};

struct cuda_plan {
	cudaGraphExec_t exec;
};

/*
 * Enqueues spec's kernels on s: the fused kernel, or ops x repeat per-op
 * kernels, the first reading in and every one writing out. Between passes
 * it stops launching when *cancel is set (eager runs; a capture passes NULL).
 */
static cudaError_t chain_enqueue(const struct chain_spec *spec, cudaStream_t s,
				 const atomic_bool *cancel, bool *stopped)
{
	enum kernels_dtype kd = (enum kernels_dtype)spec->dtype;
	if (spec->mode == CHAIN_FUSED)
		return kernels_chain_fused(spec->in, spec->out, spec->count, kd, spec->ops, spec->nops,
					   spec->repeat, s);
	for (uint64_t p = 0; p < spec->repeat; p++) {
		if (cancel && p > 0 && atomic_load(cancel)) {
			*stopped = true;
			return cudaSuccess;
		}
		for (unsigned i = 0; i < spec->nops; i++) {
			const void *src = p == 0 && i == 0 ? spec->in : spec->out;
			cudaError_t e = kernels_chain_op(src, spec->out, spec->count, kd, &spec->ops[i], s);
			if (e != cudaSuccess)
				return e;
		}
	}
	return cudaSuccess;
}

/* Captures spec's kernels into a new graph (the caller destroys it). */
static int cuda_capture(struct device *dev, struct chain_cuda *cc, const struct chain_spec *spec,
			cudaGraph_t *graph, struct gpuq_error *err)
{
	CUDA_TRY(dev, err, cudaStreamBeginCapture(cc->stream, cudaStreamCaptureModeThreadLocal));
	cudaError_t launched = chain_enqueue(spec, cc->stream, NULL, NULL);
	cudaGraph_t g = NULL;
	cudaError_t ended = cudaStreamEndCapture(cc->stream, &g);
	if (launched == cudaSuccess && ended == cudaSuccess && g) {
		*graph = g;
		return 0;
	}
	if (g)
		CUDA_LOG(dev, cudaGraphDestroy(g));
	if (launched != cudaSuccess)
		return CUDA_FAIL(dev, err, launched, "kernels_chain_* launch during stream capture");
	return CUDA_FAIL(dev, err, ended != cudaSuccess ? ended : cudaErrorStreamCaptureInvalidated,
			 "cudaStreamEndCapture(chain stream)");
}

static struct chain_cuda *cuda_impl(struct chain_state *cs)
{
	return chain_state_impl(cs);
}

static int cuda_plan_build(struct device *dev, const struct chain_spec *spec, void **plan,
			   struct gpuq_error *err)
{
	struct chain_cuda *cc = cuda_impl(dev->chain);
	struct cuda_plan *p = calloc(1, sizeof *p);
	cudaGraph_t g;
	if (!p)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory for a chain plan",
				 dev->index);
	if (cuda_capture(dev, cc, spec, &g, err) != 0) {
		free(p);
		return -1;
	}
	cudaError_t e = cudaGraphInstantiate(&p->exec, g, 0);
	CUDA_LOG(dev, cudaGraphDestroy(g)); /* the executable graph does not need it */
	if (e != cudaSuccess) {
		free(p);
		return CUDA_FAIL(dev, err, e, "cudaGraphInstantiate(chain graph)");
	}
	*plan = p;
	return 0;
}

/* 1 when CUDA cannot update the graph in place (the cache then builds another). */
static int cuda_plan_retarget(struct device *dev, void *plan, const struct chain_spec *spec,
			      struct gpuq_error *err)
{
	struct cuda_plan *p = plan;
	cudaGraph_t g;
	cudaGraphExecUpdateResultInfo info;
	if (cuda_capture(dev, cuda_impl(dev->chain), spec, &g, err) != 0)
		return -1;
	memset(&info, 0, sizeof info);
	cudaError_t e = cudaGraphExecUpdate(p->exec, g, &info);
	CUDA_LOG(dev, cudaGraphDestroy(g));
	if (e == cudaErrorGraphExecUpdateFailure) {
		(void)cudaGetLastError();
		return 1;
	}
	if (e != cudaSuccess)
		return CUDA_FAIL(dev, err, e, "cudaGraphExecUpdate(chain graph)");
	return 0;
}

/* A faulted context fails every call: then only the host memory is freed. */
static void cuda_plan_destroy(struct device *dev, void *plan)
{
	struct cuda_plan *p = plan;
	if (!p)
		return;
	if (!dev->faulted)
		CUDA_LOG(dev, cudaGraphExecDestroy(p->exec));
	free(p);
}

static const struct chain_plan_ops cuda_plan_ops = {
	.build = cuda_plan_build,
	.retarget = cuda_plan_retarget,
	.destroy = cuda_plan_destroy,
};

/*
 * The device's chain state with its CUDA part, made on first use: the
 * kernels are loaded (and their geometry computed) here, outside any
 * capture. A failed attempt is retried by the next chain.
 */
static struct chain_cuda *cuda_chain_state(struct device *dev, struct gpuq_error *err)
{
	struct chain_state *cs = chain_state_get(dev, &cuda_plan_ops, err);
	if (!cs)
		return NULL;
	struct chain_cuda *cc = cuda_impl(cs);
	if (cc && cc->ready)
		return cc;
	if (!cc) {
		cc = calloc(1, sizeof *cc);
		if (!cc) {
			gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				  "[gpu %d] no host memory for the chain state", dev->index);
			return NULL;
		}
		chain_state_set_impl(cs, cc);
	}
	CUDA_TRY_GOTO(dev, err, kernels_chain_prepare(), fail);
	if (!cc->stream)
		CUDA_TRY_GOTO(dev, err, cudaStreamCreateWithFlags(&cc->stream, cudaStreamNonBlocking),
			      fail);
	cc->ready = true;
	return cc;
fail:
	return NULL;
}

/* Timing events for n replays (t zeroed by the caller). */
static int cuda_events(struct device *dev, struct chain_timing *t, unsigned n,
		       struct gpuq_error *err)
{
	for (; t->n < n; t->n++) {
		CUDA_TRY(dev, err, cudaEventCreate(&t->start[t->n]));
		cudaError_t e = cudaEventCreate(&t->stop[t->n]);
		if (e != cudaSuccess) {
			CUDA_LOG(dev, cudaEventDestroy(t->start[t->n]));
			return CUDA_FAIL(dev, err, e, "cudaEventCreate(&stop)");
		}
	}
	return 0;
}

static void cuda_events_destroy(struct device *dev, struct chain_timing *t)
{
	for (unsigned i = 0; i < t->n && !dev->faulted; i++) {
		CUDA_LOG(dev, cudaEventDestroy(t->start[i]));
		CUDA_LOG(dev, cudaEventDestroy(t->stop[i]));
	}
	t->n = 0;
}

/* The median and minimum of the n timed replays, once the lane is idle. */
static int cuda_times(struct device *dev, const struct chain_timing *tm, unsigned n,
		      double *median, double *min, struct gpuq_error *err)
{
	double t[CHAIN_MAX_REPS];
	for (unsigned r = 0; r < n; r++) {
		float ms = 0;
		CUDA_TRY(dev, err, cudaEventElapsedTime(&ms, tm->start[r], tm->stop[r]));
		t[r] = ms / 1e3;
	}
	*median = chain_median(t, n); /* sorts t */
	*min = t[0];
	return 0;
}

/*
 * Enqueues n timed replays on the job's lane: each the graph, or the eager
 * kernels. Returns 0, or -1 with err; *stopped when a cancel stopped the
 * eager launches.
 */
static int cuda_replays(struct device *dev, const struct chain_timing *t,
			const struct chain_spec *spec, cudaGraphExec_t exec, unsigned n,
			bool *stopped, struct gpuq_error *err)
{
	cudaStream_t s = cuda_current_stream(dev);
	for (unsigned r = 0; r < n && !*stopped; r++) {
		CUDA_TRY(dev, err, cudaEventRecord(t->start[r], s));
		if (exec) {
			CUDA_TRY(dev, err, cudaGraphLaunch(exec, s));
		} else {
			cudaError_t e = chain_enqueue(spec, s, spec->cancel, stopped);
			if (e != cudaSuccess)
				return CUDA_FAIL(dev, err, e, "kernels_chain_op (eager launch)");
		}
		CUDA_TRY(dev, err, cudaEventRecord(t->stop[r], s));
	}
	sched_publish_tail(dev);
	return 0;
}

/* Waits for the lane whatever happened before: nothing may outlive the job. */
static int cuda_drain(struct device *dev, int rc, struct gpuq_error *err)
{
	struct gpuq_error drain_err;
	if (cuda_sync(dev, &drain_err) == 0 || rc != 0)
		return rc; /* the first failure is the job's; a later one may still fault the device */
	*err = drain_err;
	return -1;
}

int chain_cuda_run(struct device *dev, struct chain_spec *spec, struct gpuq_error *err)
{
	struct chain_cuda *cc = cuda_chain_state(dev, err);
	struct chain_timing t = { 0 };
	if (!cc)
		return -1;
	unsigned n = spec->reps ? spec->reps : 1;
	cudaGraphExec_t exec = NULL;
	if (spec->mode != CHAIN_EAGER) {
		void *plan;
		if (chain_cache_get(dev, dev->chain, spec, &plan, err) != 0)
			return -1;
		exec = ((struct cuda_plan *)plan)->exec;
	}
	bool stopped = false;
	int rc = cuda_events(dev, &t, n, err);
	if (rc == 0)
		rc = cuda_drain(dev, cuda_replays(dev, &t, spec, exec, n, &stopped, err), err);
	if (rc == 0 && stopped)
		rc = gpuq_fail(err, GPUQ_E_CANCELLED,
			       "run cancelled: the eager launches stopped at a pass boundary");
	if (rc == 0) {
		spec->result.kernels = chain_kernels(spec);
		rc = cuda_times(dev, &t, n, &spec->result.device_s, &spec->result.device_min_s, err);
	}
	cuda_events_destroy(dev, &t);
	return rc;
}

/* Enqueues timed replay r of the baseline copy on the job's lane. */
static int cuda_copy_one(struct device *dev, const struct chain_timing *t, unsigned r, void *dst,
			 const void *src, uint64_t bytes, struct gpuq_error *err)
{
	cudaStream_t s = cuda_current_stream(dev);
	CUDA_TRY(dev, err, cudaEventRecord(t->start[r], s));
	CUDA_TRY(dev, err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
	CUDA_TRY(dev, err, cudaEventRecord(t->stop[r], s));
	return 0;
}

int chain_cuda_copy_time(struct device *dev, void *dst, const void *src, uint64_t bytes,
			 unsigned reps, double *seconds, struct gpuq_error *err)
{
	struct chain_cuda *cc = cuda_chain_state(dev, err);
	struct chain_timing t = { 0 };
	double min;
	if (!cc)
		return -1;
	if (reps < 1 || reps > CHAIN_MAX_REPS)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] copy timing: %u reps (1..%d)",
				 dev->index, reps, CHAIN_MAX_REPS);
	int rc = cuda_events(dev, &t, reps, err);
	for (unsigned r = 0; r < reps && rc == 0; r++)
		rc = cuda_copy_one(dev, &t, r, dst, src, bytes, err);
	rc = cuda_drain(dev, rc, err);
	if (rc == 0)
		rc = cuda_times(dev, &t, reps, seconds, &min, err);
	cuda_events_destroy(dev, &t);
	return rc;
}

int chain_cuda_enqueue(struct device *dev, const struct chain_spec *spec, struct gpuq_error *err)
{
	if (!cuda_chain_state(dev, err))
		return -1;
	CUDA_TRY(dev, err,
		 kernels_chain_fused(spec->in, spec->out, spec->count, (enum kernels_dtype)spec->dtype,
				     spec->ops, spec->nops, spec->repeat, cuda_current_stream(dev)));
	return 0;
}

void chain_cuda_close(struct device *dev)
{
	struct chain_cuda *cc = chain_state_close(dev);
	if (!cc)
		return;
	if (!dev->faulted) {
		if (cc->stream) {
			CUDA_LOG(dev, cudaStreamSynchronize(cc->stream));
			CUDA_LOG(dev, cudaStreamDestroy(cc->stream));
		}
	}
	free(cc);
}
