/*
 * The scheduler's queues and its admission rule (see sched.h): which queued
 * work may start next on a device, and what it must wait for on the device
 * when it does. Pure bookkeeping, no backend calls, so the unit tests drive
 * it directly (tests/unit/test_sched.c).
 *
 * Threads: everything here runs with the worker's lock held; the main
 * thread enqueues and removes, the worker thread admits and retires.
 */
#include "workers/sched/sched_queue.h"

#include <stdlib.h>
#include <string.h>

#include "workers/clock.h"

static bool work_is_gang(const struct work *w)
{
	return w->gang_size > 1;
}

/* The admission flags of each kind (WORK_KIND_EXCLUSIVE, ...), from the rows of workers/work_kinds.h. */
static const unsigned char work_kind_flags[WORK_KIND_COUNT] = {
#define WORK_KIND_FLAGS(kind, name, runner, engine, flags) [WORK_##kind] = (flags),
	WORK_KINDS(WORK_KIND_FLAGS)
#undef WORK_KIND_FLAGS
};

static bool work_kind_has(const struct work *w, enum work_kind_flag flag)
{
	return (unsigned)w->kind < WORK_KIND_COUNT && (work_kind_flags[w->kind] & flag);
}

bool sched_work_exclusive(const struct work *w)
{
	return work_kind_has(w, WORK_KIND_EXCLUSIVE);
}

/*
 * Whether every device operation of w goes on its own lane, so that a later
 * work can wait for it (and it for an earlier one) with a stream wait. Gang
 * parts and collectives also depend on other devices; they are ordered on
 * the host instead.
 */
bool sched_work_lane_ordered(const struct work *w)
{
	return !work_is_gang(w) && work_kind_has(w, WORK_KIND_LANE_ORDERED);
}

static bool ranges_overlap(const struct work_access *a, const struct work_access *b)
{
	if (a->base != b->base || !(a->write || b->write))
		return false;
	if (a->len == 0 || b->len == 0)
		return false;
	return a->off < b->off + b->len && b->off < a->off + a->len;
}

bool sched_works_conflict(const struct work *a, const struct work *b)
{
	for (unsigned i = 0; i < a->naccess; i++)
		for (unsigned j = 0; j < b->naccess; j++)
			if (ranges_overlap(&a->access[i], &b->access[j]))
				return true;
	return false;
}

/* ---- owners and their queues ---- */

static struct sched_owner *owner_find(struct sched_queues *q, uid_t uid)
{
	for (unsigned i = 0; i < SCHED_MAX_OWNERS; i++)
		if (q->owners[i].used && q->owners[i].uid == uid)
			return &q->owners[i];
	return NULL;
}

/* An owner's device time per weight so far: its finished works', and its works' in flight until now. */
static double owner_usage(const struct sched_owner *o, double now)
{
	return (o->served + o->inflight * now - o->inflight_since) / o->weight;
}

/* The least served owner's figure among those with work queued or in flight. */
static double owners_min_served(const struct sched_queues *q, double now)
{
	double min = -1;
	for (unsigned i = 0; i < SCHED_MAX_OWNERS; i++) {
		const struct sched_owner *o = &q->owners[i];
		if (!o->used || (o->queued == 0 && o->inflight == 0))
			continue;
		double v = owner_usage(o, now);
		if (min < 0 || v < min)
			min = v;
	}
	return min < 0 ? 0 : min;
}

/*
 * The owner's share record, made (or an idle one recycled) on first use.
 * An owner that comes back after being idle starts level with the least
 * served active owner: fair share is about who is waiting now, not credit
 * saved up while idle. NULL only when every record belongs to an active owner.
 */
static struct sched_owner *owner_take(struct sched_queues *q, uid_t uid, double weight)
{
	struct sched_owner *o = owner_find(q, uid), *idle = NULL;
	if (!o) {
		for (unsigned i = 0; i < SCHED_MAX_OWNERS && !idle; i++) {
			struct sched_owner *c = &q->owners[i];
			if (!c->used || (c->queued == 0 && c->inflight == 0))
				idle = c;
		}
		if (!idle)
			return NULL;
		memset(idle, 0, sizeof *idle);
		idle->used = true;
		idle->uid = uid;
		o = idle;
	}
	o->weight = weight > 0 ? weight : 1;
	if (o->queued == 0 && o->inflight == 0) {
		double floor = owners_min_served(q, monotonic_seconds()) * o->weight;
		if (o->served < floor)
			o->served = floor;
	}
	return o;
}

