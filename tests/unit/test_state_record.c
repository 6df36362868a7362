/*
 * daemon/state_record.c: a snapshot's round trip through the payload and
 * the memfd's slots (GPUs' uuids, buffers kept for GPUs not served), generations taking turns, a torn write (half a slot
 * written: payload or header) recovering the previous generation, a record
 * of a newer format refused with a clear message, a corrupted one refused,
 * and an empty one told apart.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/state_record.h"
#include "protocol/msg.h"
#include "tests/harness.h"
#include "workers/backend/host_patterns.h"

static struct state_buffer test_buffers[3] = {
	{ .name = "weights", .owner = 1000, .device = 0, .dtype = GPUQ_DTYPE_BF16, .count = 1u << 20,
	  .bytes = 2u << 20, .slab = 3, .slab_offset = 4096, .shareable = false, .ephemeral = false,
	  .state = "ready", .writers = 0, .slab_bytes = 32u << 20, .slab_fd = 23, .shape = "1024,1024",
	  .uuid = "GPU-5ee4a5e1-0f6c-b2d3-7a1e-93b1e2f0c8d4" },
	{ .name = "kv", .owner = 1001, .device = 1, .dtype = GPUQ_DTYPE_BYTES, .count = 77,
	  .bytes = 77, .slab = 0, .slab_offset = 0, .shareable = true, .ephemeral = true,
	  .state = "suspect", .writers = 2, .slab_fd = -1, .conn_serial = 9,
	  .suspect = "a job writing it was cut short by a restart" },
	{ .name = "gone", .owner = 1000, .device = 1, .dtype = GPUQ_DTYPE_F32, .count = 2, .bytes = 8,
	  .slab = 1, .slab_offset = 64, .state = "lost", .slab_fd = -1,
	  .lost = "when gpu 1 was reset after an administrator's request (uid 0)" },
};
/* Kept for a GPU the writer did not serve. */
static struct state_buffer test_absent[1] = {
	{ .name = "dataset", .owner = 1002, .device = -1, .dtype = GPUQ_DTYPE_F32, .count = 4,
	  .bytes = 16, .slab = 9, .slab_offset = 0, .state = "ready", .slab_bytes = 2u << 20,
	  .slab_fd = 31, .uuid = "GPU-00000000-1111-2222-3333-444444444444" },
};
static struct state_region test_regions[1] = {
	{ .name = "in", .owner = 1000, .device = 1, .bytes = 1u << 21, .fd = 17, .ephemeral = true,
	  .conn_serial = 12, .created_ms = 123456, .uuid = "HOST-1" },
};
static struct state_lease test_leases[1] = {
	{ .id = 42, .buffer = "kv", .buffer_owner = 1001, .device = 1, .uid = 1001, .pid = 4242,
	  .write = true, .conn_serial = 13, .since_ms = 654321, .uuid = "HOST-1" },
};
static struct state_quota test_quotas[2] = {
	{ .uid = 1000, .buffer_bytes = 2u << 20, .region_bytes = 1u << 21 },
	{ .uid = 1001, .buffer_bytes = 77, .region_bytes = 0 },
};

static struct state_snapshot test_snapshot(void)
{
	struct state_snapshot s = { .backend = "host", .devices = 2, .recoveries = 3,
				    .job_ids_below = (1ull << 40) + 7, .stopped = true,
				    .buffers = test_buffers, .nbuffers = 3,
				    .regions = test_regions, .nregions = 1,
				    .leases = test_leases, .nleases = 1,
				    .quotas = test_quotas, .nquotas = 2,
				    .absent = test_absent, .nabsent = 1 };
	return s;
}

/* Encodes s and writes it as the record's next generation. */
static void write_snapshot(struct state_record *r, const struct state_snapshot *s)
{
	msgpack_sbuffer sb;
	struct gpuq_error err;
	msgpack_sbuffer_init(&sb);
	state_snapshot_encode(s, &sb);
	CHECKF(state_record_write(r, sb.data, sb.size, &err) == 0, "write: %s", err.message);
	msgpack_sbuffer_destroy(&sb);
}

