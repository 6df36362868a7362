/*
 * The region registry, and how long an ephemeral region lives. Main thread
 * only.
 */
#include "daemon/region.h"
#include "daemon/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "workers/log.h"
#include "workers/clock.h"

const char *region_state_name(enum region_state state)
{
	switch (state) {
	case REGION_PINNING: return "pinning";
	case REGION_READY: return "ready";
	case REGION_FREEING: return "freeing";
	}
	return "unknown";
}

struct region *region_find(struct region_table *t, uid_t owner, const char *name)
{
	for (struct region *r = t->head; r; r = r->next)
		if (r->owner == owner && strcmp(r->name, name) == 0)
			return r;
	return NULL;
}

struct region *region_resolve(struct region_table *t, uid_t owner, uid_t caller, const char *name,
			      struct gpuq_error *err)
{
	struct region *found = region_find(t, owner, name);
	if (found)
		return found;
	unsigned total = 0;
	for (struct region *r = t->head; r; r = r->next)
		total += r->owner == owner;
	char names[256], who[24];
	struct buffer_names l;
	buffer_names_begin(&l, names, sizeof names, total);
	for (struct region *r = t->head; r; r = r->next)
		if (r->owner == owner)
			buffer_names_add(&l, r->name, -1);
	buffer_names_end(&l);
	buffer_whose(owner, caller, who, sizeof who);
	gpuq_fail(err, GPUQ_E_NOT_FOUND, "region '%s' not found (%s regions: %s)", name, who, names);
	return NULL;
}

struct region *region_add(struct region_table *t, const char *name, int device, uid_t owner,
			  uint64_t bytes, int fd)
{
	struct region *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	snprintf(r->name, sizeof r->name, "%s", name);
	r->device = device;
	r->owner = owner;
	r->bytes = bytes;
	r->fd = fd;
	r->numa_node = -1;
	r->state = REGION_PINNING;
	r->created = monotonic_seconds();
	r->next = t->head;
	t->head = r;
	t->count++;
	t->pinned += bytes;
	return r;
}

void region_remove(struct region_table *t, struct region *r)
{
	for (struct region **link = &t->head; *link; link = &(*link)->next) {
		if (*link != r)
			continue;
		*link = r->next;
		t->count--;
		t->pinned -= r->bytes;
		r->removed = true;
		if (r->fd >= 0)
			close(r->fd);
		r->fd = -1;
		if (atomic_load(&r->users) == 0)
			free(r);
		return;
	}
}

void region_unhold(struct region *r)
{
	if (atomic_load(&r->users) > 0)
		atomic_fetch_sub(&r->users, 1);
	if (r->removed && atomic_load(&r->users) == 0)
		free(r);
}

int region_check_usable(const struct region *r, struct gpuq_error *err)
{
	if (r->state == REGION_PINNING)
		return gpuq_fail(err, GPUQ_E_BUSY,
				 "region '%s' is still being pinned (job %llu); wait for that job", r->name,
				 (unsigned long long)r->last_job);
	if (r->state == REGION_FREEING)
		return gpuq_fail(err, GPUQ_E_BUSY, "region '%s' is being freed (job %llu)", r->name,
				 (unsigned long long)r->last_job);
	return 0;
}

uint64_t region_bytes_of(const struct region_table *t, uid_t owner)
{
	uint64_t sum = 0;
	for (const struct region *r = t->head; r; r = r->next)
		if (r->owner == owner)
			sum += r->bytes;
	return sum;
}

uint64_t region_bytes_on(const struct region_table *t, int device, unsigned *count)
{
	uint64_t sum = 0;
	*count = 0;
	for (const struct region *r = t->head; r; r = r->next) {
		if (r->device != device)
			continue;
		sum += r->bytes;
		(*count)++;
	}
	return sum;
}

static const char *mib(uint64_t bytes, char *buf, size_t size)
{
	snprintf(buf, size, "%.1f MiB", (double)bytes / (1024.0 * 1024.0));
	return buf;
}

bool region_memlock_limit(uint64_t *bytes)
{
	struct rlimit lim;
	if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY)
		return false;
	*bytes = (uint64_t)lim.rlim_cur;
	return true;
}

int region_check_memlock(const struct region_table *t, const char *name, uint64_t bytes,
			 struct gpuq_error *err)
{
	uint64_t cur;
	char want[32], total[32], limit[32];
	if (!region_memlock_limit(&cur) || (bytes <= cur && t->pinned <= cur - bytes))
		return 0;
	return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
			 "pinning region '%s' (%s) would take the host memory gpuqd keeps pinned for regions "
			 "to %s, over its RLIMIT_MEMLOCK of %s: raise LimitMEMLOCK= in gpuqd.service "
			 "(LimitMEMLOCK=infinity, as installed), or `ulimit -l` where gpuqd is started by hand, "
			 "or free a region",
			 name, mib(bytes, want, sizeof want), mib(t->pinned + bytes, total, sizeof total),
			 mib(cur, limit, sizeof limit));
}

/*
 * An orphaned ephemeral region that is READY and that no job uses goes,
 * with the job the region table's free_orphan makes. One still pinning or
 * in use waits: finish_region_create and region_job_release call this
 * again.
 */
void region_free_if_orphaned(struct daemon *d, struct region *r)
{
	if (!r || !r->orphaned || r->state != REGION_READY || atomic_load(&r->users) || d->stopping)
		return;
	d->regions.free_orphan(d, r);
}

void region_job_release(struct daemon *d, struct job *job)
{
	struct region *r = job->region;
	job->region = NULL;
	if (!r || !job->region_held)
		return;
	bool removed = r->removed, freeing = r->state == REGION_FREEING && !removed;
	int device = r->device;
	region_unhold(r); /* frees a removed region with its last user: r is not read after */
	if (freeing)
		worker_kick(&d->pool, device); /* its region_free waits for this */
	else if (!removed)
		region_free_if_orphaned(d, r);
}

void regions_drop_conn(struct daemon *d, struct conn *c)
{
	struct region *next;
	for (struct region *r = d->regions.head; r; r = next) {
		next = r->next;
		if (r->conn_serial != c->serial)
			continue;
		r->orphaned = true;
		region_free_if_orphaned(d, r);
	}
}

void regions_inherit(struct region_table *t, bool keep)
{
	for (struct region *r = t->head; r; r = r->next) {
		int flags = r->fd >= 0 ? fcntl(r->fd, F_GETFD) : -1;
		int want = keep ? flags & ~FD_CLOEXEC : flags | FD_CLOEXEC;
		if (flags < 0 || fcntl(r->fd, F_SETFD, want) != 0)
			log_error("region '%s' of uid %d: its memfd (descriptor %d) cannot be %s: %s",
				  r->name, (int)r->owner, r->fd,
				  keep ? "handed to the new image, which will not find it"
				       : "closed on exec again",
				  r->fd < 0 ? "none" : strerror(errno));
	}
}

void regions_adopt_conns(struct daemon *d)
{
	struct region *next;
	for (struct region *r = d->regions.head; r; r = next) {
		next = r->next;
		if (!r->orphaned || r->conn_serial == 0)
			continue;
		if (server_conn_of_serial(&d->server, r->conn_serial)) {
			r->orphaned = false;
			continue;
		}
		log_info("ephemeral region %s of uid %d goes: its connection did not come through the "
			 "re-exec", r->name, (int)r->owner);
		region_free_if_orphaned(d, r);
	}
}
