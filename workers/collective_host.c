/*
 * The host backend's collectives: the reference the CUDA path is measured
 * against, and what CI tests the rendezvous, the id hand-off, the ordering
 * and the faults with.
 *
 * Communicators. A host communicator is a group in a process-wide registry,
 * keyed by the id rank 0 made: each rank's init joins the group named by the
 * id it was handed and waits (polling the collective's deadline, failure and
 * cancel flags) until all nranks have joined, as NCCL's bootstrap does. A
 * rank handed a wrong id therefore times out, and the first collective
 * checks that every rank's communicator is the same group.
 *
 * The collective itself runs among the ranks' worker threads: after a
 * barrier, rank r reduces elements [count*r/n, count*(r+1)/n) of every
 * rank's input into every rank's output, and a second barrier ends it. So
 * each rank's thread reads and writes other devices' arenas here, and only
 * between those barriers, while their workers wait in the same collective.
 *
 * Semantics, as NCCL's: each element is reduced in rank order in the
 * dtype's own precision, rounding after every step (f16 and bf16 through
 * float and kernels/hash.h's conversions, which is exact: float has more
 * than twice their precision); integers wrap; min and max of floats ignore
 * NaNs (fmin/fmax); avg of floats multiplies each input by 1/n (rounded to
 * the dtype) before the sum, as NCCL's PreMulSum does; avg of integers
 * divides the wrapped sum by n, truncating toward zero.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/hash.h"
#include "workers/backend.h"
#include "workers/clock.h"
#include "workers/collective.h"
#include "workers/collective_host.h"
#include "workers/collective_math.h"

struct host_group {
	struct coll_id id;
	int nranks;
	int joined; /* ranks whose init found the group; guarded by host_groups_lock */
	int refs;   /* members that still hold it */
	struct host_group *next;
};

struct host_comm {
	struct host_group *group;
	int rank;
};

static pthread_mutex_t host_groups_lock = PTHREAD_MUTEX_INITIALIZER;
static struct host_group *host_groups;
static _Atomic uint64_t host_id_counter;

int host_coll_unique_id(struct device *dev, struct coll_id *id, struct gpuq_error *err)
{
	(void)dev;
	(void)err;
	uint64_t seed = gpuq_mix64(((uint64_t)getpid() << 32) ^
				   (uint64_t)(monotonic_seconds() * 1e9)) ^
			atomic_fetch_add(&host_id_counter, 1) * GPUQ_GOLDEN;
	memcpy(id->bytes, "gpuqhost", 8);
	for (size_t i = 8; i + 8 <= sizeof id->bytes; i += 8) {
		uint64_t w = gpuq_random_word(seed, i);
		memcpy(id->bytes + i, &w, 8);
	}
	return 0;
}

/* Lets go of a group; the last member frees it. Takes the registry lock. */
static void host_group_leave(struct host_group *g)
{
	pthread_mutex_lock(&host_groups_lock);
	if (--g->refs == 0) {
		for (struct host_group **link = &host_groups; *link; link = &(*link)->next) {
			if (*link == g) {
				*link = g->next;
				break;
			}
		}
		free(g);
	}
	pthread_mutex_unlock(&host_groups_lock);
}

/* Finds or makes the group for id and joins it. */
static struct host_group *host_group_join(const struct coll_id *id, int nranks, int rank,
					  struct gpuq_error *err)
{
	pthread_mutex_lock(&host_groups_lock);
	struct host_group *g = host_groups;
	while (g && memcmp(g->id.bytes, id->bytes, sizeof id->bytes) != 0)
		g = g->next;
	if (!g && (g = calloc(1, sizeof *g)) != NULL) {
		g->id = *id;
		g->nranks = nranks;
		g->next = host_groups;
		host_groups = g;
	}
	if (g && g->nranks == nranks && g->joined < nranks) {
		g->joined++;
		g->refs++;
	} else if (g) {
		gpuq_fail(err, GPUQ_E_INTERNAL,
			  "host communicator: rank %d of %d joined a group of %d with %d members",
			  rank, nranks, g->nranks, g->joined);
		g = NULL;
	} else {
		gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host communicator: no memory for a group");
	}
	pthread_mutex_unlock(&host_groups_lock);
	return g;
}

