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

struct bench_sched_args {
	int device;
	uint64_t bytes, reps;
};

static int check_bytes(struct request *req, void *args, struct gpuq_error *err)
{
	const struct bench_sched_args *a = args;
	(void)req;
	if (a->bytes < MIN_BYTES || a->bytes > MAX_BYTES || a->bytes % 4096)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'bytes': %llu is not a multiple of 4096 from 1 MiB to 64 GiB",
				 (unsigned long long)a->bytes);
	return 0;
}

static int check_reps(struct request *req, void *args, struct gpuq_error *err)
{
	const struct bench_sched_args *a = args;
	(void)req;
	if (a->reps < 1 || a->reps > SCHED_BENCH_MAX_REPS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'reps': %llu is not 1 to %d",
				 (unsigned long long)a->reps, SCHED_BENCH_MAX_REPS);
	return 0;
}

static const struct args_field bench_sched_fields[] = {
	{ "device", ARGS_DEVICE, 0, ARGS_AT(struct bench_sched_args, device) },
	{ "bytes", ARGS_U64, 0, ARGS_AT(struct bench_sched_args, bytes), .then = check_bytes },
	{ "reps", ARGS_U64, 0, ARGS_AT(struct bench_sched_args, reps), .then = check_reps },
};
static const struct bench_sched_args bench_sched_defaults = {
	.bytes = DEFAULT_BYTES, .reps = DEFAULT_REPS
};
const struct args_spec op_bench_sched_args =
	ARGS_SPEC(struct bench_sched_args, bench_sched_fields, &bench_sched_defaults);

static int fill_bench_sched(struct request *req, const void *args, void *spec, int *device,
			    struct gpuq_error *err)
{
	const struct bench_sched_args *a = args;
	struct sched_bench *b = spec;
	(void)req;
	(void)err;
	b->bytes = a->bytes;
	b->reps = (unsigned)a->reps;
	*device = a->device;
	return 0;
}

static const struct spec_job bench_sched_job = {
	.kind = &kind_bench_sched,
	.work_kind = WORK_BENCH_SCHED,
	.spec_size = sizeof(struct sched_bench),
	.what = "a benchmark",
	.fill = fill_bench_sched,
	.release = release_bench_sched,
};

void op_bench_sched(struct request *req, void *args)
{
	spec_job_submit(req, &bench_sched_job, args);
}
