/*
 * Check macros for NCCL calls, in cuda_check.h's style: a failure is
 * reported as "[gpu N] call failed: string (ncclName): NCCL's last error at
 * file:line" with GPUQ_E_DEVICE_ERROR.
 *
 *   NCCL_TRY(dev, err, call)      on failure: set err, return -1 (ncclSuccess only)
 *   NCCL_LOG(dev, call)           teardown: log the failure, go on
 *   NCCL_FAIL(dev, err, r, what)  for a result already in hand
 *
 * Calls on a non-blocking communicator may also return ncclInProgress, which
 * is not a failure: collective_cuda.c handles those results itself and then
 * polls ncclCommGetAsyncError until the call has settled.
 *
 * Only the thread that owns dev may use these (backend.h).
 */
#ifndef GPUQ_NCCL_CHECK_H
#define GPUQ_NCCL_CHECK_H

/* nccl.h declares a few functions as f() rather than f(void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "protocol/protocol.h"
#include "workers/backend/backend.h"

/* Sets err from r and returns -1. Defined in workers/collective/collective_cuda.c. */
int nccl_fail(struct device *dev, struct gpuq_error *err, ncclResult_t r, const char *call,
	      const char *file, int line);
/* Logs a failure during teardown ("gpuqd: [gpu N] ..."). */
void nccl_log_teardown_error(const struct device *dev, ncclResult_t r, const char *call,
			     const char *file, int line);

#define NCCL_FAIL(dev, err, r, what) nccl_fail((dev), (err), (r), (what), __FILE__, __LINE__)

#define NCCL_TRY(dev, err, call)                                               \
	do {                                                                   \
		ncclResult_t nccl_try_r_ = (call);                             \
		if (nccl_try_r_ != ncclSuccess)                                \
			return nccl_fail((dev), (err), nccl_try_r_, #call,      \
					 __FILE__, __LINE__);                  \
	} while (0)

#define NCCL_LOG(dev, call)                                                    \
	do {                                                                   \
		ncclResult_t nccl_log_r_ = (call);                             \
		if (nccl_log_r_ != ncclSuccess && nccl_log_r_ != ncclInProgress) \
			nccl_log_teardown_error((dev), nccl_log_r_, #call,     \
						__FILE__, __LINE__);           \
	} while (0)

#endif
