/*
 * Host regions: region_create, region_free, regions, region_open, and the
 * region side of put and get (daemon/region.h). The main thread checks
 * everything a request says (the memfd's seals, mode and size, the names,
 * the quotas and RLIMIT_MEMLOCK) before a job maps or pins anything; the
 * mapping and pinning happen on the region's device's worker
 * (workers/transfer/region_pin.h). Main thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"

static void render_region_create(const struct job *job, struct mp_map *out)
{
	mp_put_str(out, "name", job->brief.name);
	mp_put_i64(out, "device", job->brief.device);
	mp_put_u64(out, "bytes", job->brief.bytes);
	mp_put_i64(out, "numa_node", job->work.result.numa_node);
	mp_put_f64(out, "pin_s", job->work.result.seconds);
}

static void render_region_free(const struct job *job, struct mp_map *out)
{
	mp_put_str(out, "name", job->brief.name);
	mp_put_u64(out, "bytes", job->brief.bytes);
}

static void finish_region_create(struct daemon *d, struct job *job)
{
	struct region *r = job->region;
	if (job->work.error.code != GPUQ_OK) {
		region_remove(&d->regions, r);
		return;
	}
	r->map = job->work.dptr;
	r->state = REGION_READY;
	r->pin_s = job->work.result.seconds;
	r->numa_node = job->work.result.numa_node;
	region_free_if_orphaned(d, r); /* its connection closed while it was being pinned */
}

static void finish_region_free(struct daemon *d, struct job *job)
{
	if (job->work.error.code == GPUQ_OK)
		region_remove(&d->regions, job->region);
	else
		job->region->state = REGION_READY;
}

static const struct job_kind kind_region_create = { "region_create", finish_region_create,
						    render_region_create };
static const struct job_kind kind_region_free = { "region_free", finish_region_free,
						  render_region_free };

/* What the records of a region's jobs show after it is gone. */
static void job_name_region(struct job *job, const struct region *r)
{
	job->region = (struct region *)r;
	snprintf(job->buffer_label, sizeof job->buffer_label, "region:%s", r->name);
	snprintf(job->brief.name, sizeof job->brief.name, "%s", r->name);
	job->brief.device = r->device;
	job->brief.dtype = GPUQ_DTYPE_BYTES;
	job->brief.count = job->brief.bytes = r->bytes;
}

/*
 * The descriptor of a region_create: a memfd sealed against shrinking (so
 * that no one can truncate the pages gpuqd has mapped and pinned), open
 * for reading and writing, holding at least `bytes`.
 */
static int read_region_memfd(struct request *req, uint64_t bytes, struct gpuq_error *err)
{
	struct stat st;
	if (req->nfds != 1)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "region_create needs exactly one descriptor attached (fds: 1), a memfd, not %d",
				 req->nfds);
	int fd = req->fds[0];
	int flags = fcntl(fd, F_GETFL), seals = fcntl(fd, F_GET_SEALS);
	if (flags < 0 || fstat(fd, &st) < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "the descriptor passed to region_create: %s",
				 strerror(errno));
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "a region must be a memfd sealed against shrinking (memfd_create with "
				 "MFD_ALLOW_SEALING, then F_ADD_SEALS F_SEAL_SHRINK), so that gpuqd can keep it "
				 "mapped and pinned");
	if ((flags & O_ACCMODE) != O_RDWR)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the region's memfd must be open for reading and writing (get writes into it)");
	if ((uint64_t)st.st_size < bytes)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the region's memfd holds %lld bytes, fewer than the %llu asked for; "
				 "ftruncate it first",
				 (long long)st.st_size, (unsigned long long)bytes);
	return 0;
}

/* region_create: name, device, bytes (a positive multiple of the page size), ephemeral. */
struct region_create_args {
	char name[BUFFER_NAME_MAX + 2];
	int device;
	uint64_t bytes;
	bool ephemeral;
};

static int region_create_check_name(struct request *req, void *args, struct gpuq_error *err)
{
	(void)req;
	return region_name_check(((struct region_create_args *)args)->name, err);
}

static int region_create_check_bytes(struct request *req, void *args, struct gpuq_error *err)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t bytes = ((struct region_create_args *)args)->bytes;
	(void)req;
	if (bytes == 0 || bytes % page)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'bytes': %llu is not a positive multiple of the page size (%llu)",
				 (unsigned long long)bytes, (unsigned long long)page);
	return 0;
}

