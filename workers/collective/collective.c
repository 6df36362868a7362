/*
 * One rank's part of a collective, the same for every backend: arrive at
 * the rendezvous, agree on a communicator (the warm one, or a fresh one made
 * from an id rank 0 hands over), run the collective through the backend, and
 * on any failure make the failure shared, abort and drop this rank's
 * communicator. Worker threads only; see collective.h for who owns what.
 */
#include "workers/collective/collective.h"
#include "workers/sched/sched_wait.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workers/clock.h"

/* One cached communicator: this device's rank of the communicator over devices[]. */
struct coll_comm {
	int n;
	int devices[GPUQ_MAX_DEVICES];
	uint64_t gen;
	void *handle; /* the backend's */
	uint64_t last_use;
};

struct coll_cache {
	struct coll_comm entries[COLL_CACHE_MAX];
	int count;
	uint64_t tick;
};

/* Generations: unique to one creation of one communicator, daemon-wide. */
static _Atomic uint64_t coll_next_gen = 1;

bool coll_dtype_supported(enum coll_prim prim, enum gpuq_dtype dtype)
{
	if ((unsigned)dtype >= GPUQ_DTYPE_COUNT)
		return false;
	return dtype != GPUQ_DTYPE_BYTES || !coll_prim_reduces(prim);
}

void coll_spec_init(struct coll_spec *spec)
{
	memset(spec, 0, sizeof *spec);
	spec->inject_hang_rank = -1;
	struct coll_sync *s = &spec->sync;
	pthread_mutex_init(&s->lock, NULL);
	for (int i = 0; i < GPUQ_MAX_DEVICES; i++) {
		atomic_init(&s->rank_arrived[i], false);
		atomic_init(&s->host_rank_started[i], 0);
		atomic_init(&s->host_rank_finished[i], 0);
		atomic_init(&s->host_group[i], NULL);
	}
	atomic_init(&s->all_arrived, false);
	atomic_init(&s->id_ready, false);
	atomic_init(&s->failed, false);
	atomic_init(&s->host_arrive, 0);
	atomic_init(&s->host_finish, 0);
}

void coll_spec_destroy(struct coll_spec *spec)
{
	pthread_mutex_destroy(&spec->sync.lock);
}

const char *coll_spec_name(const struct coll_spec *spec)
{
	return spec->group ? "group" : coll_prim_name(spec->tasks[0].layout.prim);
}

