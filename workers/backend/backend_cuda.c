/*
 * The CUDA backend: each struct device is one GPU.
 *
 * Threads. device_count runs on the main thread before any worker starts.
 * Every other operation runs on the device's worker thread, the only thread
 * that calls CUDA for that device: open makes the device current there
 * (cudaSetDevice is per thread), so the state in dev->impl needs no lock.
 * CUDA's last error is per thread as well; cuda_fail clears it after each
 * failure so that it cannot resurface at a later launch check.
 *
 * What open takes, and close gives back in reverse order:
 *   - the device's primary context, initialised and made current;
 *   - three non-blocking streams: compute (alloc, release, fill, checksum)
 *     and h2d and d2h (staged copies), so that copies in both directions
 *     overlap each other and compute;
 *   - a memory pool on the device, which keeps up to
 *     config.pool_release_bytes of freed memory cached between jobs, and a
 *     heap of exportable slabs (workers/buffer/slab.h over cuda_vmm.h):
 *     buffers come from one or the other (--buffer-memory), shareable
 *     buffers always from a slab of their own;
 *   - the staging ring: one pinned block cut into config.staging_slots slots
 *     (dev->staging) and one event per slot that marks its last copy;
 *   - a device word and a pinned host word for checksums;
 *   - peer access to every other device that allows it (dev->peer_access).
 *
 * Every operation leaves the compute stream idle when it returns. The copies
 * h2d_async and d2h_async enqueue are finished by the caller's slot_wait
 * (transfer.c waits for every slot before a job ends), so no buffer is still
 * in use on a copy stream when release frees it on the compute stream.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "protocol/hash.h"
#include "workers/log.h"
#include "kernels/kernels.h"
#include "protocol/protocol.h"
#include "workers/backend/backend.h"
#include "workers/chain/chain.h"
#include "workers/collective/collective_cuda.h"
#include "workers/backend/cuda_check.h"
#include "workers/backend/cuda_util.h"
#include "workers/backend/cuda_vmm.h"
#include "workers/backend/numa.h"
#include "workers/backend/peer_link.h"
#include "workers/buffer/slab.h"

/* Dtypes are passed to the kernels by value: both enums must agree. */
_Static_assert((int)KERNELS_BYTES == (int)GPUQ_DTYPE_BYTES && (int)KERNELS_U8 == (int)GPUQ_DTYPE_U8 &&
		       (int)KERNELS_I32 == (int)GPUQ_DTYPE_I32 &&
		       (int)KERNELS_I64 == (int)GPUQ_DTYPE_I64 &&
		       (int)KERNELS_F16 == (int)GPUQ_DTYPE_F16 &&
		       (int)KERNELS_BF16 == (int)GPUQ_DTYPE_BF16 &&
		       (int)KERNELS_F32 == (int)GPUQ_DTYPE_F32 &&
		       (int)KERNELS_F64 == (int)GPUQ_DTYPE_F64,
	       "enum kernels_dtype must number dtypes as enum gpuq_dtype does");

/*
 * The slabs small buffers are carved from: 16 granules of 2 MiB, so that a
 * 4 KiB buffer costs 4 KiB of a slab that a few hundred such share, and a
 * slab's creation (a few driver calls) is paid once per many buffers.
 */
#define CUDA_SLAB_CARVE ((uint64_t)32 << 20)

/* Slots start on page boundaries, which copy engines and memcpy both favour. */
#define CUDA_SLOT_ALIGN ((size_t)4096)

/* Remembers an allocation; false when the host is out of memory. */
static bool cuda_track(struct cuda_state *st, void *ptr)
{
	if (st->nlive == st->live_cap) {
		size_t cap = st->live_cap ? st->live_cap * 2 : 64;
		void **live = realloc(st->live, cap * sizeof *live);
		if (!live)
			return false;
		st->live = live;
		st->live_cap = cap;
	}
	st->live[st->nlive++] = ptr;
	return true;
}

static void cuda_untrack(struct cuda_state *st, void *ptr)
{
	for (size_t i = 0; i < st->nlive; i++) {
		if (st->live[i] == ptr) {
			st->live[i] = st->live[--st->nlive];
			return;
		}
	}
}

/* Main thread. The configuration is the host backend's business; CUDA counts its own. */
static int cuda_device_count(const struct device_config *config, int *count,
			     struct gpuq_error *err)
{
	(void)config;
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		return gpuq_fail(err, GPUQ_E_NO_DEVICE,
				 "no CUDA devices: cudaGetDeviceCount: %s (%s); run with "
				 "--backend host for the host backend",
				 cudaGetErrorString(e), cudaGetErrorName(e));
	}
	if (n < 1)
		return gpuq_fail(err, GPUQ_E_NO_DEVICE,
				 "no CUDA devices: cudaGetDeviceCount found none; run with "
				 "--backend host for the host backend");
	*count = n;
	return 0;
}

/* What open relies on from the daemon; a failure here is a bug in the caller. */
static int cuda_check_config(const struct device *dev, struct gpuq_error *err)
{
	const struct device_config *c = &dev->config;
	if (c->staging_slots < 1 || c->staging_slots > GPUQ_MAX_STAGING_SLOTS ||
	    c->staging_slot_bytes == 0)
		return gpuq_fail(err, GPUQ_E_INTERNAL,
				 "[gpu %d] open: %u staging slots of %zu bytes: need 1..%d slots of "
				 "at least one byte",
				 dev->index, c->staging_slots, c->staging_slot_bytes,
				 GPUQ_MAX_STAGING_SLOTS);
	if (dev->device_count < 1 || dev->device_count > GPUQ_MAX_DEVICES || !dev->ordinals ||
	    dev->index < 0 || dev->index >= dev->device_count)
		return gpuq_fail(err, GPUQ_E_INTERNAL,
				 "[gpu %d] open: index %d of %d devices (at most %d), ordinals %s",
				 dev->index, dev->index, dev->device_count, GPUQ_MAX_DEVICES,
				 dev->ordinals ? "given" : "missing");
	return 0;
}

/* Creates the primary context now, so that its failure is open's, not a job's. */
static int cuda_open_context(struct device *dev, struct gpuq_error *err)
{
	CUDA_TRY(dev, err, cudaInitDevice(dev->ordinal, 0, 0));
	CUDA_TRY(dev, err, cudaSetDevice(dev->ordinal));
	return 0;
}

