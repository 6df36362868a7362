/*
 * gpuq bench restart: gpuqd re-executing itself with many buffers resident
 * (daemon/restart.c). N buffers of mixed sizes (SIZE in all) are filled
 * and checksummed; then `restart`, and the time from the request to the
 * first job served again (a noop, retried while the drain refuses it with
 * `restarted`), and to every buffer's checksum verified. The device's
 * memory in use before and after says that nothing was copied. Beside it,
 * what the restart saves: the time to put every buffer's bytes again from
 * a file in the page cache. Needs root or the admin group (restart is theirs).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/cli/cli.h"

#define RESTART_MAX_BUFFERS 100000
#define RESTART_AIM_S 1.5

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A waited job on buffer name with extra fields; CLI_OK, or the refusal reported. *code gets its error code. */
static int restart_job(struct cli *cli, const char *op, const char *name, uint64_t a, uint64_t *sum,
		       enum gpuq_errc *code)
{
	struct gpuq_reply *r;
	struct mp_map req;
	int rc = cli_begin(cli, &req, op);
	if (rc)
		return rc;
	if (strcmp(op, "noop") != 0)
		mp_put_str(&req, strcmp(op, "alloc") == 0 ? "name" : "buffer", name);
	mp_put_bool(&req, "wait", true);
	if (cli->has_device)
		mp_put_u64(&req, "device", cli->device);
	if (strcmp(op, "alloc") == 0)
		mp_put_u64(&req, "bytes", a);
	if (strcmp(op, "fill") == 0) {
		mp_put_str(&req, "pattern", "random");
		mp_put_u64(&req, "seed", a);
	}
	if ((rc = cli_call(cli, &req, NULL, 0, &r)) != 0)
		return rc;
	if (code) {
		struct gpuq_error err = { .code = GPUQ_OK };
		if (!gpuq_reply_ok(r))
			gpuq_reply_error(r, &err);
		*code = err.code;
	}
	if (gpuq_reply_ok(r) && sum) {
		const msgpack_object *job = gpuq_reply_get(r, "job");
		const msgpack_object *res = job ? msg_map_get(job, "result") : NULL;
		*sum = res ? field_u64(res, "checksum", 0) : 0;
	}
	rc = gpuq_reply_ok(r) ? CLI_OK : (code ? CLI_REFUSED : cli_report_refusal(r));
	gpuq_reply_free(r);
	return rc;
}

/*
 * The i-th of n buffers' size: the first four (where n > 8) take 16% of
 * total each (16 GiB of 100 GiB), the rest share what is left in a cycle
 * of 1, 4, 16 and 64 parts (1.7 MiB to 111 MiB of 100 GiB in 1000
 * buffers); 4 KiB-aligned.
 */
static uint64_t restart_size(uint64_t total, unsigned n, unsigned i)
{
	static const unsigned parts[] = { 1, 4, 16, 64 };
	unsigned big = n > 8 ? 4 : 0;
	uint64_t size, sum = 0;
	if (i < big) {
		size = total / 100 * 16;
	} else {
		for (unsigned k = big; k < n; k++)
			sum += parts[(k - big) % 4];
		size = (total - total / 100 * 16 * big) / sum * parts[(i - big) % 4];
	}
	size = size / 4096 * 4096;
	return size ? size : 4096;
}

/* ping's backend and restart count. */
static int restart_ping(struct cli *cli, char *backend, size_t n, uint64_t *restarts)
{
	struct gpuq_reply *r;
	struct mp_map req;
	int rc = cli_begin(cli, &req, "ping");
	if (rc || (rc = cli_call(cli, &req, NULL, 0, &r)))
		return rc;
	if (backend)
		field_str(r->root, "backend", backend, n, "cuda");
	*restarts = field_u64(r->root, "restarts", 0);
	gpuq_reply_free(r);
	return 0;
}

/* The device's memory in use (total - free), from `devices`. */
static uint64_t restart_used(struct cli *cli)
{
	struct gpuq_reply *r;
	struct mp_map req;
	uint64_t used = 0, dev = cli->has_device ? cli->device : 0;
	if (cli_begin(cli, &req, "devices") || cli_call(cli, &req, NULL, 0, &r))
		return 0;
	const msgpack_object *list = field_array(r->root, "devices");
	if (list && dev < list->via.array.size) {
		const msgpack_object *d = &list->via.array.ptr[dev];
		used = field_u64(d, "mem_total", 0) - field_u64(d, "mem_free", 0);
	}
	gpuq_reply_free(r);
	return used;
}

struct restart_result {
	unsigned buffers;
	uint64_t bytes, used_before, used_after;
	double serving_s, verified_s;
	unsigned mismatched;
	double reload_s; /* every buffer put again from a file in the page cache; 0: not measured */
	char reload_skipped[160];
};

