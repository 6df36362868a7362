/*
 * Buffers in exportable slabs (--buffer-memory, workers/buffer/slab.h):
 * which memory `devices` says buffers come from, many small buffers carved
 * from shared slabs without touching one another, large ones on their own,
 * the descriptors slabs hold given back as buffers go, and the pool still
 * selectable. On the host backend slabs are memfds, so CI runs every path;
 * on CUDA they are VMM allocations.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "tests/harness.h"
#include "tests/integration/fixture.h"

#define KIB 1024ull
#define MIB (1024ull * 1024)

/* Device 0's `buffer_memory` in `devices`, into out. */
static void device_buffer_memory(struct gpuq_client *c, char *out, size_t size)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "devices");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "devices");
	const msgpack_object *list = reply_path(r, "devices");
	CHECK(list && list->type == MSGPACK_OBJECT_ARRAY && list->via.array.size >= 1);
	const msgpack_object *v = msg_map_get(&list->via.array.ptr[0], "buffer_memory");
	CHECKF(v && v->type == MSGPACK_OBJECT_STR, "device 0 lacks buffer_memory");
	snprintf(out, size, "%.*s", (int)v->via.str.size, v->via.str.ptr);
	gpuq_reply_free(r);
}

TEST(slabs_are_the_default_and_the_pool_stays_selectable)
{
	struct daemon_proc d;
	char how[16];
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	device_buffer_memory(c, how, sizeof how);
	/* CUDA falls back to the pool where the driver lacks VMM; the host never does. */
	CHECKF(strcmp(how, "vmm") == 0 || (test_backend_is_cuda() && strcmp(how, "pool") == 0),
	       "buffer_memory %s", how);
	gpuq_close(c);
	daemon_stop(&d);

	daemon_start(&d, "--buffer-memory", "pool", NULL);
	c = client_open(&d);
	device_buffer_memory(c, how, sizeof how);
	CHECK_STR(how, "pool");
	do_alloc(c, "p", 0, 3 * MIB + 5);
	do_fill_random(c, "p", 3);
	uint64_t sum = do_checksum(c, "p");
	do_fill_random(c, "p", 3);
	CHECK_EQ(do_checksum(c, "p"), sum);
	do_free(c, "p");
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * 96 small buffers of different sizes share slabs: each filled with its own
 * data, every other one freed and its place taken by a new one, and the
 * survivors' checksums unchanged, so no two ranges overlap.
 */
TEST(slabs_small_buffers_keep_their_own_bytes)
{
	enum { N = 96 };
	struct daemon_proc d;
	uint64_t sums[N];
	char name[32];
	daemon_start(&d, "--buffer-memory", test_backend_is_cuda() ? "auto" : "vmm", NULL);
	struct gpuq_client *c = client_open(&d);
	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof name, "s%d", i);
		do_alloc(c, name, 0, 1 + (uint64_t)i * 997 % (64 * KIB));
		do_fill_random(c, name, 100 + (uint64_t)i);
		sums[i] = do_checksum(c, name);
	}
	for (int i = 0; i < N; i += 2) {
		snprintf(name, sizeof name, "s%d", i);
		do_free(c, name);
	}
	for (int i = 0; i < N; i += 2) {
		snprintf(name, sizeof name, "t%d", i);
		do_alloc(c, name, 0, 3 * KIB + (uint64_t)i);
		do_fill_random(c, name, 900 + (uint64_t)i);
	}
	for (int i = 1; i < N; i += 2) {
		snprintf(name, sizeof name, "s%d", i);
		CHECKF(do_checksum(c, name) == sums[i], "%s changed after its neighbours moved", name);
	}
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * Each slab holds a descriptor; a large buffer's own slab gives its
 * descriptor back once another own slab is freed after it (the last one
 * freed is kept for reuse), small ones share one (the carved slab kept
 * for reuse), and a shareable buffer's slab is never kept.
 */
TEST(slabs_descriptors_go_with_their_buffers)
{
	if (test_backend_is_cuda())
		SKIP("counts the host backend's memfds");
	struct daemon_proc d;
	daemon_start(&d, "--buffer-memory", "vmm", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "warm", 0, 4 * KIB); /* the carved slab, kept from now on */
	unsigned base = daemon_fd_count(&d);
	do_alloc(c, "a", 0, 4 * KIB);
	do_alloc(c, "b", 0, 100 * KIB);
	CHECK_EQ(daemon_fd_count(&d), base); /* carved from the same slab */
	do_alloc(c, "big", 0, 64 * MIB);
	CHECK_EQ(daemon_fd_count(&d), base + 1);
	do_free(c, "big");
	CHECK_EQ(daemon_fd_count(&d), base + 1); /* kept, the last of its own freed */
	do_alloc(c, "big2", 0, 64 * MIB);
	CHECK_EQ(daemon_fd_count(&d), base + 1); /* ... and reused */
	do_alloc(c, "big3", 0, 32 * MIB);
	CHECK_EQ(daemon_fd_count(&d), base + 2);
	do_free(c, "big3");
	do_free(c, "big2");
	CHECK_EQ(daemon_fd_count(&d), base + 1); /* the last freed kept, the other gone */
	do_free(c, "a");
	do_free(c, "b");
	do_free(c, "warm");
	CHECK_EQ(daemon_fd_count(&d), base + 1); /* the empty carved slab and the last own one are kept */
	gpuq_close(c);
	daemon_stop(&d);
}

