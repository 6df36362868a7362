/*
 * Rings (docs/protocol.md, "Rings"): a put or get through a region's slots,
 * handed over chunk by chunk through counters in the region. The test is
 * the client: it writes or reads the slots and the `posted` counter while
 * the job runs. Bit-exact transfers longer than the ring, every refusal of
 * the request, a counter that goes wrong, a client that posts nothing, the
 * status counter of a job that ends before it runs, and a ring whose
 * ephemeral region went with its connection.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "tests/integration/lease_util.h"
#include "workers/backend/host_patterns.h"

#define KIB 1024u
#define MIB (1024u * 1024u)

enum { POSTED, MOVED, STATUS };

static unsigned char *random_data(size_t n, uint64_t seed)
{
	unsigned char *p = malloc(n);
	CHECK(p);
	host_fill_random(p, n, GPUQ_DTYPE_BYTES, seed);
	return p;
}

/* A ring of `slots` slots of `slot` bytes in region `name`: counters at byte 0, slots from 4 KiB. */
struct ring {
	struct gpuq_region region;
	uint64_t slot;
	unsigned slots;
	_Atomic uint64_t *counter;
	char text[64]; /* the `region` field: NAME[4096:END] */
};

static void ring_make_in(struct gpuq_client *c, const char *name, uint64_t slot, unsigned slots,
			 bool ephemeral, struct ring *r)
{
	struct gpuq_error err;
	uint64_t bytes = 4 * KIB + slot * slots;
	CHECKF(gpuq_region_create(c, name, bytes, 0, ephemeral, &r->region, &err) == 0,
	       "region_create %s: %s", name, err.message);
	r->slot = slot;
	r->slots = slots;
	r->counter = (_Atomic uint64_t *)r->region.ptr;
	snprintf(r->text, sizeof r->text, "%s[%u:%llu]", name, 4 * KIB, (unsigned long long)bytes);
}

static void ring_make(struct gpuq_client *c, const char *name, uint64_t slot, unsigned slots,
		      struct ring *r)
{
	ring_make_in(c, name, slot, slots, false, r);
}

static void ring_reset(struct ring *r)
{
	for (int i = POSTED; i <= STATUS; i++)
		atomic_store(&r->counter[i], 0);
}

static unsigned char *slot_of(const struct ring *r, uint64_t k)
{
	return (unsigned char *)r->region.ptr + 4 * KIB + (k % r->slots) * r->slot;
}

/*
 * Begins a put or get through a ring (detached): buffer, region and the
 * ring map; a slot_bytes or counters of RING_ABSENT leaves that key out,
 * RING_NIL sends it as nil. The caller may add fields before sending it.
 */
#define RING_ABSENT (-1)
#define RING_NIL (-2)

static void ring_put_field(struct mp_map *ring, const char *key, int64_t v)
{
	if (v == RING_NIL)
		mp_put_nil(ring, key);
	else if (v != RING_ABSENT)
		mp_put_u64(ring, key, (uint64_t)v);
}

static void ring_begin(struct gpuq_client *c, struct mp_map *req, bool put, const char *buffer,
		       const char *region, int64_t slot_bytes, int64_t counters)
{
	struct mp_map ring;
	gpuq_request_begin(c, req, put ? "put" : "get");
	mp_put_str(req, "buffer", buffer);
	if (region)
		mp_put_str(req, "region", region);
	mp_map_init(&ring);
	ring_put_field(&ring, "slot_bytes", slot_bytes);
	ring_put_field(&ring, "counters", counters);
	mp_put_map(req, "ring", &ring);
}

/* A put or get through the ring; the reply (the job, or a refusal). */
static struct gpuq_reply *ring_request(struct gpuq_client *c, bool put, const char *buffer,
				       const char *region, int64_t slot_bytes, int64_t counters)
{
	struct mp_map req;
	ring_begin(c, &req, put, buffer, region, slot_bytes, counters);
	return call(c, &req, NULL, 0);
}

