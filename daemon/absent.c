/*
 * Which GPU each index serves, and the buffers of GPUs not served
 * (absent.h). Main thread only.
 */
#include "daemon/absent.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/fd_store.h"
#include "workers/worker.h"

void absent_learn_uuids(struct absent *a, struct worker_pool *pool)
{
	a->devices = pool->count;
	for (int i = 0; i < pool->count && i < GPUQ_MAX_DEVICES; i++) {
		struct worker_snapshot s;
		worker_snapshot(pool, i, &s);
		if (s.info.uuid[0]) /* a device that has not opened keeps what it was, or "" */
			snprintf(a->uuid[i], sizeof a->uuid[i], "%s", s.info.uuid);
	}
}

const char *absent_uuid_of(const struct absent *a, int index)
{
	return index >= 0 && index < a->devices ? a->uuid[index] : "";
}

int absent_index_of(const struct absent *a, const char *uuid)
{
	if (!uuid[0])
		return -1;
	for (int i = 0; i < a->devices; i++)
		if (strcmp(a->uuid[i], uuid) == 0)
			return i;
	return -1;
}

int absent_device_now(const struct absent *a, const char *uuid, int device)
{
	return uuid[0] ? absent_index_of(a, uuid) : device;
}

/* The descriptor already kept for the slab of b: -1 when none. */
static int absent_fd_of(const struct absent *a, const struct state_buffer *b)
{
	for (size_t i = 0; i < a->n; i++)
		if (a->buffers[i].slab == b->slab && a->buffers[i].slab_fd >= 0 &&
		    strcmp(a->buffers[i].uuid, b->uuid) == 0 && strcmp(a->buffers[i].state, "lost") != 0)
			return a->buffers[i].slab_fd;
	return -1;
}

int absent_add(struct absent *a, const struct state_buffer *b, int fd)
{
	struct state_buffer *grown = realloc(a->buffers, (a->n + 1) * sizeof *grown);
	if (!grown)
		return -1;
	a->buffers = grown;
	if (fd >= 0 && fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
		fd = -1; /* a number the previous image named but did not hand over */
	/* A lost buffer's slab id may be another's since (a reset renumbers): it shares nothing. */
	bool has_memory = b->slab && strcmp(b->state, "lost") != 0;
	int kept = has_memory ? absent_fd_of(a, b) : -1;
	if (!has_memory && fd >= 0) {
		close(fd);
		fd = -1;
	}
	if (kept >= 0 && fd >= 0 && fd != kept)
		close(fd); /* a second descriptor of a slab kept already */
	struct state_buffer *e = &a->buffers[a->n++];
	*e = *b;
	e->device = -1;
	e->slab_fd = kept >= 0 ? kept : fd;
	return 0;
}

const struct state_buffer *absent_find(const struct absent *a, uid_t owner, const char *name)
{
	for (size_t i = 0; i < a->n; i++)
		if (a->buffers[i].owner == (uint32_t)owner && strcmp(a->buffers[i].name, name) == 0)
			return &a->buffers[i];
	return NULL;
}

int absent_copy(const struct absent *a, struct state_buffer **out, size_t *n)
{
	*out = calloc(a->n ? a->n : 1, sizeof **out);
	if (!*out)
		return -1;
	if (a->n) /* buffers is NULL until the first */
		memcpy(*out, a->buffers, a->n * sizeof **out);
	*n = a->n;
	return 0;
}

/* Whether the i-th buffer's descriptor is the first of its number (each is handled once). */
static bool absent_first_of_fd(const struct absent *a, size_t i)
{
	if (a->buffers[i].slab_fd < 0)
		return false;
	for (size_t k = 0; k < i; k++)
		if (a->buffers[k].slab_fd == a->buffers[i].slab_fd)
			return false;
	return true;
}

unsigned absent_slabs(const struct absent *a)
{
	unsigned n = 0;
	for (size_t i = 0; i < a->n; i++)
		n += absent_first_of_fd(a, i);
	return n;
}

void absent_store(const struct absent *a, struct fd_store *store)
{
	char name[FD_STORE_NAME_MAX];
	for (size_t i = 0; i < a->n; i++) {
		if (!absent_first_of_fd(a, i))
			continue;
		fd_store_slab_name(a->buffers[i].uuid, a->buffers[i].slab, name, sizeof name);
		fd_store_add(store, name, a->buffers[i].slab_fd);
	}
}

void absent_drop(struct absent *a, const char *uuid, struct fd_store *store, unsigned *buffers,
		 uint64_t *bytes)
{
	char name[FD_STORE_NAME_MAX];
	size_t kept = 0;
	*buffers = 0;
	*bytes = 0;
	for (size_t i = 0; i < a->n; i++) {
		struct state_buffer *b = &a->buffers[i];
		if (strcmp(b->uuid, uuid) != 0) {
			a->buffers[kept++] = *b;
			continue;
		}
		(*buffers)++;
		*bytes += b->bytes;
		if (b->slab_fd < 0)
			continue;
		fd_store_slab_name(uuid, b->slab, name, sizeof name);
		fd_store_remove(store, name);
		close(b->slab_fd);
		for (size_t k = i + 1; k < a->n; k++) /* the slab's other buffers: closed once */
			if (a->buffers[k].slab_fd == b->slab_fd)
				a->buffers[k].slab_fd = -1;
	}
	a->n = kept;
}

void absent_inherit(const struct absent *a, int inherit)
{
	for (size_t i = 0; i < a->n; i++) {
		int fd = a->buffers[i].slab_fd;
		int flags = absent_first_of_fd(a, i) ? fcntl(fd, F_GETFD) : -1;
		if (flags >= 0)
			fcntl(fd, F_SETFD, inherit ? flags & ~FD_CLOEXEC : flags | FD_CLOEXEC);
	}
}

size_t absent_by_gpu(const struct absent *a, struct absent_gpu *out, size_t max)
{
	size_t n = 0;
	for (size_t i = 0; i < a->n; i++) {
		const struct state_buffer *b = &a->buffers[i];
		size_t k = 0;
		while (k < n && strcmp(out[k].uuid, b->uuid) != 0)
			k++;
		if (k == n) {
			if (n == max)
				continue;
			out[n] = (struct absent_gpu){ .buffers = 0 };
			snprintf(out[n].uuid, sizeof out[n].uuid, "%s", b->uuid);
			n++;
		}
		out[k].buffers++;
		out[k].bytes += b->bytes;
	}
	return n;
}

void absent_free(struct absent *a)
{
	for (size_t i = 0; i < a->n; i++)
		if (absent_first_of_fd(a, i))
			close(a->buffers[i].slab_fd);
	free(a->buffers);
	a->buffers = NULL;
	a->n = 0;
}
