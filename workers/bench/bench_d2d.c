/*
 * The device-to-device copy benchmark (see bench_d2d.h). Worker threads
 * only: each part measures on its own device, and a pair's parts meet at
 * a two-part barrier under the gang's sync lock; rows are appended under
 * that lock (by the D2D part, then by each pair's destination).
 */
#include "workers/bench/bench_d2d.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One part's view: its device, its work, the benchmark and its part index. */
struct bench_ctx {
	struct device *dev;
	struct work *work;
	struct bench_d2d *b;
	int self;
	bool gang;
	void *start, *end; /* timing events */
};

int bench_d2d_init_gang(struct bench_d2d *b, struct work *const *parts, int nparts)
{
	b->pair_arrived = b->pair_generation = 0;
	b->nrows = 0;
	return peer_sync_init(&b->sync, parts, nparts, b->timeout_ms);
}

void bench_d2d_destroy(struct bench_d2d *b)
{
	if (b->npairs > 0)
		peer_sync_destroy(&b->sync);
}

static int bench_stop(const struct bench_ctx *c, struct gpuq_error *err)
{
	if (c->gang)
		return peer_sync_check(&c->b->sync, c->self, err);
	if (atomic_load(&c->work->cancel))
		return gpuq_fail(err, GPUQ_E_CANCELLED, "bench_d2d cancelled");
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median_gbps(double *seconds, unsigned n, uint64_t bytes)
{
	qsort(seconds, n, sizeof *seconds, cmp_double);
	double mid = n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
	return mid > 0 ? (double)bytes / mid / 1e9 : 0;
}

/* path NULL: the ceiling's row. */
static void add_row(const struct bench_ctx *c, const char *group, uint64_t bytes,
		    const char *method, const char *path, double gbps, double ceiling_gbps,
		    bool verified)
{
	struct bench_d2d *b = c->b;
	if (c->gang)
		peer_sync_lock(&b->sync);
	if (b->nrows < BENCH_D2D_MAX_ROWS) {
		struct bench_row *r = &b->rows[b->nrows++];
		snprintf(r->group, sizeof r->group, "%s", group);
		r->bytes = bytes;
		snprintf(r->method, sizeof r->method, "%s", method);
		r->role = path ? "gpuq" : "ceiling";
		r->path = path;
		r->gbps = gbps;
		r->ceiling = ceiling_gbps;
		r->verified = verified;
	}
	if (c->gang)
		peer_sync_unlock(&b->sync);
}

static int fill_with(struct device *dev, void *p, uint64_t n, enum fill_pattern pattern,
		     uint64_t seed, struct gpuq_error *err)
{
	struct fill_spec spec;
	memset(&spec, 0, sizeof spec);
	spec.pattern = pattern;
	spec.dtype = GPUQ_DTYPE_BYTES;
	spec.seed = seed;
	return dev->ops->mem.fill(dev, p, n, &spec, err);
}

/* ---- D2D on one device ---- */

enum d2d_method { D2D_RAW, D2D_CE, D2D_SM, D2D_METHODS };

static int d2d_run_once(const struct bench_ctx *c, enum d2d_method m, void *dst,
			const void *src, uint64_t n, double *seconds, struct gpuq_error *err)
{
	struct device *dev = c->dev;
	const struct backend_ops *ops = dev->ops;
	int rc;
	if (m == D2D_RAW) {
		rc = ops->events.record(dev, c->start, err);
		if (rc == 0)
			rc = ops->copy.d2d(dev, dst, src, n, COPY_ENGINE_CE, err);
		if (rc == 0)
			rc = ops->events.record(dev, c->end, err);
	} else { /* timed from right before its first chunk, as the raw call from before its one */
		rc = copy_same(dev, NULL, dst, src, n, m == D2D_SM ? COPY_ENGINE_SM : COPY_ENGINE_CE,
			       0, c->start, c->end, err);
	}
	if (rc == 0)
		rc = ops->events.sync(dev, c->end, err);
	if (rc == 0)
		rc = ops->events.elapsed(dev, c->start, c->end, seconds, err);
	return rc;
}

/* Poisons dst, runs method m warm-up + repeats times; *gbps is the median, *ok the verify. */
static int d2d_method(const struct bench_ctx *c, enum d2d_method m, void *dst, const void *src,
		      uint64_t n, uint64_t want, double *gbps, bool *ok, struct gpuq_error *err)
{
	double seconds[BENCH_D2D_MAX_REPEATS], s;
	unsigned reps = c->b->repeats;
	uint64_t got = 0;
	int rc = fill_with(c->dev, dst, n, FILL_ZERO, 0, err);
	for (unsigned r = 0; rc == 0 && r <= reps; r++) {
		rc = bench_stop(c, err);
		if (rc == 0)
			rc = d2d_run_once(c, m, dst, src, n, &s, err);
		if (rc == 0 && r > 0)
			seconds[r - 1] = s;
	}
	if (rc == 0)
		rc = c->dev->ops->mem.checksum(c->dev, dst, n, &got, err);
	if (rc == 0) {
		*gbps = median_gbps(seconds, reps, n);
		*ok = got == want;
	}
	return rc;
}

static int d2d_size(const struct bench_ctx *c, uint64_t n, struct gpuq_error *err)
{
	static const char *const cuda_names[] = { "cudaMemcpy", "gpuq CE", "gpuq SM" };
	static const char *const host_names[] = { "memcpy (host)", "gpuq CE", "gpuq SM" };
	const char *const *names = c->b->host ? host_names : cuda_names;
	struct device *dev = c->dev;
	void *src = NULL, *dst = NULL;
	uint64_t want = 0;
	double gbps[D2D_METHODS] = { 0 };
	bool ok[D2D_METHODS] = { false };
	int rc = dev->ops->mem.alloc(dev, n, &src, err);
	if (rc == 0)
		rc = dev->ops->mem.alloc(dev, n, &dst, err);
	if (rc == 0)
		rc = fill_with(dev, src, n, FILL_RANDOM, c->b->seed, err);
	if (rc == 0)
		rc = dev->ops->mem.checksum(dev, src, n, &want, err);
	for (int m = 0; rc == 0 && m < D2D_METHODS; m++)
		rc = d2d_method(c, (enum d2d_method)m, dst, src, n, want, &gbps[m], &ok[m], err);
	const char *paths[D2D_METHODS] = { NULL, c->b->host ? "host-memcpy" : "ce",
					   c->b->host ? "host-memcpy" : "sm" };
	for (int m = 0; rc == 0 && m < D2D_METHODS; m++)
		add_row(c, "D2D", n, names[m], paths[m], gbps[m], gbps[D2D_RAW], ok[m]);
	struct gpuq_error ignored;
	if (dst && !dev->faulted)
		dev->ops->mem.release(dev, dst, &ignored);
	if (src && !dev->faulted)
		dev->ops->mem.release(dev, src, &ignored);
	return rc;
}

/* ---- a peer pair ---- */

enum pair_method { PAIR_RAW, PAIR_PEER, PAIR_STAGED };

struct pair_run {
	const struct bench_d2d_pair *p;
	uint64_t n;
	enum pair_method m;
};

static bool pair_passed(void *arg)
{
	struct bench_d2d *b = ((void **)arg)[0];
	unsigned generation = *(unsigned *)((void **)arg)[1];
	return b->pair_generation != generation;
}

/* The pair's two parts meet here (the others wait for the next pair). */
static int pair_barrier(const struct bench_ctx *c, struct gpuq_error *err)
{
	struct bench_d2d *b = c->b;
	peer_sync_lock(&b->sync);
	unsigned generation = b->pair_generation;
	void *arg[2] = { b, &generation };
	if (++b->pair_arrived == 2) {
		b->pair_arrived = 0;
		b->pair_generation++;
		peer_sync_changed(&b->sync);
	}
	int rc = peer_sync_wait(&b->sync, c->self, pair_passed, arg,
				"the other device of the pair", err);
	peer_sync_unlock(&b->sync);
	return rc;
}

static const char *gpuq_path_method(const char *path)
{
	static const char *const names[][2] = {
		{ "nvlink", "gpuq nvlink" },     { "pcie-p2p", "gpuq pcie-p2p" },
		{ "p2p", "gpuq p2p" },           { "same-gpu", "gpuq same-gpu" },
		{ "host-memcpy", "gpuq host-memcpy" },
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (strcmp(path, names[i][0]) == 0)
			return names[i][1];
	return "gpuq peer";
}

static const char *pair_ceiling_name(const struct bench_d2d *b, const struct bench_d2d_pair *p)
{
	if (b->host)
		return "memcpy (host)";
	return p->direct ? "cudaMemcpyPeer" : "cudaMemcpyPeer (no P2P: driver-staged)";
}

/* The source prepares the run's gpuq copy before the pair's first barrier of the run. */
static int pair_spec_make(const struct bench_ctx *c, const struct pair_run *r,
			  struct gpuq_error *err)
{
	struct bench_d2d *b = c->b;
	struct copy_spec *s = &b->pair;
	memset(s, 0, sizeof *s);
	s->route = r->m == PAIR_PEER ? COPY_ROUTE_PEER : COPY_ROUTE_STAGED;
	s->path = r->m == PAIR_PEER ? r->p->path : "host-staged";
	s->src = b->pair_src;
	s->dst = b->pair_dst;
	s->bytes = r->n;
	s->src_device = r->p->src;
	s->dst_device = r->p->dst;
	s->chunk_bytes = r->m == PAIR_PEER ? COPY_PEER_CHUNK : COPY_RING_SLOT;
	snprintf(s->src_label, sizeof s->src_label, "bench source on gpu %d", r->p->src);
	snprintf(s->dst_label, sizeof s->dst_label, "bench destination on gpu %d", r->p->dst);
	if (copy_spec_init_gang(s, b->sync.parts[r->p->src], b->sync.parts[r->p->dst],
				b->timeout_ms) != 0)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "bench_d2d: cannot make a copy's locks");
	return 0;
}

/*
 * One run, both parts: barrier; the destination records its start; barrier
 * (so the source starts nothing before); the copy; barrier.
 */
static int pair_run_once(const struct bench_ctx *c, const struct pair_run *r, double *seconds,
			 struct gpuq_error *err)
{
	struct bench_d2d *b = c->b;
	struct device *dev = c->dev;
	bool src = c->self == r->p->src, gang = r->m != PAIR_RAW;
	int rc = src && gang ? pair_spec_make(c, r, err) : 0;
	if (rc == 0)
		rc = pair_barrier(c, err);
	if (rc == 0 && !src)
		rc = dev->ops->events.record(dev, c->start, err);
	if (rc == 0)
		rc = pair_barrier(c, err);
	if (rc == 0 && !src && r->m == PAIR_RAW) {
		rc = dev->ops->copy.peer(dev, b->pair_dst, r->p->src, b->pair_src, r->n, err);
		if (rc == 0)
			rc = dev->ops->events.record(dev, c->end, err);
	} else if (rc == 0 && gang) {
		if (!src)
			b->pair.timing_end = c->end;
		rc = copy_gang_part(dev, &b->pair, src ? COPY_PART_SRC : COPY_PART_DST, err);
	}
	if (rc == 0 && !src)
		rc = dev->ops->events.sync(dev, c->end, err);
	if (rc == 0 && !src)
		rc = dev->ops->events.elapsed(dev, c->start, c->end, seconds, err);
	if (rc == 0)
		rc = pair_barrier(c, err);
	if (src && gang && rc == 0)
		copy_spec_destroy(&b->pair);
	return rc;
}

static int pair_method(const struct bench_ctx *c, const struct pair_run *r, double *gbps,
		       bool *ok, struct gpuq_error *err)
{
	struct bench_d2d *b = c->b;
	double seconds[BENCH_D2D_MAX_REPEATS], s = 0;
	uint64_t got = 0;
	bool src = c->self == r->p->src;
	int rc = src ? 0 : fill_with(c->dev, b->pair_dst, r->n, FILL_ZERO, 0, err);
	for (unsigned k = 0; rc == 0 && k <= b->repeats; k++) {
		rc = pair_run_once(c, r, &s, err);
		if (rc == 0 && k > 0)
			seconds[k - 1] = s;
	}
	if (rc == 0 && !src) {
		rc = c->dev->ops->mem.checksum(c->dev, b->pair_dst, r->n, &got, err);
		*gbps = median_gbps(seconds, b->repeats, r->n);
		*ok = got == b->pair_sum;
	}
	return rc;
}

/* The pair's buffers: each part allocates its own and publishes it. */
static int pair_setup(const struct bench_ctx *c, const struct bench_d2d_pair *p, uint64_t n,
		      void **mine, struct gpuq_error *err)
{
	struct bench_d2d *b = c->b;
	struct device *dev = c->dev;
	bool src = c->self == p->src;
	uint64_t sum = 0;
	int rc = dev->ops->mem.alloc(dev, n, mine, err);
	if (rc == 0 && src)
		rc = fill_with(dev, *mine, n, FILL_RANDOM, b->seed, err);
	if (rc == 0 && src)
		rc = dev->ops->mem.checksum(dev, *mine, n, &sum, err);
	if (rc == 0) {
		peer_sync_lock(&b->sync);
		if (src) {
			b->pair_src = *mine;
			b->pair_sum = sum;
		} else {
			b->pair_dst = *mine;
		}
		peer_sync_unlock(&b->sync);
		rc = pair_barrier(c, err);
	}
	return rc;
}

static int pair_size(const struct bench_ctx *c, const struct bench_d2d_pair *p, uint64_t n,
		     struct gpuq_error *err)
{
	struct bench_d2d *b = c->b;
	enum pair_method methods[3];
	unsigned nm = 0;
	methods[nm++] = PAIR_RAW;
	if (p->direct)
		methods[nm++] = PAIR_PEER;
	methods[nm++] = PAIR_STAGED;
	double gbps[3] = { 0 };
	bool ok[3] = { false };
	void *mine = NULL;
	int rc = pair_setup(c, p, n, &mine, err);
	for (unsigned i = 0; rc == 0 && i < nm; i++) {
		struct pair_run r = { p, n, methods[i] };
		rc = pair_method(c, &r, &gbps[i], &ok[i], err);
	}
	if (rc == 0 && c->self == p->dst) {
		char group[32];
		const char *ceiling = pair_ceiling_name(b, p);
		snprintf(group, sizeof group, "peer %d->%d", p->src, p->dst);
		for (unsigned i = 0; i < nm; i++) {
			const char *method = methods[i] == PAIR_RAW ? ceiling
					     : methods[i] == PAIR_PEER ? gpuq_path_method(p->path)
								       : "gpuq host-staged";
			const char *path = methods[i] == PAIR_RAW ? NULL
					   : methods[i] == PAIR_PEER ? p->path
								     : "host-staged";
			add_row(c, group, n, method, path, gbps[i], gbps[0], ok[i]);
		}
	}
	if (rc == 0)
		rc = pair_barrier(c, err); /* both done with the other's buffer */
	struct gpuq_error ignored;
	if (mine && !c->dev->faulted)
		c->dev->ops->mem.release(c->dev, mine, &ignored);
	return rc;
}

/* ---- the part ---- */

static int bench_pairs(const struct bench_ctx *c, struct gpuq_error *err)
{
	struct bench_d2d *b = c->b;
	int rc = peer_sync_barrier(&b->sync, c->self, err); /* the D2D rows are done */
	for (unsigned i = 0; rc == 0 && i < b->npairs; i++) {
		const struct bench_d2d_pair *p = &b->pairs[i];
		if (c->self == p->src || c->self == p->dst)
			for (unsigned k = 0; rc == 0 && k < b->nsizes; k++)
				rc = pair_size(c, p, b->sizes[k], err);
		if (rc == 0)
			rc = peer_sync_barrier(&b->sync, c->self, err);
	}
	return rc;
}

int bench_d2d_run(struct device *dev, struct work *work)
{
	struct bench_d2d *b = work->spec;
	struct gpuq_error *err = &work->error;
	struct bench_ctx c = { dev, work, b, 0, b->npairs > 0, NULL, NULL };
	if (c.gang)
		for (int i = 0; i < b->sync.nparts; i++)
			if (b->sync.parts[i] == work)
				c.self = i;
	int rc = dev->ops->events.create(dev, true, &c.start, err);
	if (rc == 0)
		rc = dev->ops->events.create(dev, true, &c.end, err);
	for (unsigned k = 0; rc == 0 && dev->index == b->device && k < b->nsizes; k++)
		rc = d2d_size(&c, b->sizes[k], err);
	if (rc == 0 && c.gang)
		rc = bench_pairs(&c, err);
	if (rc != 0 && c.gang)
		peer_sync_fail(&b->sync, c.self);
	if (!dev->faulted) {
		dev->ops->events.destroy(dev, c.start);
		dev->ops->events.destroy(dev, c.end);
	}
	work->result.path = b->host ? "host-memcpy" : "device";
	return rc;
}
