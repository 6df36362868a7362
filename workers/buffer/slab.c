/*
 * The slab heap (slab.h): slabs the backend makes, ranges carved from them.
 * Pure bookkeeping over the backend's create and destroy; every exported
 * function takes the heap's lock, the static ones run under it.
 */
#include "workers/buffer/slab.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A piece of a slab, used or free; a slab's extents cover it in address order. */
struct slab_extent {
	uint64_t off, len;
	uint64_t asked; /* used: the bytes its allocation asked for */
	bool used;
};

struct slab {
	uint32_t id;
	struct slab_mem mem;
	bool own, exported;
	uint64_t used; /* bytes of used extents */
	bool held; /* its descriptor is with the heap's keeper too */
	struct slab_extent *ext;
	size_t next, ext_cap;
};

struct slab_heap {
	pthread_mutex_t lock;
	struct slab_backend be;
	uint64_t carve_bytes, keep_bytes;
	struct slab **slabs; /* in the order they were made */
	size_t n, cap;
	uint32_t last_id;
	uint64_t created, destroyed;
	struct slab_keeper keeper;
	char owner[SLAB_OWNER_MAX]; /* names slabs to the keeper */
};

static uint64_t round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

struct slab_heap *slab_heap_create(const struct slab_backend *be, uint64_t carve_bytes,
				   uint64_t keep_bytes)
{
	struct slab_heap *h = calloc(1, sizeof *h);
	if (!h)
		return NULL;
	pthread_mutex_init(&h->lock, NULL);
	h->be = *be;
	if (h->be.granularity == 0)
		h->be.granularity = SLAB_ALIGN;
	h->carve_bytes = round_up(carve_bytes ? carve_bytes : 1, h->be.granularity);
	h->keep_bytes = keep_bytes;
	return h;
}

void slab_heap_set_keeper(struct slab_heap *h, const struct slab_keeper *keeper, const char *owner)
{
	pthread_mutex_lock(&h->lock);
	h->keeper = keeper ? *keeper : (struct slab_keeper){ 0 };
	snprintf(h->owner, sizeof h->owner, "%s", owner);
	pthread_mutex_unlock(&h->lock);
}

/* The keeper holds s too (a made slab, or an adopted one it does not hold yet). */
static void slab_hold(struct slab_heap *h, struct slab *s)
{
	if (!h->keeper.hold)
		return;
	h->keeper.hold(h->keeper.ctx, h->owner, s->id, s->mem.fd);
	s->held = true;
}

/* The keeper lets s go: before its descriptor closes, so that the name never outlives it. */
static void slab_unhold(struct slab_heap *h, struct slab *s)
{
	if (!s->held || !h->keeper.release)
		return;
	h->keeper.release(h->keeper.ctx, h->owner, s->id);
	s->held = false;
}

static void slab_give_back(struct slab_heap *h, struct slab *s, bool lost)
{
	slab_unhold(h, s);
	h->be.destroy(h->be.ctx, &s->mem, lost);
	h->destroyed++;
	free(s->ext);
	free(s);
}