static bool host_group_complete(struct host_group *g)
{
	pthread_mutex_lock(&host_groups_lock);
	bool done = g->joined == g->nranks;
	pthread_mutex_unlock(&host_groups_lock);
	return done;
}

int host_coll_comm_init(struct device *dev, struct coll_call *call, const struct coll_id *id,
			void **comm, struct gpuq_error *err)
{
	struct host_comm *hc = calloc(1, sizeof *hc);
	if (!hc)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
				 "host device %d: no memory for a communicator", dev->index);
	hc->rank = call->rank;
	hc->group = host_group_join(id, call->spec->nranks, call->rank, err);
	if (!hc->group) {
		free(hc);
		return -1;
	}
	while (!host_group_complete(hc->group)) {
		if (coll_poll(call, err) < 0) {
			host_group_leave(hc->group);
			free(hc);
			return -1;
		}
		coll_pause(call);
	}
	*comm = hc;
	return 0;
}

void host_coll_comm_release(struct device *dev, void *comm)
{
	(void)dev;
	struct host_comm *hc = comm;
	if (!hc)
		return;
	host_group_leave(hc->group);
	free(hc);
}

/* Integers: wrapping arithmetic in the low `size` bytes, signed or not. */
static uint64_t int_mask(size_t size)
{
	return size == 8 ? UINT64_MAX : (UINT64_C(1) << (8 * size)) - 1;
}

static int64_t int_signed(uint64_t v, size_t size)
{
	uint64_t sign = UINT64_C(1) << (8 * size - 1);
	return (int64_t)((v ^ sign) - sign); /* sign-extends from bit 8*size-1 */
}

static uint64_t int_step(enum coll_op op, uint64_t a, uint64_t b, size_t size, bool is_signed)
{
	uint64_t mask = int_mask(size);
	switch (op) {
	case COLL_SUM:
	case COLL_AVG: return (a + b) & mask;
	case COLL_PROD: return (a * b) & mask;
	case COLL_MIN:
	case COLL_MAX: {
		bool less = is_signed ? int_signed(a, size) < int_signed(b, size) : a < b;
		return (op == COLL_MIN) == less ? a : b;
	}
	}
	return a;
}

static void host_reduce_int(const struct allreduce_spec *spec, uint64_t lo, uint64_t hi)
{
	size_t size = gpuq_dtype_size(spec->dtype);
	bool is_signed = spec->dtype != GPUQ_DTYPE_U8;
	uint64_t mask = int_mask(size);
	for (uint64_t i = lo; i < hi; i++) {
		uint64_t acc = 0, x = 0;
		memcpy(&acc, (const char *)spec->in[0] + i * size, size); /* little-endian */
		for (int r = 1; r < spec->nranks; r++) {
			memcpy(&x, (const char *)spec->in[r] + i * size, size);
			acc = int_step(spec->op, acc, x, size, is_signed);
		}
		if (spec->op == COLL_AVG && is_signed)
			acc = (uint64_t)(int_signed(acc, size) / spec->nranks) & mask;
		else if (spec->op == COLL_AVG)
			acc /= (uint64_t)spec->nranks;
		for (int r = 0; r < spec->nranks; r++)
			memcpy((char *)spec->out[r] + i * size, &acc, size);
	}
}

/* Floats: values carried as double, rounded to the dtype after every step. */
static double float_round(double v, enum gpuq_dtype dtype)
{
	switch (dtype) {
	case GPUQ_DTYPE_F16: return gpuq_f16_bits_to_f32(gpuq_f32_to_f16_bits((float)v));
	case GPUQ_DTYPE_BF16: return gpuq_bf16_bits_to_f32(gpuq_f32_to_bf16_bits((float)v));
	case GPUQ_DTYPE_F32: return (float)v;
	default: return v;
	}
}

