/*
 * Taking over what the previous gpuqd image left (recover.h). Main thread
 * only, at start-up: recover_begin before the workers start, recover_buffers
 * once they have opened, recover_conns once gpuqd serves.
 */
#include "daemon/recover.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "daemon/fd_store.h"
#include "daemon/listen_fds.h"
#include "workers/log.h"
#include "daemon/recover_regions.h"
#include "daemon/replay.h"
#include "daemon/state_record.h"
#include "workers/buffer/slab.h"

static int recover_add_conn(struct recover *r, int fd, uint64_t serial)
{
	struct recover_conn *grown = realloc(r->conns, (r->nconns + 1) * sizeof *grown);
	if (!grown)
		return -1;
	r->conns = grown;
	r->conns[r->nconns++] = (struct recover_conn){ fd, serial };
	return 0;
}

/* One `kind:a[:b]` item of GPUQ_INHERIT; -1 when malformed. */
static int recover_parse_item(struct recover *r, const char *item)
{
	long long a = -1, b = 0;
	char kind[16];
	int n = sscanf(item, "%15[a-z]:%lld:%lld", kind, &a, &b);
	if (n < 2 || a < 0)
		return -1;
	if (strcmp(kind, "record") == 0)
		r->record_fd = (int)a;
	else if (strcmp(kind, "listen") == 0) {
		r->listen_fd = (int)a;
		r->listen_adopted = n == 3 && b == 1;
	} else if (strcmp(kind, "restarts") == 0)
		r->restarts = (unsigned)a;
	else if (strcmp(kind, "jobs") == 0)
		r->next_job = (uint64_t)a;
	else if (strcmp(kind, "fault") == 0 && r->nfault < sizeof r->fault_ms / sizeof r->fault_ms[0])
		r->fault_ms[r->nfault++] = (uint64_t)a;
	else if (strcmp(kind, "queue") == 0)
		r->queue_fd = (int)a;
	else if (strcmp(kind, "stored") == 0)
		r->stored = a == 1;
	else if (strcmp(kind, "conn") == 0 && n == 3)
		return recover_add_conn(r, (int)a, (uint64_t)b);
	else
		return -1;
	return 0;
}

static int recover_parse(struct recover *r, const char *env)
{
	char *copy = strdup(env), *save = NULL;
	int rc = copy ? 0 : -1;
	for (char *item = copy ? strtok_r(copy, ",", &save) : NULL; item && rc == 0;
	     item = strtok_r(NULL, ",", &save))
		rc = recover_parse_item(r, item);
	free(copy);
	return rc;
}

/* The record in fd, decoded into a new snapshot: NULL with err. */
static struct state_snapshot *recover_read(int fd, uint64_t *generation, struct gpuq_error *err)
{
	void *payload = NULL;
	size_t len = 0;
	int rc = state_record_read(fd, &payload, &len, generation, err);
	if (rc == 1)
		gpuq_fail(err, GPUQ_E_IO, "the record was never written");
	if (rc != 0)
		return NULL;
	struct state_snapshot *s = calloc(1, sizeof *s);
	if (!s || state_snapshot_decode(payload, len, s, err) != 0) {
		if (!s)
			gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no memory to read the record");
		free(s);
		s = NULL;
	}
	free(payload);
	return s;
}

int recover_check_record(int fd)
{
	struct gpuq_error err;
	uint64_t generation = 0;
	struct state_snapshot *s = recover_read(fd, &generation, &err);
	if (!s) {
		fprintf(stderr, "gpuqd: cannot take over the record in descriptor %d: %s\n", fd,
			err.message);
		return RECOVER_EXIT_REFUSED;
	}
	printf("record version %u readable: generation %llu, backend %s, %d devices, %zu buffers, "
	       "%zu regions, %zu leases, %zu buffers kept for GPUs not served\n",
	       STATE_RECORD_VERSION, (unsigned long long)generation, s->backend, s->devices,
	       s->nbuffers, s->nregions, s->nleases, s->nabsent);
	state_snapshot_free(s);
	free(s);
	return 0;
}

