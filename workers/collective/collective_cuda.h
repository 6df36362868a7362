/*
 * The CUDA backend's collective operations over NCCL (collective_cuda.c),
 * for its table in backend_cuda.c. Worker threads, as backend.h says.
 */
#ifndef GPUQ_COLLECTIVE_CUDA_H
#define GPUQ_COLLECTIVE_CUDA_H

#include "workers/backend/backend.h"
#include "workers/collective/collective.h"

int cuda_coll_unique_id(struct device *dev, struct coll_id *id, struct gpuq_error *err);
int cuda_coll_comm_init(struct device *dev, struct coll_call *call, const struct coll_id *id,
			void **comm, struct gpuq_error *err);
int cuda_coll_run(struct device *dev, void *comm, struct coll_call *call, struct gpuq_error *err);
int cuda_coll_bench(struct device *dev, void *comm, struct coll_call *call,
		    struct gpuq_error *err);
void cuda_coll_comm_abort(struct device *dev, void *comm);
void cuda_coll_comm_destroy(struct device *dev, void *comm);

#endif
