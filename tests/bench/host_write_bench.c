/*
 * host_write_bench: the host half of a get, alone. Writes SIZE bytes (default
 * 1 GiB) from a source buffer (pinned with cudaHostAlloc where the CUDA
 * runtime has a device, else malloc'd and touched) into a memfd whose pages
 * exist, the way transfer_staged.c's get does it: map the destination per
 * job, hand chunks to N threads (each takes the next chunk; populate it with
 * MADV_POPULATE_WRITE or not; copy it under copy_guarded's SIGBUS guard with
 * a store function of workers/transfer/copy_store.c), then munmap in N parallel parts.
 * Each row varies one thing (store function, populating, chunk size, one
 * mapping or one per thread region, pwrite, the source as a 64 MiB ring like
 * the staging slots, a fresh memfd, a page-cache file, a private buffer as
 * the ceiling) at 8, 12 and 16 threads, and reports the median of 5 timed
 * runs after a warm-up. The destination is poisoned before the warm-up and
 * compared with the source byte for byte after it.
 *
 *   build/tests/host_write_bench [-s MIB] [-r REPS] [-t 8,12,16] [-f SUBSTRING]
 *                                [-d DIR] [-l LOGFILE]
 *
 * -f runs only the rows whose label contains SUBSTRING; -d is where the
 * regular file goes (default /tmp). Rows stop (marked "skipped") after 55 s.
 * The full log (every run) goes to stderr and to LOGFILE if given; the
 * compact table is printed last, on stdout.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "client/bench/bench_time.h"
#include "workers/transfer/copy_guard.h"
#include "workers/transfer/copy_store.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define MIB ((size_t)1 << 20)
#define MAX_THREADS 64
#define MAX_ROWS 160
#define TIME_LIMIT_S 55.0

enum store { S_MEMCPY, S_NT_SSE2, S_NT_AVX2, S_NT_AVX512, S_NT_BEST, S_PWRITE, S_NONE };
enum target { T_MEMFD, T_MEMFD_FRESH, T_FILE, T_ANON };

static const char *const store_names[] = { "memcpy", "nt-sse2", "nt-avx2", "nt-avx512", "nt",
					   "pwrite", "no-copy" };
static const char *const target_names[] = { "memfd", "memfd-fresh", "file", "anon" };

struct row {
	enum target target;
	enum store store;
	bool populate;
	size_t chunk;
	bool region_maps; /* one mapping per thread's share instead of one per job */
	size_t ring;      /* source bytes cycled through (0: the whole size) */
	unsigned threads;
	char label[96];
	/* results */
	bool ran, ok, skipped;
	double gbs, gbs_min, gbs_max, copy_gbs, unmap_ms;
};

/* ---- options and state ---- */

static size_t size = 1024 * MIB;
static unsigned reps = 5;
static unsigned thread_counts[8] = { 8, 12, 16 };
static unsigned nthread_counts = 3;
static const char *filter;
static const char *dir = "/tmp";
static FILE *log_file;
static unsigned char *src;
static const char *src_kind;
static int memfd = -1, filefd = -1;
static unsigned char *anon;
static double started;

static void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logmsg(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (log_file) {
		va_start(ap, fmt);
		vfprintf(log_file, fmt, ap);
		va_end(ap);
		fflush(log_file);
	}
}

