/*
 * bench allreduce: gpuqd's all-reduce against a raw NCCL loop on a
 * communicator of the same devices, measured in one run and printed as
 * nccl-tests does (time, algbw, busbw = algbw x 2(n-1)/n).
 *
 * Setup: an input and an output buffer of the largest size on every device,
 * the inputs filled with `fill random` (seed SEED + rank), so that the
 * expected result of every element can be computed here from the seeds.
 *
 * Per size:
 *   1. bench_allreduce, one gang job: each rank's worker times REPEATS
 *      batches of `iters` back-to-back ncclAllReduce calls with CUDA events
 *      (the host backend: its own collective, on the host clock) on the
 *      communicator of these devices; the median batch is the baseline.
 *      Its output is checked.
 *   2. The output is poisoned, then the same all-reduce runs as allreduce
 *      jobs sent from here: WARMUP unmeasured, RTT_JOBS one at a time (the
 *      round trip a caller that waits for each sees: the median), then
 *      iters x REPEATS with WINDOW in flight, timed on this clock (the
 *      daemon's throughput path). Its output is checked.
 * Checking reads every rank's output back (get into a memfd) and compares
 * each element with the reference (workers/collective_math.h).
 *
 * One thread and one connection; the pipelined round sends WINDOW requests
 * before reading the first reply, and libgpuq keeps replies by id.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client/cli.h"
#include "workers/collective_math.h"

#define MAX_RANKS 64
#define MAX_SIZES 64
#define SEED 0x5EEDull
#define POISON_SEED 0xBADull
#define REPEATS 5
#define WARMUP 3
#define RTT_JOBS 20
#define WINDOW 8
#define DEFAULT_MIN 8ull
#define DEFAULT_MAX (64ull << 20)

static const char *const op_names[] = { "sum", "prod", "min", "max", "avg" };

struct bench_ar {
	struct cli *cli;
	int devices[MAX_RANKS], n;
	enum gpuq_dtype dtype;
	size_t elt;
	const char *op_name;
	enum coll_op op;
	char in[64], out[64];
	bool allocated_in[MAX_RANKS], allocated_out[MAX_RANKS];
	uint64_t max_count;
	char backend[16];
};

struct bench_row {
	uint64_t count;
	unsigned iters;
	double raw_us, gpuqd_us, rtt_us;
	uint64_t wrong_raw, wrong_gpuqd;
};

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Sends req and returns the reply if ok; NULL (after printing why) otherwise. */
static struct gpuq_reply *call_ok(struct bench_ar *b, struct mp_map *req, const int *fds,
				  int nfds, int *rc)
{
	struct gpuq_reply *r;

	if ((*rc = cli_call(b->cli, req, fds, nfds, &r)) != 0)
		return NULL;
	if (!gpuq_reply_ok(r)) {
		*rc = cli_report_refusal(r);
		gpuq_reply_free(r);
		return NULL;
	}
	return r;
}

/* A job request with wait: true. */
static int begin(struct bench_ar *b, struct mp_map *req, const char *op)
{
	int rc = cli_begin(b->cli, req, op);

	if (rc == 0)
		mp_put_bool(req, "wait", true);
	return rc;
}

static int simple_job(struct bench_ar *b, struct mp_map *req)
{
	int rc;
	struct gpuq_reply *r = call_ok(b, req, NULL, 0, &rc);

	gpuq_reply_free(r);
	return r ? 0 : rc;
}

static int alloc_one(struct bench_ar *b, const char *name, int device)
{
	struct mp_map req;
	int rc = begin(b, &req, "alloc");

	if (rc)
		return rc;
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "device", (uint64_t)device);
	mp_put_u64(&req, "count", b->max_count);
	mp_put_str(&req, "dtype", gpuq_dtype_name(b->dtype));
	return simple_job(b, &req);
}