/* The heap's own memory, once its slabs are given back. */
static void slab_heap_free(struct slab_heap *h)
{
	free(h->slabs);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

void slab_heap_destroy(struct slab_heap *h, bool lost)
{
	if (!h)
		return;
	for (size_t i = 0; i < h->n; i++)
		slab_give_back(h, h->slabs[i], lost);
	slab_heap_free(h);
}

struct slab_kept {
	struct slab_keeper keeper;
	char owner[SLAB_OWNER_MAX];
	size_t n;
	struct {
		uint32_t id;
		int fd;
		bool held;
	} slabs[];
};

struct slab_kept *slab_heap_destroy_keeping(struct slab_heap *h)
{
	if (!h)
		return NULL;
	struct slab_kept *k = h->n ? malloc(sizeof *k + h->n * sizeof k->slabs[0]) : NULL;
	if (k) {
		k->keeper = h->keeper;
		memcpy(k->owner, h->owner, sizeof k->owner);
		k->n = 0;
	}
	for (size_t i = 0; i < h->n; i++) {
		struct slab *s = h->slabs[i];
		if (k && s->used > 0 && s->mem.fd >= 0) {
			k->slabs[k->n].id = s->id;
			k->slabs[k->n].fd = s->mem.fd;
			k->slabs[k->n].held = s->held;
			k->n++;
			s->mem.fd = -1; /* destroy unmaps; the descriptor, and with it the memory, stays */
			s->held = false; /* and so does its name in the keeper */
		}
		slab_give_back(h, s, true);
	}
	slab_heap_free(h);
	if (k && k->n == 0) {
		free(k);
		k = NULL;
	}
	return k;
}

void slab_kept_close(struct slab_kept *k)
{
	if (!k)
		return;
	for (size_t i = 0; i < k->n; i++) {
		if (k->slabs[i].held && k->keeper.release)
			k->keeper.release(k->keeper.ctx, k->owner, k->slabs[i].id);
		close(k->slabs[i].fd);
	}
	free(k);
}

/* Takes the i-th slab out of the heap's list, keeping the others' order. */
static void slab_unlist(struct slab_heap *h, size_t i)
{
	memmove(&h->slabs[i], &h->slabs[i + 1], (h->n - i - 1) * sizeof *h->slabs);
	h->n--;
}

/* Makes room for one more extent in s; false when the host is out of memory. */
static bool slab_ext_reserve(struct slab *s)
{
	if (s->next < s->ext_cap)
		return true;
	size_t cap = s->ext_cap ? s->ext_cap * 2 : 8;
	struct slab_extent *ext = realloc(s->ext, cap * sizeof *ext);
	if (!ext)
		return false;
	s->ext = ext;
	s->ext_cap = cap;
	return true;
}

static bool heap_list_reserve(struct slab_heap *h)
{
	if (h->n < h->cap)
		return true;
	size_t cap = h->cap ? h->cap * 2 : 16;
	struct slab **slabs = realloc(h->slabs, cap * sizeof *slabs);
	if (!slabs)
		return false;
	h->slabs = slabs;
	h->cap = cap;
	return true;
}

/* Whether s is empty and may serve again (a kept slab). */
static bool slab_is_kept(const struct slab *s)
{
	return s->used == 0 && !s->exported;
}

static uint64_t heap_kept_bytes(const struct slab_heap *h)
{
	uint64_t kept = 0;
	for (size_t i = 0; i < h->n; i++)
		if (slab_is_kept(h->slabs[i]))
			kept += h->slabs[i]->mem.bytes;
	return kept;
}

/* Gives back every kept slab (a creation ran out of memory); how many went. */
static unsigned heap_drop_kept(struct slab_heap *h)
{
	unsigned dropped = 0;
	for (size_t i = h->n; i-- > 0;) {
		if (!slab_is_kept(h->slabs[i]))
			continue;
		struct slab *s = h->slabs[i];
		slab_unlist(h, i);
		slab_give_back(h, s, false);
		dropped++;
	}
	return dropped;
}

/*
 * Creates a slab of bytes (a multiple of the granularity) and lists it,
 * one free extent; when the device is full, kept slabs go back first and
 * it tries once more. NULL with err.
 */
static struct slab *slab_make(struct slab_heap *h, uint64_t bytes, bool own,
			      struct gpuq_error *err)
{
	struct slab *s = calloc(1, sizeof *s);
	if (!s || !slab_ext_reserve(s) || !heap_list_reserve(h)) {
		if (s)
			free(s->ext);
		free(s);
		gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no host memory to record a slab");
		return NULL;
	}
	int rc = h->be.create(h->be.ctx, bytes, &s->mem, err);
	if (rc != 0 && err->code == GPUQ_E_OUT_OF_MEMORY && heap_drop_kept(h) > 0)
		rc = h->be.create(h->be.ctx, bytes, &s->mem, err);
	if (rc != 0) {
		free(s->ext);
		free(s);
		return NULL;
	}
	s->id = ++h->last_id;
	s->own = own;
	s->ext[0] = (struct slab_extent){ 0, s->mem.bytes, 0, false };
	s->next = 1;
	h->slabs[h->n++] = s;
	h->created++;
	slab_hold(h, s);
	return s;
}

static void slab_fill_place(const struct slab *s, const struct slab_extent *e,
			    struct slab_place *out)
{
	*out = (struct slab_place){
		.ptr = (char *)s->mem.base + e->off,
		.slab = s->id,
		.offset = e->off,
		.bytes = e->asked,
		.length = e->len,
		.slab_bytes = s->mem.bytes,
		.fd = s->mem.fd,
		.own = s->own,
	};
}

/*
 * Carves need bytes (a multiple of SLAB_ALIGN) from the i-th extent of s,
 * which is free and large enough: the rest stays free after it. false when
 * the host is out of memory for the split.
 */
static bool slab_carve_at(struct slab *s, size_t i, uint64_t need, uint64_t asked,
			  struct slab_place *out)
{
	struct slab_extent *e = &s->ext[i];
	if (e->len > need) {
		if (!slab_ext_reserve(s))
			return false;
		e = &s->ext[i];
		memmove(&s->ext[i + 2], &s->ext[i + 1], (s->next - i - 1) * sizeof *s->ext);
		s->ext[i + 1] = (struct slab_extent){ e->off + need, e->len - need, 0, false };
		s->next++;
		e->len = need;
	}
	e->used = true;
	e->asked = asked;
	s->used += need;
	slab_fill_place(s, e, out);
	return true;
}

/* The first free extent of a carved slab that holds need: 1 when carved, 0 when none, -1 on no host memory. */
static int heap_carve_existing(struct slab_heap *h, uint64_t need, uint64_t asked,
			       struct slab_place *out)
{
	for (size_t i = 0; i < h->n; i++) {
		struct slab *s = h->slabs[i];
		if (s->own || s->mem.bytes - s->used < need)
			continue;
		for (size_t k = 0; k < s->next; k++)
			if (!s->ext[k].used && s->ext[k].len >= need) {
				if (!slab_carve_at(s, k, need, asked, out))
					return -1;
				if (!s->held)
					slab_hold(h, s); /* a kept slab serves again */
				return 1;
			}
	}
	return 0;
}

static int heap_carve(struct slab_heap *h, uint64_t need, uint64_t asked, struct slab_place *out,
		      struct gpuq_error *err)
{
	int found = heap_carve_existing(h, need, asked, out);
	if (found != 0)
		return found > 0 ? 0 : gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
						 "no host memory to record a range of a slab");
	struct slab *s = slab_make(h, h->carve_bytes, false, err);
	if (!s && err->code == GPUQ_E_OUT_OF_MEMORY) /* a smaller slab may still fit */
		s = slab_make(h, round_up(need, h->be.granularity), false, err);
	if (!s)
		return -1;
	if (!slab_carve_at(s, 0, need, asked, out))
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no host memory to record a range of a slab");
	return 0;
}

