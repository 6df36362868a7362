/*
 * Check macros for CUDA runtime calls that carry their context: the call's
 * text, the error's string and name, file:line and the device.
 *
 *   CUDA_TRY(dev, err, call)              on failure: set err, return -1
 *   CUDA_TRY_GOTO(dev, err, call, label)  on failure: set err, goto label
 *   CUDA_LOG(dev, call)                   teardown: log the failure, go on
 *
 * A failure is reported as "[gpu N] call failed: string (name) at file:line"
 * with GPUQ_E_OUT_OF_MEMORY for cudaErrorMemoryAllocation and
 * GPUQ_E_DEVICE_ERROR otherwise. A sticky error (one that poisons the CUDA
 * context, so every later call fails the same way) also marks the device
 * faulted, which makes its worker refuse further jobs.
 *
 * Only the thread that owns dev may use these (backend.h). Both helpers clear
 * the thread's last CUDA error, so that a failed call is never reported a
 * second time by the cudaGetLastError() that follows a later kernel launch.
 */
#ifndef GPUQ_CUDA_CHECK_H
#define GPUQ_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stdbool.h>

#include "protocol/protocol.h"
#include "workers/backend/backend.h"

/*
 * True for the errors the CUDA headers document as leaving the process in an
 * inconsistent state ("any further CUDA work will return the same error"),
 * plus the ECC, NVLink and destroyed-context errors that mean the same.
 */
static inline bool cuda_error_is_sticky(cudaError_t e)
{
	switch (e) {
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchTimeout:
	case cudaErrorLaunchFailure:
	case cudaErrorHardwareStackError:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorAssert:
	case cudaErrorTensorMemoryLeak:
	case cudaErrorECCUncorrectable:
	case cudaErrorNvlinkUncorrectable:
	case cudaErrorContained:
	case cudaErrorContextIsDestroyed:
	case cudaErrorExternalDevice:
	case cudaErrorMpsClientTerminated:
		return true;
	default:
		return false;
	}
}

/*
 * Sets err from e as described above, marks dev faulted when e is sticky,
 * clears the thread's last error and returns -1. call names what failed.
 * Defined in workers/backend/cuda_util.c, as is cuda_log_teardown_error;
 * cuda_util.h has the stream and the waits the CUDA files share.
 */
int cuda_fail(struct device *dev, struct gpuq_error *err, cudaError_t e, const char *call,
	      const char *file, int line);

/* Logs a failure during teardown ("gpuqd: [gpu N] ...") and clears it. */
void cuda_log_teardown_error(const struct device *dev, cudaError_t e, const char *call,
			     const char *file, int line);

/* For a result already in hand: `return CUDA_FAIL(dev, err, e, "what");` */
#define CUDA_FAIL(dev, err, e, what) cuda_fail((dev), (err), (e), (what), __FILE__, __LINE__)

#define CUDA_TRY(dev, err, call)                                               \
	do {                                                                   \
		cudaError_t cuda_try_e_ = (call);                              \
		if (cuda_try_e_ != cudaSuccess)                                \
			return cuda_fail((dev), (err), cuda_try_e_, #call,      \
					 __FILE__, __LINE__);                  \
	} while (0)

#define CUDA_TRY_GOTO(dev, err, call, label)                                   \
	do {                                                                   \
		cudaError_t cuda_try_e_ = (call);                              \
		if (cuda_try_e_ != cudaSuccess) {                              \
			cuda_fail((dev), (err), cuda_try_e_, #call, __FILE__,   \
				  __LINE__);                                   \
			goto label;                                            \
		}                                                              \
	} while (0)

#define CUDA_LOG(dev, call)                                                    \
	do {                                                                   \
		cudaError_t cuda_log_e_ = (call);                              \
		if (cuda_log_e_ != cudaSuccess)                                \
			cuda_log_teardown_error((dev), cuda_log_e_, #call,     \
						__FILE__, __LINE__);           \
	} while (0)

#endif
