/*
 * The host backend: a "device" is a worker thread with a memory arena of
 * config.host_arena_bytes. It implements the same operations as the CUDA
 * backend with malloc and memcpy, so that CI and GPU-less machines run every
 * integration test, and its patterns are the reference the GPU tests compare
 * against. It is labelled "host" wherever it shows; it never stands in for
 * the CUDA path.
 *
 * Threads: as backend.h says; the arena's state is the worker's alone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/backend.h"
#include "workers/chain.h"
#include "workers/clock.h"
#include "workers/collective_host.h"
#include "workers/host_patterns.h"

/*
 * Each allocation is preceded by a header: its size, so release can return
 * it to the arena, and links, so close can free what clients left behind.
 */
#define HOST_ALIGN 256

struct host_block {
	uint64_t bytes;
	struct host_block *prev, *next;
};

struct host_device {
	uint64_t used;
	struct host_block *blocks;
	void *staging_block;
};

static int host_device_count(const struct device_config *config, int *count,
			     struct gpuq_error *err)
{
	if (config->host_devices < 1)
		return gpuq_fail(err, GPUQ_E_NO_DEVICE, "--host-devices must be at least 1");
	*count = config->host_devices;
	return 0;
}

static void host_fill_info(struct device *dev)
{
	struct device_info *info = &dev->info;
	struct host_device *h = dev->impl;
	memset(info, 0, sizeof *info);
	snprintf(info->name, sizeof info->name, "host arena (no GPU)");
	snprintf(info->uuid, sizeof info->uuid, "HOST-%d", dev->index);
	snprintf(info->pci_bus_id, sizeof info->pci_bus_id, "none");
	info->mem_total = dev->config.host_arena_bytes;
	info->mem_free = dev->config.host_arena_bytes - h->used;
}

static int host_open(struct device *dev, struct gpuq_error *err)
{
	struct host_device *h = calloc(1, sizeof *h);
	size_t slot = dev->config.staging_slot_bytes;
	if (!h)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory for its state",
				 dev->index);
	h->staging_block = malloc(slot * dev->config.staging_slots);
	if (!h->staging_block) {
		free(h);
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: cannot allocate %u staging slots of %zu bytes",
				 dev->index, dev->config.staging_slots, slot);
	}
	for (unsigned i = 0; i < dev->config.staging_slots; i++)
		dev->staging[i] = (char *)h->staging_block + (size_t)i * slot;
	for (int j = 0; j < dev->device_count; j++)
		dev->peer_access[j] = false;
	for (int j = 0; j < dev->device_count; j++) { /* every pair: a memcpy */
		dev->peer_link[j] = j == dev->index ? PEER_LINK_NONE : PEER_LINK_HOST;
		dev->pool_shared[j] = j != dev->index;
	}
	dev->impl = h;
	host_fill_info(dev);
	return 0;
}

static void host_close(struct device *dev)
{
	struct host_device *h = dev->impl;
	chain_host_close(dev); /* its cached plans */
	collective_device_close(dev); /* its communicators */
	while (h->blocks) {
		struct host_block *b = h->blocks;
		h->blocks = b->next;
		free(b);
	}
	free(h->staging_block);
	free(dev->peer_ring);
	dev->peer_ring = NULL;
	free(h);
	dev->impl = NULL;
}

static int host_refresh_info(struct device *dev, struct gpuq_error *err)
{
	(void)err;
	host_fill_info(dev);
	return 0;
}

static int host_alloc(struct device *dev, uint64_t bytes, void **ptr, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	uint64_t capacity = dev->config.host_arena_bytes;
	if (bytes > capacity - h->used)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: cannot allocate %llu bytes: %llu of its %llu are in use "
				 "(free a buffer, or raise --host-mem)",
				 dev->index, (unsigned long long)bytes, (unsigned long long)h->used,
				 (unsigned long long)capacity);
	void *block;
	if (posix_memalign(&block, HOST_ALIGN, HOST_ALIGN + bytes) != 0)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: malloc of %llu bytes failed", dev->index,
				 (unsigned long long)bytes);
	struct host_block *b = block;
	b->bytes = bytes;
	b->prev = NULL;
	b->next = h->blocks;
	if (h->blocks)
		h->blocks->prev = b;
	h->blocks = b;
	h->used += bytes;
	*ptr = (char *)block + HOST_ALIGN;
	return 0;
}

