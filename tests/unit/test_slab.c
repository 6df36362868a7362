/*
 * workers/buffer/slab.c over a fake backend (calloc'd slabs with a limit on
 * the bytes it will make): carving, alignment, coalescing on free, slabs of
 * their own, exhausting a slab, keeping and giving back empty slabs, and
 * running out of memory.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"
#include "workers/buffer/slab.h"

#define KIB 1024ull
#define MIB (1024ull * 1024)

struct fake {
	uint64_t limit, made; /* bytes it may make, bytes made and not destroyed */
	unsigned creates, destroys, lost;
	int next_fd;
};

static int fake_create(void *ctx, uint64_t bytes, struct slab_mem *mem, struct gpuq_error *err)
{
	struct fake *f = ctx;
	if (f->made + bytes > f->limit)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "fake device full: %" PRIu64 " bytes asked",
				 bytes);
	if (posix_memalign(&mem->base, 4096, bytes) != 0) /* a device's slab is page-aligned at least */
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "posix_memalign");
	mem->bytes = bytes;
	mem->fd = f->next_fd++;
	f->made += bytes;
	f->creates++;
	return 0;
}

static void fake_destroy(void *ctx, struct slab_mem *mem, bool lost)
{
	struct fake *f = ctx;
	f->made -= mem->bytes;
	f->destroys++;
	f->lost += lost;
	free(mem->base);
}

/* Adoption: fresh memory standing in for the mapping of an inherited descriptor. */
static int fake_import(void *ctx, int fd, uint64_t bytes, struct slab_mem *mem,
		       struct gpuq_error *err)
{
	(void)fd;
	return fake_create(ctx, bytes, mem, err);
}

static struct slab_heap *fake_heap(struct fake *f, uint64_t limit, uint64_t keep)
{
	memset(f, 0, sizeof *f);
	f->limit = limit;
	f->next_fd = 100;
	struct slab_backend be = { .granularity = 2 * MIB, .create = fake_create,
				   .destroy = fake_destroy, .import = fake_import, .ctx = f };
	struct slab_heap *h = slab_heap_create(&be, 8 * MIB, keep);
	CHECK(h != NULL);
	return h;
}

static struct slab_place must_alloc(struct slab_heap *h, uint64_t bytes, unsigned flags)
{
	struct slab_place p;
	struct gpuq_error err;
	CHECKF(slab_alloc(h, bytes, flags, &p, &err) == 0, "alloc %" PRIu64 ": %s", bytes,
	       err.message);
	return p;
}

TEST(slab_small_buffers_share_a_slab_aligned)
{
	struct fake f;
	struct slab_heap *h = fake_heap(&f, 64 * MIB, 0);
	struct slab_place a = must_alloc(h, 4 * KIB, 0);
	struct slab_place b = must_alloc(h, 1, 0);
	struct slab_place c = must_alloc(h, 300, 0);
	CHECK_EQ(f.creates, 1);
	CHECK_EQ(a.slab, b.slab);
	CHECK_EQ(a.slab_bytes, 8 * MIB);
	CHECK(!a.own);
	CHECK_EQ(a.offset, 0);
	CHECK_EQ(b.offset, 4 * KIB);
	CHECK_EQ(b.length, SLAB_ALIGN);
	CHECK_EQ(b.bytes, 1);
	CHECK_EQ(c.offset, 4 * KIB + SLAB_ALIGN);
	CHECK_EQ(c.length, 2 * SLAB_ALIGN);
	CHECK_EQ((uintptr_t)c.ptr % SLAB_ALIGN, 0);
	CHECK_EQ(a.fd, 100);
	struct slab_place q;
	CHECK(slab_place_of(h, c.ptr, &q) == 0);
	CHECK_EQ(q.offset, c.offset);
	CHECK(slab_place_of(h, (char *)c.ptr + 1, &q) != 0); /* not where a range starts */
	slab_heap_destroy(h, false);
	CHECK_EQ(f.destroys, 1);
}

