/*
 * Kernel chains on the CUDA backend. Worker thread only (backend.h).
 *
 * A device's chain state (workers/chain/chain.c) holds, besides the plan cache, a
 * struct chain_cuda: the stream chains run on and the events that time them.
 * The stream is the chain code's own rather than the backend's compute
 * stream, so that the chain code touches none of the backend's streams
 * (it only calls down, into cuda_util.h, for the lane and the waits); ordering
 * is kept because a worker runs one job at a time and every backend
 * operation, chains included, leaves its streams idle when it returns.
 *
 * Plans. A graph-mode plan is the chain's per-op kernels (ops x repeat of
 * them) captured with stream capture in thread-local mode, so that another
 * thread's CUDA calls cannot invalidate the capture, and instantiated. A
 * fused plan is one kernel, captured the same way: the program's compiled
 * kernel (a module from the device's kernel cache, workers/chain/chain_jit.h,
 * launched with cuLaunchKernel: workers/chain/chain_module.h), or when none can be
 * had the interpreted one (the fused chain kernel for an op list, the
 * program interpreter for anything else). A reduction's plan is its tiles'
 * kernel, the kernel that folds the tiles into one result, and the copy of
 * that result to pinned host memory: the plan owns the tiles' device memory
 * and a slot of the device's pinned result block (one block, pinned once,
 * so that no plan's build or eviction pins or unpins host memory, which
 * synchronises the device). Retargeting to other buffers captures the chain again
 * and applies it with cudaGraphExecUpdate, which keeps the executable graph
 * (and its upload) and changes only the kernel parameters. Eager runs
 * launch the per-op kernels directly and use no plan. A run of more than
 * CHAIN_CHUNK_WORK_CUDA runs in chunks (workers/chain/chain.h): its plan's
 * graph holds the first chunk and is replayed for each chunk of that
 * shape, the others launched directly, at most two in flight, the cancel
 * flag looked at between them.
 *
 * Replays and baselines run on the job's lane (the scheduler's stream for
 * the job, backend.h); only stream capture uses the chain code's own
 * stream (a capture never yields, so one serves every job). Every launch
 * path ends by waiting for the lane (cuda_drain, the one place that waits,
 * yielding to the scheduler meanwhile), also on failure, so that no kernel
 * of this job still runs when it is reported finished. The plans, the
 * reductions' result slots and the timing events are the device's: the
 * scheduler runs one chain job at a time per device (sched_queue.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "workers/chain/chain.h"
#include "workers/chain/chain_jit.h"
#include "workers/chain/chain_module.h"
#include "workers/backend/cuda_check.h"
#include "workers/backend/cuda_util.h"

struct chain_cuda {
	bool ready; /* kernels loaded and stream made */
	cudaStream_t stream;
	unsigned nevents; /* pairs made so far */
	cudaEvent_t start[CHAIN_MAX_REPS], stop[CHAIN_MAX_REPS];
	cudaEvent_t chunk_done[2]; /* the last two chunks' ends: at most two chunks are in flight */
	unsigned long long *sink; /* the read kernel's device word */
	/* Reduction plans' results: one pinned slot each (used[i]), for every plan the cache can hold. */
	struct kernels_partial *results;
	bool *result_used;
	unsigned nresults;
};

struct cuda_plan {
	cudaGraphExec_t exec;
	struct chain_jit_entry *kernel; /* the compiled kernel, or NULL: interpreted */
	struct chain_kernel_info info;
	/* A reduction's: tiles' results then the folded one (device), and the host word it goes to. */
	struct kernels_partial *tiles;
	uint64_t ntiles;
	struct kernels_partial *host_result;
};

/* The program's one kernel parameter. */
static void cuda_expr(const struct chain_spec *spec, struct kernels_expr *x)
{
	memset(x, 0, sizeof *x);
	memcpy(x->var, spec->var, sizeof x->var);
	memcpy(x->store, spec->store, sizeof x->store);
	x->count = spec->count;
	x->repeat = spec->repeat;
	x->prog = spec->prog;
}

