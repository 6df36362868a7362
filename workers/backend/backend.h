/*
 * The backend seam: the device operations jobs are written against, once,
 * implemented by the CUDA backend (backend_cuda.c) and by the host backend
 * (backend_host.c, a "device" that is a memory arena). struct backend_ops
 * groups them by concern into small tables: the device's life (device),
 * memory (mem), copies (copy), events and lanes (events), kernel chains
 * (chain) and collectives (coll). A backend that lacks an operation leaves
 * it NULL where the caller checks (chain.enqueue).
 *
 * Threads: device.count runs on the main thread before any worker starts.
 * Every other operation runs only on the worker thread that owns the device,
 * between its open and its close. Operations return 0, or -1 with err set
 * (code and a message that names the device and the failing call). A
 * backend that must wait for the device or for a host thread does so
 * through dev->waits (struct device_waits), never by calling the scheduler.
 */
#ifndef GPUQ_BACKEND_H
#define GPUQ_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"
#include "workers/buffer/slab.h"

#define GPUQ_MAX_DEVICES 64
#define GPUQ_MAX_STAGING_SLOTS 256

/*
 * Where buffers' memory comes from (--buffer-memory): the backend's pool
 * (CUDA: a cudaMemPool; host: malloc'd blocks), or exportable slabs
 * (workers/buffer/slab.h: CUDA VMM allocations, host memfds). AUTO is
 * slabs where the device supports them, else the pool.
 */
enum buffer_memory { BUFFER_MEMORY_AUTO, BUFFER_MEMORY_POOL, BUFFER_MEMORY_VMM };

struct device_info {
	char name[128];
	char uuid[SLAB_OWNER_MAX];
	char pci_bus_id[32];
	int cc_major, cc_minor;
	int sms;
	int copy_engines;
	uint64_t mem_total;
	uint64_t mem_free;
	const char *buffer_memory; /* what open chose: "vmm" or "pool" (a static string) */
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
	uint64_t pool_release_bytes;  /* CUDA pool release threshold; also the empty slabs kept */
	enum buffer_memory buffer_memory; /* --buffer-memory */
	uint64_t host_arena_bytes;    /* host backend: bytes a device may hold */
	int host_devices;             /* host backend: how many devices to make */
	struct copy_pool *copy_pool;  /* host copy threads shared by the workers (daemon-owned) */
	uint64_t register_min_bytes;  /* path auto: register client mappings from this size (0: never) */
	unsigned chain_graph_cache;   /* chain plans (CUDA graphs) kept per device: --graph-cache */
	unsigned reset_limit;         /* faults recovered within reset_window_s before a device stays unhealthy */
	unsigned reset_window_s;
	char kernel_cache_dir[256];   /* compiled chain kernels on disk: --kernel-cache ("": none) */
	char nvrtc[256];              /* --nvrtc: "" (search the loader's path), a library, or "off" */
	struct device_adopt_list *adopt; /* a re-exec: the slabs each worker takes over after open (NULL: none) */
	const struct slab_keeper *slab_keeper; /* holds slabs' descriptors beyond gpuqd (NULL: none; slab.h) */
};

/*
 * A slab the previous gpuqd image made, for its device's worker to take
 * over (mem.adopt) once the device has opened, before it serves: the main
 * thread fills everything but base and why, and reads those once the
 * workers have opened (worker_pool_start returns).
 */
struct device_adopt {
	int device; /* gpuq's index in the record (-1: a GPU the record's writer did not serve) */
	char uuid[SLAB_OWNER_MAX]; /* the GPU's, which the worker goes by ("": a record without uuids: by device) */
	uint32_t slab;
	int fd;
	uint64_t bytes;
	bool exported;
	struct slab_range *ranges;
	size_t nranges;
	char held_as[SLAB_NAME_MAX]; /* the name the slab keeper holds it under ("": it does not, or by its own) */
	bool taken;    /* handed to mem.adopt, which took fd whatever happened */
	void *base;    /* where it lies now; NULL when it could not be taken over (why) */
	char why[sizeof ((struct gpuq_error *)0)->message];
};

