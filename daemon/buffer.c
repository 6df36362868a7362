/*
 * The buffer registry, and how long an ephemeral buffer lives. Main thread
 * only.
 */
#include "daemon/buffer.h"
#include "daemon/daemon.h"
#include "protocol/utf8.h"
#include "workers/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *buffer_state_name(enum buffer_state state)
{
	switch (state) {
	case BUFFER_ALLOCATING: return "allocating";
	case BUFFER_READY: return "ready";
	case BUFFER_FREEING: return "freeing";
	case BUFFER_LOST: return "lost";
	}
	return "unknown";
}

static bool name_char_ok(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '.' || c == '-';
}

/* The naming rule of buffers and regions; what ("buffer", "region") says whose name it is. */
static int name_check(const char *what, const char *name, struct gpuq_error *err)
{
	size_t len = strlen(name);
	if (len == 0 || len > BUFFER_NAME_MAX)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "%s name '%s' must be 1 to %d characters long",
				 what, name, BUFFER_NAME_MAX);
	if (name[0] == '.' || name[0] == '-')
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "%s name '%s' must not start with '.' or '-'",
				 what, name);
	for (size_t i = 0; i < len; i++) {
		if (name_char_ok(name[i]))
			continue;
		/* the whole character where it is one (replies escape what is not UTF-8) */
		size_t n = utf8_sequence((const unsigned char *)name + i, len - i);
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "%s name '%s' has '%.*s' at byte %zu; use A-Z a-z 0-9 _ . -", what,
				 name, (int)(n ? n : 1), name + i, i);
	}
	return 0;
}

int buffer_name_check(const char *name, struct gpuq_error *err)
{
	return name_check("buffer", name, err);
}

int region_name_check(const char *name, struct gpuq_error *err)
{
	return name_check("region", name, err);
}

/* NAME or NAME@GPU, NAME checked as what's ("buffer", "region"). */
static int ref_parse(const char *what, const char *ref, const char *field,
		     char name[BUFFER_NAME_MAX + 1], int *device, struct gpuq_error *err)
{
	const char *at = strrchr(ref, '@');
	size_t len = at ? (size_t)(at - ref) : strlen(ref);
	*device = -1;
	if (len > BUFFER_NAME_MAX)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field '%s': name longer than %d characters",
				 field, BUFFER_NAME_MAX);
	memcpy(name, ref, len);
	name[len] = '\0';
	if (at) {
		char *end;
		long d = strtol(at + 1, &end, 10);
		if (at[1] < '0' || at[1] > '9' || *end || d > 1000000)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "field '%s': '%s' is not NAME or NAME@GPU (GPU a number)",
					 field, ref);
		*device = (int)d;
	}
	return name_check(what, name, err);
}

int buffer_ref_parse(const char *ref, const char *field, char name[BUFFER_NAME_MAX + 1],
		     int *device, struct gpuq_error *err)
{
	return ref_parse("buffer", ref, field, name, device, err);
}

/* One bound of a range: "" (absent) or a size. 1 when given, 0 absent, -1 malformed. */
static int parse_bound(const char *s, size_t len, uint64_t *out)
{
	char buf[32];
	if (len == 0)
		return 0;
	if (len >= sizeof buf)
		return -1;
	memcpy(buf, s, len);
	buf[len] = '\0';
	return gpuq_parse_size(buf, out) == 0 ? 1 : -1;
}

/*
 * "[START:STOP]" at the end of a reference (range points at '['): bytes START
 * up to STOP, STOP excluded, as a Python slice reads; either may be left out.
 */
