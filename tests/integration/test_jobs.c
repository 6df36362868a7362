/* The jobs working as they should: every op, and data that comes back bit-exact. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/fixture.h"
#include "workers/backend/host_patterns.h"

TEST(ping_reports_server_and_backend)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	gpuq_request_begin(c, &req, "ping");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "ping");
	char backend[16], server[64];
	reply_str(r, "backend", backend, sizeof backend);
	reply_str(r, "server", server, sizeof server);
	CHECK_STR(backend, test_backend());
	CHECK(strncmp(server, "gpuqd ", 6) == 0);
	CHECK_EQ(reply_u64(r, "version"), GPUQ_PROTOCOL_VERSION);
	CHECK(reply_u64(r, "devices") >= 1);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(devices_lists_every_field)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	gpuq_request_begin(c, &req, "devices");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "devices");
	const msgpack_object *list = reply_path(r, "devices");
	CHECK(list && list->type == MSGPACK_OBJECT_ARRAY && list->via.array.size >= 1);
	const char *keys[] = { "index", "backend", "name", "uuid", "pci_bus_id",
			       "compute_capability", "sms", "copy_engines", "mem_total", "mem_free",
			       "mem_used", "healthy", "health", "peer_access", "queue_depth",
			       "counters" };
	for (uint32_t i = 0; i < list->via.array.size; i++)
		for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
			CHECKF(msg_map_get(&list->via.array.ptr[i], keys[k]), "device %u lacks '%s'",
			       i, keys[k]);
	const msgpack_object *healthy = msg_map_get(&list->via.array.ptr[0], "healthy");
	CHECK(healthy->type == MSGPACK_OBJECT_BOOLEAN && healthy->via.boolean);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(noop_goes_through_a_worker)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	gpuq_request_begin(c, &req, "noop");
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "noop");
	char state[16];
	reply_str(r, "job.state", state, sizeof state);
	CHECK_STR(state, "done");
	CHECK(reply_u64(r, "job.job") >= 1);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(fill_random_matches_host_reference)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t sizes[] = { 1, 7, 8, 4097, (1u << 20) + 3 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		char name[32];
		snprintf(name, sizeof name, "r%zu", i);
		do_alloc(c, name, 0, sizes[i]);
		do_fill_random(c, name, 1000 + i);
		unsigned char *ref = malloc(sizes[i]);
		host_fill_random(ref, sizes[i], GPUQ_DTYPE_BYTES, 1000 + i);
		CHECK_EQ(do_checksum(c, name), host_checksum(ref, sizes[i]));
		int fd = memfd_create("out", MFD_CLOEXEC);
		CHECK_EQ(do_get(c, name, fd), sizes[i]);
		size_t n;
		unsigned char *out = fd_slurp(fd, &n);
		CHECK_EQ(n, sizes[i]);
		CHECKF(memcmp(out, ref, n) == 0, "random fill of %zu bytes differs from the reference", n);
		free(out);
		free(ref);
		close(fd);
		do_free(c, name);
	}
	gpuq_close(c);
	daemon_stop(&d);
}

static void fill_and_get(struct gpuq_client *c, const char *buffer, const char *pattern,
			 double value, void *out, size_t n)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", buffer);
	mp_put_str(&req, "pattern", pattern);
	mp_put_f64(&req, "value", value);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, pattern);
	gpuq_reply_free(r);
	int fd = memfd_create("out", MFD_CLOEXEC);
	CHECK_EQ(do_get(c, buffer, fd), n);
	CHECK_EQ(pread(fd, out, n, 0), n);
	close(fd);
}

TEST(fill_value_iota_and_zero_by_dtype)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "v");
	mp_put_u64(&req, "count", 1000);
	mp_put_str(&req, "dtype", "f32");
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "alloc f32");
	CHECK_EQ(reply_u64(r, "job.result.bytes"), 4000);
	gpuq_reply_free(r);
	float f[1000];
	fill_and_get(c, "v", "value", 2.5, f, sizeof f);
	for (int i = 0; i < 1000; i++)
		CHECKF(f[i] == 2.5f, "value fill: element %d is %g", i, (double)f[i]);
	fill_and_get(c, "v", "iota", 0, f, sizeof f);
	for (int i = 0; i < 1000; i++)
		CHECKF(f[i] == (float)i, "iota: element %d is %g", i, (double)f[i]);
	fill_and_get(c, "v", "zero", 0, f, sizeof f);
	for (int i = 0; i < 1000; i++)
		CHECKF(f[i] == 0.0f, "zero: element %d is %g", i, (double)f[i]);
	gpuq_close(c);
	daemon_stop(&d);
}

static void check_roundtrip(struct gpuq_client *c, size_t size, uint64_t seed)
{
	int src = memfd_random(size, seed);
	do_alloc(c, "rt", 0, size);
	CHECK_EQ(do_put(c, "rt", src), size);
	size_t n;
	unsigned char *want = fd_slurp(src, &n);
	CHECK_EQ(do_checksum(c, "rt"), host_checksum(want, size));
	int dst = memfd_create("dst", MFD_CLOEXEC);
	CHECK_EQ(do_get(c, "rt", dst), size);
	unsigned char *got = fd_slurp(dst, &n);
	CHECK_EQ(n, size);
	CHECKF(memcmp(want, got, size) == 0, "round trip of %zu bytes differs", size);
	free(want);
	free(got);
	close(src);
	close(dst);
	do_free(c, "rt");
}

TEST(put_get_round_trips_odd_sizes)
{
	struct daemon_proc d;
	/* Small slots so that every size crosses slot and ring boundaries. */
	daemon_start(&d, "--staging-slot", "4K", "--staging-slots", "3", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t sizes[] = { 1, 4095, 4096, 4097, 3 * 4096, 3 * 4096 + 1, 1000003 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		check_roundtrip(c, sizes[i], 77 + i);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(put_and_get_through_pipes_in_order)
{
	struct daemon_proc d;
	daemon_start(&d, "--staging-slot", "4K", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t size = 100000;
	unsigned char *data = malloc(size);
	host_fill_random(data, size, GPUQ_DTYPE_BYTES, 5);
	int p[2];
	CHECK(pipe(p) == 0);
	pid_t writer = fork();
	if (writer == 0) {
		close(p[0]);
		for (size_t off = 0; off < size; off += 1000) /* dribbles, to split reads */
			if (write(p[1], data + off, 1000) != 1000)
				_exit(1);
		_exit(0);
	}
	close(p[1]);
	do_alloc(c, "pipe", 0, size);
	CHECK_EQ(do_put(c, "pipe", p[0]), size);
	close(p[0]);
	CHECK_EQ(do_checksum(c, "pipe"), host_checksum(data, size));
	CHECK(pipe(p) == 0);
	pid_t reader = fork();
	if (reader == 0) {
		close(p[1]);
		unsigned char *got = malloc(size);
		size_t n = 0;
		ssize_t r;
		while (n < size && (r = read(p[0], got + n, size - n)) > 0)
			n += (size_t)r;
		_exit(n == size && memcmp(got, data, size) == 0 ? 0 : 1);
	}
	close(p[0]);
	CHECK_EQ(do_get(c, "pipe", p[1]), size);
	close(p[1]);
	int status;
	waitpid(reader, &status, 0);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "bytes read from the get pipe differ");
	waitpid(writer, &status, 0);
	free(data);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(put_with_offset_and_length)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "w", 0, 100);
	struct mp_map req;
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", "w");
	mp_put_str(&req, "pattern", "zero");
	mp_put_bool(&req, "wait", true);
	gpuq_reply_free(call(c, &req, NULL, 0));
	int src = memfd_random(30, 9);
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "w");
	mp_put_u64(&req, "offset", 50);
	mp_put_u64(&req, "length", 30);
	mp_put_u64(&req, "fds", 1);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, &src, 1);
	expect_ok(r, "put at offset");
	gpuq_reply_free(r);
	unsigned char want[100] = { 0 };
	CHECK_EQ(pread(src, want + 50, 30, 0), 30);
	CHECK_EQ(do_checksum(c, "w"), host_checksum(want, 100));
	close(src);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(buffers_and_jobs_list_the_callers_things)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int last = device_count(c) - 1;
	do_alloc(c, "a", 0, 4096);
	do_alloc(c, "b", last, 8192);
	struct mp_map req;
	gpuq_request_begin(c, &req, "buffers");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "buffers");
	const msgpack_object *list = reply_path(r, "buffers");
	CHECK(list && list->via.array.size == 2);
	gpuq_reply_free(r);
	gpuq_request_begin(c, &req, "jobs");
	r = call(c, &req, NULL, 0);
	expect_ok(r, "jobs");
	CHECK(reply_path(r, "jobs")->via.array.size == 2);
	gpuq_reply_free(r);
	do_fill_random(c, "a@0", 3);
	do_fill_random(c, "b", 3);
	CHECK(do_checksum(c, "a@0") != do_checksum(c, "b")); /* 4 KiB and 8 KiB of one stream */
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(a_name_on_several_devices_needs_its_gpu)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	if (device_count(c) < 2)
		SKIP("needs two devices (the host backend has them; this machine has one GPU)");
	do_alloc(c, "a", 0, 4096);
	do_alloc(c, "a", 1, 4096);
	struct mp_map req;
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", "a");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_BAD_REQUEST, "several devices");
	gpuq_reply_free(r);
	do_fill_random(c, "a@1", 3);
	do_fill_random(c, "a@0", 4);
	CHECK(do_checksum(c, "a@1") != do_checksum(c, "a@0"));
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(status_and_wait_report_finished_jobs)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "s", 0, 1 << 16);
	struct mp_map req;
	gpuq_request_begin(c, &req, "checksum");
	mp_put_str(&req, "buffer", "s");
	struct gpuq_reply *r = call(c, &req, NULL, 0); /* no wait: queued */
	expect_ok(r, "checksum submit");
	uint64_t id = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	gpuq_request_begin(c, &req, "wait");
	mp_put_u64(&req, "job", id);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "wait");
	uint64_t sum = reply_u64(r, "job.result.checksum");
	gpuq_reply_free(r);
	gpuq_request_begin(c, &req, "status");
	mp_put_u64(&req, "job", id);
	r = call(c, &req, NULL, 0);
	expect_ok(r, "status");
	CHECK_EQ(reply_u64(r, "job.result.checksum"), sum);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}