/* bench_alloc: one row per size and memory, pool first, with sane numbers. */
TEST(slabs_bench_alloc_measures_the_pool_and_slabs_in_one_run)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	struct mp_array sizes;
	gpuq_request_begin(c, &req, "bench_alloc");
	mp_put_bool(&req, "wait", true);
	mp_put_u64(&req, "repeats", 5);
	mp_array_init(&sizes);
	mp_array_u64(&sizes, 4 * KIB);
	mp_array_u64(&sizes, 3 * MIB);
	mp_put_array(&req, "sizes", &sizes);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "bench_alloc");
	const msgpack_object *rows = reply_path(r, "job.result.rows");
	CHECK(rows && rows->type == MSGPACK_OBJECT_ARRAY);
	CHECK_EQ(rows->via.array.size, 4);
	static const char *const memory[] = { "pool", "vmm", "pool", "vmm" };
	static const uint64_t bytes[] = { 4 * KIB, 4 * KIB, 3 * MIB, 3 * MIB };
	for (uint32_t i = 0; i < 4; i++) {
		const msgpack_object *row = &rows->via.array.ptr[i];
		const msgpack_object *m = msg_map_get(row, "memory");
		const msgpack_object *b = msg_map_get(row, "bytes");
		const msgpack_object *p50 = msg_map_get(row, "alloc_p50_us");
		const msgpack_object *p99 = msg_map_get(row, "alloc_p99_us");
		CHECK(m && m->type == MSGPACK_OBJECT_STR && m->via.str.size == strlen(memory[i]) &&
		      memcmp(m->via.str.ptr, memory[i], m->via.str.size) == 0);
		CHECK(b && b->via.u64 == bytes[i]);
		CHECK(p50 && p99 && p50->type == MSGPACK_OBJECT_FLOAT64 && p50->via.f64 > 0 &&
		      p99->via.f64 >= p50->via.f64);
	}
	gpuq_reply_free(r);
	/* The buffers the benchmark made are all gone: the whole arena is free again. */
	if (!test_backend_is_cuda())
		CHECK_EQ(device_mem_free(c, 0), 1ull << 30);
	gpuq_close(c);
	daemon_stop(&d);
}

/* bench_alloc's request with `repeats` (when given) and `sizes` (count of them, each `size`). */
static struct gpuq_reply *bench_alloc_asking(struct gpuq_client *c, uint64_t repeats,
					     unsigned nsizes, uint64_t size)
{
	struct mp_map req;
	struct mp_array sizes;
	gpuq_request_begin(c, &req, "bench_alloc");
	mp_put_bool(&req, "wait", true);
	if (repeats != UINT64_MAX)
		mp_put_u64(&req, "repeats", repeats);
	mp_array_init(&sizes);
	for (unsigned i = 0; i < nsizes; i++)
		mp_array_u64(&sizes, size);
	mp_put_array(&req, "sizes", &sizes);
	return call(c, &req, NULL, 0);
}

/* bench_alloc's refusals name the field and what it takes, before any job runs. */
TEST(slabs_bench_alloc_refuses_bad_repeats_and_sizes)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	static const struct {
		uint64_t repeats;
		unsigned nsizes;
		uint64_t size;
		const char *says;
	} bad[] = {
		{ 0, 1, 4096, "field 'repeats': 0 is out of range (1 to 1000)" },
		{ 1001, 1, 4096, "field 'repeats': 1001 is out of range (1 to 1000)" },
		{ UINT64_MAX, 0, 0, "field 'sizes': give 1 to" },
		{ UINT64_MAX, 9, 4096, "field 'sizes': give 1 to 8 sizes, not 9" },
		{ UINT64_MAX, 1, 0, "field 'sizes': entry 0 is not a byte count" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct gpuq_reply *r = bench_alloc_asking(c, bad[i].repeats, bad[i].nsizes, bad[i].size);
		expect_error(r, GPUQ_E_BAD_REQUEST, bad[i].says);
		gpuq_reply_free(r);
	}
	struct mp_map req;
	gpuq_request_begin(c, &req, "bench_alloc");
	mp_put_str(&req, "sizes", "4K");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_BAD_REQUEST, "'sizes'");
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}