static int parse_range(const char *ref, const char *range, const char *field,
		       struct buffer_ref *out, struct gpuq_error *err)
{
	const char *colon = strchr(range, ':');
	size_t len = strlen(range);
	uint64_t stop = 0;
	int has_start = -1, has_stop = -1;
	if (colon && range[len - 1] == ']' && colon < range + len - 1) {
		has_start = parse_bound(range + 1, (size_t)(colon - range - 1), &out->offset);
		has_stop = parse_bound(colon + 1, (size_t)(range + len - 2 - colon), &stop);
	}
	if (has_start < 0 || has_stop < 0 || (!has_start && !has_stop))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field '%s': '%s' has a malformed range; write NAME[START:STOP] "
				 "(bytes START up to STOP, as a Python slice), NAME[START:] or "
				 "NAME[:STOP] with sizes such as 4096, 64K, 1G",
				 field, ref);
	if (has_stop && stop < out->offset)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field '%s': '%s' ends before it starts: [START:STOP] is bytes START "
				 "up to STOP, as a Python slice (%llu bytes from byte %llu would be "
				 "[%llu:%llu])",
				 field, ref, (unsigned long long)stop, (unsigned long long)out->offset,
				 (unsigned long long)out->offset,
				 (unsigned long long)(out->offset + stop));
	out->has_range = true;
	out->has_length = has_stop == 1;
	out->length = has_stop ? stop - out->offset : 0;
	return 0;
}

static int ref_parse_range(const char *what, const char *ref, const char *field,
			   struct buffer_ref *out, struct gpuq_error *err)
{
	char head[BUFFER_NAME_MAX + 32];
	const char *range = strchr(ref, '[');
	size_t len = range ? (size_t)(range - ref) : strlen(ref);
	memset(out, 0, sizeof *out);
	out->device = -1;
	if (len >= sizeof head)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field '%s': name longer than %d characters",
				 field, BUFFER_NAME_MAX);
	memcpy(head, ref, len);
	head[len] = '\0';
	if (ref_parse(what, head, field, out->name, &out->device, err) < 0)
		return -1;
	return range ? parse_range(ref, range, field, out, err) : 0;
}

int buffer_ref_parse_range(const char *ref, const char *field, struct buffer_ref *out,
			   struct gpuq_error *err)
{
	return ref_parse_range("buffer", ref, field, out, err);
}

int region_ref_parse_range(const char *ref, const char *field, struct buffer_ref *out,
			   struct gpuq_error *err)
{
	return ref_parse_range("region", ref, field, out, err);
}

int buffer_range_check(const struct buffer *b, uint64_t offset, bool has_length,
		       uint64_t length, uint64_t *out_length, struct gpuq_error *err)
{
	if (offset > b->bytes)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "offset %llu is past the end of buffer '%s@%d' (%llu bytes)",
				 (unsigned long long)offset, b->name, b->device,
				 (unsigned long long)b->bytes);
	if (has_length && length > b->bytes - offset)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "%llu bytes at offset %llu are outside buffer '%s@%d' (%llu bytes); "
				 "the range must end by byte %llu",
				 (unsigned long long)length, (unsigned long long)offset, b->name,
				 b->device, (unsigned long long)b->bytes, (unsigned long long)b->bytes);
	*out_length = has_length ? length : b->bytes - offset;
	return 0;
}

struct buffer *buffer_find(struct buffer_table *t, uid_t owner, const char *name, int device)
{
	for (struct buffer *b = t->head; b; b = b->next)
		if (b->owner == owner && b->device == device && strcmp(b->name, name) == 0)
			return b;
	return NULL;
}

void buffer_names_begin(struct buffer_names *l, char *out, size_t size, unsigned total)
{
	*l = (struct buffer_names){ .out = out, .size = size, .left = total };
	out[0] = '\0';
}

void buffer_names_add(struct buffer_names *l, const char *name, int device)
{
	const size_t more_room = sizeof " and 4294967295 more";
	char one[BUFFER_NAME_MAX + 16];
	int n = device < 0 ? snprintf(one, sizeof one, "%s%s", l->used ? ", " : "", name)
			   : snprintf(one, sizeof one, "%s%s@%d", l->used ? ", " : "", name, device);
	if (l->left)
		l->left--;
	if (l->more || n < 0 || l->used + (size_t)n + (l->left ? more_room : 0) >= l->size) {
		l->more++;
		return;
	}
	memcpy(l->out + l->used, one, (size_t)n + 1);
	l->used += (size_t)n;
}

