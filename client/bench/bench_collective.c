/*
 * bench allreduce and bench collective --op PRIMITIVE: gpuqd's collective
 * jobs against the same NCCL calls in a raw loop on a communicator of the
 * same devices, measured in one run and printed as nccl-tests does (time,
 * algbw = size / time, busbw = algbw x the primitive's bus factor, and the
 * size as nccl-tests counts it: protocol/collective_layout.h).
 *
 * Setup: an input and an output buffer of the largest size on every device,
 * the inputs filled with `fill random` (seed SEED + rank), so that the
 * expected value of every output element can be computed here from the
 * seeds (coll_sources names the inputs each one is made of).
 *
 * Per size (the outputs poisoned before each of the two steps):
 *   1. bench_collective, one gang job: each rank's worker times REPEATS
 *      batches of `iters` back-to-back runs of the primitive's NCCL calls
 *      with CUDA events (the host backend: its own collective, on the host
 *      clock) on the communicator of these devices; the median batch is the
 *      baseline. Its output is checked.
 *   2. The same primitive as jobs sent from here: WARMUP unmeasured,
 *      RTT_JOBS one at a time (the round trip a caller that waits for each
 *      sees: the median), then iters x REPEATS with WINDOW in flight, timed
 *      on this clock (the daemon's throughput path). Its output is checked.
 * sendrecv runs as nccl-tests' does: a ring, rank r sending to rank r+1 (to
 * itself with one rank), all of it one group. Checking reads every rank's
 * output back (get into a memfd) and compares each element it writes with
 * the reference (protocol/collective_math.h).
 *
 * One thread and one connection; the pipelined round sends WINDOW requests
 * before reading the first reply, and libgpuq keeps replies by id.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/bench/bench_time.h"
#include "client/cli/cli.h"
#include "protocol/collective_layout.h"

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

struct bench_coll {
	struct cli *cli;
	enum coll_prim prim;
	int devices[MAX_RANKS], n;
	enum gpuq_dtype dtype;
	size_t elt;
	const char *op_name; /* the reduction's */
	enum coll_op op;
	int root;
	char in[64], out[64];
	bool allocated_in[MAX_RANKS], allocated_out[MAX_RANKS];
	uint64_t max_in, max_out; /* elements of each buffer */
	char backend[16];
	/* The run being measured: its primitives as requests and as layouts. */
	struct gpuq_collective ops[MAX_RANKS];
	struct coll_layout layouts[MAX_RANKS];
	int nops;
	char src[MAX_RANKS][96], dst[MAX_RANKS][96];
};

struct bench_row {
	uint64_t count; /* NCCL's count */
	uint64_t bytes; /* nccl-tests' size */
	unsigned iters;
	double raw_us, gpuqd_us, rtt_us;
	uint64_t wrong_raw, wrong_gpuqd;
};

/* Sends req and returns the reply if ok; NULL (after printing why) otherwise. */
static struct gpuq_reply *call_ok(struct bench_coll *b, struct mp_map *req, const int *fds,
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
static int begin(struct bench_coll *b, struct mp_map *req, const char *op)
{
	int rc = cli_begin(b->cli, req, op);

	if (rc == 0)
		mp_put_bool(req, "wait", true);
	return rc;
}

static int simple_job(struct bench_coll *b, struct mp_map *req)
{
	int rc;
	struct gpuq_reply *r = call_ok(b, req, NULL, 0, &rc);

	gpuq_reply_free(r);
	return r ? 0 : rc;
}

static int alloc_one(struct bench_coll *b, const char *name, int device, uint64_t count)
{
	struct mp_map req;
	int rc = begin(b, &req, "alloc");

	if (rc)
		return rc;
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "device", (uint64_t)device);
	mp_put_u64(&req, "count", count);
	mp_put_str(&req, "dtype", gpuq_dtype_name(b->dtype));
	return simple_job(b, &req);
}

static int fill_random(struct bench_coll *b, const char *name, int device, uint64_t seed)
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

static void free_buffers(struct bench_coll *b)
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

