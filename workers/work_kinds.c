/*
 * The runner and the name of each work kind, expanded from the rows of
 * workers/work_kinds.h, and run_work, through which the scheduler runs
 * every work. Worker thread only (work_kind_name: any thread).
 */
#include "workers/work_kinds.h"

#include <stddef.h>

#include "workers/bench/bench_alloc.h"
#include "workers/bench/bench_copy.h"
#include "workers/bench/bench_d2d.h"
#include "workers/bench/chain_bench.h"
#include "workers/bench/sched_bench.h"
#include "workers/buffer/buffer_run.h"
#include "workers/chain/chain.h"
#include "workers/clock.h"
#include "workers/collective/collective.h"
#include "workers/copy/copy.h"
#include "workers/transfer/region_pin.h"
#include "workers/transfer/transfer.h"
#include "workers/worker.h"
#ifdef GPUQ_FAULT_INJECTION
#include "workers/faults/fault_inject.h"
#else
/* Only tests/gpuqd-faults has the runner; the production gpuqd never queues the kind. */
#define fault_inject_run NULL
#endif

typedef int (*work_runner)(struct device *dev, struct work *work);

static const work_runner work_runners[WORK_KIND_COUNT] = {
#define WORK_KIND_RUNNER(kind, name, runner, engine, flags) [WORK_##kind] = runner,
	WORK_KINDS(WORK_KIND_RUNNER)
#undef WORK_KIND_RUNNER
};

static const char *const work_kind_names[WORK_KIND_COUNT] = {
#define WORK_KIND_NAME(kind, name, runner, engine, flags) [WORK_##kind] = name,
	WORK_KINDS(WORK_KIND_NAME)
#undef WORK_KIND_NAME
};

const char *work_kind_name(enum work_kind kind)
{
	if ((unsigned)kind >= WORK_KIND_COUNT)
		return "unknown";
	return work_kind_names[kind];
}

static int run_kind(struct device *dev, struct work *work)
{
	if ((unsigned)work->kind < WORK_KIND_COUNT && work_runners[work->kind])
		return work_runners[work->kind](dev, work);
	return gpuq_fail(&work->error, GPUQ_E_INTERNAL, "work kind %d has no runner",
			 (int)work->kind);
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
