/*
 * inject_fault: the fault-injection build's request (tests/gpuqd-faults
 * only; the production gpuqd has no such op). Root only: a job on `device`
 * that faults it as a kernel bug would, so that the tests see the recovery.
 * Main thread.
 */
#include "daemon/daemon.h"

static const struct job_kind kind_inject_fault = { "inject_fault", NULL, NULL };

void op_inject_fault(struct request *req)
{
	struct gpuq_error err;
	uint64_t device = 0;
	if (msg_get_u64(req->map, "device", &device, &err) < 0 ||
	    (req->conn->uid != 0 &&
	     gpuq_fail(&err, GPUQ_E_PERMISSION_DENIED, "inject_fault is root's") < 0)) {
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, &kind_inject_fault, WORK_FAULT, (int)device);
	if (job)
		job_submit(req, job);
}
