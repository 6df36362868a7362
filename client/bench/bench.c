/*
 * bench dispatch: request latency through gpuqd, against a bare socket echo.
 *
 * For each client count C three rounds run in turn: echo, ping, noop. In
 * each, C threads (one connection each) make WARMUP unmeasured round trips,
 * meet at a start line, then make N measured ones, each timed with
 * CLOCK_MONOTONIC. Every thread owns its connection and its latency array;
 * the main thread reads them only after joining.
 *
 * The echo round talks to a thread in this process that serves every client
 * from one poll loop, as gpuqd's main thread does, and sends back frames of
 * the ping request's size: the gap between echo and ping is what gpuqd
 * itself adds (decoding, dispatch, encoding), and noop adds the trip through
 * a device worker.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client/cli/cli.h"

#define WARMUP 200
#define DEFAULT_REQUESTS 2000
#define MAX_CLIENTS 1024
#define MAX_COUNTS 16

enum bench_kind { BENCH_ECHO, BENCH_PING, BENCH_NOOP };
static const char *const kind_names[] = { "echo", "ping", "noop" };

struct bench_cfg {
	const char *socket;
	uint64_t requests;
	bool has_device;
	uint64_t device;
	msgpack_sbuffer frame; /* the echo payload: a ping request's frame */
};

/*
 * The start line for one round's clients. Like a barrier, but the main
 * thread can call the round off when it could not start every thread, so
 * those that did start do not wait for ever.
 */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned waiting, need;
	bool open, abort;
};

/* Waits for the others; returns false when the round was called off. */
static bool gate_wait(struct gate *g)
{
	bool go;

	pthread_mutex_lock(&g->mu);
	if (++g->waiting >= g->need) {
		g->open = true;
		pthread_cond_broadcast(&g->cv);
	}
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	go = !g->abort;
	pthread_mutex_unlock(&g->mu);
	return go;
}