/* A name still free for the caller, and the memfd that will back it. */
static int region_create_check_new(struct request *req, void *args, struct gpuq_error *err)
{
	const struct region_create_args *a = args;
	if (region_find(&req->d->regions, req->conn->uid, a->name))
		return gpuq_fail(err, GPUQ_E_EXISTS, "region '%s' already exists; free it or pick another name",
				 a->name);
	return read_region_memfd(req, a->bytes, err);
}

static const struct args_field region_create_fields[] = {
	{ "name", ARGS_STR, ARGS_REQUIRED, ARGS_AT(struct region_create_args, name),
	  .then = region_create_check_name },
	{ "device", ARGS_DEVICE, 0, ARGS_AT(struct region_create_args, device) },
	{ "bytes", ARGS_U64, ARGS_REQUIRED, ARGS_AT(struct region_create_args, bytes),
	  .then = region_create_check_bytes },
	{ "ephemeral", ARGS_BOOL, 0, ARGS_AT(struct region_create_args, ephemeral),
	  .then = region_create_check_new },
};
const struct args_spec op_region_create_args =
	ARGS_SPEC(struct region_create_args, region_create_fields, NULL);

void op_region_create(struct request *req, void *args)
{
	const struct region_create_args *a = args;
	struct gpuq_error err;
	struct daemon *d = req->d;
	if (quota_check_pinned(d, req->conn, a->bytes, &err) < 0 ||
	    region_check_memlock(&d->regions, a->name, a->bytes, &err) < 0) {
		reply_error(req, &err);
		return;
	}
	int fd = dup(req->fds[0]); /* the job's, closed when it ends; the region keeps the original */
	struct region *r = fd >= 0 ? region_add(&d->regions, a->name, a->device, req->conn->uid,
						 a->bytes, req->fds[0]) : NULL;
	if (!r) {
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd cannot keep another region: %s",
			  fd < 0 ? strerror(errno) : "no memory");
		if (fd >= 0)
			close(fd);
		reply_error(req, &err);
		return;
	}
	req->fds[0] = -1;
	r->conn_serial = a->ephemeral ? req->conn->serial : 0;
	struct job *job = new_job(req, &kind_region_create, WORK_REGION_MAP, a->device);
	if (!job) {
		close(fd);
		region_remove(&d->regions, r);
		return;
	}
	job_name_region(job, r);
	r->last_job = job->id;
	job->work.fd = fd;
	job->work.length = a->bytes;
	job_submit(req, job);
}

/* The ops on one region: region_free, region_open. `name` resolves for the caller (root: `owner`'s). */
struct region_args {
	char name[BUFFER_NAME_MAX + 2];
	uid_t owner;
	struct region *region; /* ready to use */
};

static int region_args_resolve(struct request *req, void *args, struct gpuq_error *err)
{
	struct region_args *a = args;
	a->region = region_resolve(&req->d->regions, a->owner, req->conn->uid, a->name, err);
	return a->region && region_check_usable(a->region, err) == 0 ? 0 : -1;
}

static const struct args_field region_fields[] = {
	{ "name", ARGS_STR, ARGS_REQUIRED, ARGS_AT(struct region_args, name),
	  .missing = "field 'name' (a region's name) is required" },
	{ "owner", ARGS_OWNER, ARGS_OF_REGIONS, ARGS_AT(struct region_args, owner),
	  .then = region_args_resolve },
};
const struct args_spec op_region_free_args = ARGS_SPEC(struct region_args, region_fields, NULL);
const struct args_spec op_region_open_args = ARGS_SPEC(struct region_args, region_fields, NULL);
const struct args_spec op_regions_args = ARGS_NONE;

/* A region_free's job: it unpins and unmaps r once no job uses it; r is being freed from now. */
static void region_free_job(struct job *job, struct region *r)
{
	job->work.kind = WORK_REGION_UNMAP;
	job->work.device = r->device;
	job_name_region(job, r);
	job->work.dptr = r->map;
	job->work.length = r->bytes;
	job->work.users = &r->users;
	r->state = REGION_FREEING;
	r->last_job = job->id;
}

/*
 * A region_free no client asked for: an ephemeral region's connection
 * closed, and nothing uses it (region_free_if_orphaned, through the region
 * table's free_orphan).
 */
void op_region_free_own(struct daemon *d, struct region *r)
{
	struct gpuq_error err;
	struct job *job = job_create(&d->jobs, &kind_region_free, r->owner, 0, 0);
	if (!job)
		return;
	region_free_job(job, r);
	if (job_submit_own(d, job, &err) < 0) {
		r->state = REGION_READY; /* a full queue: the next job that lets go of it tries again */
		job_discard(&d->jobs, job);
		log_warn("ephemeral region %s of uid %d stays for now: %s", r->name, (int)r->owner,
			 err.message);
		return;
	}
	log_info("job %llu: freeing ephemeral region %s of uid %d: the connection that made it closed",
		 (unsigned long long)job->id, r->name, (int)r->owner);
}

