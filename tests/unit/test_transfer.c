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
