/*
 * The requests gpuq bench sched makes, each checked: a refusal, a failed
 * job or a broken connection fails the running part with a message that
 * names the request, and the bench goes on with its next part (or stops,
 * when the connection is gone). One thread; b->c is the part's connection.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client/bench/bench_sched.h"

/* Requests in flight at once in a pipelined batch (replies are matched by id). */
#define PIPELINE_WINDOW 64
/* How long a wait request in a batch lets the daemon wait for its job. */
#define WAIT_JOB_MS 600000

double bench_job_quantile(const double *sorted, unsigned n, double q)
{
	return n ? sorted[(size_t)((double)(n - 1) * q + 0.5)] : 0;
}

/* The connection failed (not the request): nothing more can be asked on it. */
static int transport_failed(struct bench_sched *b, const char *what,
			    const struct gpuq_error *err)
{
	if (err->code != GPUQ_E_TIMEOUT)
		b->broken = true;
	return bench_sched_fail(b, "%s: %s", what, err->message);
}

static int refused(struct bench_sched *b, const char *what, const struct gpuq_reply *r)
{
	struct gpuq_error err;

	gpuq_reply_error(r, &err);
	return bench_sched_fail(b, "%s: %s: %s", what, gpuq_errc_name(err.code), err.message);
}

int bench_job_call(struct bench_sched *b, struct mp_map *req, const char *what,
		   struct gpuq_reply **out)
{
	struct gpuq_error err;

	*out = NULL;
	if (gpuq_call(b->c, req, NULL, 0, out, &err) < 0)
		return transport_failed(b, what, &err);
	if (!gpuq_reply_ok(*out)) {
		refused(b, what, *out);
		gpuq_reply_free(*out);
		*out = NULL;
		return -1;
	}
	return 0;
}

int bench_job_do(struct bench_sched *b, struct mp_map *req, const char *what)
{
	struct gpuq_reply *r;
	int rc = bench_job_call(b, req, what, &r);

	gpuq_reply_free(r);
	return rc;
}

uint64_t bench_job_begin(struct bench_sched *b, struct mp_map *req, const char *op, bool wait)
{
	uint64_t id = gpuq_request_begin(b->c, req, op);

	if (wait)
		mp_put_bool(req, "wait", true);
	return id;
}

const char *bench_job_name(const struct bench_sched *b, const char *suffix, char *out,
			   size_t size)
{
	snprintf(out, size, "%s.%s", b->tag, suffix);
	return out;
}

int bench_job_alloc(struct bench_sched *b, const char *name, uint64_t bytes, bool f32)
{
	char what[160];
	struct mp_map req;

	bench_job_begin(b, &req, "alloc", true);
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "device", b->device);
	if (f32) {
		mp_put_u64(&req, "count", bytes / sizeof(float));
		mp_put_str(&req, "dtype", "f32");
	} else {
		mp_put_u64(&req, "bytes", bytes);
	}
	snprintf(what, sizeof what, "alloc %s (%" PRIu64 " bytes on gpu %" PRIu64 ")", name,
		 bytes, b->device);
	return bench_job_do(b, &req, what);
}

int bench_job_fill_random(struct bench_sched *b, const char *name, uint64_t seed)
{
	char what[128];
	struct mp_map req;

	bench_job_begin(b, &req, "fill", true);
	mp_put_str(&req, "buffer", name);
	mp_put_str(&req, "pattern", "random");
	mp_put_u64(&req, "seed", seed);
	snprintf(what, sizeof what, "fill %s random", name);
	return bench_job_do(b, &req, what);
}

void bench_job_free_as(struct bench_sched *b, const char *name, int64_t owner)
{
	struct gpuq_error err;
	struct gpuq_reply *r;
	struct mp_map req;
	char ref[96];

	if (b->broken || !name[0])
		return;
	bench_job_begin(b, &req, "free", true);
	snprintf(ref, sizeof ref, "%s@%" PRIu64, name, b->device);
	mp_put_str(&req, "buffer", ref);
	if (owner >= 0)
		mp_put_u64(&req, "owner", (uint64_t)owner);
	if (gpuq_call(b->c, &req, NULL, 0, &r, &err) == 0)
		gpuq_reply_free(r);
}

void bench_job_free(struct bench_sched *b, const char *name)
{
	bench_job_free_as(b, name, -1);
}

void bench_job_put_scratch(struct mp_map *req, const char *buffer, uint64_t offset,
			   uint64_t length)
{
	mp_put_str(req, "buffer", buffer);
	mp_put_bool(req, "scratch", true);
	mp_put_u64(req, "offset", offset);
	mp_put_u64(req, "length", length);
}

const msgpack_object *bench_job_record(const struct gpuq_reply *r)
{
	const msgpack_object *rec = r ? gpuq_reply_get(r, "job") : NULL;

	return rec && rec->type == MSGPACK_OBJECT_MAP ? rec : NULL;
}

double bench_job_sub_f64(const msgpack_object *map, const char *sub, const char *key)
{
	const msgpack_object *m = map ? msg_map_get(map, sub) : NULL;

	return m && m->type == MSGPACK_OBJECT_MAP ? field_f64(m, key, 0) : 0;
}

int bench_job_state(struct bench_sched *b, uint64_t id, char *state, size_t size)
{
	char what[64];
	struct gpuq_reply *r;
	struct mp_map req;

	gpuq_request_begin(b->c, &req, "status");
	mp_put_u64(&req, "job", id);
	snprintf(what, sizeof what, "status of job %" PRIu64, id);
	if (bench_job_call(b, &req, what, &r) < 0)
		return -1;
	field_str(bench_job_record(r), "state", state, size, "?");
	gpuq_reply_free(r);
	return 0;
}