TEST(slab_free_coalesces_neighbours)
{
	struct fake f;
	struct slab_heap *h = fake_heap(&f, 64 * MIB, 0);
	struct slab_place a = must_alloc(h, 1 * MIB, 0);
	struct slab_place b = must_alloc(h, 1 * MIB, 0);
	struct slab_place c = must_alloc(h, 1 * MIB, 0);
	uint64_t asked = 0;
	CHECK_EQ(b.bytes, 1 * MIB);
	CHECK(slab_free(h, a.ptr, &asked) == 0);
	CHECK_EQ(asked, 1 * MIB);
	CHECK(slab_free(h, c.ptr, NULL) == 0);
	CHECK(slab_free(h, c.ptr, NULL) != 0); /* twice: refused, nothing changes */
	/* a and c are free but apart: 2 MiB fits only after c (merged with the rest), until b goes. */
	struct slab_place d = must_alloc(h, 2 * MIB, 0);
	CHECK_EQ(d.offset, 2 * MIB);
	CHECK(slab_free(h, d.ptr, NULL) == 0);
	CHECK(slab_free(h, b.ptr, NULL) == 0);
	struct slab_place e = must_alloc(h, 2 * MIB, 0);
	CHECK_EQ(e.offset, 0);
	CHECK_EQ(f.creates, 1);
	slab_heap_destroy(h, false);
}

TEST(slab_exhausted_makes_another)
{
	struct fake f;
	struct slab_heap *h = fake_heap(&f, 64 * MIB, 0);
	struct slab_place p[5];
	for (int i = 0; i < 4; i++)
		p[i] = must_alloc(h, 2 * MIB, 0); /* a quarter of a slab: still carved */
	CHECK_EQ(f.creates, 1);
	p[4] = must_alloc(h, 4 * KIB, 0);
	CHECK_EQ(f.creates, 2);
	CHECK(p[4].slab != p[0].slab);
	struct slab_stats st;
	slab_heap_stats(h, &st);
	CHECK_EQ(st.slabs, 2);
	CHECK_EQ(st.used_bytes, 8 * MIB + 4 * KIB);
	/* The first slab, emptied, is kept (one carved slab always is); the second, emptied too, goes back. */
	for (int i = 0; i < 4; i++)
		CHECK(slab_free(h, p[i].ptr, NULL) == 0);
	slab_heap_stats(h, &st);
	CHECK_EQ(st.slabs, 2); /* the one carved slab always kept */
	CHECK_EQ(st.kept, 1);
	CHECK(slab_free(h, p[4].ptr, NULL) == 0);
	slab_heap_stats(h, &st);
	CHECK_EQ(st.slabs, 1);
	CHECK_EQ(st.kept, 1);
	CHECK_EQ(f.destroys, 1);
	slab_heap_destroy(h, true);
	CHECK_EQ(f.lost, 1);
}

TEST(slab_large_buffers_get_their_own)
{
	struct fake f;
	struct slab_heap *h = fake_heap(&f, 64 * MIB, 0);
	struct slab_place big = must_alloc(h, 2 * MIB + 1, 0);
	CHECK(big.own);
	CHECK_EQ(big.slab_bytes, 4 * MIB); /* rounded up to the granularity */
	CHECK_EQ(big.offset, 0);
	struct slab_place shared = must_alloc(h, 4 * KIB, SLAB_EXPORTED);
	CHECK(shared.own);
	CHECK_EQ(shared.slab_bytes, 2 * MIB);
	CHECK(shared.slab != big.slab);
	CHECK_EQ(f.creates, 2);
	CHECK(slab_free(h, big.ptr, NULL) == 0);
	CHECK(slab_free(h, shared.ptr, NULL) == 0);
	CHECK_EQ(f.destroys, 1); /* the exported one; big is kept as the last freed */
	slab_heap_destroy(h, false);
}

TEST(slab_keeps_the_last_own_slab_freed_for_the_next_buffer_of_its_size)
{
	struct fake f;
	struct slab_heap *h = fake_heap(&f, 64 * MIB, 0); /* --pool-release 0 */
	struct slab_place a = must_alloc(h, 12 * MIB, 0), b = must_alloc(h, 20 * MIB, 0);
	CHECK(slab_free(h, a.ptr, NULL) == 0);
	CHECK_EQ(f.destroys, 0); /* kept: the last one freed */
	CHECK(slab_free(h, b.ptr, NULL) == 0);
	CHECK_EQ(f.destroys, 1); /* b is now the last: a goes back */
	struct slab_place c = must_alloc(h, 19 * MIB, 0);
	CHECK_EQ(c.slab, b.slab); /* reused, nothing mapped */
	CHECK_EQ(f.creates, 2);
	CHECK(slab_free(h, c.ptr, NULL) == 0);
	struct slab_stats st;
	slab_heap_stats(h, &st);
	CHECK_EQ(st.kept, 1);
	slab_heap_destroy(h, false);
}

