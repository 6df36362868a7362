/*
 * The helpers every CUDA file of workers/ shares (cuda_util.h): waits for
 * events, through the scheduler's hooks in dev->waits, and the failure
 * reporting behind cuda_check.h's macros. Worker thread of the device only.
 */
#include "workers/backend/cuda_util.h"
#include "workers/log.h"

#include <stdio.h>

#include <cuda_runtime_api.h>

int cuda_wait_event(struct device *dev, cudaEvent_t event, const char *what, struct gpuq_error *err)
{
	struct cuda_event_poll p = { event, cudaErrorNotReady };
	dev->waits->wait_device(cuda_event_settled, &p);
	return p.result == cudaSuccess ? 0 : cuda_fail(dev, err, p.result, what, __FILE__, __LINE__);
}

int cuda_sync(struct device *dev, struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	struct cuda_lane *lane = dev->lane;
	cudaEvent_t ev = lane ? lane->done : st->sync_done;
	CUDA_TRY(dev, err, cudaEventRecord(ev, cuda_current_stream(dev)));
	return cuda_wait_event(dev, ev, "waiting for the job's stream (cudaEventQuery)", err);
}

int cuda_fail(struct device *dev, struct gpuq_error *err, cudaError_t e, const char *call,
	      const char *file, int line)
{
	enum gpuq_errc code =
		e == cudaErrorMemoryAllocation ? GPUQ_E_OUT_OF_MEMORY : GPUQ_E_DEVICE_ERROR;
	(void)cudaGetLastError(); /* a sticky error stays regardless */
	if (!cuda_error_is_sticky(e))
		return gpuq_fail(err, code, "[gpu %d] %s failed: %s (%s) at %s:%d", dev->index,
				 call, cudaGetErrorString(e), cudaGetErrorName(e), file, line);
	dev->faulted = true;
	snprintf(dev->fault_reason, sizeof dev->fault_reason, "%s failed: %s (%s)", call,
		 cudaGetErrorString(e), cudaGetErrorName(e));
	return gpuq_fail(err, code,
			 "[gpu %d] %s failed: %s (%s) at %s:%d; the error is sticky: the CUDA "
			 "context of gpu %d is lost and it takes no more jobs",
			 dev->index, call, cudaGetErrorString(e), cudaGetErrorName(e), file, line,
			 dev->index);
}

/* The one place teardown failures are reported; the daemon's logger may take over here. */
void cuda_log_teardown_error(const struct device *dev, cudaError_t e, const char *call,
			     const char *file, int line)
{
	log_warn("[gpu %d] %s failed during teardown: %s (%s) at %s:%d",
		dev->index, call, cudaGetErrorString(e), cudaGetErrorName(e), file, line);
	(void)cudaGetLastError();
}