static int cuda_open_streams(struct device *dev, struct cuda_state *st, struct gpuq_error *err)
{
	CUDA_TRY(dev, err, cudaStreamCreateWithFlags(&st->compute, cudaStreamNonBlocking));
	CUDA_TRY(dev, err, cudaStreamCreateWithFlags(&st->h2d, cudaStreamNonBlocking));
	CUDA_TRY(dev, err, cudaStreamCreateWithFlags(&st->d2h, cudaStreamNonBlocking));
	CUDA_TRY(dev, err, cudaEventCreateWithFlags(&st->sync_done, cudaEventDisableTiming));
	return 0;
}

static int cuda_open_pool(struct device *dev, struct cuda_state *st, struct gpuq_error *err)
{
	int supported = 0;
	CUDA_TRY(dev, err,
		 cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev->ordinal));
	if (!supported)
		return gpuq_fail(err, GPUQ_E_NO_DEVICE,
				 "[gpu %d] CUDA device %d does not support memory pools "
				 "(cudaDevAttrMemoryPoolsSupported is 0), which gpuq needs",
				 dev->index, dev->ordinal);
	struct cudaMemPoolProps props;
	memset(&props, 0, sizeof props);
	props.allocType = cudaMemAllocationTypePinned;
	props.handleTypes = cudaMemHandleTypeNone;
	props.location.type = cudaMemLocationTypeDevice;
	props.location.id = dev->ordinal;
	CUDA_TRY(dev, err, cudaMemPoolCreate(&st->pool, &props));
	uint64_t threshold = dev->config.pool_release_bytes; /* the attribute is a cuuint64_t */
	CUDA_TRY(dev, err,
		 cudaMemPoolSetAttribute(st->pool, cudaMemPoolAttrReleaseThreshold, &threshold));
	return 0;
}

/*
 * The ring on the GPU's NUMA node, where the machine has several and
 * says which: anonymous memory bound there (preferred) before its first
 * touch, then pinned by cudaHostRegister. Anything short of that, and every
 * single-node machine, gets cudaHostAlloc's pages (the allocating thread's
 * node): placement is an optimisation, never a reason for open to fail.
 */
static bool cuda_ring_on_node(struct device *dev, struct cuda_state *st, size_t bytes)
{
	char bus_id[32];
	if (cudaDeviceGetPCIBusId(bus_id, (int)sizeof bus_id, dev->ordinal) != cudaSuccess) {
		(void)cudaGetLastError();
		return false;
	}
	int node = numa_node_of_pci(bus_id);
	if (node < 0)
		return false;
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return false;
	if (numa_prefer_node(p, bytes, node) != 0 ||
	    cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
		(void)cudaGetLastError();
		munmap(p, bytes);
		return false;
	}
	st->staging = p;
	st->ring_mapped = bytes;
	return true;
}

static int cuda_alloc_ring(struct device *dev, struct cuda_state *st, size_t bytes,
			   struct gpuq_error *err)
{
	if (cuda_ring_on_node(dev, st, bytes))
		return 0;
	CUDA_TRY(dev, err, cudaHostAlloc(&st->staging, bytes, cudaHostAllocDefault));
	return 0;
}

static void cuda_free_ring(struct device *dev, struct cuda_state *st)
{
	if (st->staging && st->ring_mapped) {
		CUDA_LOG(dev, cudaHostUnregister(st->staging));
		munmap(st->staging, st->ring_mapped);
	} else if (st->staging) {
		CUDA_LOG(dev, cudaFreeHost(st->staging));
	}
	st->staging = NULL;
	st->ring_mapped = 0;
}

static int cuda_open_staging(struct device *dev, struct cuda_state *st, struct gpuq_error *err)
{
	const struct device_config *c = &dev->config;
	size_t stride = (c->staging_slot_bytes + CUDA_SLOT_ALIGN - 1) / CUDA_SLOT_ALIGN *
			CUDA_SLOT_ALIGN;
	if (stride < c->staging_slot_bytes || stride > SIZE_MAX / c->staging_slots)
		return gpuq_fail(err, GPUQ_E_INTERNAL,
				 "[gpu %d] open: %u staging slots of %zu bytes overflow size_t",
				 dev->index, c->staging_slots, c->staging_slot_bytes);
	if (cuda_alloc_ring(dev, st, stride * c->staging_slots, err) != 0)
		return -1;
	for (unsigned i = 0; i < c->staging_slots; i++) {
		dev->staging[i] = (char *)st->staging + (size_t)i * stride;
		CUDA_TRY(dev, err,
			 cudaEventCreateWithFlags(&st->slot_done[i], cudaEventDisableTiming));
	}
	return 0;
}

static int cuda_open_checksum(struct device *dev, struct cuda_state *st, struct gpuq_error *err)
{
	void *p;
	CUDA_TRY(dev, err, cudaMalloc(&p, sizeof *st->d_sum));
	st->d_sum = p;
	CUDA_TRY(dev, err, cudaHostAlloc(&p, sizeof *st->h_sum, cudaHostAllocDefault));
	st->h_sum = p;
	return 0;
}

/* Enables access to gpuq device j's memory when CUDA allows it. */
static int cuda_enable_peer(struct device *dev, struct cuda_state *st, int j,
			    struct gpuq_error *err)
{
	int peer = dev->ordinals[j], can = 0;
	CUDA_TRY(dev, err, cudaDeviceCanAccessPeer(&can, dev->ordinal, peer));
	if (!can)
		return 0;
	cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
	if (e == cudaErrorPeerAccessAlreadyEnabled) {
		(void)cudaGetLastError(); /* not an error for us, but CUDA recorded it */
		e = cudaSuccess;
	}
	if (e != cudaSuccess) {
		char what[96];
		snprintf(what, sizeof what, "cudaDeviceEnablePeerAccess(%d, 0) for gpu %d", peer, j);
		return CUDA_FAIL(dev, err, e, what);
	}
	st->peer_enabled[j] = true;
	dev->peer_access[j] = true;
	return 0;
}

/*
 * peer_access[j] (by gpuq index) is true when this device can address device
 * j's memory directly. A device is not its own peer; the same GPU named twice
 * in --devices can, trivially.
 */
static int cuda_open_peers(struct device *dev, struct cuda_state *st, struct gpuq_error *err)
{
	for (int j = 0; j < dev->device_count; j++) {
		dev->peer_access[j] = false;
		if (j == dev->index)
			continue;
		if (dev->ordinals[j] == dev->ordinal) {
			dev->peer_access[j] = true;
			continue;
		}
		if (cuda_enable_peer(dev, st, j, err) != 0)
			return -1;
	}
	return 0;
}

/*
 * Grants every device that can reach this one's memory access to its
 * pool: peer access (cudaDeviceEnablePeerAccess) does not cover memory
 * from a cudaMemPool, which each pool's owner must share itself. A grant
 * CUDA refuses leaves that pair host-staged, with the reason in peer_note.
 */
