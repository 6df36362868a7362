/*
 * Pipelined host<->device copies (put and get): every kind of client
 * endpoint, odd sizes around slot boundaries, ranges, --verify, the
 * registered path, cancellation, progress events, every refusal and
 * failure, and bench_copy. They run on both tiers (host and cuda).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "workers/backend/host_patterns.h"

/* ---- helpers ---- */

/* A put or get of buffer (which may carry a range) through fd, waited for, with options. */
struct xfer_opts {
	bool verify;
	const char *path;
	int64_t offset, length; /* -1: not sent */
	bool progress;
};

static struct gpuq_reply *xfer(struct gpuq_client *c, const char *op, const char *buffer, int fd,
			       const struct xfer_opts *o)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, "buffer", buffer);
	mp_put_bool(&req, "wait", true);
	if (o && o->verify)
		mp_put_bool(&req, "verify", true);
	if (o && o->path)
		mp_put_str(&req, "path", o->path);
	if (o && o->offset >= 0)
		mp_put_u64(&req, "offset", (uint64_t)o->offset);
	if (o && o->length >= 0)
		mp_put_u64(&req, "length", (uint64_t)o->length);
	if (o && o->progress)
		mp_put_bool(&req, "progress", true);
	if (fd < 0)
		return call(c, &req, NULL, 0);
	mp_put_u64(&req, "fds", 1);
	return call(c, &req, &fd, 1);
}

static const struct xfer_opts plain = { .offset = -1, .length = -1 };

/* A successful transfer: checks bytes and path, returns nothing. */
static void xfer_ok(struct gpuq_client *c, const char *op, const char *buffer, int fd,
		    const struct xfer_opts *o, uint64_t bytes, const char *path)
{
	struct gpuq_reply *r = xfer(c, op, buffer, fd, o ? o : &plain);
	char got[32], what[96];
	snprintf(what, sizeof what, "%s %s", op, buffer);
	expect_ok(r, what);
	CHECK_EQ(reply_u64(r, "job.result.bytes"), bytes);
	reply_str(r, "job.result.path", got, sizeof got);
	CHECKF(!path || strcmp(got, path) == 0, "%s took path %s, expected %s", what, got, path);
	if (o && o->verify)
		CHECK(reply_path(r, "job.result.verified") &&
		      reply_path(r, "job.result.verified")->via.boolean);
	gpuq_reply_free(r);
}

static void expect_fail(struct gpuq_reply *r, enum gpuq_errc code, const char *contains)
{
	expect_error(r, code, contains);
	gpuq_reply_free(r);
}

static unsigned char *random_bytes(size_t n, uint64_t seed)
{
	unsigned char *p = malloc(n ? n : 1);
	CHECK(p);
	host_fill_random(p, n, GPUQ_DTYPE_BYTES, seed);
	return p;
}

/* A regular file under /tmp holding data (unlinked; the descriptor keeps it). */
static int temp_file(const void *data, size_t n, int flags)
{
	char path[] = "/tmp/gpuq-copy-test-XXXXXX";
	int fd = mkostemp(path, O_CLOEXEC | flags);
	CHECKF(fd >= 0, "mkostemp: %s", strerror(errno));
	unlink(path);
	size_t put = 0;
	while (put < n) {
		ssize_t w = write(fd, (const char *)data + put, n - put);
		CHECKF(w > 0, "write: %s", strerror(errno));
		put += (size_t)w;
	}
	CHECK(lseek(fd, 0, SEEK_SET) == 0);
	return fd;
}

static void check_fd_holds(int fd, const void *want, size_t n, const char *what)
{
	size_t got_n;
	unsigned char *got = fd_slurp(fd, &got_n);
	CHECKF(got_n == n, "%s holds %zu bytes, expected %zu", what, got_n, n);
	CHECKF(memcmp(got, want, n) == 0, "%s differs from what was put", what);
	free(got);
}

/* A child that writes data into a pipe (in pieces of `piece`, pausing `pause_us` between); returns the read end. */
static int pipe_source(const void *data, size_t n, size_t piece, unsigned pause_us, pid_t *child)
{
	int p[2];
	CHECK(pipe(p) == 0);
	*child = fork();
	CHECK(*child >= 0);
	if (*child == 0) {
		close(p[0]);
		for (size_t off = 0; off < n; off += piece) {
			size_t k = n - off < piece ? n - off : piece;
			if (write(p[1], (const char *)data + off, k) != (ssize_t)k)
				_exit(1);
			if (pause_us)
				usleep(pause_us);
		}
		_exit(0);
	}
	close(p[1]);
	return p[0];
}

/* A child that reads everything from a pipe and checks it against want; returns the write end. */
static int pipe_sink(const void *want, size_t n, pid_t *child)
{
	int p[2];
	CHECK(pipe(p) == 0);
	*child = fork();
	CHECK(*child >= 0);
	if (*child == 0) {
		close(p[1]);
		unsigned char *got = malloc(n + 1);
		size_t k = 0;
		ssize_t r;
		while ((r = read(p[0], got + k, n + 1 - k)) > 0)
			k += (size_t)r;
		_exit(k == n && memcmp(got, want, n) == 0 ? 0 : 1);
	}
	close(p[0]);
	return p[1];
}

static void reap_ok(pid_t child, const char *what)
{
	int status;
	CHECK(waitpid(child, &status, 0) == child);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the child saw wrong bytes", what);
}

/* ---- every endpoint ---- */

static void round_trip_memfd(struct gpuq_client *c, size_t n, uint64_t seed, bool verify)
{
	struct xfer_opts o = plain;
	o.verify = verify;
	int src = memfd_random(n, seed);
	size_t k;
	unsigned char *want = fd_slurp(src, &k);
	do_alloc(c, "rt", 0, n);
	xfer_ok(c, "put", "rt", src, &o, n, "staged");
	CHECK_EQ(do_checksum(c, "rt"), host_checksum(want, n));
	int dst = memfd_create("dst", MFD_CLOEXEC);
	xfer_ok(c, "get", "rt", dst, &o, n, "staged");
	check_fd_holds(dst, want, n, "the memfd got back");
	free(want);
	close(src);
	close(dst);
	do_free(c, "rt");
}

