/*
 * The durable state record kept up to date (durable.h): a snapshot of the
 * tables, encoded and written as the record's next generation by a
 * uv_prepare handle whenever something changed since the last write.
 * Main thread only; it reads the buffer, region, lease and job tables and
 * calls nothing above them.
 */
#include "daemon/durable.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "daemon/fd_store.h"
#include "daemon/lease.h"
#include "workers/log.h"
#include "daemon/state_record.h"

/* A buffer range some unfinished job writes: where (device, base) is the buffer's identity. */
struct written {
	int device;
	const void *base;
};

static int written_cmp(const void *a, const void *b)
{
	const struct written *x = a, *y = b;
	if (x->device != y->device)
		return x->device < y->device ? -1 : 1;
	return x->base < y->base ? -1 : x->base > y->base;
}

/*
 * Every write access of every job queued or running (from submission to
 * end: a superset of the time it runs, so a buffer is never written
 * unflagged), sorted. NULL with *n 0 when there are none.
 */
static struct written *durable_collect_writes(struct daemon *d, size_t *n)
{
	struct written *w = NULL;
	size_t cap = 0;
	unsigned seen = 0; /* the unfinished jobs are the newest, mostly: stop once all are seen */
	*n = 0;
	for (struct job *job = d->jobs.newest; job && seen < d->jobs.active; job = job->older) {
		if (job->state != GPUQ_JOB_QUEUED && job->state != GPUQ_JOB_RUNNING)
			continue;
		seen++;
		if (job->held) /* a restart holds it for the next image: it writes nothing here */
			continue;
		for (int i = 0; i < job_nworks(job); i++) {
			const struct work *wk = job_work(job, i);
			for (unsigned k = 0; k < wk->naccess; k++) {
				if (!wk->access[k].write)
					continue;
				if (*n == cap) {
					cap = cap ? cap * 2 : 64;
					struct written *grown = realloc(w, cap * sizeof *w);
					if (!grown)
						return w; /* fewer flags rather than none; the next write retries */
					w = grown;
				}
				w[(*n)++] = (struct written){ wk->device, wk->access[k].base };
			}
		}
	}
	if (*n)
		qsort(w, *n, sizeof *w, written_cmp);
	return w;
}

/* How many of the sorted writes are to buffer b. */
static unsigned durable_writers_of(const struct buffer *b, const struct written *w, size_t n)
{
	struct written key = { b->device, b->dptr };
	unsigned count = 0;
	if (!b->dptr || n == 0) /* bsearch is not given the NULL of no writes */
		return 0;
	const struct written *hit = bsearch(&key, w, n, sizeof *w, written_cmp);
	if (!hit)
		return 0;
	while (hit > w && written_cmp(hit - 1, &key) == 0)
		hit--;
	for (; hit < w + n && written_cmp(hit, &key) == 0; hit++)
		count++;
	return count;
}

/* A buffer's shape as "2,3,4" (empty when none was given). */
static void durable_copy_shape(const struct buffer_shape *s, char *out, size_t n)
{
	size_t used = 0;
	out[0] = '\0';
	for (unsigned i = 0; s->given && i < s->ndim && used < n; i++)
		used += (size_t)snprintf(out + used, n - used, "%s%llu", i ? "," : "",
					 (unsigned long long)s->dim[i]);
}

static void durable_copy_buffer(struct daemon *d, const struct buffer *b, const struct written *w,
				size_t n, struct state_buffer *out)
{
	memset(out, 0, sizeof *out);
	snprintf(out->uuid, sizeof out->uuid, "%s", absent_uuid_of(&d->absent, b->device));
	snprintf(out->name, sizeof out->name, "%s", b->name);
	snprintf(out->state, sizeof out->state, "%s", b->suspect ? "suspect" : buffer_state_name(b->state));
	out->owner = (uint32_t)b->owner;
	out->device = b->device;
	out->dtype = b->dtype;
	out->count = b->count;
	out->bytes = b->bytes;
	out->slab = b->slab;
	out->slab_offset = b->slab_offset;
	out->slab_bytes = b->slab_bytes;
	out->slab_fd = b->slab ? b->slab_fd : -1;
	out->shareable = b->shareable;
	out->ephemeral = b->conn_serial != 0;
	out->conn_serial = b->conn_serial;
	if (b->suspect)
		snprintf(out->suspect, sizeof out->suspect, "%s", b->suspect);
	if (b->state == BUFFER_LOST && b->lost_why)
		snprintf(out->lost, sizeof out->lost, "%s", b->lost_why);
	durable_copy_shape(&b->shape, out->shape, sizeof out->shape);
	out->writers = durable_writers_of(b, w, n);
}

