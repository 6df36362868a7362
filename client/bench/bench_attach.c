/*
 * gpuq bench attach: what a new worker process pays to reach a resident
 * buffer by attaching it, beside getting the same bytes and beside a plain
 * cudaMemcpy of them into pinned memory, all measured in one run.
 *
 * A shareable buffer of --bytes (default 10 GiB on a GPU, 64 MiB on the
 * host backend) is allocated and filled with random bytes. Then, R times
 * (--requests, default 5), a fresh process (fork) connects, attaches the
 * buffer and reads its first 8 bytes, which must equal what gpuqd's own get
 * of them says: timed from before the connect (its first attach also
 * loads and starts the CUDA driver in that process), and again for a
 * second attach in the same process while the first is held (the driver
 * and context warm, as in a worker that already runs CUDA). The last such process also copies the whole buffer
 * into pinned memory (cuMemcpyDtoH into registered memory: the cudaMemcpy
 * baseline). Then the parent times gpuq get of the whole buffer to scratch:
 * (the staged pipeline without file I/O). Medians; the target is an attach
 * and first byte within 50 ms whatever the size. Last, what a use costs a
 * process that keeps its attachment between uses under a revocable lease
 * (gpuq_attachment_begin_use and _end_use, no request), beside an attach
 * and release per use.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/bench/bench_time.h"
#include "client/cli/cli.h"

#define ATTACH_MAX_ROUNDS 50
#define ATTACH_TARGET_S 0.050
#define KEPT_USES 21 /* uses timed each way */

/* What one child process measured, sent back through a pipe. */
struct attach_sample {
	int ok;
	char error[256];
	double cold_s;    /* connect + attach + first bytes, in a process without CUDA yet */
	double warm_s;    /* attach + first bytes again, the driver warm */
	double import_s;  /* of the warm attach: the import and mapping alone */
	uint64_t first;   /* the buffer's first 8 bytes as the attachment shows them */
	double copy_s;    /* the whole buffer into pinned memory (the last round), else 0 */
};

/* Attaches buf read-only and reads its first 8 bytes: the time of both; a stays attached (*attached). */
static int attach_first(struct gpuq_client *c, const char *buf, struct gpuq_attachment *a,
			bool *attached, struct attach_sample *s, double *seconds, struct gpuq_error *err)
{
	double start = bench_now();
	*attached = gpuq_buffer_attach(c, buf, false, a, err) == 0;
	if (!*attached)
		return -1;
	int rc = gpuq_attachment_read(a, 0, &s->first, sizeof s->first, false, NULL, err);
	*seconds = bench_now() - start;
	s->import_s = a->import_s;
	return rc;
}

/* The whole of a into pinned memory (the cudaMemcpy baseline). */
static int copy_whole(const struct gpuq_attachment *a, struct attach_sample *s, struct gpuq_error *err)
{
	void *host = mmap(NULL, a->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (host == MAP_FAILED)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "no host memory for the copy");
	int rc = gpuq_attachment_read(a, 0, host, a->bytes, true, &s->copy_s, err);
	munmap(host, a->bytes);
	return rc;
}

/* Releases a; a failure to is the round's error when it had none. */
static int release(struct gpuq_client *c, struct gpuq_attachment *a, int rc, struct gpuq_error *err)
{
	struct gpuq_error rel;
	if (gpuq_buffer_release(c, a, &rel) < 0 && rc == 0) {
		*err = rel;
		return -1;
	}
	return rc;
}

/*
 * The child: a new process attaching twice. The first attachment stays
 * held through the second, as a worker's own CUDA work keeps its context
 * alive: released, the process's last hold on the primary context would
 * destroy it, and the second attach would pay for a new one (100 ms on
 * the H200) instead of measuring a warm driver.
 */
