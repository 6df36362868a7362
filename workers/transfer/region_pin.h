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

/*
 * Around a device reset (workers/backend/device_reset.c): a registration
 * goes with the context that made it, the mapping stays. region_pin_release
 * unpins every region the device pinned while its context still works (a
 * faulted one has nothing left to undo); region_pin_restore pins them again
 * in the new context: *pinned of them, and *failed not, each logged (their
 * copies still go through, at pageable speed, until the region is made again).
 */
void region_pin_release(struct device *dev);
void region_pin_restore(struct device *dev, unsigned *pinned, unsigned *failed);
/* The worker's end: forgets the list, leaving pins and mappings to the process's exit. */
void region_pin_forget_all(struct device *dev);

/* WORK_REGION_MAP: region_pin_map with the work's fd and length; dptr the mapping. */
int region_pin_run_map(struct device *dev, struct work *work);
/* WORK_REGION_UNMAP: waits until no job uses the region, then region_pin_unmap. */
int region_pin_run_unmap(struct device *dev, struct work *work);

#endif