/* Reads the record and decodes it; the generation read. */
static uint64_t read_snapshot(int fd, struct state_snapshot *out)
{
	void *p = NULL;
	size_t len = 0;
	uint64_t gen = 0;
	struct gpuq_error err;
	CHECKF(state_record_read(fd, &p, &len, &gen, &err) == 0, "read: %s", err.message);
	CHECKF(state_snapshot_decode(p, len, out, &err) == 0, "decode: %s", err.message);
	free(p);
	return gen;
}

static void read_header(int fd, unsigned slot, struct state_record_header *h)
{
	CHECK(pread(fd, h, sizeof *h, (off_t)(slot * sizeof *h)) == (ssize_t)sizeof *h);
}

TEST(state_record_round_trip)
{
	struct gpuq_error err;
	struct state_record *r = state_record_create(&err);
	CHECKF(r != NULL, "%s", err.message);
	struct state_snapshot s = test_snapshot(), back;
	write_snapshot(r, &s);
	CHECK_EQ(read_snapshot(state_record_fd(r), &back), 1);
	CHECK_STR(back.backend, "host");
	CHECK_EQ(back.devices, 2);
	CHECK_EQ(back.recoveries, 3);
	CHECK_EQ(back.job_ids_below, (1ull << 40) + 7);
	CHECK(back.stopped);
	CHECK_EQ(back.nbuffers, 3);
	for (size_t i = 0; i < 3; i++) {
		const struct state_buffer *a = &test_buffers[i], *b = &back.buffers[i];
		CHECK_STR(b->name, a->name);
		CHECK_STR(b->state, a->state);
		CHECK_EQ(b->owner, a->owner);
		CHECK_EQ(b->device, a->device);
		CHECK_EQ(b->dtype, a->dtype);
		CHECK_EQ(b->count, a->count);
		CHECK_EQ(b->bytes, a->bytes);
		CHECK_EQ(b->slab, a->slab);
		CHECK_EQ(b->slab_offset, a->slab_offset);
		CHECK_EQ(b->shareable, a->shareable);
		CHECK_EQ(b->ephemeral, a->ephemeral);
		CHECK_EQ(b->writers, a->writers);
		CHECK_EQ(b->slab_bytes, a->slab_bytes);
		CHECK_EQ(b->slab_fd, a->slab_fd);
		CHECK_EQ(b->conn_serial, a->conn_serial);
		CHECK_STR(b->suspect, a->suspect);
		CHECK_STR(b->lost, a->lost);
		CHECK_STR(b->shape, a->shape);
		CHECK_STR(b->uuid, a->uuid);
	}
	CHECK_EQ(back.nabsent, 1);
	CHECK_STR(back.absent[0].name, "dataset");
	CHECK_STR(back.absent[0].uuid, test_absent[0].uuid);
	CHECK_EQ(back.absent[0].device, -1);
	CHECK_EQ(back.absent[0].slab, 9);
	CHECK_EQ(back.absent[0].slab_fd, 31);
	CHECK_EQ(back.absent[0].slab_bytes, 2u << 20);
	CHECK_STR(back.regions[0].uuid, "HOST-1");
	CHECK_STR(back.leases[0].uuid, "HOST-1");
	char why[128];
	CHECK(state_buffer_suspect(&back.buffers[0], why, sizeof why) == NULL);
	CHECK(state_buffer_suspect(&back.buffers[1], why, sizeof why) == why);
	CHECK_STR(why, "2 jobs were writing it when gpuqd ended; its bytes may be partly written");
	CHECK_EQ(back.nregions, 1);
	CHECK_STR(back.regions[0].name, "in");
	CHECK_EQ(back.regions[0].fd, 17);
	CHECK(back.regions[0].ephemeral);
	CHECK_EQ(back.regions[0].conn_serial, 12);
	CHECK_EQ(back.regions[0].created_ms, 123456);
	CHECK_EQ(back.nleases, 1);
	CHECK_EQ(back.leases[0].id, 42);
	CHECK_STR(back.leases[0].buffer, "kv");
	CHECK_EQ(back.leases[0].pid, 4242);
	CHECK(back.leases[0].write);
	CHECK_EQ(back.leases[0].conn_serial, 13);
	CHECK_EQ(back.leases[0].since_ms, 654321);
	CHECK_EQ(back.nquotas, 2);
	CHECK_EQ(back.quotas[0].region_bytes, 1u << 21);
	CHECK_EQ(back.quotas[1].buffer_bytes, 77);
	state_snapshot_free(&back);
	/* The next generations take turns in the two slots; the newest is read. */
	s.nbuffers = 1;
	write_snapshot(r, &s);
	s.nbuffers = 0;
	write_snapshot(r, &s);
	CHECK_EQ(state_record_generation(r), 3);
	CHECK_EQ(read_snapshot(state_record_fd(r), &back), 3);
	CHECK_EQ(back.nbuffers, 0);
	state_snapshot_free(&back);
	struct state_record_header h0, h1;
	read_header(state_record_fd(r), 0, &h0);
	read_header(state_record_fd(r), 1, &h1);
	CHECK_EQ(h1.generation, 3);
	CHECK_EQ(h0.generation, 2);
	state_record_close(r);
}