TEST(slab_keeps_freed_slabs_within_the_threshold)
{
	struct fake f;
	struct slab_heap *h = fake_heap(&f, 64 * MIB, 16 * MIB);
	struct slab_place a = must_alloc(h, 12 * MIB, 0);
	CHECK(slab_free(h, a.ptr, NULL) == 0);
	CHECK_EQ(f.destroys, 0);
	struct slab_place b = must_alloc(h, 11 * MIB, 0); /* 12 MiB is within an eighth */
	CHECK_EQ(b.slab, a.slab);
	CHECK_EQ(f.creates, 1);
	CHECK(slab_free(h, b.ptr, NULL) == 0);
	/* An exported slab is never kept: a client may still map it. */
	struct slab_place e = must_alloc(h, 12 * MIB, SLAB_EXPORTED);
	CHECK_EQ(e.slab, a.slab); /* a kept slab may be exported: nobody else holds it */
	CHECK(slab_free(h, e.ptr, NULL) == 0);
	CHECK_EQ(f.destroys, 1);
	slab_heap_destroy(h, false);
}

TEST(slab_out_of_memory_gives_kept_slabs_back_then_fails)
{
	struct fake f;
	struct slab_heap *h = fake_heap(&f, 20 * MIB, 64 * MIB);
	struct slab_place a = must_alloc(h, 10 * MIB, 0);
	CHECK(slab_free(h, a.ptr, NULL) == 0); /* kept: 10 MiB of the 20 */
	struct slab_place b = must_alloc(h, 16 * MIB, 0); /* fits once the kept slab is gone */
	CHECK_EQ(f.destroys, 1);
	struct slab_place p;
	struct gpuq_error err;
	CHECK(slab_alloc(h, 8 * MIB, 0, &p, &err) != 0);
	CHECK_EQ(err.code, GPUQ_E_OUT_OF_MEMORY);
	CHECK(strstr(err.message, "fake device full") != NULL);
	/* A small buffer falls back to a slab of one granule when a whole carved slab does not fit. */
	struct slab_place s = must_alloc(h, 4 * KIB, 0);
	CHECK_EQ(s.slab_bytes, 2 * MIB);
	CHECK(!s.own);
	CHECK(slab_free(h, b.ptr, NULL) == 0);
	CHECK(slab_free(h, s.ptr, NULL) == 0);
	slab_heap_destroy(h, false);
	CHECK_EQ(f.made, 0);
}

/* Random allocations and frees: every range inside its slab, none overlapping, all freed coalesce. */
TEST(slab_random_ranges_never_overlap)
{
	struct fake f;
	struct slab_heap *h = fake_heap(&f, 1024 * MIB, 0);
	struct slab_place live[64];
	bool have[64] = { false };
	uint64_t seed = 12345;
	for (int step = 0; step < 4000; step++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		unsigned i = (unsigned)(seed >> 58);
		if (have[i]) {
			CHECK(slab_free(h, live[i].ptr, NULL) == 0);
			have[i] = false;
			continue;
		}
		uint64_t bytes = 1 + (seed >> 20) % (3 * MIB);
		live[i] = must_alloc(h, bytes, 0);
		have[i] = true;
		CHECK(live[i].length >= bytes);
		CHECK(live[i].offset + live[i].length <= live[i].slab_bytes);
		for (unsigned j = 0; j < 64; j++) {
			if (j == i || !have[j] || live[j].slab != live[i].slab)
				continue;
			CHECK(live[j].offset + live[j].length <= live[i].offset ||
			      live[i].offset + live[i].length <= live[j].offset);
		}
	}
	for (unsigned j = 0; j < 64; j++)
		if (have[j])
			CHECK(slab_free(h, live[j].ptr, NULL) == 0);
	struct slab_stats st;
	slab_heap_stats(h, &st);
	CHECK_EQ(st.used_bytes, 0);
	CHECK(st.slabs <= 2); /* everything else went back: the carved slab and the last own one stay */
	slab_heap_destroy(h, false);
	CHECK_EQ(f.made, 0);
}

