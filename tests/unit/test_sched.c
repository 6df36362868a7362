/*
 * Unit tests for the scheduler's admission rule (workers/sched/sched_queue.c) and
 * for fibers (workers/sched/fiber.c): which queued work starts next, and what it
 * must wait for, with no worker thread and no device.
 */
#include <fenv.h>
#include <string.h>

#include "tests/harness.h"
#include "workers/clock.h"
#include "workers/sched/fiber.h"
#include "workers/sched/sched_queue.h"
#include "workers/sched/sched_wait.h"

static char buffer_a[64], buffer_b[64]; /* stand-ins for device memory */
static double add_weight = 1; /* the weight add() gives its works */

struct bench {
	struct sched_queues q;
	struct work works[64];
	int n;
	struct sched_load load;
	struct sched_deps deps;
	double now; /* the clock admissions and retirements are stamped with */
};

static void bench_init(struct bench *b, unsigned max_inflight)
{
	memset(b, 0, sizeof *b);
	sched_queues_init(&b->q);
	b->load.max_inflight = max_inflight;
	b->now = monotonic_seconds();
}

/* A queued work: kind, owner, priority, and one access (base NULL: none). */
static struct work *add(struct bench *b, enum work_kind kind, uid_t uid, int priority,
			const void *base, uint64_t off, uint64_t len, bool write)
{
	struct work *w = &b->works[b->n++];
	memset(w, 0, sizeof *w);
	w->kind = kind;
	w->owner_uid = uid;
	w->priority = priority;
	w->weight = add_weight;
	w->gang_size = 1;
	w->job_id = (uint64_t)b->n;
	if (base)
		w->access[w->naccess++] = (struct work_access){ base, off, len, write };
	CHECK(sched_enqueue(&b->q, w) == 0);
	return w;
}

/* Picks and admits the next work, as the worker would; NULL when none may start. */
static struct work *next(struct bench *b)
{
	struct work *w = sched_pick(&b->q, &b->load, &b->deps, b->now);
	if (!w)
		return NULL;
	w->started_at = b->now;
	sched_admit_work(&b->q, w, b->now);
	b->load.inflight++;
	b->load.inflight_by_level[w->priority]++;
	return w;
}

/* w finishes `seconds` after it started; the clock moves on to then if it was earlier. */
static void finish(struct bench *b, struct work *w, double seconds)
{
	if (b->now < w->started_at + seconds)
		b->now = w->started_at + seconds;
	sched_retire(&b->q, w, w->started_at, w->started_at + seconds);
	b->load.inflight--;
	b->load.inflight_by_level[w->priority]--;
}