static int setup(struct bench_coll *b)
{
	int rc;

	snprintf(b->in, sizeof(b->in), "bench-%s-in.%d", coll_prim_name(b->prim), (int)getpid());
	snprintf(b->out, sizeof(b->out), "bench-%s-out.%d", coll_prim_name(b->prim), (int)getpid());
	for (int r = 0; r < b->n; r++) {
		if ((rc = alloc_one(b, b->in, b->devices[r], b->max_in)) != 0)
			return rc;
		b->allocated_in[r] = true;
		if ((rc = alloc_one(b, b->out, b->devices[r], b->max_out)) != 0)
			return rc;
		b->allocated_out[r] = true;
		if ((rc = fill_random(b, b->in, b->devices[r], SEED + (uint64_t)r)) != 0)
			return rc;
	}
	return 0;
}

/* NCCL's count for a run of nccl-tests' size `bytes` (at least 1). */
static uint64_t count_for(const struct bench_coll *b, uint64_t bytes)
{
	struct coll_layout l = { .prim = b->prim, .nranks = b->n, .count = 1 };
	uint64_t per = coll_size_elements(&l) * b->elt; /* bytes of count 1 */

	return bytes / per ? bytes / per : 1;
}

/*
 * The run of one size as requests and layouts: the primitive, or for
 * sendrecv the ring of n sends (rank k's input to rank k+1's output).
 */
static void plan_run(struct bench_coll *b, uint64_t count)
{
	bool ring = b->prim == COLL_SENDRECV;

	b->nops = ring ? b->n : 1;
	for (int k = 0; k < b->nops; k++) {
		int to = (k + 1) % b->n;
		struct gpuq_collective *c = &b->ops[k];

		*c = (struct gpuq_collective){ .op = coll_prim_name(b->prim), .root = -1 };
		b->layouts[k] = (struct coll_layout){ .prim = b->prim, .nranks = b->n, .count = count,
						      .root = ring ? k : b->root, .peer = to };
		if (ring) {
			snprintf(b->src[k], sizeof(b->src[k]), "%s@%d[0:%" PRIu64 "]", b->in,
				 b->devices[k], count * b->elt);
			snprintf(b->dst[k], sizeof(b->dst[k]), "%s@%d[0:%" PRIu64 "]", b->out,
				 b->devices[to], count * b->elt);
			c->src = b->src[k];
			c->dst = b->dst[k];
			continue;
		}
		c->buffer = b->in;
		c->out = b->out;
		c->count = count;
		if (coll_prim_reduces(b->prim))
			c->reduce = b->op_name;
		if (coll_prim_has_root(b->prim))
			c->root = b->root;
	}
}

/* Elements of rank r's output (mapped) that one layout writes and that are not the reference. */
static uint64_t count_wrong(const struct bench_coll *b, const struct coll_layout *l, int r,
			    const unsigned char *p)
{
	uint64_t in[MAX_RANKS], index[MAX_RANKS], wrong = 0, n = coll_out_count(l, r);
	int ranks[MAX_RANKS], nsrc = 0;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t out = 0;

		if (!coll_sources(l, r, i, &nsrc, ranks, index))
			break; /* past what the layout writes (n says where that ends) */
		for (int k = 0; k < nsrc; k++)
			in[k] = coll_random_element(b->dtype, SEED + (uint64_t)ranks[k], index[k]);
		memcpy(&out, p + i * b->elt, b->elt); /* little-endian, as on the device */
		wrong += !coll_check_output(b->prim, b->dtype, b->op, nsrc, in, out);
	}
	return wrong;
}

/* The elements rank r's output holds (the most any layout writes there). */
static uint64_t out_elements(const struct bench_coll *b, int r)
{
	uint64_t most = 0;

	for (int k = 0; k < b->nops; k++)
		if (coll_out_count(&b->layouts[k], r) > most)
			most = coll_out_count(&b->layouts[k], r);
	return most;
}