static int cuda_share_pool(struct device *dev, struct cuda_state *st, struct gpuq_error *err)
{
	for (int j = 0; j < dev->device_count; j++) {
		int can = 0, peer = dev->ordinals[j];
		dev->pool_shared[j] = j != dev->index && peer == dev->ordinal;
		if (j == dev->index || peer == dev->ordinal)
			continue;
		CUDA_TRY(dev, err, cudaDeviceCanAccessPeer(&can, peer, dev->ordinal));
		if (!can)
			continue;
		struct cudaMemAccessDesc desc;
		memset(&desc, 0, sizeof desc);
		desc.location.type = cudaMemLocationTypeDevice;
		desc.location.id = peer;
		desc.flags = cudaMemAccessFlagsProtReadWrite;
		cudaError_t e = cudaMemPoolSetAccess(st->pool, &desc, 1);
		if (e != cudaSuccess && cuda_error_is_sticky(e))
			return CUDA_FAIL(dev, err, e, "cudaMemPoolSetAccess(pool, gpu j, read-write)");
		if (e != cudaSuccess) {
			(void)cudaGetLastError();
			snprintf(dev->peer_note, sizeof dev->peer_note,
				 "cudaMemPoolSetAccess for gpu %d failed: %s; copies to it are host-staged",
				 j, cudaGetErrorName(e));
			continue;
		}
		dev->pool_shared[j] = true;
	}
	return 0;
}

/* What kind of link each peer this device can reach is on (NVML, when there). */
static void cuda_probe_links(struct device *dev)
{
	char self_bus[32], bus[32];
	bool have_self = cudaDeviceGetPCIBusId(self_bus, (int)sizeof self_bus, dev->ordinal) ==
			 cudaSuccess;
	(void)cudaGetLastError();
	for (int j = 0; j < dev->device_count; j++) {
		dev->peer_link[j] = PEER_LINK_NONE;
		if (j == dev->index || !dev->peer_access[j])
			continue;
		if (dev->ordinals[j] == dev->ordinal) {
			dev->peer_link[j] = PEER_LINK_SAME;
			continue;
		}
		char note[sizeof dev->peer_note];
		int nvlink = -1;
		if (have_self && cudaDeviceGetPCIBusId(bus, (int)sizeof bus, dev->ordinals[j]) == cudaSuccess)
			nvlink = peer_link_nvlink(self_bus, bus, note, sizeof note);
		else
			snprintf(note, sizeof note, "the PCI bus id of gpu %d is unknown", j);
		(void)cudaGetLastError();
		dev->peer_link[j] = nvlink > 0 ? PEER_LINK_NVLINK : nvlink == 0 ? PEER_LINK_PCIE
									: PEER_LINK_P2P;
		if (nvlink < 0 && !dev->peer_note[0])
			snprintf(dev->peer_note, sizeof dev->peer_note, "%s", note);
	}
}

/* Copies a string that may fill its whole array, unterminated, as cudaDeviceProp.name may. */
static void cuda_copy_string(char *dst, size_t size, const char *src, size_t src_size)
{
	size_t n = strnlen(src, src_size);
	if (n > size - 1)
		n = size - 1;
	memcpy(dst, src, n);
	dst[n] = '\0';
}

/* As nvidia-smi shows it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
/* Current thread's device: the worker's, since open. */
static int cuda_refresh_info(struct device *dev, struct gpuq_error *err)
{
	size_t free_bytes, total_bytes;
	CUDA_TRY(dev, err, cudaMemGetInfo(&free_bytes, &total_bytes));
	dev->info.mem_free = free_bytes;
	dev->info.mem_total = total_bytes;
	return 0;
}

static int cuda_read_info(struct device *dev, struct gpuq_error *err)
{
	struct device_info *info = &dev->info;
	struct cudaDeviceProp prop;
	CUDA_TRY(dev, err, cudaGetDeviceProperties(&prop, dev->ordinal));
	memset(info, 0, sizeof *info);
	cuda_copy_string(info->name, sizeof info->name, prop.name, sizeof prop.name);
	gpuq_format_uuid(info->uuid, sizeof info->uuid, (const unsigned char *)prop.uuid.bytes);
	CUDA_TRY(dev, err,
		 cudaDeviceGetPCIBusId(info->pci_bus_id, (int)sizeof info->pci_bus_id,
				       dev->ordinal));
	info->cc_major = prop.major;
	info->cc_minor = prop.minor;
	info->sms = prop.multiProcessorCount;
	info->copy_engines = prop.asyncEngineCount;
	return cuda_refresh_info(dev, err);
}

static void cuda_teardown_sync(struct device *dev, struct cuda_state *st)
{
	cudaStream_t streams[] = { st->compute, st->h2d, st->d2h };
	for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++)
		if (streams[i])
			CUDA_LOG(dev, cudaStreamSynchronize(streams[i]));
}

static void cuda_teardown_staging(struct device *dev, struct cuda_state *st)
{
	for (unsigned i = 0; i < GPUQ_MAX_STAGING_SLOTS; i++)
		if (st->slot_done[i])
			CUDA_LOG(dev, cudaEventDestroy(st->slot_done[i]));
	cuda_free_ring(dev, st);
	if (st->h_sum)
		CUDA_LOG(dev, cudaFreeHost(st->h_sum));
	if (st->d_sum)
		CUDA_LOG(dev, cudaFree(st->d_sum));
}

static void cuda_teardown_peers(struct device *dev, struct cuda_state *st)
{
	for (int j = 0; j < dev->device_count && j < GPUQ_MAX_DEVICES; j++) {
		if (st->peer_enabled[j])
			CUDA_LOG(dev, cudaDeviceDisablePeerAccess(dev->ordinals[j]));
		dev->peer_access[j] = false;
	}
}

/* Frees the buffers clients left (slabs, pool allocations), then the pool itself. */
static void cuda_teardown_pool(struct device *dev, struct cuda_state *st)
{
	slab_heap_destroy(st->slabs, false);
	st->slabs = NULL;
	for (size_t i = 0; i < st->nlive; i++)
		CUDA_LOG(dev, cudaFreeAsync(st->live[i], st->compute));
	if (st->nlive)
		CUDA_LOG(dev, cudaStreamSynchronize(st->compute));
	free(st->live);
	st->live = NULL;
	st->nlive = st->live_cap = 0;
	if (!st->pool)
		return;
	CUDA_LOG(dev, cudaMemPoolTrimTo(st->pool, 0));
	CUDA_LOG(dev, cudaMemPoolDestroy(st->pool));
}