void buffer_names_end(struct buffer_names *l)
{
	if (l->more)
		snprintf(l->out + l->used, l->size - l->used, " and %u more", l->more);
	else if (!l->used)
		snprintf(l->out, l->size, "none");
}

void buffer_whose(uid_t owner, uid_t caller, char *out, size_t size)
{
	if (owner == caller)
		snprintf(out, size, "your");
	else
		snprintf(out, size, "uid %u's", (unsigned)owner);
}

static bool listed(const struct buffer *b, uid_t owner, int device)
{
	return b->owner == owner && (device < 0 || b->device == device);
}

/* "w0@0, w1@0, grads@1": the owner's buffers on device, or everywhere for -1. */
static void list_names(struct buffer_table *t, uid_t owner, int device, char *out, size_t size)
{
	unsigned total = 0;
	for (struct buffer *b = t->head; b; b = b->next)
		total += listed(b, owner, device);
	struct buffer_names l;
	buffer_names_begin(&l, out, size, total);
	for (struct buffer *b = t->head; b; b = b->next)
		if (listed(b, owner, device))
			buffer_names_add(&l, b->name, b->device);
	buffer_names_end(&l);
}

/* "w0@0, w0@1": the devices where owner has a buffer called name (matches of them). */
static void list_devices(struct buffer_table *t, uid_t owner, const char *name, unsigned matches,
			 char *out, size_t size)
{
	struct buffer_names l;
	buffer_names_begin(&l, out, size, matches);
	for (struct buffer *b = t->head; b; b = b->next)
		if (b->owner == owner && strcmp(b->name, name) == 0)
			buffer_names_add(&l, name, b->device);
	buffer_names_end(&l);
}

/*
 * For root, who names another user's buffer with the request's `owner`:
 * where the name was not found in owner's buffers (on device, or anywhere
 * for -1) but another uid has one of that name, "; uid 65534 has 'w@0':
 * ...", saying how to name it. Empty for any other caller (a user may not
 * learn of others' buffers) and when no one else has the name.
 */
static void other_owner_hint(struct buffer_table *t, uid_t owner, uid_t caller, const char *name,
			     int device, char *out, size_t size)
{
	out[0] = '\0';
	if (caller != 0)
		return;
	for (struct buffer *b = t->head; b; b = b->next) {
		if (b->owner == owner || strcmp(b->name, name) != 0 ||
		    (device >= 0 && b->device != device))
			continue;
		snprintf(out, size, "; uid %u has '%s@%d': name it with the request's `owner` %u "
			 "(gpuq --owner %u)", (unsigned)b->owner, name, b->device,
			 (unsigned)b->owner, (unsigned)b->owner);
		return;
	}
}

/* Where name of owner is absent (on a GPU this gpuqd does not serve), as a hint into out. */
static void absent_hint(const struct buffer_table *t, uid_t owner, const char *name, char *out,
			size_t size)
{
	const struct state_buffer *a = t->absent ? absent_find(t->absent, owner, name) : NULL;
	size_t used = strlen(out);
	if (a && used < size)
		snprintf(out + used, size - used, "; '%s' is on GPU %s, which this gpuqd does not "
			 "serve: it is kept, and comes back with its bytes under a gpuqd that serves "
			 "that GPU (gpuqd --devices)", name, a->uuid);
}