static struct sched_owner_queue *queue_of(struct sched_queues *q, int level, uid_t uid,
					  bool create)
{
	for (struct sched_owner_queue *oq = q->levels[level]; oq; oq = oq->next)
		if (oq->uid == uid)
			return oq;
	if (!create)
		return NULL;
	struct sched_owner_queue *oq = calloc(1, sizeof *oq);
	if (!oq)
		return NULL;
	oq->uid = uid;
	oq->next = q->levels[level];
	q->levels[level] = oq;
	return oq;
}

static int level_of(const struct work *w)
{
	return w->priority >= 0 && w->priority < GPUQ_PRIORITIES ? w->priority
								 : GPUQ_PRIORITY_NORMAL;
}

void sched_queues_init(struct sched_queues *q)
{
	memset(q, 0, sizeof *q);
	q->next_seq = 1;
}

void sched_queues_destroy(struct sched_queues *q)
{
	for (int l = 0; l < GPUQ_PRIORITIES; l++) {
		while (q->levels[l]) {
			struct sched_owner_queue *next = q->levels[l]->next;
			free(q->levels[l]);
			q->levels[l] = next;
		}
	}
}

static void ledger_append(struct sched_queues *q, struct work *w)
{
	w->ledger_next = NULL;
	w->ledger_prev = q->ledger_tail;
	if (q->ledger_tail)
		q->ledger_tail->ledger_next = w;
	else
		q->ledger_head = w;
	q->ledger_tail = w;
}

static void ledger_unlink(struct sched_queues *q, struct work *w)
{
	if (w->ledger_prev)
		w->ledger_prev->ledger_next = w->ledger_next;
	else
		q->ledger_head = w->ledger_next;
	if (w->ledger_next)
		w->ledger_next->ledger_prev = w->ledger_prev;
	else
		q->ledger_tail = w->ledger_prev;
	w->ledger_prev = w->ledger_next = NULL;
}

static enum sched_wait blocked(struct work *w, enum sched_wait why, const struct work *behind)
{
	atomic_store(&w->waiting, why);
	atomic_store(&w->waiting_job, behind ? behind->job_id : 0);
	return why;
}

/* ---- works kept out, and what keeps them out ---- */

/*
 * w is kept out for as long as e stays as it is: admission passes over w
 * until e starts, issues its tail, ends or is taken back. So a queue of
 * works blocked behind one stalled job costs admission nothing per round.
 */
static void park_behind(struct work *w, struct work *e)
{
	w->blocker = e;
	w->held_prev = NULL;
	w->held_next = e->held_back;
	if (e->held_back)
		e->held_back->held_prev = w;
	e->held_back = w;
}

static void unpark(struct work *w)
{
	if (!w->blocker)
		return;
	if (w->held_prev)
		w->held_prev->held_next = w->held_next;
	else
		w->blocker->held_back = w->held_next;
	if (w->held_next)
		w->held_next->held_prev = w->held_prev;
	w->blocker = w->held_next = w->held_prev = NULL;
}

/*
 * e changed: what it kept out is looked at again at the next admission.
 * Until then nothing is known to hold those works, so they read `queue`
 * (admission gives each its reason as soon as it looks).
 */
static void release_held_back(struct work *e)
{
	struct work *w = e->held_back;
	e->held_back = NULL;
	while (w) {
		struct work *next = w->held_next;
		w->blocker = w->held_next = w->held_prev = NULL;
		blocked(w, SCHED_WAIT_QUEUE, NULL);
		w = next;
	}
}

static void order_links_clear(struct work *w)
{
	w->blocker = w->held_back = w->held_next = w->held_prev = NULL;
}

/*
 * What the earlier work e means for w: SCHED_NOT_WAITING when w may start
 * whatever e does, or when w's lane can wait for e's tail on the device
 * (*tail is then e's tail event); else why w waits for e. The answer
 * depends on e's state and on nothing else that can change while w is
 * queued, which is what lets park_behind keep it.
 */