TEST(copy_memfd_odd_sizes_around_slots)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", "--staging-slots", "3", "--copy-threads", "3",
		     NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t sizes[] = { 1, 7, 8, 9, 4095, 4096, 4097, 3 * 4096 - 1, 3 * 4096,
				 3 * 4096 + 1, 100 * 4096 + 7, 1000003 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		round_trip_memfd(c, sizes[i], 300 + i, i % 2 == 0);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * Slots of several XFER_PART_BYTES (1 MiB) are read and written by
 * several copy threads in parts (transfer_impl.h): sizes that end inside
 * a part, on a part's edge and past it, bit-exact both ways; and a source
 * that ends inside the second part of a slot names the byte where it
 * ended, though the parts after it read nothing.
 */
TEST(copy_slots_in_parts_bit_exact_and_short_source_named)
{
	struct daemon_proc d;
	const size_t mib = 1 << 20;
	daemon_start(&d, "--staging-slot", "4M", "--staging-slots", "4", "--copy-threads", "3",
		     NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t sizes[] = { 16 * mib, 17 * mib + 8, 21 * mib - 3, 5 * mib + 4097 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		round_trip_memfd(c, sizes[i], 700 + i, i % 2 == 0);
	do_alloc(c, "w", 0, 16 * mib);
	do_fill_random(c, "w", 71);
	uint64_t before = do_checksum(c, "w");
	int small = memfd_random(5 * mib + 24, 72);
	struct xfer_opts o = plain;
	o.length = 16 * mib;
	expect_fail(xfer(c, "put", "w", small, &o), GPUQ_E_IO, "ended after 5242904 of the 16777216");
	CHECK_EQ(do_checksum(c, "w"), before); /* a regular source is measured first */
	close(small);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * Slots of 128K or more cut a transfer's first and last slot into pieces
 * of 1/8, 1/8, 1/4 and 1/2 slot (transfer_staged.c): sizes around four
 * slots and odd sizes whose last piece takes the odd bytes, through
 * memfds and a file, bit-exact.
 */
TEST(copy_pieces_at_both_ends_of_large_slots)
{
	struct daemon_proc d;
	const size_t slot = 128 << 10;
	daemon_start(&d, "--staging-slot", "128K", "--staging-slots", "6", "--copy-threads", "3",
		     NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t sizes[] = { 4 * slot - 1, 4 * slot, 4 * slot + 1, 4 * slot + 7, 9 * slot + 13,
				 23 * slot + 4101 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		round_trip_memfd(c, sizes[i], 500 + i, i % 2 == 1);
	const size_t n = 9 * slot + 5;
	unsigned char *data = random_bytes(n, 77);
	int src = temp_file(data, n, 0), dst = temp_file(NULL, 0, 0);
	struct xfer_opts o = plain;
	o.verify = true;
	do_alloc(c, "f", 0, n);
	xfer_ok(c, "put", "f", src, &o, n, "staged");
	CHECK_EQ(do_checksum(c, "f"), host_checksum(data, n));
	xfer_ok(c, "get", "f", dst, &o, n, "staged");
	check_fd_holds(dst, data, n, "the file got back");
	free(data);
	close(src);
	close(dst);
	gpuq_close(c);
	daemon_stop(&d);
}

/* How many of the daemon's mappings name the file (/proc/PID/maps). */
static unsigned daemon_maps_of(pid_t pid, const char *path)
{
	char name[64], line[512];
	unsigned n = 0;
	snprintf(name, sizeof name, "/proc/%d/maps", (int)pid);
	FILE *f = fopen(name, "re");
	CHECK(f != NULL);
	while (f && fgets(line, sizeof line, f))
		n += strstr(line, path) != NULL;
	if (f)
		fclose(f);
	return n;
}

/*
 * A get into a file a path names keeps its mapping for the next get into
 * it (map_cache.h), and the idle worker lets it go by itself a second
 * later: nothing else is asked of the daemon meanwhile.
 */
TEST(copy_get_into_a_named_file_keeps_its_mapping_a_second)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "8K", "--staging-slots", "4", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 100000 + 3;
	unsigned char *data = random_bytes(n, 43);
	char path[] = "/tmp/gpuq-kept-map-XXXXXX";
	int dst = mkostemp(path, O_CLOEXEC);
	CHECK(dst >= 0 && ftruncate(dst, (off_t)n) == 0);
	int src = temp_file(data, n, 0);
	struct xfer_opts o = plain;
	o.verify = true;
	do_alloc(c, "k", 0, n);
	xfer_ok(c, "put", "k", src, &o, n, "staged");
	xfer_ok(c, "get", "k", dst, &o, n, "staged");
	CHECK_EQ(daemon_maps_of(d.pid, path), 1);
	CHECK(lseek(dst, 0, SEEK_SET) == 0);
	xfer_ok(c, "get", "k", dst, &o, n, "staged"); /* through the kept mapping */
	check_fd_holds(dst, data, n, "the file got twice");
	CHECK_EQ(daemon_maps_of(d.pid, path), 1);
	unsigned waited = 0;
	while (daemon_maps_of(d.pid, path) > 0 && waited++ < 100)
		usleep(50000);
	CHECK_EQ(daemon_maps_of(d.pid, path), 0);
	unlink(path);
	free(data);
	close(src);
	close(dst);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(copy_without_copy_threads_still_works)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", "--copy-threads", "0", NULL);
	struct gpuq_client *c = client_open(&d);
	round_trip_memfd(c, 50 * 4096 + 3, 17, true);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(copy_regular_file_both_ways)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "8K", "--staging-slots", "4", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 300000 + 5;
	unsigned char *data = random_bytes(n, 41);
	int src = temp_file(data, n, 0);
	do_alloc(c, "f", 0, n);
	struct xfer_opts o = plain;
	o.verify = true;
	xfer_ok(c, "put", "f", src, &o, n, "staged");
	CHECK_EQ(lseek(src, 0, SEEK_CUR), n); /* the offset moved as read() would move it */
	CHECK_EQ(do_checksum(c, "f"), host_checksum(data, n));
	int dst = temp_file(NULL, 0, 0);
	xfer_ok(c, "get", "f", dst, &o, n, "staged"); /* mapped: open for reading and writing */
	CHECK_EQ(lseek(dst, 0, SEEK_CUR), n);
	check_fd_holds(dst, data, n, "the file got back");
	/* open for writing only, the copy threads pwrite */
	int back = temp_file(NULL, 0, 0);
	char proc[64];
	snprintf(proc, sizeof proc, "/proc/self/fd/%d", back);
	int wo = open(proc, O_WRONLY | O_CLOEXEC);
	CHECK(wo >= 0);
	xfer_ok(c, "get", "f", wo, &o, n, "staged");
	check_fd_holds(back, data, n, "the file written with pwrite");
	close(wo);
	close(back);
	free(data);
	close(src);
	close(dst);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * --copy-stores nt and regular write a get into a mapped memfd or file
 * with the same bytes: at file offsets of every alignment to a cache line and
 * a page (the mapping's first byte then sits there), sizes around the slots
 * and lines, the bytes before and after the range untouched.
 */
static void get_at_offsets(struct gpuq_client *c, const unsigned char *data, size_t n,
			   bool file, const char *kind)
{
	const size_t skips[] = { 0, 1, 17, 63, 64, 65, 4095, 4096 + 13 };
	const size_t lengths[] = { 1, 63, 64, 127, 8192, 8192 + 65, n };
	char what[128];
	for (size_t i = 0; i < sizeof skips / sizeof skips[0]; i++) {
		size_t len = lengths[i % (sizeof lengths / sizeof lengths[0])];
		size_t skip = skips[i], tail = 100 + i;
		unsigned char *around = random_bytes(skip + len + tail, 900 + i);
		unsigned char *want = malloc(skip + len + tail);
		CHECK(want);
		memcpy(want, around, skip + len + tail);
		memcpy(want + skip, data, len);
		int dst = file ? temp_file(around, skip + len + tail, 0) : memfd_create("dst", MFD_CLOEXEC);
		if (!file) {
			CHECK((size_t)write(dst, around, skip + len + tail) == skip + len + tail);
		}
		CHECK(lseek(dst, (off_t)skip, SEEK_SET) == (off_t)skip);
		struct xfer_opts o = plain;
		o.length = (int64_t)len;
		o.verify = i % 2 == 1;
		xfer_ok(c, "get", "st", dst, &o, len, "staged");
		snprintf(what, sizeof what, "--copy-stores %s: the %s after a get of %zu bytes at %zu",
			 kind, file ? "file" : "memfd", len, skip);
		check_fd_holds(dst, want, skip + len + tail, what);
		close(dst);
		free(around);
		free(want);
	}
}

TEST(copy_stores_nt_and_regular_write_the_same_bytes)
{
	const char *kinds[] = { "regular", "nt" };
	const size_t n = 300000 + 5;
	unsigned char *data = random_bytes(n, 77);
	for (int k = 0; k < 2; k++) {
		struct daemon_proc d;
		daemon_start(&d, "--staging-slot", "8K", "--staging-slots", "3", "--copy-threads",
			     "3", "--copy-stores", kinds[k], NULL);
		struct gpuq_client *c = client_open(&d);
		int src = temp_file(data, n, 0);
		do_alloc(c, "st", 0, n);
		xfer_ok(c, "put", "st", src, NULL, n, "staged");
		get_at_offsets(c, data, n, false, kinds[k]);
		get_at_offsets(c, data, n, true, kinds[k]);
		round_trip_memfd(c, 3 * 8192 + 63, 78, true);
		close(src);
		do_free(c, "st");
		gpuq_close(c);
		daemon_stop(&d);
	}
	free(data);
}

/* stdin redirected from a file that was partly read already: the put starts at its offset. */
TEST(copy_file_from_its_current_offset)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 50000, skip = 1234;
	unsigned char *data = random_bytes(n, 42);
	int src = temp_file(data, n, 0);
	CHECK(lseek(src, (off_t)skip, SEEK_SET) == (off_t)skip);
	do_alloc(c, "o", 0, n - skip);
	xfer_ok(c, "put", "o", src, NULL, n - skip, "staged");
	CHECK_EQ(do_checksum(c, "o"), host_checksum(data + skip, n - skip));
	/* get into a file at its offset: the bytes before it stay */
	int dst = temp_file(data, skip, 0);
	CHECK(lseek(dst, (off_t)skip, SEEK_SET) == (off_t)skip);
	xfer_ok(c, "get", "o", dst, NULL, n - skip, "staged");
	check_fd_holds(dst, data, n, "the file with a prefix");
	free(data);
	close(src);
	close(dst);
	gpuq_close(c);
	daemon_stop(&d);
}

/* O_APPEND would put pwrite's chunks at the end in any order: such files are written in order. */
TEST(copy_get_to_append_file_in_order)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", "--staging-slots", "3", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 64 * 1024 + 11;
	unsigned char *data = random_bytes(n, 43);
	int src = memfd_random(0, 0);
	CHECK(write(src, data, n) == (ssize_t)n);
	CHECK(lseek(src, 0, SEEK_SET) == 0);
	do_alloc(c, "a", 0, n);
	do_put(c, "a", src);
	int dst = temp_file("head", 4, O_APPEND);
	xfer_ok(c, "get", "a", dst, NULL, n, "streamed");
	size_t k;
	unsigned char *got = fd_slurp(dst, &k);
	CHECK_EQ(k, n + 4);
	CHECK(memcmp(got, "head", 4) == 0 && memcmp(got + 4, data, n) == 0);
	free(got);
	free(data);
	close(src);
	close(dst);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(copy_pipes_and_sockets_in_order)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", "--staging-slots", "3", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 200000 + 3;
	unsigned char *data = random_bytes(n, 44);
	struct xfer_opts o = plain;
	o.verify = true;
	pid_t child;
	do_alloc(c, "p", 0, n);
	int in = pipe_source(data, n, 999, 0, &child);
	xfer_ok(c, "put", "p", in, &o, n, "streamed");
	close(in);
	reap_ok(child, "pipe writer");
	CHECK_EQ(do_checksum(c, "p"), host_checksum(data, n));
	int out = pipe_sink(data, n, &child);
	xfer_ok(c, "get", "p", out, &o, n, "streamed");
	close(out);
	reap_ok(child, "pipe reader");
	/* A socket, as a stdin or stdout can be. */
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	pid_t sink = fork();
	if (sink == 0) {
		close(sv[0]);
		unsigned char *got = malloc(n);
		size_t k = 0;
		ssize_t r;
		while (k < n && (r = read(sv[1], got + k, n - k)) > 0)
			k += (size_t)r;
		/* and send it all back for the put */
		for (size_t off = 0; k == n && off < n;) {
			ssize_t w = write(sv[1], got + off, n - off);
			if (w <= 0)
				_exit(2);
			off += (size_t)w;
		}
		_exit(k == n && memcmp(got, data, n) == 0 ? 0 : 1);
	}
	close(sv[1]);
	xfer_ok(c, "get", "p", sv[0], &o, n, "streamed");
	do_fill_random(c, "p", 1); /* overwritten, then put back from the socket */
	o.length = (int64_t)n;
	xfer_ok(c, "put", "p", sv[0], &o, n, "streamed");
	CHECK_EQ(do_checksum(c, "p"), host_checksum(data, n));
	reap_ok(sink, "socket peer");
	close(sv[0]);
	free(data);
	gpuq_close(c);
	daemon_stop(&d);
}

/* The scratch source and sink: no descriptor at all. */
TEST(copy_scratch_source_and_sink)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", "--staging-slots", "3", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 100 * 4096 + 5;
	do_alloc(c, "s", 0, n);
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "s");
	mp_put_bool(&req, "scratch", true);
	mp_put_u64(&req, "seed", 58);
	mp_put_bool(&req, "verify", true);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "put from scratch");
	CHECK_EQ(reply_u64(r, "job.result.bytes"), n);
	gpuq_reply_free(r);
	unsigned char *want = random_bytes(n, 58); /* what fill random 58 writes */
	CHECK_EQ(do_checksum(c, "s"), host_checksum(want, n));
	gpuq_request_begin(c, &req, "get");
	mp_put_str(&req, "buffer", "s[5:]");
	mp_put_bool(&req, "scratch", true);
	mp_put_bool(&req, "verify", true);
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "get into scratch");
	CHECK_EQ(reply_u64(r, "job.result.bytes"), n - 5);
	CHECK_EQ(reply_u64(r, "job.result.checksum"), host_checksum(want + 5, n - 5));
	gpuq_reply_free(r);
	int fd = memfd_random(10, 1);
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "s");
	mp_put_bool(&req, "scratch", true);
	mp_put_u64(&req, "fds", 1);
	expect_fail(call(c, &req, &fd, 1), GPUQ_E_BAD_REQUEST, "takes no descriptor");
	gpuq_request_begin(c, &req, "get");
	mp_put_str(&req, "buffer", "s");
	mp_put_bool(&req, "scratch", true);
	mp_put_str(&req, "path", "registered");
	expect_fail(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "scratch sink");
	close(fd);
	free(want);
	gpuq_close(c);
	daemon_stop(&d);
}