static void cuda_teardown_streams(struct device *dev, struct cuda_state *st)
{
	if (st->sync_done)
		CUDA_LOG(dev, cudaEventDestroy(st->sync_done));
	cudaStream_t streams[] = { st->compute, st->h2d, st->d2h };
	for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++)
		if (streams[i])
			CUDA_LOG(dev, cudaStreamDestroy(streams[i]));
}

/*
 * Releases whatever of open's work exists (open's failure path uses it too).
 * A faulted context fails every call the same way, so nothing is asked of it:
 * the driver reclaims the device's resources when the process exits.
 */
static void cuda_teardown(struct device *dev)
{
	struct cuda_state *st = dev->impl;
	if (!st)
		return;
	chain_cuda_close(dev); /* its graphs, stream and events, first */
	collective_device_close(dev); /* its communicators, after any graph */
	if (!dev->faulted) {
		cuda_teardown_sync(dev, st);
		if (dev->peer_ring)
			CUDA_LOG(dev, cudaFreeHost(dev->peer_ring));
		cuda_teardown_staging(dev, st);
		cuda_teardown_peers(dev, st);
		cuda_teardown_pool(dev, st);
		cuda_teardown_streams(dev, st);
	} else if (st->staging && st->ring_mapped) {
		/* The context's registrations die with it (a reset); our mapping does not. */
		munmap(st->staging, st->ring_mapped);
	}
	/* A faulted context's slabs: unmapped as far as the driver lets, their descriptors kept for a re-exec. */
	if (st->slabs)
		dev->kept = slab_heap_destroy_keeping(st->slabs);
	memset(dev->staging, 0, sizeof dev->staging);
	free(st->live);
	free(st);
	dev->impl = NULL;
}

/* A slab: one exportable allocation (cuda_vmm.h), its exported descriptor kept with it. */
static int cuda_slab_create(void *ctx, uint64_t bytes, struct slab_mem *mem, struct gpuq_error *err)
{
	struct device *dev = ctx;
	struct cuda_state *st = dev->impl;
	struct cuda_vmm_alloc a;
	int fd = -1;
	if (cuda_vmm_create(dev, bytes, &a, &fd, err) != 0) {
		st->slab_oom = err->code == GPUQ_E_OUT_OF_MEMORY;
		return -1;
	}
	*mem = (struct slab_mem){ .base = (void *)(uintptr_t)a.va, .bytes = a.size, .fd = fd,
				  .handle = a.handle };
	return 0;
}

/* A slab the previous image made, imported from its descriptor (a re-exec). */
static int cuda_slab_import(void *ctx, int fd, uint64_t bytes, struct slab_mem *mem,
			    struct gpuq_error *err)
{
	struct device *dev = ctx;
	struct cuda_vmm_alloc a;
	if (cuda_vmm_import(dev, fd, bytes, &a, err) != 0)
		return -1;
	*mem = (struct slab_mem){ .base = (void *)(uintptr_t)a.va, .bytes = a.size, .fd = fd,
				  .handle = a.handle };
	return 0;
}

/* Called only once the work queued on the slab has finished (release syncs first). */
static void cuda_slab_destroy(void *ctx, struct slab_mem *mem, bool lost)
{
	struct device *dev = ctx;
	struct gpuq_error err;
	struct cuda_vmm_alloc a = { mem->handle, (unsigned long long)(uintptr_t)mem->base, mem->bytes };
	if (lost)
		cuda_vmm_destroy_lost(&a);
	else if (cuda_vmm_destroy(dev, &a, &err) != 0)
		log_warn("%s (giving a slab back)", err.message);
	if (mem->fd >= 0)
		close(mem->fd);
}

/*
 * The slab heap, and whether buffers come from it (--buffer-memory: auto
 * takes slabs where the driver supports them and says on stderr why not
 * otherwise; vmm insists). Shareable buffers use the heap either way.
 */
static int cuda_open_slabs(struct device *dev, struct cuda_state *st, struct gpuq_error *err)
{
	struct gpuq_error why;
	uint64_t granularity = (uint64_t)2 << 20; /* the usual one, where the probe cannot say */
	bool ok = cuda_vmm_probe(dev, &granularity, &why) == 0;
	enum buffer_memory want = dev->config.buffer_memory;
	if (!ok && want == BUFFER_MEMORY_VMM)
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR, "--buffer-memory vmm: %s; use --buffer-memory pool",
				 why.message);
	if (!ok && want == BUFFER_MEMORY_AUTO)
		log_info("[gpu %d] buffers come from the memory pool: %s", dev->index,
			why.message);
	st->use_slabs = ok && want != BUFFER_MEMORY_POOL;
	struct slab_backend be = { .granularity = granularity,
				   .create = cuda_slab_create,
				   .destroy = cuda_slab_destroy,
				   .import = cuda_slab_import,
				   .ctx = dev };
	st->slabs = slab_heap_create(&be, CUDA_SLAB_CARVE, dev->config.pool_release_bytes);
	if (!st->slabs)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] open: no host memory for the slab heap",
				 dev->index);
	return 0;
}

static int cuda_open(struct device *dev, struct gpuq_error *err)
{
	if (cuda_check_config(dev, err) != 0)
		return -1;
	struct cuda_state *st = calloc(1, sizeof *st);
	if (!st)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "[gpu %d] open: no host memory for the backend's state", dev->index);
	dev->impl = st;
	if (cuda_open_context(dev, err) != 0)
		goto fail;
	if (cuda_open_streams(dev, st, err) != 0)
		goto fail;
	if (cuda_open_pool(dev, st, err) != 0)
		goto fail;
	if (cuda_open_staging(dev, st, err) != 0)
		goto fail;
	if (cuda_open_checksum(dev, st, err) != 0)
		goto fail;
	if (cuda_open_peers(dev, st, err) != 0)
		goto fail;
	if (cuda_share_pool(dev, st, err) != 0)
		goto fail;
	cuda_probe_links(dev);
	if (cuda_open_slabs(dev, st, err) != 0)
		goto fail;
	if (cuda_read_info(dev, err) != 0)
		goto fail;
	dev->info.buffer_memory = st->use_slabs ? "vmm" : "pool";
	/* Named by the GPU's uuid, which another gpuqd serving it under another index finds too. */
	slab_heap_set_keeper(st->slabs, dev->config.slab_keeper, dev->info.uuid);
	return 0;
fail:
	cuda_teardown(dev); /* undoes exactly the steps that completed */
	return -1;
}

static void cuda_close(struct device *dev)
{
	cuda_teardown(dev);
}

/*
 * Destroys the device's primary context and everything in it, on this
 * (the worker's) thread, so that the next open makes a fresh one: what
 * recovers a context a sticky error has poisoned without a restart.
 */