static struct buffer *resolve_anywhere(struct buffer_table *t, uid_t owner, uid_t caller,
				       const char *name, struct gpuq_error *err)
{
	struct buffer *found = NULL;
	unsigned matches = 0;
	for (struct buffer *b = t->head; b; b = b->next) {
		if (b->owner == owner && strcmp(b->name, name) == 0) {
			found = b;
			matches++;
		}
	}
	if (matches == 1)
		return found;
	char names[256], who[24];
	if (matches > 1) {
		list_devices(t, owner, name, matches, names, sizeof names);
		gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			  "buffer '%s' exists on several devices (%s); name one as NAME@GPU", name,
			  names);
		return NULL;
	}
	char hint[400];
	list_names(t, owner, -1, names, sizeof names);
	buffer_whose(owner, caller, who, sizeof who);
	other_owner_hint(t, owner, caller, name, -1, hint, sizeof hint);
	absent_hint(t, owner, name, hint, sizeof hint);
	gpuq_fail(err, GPUQ_E_NOT_FOUND, "buffer '%s' not found (%s buffers: %s)%s", name, who,
		  names, hint);
	return NULL;
}

struct buffer *buffer_resolve(struct buffer_table *t, uid_t owner, uid_t caller, const char *name,
			      int device, struct gpuq_error *err)
{
	if (device < 0)
		return resolve_anywhere(t, owner, caller, name, err);
	struct buffer *b = buffer_find(t, owner, name, device);
	if (!b) {
		char names[256], who[24], hint[400];
		list_names(t, owner, device, names, sizeof names);
		buffer_whose(owner, caller, who, sizeof who);
		other_owner_hint(t, owner, caller, name, device, hint, sizeof hint);
		absent_hint(t, owner, name, hint, sizeof hint);
		gpuq_fail(err, GPUQ_E_NOT_FOUND,
			  "buffer '%s' not found on device %d (%s buffers there: %s)%s", name,
			  device, who, names, hint);
	}
	return b;
}

void buffer_mark_suspect(struct buffer *b, const char *why)
{
	char *copy = strdup(why);
	if (!copy)
		return; /* no memory for the reason: the state stays as it was, logged by the caller's job */
	free(b->suspect);
	b->suspect = copy;
}

void buffer_clear_suspect(struct buffer *b)
{
	free(b->suspect);
	b->suspect = NULL;
}

static void buffer_destroy(struct buffer *b)
{
	free(b->suspect);
	free(b->lost_why);
	free(b);
}

/*
 * A number no buffer had before, in this run or an earlier one: a counter
 * that starts from the wall clock in microseconds (a restart comes later,
 * and a run makes fewer than a million buffers a second). Main thread only.
 */
static uint64_t next_generation(void)
{
	static uint64_t last;
	struct timespec ts;
	if (last == 0 && clock_gettime(CLOCK_REALTIME, &ts) == 0)
		last = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
	return ++last;
}

struct buffer *buffer_add(struct buffer_table *t, const char *name, int device, uid_t owner,
			  enum gpuq_dtype dtype, uint64_t count, uint64_t bytes)
{
	struct buffer *b = calloc(1, sizeof *b);
	if (!b)
		return NULL;
	snprintf(b->name, sizeof b->name, "%s", name);
	b->device = device;
	b->owner = owner;
	b->dtype = dtype;
	b->count = count;
	b->bytes = bytes;
	b->state = BUFFER_ALLOCATING;
	b->share_fd = -1;
	b->slab_fd = -1;
	b->created = monotonic_seconds();
	b->generation = next_generation();
	b->next = t->head;
	t->head = b;
	t->count++;
	return b;
}

void buffer_remove(struct buffer_table *t, struct buffer *b)
{
	for (struct buffer **link = &t->head; *link; link = &(*link)->next) {
		if (*link == b) {
			*link = b->next;
			t->count--;
			b->removed = true;
			if (b->share_fd >= 0)
				close(b->share_fd); /* clients that attached keep their own handles */
			b->share_fd = -1;
			if (b->users == 0)
				buffer_destroy(b);
			return;
		}
	}
}

void buffer_unhold(struct buffer *b)
{
	if (b->users > 0)
		b->users--;
	if (b->removed && b->users == 0)
		buffer_destroy(b);
}