static enum sched_wait order_against(const struct work *w, const struct work *e, void **tail)
{
	*tail = NULL;
	if (e->sched_state == SCHED_WORK_HELD) /* a client's lease: no device work to wait for */
		return sched_works_conflict(e, w) ? SCHED_WAIT_LEASE : SCHED_NOT_WAITING;
	if (sched_work_exclusive(e) || sched_work_exclusive(w))
		return SCHED_WAIT_EXCLUSIVE;
	if (work_is_gang(w) && work_is_gang(e))
		return SCHED_WAIT_GANG;
	if (w->kind == WORK_CHAIN && e->kind == WORK_CHAIN)
		return SCHED_WAIT_CHAIN; /* the chain state (plans, events, result slots) is the device's */
	if (!sched_works_conflict(e, w))
		return SCHED_NOT_WAITING;
	if (sched_work_lane_ordered(w) && sched_work_lane_ordered(e) &&
	    e->sched_state == SCHED_WORK_TAIL && e->tail_event) {
		*tail = e->tail_event;
		return SCHED_NOT_WAITING;
	}
	return SCHED_WAIT_BUFFER;
}

/* The earliest client's lease before w that keeps it out, or NULL. */
static struct work *first_lease_before(const struct sched_queues *q, const struct work *w)
{
	for (struct work *e = q->ledger_head; e && e != w; e = e->ledger_next)
		if (e->sched_state == SCHED_WORK_HELD && sched_works_conflict(e, w))
			return e;
	return NULL;
}

/*
 * w is kept out by e (for why): it is parked behind e and says so, unless
 * a lease keeps it out too. Then it names the earliest such lease and
 * waits on it: a lease is what its user can act on (gpuq leases,
 * release), and it lasts.
 */
static enum sched_wait kept_out(struct sched_queues *q, struct work *w, struct work *e,
				enum sched_wait why)
{
	struct work *lease = q->holds ? first_lease_before(q, w) : NULL;
	if (lease) {
		e = lease;
		why = SCHED_WAIT_LEASE;
	}
	park_behind(w, e);
	return blocked(w, why, e);
}

/*
 * Whether w may start now, given every earlier unfinished work on the
 * device (the ledger before it), looked at from the nearest back: a work
 * kept out is kept out by the nearest such work (the job just before it
 * on its buffer, the gang just before it) or a lease, and parked behind
 * it. On success the tail events w's lane must wait for are in deps, and
 * w reads `queue` until it starts (priority, turns or room in flight
 * decide).
 */
static enum sched_wait admissible(struct sched_queues *q, struct work *w,
				  const struct sched_load *load, struct sched_deps *deps)
{
	unpark(w);
	deps->count = 0;
	for (struct work *e = w->ledger_prev; e; e = e->ledger_prev) {
		void *tail;
		enum sched_wait why = order_against(w, e, &tail);
		if (why != SCHED_NOT_WAITING)
			return kept_out(q, w, e, why);
		if (tail && deps->count == SCHED_MAX_DEPS)
			return blocked(w, SCHED_WAIT_BUFFER, e); /* not parked: an earlier tail's end frees a place */
		if (tail)
			deps->events[deps->count++] = tail;
	}
	if (sched_work_exclusive(w) && load->inflight > 0)
		return blocked(w, SCHED_WAIT_EXCLUSIVE, NULL);
	blocked(w, SCHED_WAIT_QUEUE, NULL);
	return SCHED_NOT_WAITING;
}

int sched_enqueue(struct sched_queues *q, struct work *w)
{
	int level = level_of(w);
	struct sched_owner_queue *oq = queue_of(q, level, w->owner_uid, true);
	struct sched_owner *o = oq ? owner_take(q, w->owner_uid, w->weight) : NULL;
	if (!o)
		return -1;
	w->seq = q->next_seq++;
	w->sched_state = SCHED_WORK_QUEUED;
	w->tail_event = NULL;
	order_links_clear(w);
	atomic_store(&w->waiting, SCHED_WAIT_QUEUE);
	atomic_store(&w->waiting_job, 0);
	w->next = NULL;
	if (oq->tail)
		oq->tail->next = w;
	else
		oq->head = w;
	oq->tail = w;
	oq->count++;
	o->queued++;
	q->queued++;
	ledger_append(q, w);
	q->dirty = true;
	/* Its reason now, so that a status right after submission says it (admission refines it). */
	struct sched_deps ignored;
	struct sched_load none = { .max_inflight = 1 };
	admissible(q, w, &none, &ignored);
	return 0;
}

