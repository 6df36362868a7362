/*
 * What a worker does with each kind of work. Worker thread only; every
 * device operation goes through the backend table, so this file serves the
 * CUDA and the host backend alike.
 */
#include "workers/chain/chain.h"
#include "workers/bench/chain_bench.h"
#include "workers/clock.h"
#include "workers/bench/bench_copy.h"
#include "workers/bench/bench_d2d.h"
#include "workers/copy/copy.h"
#include "workers/transfer/region_pin.h"
#include "workers/collective/collective.h"
#include "workers/sched/sched.h"
#include "workers/bench/sched_bench.h"
#ifdef GPUQ_FAULT_INJECTION
#include "workers/faults/fault_inject.h"
#endif
#include "workers/transfer/transfer.h"
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
	case WORK_BENCH_SCHED: return "bench_sched";
	case WORK_FAULT: return "inject_fault";
	case WORK_REGION_MAP: return "region_create";
	case WORK_REGION_UNMAP: return "region_free";
	case WORK_ATTACH: return "attach";
	}
	return "unknown";
}

struct memory_wait {
	struct work *work;
	struct device *dev;
	uint64_t epoch;
	double deadline;
};

/* Memory was released since the last try, the time is up, or the job was cancelled. */
static bool memory_wait_over(void *arg)
{
	struct memory_wait *m = arg;
	return sched_memory_epoch(m->dev) != m->epoch || monotonic_seconds() >= m->deadline ||
	       atomic_load(&m->work->cancel);
}

/*
 * An allocation, waiting up to wait_memory_ms for memory that other jobs
 * release (each release lets every waiting allocation try again, the more
 * urgent first, since the scheduler resumes jobs in that order).
 */
/* One try: from the pool, or on its own with a handle to export (a shareable buffer). */
static int alloc_once(struct device *dev, struct work *work)
{
	if (!work->shareable)
		return dev->ops->alloc(dev, work->length, &work->dptr, &work->error);
	return dev->ops->alloc_shareable(dev, work->length, &work->dptr, &work->result.share_fd,
					 &work->error);
}

static int run_alloc(struct device *dev, struct work *work)
{
	struct memory_wait m = { .work = work, .dev = dev,
				 .deadline = monotonic_seconds() + work->wait_memory_ms / 1e3 };
	work->result.bytes = work->length;
	work->result.share_fd = -1;
	for (;;) {
		m.epoch = sched_memory_epoch(dev);
		if (alloc_once(dev, work) == 0)
			return 0;
		if (work->error.code != GPUQ_E_OUT_OF_MEMORY || work->wait_memory_ms == 0 ||
		    !sched_in_job())
			return -1;
		if (atomic_load(&work->cancel))
			return gpuq_fail(&work->error, GPUQ_E_CANCELLED,
					 "alloc cancelled while it waited for memory");
		if (monotonic_seconds() >= m.deadline)
			return gpuq_fail(&work->error, GPUQ_E_OUT_OF_MEMORY,
					 "%s; waited %llu ms (wait_memory_ms) without enough being freed",
					 work->error.message, (unsigned long long)work->wait_memory_ms);
		sched_wait_host(memory_wait_over, &m, SCHED_WAIT_MEMORY);
	}
}

static int run_free(struct device *dev, struct work *work)
{
	work->result.bytes = work->length;
	if (dev->ops->release(dev, work->dptr, &work->error) != 0)
		return -1;
	sched_memory_released(dev);
	return 0;
}

static int run_kind(struct device *dev, struct work *work)
{
	const struct backend_ops *ops = dev->ops;
	struct gpuq_error *err = &work->error;
	switch (work->kind) {
	case WORK_NOOP:
		return 0;
	case WORK_ALLOC:
		return run_alloc(dev, work);
	case WORK_FREE:
		return run_free(dev, work);
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
	case WORK_BENCH_SCHED:
		return sched_bench_run(dev, work);
	case WORK_REGION_MAP:
		return region_pin_run_map(dev, work);
	case WORK_REGION_UNMAP:
		return region_pin_run_unmap(dev, work);
	case WORK_ATTACH:
		break; /* the scheduler grants it without running it */
	case WORK_FAULT:
#ifdef GPUQ_FAULT_INJECTION
		return fault_inject_run(dev, work);
#else
		break; /* the production gpuqd never queues one */
#endif
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