/* The compiled kernel: a grid over every element, or a reduction's persistent tile grid. */
static cudaError_t cuda_launch_compiled(const struct chain_module *m, int sms,
					const struct chain_spec *spec, const struct cuda_plan *p,
					cudaStream_t s)
{
	struct kernels_expr x;
	struct kernels_partial *tiles = p->tiles;
	void *params[2] = { &x, &tiles };
	cuda_expr(spec, &x);
	uint64_t wave = (uint64_t)(sms > 0 ? sms : 1) * (uint64_t)m->blocks_per_sm;
	if (m->reduce)
		return p->ntiles ? chain_module_launch(m, (unsigned)kernels_reduce_blocks(p->ntiles, wave),
						       params, s)
				 : cudaSuccess;
	if (spec->count == 0)
		return cudaSuccess;
	return chain_module_launch(m, kernels_elementwise_blocks(spec->count), params, s);
}

/* A fused plan's kernels: compiled or interpreted, and a reduction's fold and copy back. */
static cudaError_t cuda_enqueue_fused(const struct device *dev, const struct chain_spec *spec,
				      const struct cuda_plan *p, cudaStream_t s)
{
	struct kernels_expr x;
	cudaError_t e;
	cuda_expr(spec, &x);
	if (p->kernel)
		e = cuda_launch_compiled(chain_jit_loaded(p->kernel), dev->info.sms, spec, p, s);
	else if (spec->has_ops)
		e = kernels_chain_fused(spec->in, spec->out, spec->count,
					(enum kernels_dtype)spec->dtype, spec->ops, spec->nops,
					spec->repeat, s);
	else if (!chain_spec_is_reduce(spec))
		e = kernels_expr_run(&x, s);
	else
		e = kernels_expr_reduce(&x, p->tiles, s);
	if (e != cudaSuccess || !chain_spec_is_reduce(spec))
		return e;
	e = kernels_reduce_combine(spec->prog.reduce, p->tiles, p->ntiles, p->tiles + p->ntiles, s);
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(p->host_result, p->tiles + p->ntiles, sizeof *p->host_result,
				    cudaMemcpyDeviceToHost, s);
	return e;
}

/*
 * Enqueues spec's kernels on s: the fused plan's, or ops x repeat per-op
 * kernels, the first reading in and every one writing out. Between passes
 * it stops launching when *cancel is set (eager runs; a capture passes NULL).
 */
static cudaError_t chain_enqueue(const struct device *dev, const struct chain_spec *spec,
				 const struct cuda_plan *plan, cudaStream_t s,
				 const atomic_bool *cancel, bool *stopped)
{
	enum kernels_dtype kd = (enum kernels_dtype)spec->dtype;
	if (spec->mode == CHAIN_FUSED)
		return cuda_enqueue_fused(dev, spec, plan, s);
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

/*
 * Captures spec's kernels into a new graph (the caller destroys it): the
 * whole run, or for a run in chunks its first chunk (whole repeats over
 * every element, in place), which the run replays for each chunk of that
 * shape. Either is a function of the plan's key, so a retargeted plan
 * holds the same shape.
 */
static int cuda_capture(struct device *dev, struct chain_cuda *cc, const struct chain_spec *whole,
			const struct cuda_plan *plan, cudaGraph_t *graph, struct gpuq_error *err)
{
	struct chain_chunks k;
	struct chain_spec first;
	const struct chain_spec *spec = whole;
	chain_chunks_plan(whole, CHAIN_CHUNK_WORK_CUDA, &k);
	if (k.n > 1 && whole->mode != CHAIN_EAGER) {
		chain_chunk_spec(whole, &k, 0, &first);
		spec = &first;
	}
	CUDA_TRY(dev, err, cudaStreamBeginCapture(cc->stream, cudaStreamCaptureModeThreadLocal));
	cudaError_t launched = chain_enqueue(dev, spec, plan, cc->stream, NULL, NULL);
	cudaGraph_t g = NULL;
	cudaError_t ended = cudaStreamEndCapture(cc->stream, &g);
	if (launched == cudaSuccess && ended == cudaSuccess && g) {
		*graph = g;
		return 0;
	}
	if (g)
		CUDA_LOG(dev, cudaGraphDestroy(g));
	if (launched != cudaSuccess)
		return CUDA_FAIL(dev, err, launched, plan && plan->kernel
					   ? "cuLaunchKernel(compiled chain kernel) during stream capture"
					   : "kernels_chain_* launch during stream capture");
	return CUDA_FAIL(dev, err, ended != cudaSuccess ? ended : cudaErrorStreamCaptureInvalidated,
			 "cudaStreamEndCapture(chain stream)");
}

static struct chain_cuda *cuda_impl(struct chain_state *cs)
{
	return chain_state_impl(cs);
}

/* A free slot of the device's pinned result block, made at the first reduction plan. */
static int cuda_result_slot(struct device *dev, struct chain_cuda *cc,
			    struct kernels_partial **slot, struct gpuq_error *err)
{
	if (!cc->results) {
		/* A full cache builds its next plan before it evicts one: one more slot than plans. */
		unsigned n = 1 + (dev->config.chain_graph_cache ? dev->config.chain_graph_cache
								  : CHAIN_CACHE_DEFAULT);
		cc->result_used = calloc(n, sizeof *cc->result_used);
		if (!cc->result_used)
			return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory for results",
					 dev->index);
		CUDA_TRY(dev, err, cudaHostAlloc((void **)&cc->results, n * sizeof *cc->results,
						 cudaHostAllocDefault));
		cc->nresults = n;
	}
	for (unsigned i = 0; i < cc->nresults; i++) {
		if (!cc->result_used[i]) {
			cc->result_used[i] = true;
			*slot = &cc->results[i];
			return 0;
		}
	}
	return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] more reduction plans than the cache holds",
			 dev->index);
}

