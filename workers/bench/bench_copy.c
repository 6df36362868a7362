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
 *                                      (workers/transfer/region_pin.c): one DMA a copy;
 *                                      the pinning's cost is timed apart
 *     gpuq scratch                     no file: the copy threads make up the
 *                                      bytes (put) or drop them (get), which
 *                                      shows the pipeline without file I/O
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "workers/clock.h"
#include "workers/transfer/copy_hash.h"
#include "workers/transfer/region_pin.h"
#include "workers/transfer/transfer.h"

#define MAX_REPEATS 100
#define GIB (1024.0 * 1024.0 * 1024.0)

enum method_kind { M_PAGEABLE, M_PINNED, M_MEMFD, M_FILE, M_REGISTERED, M_REGION, M_SCRATCH };

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
	unsigned char *memfd_map, *file_map;
	const char *skip_file; /* why the file rows are skipped, or NULL */
	void *region_map;      /* the memfd pinned as a region (NULL: the region rows are skipped) */
	struct bench_copy_pin *pin;
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

static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[128];
	unsigned long long kb = 0;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return (uint64_t)kb * 1024;
}

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
	if (fcntl(b->memfd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) /* path registered needs it */
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
	if (fd >= 0 && lseek(fd, 0, SEEK_SET) < 0)
		return gpuq_fail(err, GPUQ_E_IO, "bench: lseek: %s", strerror(errno));
	double start = monotonic_seconds();
	int rc = h2d ? transfer_put(b->dev, &w) : transfer_get(b->dev, &w);
	*seconds = monotonic_seconds() - start;
	*taken = w.result.path;
	if (rc < 0)
		*err = w.error;
	return rc;
}