static void die(const char *what)
{
	fprintf(stderr, "host_write_bench: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* ---- a tiny pool: run fn(i, arg) on threads 0..n-1 and wait ---- */

typedef void (*phase_fn)(unsigned i, unsigned n, void *arg);

static struct {
	pthread_mutex_t lock;
	pthread_cond_t go, done;
	unsigned generation, running, n;
	phase_fn fn;
	void *arg;
	pthread_t threads[MAX_THREADS];
} pool = { .lock = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER };

static void *pool_main(void *p)
{
	unsigned i = (unsigned)(uintptr_t)p, seen = 0;
	pthread_mutex_lock(&pool.lock);
	for (;;) {
		while (pool.generation == seen)
			pthread_cond_wait(&pool.go, &pool.lock);
		seen = pool.generation;
		if (i >= pool.n)
			continue;
		phase_fn fn = pool.fn;
		void *arg = pool.arg;
		unsigned n = pool.n;
		pthread_mutex_unlock(&pool.lock);
		fn(i, n, arg);
		pthread_mutex_lock(&pool.lock);
		if (--pool.running == 0)
			pthread_cond_broadcast(&pool.done);
	}
	return NULL;
}

static void pool_start(void)
{
	for (unsigned i = 0; i < MAX_THREADS; i++)
		if (pthread_create(&pool.threads[i], NULL, pool_main, (void *)(uintptr_t)i) != 0)
			die("pthread_create");
}

static void run_phase(unsigned n, phase_fn fn, void *arg)
{
	pthread_mutex_lock(&pool.lock);
	pool.fn = fn;
	pool.arg = arg;
	pool.n = n;
	pool.running = n;
	pool.generation++;
	pthread_cond_broadcast(&pool.go);
	while (pool.running)
		pthread_cond_wait(&pool.done, &pool.lock);
	pthread_mutex_unlock(&pool.lock);
}

/* ---- source, poison, verify ---- */

static void part_of(unsigned i, unsigned n, size_t total, size_t *at, size_t *len)
{
	size_t per = (total / n + 4095) & ~(size_t)4095;
	*at = per * i < total ? per * i : total;
	*len = total - *at < per ? total - *at : per;
}

static void fill_random(unsigned i, unsigned n, void *arg)
{
	(void)arg;
	size_t at, len;
	part_of(i, n, size, &at, &len);
	uint64_t x = 0x9e3779b97f4a7c15ull * (at / 8 + 1);
	for (size_t k = 0; k + 8 <= len; k += 8) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		memcpy(src + at + k, &x, 8);
	}
}

struct poison_arg {
	unsigned char *dst;
	size_t ring;
	atomic_int bad;
};

static void poison_part(unsigned i, unsigned n, void *arg)
{
	struct poison_arg *p = arg;
	size_t at, len;
	part_of(i, n, size, &at, &len);
	memset(p->dst + at, 0xa5, len);
}

static void verify_part(unsigned i, unsigned n, void *arg)
{
	struct poison_arg *p = arg;
	size_t at, len;
	part_of(i, n, size, &at, &len);
	for (size_t k = at; k < at + len;) {
		size_t off = k % p->ring, step = p->ring - off;
		if (step > at + len - k)
			step = at + len - k;
		if (memcmp(p->dst + k, src + off, step) != 0)
			atomic_fetch_add(&p->bad, 1);
		k += step;
	}
}

static unsigned char *map_fd(int fd)
{
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		die("mmap");
	return m;
}

/* 0xa5 everywhere in the destination of row r (through a mapping of its own). */
static void poison(const struct row *r, int fd)
{
	struct poison_arg p = { .dst = r->target == T_ANON ? anon : map_fd(fd) };
	run_phase(16, poison_part, &p);
	if (r->target != T_ANON)
		munmap(p.dst, size);
}

static bool verify(const struct row *r, int fd)
{
	struct poison_arg p = { .dst = r->target == T_ANON ? anon : map_fd(fd),
				.ring = r->ring ? r->ring : size };
	run_phase(16, verify_part, &p);
	if (r->target != T_ANON)
		munmap(p.dst, size);
	return atomic_load(&p.bad) == 0;
}

/* ---- one timed write of the whole size ---- */

struct job {
	const struct row *r;
	int fd;
	copy_store_fn store;
	unsigned char *maps[MAX_THREADS]; /* one, or one per region */
	size_t lens[MAX_THREADS];
	size_t region;                   /* bytes per region mapping (the last may be shorter) */
	unsigned nmaps;
	atomic_size_t next_chunk;
	atomic_int errors;
};

static unsigned char *dst_at(struct job *j, size_t at)
{
	if (j->nmaps == 1)
		return j->maps[0] + at;
	return j->maps[at / j->region] + at % j->region;
}

static void copy_part(unsigned i, unsigned n, void *arg)
{
	(void)i, (void)n;
	struct job *j = arg;
	const struct row *r = j->r;
	size_t ring = r->ring ? r->ring : size;
	for (;;) {
		size_t k = atomic_fetch_add(&j->next_chunk, 1), at = k * r->chunk;
		if (at >= size)
			break;
		size_t len = size - at < r->chunk ? size - at : r->chunk;
		const unsigned char *s = src + at % ring;
		if (r->store == S_PWRITE) {
			for (size_t done = 0; done < len;) {
				ssize_t w = pwrite(j->fd, s + done, len - done, (off_t)(at + done));
				if (w <= 0 && errno != EINTR) {
					atomic_fetch_add(&j->errors, 1);
					break;
				}
				done += w > 0 ? (size_t)w : 0;
			}
			continue;
		}
		/* A chunk never straddles two region mappings: regions are whole chunks. */
		unsigned char *d = dst_at(j, at);
		if (r->populate)
			(void)madvise(d, len, MADV_POPULATE_WRITE);
		if (r->store != S_NONE && copy_guarded_store(d, s, len, j->store) != 0)
			atomic_fetch_add(&j->errors, 1);
	}
}

static void unmap_part(unsigned i, unsigned n, void *arg)
{
	struct job *j = arg;
	if (j->nmaps > 1) {
		if (i < j->nmaps && j->maps[i])
			munmap(j->maps[i], j->lens[i]);
		return;
	}
	size_t at, len;
	part_of(i, n, size, &at, &len);
	if (len)
		munmap(j->maps[0] + at, len);
}

static copy_store_fn store_fn(enum store s)
{
	switch (s) {
	case S_NT_SSE2: return copy_store_nt_sse2;
	case S_NT_AVX2: return copy_store_nt_avx2;
	case S_NT_AVX512: return copy_store_nt_avx512;
	case S_NT_BEST: return copy_store_pick(COPY_STORES_NT, NULL);
	default: return copy_store_regular;
	}
}

/* One write; seconds overall (map to unmapped), of the copy phase, of the unmap phase. */
static int timed_write(const struct row *r, int fd, double *all, double *copy, double *unmap)
{
	struct job j = { .r = r, .fd = fd, .store = store_fn(r->store) };
	double t0 = bench_now();
	if (r->target == T_ANON) {
		j.maps[0] = anon;
		j.nmaps = 1;
	} else if (r->store != S_PWRITE && r->region_maps) {
		size_t chunks = (size + r->chunk - 1) / r->chunk;
		j.nmaps = r->threads;
		j.region = (chunks + j.nmaps - 1) / j.nmaps * r->chunk;
		for (unsigned i = 0; i < j.nmaps; i++) {
			size_t at = (size_t)i * j.region;
			if (at >= size)
				break;
			size_t len = size - at < j.region ? size - at : j.region;
			void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)at);
			if (m == MAP_FAILED)
				die("mmap region");
			j.maps[i] = m;
			j.lens[i] = len;
		}
	} else if (r->store != S_PWRITE) {
		void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED)
			die("mmap");
		j.maps[0] = m;
		j.nmaps = 1;
	}
	run_phase(r->threads, copy_part, &j);
	double t1 = bench_now();
	if (r->target != T_ANON && r->store != S_PWRITE)
		run_phase(r->threads, unmap_part, &j);
	double t2 = bench_now();
	*all = t2 - t0, *copy = t1 - t0, *unmap = t2 - t1;
	return atomic_load(&j.errors);
}

