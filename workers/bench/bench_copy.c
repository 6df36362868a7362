/*
 * bench_copy on the worker: for each size, one device buffer and random host
 * data, then every host<->device method measured in the same run:
 *
 *   H2D and D2H, each with
 *     cudaMemcpy pageable (baseline)   plain malloc'd memory
 *     cudaMemcpy pinned (ceiling)      cudaHostAlloc'd memory
 *     gpuq memfd                       transfer_put/get, path auto, a memfd
 *     gpuq file                        the same, a regular file in the page
 *                                      cache ($TMPDIR or /tmp, unlinked at once)
 *     gpuq memfd registered            the same memfd, path registered
 *     gpuq region                      the same memfd pinned once as a region
 *                                      (workers/transfer/region_pin.c): DMAs of 8 slots;
 *                                      the pinning's cost is timed apart
 *     gpuq scratch                     no file: the copy threads make up the
 *                                      bytes (put) or drop them (get), which
 *                                      shows the pipeline without file I/O
 *
 *   and, D2H only, the host half of a get and its other destinations:
 *     host memfd, host file ...        the copy threads write the pinned
 *                                      source into the destination with no
 *                                      device work (bench_host.c): the
 *                                      ceiling of a get into that kind of
 *                                      destination, mapped per run, through
 *                                      a mapping kept across runs (as
 *                                      gpuqd keeps a memfd's, and a file's
 *                                      for a second, map_cache.h), or by
 *                                      pwrite
 *     ... fresh                        a destination with no pages: a new
 *                                      memfd, or the file truncated to 0
 *                                      before each run (what `gpuq get BUF
 *                                      FILE` writes into)
 *     gpuq file write-only             the file through a write-only
 *                                      descriptor: the pwrite path
 *     host pipe write, ... polled      the pinned source through a pipe a
 *                                      thread drains, by blocking writes or
 *                                      as the streamed path writes
 *                                      (bench_pipe.h): the ceiling of a get
 *                                      into a pipe
 *     gpuq /dev/null, gpuq pipe        the streamed path into a sink and into
 *                                      a pipe drained by a thread
 *
 * Each get row into a memfd, a file or a pipe also carries the best host
 * row of its kind of destination (existing pages or fresh; memfd, file or
 * pipe; for a write-only descriptor, which can only be pwritten, the pwrite
 * rows) as its host ceiling.
 *
 * The host backend has no CUDA: its ceiling is a memcpy into the arena and
 * its rows say "(host)". Each measurement is one warm-up and then the median
 * of `repeats` timed runs; CUDA baselines are timed with events around the
 * copy, gpuq's with the clock around the whole transfer (all that a put or
 * get does on the worker). Destinations are poisoned before each method and
 * the checksum of what arrived is compared with the source's afterwards.
 *
 * Worker thread only; the copy threads fill, copy and hash the host buffers.
 */
#include "workers/bench/bench_copy.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "workers/bench/bench_host.h"
#include "workers/bench/bench_pipe.h"
#include "workers/clock.h"
#include "workers/transfer/copy_hash.h"
#include "workers/transfer/region_pin.h"
#include "workers/transfer/transfer.h"
#include "workers/host_memory.h"

#define MAX_REPEATS 100
#define GIB (1024.0 * 1024.0 * 1024.0)

enum method_kind {
	M_PAGEABLE, M_PINNED, M_MEMFD, M_FILE, M_FILE_WRONLY, M_REGISTERED, M_REGION, M_SCRATCH,
	M_DEVNULL, M_PIPE, M_HOST_MAP, M_HOST_PWRITE, M_HOST_KEPT, M_HOST_PIPE_WRITE, M_HOST_PIPE_POLLED,
};

/* A get's kind of destination, which picks its host ceiling. */
enum dest { D_NONE, D_MEMFD, D_MEMFD_FRESH, D_FILE, D_FILE_FRESH, D_PIPE, D_COUNT };

struct method {
	enum method_kind kind;
	enum dest dest;
};

struct bench {
	struct device *dev;
	struct work *work;
	struct bench_copy_spec *spec;
	struct gpuq_error *err;
	struct copy_pool *pool;
	bool cuda;
	uint64_t size, seed, expected;
	void *dbuf;
	unsigned char *src;    /* pageable random bytes (and the pageable D2H destination) */
	unsigned char *pinned; /* CUDA: the ceiling's host memory */
	int memfd, file;
	int file_wronly;       /* the file again, write-only: a get takes the pwrite path */
	int fresh;             /* the newest fresh memfd (D_MEMFD_FRESH), or -1 */
	unsigned char *memfd_map, *file_map;
	const char *skip_file; /* why the file rows are skipped, or NULL */
	void *region_map;      /* the memfd pinned as a region (NULL: the region rows are skipped) */
	struct bench_copy_pin *pin;
	struct transfer_timeline timeline; /* the last transfer's */
	uint64_t slow_noted; /* bit i (+32 for H2D): methods[i]'s `why` was noted */
};

