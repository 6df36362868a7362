/*
 * Host regions on the worker (see region_pin.h). Pinning is what the
 * region is for: the copies of every put and get through it are then one
 * DMA each on the job's lane, with no staging and no mapping per job.
 *
 * Placement: the pages a client has not touched yet are asked for on the
 * GPU's NUMA node (mbind on gpuqd's mapping, MPOL_PREFERRED, before the
 * populate that allocates them); pages the client already wrote stay where
 * they are. A device reset takes the registrations with the context; the
 * device keeps a list of what it pinned, so that the new context pins it
 * again. Worker thread only.
 */
#include "workers/transfer/region_pin.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "workers/backend/numa.h"
#include "workers/log.h"
#include "workers/sched/sched_wait.h"

/* One region this device pinned: dev->pinned_regions, for a reset to pin again. */
struct region_pin {
	void *map;
	uint64_t length; /* whole pages */
	bool registered; /* false once a reset's new context could not pin it again */
	struct region_pin *next;
};

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
	struct region_pin *pin = calloc(1, sizeof *pin);
	if (!pin) {
		munmap(p, length);
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no memory to track a region",
				 dev->index);
	}
	if (dev->ops->mem.host_register(dev, p, length, BACKEND_REGISTER_PORTABLE, err) != 0) {
		free(pin);
		munmap(p, length);
		return -1;
	}
	*pin = (struct region_pin){ .map = p, .length = length, .registered = true,
				    .next = dev->pinned_regions };
	dev->pinned_regions = pin;
	*map = p;
	return 0;
}

/* Takes map's entry off the device's list; whether it is still registered. */
static bool forget_pin(struct device *dev, void *map)
{
	for (struct region_pin **at = &dev->pinned_regions; *at; at = &(*at)->next) {
		struct region_pin *pin = *at;
		if (pin->map != map)
			continue;
		bool registered = pin->registered;
		*at = pin->next;
		free(pin);
		return registered;
	}
	return true;
}

void region_pin_release(struct device *dev)
{
	for (struct region_pin *pin = dev->pinned_regions; pin; pin = pin->next) {
		struct gpuq_error err;
		if (pin->registered && !dev->faulted &&
		    dev->ops->mem.host_unregister(dev, pin->map, &err) != 0)
			log_warn("%s (unpinning a region before the device's reset)", err.message);
		pin->registered = false;
	}
}

void region_pin_restore(struct device *dev, unsigned *pinned, unsigned *failed)
{
	*pinned = *failed = 0;
	for (struct region_pin *pin = dev->pinned_regions; pin; pin = pin->next) {
		struct gpuq_error err;
		if (pin->registered)
			continue;
		if (dev->ops->mem.host_register(dev, pin->map, pin->length,
						BACKEND_REGISTER_PORTABLE, &err) == 0) {
			pin->registered = true;
			++*pinned;
			continue;
		}
		++*failed;
		log_warn("[gpu %d] a host region of %llu bytes is not pinned since the device's reset "
			 "(%s): its copies go at pageable speed until it is freed and made again",
			 dev->index, (unsigned long long)pin->length, err.message);
	}
}

void region_pin_forget_all(struct device *dev)
{
	while (dev->pinned_regions) {
		struct region_pin *pin = dev->pinned_regions;
		dev->pinned_regions = pin->next;
		free(pin);
	}
}

int region_pin_unmap(struct device *dev, void *map, uint64_t length, struct gpuq_error *err)
{
	int rc = 0;
	if (!map)
		return 0;
	length = page_round(length);
	/* not where a reset took the registration with the context */
	if (forget_pin(dev, map) && !dev->faulted)
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
