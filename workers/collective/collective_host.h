/*
 * The host backend's collective operations (collective_host.c), for its
 * table in backend_host.c. Worker threads, as backend.h says.
 */
#ifndef GPUQ_COLLECTIVE_HOST_H
#define GPUQ_COLLECTIVE_HOST_H

#include "workers/backend/backend.h"
#include "workers/collective/collective.h"

int host_coll_unique_id(struct device *dev, struct coll_id *id, struct gpuq_error *err);
int host_coll_comm_init(struct device *dev, struct coll_call *call, const struct coll_id *id,
			void **comm, struct gpuq_error *err);
int host_coll_run(struct device *dev, void *comm, struct coll_call *call,
		  struct gpuq_error *err);
int host_coll_bench(struct device *dev, void *comm, struct coll_call *call,
		    struct gpuq_error *err);
/* Abort and destroy are the same on the host: leave the group. */
void host_coll_comm_release(struct device *dev, void *comm);

/*
 * collective_host_reduce.c: dst[d][i] = src[0][i] op src[1][i] op ... for
 * every d < ndst and i < count, in source order with NCCL's semantics. Each
 * element is read from every source before any destination's is written,
 * so a destination may be one of the sources (in place).
 */
struct host_reduction {
	enum gpuq_dtype dtype;
	enum coll_op op;
	int nsrc, ndst;
	const void *src[GPUQ_MAX_DEVICES];
	void *dst[GPUQ_MAX_DEVICES];
};
void host_reduce(const struct host_reduction *h, uint64_t count);

#endif