/* A new memfd of the size, its pages not yet allocated (a client's empty memfd). */
static int fresh_memfd(void)
{
	int fd = memfd_create("hwb-fresh", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
		die("memfd_create (fresh)");
	return fd;
}

static void run_row(struct row *r)
{
	double all[32], copy[32], unmap[32];
	if (bench_now() - started > TIME_LIMIT_S) {
		r->skipped = true;
		logmsg("%-44s %2ut  skipped (time limit)\n", r->label, r->threads);
		return;
	}
	int fd = r->target == T_MEMFD ? memfd : r->target == T_FILE ? filefd : -1;
	if (r->target == T_MEMFD_FRESH)
		fd = fresh_memfd();
	if (r->target != T_ANON)
		poison(r, fd);
	else
		poison(r, -1);
	double a, c, u;
	int errors = timed_write(r, fd, &a, &c, &u); /* warm-up, then checked */
	r->ok = errors == 0 && (r->store == S_NONE || verify(r, fd));
	logmsg("%-44s %2ut  warm-up %.2f GB/s, bytes %s\n", r->label, r->threads, size / a / 1e9,
	       r->store == S_NONE ? "not copied" : r->ok ? "ok" : "WRONG");
	for (unsigned k = 0; k < reps; k++) {
		if (r->target == T_MEMFD_FRESH) {
			close(fd);
			fd = fresh_memfd();
		}
		errors += timed_write(r, fd, &all[k], &copy[k], &unmap[k]);
		logmsg("%-44s %2ut  run %u: %.2f GB/s (copy %.1f ms, unmap %.1f ms)\n", r->label,
		       r->threads, k + 1, size / all[k] / 1e9, copy[k] * 1e3, unmap[k] * 1e3);
	}
	if (r->target == T_MEMFD_FRESH)
		close(fd);
	if (errors)
		r->ok = false;
	double lo = all[0], hi = all[0];
	for (unsigned k = 1; k < reps; k++)
		lo = all[k] < lo ? all[k] : lo, hi = all[k] > hi ? all[k] : hi;
	r->gbs = size / bench_median(all, reps) / 1e9;
	r->gbs_min = size / hi / 1e9;
	r->gbs_max = size / lo / 1e9;
	r->copy_gbs = size / bench_median(copy, reps) / 1e9;
	r->unmap_ms = bench_median(unmap, reps) * 1e3;
	r->ran = true;
}

/* ---- the rows ---- */

static struct row rows[MAX_ROWS];
static unsigned nrows;

static void add(enum target t, enum store s, bool populate, size_t chunk_mib, bool region_maps,
		size_t ring_mib, unsigned threads)
{
	if (nrows == MAX_ROWS)
		return;
	if ((s == S_NT_AVX2 && !copy_store_cpu_has("avx2")) ||
	    (s == S_NT_AVX512 && !copy_store_cpu_has("avx512f")))
		return;
	struct row *r = &rows[nrows];
	memset(r, 0, sizeof *r);
	r->target = t, r->store = s, r->populate = populate, r->chunk = chunk_mib * MIB;
	r->region_maps = region_maps, r->ring = ring_mib * MIB, r->threads = threads;
	if (r->ring > size)
		r->ring = 0;
	char ring[24] = "";
	if (r->ring)
		snprintf(ring, sizeof ring, " src-ring%zuM", ring_mib);
	snprintf(r->label, sizeof r->label, "%s %s%s %zuM%s%s", target_names[t], store_names[s],
		 s == S_PWRITE || t == T_ANON ? "" : populate ? " pop" : " nopop", chunk_mib,
		 region_maps ? " regionmaps" : "", ring);
	if (filter && !strstr(r->label, filter))
		return;
	nrows++;
}

static void make_rows(void)
{
	for (unsigned k = 0; k < nthread_counts; k++) {
		unsigned t = thread_counts[k];
		add(T_MEMFD, S_MEMCPY, true, 2, false, 0, t); /* today's get */
		add(T_MEMFD, S_NONE, true, 2, false, 0, t);   /* map, populate, unmap: no bytes */
		add(T_MEMFD, S_MEMCPY, false, 2, false, 0, t);
		add(T_MEMFD, S_NT_SSE2, true, 2, false, 0, t);
		add(T_MEMFD, S_NT_AVX2, true, 2, false, 0, t);
		add(T_MEMFD, S_NT_AVX512, true, 2, false, 0, t);
		add(T_MEMFD, S_NT_BEST, false, 2, false, 0, t);
		add(T_MEMFD, S_MEMCPY, true, 8, false, 0, t);
		add(T_MEMFD, S_MEMCPY, true, 32, false, 0, t);
		add(T_MEMFD, S_NT_BEST, true, 8, false, 0, t);
		add(T_MEMFD, S_NT_BEST, true, 32, false, 0, t);
		add(T_MEMFD, S_MEMCPY, true, 2, true, 0, t);
		add(T_MEMFD, S_NT_BEST, true, 2, true, 0, t);
		add(T_MEMFD, S_PWRITE, false, 2, false, 0, t);
		add(T_MEMFD, S_MEMCPY, true, 2, false, 64, t);
		add(T_MEMFD, S_NT_BEST, true, 2, false, 64, t);
	}
	unsigned t12 = nthread_counts > 1 ? thread_counts[1] : thread_counts[0];
	add(T_MEMFD_FRESH, S_MEMCPY, true, 2, false, 0, t12);
	add(T_MEMFD_FRESH, S_NT_BEST, true, 2, false, 0, t12);
	add(T_FILE, S_MEMCPY, true, 2, false, 0, t12);
	add(T_FILE, S_MEMCPY, false, 2, false, 0, t12);
	add(T_FILE, S_NT_BEST, true, 2, false, 0, t12);
	add(T_FILE, S_PWRITE, false, 2, false, 0, t12);
	for (unsigned k = 0; k < nthread_counts; k++) {
		if (thread_counts[k] == t12)
			continue;
		add(T_FILE, S_MEMCPY, true, 2, false, 0, thread_counts[k]);
		add(T_FILE, S_NT_BEST, true, 2, false, 0, thread_counts[k]);
	}
	for (unsigned k = 0; k < nthread_counts; k++) {
		add(T_ANON, S_MEMCPY, false, 2, false, 0, thread_counts[k]);
		add(T_ANON, S_NT_BEST, false, 2, false, 0, thread_counts[k]);
	}
}

/* ---- setup ---- */

static void make_source(void)
{
	void *p = NULL;
	cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocDefault);
	if (e == cudaSuccess) {
		src_kind = "pinned (cudaHostAlloc)";
	} else {
		p = aligned_alloc(4096, size);
		if (!p)
			die("aligned_alloc");
		src_kind = "malloc'd and touched (cudaHostAlloc failed)";
		logmsg("cudaHostAlloc: %s; the source is ordinary memory\n", cudaGetErrorString(e));
	}
	src = p;
	run_phase(16, fill_random, NULL); /* touches every page */
}