/* ---- ranges ---- */

TEST(copy_buffer_ranges)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 20000;
	do_alloc(c, "r", 0, n);
	struct mp_map req;
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", "r");
	mp_put_str(&req, "pattern", "zero");
	mp_put_bool(&req, "wait", true);
	gpuq_reply_free(call(c, &req, NULL, 0));
	unsigned char *want = calloc(n, 1);
	int src = memfd_random(5000, 45);
	CHECK_EQ(pread(src, want + 10001, 5000, 0), 5000);
	xfer_ok(c, "put", "r@0[10001:15001]", src, NULL, 5000, "staged");
	CHECK_EQ(do_checksum(c, "r"), host_checksum(want, n));
	/* [START:] runs to the end; [:STOP] starts at 0 */
	int dst = memfd_create("dst", MFD_CLOEXEC);
	xfer_ok(c, "get", "r[10001:]", dst, NULL, n - 10001, "staged");
	check_fd_holds(dst, want + 10001, n - 10001, "the tail");
	close(dst);
	dst = memfd_create("dst", MFD_CLOEXEC);
	xfer_ok(c, "get", "r[:10006]", dst, NULL, 10006, "staged");
	check_fd_holds(dst, want, 10006, "the head");
	/* refusals, and nothing moved */
	struct xfer_opts o = plain;
	o.offset = 3;
	expect_fail(xfer(c, "get", "r[1:2]", dst, &o), GPUQ_E_BAD_REQUEST, "give one");
	expect_fail(xfer(c, "put", "r[19999:20001]", src, NULL), GPUQ_E_BAD_REQUEST, "outside buffer");
	expect_fail(xfer(c, "get", "r[20001:]", dst, NULL), GPUQ_E_BAD_REQUEST, "past the end");
	expect_fail(xfer(c, "get", "r[1:2", dst, NULL), GPUQ_E_BAD_REQUEST, "malformed range");
	expect_fail(xfer(c, "get", "r@9[1:2]", dst, NULL), GPUQ_E_NOT_FOUND, "device 9 does not exist");
	CHECK_EQ(do_checksum(c, "r"), host_checksum(want, n));
	free(want);
	close(src);
	close(dst);
	gpuq_close(c);
	daemon_stop(&d);
}