/* Reads rank r's output back into a memfd and counts its wrong elements. */
static int verify_rank(struct bench_coll *b, int r, uint64_t *wrong)
{
	size_t bytes = (size_t)(out_elements(b, r) * b->elt);
	char ref[96];
	struct mp_map req;
	int rc, fd = memfd_create("gpuq-bench-collective", MFD_CLOEXEC);

	if (bytes == 0)
		return 0;
	if (fd < 0) {
		perror("gpuq bench: memfd_create");
		return CLI_REFUSED;
	}
	if ((rc = begin(b, &req, "get")) == 0) {
		snprintf(ref, sizeof(ref), "%s@%d", b->out, b->devices[r]);
		mp_put_str(&req, "buffer", ref);
		mp_put_u64(&req, "fds", 1);
		mp_put_u64(&req, "length", bytes);
		gpuq_reply_free(call_ok(b, &req, &fd, 1, &rc));
	}
	void *p = rc ? MAP_FAILED : mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);

	if (rc == 0 && p == MAP_FAILED) {
		perror("gpuq bench: mmap");
		rc = CLI_REFUSED;
	}
	for (int k = 0; rc == 0 && k < b->nops; k++)
		*wrong += count_wrong(b, &b->layouts[k], r, p);
	if (p != MAP_FAILED)
		munmap(p, bytes);
	close(fd);
	return rc;
}

static int verify(struct bench_coll *b, uint64_t *wrong)
{
	int rc = 0;

	*wrong = 0;
	for (int r = 0; r < b->n && rc == 0; r++)
		rc = verify_rank(b, r, wrong);
	return rc;
}

static int poison_outputs(struct bench_coll *b)
{
	int rc = 0;

	for (int r = 0; r < b->n && rc == 0; r++)
		rc = fill_random(b, b->out, b->devices[r], POISON_SEED);
	return rc;
}

/* The baseline: the daemon's raw loop of the same calls on the same communicator. */
static int run_raw(struct bench_coll *b, struct bench_row *row)
{
	struct mp_map req;
	struct gpuq_reply *r;
	int rc;

	if ((rc = poison_outputs(b)) != 0)
		return rc;
	gpuq_group_begin(b->cli->client, &req, "bench_collective", b->ops, b->nops, b->devices, b->n);
	mp_put_bool(&req, "wait", true);
	mp_put_u64(&req, "warmup", 5);
	mp_put_u64(&req, "iters", row->iters);
	mp_put_u64(&req, "repeats", REPEATS);
	if (!(r = call_ok(b, &req, NULL, 0, &rc)))
		return rc;
	const msgpack_object *rec = gpuq_reply_get(r, "job");
	const msgpack_object *res = rec ? msg_map_get(rec, "result") : NULL;

	row->raw_us = res ? field_f64(res, "us", 0) : 0;
	gpuq_reply_free(r);
	return verify(b, &row->wrong_raw);
}

/* The primitive as a job of its own (sendrecv's ring: a group). */
static int send_job(struct bench_coll *b, uint64_t *id)
{
	struct gpuq_error err;
	struct mp_map req;

	if (b->nops == 1)
		*id = gpuq_collective_begin(b->cli->client, &req, &b->ops[0], b->devices, b->n);
	else
		*id = gpuq_group_begin(b->cli->client, &req, "group", b->ops, b->nops, b->devices,
				       b->n);
	mp_put_bool(&req, "wait", true);
	if (gpuq_send(b->cli->client, &req, NULL, 0, &err) < 0) {
		cli_print_error(&err);
		return CLI_UNREACHABLE;
	}
	return 0;
}

static int recv_job(struct bench_coll *b, uint64_t id)
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

static int one_job(struct bench_coll *b)
{
	uint64_t id;
	int rc = send_job(b, &id);

	return rc ? rc : recv_job(b, id);
}

/* Round trips one at a time: the median. */
static int run_rtt(struct bench_coll *b, struct bench_row *row)
{
	double t[RTT_JOBS];
	int rc = 0;

	for (int i = 0; i < WARMUP && rc == 0; i++)
		rc = one_job(b);
	for (int i = 0; i < RTT_JOBS && rc == 0; i++) {
		double t0 = bench_now();

		rc = one_job(b);
		t[i] = (bench_now() - t0) * 1e6;
	}
	if (rc == 0)
		row->rtt_us = bench_median(t, RTT_JOBS);
	return rc;
}

