/* Unit tests for daemon/parked_fds.c: which frame takes which descriptors. */
#include "tests/harness.h"

#include <fcntl.h>
#include <unistd.h>

#include "daemon/parked_fds.h"

/* n fresh descriptors (of /dev/null). */
static void open_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++) {
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		CHECK(fds[i] >= 0);
	}
}

static bool is_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

TEST(parked_a_frame_takes_the_descriptors_of_the_read_holding_its_first_byte)
{
	struct parked_fds p = { .count = 0 };
	int a[2], b[1], out[4], have;
	open_fds(a, 2);
	open_fds(b, 1);
	CHECK_EQ(parked_keep(&p, a, 2, 0, 100), 0);   /* frames starting at 0 and 40 */
	CHECK_EQ(parked_keep(&p, b, 1, 100, 180), 0); /* the frame starting at 120 */
	/* the frame at 120 cannot take the first read's descriptors */
	CHECK(parked_take(&p, 120, 2, out, &have) < 0);
	CHECK_EQ(have, 1);
	CHECK(parked_take(&p, 0, 1, out, &have) == 0);
	CHECK_EQ(out[0], a[0]);
	CHECK_EQ(parked_drop_through(&p, 40), 0); /* the first read may still hold a frame */
	CHECK(parked_take(&p, 40, 1, out, &have) == 0);
	CHECK_EQ(out[0], a[1]);
	CHECK_EQ(parked_drop_through(&p, 120), 0);
	CHECK(parked_take(&p, 120, 1, out, &have) == 0);
	CHECK_EQ(out[0], b[0]);
	CHECK_EQ(p.count, 0);
	for (int i = 0; i < 2; i++)
		close(a[i]);
	close(b[0]);
}

TEST(parked_undeclared_descriptors_are_closed_and_counted_once_their_frames_end)
{
	struct parked_fds p = { .count = 0 };
	int a[3], out[4], have;
	open_fds(a, 3);
	parked_keep(&p, a, 3, 10, 50);
	CHECK(parked_take(&p, 10, 1, out, &have) == 0); /* the frame [10, 30) takes one */
	CHECK_EQ(parked_drop_through(&p, 30), 0);        /* a frame may start at 30 */
	CHECK_EQ(parked_drop_through(&p, 50), 2);        /* no frame took the other two */
	CHECK(!is_open(a[1]) && !is_open(a[2]));
	CHECK(is_open(a[0]));
	CHECK_EQ(p.count, 0);
	close(a[0]);
}

TEST(parked_overflow_and_close_all)
{
	struct parked_fds p = { .count = 0 };
	int fds[PARKED_MAX + 3];
	open_fds(fds, PARKED_MAX + 3);
	CHECK_EQ(parked_keep(&p, fds, PARKED_MAX + 3, 0, 10), 3);
	CHECK_EQ(p.count, PARKED_MAX);
	CHECK(!is_open(fds[PARKED_MAX]));
	parked_close_all(&p);
	CHECK_EQ(p.count, 0);
	CHECK(!is_open(fds[0]) && !is_open(fds[PARKED_MAX - 1]));
}
