/*
 * The host backend: a "device" is a worker thread with a memory arena of
 * config.host_arena_bytes. It implements the same operations as the CUDA
 * backend with malloc and memcpy, so that CI and GPU-less machines run every
 * integration test, and its patterns are the reference the GPU tests compare
 * against. It is labelled "host" wherever it shows; it never stands in for
 * the CUDA path.
 *
 * Device work runs on the device's engine threads (host_engine.h), in the
 * order of the lane it was enqueued on, as on a GPU: the copies of a put,
 * a get and a kernel chain of three jobs run side by side, and a job waits
 * for its own work by yielding to the scheduler (through dev->waits, backend.h).
 *
 * Threads: as backend.h says; the arena's list is shared with the compute
 * engine (which releases blocks) under the device's lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workers/backend/backend.h"
#include "workers/backend/backend_host.h"
#include "workers/chain/chain.h"
#include "workers/clock.h"
#include "workers/collective/collective_host.h"
#include "workers/backend/host_engine.h"
#include "workers/backend/host_patterns.h"
#include "workers/buffer/slab.h"

/*
 * Buffers come from slabs (workers/buffer/slab.h) whose memory is a memfd
 * mapped shared, as a GPU's are exportable VMM allocations, so that CI
 * runs every path of exportable memory; or, with --buffer-memory pool,
 * from malloc'd blocks, each preceded by a header: its size, so release
 * can return it to the arena, and links, so close can free what clients
 * left behind. Either way the arena counts the bytes buffers asked for
 * (`used`), as before slabs: a slab's memfd takes pages only as they are
 * written. The block list and `used` are under `lock`: allocations happen
 * on the worker thread, releases on the compute engine (in stream order,
 * after whatever the job's lane waited for); the slab heap has its own.
 */
#define HOST_ALIGN 256
/* A host slab's granularity and the size small buffers share: a GPU's (2 MiB, cuda_vmm.c) and the CUDA backend's. */
#define HOST_SLAB_GRANULARITY ((uint64_t)2 << 20)
#define HOST_SLAB_CARVE ((uint64_t)32 << 20)

struct host_block {
	uint64_t bytes;
	struct host_block *prev, *next;
};

struct host_device {
	pthread_mutex_t lock;
	uint64_t used;
	struct host_block *blocks;
	struct slab_heap *slabs;
	bool use_slabs; /* buffers from slabs (--buffer-memory vmm or auto), else blocks */
	void *staging_block;
	struct host_engines *engines;
	struct host_stream *stream;                    /* outside jobs (dev->lane NULL) */
	struct host_event slot_done[GPUQ_MAX_STAGING_SLOTS]; /* each slot's last copy */
};

/* The stream device work goes on: the running job's lane, or the device's own. */
static struct host_stream *host_current(const struct device *dev)
{
	const struct host_device *h = dev->impl;
	return dev->lane ? dev->lane : h->stream;
}

static bool host_event_settled(void *arg)
{
	return host_event_done(arg);
}

/* Waits for ev: a job yields until an engine thread has got there (it tells the scheduler). */
static void host_event_wait_host(struct device *dev, struct host_event *ev)
{
	dev->waits->wait_host(host_event_settled, ev);
}

static int host_enqueue(struct device *dev, enum host_engine_kind kind, host_op_fn fn,
			const struct host_op *op, struct gpuq_error *err)
{
	if (host_stream_enqueue(host_current(dev), kind, fn, op) != 0)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory to queue work",
				 dev->index);
	return 0;
}

/* Waits for everything enqueued so far on the current stream. */
static int host_sync(struct device *dev, struct gpuq_error *err)
{
	struct host_event ev = { 0 };
	if (host_stream_record(host_current(dev), &ev) != 0)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory to queue work",
				 dev->index);
	host_event_wait_host(dev, &ev);
	return 0;
}

/* Runs fn(op) on an engine of the current stream and waits for it. */
static int host_run_sync(struct device *dev, enum host_engine_kind kind, host_op_fn fn,
			 const struct host_op *op, struct gpuq_error *err)
{
	if (host_enqueue(dev, kind, fn, op, err) != 0)
		return -1;
	return host_sync(dev, err);
}

static void op_call(struct host_op *op)
{
	void (*fn)(void *) = (void (*)(void *))op->dst;
	fn(op->arg);
}

