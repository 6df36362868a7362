/* The engines a work keeps busy (sched_engine.h). Any thread. */
#include "workers/sched/sched_engine.h"

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
	switch (work->kind) {
	case WORK_PUT: return SCHED_ENGINE_H2D;
	case WORK_GET: return SCHED_ENGINE_D2H;
	case WORK_FILL:
	case WORK_CHECKSUM:
	case WORK_CHAIN: return SCHED_ENGINE_KERNEL;
	case WORK_COPY: return SCHED_ENGINE_COPY;
	case WORK_COLLECTIVE:
	case WORK_COLLECTIVE_BENCH: return SCHED_ENGINE_COLLECTIVE;
	default: return SCHED_ENGINE_OTHER;
	}
}