/* ---- the registered path ---- */

TEST(copy_registered_path)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = (3u << 20) + 13;
	int src = sealed_memfd(n, 46);
	size_t k;
	unsigned char *want = fd_slurp(src, &k);
	struct xfer_opts o = plain;
	o.path = "registered";
	o.verify = true;
	do_alloc(c, "g", 0, n);
	xfer_ok(c, "put", "g", src, &o, n, "registered");
	CHECK_EQ(do_checksum(c, "g"), host_checksum(want, n));
	int dst = sealed_memfd(0, 0); /* grows to hold the range */
	xfer_ok(c, "get", "g", dst, &o, n, "registered");
	check_fd_holds(dst, want, n, "the registered get");
	/* Open for reading only, it is registered read-only, which not every GPU supports. */
	char proc[64];
	snprintf(proc, sizeof proc, "/proc/self/fd/%d", src);
	int src_ro = open(proc, O_RDONLY | O_CLOEXEC);
	CHECK(src_ro >= 0);
	struct gpuq_reply *r = xfer(c, "put", "g", src_ro, &o);
	if (!test_backend_is_cuda() || gpuq_reply_ok(r)) {
		expect_ok(r, "registered put from a read-only memfd");
		CHECK_EQ(reply_u64(r, "job.result.bytes"), n);
	} else {
		expect_error(r, GPUQ_E_DEVICE_ERROR, "cudaHostRegister");
	}
	gpuq_reply_free(r);
	close(src_ro);
	/* refused where it cannot be done safely */
	int plain_fd = memfd_random(100, 1);
	expect_fail(xfer(c, "put", "g", plain_fd, &o), GPUQ_E_BAD_REQUEST, "sealed against shrinking");
	int p[2];
	CHECK(pipe(p) == 0);
	expect_fail(xfer(c, "put", "g", p[0], &o), GPUQ_E_BAD_REQUEST, "sealed against shrinking");
	int ro = open(proc, O_RDONLY | O_CLOEXEC); /* fits the buffer: only the path is wrong */
	CHECK(ro >= 0);
	o.path = "sideways";
	expect_fail(xfer(c, "put", "g", ro, &o), GPUQ_E_BAD_REQUEST, "auto, staged or registered");
	close(ro);
	close(p[0]);
	close(p[1]);
	close(plain_fd);
	free(want);
	close(src);
	close(dst);
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A get into a disk file (this directory's filesystem; /tmp may be tmpfs)
 * allocates the blocks past the file's old end before it writes them: the
 * bytes land whole, mapped or pwritten, from offset 0 and from inside the
 * old contents.
 */
TEST(copy_get_into_a_fresh_disk_file)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = (5u << 20) + 12345;
	int src = memfd_random(n, 52);
	size_t k;
	unsigned char *want = fd_slurp(src, &k);
	do_alloc(c, "fr", 0, n);
	xfer_ok(c, "put", "fr", src, NULL, n, "staged");
	const int modes[] = { O_RDWR, O_WRONLY }; /* mapped; pwritten */
	for (int i = 0; i < 2; i++) {
		char path[] = "gpuq-fresh-XXXXXX";
		int fd = mkostemp(path, O_CLOEXEC);
		CHECK(fd >= 0);
		unlink(path);
		char proc[64];
		snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
		int out = open(proc, modes[i] | O_CLOEXEC);
		CHECK(out >= 0);
		xfer_ok(c, "get", "fr", out, NULL, n, "staged");
		check_fd_holds(fd, want, n, "a get into an empty file");
		/* from inside the old contents: 1 MiB of them kept, the rest new */
		CHECK(ftruncate(fd, 3u << 20) == 0);
		CHECK(lseek(out, 1 << 20, SEEK_SET) == 1 << 20);
		xfer_ok(c, "get", "fr", out, NULL, n, "staged");
		unsigned char *got = fd_slurp(fd, &k);
		CHECK_EQ(k, (1u << 20) + n);
		CHECK(memcmp(got, want, 1 << 20) == 0);
		CHECK(memcmp(got + (1 << 20), want, n) == 0);
		free(got);
		close(out);
		close(fd);
	}
	free(want);
	close(src);
	gpuq_close(c);
	daemon_stop(&d);
}

