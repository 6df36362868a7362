/*
 * What a worker does with each kind of work. Worker thread only; every
 * device operation goes through the backend table, so this file serves the
 * CUDA and the host backend alike.
 */
#include "workers/chain.h"
#include "workers/chain_bench.h"
#include "workers/clock.h"
#include "workers/bench_copy.h"
#include "workers/bench_d2d.h"
#include "workers/copy.h"
#include "workers/collective.h"
#include "workers/transfer.h"
#include "workers/worker.h"


const char *work_kind_name(enum work_kind kind)
{
	switch (kind) {
	case WORK_NOOP: return "noop";
	case WORK_ALLOC: return "alloc";
	case WORK_FREE: return "free";
	case WORK_PUT: return "put";
	case WORK_GET: return "get";
	case WORK_FILL: return "fill";
	case WORK_CHECKSUM: return "checksum";
	case WORK_BENCH_COPY: return "bench_copy";
	case WORK_COPY: return "copy";
	case WORK_BENCH_D2D: return "bench_d2d";
	case WORK_CHAIN: return "run";
	case WORK_BENCH_CHAIN: return "bench_chain";
	case WORK_COLLECTIVE: return "collective";
	case WORK_COLLECTIVE_BENCH: return "bench_collective";
	}
	return "unknown";
}

static int run_kind(struct device *dev, struct work *work)
{
	const struct backend_ops *ops = dev->ops;
	struct gpuq_error *err = &work->error;
	switch (work->kind) {
	case WORK_NOOP:
		return 0;
	case WORK_ALLOC:
		work->result.bytes = work->length;
		return ops->alloc(dev, work->length, &work->dptr, err);
	case WORK_FREE:
		work->result.bytes = work->length;
		return ops->release(dev, work->dptr, err);
	case WORK_FILL:
		work->result.bytes = work->length;
		return ops->fill(dev, work->dptr, work->length, &work->fill, err);
	case WORK_CHECKSUM:
		work->result.bytes = work->length;
		return ops->checksum(dev, work->dptr, work->length, &work->result.checksum, err);
	case WORK_PUT:
		return transfer_put(dev, work);
	case WORK_GET:
		return transfer_get(dev, work);
	case WORK_BENCH_COPY:
		return bench_copy_run(dev, work);
	case WORK_COPY:
		return copy_run(dev, work);
	case WORK_BENCH_D2D:
		return bench_d2d_run(dev, work);
	case WORK_CHAIN:
		return chain_run(dev, work);
	case WORK_BENCH_CHAIN:
		return chain_bench_run(dev, work);
	case WORK_COLLECTIVE:
	case WORK_COLLECTIVE_BENCH:
		return collective_run(dev, work);
	}
	return gpuq_fail(err, GPUQ_E_INTERNAL, "work kind %d has no runner", (int)work->kind);
}

void run_work(struct device *dev, struct work *work)
{
	double start = monotonic_seconds();
	if (run_kind(dev, work) == 0)
		gpuq_error_clear(&work->error);
	else if (work->error.code == GPUQ_OK)
		gpuq_fail(&work->error, GPUQ_E_INTERNAL, "%s failed without saying why",
			  work_kind_name(work->kind));
	work->result.seconds = monotonic_seconds() - start;
}