int host_backend_enqueue(struct device *dev, enum host_engine_kind kind, host_op_fn fn,
			 const struct host_op *op, struct gpuq_error *err)
{
	return host_enqueue(dev, kind, fn, op, err);
}

int host_backend_compute(struct device *dev, void (*fn)(void *arg), void *arg,
			 struct gpuq_error *err)
{
	struct host_op op = { .dst = (void *)fn, .arg = arg };
	return host_run_sync(dev, HOST_ENGINE_COMPUTE, op_call, &op, err);
}

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
	snprintf(info->uuid, sizeof info->uuid, "HOST-%d", dev->ordinal);
	snprintf(info->pci_bus_id, sizeof info->pci_bus_id, "none");
	info->copy_engines = 3;
	pthread_mutex_lock(&h->lock);
	info->mem_total = dev->config.host_arena_bytes;
	info->mem_free = dev->config.host_arena_bytes - h->used;
	pthread_mutex_unlock(&h->lock);
	info->buffer_memory = h->use_slabs ? "vmm" : "pool";
}

/* A slab: a memfd of bytes, mapped shared; its descriptor opens it alone. */
static int host_slab_create(void *ctx, uint64_t bytes, struct slab_mem *mem,
			    struct gpuq_error *err)
{
	struct device *dev = ctx;
	int m = memfd_create("gpuq-slab", MFD_CLOEXEC);
	void *p = MAP_FAILED;
	if (m >= 0 && ftruncate(m, (off_t)bytes) == 0)
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
	if (p == MAP_FAILED) {
		int e = errno;
		if (m >= 0)
			close(m);
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: cannot make a memfd slab of %llu bytes: %s",
				 dev->index, (unsigned long long)bytes, strerror(e));
	}
	*mem = (struct slab_mem){ .base = p, .bytes = bytes, .fd = m };
	return 0;
}

/* A slab the previous image made: its memfd, mapped again. */
static int host_slab_import(void *ctx, int fd, uint64_t bytes, struct slab_mem *mem,
			    struct gpuq_error *err)
{
	struct device *dev = ctx;
	struct stat st;
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < bytes)
		return gpuq_fail(err, GPUQ_E_IO,
				 "host device %d: descriptor %d does not hold a slab of %llu bytes", dev->index,
				 fd, (unsigned long long)bytes);
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return gpuq_fail(err, GPUQ_E_IO, "host device %d: mmap of slab descriptor %d: %s",
				 dev->index, fd, strerror(errno));
	*mem = (struct slab_mem){ .base = p, .bytes = bytes, .fd = fd };
	return 0;
}

/* Host memory outlives any "context": lost or not, the mapping and the memfd go. */
static void host_slab_destroy(void *ctx, struct slab_mem *mem, bool lost)
{
	(void)ctx;
	(void)lost;
	munmap(mem->base, mem->bytes);
	if (mem->fd >= 0)
		close(mem->fd);
}

static int host_open_slabs(struct device *dev, struct host_device *h, struct gpuq_error *err)
{
	struct slab_backend be = { .granularity = HOST_SLAB_GRANULARITY,
				   .create = host_slab_create,
				   .destroy = host_slab_destroy,
				   .import = host_slab_import,
				   .ctx = dev };
	h->use_slabs = dev->config.buffer_memory != BUFFER_MEMORY_POOL;
	h->slabs = slab_heap_create(&be, HOST_SLAB_CARVE, dev->config.pool_release_bytes);
	if (!h->slabs)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory for its slab heap",
				 dev->index);
	return 0;
}

static void host_free_state(struct host_device *h)
{
	slab_heap_destroy(h->slabs, false);
	pthread_mutex_destroy(&h->lock);
	free(h->staging_block);
	free(h);
}

/*
 * Tests only: GPUQ_HOST_FAIL_OPEN=N[:PATH] makes host device N fail to open
 * (while PATH exists, when given), as a GPU the driver cannot open does at
 * gpuqd's start, so that the integration tests reach a device that never
 * opened and the restart that opens it. The CUDA backend has no such hook.
 */