/* A reduction's tiles and result on the device, and the host slot the result comes back to. */
static int cuda_plan_reduce_memory(struct device *dev, const struct chain_spec *spec,
				   struct cuda_plan *p, struct gpuq_error *err)
{
	p->ntiles = kernels_reduce_tiles(spec->count);
	if (dev->ops->mem.alloc(dev, (p->ntiles + 1) * sizeof *p->tiles, (void **)&p->tiles, err) != 0)
		return -1;
	return cuda_result_slot(dev, cuda_impl(dev->chain), &p->host_result, err);
}

static void cuda_plan_destroy(struct device *dev, void *plan);

static int cuda_plan_build(struct device *dev, const struct chain_spec *spec, void **plan,
			   struct gpuq_error *err)
{
	struct chain_cuda *cc = cuda_impl(dev->chain);
	struct cuda_plan *p = calloc(1, sizeof *p);
	cudaGraph_t g;
	if (!p)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory for a chain plan",
				 dev->index);
	if (chain_kernel_resolve(dev, spec, &p->kernel, &p->info, err) != 0 ||
	    (chain_spec_is_reduce(spec) && cuda_plan_reduce_memory(dev, spec, p, err) != 0) ||
	    cuda_capture(dev, cc, spec, p, &g, err) != 0) {
		cuda_plan_destroy(dev, p);
		return -1;
	}
	cudaError_t e = cudaGraphInstantiate(&p->exec, g, 0);
	CUDA_LOG(dev, cudaGraphDestroy(g)); /* the executable graph does not need it */
	if (e != cudaSuccess) {
		p->exec = NULL;
		cuda_plan_destroy(dev, p);
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
	if (cuda_capture(dev, cuda_impl(dev->chain), spec, p, &g, err) != 0)
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
	struct gpuq_error ignored;
	if (!p)
		return;
	if (!dev->faulted) {
		if (p->exec)
			CUDA_LOG(dev, cudaGraphExecDestroy(p->exec));
		if (p->tiles)
			dev->ops->mem.release(dev, p->tiles, &ignored);
	}
	if (p->host_result) {
		struct chain_cuda *cc = cuda_impl(dev->chain);
		cc->result_used[p->host_result - cc->results] = false;
	}
	chain_kernel_release(dev, p->kernel);
	free(p);
}

static const struct chain_kernel_info *cuda_plan_kernel(const void *plan)
{
	return &((const struct cuda_plan *)plan)->info;
}

