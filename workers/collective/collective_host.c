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
 * barrier, each rank does its share of every primitive of the job
 * (host_task_share: allreduce's and reduce's elements split among the
 * ranks, every other primitive's output filled by its own rank), and a
 * second barrier ends it. So each rank's thread reads and writes other
 * devices' arenas here, and only between those barriers, while their
 * workers wait in the same collective. The arithmetic, with NCCL's
 * semantics, is collective_host_reduce.c's.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "protocol/hash.h"
#include "workers/backend/backend.h"
#include "workers/clock.h"
#include "workers/collective/collective.h"
#include "workers/collective/collective_host.h"

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

/* dst <- src, count elements (nothing when they are the same: in place). */
static void host_copy(void *dst, const void *src, uint64_t count, size_t elt)
{
	if (dst != src)
		memcpy(dst, src, count * elt);
}

static void *host_at(void *base, uint64_t element, size_t elt)
{
	return (char *)base + element * elt;
}

/* Elements [lo, hi) of every rank's input reduced into out[0..ndst). */
static void host_reduce_slice(const struct coll_task *t, uint64_t lo, uint64_t hi,
			      void *const *out, int ndst)
{
	size_t elt = gpuq_dtype_size(t->dtype);
	struct host_reduction h = { .dtype = t->dtype, .op = t->op, .nsrc = t->layout.nranks,
				    .ndst = ndst };
	for (int k = 0; k < h.nsrc; k++)
		h.src[k] = host_at(t->in[k], lo, elt);
	for (int d = 0; d < ndst; d++)
		h.dst[d] = host_at(out[d], lo, elt);
	host_reduce(&h, hi - lo);
}

/*
 * Rank r's share of one primitive, between the barriers: allreduce and
 * reduce split the elements among the ranks (rank r reduces its slice of
 * every input into every output, or the root's); every other primitive has
 * each rank fill its own output, reading the others' inputs. Nothing a rank
 * writes is read by another rank in the same share (in place included, as
 * coll_in_place_offsets lays it out), so the shares need no order.
 */
static void host_task_share(const struct coll_task *t, int r)
{
	const struct coll_layout *l = &t->layout;
	size_t elt = gpuq_dtype_size(t->dtype);
	uint64_t n = (uint64_t)l->nranks, c = l->count, lo = c * (uint64_t)r / n,
		 hi = c * (uint64_t)(r + 1) / n;
	void *const root_out[1] = { t->out[l->root] };
	switch (l->prim) {
	case COLL_ALLREDUCE: host_reduce_slice(t, lo, hi, t->out, l->nranks); return;
	case COLL_REDUCE: host_reduce_slice(t, lo, hi, root_out, 1); return;
	case COLL_REDUCE_SCATTER: {
		struct host_reduction h = { .dtype = t->dtype, .op = t->op, .nsrc = l->nranks,
					    .ndst = 1, .dst = { t->out[r] } };
		for (int k = 0; k < l->nranks; k++)
			h.src[k] = host_at(t->in[k], (uint64_t)r * c, elt);
		host_reduce(&h, c);
		return;
	}
	case COLL_ALL_GATHER:
		for (uint64_t k = 0; k < n; k++)
			host_copy(host_at(t->out[r], k * c, elt), t->in[k], c, elt);
		return;
	case COLL_BROADCAST: host_copy(t->out[r], t->in[l->root], c, elt); return;
	case COLL_SENDRECV:
		if (r == l->peer)
			host_copy(t->out[r], t->in[l->root], c, elt);
		return;
	case COLL_ALL_TO_ALL:
		for (uint64_t k = 0; k < n; k++)
			host_copy(host_at(t->out[r], k * c, elt), host_at(t->in[k], (uint64_t)r * c, elt),
				  c, elt);
		return;
	}
}

/* A timeout inside the collective names the ranks that are behind. */
static int host_name_laggards(struct coll_call *call, const _Atomic unsigned *progress,
			      unsigned want, const char *what, struct gpuq_error *err)
{
	const struct coll_spec *spec = call->spec;
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
			 "%s: %s did not %s within %.0f ms; the communicator is dropped",
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
					 "%s: rank %d and rank %d hold different communicators "
					 "(a stale communicator cache)",
					 coll_spec_name(call->spec), call->rank, r);
	return 0;
}

/* One run of the spec's primitives among the ranks' threads: barrier, this rank's shares, barrier. */
static int host_collective_once(struct coll_call *call, struct host_comm *hc,
				struct gpuq_error *err)
{
	struct coll_spec *spec = call->spec;
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
	for (int t = 0; t < spec->ntasks; t++)
		host_task_share(&spec->tasks[t], (int)r);
	atomic_store(&s->host_rank_finished[r], k);
	atomic_fetch_add(&s->host_finish, 1);
	return host_barrier(call, &s->host_finish, n * k, s->host_rank_finished, k,
			    "finish its share of the collective", err);
}

int host_coll_run(struct device *dev, void *comm, struct coll_call *call,
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
	struct coll_spec *spec = call->spec;
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