static int host_fail_open_if_asked(const struct device *dev, struct gpuq_error *err)
{
	const char *v = getenv("GPUQ_HOST_FAIL_OPEN");
	char *end;
	if (!v || !*v || strtol(v, &end, 10) != dev->index || (*end && *end != ':') ||
	    (*end == ':' && access(end + 1, F_OK) != 0))
		return 0;
	return gpuq_fail(err, GPUQ_E_NO_DEVICE,
			 "host device %d: simulated open failure (GPUQ_HOST_FAIL_OPEN)", dev->index);
}

static int host_open(struct device *dev, struct gpuq_error *err)
{
	if (host_fail_open_if_asked(dev, err) != 0)
		return -1;
	struct host_device *h = calloc(1, sizeof *h);
	size_t slot = dev->config.staging_slot_bytes;
	if (!h)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory for its state",
				 dev->index);
	pthread_mutex_init(&h->lock, NULL);
	h->staging_block = malloc(slot * dev->config.staging_slots);
	if (host_open_slabs(dev, h, err) != 0) {
		host_free_state(h);
		return -1;
	}
	if (!h->staging_block) {
		host_free_state(h);
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: cannot allocate %u staging slots of %zu bytes",
				 dev->index, dev->config.staging_slots, slot);
	}
	h->engines = host_engines_start(dev, err);
	if (!h->engines) {
		host_free_state(h);
		return -1;
	}
	h->stream = host_stream_create(h->engines, GPUQ_PRIORITY_NORMAL);
	if (!h->stream) {
		host_engines_stop(h->engines);
		host_free_state(h);
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory for a stream",
				 dev->index);
	}
	for (unsigned i = 0; i < dev->config.staging_slots; i++)
		dev->staging[i] = (char *)h->staging_block + (size_t)i * slot;
	for (int j = 0; j < dev->device_count; j++) { /* every pair: a memcpy */
		dev->peer_access[j] = false;
		dev->peer_link[j] = j == dev->index ? PEER_LINK_NONE : PEER_LINK_HOST;
		dev->pool_shared[j] = j != dev->index;
	}
	dev->impl = h;
	host_fill_info(dev);
	/* Named by the device's uuid, which another gpuqd serving it under another index finds too. */
	slab_heap_set_keeper(h->slabs, dev->config.slab_keeper, dev->info.uuid);
	return 0;
}

static void host_close(struct device *dev)
{
	struct host_device *h = dev->impl;
	if (!h)
		return; /* closed already: a reset that could not open the device again */
	chain_host_close(dev); /* its cached plans */
	collective_device_close(dev); /* its communicators */
	host_engines_stop(h->engines); /* drains every stream first */
	while (h->blocks) {
		struct host_block *b = h->blocks;
		h->blocks = b->next;
		free(b);
	}
	free(dev->peer_ring);
	dev->peer_ring = NULL;
	if (dev->faulted) { /* as a faulted GPU's: the memfds stay for a re-exec */
		dev->kept = slab_heap_destroy_keeping(h->slabs);
		h->slabs = NULL;
	}
	host_free_state(h);
	dev->impl = NULL;
}

static int host_refresh_info(struct device *dev, struct gpuq_error *err)
{
	(void)err;
	host_fill_info(dev);
	return 0;
}

/* Takes bytes of the arena, or refuses with what is in use. */
static int host_reserve(struct device *dev, uint64_t bytes, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	uint64_t capacity = dev->config.host_arena_bytes;
	pthread_mutex_lock(&h->lock);
	uint64_t used = h->used;
	bool fits = bytes <= capacity - used;
	if (fits)
		h->used += bytes; /* reserved now, so two allocations cannot both fit */
	pthread_mutex_unlock(&h->lock);
	if (!fits)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: cannot allocate %llu bytes: %llu of its %llu are in use "
				 "(free a buffer, or raise --host-mem)",
				 dev->index, (unsigned long long)bytes, (unsigned long long)used,
				 (unsigned long long)capacity);
	return 0;
}

static void host_unreserve(struct host_device *h, uint64_t bytes)
{
	pthread_mutex_lock(&h->lock);
	h->used -= bytes;
	pthread_mutex_unlock(&h->lock);
}