/*
 * Whether plan entry a is the slab the record's buffer b lies in: the same
 * GPU (by uuid; by index in a record without uuids) and slab id.
 */
static bool recover_same_slab(const struct device_adopt *a, const struct state_buffer *b)
{
	if (a->slab != b->slab || strcmp(a->uuid, b->uuid) != 0)
		return false;
	return b->uuid[0] || a->device == b->device;
}

/* The plan entry of b's slab, added if new: NULL when out of memory. */
static struct device_adopt *recover_slab(struct recover *r, const struct state_buffer *b)
{
	struct device_adopt_list *l = &r->adopt;
	for (size_t i = 0; i < l->n; i++)
		if (recover_same_slab(&l->slabs[i], b))
			return &l->slabs[i];
	struct device_adopt *grown = realloc(l->slabs, (l->n + 1) * sizeof *grown);
	if (!grown)
		return NULL;
	l->slabs = grown;
	struct device_adopt *a = &l->slabs[l->n++];
	*a = (struct device_adopt){ .device = b->device, .slab = b->slab, .fd = b->slab_fd,
				    .bytes = b->slab_bytes };
	snprintf(a->uuid, sizeof a->uuid, "%s", b->uuid);
	/*
	 * Through a re-exec under the store, the slab is there under the name
	 * the previous image gave it: its uuid's, or its index's in a record of
	 * a gpuqd before uuids (the worker then stores it under its own).
	 */
	if (r->stored && !b->uuid[0])
		fd_store_slab_name_of_index(b->device, b->slab, a->held_as, sizeof a->held_as);
	return a;
}

/* Whether the record's buffer b names memory this image can take over. */
static bool recover_has_slab(const struct state_buffer *b, int devices)
{
	bool located = b->uuid[0] || (b->device >= 0 && b->device < devices);
	return b->slab != 0 && b->slab_bytes != 0 && b->slab_fd >= 0 && located &&
	       strcmp(b->state, "lost") != 0;
}

static int recover_plan_buffer(struct recover *r, const struct state_buffer *b)
{
	if (!recover_has_slab(b, r->snap->devices))
		return 0;
	struct device_adopt *a = recover_slab(r, b);
	if (!a)
		return -1;
	struct slab_range *grown = realloc(a->ranges, (a->nranges + 1) * sizeof *grown);
	if (!grown)
		return -1;
	a->ranges = grown;
	a->ranges[a->nranges++] = (struct slab_range){ b->slab_offset, b->bytes };
	a->exported = a->exported || b->shareable;
	return 0;
}

/* Every slab the record's buffers lie in, those of GPUs its writer did not serve too. */
static int recover_plan(struct recover *r)
{
	const struct state_snapshot *s = r->snap;
	for (size_t i = 0; i < s->nbuffers; i++)
		if (recover_plan_buffer(r, &s->buffers[i]) != 0)
			return -1;
	for (size_t i = 0; i < s->nabsent; i++)
		if (recover_plan_buffer(r, &s->absent[i]) != 0)
			return -1;
	return 0;
}

static struct device_adopt *recover_find(const struct recover *r, const struct state_buffer *b);

/* The event recovered from, for the log: a re-exec, a death or a stop under the descriptor store. */
static const char *recover_event(const struct recover *r)
{
	if (!r->from_store)
		return "in the re-exec";
	return r->after_stop ? "after gpuqd stopped" : "after gpuqd died";
}

/*
 * Whether the store's slab p is plan entry a's: stored under its GPU's
 * uuid, or (legacy) under its index in the record, as gpuqd before uuids
 * named slabs.
 */
static bool recover_passed_is(const struct listen_slab *p, const struct device_adopt *a,
			      bool legacy)
{
	char index[16];
	if (p->fd < 0 || p->id != a->slab)
		return false;
	if (!legacy)
		return a->uuid[0] && strcmp(p->owner, a->uuid) == 0;
	snprintf(index, sizeof index, "%d", a->device);
	return a->device >= 0 && strcmp(p->owner, index) == 0;
}