static int host_release(struct device *dev, void *ptr, struct gpuq_error *err)
{
	(void)err;
	struct host_device *h = dev->impl;
	struct host_block *b = (struct host_block *)((char *)ptr - HOST_ALIGN);
	if (b->prev)
		b->prev->next = b->next;
	else
		h->blocks = b->next;
	if (b->next)
		b->next->prev = b->prev;
	h->used -= b->bytes;
	free(b);
	return 0;
}

static int host_fill(struct device *dev, void *ptr, uint64_t bytes, const struct fill_spec *spec,
		     struct gpuq_error *err)
{
	size_t size = gpuq_dtype_size(spec->dtype);
	switch (spec->pattern) {
	case FILL_ZERO: memset(ptr, 0, bytes); return 0;
	case FILL_VALUE: host_fill_pattern(ptr, bytes, spec->value_bits, size); return 0;
	case FILL_IOTA: host_fill_iota(ptr, bytes / size, spec->dtype); return 0;
	case FILL_RANDOM: host_fill_random(ptr, bytes, spec->dtype, spec->seed); return 0;
	}
	return gpuq_fail(err, GPUQ_E_INTERNAL, "host device %d: fill pattern %d unknown", dev->index,
			 (int)spec->pattern);
}

/*
 * Tests only: GPUQ_HOST_FAULT_DEVICE=N makes host device N's first
 * checksum fail as a sticky CUDA error does (the device is then unhealthy and
 * refuses jobs), so that the integration tests reach what becomes of jobs
 * aimed at an unhealthy device without a GPU. The CUDA backend has no such hook.
 */
static int host_fault_if_asked(struct device *dev, struct gpuq_error *err)
{
	const char *v = getenv("GPUQ_HOST_FAULT_DEVICE");
	char *end;
	if (!v || !*v || strtol(v, &end, 10) != dev->index || *end)
		return 0;
	dev->faulted = true;
	snprintf(dev->fault_reason, sizeof dev->fault_reason,
		 "simulated sticky fault (GPUQ_HOST_FAULT_DEVICE=%d)", dev->index);
	return gpuq_fail(err, GPUQ_E_DEVICE_ERROR, "host device %d: %s; it takes no more jobs",
			 dev->index, dev->fault_reason);
}

static int host_checksum_op(struct device *dev, const void *ptr, uint64_t bytes, uint64_t *out,
			    struct gpuq_error *err)
{
	if (host_fault_if_asked(dev, err) != 0)
		return -1;
	*out = host_checksum(ptr, bytes);
	return 0;
}

/* Copies happen at once: the "stream" is the worker thread itself. */
static int host_h2d(struct device *dev, void *dst, unsigned slot, size_t n, struct gpuq_error *err)
{
	(void)err;
	memcpy(dst, dev->staging[slot], n);
	return 0;
}

static int host_d2h(struct device *dev, unsigned slot, const void *src, size_t n,
		    struct gpuq_error *err)
{
	(void)err;
	memcpy(dev->staging[slot], src, n);
	return 0;
}

static int host_slot_wait(struct device *dev, unsigned slot, struct gpuq_error *err)
{
	(void)dev;
	(void)slot;
	(void)err;
	return 0;
}

/* The "copies" are memcpy on the worker thread: nothing is ever in flight. */
static int host_slot_ready(struct device *dev, unsigned slot, bool *ready, struct gpuq_error *err)
{
	(void)dev;
	(void)slot;
	(void)err;
	*ready = true;
	return 0;
}

/* Host memory needs no registering to be memcpy'd. */
static int host_register_range(struct device *dev, void *ptr, size_t n, bool read_only,
			       struct gpuq_error *err)
{
	(void)dev;
	(void)ptr;
	(void)n;
	(void)read_only;
	(void)err;
	return 0;
}

static int host_unregister_range(struct device *dev, void *ptr, struct gpuq_error *err)
{
	(void)dev;
	(void)ptr;
	(void)err;
	return 0;
}

static int host_copy_timed(void *dst, const void *src, size_t n, double *seconds)
{
	double start = monotonic_seconds();
	memcpy(dst, src, n);
	if (seconds)
		*seconds = monotonic_seconds() - start;
	return 0;
}

static int host_copy_h2d(struct device *dev, void *dst, const void *src, size_t n,
			 double *seconds, struct gpuq_error *err)
{
	(void)dev;
	(void)err;
	return host_copy_timed(dst, src, n, seconds);
}

