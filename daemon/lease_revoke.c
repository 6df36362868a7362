/*
 * Revocable leases (docs/protocol.md, "Revocable leases"): a client keeps
 * its lease between uses of a buffer, and gpuqd ends it whenever a job
 * waits for it and the client is not using the buffer. Main thread only.
 *
 * The lease's lock is a memfd the client sent with its attach. Both sides
 * take POSIX record locks, which belong to a process, so gpuqd's and the
 * client's conflict although they share the open file: gpuqd holds byte 0
 * for as long as the lease lives (closing the descriptor drops it, and a
 * gpuqd that is gone holds nothing), the client holds byte 1 while it uses
 * the buffer. Revoking is taking byte 1 without waiting: once gpuqd has
 * it, the client can neither be using the buffer nor start to, and the
 * lease ends. A client using the buffer keeps gpuqd out; a timer tries
 * again every millisecond, since nothing tells gpuqd when the client lets
 * go.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "daemon/daemon.h"
#include "workers/log.h"

enum {
	LOCK_BYTE_LEASE = 0, /* gpuqd's while the lease lives */
	LOCK_BYTE_USE = 1,   /* the holder's while it uses the buffer */
	REVOKE_RETRY_MS = 1,
};

/* One byte of fd write-locked, not waiting: 0, or -1 (errno EAGAIN, EACCES: held elsewhere). */
static int lock_byte(int fd, off_t byte)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1 };
	return fcntl(fd, F_SETLK, &fl);
}

static bool held_elsewhere(int error)
{
	return error == EAGAIN || error == EACCES;
}

/* A connection's revocable leases, held or waiting: each keeps a descriptor in gpuqd. */
static unsigned revocable_of_conn(const struct lease_table *t, const struct conn *c)
{
	unsigned n = 0;
	for (const struct lease *l = t->head; l; l = l->next)
		n += l->lock_fd >= 0 && l->conn == c && l->state != LEASE_ENDED;
	return n;
}

int lease_lock_take(struct daemon *d, const struct conn *c, int fd, struct gpuq_error *err)
{
	if (revocable_of_conn(&d->leases, c) >= LEASE_REVOCABLE_MAX)
		return gpuq_fail(err, GPUQ_E_BUSY,
				 "field 'revocable': this connection has %u revocable leases, the most "
				 "one may hold (each keeps a descriptor in gpuqd); release one first",
				 LEASE_REVOCABLE_MAX);
	/* Only a memfd (sealing is what tells one apart): its locks never wait on a file server. */
	if (fcntl(fd, F_GET_SEALS) < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'revocable': the lease's lock must be a memfd (memfd_create), "
				 "and the descriptor sent is not one (F_GET_SEALS: %s)",
				 strerror(errno));
	if (lock_byte(fd, LOCK_BYTE_LEASE) == 0)
		return 0;
	if (held_elsewhere(errno))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'revocable': byte 0 of the lock is locked by another process; "
				 "that byte is gpuqd's (the holder locks byte 1)");
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			 "field 'revocable': cannot lock byte 0 of the lease's lock: %s",
			 strerror(errno));
}

/* Ends l if its holder is not using the buffer; true when it did. */
static bool lease_try_revoke(struct daemon *d, struct lease *l)
{
	if (lock_byte(l->lock_fd, LOCK_BYTE_USE) == 0) {
		log_debug("lease %llu on %s@%d revoked: a job waits for the buffer",
			  (unsigned long long)l->id, l->buffer->name, l->buffer->device);
		lease_end(d, l);
		return true;
	}
	if (!held_elsewhere(errno) && !l->wanted) /* ENOLCK and the like: retried with the rest */
		log_warn("lease %llu: cannot lock byte 1 of its lock to revoke it (%s); trying again",
			 (unsigned long long)l->id, strerror(errno));
	return false;
}

/*
 * Calls act on each lease; act returns true when it ended the lease (and
 * freed it). Ending a lease may let a buffer go, and that submits a job of
 * gpuqd's own, which looks at the leases again: after each end the walk
 * starts over rather than trust any link it kept. A lease act leaves is
 * not ended by it the next time round (it is wanted, or not its business),
 * so the walk ends.
 */
typedef bool lease_act(struct daemon *d, struct lease *l, const void *arg);

static void leases_each(struct daemon *d, lease_act *act, const void *arg)
{
	struct lease *l = d->leases.head;
	while (l)
		l = act(d, l, arg) ? d->leases.head : l->next;
}

static bool retry_wanted(struct daemon *d, struct lease *l, const void *unused)
{
	(void)unused;
	return l->wanted && lease_try_revoke(d, l);
}

static void on_revoke_timer(uv_timer_t *timer)
{
	struct daemon *d = timer->data;
	leases_each(d, retry_wanted, NULL);
	if (d->leases.wanted == 0)
		uv_timer_stop(timer);
}

/* A job waits for l: it ends now if it can (true), else the timer tries again. */
static bool lease_want(struct daemon *d, struct lease *l)
{
	struct lease_table *t = &d->leases;
	if (l->wanted)
		return false;
	if (lease_try_revoke(d, l))
		return true;
	l->wanted = true;
	t->wanted++;
	if (!t->revoke_timer_ready) {
		int rc = uv_timer_init(d->loop, &t->revoke_timer);
		if (rc < 0) {
			log_error("cannot retry revoking leases (uv_timer_init: %s): the jobs behind lease "
				  "%llu wait until it is released", uv_strerror(rc), (unsigned long long)l->id);
			return false;
		}
		t->revoke_timer.data = d;
		t->revoke_timer_ready = true;
	}
	if (!uv_is_active((uv_handle_t *)&t->revoke_timer))
		uv_timer_start(&t->revoke_timer, on_revoke_timer, REVOKE_RETRY_MS, REVOKE_RETRY_MS);
	return false;
}

/* Whether a work of job waits for l (on l's device, conflicting with its access). */
static bool job_waits_for(struct job *job, const struct lease *l)
{
	for (int i = 0; i < job_nworks(job); i++)
		if (job_device(job, i) == l->hold.device &&
		    sched_works_conflict(&l->hold, job_work(job, i)))
			return true;
	return false;
}

/* A held revocable lease not yet wanted. */
static bool revocable_idle(const struct lease *l)
{
	return l->lock_fd >= 0 && l->state == LEASE_HELD && !l->wanted;
}

static bool yield_to_job(struct daemon *d, struct lease *l, const void *job)
{
	return revocable_idle(l) && job_waits_for((struct job *)job, l) && lease_want(d, l);
}

void leases_yield(struct daemon *d, struct job *job)
{
	leases_each(d, yield_to_job, job);
}

static bool yield_orphan(struct daemon *d, struct lease *l, const void *buffer)
{
	return revocable_idle(l) && l->buffer == buffer && lease_want(d, l);
}

void leases_yield_orphan(struct daemon *d, const struct buffer *b)
{
	leases_each(d, yield_orphan, b);
}

void lease_yield_granted(struct daemon *d, struct lease *l, struct job *attach_job)
{
	for (struct job *j = attach_job->newer; j; j = j->newer) {
		enum gpuq_job_state state = job_current_state(j);
		if ((state == GPUQ_JOB_QUEUED || state == GPUQ_JOB_RUNNING) && job_waits_for(j, l)) {
			lease_want(d, l);
			return;
		}
	}
}

void leases_close(struct daemon *d)
{
	if (d->leases.revoke_timer_ready && !uv_is_closing((uv_handle_t *)&d->leases.revoke_timer))
		uv_close((uv_handle_t *)&d->leases.revoke_timer, NULL);
}