static void child_round(const struct cli *cli, const char *buf, bool copy_all, int out)
{
	struct attach_sample s;
	struct gpuq_error err;
	struct gpuq_client *c = NULL;
	struct gpuq_attachment held, a;
	bool holding = false, attached = false;
	memset(&s, 0, sizeof s);
	double start = bench_now(), t;
	int rc = gpuq_connect(cli->socket, &c, &err);
	if (rc == 0 && (rc = attach_first(c, buf, &held, &holding, &s, &t, &err)) == 0)
		s.cold_s = bench_now() - start;
	if (rc == 0) {
		rc = attach_first(c, buf, &a, &attached, &s, &s.warm_s, &err);
		if (rc == 0 && copy_all)
			rc = copy_whole(&a, &s, &err);
	}
	if (attached)
		rc = release(c, &a, rc, &err);
	if (holding)
		rc = release(c, &held, rc, &err);
	s.ok = rc == 0;
	if (rc < 0)
		snprintf(s.error, sizeof s.error, "%.255s", err.message);
	if (write(out, &s, sizeof s) != (ssize_t)sizeof s)
		_exit(1);
	gpuq_close(c);
	_exit(0);
}

static int run_round(const struct cli *cli, const char *buf, bool copy_all, struct attach_sample *s)
{
	int p[2];
	if (pipe(p) < 0)
		return -1;
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		child_round(cli, buf, copy_all, p[1]);
	}
	close(p[1]);
	ssize_t n = pid > 0 ? read(p[0], s, sizeof *s) : -1;
	close(p[0]);
	if (pid > 0)
		waitpid(pid, NULL, 0);
	return n == (ssize_t)sizeof *s ? 0 : -1;
}

/* A waited job of op on buf with its extra fields; the reply (NULL on a transport failure). */
static struct gpuq_reply *job(struct cli *cli, const char *op, const char *buf, int fd,
			      void (*more)(struct mp_map *req, const struct cli *cli))
{
	struct gpuq_reply *r = NULL;
	struct mp_map req;
	if (cli_begin(cli, &req, op) != 0)
		return NULL;
	mp_put_str(&req, op[0] == 'a' ? "name" : "buffer", buf);
	mp_put_bool(&req, "wait", true);
	if (more)
		more(&req, cli);
	if (fd >= 0)
		mp_put_u64(&req, "fds", 1);
	if (cli_call(cli, &req, &fd, fd >= 0, &r) != 0)
		return NULL;
	return r;
}

static void alloc_fields(struct mp_map *req, const struct cli *cli)
{
	mp_put_u64(req, "bytes", cli->bytes);
	mp_put_bool(req, "shareable", true);
	if (cli->has_device)
		mp_put_u64(req, "device", cli->device);
}

static void fill_fields(struct mp_map *req, const struct cli *cli)
{
	(void)cli;
	mp_put_str(req, "pattern", "random");
	mp_put_u64(req, "seed", 12);
}

static void scratch_fields(struct mp_map *req, const struct cli *cli)
{
	(void)cli;
	mp_put_bool(req, "scratch", true);
}

static int job_ok(struct cli *cli, struct gpuq_reply *r, double *seconds)
{
	if (!r)
		return CLI_UNREACHABLE;
	int rc = gpuq_reply_ok(r) ? CLI_OK : cli_report_refusal(r);
	const msgpack_object *rec = gpuq_reply_get(r, "job");
	const msgpack_object *res = rec ? msg_map_get(rec, "result") : NULL;
	if (seconds && res)
		*seconds = field_f64(res, "seconds", 0);
	(void)cli;
	gpuq_reply_free(r);
	return rc;
}

/* gpuqd's own account of the buffer's first 8 bytes: a get of them into a memfd. */
static int first_bytes(struct cli *cli, const char *name, uint64_t *first)
{
	char ref[96];
	int fd = memfd_create("gpuq-bench-attach", MFD_CLOEXEC);
	if (fd < 0)
		return CLI_REFUSED;
	snprintf(ref, sizeof ref, "%s[0:8]", name);
	int rc = job_ok(cli, job(cli, "get", ref, fd, NULL), NULL);
	if (rc == CLI_OK && pread(fd, first, sizeof *first, 0) != (ssize_t)sizeof *first)
		rc = CLI_REFUSED;
	close(fd);
	return rc;
}

struct attach_results {
	double cold_s, warm_s, import_s, copy_s, get_s;
	double use_s, attach_release_s; /* a use of a kept attachment; an attach and release */
	bool same;
};

/* One use of a kept revocable attachment: its time, or -1 and err (the lease had ended, say). */
static double kept_use(struct gpuq_attachment *a, struct gpuq_error *err)
{
	double start = bench_now();
	int rc = gpuq_attachment_begin_use(a, err);
	if (rc == 0)
		gpuq_fail(err, GPUQ_E_INTERNAL, "the kept lease ended while nothing wanted the buffer");
	if (rc != 1 || gpuq_attachment_end_use(a, err) < 0)
		return -1;
	return bench_now() - start;
}