/* The registered path keeps a memfd's pinning between transfers: every change of the memfd still shows. */
TEST(copy_registered_kept_pinning_sees_every_change)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = (2u << 20) + 4096;
	int src = sealed_memfd(n, 50);
	CHECK(fcntl(src, F_ADD_SEALS, F_SEAL_SEAL) == 0); /* its pinning may be kept */
	size_t k;
	unsigned char *want = fd_slurp(src, &k);
	unsigned char *mine = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, src, 0);
	CHECK(mine != MAP_FAILED);
	struct xfer_opts o = plain;
	o.path = "registered";
	do_alloc(c, "kp", 0, n);
	CHECK(lseek(src, 0, SEEK_SET) == 0);
	xfer_ok(c, "put", "kp", src, &o, n, "registered");
	CHECK_EQ(do_checksum(c, "kp"), host_checksum(want, n));
	/* rewritten through the client's own mapping: the same pages */
	memset(mine + 4096, 0x5a, 8192);
	memset(want + 4096, 0x5a, 8192);
	CHECK(lseek(src, 0, SEEK_SET) == 0);
	xfer_ok(c, "put", "kp", src, &o, n, "registered");
	CHECK_EQ(do_checksum(c, "kp"), host_checksum(want, n));
	/* written with pwrite */
	memset(want, 0x33, 100);
	CHECK(pwrite(src, want, 100, 0) == 100);
	CHECK(lseek(src, 0, SEEK_SET) == 0);
	xfer_ok(c, "put", "kp", src, &o, n, "registered");
	CHECK_EQ(do_checksum(c, "kp"), host_checksum(want, n));
	/* a hole punched and written again: new pages under the old pinning */
	CHECK(fallocate(src, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20) == 0);
	memset(want + (1 << 20), 0x77, 1 << 20);
	memset(mine + (1 << 20), 0x77, 1 << 20);
	CHECK(lseek(src, 0, SEEK_SET) == 0);
	xfer_ok(c, "put", "kp", src, &o, n, "registered");
	CHECK_EQ(do_checksum(c, "kp"), host_checksum(want, n));
	/* gets into one memfd, the device's bytes changed in between */
	int dst = sealed_memfd(0, 0);
	CHECK(fcntl(dst, F_ADD_SEALS, F_SEAL_SEAL) == 0);
	xfer_ok(c, "get", "kp", dst, &o, n, "registered");
	check_fd_holds(dst, want, n, "the first registered get");
	int other_fd = sealed_memfd(n, 51);
	unsigned char *other = fd_slurp(other_fd, &k);
	xfer_ok(c, "put", "kp", other_fd, NULL, n, "staged");
	CHECK(lseek(dst, 0, SEEK_SET) == 0);
	xfer_ok(c, "get", "kp", dst, &o, n, "registered");
	check_fd_holds(dst, other, n, "the second registered get");
	/* a memfd that may still be sealed is not kept mapped writable: F_SEAL_WRITE works after */
	int open_fd = sealed_memfd(0, 0);
	xfer_ok(c, "get", "kp", open_fd, &o, n, "registered");
	xfer_ok(c, "get", "kp", open_fd, NULL, n, "staged");
	CHECK(fcntl(open_fd, F_ADD_SEALS, F_SEAL_WRITE) == 0);
	close(open_fd);
	munmap(mine, n);
	free(want);
	free(other);
	close(src);
	close(dst);
	close(other_fd);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(copy_register_min_picks_the_registered_path)
{
	struct daemon_proc d;
	daemon_start(&d, "--register-min", "1M", NULL);
	struct gpuq_client *c = client_open(&d);
	int big = sealed_memfd(2u << 20, 47), small = sealed_memfd(1000, 48), unsealed = memfd_random(2u << 20, 49);
	do_alloc(c, "m", 0, 2u << 20);
	xfer_ok(c, "put", "m", big, NULL, 2u << 20, "registered");
	struct xfer_opts o = plain;
	o.length = 1000;
	xfer_ok(c, "put", "m", small, &o, 1000, "staged");
	xfer_ok(c, "put", "m", unsealed, NULL, 2u << 20, "staged");
	o.path = "staged";
	o.length = -1;
	CHECK(lseek(big, 0, SEEK_SET) == 0);
	xfer_ok(c, "put", "m", big, &o, 2u << 20, "staged");
	close(big);
	close(small);
	close(unsealed);
	gpuq_close(c);
	daemon_stop(&d);
}

/* ---- errors ---- */