static int fill_random(struct bench_ar *b, const char *name, int device, uint64_t seed)
{
	char ref[96];
	struct mp_map req;
	int rc = begin(b, &req, "fill");

	if (rc)
		return rc;
	snprintf(ref, sizeof(ref), "%s@%d", name, device);
	mp_put_str(&req, "buffer", ref);
	mp_put_str(&req, "pattern", "random");
	mp_put_u64(&req, "seed", seed);
	return simple_job(b, &req);
}

static void free_buffers(struct bench_ar *b)
{
	char ref[96];
	struct mp_map req;

	for (int r = 0; r < b->n; r++) {
		for (int k = 0; k < 2; k++) {
			bool *have = k ? &b->allocated_out[r] : &b->allocated_in[r];

			if (!*have || begin(b, &req, "free") != 0)
				continue;
			snprintf(ref, sizeof(ref), "%s@%d", k ? b->out : b->in, b->devices[r]);
			mp_put_str(&req, "buffer", ref);
			simple_job(b, &req);
			*have = false;
		}
	}
}

static int setup(struct bench_ar *b)
{
	int rc;

	snprintf(b->in, sizeof(b->in), "bench-allreduce-in.%d", (int)getpid());
	snprintf(b->out, sizeof(b->out), "bench-allreduce-out.%d", (int)getpid());
	for (int r = 0; r < b->n; r++) {
		if ((rc = alloc_one(b, b->in, b->devices[r])) != 0)
			return rc;
		b->allocated_in[r] = true;
		if ((rc = alloc_one(b, b->out, b->devices[r])) != 0)
			return rc;
		b->allocated_out[r] = true;
		if ((rc = fill_random(b, b->in, b->devices[r], SEED + (uint64_t)r)) != 0)
			return rc;
	}
	return 0;
}

/* The fields every allreduce and bench_allreduce request of this run has. */
static void put_collective(struct bench_ar *b, struct mp_map *req, uint64_t count)
{
	struct mp_array devs;

	mp_put_str(req, "buffer", b->in);
	mp_put_str(req, "out", b->out);
	mp_array_init(&devs);
	for (int r = 0; r < b->n; r++)
		mp_array_u64(&devs, (uint64_t)b->devices[r]);
	mp_put_array(req, "devices", &devs);
	mp_put_str(req, "reduce", b->op_name);
	mp_put_u64(req, "count", count);
}

/* Elements of one rank's output (mapped) that are not the reference. */
static uint64_t count_wrong(const struct bench_ar *b, const unsigned char *p, uint64_t count)
{
	uint64_t in[MAX_RANKS], wrong = 0;

	for (uint64_t i = 0; i < count; i++) {
		uint64_t out = 0;

		for (int r = 0; r < b->n; r++)
			in[r] = coll_random_element(b->dtype, SEED + (uint64_t)r, i);
		memcpy(&out, p + i * b->elt, b->elt); /* little-endian, as on the device */
		wrong += !coll_check_element(b->dtype, b->op, b->n, in, out);
	}
	return wrong;
}

/* Reads every rank's first count outputs back and counts the wrong ones. */
static int verify(struct bench_ar *b, uint64_t count, uint64_t *wrong)
{
	size_t bytes = (size_t)(count * b->elt);
	char ref[96];
	int rc = 0;

	*wrong = 0;
	for (int r = 0; r < b->n && rc == 0; r++) {
		struct mp_map req;
		struct gpuq_reply *reply;
		int fd = memfd_create("gpuq-bench-allreduce", MFD_CLOEXEC);

		if (fd < 0) {
			perror("gpuq bench allreduce: memfd_create");
			return CLI_REFUSED;
		}
		if ((rc = begin(b, &req, "get")) == 0) {
			snprintf(ref, sizeof(ref), "%s@%d", b->out, b->devices[r]);
			mp_put_str(&req, "buffer", ref);
			mp_put_u64(&req, "fds", 1);
			mp_put_u64(&req, "length", bytes);
			reply = call_ok(b, &req, &fd, 1, &rc);
			gpuq_reply_free(reply);
		}
		void *p = rc ? MAP_FAILED : mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);

		if (rc == 0 && p == MAP_FAILED) {
			perror("gpuq bench allreduce: mmap");
			rc = CLI_REFUSED;
		}
		if (rc == 0) {
			*wrong += count_wrong(b, p, count);
			munmap(p, bytes);
		}
		close(fd);
	}
	return rc;
}