/* A malloc'd block of the arena (--buffer-memory pool), the header before it. */
static int host_alloc_block(struct device *dev, uint64_t bytes, void **ptr, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	void *block;
	if (posix_memalign(&block, HOST_ALIGN, HOST_ALIGN + bytes) != 0)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: malloc of %llu bytes failed", dev->index,
				 (unsigned long long)bytes);
	struct host_block *b = block;
	b->bytes = bytes;
	b->prev = NULL;
	pthread_mutex_lock(&h->lock);
	b->next = h->blocks;
	if (h->blocks)
		h->blocks->prev = b;
	h->blocks = b;
	pthread_mutex_unlock(&h->lock);
	*ptr = (char *)block + HOST_ALIGN;
	return 0;
}

/* A range of a slab; *fd (may be NULL: not exported) a descriptor of its own slab, the caller's. */
static int host_alloc_slab(struct device *dev, uint64_t bytes, unsigned flags, void **ptr,
			   int *fd, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	struct slab_place p;
	if (slab_alloc(h->slabs, bytes, flags, &p, err) != 0)
		return -1;
	if (fd && (*fd = fcntl(p.fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		int e = errno;
		slab_free(h->slabs, p.ptr, NULL);
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: cannot duplicate a slab's descriptor: %s", dev->index,
				 strerror(e));
	}
	*ptr = p.ptr;
	return 0;
}

/* Takes bytes of the arena, then memory from `from`; the arena's count is the same for both. */
static int host_alloc_from(struct device *dev, enum buffer_memory from, uint64_t bytes,
			   void **ptr, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	*ptr = NULL;
	if (host_reserve(dev, bytes, err) != 0)
		return -1;
	int rc = from == BUFFER_MEMORY_POOL ? host_alloc_block(dev, bytes, ptr, err)
					    : host_alloc_slab(dev, bytes, 0, ptr, NULL, err);
	if (rc != 0)
		host_unreserve(h, bytes);
	return rc;
}

static int host_alloc(struct device *dev, uint64_t bytes, void **ptr, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	return host_alloc_from(dev, h->use_slabs ? BUFFER_MEMORY_VMM : BUFFER_MEMORY_POOL, bytes,
			       ptr, err);
}

/*
 * The stand-in for cuMemCreate and its export: a slab of its own, a memfd
 * mapped shared, and the descriptor handed out opens that memfd alone, so a
 * client that attaches maps the very bytes the daemon's jobs touch.
 */
static int host_alloc_shareable(struct device *dev, uint64_t bytes, void **ptr, int *fd,
				struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	*ptr = NULL;
	*fd = -1;
	if (host_reserve(dev, bytes, err) != 0)
		return -1;
	if (host_alloc_slab(dev, bytes, SLAB_EXPORTED, ptr, fd, err) != 0) {
		host_unreserve(h, bytes);
		return -1;
	}
	return 0;
}

static int host_place(struct device *dev, const void *ptr, struct slab_place *out)
{
	struct host_device *h = dev->impl;
	return slab_place_of(h->slabs, ptr, out);
}

/* A slab the previous image made; its ranges count against the arena as allocations do. */
static int host_adopt(struct device *dev, uint32_t slab, int fd, uint64_t bytes, bool exported,
		      const struct slab_range *ranges, size_t n, void **base, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	uint64_t asked = 0;
	for (size_t i = 0; i < n; i++)
		asked += ranges[i].bytes;
	if (host_reserve(dev, asked, err) != 0) {
		close(fd);
		return -1;
	}
	if (slab_adopt(h->slabs, slab, fd, bytes, exported, ranges, n, base, err) != 0) {
		host_unreserve(h, asked);
		return -1;
	}
	return 0;
}

/* Compute engine: a slab's range goes back once what came before it on the lane has run. */
static void op_release_slab(struct host_op *op)
{
	struct host_device *h = op->arg;
	uint64_t bytes = 0;
	if (slab_free(h->slabs, op->dst, &bytes) == 0)
		host_unreserve(h, bytes);
}

/* Compute engine: the block goes back to the arena once what came before it on the lane has run. */
static void op_release(struct host_op *op)
{
	struct host_device *h = op->arg;
	struct host_block *b = (struct host_block *)((char *)op->dst - HOST_ALIGN);
	pthread_mutex_lock(&h->lock);
	if (b->prev)
		b->prev->next = b->next;
	else
		h->blocks = b->next;
	if (b->next)
		b->next->prev = b->prev;
	h->used -= b->bytes;
	pthread_mutex_unlock(&h->lock);
	free(b);
}

static int host_release(struct device *dev, void *ptr, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	struct slab_place p;
	if (!ptr)
		return 0;
	struct host_op op = { .dst = ptr, .arg = h };
	bool slab = slab_place_of(h->slabs, ptr, &p) == 0;
	return host_run_sync(dev, HOST_ENGINE_COMPUTE, slab ? op_release_slab : op_release, &op, err);
}

static void op_fill(struct host_op *op)
{
	const struct fill_spec *spec = op->arg;
	size_t size = gpuq_dtype_size(spec->dtype);
	switch (spec->pattern) {
	case FILL_ZERO: memset(op->dst, 0, op->n); break;
	case FILL_VALUE: host_fill_pattern(op->dst, op->n, spec->value_bits, size); break;
	case FILL_IOTA: host_fill_iota(op->dst, op->n / size, spec->dtype); break;
	case FILL_RANDOM: host_fill_random(op->dst, op->n, spec->dtype, spec->seed); break;
	}
}

static int host_fill(struct device *dev, void *ptr, uint64_t bytes, const struct fill_spec *spec,
		     struct gpuq_error *err)
{
	if ((unsigned)spec->pattern > FILL_RANDOM)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "host device %d: fill pattern %d unknown",
				 dev->index, (int)spec->pattern);
	struct host_op op = { .dst = ptr, .n = bytes, .arg = (void *)spec };
	return host_run_sync(dev, HOST_ENGINE_COMPUTE, op_fill, &op, err);
}