/* A kept slab of its own of size in [size, size + size/8] (the smallest), or NULL. */
static struct slab *heap_find_kept_own(struct slab_heap *h, uint64_t size)
{
	struct slab *best = NULL;
	for (size_t i = 0; i < h->n; i++) {
		struct slab *s = h->slabs[i];
		if (!s->own || !slab_is_kept(s) || s->mem.bytes < size ||
		    s->mem.bytes > size + size / 8)
			continue;
		if (!best || s->mem.bytes < best->mem.bytes)
			best = s;
	}
	return best;
}

static int heap_own(struct slab_heap *h, uint64_t bytes, unsigned flags, struct slab_place *out,
		    struct gpuq_error *err)
{
	uint64_t size = round_up(bytes ? bytes : 1, h->be.granularity);
	struct slab *s = heap_find_kept_own(h, size);
	if (s && !s->held)
		slab_hold(h, s); /* a kept slab serves again */
	if (!s)
		s = slab_make(h, size, true, err);
	if (!s)
		return -1;
	s->exported = (flags & SLAB_EXPORTED) != 0;
	s->used = s->mem.bytes;
	s->ext[0].used = true;
	s->ext[0].asked = bytes;
	slab_fill_place(s, &s->ext[0], out);
	return 0;
}

int slab_alloc(struct slab_heap *h, uint64_t bytes, unsigned flags, struct slab_place *out,
	       struct gpuq_error *err)
{
	uint64_t asked = bytes; /* 0 still takes SLAB_ALIGN, so that each range has its own start */
	uint64_t need = round_up(bytes ? bytes : 1, SLAB_ALIGN);
	gpuq_error_clear(err);
	memset(out, 0, sizeof *out);
	out->fd = -1;
	pthread_mutex_lock(&h->lock);
	int rc = (flags & (SLAB_OWN | SLAB_EXPORTED)) || need > h->carve_bytes / 4
			 ? heap_own(h, asked, flags, out, err)
			 : heap_carve(h, need, asked, out, err);
	pthread_mutex_unlock(&h->lock);
	return rc;
}

/* The slab index and extent index of the range that starts at ptr: false when none. */
static bool heap_find(const struct slab_heap *h, const void *ptr, size_t *si, size_t *ei)
{
	for (size_t i = 0; i < h->n; i++) {
		const struct slab *s = h->slabs[i];
		const char *base = s->mem.base;
		if ((const char *)ptr < base || (const char *)ptr >= base + s->mem.bytes)
			continue;
		uint64_t off = (uint64_t)((const char *)ptr - base);
		size_t lo = 0, hi = s->next; /* extents are sorted by offset */
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (s->ext[mid].off < off)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo == s->next || s->ext[lo].off != off || !s->ext[lo].used)
			return false;
		*si = i;
		*ei = lo;
		return true;
	}
	return false;
}