/*
 * A host region the previous image had pinned, for its device's worker to
 * map and pin again (region_pin_map, as region_create's work does) before
 * it serves: the main thread keeps fd and fills device and bytes, and
 * reads map (NULL: not taken, why), node and seconds once the workers have
 * opened.
 */
struct device_adopt_region {
	int device; /* gpuq's index in the record */
	char uuid[SLAB_OWNER_MAX]; /* its device's GPU, which the worker goes by ("": by device) */
	int served_by; /* the index of the worker that tried it (when tried) */
	int fd; /* the client's memfd, gpuqd's descriptor of it (not taken: the main thread's) */
	uint64_t bytes;
	bool tried;
	void *map;
	int node;
	double seconds;
	char why[sizeof ((struct gpuq_error *)0)->message];
};

struct device_adopt_list {
	struct device_adopt *slabs;
	size_t n;
	struct device_adopt_region *regions;
	size_t nregions;
};

struct backend_ops;
struct copy_pool;
struct device_adopt_list;
struct slab_keeper; /* workers/buffer/slab.h */
struct slab_place;
struct slab_range;
/* host_register's flags. */
#define BACKEND_REGISTER_READ_ONLY 1u
#define BACKEND_REGISTER_PORTABLE 2u
/*
 * Device-to-device copies (workers/copy/copy.c). How a device reaches
 * another's memory, as open finds it: the kind of link where the driver can
 * copy directly, or NONE (copies go through host memory, "host-staged").
 */
enum peer_link {
	PEER_LINK_NONE,   /* no peer access: host-staged */
	PEER_LINK_SAME,   /* the same GPU named twice in --devices */
	PEER_LINK_NVLINK, /* peer access over NVLink (NVML says so) */
	PEER_LINK_PCIE,   /* peer access, and NVML says the pair has no NVLink */
	PEER_LINK_P2P,    /* peer access; the link's kind is unknown (no NVML: see peer_note) */
	PEER_LINK_HOST,   /* the host backend: a memcpy between arenas */
};
/* The engines a copy within one device may use. */
enum copy_engine { COPY_ENGINE_CE, COPY_ENGINE_SM };
/* workers/collective/collective.h */
struct coll_cache;
struct coll_call;
struct coll_id;
struct chain_spec;
struct chain_state;
struct sched;
struct device;
struct slab_kept;
#define DEVICE_CHAIN_COUNTERS 16

/*
 * What a backend asks of the scheduler that drives its device, through
 * this table rather than by name, since the scheduler is above it
 * (workers/sched/sched_wait.h fills it in; the worker sets dev->waits
 * before the device opens). wait_device and wait_host yield the running
 * job until ready(arg) (outside a job they poll): wait_device for what
 * the device finishes by itself (an event: the worker keeps polling),
 * wait_host for what the backend's own threads finish and announce with
 * notify (the worker may sleep meanwhile). notify (any thread) wakes
 * scheduler s, which may be NULL. publish_tail: the running job has issued
 * all the device work it will issue on its lane (sched_publish_tail).
 */
struct device_waits {
	void (*wait_device)(bool (*ready)(void *arg), void *arg);
	void (*wait_host)(bool (*ready)(void *arg), void *arg);
	void (*notify)(struct sched *s);
	void (*publish_tail)(struct device *dev);
};

