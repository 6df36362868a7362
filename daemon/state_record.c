/*
 * The durable state record (state_record.h): the payload's encoding,
 * declared once per kind of entry as a table of fields that both the
 * encoder and the decoder walk, and the memfd's two slots.
 */
#include "daemon/state_record.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "protocol/hash.h"
#include "protocol/msg.h"

/* The payload's fields ------------------------------------------------------------ */

enum rec_type { REC_STR, REC_U32, REC_INT, REC_U64, REC_BOOL, REC_DTYPE };

struct rec_field {
	const char *key;
	enum rec_type type;
	size_t at, size; /* the member's place and size in its struct */
	bool optional;   /* added after the first format: a record without it reads as zero */
};

#define REC_FIELD(type_, key_, kind, member)                                                    \
	{ key_, kind, offsetof(type_, member), sizeof(((type_ *)0)->member), false }
#define REC_FIELD_ADDED(type_, key_, kind, member)                                              \
	{ key_, kind, offsetof(type_, member), sizeof(((type_ *)0)->member), true }

static const struct rec_field buffer_fields[] = {
	REC_FIELD(struct state_buffer, "name", REC_STR, name),
	REC_FIELD(struct state_buffer, "owner", REC_U32, owner),
	REC_FIELD(struct state_buffer, "device", REC_INT, device),
	REC_FIELD(struct state_buffer, "dtype", REC_DTYPE, dtype),
	REC_FIELD(struct state_buffer, "count", REC_U64, count),
	REC_FIELD(struct state_buffer, "bytes", REC_U64, bytes),
	REC_FIELD(struct state_buffer, "slab", REC_U32, slab),
	REC_FIELD(struct state_buffer, "slab_offset", REC_U64, slab_offset),
	REC_FIELD_ADDED(struct state_buffer, "slab_bytes", REC_U64, slab_bytes),
	REC_FIELD_ADDED(struct state_buffer, "slab_fd", REC_INT, slab_fd),
	REC_FIELD(struct state_buffer, "shareable", REC_BOOL, shareable),
	REC_FIELD(struct state_buffer, "ephemeral", REC_BOOL, ephemeral),
	REC_FIELD_ADDED(struct state_buffer, "conn", REC_U64, conn_serial),
	REC_FIELD(struct state_buffer, "state", REC_STR, state),
	REC_FIELD_ADDED(struct state_buffer, "suspect", REC_STR, suspect),
	REC_FIELD_ADDED(struct state_buffer, "lost", REC_STR, lost),
	REC_FIELD_ADDED(struct state_buffer, "shape", REC_STR, shape),
	REC_FIELD(struct state_buffer, "writers", REC_U32, writers),
	REC_FIELD_ADDED(struct state_buffer, "uuid", REC_STR, uuid),
};

static const struct rec_field region_fields[] = {
	REC_FIELD(struct state_region, "name", REC_STR, name),
	REC_FIELD(struct state_region, "owner", REC_U32, owner),
	REC_FIELD(struct state_region, "device", REC_INT, device),
	REC_FIELD(struct state_region, "bytes", REC_U64, bytes),
	REC_FIELD(struct state_region, "fd", REC_INT, fd),
	REC_FIELD(struct state_region, "ephemeral", REC_BOOL, ephemeral),
	REC_FIELD_ADDED(struct state_region, "conn", REC_U64, conn_serial),
	REC_FIELD_ADDED(struct state_region, "created_ms", REC_U64, created_ms),
	REC_FIELD_ADDED(struct state_region, "uuid", REC_STR, uuid),
};

static const struct rec_field lease_fields[] = {
	REC_FIELD(struct state_lease, "id", REC_U64, id),
	REC_FIELD(struct state_lease, "buffer", REC_STR, buffer),
	REC_FIELD(struct state_lease, "buffer_owner", REC_U32, buffer_owner),
	REC_FIELD(struct state_lease, "device", REC_INT, device),
	REC_FIELD(struct state_lease, "uid", REC_U32, uid),
	REC_FIELD(struct state_lease, "pid", REC_INT, pid),
	REC_FIELD(struct state_lease, "write", REC_BOOL, write),
	REC_FIELD_ADDED(struct state_lease, "conn", REC_U64, conn_serial),
	REC_FIELD_ADDED(struct state_lease, "since_ms", REC_U64, since_ms),
	REC_FIELD_ADDED(struct state_lease, "uuid", REC_STR, uuid),
	REC_FIELD_ADDED(struct state_lease, "revocable", REC_BOOL, revocable),
	REC_FIELD_ADDED(struct state_lease, "lock_fd", REC_INT, lock_fd),
};