static int cuda_reset(struct device *dev, struct gpuq_error *err)
{
	/* Both may report the sticky error that brought us here: the reset clears it. */
	cudaError_t e = cudaSetDevice(dev->ordinal);
	if (e == cudaSuccess || cuda_error_is_sticky(e))
		e = cudaDeviceReset();
	(void)cudaGetLastError();
	if (e == cudaSuccess || cuda_error_is_sticky(e))
		e = cudaInitDevice(dev->ordinal, 0, 0); /* a fresh context, or why there is none */
	(void)cudaGetLastError();
	dev->needs_restart = e == cudaErrorDevicesUnavailable;
	if (dev->needs_restart) /* seen on H200s under driver 580 after an illegal address */
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR,
				 "[gpu %d] after the fault the CUDA driver gives this process no new "
				 "context on the GPU (cudaErrorDevicesUnavailable): restart gpuqd to use "
				 "it again (systemctl restart gpuqd; the other GPUs serve on until then)",
				 dev->index);
	if (e != cudaSuccess && !cuda_error_is_sticky(e))
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR, "[gpu %d] cudaDeviceReset failed: %s (%s)",
				 dev->index, cudaGetErrorString(e), cudaGetErrorName(e));
	return 0;
}

/*
 * An allocation the device cannot satisfy: say how much was asked and how
 * much is free, and which call refused (call, what it said).
 */
static int cuda_fail_oom(struct device *dev, uint64_t bytes, const char *call, const char *said,
			 struct gpuq_error *err)
{
	const double gib = 1024.0 * 1024.0 * 1024.0;
	size_t free_bytes = 0, total_bytes = 0;
	(void)cudaGetLastError(); /* out of memory is not sticky: clear it */
	if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess)
		(void)cudaGetLastError();
	return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
			 "[gpu %d] out of device memory: cannot allocate %" PRIu64
			 " bytes (%.2f GiB) with %zu bytes (%.2f GiB) of %.2f GiB free "
			 "(%s: %s); free a buffer on gpu %d or ask for less",
			 dev->index, bytes, (double)bytes / gib, free_bytes,
			 (double)free_bytes / gib, (double)total_bytes / gib, call, said, dev->index);
}

/*
 * Allocates from the device's pool on the current stream and waits, so that
 * the memory is usable on any stream and a failure belongs to this job.
 */
static int cuda_alloc_pool(struct device *dev, uint64_t bytes, void **ptr, struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	cudaError_t e = cudaMallocFromPoolAsync(ptr, bytes, st->pool, cuda_current_stream(dev));
	if (e == cudaErrorMemoryAllocation) {
		*ptr = NULL;
		return cuda_fail_oom(dev, bytes, "cudaMallocFromPoolAsync", cudaGetErrorName(e), err);
	}
	if (e != cudaSuccess) {
		*ptr = NULL;
		return CUDA_FAIL(dev, err, e, "cudaMallocFromPoolAsync(ptr, bytes, pool, stream)");
	}
	if (cuda_sync(dev, err) != 0) {
		CUDA_LOG(dev, cudaFreeAsync(*ptr, cuda_current_stream(dev)));
		*ptr = NULL;
		return -1;
	}
	if (!cuda_track(st, *ptr)) {
		CUDA_LOG(dev, cudaFreeAsync(*ptr, cuda_current_stream(dev)));
		*ptr = NULL;
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "[gpu %d] no host memory to record an allocation", dev->index);
	}
	return 0;
}

/*
 * A range of a slab (flags SLAB_*); *fd, when not NULL, a descriptor of
 * its own slab, the caller's. The stream does not order a slab's creation,
 * so the memory is complete on return. A slab the driver could not make
 * for want of memory is worded as the pool's refusal is (cuda_fail_oom).
 */
static int cuda_alloc_slab(struct device *dev, uint64_t bytes, unsigned flags, void **ptr, int *fd,
			   struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	struct slab_place p;
	st->slab_oom = false;
	if (slab_alloc(st->slabs, bytes, flags, &p, err) != 0) {
		if (st->slab_oom && !(flags & SLAB_EXPORTED))
			return cuda_fail_oom(dev, bytes, "cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY", err);
		return -1;
	}
	if (fd && (*fd = fcntl(p.fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		int e = errno;
		slab_free(st->slabs, p.ptr, NULL);
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "[gpu %d] cannot duplicate a slab's descriptor: %s", dev->index,
				 strerror(e));
	}
	*ptr = p.ptr;
	return 0;
}

/* Zero bytes give NULL, which release accepts. */
static int cuda_alloc_from(struct device *dev, enum buffer_memory from, uint64_t bytes, void **ptr,
			   struct gpuq_error *err)
{
	*ptr = NULL;
	if (bytes == 0)
		return 0;
	if (from == BUFFER_MEMORY_POOL)
		return cuda_alloc_pool(dev, bytes, ptr, err);
	return cuda_alloc_slab(dev, bytes, 0, ptr, NULL, err);
}

static int cuda_alloc(struct device *dev, uint64_t bytes, void **ptr, struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	return cuda_alloc_from(dev, st->use_slabs ? BUFFER_MEMORY_VMM : BUFFER_MEMORY_POOL, bytes,
			       ptr, err);
}

/* A buffer clients may attach: a slab of its own, exported (cuda_vmm.h); its messages as before slabs. */
static int cuda_alloc_shareable(struct device *dev, uint64_t bytes, void **ptr, int *fd,
				struct gpuq_error *err)
{
	*ptr = NULL;
	*fd = -1;
	return cuda_alloc_slab(dev, bytes, SLAB_EXPORTED, ptr, fd, err);
}

static int cuda_place(struct device *dev, const void *ptr, struct slab_place *out)
{
	struct cuda_state *st = dev->impl;
	return slab_place_of(st->slabs, ptr, out);
}

static int cuda_adopt(struct device *dev, uint32_t slab, int fd, uint64_t bytes, bool exported,
		      const struct slab_range *ranges, size_t n, void **base, struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	return slab_adopt(st->slabs, slab, fd, bytes, exported, ranges, n, base, err);
}

/*
 * Frees a slab's range once the lane is idle: neither unmapping nor a
 * range's next use is stream ordered. 1 when ptr was one (0: a pool
 * allocation), -1 with err.
 */
static int cuda_release_slab(struct device *dev, struct cuda_state *st, void *ptr,
			     struct gpuq_error *err)
{
	struct slab_place p;
	if (slab_place_of(st->slabs, ptr, &p) != 0)
		return 0;
	if (cuda_sync(dev, err) != 0)
		return -1;
	slab_free(st->slabs, ptr, NULL);
	return 1;
}

static int cuda_release(struct device *dev, void *ptr, struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	if (!ptr)
		return 0;
	int slab = cuda_release_slab(dev, st, ptr, err);
	if (slab != 0)
		return slab < 0 ? -1 : 0;
	cuda_untrack(st, ptr);
	CUDA_TRY(dev, err, cudaFreeAsync(ptr, cuda_current_stream(dev)));
	return cuda_sync(dev, err);
}

static bool cuda_dtype_is_float(enum gpuq_dtype dtype)
{
	return dtype == GPUQ_DTYPE_F16 || dtype == GPUQ_DTYPE_BF16 || dtype == GPUQ_DTYPE_F32 ||
	       dtype == GPUQ_DTYPE_F64;
}

/*
 * Enqueues the fill on the compute stream. Like the host backend, typed
 * patterns write whole elements only (a trailing partial element is left as
 * it was); byte-defined ones (zero; random for bytes and integers) write all.
 */
static int cuda_enqueue_fill(struct device *dev, void *ptr, uint64_t bytes,
			     const struct fill_spec *spec, size_t size, struct gpuq_error *err)
{
	cudaStream_t stream = cuda_current_stream(dev);
	enum kernels_dtype kd = (enum kernels_dtype)spec->dtype;
	uint64_t whole = bytes - bytes % size;
	switch (spec->pattern) {
	case FILL_ZERO:
		CUDA_TRY(dev, err, cudaMemsetAsync(ptr, 0, bytes, stream));
		return 0;
	case FILL_VALUE:
		CUDA_TRY(dev, err,
			 kernels_fill_pattern(ptr, whole, spec->value_bits, (unsigned)size, stream));
		return 0;
	case FILL_IOTA:
		CUDA_TRY(dev, err, kernels_fill_iota(ptr, bytes / size, kd, stream));
		return 0;
	case FILL_RANDOM:
		CUDA_TRY(dev, err,
			 kernels_fill_random(ptr, cuda_dtype_is_float(spec->dtype) ? whole : bytes,
					     kd, spec->seed, stream));
		return 0;
	}
	return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] fill: pattern %d unknown", dev->index,
			 (int)spec->pattern);
}

