/*
 * protocol/collective_layout.h: NCCL's layouts as nccl.h words them, and
 * nccl-tests' sizes and bus factors; the host backend's reduction in place.
 * protocol/collective_math.h and the collective's names: the f16/bf16
 * decoders of protocol/dtype.h against an independent definition and as
 * exact inverses of its encoders, the random elements against
 * host_fill_random, the integer reference's wrapping and rounding, and the
 * float check's tolerance at its edges.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tests/harness.h"
#include "workers/collective/collective.h"
#include "workers/collective/collective_host.h"
#include "protocol/collective_layout.h"
#include "protocol/collective_math.h"
#include "workers/backend/host_patterns.h"

TEST(collective_f16_decoder_is_exact_and_inverts_the_encoder)
{
	for (uint32_t h = 0; h < 0x10000u; h++) {
		float f = gpuq_f16_bits_to_f32((uint16_t)h);
		int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
		float sign = (h & 0x8000u) ? -1.0f : 1.0f;
		if (exp == 31) {
			CHECKF(man ? isnan(f) : f == sign * INFINITY, "0x%04x decodes to %g", h, f);
			continue;
		}
		float want = exp ? sign * ldexpf((float)(man | 0x400), exp - 25)
				 : sign * ldexpf((float)man, -24);
		CHECKF(f == want && signbit(f) == signbit(want), "0x%04x decodes to %a, not %a", h,
		       f, want);
		CHECKF(gpuq_f32_to_f16_bits(f) == h, "0x%04x does not survive a round trip", h);
	}
}

TEST(collective_bf16_decoder_inverts_the_encoder)
{
	for (uint32_t b = 0; b < 0x10000u; b++) {
		float f = gpuq_bf16_bits_to_f32((uint16_t)b);
		if (isnan(f))
			continue;
		CHECKF(gpuq_f32_to_bf16_bits(f) == b, "bf16 0x%04x does not survive a round trip", b);
	}
}

TEST(collective_random_elements_are_what_fill_random_writes)
{
	static const enum gpuq_dtype types[] = { GPUQ_DTYPE_U8,  GPUQ_DTYPE_I32, GPUQ_DTYPE_I64,
						 GPUQ_DTYPE_F16, GPUQ_DTYPE_BF16, GPUQ_DTYPE_F32,
						 GPUQ_DTYPE_F64 };
	unsigned char buf[8 * 333];
	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
		size_t sz = gpuq_dtype_size(types[t]), n = sizeof buf / sz;
		host_fill_random(buf, n * sz, types[t], 4242);
		for (size_t i = 0; i < n; i++) {
			uint64_t got = 0;
			memcpy(&got, buf + i * sz, sz);
			CHECKF(got == coll_random_element(types[t], 4242, i), "%s element %zu differs",
			       gpuq_dtype_name(types[t]), i);
		}
	}
}

TEST(collective_integer_reference_wraps_and_truncates_as_nccl)
{
	uint64_t in[3];
	in[0] = 200, in[1] = 100, in[2] = 1;
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_U8, COLL_SUM, 3, in), (200 + 100 + 1) & 0xFF);
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_U8, COLL_AVG, 3, in), ((200 + 100 + 1) & 0xFF) / 3);
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_U8, COLL_MAX, 3, in), 200);
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_U8, COLL_PROD, 2, in), (200 * 100) & 0xFF);
	in[0] = (uint32_t)-7, in[1] = 2, in[2] = 0;
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I32, COLL_AVG, 2, in), (uint32_t)-2); /* -5/2 -> -2 */
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I32, COLL_MIN, 2, in), (uint32_t)-7);
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I32, COLL_MAX, 3, in), 2);
	in[0] = 0x7FFFFFFFu, in[1] = 1;
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I32, COLL_SUM, 2, in), 0x80000000u);
	in[0] = (uint64_t)INT64_MIN, in[1] = (uint64_t)INT64_MIN;
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I64, COLL_SUM, 2, in), 0);
	CHECK_EQ(coll_reference_int(GPUQ_DTYPE_I64, COLL_MIN, 2, in), (uint64_t)INT64_MIN);
}

static uint64_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