/* The baseline: the daemon's raw loop on the same communicator. */
static int run_raw(struct bench_ar *b, struct bench_row *row)
{
	struct mp_map req;
	struct gpuq_reply *r;
	int rc = begin(b, &req, "bench_allreduce");

	if (rc)
		return rc;
	put_collective(b, &req, row->count);
	mp_put_u64(&req, "warmup", 5);
	mp_put_u64(&req, "iters", row->iters);
	mp_put_u64(&req, "repeats", REPEATS);
	if (!(r = call_ok(b, &req, NULL, 0, &rc)))
		return rc;
	const msgpack_object *rec = gpuq_reply_get(r, "job");
	const msgpack_object *res = rec ? msg_map_get(rec, "result") : NULL;

	row->raw_us = res ? field_f64(res, "us", 0) : 0;
	gpuq_reply_free(r);
	return verify(b, row->count, &row->wrong_raw);
}

static int send_allreduce(struct bench_ar *b, uint64_t count, uint64_t *id)
{
	struct gpuq_error err;
	struct mp_map req;

	*id = gpuq_request_begin(b->cli->client, &req, "allreduce");
	mp_put_bool(&req, "wait", true);
	put_collective(b, &req, count);
	if (gpuq_send(b->cli->client, &req, NULL, 0, &err) < 0) {
		cli_print_error(&err);
		return CLI_UNREACHABLE;
	}
	return 0;
}

static int recv_allreduce(struct bench_ar *b, uint64_t id)
{
	struct gpuq_error err;
	struct gpuq_reply *r;
	int rc = 0;

	if (gpuq_recv(b->cli->client, id, &r, &err) < 0) {
		cli_print_error(&err);
		return CLI_UNREACHABLE;
	}
	if (!gpuq_reply_ok(r))
		rc = cli_report_refusal(r);
	gpuq_reply_free(r);
	return rc;
}