/* One attach and release of buf: its time, or -1. */
static double attach_release(struct gpuq_client *c, const char *buf, struct gpuq_error *err)
{
	struct gpuq_attachment a;
	double start = bench_now();
	if (gpuq_buffer_attach(c, buf, false, &a, err) < 0 || gpuq_buffer_release(c, &a, err) < 0)
		return -1;
	return bench_now() - start;
}

/*
 * Uses of buf through a revocable attachment kept between them, beside an
 * attach and release per use, on a connection of their own (the driver warm
 * from the first attach). Nothing else wants the buffer meanwhile, so every
 * use must find the lease alive.
 */
static int measure_kept(const struct cli *cli, const char *buf, struct attach_results *res)
{
	double use[KEPT_USES], per_use[KEPT_USES];
	struct gpuq_client *c = NULL;
	struct gpuq_attachment kept;
	struct gpuq_error err;
	int rc = gpuq_connect(cli->socket, &c, &err);
	if (rc == 0 && (rc = gpuq_buffer_attach_revocable(c, buf, false, &kept, &err)) == 0) {
		rc = gpuq_attachment_end_use(&kept, &err);
		for (int i = 0; rc == 0 && i < KEPT_USES; i++)
			if ((use[i] = kept_use(&kept, &err)) < 0)
				rc = -1;
		for (int i = 0; rc == 0 && i < KEPT_USES; i++)
			if ((per_use[i] = attach_release(c, buf, &err)) < 0)
				rc = -1;
		rc = release(c, &kept, rc, &err);
	}
	if (rc == 0) {
		res->use_s = bench_median(use, KEPT_USES);
		res->attach_release_s = bench_median(per_use, KEPT_USES);
	}
	if (c)
		gpuq_close(c);
	if (rc < 0)
		fprintf(stderr, "gpuq bench attach: kept attachment: %s\n", err.message);
	return rc < 0 ? CLI_REFUSED : CLI_OK;
}

static void print_results(struct cli *cli, const struct attach_results *res, int rounds)
{
	char size[32];
	FILE *f = cli->out;
	double gib = (double)cli->bytes / 1e9;
	human_bytes(size, sizeof size, cli->bytes, 1);
	fprintf(f, "attach of a %s resident buffer by a new process (medians of %d):\n", size, rounds);
	fprintf(f, "  %-44s %9.2f ms\n", "new process: connect, attach, first 8 bytes", res->cold_s * 1e3);
	fprintf(f, "  %-44s %9.2f ms  (import and map %.2f ms)\n", "attach and first 8 bytes, driver warm",
		res->warm_s * 1e3, res->import_s * 1e3);
	fprintf(f, "  %-44s %9.2f ms  %7.2f GB/s\n", "gpuq get to scratch: (the staged pipeline)",
		res->get_s * 1e3, res->get_s > 0 ? gib / res->get_s : 0);
	fprintf(f, "  %-44s %9.2f ms  %7.2f GB/s\n", "cudaMemcpy into pinned memory (baseline)",
		res->copy_s * 1e3, res->copy_s > 0 ? gib / res->copy_s : 0);
	fprintf(f, "  attach is %.0fx faster than get, %.0fx faster than the copy; bytes %s gpuqd's\n",
		res->warm_s > 0 ? res->get_s / res->warm_s : 0,
		res->warm_s > 0 ? res->copy_s / res->warm_s : 0, res->same ? "match" : "DIFFER from");
	fprintf(f, "  target: attach and first byte <= %.0f ms (driver warm): %s\n",
		ATTACH_TARGET_S * 1e3, res->warm_s <= ATTACH_TARGET_S && res->same ? "met" : "MISSED");
	fprintf(f, "  %-44s %9.4f ms  (an attach and release per use %.3f ms)\n",
		"a use of a kept attachment (revocable lease)", res->use_s * 1e3,
		res->attach_release_s * 1e3);
}