static int durable_copy_buffers(struct daemon *d, struct state_snapshot *s)
{
	size_t n = 0;
	struct written *w = durable_collect_writes(d, &n);
	s->buffers = calloc(d->buffers.count ? d->buffers.count : 1, sizeof *s->buffers);
	if (!s->buffers) {
		free(w);
		return -1;
	}
	for (struct buffer *b = d->buffers.head; b && s->nbuffers < d->buffers.count; b = b->next)
		durable_copy_buffer(d, b, w, n, &s->buffers[s->nbuffers++]);
	free(w);
	return 0;
}

static int durable_copy_regions(struct daemon *d, struct state_snapshot *s)
{
	s->regions = calloc(d->regions.count ? d->regions.count : 1, sizeof *s->regions);
	if (!s->regions)
		return -1;
	for (struct region *r = d->regions.head; r && s->nregions < d->regions.count; r = r->next) {
		struct state_region *out = &s->regions[s->nregions++];
		snprintf(out->name, sizeof out->name, "%s", r->name);
		out->owner = (uint32_t)r->owner;
		out->device = r->device;
		snprintf(out->uuid, sizeof out->uuid, "%s", absent_uuid_of(&d->absent, r->device));
		out->bytes = r->bytes;
		out->fd = r->fd;
		out->ephemeral = r->conn_serial != 0;
		out->conn_serial = r->conn_serial;
		out->created_ms = (uint64_t)(r->created * 1e3);
	}
	return 0;
}

/* Granted leases: what clients map now (a waiting one is an attach job still queued). */
static int durable_copy_leases(struct daemon *d, struct state_snapshot *s)
{
	s->leases = calloc(d->leases.count ? d->leases.count : 1, sizeof *s->leases);
	if (!s->leases)
		return -1;
	for (struct lease *l = d->leases.head; l && s->nleases < d->leases.count; l = l->next) {
		if (l->state != LEASE_HELD || !l->buffer)
			continue;
		struct state_lease *out = &s->leases[s->nleases++];
		out->id = l->id;
		snprintf(out->buffer, sizeof out->buffer, "%s", l->buffer->name);
		out->buffer_owner = (uint32_t)l->buffer->owner;
		out->device = l->buffer->device;
		snprintf(out->uuid, sizeof out->uuid, "%s", absent_uuid_of(&d->absent, out->device));
		out->uid = (uint32_t)l->uid;
		out->pid = (int32_t)l->pid;
		out->write = l->write;
		out->conn_serial = l->conn_serial;
		out->since_ms = (uint64_t)(l->since * 1e3);
		out->revocable = l->lock_fd >= 0;
		out->lock_fd = l->lock_fd;
	}
	return 0;
}

/* The quota entry of uid in s, added if new; NULL when full (cannot happen: sized to every owner). */
static struct state_quota *durable_quota_of(struct state_snapshot *s, size_t cap, uint32_t uid)
{
	for (size_t i = 0; i < s->nquotas; i++)
		if (s->quotas[i].uid == uid)
			return &s->quotas[i];
	if (s->nquotas == cap)
		return NULL;
	s->quotas[s->nquotas] = (struct state_quota){ .uid = uid };
	return &s->quotas[s->nquotas++];
}

/* Each owner's bytes in buffers and regions: the quota usage that outlives connections. */
static int durable_copy_quota(struct state_snapshot *s)
{
	size_t cap = s->nbuffers + s->nregions;
	s->quotas = calloc(cap ? cap : 1, sizeof *s->quotas);
	if (!s->quotas)
		return -1;
	for (size_t i = 0; i < s->nbuffers; i++) {
		struct state_quota *q = durable_quota_of(s, cap, s->buffers[i].owner);
		if (q)
			q->buffer_bytes += s->buffers[i].bytes;
	}
	for (size_t i = 0; i < s->nregions; i++) {
		struct state_quota *q = durable_quota_of(s, cap, s->regions[i].owner);
		if (q)
			q->region_bytes += s->regions[i].bytes;
	}
	return 0;
}

int durable_snapshot(struct daemon *d, struct state_snapshot *s)
{
	memset(s, 0, sizeof *s);
	snprintf(s->backend, sizeof s->backend, "%s", d->ops ? d->ops->name : "");
	s->devices = d->pool.count;
	s->recoveries = d->recover.recoveries;
	s->job_ids_below = d->durable.ids_reserved;
	s->stopped = d->durable.stopped;
	if (durable_copy_buffers(d, s) != 0 || durable_copy_regions(d, s) != 0 ||
	    durable_copy_leases(d, s) != 0 || durable_copy_quota(s) != 0 ||
	    absent_copy(&d->absent, &s->absent, &s->nabsent) != 0) {
		state_snapshot_free(s);
		return -1;
	}
	return 0;
}