/* A put or get through ring r (its counters zeroed first), checked on the way with `verify`. */
static uint64_t ring_start(struct gpuq_client *c, bool put, const char *buffer, struct ring *r,
			   bool verify)
{
	struct mp_map req;
	ring_reset(r);
	ring_begin(c, &req, put, buffer, r->text, (int64_t)r->slot, 0);
	mp_put_bool(&req, "verify", verify);
	struct gpuq_reply *rep = call(c, &req, NULL, 0);
	expect_ok(rep, put ? "ring put" : "ring get");
	uint64_t job = reply_u64(rep, "job.job");
	gpuq_reply_free(rep);
	return job;
}

/* Waits until the daemon's `moved` reaches `want` or the status says the job ended; false then. */
static bool wait_moved(const struct ring *r, uint64_t want)
{
	for (unsigned spins = 0; atomic_load(&r->counter[MOVED]) < want; spins++) {
		if (atomic_load(&r->counter[STATUS]) != 0)
			return false;
		CHECKF(spins < 2000000, "the ring's moved counter stayed at %llu (want %llu)",
		       (unsigned long long)atomic_load(&r->counter[MOVED]), (unsigned long long)want);
		usleep(10);
	}
	return true;
}

/* The client's side of a put: each chunk into its slot once free, then posted. */
static void client_put(struct ring *r, const unsigned char *data, uint64_t n)
{
	uint64_t chunks = (n + r->slot - 1) / r->slot;
	for (uint64_t k = 0; k < chunks; k++) {
		if (k >= r->slots && !wait_moved(r, k - r->slots + 1))
			return;
		uint64_t len = n - k * r->slot < r->slot ? n - k * r->slot : r->slot;
		memcpy(slot_of(r, k), data + k * r->slot, len);
		atomic_store(&r->counter[POSTED], k + 1);
	}
}

/* The client's side of a get: each chunk out of its slot once moved, then posted. */
static void client_get(struct ring *r, unsigned char *out, uint64_t n)
{
	uint64_t chunks = (n + r->slot - 1) / r->slot;
	for (uint64_t k = 0; k < chunks; k++) {
		if (!wait_moved(r, k + 1))
			return;
		uint64_t len = n - k * r->slot < r->slot ? n - k * r->slot : r->slot;
		memcpy(out + k * r->slot, slot_of(r, k), len);
		atomic_store(&r->counter[POSTED], k + 1);
	}
}

static void expect_job(struct gpuq_client *c, uint64_t job, uint64_t bytes)
{
	struct gpuq_reply *w = job_request(c, "wait", job, 0);
	char path[16];
	expect_ok(w, "the ring's job");
	CHECK_EQ(reply_u64(w, "job.result.bytes"), bytes);
	reply_str(w, "job.result.path", path, sizeof path);
	CHECK_STR(path, "ring");
	gpuq_reply_free(w);
}

TEST(ring_put_and_get_are_bit_exact_through_a_ring_smaller_than_the_buffer)
{
	struct daemon_proc d;
	struct ring r;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, MIB);
	ring_make(c, "ring", 64 * KIB, 4, &r);
	const uint64_t n = 3 * MIB + 16 + 13; /* 49 chunks, the last of 29 bytes */
	unsigned char *data = random_data(n, 81);
	do_alloc(c, "b", 0, n + 96);
	do_fill_random(c, "b", 82);
	/* put into b[96:], verified: the host's checksum of what went through the slots */
	uint64_t job = ring_start(c, true, "b[96:]", &r, true);
	client_put(&r, data, n);
	expect_job(c, job, n);
	CHECK_EQ(atomic_load(&r.counter[STATUS]), 1);
	CHECK_EQ(atomic_load(&r.counter[MOVED]), 49);
	int fd = memfd_create("back", MFD_CLOEXEC);
	do_get(c, "b", fd);
	size_t got;
	unsigned char *back = fd_slurp(fd, &got);
	CHECK_EQ(got, n + 96);
	CHECK(memcmp(back + 96, data, n) == 0);
	close(fd);
	/* get the same range back through the ring */
	unsigned char *out = malloc(n);
	CHECK(out != NULL);
	memset(out, 0x5a, n);
	job = ring_start(c, false, "b[96:]", &r, true);
	client_get(&r, out, n);
	expect_job(c, job, n);
	CHECK_EQ(atomic_load(&r.counter[STATUS]), 1);
	CHECK(memcmp(out, data, n) == 0);
	free(out);
	free(back);
	free(data);
	gpuq_region_unmap(&r.region);
	gpuq_close(c);
	daemon_stop(&d);
}