TEST(copy_errors_are_precise_and_move_nothing)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 10000);
	do_fill_random(c, "w", 50);
	uint64_t before = do_checksum(c, "w");
	struct xfer_opts o = plain;
	/* short reads: a memfd, a file and a pipe that end early */
	int small = memfd_random(10, 51);
	o.length = 20;
	expect_fail(xfer(c, "put", "w", small, &o), GPUQ_E_IO, "ended after 10 of the 20");
	unsigned char bytes[100] = { 1 };
	int file = temp_file(bytes, 100, 0);
	o.length = 5000;
	expect_fail(xfer(c, "put", "w", file, &o), GPUQ_E_IO, "ended after 100 of the 5000");
	CHECK_EQ(do_checksum(c, "w"), before); /* a regular source is measured first */
	pid_t child;
	int in = pipe_source(bytes, 100, 100, 0, &child);
	expect_fail(xfer(c, "put", "w", in, &o), GPUQ_E_IO, "ended after 100 of the 5000");
	close(in);
	reap_ok(child, "short pipe");
	/* descriptors that cannot be read or written */
	int wo = open("/dev/null", O_WRONLY | O_CLOEXEC), ro = open("/dev/null", O_RDONLY | O_CLOEXEC);
	int dir = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int opath = open("/tmp", O_PATH | O_CLOEXEC);
	expect_fail(xfer(c, "put", "w", wo, NULL), GPUQ_E_BAD_REQUEST, "writing only");
	expect_fail(xfer(c, "get", "w", ro, NULL), GPUQ_E_BAD_REQUEST, "reading only");
	expect_fail(xfer(c, "put", "w", dir, NULL), GPUQ_E_BAD_REQUEST, "directory");
	expect_fail(xfer(c, "get", "w", opath, NULL), GPUQ_E_BAD_REQUEST, "O_PATH");
	expect_fail(xfer(c, "put", "w", -1, NULL), GPUQ_E_BAD_REQUEST, "descriptor");
	/* a destination that fails as it is written */
	int full = open("/dev/full", O_WRONLY | O_CLOEXEC);
	if (full >= 0) {
		expect_fail(xfer(c, "get", "w", full, NULL), GPUQ_E_IO, "writing the destination");
		close(full);
	}
	/* the buffer too small: a file, and a pipe (found out only as it is read) */
	int big = memfd_random(10001, 52);
	expect_fail(xfer(c, "put", "w", big, NULL), GPUQ_E_BAD_REQUEST, "room for 10000");
	unsigned char *many = random_bytes(10001, 53);
	in = pipe_source(many, 10001, 4096, 0, &child);
	expect_fail(xfer(c, "put", "w", in, NULL), GPUQ_E_BAD_REQUEST, "longer than the 10000 bytes");
	close(in);
	waitpid(child, NULL, 0);
	free(many);
	/* a range outside the buffer */
	o.length = 10;
	o.offset = 9995;
	expect_fail(xfer(c, "get", "w", ro, &o), GPUQ_E_BAD_REQUEST, "reading only");
	int sink = memfd_create("sink", MFD_CLOEXEC);
	expect_fail(xfer(c, "get", "w", sink, &o), GPUQ_E_BAD_REQUEST, "outside buffer");
	o.offset = -1;
	o.length = -1;
	/* a buffer that does not exist */
	expect_fail(xfer(c, "put", "nope", small, NULL), GPUQ_E_NOT_FOUND, "not found");
	close(sink);
	close(big);
	close(small);
	close(file);
	close(wo);
	close(ro);
	close(dir);
	close(opath);
	gpuq_close(c);
	daemon_stop(&d);
}

/* The host backend's test hook makes device 1 fault as a sticky CUDA error would. */
TEST(copy_to_an_unhealthy_device_is_refused)
{
	if (test_backend_is_cuda())
		SKIP("a device cannot be made unhealthy on purpose on the cuda backend");
	setenv("GPUQ_HOST_FAULT_DEVICE", "1", 1);
	struct daemon_proc d;
	daemon_start(&d, "--reset-limit", "0", NULL); /* the device stays unhealthy: no reset */
	unsetenv("GPUQ_HOST_FAULT_DEVICE");
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "u", 1, 4096);
	struct mp_map req;
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", "u@1");
	mp_put_bool(&req, "wait", true);
	expect_fail(call(c, &req, NULL, 0), GPUQ_E_DEVICE_ERROR, "simulated sticky fault");
	int src = memfd_random(4096, 54), dst = memfd_create("dst", MFD_CLOEXEC);
	expect_fail(xfer(c, "put", "u@1", src, NULL), GPUQ_E_NO_DEVICE, "simulated sticky fault");
	expect_fail(xfer(c, "get", "u@1", dst, NULL), GPUQ_E_NO_DEVICE, "device 1 is unavailable");
	/* device 0 carries on */
	do_alloc(c, "ok", 0, 4096);
	xfer_ok(c, "put", "ok", src, NULL, 4096, "staged");
	close(src);
	close(dst);
	gpuq_close(c);
	daemon_stop(&d);
}

/* ---- cancellation and progress ---- */

static struct gpuq_reply *job_op(struct gpuq_client *c, const char *op, uint64_t job)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_u64(&req, "job", job);
	return call(c, &req, NULL, 0);
}

TEST(copy_cancel_stops_a_large_memfd_put_at_a_chunk)
{
	struct daemon_proc d;
	/* Tiny slots make a large transfer long enough to cancel on any machine. */
	daemon_start(&d, "--staging-slot", "4K", "--staging-slots", "2", "--copy-threads", "1",
		     "--host-mem", "1G", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 768u << 20;
	int src = memfd_random(n, 55);
	do_alloc(c, "big", 0, n);
	uint64_t job = start_running_transfer(c, "put", "big", src);
	char state[16];
	struct gpuq_reply *r = job_op(c, "cancel", job);
	expect_ok(r, "cancel");
	gpuq_reply_free(r);
	r = job_op(c, "wait", job);
	expect_error(r, GPUQ_E_CANCELLED, "cancelled after");
	reply_str(r, "job.state", state, sizeof state);
	CHECK_STR(state, "cancelled");
	gpuq_reply_free(r);
	close(src);
	do_free(c, "big"); /* the buffer is free again: nothing still runs on it */
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * A get into a pipe that nobody reads waits in poll while it is its
 * device's only business (transfer.c, stream_wait): another job on the
 * device still runs meanwhile, and a cancel still ends the get.
 */
TEST(copy_a_stalled_pipe_holds_off_no_other_job_and_no_cancel)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "64K", NULL);
	struct gpuq_client *c = client_open(&d);
	int fds[2];
	CHECK(pipe2(fds, O_CLOEXEC) == 0);
	do_alloc(c, "p", 0, 8u << 20); /* far more than the pipe holds */
	uint64_t job = start_running_transfer(c, "get", "p", fds[1]);
	/* jobs on another buffer of the same device run beside the stalled get (which holds the slots) */
	do_alloc(c, "q", 0, 4096);
	(void)do_checksum(c, "q");
	struct gpuq_reply *r = job_op(c, "cancel", job);
	expect_ok(r, "cancel");
	gpuq_reply_free(r);
	r = job_op(c, "wait", job);
	expect_error(r, GPUQ_E_CANCELLED, "cancelled after");
	gpuq_reply_free(r);
	close(fds[0]);
	close(fds[1]);
	gpuq_close(c);
	daemon_stop(&d);
}

struct events {
	uint64_t request_id, job, count, last_bytes, total;
	bool bad;
};