/* The store's descriptor of a's slab, taken from passed: -1 when it has none. */
static int recover_take_passed(struct listen_fds *passed, struct device_adopt *a)
{
	for (int legacy = 0; legacy < 2; legacy++)
		for (size_t k = 0; k < passed->nslabs; k++) {
			struct listen_slab *p = &passed->slabs[k];
			if (!recover_passed_is(p, a, legacy))
				continue;
			fd_store_slab_name(p->owner, p->id, a->held_as, sizeof a->held_as);
			int fd = p->fd;
			p->fd = -1;
			return fd;
		}
	return -1;
}

/*
 * The store's case: each planned slab's descriptor is the store's of that
 * GPU and id, not the number the record names (the dead process's). A slab
 * the store lacks is planned with no descriptor: its buffers are lost.
 */
static void recover_plan_from_store(struct recover *r, struct listen_fds *passed)
{
	for (size_t i = 0; i < r->adopt.n; i++) {
		struct device_adopt *a = &r->adopt.slabs[i];
		a->held_as[0] = '\0';
		a->fd = recover_take_passed(passed, a);
		if (a->fd >= 0)
			continue;
		char name[FD_STORE_NAME_MAX];
		if (a->uuid[0])
			fd_store_slab_name(a->uuid, a->slab, name, sizeof name);
		else
			fd_store_slab_name_of_index(a->device, a->slab, name, sizeof name);
		snprintf(a->why, sizeof a->why, "the service manager's store does not hold its slab (%s)",
			 name);
	}
}

/* Whether a plan entry took the store's slab of this name. */
static bool recover_plan_took(const struct recover *r, const char *name)
{
	for (size_t i = 0; i < r->adopt.n; i++)
		if (strcmp(r->adopt.slabs[i].held_as, name) == 0)
			return true;
	return false;
}

/*
 * Stored slabs that no buffer of the record names (freed buffers' slabs
 * whose removal was lost with the process, kept empty slabs, another
 * backend's) leave the store and are closed: they only hold memory.
 */
static void recover_drop_unnamed(struct daemon *d)
{
	struct listen_fds *passed = &d->passed;
	char name[FD_STORE_NAME_MAX];
	unsigned dropped = 0;
	for (size_t i = 0; i < passed->nslabs; i++) {
		struct listen_slab *p = &passed->slabs[i];
		if (p->fd < 0)
			continue;
		fd_store_slab_name(p->owner, p->id, name, sizeof name);
		if (recover_plan_took(&d->recover, name)) {
			/*
			 * A second descriptor of a name the plan took (the heap never
			 * stores two; a store that kept one anyway): FDSTOREREMOVE
			 * would drop the one taken over too, so it is only closed.
			 */
			log_warn("the service manager's store passed '%s' twice; the first is taken over, "
				 "the other closed", name);
			close(p->fd);
			p->fd = -1;
			continue;
		}
		fd_store_remove(&d->fd_store, name);
		close(p->fd);
		p->fd = -1;
		dropped++;
	}
	if (dropped)
		log_info("%u slabs in the service manager's store held no buffer of the record: "
			 "removed from it", dropped);
}

/* Where the record comes from: GPUQ_INHERIT (a re-exec), or the store (gpuqd died). */
static void recover_find_record(struct daemon *d)
{
	struct recover *r = &d->recover;
	const char *env = getenv(RECOVER_ENV);
	if (env) {
		r->active = true;
		if (recover_parse(r, env) != 0)
			log_error("%s is malformed ('%s'); taking over what it names as far as it can be read",
				  RECOVER_ENV, env);
		unsetenv(RECOVER_ENV);
		if (r->next_job > d->jobs.next_id)
			d->jobs.next_id = r->next_job; /* job ids are never reused while gpuqd lives, across re-execs too */
	} else if (d->passed.record_fd >= 0) {
		r->active = r->from_store = r->stored = true;
		r->record_fd = d->passed.record_fd;
		d->passed.record_fd = -1;
	}
}