static void expect_refused(struct gpuq_reply *r, const char *contains)
{
	expect_error(r, GPUQ_E_BAD_REQUEST, contains);
	gpuq_reply_free(r);
}

TEST(ring_refusals_name_the_problem)
{
	struct daemon_proc d;
	struct ring r;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, MIB);
	ring_make(c, "q", 64 * KIB, 4, &r); /* 4 KiB of counters, then [4096, 266240) */
	do_alloc(c, "b", 0, MIB);
	expect_refused(ring_request(c, true, "b", NULL, 64 * KIB, 0), "field 'ring' needs 'region'");
	expect_refused(ring_request(c, true, "b", r.text, RING_ABSENT, 0),
		       "needs 'slot_bytes' and 'counters'");
	expect_refused(ring_request(c, false, "b", r.text, 64 * KIB, RING_ABSENT),
		       "needs 'slot_bytes' and 'counters'");
	/* nil is absent: a nil slot_bytes divided by zero and killed gpuqd; nil counters read 0 */
	expect_refused(ring_request(c, true, "b", r.text, RING_NIL, 0),
		       "needs 'slot_bytes' and 'counters'");
	expect_refused(ring_request(c, false, "b", r.text, RING_NIL, 0),
		       "needs 'slot_bytes' and 'counters'");
	expect_refused(ring_request(c, true, "b", r.text, 64 * KIB, RING_NIL),
		       "needs 'slot_bytes' and 'counters'");
	expect_refused(ring_request(c, true, "b", r.text, 4, 0), "slot_bytes");
	expect_refused(ring_request(c, true, "b", r.text, 64 * KIB + 4, 0), "not a multiple of 8");
	expect_refused(ring_request(c, true, "b", "q[4096:200000]", 64 * KIB, 0),
		       "are not two or more whole slots of 65536 bytes");
	expect_refused(ring_request(c, true, "b", "q[4096:69632]", 64 * KIB, 0),
		       "are not two or more whole slots");
	expect_refused(ring_request(c, true, "b", r.text, 64 * KIB, 4), "must be a multiple of 8");
	expect_refused(ring_request(c, true, "b", r.text, 64 * KIB, 4096 + 8),
		       "outside its slots [4096, 266240)");
	expect_refused(ring_request(c, false, "b", r.text, 64 * KIB, 4096 - 16),
		       "outside its slots");
	expect_refused(ring_request(c, true, "b", "q[0:131072]", 64 * KIB, 266240),
		       "bytes in region 'q'"); /* at the region's end */
	expect_refused(ring_request(c, true, "b", "q[0:131072]", 64 * KIB, 266240 - 16),
		       "bytes in region 'q'"); /* 16 of its 24 bytes in the region */
	struct mp_map req;
	ring_begin(c, &req, false, "b", r.text, 64 * KIB, 0);
	mp_put_str(&req, "path", "staged");
	expect_refused(call(c, &req, NULL, 0), "always takes path ring; leave path out");
	struct gpuq_reply *none = ring_request(c, true, "b", "nosuch", 64 * KIB, 0);
	expect_error(none, GPUQ_E_NOT_FOUND, "region 'nosuch' not found");
	gpuq_reply_free(none);
	/* what was refused left the buffer and the region usable */
	unsigned char *data = random_data(MIB, 83);
	uint64_t job = ring_start(c, true, "b", &r, false);
	client_put(&r, data, MIB);
	expect_job(c, job, MIB);
	CHECK_EQ(do_checksum(c, "b"), host_checksum(data, MIB));
	free(data);
	gpuq_region_unmap(&r.region);
	gpuq_close(c);
	daemon_stop(&d);
}