unsigned buffer_mark_lost(struct buffer_table *t, int device, const char *why)
{
	unsigned n = 0;
	for (struct buffer *b = t->head; b; b = b->next) {
		/* an allocation still queued gets memory of the new context; one lost before keeps its cause */
		if (b->device != device || b->state == BUFFER_ALLOCATING || b->state == BUFFER_LOST)
			continue;
		b->state = BUFFER_LOST;
		b->dptr = NULL;
		free(b->lost_why);
		b->lost_why = strdup(why); /* NULL: the refusal's words for an unknown cause */
		n++;
	}
	return n;
}

void buffer_free_failed(struct buffer *b)
{
	if (b->state == BUFFER_FREEING)
		b->state = BUFFER_READY;
}

unsigned buffer_count_on(const struct buffer_table *t, int device)
{
	unsigned n = 0;
	for (const struct buffer *b = t->head; b; b = b->next)
		n += b->device == device;
	return n;
}

uint64_t buffer_bytes_on(const struct buffer_table *t, int device)
{
	uint64_t sum = 0;
	for (const struct buffer *b = t->head; b; b = b->next)
		if (b->device == device && b->state != BUFFER_LOST)
			sum += b->bytes;
	return sum;
}

int buffer_check_usable(const struct buffer *b, struct gpuq_error *err)
{
	if (b->state == BUFFER_ALLOCATING)
		return gpuq_fail(err, GPUQ_E_BUSY,
				 "buffer '%s@%d' is still being allocated (job %llu); wait for that job",
				 b->name, b->device, (unsigned long long)b->last_job);
	if (b->state == BUFFER_FREEING)
		return gpuq_fail(err, GPUQ_E_BUSY, "buffer '%s@%d' is being freed (job %llu)",
				 b->name, b->device, (unsigned long long)b->last_job);
	if (b->state == BUFFER_LOST && b->lost_why)
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR,
				 "buffer '%s@%d' was lost %s; free it and allocate it again", b->name,
				 b->device, b->lost_why);
	if (b->state == BUFFER_LOST)
		return gpuq_fail(err, GPUQ_E_DEVICE_ERROR,
				 "buffer '%s@%d' was lost when gpu %d was reset, or a restart could not take "
				 "its memory over; free it and allocate it again",
				 b->name, b->device, b->device);
	return 0;
}

/*
 * Frees an orphaned ephemeral buffer if nothing holds it, with the free
 * job the buffer table's free_orphan makes. A buffer still allocating, in
 * use or not yet freeable (a full queue) is left for later: job_release
 * calls this when a job lets go of it, and the service tick retries every
 * second.
 */
void buffer_free_if_orphaned(struct daemon *d, struct buffer *b)
{
	if (!b || !b->orphaned || b->users > 0 || d->stopping)
		return;
	if (b->state == BUFFER_LOST) { /* a device reset took its memory: nothing to give back */
		buffer_remove(&d->buffers, b);
		return;
	}
	if (b->state == BUFFER_READY)
		d->buffers.free_orphan(d, b);
}

void buffer_let_go(struct daemon *d, struct buffer *b, bool free_orphan)
{
	bool listed = !b->removed;
	buffer_unhold(b); /* frees a removed buffer with its last user */
	if (listed && free_orphan)
		buffer_free_if_orphaned(d, b);
}

void buffers_drop_conn(struct daemon *d, struct conn *c)
{
	for (struct buffer *b = d->buffers.head, *next; b; b = next) {
		next = b->next;
		if (b->conn_serial != c->serial)
			continue;
		b->orphaned = true;
		leases_yield_orphan(d, b); /* what still holds it after this, the free waits for */
		buffer_free_if_orphaned(d, b);
	}
}

void buffers_free_orphans(struct daemon *d)
{
	for (struct buffer *b = d->buffers.head, *next; b; b = next) {
		next = b->next; /* a lost buffer is removed (and freed) at once */
		buffer_free_if_orphaned(d, b);
	}
}