static void on_event(const msgpack_object *ev, void *arg)
{
	struct events *e = arg;
	struct gpuq_error err;
	uint64_t id = 0, bytes = 0, total = 0;
	char kind[32] = "";
	msg_get_str(ev, "event", kind, sizeof kind, &err);
	msg_get_u64(ev, "id", &id, &err);
	msg_get_u64(ev, "bytes", &bytes, &err);
	msg_get_u64(ev, "total", &total, &err);
	if (strcmp(kind, "progress") != 0 || id != e->request_id || bytes < e->last_bytes ||
	    !msg_map_get(ev, "gbps") || !msg_map_get(ev, "job"))
		e->bad = true;
	msg_get_u64(ev, "job", &e->job, &err);
	e->count++;
	e->last_bytes = bytes;
	e->total = total;
}

/* A pipe that dribbles for about 1.6 s: events arrive after the first second. */
TEST(copy_progress_events_reach_a_client_that_asked)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 16 * 4096;
	unsigned char *data = random_bytes(n, 56);
	do_alloc(c, "pr", 0, n);
	pid_t child;
	int in = pipe_source(data, n, 4096, 100000, &child);
	struct events e = { 0 };
	gpuq_set_event_handler(c, on_event, &e);
	struct mp_map req;
	e.request_id = gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "pr");
	mp_put_u64(&req, "length", n);
	mp_put_bool(&req, "wait", true);
	mp_put_bool(&req, "progress", true);
	mp_put_u64(&req, "fds", 1);
	struct gpuq_reply *r = call(c, &req, &in, 1);
	expect_ok(r, "slow put");
	CHECKF(e.count >= 1, "no progress event in a %.1f s put", reply_f64(r, "job.run_s"));
	CHECK(!e.bad);
	CHECK_EQ(e.job, reply_u64(r, "job.job"));
	CHECK_EQ(e.total, n);
	CHECK(e.last_bytes > 0 && e.last_bytes <= n);
	gpuq_reply_free(r);
	reap_ok(child, "dribbling writer");
	close(in);
	/* a client that did not ask gets none */
	struct events none = { 0 };
	gpuq_set_event_handler(c, on_event, &none);
	in = pipe_source(data, n, 4096, 100000, &child);
	do_put(c, "pr", in);
	CHECK_EQ(none.count, 0);
	reap_ok(child, "second writer");
	close(in);
	free(data);
	gpuq_close(c);
	daemon_stop(&d);
}

/* A child that reads nothing for pause_us, then everything; returns the write end. */
static int pipe_late_sink(size_t n, unsigned pause_us, pid_t *child)
{
	int p[2];
	CHECK(pipe(p) == 0);
	*child = fork();
	CHECK(*child >= 0);
	if (*child == 0) {
		close(p[1]);
		usleep(pause_us);
		char buf[65536];
		size_t k = 0;
		ssize_t r;
		while ((r = read(p[0], buf, sizeof buf)) > 0)
			k += (size_t)r;
		_exit(k == n ? 0 : 1);
	}
	close(p[0]);
	return p[1];
}

struct get_events {
	uint64_t count, most_bytes;
	bool eta_with_bytes;
};

static void on_get_event(const msgpack_object *ev, void *arg)
{
	struct get_events *e = arg;
	struct gpuq_error err;
	uint64_t bytes = 0;
	msg_get_u64(ev, "bytes", &bytes, &err);
	e->count++;
	if (bytes > e->most_bytes)
		e->most_bytes = bytes;
	if (bytes > 0 && msg_map_get(ev, "eta_s"))
		e->eta_with_bytes = true;
}

/*
 * A get of one staging slot into a pipe whose reader waits 1.6 s: the pipe
 * took its first bytes at once, and the events say so while the rest waits
 * (they said 0, with no eta_s, until a whole slot had gone out).
 */
TEST(a_get_into_a_stalled_pipe_shows_the_bytes_written_so_far)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t n = 256 * 1024; /* within one 2 MiB slot, more than a pipe holds */
	do_alloc(c, "gp", 0, n);
	do_fill_random(c, "gp", 9);
	pid_t child;
	int out = pipe_late_sink(n, 1600000, &child);
	struct get_events e = { 0 };
	gpuq_set_event_handler(c, on_get_event, &e);
	struct mp_map req;
	gpuq_request_begin(c, &req, "get");
	mp_put_str(&req, "buffer", "gp");
	mp_put_bool(&req, "wait", true);
	mp_put_bool(&req, "progress", true);
	mp_put_u64(&req, "fds", 1);
	struct gpuq_reply *r = call(c, &req, &out, 1);
	close(out);
	expect_ok(r, "get into a stalled pipe");
	CHECKF(e.count >= 1, "no progress event in a %.1f s get", reply_f64(r, "job.run_s"));
	CHECKF(e.most_bytes > 0 && e.most_bytes < n,
	       "the events said at most %llu of %zu bytes while the pipe's reader waited",
	       (unsigned long long)e.most_bytes, n);
	CHECK(e.eta_with_bytes);
	gpuq_reply_free(r);
	reap_ok(child, "late reader");
	gpuq_close(c);
	daemon_stop(&d);
}

struct states {
	uint64_t request_id, queued, running;
	bool bad;
};

static void on_state_event(const msgpack_object *ev, void *arg)
{
	struct states *e = arg;
	struct gpuq_error err;
	uint64_t id = 0, bytes = 1;
	char state[16] = "";
	msg_get_u64(ev, "id", &id, &err);
	msg_get_u64(ev, "bytes", &bytes, &err);
	msg_get_str(ev, "state", state, sizeof state, &err);
	if (id != e->request_id)
		e->bad = true;
	else if (strcmp(state, "queued") == 0 && bytes == 0)
		e->queued++;
	else if (strcmp(state, "running") == 0)
		e->running++;
	else
		e->bad = true;
}

/*
 * A fill queued behind a put that dribbles for about 1.6 s on the same
 * buffer: its waiter hears "queued" after the first second, not silence.
 */
TEST(progress_events_say_a_job_is_queued_behind_others)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", NULL);
	struct gpuq_client *writer = client_open(&d), *c = client_open(&d);
	const size_t n = 16 * 4096;
	unsigned char *data = random_bytes(n, 57);
	do_alloc(c, "q", 0, n);
	pid_t child;
	int in = pipe_source(data, n, 4096, 100000, &child);
	struct mp_map req;
	gpuq_request_begin(writer, &req, "put");
	mp_put_str(&req, "buffer", "q");
	mp_put_u64(&req, "length", n);
	mp_put_u64(&req, "fds", 1);
	struct gpuq_reply *r = call(writer, &req, &in, 1);
	expect_ok(r, "detached slow put");
	gpuq_reply_free(r);
	struct states e = { 0 };
	gpuq_set_event_handler(c, on_state_event, &e);
	e.request_id = gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", "q");
	mp_put_str(&req, "pattern", "zero");
	mp_put_bool(&req, "wait", true);
	mp_put_bool(&req, "progress", true);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "fill behind the put");
	CHECKF(e.queued >= 1, "no queued event for a fill that waited %.1f s",
	       reply_f64(r, "job.queued_s"));
	CHECK(!e.bad);
	gpuq_reply_free(r);
	reap_ok(child, "dribbling writer");
	close(in);
	free(data);
	gpuq_close(c);
	gpuq_close(writer);
	daemon_stop(&d);
}