static void expect_job_error(struct gpuq_client *c, uint64_t job, enum gpuq_errc code,
			     const char *contains)
{
	struct gpuq_reply *w = job_request(c, "wait", job, 0);
	expect_error(w, code, contains);
	gpuq_reply_free(w);
}

/*
 * The client's counter is another process's memory: a value that goes
 * backwards, past the transfer's chunks, or (get) past what gpuqd moved
 * ends the job with bad_request, and the status counter says it failed.
 */
TEST(ring_counter_that_goes_wrong_fails_the_job)
{
	struct daemon_proc d;
	struct ring r;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, MIB);
	ring_make(c, "w", 64 * KIB, 4, &r);
	do_alloc(c, "b", 0, 8 * 64 * KIB);
	uint64_t job = ring_start(c, true, "b", &r, false);
	atomic_store(&r.counter[POSTED], 2);
	CHECK(wait_moved(&r, 2));
	atomic_store(&r.counter[POSTED], 1);
	expect_job_error(c, job, GPUQ_E_BAD_REQUEST, "ring counter 'posted' went from 2 to 1");
	CHECK_EQ(atomic_load(&r.counter[STATUS]), 2);
	job = ring_start(c, true, "b", &r, false);
	atomic_store(&r.counter[POSTED], 9);
	expect_job_error(c, job, GPUQ_E_BAD_REQUEST, "went from 0 to 9; it counts up to 8");
	CHECK_EQ(atomic_load(&r.counter[STATUS]), 2);
	job = ring_start(c, false, "b", &r, false);
	CHECK(wait_moved(&r, 1));
	atomic_store(&r.counter[POSTED], 7);
	expect_job_error(c, job, GPUQ_E_BAD_REQUEST, "the chunks gpuqd has moved so far");
	CHECK_EQ(atomic_load(&r.counter[STATUS]), 2);
	gpuq_region_unmap(&r.region);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A client that posts nothing: the job fails with timeout after
 * --transfer-idle-timeout. A ring job cancelled while it waits behind
 * another on its buffer never runs: its status counter still says it
 * ended.
 */