static void gate_call_off(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->open = g->abort = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

struct bench_thread {
	const struct bench_cfg *cfg;
	enum bench_kind kind;
	int echo_fd; /* BENCH_ECHO: this client's end of its socketpair */
	struct gate *gate;
	uint64_t *lat_ns; /* cfg->requests entries */
	uint64_t start_ns, end_ns;
	int failed; /* 0, or the exit code the failure maps to */
	struct gpuq_error err;
	pthread_t tid;
};

struct bench_result {
	enum bench_kind kind;
	unsigned clients;
	double p50_us, p99_us, rps, ratio;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Moves exactly len bytes in either direction; 0, or -1 with errno (EPIPE at EOF). */
static int io_all(int fd, void *data, size_t len, bool writing)
{
	uint8_t *p = data;

	while (len > 0) {
		ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0)
				errno = EPIPE;
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* The echo server: one poll loop over every client's socket, until all close. */
static void *echo_serve(void *arg)
{
	struct pollfd *p = arg;
	uint8_t buf[4096];
	size_t i, open = 0;

	for (i = 0; p[i].fd != -2; i++)
		open++;
	while (open > 0) {
		if (poll(p, i, -1) < 0 && errno != EINTR)
			break;
		for (size_t k = 0; k < i; k++) {
			ssize_t n;

			if (p[k].fd < 0 || !(p[k].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			n = recv(p[k].fd, buf, sizeof(buf), 0);
			if (n <= 0 || io_all(p[k].fd, buf, (size_t)n, true) < 0) {
				close(p[k].fd);
				p[k].fd = -1;
				open--;
			}
		}
	}
	return NULL;
}

static int echo_round_trip(struct bench_thread *t)
{
	const struct bench_cfg *cfg = t->cfg;
	uint8_t back[256]; /* a ping frame is about 20 bytes */

	if (cfg->frame.size > sizeof(back))
		return gpuq_fail(&t->err, GPUQ_E_INTERNAL, "bench: echo frame too large");
	if (io_all(t->echo_fd, cfg->frame.data, cfg->frame.size, true) < 0 ||
	    io_all(t->echo_fd, back, cfg->frame.size, false) < 0) {
		t->failed = CLI_UNREACHABLE;
		return gpuq_fail(&t->err, GPUQ_E_IO, "bench echo socket: %s", strerror(errno));
	}
	return 0;
}

/* One ping, or one waited noop; a refusal stops the thread with the reply's error. */
static int daemon_round_trip(struct bench_thread *t, struct gpuq_client *c)
{
	struct gpuq_reply *r;
	struct mp_map req;

	gpuq_request_begin(c, &req, t->kind == BENCH_PING ? "ping" : "noop");
	if (t->kind == BENCH_NOOP) {
		mp_put_bool(&req, "wait", true);
		if (t->cfg->has_device)
			mp_put_u64(&req, "device", t->cfg->device);
	}
	if (gpuq_call(c, &req, NULL, 0, &r, &t->err) < 0) {
		t->failed = CLI_UNREACHABLE;
		return -1;
	}
	if (!gpuq_reply_ok(r)) {
		gpuq_reply_error(r, &t->err);
		t->failed = CLI_REFUSED;
	}
	gpuq_reply_free(r);
	return t->failed ? -1 : 0;
}

static int round_trip(struct bench_thread *t, struct gpuq_client *c)
{
	return t->kind == BENCH_ECHO ? echo_round_trip(t) : daemon_round_trip(t, c);
}

/*
 * One client. Every thread reaches the gate exactly once, failed or not,
 * so that a failure in one cannot leave the others waiting there.
 */
static void *bench_client(void *arg)
{
	struct bench_thread *t = arg;
	struct gpuq_client *c = NULL;
	uint64_t i, t0;

	if (t->kind != BENCH_ECHO && gpuq_connect(t->cfg->socket, &c, &t->err) < 0)
		t->failed = CLI_UNREACHABLE;
	for (i = 0; i < WARMUP && !t->failed; i++)
		round_trip(t, c);
	if (!gate_wait(t->gate))
		t->failed = t->failed ? t->failed : CLI_REFUSED;
	t->start_ns = now_ns();
	for (i = 0; i < t->cfg->requests && !t->failed; i++) {
		t0 = now_ns();
		if (round_trip(t, c) == 0)
			t->lat_ns[i] = now_ns() - t0;
	}
	t->end_ns = now_ns();
	gpuq_close(c);
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Percentiles over every client's latencies (lat, sorted here), and throughput. */
static void summarise(const struct bench_cfg *cfg, const struct bench_thread *th,
		      unsigned n, uint64_t *lat, struct bench_result *res)
{
	size_t total = (size_t)cfg->requests * n;
	uint64_t first = UINT64_MAX, last = 0;
	unsigned i;

	for (i = 0; i < n; i++) {
		first = th[i].start_ns < first ? th[i].start_ns : first;
		last = th[i].end_ns > last ? th[i].end_ns : last;
	}
	qsort(lat, total, sizeof(*lat), cmp_u64);
	res->clients = n;
	res->rps = last > first ? (double)total * 1e9 / (double)(last - first) : 0;
	res->p50_us = (double)lat[(total - 1) / 2] / 1e3;
	res->p99_us = (double)lat[(size_t)((double)(total - 1) * 0.99)] / 1e3;
}

/* Socketpairs for an echo round: client ends in th[], server ends in p[] (ended by -2). */
static int echo_setup(struct bench_thread *th, unsigned n, struct pollfd *p,
		      struct gpuq_error *err)
{
	unsigned i;
	int sv[2];

	for (i = 0; i < n; i++) {
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
			p[i].fd = -2;
			return gpuq_fail(err, GPUQ_E_IO, "bench: socketpair: %s", strerror(errno));
		}
		th[i].echo_fd = sv[0];
		p[i] = (struct pollfd){ .fd = sv[1], .events = POLLIN };
	}
	p[n].fd = -2;
	return 0;
}

static void echo_teardown(struct bench_thread *th, unsigned n, struct pollfd *p)
{
	unsigned i;

	for (i = 0; i < n; i++)
		if (th[i].echo_fd >= 0)
			close(th[i].echo_fd);
	for (i = 0; p[i].fd != -2; i++)
		if (p[i].fd >= 0)
			close(p[i].fd);
}

/* Starts n client threads for kind and joins them; 0 or the first failure's exit code. */
static int run_clients(const struct bench_cfg *cfg, enum bench_kind kind,
		       struct bench_thread *th, unsigned n, struct gpuq_error *err)
{
	struct gate gate = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, n,
			     false, false };
	unsigned i, started;
	int rc = 0;

	for (started = 0; started < n; started++) {
		th[started].cfg = cfg;
		th[started].kind = kind;
		th[started].gate = &gate;
		if (pthread_create(&th[started].tid, NULL, bench_client, &th[started]) != 0)
			break;
	}
	if (started < n) {
		gate_call_off(&gate);
		rc = CLI_REFUSED;
		gpuq_fail(err, GPUQ_E_IO, "bench: cannot start %u client threads "
					  "(started %u); try fewer --clients", n, started);
	}
	for (i = 0; i < started; i++) {
		pthread_join(th[i].tid, NULL);
		if (th[i].failed && !rc) {
			rc = th[i].failed;
			*err = th[i].err;
		}
	}
	return rc;
}

/* One round: n clients of one kind, with the echo server when kind is echo. */
static int bench_round(const struct bench_cfg *cfg, enum bench_kind kind, unsigned n,
		       struct bench_result *res, struct gpuq_error *err)
{
	struct bench_thread *th = calloc(n, sizeof(*th));
	struct pollfd *p = calloc(n + 1, sizeof(*p));
	uint64_t *lat = calloc((size_t)n * cfg->requests, sizeof(*lat));
	pthread_t echo;
	unsigned i;
	int rc = CLI_REFUSED;

	if (!th || !p || !lat) {
		gpuq_fail(err, GPUQ_E_IO, "bench: out of memory for %u clients", n);
		goto out;
	}
	p[0].fd = -2;
	for (i = 0; i < n; i++) {
		th[i].echo_fd = -1;
		th[i].lat_ns = lat + (size_t)i * cfg->requests;
	}
	if (kind == BENCH_ECHO && echo_setup(th, n, p, err) < 0)
		goto out_echo;
	if (kind == BENCH_ECHO && pthread_create(&echo, NULL, echo_serve, p) != 0) {
		gpuq_fail(err, GPUQ_E_IO, "bench: cannot start the echo server thread");
		goto out_echo;
	}
	rc = run_clients(cfg, kind, th, n, err);
	if (rc == 0)
		summarise(cfg, th, n, lat, res);
	res->kind = kind;
	if (kind == BENCH_ECHO) {
		/* The clients' ends closing is what lets the server's loop end. */
		for (i = 0; i < n; i++) {
			close(th[i].echo_fd);
			th[i].echo_fd = -1;
		}
		pthread_join(echo, NULL);
	}
out_echo:
	echo_teardown(th, n, p);
out:
	free(lat);
	free(p);
	free(th);
	return rc;
}

/* --clients "1,8": client counts, each 1..MAX_CLIENTS. Returns how many, or -CLI_USAGE. */
static int parse_clients(const struct cli *cli, const char *list, unsigned *counts)
{
	char copy[256], *tok, *save;
	uint64_t v;
	int n = 0;

	snprintf(copy, sizeof(copy), "%s", list);
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (cli_parse_uint(tok, &v) < 0 || v == 0 || v > MAX_CLIENTS)
			return -cli_usage(cli, "--clients '%s': '%s' is not a client count "
					       "from 1 to %d; give a list such as 1,8,32",
					  list, tok, MAX_CLIENTS);
		if (n == MAX_COUNTS)
			return -cli_usage(cli, "--clients '%s' has more than %d counts",
					  list, MAX_COUNTS);
		counts[n++] = (unsigned)v;
	}
	if (n == 0)
		return -cli_usage(cli, "--clients '%s' has no counts; give a list such as 1,8",
				  list);
	return n;
}

/* The bytes the echo server sends back: a ping request as libgpuq frames it. */
static void build_echo_frame(struct bench_cfg *cfg)
{
	struct mp_map m;

	mp_map_init(&m);
	mp_put_u64(&m, "v", GPUQ_PROTOCOL_VERSION);
	mp_put_u64(&m, "id", WARMUP + cfg->requests / 2); /* a typical id's width */
	mp_put_str(&m, "op", "ping");
	msgpack_sbuffer_init(&cfg->frame);
	mp_map_frame(&m, &cfg->frame);
}

static void print_results(const struct cli *cli, const struct bench_cfg *cfg,
			  const struct bench_result *res, int nres)
{
	static const struct table_col cols[] = {
		{ "KIND", false },       { "CLIENTS", true }, { "P50 µs", true },
		{ "P99 µs", true },      { "REQUESTS/S", true }, { "P50 / ECHO", true },
	};
	struct table t;
	int i;

	if (cli->json_out) {
		FILE *j = cli->json_out;
		fprintf(j, "{\"bench\":\"dispatch\",\"requests_per_client\":%" PRIu64
			",\"warmup\":%d,\"results\":[", cfg->requests, WARMUP);
		for (i = 0; i < nres; i++)
			fprintf(j, "%s{\"kind\":\"%s\",\"clients\":%u,\"p50_us\":%.3f,\"p99_us\":%.3f,"
				"\"requests_per_s\":%.1f,\"p50_ratio_to_echo\":%.3f}",
				i ? "," : "", kind_names[res[i].kind], res[i].clients,
				res[i].p50_us, res[i].p99_us, res[i].rps, res[i].ratio);
		fprintf(j, "]}\n");
	}
	if (cli->json)
		return;
	printf("bench dispatch: %" PRIu64 " round trips per client, after %d unmeasured\n",
	       cfg->requests, WARMUP);
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	for (i = 0; i < nres; i++) {
		table_cell(&t, "%s", kind_names[res[i].kind]);
		table_cell(&t, "%u", res[i].clients);
		table_cell(&t, "%.1f", res[i].p50_us);
		table_cell(&t, "%.1f", res[i].p99_us);
		table_cell(&t, "%.0f", res[i].rps);
		table_cell(&t, "%.2f", res[i].ratio);
	}
	table_print(&t, stdout);
	table_free(&t);
}

/* Fails fast, with the usual error and exit 3, when gpuqd is not there. */
static int check_daemon(struct cli *cli)
{
	struct gpuq_reply *r;
	struct mp_map req;
	int rc = cli_begin(cli, &req, "ping");

	if (rc || (rc = cli_call(cli, &req, NULL, 0, &r)))
		return rc;
	rc = gpuq_reply_ok(r) ? 0 : cli_report_refusal(r);
	gpuq_reply_free(r);
	return rc;
}

/* Runs echo, ping and noop for each client count into res; 0 or an exit code. */
static int run_all(const struct bench_cfg *cfg, const unsigned *counts, int ncounts,
		   struct bench_result *res)
{
	struct gpuq_error err;
	int c, k, rc;

	for (c = 0; c < ncounts; c++) {
		for (k = BENCH_ECHO; k <= BENCH_NOOP; k++) {
			struct bench_result *r = &res[c * 3 + k];

			rc = bench_round(cfg, (enum bench_kind)k, counts[c], r, &err);
			if (rc) {
				fprintf(stderr, "gpuq: bench %s with %u client%s failed\n",
					kind_names[k], counts[c], counts[c] == 1 ? "" : "s");
				cli_print_error(&err);
				return rc;
			}
			r->ratio = res[c * 3].p50_us > 0 ? r->p50_us / res[c * 3].p50_us : 0;
		}
	}
	return 0;
}

int bench_dispatch(struct cli *cli)
{
	struct bench_result res[MAX_COUNTS * 3];
	unsigned counts[MAX_COUNTS];
	struct bench_cfg cfg = { 0 };
	int ncounts, rc;

	ncounts = parse_clients(cli, cli->clients ? cli->clients : "1,8", counts);
	if (ncounts < 0)
		return -ncounts;
	if (cli->has_requests && (cli->requests == 0 || cli->requests > 10000000))
		return cli_usage(cli, "--requests %" PRIu64 " is out of range; give 1 to "
				      "10000000 round trips per client", cli->requests);
	if ((rc = check_daemon(cli)) != 0)
		return rc;
	cfg.socket = cli->socket;
	cfg.requests = cli->has_requests ? cli->requests : DEFAULT_REQUESTS;
	cfg.has_device = cli->has_device;
	cfg.device = cli->device;
	build_echo_frame(&cfg);
	rc = run_all(&cfg, counts, ncounts, res);
	if (rc == 0)
		print_results(cli, &cfg, res, ncounts * 3);
	msgpack_sbuffer_destroy(&cfg.frame);
	return rc;
}

/*
 * The bench kinds, one row each: gpuq bench KIND's synopsis, its line in
 * gpuq --help, its gpuq bench KIND --help, and its run. gpuq --help, gpuq
 * bench --help and tests/docs.sh read this table.
 */
const struct bench_kind_row bench_kind_rows[] = {
	{ "dispatch", "[--clients LIST] [--requests N] [--device N]",
	  "request latency against a bare socket echo",
	  "For each client count C in LIST (default 1,8), C threads with a\n"
	  "connection each make N round trips (default 2000, after 200 unmeasured)\n"
	  "to an echo thread in this process, then of ping, then of noop (waited,\n"
	  "on --device N). Prints p50/p99 latency, requests/s and the p50 ratio\n"
	  "to the echo baseline.\n",
	  bench_dispatch },
	{ "copy", "[--device N] [--sizes LIST] [--requests R]",
	  "gpuqd's copy paths against cudaMemcpy",
	  "gpuqd measures its copy paths on device N as a job (default sizes\n"
	  "256M,1G,4G; R timed repeats after a warm-up, default 5): cudaMemcpy\n"
	  "pageable and pinned against gpuq from a memfd, from a file,\n"
	  "registered, through a region and from scratch, both ways; D2H also\n"
	  "the host alone writing each kind of destination (memfd, file, fresh,\n"
	  "pwrite, a pipe) and gets into fresh and write-only files, /dev/null\n"
	  "and a pipe, each get read against its host row (GET); then\n"
	  "device<->device where the daemon has bench_d2d. One table: GB/s and\n"
	  "the ratio to the pinned ceiling of the same run, each row verified.\n",
	  bench_copy },
	{ "chain", "[--device N] [--bytes SIZE] [--repeat N]",
	  "kernel chains: eager, graph and fused",
	  "gpuqd measures kernel chains on device N as a job: launch-bound, 1024\n"
	  "f32 elements and chains of 1, 5 and 20 ops applied N times (default\n"
	  "1000), eager against graph in µs per kernel; bandwidth-bound, SIZE of\n"
	  "f32 (default 1G) and sin | add 1 | sqrt | mul 2 | sub 3, each op alone\n"
	  "and the chain eager, graph and fused in GB/s beside cudaMemcpy device\n"
	  "to device; and the time to instantiate, update and find a cached graph.\n"
	  "Medians of 10 timed replays; the H200 targets are marked met or missed.\n",
	  bench_chain },
	{ "allreduce", "[--bytes MIN:MAX] [--factor F] [--devices LIST|all] [--dtype T] [--op OP]",
	  "allreduce jobs against a raw NCCL loop",
	  "For each size from MIN to MAX (default 8:64M, times F, default 2) a raw\n"
	  "ncclAllReduce loop on a communicator of the same devices (default all)\n"
	  "timed by gpuqd with CUDA events, then the same all-reduce as allreduce\n"
	  "jobs sent from here, 8 in flight; both results are checked element by\n"
	  "element. An nccl-tests style table: time, algbw, busbw (algbw x\n"
	  "2(n-1)/n), wrong elements, the ratio.\n",
	  bench_allreduce },
	{ "collective",
	  "--op PRIMITIVE [--bytes MIN:MAX] [--factor F] [--devices LIST|all] [--dtype T] "
	  "[--reduce OP] [--root N]",
	  "the other collectives against raw NCCL loops",
	  "As bench allreduce for all-gather, reduce-scatter, broadcast, reduce,\n"
	  "all-to-all or sendrecv (a ring: rank r sends to rank r+1, one group),\n"
	  "with nccl-tests' size and bus factor for each ((n-1)/n for all-gather,\n"
	  "reduce-scatter and all-to-all, 1 for broadcast, reduce and sendrecv).\n"
	  "--reduce OP: the reduction of reduce-scatter and reduce (default sum).\n",
	  bench_collective },
	{ "sched", "[--device N] [--bytes SIZE] [--repeat R] [--requests S]",
	  "the scheduler: overlap, head of line, priority, fairness",
	  "gpuqd's scheduler on device N beside what the device does alone, in one\n"
	  "run. (1) overlap: a put from scratch:, a get to scratch: and the fused\n"
	  "chain sin | add 1 | sqrt | mul 2 | sub 3, SIZE each (default 4G, less on\n"
	  "a small device, 16M on the host backend), alone and all three at once,\n"
	  "beside gpuqd's raw ceiling of the same (pinned copies and the kernel on\n"
	  "three streams); medians of R rounds (default 3). (2) head of line: p50\n"
	  "and p99 of a 1 MiB checksum and a 1 MiB put, S of each (default 200),\n"
	  "idle and while a 32 GiB put runs. (3) priority: a high-priority checksum\n"
	  "behind 1000 queued low-priority 256 MiB puts, against idle. (4) fairness:\n"
	  "two owners, one sending 800 puts and then the other 80: each one's share\n"
	  "of the bytes moved (and of the time in flight) while both have jobs\n"
	  "queued; needs root (a child process becomes uid 65534, and gpuqd's\n"
	  "--socket-group must let it in), skipped otherwise. Sizes shrink on the\n"
	  "host backend. A closing table marks the H200 targets met or MISSED.\n",
	  bench_sched },
	{ "attach", "[--device N] [--bytes SIZE] [--requests R]",
	  "attaching a shareable buffer in a new process",
	  "A shareable buffer of SIZE (default 10G; 64M on the host backend)\n"
	  "filled with random bytes; R times (default 5) a new process attaches it\n"
	  "and reads its first bytes (checked against gpuqd's), cold (the CUDA\n"
	  "driver starting in that process) and warm; beside gpuq get of it to\n"
	  "scratch: and a copy of it into pinned memory (cudaMemcpy). Target:\n"
	  "attach <= 50 ms for any size.\n",
	  bench_attach },
	{ "alloc", "[--device N] [--sizes LIST] [--requests R]",
	  "alloc and free latency: the pool against slabs",
	  "gpuqd measures, as a job on device N, R timed alloc/free pairs (default\n"
	  "50, after one unmeasured) of each size in LIST (default 4K,1M,64M,1G)\n"
	  "from the memory pool and from exportable slabs (--buffer-memory) in the\n"
	  "same run: p50 and p99 of each call, the slabs' p50 over the pool's, and\n"
	  "the device memory one buffer took from each (its free memory's drop\n"
	  "with up to 64 buffers held at once). Aims: slabs' alloc p50 within 2x\n"
	  "of the pool's from 64M, and no worse for small buffers.\n",
	  bench_alloc },
	{ "restart", "[--device N] [--bytes SIZE] [--requests N]",
	  "gpuqd re-executing itself with many buffers resident",
	  "N buffers (default 1000; 64 on the host backend) of mixed sizes, SIZE in\n"
	  "all (default 100G; 256M on the host backend), on device N, filled and\n"
	  "checksummed; then gpuq admin restart, and the time from the request to\n"
	  "the first job served again and to every buffer's checksum verified\n"
	  "(each must match), with the device's memory in use before and after\n"
	  "(the same: no buffer is copied). Aim: serving again in under 1.5 s.\n"
	  "Root and the admin group only, as restart is. The buffers are freed.\n",
	  bench_restart },
	{ NULL, NULL, NULL, NULL, NULL },
};

const struct bench_kind_row *bench_kind_find(const char *name)
{
	for (const struct bench_kind_row *k = bench_kind_rows; k->name; k++)
		if (strcmp(k->name, name) == 0)
			return k;
	return NULL;
}

/*
 * --save-json FILE: the table as usual, and the --json result in FILE (what
 * `python -m gpuq plot` draws), from the same run.
 */
static int run_kind(struct cli *cli, int (*run)(struct cli *cli))
{
	cli->json_out = cli->json ? stdout : NULL;
	if (cli->save_json && !(cli->json_out = fopen(cli->save_json, "w"))) {
		fprintf(stderr, "gpuq bench: --save-json %s: %s\n", cli->save_json, strerror(errno));
		return CLI_USAGE;
	}
	int rc = run(cli);
	if (cli->save_json && (ferror(cli->json_out) | fclose(cli->json_out))) {
		fprintf(stderr, "gpuq bench: writing %s failed: %s\n", cli->save_json, strerror(errno));
		rc = rc ? rc : CLI_REFUSED;
	}
	cli->json_out = NULL;
	return rc;
}

int cmd_bench(struct cli *cli)
{
	char names[128] = "";
	const struct bench_kind_row *kind = bench_kind_find(cli->args[0]);
	if (kind)
		return run_kind(cli, kind->run);
	for (const struct bench_kind_row *k = bench_kind_rows; k->name; k++)
		snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
			 k == bench_kind_rows ? "" : ", ", k->name);
	return cli_usage(cli, "unknown benchmark '%s'; there are: %s", cli->args[0], names);
}