/* Writes the tables as the next generation; a failure is logged and retried at the next change. */
static int durable_write(struct daemon *d)
{
	static struct log_every every;
	struct durable *du = &d->durable;
	struct state_snapshot s;
	struct gpuq_error err;
	msgpack_sbuffer sb;
	unsigned held;
	du->dirty = false;
	if (durable_snapshot(d, &s) != 0) {
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "no memory to copy the tables");
	} else {
		msgpack_sbuffer_init(&sb);
		state_snapshot_encode(&s, &sb);
		state_snapshot_free(&s);
		int rc = state_record_write(du->record, sb.data, sb.size, &err);
		msgpack_sbuffer_destroy(&sb);
		if (rc == 0)
			return 0;
	}
	du->failures++;
	du->dirty = true;
	if (log_every_pass(&every, 10, &held))
		log_error("the durable state record was not updated: %s (%u more such failures)",
			  err.message, held);
	return -1;
}

/* Whether a work of job writes a buffer range. */
static bool durable_job_writes(struct job *job)
{
	for (int i = 0; i < job_nworks(job); i++) {
		const struct work *w = job_work(job, i);
		for (unsigned k = 0; k < w->naccess; k++)
			if (w->access[k].write)
				return true;
	}
	return false;
}

/* Whether job's start or end changes what the record says (a noop's does not). */
static bool durable_job_matters(struct job *job)
{
	return job->buffer || job->buffer2 || job->region || job->lease || durable_job_writes(job);
}

/*
 * Job ids are given out in blocks that the record names before any id of
 * the block reaches a client, so a gpuqd that comes back after dying goes
 * on above every id the dead one gave out (recover.c) and a client's old
 * job id never names a new job. A block costs one extra write.
 */
#define DURABLE_JOB_ID_BLOCK (1u << 20)

static void durable_reserve_job_ids(struct daemon *d)
{
	struct durable *du = &d->durable;
	if (!du->record || d->jobs.next_id <= du->ids_reserved)
		return;
	du->ids_reserved = d->jobs.next_id + DURABLE_JOB_ID_BLOCK;
	durable_write(d);
}

void durable_job_submitting(struct daemon *d, struct job *job)
{
	durable_reserve_job_ids(d);
	if (!durable_job_matters(job))
		return;
	durable_touch(d);
	if (durable_job_writes(job) && d->durable.record)
		durable_write(d); /* now: its worker may start it before the loop turns */
}

void durable_job_ended(struct daemon *d, struct job *job)
{
	if (durable_job_matters(job))
		durable_touch(d);
}

static void durable_on_prepare(uv_prepare_t *h)
{
	struct daemon *d = h->data;
	if (d->durable.dirty && d->durable.record)
		durable_write(d);
}

/*
 * The record handed to the service manager's store, once for the service's
 * life: a record taken over from it (or from an image that stored it) is
 * there already. A new one replaces whatever of that name it held.
 */
static void durable_store(struct daemon *d, bool held)
{
	if (held || !fd_store_enabled(&d->fd_store))
		return;
	fd_store_remove(&d->fd_store, FD_STORE_RECORD);
	fd_store_add(&d->fd_store, FD_STORE_RECORD, state_record_fd(d->durable.record));
}

void durable_start(struct daemon *d, struct state_record *adopted, bool held)
{
	struct durable *du = &d->durable;
	struct gpuq_error err;
	du->record = adopted ? adopted : state_record_create(&err);
	if (!du->record) {
		log_error("no durable state record: %s; gpuqd serves without one", err.message);
		return;
	}
	if (uv_prepare_init(d->loop, &du->flush) != 0) {
		log_error("no durable state record: its loop handle cannot be made");
		state_record_close(du->record);
		du->record = NULL;
		return;
	}
	du->flush.data = d;
	uv_prepare_start(&du->flush, durable_on_prepare);
	du->started = true;
	du->ids_reserved = d->jobs.next_id + DURABLE_JOB_ID_BLOCK;
	durable_write(d); /* the state at start: no buffers yet, or those taken over */
	durable_store(d, adopted && held);
}

int durable_flush(struct daemon *d)
{
	if (!d->durable.record)
		return -1;
	return durable_write(d);
}

int durable_record_fd(const struct daemon *d)
{
	return d->durable.record ? state_record_fd(d->durable.record) : -1;
}

void durable_touch(struct daemon *d)
{
	d->durable.dirty = true;
}

void durable_close(struct daemon *d)
{
	struct durable *du = &d->durable;
	if (!du->started)
		return;
	du->stopped = true; /* so that the next start from the store says gpuqd stopped, not died */
	if (du->record)
		durable_write(d);
	uv_close((uv_handle_t *)&du->flush, NULL);
	du->started = false;
}

void durable_free(struct daemon *d)
{
	state_record_close(d->durable.record);
	d->durable.record = NULL;
}