/* ---- bench_copy ---- */

TEST(bench_copy_rows_are_measured_and_verified)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	struct mp_array sizes;
	gpuq_request_begin(c, &req, "bench_copy");
	mp_array_init(&sizes);
	mp_array_u64(&sizes, 1u << 20);
	mp_array_u64(&sizes, (3u << 20) + 5);
	mp_array_u64(&sizes, 1ull << 40); /* does not fit: skipped with a note */
	mp_put_array(&req, "sizes", &sizes);
	mp_put_u64(&req, "repeats", 2);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "bench_copy");
	const msgpack_object *rows = reply_path(r, "job.result.rows");
	CHECK(rows && rows->type == MSGPACK_OBJECT_ARRAY);
	/* with gpuq region both ways; D2H: ten host rows, fresh and write-only files, sinks */
	unsigned per_size = test_backend_is_cuda() ? 30 : 28;
	unsigned host_rated = 0;
	double pwrite_gbps = 0, fresh_pwrite_gbps = 0; /* this size's host pwrite rows */
	double pipe_gbps = 0;                          /* and the better of its host pipe rows */
	CHECKF(rows->via.array.size == 2 * per_size, "%u rows", rows->via.array.size);
	for (uint32_t i = 0; i < rows->via.array.size; i++) {
		const msgpack_object *row = &rows->via.array.ptr[i];
		struct gpuq_error err;
		bool verified = false;
		double gbps = 0, ratio = 0, ceiling = 0;
		char group[8], method[64];
		CHECK(msg_get_str(row, "group", group, sizeof group, &err) == 1);
		CHECK(msg_get_str(row, "method", method, sizeof method, &err) == 1);
		CHECK(strcmp(group, "H2D") == 0 || strcmp(group, "D2H") == 0);
		CHECK(msg_get_bool(row, "verified", &verified, &err) == 1);
		CHECKF(verified, "row %u (%s %s) is not verified", i, group, method);
		CHECK(msg_get_f64(row, "gbps", &gbps, &err) == 1 && gbps > 0);
		CHECK(msg_get_f64(row, "ratio", &ratio, &err) == 1 && ratio > 0);
		CHECK(msg_get_f64(row, "ceiling", &ceiling, &err) == 1 && ceiling > 0);
		CHECK(test_backend_is_cuda() || strstr(method, "(host)"));
		/* a staged row says when its first DMA went and how long after its last it ended */
		char path[16] = "";
		double first_dma = 0, after_last = -1;
		(void)msg_get_str(row, "path", path, sizeof path, &err);
		if (strcmp(path, "staged") == 0)
			CHECKF(msg_get_f64(row, "first_dma_ms", &first_dma, &err) == 1 && first_dma > 0 &&
				       msg_get_f64(row, "after_last_dma_ms", &after_last, &err) == 1 &&
				       after_last >= 0,
			       "row %u (%s %s) has no DMA times", i, group, method);
		/* every get into a memfd or file is read against the host alone */
		double host_ratio = 0;
		bool into_file = strstr(method, "gpuq memfd") || strstr(method, "gpuq file");
		if (strcmp(group, "D2H") == 0 && into_file && !strstr(method, "registered")) {
			CHECKF(msg_get_f64(row, "host_ratio", &host_ratio, &err) == 1 && host_ratio > 0,
			       "row %u (%s) has no host_ratio", i, method);
			/* and against the slower of its halves: the DMA's ceiling or the host's */
			double host_ceiling = 0, get_ceiling = 0, get_ratio = 0;
			CHECK(msg_get_f64(row, "host_ceiling", &host_ceiling, &err) == 1);
			CHECKF(msg_get_f64(row, "get_ceiling", &get_ceiling, &err) == 1 &&
				       msg_get_f64(row, "get_ratio", &get_ratio, &err) == 1,
			       "row %u (%s) has no get_ceiling or get_ratio", i, method);
			CHECK(get_ceiling == (ceiling < host_ceiling ? ceiling : host_ceiling));
			CHECK(fabs(get_ratio - gbps / get_ceiling) < 1e-9 * get_ratio);
			/* a write-only descriptor can only be pwritten: read against the pwrite rows */
			if (strstr(method, "write-only"))
				CHECKF(host_ceiling == (strstr(method, "fresh") ? fresh_pwrite_gbps
										: pwrite_gbps),
				       "row %u (%s) is read against %.3f GB/s, not its pwrite row", i,
				       method, host_ceiling);
			host_rated++;
		}
		/* a get into a pipe: against the better of the host's two ways through one */
		if (strstr(method, "gpuq pipe")) {
			double host_ceiling = 0;
			CHECKF(msg_get_f64(row, "host_ceiling", &host_ceiling, &err) == 1 &&
				       host_ceiling == pipe_gbps,
			       "row %u (%s) is read against %.3f GB/s, not its host pipe rows' %.3f", i,
			       method, host_ceiling, pipe_gbps);
			host_rated++;
		}
		if (strstr(method, "host pipe write"))
			pipe_gbps = gbps;
		if (strstr(method, "host pipe polled") && gbps > pipe_gbps)
			pipe_gbps = gbps;
		if (strstr(method, "host file pwrite"))
			pwrite_gbps = gbps;
		if (strstr(method, "host file fresh pwrite"))
			fresh_pwrite_gbps = gbps;
	}
	CHECK_EQ(host_rated, 2 * 7);
	const msgpack_object *notes = reply_path(r, "job.result.notes");
	CHECK(notes && notes->via.array.size >= 1);
	const msgpack_object *pins = reply_path(r, "job.result.region_pin");
	CHECK(pins && pins->type == MSGPACK_OBJECT_ARRAY && pins->via.array.size == 2);
	CHECK(reply_f64(r, "job.result.region_pin.1.pin_s") > 0);
	CHECK_EQ(reply_u64(r, "job.result.region_pin.1.bytes"), (3u << 20) + 5);
	gpuq_reply_free(r);
	/* refusals */
	gpuq_request_begin(c, &req, "bench_copy");
	mp_put_u64(&req, "repeats", 0);
	expect_fail(call(c, &req, NULL, 0), GPUQ_E_BAD_REQUEST, "repeats");
	gpuq_request_begin(c, &req, "bench_copy");
	mp_put_u64(&req, "device", 99);
	expect_fail(call(c, &req, NULL, 0), GPUQ_E_NOT_FOUND, "device 99");
	gpuq_close(c);
	daemon_stop(&d);
}