/* One device as its worker sees it. Owned by that worker thread. */
struct device {
	int index;  /* gpuq's index: what clients name */
	int ordinal; /* the backend's own number (CUDA device ordinal) */
	const struct backend_ops *ops;
	const struct device_waits *waits; /* the scheduler's hooks, set before open */
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
	unsigned resets; /* resets done (device_reset.c; worker thread) */
	/* A reset failed to open it again: nothing of the backend's is held (workers/backend/device_reset.c). */
	bool lost;
	/*
	 * Set by reset when the driver gives this process no new context on the
	 * device after a fault: only a new process recovers it, so retrying is
	 * pointless and the health says to restart gpuqd.
	 */
	bool needs_restart;
	/*
	 * The slabs of a context that faulted, whose descriptors close keeps
	 * open (workers/buffer/slab.h, slab_heap_destroy_keeping) so that the
	 * buffers' memory outlives the context for the re-exec a needs_restart
	 * asks for. device_reset.c lets them go once the device opens again in
	 * this process (its buffers are lost then, as before); the worker at its
	 * end. NULL: none.
	 */
	struct slab_kept *kept;
	/*
	 * The host regions this device pinned (workers/transfer/region_pin.c):
	 * their registrations go with the context at a reset, so the new one
	 * pins them again. NULL: none. Worker thread only.
	 */
	struct region_pin *pinned_regions;
	void *impl; /* the backend's private state */
	/* The kernel-chain state (workers/chain/chain.h): the graph cache, made by
	 * the worker at the device's first chain and released by close. */
	struct chain_state *chain;
	/* Chain counters: added to by the worker, read by the main thread's
	 * `stats` op (the one part of a device it reads), hence atomic. */
	_Atomic uint64_t chain_counters[DEVICE_CHAIN_COUNTERS];
	/*
	 * Filled by open, read-only afterwards: peer_link[j] is how this
	 * device reaches device j's memory; pool_shared[j] says whether device j
	 * was granted access to this device's memory pool (where buffers live);
	 * peer_note says why a link's kind is unknown ("" when nothing to say).
	 */
	enum peer_link peer_link[GPUQ_MAX_DEVICES];
	bool pool_shared[GPUQ_MAX_DEVICES];
	char peer_note[160];
	/*
	 * The host-staged peer ring of copies from this device: portable
	 * pinned memory (host_alloc_portable), made by workers/copy/copy.c at the
	 * first such copy and freed by close (host_free_portable).
	 */
	void *peer_ring;
	size_t peer_ring_bytes;
	/* The warm communicators (workers/collective/collective.h), made by the
	 * worker at the device's first collective and released by close. */
	struct coll_cache *coll;
	/*
	 * The scheduler (workers/sched/sched.h) and the lane of the job it runs now:
	 * set by the scheduler before it resumes a job, NULL between jobs. Every
	 * operation that enqueues device work enqueues it on dev->lane, or on
	 * the device's own streams when it is NULL (open, close, code outside jobs).
	 */
	struct sched *_Atomic sched; /* read by other threads to notify it (host engines) */
	void *lane;
};

/* The device's life: how many, open and close, the volatile info, a reset. */
struct backend_device_ops {
	/*
	 * Devices this backend can serve (the host backend: config->host_devices).
	 * Main thread, before workers start.
	 */
	int (*count)(const struct device_config *config, int *count,
		     struct gpuq_error *err);
	/* Takes the device: context, streams, pool, staging ring, peer matrix, info. */
	int (*open)(struct device *dev, struct gpuq_error *err);
	/* Releases everything open took, in order; logs and goes on past errors. */
	void (*close)(struct device *dev);
	/* Refreshes the volatile parts of dev->info (free memory). */
	int (*refresh_info)(struct device *dev, struct gpuq_error *err);
	/*
	 * Between a close and the next open of a device that faulted or is
	 * reset on demand: makes it new (CUDA: cudaDeviceReset, which destroys
	 * the primary context and everything in it). workers/backend/device_reset.c.
	 */
	int (*reset)(struct device *dev, struct gpuq_error *err);
};

/*
 * Memory: device buffers (pooled and shareable), fills and checksums on
 * them, and the pinned or registered host memory copies go through.
 */
