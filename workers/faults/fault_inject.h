/* The fault-injection build's job (workers/faults/fault_inject.c): tests/gpuqd-faults only. */
#ifndef GPUQ_FAULT_INJECT_H
#define GPUQ_FAULT_INJECT_H

#include "workers/backend/backend.h"
#include "workers/work.h"

/* Faults the device on purpose (a sticky error); always returns -1 with work->error. */
int fault_inject_run(struct device *dev, struct work *work);

#endif
