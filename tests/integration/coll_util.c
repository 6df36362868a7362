/* What the collective tests share: see coll_util.h. */
#include "tests/integration/coll_util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

const enum gpuq_dtype coll_typed_dtypes[7] = {
	GPUQ_DTYPE_U8, GPUQ_DTYPE_I32, GPUQ_DTYPE_I64, GPUQ_DTYPE_F16,
	GPUQ_DTYPE_BF16, GPUQ_DTYPE_F32, GPUQ_DTYPE_F64,
};

double coll_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void coll_alloc(struct gpuq_client *c, const char *name, int device, enum gpuq_dtype t,
		uint64_t count)
{
	do_alloc_typed(c, name, device, gpuq_dtype_name(t), count);
}

void coll_fill(struct gpuq_client *c, const char *name, int device, uint64_t seed)
{
	char ref[96];
	snprintf(ref, sizeof ref, "%s@%d", name, device);
	do_fill_random(c, ref, seed);
}

void coll_free(struct gpuq_client *c, const char *name, int device)
{
	char ref[96];
	snprintf(ref, sizeof ref, "%s@%d", name, device);
	do_free(c, ref);
}

unsigned char *coll_read_back(struct gpuq_client *c, const char *name, int device, size_t *n)
{
	char ref[96];
	snprintf(ref, sizeof ref, "%s@%d", name, device);
	int fd = memfd_create("gpuq-test-collective", MFD_CLOEXEC);
	CHECKF(fd >= 0, "memfd_create: %s", strerror(errno));
	do_get(c, ref, fd);
	unsigned char *p = fd_slurp(fd, n);
	close(fd);
	return p;
}

int coll_ranks(struct gpuq_client *c, int want, int *devices)
{
	int n = device_count(c);
	n = n < want ? n : want;
	for (int i = 0; i < n; i++)
		devices[i] = i;
	return n;
}

struct gpuq_reply *coll_run(struct gpuq_client *c, const struct gpuq_collective *op,
			    const int *devices, int n, bool detach)
{
	struct mp_map req;
	gpuq_collective_begin(c, &req, op, devices, n);
	mp_put_bool(&req, "wait", !detach);
	return call(c, &req, NULL, 0);
}

struct gpuq_reply *coll_run_group(struct gpuq_client *c, const struct gpuq_collective *ops,
				  int nops, const int *devices, int n)
{
	struct mp_map req;
	gpuq_group_begin(c, &req, "group", ops, nops, devices, n);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

void coll_expect_error(struct gpuq_reply *r, enum gpuq_errc code, const char *contains)
{
	expect_error(r, code, contains);
	gpuq_reply_free(r);
}

void coll_job_state(struct gpuq_client *c, uint64_t job, char *state, size_t size)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "status");
	mp_put_u64(&req, "job", job);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	reply_str(r, "job.state", state, size);
	gpuq_reply_free(r);
}

struct gpuq_reply *coll_wait(struct gpuq_client *c, uint64_t job, uint64_t timeout_ms)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "wait");
	mp_put_u64(&req, "job", job);
	mp_put_u64(&req, "timeout_ms", timeout_ms);
	return call(c, &req, NULL, 0);
}

/* Element i of a rank's output is right: made of the seeded inputs coll_sources names. */
static void check_element(const struct coll_layout *l, enum gpuq_dtype t, enum coll_op op,
			  int r, uint64_t i, const uint64_t *seeds, const struct coll_bufs *b,
			  uint64_t got, const char *where)
{
	int ranks[64], nsrc = 0;
	uint64_t index[64], in[64] = { 0 }, in_at = b->in_at, out_at;
	bool in_place = !b->out;
	CHECK(coll_sources(l, r, i, &nsrc, ranks, index));
	for (int k = 0; k < nsrc; k++) {
		if (in_place)
			coll_in_place_offsets(l, ranks[k], &in_at, &out_at);
		in[k] = coll_random_element(t, seeds[ranks[k]], in_at + index[k]);
	}
	CHECKF(coll_check_output(l->prim, t, op, nsrc, in, got),
	       "%s of %d ranks (%s, %s, count %" PRIu64 ", root %d, %s): %s element %" PRIu64
	       " is 0x%" PRIx64 " (its first source, rank %d element %" PRIu64 ", is 0x%" PRIx64 ")",
	       coll_prim_name(l->prim), l->nranks, gpuq_dtype_name(t), coll_op_name(op), l->count,
	       l->root, in_place ? "in place" : "out of place", where, i, got, ranks[0], index[0],
	       in[0]);
}

void coll_check(struct gpuq_client *c, const struct coll_layout *l, enum gpuq_dtype t,
		enum coll_op op, const int *devices, const struct coll_bufs *b,
		const uint64_t *seeds, uint64_t rest)
{
	size_t sz = gpuq_dtype_size(t), bytes;
	const char *in = b->in, *out = b->out;
	for (int r = 0; r < l->nranks; r++) {
		uint64_t oc = coll_out_count(l, r), in_at = 0, out_at = b->out_at;
		if (oc == 0)
			continue;
		if (!out)
			coll_in_place_offsets(l, r, &in_at, &out_at);
		unsigned char *p = coll_read_back(c, out ? out : in, devices[r], &bytes);
		char where[96];
		snprintf(where, sizeof where, "%s@%d", out ? out : in, devices[r]);
		CHECKF(bytes >= (out_at + oc) * sz, "%s holds %zu bytes", where, bytes);
		for (uint64_t e = 0; e < bytes / sz; e++) {
			uint64_t got = 0;
			memcpy(&got, p + e * sz, sz);
			if (e >= out_at && e < out_at + oc)
				check_element(l, t, op, r, e - out_at, seeds, b, got, where);
			else if (out && rest)
				CHECKF(got == coll_random_element(t, rest, e),
				       "%s element %" PRIu64 ", which %s does not write, was changed",
				       where, e, coll_prim_name(l->prim));
		}
		free(p);
	}
}

void coll_range(char *out, size_t size, const char *name, int device, uint64_t at,
		uint64_t count, size_t elt)
{
	snprintf(out, size, "%s@%d[%" PRIu64 ":%" PRIu64 "]", name, device, at * elt,
		 (at + count) * elt);
}