static int host_copy_d2h(struct device *dev, void *dst, const void *src, size_t n,
			 double *seconds, struct gpuq_error *err)
{
	(void)dev;
	(void)err;
	return host_copy_timed(dst, src, n, seconds);
}

static int host_alloc_host(struct device *dev, size_t n, void **ptr, struct gpuq_error *err)
{
	*ptr = malloc(n ? n : 1);
	if (!*ptr)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: cannot allocate %zu bytes of host memory", dev->index, n);
	return 0;
}

static void host_free_host(struct device *dev, void *ptr)
{
	(void)dev;
	free(ptr);
}

/*
 * Device-to-device copies. Both engines and the "peer" copy are a
 * memcpy (the devices share the process's memory); the host-staged path's
 * ring copies are memcpy too, through the ring's real slots. Nothing is
 * ever in flight, so an event is only the time it was recorded at.
 */
struct host_event {
	double at;
};

static int host_copy_d2d(struct device *dev, void *dst, const void *src, size_t n,
			 enum copy_engine engine, struct gpuq_error *err)
{
	(void)dev;
	(void)engine;
	(void)err;
	memcpy(dst, src, n);
	return 0;
}

static int host_copy_peer(struct device *dev, void *dst, int src_index, const void *src,
			  size_t n, struct gpuq_error *err)
{
	(void)dev;
	(void)src_index;
	(void)err;
	memcpy(dst, src, n);
	return 0;
}

static int host_ring_copy(struct device *dev, void *dst, const void *src, size_t n,
			  struct gpuq_error *err)
{
	(void)dev;
	(void)err;
	memcpy(dst, src, n);
	return 0;
}

static int host_event_create(struct device *dev, bool timing, void **event,
			     struct gpuq_error *err)
{
	(void)timing;
	*event = calloc(1, sizeof(struct host_event));
	if (!*event)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory for an event",
				 dev->index);
	return 0;
}

static void host_event_destroy(struct device *dev, void *event)
{
	(void)dev;
	free(event);
}

static int host_event_record(struct device *dev, void *event, struct gpuq_error *err)
{
	(void)dev;
	(void)err;
	((struct host_event *)event)->at = monotonic_seconds();
	return 0;
}

/* Waiting and syncing: what was recorded is already done. */
static int host_event_nothing(struct device *dev, void *event, struct gpuq_error *err)
{
	(void)dev;
	(void)event;
	(void)err;
	return 0;
}

static int host_event_elapsed(struct device *dev, void *start, void *end, double *seconds,
			      struct gpuq_error *err)
{
	(void)dev;
	(void)err;
	*seconds = ((struct host_event *)end)->at - ((struct host_event *)start)->at;
	return 0;
}

const struct backend_ops backend_host = {
	.name = "host",
	.device_count = host_device_count,
	.open = host_open,
	.close = host_close,
	.refresh_info = host_refresh_info,
	.alloc = host_alloc,
	.release = host_release,
	.fill = host_fill,
	.checksum = host_checksum_op,
	.h2d_async = host_h2d,
	.d2h_async = host_d2h,
	.slot_wait = host_slot_wait,
	.slot_ready = host_slot_ready,
	.host_register = host_register_range,
	.host_unregister = host_unregister_range,
	.copy_h2d = host_copy_h2d,
	.copy_d2h = host_copy_d2h,
	.host_alloc_pinned = host_alloc_host,
	.host_free_pinned = host_free_host,
	.copy_d2d = host_copy_d2d,
	.copy_peer = host_copy_peer,
	.ring_d2h = host_ring_copy,
	.ring_h2d = host_ring_copy,
	.host_alloc_portable = host_alloc_host,
	.host_free_portable = host_free_host,
	.event_create = host_event_create,
	.event_destroy = host_event_destroy,
	.event_record = host_event_record,
	.event_wait = host_event_nothing,
	.event_sync = host_event_nothing,
	.event_elapsed = host_event_elapsed,
	.chain = chain_host_run,
	.chain_copy_time = chain_host_copy_time,
	.chain_read_time = chain_host_read_time,
	.coll_unique_id = host_coll_unique_id,
	.coll_comm_init = host_coll_comm_init,
	.coll_allreduce = host_coll_allreduce,
	.coll_bench = host_coll_bench,
	.coll_comm_abort = host_coll_comm_release,
	.coll_comm_destroy = host_coll_comm_release,
};