static const struct rec_field quota_fields[] = {
	REC_FIELD(struct state_quota, "uid", REC_U32, uid),
	REC_FIELD(struct state_quota, "buffer_bytes", REC_U64, buffer_bytes),
	REC_FIELD(struct state_quota, "region_bytes", REC_U64, region_bytes),
};

/* The snapshot's lists: under which key, made of which entries, where in the snapshot. */
struct rec_list {
	const char *key;
	const struct rec_field *fields;
	size_t nfields, entry_size, at_list, at_count;
	bool optional; /* added after the first format: a record without it reads as no entries */
};

#define REC_LIST_OF(key_, fields_, entry, list, count, optional_)                              \
	{ key_, fields_, sizeof fields_ / sizeof fields_[0], sizeof(entry),                     \
	  offsetof(struct state_snapshot, list), offsetof(struct state_snapshot, count), optional_ }
#define REC_LIST(key_, fields_, entry, list, count) REC_LIST_OF(key_, fields_, entry, list, count, false)
#define REC_LIST_ADDED(key_, fields_, entry, list, count) REC_LIST_OF(key_, fields_, entry, list, count, true)

static const struct rec_list rec_lists[] = {
	REC_LIST("buffers", buffer_fields, struct state_buffer, buffers, nbuffers),
	REC_LIST("regions", region_fields, struct state_region, regions, nregions),
	REC_LIST("leases", lease_fields, struct state_lease, leases, nleases),
	REC_LIST("quota", quota_fields, struct state_quota, quotas, nquotas),
	REC_LIST_ADDED("absent", buffer_fields, struct state_buffer, absent, nabsent),
};

/* An integer member of 4 or 8 bytes, signed or not, as an int64. */
static int64_t rec_int_of(const void *p, size_t size, bool is_signed)
{
	if (size == 8)
		return *(const int64_t *)p;
	return is_signed ? *(const int32_t *)p : (int64_t)*(const uint32_t *)p;
}

static void rec_put_field(struct mp_map *m, const struct rec_field *f, const char *entry)
{
	const void *p = entry + f->at;
	switch (f->type) {
	case REC_STR: mp_put_str(m, f->key, p); break;
	case REC_U32: mp_put_u64(m, f->key, *(const uint32_t *)p); break;
	case REC_INT: mp_put_i64(m, f->key, rec_int_of(p, f->size, true)); break;
	case REC_U64: mp_put_u64(m, f->key, *(const uint64_t *)p); break;
	case REC_BOOL: mp_put_bool(m, f->key, *(const bool *)p); break;
	case REC_DTYPE: mp_put_str(m, f->key, gpuq_dtype_name(*(const enum gpuq_dtype *)p)); break;
	}
}

const char *state_buffer_suspect(const struct state_buffer *b, char *why, size_t n)
{
	if (b->writers == 0)
		return NULL;
	snprintf(why, n, "%u job%s %s writing it when gpuqd ended; its bytes may be partly written",
		 b->writers, b->writers == 1 ? "" : "s", b->writers == 1 ? "was" : "were");
	return why;
}

