/*
 * Host regions on the worker (see region_pin.h). Pinning is what the
 * region is for: the copies of every put and get through it are then one
 * DMA each on the job's lane, with no staging and no mapping per job.
 *
 * Placement: the pages a client has not touched yet are asked for on the
 * GPU's NUMA node (mbind on gpuqd's mapping, MPOL_PREFERRED, before the
 * populate that allocates them); pages the client already wrote stay where
 * they are. Worker thread only.
 */
#include "workers/transfer/region_pin.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "workers/backend/numa.h"
#include "workers/sched/sched_wait.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/*
 * Whole pages: what is mapped and registered. The last page of a memfd whose
 * size is not a multiple of it exists whole, so this never maps past its end.
 */
static uint64_t page_round(uint64_t n)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	return (n + page - 1) / page * page;
}

int region_pin_map(struct device *dev, int fd, uint64_t length, void **map, int *node,
		   struct gpuq_error *err)
{
	length = page_round(length);
	*map = NULL;
	*node = numa_node_of_pci(dev->info.pci_bus_id);
	void *p = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return gpuq_fail(err, GPUQ_E_IO, "[gpu %d] cannot map the region's memfd (%llu bytes): %s",
				 dev->index, (unsigned long long)length, strerror(errno));
	if (*node >= 0 && numa_prefer_node(p, length, *node) != 0)
		*node = -1; /* placement is an optimisation: pin where the pages come */
	/* Allocates every page now, not one fault at a time under the pinning; old kernels lack it. */
	if (madvise(p, length, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
		int e = errno;
		munmap(p, length);
		return gpuq_fail(err, e == ENOMEM ? GPUQ_E_OUT_OF_MEMORY : GPUQ_E_IO,
				 "[gpu %d] cannot populate the region's %llu bytes: %s", dev->index,
				 (unsigned long long)length, strerror(e));
	}
	if (dev->ops->mem.host_register(dev, p, length, BACKEND_REGISTER_PORTABLE, err) != 0) {
		munmap(p, length);
		return -1;
	}
	*map = p;
	return 0;
}

int region_pin_unmap(struct device *dev, void *map, uint64_t length, struct gpuq_error *err)
{
	int rc = 0;
	if (!map)
		return 0;
	length = page_round(length);
	if (!dev->faulted) /* a reset took the registration with the context */
		rc = dev->ops->mem.host_unregister(dev, map, err);
	if (munmap(map, length) != 0 && rc == 0)
		rc = gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] munmap of a region: %s", dev->index,
			       strerror(errno));
	return rc;
}

int region_pin_run_map(struct device *dev, struct work *work)
{
	int node;
	if (region_pin_map(dev, work->fd, work->length, &work->dptr, &node, &work->error) != 0)
		return -1;
	work->result.numa_node = node;
	work->result.bytes = work->length;
	return 0;
}

/* No job uses the region any more, on this device or another. */
static bool region_idle(void *arg)
{
	const struct work *work = arg;
	return atomic_load(work->users) == 0;
}

int region_pin_run_unmap(struct device *dev, struct work *work)
{
	if (work->users)
		sched_wait_host(region_idle, work, SCHED_WAIT_REGION);
	work->result.bytes = work->length;
	return region_pin_unmap(dev, work->dptr, work->length, &work->error);
}
