/*
 * The durable state record (daemon/durable.c) as a running gpuqd keeps it:
 * read through /proc from the daemon's memfd, as a later process would be
 * handed it. Buffers appear with their slab and offset, a buffer that a
 * running job writes is flagged for as long as the job lasts, frees and
 * quota usage follow. The record is written before the loop next waits
 * (a job that writes: before it is handed to its worker), so the other
 * checks poll for the state they expect (order, not time).
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/state_record.h"
#include "tests/harness.h"
#include "tests/integration/fixture.h"

#define MIB (1024ull * 1024)

/* The daemon's state record, opened through /proc; -1 when it has none. */
static int open_record(const struct daemon_proc *d)
{
	char dir[64], path[64 + 256], link[256];
	snprintf(dir, sizeof dir, "/proc/%d/fd", (int)d->pid);
	DIR *dp = opendir(dir);
	struct dirent *e;
	int fd = -1;
	CHECKF(dp != NULL, "cannot list %s", dir);
	while (fd < 0 && (e = readdir(dp)) != NULL) {
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		ssize_t n = readlink(path, link, sizeof link - 1);
		if (n <= 0)
			continue;
		link[n] = '\0';
		if (strncmp(link, "/memfd:gpuq-state", 17) == 0)
			fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	closedir(dp);
	return fd;
}

/* The newest generation, decoded into *s; its generation. */
static uint64_t read_record(int fd, struct state_snapshot *s)
{
	void *p = NULL;
	size_t len = 0;
	uint64_t gen = 0;
	struct gpuq_error err;
	CHECKF(state_record_read(fd, &p, &len, &gen, &err) == 0, "read: %s", err.message);
	CHECKF(state_snapshot_decode(p, len, s, &err) == 0, "decode: %s", err.message);
	free(p);
	return gen;
}

static const struct state_buffer *find(const struct state_snapshot *s, const char *name)
{
	for (size_t i = 0; i < s->nbuffers; i++)
		if (strcmp(s->buffers[i].name, name) == 0)
			return &s->buffers[i];
	return NULL;
}

/* What a test waits for the record to say. */
struct expect {
	const char *name;
	bool present;
	unsigned writers;
};

static bool record_says(const struct state_snapshot *s, const struct expect *x)
{
	const struct state_buffer *b = find(s, x->name);
	if (!x->present)
		return b == NULL;
	return b && strcmp(b->state, "ready") == 0 && b->writers == x->writers;
}

/* Polls the record (up to 5 s) until it says x; fails the test otherwise. Its generation. */
static uint64_t await_record(int fd, const struct expect *x)
{
	struct state_snapshot s;
	uint64_t gen = 0;
	for (int i = 0; i < 5000; i++) {
		gen = read_record(fd, &s);
		bool ok = record_says(&s, x);
		state_snapshot_free(&s);
		if (ok)
			return gen;
		usleep(1000);
	}
	CHECKF(false, "the record never said buffer '%s' %s with %u writers", x->name,
	       x->present ? "ready" : "gone", x->writers);
	return gen;
}

TEST(durable_record_follows_buffers_writers_and_quota)
{
	struct daemon_proc d;
	struct state_snapshot s;
	int p[2];
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	int fd = open_record(&d);
	CHECKF(fd >= 0, "gpuqd holds no memfd named gpuq-state");
	do_alloc(c, "w", 0, 1 * MIB);
	do_alloc(c, "big", 0, 64 * MIB);
	await_record(fd, &(struct expect){ "w", true, 0 });
	uint64_t g1 = await_record(fd, &(struct expect){ "big", true, 0 });
	read_record(fd, &s);
	CHECK_STR(s.backend, test_backend());
	const struct state_buffer *w = find(&s, "w"), *big = find(&s, "big");
	CHECK_EQ(w->bytes, 1 * MIB);
	CHECK_EQ(w->owner, getuid());
	if (!test_backend_is_cuda()) { /* host slabs always: small ones carved, large ones alone */
		CHECK(w->slab != 0 && big->slab != 0 && w->slab != big->slab);
		CHECK_EQ(big->slab_offset, 0);
	}
	CHECK_EQ(s.nquotas, 1);
	CHECK_EQ(s.quotas[0].uid, getuid());
	CHECK_EQ(s.quotas[0].buffer_bytes, 65 * MIB);
	state_snapshot_free(&s);
	/*
	 * A put from a pipe that stalls: w is written for as long as it runs,
	 * and flagged before its worker could start it, so at once, not polled.
	 */
	start_stalled_put(c, "w", p);
	uint64_t g2 = read_record(fd, &s);
	CHECK(record_says(&s, &(struct expect){ "w", true, 1 }));
	state_snapshot_free(&s);
	CHECK(g2 > g1);
	close(p[1]); /* the put ends (short of data or not: either way no longer writing) */
	await_record(fd, &(struct expect){ "w", true, 0 });
	do_free(c, "big");
	await_record(fd, &(struct expect){ "big", false, 0 });
	read_record(fd, &s);
	CHECK_EQ(s.quotas[0].buffer_bytes, 1 * MIB);
	state_snapshot_free(&s);
	close(fd);
	gpuq_close(c);
	daemon_stop(&d);
}
