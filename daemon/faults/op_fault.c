/*
 * inject_fault: the fault-injection build's request (tests/gpuqd-faults
 * only; the production gpuqd has no such op). Root only: a job on `device`
 * that faults it as a kernel bug would, so that the tests see the recovery.
 * Main thread.
 */
#include "daemon/daemon.h"

static const struct job_kind kind_inject_fault = { "inject_fault", NULL, NULL };

struct inject_fault_args {
	uint64_t device;
};

static const struct args_field inject_fault_fields[] = {
	{ "device", ARGS_U64, 0, ARGS_AT(struct inject_fault_args, device) },
};
const struct args_spec op_inject_fault_args =
	ARGS_SPEC(struct inject_fault_args, inject_fault_fields, NULL);

/* Only root gets here (request.c's op table). */
void op_inject_fault(struct request *req, void *args)
{
	uint64_t device = ((struct inject_fault_args *)args)->device;
	struct job *job = new_job(req, &kind_inject_fault, WORK_FAULT, (int)device);
	if (job)
		job_submit(req, job);
}
