/* Helpers for the tests of leases (lease_util.h). */
#include "tests/integration/lease_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/fixture.h"

void lease_alloc_shareable(struct gpuq_client *c, const char *name, uint64_t bytes, bool ephemeral)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "bytes", bytes);
	mp_put_bool(&req, "shareable", true);
	mp_put_bool(&req, "ephemeral", ephemeral);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "alloc shareable");
	CHECK(reply_path(r, "job.result.shareable")->via.boolean);
	gpuq_reply_free(r);
}

void lease_attach(struct gpuq_client *c, const char *buffer, bool rw, struct gpuq_attachment *a)
{
	struct gpuq_error err;
	CHECKF(gpuq_buffer_attach(c, buffer, rw, a, &err) == 0, "attach %s: %s", buffer, err.message);
	CHECK(a->ptr != NULL && a->lease > 0);
	CHECK_EQ(a->host, !test_backend_is_cuda());
}

uint64_t lease_submit(struct gpuq_client *c, const char *op, const char *buffer)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, "buffer", buffer);
	if (strcmp(op, "fill") == 0) {
		mp_put_str(&req, "pattern", "value");
		mp_put_u64(&req, "value", 7);
	}
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, op);
	uint64_t id = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	return id;
}

void lease_expect_behind(struct gpuq_client *c, uint64_t job, uint64_t lease)
{
	char reason[32] = "";
	for (int i = 0; i < 200; i++) {
		struct gpuq_reply *r = job_request(c, "status", job, 0);
		const msgpack_object *o = reply_path(r, "job.waiting_reason");
		if (o && o->type == MSGPACK_OBJECT_STR)
			snprintf(reason, sizeof reason, "%.*s", (int)o->via.str.size, o->via.str.ptr);
		bool behind = strcmp(reason, "lease") == 0 && reply_u64(r, "job.waiting_job") == lease;
		gpuq_reply_free(r);
		if (behind)
			return;
		usleep(10000);
	}
	CHECKF(false, "job %llu is not waiting behind lease %llu (waiting_reason '%s')",
	       (unsigned long long)job, (unsigned long long)lease, reason);
}

uint64_t lease_job_checksum(struct gpuq_client *c, uint64_t job)
{
	struct gpuq_reply *r = job_request(c, "wait", job, 0);
	expect_ok(r, "the job behind the lease");
	const msgpack_object *sum = reply_path(r, "job.result.checksum");
	uint64_t v = sum ? sum->via.u64 : 0;
	gpuq_reply_free(r);
	return v;
}

void lease_expect_done(struct gpuq_client *c, uint64_t job)
{
	struct gpuq_reply *r = job_request(c, "wait", job, 0);
	expect_ok(r, "the job behind the lease");
	gpuq_reply_free(r);
}

unsigned lease_listed(struct gpuq_client *c, bool *first_revocable)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "leases");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "leases");
	unsigned n = reply_path(r, "leases")->via.array.size;
	if (n > 0 && first_revocable)
		*first_revocable = reply_path(r, "leases.0.revocable")->via.boolean;
	gpuq_reply_free(r);
	return n;
}

bool lease_byte_locked_elsewhere(int fd, off_t byte)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1 };
	CHECK(fcntl(fd, F_GETLK, &fl) == 0);
	return fl.l_type != F_UNLCK; /* F_GETLK ignores the caller's own locks */
}