static int cuda_fill(struct device *dev, void *ptr, uint64_t bytes, const struct fill_spec *spec,
		     struct gpuq_error *err)
{
	size_t size = gpuq_dtype_size(spec->dtype);
	if (size == 0)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] fill: dtype %d unknown",
				 dev->index, (int)spec->dtype);
	if (cuda_enqueue_fill(dev, ptr, bytes, spec, size, err) != 0)
		return -1;
	return cuda_sync(dev, err);
}

static int cuda_checksum(struct device *dev, const void *ptr, uint64_t bytes, uint64_t *out,
			 struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	struct cuda_lane *lane = dev->lane;
	unsigned long long *d_sum = lane ? lane->d_sum : st->d_sum;
	unsigned long long *h_sum = lane ? lane->h_sum : st->h_sum;
	cudaStream_t stream = cuda_current_stream(dev);
	CUDA_TRY(dev, err, kernels_checksum_sum(ptr, bytes, d_sum, stream));
	CUDA_TRY(dev, err,
		 cudaMemcpyAsync(h_sum, d_sum, sizeof *h_sum, cudaMemcpyDeviceToHost, stream));
	if (cuda_sync(dev, err) != 0)
		return -1;
	*out = gpuq_checksum_finish(*h_sum, bytes);
	return 0;
}

/* A slot out of range or an oversized copy is a bug in the caller. */
static int cuda_check_slot(const struct device *dev, const char *op, unsigned slot, size_t n,
			   struct gpuq_error *err)
{
	if (slot < dev->config.staging_slots && n <= dev->config.staging_slot_bytes)
		return 0;
	return gpuq_fail(err, GPUQ_E_INTERNAL,
			 "[gpu %d] %s: slot %u of %u, %zu bytes into a %zu-byte slot: out of range",
			 dev->index, op, slot, dev->config.staging_slots, n,
			 dev->config.staging_slot_bytes);
}

/* The slots a copy of n bytes from slot's start covers (backend_slot_span), or 0 with err. */
static unsigned cuda_slot_span(const struct device *dev, const char *op, unsigned slot, size_t n,
			       struct gpuq_error *err)
{
	unsigned k = backend_slot_span(dev, slot, n);
	if (k == 0)
		(void)cuda_check_slot(dev, op, slot, n, err);
	return k;
}

/* Marks each slot of a span busy until the copy just queued on stream ends. */
static int cuda_record_span(struct device *dev, cudaStream_t stream, unsigned slot, unsigned k,
			    struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	for (unsigned i = slot; i < slot + k; i++)
		CUDA_TRY(dev, err, cudaEventRecord(st->slot_done[i], stream));
	return 0;
}

static int cuda_h2d_async(struct device *dev, void *dst, unsigned slot, size_t n,
			  struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	unsigned k = cuda_slot_span(dev, "h2d_async", slot, n, err);
	if (k == 0)
		return -1;
	cudaStream_t stream = cuda_stream(dev, st->h2d);
	CUDA_TRY(dev, err, cudaMemcpyAsync(dst, dev->staging[slot], n, cudaMemcpyHostToDevice, stream));
	return cuda_record_span(dev, stream, slot, k, err);
}

static int cuda_d2h_async(struct device *dev, unsigned slot, const void *src, size_t n,
			  struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	unsigned k = cuda_slot_span(dev, "d2h_async", slot, n, err);
	if (k == 0)
		return -1;
	cudaStream_t stream = cuda_stream(dev, st->d2h);
	CUDA_TRY(dev, err, cudaMemcpyAsync(dev->staging[slot], src, n, cudaMemcpyDeviceToHost, stream));
	return cuda_record_span(dev, stream, slot, k, err);
}

/* An event never recorded counts as complete, so a fresh slot needs no wait. */
static int cuda_slot_wait(struct device *dev, unsigned slot, struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	if (cuda_check_slot(dev, "slot_wait", slot, 0, err) != 0)
		return -1;
	return cuda_wait_event(dev, st->slot_done[slot], "cudaEventQuery(slot_done[slot])", err);
}

static int cuda_slot_ready(struct device *dev, unsigned slot, bool *ready, struct gpuq_error *err)
{
	struct cuda_state *st = dev->impl;
	if (cuda_check_slot(dev, "slot_ready", slot, 0, err) != 0)
		return -1;
	cudaError_t e = cudaEventQuery(st->slot_done[slot]);
	*ready = e == cudaSuccess;
	if (e == cudaErrorNotReady) {
		(void)cudaGetLastError(); /* "not ready" is an answer, not an error to report later */
		return 0;
	}
	return e == cudaSuccess ? 0 : CUDA_FAIL(dev, err, e, "cudaEventQuery(slot_done[slot])");
}