struct backend_mem_ops {
	/*
	 * Device memory, from the pool or carved from slabs as open chose
	 * (dev->info.buffer_memory): GPUQ_E_OUT_OF_MEMORY when it cannot be
	 * had. release frees either kind, once the work queued before it on
	 * the lane has run.
	 */
	int (*alloc)(struct device *dev, uint64_t bytes, void **ptr, struct gpuq_error *err);
	int (*release)(struct device *dev, void *ptr, struct gpuq_error *err);
	/*
	 * The same, from the memory named (pool or slabs) whatever open chose:
	 * the allocation benchmark compares both in one run.
	 */
	int (*alloc_from)(struct device *dev, enum buffer_memory from, uint64_t bytes, void **ptr,
			  struct gpuq_error *err);
	/*
	 * Where an allocation lives: 0 with *out (its slab, offset, the slab's
	 * descriptor, which stays the backend's), or -1 for pool memory.
	 */
	int (*place)(struct device *dev, const void *ptr, struct slab_place *out);
	/*
	 * A re-exec (docs/ARCHITECTURE.md, Durable state): takes over slab
	 * `slab` that the previous gpuqd image made, from its descriptor fd
	 * (bytes long), with ranges[0..n) (its buffers) allocated as they
	 * were, counted against the device as allocations are (slab_adopt:
	 * the heap takes fd whatever happens). 0 with *base, where the slab
	 * now lies, or -1 with err. Worker thread, after open.
	 */
	int (*adopt)(struct device *dev, uint32_t slab, int fd, uint64_t bytes, bool exported,
		     const struct slab_range *ranges, size_t n, void **base, struct gpuq_error *err);
	/*
	 * Device memory that client processes may map (a shareable buffer):
	 * a slab of its own, never from the pool, and *fd a descriptor that
	 * opens this allocation and nothing else, the caller's to close. CUDA:
	 * cuMemCreate with a POSIX file-descriptor handle (workers/backend/cuda_vmm.h);
	 * host: a memfd whose mapping is the arena piece. release frees it.
	 */
	int (*alloc_shareable)(struct device *dev, uint64_t bytes, void **ptr, int *fd,
			       struct gpuq_error *err);
	/* Synchronous: the fill/checksum is complete when they return. */
	int (*fill)(struct device *dev, void *ptr, uint64_t bytes,
		    const struct fill_spec *spec, struct gpuq_error *err);
	int (*checksum)(struct device *dev, const void *ptr, uint64_t bytes,
			uint64_t *out, struct gpuq_error *err);
	/*
	 * The registered path and regions: pins the host range [ptr, ptr + n)
	 * (page-aligned) for direct copies; flags are BACKEND_REGISTER_*:
	 * READ_ONLY when the device only reads it (a put from a read-only
	 * mapping), PORTABLE when every device copies from and to it (a
	 * region). host_unregister undoes it.
	 */
	int (*host_register)(struct device *dev, void *ptr, size_t n, unsigned flags,
			     struct gpuq_error *err);
	int (*host_unregister)(struct device *dev, void *ptr, struct gpuq_error *err);
	/* Pinned host memory outside the ring (the benchmark's ceiling). */
	int (*host_alloc_pinned)(struct device *dev, size_t n, void **ptr, struct gpuq_error *err);
	void (*host_free_pinned)(struct device *dev, void *ptr);
	/* Pinned host memory every device may copy from and to (cudaHostAllocPortable). */
	int (*host_alloc_portable)(struct device *dev, size_t n, void **ptr, struct gpuq_error *err);
	void (*host_free_portable)(struct device *dev, void *ptr);
};

/*
 * Copies: the staging ring's slots, synchronous host<->device copies, and
 * device-side copies (same device, peer, the host-staged ring).
 */
