/*
 * Attaching gpuq buffers from client processes, on a GPU (make gpu-check,
 * through tests/gpu/attach.sh, which starts a private gpuqd on the CUDA
 * backend). This process only talks to gpuqd; every CUDA call is made in
 * the child processes it forks, each a fresh client, as worker processes
 * would be:
 *
 *   1. a 1 GiB shareable buffer, filled with random bytes by a daemon job;
 *   2. child A attaches it read-write, checks that it sees the daemon's
 *      bytes (gpuq's checksum of its copy equals the daemon's checksum),
 *      and says so; meanwhile a daemon checksum job waits behind A's lease
 *      (waiting_reason lease). A runs its own kernel on the buffer, copies
 *      the result back, synchronizes and releases; the daemon's checksum
 *      then equals the checksum A computed of what it wrote, and A's
 *      bytes equal the transform applied on the host, word for word;
 *   3. children B and C attach it read-only, C while B holds its lease;
 *      both see the same bytes, and a daemon checksum runs while both hold
 *      their read leases, while a daemon fill waits behind them;
 *   4. attach times (the import and mapping after gpuqd's answer) are
 *      printed: each child's first CUDA work, so they include creating
 *      its CUDA context; the 50 ms target is for an attach in a process
 *      whose driver is warm, which gpuq bench attach measures.
 *
 *   attach_selftest SOCKET    ends with "N passed, N failed"; exits 1 on a failure.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "client/lib/gpuq.h"
#include "workers/backend/host_patterns.h"

#define BYTES (1ull << 30)
#define NAME "attach-selftest"

cudaError_t attach_test_bump(uint32_t *words, size_t n);

static int passed, failed;

static void check(bool ok, const char *what)
{
	printf("%s %s\n", ok ? "ok  " : "FAIL", what);
	fflush(stdout);
	if (ok)
		passed++;
	else
		failed++;
}

static struct gpuq_client *connect_to(const char *sock)
{
	struct gpuq_client *c;
	struct gpuq_error err;
	if (gpuq_connect(sock, &c, &err) < 0) {
		fprintf(stderr, "connect %s: %s\n", sock, err.message);
		exit(2);
	}
	return c;
}

/* A daemon job on the buffer; wait: its reply; else its id (and NULL). */
static struct gpuq_reply *job(struct gpuq_client *c, const char *op, bool wait, uint64_t *id)
{
	struct gpuq_reply *r;
	struct mp_map req;
	struct gpuq_error err;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, op[0] == 'a' ? "name" : "buffer", NAME);
	if (op[0] == 'a') {
		mp_put_u64(&req, "bytes", BYTES);
		mp_put_bool(&req, "shareable", true);
	} else if (op[0] == 'f' && op[1] == 'i') {
		mp_put_str(&req, "pattern", "random");
		mp_put_u64(&req, "seed", 21);
	}
	mp_put_bool(&req, "wait", wait);
	if (gpuq_call(c, &req, NULL, 0, &r, &err) < 0 || !gpuq_reply_ok(r)) {
		if (r)
			gpuq_reply_error(r, &err);
		fprintf(stderr, "%s: %s\n", op, err.message);
		exit(2);
	}
	const msgpack_object *rec = gpuq_reply_get(r, "job");
	if (id && rec)
		msg_get_u64(rec, "job", id, &err);
	if (wait)
		return r;
	gpuq_reply_free(r);
	return NULL;
}

static uint64_t daemon_checksum(struct gpuq_client *c)
{
	struct gpuq_error err;
	struct gpuq_reply *r = job(c, "checksum", true, NULL);
	const msgpack_object *res = msg_map_get(msg_map_get(r->root, "job"), "result");
	uint64_t sum = 0;
	msg_get_u64(res, "checksum", &sum, &err);
	gpuq_reply_free(r);
	return sum;
}

static struct gpuq_reply *job_record(struct gpuq_client *c, const char *op, uint64_t id)
{
	struct gpuq_reply *r;
	struct mp_map req;
	struct gpuq_error err;
	gpuq_request_begin(c, &req, op);
	mp_put_u64(&req, "job", id);
	if (gpuq_call(c, &req, NULL, 0, &r, &err) < 0) {
		fprintf(stderr, "%s: %s\n", op, err.message);
		exit(2);
	}
	return r;
}

