/*
 * The host backend's engines (see host_engine.h).
 *
 * Every stream holds its operations in order; the head is the next to run.
 * A "run" head is taken by the thread of its engine (the most urgent stream
 * first); marks and waits at the head are retired by whichever thread looks:
 * a mark stamps its event's completion time, a wait leaves once the event it
 * waits for is complete. `completed` counts the stream's retired operations
 * and is what events compare with, read without the lock (release/acquire).
 *
 * Lifetimes: a stream is freed only when its device's engines stop, so a
 * wait in another device's stream never reads freed memory; an event must
 * be complete before its memory goes (backend_host.c's event_destroy waits).
 */
#include "workers/backend/host_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "workers/backend/backend.h"
#include "workers/clock.h"

enum qop_type { QOP_RUN, QOP_MARK, QOP_WAIT };

struct qop {
	enum qop_type type;
	enum host_engine_kind kind;
	host_op_fn fn;
	struct host_op op;
	struct host_event *event;        /* MARK: stamped if still recorded at mark_seq */
	uint64_t mark_seq;
	struct host_stream *wait_stream; /* WAIT: until its completed count reaches wait_seq */
	uint64_t wait_seq;
	uint64_t order; /* RUN: when it was queued, among all the device's streams */
	struct qop *next;
};

struct host_stream {
	struct host_engines *e;
	int priority;
	struct qop *head, *tail;
	bool running; /* its head runs on an engine thread */
	uint64_t submitted;
	_Atomic uint64_t completed;
	bool destroyed;
	unsigned serial; /* its number among the device's streams (the engine trace's) */
	struct host_stream *next; /* in e->streams, most urgent first */
};

struct host_engines {
	struct device *dev;
	pthread_t threads[HOST_ENGINES];
	bool started[HOST_ENGINES];
	struct host_stream *streams;
	bool stopping;
	unsigned delay_us[HOST_ENGINES];
	int trace_fd; /* GPUQ_HOST_ENGINE_TRACE's file, or -1 */
	unsigned streams_made;
	uint64_t queued; /* operations queued so far, numbering them */
	struct host_stream *last[HOST_ENGINES]; /* the stream each engine ran last */
};

struct engine_thread_arg {
	struct host_engines *e;
	enum host_engine_kind kind;
};

static pthread_mutex_t engines_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t engines_cond = PTHREAD_COND_INITIALIZER;

bool host_event_done(const struct host_event *ev)
{
	return !ev->stream ||
	       atomic_load_explicit(&ev->stream->completed, memory_order_acquire) >= ev->seq;
}

/* Retires the stream's head; the lock is held. */
static void stream_pop(struct host_stream *s)
{
	struct qop *q = s->head;
	s->head = q->next;
	if (!s->head)
		s->tail = NULL;
	free(q);
	atomic_fetch_add_explicit(&s->completed, 1, memory_order_release);
}

/* Retires the marks and satisfied waits at the heads of e's streams; true if any. */
static bool retire_ready(struct host_engines *e)
{
	bool any = false;
	for (struct host_stream *s = e->streams; s; s = s->next) {
		while (s->head && !s->running) {
			struct qop *q = s->head;
			if (q->type == QOP_MARK) {
				if (q->event->stream == s && q->event->seq == q->mark_seq)
					q->event->at = monotonic_seconds();
			} else if (q->type == QOP_WAIT) {
				if (atomic_load_explicit(&q->wait_stream->completed,
							 memory_order_acquire) < q->wait_seq)
					break;
			} else {
				break;
			}
			stream_pop(s);
			any = true;
		}
	}
	return any;
}

/*
 * Moves s behind the other streams of its priority, so that streams of one
 * priority take turns on an engine as a GPU's do. The lock is held.
 */
static void stream_take_turn(struct host_engines *e, struct host_stream *s)
{
	struct host_stream **link = &e->streams;
	while (*link != s)
		link = &(*link)->next;
	*link = s->next;
	while (*link && (*link)->priority <= s->priority)
		link = &(*link)->next;
	s->next = *link;
	*link = s;
}

static bool runs_next_on(const struct host_stream *s, enum host_engine_kind kind)
{
	return !s->running && s->head && s->head->type == QOP_RUN && s->head->kind == kind;
}