/*
 * Something changed that may let a queued work start: the worker admits
 * again. With nothing queued there is nothing to admit, and a worker
 * that finishes one job at a time (a client's noops, one after another)
 * need not take the lock for an admission that finds nothing.
 */
static void admission_wanted(struct sched_queues *q)
{
	if (q->queued)
		q->dirty = true;
}

/* Unlinks w from its owner queue (it is queued there). */
static void owner_queue_unlink(struct sched_queues *q, struct work *w)
{
	struct sched_owner_queue *oq = queue_of(q, level_of(w), w->owner_uid, false);
	struct work **link = oq ? &oq->head : NULL, *prev = NULL;
	while (link && *link && *link != w) {
		prev = *link;
		link = &(*link)->next;
	}
	if (!link || !*link)
		return;
	*link = w->next;
	if (oq->tail == w)
		oq->tail = prev;
	oq->count--;
	w->next = NULL;
	struct sched_owner *o = owner_find(q, w->owner_uid);
	if (o)
		o->queued--;
	q->queued--;
}

void sched_remove(struct sched_queues *q, struct work *w)
{
	owner_queue_unlink(q, w);
	unpark(w);
	release_held_back(w);
	ledger_unlink(q, w);
	w->sched_state = SCHED_WORK_FINISHED;
	atomic_store(&w->waiting, SCHED_NOT_WAITING);
	admission_wanted(q);
}

void sched_retire(struct sched_queues *q, struct work *w, double started, double now)
{
	struct sched_owner *o = owner_find(q, w->owner_uid);
	if (o) {
		o->inflight--;
		o->inflight_since -= started;
		o->served += now - started;
	}
	release_held_back(w);
	ledger_unlink(q, w);
	w->sched_state = SCHED_WORK_FINISHED;
	admission_wanted(q);
}

bool sched_hold(struct sched_queues *q, struct work *w, struct work *hold)
{
	if (atomic_load(&hold->cancel))
		return false;
	hold->sched_state = SCHED_WORK_HELD;
	order_links_clear(hold);
	q->holds++;
	hold->ledger_prev = w;
	hold->ledger_next = w->ledger_next;
	if (w->ledger_next)
		w->ledger_next->ledger_prev = hold;
	else
		q->ledger_tail = hold;
	w->ledger_next = hold;
	return true;
}

bool sched_hold_last(struct sched_queues *q, struct work *hold)
{
	if (atomic_load(&hold->cancel))
		return false;
	hold->sched_state = SCHED_WORK_HELD;
	order_links_clear(hold);
	q->holds++;
	ledger_append(q, hold);
	return true;
}

void sched_unhold(struct sched_queues *q, struct work *hold)
{
	atomic_store(&hold->cancel, true);
	if (hold->sched_state != SCHED_WORK_HELD)
		return;
	release_held_back(hold);
	q->holds--;
	ledger_unlink(q, hold);
	hold->sched_state = SCHED_WORK_FINISHED;
	admission_wanted(q);
}

void sched_mark_tail(struct sched_queues *q, struct work *w)
{
	if (w->sched_state == SCHED_WORK_ADMITTED) {
		w->sched_state = SCHED_WORK_TAIL;
		release_held_back(w);
		admission_wanted(q);
	}
}

/* ---- admission ---- */

/*
 * Whether candidate a (of owner oa) goes before b (of ob) at one level: the
 * owner with less device time per weight first, then the one with fewer
 * works in flight, then the earlier work.
 */
static bool candidate_before(const struct work *a, const struct sched_owner *oa,
			     const struct work *b, const struct sched_owner *ob, double now)
{
	double va = owner_usage(oa, now), vb = owner_usage(ob, now);
	if (va != vb)
		return va < vb;
	if (oa->inflight != ob->inflight)
		return oa->inflight < ob->inflight;
	return a->seq < b->seq;
}