TEST(ring_client_that_posts_nothing_times_out_and_a_cancelled_ring_says_so)
{
	struct daemon_proc d;
	struct ring r, q;
	require_backend();
	daemon_start(&d, "--transfer-idle-timeout", "300", NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, MIB);
	ring_make(c, "idle", 64 * KIB, 2, &r);
	ring_make(c, "next", 64 * KIB, 2, &q);
	do_alloc(c, "b", 0, 4 * 64 * KIB);
	uint64_t first = ring_start(c, true, "b", &r, false);
	uint64_t second = ring_start(c, true, "b", &q, false); /* waits behind the first, on b */
	struct gpuq_reply *x = job_request(c, "cancel", second, 0);
	expect_ok(x, "cancel the queued ring job");
	gpuq_reply_free(x);
	expect_job_error(c, second, GPUQ_E_CANCELLED, "");
	CHECK_EQ(atomic_load(&q.counter[STATUS]), 2);
	CHECK_EQ(atomic_load(&q.counter[MOVED]), 0);
	expect_job_error(c, first, GPUQ_E_TIMEOUT, "posted no chunk for 300 ms");
	CHECK_EQ(atomic_load(&r.counter[STATUS]), 2);
	gpuq_region_unmap(&r.region);
	gpuq_region_unmap(&q.region);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A ring in an ephemeral region goes with the connection that made it:
 * once that connection closes no one raises its counters, so its jobs are
 * cancelled at once, the running one and the one queued behind it, and the
 * buffer is free for other clients' jobs, long before the idle timeout.
 */
TEST(ring_in_an_ephemeral_region_is_cancelled_when_its_connection_closes)
{
	struct daemon_proc d;
	struct ring r, q;
	require_backend();
	daemon_start(&d, "--transfer-idle-timeout", "20000", NULL);
	struct gpuq_client *maker = client_open(&d), *other = client_open(&d);
	require_memlock(maker, MIB);
	ring_make_in(maker, "gone", 64 * KIB, 2, true, &r);
	ring_make_in(maker, "gone2", 64 * KIB, 2, true, &q);
	do_alloc(other, "b", 0, 4 * 64 * KIB);
	unsigned char *data = random_data(64 * KIB, 31);
	uint64_t running = ring_start(maker, true, "b", &r, false);
	uint64_t queued = ring_start(maker, true, "b", &q, false); /* behind the first, on b */
	memcpy(slot_of(&r, 0), data, 64 * KIB);
	atomic_store(&r.counter[POSTED], 1);
	CHECK(wait_moved(&r, 1)); /* running, one chunk of four moved */
	gpuq_close(maker);
	expect_job_error(other, running, GPUQ_E_CANCELLED, "cancelled after 65536 bytes");
	/* Queued, or taken by the worker and waiting there for b: cancelled either way. */
	expect_job_error(other, queued, GPUQ_E_CANCELLED, "cancelled");
	CHECK_EQ(atomic_load(&r.counter[STATUS]), 2);
	CHECK_EQ(atomic_load(&q.counter[STATUS]), 2);
	do_checksum(other, "b"); /* the buffer's next job runs */
	free(data);
	gpuq_region_unmap(&r.region);
	gpuq_region_unmap(&q.region);
	gpuq_close(other);
	daemon_stop(&d);
}

/* Waits (up to 10 s) until device 0 runs jobs again after a reset. */
static void wait_serving(struct gpuq_client *c)
{
	struct gpuq_error err = { 0 };
	for (int i = 0; i < 1000; i++) {
		struct mp_map req;
		struct gpuq_reply *r;
		gpuq_request_begin(c, &req, "noop");
		mp_put_bool(&req, "wait", true);
		if (gpuq_call(c, &req, NULL, 0, &r, &err) == 0) {
			gpuq_reply_error(r, &err);
			gpuq_reply_free(r);
		}
		if (err.code == GPUQ_OK)
			return;
		usleep(10000);
	}
	CHECKF(false, "device 0 does not serve after its reset: %s", err.message);
}

/*
 * reset_device cancels the running ring job (which ends at once: it only
 * waits for its client), and the checksum queued behind it on the same
 * buffer must not start in the moment before the reset: it fails as the
 * reset's. The cancel used to come before the reset was asked for, and the
 * worker could start the checksum in between, so that its client got the
 * checksum of a buffer lost a moment later. Rounds, since that was a race.
 */
TEST(ring_cancelled_by_a_reset_lets_no_job_queued_behind_it_start)
{
	struct daemon_proc d;
	struct ring r;
	require_backend();
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, MIB);
	ring_make(c, "rr", 64 * KIB, 2, &r);
	for (unsigned round = 1; round <= 8; round++) {
		char name[16];
		snprintf(name, sizeof name, "b%u", round);
		do_alloc(c, name, 0, 4 * 64 * KIB);
		uint64_t ring_job = ring_start(c, true, name, &r, false);
		wait_job_running(c, ring_job);
		uint64_t sum = lease_submit(c, "checksum", name); /* queued behind the ring job */
		do_reset_device(c, 0);
		expect_job_error(c, ring_job, GPUQ_E_CANCELLED, "");
		expect_job_error(c, sum, GPUQ_E_DEVICE_ERROR, "before this job started");
		wait_serving(c);
		do_free(c, name);
	}
	gpuq_region_unmap(&r.region);
	gpuq_close(c);
	daemon_stop(&d);
}