struct backend_copy_ops {
	/*
	 * Asynchronous copies between a staging slot and device memory: enqueue
	 * the copy (host->device on one stream, device->host on another) and mark
	 * the slot busy; slot_wait blocks until the slot's last copy is done.
	 * A copy of more than a slot spans the slots after it (the caller holds
	 * them all, and they lie back to back: staging[slot] + slot bytes is
	 * staging[slot + 1]) and marks each of them busy.
	 */
	int (*h2d_async)(struct device *dev, void *dst, unsigned slot, size_t n,
			 struct gpuq_error *err);
	int (*d2h_async)(struct device *dev, unsigned slot, const void *src, size_t n,
			 struct gpuq_error *err);
	int (*slot_wait)(struct device *dev, unsigned slot, struct gpuq_error *err);
	/* Non-blocking slot_wait: *ready is true once the slot's last copy is done. */
	int (*slot_ready)(struct device *dev, unsigned slot, bool *ready, struct gpuq_error *err);
	/*
	 * Synchronous copies between registered (or pinned, or, for the benchmark's
	 * baselines, pageable) host memory and device memory, on the h2d or d2h
	 * stream. *seconds (may be NULL) is the copy's time between events
	 * recorded around it on that stream.
	 */
	int (*h2d)(struct device *dev, void *dst, const void *src, size_t n, double *seconds,
		   struct gpuq_error *err);
	int (*d2h)(struct device *dev, void *dst, const void *src, size_t n, double *seconds,
		   struct gpuq_error *err);
	/*
	 * Device-side copies for copy jobs (workers/copy/copy.c). They enqueue
	 * on the compute stream and return at once; events order them, across
	 * devices too, and the caller waits on its own events before it returns.
	 *
	 * d2d: dst <- src, both on this device, by the copy engine
	 * (cudaMemcpyAsync) or the SM kernel (kernels_copy).
	 * peer: dst on this device <- src on device src_index, by the
	 * driver's peer copy (cudaMemcpyPeerAsync); only where this device has
	 * peer access to src_index and that device's pool is shared with it
	 * (the caller checks: without them CUDA would stage silently).
	 * ring_d2h / ring_h2d: between device memory and portable pinned memory
	 * from host_alloc_portable (the host-staged peer path's ring).
	 */
	int (*d2d)(struct device *dev, void *dst, const void *src, size_t n,
		   enum copy_engine engine, struct gpuq_error *err);
	int (*peer)(struct device *dev, void *dst, int src_index, const void *src, size_t n,
		    struct gpuq_error *err);
	int (*ring_d2h)(struct device *dev, void *host, const void *src, size_t n,
			struct gpuq_error *err);
	int (*ring_h2d)(struct device *dev, void *dst, const void *host, size_t n,
			struct gpuq_error *err);
};

/*
 * Ordering: events on the current lane, and the lanes (one stream per job
 * in flight) the scheduler makes.
 */
struct backend_events_ops {
	/*
	 * Events. record marks the current lane's work so far;
	 * wait makes the compute stream wait for an event, which may
	 * belong to another device (recorded by that device's worker);
	 * sync blocks until one of this device's own events is complete;
	 * elapsed gives the seconds between two timing events.
	 */
	int (*create)(struct device *dev, bool timing, void **event, struct gpuq_error *err);
	void (*destroy)(struct device *dev, void *event);
	int (*record)(struct device *dev, void *event, struct gpuq_error *err);
	int (*wait)(struct device *dev, void *event, struct gpuq_error *err);
	int (*sync)(struct device *dev, void *event, struct gpuq_error *err);
	int (*elapsed)(struct device *dev, void *start, void *end, double *seconds,
		       struct gpuq_error *err);
	/*
	 * Non-blocking: *done once everything the event marks has run. -1 with
	 * err when the device reports an error instead (a fault).
	 */
	int (*query)(struct device *dev, void *event, bool *done, struct gpuq_error *err);
	/*
	 * A lane: the stream of one job in flight (CUDA: a non-blocking stream
	 * with the CUDA stream priority of `priority`, an enum gpuq_priority;
	 * host: an ordered queue that the device's engine threads run). The
	 * scheduler makes them, keeps them between jobs and sets dev->lane.
	 */
	int (*lane_create)(struct device *dev, int priority, void **lane, struct gpuq_error *err);
	void (*lane_destroy)(struct device *dev, void *lane);
};