/* Marks extent k of s free and merges it with free neighbours. */
static void slab_merge_free(struct slab *s, size_t k)
{
	s->ext[k].used = false;
	if (k + 1 < s->next && !s->ext[k + 1].used) {
		s->ext[k].len += s->ext[k + 1].len;
		memmove(&s->ext[k + 1], &s->ext[k + 2], (s->next - k - 2) * sizeof *s->ext);
		s->next--;
	}
	if (k > 0 && !s->ext[k - 1].used) {
		s->ext[k - 1].len += s->ext[k].len;
		memmove(&s->ext[k], &s->ext[k + 1], (s->next - k - 1) * sizeof *s->ext);
		s->next--;
	}
}

/* Whether another empty carved slab than s is kept (one is always kept). */
static bool heap_has_other_kept_carved(const struct slab_heap *h, const struct slab *s)
{
	for (size_t i = 0; i < h->n; i++)
		if (h->slabs[i] != s && !h->slabs[i]->own && slab_is_kept(h->slabs[i]))
			return true;
	return false;
}

/* Gives back kept slabs of their own other than s while more than keep bytes are kept. */
static void heap_trim_own_except(struct slab_heap *h, const struct slab *s, uint64_t keep)
{
	for (size_t i = h->n; i-- > 0 && heap_kept_bytes(h) > keep;) {
		struct slab *o = h->slabs[i];
		if (o == s || !o->own || !slab_is_kept(o))
			continue;
		slab_unlist(h, i);
		slab_give_back(h, o, false);
	}
}

/*
 * s (the si-th) has just become empty: keep it, or give it back. The last
 * slab of its own emptied (up to SLAB_KEEP_LAST_MAX) is kept for the next
 * buffer of its size, as the CUDA pool reuses the block a free left:
 * freeing and allocating again, the common churn, then costs no mapping.
 */
static void heap_settle_empty(struct slab_heap *h, size_t si)
{
	struct slab *s = h->slabs[si];
	if (!s->exported) {
		/*
		 * A kept slab leaves the keeper until it serves again: the keeper
		 * holds only memory that buffers use, so that a stopped gpuqd's
		 * store pins no empty slab, and a re-exec (whose next image takes
		 * over only the slabs buffers name) leaves none behind in it.
		 */
		slab_unhold(h, s);
		if (!s->own && !heap_has_other_kept_carved(h, s))
			return; /* the one carved slab always kept */
		if (s->own && s->mem.bytes <= SLAB_KEEP_LAST_MAX) {
			heap_trim_own_except(h, s, h->keep_bytes + s->mem.bytes);
			return;
		}
		if (heap_kept_bytes(h) <= h->keep_bytes)
			return; /* kept slabs (s among them) within --pool-release */
	}
	slab_unlist(h, si);
	slab_give_back(h, s, false);
}

int slab_free(struct slab_heap *h, void *ptr, uint64_t *bytes)
{
	size_t si, ei;
	pthread_mutex_lock(&h->lock);
	if (!heap_find(h, ptr, &si, &ei)) {
		pthread_mutex_unlock(&h->lock);
		return -1;
	}
	struct slab *s = h->slabs[si];
	uint64_t len = s->ext[ei].len, asked = s->ext[ei].asked;
	s->used -= len;
	slab_merge_free(s, ei);
	if (s->used == 0)
		heap_settle_empty(h, si);
	pthread_mutex_unlock(&h->lock);
	if (bytes)
		*bytes = asked;
	return 0;
}

int slab_place_of(struct slab_heap *h, const void *ptr, struct slab_place *out)
{
	size_t si, ei;
	pthread_mutex_lock(&h->lock);
	bool found = heap_find(h, ptr, &si, &ei);
	if (found)
		slab_fill_place(h->slabs[si], &h->slabs[si]->ext[ei], out);
	pthread_mutex_unlock(&h->lock);
	return found ? 0 : -1;
}

void slab_heap_stats(struct slab_heap *h, struct slab_stats *out)
{
	memset(out, 0, sizeof *out);
	pthread_mutex_lock(&h->lock);
	for (size_t i = 0; i < h->n; i++) {
		const struct slab *s = h->slabs[i];
		out->slabs++;
		out->kept += slab_is_kept(s);
		out->mapped_bytes += s->mem.bytes;
		out->used_bytes += s->used;
	}
	out->created = h->created;
	out->destroyed = h->destroyed;
	pthread_mutex_unlock(&h->lock);
}