static int run_once(struct bench *b, bool h2d, enum method_kind kind, double *seconds,
		    const char **taken, struct gpuq_error *err)
{
	const struct backend_ops *ops = b->dev->ops;
	void *host = kind == M_PINNED ? (void *)b->pinned : (void *)b->src;
	switch (kind) {
	case M_PAGEABLE:
	case M_PINNED:
		return h2d ? ops->copy.h2d(b->dev, b->dbuf, host, b->size, seconds, err)
			   : ops->copy.d2h(b->dev, host, b->dbuf, b->size, seconds, err);
	case M_MEMFD:
		return run_transfer(b, h2d, b->memfd, TRANSFER_PATH_AUTO, false, seconds, taken, err);
	case M_FILE:
		return run_transfer(b, h2d, b->file, TRANSFER_PATH_AUTO, false, seconds, taken, err);
	case M_REGISTERED:
		return run_transfer(b, h2d, b->memfd, TRANSFER_PATH_REGISTERED, false, seconds, taken,
				    err);
	case M_REGION: /* no descriptor, the pinned mapping: path region */
		return run_transfer(b, h2d, -1, TRANSFER_PATH_REGISTERED, false, seconds, taken, err);
	case M_SCRATCH:
		return run_transfer(b, h2d, -1, TRANSFER_PATH_AUTO, false, seconds, taken, err);
	}
	return gpuq_fail(err, GPUQ_E_INTERNAL, "bench: method %d unknown", (int)kind);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The destination of a method, for poisoning and checking (NULL: the device buffer). */
static unsigned char *host_side(struct bench *b, enum method_kind kind)
{
	switch (kind) {
	case M_PAGEABLE: return b->src;
	case M_PINNED: return b->pinned;
	case M_MEMFD:
	case M_REGISTERED:
	case M_REGION: return b->memfd_map; /* the region's pages: the same memfd */
	case M_FILE: return b->file_map;
	case M_SCRATCH: return NULL;
	}
	return NULL;
}

/* Overwrites the method's destination with other bytes, so that a copy that moved nothing shows. */
static int poison(struct bench *b, bool h2d, enum method_kind kind)
{
	struct fill_spec zero = { .pattern = FILL_ZERO, .dtype = GPUQ_DTYPE_BYTES };
	if (h2d)
		return b->dev->ops->mem.fill(b->dev, b->dbuf, b->size, &zero, b->err);
	if (host_side(b, kind))
		copy_fill_random_parallel(b->pool, host_side(b, kind), b->size, ~b->seed);
	return 0;
}

/*
 * Whether the destination holds the source. A scratch sink keeps nothing:
 * one more get, with --verify, checks the bytes that reached host memory.
 */
static int check(struct bench *b, bool h2d, enum method_kind kind, bool *ok)
{
	uint64_t sum;
	if (!h2d && kind == M_SCRATCH) {
		struct gpuq_error err;
		double s;
		const char *taken;
		*ok = run_transfer(b, false, -1, TRANSFER_PATH_AUTO, true, &s, &taken, &err) == 0;
		return 0;
	}
	if (h2d && b->dev->ops->mem.checksum(b->dev, b->dbuf, b->size, &sum, b->err) < 0)
		return -1;
	if (!h2d)
		sum = copy_hash_parallel(b->pool, host_side(b, kind), b->size);
	*ok = sum == b->expected;
	return 0;
}

/*
 * A warm-up and `repeats` timed runs; the median into row. A gpuq transfer
 * that fails is noted and its row left at 0 GB/s; a CUDA baseline that
 * fails, or a cancel, ends the benchmark.
 */
static int measure(struct bench *b, bool h2d, enum method_kind kind, struct bench_row *row)
{
	double t[MAX_REPEATS + 1];
	unsigned n = b->spec->repeats;
	struct gpuq_error err;
	char size[32];
	if (poison(b, h2d, kind) < 0)
		return -1;
	for (unsigned i = 0; i <= n; i++) {
		if (cancelled(b) < 0)
			return -1;
		if (run_once(b, h2d, kind, &t[i], &row->path, &err) < 0) {
			if (kind == M_PAGEABLE || kind == M_PINNED || err.code == GPUQ_E_CANCELLED ||
			    b->dev->faulted) {
				*b->err = err;
				return -1;
			}
			note(b, "%s %s %s: %s", row->group, size_name(b->size, size, sizeof size),
			     row->method, err.message);
			return 0;
		}
	}
	qsort(t + 1, n, sizeof t[0], cmp_double); /* t[0] was the warm-up */
	double median = n % 2 ? t[1 + n / 2] : (t[n / 2] + t[n / 2 + 1]) / 2;
	row->gbps = median > 0 ? (double)b->size / median / 1e9 : 0;
	return check(b, h2d, kind, &row->verified);
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

/* Every method of one direction; the ratios once the ceiling is known. */
static int bench_direction(struct bench *b, bool h2d)
{
	static const struct {
		enum method_kind kind;
		const char *cuda_name, *host_name, *role;
	} methods[] = {
		{ M_PAGEABLE, "cudaMemcpy pageable", NULL, "baseline" },
		{ M_PINNED, "cudaMemcpy pinned", NULL, "ceiling" },
		{ M_PAGEABLE, NULL, "memcpy", "ceiling" },
		{ M_MEMFD, "gpuq memfd", "gpuq memfd", "gpuq" },
		{ M_FILE, "gpuq file", "gpuq file", "gpuq" },
		{ M_REGISTERED, "gpuq memfd registered", "gpuq memfd registered", "gpuq" },
		{ M_REGION, "gpuq region", "gpuq region", "gpuq" },
		{ M_SCRATCH, "gpuq scratch", "gpuq scratch", "gpuq" },
	};
	const char *group = h2d ? "H2D" : "D2H";
	unsigned first = b->spec->nrows;
	double ceiling = 0, staged = 0, region = 0;
	for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
		const char *name = b->cuda ? methods[i].cuda_name : methods[i].host_name;
		enum method_kind kind = methods[i].kind;
		if (!name || (kind == M_FILE && b->skip_file) || (kind == M_REGION && !b->region_map))
			continue;
		struct bench_row *row = add_row(b, group, name, methods[i].role);
		if (!row || measure(b, h2d, kind, row) < 0)
			return -1;
		if (strcmp(methods[i].role, "ceiling") == 0)
			ceiling = row->gbps;
		staged = kind == M_MEMFD ? row->gbps : staged;
		region = kind == M_REGION ? row->gbps : region;
	}
	for (unsigned i = first; i < b->spec->nrows; i++)
		b->spec->rows[i].ceiling = ceiling;
	region_break_even(b, h2d, staged, region);
	return 0;
}

/* The device holds the source again (after H2D methods that may have failed). */
static int restore_device(struct bench *b)
{
	void *host = b->cuda ? (void *)b->pinned : (void *)b->src;
	bool ok;
	if (b->dev->ops->copy.h2d(b->dev, b->dbuf, host, b->size, NULL, b->err) < 0 ||
	    check(b, true, M_PINNED, &ok) < 0)
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
	uint64_t need = b->size * (b->cuda ? 4 : 3) + (1ull << 30);
	uint64_t have = mem_available();
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
	b->memfd = b->file = -1;
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
	for (unsigned i = 0; i < spec->nsizes; i++) {
		if (bench_size(&b, spec->sizes[i], i) < 0)
			return -1;
		work->result.bytes += spec->sizes[i];
	}
	return 0;
}
