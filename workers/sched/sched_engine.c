/* The engines a work keeps busy (sched_engine.h). Any thread. */
#include "workers/sched/sched_engine.h"
#include "workers/work_kinds.h"

const char *sched_engine_name(enum sched_engine engine)
{
	static const char *const names[SCHED_ENGINES] = {
		[SCHED_ENGINE_H2D] = "h2d",       [SCHED_ENGINE_D2H] = "d2h",
		[SCHED_ENGINE_KERNEL] = "kernel", [SCHED_ENGINE_COPY] = "copy",
		[SCHED_ENGINE_COLLECTIVE] = "collective", [SCHED_ENGINE_OTHER] = "other",
	};
	return (unsigned)engine < SCHED_ENGINES ? names[engine] : "unknown";
}

enum sched_engine sched_engine_of(const struct work *work)
{
	static const enum sched_engine engines[WORK_KIND_COUNT] = {
#define WORK_KIND_ENGINE(kind, name, runner, engine, flags) [WORK_##kind] = SCHED_ENGINE_##engine,
		WORK_KINDS(WORK_KIND_ENGINE) /* workers/work_kinds.h */
#undef WORK_KIND_ENGINE
	};
	return (unsigned)work->kind < WORK_KIND_COUNT ? engines[work->kind] : SCHED_ENGINE_OTHER;
}