/* A compiled kernel's image as a module of the device's context (workers/chain/chain_jit.h's load). */
static int cuda_kernel_load(struct device *dev, const void *image, size_t size, void **loaded,
			    struct gpuq_error *err)
{
	char why[300];
	cudaError_t e;
	(void)size;
	struct chain_module *m = calloc(1, sizeof *m);
	if (!m)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory for a module",
				 dev->index);
	if (chain_module_load(image, m, &e, why, sizeof why) != 0) {
		free(m);
		if (cuda_error_is_sticky(e)) /* the context is lost: the device is faulted */
			return cuda_fail(dev, err, e, "cuModuleLoadData(compiled chain kernel)",
					 __FILE__, __LINE__);
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR, "[gpu %d] %s", dev->index, why);
	}
	*loaded = m;
	return 0;
}

static void cuda_kernel_unload(struct device *dev, void *loaded)
{
	if (!dev->faulted)
		chain_module_unload(loaded, dev->index);
	free(loaded);
}

static const struct chain_plan_ops cuda_plan_ops = {
	.build = cuda_plan_build,
	.retarget = cuda_plan_retarget,
	.destroy = cuda_plan_destroy,
	.kernel_info = cuda_plan_kernel,
	.load = cuda_kernel_load,
	.unload = cuda_kernel_unload,
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
	CUDA_TRY_GOTO(dev, err, kernels_expr_prepare(), fail);
	if (!cc->sink)
		CUDA_TRY_GOTO(dev, err, cudaMalloc((void **)&cc->sink, sizeof *cc->sink), fail);
	if (!cc->stream)
		CUDA_TRY_GOTO(dev, err, cudaStreamCreateWithFlags(&cc->stream, cudaStreamNonBlocking),
			      fail);
	for (int i = 0; i < 2; i++)
		if (!cc->chunk_done[i])
			CUDA_TRY_GOTO(dev, err, cudaEventCreateWithFlags(&cc->chunk_done[i],
									 cudaEventDisableTiming),
				      fail);
	cc->ready = true;
	return cc;
fail:
	return NULL;
}

/* Timing events for n replays. */
static int cuda_events(struct device *dev, struct chain_cuda *cc, unsigned n,
		       struct gpuq_error *err)
{
	for (; cc->nevents < n; cc->nevents++) {
		CUDA_TRY(dev, err, cudaEventCreate(&cc->start[cc->nevents]));
		cudaError_t e = cudaEventCreate(&cc->stop[cc->nevents]);
		if (e != cudaSuccess) {
			CUDA_LOG(dev, cudaEventDestroy(cc->start[cc->nevents]));
			return CUDA_FAIL(dev, err, e, "cudaEventCreate(&stop)");
		}
	}
	return 0;
}

/* The median and minimum of the n timed replays, once the stream is idle. */
static int cuda_times(struct device *dev, struct chain_cuda *cc, unsigned n, double *median,
		      double *min, struct gpuq_error *err)
{
	double t[CHAIN_MAX_REPS];
	for (unsigned r = 0; r < n; r++) {
		float ms = 0;
		CUDA_TRY(dev, err, cudaEventElapsedTime(&ms, cc->start[r], cc->stop[r]));
		t[r] = ms / 1e3;
	}
	*median = chain_median(t, n); /* sorts t */
	*min = t[0];
	return 0;
}

/*
 * One replay of a run in chunks (k->n > 1, fused or graph): the input
 * copied to the output first when out of place, then each chunk in place,
 * from the plan's graph when the chunk has the shape it captured (whole
 * repeats over every element), else launched directly. Before each chunk
 * it waits for the chunk two back, so that at most two are in flight, and
 * then looks at the cancel flag: *done is the chunks enqueued (k->n unless
 * a cancel stopped it).
 */
static int cuda_chunks(struct device *dev, struct chain_cuda *cc, const struct chain_spec *spec,
		       const struct cuda_plan *plan, const struct chain_chunks *k, cudaStream_t lane,
		       uint64_t *done, struct gpuq_error *err)
{
	struct chain_spec c;
	if (chain_chunks_copy_first(spec))
		CUDA_TRY(dev, err, cudaMemcpyAsync(spec->out, spec->in,
						   spec->count * gpuq_dtype_size(spec->dtype),
						   cudaMemcpyDeviceToDevice, lane));
	for (uint64_t i = 0; i < k->n; i++) {
		if (i >= 2 && cuda_wait_event(dev, cc->chunk_done[i % 2],
					      "waiting for a chain chunk (cudaEventQuery)", err) != 0)
			return -1;
		if (i > 0 && spec->cancel && atomic_load(spec->cancel)) {
			*done = i;
			return 0;
		}
		chain_chunk_spec(spec, k, i, &c);
		if (k->eblocks == 1 && c.repeat == k->repeat) {
			CUDA_TRY(dev, err, cudaGraphLaunch(plan->exec, lane));
		} else {
			cudaError_t e = chain_enqueue(dev, &c, plan, lane, NULL, NULL);
			if (e != cudaSuccess)
				return CUDA_FAIL(dev, err, e, "the chain's chunk (direct launch)");
		}
		CUDA_TRY(dev, err, cudaEventRecord(cc->chunk_done[i % 2], lane));
	}
	*done = k->n;
	return 0;
}

