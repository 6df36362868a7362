/*
 * A buffer a job may have written part of is `suspect`, whatever cut the
 * job short: here a put whose source ended early, which left the buffer
 * half new and half old and listed `ready`. A put that failed before it
 * wrote anything leaves the buffer as it was. The checks wait for replies,
 * never for a time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/fixture.h"

#define MIB (1024ull * 1024)

/* A put of exactly `length` bytes from the pipe p[0] (closed here), running: its job id. */
static uint64_t put_from_pipe(struct gpuq_client *c, const char *buffer, uint64_t length, int p[2])
{
	CHECK(pipe(p) == 0);
	struct mp_map req;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", buffer);
	mp_put_u64(&req, "length", length);
	mp_put_u64(&req, "fds", 1);
	struct gpuq_reply *r = call(c, &req, &p[0], 1);
	expect_ok(r, "put from a pipe");
	uint64_t id = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	close(p[0]);
	return id;
}

TEST(suspect_after_a_put_whose_source_ended_early)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "x", 0, 8 * MIB);
	do_fill_random(c, "x", 1);
	int p[2];
	uint64_t put = put_from_pipe(c, "x", 8 * MIB, p);
	char *half = calloc(1, 4 * MIB);
	CHECK(half && write(p[1], half, 4 * MIB) == (ssize_t)(4 * MIB));
	free(half);
	close(p[1]); /* the source ends after half of what the put asked for */
	struct gpuq_reply *r = job_request(c, "wait", put, 0);
	expect_error(r, GPUQ_E_IO, "the source ended after");
	gpuq_reply_free(r);
	char state[16], why[400], want[64];
	buffer_state(c, "x", state, sizeof state, why, sizeof why);
	CHECK_STR(state, "suspect");
	snprintf(want, sizeof want, "job %llu (put) writing it ended early (io_error: ",
		 (unsigned long long)put);
	CHECKF(strstr(why, want), "suspect reason: %s", why);
	do_fill_random(c, "x", 2); /* a write of every byte: sound again */
	buffer_state(c, "x", state, sizeof state, why, sizeof why);
	CHECK_STR(state, "ready");
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(suspect_not_after_a_put_cancelled_before_it_wrote)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	do_alloc(c, "x", 0, 8 * MIB);
	do_fill_random(c, "x", 1);
	uint64_t sum = do_checksum(c, "x");
	int p[2];
	uint64_t put = start_stalled_put(c, "x", p); /* running, nothing sent yet */
	gpuq_reply_free(job_request(c, "cancel", put, 0));
	struct gpuq_reply *r = job_request(c, "wait", put, 0);
	expect_error(r, GPUQ_E_CANCELLED, NULL);
	gpuq_reply_free(r);
	close(p[1]);
	char state[16], why[400];
	buffer_state(c, "x", state, sizeof state, why, sizeof why);
	CHECK_STR(state, "ready");
	CHECK_EQ(do_checksum(c, "x"), sum);
	gpuq_close(c);
	daemon_stop(&d);
}