/* Whether job id waits behind a lease now (looks for up to 2 s). */
static bool waits_behind_lease(struct gpuq_client *c, uint64_t id)
{
	for (int i = 0; i < 200; i++) {
		struct gpuq_reply *r = job_record(c, "status", id);
		char why[32] = "";
		struct gpuq_error err;
		msg_get_str(msg_map_get(r->root, "job"), "waiting_reason", why, sizeof why, &err);
		gpuq_reply_free(r);
		if (strcmp(why, "lease") == 0)
			return true;
		usleep(10000);
	}
	return false;
}

static uint64_t wait_sum(struct gpuq_client *c, uint64_t id, bool *ok)
{
	struct gpuq_reply *r = job_record(c, "wait", id);
	struct gpuq_error err;
	uint64_t sum = 0;
	*ok = gpuq_reply_ok(r);
	msg_get_u64(msg_map_get(msg_map_get(r->root, "job"), "result"), "checksum", &sum, &err);
	gpuq_reply_free(r);
	return sum;
}

/* ---- the children: each a fresh process with its own CUDA context ---- */

struct report {
	int ok;
	char error[600];
	uint64_t seen;    /* gpuq's checksum of the bytes the child saw on attaching */
	uint64_t written; /* A: of the bytes after its kernel */
	bool exact;       /* A: its bytes are the host's transform of what it saw, word for word */
	double import_ms;
};

static int child_fail(struct report *rep, const char *what, const char *why)
{
	snprintf(rep->error, sizeof rep->error, "%s: %s", what, why);
	return -1;
}

/* Copies the attached buffer here and hashes it; the copy is the caller's (NULL on failure). */
static uint32_t *copy_back(const struct gpuq_attachment *a, struct report *rep, uint64_t *sum)
{
	uint32_t *h = malloc(BYTES);
	cudaError_t e = h ? cudaMemcpy(h, a->ptr, BYTES, cudaMemcpyDeviceToHost) : cudaErrorMemoryAllocation;
	if (e != cudaSuccess) {
		child_fail(rep, "cudaMemcpy of the attached buffer", cudaGetErrorString(e));
		free(h);
		return NULL;
	}
	*sum = host_checksum(h, BYTES);
	return h;
}

/* A: read-write, its own kernel, then release. */
static int child_writer(struct gpuq_client *c, int go, int tell, struct report *rep)
{
	struct gpuq_attachment a;
	struct gpuq_error err;
	char byte = 1;
	if (gpuq_buffer_attach(c, NAME, true, &a, &err) < 0)
		return child_fail(rep, "attach read-write", err.message);
	rep->import_ms = a.import_s * 1e3;
	cudaSetDevice(a.cuda_device);
	uint32_t *before = copy_back(&a, rep, &rep->seen);
	if (!before || write(tell, &byte, 1) != 1 || read(go, &byte, 1) != 1)
		return -1;
	cudaError_t e = attach_test_bump(a.ptr, BYTES / 4);
	if (e == cudaSuccess)
		e = cudaDeviceSynchronize();
	if (e != cudaSuccess)
		return child_fail(rep, "the client's kernel", cudaGetErrorString(e));
	uint32_t *after = copy_back(&a, rep, &rep->written);
	if (!after)
		return -1;
	rep->exact = true;
	for (size_t i = 0; i < BYTES / 4 && rep->exact; i++)
		rep->exact = after[i] == before[i] * 2654435761u + (uint32_t)i;
	free(before);
	free(after);
	if (gpuq_buffer_release(c, &a, &err) < 0)
		return child_fail(rep, "release", err.message);
	return 0;
}

/* B and C: read-only, hold until told, then release. */
static int child_reader(struct gpuq_client *c, int go, int tell, struct report *rep)
{
	struct gpuq_attachment a;
	struct gpuq_error err;
	char byte = 1;
	if (gpuq_buffer_attach(c, NAME, false, &a, &err) < 0)
		return child_fail(rep, "attach read-only", err.message);
	rep->import_ms = a.import_s * 1e3;
	cudaSetDevice(a.cuda_device);
	uint32_t *seen = copy_back(&a, rep, &rep->seen);
	free(seen);
	if (!seen || write(tell, &byte, 1) != 1 || read(go, &byte, 1) != 1)
		return -1;
	if (gpuq_buffer_release(c, &a, &err) < 0)
		return child_fail(rep, "release", err.message);
	return 0;
}

