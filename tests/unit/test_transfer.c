/* Unit tests for what a put decides before it moves a byte: workers/transfer/transfer.c. */
#include "tests/harness.h"

#include "workers/transfer/transfer_impl.h"

#define MiB ((size_t)1 << 20)

TEST(a_put_reads_at_most_64_MiB_ahead_of_its_dma)
{
	CHECK_EQ(xfer_put_slots(64, 2 * MiB), 32);  /* the default ring: half of it */
	CHECK_EQ(xfer_put_slots(32, 2 * MiB), 32);  /* exactly 64 MiB: all of it */
	CHECK_EQ(xfer_put_slots(16, 8 * MiB), 8);
	CHECK_EQ(xfer_put_slots(64, 1 * MiB), 64);  /* 1M slots: the whole ring is 64 MiB */
	CHECK_EQ(xfer_put_slots(256, 4096), 256);   /* small slots: the ring is the limit */
	CHECK_EQ(xfer_put_slots(3, 64 * 1024), 3);  /* the tests' small rings stay whole */
}

TEST(a_put_keeps_two_slots_whatever_their_size)
{
	/* one slot reading while the other's DMA runs: the least that overlaps */
	CHECK_EQ(xfer_put_slots(8, 64 * MiB), 2);
	CHECK_EQ(xfer_put_slots(4, 1024 * MiB), 2);
	CHECK_EQ(xfer_put_slots(2, 1024 * MiB), 2);
}

/* Pieces in order, contiguous, covering the whole, each at most a slot, at offsets in whole words. */
static void check_pieces(uint64_t total, size_t chunk)
{
	uint64_t count = xfer_piece_count(total, chunk), expect = 0;
	for (uint64_t k = 0; k < count; k++) {
		uint64_t at;
		size_t n;
		xfer_piece(total, chunk, k, &at, &n);
		CHECKF(at == expect, "total %llu chunk %zu: piece %llu at %llu, not %llu",
		       (unsigned long long)total, chunk, (unsigned long long)k,
		       (unsigned long long)at, (unsigned long long)expect);
		CHECK(n > 0 && n <= chunk);
		CHECK_EQ(at % 8, 0);
		expect = at + n;
	}
	CHECK_EQ(expect, total);
}

TEST(a_staged_transfer_starts_and_ends_with_small_pieces)
{
	uint64_t at;
	size_t n;
	/* 256 MiB in 2 MiB slots: 1/8, 1/8, 1/4, 1/2 slot, 126 slots, then the mirror */
	CHECK_EQ(xfer_piece_count(256 * MiB, 2 * MiB), 8 + 126);
	xfer_piece(256 * MiB, 2 * MiB, 0, &at, &n);
	CHECK_EQ(at, 0);
	CHECK_EQ(n, 256 << 10);
	xfer_piece(256 * MiB, 2 * MiB, 3, &at, &n);
	CHECK_EQ(n, 1 * MiB);
	xfer_piece(256 * MiB, 2 * MiB, 4, &at, &n);
	CHECK_EQ(at, 2 * MiB);
	CHECK_EQ(n, 2 * MiB);
	xfer_piece(256 * MiB, 2 * MiB, 8 + 126 - 1, &at, &n);
	CHECK_EQ(n, 256 << 10);
	CHECK_EQ(at + n, 256 * MiB);
	const uint64_t totals[] = { 1, 4095, 8 * MiB - 1, 8 * MiB, 8 * MiB + 1, 8 * MiB + 7,
				    10 * MiB + 17, 256 * MiB, 3 * (1024 * MiB) + 17 };
	const size_t chunks[] = { 4096, 128 << 10, 2 * MiB, 2 * MiB + 8, 64 * MiB };
	for (size_t i = 0; i < sizeof totals / sizeof totals[0]; i++)
		for (size_t j = 0; j < sizeof chunks / sizeof chunks[0]; j++)
			check_pieces(totals[i], chunks[j]);
}

TEST(small_slots_and_small_transfers_are_cut_in_whole_slots)
{
	/* the tests' 4K slots, and fewer than four slots' worth: as before */
	CHECK_EQ(xfer_piece_count(40960, 4096), 10);
	CHECK_EQ(xfer_piece_count(8 * MiB - 1, 2 * MiB), 4);
	CHECK_EQ(xfer_piece_count(8 * MiB, 2 * MiB), 8 + 2);
}