void coll_format_devices(const struct coll_spec *spec, char *out, size_t size)
{
	size_t used = (size_t)snprintf(out, size, "%s over device%s ", coll_spec_name(spec),
				       spec->nranks == 1 ? "" : "s");
	for (int r = 0; r < spec->nranks && used < size; r++)
		used += (size_t)snprintf(out + used, size - used, "%s%d", r ? "," : "",
					 spec->devices[r]);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

double coll_median(double *samples, unsigned n)
{
	if (n == 0)
		return 0;
	qsort(samples, n, sizeof *samples, cmp_double);
	return n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
}

bool coll_failed(const struct coll_spec *spec)
{
	return atomic_load_explicit(&spec->sync.failed, memory_order_acquire);
}

/* Records err as the collective's cause unless another rank's came first. */
static void coll_record_failure(struct coll_spec *spec, const struct gpuq_error *err)
{
	struct coll_sync *s = &spec->sync;
	pthread_mutex_lock(&s->lock);
	if (!atomic_load(&s->failed)) {
		s->error = *err;
		atomic_store_explicit(&s->failed, true, memory_order_release);
	}
	pthread_mutex_unlock(&s->lock);
}

/* The collective's first failure, into err; returns -1. */
static int coll_shared_error(struct coll_spec *spec, struct gpuq_error *err)
{
	pthread_mutex_lock(&spec->sync.lock);
	*err = spec->sync.error;
	pthread_mutex_unlock(&spec->sync.lock);
	return -1;
}

void coll_wait_begin(struct coll_call *call, double timeout_s, const char *phase)
{
	call->wait_start = monotonic_seconds();
	call->deadline = call->wait_start + timeout_s;
	call->phase = phase;
}

int coll_poll(struct coll_call *call, struct gpuq_error *err)
{
	if (coll_failed(call->spec))
		return coll_shared_error(call->spec, err);
	if (atomic_load_explicit(&call->work->cancel, memory_order_relaxed))
		return gpuq_fail(err, GPUQ_E_CANCELLED, "%s cancelled (rank %d on device %d was "
				 "waiting for %s)", coll_spec_name(call->spec), call->rank,
				 call->dev->index, call->phase);
	double now = monotonic_seconds();
	if (now <= call->deadline)
		return 0;
	char devs[256];
	coll_format_devices(call->spec, devs, sizeof devs);
	return gpuq_fail(err, GPUQ_E_TIMEOUT,
			 "%s: rank %d (device %d) gave up after %.0f ms waiting for %s; the "
			 "communicator is dropped",
			 devs, call->rank, call->dev->index, (now - call->wait_start) * 1e3,
			 call->phase);
}

/*
 * Polls without pause for the first 10 ms of a wait, then sleeps in steps
 * that grow with the wait. A collective's parts usually meet within
 * microseconds, and the end of a collective must be seen at once: every
 * microsecond between one all-reduce's end and the next one's launch is
 * bandwidth lost, and a sleep costs at least the kernel's 50 µs timer
 * slack. So a rank polls while its collective runs, as NCCL's own threads
 * do; a long wait costs little CPU, and a deadline is still noticed within
 * a millisecond. Either way the rank's worker goes on with its other jobs
 * meanwhile (sched_pause and sched_sleep yield to the scheduler).
 */
void coll_pause(struct coll_call *call)
{
	double waited = monotonic_seconds() - call->wait_start;
	if (waited < 10e-3)
		sched_pause();
	else
		sched_sleep(waited < 100e-3 ? 100e-6 : 1e-3);
}

static int coll_rank_of(const struct coll_spec *spec, int device)
{
	for (int r = 0; r < spec->nranks; r++)
		if (spec->devices[r] == device)
			return r;
	return -1;
}

/* The cache entry for the spec's ordered device list, or NULL. */
static struct coll_comm *coll_cache_find(struct device *dev, const struct coll_spec *spec)
{
	struct coll_cache *c = dev->coll;
	for (int i = 0; c && i < c->count; i++) {
		struct coll_comm *e = &c->entries[i];
		if (e->n == spec->nranks &&
		    memcmp(e->devices, spec->devices, sizeof(int) * (size_t)e->n) == 0)
			return e;
	}
	return NULL;
}

static void coll_cache_remove(struct device *dev, struct coll_comm *e)
{
	struct coll_cache *c = dev->coll;
	*e = c->entries[--c->count];
}

/* Aborts and forgets this device's communicator for the spec's set, if it has one. */
static void coll_cache_drop(struct device *dev, const struct coll_spec *spec)
{
	struct coll_comm *e = coll_cache_find(dev, spec);
	if (!e)
		return;
	dev->ops->coll.comm_abort(dev, e->handle);
	coll_cache_remove(dev, e);
}

/*
 * Makes room for one more communicator: the cache itself on first use, and
 * the least recently used entry aborted when it is full (its set then makes a
 * fresh communicator at its next use, since its generations no longer match).
 */
static int coll_cache_reserve(struct device *dev, struct gpuq_error *err)
{
	if (!dev->coll) {
		dev->coll = calloc(1, sizeof *dev->coll);
		if (!dev->coll)
			return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
					 "[gpu %d] no host memory for the communicator cache", dev->index);
	}
	struct coll_cache *c = dev->coll;
	if (c->count < COLL_CACHE_MAX)
		return 0;
	struct coll_comm *lru = &c->entries[0];
	for (int i = 1; i < c->count; i++)
		if (c->entries[i].last_use < lru->last_use)
			lru = &c->entries[i];
	dev->ops->coll.comm_abort(dev, lru->handle);
	coll_cache_remove(dev, lru);
	return 0;
}

static struct coll_comm *coll_cache_add(struct device *dev, const struct coll_spec *spec,
					uint64_t gen, void *handle)
{
	struct coll_cache *c = dev->coll;
	struct coll_comm *e = &c->entries[c->count++];
	e->n = spec->nranks;
	memcpy(e->devices, spec->devices, sizeof(int) * (size_t)spec->nranks);
	e->gen = gen;
	e->handle = handle;
	e->last_use = ++c->tick;
	return e;
}

/* The last arrival decides, under the lock: the warm communicator, or a fresh one. */
static void coll_decide(struct coll_spec *spec)
{
	struct coll_sync *s = &spec->sync;
	bool same = s->gens[0] != 0;
	for (int r = 1; r < spec->nranks && same; r++)
		same = s->gens[r] == s->gens[0];
	s->need_new = !same;
	if (!same)
		s->new_gen = atomic_fetch_add(&coll_next_gen, 1);
	atomic_store_explicit(&s->all_arrived, true, memory_order_release);
}