struct child {
	pid_t pid;
	int go, told, result; /* parent's ends: tell it to go on, hear it is ready, its report */
};

static struct child spawn(const char *sock, bool writer)
{
	int go[2], told[2], result[2];
	struct child ch;
	if (pipe(go) < 0 || pipe(told) < 0 || pipe(result) < 0)
		exit(2);
	fflush(NULL);
	ch.pid = fork();
	if (ch.pid == 0) {
		struct report rep;
		memset(&rep, 0, sizeof rep);
		struct gpuq_client *c = connect_to(sock);
		int rc = writer ? child_writer(c, go[0], told[1], &rep) : child_reader(c, go[0], told[1], &rep);
		rep.ok = rc == 0;
		char byte = 0;
		if (rc < 0)
			(void)!write(told[1], &byte, 1); /* unblock the parent */
		(void)!write(result[1], &rep, sizeof rep);
		gpuq_close(c);
		_exit(0);
	}
	close(go[0]);
	close(told[1]);
	close(result[1]);
	ch.go = go[1];
	ch.told = told[0];
	ch.result = result[0];
	return ch;
}

static bool ready(struct child *ch)
{
	char byte = 0;
	return read(ch->told, &byte, 1) == 1 && byte == 1;
}

static void finish(struct child *ch, struct report *rep)
{
	char byte = 1;
	(void)!write(ch->go, &byte, 1);
	memset(rep, 0, sizeof *rep);
	if (read(ch->result, rep, sizeof *rep) != (ssize_t)sizeof *rep)
		snprintf(rep->error, sizeof rep->error, "the child process died");
	waitpid(ch->pid, NULL, 0);
	close(ch->go);
	close(ch->told);
	close(ch->result);
	if (!rep->ok)
		fprintf(stderr, "child: %s\n", rep->error);
}

static void writer_round(const char *sock, struct gpuq_client *c, uint64_t filled)
{
	struct report rep;
	uint64_t waiting;
	bool ok;
	struct child a = spawn(sock, true);
	check(ready(&a), "A attached the 1 GiB buffer read-write");
	job(c, "checksum", false, &waiting);
	check(waits_behind_lease(c, waiting), "a daemon checksum waits behind A's lease (waiting_reason lease)");
	finish(&a, &rep);
	check(rep.ok, "A ran its kernel and released");
	check(rep.seen == filled, "A saw the daemon's bytes (checksums equal)");
	check(rep.exact, "A's bytes are its transform of them, word for word");
	uint64_t after = wait_sum(c, waiting, &ok);
	check(ok && after == rep.written, "the daemon's checksum after the release sees A's writes");
	printf("attach (import and map, read-write, a cold process: its CUDA context included): %.2f ms\n",
	       rep.import_ms);
}

static void reader_round(const char *sock, struct gpuq_client *c, uint64_t expected)
{
	struct report rb, rc;
	uint64_t fill;
	struct child b = spawn(sock, false);
	check(ready(&b), "B attached read-only");
	struct child cc = spawn(sock, false);
	check(ready(&cc), "C attached read-only while B holds its read lease");
	check(daemon_checksum(c) == expected, "a daemon checksum runs while both hold read leases");
	job(c, "fill", false, &fill);
	check(waits_behind_lease(c, fill), "a daemon fill waits behind the read leases");
	finish(&b, &rb);
	finish(&cc, &rc);
	check(rb.ok && rc.ok && rb.seen == expected && rc.seen == expected, "B and C saw the same bytes");
	struct gpuq_reply *r = job_record(c, "wait", fill);
	check(gpuq_reply_ok(r), "the fill ran once both released");
	gpuq_reply_free(r);
	printf("attach (import and map, read-only, cold processes): %.2f ms, %.2f ms\n", rb.import_ms,
	       rc.import_ms);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: attach_selftest SOCKET\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN); /* a child that failed early has closed its pipe */
	struct gpuq_client *c = connect_to(argv[1]);
	job(c, "alloc", true, NULL);
	job(c, "fill", true, NULL);
	uint64_t filled = daemon_checksum(c);
	writer_round(argv[1], c, filled);
	reader_round(argv[1], c, daemon_checksum(c));
	gpuq_reply_free(job(c, "free", true, NULL));
	gpuq_close(c);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