TEST(sched_independent_works_all_start)
{
	struct bench b;
	bench_init(&b, 16);
	struct work *put = add(&b, WORK_PUT, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	struct work *get = add(&b, WORK_GET, 1, GPUQ_PRIORITY_NORMAL, buffer_b, 0, 64, false);
	struct work *noop = add(&b, WORK_NOOP, 1, GPUQ_PRIORITY_NORMAL, NULL, 0, 0, false);
	CHECK(next(&b) == put);
	CHECK(next(&b) == get);
	CHECK(next(&b) == noop);
	CHECK(next(&b) == NULL);
}

TEST(sched_same_buffer_keeps_submission_order)
{
	struct bench b;
	bench_init(&b, 16);
	struct work *put = add(&b, WORK_PUT, 1, GPUQ_PRIORITY_LOW, buffer_a, 0, 64, true);
	/* more urgent, and on the same bytes: still after the put */
	struct work *get = add(&b, WORK_GET, 1, GPUQ_PRIORITY_HIGH, buffer_a, 16, 8, false);
	CHECK(next(&b) == put);
	CHECK(next(&b) == NULL);
	CHECK_EQ(atomic_load(&get->waiting), SCHED_WAIT_BUFFER);
	CHECK_EQ(atomic_load(&get->waiting_job), put->job_id);
	/* once the put has issued everything, the get starts and waits for it on the device */
	static int tail_event;
	put->tail_event = &tail_event;
	sched_mark_tail(&b.q, put);
	CHECK(next(&b) == get);
	CHECK_EQ(b.deps.count, 1);
	CHECK(b.deps.events[0] == &tail_event);
}

TEST(sched_reads_share_and_disjoint_ranges_overlap)
{
	struct bench b;
	bench_init(&b, 16);
	struct work *r1 = add(&b, WORK_CHECKSUM, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	struct work *r2 = add(&b, WORK_GET, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	struct work *w1 = add(&b, WORK_PUT, 1, GPUQ_PRIORITY_NORMAL, buffer_b, 0, 32, true);
	struct work *w2 = add(&b, WORK_PUT, 1, GPUQ_PRIORITY_NORMAL, buffer_b, 32, 32, true);
	struct work *w3 = add(&b, WORK_PUT, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 63, 1, true);
	CHECK(next(&b) == r1);
	CHECK(next(&b) == r2);
	CHECK(next(&b) == w1);
	CHECK(next(&b) == w2); /* [32, 64) does not overlap [0, 32) */
	CHECK(next(&b) == NULL); /* w3 writes byte 63 the reads read */
	CHECK_EQ(atomic_load(&w3->waiting), SCHED_WAIT_BUFFER);
	finish(&b, r1, 0.001);
	CHECK(next(&b) == NULL);
	finish(&b, r2, 0.001);
	CHECK(next(&b) == w3);
}

TEST(sched_streams_cannot_wait_for_gangs_on_the_device)
{
	struct bench b;
	bench_init(&b, 16);
	struct work *ar = add(&b, WORK_COLLECTIVE, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	ar->gang_size = 2;
	struct work *get = add(&b, WORK_GET, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	CHECK(next(&b) == ar);
	static int tail_event;
	ar->tail_event = &tail_event;
	sched_mark_tail(&b.q, ar); /* ignored for a gang's part: it is not lane-ordered */
	CHECK(next(&b) == NULL);
	finish(&b, ar, 0.001);
	CHECK(next(&b) == get);
	CHECK_EQ(b.deps.count, 0);
}

TEST(sched_gang_parts_keep_their_order_and_go_one_at_a_time)
{
	struct bench b;
	bench_init(&b, 16);
	struct work *g1 = add(&b, WORK_COLLECTIVE, 1, GPUQ_PRIORITY_LOW, buffer_a, 0, 64, true);
	struct work *g2 = add(&b, WORK_COPY, 2, GPUQ_PRIORITY_HIGH, buffer_b, 0, 64, true);
	struct work *noop = add(&b, WORK_NOOP, 3, GPUQ_PRIORITY_LOW, NULL, 0, 0, false);
	g1->gang_size = g2->gang_size = 2;
	CHECK(next(&b) == g1); /* g2 is more urgent but later: gangs never cross */
	CHECK(next(&b) == noop);
	CHECK(next(&b) == NULL);
	CHECK_EQ(atomic_load(&g2->waiting), SCHED_WAIT_GANG);
	finish(&b, g1, 0.001);
	CHECK(next(&b) == g2);
}

TEST(sched_benchmarks_run_alone)
{
	struct bench b;
	bench_init(&b, 16);
	struct work *before = add(&b, WORK_FILL, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	struct work *bench = add(&b, WORK_BENCH_COPY, 1, GPUQ_PRIORITY_NORMAL, NULL, 0, 0, false);
	struct work *after = add(&b, WORK_NOOP, 1, GPUQ_PRIORITY_HIGH, NULL, 0, 0, false);
	CHECK(next(&b) == before);
	CHECK(next(&b) == NULL);
	CHECK_EQ(atomic_load(&bench->waiting), SCHED_WAIT_EXCLUSIVE);
	CHECK_EQ(atomic_load(&after->waiting), SCHED_WAIT_EXCLUSIVE);
	finish(&b, before, 0.001);
	CHECK(next(&b) == bench);
	CHECK(next(&b) == NULL);
	finish(&b, bench, 0.5);
	CHECK(next(&b) == after);
}

TEST(sched_priority_first_and_urgent_work_passes_a_full_device)
{
	struct bench b;
	bench_init(&b, 2);
	struct work *low[3];
	for (int i = 0; i < 3; i++)
		low[i] = add(&b, WORK_PUT, 1, GPUQ_PRIORITY_LOW, buffer_a, (uint64_t)i * 8, 8, true);
	CHECK(next(&b) == low[0]);
	CHECK(next(&b) == low[1]);
	CHECK(next(&b) == NULL); /* two in flight: the limit */
	CHECK_EQ(atomic_load(&low[2]->waiting), SCHED_WAIT_INFLIGHT);
	struct work *normal = add(&b, WORK_NOOP, 1, GPUQ_PRIORITY_NORMAL, NULL, 0, 0, false);
	struct work *high = add(&b, WORK_CHECKSUM, 1, GPUQ_PRIORITY_HIGH, buffer_b, 0, 64, false);
	CHECK(next(&b) == high); /* more urgent first, and low work does not keep it out */
	CHECK(next(&b) == normal);
	CHECK(next(&b) == NULL); /* four in flight: twice the limit */
}

TEST(sched_owners_take_turns_by_time_used)
{
	struct bench b;
	bench_init(&b, 1);
	struct work *many[6], *few[2];
	for (int i = 0; i < 6; i++)
		many[i] = add(&b, WORK_PUT, 100, GPUQ_PRIORITY_NORMAL, buffer_a, (uint64_t)i, 1, true);
	for (int i = 0; i < 2; i++)
		few[i] = add(&b, WORK_PUT, 200, GPUQ_PRIORITY_NORMAL, buffer_b, (uint64_t)i, 1, true);
	struct work *order[8];
	for (int i = 0; i < 8; i++) {
		order[i] = next(&b);
		CHECK(order[i] != NULL);
		finish(&b, order[i], 1.0);
	}
	/* equal times per job: they alternate while both have work, submission order within each */
	CHECK(order[0] == many[0] && order[1] == few[0] && order[2] == many[1] &&
	      order[3] == few[1] && order[4] == many[2]);
}

TEST(sched_a_weight_buys_a_larger_share)
{
	struct bench b;
	bench_init(&b, 1);
	for (int i = 0; i < 12; i++) {
		add_weight = 3;
		add(&b, WORK_NOOP, 300, GPUQ_PRIORITY_NORMAL, NULL, 0, 0, false);
		add_weight = 1;
		add(&b, WORK_NOOP, 400, GPUQ_PRIORITY_NORMAL, NULL, 0, 0, false);
	}
	int heavy = 0;
	for (int i = 0; i < 8; i++) {
		struct work *w = next(&b);
		heavy += w->owner_uid == 300;
		finish(&b, w, 1.0);
	}
	CHECKF(heavy == 6, "the weight-3 owner got %d of 8 turns, not 6", heavy);
}

TEST(sched_removed_work_unblocks_what_waited_for_it)
{
	struct bench b;
	bench_init(&b, 16);
	struct work *put = add(&b, WORK_PUT, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	struct work *get = add(&b, WORK_GET, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	struct work *get2 = add(&b, WORK_GET, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	CHECK(next(&b) == put);
	CHECK(next(&b) == NULL);
	sched_remove(&b.q, get); /* cancelled while queued */
	CHECK(sched_queued_first(&b.q) == get2);
	finish(&b, put, 0.01);
	CHECK(next(&b) == get2);
	CHECK(sched_queued_first(&b.q) == NULL);
}

/*
 * Works that wait only for the order on one buffer never keep their
 * owner's work on another buffer out, however many of them there are, and
 * a less urgent job never starts first. Then the chain on the first buffer
 * drains in submission order, each behind the one before it.
 */
TEST(sched_any_number_of_works_blocked_on_a_buffer_let_their_owners_other_works_pass)
{
	enum { BLOCKED = 40 };
	struct bench b;
	bench_init(&b, 4);
	struct work *put = add(&b, WORK_PUT, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	CHECK(next(&b) == put); /* a put from a stalled pipe: it holds buffer_a */
	struct work *fills[BLOCKED];
	for (int i = 0; i < BLOCKED; i++)
		fills[i] = add(&b, WORK_FILL, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	struct work *normal = add(&b, WORK_FILL, 1, GPUQ_PRIORITY_NORMAL, buffer_b, 0, 32, true);
	struct work *low = add(&b, WORK_FILL, 1, GPUQ_PRIORITY_LOW, buffer_b, 32, 32, true);
	CHECK(next(&b) == normal);
	CHECK(next(&b) == low);
	CHECK(next(&b) == NULL);
	for (int i = 0; i < BLOCKED; i++) {
		CHECK_EQ(atomic_load(&fills[i]->waiting), SCHED_WAIT_BUFFER);
		CHECK_EQ(atomic_load(&fills[i]->waiting_job), i ? fills[i - 1]->job_id : put->job_id);
	}
	finish(&b, normal, 0.001);
	finish(&b, low, 0.001);
	finish(&b, put, 0.001);
	for (int i = 0; i < BLOCKED; i++) {
		CHECK(next(&b) == fills[i]);
		CHECK(next(&b) == NULL); /* the next fill waits for this one's tail */
		finish(&b, fills[i], 0.001);
	}
	CHECK(sched_queued_first(&b.q) == NULL);
}

/*
 * A work refused for one reason and then for another says the one that
 * holds now: the get waits behind the put, then (the put done, a less
 * served owner's work started) for room in flight, not behind the put.
 */
TEST(sched_a_waiting_reason_follows_what_holds_the_work_now)
{
	struct bench b;
	bench_init(&b, 2);
	struct work *earlier = add(&b, WORK_NOOP, 2, GPUQ_PRIORITY_NORMAL, NULL, 0, 0, false);
	struct work *put = add(&b, WORK_PUT, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	struct work *get = add(&b, WORK_GET, 2, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	struct work *other = add(&b, WORK_GET, 3, GPUQ_PRIORITY_NORMAL, buffer_b, 0, 64, false);
	CHECK(next(&b) == earlier); /* owner 2's, in flight from now on */
	CHECK(next(&b) == put);
	CHECK(next(&b) == NULL); /* two in flight: the limit */
	CHECK_EQ(atomic_load(&get->waiting), SCHED_WAIT_BUFFER);
	CHECK_EQ(atomic_load(&other->waiting), SCHED_WAIT_INFLIGHT);
	b.now += 1.0;
	finish(&b, put, 0.001);
	CHECK(next(&b) == other); /* owner 3 has used the device least */
	CHECK(next(&b) == NULL);
	CHECK_EQ(atomic_load(&get->waiting), SCHED_WAIT_INFLIGHT);
	CHECK_EQ(atomic_load(&get->waiting_job), 0);
}

/* ---- fibers ---- */

struct steps {
	int trace[8];
	int n;
};

static void fiber_body(void *arg)
{
	struct steps *s = arg;
	s->trace[s->n++] = 1;
	fiber_yield();
	s->trace[s->n++] = 3;
	CHECK(fiber_current() != NULL);
}

TEST(fiber_runs_until_it_yields_and_resumes_where_it_stopped)
{
	struct steps s = { .n = 0 };
	struct fiber *f = fiber_create(fiber_body, &s, 0);
	CHECK(f != NULL);
	CHECK(fiber_current() == NULL);
	CHECK(!fiber_resume(f));
	s.trace[s.n++] = 2;
	CHECK(fiber_resume(f));
	CHECK_EQ(s.n, 3);
	CHECK(s.trace[0] == 1 && s.trace[1] == 2 && s.trace[2] == 3);
	s.n = 0; /* a finished fiber runs another function on the same stack */
	fiber_restart(f, fiber_body, &s);
	CHECK(!fiber_resume(f));
	CHECK(fiber_resume(f));
	CHECK_EQ(s.n, 2);
	fiber_destroy(f);
}

static void deep(void *arg)
{
	volatile char page[64 << 10]; /* a deep frame: the stack is large enough for real calls */
	memset((char *)page, 1, sizeof page);
	*(int *)arg = page[100];
}

TEST(fiber_stack_holds_large_frames)
{
	int out = 0;
	struct fiber *f = fiber_create(deep, &out, 0);
	CHECK(f && fiber_resume(f));
	CHECK_EQ(out, 1);
	fiber_destroy(f);
}

/*
 * Values a fiber keeps in registers across its yields: several fibers
 * interleaved, each with more live integers and doubles than the registers
 * a call clobbers, and the scheduler's own the same, so a switch that
 * dropped or mixed up a callee-saved register shows as a wrong sum.
 */
struct accum {
	int id;
	long ints;
	double reals;
};

/* The sums, yielding after each step when asked (on a fiber) or not (the reference). */
static void accumulate_steps(struct accum *a, bool yield)
{
	long i0 = a->id, i1 = 2 * a->id, i2 = 3 * a->id, i3 = 5 * a->id, i4 = 7 * a->id;
	double d0 = a->id * 0.5, d1 = a->id * 0.25;
	for (int k = 0; k < 1000; k++) {
		i0 += 1; i1 += i0; i2 ^= i1; i3 += i2 & 7; i4 -= i3 & 3;
		d0 += 1.0; d1 += d0 * 0.5;
		if (yield)
			fiber_yield();
	}
	a->ints = i0 + i1 + i2 + i3 + i4;
	a->reals = d0 + d1;
}

static void accumulate(void *arg)
{
	accumulate_steps(arg, true);
}

TEST(fibers_keep_their_registers_across_switches)
{
	enum { N = 6 };
	struct accum got[N], want[N];
	struct fiber *f[N];
	for (int i = 0; i < N; i++) {
		got[i] = (struct accum){ .id = i + 1 };
		want[i] = got[i];
		accumulate_steps(&want[i], false);
		f[i] = fiber_create(accumulate, &got[i], 0);
		CHECK(f[i] != NULL);
	}
	int running = N;
	long mine = 0; /* the scheduler's own live value across the resumes */
	while (running > 0) {
		running = 0;
		for (int i = 0; i < N; i++) {
			if (!f[i])
				continue;
			mine += i;
			if (fiber_resume(f[i])) {
				fiber_destroy(f[i]);
				f[i] = NULL;
			} else {
				running++;
			}
		}
	}
	CHECK_EQ(mine, 1001L * (0 + 1 + 2 + 3 + 4 + 5));
	for (int i = 0; i < N; i++) {
		CHECK_EQ(got[i].ints, want[i].ints);
		CHECK(got[i].reals == want[i].reals);
	}
}

/* A fiber's floating-point modes are its own: a rounding mode it sets stays with it. */
static void round_upward(void *arg)
{
	int *seen = arg;
	fesetround(FE_UPWARD);
	fiber_yield();
	seen[0] = fegetround();
	fesetround(FE_TONEAREST);
}

TEST(fiber_rounding_mode_stays_with_the_fiber)
{
	int seen[1] = { -1 };
	struct fiber *f = fiber_create(round_upward, seen, 0);
	CHECK(f != NULL);
	CHECK(!fiber_resume(f));
	CHECK_EQ(fegetround(), FE_TONEAREST);
	CHECK(fiber_resume(f));
	CHECK_EQ(seen[0], FE_UPWARD);
	CHECK_EQ(fegetround(), FE_TONEAREST);
	fiber_destroy(f);
}

/*
 * Grants an attach as the scheduler does: its lease's entry takes the
 * attach's place in the ledger, then the attach is retired.
 */
static bool grant(struct bench *b, struct work *attach, struct work *hold)
{
	bool held = sched_hold(&b->q, attach, hold);
	finish(b, attach, 0);
	return held;
}

static struct work lease_hold(const void *base, bool write)
{
	struct work h;
	memset(&h, 0, sizeof h);
	h.kind = WORK_ATTACH;
	h.job_id = 99;
	h.access[h.naccess++] = (struct work_access){ base, 0, 64, write };
	return h;
}

TEST(sched_a_read_write_lease_holds_every_later_job_on_its_buffer)
{
	struct bench b;
	bench_init(&b, 16);
	struct work hold = lease_hold(buffer_a, true);
	struct work *attach = add(&b, WORK_ATTACH, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	CHECK(next(&b) == attach);
	CHECK(grant(&b, attach, &hold));
	struct work *read = add(&b, WORK_CHECKSUM, 2, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	struct work *other = add(&b, WORK_FILL, 2, GPUQ_PRIORITY_NORMAL, buffer_b, 0, 64, true);
	CHECK(next(&b) == other); /* another buffer goes on */
	CHECK(next(&b) == NULL);
	CHECK_EQ(atomic_load(&read->waiting), SCHED_WAIT_LEASE);
	CHECK_EQ(atomic_load(&read->waiting_job), 99);
	sched_unhold(&b.q, &hold);
	CHECK(next(&b) == read);
}

TEST(sched_read_leases_let_readers_pass_and_hold_writers)
{
	struct bench b;
	bench_init(&b, 16);
	struct work h1 = lease_hold(buffer_a, false), h2 = lease_hold(buffer_a, false);
	struct work *a1 = add(&b, WORK_ATTACH, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	CHECK(next(&b) == a1 && grant(&b, a1, &h1));
	struct work *a2 = add(&b, WORK_ATTACH, 2, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	CHECK(next(&b) == a2 && grant(&b, a2, &h2)); /* a second read lease beside the first */
	struct work *read = add(&b, WORK_CHECKSUM, 3, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	struct work *write = add(&b, WORK_FILL, 3, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	CHECK(next(&b) == read); /* (a read after the write would keep its order behind it) */
	CHECK(next(&b) == NULL);
	CHECK_EQ(atomic_load(&write->waiting), SCHED_WAIT_LEASE);
	sched_unhold(&b.q, &h1);
	CHECK(next(&b) == NULL); /* the second lease still holds it */
	sched_unhold(&b.q, &h2);
	finish(&b, read, 0.001);
	CHECK(next(&b) == write);
}

TEST(sched_a_lease_dropped_before_its_grant_never_enters_the_ledger)
{
	struct bench b;
	bench_init(&b, 16);
	struct work hold = lease_hold(buffer_a, true);
	struct work *attach = add(&b, WORK_ATTACH, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	sched_unhold(&b.q, &hold); /* the client went away while the attach was queued */
	CHECK(next(&b) == attach);
	CHECK(!grant(&b, attach, &hold));
	struct work *fill = add(&b, WORK_FILL, 2, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	CHECK(next(&b) == fill);
}

TEST(sched_a_held_lease_keeps_no_benchmark_or_chain_out)
{
	struct bench b;
	bench_init(&b, 16);
	struct work hold = lease_hold(buffer_a, true);
	struct work *attach = add(&b, WORK_ATTACH, 1, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	CHECK(next(&b) == attach && grant(&b, attach, &hold));
	struct work *bench = add(&b, WORK_BENCH_SCHED, 2, GPUQ_PRIORITY_NORMAL, NULL, 0, 0, false);
	CHECK(next(&b) == bench); /* not device work: nothing for a benchmark to wait for */
	sched_unhold(&b.q, &hold);
}

TEST(sched_alone_is_false_outside_a_job)
{
	/* a thread that runs no job may not block on the strength of being alone */
	CHECK(!sched_alone());
}

TEST(sched_a_lease_held_again_after_a_reexec_holds_back_what_comes_after_it)
{
	struct bench b;
	bench_init(&b, 16);
	struct work hold = lease_hold(buffer_a, false), dropped = lease_hold(buffer_b, true);
	CHECK(sched_hold_last(&b.q, &hold)); /* an empty ledger: no attach stands before it */
	struct work *read = add(&b, WORK_CHECKSUM, 2, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, false);
	struct work *write = add(&b, WORK_FILL, 2, GPUQ_PRIORITY_NORMAL, buffer_a, 0, 64, true);
	CHECK(next(&b) == read); /* a read lease lets readers pass */
	CHECK(next(&b) == NULL);
	CHECK_EQ(atomic_load(&write->waiting), SCHED_WAIT_LEASE);
	CHECK_EQ(atomic_load(&write->waiting_job), 99);
	sched_unhold(&b.q, &hold);
	finish(&b, read, 0.001);
	CHECK(next(&b) == write);
	sched_unhold(&b.q, &dropped); /* ended before it was held again: it never is */
	CHECK(!sched_hold_last(&b.q, &dropped));
	finish(&b, write, 0.001);
	struct work *fill_b = add(&b, WORK_FILL, 2, GPUQ_PRIORITY_NORMAL, buffer_b, 0, 64, true);
	CHECK(next(&b) == fill_b);
}
