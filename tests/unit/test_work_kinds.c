/*
 * Unit tests for the table of work kinds (workers/work_kinds.h): what the
 * scheduler and run_work read from each row. The expectations are written
 * out by hand, kind by kind, so that a row edited by mistake fails here.
 */
#include <stdio.h>
#include <string.h>

#include "tests/harness.h"
#include "workers/sched/sched.h"
#include "workers/worker.h"

struct expected_kind {
	enum work_kind kind;
	const char *name;
	enum sched_engine engine;
	bool exclusive, lane_ordered;
};

static const struct expected_kind expected[] = {
	{ WORK_NOOP, "noop", SCHED_ENGINE_OTHER, false, true },
	{ WORK_ALLOC, "alloc", SCHED_ENGINE_OTHER, false, false },
	{ WORK_FREE, "free", SCHED_ENGINE_OTHER, false, true },
	{ WORK_PUT, "put", SCHED_ENGINE_H2D, false, true },
	{ WORK_GET, "get", SCHED_ENGINE_D2H, false, true },
	{ WORK_FILL, "fill", SCHED_ENGINE_KERNEL, false, true },
	{ WORK_CHECKSUM, "checksum", SCHED_ENGINE_KERNEL, false, true },
	{ WORK_BENCH_COPY, "bench_copy", SCHED_ENGINE_OTHER, true, false },
	{ WORK_COPY, "copy", SCHED_ENGINE_COPY, false, true },
	{ WORK_BENCH_D2D, "bench_d2d", SCHED_ENGINE_OTHER, true, false },
	{ WORK_CHAIN, "run", SCHED_ENGINE_KERNEL, false, true },
	{ WORK_BENCH_CHAIN, "bench_chain", SCHED_ENGINE_OTHER, true, false },
	{ WORK_COLLECTIVE, "collective", SCHED_ENGINE_COLLECTIVE, false, false },
	{ WORK_COLLECTIVE_BENCH, "bench_collective", SCHED_ENGINE_COLLECTIVE, true, false },
	{ WORK_BENCH_SCHED, "bench_sched", SCHED_ENGINE_OTHER, true, false },
	{ WORK_BENCH_ALLOC, "bench_alloc", SCHED_ENGINE_OTHER, true, false },
	{ WORK_FAULT, "inject_fault", SCHED_ENGINE_OTHER, false, false },
	{ WORK_REGION_MAP, "region_create", SCHED_ENGINE_OTHER, false, false },
	{ WORK_REGION_UNMAP, "region_free", SCHED_ENGINE_OTHER, false, false },
	{ WORK_ATTACH, "attach", SCHED_ENGINE_OTHER, false, false },
};

TEST(work_kinds_every_row_is_checked_here)
{
	CHECK_EQ(sizeof expected / sizeof expected[0], WORK_KIND_COUNT);
	CHECK_EQ(WORK_NOOP, 0); /* a zeroed work is a noop */
	CHECK_STR(work_kind_name(WORK_KIND_COUNT), "unknown");
}

TEST(work_kinds_name_engine_and_flags_of_each_kind)
{
	for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
		const struct expected_kind *e = &expected[i];
		struct work w;
		memset(&w, 0, sizeof w);
		w.kind = e->kind;
		w.gang_size = 1;
		CHECK_STR(work_kind_name(e->kind), e->name);
		CHECKF(sched_engine_of(&w) == e->engine, "%s: engine %s, not %s", e->name,
		       sched_engine_name(sched_engine_of(&w)), sched_engine_name(e->engine));
		CHECKF(sched_work_exclusive(&w) == e->exclusive, "%s: exclusive", e->name);
		CHECKF(sched_work_lane_ordered(&w) == e->lane_ordered, "%s: lane ordered", e->name);
	}
}

TEST(work_kinds_a_gang_part_is_never_lane_ordered)
{
	struct work w;
	memset(&w, 0, sizeof w);
	w.kind = WORK_COPY;
	w.gang_size = 2;
	CHECK(!sched_work_lane_ordered(&w));
	w.gang_size = 1;
	CHECK(sched_work_lane_ordered(&w));
}

/* attach is granted by the scheduler, and the production gpuqd has no fault runner. */
TEST(work_kinds_a_kind_without_a_runner_fails_as_internal)
{
	static const enum work_kind kinds[] = { WORK_ATTACH, WORK_FAULT };
	for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
		struct work w;
		char want[64];
		memset(&w, 0, sizeof w);
		w.kind = kinds[i];
		run_work(NULL, &w);
		CHECK_EQ(w.error.code, GPUQ_E_INTERNAL);
		snprintf(want, sizeof want, "work kind %d has no runner", (int)kinds[i]);
		CHECK_STR(w.error.message, want);
	}
}