/* Chunks of `chunk` bytes of fd (as long as `want`) that already hold want's bytes there. */
static unsigned chunks_landed(int fd, const unsigned char *want, uint64_t n, uint64_t chunk)
{
	unsigned landed = 0;
	for (uint64_t at = 0; at < n; at += chunk) {
		unsigned char head[8];
		CHECK(pread(fd, head, sizeof head, (off_t)at) == (ssize_t)sizeof head);
		landed += memcmp(head, want + at, sizeof head) == 0;
	}
	return landed;
}

/*
 * A ring's DMAs take turns with the device's other transfers (sched_wait.h):
 * a copy engine runs what is queued in order, and keeps to one stream
 * while it has copies queued, so a ring that kept its own queue full
 * would hold a staged get beside it back until the ring ended. With the
 * engines slowed, a ring get of 48 chunks (its slots hold them all: it
 * never waits for its client) and a staged get of 48 chunks into a memfd
 * start together; when the ring has ended, the staged get has landed a
 * fair part of its chunks, not the one or two that come before the ring's
 * queue fills. Counts of chunks, not times.
 */
TEST(ring_dmas_take_turns_with_a_staged_transfer_beside_them)
{
	if (test_backend_is_cuda())
		SKIP("counts DMAs on the host engines, slowed (bench sched measures the GPU)");
	struct daemon_proc d;
	struct ring r;
	const uint64_t chunk = 64 * KIB, chunks = 48, n = chunks * chunk;
	setenv("GPUQ_HOST_ENGINE_DELAY_US", "d2h:20000", 1);
	daemon_start(&d, "--staging-slot", "64K", "--staging-slots", "64", NULL);
	unsetenv("GPUQ_HOST_ENGINE_DELAY_US");
	struct gpuq_client *c = client_open(&d);
	require_memlock(c, 4 * MIB);
	ring_make(c, "turns", chunk, (unsigned)chunks, &r);
	unsigned char *want = random_data(n, 91);
	int src = memfd_create("src", MFD_CLOEXEC), dst = memfd_create("dst", MFD_CLOEXEC);
	CHECK(src >= 0 && dst >= 0 && write(src, want, n) == (ssize_t)n && ftruncate(dst, n) == 0);
	CHECK(lseek(src, 0, SEEK_SET) == 0);
	do_alloc(c, "ringed", 0, n);
	do_alloc(c, "staged", 0, n);
	do_fill_random(c, "ringed", 92);
	do_put(c, "staged", src);
	uint64_t ringed = ring_start(c, false, "ringed", &r, false);
	struct mp_map req;
	gpuq_request_begin(c, &req, "get");
	mp_put_str(&req, "buffer", "staged");
	mp_put_u64(&req, "fds", 1);
	struct gpuq_reply *rep = call(c, &req, &dst, 1);
	expect_ok(rep, "the staged get");
	uint64_t staged = reply_u64(rep, "job.job");
	gpuq_reply_free(rep);
	CHECK(wait_moved(&r, chunks) || atomic_load(&r.counter[MOVED]) == chunks);
	unsigned landed = chunks_landed(dst, want, n, chunk);
	CHECKF(landed >= chunks / 4, "the staged get had landed %u of its %llu chunks when the "
	       "ring's %llu had all moved: the ring's DMAs did not take turns with it",
	       landed, (unsigned long long)chunks, (unsigned long long)chunks);
	expect_job(c, ringed, n);
	struct gpuq_reply *w = job_request(c, "wait", staged, 0);
	expect_ok(w, "the staged get");
	gpuq_reply_free(w);
	CHECK_EQ(chunks_landed(dst, want, n, chunk), chunks);
	free(want);
	close(src);
	close(dst);
	gpuq_region_unmap(&r.region);
	gpuq_close(c);
	daemon_stop(&d);
}