void state_snapshot_encode(const struct state_snapshot *s, msgpack_sbuffer *out)
{
	struct mp_map root;
	mp_map_init(&root);
	mp_put_u64(&root, "version", STATE_RECORD_VERSION);
	mp_put_str(&root, "backend", s->backend);
	mp_put_i64(&root, "devices", s->devices);
	mp_put_u64(&root, "recoveries", s->recoveries);
	mp_put_u64(&root, "job_ids_below", s->job_ids_below);
	mp_put_bool(&root, "stopped", s->stopped);
	for (size_t l = 0; l < sizeof rec_lists / sizeof rec_lists[0]; l++) {
		const struct rec_list *list = &rec_lists[l];
		const char *entries = *(char *const *)((const char *)s + list->at_list);
		size_t n = *(const size_t *)((const char *)s + list->at_count);
		struct mp_array a;
		mp_array_init(&a);
		for (size_t i = 0; i < n; i++) {
			struct mp_map e;
			mp_map_init(&e);
			for (size_t k = 0; k < list->nfields; k++)
				rec_put_field(&e, &list->fields[k], entries + i * list->entry_size);
			mp_array_map(&a, &e);
		}
		mp_put_array(&root, list->key, &a);
	}
	mp_map_finish(&root, out);
}

/* A required field: the getter's 1 becomes 0, absent becomes an error naming it. */
static int rec_need(int rc, const char *key, struct gpuq_error *err)
{
	if (rc == 0)
		return gpuq_fail(err, GPUQ_E_IO, "field '%s' is missing", key);
	return rc < 0 ? -1 : 0;
}

static int rec_get_int(const msgpack_object *m, const struct rec_field *f, void *p,
		       struct gpuq_error *err)
{
	int64_t v = 0;
	if (rec_need(msg_get_i64(m, f->key, &v, err), f->key, err) != 0)
		return -1;
	if (f->size == 8)
		*(int64_t *)p = v;
	else if (v < INT32_MIN || v > INT32_MAX)
		return gpuq_fail(err, GPUQ_E_IO, "field '%s': %lld is out of range", f->key,
				 (long long)v);
	else
		*(int32_t *)p = (int32_t)v;
	return 0;
}

static int rec_get_dtype(const msgpack_object *m, const struct rec_field *f, void *p,
			 struct gpuq_error *err)
{
	char name[16];
	if (rec_need(msg_get_str(m, f->key, name, sizeof name, err), f->key, err) != 0)
		return -1;
	if (gpuq_dtype_from_name(name, strlen(name), p) != 0)
		return gpuq_fail(err, GPUQ_E_IO, "field '%s': '%s' is no dtype", f->key, name);
	return 0;
}

static int rec_get_field(const msgpack_object *m, const struct rec_field *f, char *entry,
			 struct gpuq_error *err)
{
	void *p = entry + f->at;
	uint64_t u = 0;
	switch (f->type) {
	case REC_STR: return rec_need(msg_get_str(m, f->key, p, f->size, err), f->key, err);
	case REC_U32:
		if (rec_need(msg_get_u64_in(m, f->key, 0, UINT32_MAX, &u, err), f->key, err) != 0)
			return -1;
		*(uint32_t *)p = (uint32_t)u;
		return 0;
	case REC_INT: return rec_get_int(m, f, p, err);
	case REC_U64: return rec_need(msg_get_u64(m, f->key, p, err), f->key, err);
	case REC_BOOL: return rec_need(msg_get_bool(m, f->key, p, err), f->key, err);
	case REC_DTYPE: return rec_get_dtype(m, f, p, err);
	}
	return gpuq_fail(err, GPUQ_E_INTERNAL, "field '%s' of an unknown type", f->key);
}

/* One list of the snapshot from the root map: an array of maps, each the list's entry. */
static int rec_get_list(const msgpack_object *root, const struct rec_list *list,
			struct state_snapshot *s, struct gpuq_error *err)
{
	const msgpack_object *a = NULL;
	if (list->optional && !msg_map_get(root, list->key))
		return 0;
	if (rec_need(msg_get_array(root, list->key, &a, err), list->key, err) != 0)
		return -1;
	size_t n = a->via.array.size;
	char *entries = calloc(n ? n : 1, list->entry_size);
	if (!entries)
		return gpuq_fail(err, GPUQ_E_IO, "no memory for %zu entries of '%s'", n, list->key);
	*(char **)((char *)s + list->at_list) = entries;
	*(size_t *)((char *)s + list->at_count) = n;
	for (size_t i = 0; i < n; i++) {
		const msgpack_object *e = &a->via.array.ptr[i];
		if (e->type != MSGPACK_OBJECT_MAP)
			return gpuq_fail(err, GPUQ_E_IO, "'%s' entry %zu is not a map", list->key, i);
		for (size_t k = 0; k < list->nfields; k++)
			if ((!list->fields[k].optional || msg_map_get(e, list->fields[k].key)) &&
			    rec_get_field(e, &list->fields[k], entries + i * list->entry_size, err) != 0)
				return gpuq_fail(err, GPUQ_E_IO, "'%s' entry %zu: %s", list->key, i,
						 err->message);
	}
	return 0;
}