/* The restart itself: the request, the first job served, every checksum verified. */
static int restart_measure(struct cli *cli, const char *prefix, const uint64_t *sums,
			   struct restart_result *res)
{
	struct gpuq_reply *r;
	struct mp_map req;
	char name[96];
	enum gpuq_errc code = GPUQ_OK;
	res->used_before = restart_used(cli);
	double t0 = now_s();
	int rc = cli_begin(cli, &req, "restart");
	if (rc || (rc = cli_call(cli, &req, NULL, 0, &r)))
		return rc;
	rc = gpuq_reply_ok(r) ? CLI_OK : cli_report_refusal(r);
	gpuq_reply_free(r);
	if (rc)
		return rc;
	do /* refused with `restarted` while the old image drains; served by the new one */
		rc = restart_job(cli, "noop", NULL, 0, NULL, &code);
	while (rc == CLI_REFUSED && code == GPUQ_E_RESTARTED);
	if (rc)
		return rc;
	res->serving_s = now_s() - t0;
	for (unsigned i = 0; i < res->buffers && rc == CLI_OK; i++) {
		uint64_t sum = 0;
		snprintf(name, sizeof name, "%s-%u", prefix, i);
		rc = restart_job(cli, "checksum", name, 0, &sum, NULL);
		res->mismatched += rc == CLI_OK && sum != sums[i];
	}
	res->verified_s = now_s() - t0;
	res->used_after = restart_used(cli);
	return rc;
}

/* One waited put of the first bytes of fd (from its start) into buffer name. */
static int restart_put(struct cli *cli, const char *name, int fd, uint64_t bytes)
{
	struct gpuq_reply *r;
	struct mp_map req;
	if (lseek(fd, 0, SEEK_SET) != 0)
		return cli_usage(cli, "reload: lseek: %s", strerror(errno));
	int rc = cli_begin(cli, &req, "put");
	if (rc)
		return rc;
	mp_put_str(&req, "buffer", name);
	mp_put_u64(&req, "length", bytes);
	mp_put_u64(&req, "fds", 1);
	mp_put_bool(&req, "wait", true);
	if ((rc = cli_call(cli, &req, &fd, 1, &r)) != 0)
		return rc;
	rc = gpuq_reply_ok(r) ? CLI_OK : cli_report_refusal(r);
	gpuq_reply_free(r);
	return rc;
}

/* A file of bytes in TMPDIR (or /var/tmp), unlinked, written so that its pages are in the page cache; -1 with why. */
static int restart_cached_file(uint64_t bytes, char *why, size_t n)
{
	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp";
	char path[512];
	static char chunk[8 << 20];
	snprintf(path, sizeof path, "%s/gpuq-bench-reload-XXXXXX", dir);
	int fd = mkstemp(path);
	if (fd < 0) {
		snprintf(why, n, "cannot make a file in %s: %s", dir, strerror(errno));
		return -1;
	}
	unlink(path);
	memset(chunk, 0x5a, sizeof chunk);
	for (uint64_t off = 0; off < bytes;) {
		size_t len = bytes - off < sizeof chunk ? (size_t)(bytes - off) : sizeof chunk;
		ssize_t w = pwrite(fd, chunk, len, (off_t)off);
		if (w <= 0) {
			snprintf(why, n, "writing %" PRIu64 " bytes into a file in %s: %s", bytes, dir,
				 w < 0 ? strerror(errno) : "no progress");
			close(fd);
			return -1;
		}
		off += (uint64_t)w;
	}
	return fd;
}

/*
 * What the restart saves: every buffer put again from a file whose pages
 * are in the page cache (one put per buffer, as a client reloading its
 * data would), timed. A host without room for the file skips it, saying why.
 */
static int restart_reload(struct cli *cli, const char *prefix, uint64_t total,
			  struct restart_result *res)
{
	char name[96];
	uint64_t largest = 0;
	for (unsigned i = 0; i < res->buffers; i++) {
		uint64_t b = restart_size(total, res->buffers, i);
		largest = b > largest ? b : largest;
	}
	int fd = restart_cached_file(largest, res->reload_skipped, sizeof res->reload_skipped);
	if (fd < 0)
		return CLI_OK;
	int rc = CLI_OK;
	double t0 = now_s();
	for (unsigned i = 0; i < res->buffers && rc == CLI_OK; i++) {
		snprintf(name, sizeof name, "%s-%u", prefix, i);
		rc = restart_put(cli, name, fd, restart_size(total, res->buffers, i));
	}
	res->reload_s = now_s() - t0;
	close(fd);
	return rc;
}