/*
 * The stream whose head runs next on `kind`; the lock is held. Compute
 * takes the most urgent stream first, as a GPU's kernels do. A DMA engine
 * does as a GPU's copy engine does (measured by others: stream priority
 * changes nothing, and copies ready back to back on one stream run
 * back to back): it stays with the stream it ran last while that stream
 * has a copy ready, else takes the copy queued first, whatever its stream.
 * So a stream that is never empty shuts out every other's copies, and the
 * tests see the head-of-line blocking the scheduler must avoid.
 */
static struct host_stream *runnable(struct host_engines *e, enum host_engine_kind kind)
{
	bool copy_engine = kind == HOST_ENGINE_H2D || kind == HOST_ENGINE_D2H;
	struct host_stream *first = NULL;
	if (copy_engine && e->last[kind] && runs_next_on(e->last[kind], kind))
		return e->last[kind];
	for (struct host_stream *s = e->streams; s; s = s->next) {
		if (!runs_next_on(s, kind))
			continue;
		if (!copy_engine)
			return s;
		if (!first || s->head->order < first->head->order)
			first = s;
	}
	return first;
}

/* Whether any stream still has an operation to run (waits alone may wait on stopped devices). */
static bool work_left(const struct host_engines *e)
{
	for (const struct host_stream *s = e->streams; s; s = s->next)
		for (const struct qop *q = s->head; q; q = q->next)
			if (q->type == QOP_RUN)
				return true;
	return false;
}

static void engine_delay(unsigned us)
{
	if (!us)
		return;
	struct timespec t = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000L };
	nanosleep(&t, NULL);
}

/*
 * Tests only: GPUQ_HOST_ENGINE_TRACE=PATH appends a line per copy as its
 * engine takes it, "h2d|d2h DEVICE STREAM BYTES", and one as it is queued,
 * the same after "queued ", so that a test counts whose copies ran before
 * whose and how many bytes a stream kept queued (test_sched.c) instead of
 * timing them. Written under the engines' lock, so the lines are in the
 * order of those events.
 */
static void trace_copy(const struct host_engines *e, const char *event,
		       const struct host_stream *s, const struct qop *q)
{
	if (e->trace_fd < 0 || (q->kind != HOST_ENGINE_H2D && q->kind != HOST_ENGINE_D2H))
		return;
	dprintf(e->trace_fd, "%s%s %d %u %zu\n", event, q->kind == HOST_ENGINE_H2D ? "h2d" : "d2h",
		e->dev->index, s->serial, q->op.n);
}

static void *engine_main(void *arg)
{
	struct engine_thread_arg *a = arg;
	struct host_engines *e = a->e;
	enum host_engine_kind kind = a->kind;
	free(a);
	pthread_mutex_lock(&engines_lock);
	for (;;) {
		retire_ready(e);
		struct host_stream *s = runnable(e, kind);
		if (!s) {
			if (e->stopping && !work_left(e))
				break;
			pthread_cond_wait(&engines_cond, &engines_lock);
			continue;
		}
		struct qop *q = s->head;
		s->running = true;
		e->last[kind] = s;
		stream_take_turn(e, s);
		trace_copy(e, "", s, q);
		pthread_mutex_unlock(&engines_lock);
		engine_delay(e->delay_us[kind]);
		q->fn(&q->op);
		pthread_mutex_lock(&engines_lock);
		s->running = false;
		stream_pop(s);
		retire_ready(e);
		pthread_cond_broadcast(&engines_cond);
		pthread_mutex_unlock(&engines_lock);
		e->dev->waits->notify(e->dev->sched);
		pthread_mutex_lock(&engines_lock);
	}
	pthread_mutex_unlock(&engines_lock);
	return NULL;
}

/*
 * Tests only: GPUQ_HOST_ENGINE_DELAY_US="h2d:500,compute:100" makes each
 * operation on those engines take that much longer, so that the tests can
 * make one job slow and see what runs beside it.
 */
static void read_delays(struct host_engines *e)
{
	static const char *const names[HOST_ENGINES] = { "h2d", "d2h", "copy", "compute" };
	const char *v = getenv("GPUQ_HOST_ENGINE_DELAY_US");
	while (v && *v) {
		for (int k = 0; k < HOST_ENGINES; k++) {
			size_t len = strlen(names[k]);
			if (strncmp(v, names[k], len) == 0 && v[len] == ':')
				e->delay_us[k] = (unsigned)strtoul(v + len + 1, NULL, 10);
		}
		v = strchr(v, ',');
		v = v ? v + 1 : NULL;
	}
}