/*
 * Tests only: GPUQ_HOST_FAULT_DEVICE=N makes host device N's first
 * checksum fail as a sticky CUDA error does (the device is unhealthy, and is
 * reset: workers/backend/device_reset.c), so that the integration tests reach what
 * becomes of a faulting device without a GPU. Only the first checksum of the
 * process: the reset device then serves (with --reset-limit 0 it stays
 * unhealthy). The CUDA backend has no such hook.
 */
static int host_fault_if_asked(struct device *dev, struct gpuq_error *err)
{
	static atomic_bool fired[GPUQ_MAX_DEVICES];
	const char *v = getenv("GPUQ_HOST_FAULT_DEVICE");
	char *end;
	if (!v || !*v || strtol(v, &end, 10) != dev->index || *end || dev->index >= GPUQ_MAX_DEVICES ||
	    atomic_exchange(&fired[dev->index], true))
		return 0;
	dev->faulted = true;
	snprintf(dev->fault_reason, sizeof dev->fault_reason,
		 "simulated sticky fault (GPUQ_HOST_FAULT_DEVICE=%d)", dev->index);
	return gpuq_fail(err, GPUQ_E_DEVICE_ERROR, "host device %d: %s; it takes no more jobs",
			 dev->index, dev->fault_reason);
}

static void op_checksum(struct host_op *op)
{
	*(uint64_t *)op->arg = host_checksum(op->src, op->n);
}

static int host_checksum_op(struct device *dev, const void *ptr, uint64_t bytes, uint64_t *out,
			    struct gpuq_error *err)
{
	if (host_fault_if_asked(dev, err) != 0)
		return -1;
	struct host_op op = { .src = ptr, .n = bytes, .arg = out };
	return host_run_sync(dev, HOST_ENGINE_COMPUTE, op_checksum, &op, err);
}

static void op_memcpy(struct host_op *op)
{
	memcpy(op->dst, op->src, op->n);
}

/* An asynchronous copy through a staging slot, marking the slot's event after it. */
static int host_slot_copy(struct device *dev, enum host_engine_kind kind, void *dst,
			  const void *src, size_t n, unsigned slot, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	struct host_op op = { .dst = dst, .src = src, .n = n };
	unsigned span = backend_slot_span(dev, slot, n);
	if (span == 0)
		return gpuq_fail(err, GPUQ_E_INTERNAL,
				 "host device %d: %zu bytes from slot %u of %u: out of range",
				 dev->index, n, slot, dev->config.staging_slots);
	if (host_enqueue(dev, kind, op_memcpy, &op, err) != 0)
		return -1;
	for (unsigned i = slot; i < slot + span; i++)
		if (host_stream_record(host_current(dev), &h->slot_done[i]) != 0)
			return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
					 "host device %d: no memory to queue work", dev->index);
	return 0;
}