/* The same figures as print_results, for --json (and `python -m gpuq plot`). */
static void print_json(const struct cli *cli, const struct attach_results *res, int rounds)
{
	double gb = (double)cli->bytes / 1e9;
	fprintf(cli->json_out, "{\"bench\":\"attach\",\"bytes\":%" PRIu64 ",\"rounds\":%d,\"cold_ms\":%.3f,"
	       "\"warm_ms\":%.3f,\"import_ms\":%.3f,\"get_ms\":%.3f,\"get_gbps\":%.3f,"
	       "\"copy_ms\":%.3f,\"copy_gbps\":%.3f,\"bytes_match\":%s,\"target_ms\":%.0f,"
	       "\"met\":%s,\"kept_use_ms\":%.4f,\"attach_release_ms\":%.3f}\n",
	       cli->bytes, rounds, res->cold_s * 1e3, res->warm_s * 1e3, res->import_s * 1e3,
	       res->get_s * 1e3, res->get_s > 0 ? gb / res->get_s : 0, res->copy_s * 1e3,
	       res->copy_s > 0 ? gb / res->copy_s : 0, res->same ? "true" : "false",
	       ATTACH_TARGET_S * 1e3, res->warm_s <= ATTACH_TARGET_S && res->same ? "true" : "false",
	       res->use_s * 1e3, res->attach_release_s * 1e3);
}

static int measure(struct cli *cli, const char *name, int rounds, struct attach_results *res)
{
	double cold[ATTACH_MAX_ROUNDS], warm[ATTACH_MAX_ROUNDS], import[ATTACH_MAX_ROUNDS];
	uint64_t expected = 0;
	int rc = first_bytes(cli, name, &expected);
	res->same = true;
	for (int i = 0; rc == CLI_OK && i < rounds; i++) {
		struct attach_sample s;
		if (run_round(cli, name, i == rounds - 1, &s) < 0 || !s.ok) {
			fprintf(stderr, "gpuq bench attach: round %d: %s\n", i + 1,
				s.ok ? "the child process failed" : s.error);
			return CLI_REFUSED;
		}
		cold[i] = s.cold_s;
		warm[i] = s.warm_s;
		import[i] = s.import_s;
		res->copy_s = s.copy_s;
		res->same = res->same && s.first == expected;
	}
	if (rc != CLI_OK)
		return rc;
	res->cold_s = bench_median(cold, (unsigned)rounds);
	res->warm_s = bench_median(warm, (unsigned)rounds);
	res->import_s = bench_median(import, (unsigned)rounds);
	rc = job_ok(cli, job(cli, "get", name, -1, scratch_fields), &res->get_s);
	return rc == CLI_OK ? measure_kept(cli, name, res) : rc;
}

/* The default size: 10 GiB on a GPU, 64 MiB in the host backend's arena. */
static int default_bytes(struct cli *cli)
{
	struct gpuq_reply *r;
	struct mp_map req;
	char backend[16];
	int rc = cli_begin(cli, &req, "ping");
	if (rc || (rc = cli_call(cli, &req, NULL, 0, &r)))
		return rc;
	field_str(r->root, "backend", backend, sizeof backend, "cuda");
	cli->bytes = strcmp(backend, "host") == 0 ? 64ull << 20 : 10ull << 30;
	gpuq_reply_free(r);
	return 0;
}

int bench_attach(struct cli *cli)
{
	struct attach_results res;
	char name[64];
	int rounds = cli->has_requests ? (int)cli->requests : 5;
	if (rounds < 1 || rounds > ATTACH_MAX_ROUNDS)
		return cli_usage(cli, "--requests: 1 to %d rounds", ATTACH_MAX_ROUNDS);
	int rc = cli->has_bytes ? 0 : default_bytes(cli);
	if (rc)
		return rc;
	memset(&res, 0, sizeof res);
	snprintf(name, sizeof name, "gpuq-bench-attach-%d", (int)getpid());
	rc = job_ok(cli, job(cli, "alloc", name, -1, alloc_fields), NULL);
	if (rc)
		return rc;
	rc = job_ok(cli, job(cli, "fill", name, -1, fill_fields), NULL);
	if (rc == CLI_OK)
		rc = measure(cli, name, rounds, &res);
	int freed = job_ok(cli, job(cli, "free", name, -1, NULL), NULL);
	if (rc == CLI_OK && cli->json_out)
		print_json(cli, &res, rounds);
	if (rc == CLI_OK && !cli->json)
		print_results(cli, &res, rounds);
	return rc ? rc : freed;
}
