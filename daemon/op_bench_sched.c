/*
 * bench_sched: the ceiling `gpuq bench sched` measures gpuqd's scheduler
 * against (workers/bench/sched_bench.c): a host-to-device copy, a device-to-host
 * copy and a bandwidth-bound kernel chain, each alone and all three at once,
 * with nothing of gpuq's in the way. A job that runs alone on its device.
 * Main thread only.
 */
#include <stdlib.h>

#include "daemon/daemon.h"
#include "workers/bench/sched_bench.h"

#define DEFAULT_BYTES (4ull << 30)
#define MIN_BYTES (1ull << 20)
#define MAX_BYTES (64ull << 30)
#define DEFAULT_REPS 3

static void render_part(struct mp_map *out, const char *name, double seconds, uint64_t bytes)
{
	struct mp_map m;
	mp_map_init(&m);
	mp_put_f64(&m, "seconds", seconds);
	mp_put_f64(&m, "gbps", seconds > 0 ? (double)bytes / seconds / 1e9 : 0);
	mp_put_map(out, name, &m);
}

static void render_bench_sched(const struct job *job, struct mp_map *out)
{
	const struct sched_bench *b = job->work.spec;
	double longest = 0, sum = 0;
	for (int p = 0; p < SCHED_BENCH_PARTS; p++) {
		longest = b->alone_s[p] > longest ? b->alone_s[p] : longest;
		sum += b->alone_s[p];
	}
	mp_put_i64(out, "device", job->work.device);
	mp_put_u64(out, "bytes", b->bytes);
	mp_put_u64(out, "reps", b->reps);
	render_part(out, "h2d", b->alone_s[SCHED_BENCH_H2D], b->bytes);
	render_part(out, "d2h", b->alone_s[SCHED_BENCH_D2H], b->bytes);
	render_part(out, "kernel", b->alone_s[SCHED_BENCH_KERNEL], 2 * b->bytes); /* read + write */
	mp_put_f64(out, "together_s", b->together_s);
	mp_put_f64(out, "serial_s", sum);
	mp_put_f64(out, "together_over_longest", longest > 0 ? b->together_s / longest : 0);
}

static void release_bench_sched(struct job *job)
{
	free(job->work.spec);
	job->work.spec = NULL;
}

static const struct job_kind kind_bench_sched = { "bench_sched", NULL, render_bench_sched };

static int read_bench_sched(struct request *req, struct sched_bench *b, int *device,
			    struct gpuq_error *err)
{
	uint64_t d = 0, bytes = DEFAULT_BYTES, reps = DEFAULT_REPS;
	if (msg_get_u64(req->map, "device", &d, err) < 0 ||
	    msg_get_u64(req->map, "bytes", &bytes, err) < 0 ||
	    msg_get_u64(req->map, "reps", &reps, err) < 0)
		return -1;
	if (d >= (uint64_t)req->d->pool.count)
		return gpuq_fail(err, GPUQ_E_NOT_FOUND, "device %llu does not exist (devices: 0-%d)",
				 (unsigned long long)d, req->d->pool.count - 1);
	if (bytes < MIN_BYTES || bytes > MAX_BYTES || bytes % 4096)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'bytes': %llu is not a multiple of 4096 from 1 MiB to 64 GiB",
				 (unsigned long long)bytes);
	if (reps < 1 || reps > SCHED_BENCH_MAX_REPS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'reps': %llu is not 1 to %d",
				 (unsigned long long)reps, SCHED_BENCH_MAX_REPS);
	b->bytes = bytes;
	b->reps = (unsigned)reps;
	*device = (int)d;
	return 0;
}

void op_bench_sched(struct request *req)
{
	struct gpuq_error err;
	int device = 0;
	struct sched_bench *b = calloc(1, sizeof *b);
	if (!b) {
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for a benchmark");
		reply_error(req, &err);
		return;
	}
	if (read_bench_sched(req, b, &device, &err) < 0) {
		free(b);
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, &kind_bench_sched, WORK_BENCH_SCHED, device);
	if (!job) {
		free(b);
		return;
	}
	job->work.spec = b;
	job->release = release_bench_sched;
	job_submit(req, job);
}