static int host_h2d(struct device *dev, void *dst, unsigned slot, size_t n, struct gpuq_error *err)
{
	return host_slot_copy(dev, HOST_ENGINE_H2D, dst, dev->staging[slot], n, slot, err);
}

static int host_d2h(struct device *dev, unsigned slot, const void *src, size_t n,
		    struct gpuq_error *err)
{
	return host_slot_copy(dev, HOST_ENGINE_D2H, dev->staging[slot], src, n, slot, err);
}

static int host_slot_wait(struct device *dev, unsigned slot, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	(void)err;
	host_event_wait_host(dev, &h->slot_done[slot]);
	return 0;
}

static int host_slot_ready(struct device *dev, unsigned slot, bool *ready, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	(void)err;
	*ready = host_event_done(&h->slot_done[slot]);
	return 0;
}

/* Host memory needs no registering to be memcpy'd. */
static int host_register_range(struct device *dev, void *ptr, size_t n, unsigned flags,
			       struct gpuq_error *err)
{
	(void)dev;
	(void)ptr;
	(void)n;
	(void)flags;
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

/* One copy on an engine of the current stream, waited for, timed between marks around it. */
static int host_copy_timed(struct device *dev, enum host_engine_kind kind, void *dst,
			   const void *src, size_t n, double *seconds, struct gpuq_error *err)
{
	struct host_event start = { 0 }, end = { 0 };
	struct host_op op = { .dst = dst, .src = src, .n = n };
	struct host_stream *s = host_current(dev);
	if (host_stream_record(s, &start) != 0 || host_enqueue(dev, kind, op_memcpy, &op, err) != 0 ||
	    host_stream_record(s, &end) != 0)
		return err->code != GPUQ_OK ? -1
					    : gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
							"host device %d: no memory to queue work",
							dev->index);
	host_event_wait_host(dev, &end);
	if (seconds)
		*seconds = end.at - start.at;
	return 0;
}

static int host_copy_h2d(struct device *dev, void *dst, const void *src, size_t n,
			 double *seconds, struct gpuq_error *err)
{
	gpuq_error_clear(err);
	return host_copy_timed(dev, HOST_ENGINE_H2D, dst, src, n, seconds, err);
}

static int host_copy_d2h(struct device *dev, void *dst, const void *src, size_t n,
			 double *seconds, struct gpuq_error *err)
{
	gpuq_error_clear(err);
	return host_copy_timed(dev, HOST_ENGINE_D2H, dst, src, n, seconds, err);
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
 * Device-to-device copies: the copy engine for the driver's copies, the
 * compute engine for the SM kernel; the host-staged ring's copies on the
 * engines of their direction. All enqueued on the current stream.
 */
static int host_copy_d2d(struct device *dev, void *dst, const void *src, size_t n,
			 enum copy_engine engine, struct gpuq_error *err)
{
	struct host_op op = { .dst = dst, .src = src, .n = n };
	return host_enqueue(dev, engine == COPY_ENGINE_SM ? HOST_ENGINE_COMPUTE : HOST_ENGINE_COPY,
			    op_memcpy, &op, err);
}

static int host_copy_peer(struct device *dev, void *dst, int src_index, const void *src,
			  size_t n, struct gpuq_error *err)
{
	(void)src_index;
	struct host_op op = { .dst = dst, .src = src, .n = n };
	return host_enqueue(dev, HOST_ENGINE_COPY, op_memcpy, &op, err);
}

static int host_ring_d2h(struct device *dev, void *host, const void *src, size_t n,
			 struct gpuq_error *err)
{
	struct host_op op = { .dst = host, .src = src, .n = n };
	return host_enqueue(dev, HOST_ENGINE_D2H, op_memcpy, &op, err);
}

static int host_ring_h2d(struct device *dev, void *dst, const void *host, size_t n,
			 struct gpuq_error *err)
{
	struct host_op op = { .dst = dst, .src = host, .n = n };
	return host_enqueue(dev, HOST_ENGINE_H2D, op_memcpy, &op, err);
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

/* A mark still queued would stamp freed memory: wait for it first. */
static void host_event_destroy(struct device *dev, void *event)
{
	(void)dev;
	if (!event)
		return;
	host_event_wait_host(dev, event);
	free(event);
}

static int host_event_record(struct device *dev, void *event, struct gpuq_error *err)
{
	if (host_stream_record(host_current(dev), event) != 0)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory to queue work",
				 dev->index);
	return 0;
}

/* The event may be another device's, as CUDA allows. */
static int host_event_wait(struct device *dev, void *event, struct gpuq_error *err)
{
	if (host_stream_wait_event(host_current(dev), event) != 0)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory to queue work",
				 dev->index);
	return 0;
}