TEST(slab_adopt_lays_ranges_and_carves_around_them)
{
	struct fake f;
	struct gpuq_error err;
	void *base = NULL;
	struct slab_heap *h = fake_heap(&f, 64 * MIB, 0);
	struct slab_range r[] = { { 8 * KIB, 300 }, { 0, 4 * KIB } }; /* out of order on purpose */
	CHECKF(slab_adopt(h, 7, -1, 8 * MIB, false, r, 2, &base, &err) == 0, "%s", err.message);
	struct slab_place p;
	CHECK_EQ(slab_place_of(h, (char *)base + 8 * KIB, &p), 0);
	CHECK_EQ(p.slab, 7);
	CHECK_EQ(p.bytes, 300);
	CHECK(!p.own);
	struct slab_place a = must_alloc(h, 4 * KIB, 0); /* the gap between the adopted ranges */
	CHECK_EQ(a.slab, 7);
	CHECK_EQ(a.offset, 4 * KIB);
	struct slab_place big = must_alloc(h, 4 * MIB, 0); /* a new slab numbers after the adopted one */
	CHECK_EQ(big.slab, 8);
	CHECK(slab_adopt(h, 7, -1, 8 * MIB, false, r, 1, &base, &err) != 0);
	uint64_t bytes = 0;
	CHECK_EQ(slab_free(h, (char *)base + 8 * KIB, &bytes), 0);
	CHECK_EQ(bytes, 300);
	slab_heap_destroy(h, false);
	CHECK_EQ(f.made, 0);
}

TEST(slab_adopt_refuses_overlapping_ranges_and_own_slabs_stay_own)
{
	struct fake f;
	struct gpuq_error err;
	void *base = NULL;
	struct slab_heap *h = fake_heap(&f, 64 * MIB, 0);
	struct slab_range bad[] = { { 0, 4 * KIB }, { 2 * KIB, 4 * KIB } };
	CHECK(slab_adopt(h, 1, -1, 8 * MIB, false, bad, 2, &base, &err) != 0);
	CHECK(strstr(err.message, "overlaps") != NULL);
	CHECK_EQ(f.made, 0); /* the import was given back */
	struct slab_range own[] = { { 0, 5 * MIB } };
	CHECKF(slab_adopt(h, 2, -1, 6 * MIB, false, own, 1, &base, &err) == 0, "%s", err.message);
	struct slab_place p;
	CHECK_EQ(slab_place_of(h, base, &p), 0);
	CHECK(p.own);
	CHECK_EQ(p.length, 6 * MIB);
	slab_heap_destroy(h, false);
	CHECK_EQ(f.made, 0);
}

/* A keeper that writes down what it was told, in order, and whether the slab was still made then. */
struct keeper_log {
	char events[32][32];
	unsigned n;
	struct fake *f;
};

static void keeper_note(struct keeper_log *k, const char *what, const char *owner, uint32_t slab)
{
	if (k->n < 32)
		snprintf(k->events[k->n++], sizeof k->events[0], "%s %s-%u", what, owner, slab);
}

static void keeper_hold(void *ctx, const char *owner, uint32_t slab, int fd)
{
	struct keeper_log *k = ctx;
	CHECK(fd >= 100); /* the heap's descriptor */
	keeper_note(k, "hold", owner, slab);
}

static void keeper_release(void *ctx, const char *owner, uint32_t slab)
{
	struct keeper_log *k = ctx;
	keeper_note(k, "release", owner, slab);
}

/*
 * The keeper holds a slab from its creation while a buffer uses it, lets
 * it go as it becomes empty (before it is given back, while its
 * descriptor is open) and holds it again when it serves again; a heap
 * destroyed lets go of what the keeper holds (whether to keep it is the
 * keeper's choice), a lost one (a faulted device) too.
 */