static void fill_fd(int fd, const char *what)
{
	if (ftruncate(fd, (off_t)size) < 0)
		die(what);
	unsigned char *m = map_fd(fd);
	struct poison_arg p = { .dst = m };
	run_phase(16, poison_part, &p); /* every page now exists */
	munmap(m, size);
}

static void make_targets(void)
{
	memfd = memfd_create("hwb", MFD_CLOEXEC);
	if (memfd < 0)
		die("memfd_create");
	fill_fd(memfd, "ftruncate memfd");
	char path[4096];
	snprintf(path, sizeof path, "%s/host_write_bench-XXXXXX", dir);
	filefd = mkostemp(path, O_CLOEXEC);
	if (filefd < 0)
		die("mkostemp");
	unlink(path);
	fill_fd(filefd, "ftruncate file");
	anon = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (anon == MAP_FAILED)
		die("mmap anon");
	memset(anon, 0x5a, size);
}

/* Every store function against memcpy at every alignment pair and small lengths. */
static int self_check(void)
{
	enum { N = 1024 + 3 * 64 };
	static unsigned char a[N + 64], want[N + 64], got[N + 64];
	copy_store_fn fns[4] = { copy_store_nt_sse2, NULL, NULL, copy_store_regular };
	if (copy_store_cpu_has("avx2"))
		fns[1] = copy_store_nt_avx2;
	if (copy_store_cpu_has("avx512f"))
		fns[2] = copy_store_nt_avx512;
	for (unsigned i = 0; i < sizeof a; i++)
		a[i] = (unsigned char)(i * 131 + 7);
	int bad = 0;
	for (unsigned f = 0; f < 4; f++) {
		if (!fns[f])
			continue;
		for (unsigned so = 0; so < 64; so += 5)
			for (unsigned d = 0; d < 64; d++)
				for (unsigned n = 0; n <= N - 64; n += n < 300 ? 1 : 61) {
					memset(want, 0xee, sizeof want);
					memset(got, 0xee, sizeof got);
					memcpy(want + d, a + so, n);
					fns[f](got + d, a + so, n);
					bad += memcmp(want, got, sizeof got) != 0;
				}
	}
	return bad;
}