static double float_load(const void *base, uint64_t i, enum gpuq_dtype dtype)
{
	const char *p = base;
	uint16_t h;
	float f;
	double d;
	switch (dtype) {
	case GPUQ_DTYPE_F16: memcpy(&h, p + i * 2, 2); return gpuq_f16_bits_to_f32(h);
	case GPUQ_DTYPE_BF16: memcpy(&h, p + i * 2, 2); return gpuq_bf16_bits_to_f32(h);
	case GPUQ_DTYPE_F32: memcpy(&f, p + i * 4, 4); return f;
	default: memcpy(&d, p + i * 8, 8); return d;
	}
}

static void float_store(void *base, uint64_t i, enum gpuq_dtype dtype, double v)
{
	char *p = base;
	uint16_t h;
	float f = (float)v;
	switch (dtype) {
	case GPUQ_DTYPE_F16: h = gpuq_f32_to_f16_bits(f); memcpy(p + i * 2, &h, 2); return;
	case GPUQ_DTYPE_BF16: h = gpuq_f32_to_bf16_bits(f); memcpy(p + i * 2, &h, 2); return;
	case GPUQ_DTYPE_F32: memcpy(p + i * 4, &f, 4); return;
	default: memcpy(p + i * 8, &v, 8); return;
	}
}

static double float_step(enum coll_op op, double a, double b, enum gpuq_dtype dtype)
{
	switch (op) {
	case COLL_SUM:
	case COLL_AVG: return float_round(a + b, dtype);
	case COLL_PROD: return float_round(a * b, dtype);
	case COLL_MIN: return fmin(a, b);
	case COLL_MAX: return fmax(a, b);
	}
	return a;
}

static void host_reduce_float(const struct allreduce_spec *spec, uint64_t lo, uint64_t hi)
{
	enum gpuq_dtype t = spec->dtype;
	double scale = float_round(1.0 / spec->nranks, t);
	bool avg = spec->op == COLL_AVG;
	for (uint64_t i = lo; i < hi; i++) {
		double acc = float_load(spec->in[0], i, t);
		if (avg)
			acc = float_round(acc * scale, t);
		for (int r = 1; r < spec->nranks; r++) {
			double x = float_load(spec->in[r], i, t);
			acc = float_step(spec->op, acc, avg ? float_round(x * scale, t) : x, t);
		}
		for (int r = 0; r < spec->nranks; r++)
			float_store(spec->out[r], i, t, acc);
	}
}

/* Elements [lo, hi) of every input reduced into every output. */
static void host_reduce(const struct allreduce_spec *spec, uint64_t lo, uint64_t hi)
{
	switch (spec->dtype) {
	case GPUQ_DTYPE_F16:
	case GPUQ_DTYPE_BF16:
	case GPUQ_DTYPE_F32:
	case GPUQ_DTYPE_F64: host_reduce_float(spec, lo, hi); return;
	default: host_reduce_int(spec, lo, hi); return;
	}
}

/* A timeout inside the collective names the ranks that are behind. */
static int host_name_laggards(struct coll_call *call, const _Atomic unsigned *progress,
			      unsigned want, const char *what, struct gpuq_error *err)
{
	const struct allreduce_spec *spec = call->spec;
	if (err->code != GPUQ_E_TIMEOUT || coll_failed(spec))
		return -1;
	char devs[256], late[256] = "";
	size_t used = 0;
	int n = 0;
	for (int r = 0; r < spec->nranks && used < sizeof late; r++)
		if (atomic_load(&progress[r]) < want)
			used += (size_t)snprintf(late + used, sizeof late - used, "%srank %d (device %d)",
						 n++ ? ", " : "", r, spec->devices[r]);
	coll_format_devices(spec, devs, sizeof devs);
	return gpuq_fail(err, GPUQ_E_TIMEOUT,
			 "allreduce over %s: %s did not %s within %.0f ms; the communicator is dropped",
			 devs, late, what, (call->deadline - call->wait_start) * 1e3);
}

