/*
 * Host regions on the worker: a client's memfd mapped by gpuqd, its pages
 * asked for on the device's NUMA node, populated and pinned once
 * (host_register, portable: every device copies from and to it), and
 * undone when the region is freed. Worker thread only; the daemon's
 * registry (daemon/region.h) owns the region itself.
 */
#ifndef GPUQ_REGION_PIN_H
#define GPUQ_REGION_PIN_H

#include <stdint.h>

#include "workers/backend/backend.h"
#include "workers/work.h"

/*
 * Maps length bytes of fd (a memfd sealed against shrinking, open for
 * reading and writing), places and pins them. *map is the mapping and
 * *node the NUMA node asked for (-1: none). 0, or -1 with err.
 */
int region_pin_map(struct device *dev, int fd, uint64_t length, void **map, int *node,
		   struct gpuq_error *err);
/* Unpins and unmaps what region_pin_map made; the first error in err. */
int region_pin_unmap(struct device *dev, void *map, uint64_t length, struct gpuq_error *err);

/* WORK_REGION_MAP: region_pin_map with the work's fd and length; dptr the mapping. */
int region_pin_run_map(struct device *dev, struct work *work);
/* WORK_REGION_UNMAP: waits until no job uses the region, then region_pin_unmap. */
int region_pin_run_unmap(struct device *dev, struct work *work);

#endif