/*
 * Room in flight for a work of this level: works of lower priority never
 * keep it out, up to twice max_inflight in all, so an urgent job starts at
 * once behind a backlog of low-priority ones.
 */
static bool inflight_room(const struct sched_load *load, int level)
{
	unsigned as_urgent = 0;
	for (int l = 0; l <= level; l++)
		as_urgent += load->inflight_by_level[l];
	return as_urgent < load->max_inflight && load->inflight < 2 * load->max_inflight;
}

/*
 * The owner's first work that may start, or NULL. Works parked behind an
 * earlier one are passed over unexamined, however many there are, so that
 * a stalled job does not keep its owner's independent works out.
 */
static struct work *queue_candidate(struct sched_queues *q, struct sched_owner_queue *oq,
				    const struct sched_load *load, struct sched_deps *deps)
{
	for (struct work *w = oq->head; w; w = w->next)
		if (!w->blocker && admissible(q, w, load, deps) == SCHED_NOT_WAITING)
			return w;
	return NULL;
}

/*
 * The level's work to start next, by fair share between its owners; NULL
 * when none may start. With no room in flight at this level, every
 * owner's candidate is told so (inflight) and *held is set.
 */
static struct work *level_pick(struct sched_queues *q, int level, const struct sched_load *load,
			       struct sched_deps *deps, double now, bool *held)
{
	bool room = inflight_room(load, level);
	struct work *best = NULL;
	struct sched_owner *best_owner = NULL;
	struct sched_deps trial;
	for (struct sched_owner_queue *oq = q->levels[level]; oq; oq = oq->next) {
		struct sched_owner *o = oq->head ? owner_find(q, oq->uid) : NULL;
		struct work *w = o ? queue_candidate(q, oq, load, &trial) : NULL;
		if (w && !room) {
			blocked(w, SCHED_WAIT_INFLIGHT, NULL);
			*held = true;
			continue;
		}
		if (!w || (best && !candidate_before(w, o, best, best_owner, now)))
			continue;
		best = w;
		best_owner = o;
		*deps = trial;
	}
	return best;
}

struct work *sched_pick(struct sched_queues *q, const struct sched_load *load,
			struct sched_deps *deps, double now)
{
	for (int level = 0; level < GPUQ_PRIORITIES; level++) {
		bool held = false;
		struct work *best = level_pick(q, level, load, deps, now, &held);
		if (best || held)
			return best;
	}
	return NULL;
}

void sched_admit_work(struct sched_queues *q, struct work *w, double now)
{
	owner_queue_unlink(q, w);
	release_held_back(w);
	struct sched_owner *o = owner_find(q, w->owner_uid);
	if (o) {
		o->inflight++;
		o->inflight_since += now;
	}
	w->sched_state = SCHED_WORK_ADMITTED;
	atomic_store(&w->waiting, SCHED_NOT_WAITING);
	atomic_store(&w->waiting_job, 0);
}

struct work *sched_queued_first(struct sched_queues *q)
{
	for (struct work *w = q->ledger_head; w; w = w->ledger_next)
		if (w->sched_state == SCHED_WORK_QUEUED)
			return w;
	return NULL;
}

const char *sched_wait_name(enum sched_wait why)
{
	switch (why) {
	case SCHED_NOT_WAITING: return "";
	case SCHED_WAIT_QUEUE: return "queue";
	case SCHED_WAIT_BUFFER: return "buffer";
	case SCHED_WAIT_GANG: return "gang";
	case SCHED_WAIT_EXCLUSIVE: return "exclusive";
	case SCHED_WAIT_INFLIGHT: return "inflight";
	case SCHED_WAIT_CHAIN: return "chain";
	case SCHED_WAIT_SLOTS: return "staging";
	case SCHED_WAIT_MEMORY: return "memory";
	case SCHED_WAIT_PEERS: return "peers";
	case SCHED_WAIT_LEASE: return "lease";
	case SCHED_WAIT_REGION: return "region";
	case SCHED_WAIT_COUNT: break;
	}
	return "unknown";
}