TEST(state_record_empty_is_told_apart)
{
	struct gpuq_error err;
	struct state_record *r = state_record_create(&err);
	void *p = NULL;
	size_t len = 0;
	uint64_t gen = 0;
	CHECK(r != NULL);
	CHECK_EQ(state_record_read(state_record_fd(r), &p, &len, &gen, &err), 1);
	state_record_close(r);
}

/*
 * A crash while generation 3 was being written: its slot (generation 1's)
 * holds the new header and the first half of the new payload, the rest
 * still generation 1's bytes. Generation 2 is read. Then the same with
 * the header itself half written.
 */
TEST(state_record_torn_write_recovers_the_previous_generation)
{
	struct gpuq_error err;
	struct state_record *r = state_record_create(&err);
	int fd = state_record_fd(r);
	struct state_snapshot s = test_snapshot(), back;
	struct state_record_header h;
	write_snapshot(r, &s); /* 1, slot 1 */
	s.nleases = 0;
	write_snapshot(r, &s); /* 2, slot 0 */
	read_header(fd, 1, &h);
	size_t area = (size_t)h.capacity;
	char *old = malloc(area);
	CHECK(pread(fd, old, area, (off_t)h.offset) == (ssize_t)area);
	s = test_snapshot();
	s.nregions = 0;
	write_snapshot(r, &s); /* 3, slot 1, the same area (it fits) */
	struct state_record_header h3;
	read_header(fd, 1, &h3);
	CHECK_EQ(h3.generation, 3);
	CHECK_EQ(h3.offset, h.offset);
	size_t half = (size_t)h3.length / 2;
	CHECK(pwrite(fd, old + half, area - half, (off_t)(h3.offset + half)) ==
	      (ssize_t)(area - half));
	CHECK_EQ(read_snapshot(fd, &back), 2);
	CHECK_EQ(back.nleases, 0);
	CHECK_EQ(back.nregions, 1);
	state_snapshot_free(&back);
	/* Now the header half written: generation 3's first half, generation 1's second. */
	CHECK(pwrite(fd, (char *)&h + 32, 32, 64 + 32) == 32);
	CHECK_EQ(read_snapshot(fd, &back), 2);
	state_snapshot_free(&back);
	free(old);
	state_record_close(r);
}