/* Reads the record and takes its memfd over (durable_start writes on in it): the snapshot, or NULL. */
static void recover_take_record(struct recover *r)
{
	struct gpuq_error err;
	uint64_t generation = 0;
	int fd = r->record_fd;
	r->record_fd = -1;
	r->snap = recover_read(fd, &generation, &err);
	if (!r->snap) {
		log_error("%s, but the state record cannot be read: %s; serving without the buffers it "
			  "named", r->from_store ? "gpuqd died" : "re-executed", err.message);
		close(fd);
		return;
	}
	r->recoveries = r->snap->recoveries + r->from_store;
	r->after_stop = r->from_store && r->snap->stopped;
	r->record = state_record_adopt(fd, &err);
	if (!r->record)
		log_error("the state record cannot be written on (%s); gpuqd writes a new one",
			  err.message);
	if (r->from_store)
		log_info("%s; the service manager's store holds record generation %llu: "
			 "%zu buffers", r->after_stop ? "gpuqd stopped" : "gpuqd died",
			 (unsigned long long)generation, r->snap->nbuffers);
	else
		log_info("re-exec %u: record generation %llu names %zu buffers", r->restarts,
			 (unsigned long long)generation, r->snap->nbuffers);
}

void recover_begin(struct daemon *d)
{
	struct recover *r = &d->recover;
	r->record_fd = r->listen_fd = r->queue_fd = -1;
	recover_find_record(d);
	if (r->record_fd >= 0)
		recover_take_record(r);
	/* After a death, ids go on above every one the dead gpuqd gave out (durable.c's blocks). */
	if (r->snap && r->from_store)
		job_table_skip_ids(&d->jobs, r->snap->job_ids_below);
	if (r->snap && strcmp(r->snap->backend, d->ops->name) != 0) {
		log_error("%s with the %s backend, but the record is the %s backend's; its buffers are "
			  "not taken over", r->from_store ? "restarted" : "re-executed", d->ops->name,
			  r->snap->backend);
	} else if (r->snap) {
		if (recover_plan(r) != 0)
			log_error("no memory to plan taking the slabs over; those left out are lost");
		if (r->from_store)
			recover_plan_from_store(r, &d->passed);
		else /* a region's memfd comes through an execve, never through a death */
			recover_regions_plan(r);
		d->opt.device.adopt = &r->adopt;
		log_info("taking over %zu slabs %s", r->adopt.n, recover_event(r));
	}
	recover_drop_unnamed(d);
}

/* The plan entry of the slab the record's buffer b lies in: NULL when none was planned. */
static struct device_adopt *recover_find(const struct recover *r, const struct state_buffer *b)
{
	for (size_t i = 0; i < r->adopt.n; i++)
		if (recover_same_slab(&r->adopt.slabs[i], b))
			return &r->adopt.slabs[i];
	return NULL;
}

/* Why rb's memory could not be taken over, its plan entry being a (NULL: none). */
static const char *recover_lost_cause(const struct device_adopt *a, const struct state_buffer *rb)
{
	if (strcmp(rb->state, "allocating") == 0)
		return "its alloc had not finished: it never held data";
	if (a)
		return a->why[0] ? a->why : "its device did not open, or is not among this gpuqd's devices";
	return rb->slab == 0 ? "its memory was in the memory pool, which no restart takes over"
			     : "its slab was not handed over";
}