static int cuda_host_register(struct device *dev, void *ptr, size_t n, unsigned how,
			      struct gpuq_error *err)
{
	unsigned flags = how & BACKEND_REGISTER_PORTABLE ? cudaHostRegisterPortable
							 : cudaHostRegisterDefault;
	if (how & BACKEND_REGISTER_READ_ONLY) {
		int supported = 0;
		CUDA_TRY(dev, err,
			 cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported,
						dev->ordinal));
		if (!supported)
			return gpuq_fail(err, GPUQ_E_DEVICE_ERROR,
					 "[gpu %d] cannot register a read-only mapping: the device does "
					 "not support cudaHostRegisterReadOnly; pass a descriptor open "
					 "for reading and writing, or use path staged",
					 dev->index);
		flags |= cudaHostRegisterReadOnly;
	}
	cudaError_t e = cudaHostRegister(ptr, n, flags);
	if (e == cudaErrorHostMemoryAlreadyRegistered && (how & BACKEND_REGISTER_PORTABLE)) {
		/* a region pinned again after a reset whose registration outlived the context */
		(void)cudaGetLastError();
		return 0;
	}
	return e == cudaSuccess ? 0 : CUDA_FAIL(dev, err, e, "cudaHostRegister(ptr, n, flags)");
}

/*
 * A registration a device reset took with its context (a region's) is
 * nothing left to undo, so "not registered" is not a failure here.
 */
static int cuda_host_unregister(struct device *dev, void *ptr, struct gpuq_error *err)
{
	cudaError_t e = cudaHostUnregister(ptr);
	if (e == cudaErrorHostMemoryNotRegistered) {
		(void)cudaGetLastError();
		return 0;
	}
	return e == cudaSuccess ? 0 : CUDA_FAIL(dev, err, e, "cudaHostUnregister(ptr)");
}

/* One copy on stream s, waited for; timed between events around it when seconds is given. */
static int cuda_copy_sync(struct device *dev, cudaStream_t s, void *dst, const void *src,
			  size_t n, enum cudaMemcpyKind kind, double *seconds,
			  struct gpuq_error *err)
{
	cudaEvent_t ev[2] = { NULL, NULL };
	float ms = 0;
	int rc = -1;
	if (seconds) {
		CUDA_TRY_GOTO(dev, err, cudaEventCreate(&ev[0]), out);
		CUDA_TRY_GOTO(dev, err, cudaEventCreate(&ev[1]), out);
		CUDA_TRY_GOTO(dev, err, cudaEventRecord(ev[0], s), out);
	}
	CUDA_TRY_GOTO(dev, err, cudaMemcpyAsync(dst, src, n, kind, s), out);
	if (seconds)
		CUDA_TRY_GOTO(dev, err, cudaEventRecord(ev[1], s), out);
	if (cuda_sync(dev, err) != 0)
		goto out;
	if (seconds) {
		CUDA_TRY_GOTO(dev, err, cudaEventElapsedTime(&ms, ev[0], ev[1]), out);
		*seconds = ms / 1e3;
	}
	rc = 0;
out:
	for (int i = 0; i < 2; i++)
		if (ev[i])
			CUDA_LOG(dev, cudaEventDestroy(ev[i]));
	return rc;
}

static int cuda_copy_h2d(struct device *dev, void *dst, const void *src, size_t n,
			 double *seconds, struct gpuq_error *err)
{
	return cuda_copy_sync(dev, cuda_current_stream(dev), dst, src, n, cudaMemcpyHostToDevice,
			      seconds, err);
}

static int cuda_copy_d2h(struct device *dev, void *dst, const void *src, size_t n,
			 double *seconds, struct gpuq_error *err)
{
	return cuda_copy_sync(dev, cuda_current_stream(dev), dst, src, n, cudaMemcpyDeviceToHost,
			      seconds, err);
}

static int cuda_host_alloc_pinned(struct device *dev, size_t n, void **ptr,
				  struct gpuq_error *err)
{
	*ptr = NULL;
	CUDA_TRY(dev, err, cudaHostAlloc(ptr, n, cudaHostAllocDefault));
	return 0;
}

static void cuda_host_free_pinned(struct device *dev, void *ptr)
{
	if (ptr)
		CUDA_LOG(dev, cudaFreeHost(ptr));
}

/*
 * Device-to-device copies (workers/copy/copy.c): everything on the
 * compute stream, ordered by events; the caller syncs its own events.
 */
static int cuda_copy_d2d(struct device *dev, void *dst, const void *src, size_t n,
			 enum copy_engine engine, struct gpuq_error *err)
{
	if (engine == COPY_ENGINE_SM)
		CUDA_TRY(dev, err, kernels_copy(dst, src, n, cuda_current_stream(dev)));
	else
		CUDA_TRY(dev, err,
			 cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, cuda_current_stream(dev)));
	return 0;
}

static int cuda_copy_peer(struct device *dev, void *dst, int src_index, const void *src,
			  size_t n, struct gpuq_error *err)
{
	if (src_index < 0 || src_index >= dev->device_count)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "[gpu %d] copy_peer from device %d of %d",
				 dev->index, src_index, dev->device_count);
	CUDA_TRY(dev, err,
		 cudaMemcpyPeerAsync(dst, dev->ordinal, src, dev->ordinals[src_index], n,
				     cuda_current_stream(dev)));
	return 0;
}

static int cuda_ring_d2h(struct device *dev, void *host, const void *src, size_t n,
			 struct gpuq_error *err)
{
	CUDA_TRY(dev, err, cudaMemcpyAsync(host, src, n, cudaMemcpyDeviceToHost, cuda_current_stream(dev)));
	return 0;
}

static int cuda_ring_h2d(struct device *dev, void *dst, const void *host, size_t n,
			 struct gpuq_error *err)
{
	CUDA_TRY(dev, err, cudaMemcpyAsync(dst, host, n, cudaMemcpyHostToDevice, cuda_current_stream(dev)));
	return 0;
}

static int cuda_host_alloc_portable(struct device *dev, size_t n, void **ptr,
				    struct gpuq_error *err)
{
	*ptr = NULL;
	CUDA_TRY(dev, err, cudaHostAlloc(ptr, n, cudaHostAllocPortable));
	return 0;
}

static void cuda_host_free_portable(struct device *dev, void *ptr)
{
	if (ptr)
		CUDA_LOG(dev, cudaFreeHost(ptr));
}