static int one_allreduce(struct bench_ar *b, uint64_t count)
{
	uint64_t id;
	int rc = send_allreduce(b, count, &id);

	return rc ? rc : recv_allreduce(b, id);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Round trips one at a time: the median. */
static int run_rtt(struct bench_ar *b, struct bench_row *row)
{
	double t[RTT_JOBS];
	int rc = 0;

	for (int i = 0; i < WARMUP && rc == 0; i++)
		rc = one_allreduce(b, row->count);
	for (int i = 0; i < RTT_JOBS && rc == 0; i++) {
		double t0 = now_s();

		rc = one_allreduce(b, row->count);
		t[i] = (now_s() - t0) * 1e6;
	}
	if (rc == 0) {
		qsort(t, RTT_JOBS, sizeof(t[0]), cmp_double);
		row->rtt_us = (t[RTT_JOBS / 2 - 1] + t[RTT_JOBS / 2]) / 2;
	}
	return rc;
}

/* jobs all-reduces with WINDOW in flight: the time per all-reduce. */
static int run_pipelined(struct bench_ar *b, struct bench_row *row)
{
	uint64_t ids[WINDOW];
	unsigned jobs = row->iters * REPEATS, sent = 0, done = 0;
	double t0 = now_s();
	int rc = 0;

	while (rc == 0 && sent < jobs && sent < WINDOW)
		rc = send_allreduce(b, row->count, &ids[sent++ % WINDOW]);
	while (rc == 0 && done < jobs) {
		rc = recv_allreduce(b, ids[done++ % WINDOW]);
		if (rc == 0 && sent < jobs)
			rc = send_allreduce(b, row->count, &ids[sent++ % WINDOW]);
	}
	row->gpuqd_us = (now_s() - t0) * 1e6 / jobs;
	return rc;
}

static int run_daemon_path(struct bench_ar *b, struct bench_row *row)
{
	struct mp_map req;
	char ref[96];
	int rc;

	for (int r = 0; r < b->n; r++) {
		if ((rc = begin(b, &req, "fill")) != 0)
			return rc;
		snprintf(ref, sizeof(ref), "%s@%d", b->out, b->devices[r]);
		mp_put_str(&req, "buffer", ref);
		mp_put_str(&req, "pattern", "random");
		mp_put_u64(&req, "seed", POISON_SEED);
		if ((rc = simple_job(b, &req)) != 0)
			return rc;
	}
	if ((rc = run_rtt(b, row)) != 0 || (rc = run_pipelined(b, row)) != 0)
		return rc;
	return verify(b, row->count, &row->wrong_gpuqd);
}

/* Batches get shorter as sizes grow: about 128 MiB a batch, 5 to 100 calls (or --requests / 5). */
static unsigned iters_for(const struct cli *cli, uint64_t bytes)
{
	uint64_t it = (128ull << 20) / (bytes ? bytes : 1);

	if (cli->has_requests)
		it = cli->requests / REPEATS;
	else if (it < 5)
		it = 5;
	if (it < 1)
		it = 1;
	return it > (cli->has_requests ? 100000 : 100) ? (cli->has_requests ? 100000 : 100)
							: (unsigned)it;
}

static double busbw(const struct bench_ar *b, uint64_t count, double us)
{
	double algbw = us > 0 ? (double)(count * b->elt) / us / 1e3 : 0;

	return algbw * 2.0 * (b->n - 1) / b->n;
}

static void print_json(const struct bench_ar *b, const struct bench_row *rows, int nrows)
{
	printf("{\"bench\":\"allreduce\",\"backend\":\"%s\",\"ranks\":%d,\"dtype\":\"%s\","
	       "\"op\":\"%s\",\"repeats\":%d,\"window\":%d,\"results\":[",
	       b->backend, b->n, gpuq_dtype_name(b->dtype), b->op_name, REPEATS, WINDOW);
	for (int i = 0; i < nrows; i++) {
		const struct bench_row *w = &rows[i];
		double bytes = (double)(w->count * b->elt);

		printf("%s{\"bytes\":%.0f,\"count\":%" PRIu64 ",\"iters\":%u,"
		       "\"raw_us\":%.3f,\"raw_algbw_gbps\":%.3f,\"raw_busbw_gbps\":%.3f,"
		       "\"gpuqd_us\":%.3f,\"gpuqd_algbw_gbps\":%.3f,\"gpuqd_busbw_gbps\":%.3f,"
		       "\"rtt_us\":%.3f,\"wrong_raw\":%" PRIu64 ",\"wrong_gpuqd\":%" PRIu64
		       ",\"ratio\":%.4f,\"added_us\":%.3f}",
		       i ? "," : "", bytes, w->count, w->iters, w->raw_us,
		       w->raw_us > 0 ? bytes / w->raw_us / 1e3 : 0, busbw(b, w->count, w->raw_us),
		       w->gpuqd_us, w->gpuqd_us > 0 ? bytes / w->gpuqd_us / 1e3 : 0,
		       busbw(b, w->count, w->gpuqd_us), w->rtt_us, w->wrong_raw, w->wrong_gpuqd,
		       w->gpuqd_us > 0 ? w->raw_us / w->gpuqd_us : 0, w->gpuqd_us - w->raw_us);
	}
	printf("]}\n");
}

static void print_table(const struct bench_ar *b, const struct bench_row *rows, int nrows)
{
	static const struct table_col cols[] = {
		{ "SIZE", true },        { "COUNT", true },       { "TYPE", false },
		{ "OP", false },         { "RAW µs", true },      { "ALGBW", true },
		{ "BUSBW", true },       { "GPUQD µs", true },    { "ALGBW", true },
		{ "BUSBW", true },       { "RTT µs", true },      { "WRONG", true },
		{ "RATIO", true },       { "ADDED µs", true },
	};
	bool cuda = strcmp(b->backend, "cuda") == 0;
	char size[32];
	struct table t;

	printf("bench allreduce: %d rank%s on the %s backend (devices", b->n, b->n == 1 ? "" : "s",
	       b->backend);
	for (int r = 0; r < b->n; r++)
		printf("%s%d", r ? "," : " ", b->devices[r]);
	printf("), %s %s, out of place, every element checked\n", gpuq_dtype_name(b->dtype),
	       b->op_name);
	printf("RAW: %s, median of %d batches; GPUQD: allreduce jobs from this client, %d in "
	       "flight; RTT: one job waited at a time (median)\n",
	       cuda ? "a raw ncclAllReduce loop on a communicator of the same devices, CUDA events"
		    : "the host backend's collective in a loop, host clock",
	       REPEATS, WINDOW);
	printf("GB/s; WRONG: raw/gpuqd elements off the reference; RATIO: gpuqd busbw / raw "
	       "busbw (= raw time / gpuqd time); ADDED: gpuqd - raw, µs per all-reduce\n");
	if (b->n == 1)
		printf("one rank: busbw = algbw x 2(n-1)/n is 0 (no byte crosses a link), so the "
		       "ratio compares times; the busbw targets need a multi-GPU machine\n");
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	for (int i = 0; i < nrows; i++) {
		const struct bench_row *w = &rows[i];
		double bytes = (double)(w->count * b->elt);

		table_cell(&t, "%s", human_bytes(size, sizeof(size), w->count * b->elt, 0));
		table_cell(&t, "%" PRIu64, w->count);
		table_cell(&t, "%s", gpuq_dtype_name(b->dtype));
		table_cell(&t, "%s", b->op_name);
		table_cell(&t, "%.2f", w->raw_us);
		table_cell(&t, "%.2f", w->raw_us > 0 ? bytes / w->raw_us / 1e3 : 0);
		table_cell(&t, "%.2f", busbw(b, w->count, w->raw_us));
		table_cell(&t, "%.2f", w->gpuqd_us);
		table_cell(&t, "%.2f", w->gpuqd_us > 0 ? bytes / w->gpuqd_us / 1e3 : 0);
		table_cell(&t, "%.2f", busbw(b, w->count, w->gpuqd_us));
		table_cell(&t, "%.2f", w->rtt_us);
		table_cell(&t, "%" PRIu64 "/%" PRIu64, w->wrong_raw, w->wrong_gpuqd);
		table_cell(&t, "%.3f", w->gpuqd_us > 0 ? w->raw_us / w->gpuqd_us : 0);
		table_cell(&t, "%+.2f", w->gpuqd_us - w->raw_us);
	}
	table_print(&t, stdout);
	table_free(&t);
}

/* --bytes MIN:MAX (or one SIZE) and --factor into sizes; the count or -(exit code). */
static int parse_sizes(struct bench_ar *b, uint64_t *sizes)
{
	struct cli *cli = b->cli;
	uint64_t lo = DEFAULT_MIN, hi = DEFAULT_MAX, factor = cli->has_factor ? cli->factor : 2;
	int n = 0;

	if (cli->bytes_range) {
		char copy[64], *colon;

		snprintf(copy, sizeof(copy), "%s", cli->bytes_range);
		colon = strchr(copy, ':');
		*colon = '\0';
		if (gpuq_parse_size(copy, &lo) < 0 || gpuq_parse_size(colon + 1, &hi) < 0 ||
		    lo == 0 || hi < lo)
			return -cli_usage(cli, "--bytes '%s' is not MIN:MAX with 0 < MIN <= MAX "
					       "(8:1G, 4K:64M)", cli->bytes_range);
	} else if (cli->has_bytes) {
		lo = hi = cli->bytes;
	}
	if (factor < 2)
		return -cli_usage(cli, "--factor %" PRIu64 " must be 2 or more", factor);
	for (uint64_t s = lo; s <= hi && n < MAX_SIZES; s *= factor) {
		sizes[n++] = s;
		if (s > UINT64_MAX / factor)
			break;
	}
	return n;
}

static int parse_kind(struct bench_ar *b)
{
	struct cli *cli = b->cli;
	const char *dtype = cli->dtype ? cli->dtype : "f32";

	int op = 0, nops = (int)(sizeof(op_names) / sizeof(op_names[0]));

	b->op_name = cli->redop ? cli->redop : "sum";
	while (op < nops && strcmp(op_names[op], b->op_name) != 0)
		op++;
	if (op == nops)
		return cli_usage(cli, "--op '%s' is not one of " COLL_OP_LIST, b->op_name);
	b->op = (enum coll_op)op;
	if (gpuq_dtype_from_name(dtype, strlen(dtype), &b->dtype) < 0 ||
	    b->dtype == GPUQ_DTYPE_BYTES)
		return cli_usage(cli, "--dtype '%s' is not one of u8, i32, i64, f16, bf16, f32, f64",
				 dtype);
	b->elt = gpuq_dtype_size(b->dtype);
	return 0;
}

static int ping_backend(struct bench_ar *b)
{
	struct mp_map req;
	int rc = cli_begin(b->cli, &req, "ping");
	struct gpuq_reply *r = rc ? NULL : call_ok(b, &req, NULL, 0, &rc);

	if (r)
		field_str(r->root, "backend", b->backend, sizeof(b->backend), "?");
	gpuq_reply_free(r);
	return rc;
}

static int run_sizes(struct bench_ar *b, const uint64_t *sizes, int nsizes,
		     struct bench_row *rows)
{
	int rc = 0;

	for (int i = 0; i < nsizes && rc == 0; i++) {
		struct bench_row *w = &rows[i];

		w->count = sizes[i] / b->elt ? sizes[i] / b->elt : 1;
		w->iters = iters_for(b->cli, w->count * b->elt);
		rc = run_raw(b, w);
		if (rc == 0)
			rc = run_daemon_path(b, w);
		if (rc)
			fprintf(stderr, "gpuq: bench allreduce failed at %" PRIu64 " bytes\n",
				w->count * b->elt);
	}
	return rc;
}

int bench_allreduce(struct cli *cli)
{
	struct bench_ar b = { .cli = cli };
	uint64_t sizes[MAX_SIZES];
	struct bench_row rows[MAX_SIZES];
	int nsizes, rc;

	memset(rows, 0, sizeof(rows));
	if ((rc = parse_kind(&b)) != 0)
		return rc;
	if ((nsizes = parse_sizes(&b, sizes)) < 0)
		return -nsizes;
	if ((rc = ping_backend(&b)) != 0)
		return rc;
	b.n = cli_parse_devices(cli, cli->devices ? cli->devices : "all", b.devices, MAX_RANKS);
	if (b.n < 0)
		return -b.n;
	b.max_count = sizes[nsizes - 1] / b.elt ? sizes[nsizes - 1] / b.elt : 1;
	rc = setup(&b);
	if (rc == 0)
		rc = run_sizes(&b, sizes, nsizes, rows);
	free_buffers(&b);
	if (rc)
		return rc;
	if (cli->json)
		print_json(&b, rows, nsizes);
	else
		print_table(&b, rows, nsizes);
	for (int i = 0; i < nsizes; i++)
		if (rows[i].wrong_raw || rows[i].wrong_gpuqd)
			return CLI_REFUSED;
	return CLI_OK;
}