static void note(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(struct bench *b, const char *fmt, ...)
{
	struct bench_copy_spec *s = b->spec;
	if (s->nnotes == BENCH_COPY_MAX_NOTES)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->notes[s->nnotes++], sizeof s->notes[0], fmt, ap);
	va_end(ap);
}

static const char *size_name(uint64_t bytes, char *buf, size_t n)
{
	if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0)
		snprintf(buf, n, "%llu GiB", (unsigned long long)(bytes >> 30));
	else if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0)
		snprintf(buf, n, "%llu MiB", (unsigned long long)(bytes >> 20));
	else
		snprintf(buf, n, "%llu bytes", (unsigned long long)bytes);
	return buf;
}

/* ---- host memory and files ---- */

struct copy_part {
	struct copy_task task; /* first */
	unsigned char *dst;
	const unsigned char *src;
	size_t n;
};

static void part_copy(struct copy_task *task)
{
	struct copy_part *p = (struct copy_part *)task;
	memcpy(p->dst, p->src, p->n);
}

/* memcpy of n bytes split across the copy threads (filling pinned memory and mappings). */
static void parallel_copy(struct copy_pool *pool, void *dst, const void *src, size_t n)
{
	enum { PARTS = 32 };
	struct copy_part parts[PARTS];
	struct copy_group group;
	size_t part = n / PARTS + 1;
	unsigned count = 0;
	copy_group_init(&group);
	for (size_t at = 0; at < n; at += part, count++) {
		parts[count] = (struct copy_part){ .dst = (unsigned char *)dst + at,
						   .src = (const unsigned char *)src + at,
						   .n = n - at < part ? n - at : part };
		parts[count].task.fn = part_copy;
		parts[count].task.group = &group;
		copy_pool_submit(pool, &parts[count].task);
	}
	for (unsigned i = 0; i < count; i++)
		copy_task_wait(&parts[i].task);
	copy_group_destroy(&group);
}

/* A file of `size` bytes holding src, mapped shared; -1 with err (or a note and *fd -1). */
static int make_file(struct bench *b, int fd, unsigned char **map, const char *what)
{
	if (fd < 0 || ftruncate(fd, (off_t)b->size) < 0)
		return gpuq_fail(b->err, GPUQ_E_IO, "bench: cannot make the %s: %s", what,
				 strerror(errno));
	*map = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (*map == MAP_FAILED) {
		*map = NULL;
		return gpuq_fail(b->err, GPUQ_E_IO, "bench: cannot map the %s: %s", what,
				 strerror(errno));
	}
	parallel_copy(b->pool, *map, b->src, b->size);
	return 0;
}