/*
 * Kernel chains: run one, enqueue a fused one without waiting, and the
 * benchmark's baselines.
 */
struct backend_chain_ops {
	/* Runs spec's chain (workers/chain/chain.h) and fills spec->result; synchronous. */
	int (*run)(struct device *dev, struct chain_spec *spec, struct gpuq_error *err);
	/* Enqueues spec's fused chain on the current lane without waiting (the scheduler's ceiling). */
	int (*enqueue)(struct device *dev, const struct chain_spec *spec, struct gpuq_error *err);
	/*
	 * The chain benchmark's baseline: bytes copied device to device, reps
	 * times, each timed; *seconds is the median of one copy.
	 */
	int (*copy_time)(struct device *dev, void *dst, const void *src, uint64_t bytes,
			 unsigned reps, double *seconds, struct gpuq_error *err);
	/* The reductions' baseline: a kernel that only reads bytes at src, timed likewise. */
	int (*read_time)(struct device *dev, const void *src, uint64_t bytes, unsigned reps,
			 double *seconds, struct gpuq_error *err);
};

/* Collectives (NCCL, or the host backend's threads): communicators and their primitives. */
struct backend_coll_ops {
	/*
	 * workers/collective/collective.h drives them; each runs on the rank's
	 * worker and polls coll_poll while it waits, so none waits past the call's deadline,
	 * the collective's failure or the part's cancel flag. unique_id
	 * makes a fresh communicator id (rank 0 only); comm_init makes this
	 * rank's communicator from it, with every other rank at the same time,
	 * and on failure releases what it made; run runs this rank's part of
	 * spec's primitives (one group) and waits for it; bench times the raw
	 * loop into spec->bench_us; comm_abort stops and frees at once (after a
	 * failure); comm_destroy finalizes, then frees (at close).
	 */
	int (*unique_id)(struct device *dev, struct coll_id *id, struct gpuq_error *err);
	int (*comm_init)(struct device *dev, struct coll_call *call, const struct coll_id *id,
			 void **comm, struct gpuq_error *err);
	int (*run)(struct device *dev, void *comm, struct coll_call *call,
		   struct gpuq_error *err);
	int (*bench)(struct device *dev, void *comm, struct coll_call *call,
		     struct gpuq_error *err);
	void (*comm_abort)(struct device *dev, void *comm);
	void (*comm_destroy)(struct device *dev, void *comm);
};

struct backend_ops {
	const char *name; /* "cuda" or "host" */
	/*
	 * Whether the device's completions wake the scheduler by themselves
	 * (sched_notify: the host backend's engine threads do); if not (CUDA),
	 * a job waiting for the device makes the worker poll.
	 */
	bool completions_notify;

	struct backend_device_ops device;
	struct backend_mem_ops mem;
	struct backend_copy_ops copy;
	struct backend_events_ops events;
	struct backend_chain_ops chain;
	struct backend_coll_ops coll;
};

extern const struct backend_ops backend_cuda;
extern const struct backend_ops backend_host;

/* "cuda" or "host" -> its table, or NULL. */
const struct backend_ops *backend_by_name(const char *name);

/*
 * How many staging slots a copy of n bytes from slot's start covers
 * (backend_copy_ops: a copy may span the slots after it where the ring
 * holds them back to back); 0 when it runs past the ring or the slots are
 * not back to back: a bug in the caller. For the backends' h2d_async and
 * d2h_async.
 */
unsigned backend_slot_span(const struct device *dev, unsigned slot, size_t n);

#endif