TEST(state_record_of_a_newer_format_is_refused)
{
	struct gpuq_error err;
	struct state_record *r = state_record_create(&err);
	int fd = state_record_fd(r);
	struct state_snapshot s = test_snapshot();
	struct state_record_header h;
	void *p = NULL;
	size_t len = 0;
	uint64_t gen = 0;
	write_snapshot(r, &s);
	write_snapshot(r, &s);
	/* Generation 2 (slot 0) as a newer gpuqd would write it: an intact header of a newer version. */
	read_header(fd, 0, &h);
	h.version = STATE_RECORD_VERSION + 1;
	h.header_check = host_checksum(&h, offsetof(struct state_record_header, header_check));
	CHECK(pwrite(fd, &h, sizeof h, 0) == (ssize_t)sizeof h);
	CHECK_EQ(state_record_read(fd, &p, &len, &gen, &err), -1);
	CHECK_EQ(err.code, GPUQ_E_UNSUPPORTED_VERSION);
	char newer[40], ours[40];
	snprintf(newer, sizeof newer, "format version %u", STATE_RECORD_VERSION + 1);
	snprintf(ours, sizeof ours, "reads version %u", STATE_RECORD_VERSION);
	CHECKF(strstr(err.message, newer) && strstr(err.message, ours), "%s", err.message);
	/* A payload that says a newer version inside is refused by the decoder too. */
	msgpack_sbuffer sb;
	struct mp_map m;
	struct state_snapshot back;
	msgpack_sbuffer_init(&sb);
	mp_map_init(&m);
	mp_put_u64(&m, "version", STATE_RECORD_VERSION + 1);
	mp_map_finish(&m, &sb);
	CHECK_EQ(state_snapshot_decode(sb.data, sb.size, &back, &err), -1);
	CHECK_EQ(err.code, GPUQ_E_UNSUPPORTED_VERSION);
	CHECKF(strstr(err.message, newer), "%s", err.message);
	msgpack_sbuffer_destroy(&sb);
	state_record_close(r);
}

TEST(state_record_corrupted_is_refused)
{
	struct gpuq_error err;
	struct state_record *r = state_record_create(&err);
	int fd = state_record_fd(r);
	struct state_snapshot s = test_snapshot(), back;
	struct state_record_header h;
	void *p = NULL;
	size_t len = 0;
	uint64_t gen = 0;
	write_snapshot(r, &s);
	write_snapshot(r, &s);
	for (unsigned t = 0; t < 2; t++) { /* one byte of each payload flipped */
		char c;
		read_header(fd, t, &h);
		CHECK(pread(fd, &c, 1, (off_t)(h.offset + h.length / 3)) == 1);
		c ^= 0x40;
		CHECK(pwrite(fd, &c, 1, (off_t)(h.offset + h.length / 3)) == 1);
	}
	CHECK_EQ(state_record_read(fd, &p, &len, &gen, &err), -1);
	CHECK_EQ(err.code, GPUQ_E_IO);
	CHECKF(strstr(err.message, "no slot checks out") && strstr(err.message, "checksum"), "%s",
	       err.message);
	/* Not a record at all: no magic. */
	char junk[128];
	memset(junk, 'x', sizeof junk);
	CHECK(pwrite(fd, junk, sizeof junk, 0) == (ssize_t)sizeof junk);
	CHECK_EQ(state_record_read(fd, &p, &len, &gen, &err), -1);
	CHECKF(strstr(err.message, "magic"), "%s", err.message);
	/* A payload that is not msgpack's map is refused by the decoder. */
	CHECK_EQ(state_snapshot_decode(junk, sizeof junk, &back, &err), -1);
	CHECK_EQ(err.code, GPUQ_E_IO);
	state_record_close(r);
}

/* A payload that grows past its area gets a new one; both slots stay readable. */
TEST(state_record_grows)
{
	enum { N = 2000 };
	struct gpuq_error err;
	struct state_record *r = state_record_create(&err);
	struct state_buffer *many = calloc(N, sizeof *many);
	struct state_snapshot s = test_snapshot(), back;
	for (size_t i = 0; i < N; i++) {
		many[i] = test_buffers[0];
		snprintf(many[i].name, sizeof many[i].name, "b%zu", i);
		many[i].slab_offset = i * 256;
	}
	write_snapshot(r, &s);
	s.buffers = many;
	s.nbuffers = N;
	write_snapshot(r, &s);
	write_snapshot(r, &s);
	CHECK_EQ(read_snapshot(state_record_fd(r), &back), 3);
	CHECK_EQ(back.nbuffers, N);
	CHECK_STR(back.buffers[N - 1].name, "b1999");
	CHECK_EQ(back.buffers[N - 1].slab_offset, (N - 1) * 256);
	state_snapshot_free(&back);
	free(many);
	state_record_close(r);
}