int bench_job_pipeline(struct bench_sched *b, unsigned n, bench_job_build_fn build,
		       bench_job_reply_fn reply, void *arg)
{
	uint64_t ids[PIPELINE_WINDOW];
	unsigned sent = 0, done = 0;
	struct gpuq_error err;
	int rc = 0;

	while (done < sent || (rc == 0 && sent < n)) {
		if (rc == 0 && sent < n && sent - done < PIPELINE_WINDOW) {
			struct mp_map req;

			ids[sent % PIPELINE_WINDOW] = build(b, &req, sent, arg);
			if (gpuq_send(b->c, &req, NULL, 0, &err) < 0)
				return transport_failed(b, "sending a batch of requests", &err);
			sent++;
			continue;
		}
		struct gpuq_reply *r;

		if (gpuq_recv(b->c, ids[done % PIPELINE_WINDOW], &r, &err) < 0)
			return transport_failed(b, "reading a batch's replies", &err);
		if (rc == 0 && reply(b, r, done, arg) < 0)
			rc = -1;
		gpuq_reply_free(r);
		done++;
	}
	return rc;
}

/* ---- batches of detached jobs: submit, wait, cancel ---- */

struct submit_batch {
	bench_job_build_fn build;
	void *arg;
	uint64_t *ids;
};

static uint64_t submit_build(struct bench_sched *b, struct mp_map *req, unsigned i, void *arg)
{
	struct submit_batch *s = arg;

	return s->build(b, req, i, s->arg);
}

static int submit_reply(struct bench_sched *b, const struct gpuq_reply *r, unsigned i, void *arg)
{
	struct submit_batch *s = arg;

	if (!gpuq_reply_ok(r))
		return refused(b, "submitting a batch of jobs", r);
	s->ids[i] = field_u64(bench_job_record(r), "job", 0);
	return 0;
}

int bench_job_submit_all(struct bench_sched *b, unsigned n, bench_job_build_fn build,
			 uint64_t *ids, void *arg)
{
	struct submit_batch s = { build, arg, ids };

	memset(ids, 0, n * sizeof ids[0]);
	return bench_job_pipeline(b, n, submit_build, submit_reply, &s);
}

/* A request per job of ids: wait, status or cancel, and what to make of each reply. */
struct job_batch {
	const char *op;
	const uint64_t *ids;
	bool cancelled_ok; /* wait: a job that ended cancelled is what was asked for */
	bench_job_reply_fn on_record; /* status: what to do with each record */
	void *arg;
};

static uint64_t batch_build(struct bench_sched *b, struct mp_map *req, unsigned i, void *arg)
{
	const struct job_batch *j = arg;
	uint64_t id = gpuq_request_begin(b->c, req, j->op);

	mp_put_u64(req, "job", j->ids[i]);
	if (strcmp(j->op, "wait") == 0)
		mp_put_u64(req, "timeout_ms", WAIT_JOB_MS);
	return id;
}

static int batch_reply(struct bench_sched *b, const struct gpuq_reply *r, unsigned i, void *arg)
{
	const struct job_batch *j = arg;
	struct gpuq_error err;
	char what[64];

	gpuq_reply_error(r, &err);
	if (gpuq_reply_ok(r))
		return j->on_record ? j->on_record(b, r, i, j->arg) : 0;
	if (j->cancelled_ok && err.code == GPUQ_E_CANCELLED)
		return 0;
	snprintf(what, sizeof what, "%s job %" PRIu64, j->op, j->ids[i]);
	return refused(b, what, r);
}

int bench_job_wait_all(struct bench_sched *b, const uint64_t *ids, unsigned n)
{
	struct job_batch j = { "wait", ids, false, NULL, NULL };

	return bench_job_pipeline(b, n, batch_build, batch_reply, &j);
}

int bench_job_records(struct bench_sched *b, const uint64_t *ids, unsigned n,
		      bench_job_reply_fn on_record, void *arg)
{
	struct job_batch j = { "status", ids, false, on_record, arg };

	return bench_job_pipeline(b, n, batch_build, batch_reply, &j);
}

int bench_job_cancel_all(struct bench_sched *b, const uint64_t *ids, unsigned n)
{
	struct job_batch cancel = { "cancel", ids, false, NULL, NULL };
	struct job_batch wait = { "wait", ids, true, NULL, NULL };
	unsigned have = 0;

	while (have < n && ids[have]) /* a batch cut short leaves zeros after its last job */
		have++;
	if (bench_job_pipeline(b, have, batch_build, batch_reply, &cancel) < 0)
		return -1;
	return bench_job_pipeline(b, have, batch_build, batch_reply, &wait);
}

int bench_job_device(struct bench_sched *b, struct gpuq_reply **out, const msgpack_object **dev)
{
	struct mp_map req;
	const msgpack_object *list;

	*dev = NULL;
	gpuq_request_begin(b->c, &req, "devices");
	if (bench_job_call(b, &req, "devices", out) < 0)
		return -1;
	list = gpuq_reply_get(*out, "devices");
	for (uint32_t i = 0; list && list->type == MSGPACK_OBJECT_ARRAY && i < list->via.array.size;
	     i++) {
		const msgpack_object *d = &list->via.array.ptr[i];

		if (d->type == MSGPACK_OBJECT_MAP && field_u64(d, "index", UINT64_MAX) == b->device)
			*dev = d;
	}
	return 0;
}
