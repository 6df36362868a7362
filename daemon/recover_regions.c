/*
 * Regions and leases through a re-exec (recover_regions.h). Main thread
 * only, at start-up.
 */
#include "daemon/recover_regions.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/log.h"
#include "daemon/state_record.h"

/*
 * Whether the record's region r names, in this process, the memfd it was
 * made from: a descriptor open read-write, sealed against shrinking, long
 * enough (what region_create checked). A number that fails this was not
 * handed over, and may now be another descriptor of this process: it is
 * left alone. Else why says what is wrong.
 */
static bool recover_region_fd_ok(const struct state_region *r, char *why, size_t n)
{
	struct stat st;
	int flags = r->fd >= 0 ? fcntl(r->fd, F_GETFL) : -1;
	int seals = flags >= 0 ? fcntl(r->fd, F_GET_SEALS) : -1;
	if (flags < 0 || fstat(r->fd, &st) != 0)
		snprintf(why, n, "its descriptor %d did not come through the execve (%s)", r->fd,
			 r->fd < 0 ? "the record names none" : strerror(errno));
	else if (seals < 0 || !(seals & F_SEAL_SHRINK) || (flags & O_ACCMODE) != O_RDWR ||
		 (uint64_t)st.st_size < r->bytes)
		snprintf(why, n, "descriptor %d is not its memfd (not a read-write memfd sealed "
			 "against shrinking of at least %llu bytes)", r->fd,
			 (unsigned long long)r->bytes);
	else
		return true;
	return false;
}

static int recover_add_region(struct device_adopt_list *l, const struct state_region *r)
{
	struct device_adopt_region *grown = realloc(l->regions, (l->nregions + 1) * sizeof *grown);
	if (!grown)
		return -1;
	l->regions = grown;
	struct device_adopt_region *a = &l->regions[l->nregions++];
	*a = (struct device_adopt_region){ .device = r->device, .fd = r->fd, .bytes = r->bytes,
					   .node = -1, .served_by = -1 };
	snprintf(a->uuid, sizeof a->uuid, "%s", r->uuid);
	return 0;
}

void recover_regions_plan(struct recover *r)
{
	char why[200];
	for (size_t i = 0; i < r->snap->nregions; i++) {
		const struct state_region *sr = &r->snap->regions[i];
		if (sr->device < 0 || sr->device >= r->snap->devices) {
			snprintf(why, sizeof why, "its device %d is not in the record", sr->device);
		} else if (recover_region_fd_ok(sr, why, sizeof why)) {
			if (recover_add_region(&r->adopt, sr) == 0)
				continue;
			snprintf(why, sizeof why, "no memory to plan taking it over");
		}
		log_error("region '%s' of uid %u is lost in the re-exec: %s", sr->name, sr->owner, why);
	}
}

/* The record's entry for the region planned as a (same device and descriptor). */
static const struct state_region *recover_region_record(const struct state_snapshot *s,
							const struct device_adopt_region *a)
{
	for (size_t i = 0; i < s->nregions; i++)
		if (s->regions[i].fd == a->fd && s->regions[i].device == a->device)
			return &s->regions[i];
	return NULL;
}

/* Lists the region a worker pinned again as rr said it was; false (fd still to close) when it cannot. */
static bool recover_region(struct daemon *d, const struct device_adopt_region *a,
			   const struct state_region *rr)
{
	struct region *r = region_add(&d->regions, rr->name, a->served_by, (uid_t)rr->owner,
				      rr->bytes, a->fd); /* the device that is its GPU now */
	if (!r)
		return false;
	r->map = a->map;
	r->state = REGION_READY;
	r->numa_node = a->node;
	r->pin_s = a->seconds;
	double now = monotonic_seconds();
	if (rr->created_ms && (double)rr->created_ms / 1e3 <= now) /* the same clock after an execve */
		r->created = (double)rr->created_ms / 1e3;
	if (rr->ephemeral) { /* orphaned until its connection is found (recover_holders) */
		r->conn_serial = rr->conn_serial ? rr->conn_serial : UINT64_MAX;
		r->orphaned = true;
	}
	return true;
}