struct host_engines *host_engines_start(struct device *dev, struct gpuq_error *err)
{
	struct host_engines *e = calloc(1, sizeof *e);
	if (!e) {
		gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "host device %d: no memory for its engines",
			  dev->index);
		return NULL;
	}
	e->dev = dev;
	read_delays(e);
	const char *trace = getenv("GPUQ_HOST_ENGINE_TRACE");
	e->trace_fd = trace ? open(trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
	if (trace && e->trace_fd < 0) { /* a test reading an empty trace would blame the scheduler */
		gpuq_fail(err, GPUQ_E_IO, "host device %d: GPUQ_HOST_ENGINE_TRACE=%s: %s", dev->index,
			  trace, strerror(errno));
		free(e);
		return NULL;
	}
	for (int k = 0; k < HOST_ENGINES; k++) {
		struct engine_thread_arg *a = malloc(sizeof *a);
		if (a) {
			a->e = e;
			a->kind = (enum host_engine_kind)k;
		}
		int rc = a ? pthread_create(&e->threads[k], NULL, engine_main, a) : -1;
		if (rc != 0) {
			free(a);
			gpuq_fail(err, GPUQ_E_INTERNAL, "host device %d: cannot start engine thread %d",
				  dev->index, k);
			host_engines_stop(e);
			return NULL;
		}
		e->started[k] = true;
	}
	return e;
}

void host_engines_stop(struct host_engines *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&engines_lock);
	e->stopping = true;
	pthread_cond_broadcast(&engines_cond);
	pthread_mutex_unlock(&engines_lock);
	for (int k = 0; k < HOST_ENGINES; k++)
		if (e->started[k])
			pthread_join(e->threads[k], NULL);
	while (e->streams) {
		struct host_stream *s = e->streams;
		e->streams = s->next;
		while (s->head) { /* only waits on streams that will never run again */
			struct qop *q = s->head;
			s->head = q->next;
			free(q);
		}
		free(s);
	}
	if (e->trace_fd >= 0)
		close(e->trace_fd);
	free(e);
}

struct host_stream *host_stream_create(struct host_engines *e, int priority)
{
	struct host_stream *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->e = e;
	s->priority = priority;
	pthread_mutex_lock(&engines_lock);
	s->serial = ++e->streams_made;
	struct host_stream **link = &e->streams;
	while (*link && (*link)->priority <= priority)
		link = &(*link)->next;
	s->next = *link;
	*link = s;
	pthread_mutex_unlock(&engines_lock);
	return s;
}

/* The stream stays listed (and allocated) until its engines stop: see the top. */
void host_stream_destroy(struct host_stream *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&engines_lock);
	s->destroyed = true;
	pthread_mutex_unlock(&engines_lock);
}

static int stream_append(struct host_stream *s, struct qop *q)
{
	pthread_mutex_lock(&engines_lock);
	q->next = NULL;
	if (s->tail)
		s->tail->next = q;
	else
		s->head = q;
	s->tail = q;
	s->submitted++;
	if (q->type == QOP_RUN) {
		q->order = s->e->queued++;
		trace_copy(s->e, "queued ", s, q);
	}
	if (q->type == QOP_MARK) {
		q->event->stream = s;
		q->event->seq = q->mark_seq = s->submitted;
	}
	retire_ready(s->e);
	pthread_cond_broadcast(&engines_cond);
	pthread_mutex_unlock(&engines_lock);
	return 0;
}

int host_stream_enqueue(struct host_stream *s, enum host_engine_kind kind, host_op_fn fn,
			const struct host_op *op)
{
	struct qop *q = calloc(1, sizeof *q);
	if (!q)
		return -1;
	q->type = QOP_RUN;
	q->kind = kind;
	q->fn = fn;
	q->op = *op;
	return stream_append(s, q);
}

int host_stream_record(struct host_stream *s, struct host_event *ev)
{
	struct qop *q = calloc(1, sizeof *q);
	if (!q)
		return -1;
	q->type = QOP_MARK;
	q->event = ev; /* its stream and seq are set under the lock, with the position */
	return stream_append(s, q);
}

int host_stream_wait_event(struct host_stream *s, struct host_event *ev)
{
	if (host_event_done(ev))
		return 0;
	struct qop *q = calloc(1, sizeof *q);
	if (!q)
		return -1;
	q->type = QOP_WAIT;
	q->wait_stream = ev->stream;
	q->wait_seq = ev->seq;
	return stream_append(s, q);
}