static int cuda_event_create(struct device *dev, bool timing, void **event,
			     struct gpuq_error *err)
{
	cudaEvent_t e = NULL;
	*event = NULL;
	CUDA_TRY(dev, err,
		 cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
	*event = e;
	return 0;
}

static void cuda_event_destroy(struct device *dev, void *event)
{
	if (event && !dev->faulted)
		CUDA_LOG(dev, cudaEventDestroy((cudaEvent_t)event));
}

static int cuda_event_record(struct device *dev, void *event, struct gpuq_error *err)
{
	CUDA_TRY(dev, err, cudaEventRecord((cudaEvent_t)event, cuda_current_stream(dev)));
	return 0;
}

/* The event may be another device's: CUDA lets a stream wait for any device's event. */
static int cuda_event_wait(struct device *dev, void *event, struct gpuq_error *err)
{
	CUDA_TRY(dev, err, cudaStreamWaitEvent(cuda_current_stream(dev), (cudaEvent_t)event, 0));
	return 0;
}

static int cuda_event_sync(struct device *dev, void *event, struct gpuq_error *err)
{
	return cuda_wait_event(dev, (cudaEvent_t)event, "cudaEventQuery(event)", err);
}

static int cuda_event_query(struct device *dev, void *event, bool *done, struct gpuq_error *err)
{
	struct cuda_event_poll p = { (cudaEvent_t)event, cudaErrorNotReady };
	*done = cuda_event_settled(&p) && p.result == cudaSuccess;
	if (p.result == cudaSuccess || p.result == cudaErrorNotReady)
		return 0;
	return CUDA_FAIL(dev, err, p.result, "cudaEventQuery(event)");
}

/*
 * Lane priorities: high gets the GPU's greatest stream priority, low its
 * least (the default streams' too), normal the middle of the range.
 */
static int cuda_stream_priority(struct device *dev, int priority, int *out, struct gpuq_error *err)
{
	int least = 0, greatest = 0;
	CUDA_TRY(dev, err, cudaDeviceGetStreamPriorityRange(&least, &greatest));
	*out = priority == GPUQ_PRIORITY_HIGH ? greatest
	       : priority == GPUQ_PRIORITY_LOW ? least
					       : least + (greatest - least) / 2;
	return 0;
}

static void cuda_lane_destroy(struct device *dev, void *lane)
{
	struct cuda_lane *l = lane;
	if (!l)
		return;
	if (dev->faulted) { /* a lost context fails every call: the driver reclaims at exit */
		free(l);
		return;
	}
	if (l->stream)
		CUDA_LOG(dev, cudaStreamDestroy(l->stream));
	if (l->done)
		CUDA_LOG(dev, cudaEventDestroy(l->done));
	if (l->d_sum)
		CUDA_LOG(dev, cudaFree(l->d_sum));
	if (l->h_sum)
		CUDA_LOG(dev, cudaFreeHost(l->h_sum));
	free(l);
}

static int cuda_lane_create(struct device *dev, int priority, void **lane, struct gpuq_error *err)
{
	int cuda_priority = 0;
	void *p = NULL;
	*lane = NULL;
	struct cuda_lane *l = calloc(1, sizeof *l);
	if (!l)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory for a lane",
				 dev->index);
	if (cuda_stream_priority(dev, priority, &cuda_priority, err) != 0)
		goto fail;
	CUDA_TRY_GOTO(dev, err,
		      cudaStreamCreateWithPriority(&l->stream, cudaStreamNonBlocking, cuda_priority),
		      fail);
	CUDA_TRY_GOTO(dev, err, cudaEventCreateWithFlags(&l->done, cudaEventDisableTiming), fail);
	CUDA_TRY_GOTO(dev, err, cudaMalloc(&p, sizeof *l->d_sum), fail);
	l->d_sum = p;
	CUDA_TRY_GOTO(dev, err, cudaHostAlloc(&p, sizeof *l->h_sum, cudaHostAllocDefault), fail);
	l->h_sum = p;
	*lane = l;
	return 0;
fail:
	cuda_lane_destroy(dev, l);
	return -1;
}

static int cuda_event_elapsed(struct device *dev, void *start, void *end, double *seconds,
			      struct gpuq_error *err)
{
	float ms = 0;
	CUDA_TRY(dev, err, cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end));
	*seconds = ms / 1e3;
	return 0;
}

const struct backend_ops backend_cuda = {
	.name = "cuda",
	.device.count = cuda_device_count,
	.device.open = cuda_open,
	.device.close = cuda_close,
	.device.refresh_info = cuda_refresh_info,
	.mem.alloc = cuda_alloc,
	.mem.alloc_from = cuda_alloc_from,
	.mem.place = cuda_place,
	.mem.adopt = cuda_adopt,
	.mem.release = cuda_release,
	.mem.fill = cuda_fill,
	.mem.checksum = cuda_checksum,
	.copy.h2d_async = cuda_h2d_async,
	.copy.d2h_async = cuda_d2h_async,
	.copy.slot_wait = cuda_slot_wait,
	.copy.slot_ready = cuda_slot_ready,
	.mem.alloc_shareable = cuda_alloc_shareable,
	.mem.host_register = cuda_host_register,
	.mem.host_unregister = cuda_host_unregister,
	.copy.h2d = cuda_copy_h2d,
	.copy.d2h = cuda_copy_d2h,
	.mem.host_alloc_pinned = cuda_host_alloc_pinned,
	.mem.host_free_pinned = cuda_host_free_pinned,
	.copy.d2d = cuda_copy_d2d,
	.copy.peer = cuda_copy_peer,
	.copy.ring_d2h = cuda_ring_d2h,
	.copy.ring_h2d = cuda_ring_h2d,
	.mem.host_alloc_portable = cuda_host_alloc_portable,
	.mem.host_free_portable = cuda_host_free_portable,
	.events.create = cuda_event_create,
	.events.destroy = cuda_event_destroy,
	.events.record = cuda_event_record,
	.events.wait = cuda_event_wait,
	.events.sync = cuda_event_sync,
	.events.elapsed = cuda_event_elapsed,
	.chain.run = chain_cuda_run,
	.chain.copy_time = chain_cuda_copy_time,
	.chain.read_time = chain_cuda_read_time,
	.coll.unique_id = cuda_coll_unique_id,
	.coll.comm_init = cuda_coll_comm_init,
	.coll.run = cuda_coll_run,
	.coll.bench = cuda_coll_bench,
	.coll.comm_abort = cuda_coll_comm_abort,
	.coll.comm_destroy = cuda_coll_comm_destroy,
	.events.lane_create = cuda_lane_create,
	.events.lane_destroy = cuda_lane_destroy,
	.events.query = cuda_event_query,
	.chain.enqueue = chain_cuda_enqueue,
	.device.reset = cuda_reset,
};