/*
 * Enqueues n timed replays: each the graph, its chunks, or the eager
 * kernels. Returns 0, or -1 with err; *stopped when a cancel stopped the
 * eager launches or the chunks (*done: the chunks enqueued).
 */
static int cuda_replays(struct device *dev, struct chain_cuda *cc, const struct chain_spec *spec,
			const struct cuda_plan *plan, const struct chain_chunks *k, unsigned n,
			bool *stopped, uint64_t *done, struct gpuq_error *err)
{
	cudaStream_t lane = cuda_current_stream(dev);
	cudaGraphExec_t exec = plan ? plan->exec : NULL;
	for (unsigned r = 0; r < n && !*stopped; r++) {
		CUDA_TRY(dev, err, cudaEventRecord(cc->start[r], lane));
		if (exec && k->n > 1) {
			if (cuda_chunks(dev, cc, spec, plan, k, lane, done, err) != 0)
				return -1;
			*stopped = *done < k->n;
		} else if (exec) {
			CUDA_TRY(dev, err, cudaGraphLaunch(exec, lane));
		} else {
			cudaError_t e = chain_enqueue(dev, spec, NULL, lane, spec->cancel, stopped);
			if (e != cudaSuccess)
				return CUDA_FAIL(dev, err, e, "kernels_chain_op (eager launch)");
		}
		CUDA_TRY(dev, err, cudaEventRecord(cc->stop[r], lane));
	}
	dev->waits->publish_tail(dev);
	return 0;
}

/* Waits for the job's lane whatever happened before (yielding): nothing may outlive the job. */
static int cuda_drain(struct device *dev, struct chain_cuda *cc, int rc, struct gpuq_error *err)
{
	(void)cc;
	struct gpuq_error drain_err;
	if (cuda_sync(dev, &drain_err) == 0 || rc != 0)
		return rc; /* the first failure is the job's; a later one may still fault the device */
	*err = drain_err;
	return -1;
}

int chain_cuda_run(struct device *dev, struct chain_spec *spec, struct gpuq_error *err)
{
	struct chain_cuda *cc = cuda_chain_state(dev, err);
	if (!cc)
		return -1;
	unsigned n = spec->reps ? spec->reps : 1;
	struct cuda_plan *plan = NULL;
	struct chain_chunks k;
	chain_chunks_plan(spec, CHAIN_CHUNK_WORK_CUDA, &k);
	if (spec->mode != CHAIN_EAGER) {
		if (chain_cache_get(dev, dev->chain, spec, (void **)&plan, err) != 0)
			return -1;
	}
	if (cuda_events(dev, cc, n, err) != 0)
		return -1;
	bool stopped = false;
	uint64_t done = 0;
	int rc = cuda_drain(dev, cc,
			    cuda_replays(dev, cc, spec, plan, &k, n, &stopped, &done, err), err);
	if (rc != 0)
		return -1;
	if (stopped && spec->mode == CHAIN_EAGER)
		return gpuq_fail(err, GPUQ_E_CANCELLED,
				 "run cancelled: the eager launches stopped at a pass boundary; the "
				 "buffer it writes holds the passes that ran");
	if (stopped)
		return chain_chunks_cancelled(err, spec, &k, done);
	spec->result.kernels = chain_kernels(spec);
	if (plan && plan->host_result)
		spec->result.value = *plan->host_result; /* the stream is idle: the copy is done */
	return cuda_times(dev, cc, n, &spec->result.device_s, &spec->result.device_min_s, err);
}