static int rec_get_root(const msgpack_object *root, struct state_snapshot *s,
			struct gpuq_error *err)
{
	uint64_t version = 0;
	int64_t devices = 0;
	if (rec_need(msg_get_u64(root, "version", &version, err), "version", err) != 0)
		return -1;
	if (version > STATE_RECORD_VERSION)
		return gpuq_fail(err, GPUQ_E_UNSUPPORTED_VERSION,
				 "the payload is format version %llu; this gpuqd reads up to %u",
				 (unsigned long long)version, STATE_RECORD_VERSION);
	if (rec_need(msg_get_str(root, "backend", s->backend, sizeof s->backend, err), "backend",
		     err) != 0 ||
	    rec_need(msg_get_i64(root, "devices", &devices, err), "devices", err) != 0)
		return -1;
	s->devices = (int)devices;
	if (msg_get_u64(root, "recoveries", &s->recoveries, err) < 0 || /* added later: absent reads as 0 */
	    msg_get_u64(root, "job_ids_below", &s->job_ids_below, err) < 0 ||
	    msg_get_bool(root, "stopped", &s->stopped, err) < 0)
		return -1;
	for (size_t l = 0; l < sizeof rec_lists / sizeof rec_lists[0]; l++)
		if (rec_get_list(root, &rec_lists[l], s, err) != 0)
			return -1;
	return 0;
}

int state_snapshot_decode(const void *data, size_t len, struct state_snapshot *s,
			  struct gpuq_error *err)
{
	msgpack_unpacked u;
	size_t off = 0;
	int rc = -1;
	memset(s, 0, sizeof *s);
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, data, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP)
		gpuq_fail(err, GPUQ_E_IO, "the state record's payload is not a msgpack map");
	else if (rec_get_root(&u.data, s, err) == 0)
		rc = 0;
	msgpack_unpacked_destroy(&u);
	if (rc != 0) {
		char why[sizeof err->message];
		snprintf(why, sizeof why, "%s", err->message);
		gpuq_fail(err, err->code, "state record: %s", why);
		state_snapshot_free(s);
	}
	return rc;
}

void state_snapshot_free(struct state_snapshot *s)
{
	free(s->buffers);
	free(s->regions);
	free(s->leases);
	free(s->quotas);
	free(s->absent);
	memset(s, 0, sizeof *s);
}

/* The memfd's slots --------------------------------------------------------------- */

struct state_record {
	int fd;
	uint64_t generation;
	struct state_record_header slot[STATE_RECORD_SLOTS];
	uint64_t end; /* the file's size */
};

/* The checksum of n bytes: protocol/hash.h's, over 8-byte words in order. */
static uint64_t record_hash(const void *data, size_t n)
{
	const unsigned char *p = data;
	uint64_t sum = 0;
	for (size_t i = 0; i * 8 < n; i++) {
		uint64_t w = 0;
		memcpy(&w, p + i * 8, n - i * 8 < 8 ? n - i * 8 : 8);
		sum += gpuq_checksum_term(w, i);
	}
	return gpuq_checksum_finish(sum, n);
}

static uint64_t header_hash(const struct state_record_header *h)
{
	return record_hash(h, offsetof(struct state_record_header, header_check));
}