/* Fields added after the first format (the re-exec's) read as zero from a record without them. */
TEST(state_record_without_the_added_fields_reads_them_as_zero)
{
	struct gpuq_error err;
	struct state_snapshot back;
	struct mp_map root, b;
	struct mp_array buffers, empty;
	msgpack_sbuffer sb;
	mp_map_init(&root);
	mp_put_u64(&root, "version", 1);
	mp_put_str(&root, "backend", "host");
	mp_put_i64(&root, "devices", 1);
	mp_map_init(&b);
	mp_put_str(&b, "name", "old");
	mp_put_u64(&b, "owner", 0);
	mp_put_i64(&b, "device", 0);
	mp_put_str(&b, "dtype", "bytes");
	mp_put_u64(&b, "count", 8);
	mp_put_u64(&b, "bytes", 8);
	mp_put_u64(&b, "slab", 1);
	mp_put_u64(&b, "slab_offset", 0);
	mp_put_bool(&b, "shareable", false);
	mp_put_bool(&b, "ephemeral", false);
	mp_put_str(&b, "state", "ready");
	mp_put_u64(&b, "writers", 0);
	mp_array_init(&buffers);
	mp_array_map(&buffers, &b);
	mp_put_array(&root, "buffers", &buffers);
	struct mp_map region, lease;
	struct mp_array regions, leases;
	mp_map_init(&region); /* a region and a lease as the first format wrote them: no `conn` */
	mp_put_str(&region, "name", "in");
	mp_put_u64(&region, "owner", 0);
	mp_put_i64(&region, "device", 0);
	mp_put_u64(&region, "bytes", 4096);
	mp_put_i64(&region, "fd", 9);
	mp_put_bool(&region, "ephemeral", true);
	mp_array_init(&regions);
	mp_array_map(&regions, &region);
	mp_put_array(&root, "regions", &regions);
	mp_map_init(&lease);
	mp_put_u64(&lease, "id", 5);
	mp_put_str(&lease, "buffer", "old");
	mp_put_u64(&lease, "buffer_owner", 0);
	mp_put_i64(&lease, "device", 0);
	mp_put_u64(&lease, "uid", 0);
	mp_put_i64(&lease, "pid", 77);
	mp_put_bool(&lease, "write", false);
	mp_array_init(&leases);
	mp_array_map(&leases, &lease);
	mp_put_array(&root, "leases", &leases);
	mp_array_init(&empty);
	mp_put_array(&root, "quota", &empty);
	msgpack_sbuffer_init(&sb);
	mp_map_finish(&root, &sb);
	CHECKF(state_snapshot_decode(sb.data, sb.size, &back, &err) == 0, "decode: %s", err.message);
	msgpack_sbuffer_destroy(&sb);
	CHECK_EQ(back.nbuffers, 1);
	CHECK_EQ(back.buffers[0].slab_bytes, 0); /* so a re-exec does not take it over */
	CHECK_EQ(back.buffers[0].conn_serial, 0);
	CHECK_STR(back.buffers[0].suspect, "");
	CHECK_STR(back.buffers[0].lost, "");
	CHECK_STR(back.buffers[0].uuid, ""); /* placed by its index, as the gpuqd that wrote it did */
	CHECK_EQ(back.nabsent, 0);
	CHECK_EQ(back.nregions, 1);
	CHECK_EQ(back.regions[0].conn_serial, 0); /* an ephemeral region of no known connection: it goes */
	CHECK_EQ(back.nleases, 1);
	CHECK_EQ(back.leases[0].conn_serial, 0); /* a lease of no known holder: it ends */
	CHECK_EQ(back.leases[0].since_ms, 0);
	CHECK_EQ(back.regions[0].created_ms, 0);
	CHECK_EQ(back.recoveries, 0);
	CHECK_EQ(back.job_ids_below, 0); /* a record from before it: ids go on from where they would */
	CHECK(!back.stopped);                /* and it reads as a death */
	state_snapshot_free(&back);
}

