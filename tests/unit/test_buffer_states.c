/* Unit tests for buffer.c's state changes as jobs on a buffer end. */
#include "tests/harness.h"

#include "daemon/buffer.h"

/*
 * A free queued when a device reset lost the buffer, then refused because
 * of that reset, left the buffer READY with no memory (dptr NULL): the
 * next checksum read address 0 and gpuqd died. It stays lost.
 */
TEST(buffer_free_failed_keeps_a_buffer_lost_meanwhile)
{
	struct buffer_table t = { 0 };
	struct buffer *kept = buffer_add(&t, "kept", 1, 1000, GPUQ_DTYPE_BYTES, 64, 64);
	struct buffer *lost = buffer_add(&t, "lost", 1, 1000, GPUQ_DTYPE_BYTES, 64, 64);
	CHECK(kept && lost);
	kept->state = lost->state = BUFFER_FREEING;
	kept->dptr = lost->dptr = &t;
	lost->device = 2;
	CHECK_EQ(buffer_mark_lost(&t, 2, "when gpu 2 was reset"), 1);
	CHECK(lost->dptr == NULL);
	buffer_free_failed(kept);
	buffer_free_failed(lost);
	CHECK_EQ(kept->state, BUFFER_READY);
	CHECK_EQ(lost->state, BUFFER_LOST);
	while (t.head)
		buffer_remove(&t, t.head);
}