/* A region planned but not listed: logged, its descriptor closed. */
static void recover_region_lost(const struct device_adopt_region *a, const struct state_region *rr)
{
	log_error("region '%s' of uid %u is lost in the re-exec: %s", rr ? rr->name : "?",
		  rr ? rr->owner : 0,
		  a->map ? "no memory to list it (its pinning stays until gpuqd ends)"
		  : !a->tried ? "its device did not open" : a->why);
	if (close(a->fd) != 0)
		log_warn("closing the memfd of a lost region (descriptor %d): %s", a->fd,
			 strerror(errno));
}

void recover_regions(struct daemon *d)
{
	struct device_adopt_list *l = &d->recover.adopt;
	unsigned taken = 0;
	for (size_t i = l->nregions; i-- > 0;) { /* the table lists the newest first, as before */
		const struct device_adopt_region *a = &l->regions[i];
		const struct state_region *rr = recover_region_record(d->recover.snap, a);
		if (rr && a->map && recover_region(d, a, rr))
			taken++;
		else
			recover_region_lost(a, rr);
	}
	if (d->recover.snap->nregions > 0)
		log_info("re-exec %u: %u of %zu regions taken over", d->recover.restarts, taken,
			 d->recover.snap->nregions);
	free(l->regions);
	l->regions = NULL;
	l->nregions = 0;
}

/* The lease rl says, held again on its buffer; false (logged) when it cannot be. */
static bool recover_lease(struct daemon *d, const struct state_lease *rl)
{
	struct gpuq_error err;
	int device = absent_device_now(&d->absent, rl->uuid, rl->device);
	struct buffer *b = device < 0 ? NULL
				      : buffer_find(&d->buffers, (uid_t)rl->buffer_owner, rl->buffer, device);
	const struct lease from = { .id = rl->id, .write = rl->write, .uid = (uid_t)rl->uid,
				    .pid = (pid_t)rl->pid, .conn_serial = rl->conn_serial,
				    .since = (double)rl->since_ms / 1e3,
				    .lock_fd = rl->revocable ? rl->lock_fd : -1 };
	/* A revocable lease whose lock did not come along could never be revoked: it ends. */
	bool lock_lost = rl->revocable && (rl->lock_fd < 0 || fcntl(rl->lock_fd, F_GET_SEALS) < 0);
	if (lock_lost)
		gpuq_fail(&err, GPUQ_E_NOT_FOUND, "its lock (descriptor %d) did not come through the "
			  "re-exec", rl->lock_fd);
	else if (device < 0)
		gpuq_fail(&err, GPUQ_E_NOT_FOUND, "buffer '%s' is on GPU %s, which this gpuqd does not "
			  "serve", rl->buffer, rl->uuid);
	else if (!b || b->state != BUFFER_READY || !b->shareable)
		gpuq_fail(&err, GPUQ_E_NOT_FOUND, "buffer '%s@%d' %s", rl->buffer, device,
			  !b ? "was not taken over" : !b->shareable ? "is not shareable" : "is lost");
	else if (lease_adopt(d, b, &from, &err))
		return true;
	if (from.lock_fd >= 0 && !lock_lost)
		close(from.lock_fd); /* the holder finds byte 0 unlocked: its lease has ended */
	log_error("lease %llu of uid %u (pid %d) ends in the re-exec: %s",
		  (unsigned long long)rl->id, rl->uid, (int)rl->pid, err.message);
	return false;
}

void recover_leases(struct daemon *d)
{
	const struct state_snapshot *s = d->recover.snap;
	unsigned held = 0;
	for (size_t i = s->nleases; i-- > 0;)
		held += recover_lease(d, &s->leases[i]);
	if (s->nleases > 0)
		log_info("re-exec %u: %u of %zu leases held again", d->recover.restarts, held,
			 s->nleases);
}

void recover_holders(struct daemon *d)
{
	regions_adopt_conns(d);
	leases_adopt_conns(d);
}
