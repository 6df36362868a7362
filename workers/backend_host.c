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
	dev->impl = h;
	host_fill_info(dev);
	return 0;
}

static void host_close(struct device *dev)
{
	struct host_device *h = dev->impl;
	while (h->blocks) {
		struct host_block *b = h->blocks;
		h->blocks = b->next;
		free(b);
	}
	free(h->staging_block);
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

static int host_checksum_op(struct device *dev, const void *ptr, uint64_t bytes, uint64_t *out,
			    struct gpuq_error *err)
{
	(void)dev;
	(void)err;
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
	/* [copy] */
	/* [chain] */
	/* [collective] */
};