static void restart_print(struct cli *cli, const struct restart_result *res, uint64_t restarts)
{
	char size[32], before[32], after[32];
	if (cli->json_out)
		fprintf(cli->json_out,
			"{\"bench\":\"restart\",\"buffers\":%u,\"bytes\":%" PRIu64 ",\"serving_s\":%.4f,"
			"\"verified_s\":%.4f,\"mismatched\":%u,\"used_before\":%" PRIu64
			",\"used_after\":%" PRIu64 ",\"restarts\":%" PRIu64 ",\"reload_s\":%.4f}\n",
			res->buffers, res->bytes, res->serving_s, res->verified_s, res->mismatched,
			res->used_before, res->used_after, restarts, res->reload_s);
	if (cli->json)
		return;
	printf("restart with %u buffers, %s resident (restart %" PRIu64 ")\n", res->buffers,
	       human_bytes(size, sizeof size, res->bytes, 0), restarts);
	printf("  to the first job served:      %8.3f s  (aim < %.1f s: %s)\n", res->serving_s,
	       RESTART_AIM_S, res->serving_s < RESTART_AIM_S ? "met" : "MISSED");
	printf("  to every checksum verified:   %8.3f s  (%u of %u differ)\n", res->verified_s,
	       res->mismatched, res->buffers);
	printf("  device memory in use:         %s before, %s after (nothing copied: the same)\n",
	       human_bytes(before, sizeof before, res->used_before, 0),
	       human_bytes(after, sizeof after, res->used_after, 0));
	if (res->reload_s > 0)
		printf("  reloading them instead, put from the page cache: %.3f s  (%.1f GB/s: %.1fx "
		       "the restart's time to serving)\n",
		       res->reload_s, (double)res->bytes / res->reload_s / 1e9,
		       res->reload_s / res->serving_s);
	else
		printf("  reloading them instead, put from the page cache: not measured (%s)\n",
		       res->reload_skipped);
}

/* Allocates, fills and checksums the buffers; on a failure res->buffers says how many to free. */
static int restart_setup(struct cli *cli, const char *prefix, uint64_t total, uint64_t *sums,
			 struct restart_result *res)
{
	char name[96];
	int rc = CLI_OK;
	for (unsigned i = 0; i < res->buffers && rc == CLI_OK; i++) {
		uint64_t bytes = restart_size(total, res->buffers, i);
		snprintf(name, sizeof name, "%s-%u", prefix, i);
		rc = restart_job(cli, "alloc", name, bytes, NULL, NULL);
		if (rc == CLI_OK) {
			res->bytes += bytes;
			rc = restart_job(cli, "fill", name, i + 1, NULL, NULL);
		}
		if (rc == CLI_OK)
			rc = restart_job(cli, "checksum", name, 0, &sums[i], NULL);
		if (rc != CLI_OK)
			res->buffers = i + 1; /* what the teardown frees */
	}
	return rc;
}

int bench_restart(struct cli *cli)
{
	struct restart_result res;
	char prefix[64], backend[16], name[96];
	uint64_t restarts = 0;
	memset(&res, 0, sizeof res);
	int rc = restart_ping(cli, backend, sizeof backend, &restarts);
	if (rc)
		return rc;
	bool host = strcmp(backend, "host") == 0;
	uint64_t total = cli->has_bytes ? cli->bytes : host ? 256ull << 20 : 100ull << 30;
	res.buffers = cli->has_requests ? (unsigned)cli->requests : host ? 64 : 1000;
	if (res.buffers < 1 || res.buffers > RESTART_MAX_BUFFERS)
		return cli_usage(cli, "--requests: 1 to %d buffers", RESTART_MAX_BUFFERS);
	uint64_t *sums = calloc(res.buffers, sizeof *sums);
	if (!sums)
		return cli_usage(cli, "no memory for %u checksums", res.buffers);
	snprintf(prefix, sizeof prefix, "gpuq-bench-restart-%d", (int)getpid());
	rc = restart_setup(cli, prefix, total, sums, &res);
	if (rc == CLI_OK)
		rc = restart_measure(cli, prefix, sums, &res);
	if (rc == CLI_OK)
		rc = restart_reload(cli, prefix, total, &res);
	if (rc == CLI_OK)
		rc = restart_ping(cli, NULL, 0, &restarts);
	for (unsigned i = 0; i < res.buffers; i++) {
		snprintf(name, sizeof name, "%s-%u", prefix, i);
		restart_job(cli, "free", name, 0, NULL, NULL);
	}
	free(sums);
	if (rc == CLI_OK)
		restart_print(cli, &res, restarts);
	return rc == CLI_OK && res.mismatched ? CLI_REFUSED : rc;
}