static int open_memfd(struct bench *b)
{
	b->memfd = memfd_create("gpuq-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (make_file(b, b->memfd, &b->memfd_map, "memfd") < 0)
		return -1;
	/* path registered needs F_SEAL_SHRINK; F_SEAL_SEAL lets gpuqd keep it mapped (map_cache.h) */
	if (fcntl(b->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) < 0)
		return gpuq_fail(b->err, GPUQ_E_IO, "bench: cannot seal the memfd: %s",
				 strerror(errno));
	return 0;
}

/* The regular file, unlinked at once; skipped (with a note) when $TMPDIR has no room. */
static int open_file(struct bench *b)
{
	const char *dir = getenv("TMPDIR");
	char path[256];
	struct statvfs vfs;
	if (!dir || !*dir)
		dir = "/tmp";
	if (statvfs(dir, &vfs) == 0 &&
	    (uint64_t)vfs.f_bavail * vfs.f_frsize < b->size + (1ull << 30)) {
		b->skip_file = "not enough room in $TMPDIR (or /tmp)";
		return 0;
	}
	snprintf(path, sizeof path, "%s/gpuq-bench-XXXXXX", dir);
	b->file = mkostemp(path, O_CLOEXEC);
	if (b->file >= 0)
		unlink(path);
	if (make_file(b, b->file, &b->file_map, "regular file") < 0)
		return -1;
	(void)fdatasync(b->file); /* clean pages: writeback must not run during the timing */
	snprintf(path, sizeof path, "/proc/self/fd/%d", b->file);
	b->file_wronly = open(path, O_WRONLY | O_CLOEXEC);
	if (b->file_wronly < 0)
		return gpuq_fail(b->err, GPUQ_E_IO, "bench: cannot reopen the file write-only: %s",
				 strerror(errno));
	return 0;
}

/* The memfd pinned as a region, timed; a failure is a note and no region rows. */
static void open_region(struct bench *b)
{
	struct gpuq_error err;
	char size[32];
	int node;
	b->pin = b->spec->npins < BENCH_COPY_MAX_SIZES ? &b->spec->pins[b->spec->npins++] : NULL;
	double start = monotonic_seconds();
	if (!b->pin || region_pin_map(b->dev, b->memfd, b->size, &b->region_map, &node, &err) < 0) {
		b->region_map = NULL;
		if (b->pin)
			note(b, "%s region rows skipped: %s", size_name(b->size, size, sizeof size),
			     err.message);
		return;
	}
	b->pin->bytes = b->size;
	b->pin->pin_s = monotonic_seconds() - start;
}

/*
 * Pinning once and one region copy against one copy of the staged memfd
 * path: the size from which the first is quicker (bytes; 0: never).
 */
static void region_break_even(struct bench *b, bool h2d, double staged_gbps, double region_gbps)
{
	if (!b->pin || !b->region_map || staged_gbps <= 0 || region_gbps <= staged_gbps)
		return;
	double per_byte_saved = 1 / (staged_gbps * 1e9) - 1 / (region_gbps * 1e9);
	b->pin->break_even[h2d ? 0 : 1] = b->pin->pin_s / per_byte_saved;
}

static void close_host(struct bench *b)
{
	struct gpuq_error ignored;
	if (b->region_map)
		region_pin_unmap(b->dev, b->region_map, b->size, &ignored);
	b->region_map = NULL;
	if (b->memfd_map)
		munmap(b->memfd_map, b->size);
	if (b->file_map)
		munmap(b->file_map, b->size);
	if (b->memfd >= 0)
		close(b->memfd);
	if (b->file >= 0)
		close(b->file);
	if (b->file_wronly >= 0)
		close(b->file_wronly);
	if (b->fresh >= 0)
		close(b->fresh);
	if (b->src)
		munmap(b->src, b->size);
	if (b->pinned)
		b->dev->ops->mem.host_free_pinned(b->dev, b->pinned);
}

/* Random source bytes, and the same in pinned memory (CUDA), a memfd and a file. */
static int open_host(struct bench *b)
{
	void *p = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return gpuq_fail(b->err, GPUQ_E_OUT_OF_MEMORY, "bench: no host memory for %llu bytes",
				 (unsigned long long)b->size);
	b->src = p;
	copy_fill_random_parallel(b->pool, b->src, b->size, b->seed);
	b->expected = copy_hash_parallel(b->pool, b->src, b->size);
	if (b->cuda) {
		void *pin;
		if (b->dev->ops->mem.host_alloc_pinned(b->dev, b->size, &pin, b->err) < 0)
			return -1;
		b->pinned = pin;
		parallel_copy(b->pool, b->pinned, b->src, b->size);
	}
	if (open_memfd(b) < 0)
		return -1;
	open_region(b);
	return open_file(b);
}

/* ---- one measurement ---- */

static int cancelled(struct bench *b)
{
	if (!atomic_load(&b->work->cancel))
		return 0;
	return gpuq_fail(b->err, GPUQ_E_CANCELLED, "bench_copy cancelled");
}

/*
 * put or get through fd (-1: scratch) with the path given; *seconds is the
 * whole transfer's time.
 */
static int run_transfer(struct bench *b, bool h2d, int fd, enum transfer_path path,
			bool verify, double *seconds, const char **taken, struct gpuq_error *err)
{
	struct work w;
	memset(&w, 0, sizeof w);
	w.kind = h2d ? WORK_PUT : WORK_GET;
	w.device = b->dev->index;
	w.dptr = b->dbuf;
	w.length = b->size;
	w.transfer.length_exact = true;
	w.fd = fd;
	w.transfer.path = path;
	w.transfer.verify = verify;
	w.transfer.host = fd < 0 && path == TRANSFER_PATH_REGISTERED ? b->region_map : NULL;
	w.transfer.scratch = fd < 0 && !w.transfer.host;
	w.transfer.seed = b->seed; /* scratch: the source's own bytes */
	w.transfer.timeline = &b->timeline;
	if (fd >= 0 && lseek(fd, 0, SEEK_SET) < 0 && errno != ESPIPE)
		return gpuq_fail(err, GPUQ_E_IO, "bench: lseek: %s", strerror(errno));
	double start = monotonic_seconds();
	int rc = h2d ? transfer_put(b->dev, &w) : transfer_get(b->dev, &w);
	*seconds = monotonic_seconds() - start;
	*taken = w.result.path;
	if (rc < 0)
		*err = w.error;
	return rc;
}

/* A get into a pipe or /dev/null: the streamed path. */
static int run_stream_sink(struct bench *b, bool pipe, bool verify, double *seconds,
			   const char **taken, struct gpuq_error *err)
{
	struct pipe_drain drain;
	int fd = pipe ? -1 : open("/dev/null", O_WRONLY | O_CLOEXEC);
	if (!pipe && fd < 0)
		return gpuq_fail(err, GPUQ_E_IO, "bench: /dev/null: %s", strerror(errno));
	if (pipe && pipe_drain_start(&drain, false, err) < 0)
		return -1;
	int rc = run_transfer(b, false, pipe ? drain.fds[1] : fd, TRANSFER_PATH_AUTO, verify,
			      seconds, taken, err);
	if (pipe)
		pipe_drain_stop(&drain);
	else
		close(fd);
	return rc;
}

/*
 * Before a run into a fresh destination: a new memfd (the last one's pages
 * go with it), or the file emptied. Not timed: the client does it.
 */
static int make_fresh(struct bench *b, enum dest dest, struct gpuq_error *err)
{
	if (dest == D_MEMFD_FRESH) {
		if (b->fresh >= 0)
			close(b->fresh);
		b->fresh = memfd_create("gpuq-bench-fresh", MFD_CLOEXEC);
		if (b->fresh < 0)
			return gpuq_fail(err, GPUQ_E_IO, "bench: memfd_create: %s", strerror(errno));
	}
	if (dest == D_FILE_FRESH && ftruncate(b->file, 0) < 0)
		return gpuq_fail(err, GPUQ_E_IO, "bench: emptying the file: %s", strerror(errno));
	return 0;
}

/* The descriptor of a method's destination (or source). */
static int dest_fd(const struct bench *b, struct method m)
{
	if (m.dest == D_MEMFD_FRESH)
		return b->fresh;
	if (m.kind == M_FILE_WRONLY)
		return b->file_wronly;
	return m.dest == D_FILE || m.dest == D_FILE_FRESH || m.kind == M_FILE ? b->file : b->memfd;
}

static enum bench_host_means host_means(enum method_kind kind)
{
	return kind == M_HOST_PWRITE ? BENCH_HOST_PWRITE
	       : kind == M_HOST_KEPT ? BENCH_HOST_KEPT : BENCH_HOST_MAP;
}

static unsigned char *host_side(struct bench *b, struct method m);

/* The source through a drained pipe with no device work (bench_pipe.h), in slot-sized writes. */
static int host_pipe(struct bench *b, struct method m, double *seconds, uint64_t *checksum,
		     struct gpuq_error *err)
{
	enum bench_pipe_means means = m.kind == M_HOST_PIPE_POLLED ? BENCH_PIPE_POLLED
								   : BENCH_PIPE_WRITE;
	return bench_pipe_write(b->cuda ? b->pinned : b->src, b->size,
				b->dev->config.staging_slot_bytes, means, seconds, checksum, err);
}

static int run_once(struct bench *b, bool h2d, struct method m, double *seconds,
		    const char **taken, struct gpuq_error *err)
{
	const struct backend_ops *ops = b->dev->ops;
	void *host = m.kind == M_PINNED ? (void *)b->pinned : (void *)b->src;
	if (make_fresh(b, m.dest, err) < 0)
		return -1;
	switch (m.kind) {
	case M_PAGEABLE:
	case M_PINNED:
		return h2d ? ops->copy.h2d(b->dev, b->dbuf, host, b->size, seconds, err)
			   : ops->copy.d2h(b->dev, host, b->dbuf, b->size, seconds, err);
	case M_MEMFD:
	case M_FILE:
	case M_FILE_WRONLY:
		return run_transfer(b, h2d, dest_fd(b, m), TRANSFER_PATH_AUTO, false, seconds, taken,
				    err);
	case M_REGISTERED:
		return run_transfer(b, h2d, b->memfd, TRANSFER_PATH_REGISTERED, false, seconds, taken,
				    err);
	case M_REGION: /* no descriptor, the pinned mapping: path region */
		return run_transfer(b, h2d, -1, TRANSFER_PATH_REGISTERED, false, seconds, taken, err);
	case M_SCRATCH:
		return run_transfer(b, h2d, -1, TRANSFER_PATH_AUTO, false, seconds, taken, err);
	case M_DEVNULL:
	case M_PIPE:
		return run_stream_sink(b, m.kind == M_PIPE, false, seconds, taken, err);
	case M_HOST_MAP:
	case M_HOST_PWRITE:
	case M_HOST_KEPT: /* from the pinned source, as a get writes from its slots */
		return bench_host_write(b->pool, dest_fd(b, m), b->cuda ? b->pinned : b->src,
					b->size, host_means(m.kind),
					m.kind == M_HOST_KEPT ? host_side(b, m) : NULL, seconds, err);
	case M_HOST_PIPE_WRITE:
	case M_HOST_PIPE_POLLED:
		return host_pipe(b, m, seconds, NULL, err);
	}
	return gpuq_fail(err, GPUQ_E_INTERNAL, "bench: method %d unknown", (int)m.kind);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The median of the n values from t[1] (t[0]: the warm-up's); sorts them. */
static double median_of(double *t, unsigned n)
{
	qsort(t + 1, n, sizeof t[0], cmp_double);
	return n % 2 ? t[1 + n / 2] : (t[n / 2] + t[n / 2 + 1]) / 2;
}

/*
 * The file at its full size again, so that its mapping can be touched
 * (a fresh run empties it, a failed get may leave it short).
 */
static void file_full(struct bench *b)
{
	struct stat st;
	if (b->file >= 0 && fstat(b->file, &st) == 0 && st.st_size < (off_t)b->size)
		(void)ftruncate(b->file, (off_t)b->size);
}

/* The destination of a method, for poisoning and checking (NULL: the device buffer, or none kept). */
static unsigned char *host_side(struct bench *b, struct method m)
{
	switch (m.dest) {
	case D_MEMFD: return b->memfd_map;
	case D_FILE:
	case D_FILE_FRESH: file_full(b); return b->file_map;
	case D_MEMFD_FRESH:
	case D_PIPE: return NULL;
	case D_NONE:
	case D_COUNT: break;
	}
	switch (m.kind) {
	case M_PAGEABLE: return b->src;
	case M_PINNED: return b->pinned;
	case M_MEMFD:
	case M_REGISTERED:
	case M_REGION: return b->memfd_map; /* the region's pages: the same memfd */
	case M_FILE:
	case M_FILE_WRONLY: file_full(b); return b->file_map;
	default: return NULL;
	}
}

/* Overwrites the method's destination with other bytes, so that a copy that moved nothing shows. */
static int poison(struct bench *b, bool h2d, struct method m)
{
	struct fill_spec zero = { .pattern = FILL_ZERO, .dtype = GPUQ_DTYPE_BYTES };
	if (h2d)
		return b->dev->ops->mem.fill(b->dev, b->dbuf, b->size, &zero, b->err);
	if (host_side(b, m))
		copy_fill_random_parallel(b->pool, host_side(b, m), b->size, ~b->seed);
	return 0;
}

/* The hash of the newest fresh memfd's first size bytes (0 if it cannot be mapped: no match). */
static uint64_t fresh_hash(struct bench *b)
{
	void *m = b->fresh < 0 ? MAP_FAILED : mmap(NULL, b->size, PROT_READ, MAP_SHARED, b->fresh, 0);
	if (m == MAP_FAILED)
		return 0;
	uint64_t sum = copy_hash_parallel(b->pool, m, b->size);
	munmap(m, b->size);
	return sum;
}

/*
 * Whether the destination holds the source. A sink keeps nothing
 * (scratch, /dev/null, a pipe): one more get, with --verify, checks the
 * bytes that reached host memory.
 */
static int check(struct bench *b, bool h2d, struct method m, bool *ok)
{
	uint64_t sum;
	struct gpuq_error err;
	double s;
	const char *taken;
	if (!h2d && m.kind == M_SCRATCH) {
		*ok = run_transfer(b, false, -1, TRANSFER_PATH_AUTO, true, &s, &taken, &err) == 0;
		return 0;
	}
	if (!h2d && (m.kind == M_DEVNULL || m.kind == M_PIPE)) {
		*ok = run_stream_sink(b, m.kind == M_PIPE, true, &s, &taken, &err) == 0;
		return 0;
	}
	if (m.kind == M_HOST_PIPE_WRITE || m.kind == M_HOST_PIPE_POLLED) {
		*ok = host_pipe(b, m, &s, &sum, &err) == 0 && sum == b->expected;
		return 0;
	}
	if (h2d && b->dev->ops->mem.checksum(b->dev, b->dbuf, b->size, &sum, b->err) < 0)
		return -1;
	if (!h2d)
		sum = m.dest == D_MEMFD_FRESH ? fresh_hash(b)
					      : copy_hash_parallel(b->pool, host_side(b, m), b->size);
	*ok = sum == b->expected;
	return 0;
}

/*
 * A warm-up and `repeats` timed runs; the median into row. A gpuq transfer
 * that fails is noted and its row left at 0 GB/s; a CUDA baseline that
 * fails, or a cancel, ends the benchmark.
 */
static int measure(struct bench *b, bool h2d, struct method m, struct bench_row *row)
{
	double t[MAX_REPEATS + 1], first[MAX_REPEATS + 1], after[MAX_REPEATS + 1];
	unsigned n = b->spec->repeats;
	struct gpuq_error err;
	char size[32];
	if (poison(b, h2d, m) < 0)
		return -1;
	for (unsigned i = 0; i <= n; i++) {
		if (cancelled(b) < 0)
			return -1;
		b->timeline = (struct transfer_timeline){ 0, 0 };
		if (run_once(b, h2d, m, &t[i], &row->path, &err) < 0) {
			if (m.kind == M_PAGEABLE || m.kind == M_PINNED || err.code == GPUQ_E_CANCELLED ||
			    b->dev->faulted) {
				*b->err = err;
				return -1;
			}
			note(b, "%s %s %s: %s", row->group, size_name(b->size, size, sizeof size),
			     row->method, err.message);
			return 0;
		}
		first[i] = b->timeline.first_dma_s;
		after[i] = b->timeline.first_dma_s > 0 ? t[i] - b->timeline.last_dma_s : 0;
	}
	double median = median_of(t, n); /* t[0] was the warm-up */
	row->gbps = median > 0 ? (double)b->size / median / 1e9 : 0;
	row->first_dma_ms = median_of(first, n) * 1e3;
	row->after_last_dma_ms = median_of(after, n) * 1e3;
	return check(b, h2d, m, &row->verified);
}

/* ---- the table ---- */

static struct bench_row *add_row(struct bench *b, const char *group, const char *method,
				      const char *role)
{
	struct bench_copy_spec *s = b->spec;
	if (s->nrows == BENCH_COPY_MAX_ROWS)
		return NULL;
	struct bench_row *r = &s->rows[s->nrows++];
	memset(r, 0, sizeof *r);
	snprintf(r->group, sizeof r->group, "%s", group);
	snprintf(r->method, sizeof r->method, "%s%s", method, b->cuda ? "" : " (host)");
	r->role = role;
	r->bytes = b->size;
	return r;
}

/*
 * Every method of a direction, in the order measured. The host rows come
 * before the gets they are the ceilings of; D2H-only methods have no H2D
 * name. A method that may fall below pageable cudaMemcpy says why it is
 * measured all the same (`why`): a note, once, when it does.
 */
static const struct method_row {
	struct method m;
	const char *cuda_name, *host_name, *role;
	bool d2h_only;
	const char *why;
} methods[] = {
	{ { M_PAGEABLE, D_NONE }, "cudaMemcpy pageable", NULL, "baseline", false, NULL },
	{ { M_PINNED, D_NONE }, "cudaMemcpy pinned", NULL, "ceiling", false, NULL },
	{ { M_PAGEABLE, D_NONE }, NULL, "memcpy", "ceiling", false, NULL },
	{ { M_HOST_MAP, D_MEMFD }, "host memfd mapped", "host memfd mapped", "host", true, NULL },
	{ { M_HOST_KEPT, D_MEMFD }, "host memfd kept mapping", "host memfd kept mapping", "host", true, NULL },
	{ { M_HOST_MAP, D_MEMFD_FRESH }, "host memfd fresh mapped", "host memfd fresh mapped", "host", true,
	  "each fresh 4 KiB page is allocated, zeroed and mapped first: the ceiling of a get into a new memfd" },
	{ { M_HOST_MAP, D_FILE }, "host file mapped", "host file mapped", "host", true,
	  "a new mapping of a disk file: a page_mkwrite per page, and at munmap a dirty-page call per page under the file's lock" },
	{ { M_HOST_KEPT, D_FILE }, "host file kept mapping", "host file kept mapping", "host", true, NULL },
	{ { M_HOST_PWRITE, D_FILE }, "host file pwrite", "host file pwrite", "host", true,
	  "one pwrite at a time per file (its inode lock): the ceiling of a write-only destination" },
	{ { M_HOST_MAP, D_FILE_FRESH }, "host file fresh mapped", "host file fresh mapped", "host", true,
	  "fresh pages and blocks are made first: the ceiling of 'gpuq get BUF FILE'" },
	{ { M_HOST_PWRITE, D_FILE_FRESH }, "host file fresh pwrite", "host file fresh pwrite", "host", true,
	  "one pwrite at a time per file, into fresh pages: the ceiling of a write-only destination" },
	{ { M_HOST_PIPE_WRITE, D_PIPE }, "host pipe write", "host pipe write", "host", true,
	  "one writer and one reader through a 1 MiB pipe: the ceiling of a get into a pipe" },
	{ { M_HOST_PIPE_POLLED, D_PIPE }, "host pipe polled", "host pipe polled", "host", true,
	  "one writer and one reader through a 1 MiB pipe: the ceiling of a get into a pipe" },
	{ { M_MEMFD, D_MEMFD }, "gpuq memfd", "gpuq memfd", "gpuq", false, NULL },
	{ { M_MEMFD, D_MEMFD_FRESH }, "gpuq memfd fresh", "gpuq memfd fresh", "gpuq", true,
	  "a new memfd's pages are made as it is written: read it against 'host memfd fresh mapped'" },
	{ { M_FILE, D_FILE }, "gpuq file", "gpuq file", "gpuq", false,
	  "the page cache's write path; read it against 'host file mapped' (docs/ARCHITECTURE.md)" },
	{ { M_FILE, D_FILE_FRESH }, "gpuq file fresh", "gpuq file fresh", "gpuq", true,
	  "an emptied file's pages and blocks are made as it is written: read it against its host rows" },
	{ { M_FILE_WRONLY, D_FILE }, "gpuq file write-only", "gpuq file write-only", "gpuq", true,
	  "a descriptor open for writing only can only be pwritten, one writer at a time" },
	{ { M_FILE_WRONLY, D_FILE_FRESH }, "gpuq file fresh write-only", "gpuq file fresh write-only", "gpuq", true,
	  "pwritten one writer at a time into fresh pages: read it against 'host file fresh pwrite'" },
	{ { M_REGISTERED, D_NONE }, "gpuq memfd registered", "gpuq memfd registered", "gpuq", false,
	  "path registered pins every page unless the memfd's pinning was kept (map_cache.h)" },
	{ { M_REGION, D_NONE }, "gpuq region", "gpuq region", "gpuq", false, NULL },
	{ { M_SCRATCH, D_NONE }, "gpuq scratch", "gpuq scratch", "gpuq", false, NULL },
	{ { M_DEVNULL, D_NONE }, "gpuq /dev/null", "gpuq /dev/null", "gpuq", true, NULL },
	{ { M_PIPE, D_PIPE }, "gpuq pipe", "gpuq pipe", "gpuq", true,
	  "a pipe is written in order by one thread, 1 MiB of pipe buffer at a time: read it against 'host pipe'" },
};

_Static_assert(sizeof methods / sizeof methods[0] <= 32, "slow_noted has 32 bits per direction");

/* Whether a method reads or writes the regular file. */
static bool method_on_file(const struct method_row *mr)
{
	return mr->m.kind == M_FILE || mr->m.kind == M_FILE_WRONLY || mr->m.dest == D_FILE ||
	       mr->m.dest == D_FILE_FRESH;
}

static bool method_skipped(const struct bench *b, const struct method_row *mr, bool h2d)
{
	const char *name = b->cuda ? mr->cuda_name : mr->host_name;
	return !name || (h2d && mr->d2h_only) || (method_on_file(mr) && b->skip_file) ||
	       (mr->m.kind == M_REGION && !b->region_map);
}

/*
 * After a row that wrote the file, its dirty pages are written back, not
 * timed: left dirty, they are written back by the kernel's flusher at a
 * time of its choosing (past vm.dirty_background_ratio, or after
 * dirty_expire_centisecs), during whichever rows follow, memfd rows
 * included, and a page under writeback faults again when next written.
 * Each row then starts from the file's clean pages, as the first did.
 */
static void settle_file(struct bench *b, const struct method_row *mr, bool h2d)
{
	if (!h2d && method_on_file(mr) && b->file >= 0)
		(void)fdatasync(b->file);
}

/* A row below the pageable baseline says why its method is measured, once per method and direction. */
static void note_slow(struct bench *b, bool h2d, size_t method, const struct bench_row *row,
		      double baseline)
{
	uint64_t bit = 1ull << (method + (h2d ? 32 : 0));
	char size[32];
	if (!methods[method].why || row->gbps >= baseline || (b->slow_noted & bit))
		return;
	b->slow_noted |= bit;
	note(b, "%s %s %s is below pageable cudaMemcpy: %s", row->group,
	     size_name(row->bytes, size, sizeof size), row->method, methods[method].why);
}

/*
 * The host rows a get is read against (host_ceiling): those of its kind of
 * destination that write it the way the get can. A write-only descriptor
 * cannot be mapped, so the pwrite rows are its own kind.
 */
#define CEILING_KINDS (2 * D_COUNT)

static unsigned ceiling_kind(struct method m)
{
	bool pwrite_only = m.kind == M_HOST_PWRITE || m.kind == M_FILE_WRONLY;
	return (unsigned)m.dest + (pwrite_only ? D_COUNT : 0);
}

/* Every method of one direction; the ratios once the ceilings are known. */
static int bench_direction(struct bench *b, bool h2d)
{
	const char *group = h2d ? "H2D" : "D2H";
	unsigned first = b->spec->nrows;
	double ceiling = 0, staged = 0, region = 0, baseline = 0, host[CEILING_KINDS] = { 0 };
	unsigned of_row[BENCH_COPY_MAX_ROWS];
	for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
		const struct method_row *mr = &methods[i];
		if (method_skipped(b, mr, h2d))
			continue;
		struct bench_row *row = add_row(b, group, b->cuda ? mr->cuda_name : mr->host_name,
						mr->role);
		if (!row)
			return gpuq_fail(b->err, GPUQ_E_INTERNAL, "bench: more than %d rows",
					 BENCH_COPY_MAX_ROWS);
		if (measure(b, h2d, mr->m, row) < 0)
			return -1;
		settle_file(b, mr, h2d);
		of_row[row - b->spec->rows] = ceiling_kind(mr->m); /* D_NONE: no host row */
		if (strcmp(mr->role, "ceiling") == 0)
			ceiling = row->gbps;
		if (strcmp(mr->role, "baseline") == 0)
			baseline = row->gbps;
		note_slow(b, h2d, i, row, baseline);
		unsigned kind = ceiling_kind(mr->m);
		if (strcmp(mr->role, "host") == 0 && row->verified && row->gbps > host[kind])
			host[kind] = row->gbps;
		staged = mr->m.kind == M_MEMFD && mr->m.dest == D_MEMFD ? row->gbps : staged;
		region = mr->m.kind == M_REGION ? row->gbps : region;
	}
	for (unsigned i = first; i < b->spec->nrows; i++) {
		struct bench_row *r = &b->spec->rows[i];
		r->ceiling = ceiling;
		r->host_ceiling = strcmp(r->role, "gpuq") == 0 && !h2d ? host[of_row[i]] : 0;
	}
	region_break_even(b, h2d, staged, region);
	return 0;
}

/* The device holds the source again (after H2D methods that may have failed). */
static int restore_device(struct bench *b)
{
	void *host = b->cuda ? (void *)b->pinned : (void *)b->src;
	bool ok;
	if (b->dev->ops->copy.h2d(b->dev, b->dbuf, host, b->size, NULL, b->err) < 0 ||
	    check(b, true, (struct method){ M_PINNED, D_NONE }, &ok) < 0)
		return -1;
	if (!ok)
		return gpuq_fail(b->err, GPUQ_E_DEVICE_ERROR,
				 "bench: the device buffer does not hold the source after a plain copy");
	return 0;
}

/* Whether this size can run here; a note says why not. */
static bool size_fits(struct bench *b)
{
	char size[32], avail[32];
	uint64_t need = b->size * (b->cuda ? 5 : 4) + (1ull << 30); /* with a fresh memfd */
	uint64_t have = host_memory_available();
	if (have && have < need) {
		note(b, "%s skipped: it needs about %.1f GiB of host memory and %s is available",
		     size_name(b->size, size, sizeof size), (double)need / GIB,
		     size_name(have - have % (1ull << 20), avail, sizeof avail));
		return false;
	}
	struct gpuq_error err;
	if (b->dev->ops->mem.alloc(b->dev, b->size, &b->dbuf, &err) < 0) {
		b->dbuf = NULL;
		note(b, "%s skipped: %s", size_name(b->size, size, sizeof size), err.message);
		return false;
	}
	return true;
}

static int bench_size(struct bench *b, uint64_t size, unsigned index)
{
	char name[32];
	b->size = size;
	b->seed = 0x6770757162656e63ull + index; /* fresh data for each size */
	b->memfd = b->file = b->file_wronly = b->fresh = -1;
	if (!size_fits(b))
		return 0;
	int rc = open_host(b);
	if (rc == 0 && b->skip_file)
		note(b, "%s file rows skipped: %s", size_name(size, name, sizeof name), b->skip_file);
	if (rc == 0)
		rc = bench_direction(b, true);
	if (rc == 0)
		rc = restore_device(b);
	if (rc == 0)
		rc = bench_direction(b, false);
	close_host(b);
	struct gpuq_error ignored;
	if (b->dbuf && !b->dev->faulted)
		b->dev->ops->mem.release(b->dev, b->dbuf, &ignored);
	b->dbuf = NULL;
	return rc;
}

/* What the host rows depend on: shmem's huge page policy and the file's filesystem. */
static void note_host(struct bench *b)
{
	static const struct { long type; const char *name; } fs[] = {
		{ 0x01021994, "tmpfs" }, { 0xEF53, "ext4" }, { 0x58465342, "xfs" },
		{ 0x9123683E, "btrfs" }, { 0x794c7630, "overlayfs" }, { 0x6969, "nfs" },
	};
	char thp[96] = "unknown", type[24];
	const char *dir = getenv("TMPDIR");
	struct statfs sfs;
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
	if (f && fgets(thp, sizeof thp, f))
		thp[strcspn(thp, "\n")] = 0;
	if (f)
		fclose(f);
	dir = dir && *dir ? dir : "/tmp";
	snprintf(type, sizeof type, "unknown");
	if (statfs(dir, &sfs) == 0) {
		snprintf(type, sizeof type, "0x%lx", (long)sfs.f_type);
		for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
			if ((long)sfs.f_type == fs[i].type)
				snprintf(type, sizeof type, "%s", fs[i].name);
	}
	note(b, "host rows: shmem huge pages '%s'; the file is on %s (%s)", thp, type, dir);
}

int bench_copy_run(struct device *dev, struct work *work)
{
	struct bench_copy_spec *spec = work->spec;
	struct bench b;
	memset(&b, 0, sizeof b);
	b.dev = dev;
	b.work = work;
	b.spec = spec;
	b.err = &work->error;
	b.pool = dev->config.copy_pool;
	b.cuda = strcmp(dev->ops->name, "cuda") == 0;
	spec->copy_threads = copy_pool_threads(b.pool);
	spec->slot_bytes = dev->config.staging_slot_bytes;
	spec->slots = dev->config.staging_slots;
	if (spec->repeats < 1 || spec->repeats > MAX_REPEATS)
		return gpuq_fail(b.err, GPUQ_E_INTERNAL, "bench: %u repeats", spec->repeats);
	note_host(&b);
	for (unsigned i = 0; i < spec->nsizes; i++) {
		if (bench_size(&b, spec->sizes[i], i) < 0)
			return -1;
		work->result.bytes += spec->sizes[i];
	}
	return 0;
}