static int range_cmp(const void *a, const void *b)
{
	const struct slab_range *x = a, *y = b;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Appends an extent to s, counting it used or not: false when the host is out of memory. */
static bool slab_push_extent(struct slab *s, struct slab_extent e)
{
	if (!slab_ext_reserve(s))
		return false;
	s->ext[s->next++] = e;
	if (e.used)
		s->used += e.len;
	return true;
}

/*
 * Lays sorted ranges over s as used extents, the gaps free. -1 when they
 * overlap or overrun the slab (err says which), -2 when the host is out of memory.
 */
static int slab_lay_ranges(struct slab *s, const struct slab_range *r, size_t n,
			   struct gpuq_error *err)
{
	uint64_t at = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t len = s->own ? s->mem.bytes : round_up(r[i].bytes ? r[i].bytes : 1, SLAB_ALIGN);
		if (r[i].offset < at || r[i].offset + len > s->mem.bytes)
			return gpuq_fail(err, GPUQ_E_IO,
					 "slab %u: a range at %llu of %llu bytes overlaps another or "
					 "runs past the slab's %llu bytes", s->id,
					 (unsigned long long)r[i].offset, (unsigned long long)len,
					 (unsigned long long)s->mem.bytes);
		if (r[i].offset > at &&
		    !slab_push_extent(s, (struct slab_extent){ at, r[i].offset - at, 0, false }))
			return -2;
		if (!slab_push_extent(s, (struct slab_extent){ r[i].offset, len, r[i].bytes, true }))
			return -2;
		at = r[i].offset + len;
	}
	if (at < s->mem.bytes &&
	    !slab_push_extent(s, (struct slab_extent){ at, s->mem.bytes - at, 0, false }))
		return -2;
	return 0;
}

static bool heap_has_id(const struct slab_heap *h, uint32_t id)
{
	for (size_t i = 0; i < h->n; i++)
		if (h->slabs[i]->id == id)
			return true;
	return false;
}

/* The adopted slab s, its ranges laid, goes into the heap's list (room reserved). */
static void heap_list_adopted(struct slab_heap *h, struct slab *s)
{
	h->slabs[h->n++] = s;
	if (s->id > h->last_id)
		h->last_id = s->id; /* ids stay unique: new slabs number after every adopted one */
	h->created++;
	s->held = h->keeper.hold != NULL; /* held already, by the store it came from */
	if (h->keeper.adopted_unheld)
		slab_hold(h, s);
}

static int slab_adopt_locked(struct slab_heap *h, struct slab *s, int fd, uint64_t bytes,
			     struct slab_range *r, size_t n, struct gpuq_error *err)
{
	if (!h->be.import)
		return gpuq_fail(err, GPUQ_E_IO, "this backend cannot adopt slabs");
	if (heap_has_id(h, s->id))
		return gpuq_fail(err, GPUQ_E_IO, "slab %u is adopted twice", s->id);
	if (!heap_list_reserve(h))
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no host memory to record a slab");
	qsort(r, n, sizeof *r, range_cmp);
	s->own = s->exported ||
		 (n == 1 && r[0].offset == 0 && round_up(r[0].bytes ? r[0].bytes : 1, SLAB_ALIGN) >
							  h->carve_bytes / 4);
	if (h->be.import(h->be.ctx, fd, bytes, &s->mem, err) != 0)
		return -1;
	s->mem.fd = fd;
	int rc = slab_lay_ranges(s, r, n, err);
	if (rc != 0) {
		h->be.destroy(h->be.ctx, &s->mem, false); /* closes fd */
		s->mem.fd = -1;
		return rc == -2 ? gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no host memory to record a range of a slab")
				: -1;
	}
	heap_list_adopted(h, s);
	return 0;
}

int slab_adopt(struct slab_heap *h, uint32_t id, int fd, uint64_t bytes, bool exported,
	       const struct slab_range *ranges, size_t n, void **base, struct gpuq_error *err)
{
	gpuq_error_clear(err);
	struct slab *s = calloc(1, sizeof *s);
	struct slab_range *r = malloc((n ? n : 1) * sizeof *r);
	if (!s || !r) {
		free(s);
		free(r);
		close(fd);
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no host memory to adopt slab %u", id);
	}
	if (n)
		memcpy(r, ranges, n * sizeof *r);
	s->id = id;
	s->exported = exported;
	s->mem.fd = fd; /* until a failure after the import has closed it */
	pthread_mutex_lock(&h->lock);
	int rc = slab_adopt_locked(h, s, fd, bytes, r, n, err);
	pthread_mutex_unlock(&h->lock);
	free(r);
	if (rc != 0) {
		if (s->mem.fd != -1)
			close(fd);
		free(s->ext);
		free(s);
		return -1;
	}
	*base = s->mem.base;
	return 0;
}