static void print_table(void)
{
	const struct row *base = NULL;
	for (unsigned i = 0; i < nrows; i++)
		if (rows[i].ran && rows[i].target == T_MEMFD && rows[i].store == S_MEMCPY &&
		    rows[i].populate && rows[i].chunk == 2 * MIB && !rows[i].region_maps &&
		    !rows[i].ring && (!base || rows[i].threads == 12))
			base = &rows[i];
	printf("\nhost_write_bench: %zu MiB per run, median of %u after a warm-up; source %s\n",
	       size / MIB, reps, src_kind);
	printf("%-44s %3s %8s %15s %9s %9s %7s %s\n", "row (target stores populate chunk ...)",
	       "thr", "GB/s", "min-max", "copy GB/s", "unmap ms", "x today", "bytes");
	for (unsigned i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		if (!r->ran) {
			printf("%-44s %3u %8s\n", r->label, r->threads, r->skipped ? "skipped" : "-");
			continue;
		}
		char mm[32];
		snprintf(mm, sizeof mm, "%.1f-%.1f", r->gbs_min, r->gbs_max);
		printf("%-44s %3u %8.2f %15s %9.2f %9.1f %7.2f %s\n", r->label, r->threads, r->gbs,
		       mm, r->copy_gbs, r->unmap_ms, base ? r->gbs / base->gbs : 0.0,
		       r->store == S_NONE ? "n/a" : r->ok ? "ok" : "WRONG");
	}
	if (base)
		printf("x today: against '%s' at %u threads (what get does now)\n", base->label,
		       base->threads);
}