/*
 * Waits for every job that moves bytes through the region, on any device;
 * from the request on, new ones are refused with `busy`.
 */
void op_region_free(struct request *req, void *args)
{
	struct region *r = ((struct region_args *)args)->region;
	struct job *job = new_job(req, &kind_region_free, WORK_REGION_UNMAP, r->device);
	if (!job)
		return;
	region_free_job(job, r);
	job_submit(req, job);
}

static void render_region(const struct region *r, double now, struct mp_array *out)
{
	struct mp_map m;
	mp_map_init(&m);
	mp_put_str(&m, "name", r->name);
	mp_put_i64(&m, "device", r->device);
	mp_put_u64(&m, "bytes", r->bytes);
	mp_put_u64(&m, "owner", (uint64_t)r->owner);
	mp_put_str(&m, "state", region_state_name(r->state));
	mp_put_bool(&m, "ephemeral", r->conn_serial != 0);
	mp_put_i64(&m, "numa_node", r->numa_node);
	mp_put_f64(&m, "pin_s", r->pin_s);
	mp_put_u64(&m, "jobs", atomic_load(&r->users));
	mp_put_f64(&m, "age_s", now - r->created);
	mp_array_map(out, &m);
}

void op_regions(struct request *req, void *args)
{
	struct daemon *d = req->d;
	(void)args;
	uid_t uid = req->conn->uid;
	double now = monotonic_seconds();
	uint64_t limit;
	struct mp_map body;
	struct mp_array list;
	mp_map_init(&body);
	mp_array_init(&list);
	for (const struct region *r = d->regions.head; r; r = r->next)
		if (uid == 0 || r->owner == uid)
			render_region(r, now, &list);
	mp_put_array(&body, "regions", &list);
	mp_put_u64(&body, "pinned_bytes", d->regions.pinned);
	if (region_memlock_limit(&limit))
		mp_put_u64(&body, "memlock_limit", limit);
	reply_ok(req, &body);
}

/* Hands the owner (or root) a descriptor of the region's memfd, to map it. */
void op_region_open(struct request *req, void *args)
{
	struct region *r = ((struct region_args *)args)->region;
	struct mp_map body;
	mp_map_init(&body);
	mp_put_str(&body, "name", r->name);
	mp_put_u64(&body, "bytes", r->bytes);
	mp_put_i64(&body, "device", r->device);
	mp_put_u64(&body, "fds", 1);
	reply_ok_fd(req, &body, r->fd);
}

/* "NAME[START:STOP]": a region's name and an optional range, no @GPU. */
static struct region *region_ref_resolve(struct request *req, const char *text,
					 struct buffer_ref *ref, struct gpuq_error *err)
{
	uid_t owner;
	if (region_ref_parse_range(text, "region", ref, err) < 0 ||
	    args_owner(req, "regions", &owner, err) < 0)
		return NULL;
	if (ref->device >= 0) {
		gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			  "field 'region': '%s' names a device; a region serves every device (NAME[START:STOP])",
			  text);
		return NULL;
	}
	struct region *r = region_resolve(&req->d->regions, owner, req->conn->uid, ref->name, err);
	if (r && region_check_usable(r, err) < 0)
		return NULL;
	return r;
}

/*
 * The bytes a transfer moves (*n): the length given on either side (both:
 * they must agree), else the source's range to its end (put: the region's,
 * get: the buffer's, `length`: the buffer's range, given or to its end).
 * The region must hold them; the caller checks the buffer.
 */
static int region_range(const struct region *r, const struct buffer_ref *ref, bool put,
			uint64_t length, bool buffer_has_length, uint64_t *offset, uint64_t *n,
			struct gpuq_error *err)
{
	*offset = ref->offset;
	if (*offset > r->bytes)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "offset %llu is past the end of region '%s' (%llu bytes)",
				 (unsigned long long)*offset, r->name, (unsigned long long)r->bytes);
	uint64_t room = r->bytes - *offset;
	*n = length;
	if (ref->has_length && buffer_has_length && ref->length != length)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "region '%s' is given %llu bytes but the buffer's range is %llu bytes; "
				 "give ranges of one length (or one of them)",
				 r->name, (unsigned long long)ref->length, (unsigned long long)length);
	if (ref->has_length)
		*n = ref->length;
	else if (put && !buffer_has_length)
		*n = room;
	if (*n > room)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "%llu bytes at offset %llu are outside region '%s' (%llu bytes)",
				 (unsigned long long)*n, (unsigned long long)*offset, r->name,
				 (unsigned long long)r->bytes);
	return 0;
}