TEST(collective_float_check_takes_rounding_and_nothing_more)
{
	uint64_t in[2] = { f32_bits(0.1f), f32_bits(0.2f) };
	float sum = 0.1f + 0.2f;
	CHECK(coll_check_element(GPUQ_DTYPE_F32, COLL_SUM, 2, in, f32_bits(sum)));
	CHECK(coll_check_element(GPUQ_DTYPE_F32, COLL_SUM, 2, in, f32_bits(nextafterf(sum, 1))));
	CHECK(!coll_check_element(GPUQ_DTYPE_F32, COLL_SUM, 2, in, f32_bits(sum * 1.001f)));
	CHECK(!coll_check_element(GPUQ_DTYPE_F32, COLL_SUM, 2, in, f32_bits(NAN)));
	CHECK(coll_check_element(GPUQ_DTYPE_F32, COLL_MIN, 2, in, in[0]));
	CHECK(!coll_check_element(GPUQ_DTYPE_F32, COLL_MIN, 2, in, f32_bits(nextafterf(0.1f, 1))));
	CHECK(coll_check_element(GPUQ_DTYPE_F32, COLL_AVG, 2, in, f32_bits(sum / 2)));
	uint64_t h[2] = { gpuq_f32_to_f16_bits(0.5f), gpuq_f32_to_f16_bits(0.25f) };
	CHECK(coll_check_element(GPUQ_DTYPE_F16, COLL_PROD, 2, h, gpuq_f32_to_f16_bits(0.125f)));
	CHECK(!coll_check_element(GPUQ_DTYPE_F16, COLL_PROD, 2, h, gpuq_f32_to_f16_bits(0.13f)));
}

TEST(collective_op_names_round_trip)
{
	enum coll_op op;
	for (int i = COLL_SUM; i <= COLL_AVG; i++) {
		CHECK(coll_op_from_name(coll_op_name((enum coll_op)i), &op) == 0);
		CHECK_EQ(op, i);
	}
	CHECK(coll_op_from_name("mean", &op) < 0);
	CHECK(!coll_dtype_supported(COLL_ALLREDUCE, GPUQ_DTYPE_BYTES));
	CHECK(coll_dtype_supported(COLL_BROADCAST, GPUQ_DTYPE_BYTES));
	CHECK(coll_dtype_supported(COLL_REDUCE_SCATTER, GPUQ_DTYPE_BF16));
}

TEST(collective_prim_names_round_trip)
{
	enum coll_prim p;
	for (int i = 0; i < COLL_PRIM_COUNT; i++) {
		CHECK(coll_prim_from_name(coll_prim_name((enum coll_prim)i), &p) == 0);
		CHECK_EQ(p, i);
	}
	CHECK(coll_prim_from_name("all-gather", &p) < 0); /* the CLI's spelling is the CLI's */
	CHECK(coll_prim_reduces(COLL_REDUCE_SCATTER) && !coll_prim_reduces(COLL_ALL_GATHER));
	CHECK(coll_prim_has_root(COLL_BROADCAST) && !coll_prim_has_root(COLL_SENDRECV));
}

/* Output element i of rank r has exactly one source, (rank, index); fails the test otherwise. */
static void one_source(const struct coll_layout *l, int r, uint64_t i, int rank, uint64_t index)
{
	int n = 0, ranks[8] = { -1 };
	uint64_t idx[8] = { 0 };
	CHECKF(coll_sources(l, r, i, &n, ranks, idx) && n == 1 && ranks[0] == rank &&
		       idx[0] == index,
	       "%s over %d: rank %d element %llu comes from rank %d element %llu, not rank %d "
	       "element %llu",
	       coll_prim_name(l->prim), l->nranks, r, (unsigned long long)i, ranks[0],
	       (unsigned long long)idx[0], rank, (unsigned long long)index);
}

/* The layouts say what nccl.h says, in its words (the comments quote it). */
TEST(collective_layouts_follow_nccl_h)
{
	for (int n = 1; n <= 5; n++) {
		for (uint64_t c = 1; c <= 3; c += 2) {
			struct coll_layout l = { .nranks = n, .count = c, .root = n - 1, .peer = 0 };
			for (int r = 0; r < n; r++) {
				for (int i = 0; i < n; i++) {
					for (uint64_t x = 0; x < c; x++) {
						/* all_to_all: "data to send to destination rank j is
						 * taken from sendbuff+j*count and data received from
						 * source rank i is placed at recvbuff+i*count" */
						l.prim = COLL_ALL_TO_ALL;
						one_source(&l, r, (uint64_t)i * c + x, i, (uint64_t)r * c + x);
						/* all_gather: "receiving data from rank i at offset
						 * i*sendcount" */
						l.prim = COLL_ALL_GATHER;
						one_source(&l, r, (uint64_t)i * c + x, i, x);
					}
				}
				/* reduce_scatter: "recvbuff on rank i will contain the i-th block" */
				int k, ranks[8];
				uint64_t idx[8];
				l.prim = COLL_REDUCE_SCATTER;
				CHECK(coll_sources(&l, r, c - 1, &k, ranks, idx) && k == n);
				CHECK(ranks[n - 1] == n - 1 && idx[n - 1] == (uint64_t)r * c + c - 1);
				CHECK_EQ(coll_in_count(&l, r), (uint64_t)n * c);
				CHECK(!coll_sources(&l, r, c, &k, ranks, idx));
				/* reduce: "recvbuff may be NULL on all calls except for root" */
				l.prim = COLL_REDUCE;
				CHECK_EQ(coll_out_count(&l, r), r == n - 1 ? c : 0);
				l.prim = COLL_BROADCAST;
				CHECK_EQ(coll_in_count(&l, r), r == n - 1 ? c : 0);
				one_source(&l, r, c - 1, n - 1, c - 1);
				/* in place: "recvbuff == sendbuff + rank * recvcount" and
				 * "sendbuff == recvbuff + rank * sendcount" */
				uint64_t in_at, out_at;
				l.prim = COLL_REDUCE_SCATTER;
				CHECK(coll_in_place_offsets(&l, r, &in_at, &out_at) && in_at == 0 &&
				      out_at == (uint64_t)r * c);
				l.prim = COLL_ALL_GATHER;
				CHECK(coll_in_place_offsets(&l, r, &in_at, &out_at) &&
				      in_at == (uint64_t)r * c && out_at == 0);
				l.prim = COLL_ALL_TO_ALL;
				CHECK(!coll_in_place_offsets(&l, r, &in_at, &out_at));
			}
			l.prim = COLL_SENDRECV; /* root sends, peer receives */
			CHECK_EQ(coll_in_count(&l, n - 1), c);
			CHECK_EQ(coll_out_count(&l, 0), c);
			CHECK_EQ(coll_in_count(&l, 0), n == 1 ? c : 0);
			one_source(&l, 0, 0, n - 1, 0);
		}
	}
}