/* Where b's memory now lies, the buffer its record names being rb: READY (perhaps suspect) or LOST. */
static void recover_place(struct recover *r, struct buffer *b, const struct state_buffer *rb)
{
	const struct device_adopt *a = recover_find(r, rb);
	char why[200];
	b->state = BUFFER_LOST;
	if (strcmp(rb->state, "lost") == 0) {
		/*
		 * Lost before (a device reset, an earlier re-exec): a slab of its id
		 * now is another buffer's, made since (a reset's new heap numbers
		 * its slabs from 1 again), and must not become a view of it.
		 */
		b->lost_why = rb->lost[0] ? strdup(rb->lost) : NULL;
		return;
	}
	if (!a || !a->base) {
		const char *cause = recover_lost_cause(a, rb);
		log_error("buffer '%s@%d' is lost %s: %s", rb->name, b->device, recover_event(r), cause);
		if (asprintf(&b->lost_why, "%s (%s)", recover_event(r), cause) < 0)
			b->lost_why = NULL; /* the words for an unknown cause then: still lost, still refused */
		return;
	}
	b->state = BUFFER_READY;
	b->dptr = (char *)a->base + rb->slab_offset;
	b->slab = rb->slab;
	b->slab_offset = rb->slab_offset;
	b->slab_bytes = rb->slab_bytes;
	b->slab_fd = a->fd; /* the heap's now */
	if (rb->shareable && (b->share_fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0)) < 0)
		log_error("buffer '%s@%d': its descriptor for clients cannot be made again: %s",
			  rb->name, b->device, strerror(errno));
	const char *suspect = state_buffer_suspect(rb, why, sizeof why);
	if (!suspect && strcmp(rb->state, "suspect") == 0)
		suspect = rb->suspect[0] ? rb->suspect
					 : "it was suspect before the re-exec, and nothing has written it whole since";
	if (suspect)
		b->suspect = strdup(suspect);
}

/* The shape the record spells "2,3,4"; none when empty or malformed. */
static void recover_shape(struct buffer_shape *s, const char *text)
{
	char *end;
	memset(s, 0, sizeof *s);
	for (const char *p = text; *p && s->ndim < BUFFER_SHAPE_MAX; p = *end ? end + 1 : end) {
		s->dim[s->ndim++] = strtoull(p, &end, 10);
		if (end == p || (*end && *end != ','))
			return (void)memset(s, 0, sizeof *s);
	}
	s->given = s->ndim > 0;
}

/*
 * The record's buffer rb, whose GPU this gpuqd does not serve: kept
 * absent (daemon/absent.h), its slab's descriptor with it, unless it was
 * ephemeral (its connection cannot come back to it).
 */
static void recover_absent(struct daemon *d, const struct state_buffer *rb)
{
	/* A lost one holds no memory: a slab of its id now is another buffer's (recover_place). */
	struct device_adopt *a = strcmp(rb->state, "lost") != 0 ? recover_find(&d->recover, rb) : NULL;
	int fd = a && !a->taken ? a->fd : -1;
	if (rb->ephemeral) {
		log_info("ephemeral buffer '%s' of uid %u on GPU %s, which this gpuqd does not serve, "
			 "is freed", rb->name, rb->owner, rb->uuid);
		return;
	}
	if (absent_add(&d->absent, rb, fd) != 0) {
		log_error("buffer '%s' of uid %u on GPU %s is lost: no memory to keep it", rb->name,
			  rb->owner, rb->uuid);
		return;
	}
	if (a && fd >= 0)
		a->fd = -1; /* the absent table's now */
}

static void recover_buffer(struct daemon *d, const struct state_buffer *rb)
{
	int device = absent_device_now(&d->absent, rb->uuid, rb->device);
	if (device < 0) {
		recover_absent(d, rb);
		return;
	}
	if (device != rb->device)
		d->recover.moved++;
	struct buffer *b = buffer_add(&d->buffers, rb->name, device, (uid_t)rb->owner,
				      rb->dtype, rb->count, rb->bytes);
	if (!b) {
		log_error("buffer '%s@%d' is lost %s: no memory to list it", rb->name, device,
			  recover_event(&d->recover));
		return;
	}
	b->shareable = rb->shareable;
	recover_shape(&b->shape, rb->shape);
	recover_place(&d->recover, b, rb);
	if (rb->ephemeral) {
		b->conn_serial = rb->conn_serial ? rb->conn_serial : UINT64_MAX;
		b->orphaned = true; /* until its connection is taken over (recover_conns) */
	}
}