/*
 * A record taken over (a re-exec, a crash under the descriptor store)
 * continues after its newest generation in the same memfd: a reader of
 * that memfd sees each later generation, and the generation before the
 * takeover stays readable until the one after it is whole.
 */
TEST(state_record_adopt_continues_after_the_newest_generation)
{
	struct gpuq_error err;
	struct state_record *r = state_record_create(&err);
	struct state_snapshot s = test_snapshot(), back;
	write_snapshot(r, &s); /* 1 */
	s.nleases = 0;
	write_snapshot(r, &s); /* 2 */
	int held = dup(state_record_fd(r)); /* what the store keeps */
	CHECK(held >= 0);
	int fd = dup(state_record_fd(r));
	state_record_close(r); /* the image that wrote it ends */
	struct state_record *a = state_record_adopt(fd, &err);
	CHECKF(a != NULL, "adopt: %s", err.message);
	CHECK_EQ(state_record_fd(a), fd);
	CHECK_EQ(state_record_generation(a), 2);
	s.nregions = 0;
	write_snapshot(a, &s); /* 3, into the slot generation 1 held, in an area of its own */
	CHECK_EQ(read_snapshot(held, &back), 3);
	CHECK_EQ(back.nregions, 0);
	CHECK_EQ(back.nleases, 0);
	CHECK_EQ(back.nbuffers, 3);
	state_snapshot_free(&back);
	s = test_snapshot();
	write_snapshot(a, &s); /* 4 */
	CHECK_EQ(read_snapshot(held, &back), 4);
	CHECK_EQ(back.nleases, 1);
	state_snapshot_free(&back);
	state_record_close(a);
	close(held);
}

/*
 * A torn write before the takeover (generation 3's header half written
 * when gpuqd died): the takeover continues after generation 2, the newest
 * intact one, and its next generation replaces the torn one.
 */
TEST(state_record_adopt_after_a_torn_write)
{
	struct gpuq_error err;
	struct state_record *r = state_record_create(&err);
	struct state_snapshot s = test_snapshot(), back;
	struct state_record_header h1;
	write_snapshot(r, &s); /* 1, slot 1 */
	read_header(state_record_fd(r), 1, &h1);
	s.nleases = 0;
	write_snapshot(r, &s); /* 2, slot 0 */
	s.nregions = 0;
	write_snapshot(r, &s); /* 3, slot 1 */
	/* Tear generation 3: its header's second half is generation 1's again. */
	CHECK(pwrite(state_record_fd(r), (char *)&h1 + 32, 32, 64 + 32) == 32);
	int fd = dup(state_record_fd(r));
	state_record_close(r);
	CHECK_EQ(read_snapshot(fd, &back), 2);
	state_snapshot_free(&back);
	struct state_record *a = state_record_adopt(fd, &err);
	CHECKF(a != NULL, "adopt: %s", err.message);
	CHECK_EQ(state_record_generation(a), 2);
	s = test_snapshot();
	s.nbuffers = 1;
	write_snapshot(a, &s); /* 3 again, whole this time */
	CHECK_EQ(read_snapshot(fd, &back), 3);
	CHECK_EQ(back.nbuffers, 1);
	CHECK_EQ(back.nregions, 1);
	state_snapshot_free(&back);
	state_record_close(a);
}

/* A record no slot of which checks out is not taken over, and its descriptor is closed. */
TEST(state_record_adopt_refuses_a_corrupted_record)
{
	struct gpuq_error err;
	struct state_record *r = state_record_create(&err);
	struct state_snapshot s = test_snapshot();
	write_snapshot(r, &s);
	int fd = dup(state_record_fd(r));
	state_record_close(r);
	char junk[128];
	memset(junk, 0x5a, sizeof junk);
	CHECK(pwrite(fd, junk, sizeof junk, 0) == (ssize_t)sizeof junk);
	CHECK(state_record_adopt(fd, &err) == NULL);
	CHECK(strstr(err.message, "no slot checks out") != NULL);
	CHECK(fcntl(fd, F_GETFD) < 0); /* closed */
}
