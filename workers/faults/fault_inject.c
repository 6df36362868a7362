/*
 * The fault-injection build's job (tests/gpuqd-faults only): makes the
 * device fault as a real kernel bug does, so that the tests run the whole
 * recovery (workers/backend/device_reset.c). On CUDA a kernel writes through an
 * invalid pointer; the host backend records the same sticky fault its
 * GPUQ_HOST_FAULT_DEVICE hook does. Worker thread.
 */
#include <stdio.h>
#include <string.h>

#include "kernels/faults/fault.h"
#include "workers/backend/cuda_check.h"
#include "workers/backend/cuda_util.h"
#include "workers/faults/fault_inject.h"

int fault_inject_run(struct device *dev, struct work *work)
{
	if (strcmp(dev->ops->name, "cuda") != 0) {
		dev->faulted = true;
		snprintf(dev->fault_reason, sizeof dev->fault_reason,
			 "an injected illegal address (inject_fault)");
		return gpuq_fail(&work->error, GPUQ_E_DEVICE_ERROR, "host device %d: %s",
				 dev->index, dev->fault_reason);
	}
	cudaError_t e = kernels_fault_write(cuda_current_stream(dev));
	if (e != cudaSuccess)
		return CUDA_FAIL(dev, &work->error, e, "kernels_fault_write");
	return cuda_sync(dev, &work->error); /* the illegal address shows here: sticky */
}