/* What the record's GPUs are now: moved to other indexes, or absent. */
static void recover_log_devices(struct daemon *d)
{
	struct absent_gpu gpus[GPUQ_MAX_DEVICES];
	size_t n = absent_by_gpu(&d->absent, gpus, GPUQ_MAX_DEVICES);
	if (d->recover.moved)
		log_warn("%u buffers are on other device indexes than before %s: their GPUs are served "
			 "under other indexes now (--devices or the GPUs changed); each follows its GPU",
			 d->recover.moved, recover_event(&d->recover));
	for (size_t i = 0; i < n; i++)
		log_warn("%u buffers (%llu bytes) on GPU %s are kept for a gpuqd that serves it: this "
			 "one does not (not in --devices, gone, or it did not open)", gpus[i].buffers,
			 (unsigned long long)gpus[i].bytes, gpus[i].uuid);
}

/* The descriptors no worker took (their device did not open), and the plan, go. */
static void recover_free_plan(struct recover *r)
{
	for (size_t i = 0; i < r->adopt.n; i++) {
		if (!r->adopt.slabs[i].taken && r->adopt.slabs[i].fd >= 0)
			close(r->adopt.slabs[i].fd);
		free(r->adopt.slabs[i].ranges);
	}
	free(r->adopt.slabs);
	r->adopt = (struct device_adopt_list){ 0 };
}

void recover_buffers(struct daemon *d)
{
	struct recover *r = &d->recover;
	unsigned ready = 0, suspect = 0, lost = 0;
	d->opt.device.adopt = NULL;
	if (!r->snap)
		return;
	for (size_t i = r->snap->nabsent; i-- > 0;) /* of GPUs the previous image did not serve */
		recover_buffer(d, &r->snap->absent[i]);
	for (size_t i = r->snap->nbuffers; i-- > 0;) /* the table lists the newest first, as before */
		recover_buffer(d, &r->snap->buffers[i]);
	recover_log_devices(d);
	for (struct buffer *b = d->buffers.head; b; b = b->next) {
		ready += b->state == BUFFER_READY;
		suspect += b->suspect != NULL;
		lost += b->state == BUFFER_LOST;
	}
	r->suspect = suspect;
	r->lost = lost;
	if (r->from_store) {
		log_info("recovered %u buffers (%u suspect, %u lost) from the service manager's "
			 "descriptor store; %zu regions and %zu leases ended with the process that %s",
			 ready, suspect, lost, r->snap->nregions, r->snap->nleases,
			 r->after_stop ? "stopped" : "died");
	} else {
		log_info("re-exec %u: %u buffers taken over (%u of them suspect), %u lost", r->restarts,
			 ready, suspect, lost);
		recover_regions(d);
		recover_leases(d);
	}
	if (r->stored) { /* the slabs taken over, those kept absent and the record are in the store already */
		unsigned held = 1 + absent_slabs(&d->absent);
		for (size_t i = 0; i < r->adopt.n; i++)
			held += r->adopt.slabs[i].base != NULL;
		fd_store_count_held(&d->fd_store, held);
	} else if (fd_store_enabled(&d->fd_store)) { /* as the heaps hold the slabs they adopted */
		absent_store(&d->absent, &d->fd_store);
	}
	recover_free_plan(r);
	state_snapshot_free(r->snap);
	free(r->snap);
	r->snap = NULL;
	durable_touch(d);
}

void recover_jobs(struct daemon *d)
{
	char what[32];
	snprintf(what, sizeof what, "re-exec %u", d->recover.restarts);
	replay_run(d, d->recover.queue_fd, what);
	d->recover.queue_fd = -1;
}

void recover_conns(struct daemon *d)
{
	struct recover *r = &d->recover;
	for (size_t i = 0; i < r->nconns; i++) {
		conn_adopt(&d->server, r->conns[i].fd, r->conns[i].serial);
		for (struct buffer *b = d->buffers.head; b; b = b->next)
			if (b->conn_serial == r->conns[i].serial)
				b->orphaned = false;
	}
	free(r->conns);
	r->conns = NULL;
	r->nconns = 0;
	buffers_free_orphans(d); /* the ephemeral buffers of connections that did not survive */
}