int region_transfer_read(struct request *req, const char *text, bool given, bool put,
			 const struct buffer *b, uint64_t buffer_offset, uint64_t *length,
			 bool buffer_has_length, struct region_span *span, struct gpuq_error *err)
{
	struct buffer_ref ref;
	uint64_t n = 0;
	if (!text)
		return 0;
	if (!given) /* named, but nil */
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'region': expected a string, got nil");
	span->region = region_ref_resolve(req, text, &ref, err);
	if (!span->region ||
	    region_range(span->region, &ref, put, *length, buffer_has_length, &span->offset, &n,
			 err) < 0)
		return -1;
	if (n > *length) /* the buffer is the side too small: name it */
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "buffer '%s@%d' has room for %llu bytes from offset %llu, but region '%s' "
				 "gives %llu; give a range of the region (NAME[START:STOP]) or a larger "
				 "buffer",
				 b->name, b->device, (unsigned long long)*length,
				 (unsigned long long)buffer_offset, span->region->name,
				 (unsigned long long)n);
	*length = n;
	return 1;
}

/* The job holds the region (region_free waits for it) and moves bytes at the span. */
static void region_hold(struct job *job, const struct region_span *span)
{
	struct region *r = span->region;
	job->region = r;
	job->region_held = true;
	atomic_fetch_add(&r->users, 1);
	r->last_job = job->id;
	job->work.transfer.host = (char *)r->map + span->offset;
}

void region_transfer_hold(struct job *job, const struct region_span *span, bool put)
{
	region_hold(job, span);
	work_add_range(&job->work, span->region->map, span->offset, job->work.length, !put);
}

/* Bytes of the three ring counters (posted, moved, status). */
#define RING_COUNTER_BYTES (3 * sizeof(uint64_t))

int region_ring_read(struct request *req, const char *text, bool given,
		     struct region_ring *ring, struct region_span *span, struct gpuq_error *err)
{
	struct buffer_ref ref;
	if (!given)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'region': expected a string, got nil");
	struct region *r = span->region = region_ref_resolve(req, text, &ref, err);
	if (!r)
		return -1;
	if (ref.offset > r->bytes)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "offset %llu is past the end of region '%s' (%llu bytes)",
				 (unsigned long long)ref.offset, r->name, (unsigned long long)r->bytes);
	uint64_t n = ref.has_length ? ref.length : r->bytes - ref.offset;
	if (n > r->bytes - ref.offset)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "%llu bytes at offset %llu are outside region '%s' (%llu bytes)",
				 (unsigned long long)n, (unsigned long long)ref.offset, r->name,
				 (unsigned long long)r->bytes);
	if (n % ring->slot_bytes != 0 || n / ring->slot_bytes < 2 || n / ring->slot_bytes > UINT32_MAX)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'ring': the %llu bytes of region '%s' from offset %llu are not two "
				 "or more whole slots of %llu bytes (slot_bytes)",
				 (unsigned long long)n, r->name, (unsigned long long)ref.offset,
				 (unsigned long long)ring->slot_bytes);
	uint64_t c = ring->counters;
	if (c % 8 != 0 || c > r->bytes || r->bytes - c < RING_COUNTER_BYTES ||
	    (c < ref.offset + n && c + RING_COUNTER_BYTES > ref.offset))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'ring': counters at byte %llu must be a multiple of 8 with %zu "
				 "bytes in region '%s' (%llu bytes), outside its slots [%llu, %llu)",
				 (unsigned long long)c, RING_COUNTER_BYTES, r->name,
				 (unsigned long long)r->bytes, (unsigned long long)ref.offset,
				 (unsigned long long)(ref.offset + n));
	span->offset = ref.offset;
	ring->slots = (unsigned)(n / ring->slot_bytes);
	return 1;
}

void region_ring_hold(struct job *job, const struct region_span *span,
		      const struct region_ring *ring, bool put)
{
	struct region *r = span->region;
	region_hold(job, span);
	job->work.transfer.ring_slot_bytes = ring->slot_bytes;
	job->work.transfer.ring_slots = ring->slots;
	job->work.transfer.ring_counters = (uint64_t *)((char *)r->map + ring->counters);
	work_add_range(&job->work, r->map, span->offset, (uint64_t)ring->slots * ring->slot_bytes,
		       !put);
	work_add_range(&job->work, r->map, ring->counters, RING_COUNTER_BYTES, true);
}