static int host_event_sync(struct device *dev, void *event, struct gpuq_error *err)
{
	(void)dev;
	(void)err;
	host_event_wait_host(dev, event);
	return 0;
}

static int host_event_query(struct device *dev, void *event, bool *done, struct gpuq_error *err)
{
	(void)dev;
	(void)err;
	*done = host_event_done(event);
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

/* Between close and open: the arena's blocks went with close, as a GPU's memory goes with its context. */
/*
 * Tests only: with GPUQ_HOST_FAULT_NEEDS_RESTART set, a device that
 * GPUQ_HOST_FAULT_DEVICE faulted cannot be reset, as a CUDA driver that
 * gives the process no new context (needs_restart): gpuqd re-executes
 * itself for it (daemon/restart.c).
 */
static int host_reset(struct device *dev, struct gpuq_error *err)
{
	if (!getenv("GPUQ_HOST_FAULT_NEEDS_RESTART") || !strstr(dev->fault_reason, "simulated"))
		return 0;
	dev->needs_restart = true;
	return gpuq_fail(err, GPUQ_E_DEVICE_ERROR,
			 "host device %d: the driver gives this process no new context "
			 "(simulated: GPUQ_HOST_FAULT_NEEDS_RESTART); restart gpuqd", dev->index);
}

static int host_lane_create(struct device *dev, int priority, void **lane, struct gpuq_error *err)
{
	struct host_device *h = dev->impl;
	*lane = host_stream_create(h->engines, priority);
	if (!*lane)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory for a lane",
				 dev->index);
	return 0;
}

static void host_lane_destroy(struct device *dev, void *lane)
{
	(void)dev;
	host_stream_destroy(lane);
}

const struct backend_ops backend_host = {
	.name = "host",
	.completions_notify = true,
	.device.count = host_device_count,
	.device.open = host_open,
	.device.close = host_close,
	.device.refresh_info = host_refresh_info,
	.mem.alloc = host_alloc,
	.mem.alloc_from = host_alloc_from,
	.mem.place = host_place,
	.mem.adopt = host_adopt,
	.mem.release = host_release,
	.mem.fill = host_fill,
	.mem.checksum = host_checksum_op,
	.copy.h2d_async = host_h2d,
	.copy.d2h_async = host_d2h,
	.copy.slot_wait = host_slot_wait,
	.copy.slot_ready = host_slot_ready,
	.mem.alloc_shareable = host_alloc_shareable,
	.mem.host_register = host_register_range,
	.mem.host_unregister = host_unregister_range,
	.copy.h2d = host_copy_h2d,
	.copy.d2h = host_copy_d2h,
	.mem.host_alloc_pinned = host_alloc_host,
	.mem.host_free_pinned = host_free_host,
	.copy.d2d = host_copy_d2d,
	.copy.peer = host_copy_peer,
	.copy.ring_d2h = host_ring_d2h,
	.copy.ring_h2d = host_ring_h2d,
	.mem.host_alloc_portable = host_alloc_host,
	.mem.host_free_portable = host_free_host,
	.events.create = host_event_create,
	.events.destroy = host_event_destroy,
	.events.record = host_event_record,
	.events.wait = host_event_wait,
	.events.sync = host_event_sync,
	.events.elapsed = host_event_elapsed,
	.chain.run = chain_host_run,
	.chain.copy_time = chain_host_copy_time,
	.chain.read_time = chain_host_read_time,
	.coll.unique_id = host_coll_unique_id,
	.coll.comm_init = host_coll_comm_init,
	.coll.run = host_coll_run,
	.coll.bench = host_coll_bench,
	.coll.comm_abort = host_coll_comm_release,
	.coll.comm_destroy = host_coll_comm_release,
	.events.lane_create = host_lane_create,
	.events.lane_destroy = host_lane_destroy,
	.events.query = host_event_query,
	.chain.enqueue = chain_host_enqueue,
	.device.reset = host_reset,
};