static int record_pwrite(int fd, const void *buf, size_t n, uint64_t off, struct gpuq_error *err)
{
	const char *p = buf;
	while (n > 0) {
		ssize_t w = pwrite(fd, p, n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return gpuq_fail(err, GPUQ_E_IO, "writing the state record: %s",
					 w < 0 ? strerror(errno) : "nothing written");
		p += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

/* Reads n bytes at off; 0, or -1 with err (a short file is an error too). */
static int record_pread(int fd, void *buf, size_t n, uint64_t off, struct gpuq_error *err)
{
	char *p = buf;
	while (n > 0) {
		ssize_t r = pread(fd, p, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return gpuq_fail(err, GPUQ_E_IO, "reading the state record: %s",
					 r < 0 ? strerror(errno) : "it ends early");
		p += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

struct state_record *state_record_create(struct gpuq_error *err)
{
	struct state_record *r = calloc(1, sizeof *r);
	if (!r) {
		gpuq_fail(err, GPUQ_E_IO, "no memory for the state record");
		return NULL;
	}
	r->end = STATE_RECORD_SLOTS * sizeof(struct state_record_header);
	r->fd = memfd_create("gpuq-state", MFD_CLOEXEC);
	if (r->fd < 0 || ftruncate(r->fd, (off_t)r->end) != 0) {
		gpuq_fail(err, GPUQ_E_IO, "making the state record's memfd: %s", strerror(errno));
		if (r->fd >= 0)
			close(r->fd);
		free(r);
		return NULL;
	}
	return r;
}

int state_record_fd(const struct state_record *r)
{
	return r->fd;
}

uint64_t state_record_generation(const struct state_record *r)
{
	return r->generation;
}

/*
 * Gives slot h an area of at least len bytes at the end of the file (its
 * old area, which held an older generation than the other slot's, is
 * punched out: a memfd gives those pages back).
 */
static int record_grow(struct state_record *r, struct state_record_header *h, size_t len,
		       struct gpuq_error *err)
{
	uint64_t cap = 4096, off = (r->end + 4095) / 4096 * 4096;
	while (cap < len)
		cap *= 2;
	if (ftruncate(r->fd, (off_t)(off + cap)) != 0)
		return gpuq_fail(err, GPUQ_E_IO, "growing the state record to %llu bytes: %s",
				 (unsigned long long)(off + cap), strerror(errno));
	if (h->capacity)
		(void)fallocate(r->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)h->offset,
				(off_t)h->capacity);
	r->end = off + cap;
	h->offset = off;
	h->capacity = cap;
	return 0;
}

int state_record_write(struct state_record *r, const void *payload, size_t len,
		       struct gpuq_error *err)
{
	unsigned t = (unsigned)((r->generation + 1) % STATE_RECORD_SLOTS);
	struct state_record_header h = r->slot[t];
	if (len > h.capacity && record_grow(r, &h, len, err) != 0)
		return -1;
	if (record_pwrite(r->fd, payload, len, h.offset, err) != 0)
		return -1;
	memcpy(h.magic, STATE_RECORD_MAGIC, sizeof h.magic);
	h.version = STATE_RECORD_VERSION;
	h.slot = t;
	h.generation = r->generation + 1;
	h.length = len;
	h.checksum = record_hash(payload, len);
	h.header_check = header_hash(&h);
	if (record_pwrite(r->fd, &h, sizeof h, t * sizeof h, err) != 0)
		return -1;
	r->slot[t] = h;
	r->generation = h.generation;
	return 0;
}

void state_record_close(struct state_record *r)
{
	if (!r)
		return;
	close(r->fd);
	free(r);
}

/* Reading ------------------------------------------------------------------------ */

/* Whether h is an intact header of slot t (any version); why not, in why. */
static bool header_intact(const struct state_record_header *h, unsigned t, char *why, size_t n)
{
	static const struct state_record_header zero;
	if (memcmp(h, &zero, sizeof zero) == 0)
		snprintf(why, n, "never written");
	else if (memcmp(h->magic, STATE_RECORD_MAGIC, sizeof h->magic) != 0)
		snprintf(why, n, "no state record's magic");
	else if (h->header_check != header_hash(h) || h->slot != t || h->generation == 0)
		snprintf(why, n, "its header's checksum does not hold");
	else
		return true;
	return false;
}

/* Slot t's payload, checked against its header: 0 with *payload, or -1 with why. */
static int slot_payload(int fd, const struct state_record_header *h, void **payload, char *why,
			size_t n)
{
	struct gpuq_error err;
	void *p = malloc(h->length ? h->length : 1);
	if (!p) {
		snprintf(why, n, "no memory for its %llu bytes", (unsigned long long)h->length);
		return -1;
	}
	if (record_pread(fd, p, h->length, h->offset, &err) != 0) {
		snprintf(why, n, "%.150s", err.message);
		free(p);
		return -1;
	}
	if (record_hash(p, h->length) != h->checksum) {
		snprintf(why, n, "generation %llu's payload checksum does not hold (a torn write?)",
			 (unsigned long long)h->generation);
		free(p);
		return -1;
	}
	*payload = p;
	return 0;
}

/* Slot indexes of intact headers, newest generation first; how many. */
static unsigned slots_by_generation(const struct state_record_header *h, const bool *intact,
				    unsigned *order)
{
	unsigned n = 0;
	for (unsigned t = 0; t < STATE_RECORD_SLOTS; t++)
		if (intact[t])
			order[n++] = t;
	if (n == 2 && h[order[1]].generation > h[order[0]].generation) {
		unsigned x = order[0];
		order[0] = order[1];
		order[1] = x;
	}
	return n;
}

int state_record_read(int fd, void **payload, size_t *len, uint64_t *generation,
		      struct gpuq_error *err)
{
	struct state_record_header h[STATE_RECORD_SLOTS];
	char why[STATE_RECORD_SLOTS][160];
	bool intact[STATE_RECORD_SLOTS], empty = true;
	unsigned order[STATE_RECORD_SLOTS];
	if (record_pread(fd, h, sizeof h, 0, err) != 0)
		return -1;
	for (unsigned t = 0; t < STATE_RECORD_SLOTS; t++) {
		intact[t] = header_intact(&h[t], t, why[t], sizeof why[t]);
		empty = empty && strcmp(why[t], "never written") == 0;
	}
	if (empty)
		return 1;
	unsigned n = slots_by_generation(h, intact, order);
	for (unsigned i = 0; i < n; i++) {
		const struct state_record_header *s = &h[order[i]];
		if (s->version > STATE_RECORD_VERSION)
			return gpuq_fail(err, GPUQ_E_UNSUPPORTED_VERSION,
					 "the state record (generation %llu) is format version %u; "
					 "this gpuqd reads version %u and older: run a gpuqd at least as "
					 "new as the one that wrote it",
					 (unsigned long long)s->generation, s->version,
					 STATE_RECORD_VERSION);
		if (slot_payload(fd, s, payload, why[order[i]], sizeof why[0]) == 0) {
			*len = s->length;
			*generation = s->generation;
			return 0;
		}
	}
	return gpuq_fail(err, GPUQ_E_IO,
			 "the state record is refused: no slot checks out (slot 0: %s; slot 1: %s)",
			 why[0], why[1]);
}

struct state_record *state_record_adopt(int fd, struct gpuq_error *err)
{
	struct state_record *r = calloc(1, sizeof *r);
	struct state_record_header h;
	struct stat st;
	void *payload = NULL;
	size_t len = 0;
	uint64_t generation = 0;
	int rc = r ? state_record_read(fd, &payload, &len, &generation, err)
		   : gpuq_fail(err, GPUQ_E_IO, "no memory to take the state record over");
	free(payload);
	if (rc == 0 && record_pread(fd, &h, sizeof h, generation % STATE_RECORD_SLOTS * sizeof h,
				    err) != 0)
		rc = -1;
	if (rc >= 0 && fstat(fd, &st) != 0)
		rc = gpuq_fail(err, GPUQ_E_IO, "taking the state record over: fstat: %s", strerror(errno));
	if (rc < 0) {
		close(fd);
		free(r);
		return NULL;
	}
	r->fd = fd;
	r->generation = generation;
	if (rc == 0) /* the newest keeps its area until the write after next; the other slot gets a new one */
		r->slot[generation % STATE_RECORD_SLOTS] = h;
	r->end = (uint64_t)st.st_size;
	if (r->end < STATE_RECORD_SLOTS * sizeof h)
		r->end = STATE_RECORD_SLOTS * sizeof h;
	return r;
}