TEST(collective_sizes_and_bus_factors_are_nccl_tests)
{
	struct coll_layout l = { .prim = COLL_ALL_GATHER, .nranks = 8, .count = 10 };
	CHECK_EQ(coll_size_elements(&l), 80); /* the gathered buffer */
	l.prim = COLL_BROADCAST;
	CHECK_EQ(coll_size_elements(&l), 10);
	CHECK(coll_bus_factor(COLL_ALLREDUCE, 8) == 1.75);
	CHECK(coll_bus_factor(COLL_REDUCE_SCATTER, 8) == 0.875);
	CHECK(coll_bus_factor(COLL_ALL_GATHER, 8) == 0.875);
	CHECK(coll_bus_factor(COLL_ALL_TO_ALL, 8) == 0.875);
	CHECK(coll_bus_factor(COLL_BROADCAST, 8) == 1 && coll_bus_factor(COLL_REDUCE, 1) == 1);
	CHECK(coll_bus_factor(COLL_SENDRECV, 2) == 1);
	CHECK(coll_bus_factor(COLL_ALLREDUCE, 1) == 0 && coll_bus_factor(COLL_ALL_GATHER, 1) == 0);
}

TEST(collective_copies_must_be_exact)
{
	uint64_t in[1] = { f32_bits(NAN) | 0x123 };
	CHECK(coll_check_output(COLL_BROADCAST, GPUQ_DTYPE_F32, COLL_SUM, 1, in, in[0]));
	CHECK(!coll_check_output(COLL_BROADCAST, GPUQ_DTYPE_F32, COLL_SUM, 1, in, in[0] ^ 1));
	in[0] = 0xFFAB; /* only the element's own bytes count */
	CHECK(coll_check_output(COLL_ALL_GATHER, GPUQ_DTYPE_BYTES, COLL_SUM, 1, in, 0xAB));
	CHECK(!coll_check_output(COLL_ALL_GATHER, GPUQ_DTYPE_U8, COLL_SUM, 1, in, 0xAC));
}

/* The host backend's reduction into several outputs, one of them an input (in place). */
TEST(host_reduce_writes_every_output_and_may_run_in_place)
{
	int32_t a[5] = { 1, -7, 2147483647, 4, 0 }, b[5] = { 2, 2, 1, -4, 9 }, other[5];
	struct host_reduction h = { .dtype = GPUQ_DTYPE_I32, .op = COLL_AVG, .nsrc = 2, .ndst = 2,
				    .src = { a, b }, .dst = { a, other } };
	uint64_t in[2];
	int32_t a0[5];
	memcpy(a0, a, sizeof a);
	host_reduce(&h, 5);
	for (int i = 0; i < 5; i++) {
		in[0] = (uint32_t)a0[i];
		in[1] = (uint32_t)b[i];
		CHECK_EQ((uint32_t)a[i], coll_reference_int(GPUQ_DTYPE_I32, COLL_AVG, 2, in));
		CHECK_EQ(a[i], other[i]);
	}
	uint16_t x[3], y[3];
	for (int i = 0; i < 3; i++) {
		x[i] = gpuq_f32_to_f16_bits(0.1f * (float)(i + 1));
		y[i] = gpuq_f32_to_f16_bits(-0.3f * (float)i);
	}
	struct host_reduction f = { .dtype = GPUQ_DTYPE_F16, .op = COLL_SUM, .nsrc = 2, .ndst = 1,
				    .src = { x, y }, .dst = { y } };
	uint16_t y0[3];
	memcpy(y0, y, sizeof y);
	host_reduce(&f, 3);
	for (int i = 0; i < 3; i++) {
		in[0] = x[i];
		in[1] = y0[i];
		CHECK(coll_check_element(GPUQ_DTYPE_F16, COLL_SUM, 2, in, y[i]));
	}
}