/* "rank 1 (device 1), rank 3 (device 3)": the ranks marked in which. */
static void coll_format_ranks(const struct coll_spec *spec, const bool *which, char *out,
			      size_t size)
{
	size_t used = 0;
	int n = 0;
	out[0] = '\0';
	for (int r = 0; r < spec->nranks && used < size; r++)
		if (which[r])
			used += (size_t)snprintf(out + used, size - used, "%srank %d (device %d)",
						 n++ ? ", " : "", r, spec->devices[r]);
}

/* The timeout of ranks that did not arrive by the deadline, counted from submission. */
static int coll_late_error(const struct coll_spec *spec, const bool *late, const char *what,
			   struct gpuq_error *err)
{
	char devs[256], ranks[256];
	coll_format_devices(spec, devs, sizeof devs);
	coll_format_ranks(spec, late, ranks, sizeof ranks);
	return gpuq_fail(err, GPUQ_E_TIMEOUT,
			 "%s: %s did not arrive within %.0f ms of the job's submission (%s); the "
			 "communicator is dropped",
			 devs, ranks, spec->timeout_s * 1e3, what);
}

/* A timeout at the rendezvous names the ranks that never came. */
static void coll_name_missing(struct coll_call *call, struct gpuq_error *err)
{
	bool late[GPUQ_MAX_DEVICES] = { false };
	for (int r = 0; r < call->spec->nranks; r++)
		late[r] = !atomic_load(&call->spec->sync.rank_arrived[r]);
	coll_late_error(call->spec, late,
			"queued behind other jobs there, or its worker is stuck", err);
}

void coll_fail_withdrawn(struct coll_spec *spec, const bool *withdrawn, struct gpuq_error *err)
{
	coll_late_error(spec, withdrawn, "queued behind other jobs there; taken out of the queue",
			err);
	coll_record_failure(spec, err);
	coll_shared_error(spec, err);
}

/* The rendezvous: every rank says which communicator it has; the last decides. */
static int coll_arrive(struct coll_call *call, struct gpuq_error *err)
{
	struct coll_spec *spec = call->spec;
	struct coll_sync *s = &spec->sync;
	struct coll_comm *cached = coll_cache_find(call->dev, spec);
	if (coll_failed(spec))
		return coll_shared_error(spec, err); /* a late rank: the others gave up */
	pthread_mutex_lock(&s->lock);
	s->gens[call->rank] = cached ? cached->gen : 0;
	atomic_store(&s->rank_arrived[call->rank], true);
	bool last = ++s->arrived == spec->nranks;
	if (last)
		coll_decide(spec);
	pthread_mutex_unlock(&s->lock);
	if (last)
		return 0;
	call->wait_start = monotonic_seconds();
	call->deadline = spec->arrive_deadline;
	call->phase = "the other ranks to arrive";
	while (!atomic_load_explicit(&s->all_arrived, memory_order_acquire)) {
		if (coll_poll(call, err) < 0) {
			if (err->code == GPUQ_E_TIMEOUT && !coll_failed(spec))
				coll_name_missing(call, err);
			return -1;
		}
		coll_pause(call);
	}
	return 0;
}

/* Rank 0 makes the new communicator's id; the others take it from the spec. */
static int coll_handoff_id(struct coll_call *call, struct coll_id *id, struct gpuq_error *err)
{
	struct coll_sync *s = &call->spec->sync;
	if (call->rank == 0) {
		if (call->dev->ops->coll.unique_id(call->dev, &s->id, err) < 0)
			return -1;
		atomic_store_explicit(&s->id_ready, true, memory_order_release);
		*id = s->id;
		return 0;
	}
	coll_wait_begin(call, call->spec->init_timeout_s, "rank 0's communicator id");
	while (!atomic_load_explicit(&s->id_ready, memory_order_acquire)) {
		if (coll_poll(call, err) < 0)
			return -1;
		coll_pause(call);
	}
	*id = s->id;
	return 0;
}

