/*
 * bench_d2d: the device-to-device and peer copy benchmark as a job
 * (workers/bench/bench_d2d.c), on one device, or as a gang over every device when
 * there are peer pairs to measure. The request is checked here and each
 * pair's route decided as copy decides it; the job owns the spec, whose rows
 * the result renders until the job leaves the history. Main thread only.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "workers/bench/bench_d2d.h"

#define DEFAULT_REPEATS 5

static void render_bench_d2d(const struct job *job, struct mp_map *out)
{
	const struct bench_d2d *b = job->work.spec;
	struct mp_array notes;
	mp_put_i64(out, "device", b->device);
	mp_put_u64(out, "repeats", b->repeats);
	bench_rows_render(b->rows, b->nrows, out);
	mp_array_init(&notes);
	for (unsigned i = 0; i < b->nnotes; i++)
		mp_array_str(&notes, b->notes[i]);
	mp_put_array(out, "notes", &notes);
}

static void release_bench_d2d(struct job *job)
{
	struct bench_d2d *b = job->work.spec;
	if (b) {
		bench_d2d_destroy(b);
		free(b);
	}
	job->work.spec = NULL;
}

static const struct job_kind kind_bench_d2d = { "bench_d2d", NULL, render_bench_d2d };

static void add_note(struct bench_d2d *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add_note(struct bench_d2d *b, const char *fmt, ...)
{
	va_list ap;
	if (b->nnotes >= BENCH_D2D_MAX_NOTES)
		return;
	va_start(ap, fmt);
	vsnprintf(b->notes[b->nnotes++], sizeof b->notes[0], fmt, ap);
	va_end(ap);
}

static int read_bench(struct request *req, struct bench_d2d *b, bool *peers,
		      struct gpuq_error *err)
{
	uint64_t d = 0, repeats = DEFAULT_REPEATS, timeout = COPY_TIMEOUT_MS;
	b->seed = (uint64_t)(monotonic_seconds() * 1e9); /* fresh data each run unless given */
	*peers = true;
	if (msg_get_u64(req->map, "device", &d, err) < 0 ||
	    msg_get_u64(req->map, "repeats", &repeats, err) < 0 ||
	    msg_get_u64(req->map, "seed", &b->seed, err) < 0 ||
	    msg_get_u64(req->map, "peer_timeout_ms", &timeout, err) < 0 ||
	    msg_get_bool(req->map, "peers", peers, err) < 0 ||
	    read_bench_sizes(req, b->sizes, BENCH_D2D_MAX_SIZES, &b->nsizes, err) < 0)
		return -1;
	if (d >= (uint64_t)req->d->pool.count)
		return gpuq_fail(err, GPUQ_E_NOT_FOUND, "device %llu does not exist (devices: 0-%d)",
				 (unsigned long long)d, req->d->pool.count - 1);
	if (repeats < 1 || repeats > BENCH_D2D_MAX_REPEATS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'repeats': %llu is not 1 to %d",
				 (unsigned long long)repeats, BENCH_D2D_MAX_REPEATS);
	if (timeout < 1 || timeout > 3600000)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'peer_timeout_ms': %llu is not 1 to 3600000",
				 (unsigned long long)timeout);
	b->device = (int)d;
	b->repeats = (unsigned)repeats;
	b->timeout_ms = (unsigned)timeout;
	b->host = strcmp(req->d->ops->name, "host") == 0;
	return 0;
}

/* Every pair i -> j with i < j, routed as copy routes it; notes say what differs. */
static void plan_pairs(struct daemon *d, struct bench_d2d *b)
{
	for (int i = 0; i < d->pool.count; i++) {
		struct worker_snapshot s;
		worker_snapshot(&d->pool, i, &s);
		if (s.peer_note[0])
			add_note(b, "gpu %d: %s", i, s.peer_note);
	}
	for (int i = 0; i < d->pool.count; i++) {
		for (int j = i + 1; j < d->pool.count; j++) {
			if (b->npairs == BENCH_D2D_MAX_PAIRS) {
				add_note(b, "only the first %d pairs are measured", BENCH_D2D_MAX_PAIRS);
				return;
			}
			struct bench_d2d_pair *p = &b->pairs[b->npairs++];
			p->src = i;
			p->dst = j;
			p->path = copy_peer_path(d, i, j, &p->direct);
			if (!p->direct)
				add_note(b, "peer %d->%d: no peer access, so gpuq copies it host-staged; "
					    "its ceiling, cudaMemcpyPeer, is then staged by the driver",
					 i, j);
		}
	}
}

/* The gang over every device (part i on device i), sharing b. */
static int make_bench_gang(struct job *job, struct bench_d2d *b, int count)
{
	struct work *parts[GPUQ_MAX_DEVICES];
	if (job_make_gang(job, count) < 0)
		return -1;
	for (int i = 0; i < count; i++) {
		job->parts[i].device = i;
		job->parts[i].spec = b;
		parts[i] = &job->parts[i];
	}
	unsigned npairs = b->npairs;
	b->npairs = 0; /* release_bench_d2d destroys no lock that was not made */
	if (bench_d2d_init_gang(b, parts, count) != 0)
		return -1;
	b->npairs = npairs;
	return 0;
}

void op_bench_d2d(struct request *req)
{
	struct gpuq_error err;
	bool peers;
	int count = req->d->pool.count;
	struct bench_d2d *b = calloc(1, sizeof *b);
	if (!b) {
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for a benchmark");
		reply_error(req, &err);
		return;
	}
	if (read_bench(req, b, &peers, &err) < 0) {
		free(b);
		reply_error(req, &err);
		return;
	}
	if (b->host)
		add_note(b, "host backend: every method is a memcpy in host memory, timed with "
			    "the host clock; no GPU was measured");
	if (count < 2)
		add_note(b, "one device: no peer rows (a peer pair needs two)");
	else if (!peers)
		add_note(b, "peer rows not asked for (peers: false)");
	else
		plan_pairs(req->d, b);
	struct job *job = new_job(req, &kind_bench_d2d, WORK_BENCH_D2D, b->device);
	if (!job) {
		free(b);
		return;
	}
	job->work.spec = b;
	job->release = release_bench_d2d;
	if (b->npairs > 0 && make_bench_gang(job, b, count) < 0) {
		job_discard(&req->d->jobs, job);
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for a %d-device job",
			  count);
		reply_error(req, &err);
		return;
	}
	job_submit(req, job);
}