/* Waits until *counter reaches target; a timeout names the ranks behind. */
static int host_barrier(struct coll_call *call, _Atomic unsigned *counter, unsigned target,
			const _Atomic unsigned *progress, unsigned want, const char *what,
			struct gpuq_error *err)
{
	while (atomic_load(counter) < target) {
		if (coll_poll(call, err) < 0)
			return host_name_laggards(call, progress, want, what, err);
		coll_pause(call);
	}
	return 0;
}

/* Every rank must hold the same group: a stale cache entry would show here. */
static int host_check_group(struct coll_call *call, struct host_comm *hc, struct gpuq_error *err)
{
	struct coll_sync *s = &call->spec->sync;
	for (int r = 0; r < call->spec->nranks; r++)
		if (atomic_load(&s->host_group[r]) != hc->group)
			return gpuq_fail(err, GPUQ_E_INTERNAL,
					 "allreduce: rank %d and rank %d hold different communicators "
					 "(a stale communicator cache)",
					 call->rank, r);
	return 0;
}

/* One all-reduce among the ranks' threads: barrier, this rank's slice, barrier. */
static int host_collective_once(struct coll_call *call, struct host_comm *hc,
				struct gpuq_error *err)
{
	struct allreduce_spec *spec = call->spec;
	struct coll_sync *s = &spec->sync;
	unsigned k = ++call->host_ops, n = (unsigned)spec->nranks, r = (unsigned)call->rank;
	atomic_store(&s->host_group[r], hc->group);
	atomic_store(&s->host_rank_started[r], k);
	atomic_fetch_add(&s->host_arrive, 1);
	if (host_barrier(call, &s->host_arrive, n * k, s->host_rank_started, k,
			 "take part in the collective", err) < 0)
		return -1;
	if (k == 1 && host_check_group(call, hc, err) < 0)
		return -1;
	host_reduce(spec, spec->count * r / n, spec->count * (r + 1) / n);
	atomic_store(&s->host_rank_finished[r], k);
	atomic_fetch_add(&s->host_finish, 1);
	return host_barrier(call, &s->host_finish, n * k, s->host_rank_finished, k,
			    "finish its share of the collective", err);
}

int host_coll_allreduce(struct device *dev, void *comm, struct coll_call *call,
			struct gpuq_error *err)
{
	(void)dev;
	return host_collective_once(call, comm, err);
}

/* The baseline: the same collective back to back, timed on the host clock. */
int host_coll_bench(struct device *dev, void *comm, struct coll_call *call,
		    struct gpuq_error *err)
{
	(void)dev;
	struct allreduce_spec *spec = call->spec;
	double *samples = calloc(spec->repeats ? spec->repeats : 1, sizeof *samples);
	if (!samples)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "bench: no memory for %u samples",
				 spec->repeats);
	int rc = 0;
	for (unsigned w = 0; w < spec->warmup && rc == 0; w++)
		rc = host_collective_once(call, comm, err);
	for (unsigned rep = 0; rep < spec->repeats && rc == 0; rep++) {
		coll_wait_begin(call, spec->timeout_s, "the benchmark loop");
		double t0 = monotonic_seconds();
		for (unsigned i = 0; i < spec->iters && rc == 0; i++)
			rc = host_collective_once(call, comm, err);
		samples[rep] = (monotonic_seconds() - t0) / (spec->iters ? spec->iters : 1) * 1e6;
	}
	if (rc == 0)
		spec->bench_us[call->rank] = coll_median(samples, spec->repeats);
	free(samples);
	return rc;
}