/* The communicator the ranks agreed on: the warm one, or a fresh one made together. */
static int coll_ensure_comm(struct coll_call *call, struct coll_comm **out,
			    struct gpuq_error *err)
{
	struct coll_spec *spec = call->spec;
	struct device *dev = call->dev;
	int r = call->rank;
	if (!spec->sync.need_new) {
		*out = coll_cache_find(dev, spec);
		if (!*out)
			return gpuq_fail(err, GPUQ_E_INTERNAL,
					 "[gpu %d] %s: the warm communicator vanished", dev->index,
					 coll_spec_name(spec));
		(*out)->last_use = ++dev->coll->tick;
		spec->generation[r] = (*out)->gen;
		return 0;
	}
	coll_cache_drop(dev, spec); /* stale: its peers no longer hold the same one */
	struct coll_id id;
	void *handle = NULL;
	if (coll_cache_reserve(dev, err) < 0 || coll_handoff_id(call, &id, err) < 0)
		return -1;
	coll_wait_begin(call, spec->init_timeout_s, "the communicator's creation");
	if (dev->ops->coll.comm_init(dev, call, &id, &handle, err) < 0)
		return -1;
	*out = coll_cache_add(dev, spec, spec->sync.new_gen, handle);
	spec->created[r] = true;
	spec->generation[r] = spec->sync.new_gen;
	return 0;
}

/*
 * Fault-injection builds (GPUQ_FAULT_INJECTION, the test binary
 * tests/gpuqd-faults only): the chosen rank hangs where its collective would
 * start, until the others give up, the job is cancelled or its own deadline
 * passes, as a rank stuck in NCCL would until ncclCommAbort frees it.
 */
static int coll_inject_hang(struct coll_call *call, struct gpuq_error *err)
{
#ifdef GPUQ_FAULT_INJECTION
	if (call->spec->inject_hang_rank != call->rank)
		return 0;
	coll_wait_begin(call, call->spec->timeout_s, "its own collective (an injected hang)");
	for (;;) {
		if (coll_poll(call, err) < 0)
			return -1;
		coll_pause(call);
	}
#else
	(void)call;
	(void)err;
	return 0;
#endif
}

/* The bytes this rank's part writes: its output of every primitive. */
static uint64_t coll_rank_bytes(const struct coll_spec *spec, int rank)
{
	uint64_t bytes = 0;
	for (int t = 0; t < spec->ntasks; t++)
		bytes += coll_out_count(&spec->tasks[t].layout, rank) *
			 gpuq_dtype_size(spec->tasks[t].dtype);
	return bytes;
}

static int coll_execute(struct coll_call *call, struct coll_comm *comm, struct gpuq_error *err)
{
	struct coll_spec *spec = call->spec;
	struct device *dev = call->dev;
	double start = monotonic_seconds();
	coll_wait_begin(call, spec->timeout_s, spec->bench ? "the benchmark loop" : "the collective");
	int rc = spec->bench ? dev->ops->coll.bench(dev, comm->handle, call, err)
			     : dev->ops->coll.run(dev, comm->handle, call, err);
	spec->seconds[call->rank] = monotonic_seconds() - start;
	return rc;
}

int collective_run(struct device *dev, struct work *work)
{
	struct coll_spec *spec = work->spec;
	struct gpuq_error *err = &work->error;
	if (!dev->ops->coll.run)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "the %s backend has no collectives",
				 dev->ops->name);
	struct coll_call call = { .spec = spec, .work = work, .dev = dev };
	call.rank = spec ? coll_rank_of(spec, dev->index) : -1;
	if (call.rank < 0)
		return gpuq_fail(err, GPUQ_E_INTERNAL,
				 "[gpu %d] a collective's part reached a device that is not one of its "
				 "ranks", dev->index);
	work->result.bytes = coll_rank_bytes(spec, call.rank);
	struct coll_comm *comm = NULL;
	int rc = coll_arrive(&call, err);
	if (rc == 0)
		rc = coll_ensure_comm(&call, &comm, err);
	if (rc == 0)
		rc = coll_inject_hang(&call, err);
	if (rc == 0)
		rc = coll_execute(&call, comm, err);
	if (rc == 0)
		return 0;
	coll_record_failure(spec, err);
	coll_shared_error(spec, err); /* every part reports the first cause */
	coll_cache_drop(dev, spec);
	return -1;
}

void collective_device_close(struct device *dev)
{
	struct coll_cache *c = dev->coll;
	if (!c)
		return;
	while (c->count > 0) {
		struct coll_comm *oldest = &c->entries[0];
		for (int i = 1; i < c->count; i++)
			if (c->entries[i].gen < oldest->gen)
				oldest = &c->entries[i];
		if (dev->faulted)
			dev->ops->coll.comm_abort(dev, oldest->handle);
		else
			dev->ops->coll.comm_destroy(dev, oldest->handle);
		coll_cache_remove(dev, oldest);
	}
	free(c);
	dev->coll = NULL;
}