static void usage(void)
{
	fprintf(stderr, "usage: host_write_bench [-s MIB] [-r REPS] [-t 8,12,16] [-f SUBSTRING]"
			" [-d DIR] [-l LOGFILE]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int opt;
	while ((opt = getopt(argc, argv, "s:r:t:f:d:l:h")) != -1) {
		switch (opt) {
		case 's': size = strtoull(optarg, NULL, 10) * MIB; break;
		case 'r': reps = (unsigned)atoi(optarg); break;
		case 'f': filter = optarg; break;
		case 'd': dir = optarg; break;
		case 'l':
			if (!(log_file = fopen(optarg, "w")))
				die(optarg);
			break;
		case 't': {
			nthread_counts = 0;
			for (char *s = optarg; *s && nthread_counts < 8;) {
				unsigned long v = strtoul(s, &s, 10);
				if (v < 1 || v > MAX_THREADS)
					usage();
				thread_counts[nthread_counts++] = (unsigned)v;
				if (*s == ',')
					s++;
			}
			break;
		}
		default: usage();
		}
	}
	if (size < 64 * MIB || size % (32 * MIB) || reps < 1 || reps > 31 || nthread_counts == 0)
		usage(); /* a multiple of the largest chunk */
	started = bench_now();
	int bad = self_check();
	const char *nt_name = "";
	copy_store_pick(COPY_STORES_NT, &nt_name);
	char thp[128] = "?";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
	if (f) {
		if (!fgets(thp, sizeof thp, f))
			thp[0] = 0;
		thp[strcspn(thp, "\n")] = 0;
		fclose(f);
	}
	logmsg("host_write_bench: %ld CPUs online, avx2 %d, avx512f %d, nt picks %s; "
	       "shmem THP: %s; store self-check: %s\n",
	       sysconf(_SC_NPROCESSORS_ONLN), !!copy_store_cpu_has("avx2"),
	       !!copy_store_cpu_has("avx512f"), nt_name, thp, bad ? "FAILED" : "ok");
	pool_start();
	make_source();
	make_targets();
	logmsg("setup: %.1f s; source %s\n", bench_now() - started, src_kind);
	make_rows();
	for (unsigned i = 0; i < nrows; i++)
		run_row(&rows[i]);
	print_table();
	printf("nt = %s; store self-check %s; total %.1f s\n", nt_name, bad ? "FAILED" : "ok",
	       bench_now() - started);
	bool wrong = bad != 0;
	for (unsigned i = 0; i < nrows; i++)
		wrong |= rows[i].ran && !rows[i].ok;
	return wrong ? 1 : 0;
}