/* A baseline the benchmark times: cudaMemcpy device to device, or the read kernel. */
struct cuda_baseline {
	bool read;
	void *dst;
	const void *src;
	uint64_t bytes;
	const char *what;
};

/* Enqueues timed replay r of the baseline. */
static int cuda_baseline_one(struct device *dev, struct chain_cuda *cc, unsigned r,
			     const struct cuda_baseline *b, struct gpuq_error *err)
{
	cudaStream_t lane = cuda_current_stream(dev);
	CUDA_TRY(dev, err, cudaEventRecord(cc->start[r], lane));
	if (b->read)
		CUDA_TRY(dev, err, kernels_read(b->src, b->bytes, cc->sink, lane));
	else
		CUDA_TRY(dev, err, cudaMemcpyAsync(b->dst, b->src, b->bytes, cudaMemcpyDeviceToDevice,
						   lane));
	CUDA_TRY(dev, err, cudaEventRecord(cc->stop[r], lane));
	return 0;
}

/* reps timed replays of the baseline; *seconds is the median of one. */
static int cuda_baseline_time(struct device *dev, const struct cuda_baseline *b, unsigned reps,
			      double *seconds, struct gpuq_error *err)
{
	struct chain_cuda *cc = cuda_chain_state(dev, err);
	double min;
	if (!cc)
		return -1;
	if (reps < 1 || reps > CHAIN_MAX_REPS)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] %s timing: %u reps (1..%d)",
				 dev->index, b->what, reps, CHAIN_MAX_REPS);
	if (cuda_events(dev, cc, reps, err) != 0)
		return -1;
	int rc = 0;
	for (unsigned r = 0; r < reps && rc == 0; r++)
		rc = cuda_baseline_one(dev, cc, r, b, err);
	if (cuda_drain(dev, cc, rc, err) != 0)
		return -1;
	return cuda_times(dev, cc, reps, seconds, &min, err);
}

int chain_cuda_copy_time(struct device *dev, void *dst, const void *src, uint64_t bytes,
			 unsigned reps, double *seconds, struct gpuq_error *err)
{
	struct cuda_baseline b = { false, dst, src, bytes, "copy" };
	return cuda_baseline_time(dev, &b, reps, seconds, err);
}

int chain_cuda_read_time(struct device *dev, const void *src, uint64_t bytes, unsigned reps,
			 double *seconds, struct gpuq_error *err)
{
	struct cuda_baseline b = { true, NULL, src, bytes, "read" };
	return cuda_baseline_time(dev, &b, reps, seconds, err);
}

int chain_cuda_enqueue(struct device *dev, const struct chain_spec *spec, struct gpuq_error *err)
{
	struct chain_cuda *cc = cuda_chain_state(dev, err);
	const struct cuda_plan interpreted = { 0 }; /* the built-in kernels: no compiled one, no partials */
	if (!cc)
		return -1;
	if (chain_spec_is_reduce(spec))
		return gpuq_fail(err, GPUQ_E_INTERNAL,
				 "[gpu %d] a reduction cannot be enqueued without its plan", dev->index);
	cudaError_t e = chain_enqueue(dev, spec, &interpreted, cuda_current_stream(dev), NULL, NULL);
	return e == cudaSuccess ? 0 : CUDA_FAIL(dev, err, e, "the fused chain (enqueued)");
}

void chain_cuda_close(struct device *dev)
{
	struct chain_cuda *cc = chain_state_close(dev);
	if (!cc)
		return;
	if (!dev->faulted) {
		if (cc->sink)
			CUDA_LOG(dev, cudaFree(cc->sink));
		if (cc->results)
			CUDA_LOG(dev, cudaFreeHost(cc->results));
		for (unsigned i = 0; i < cc->nevents; i++) {
			CUDA_LOG(dev, cudaEventDestroy(cc->start[i]));
			CUDA_LOG(dev, cudaEventDestroy(cc->stop[i]));
		}
		for (int i = 0; i < 2; i++)
			if (cc->chunk_done[i])
				CUDA_LOG(dev, cudaEventDestroy(cc->chunk_done[i]));
		if (cc->stream) {
			CUDA_LOG(dev, cudaStreamSynchronize(cc->stream));
			CUDA_LOG(dev, cudaStreamDestroy(cc->stream));
		}
	}
	free(cc->result_used);
	free(cc);
}
