/*
 * The backend seam: one small table of device operations, implemented by the
 * CUDA backend (backend_cuda.c) and by the host backend (backend_host.c, a
 * "device" that is a memory arena). Jobs (workers/run.c, workers/transfer.c)
 * are written once against it.
 *
 * Threads: device_count runs on the main thread before any worker starts.
 * Every other operation runs only on the worker thread that owns the device,
 * between its open and its close. Operations return 0, or -1 with err set
 * (code and a message that names the device and the failing call).
 */
#ifndef GPUQ_BACKEND_H
#define GPUQ_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"

#define GPUQ_MAX_DEVICES 64
#define GPUQ_MAX_STAGING_SLOTS 16

struct device_info {
	char name[128];
	char uuid[64];
	char pci_bus_id[32];
	int cc_major, cc_minor;
	int sms;
	int copy_engines;
	uint64_t mem_total;
	uint64_t mem_free;
};

enum fill_pattern { FILL_ZERO, FILL_VALUE, FILL_IOTA, FILL_RANDOM };

struct fill_spec {
	enum fill_pattern pattern;
	enum gpuq_dtype dtype;
	uint64_t value_bits; /* FILL_VALUE: one element's bytes, little-endian */
	uint64_t seed;       /* FILL_RANDOM */
};

struct device_config {
	size_t staging_slot_bytes;    /* size of one pinned staging slot */
	unsigned staging_slots;       /* slots in the ring (2..GPUQ_MAX_STAGING_SLOTS) */
	uint64_t pool_release_bytes;  /* CUDA pool release threshold */
	uint64_t host_arena_bytes;    /* host backend: bytes a device may hold */
	int host_devices;             /* host backend: how many devices to make */
};

struct backend_ops;

/* One device as its worker sees it. Owned by that worker thread. */
struct device {
	int index;  /* gpuq's index: what clients name */
	int ordinal; /* the backend's own number (CUDA device ordinal) */
	const struct backend_ops *ops;
	struct device_config config;
	struct device_info info;
	bool peer_access[GPUQ_MAX_DEVICES]; /* filled by open */
	int device_count;                   /* devices in the daemon, for the peer matrix */
	const int *ordinals; /* every device's backend number, by gpuq index (daemon-owned) */
	/* The staging ring, allocated by open: pinned host memory on CUDA. */
	void *staging[GPUQ_MAX_STAGING_SLOTS];
	/*
	 * Set by the backend when an error leaves the device unusable (a sticky
	 * CUDA error: the context is lost). The worker then marks it unhealthy
	 * with fault_reason and refuses further jobs on it.
	 */
	bool faulted;
	char fault_reason[256];
	void *impl; /* the backend's private state */
};

struct backend_ops {
	const char *name; /* "cuda" or "host" */

	/*
	 * Devices this backend can serve (the host backend: config->host_devices).
	 * Main thread, before workers start.
	 */
	int (*device_count)(const struct device_config *config, int *count,
			    struct gpuq_error *err);

	/* Takes the device: context, streams, pool, staging ring, peer matrix, info. */
	int (*open)(struct device *dev, struct gpuq_error *err);
	/* Releases everything open took, in order; logs and goes on past errors. */
	void (*close)(struct device *dev);

	/* Refreshes the volatile parts of dev->info (free memory). */
	int (*refresh_info)(struct device *dev, struct gpuq_error *err);

	/* Device memory: GPUQ_E_OUT_OF_MEMORY when it cannot be had. */
	int (*alloc)(struct device *dev, uint64_t bytes, void **ptr, struct gpuq_error *err);
	int (*release)(struct device *dev, void *ptr, struct gpuq_error *err);

	/* Synchronous: the fill/checksum is complete when they return. */
	int (*fill)(struct device *dev, void *ptr, uint64_t bytes,
		    const struct fill_spec *spec, struct gpuq_error *err);
	int (*checksum)(struct device *dev, const void *ptr, uint64_t bytes,
			uint64_t *out, struct gpuq_error *err);

	/*
	 * Asynchronous copies between a staging slot and device memory: enqueue
	 * the copy (host->device on one stream, device->host on another) and mark
	 * the slot busy; slot_wait blocks until the slot's last copy is done.
	 */
	int (*h2d_async)(struct device *dev, void *dst, unsigned slot, size_t n,
			 struct gpuq_error *err);
	int (*d2h_async)(struct device *dev, unsigned slot, const void *src, size_t n,
			 struct gpuq_error *err);
	int (*slot_wait)(struct device *dev, unsigned slot, struct gpuq_error *err);

	/* [copy] operations of the pipelined-copy issue */
	/* [chain] operations of the kernel-chain issue */
	/* [collective] operations of the all-reduce issue */
};

extern const struct backend_ops backend_cuda;
extern const struct backend_ops backend_host;

/* "cuda" or "host" -> its table, or NULL. */
const struct backend_ops *backend_by_name(const char *name);

#endif