/* iters x REPEATS jobs with WINDOW in flight: the time per job. */
static int run_pipelined(struct bench_coll *b, struct bench_row *row)
{
	uint64_t ids[WINDOW];
	unsigned jobs = row->iters * REPEATS, sent = 0, done = 0;
	double t0 = bench_now();
	int rc = 0;

	while (rc == 0 && sent < jobs && sent < WINDOW)
		rc = send_job(b, &ids[sent++ % WINDOW]);
	while (rc == 0 && done < jobs) {
		rc = recv_job(b, ids[done++ % WINDOW]);
		if (rc == 0 && sent < jobs)
			rc = send_job(b, &ids[sent++ % WINDOW]);
	}
	row->gpuqd_us = (bench_now() - t0) * 1e6 / jobs;
	return rc;
}

static int run_daemon_path(struct bench_coll *b, struct bench_row *row)
{
	int rc;

	if ((rc = poison_outputs(b)) != 0 || (rc = run_rtt(b, row)) != 0 ||
	    (rc = run_pipelined(b, row)) != 0)
		return rc;
	return verify(b, &row->wrong_gpuqd);
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

static double algbw(const struct bench_row *w, double us)
{
	return us > 0 ? (double)w->bytes / us / 1e3 : 0;
}

static double busbw(const struct bench_coll *b, const struct bench_row *w, double us)
{
	return algbw(w, us) * coll_bus_factor(b->prim, b->n);
}

static void print_json(const struct bench_coll *b, const struct bench_row *rows, int nrows)
{
	FILE *j = b->cli->json_out;

	fprintf(j, "{\"bench\":\"%s\",\"backend\":\"%s\",\"ranks\":%d,\"dtype\":\"%s\","
	       "\"op\":\"%s\",\"root\":%d,\"bus_factor\":%.6f,\"repeats\":%d,\"window\":%d,"
	       "\"results\":[",
	       coll_prim_name(b->prim), b->backend, b->n, gpuq_dtype_name(b->dtype),
	       coll_prim_reduces(b->prim) ? b->op_name : "", b->root,
	       coll_bus_factor(b->prim, b->n), REPEATS, WINDOW);
	for (int i = 0; i < nrows; i++) {
		const struct bench_row *w = &rows[i];

		fprintf(j, "%s{\"bytes\":%" PRIu64 ",\"count\":%" PRIu64 ",\"iters\":%u,"
		       "\"raw_us\":%.3f,\"raw_algbw_gbps\":%.3f,\"raw_busbw_gbps\":%.3f,"
		       "\"gpuqd_us\":%.3f,\"gpuqd_algbw_gbps\":%.3f,\"gpuqd_busbw_gbps\":%.3f,"
		       "\"rtt_us\":%.3f,\"wrong_raw\":%" PRIu64 ",\"wrong_gpuqd\":%" PRIu64
		       ",\"ratio\":%.4f,\"added_us\":%.3f}",
		       i ? "," : "", w->bytes, w->count, w->iters, w->raw_us, algbw(w, w->raw_us),
		       busbw(b, w, w->raw_us), w->gpuqd_us, algbw(w, w->gpuqd_us),
		       busbw(b, w, w->gpuqd_us), w->rtt_us, w->wrong_raw, w->wrong_gpuqd,
		       w->gpuqd_us > 0 ? w->raw_us / w->gpuqd_us : 0, w->gpuqd_us - w->raw_us);
	}
	fprintf(j, "]}\n");
}

static void print_header(const struct bench_coll *b)
{
	bool cuda = strcmp(b->backend, "cuda") == 0;
	double factor = coll_bus_factor(b->prim, b->n);

	printf("bench %s: %d rank%s on the %s backend (devices", coll_prim_name(b->prim), b->n,
	       b->n == 1 ? "" : "s", b->backend);
	for (int r = 0; r < b->n; r++)
		printf("%s%d", r ? "," : " ", b->devices[r]);
	printf("), %s", gpuq_dtype_name(b->dtype));
	if (coll_prim_reduces(b->prim))
		printf(" %s", b->op_name);
	if (coll_prim_has_root(b->prim))
		printf(", root rank %d", b->root);
	if (b->prim == COLL_SENDRECV)
		printf(", a ring (rank r sends to rank r+1) in one group");
	printf(", out of place, every element checked\n");
	printf("RAW: %s, median of %d batches; GPUQD: %s jobs from this client, %d in "
	       "flight; RTT: one job waited at a time (median)\n",
	       cuda ? "the same NCCL calls in a raw loop on a communicator of the same devices, "
		      "CUDA events"
		    : "the host backend's collective in a loop, host clock",
	       REPEATS, b->prim == COLL_SENDRECV ? "group" : coll_prim_name(b->prim), WINDOW);
	printf("SIZE as nccl-tests counts it; GB/s; BUSBW = ALGBW x %.3f (nccl-tests' bus factor "
	       "for %s over %d rank%s); WRONG: raw/gpuqd elements off the reference; RATIO: raw "
	       "time / gpuqd time; ADDED: gpuqd - raw, µs per job\n",
	       factor, coll_prim_name(b->prim), b->n, b->n == 1 ? "" : "s");
	if (factor == 0)
		printf("one rank: the bus factor is 0 (no byte crosses a link), so busbw is 0 and "
		       "the ratio compares times; the busbw targets need a multi-GPU machine\n");
}

static void print_table(const struct bench_coll *b, const struct bench_row *rows, int nrows)
{
	static const struct table_col cols[] = {
		{ "SIZE", true },        { "COUNT", true },       { "TYPE", false },
		{ "RAW µs", true },      { "ALGBW", true },       { "BUSBW", true },
		{ "GPUQD µs", true },    { "ALGBW", true },       { "BUSBW", true },
		{ "RTT µs", true },      { "WRONG", true },       { "RATIO", true },
		{ "ADDED µs", true },
	};
	char size[32];
	struct table t;

	print_header(b);
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	for (int i = 0; i < nrows; i++) {
		const struct bench_row *w = &rows[i];

		table_cell(&t, "%s", human_bytes(size, sizeof(size), w->bytes, 0));
		table_cell(&t, "%" PRIu64, w->count);
		table_cell(&t, "%s", gpuq_dtype_name(b->dtype));
		table_cell(&t, "%.2f", w->raw_us);
		table_cell(&t, "%.2f", algbw(w, w->raw_us));
		table_cell(&t, "%.2f", busbw(b, w, w->raw_us));
		table_cell(&t, "%.2f", w->gpuqd_us);
		table_cell(&t, "%.2f", algbw(w, w->gpuqd_us));
		table_cell(&t, "%.2f", busbw(b, w, w->gpuqd_us));
		table_cell(&t, "%.2f", w->rtt_us);
		table_cell(&t, "%" PRIu64 "/%" PRIu64, w->wrong_raw, w->wrong_gpuqd);
		table_cell(&t, "%.3f", w->gpuqd_us > 0 ? w->raw_us / w->gpuqd_us : 0);
		table_cell(&t, "%+.2f", w->gpuqd_us - w->raw_us);
	}
	table_print(&t, stdout);
	table_free(&t);
}

/* --bytes MIN:MAX (or one SIZE) and --factor into sizes; the count or -(exit code). */
static int parse_sizes(struct bench_coll *b, uint64_t *sizes)
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

/* The reduction (reducing primitives), the dtype and the root; 0 or CLI_USAGE. */
static int parse_kind(struct bench_coll *b, const char *reduce)
{
	struct cli *cli = b->cli;
	const char *dtype = cli->dtype ? cli->dtype : "f32";

	b->op_name = reduce ? reduce : "sum";
	if (coll_op_from_name(b->op_name, &b->op) < 0)
		return cli_usage(cli, "'%s' is not a reduction: one of " COLL_OP_LIST, b->op_name);
	if (gpuq_dtype_from_name(dtype, strlen(dtype), &b->dtype) < 0 ||
	    (b->dtype == GPUQ_DTYPE_BYTES && coll_prim_reduces(b->prim)))
		return cli_usage(cli, "--dtype '%s' is not one of u8, i32, i64, f16, bf16, f32, f64%s",
				 dtype, coll_prim_reduces(b->prim) ? "" : ", bytes");
	b->elt = gpuq_dtype_size(b->dtype);
	b->root = cli->has_root ? (int)(cli->root < MAX_RANKS ? cli->root : MAX_RANKS) : 0;
	return 0;
}

static int ping_backend(struct bench_coll *b)
{
	struct mp_map req;
	int rc = cli_begin(b->cli, &req, "ping");
	struct gpuq_reply *r = rc ? NULL : call_ok(b, &req, NULL, 0, &rc);

	if (r)
		field_str(r->root, "backend", b->backend, sizeof(b->backend), "?");
	gpuq_reply_free(r);
	return rc;
}

static int run_sizes(struct bench_coll *b, const uint64_t *sizes, int nsizes,
		     struct bench_row *rows)
{
	int rc = 0;

	for (int i = 0; i < nsizes && rc == 0; i++) {
		struct bench_row *w = &rows[i];

		w->count = count_for(b, sizes[i]);
		plan_run(b, w->count);
		w->bytes = coll_size_elements(&b->layouts[0]) * b->elt;
		w->iters = iters_for(b->cli, w->bytes);
		rc = run_raw(b, w);
		if (rc == 0)
			rc = run_daemon_path(b, w);
		if (rc)
			fprintf(stderr, "gpuq: bench %s failed at %" PRIu64 " bytes\n",
				coll_prim_name(b->prim), w->bytes);
	}
	return rc;
}

/* Buffers that hold the largest run: every rank's input and output at the largest count. */
static void size_buffers(struct bench_coll *b, uint64_t largest)
{
	struct coll_layout l = { .prim = b->prim, .nranks = b->n, .count = count_for(b, largest) };

	b->max_in = b->max_out = l.count;
	for (int r = 0; r < b->n; r++) {
		l.root = l.peer = r; /* every rank in either role */
		if (coll_in_count(&l, r) > b->max_in)
			b->max_in = coll_in_count(&l, r);
		if (coll_out_count(&l, r) > b->max_out)
			b->max_out = coll_out_count(&l, r);
	}
}

static int run_bench(struct bench_coll *b, const char *reduce)
{
	uint64_t sizes[MAX_SIZES];
	struct bench_row rows[MAX_SIZES];
	int nsizes, rc;

	memset(rows, 0, sizeof(rows));
	if ((rc = parse_kind(b, reduce)) != 0)
		return rc;
	if ((nsizes = parse_sizes(b, sizes)) < 0)
		return -nsizes;
	if ((rc = ping_backend(b)) != 0)
		return rc;
	b->n = cli_parse_devices(b->cli, b->cli->devices ? b->cli->devices : "all", b->devices,
				 MAX_RANKS);
	if (b->n < 0)
		return -b->n;
	size_buffers(b, sizes[nsizes - 1]);
	rc = setup(b);
	if (rc == 0)
		rc = run_sizes(b, sizes, nsizes, rows);
	free_buffers(b);
	if (rc)
		return rc;
	if (b->cli->json_out)
		print_json(b, rows, nsizes);
	if (!b->cli->json)
		print_table(b, rows, nsizes);
	for (int i = 0; i < nsizes; i++)
		if (rows[i].wrong_raw || rows[i].wrong_gpuqd)
			return CLI_REFUSED;
	return CLI_OK;
}

/* bench allreduce: --op is the reduction. */
int bench_allreduce(struct cli *cli)
{
	struct bench_coll b = { .cli = cli, .prim = COLL_ALLREDUCE };

	return run_bench(&b, cli->redop);
}

/* bench collective: --op is the primitive, --reduce the reduction. */
int bench_collective(struct cli *cli)
{
	struct bench_coll b = { .cli = cli };
	const char *name = cli->redop ? cli_collective_op(cli->redop) : NULL;

	if (!name || coll_prim_from_name(name, &b.prim) < 0)
		return cli_usage(cli, "bench collective needs --op PRIMITIVE: all-gather, "
				      "reduce-scatter, broadcast, reduce, all-to-all, sendrecv or "
				      "allreduce%s%s%s",
				 cli->redop ? " (not '" : "", cli->redop ? cli->redop : "",
				 cli->redop ? "')" : "");
	return run_bench(&b, cli->reduce);
}