TEST(slab_keeper_holds_what_buffers_use)
{
	struct fake f;
	struct keeper_log k = { .n = 0, .f = &f };
	struct slab_keeper keeper = { .hold = keeper_hold, .release = keeper_release, .ctx = &k };
	struct slab_heap *h = fake_heap(&f, 256 * MIB, 0);
	slab_heap_set_keeper(h, &keeper, "GPU-3");
	struct slab_place a = must_alloc(h, 4 * KIB, 0);       /* carved slab 1 */
	struct slab_place b = must_alloc(h, 4 * MIB, SLAB_OWN); /* slab 2 */
	CHECK_EQ(k.n, 2);
	CHECK(strcmp(k.events[0], "hold GPU-3-1") == 0);
	CHECK(strcmp(k.events[1], "hold GPU-3-2") == 0);
	CHECK_EQ(slab_free(h, b.ptr, NULL), 0); /* kept empty: out of the keeper */
	CHECK_EQ(k.n, 3);
	CHECK(strcmp(k.events[2], "release GPU-3-2") == 0);
	struct slab_place c = must_alloc(h, 4 * MIB, SLAB_OWN); /* the kept slab 2 again */
	CHECK_EQ(c.slab, 2);
	CHECK_EQ(k.n, 4);
	CHECK(strcmp(k.events[3], "hold GPU-3-2") == 0);
	struct slab_place e = must_alloc(h, 64 * MIB, SLAB_EXPORTED); /* slab 3, never kept */
	CHECK_EQ(slab_free(h, e.ptr, NULL), 0);
	CHECK_EQ(k.n, 6);
	CHECK(strcmp(k.events[4], "hold GPU-3-3") == 0);
	CHECK(strcmp(k.events[5], "release GPU-3-3") == 0);
	(void)a;
	slab_heap_destroy(h, false); /* slabs 1 and 2 */
	CHECK_EQ(k.n, 8);
	CHECK(strcmp(k.events[6], "release GPU-3-1") == 0);
	CHECK(strcmp(k.events[7], "release GPU-3-2") == 0);

	/* The one carved slab kept empty serves again: the keeper holds it again. */
	k.n = 0;
	h = fake_heap(&f, 256 * MIB, 0);
	slab_heap_set_keeper(h, &keeper, "GPU-3");
	struct slab_place g = must_alloc(h, 1 * MIB, 0); /* carved slab 1 */
	CHECK_EQ(slab_free(h, g.ptr, NULL), 0);          /* kept empty: out of the keeper */
	struct slab_place r = must_alloc(h, 1 * MIB, 0); /* carved from the kept slab 1 */
	CHECK_EQ(r.slab, 1);
	CHECK_EQ(k.n, 3);
	CHECK(strcmp(k.events[1], "release GPU-3-1") == 0);
	CHECK(strcmp(k.events[2], "hold GPU-3-1") == 0);
	struct slab_place r2 = must_alloc(h, 1 * MIB, 0); /* slab 1 in use and held: nothing said */
	CHECK_EQ(k.n, 3);
	(void)r2;
	slab_heap_destroy(h, false);

	k.n = 0;
	h = fake_heap(&f, 256 * MIB, 0);
	slab_heap_set_keeper(h, &keeper, "GPU-0");
	must_alloc(h, 4 * KIB, 0);
	slab_heap_destroy(h, true); /* a faulted device: its bytes are gone, the keeper lets go */
	CHECK_EQ(k.n, 2);
	CHECK(strcmp(k.events[1], "release GPU-0-1") == 0);
}

/* Adopted slabs are held already (they came from the keeper), unless the keeper says otherwise. */
TEST(slab_keeper_and_adopted_slabs)
{
	struct fake f;
	struct keeper_log k = { .n = 0, .f = &f };
	struct slab_keeper keeper = { .hold = keeper_hold, .release = keeper_release, .ctx = &k };
	struct slab_range r = { 0, 4 * KIB };
	struct gpuq_error err;
	void *base;
	struct slab_heap *h = fake_heap(&f, 256 * MIB, 0);
	slab_heap_set_keeper(h, &keeper, "GPU-1");
	CHECK_EQ(slab_adopt(h, 7, 100, 8 * MIB, false, &r, 1, &base, &err), 0);
	CHECK_EQ(k.n, 0);
	CHECK_EQ(slab_free(h, base, NULL), 0); /* its last buffer: the keeper lets it go */
	CHECK_EQ(k.n, 1);
	CHECK(strcmp(k.events[0], "release GPU-1-7") == 0);
	slab_heap_destroy(h, false); /* kept empty: released already */
	CHECK_EQ(k.n, 1);

	k.n = 0;
	keeper.adopted_unheld = true; /* an image that stored nothing handed it over */
	h = fake_heap(&f, 256 * MIB, 0);
	slab_heap_set_keeper(h, &keeper, "GPU-1");
	CHECK_EQ(slab_adopt(h, 7, 100, 8 * MIB, false, &r, 1, &base, &err), 0);
	CHECK_EQ(k.n, 1);
	CHECK(strcmp(k.events[0], "hold GPU-1-7") == 0);
	slab_heap_destroy(h, false);
	CHECK_EQ(k.n, 2);
}
