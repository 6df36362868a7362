/*
 * The soak: SOAK_CLIENTS processes of uid 65534 run mixed jobs (fills, puts
 * from memfds and pipes, gets with verify, checksums, copies, noops, waits
 * with progress, disconnects, frees and allocs, ephemeral buffers) while the
 * test SIGKILLs one every few tens of milliseconds and restarts it, and
 * sends gpuqd SIGHUP twice a second. It runs GPUQ_SOAK_SECONDS (default 4;
 * make gpu-check's extended mode runs 300 on the GPU) after a warm-up of a
 * quarter of that (1 to 30 s), and checks at the end of each: every client exited
 * cleanly or was killed by the test, no client saw a wrong byte, every
 * surviving buffer holds what its slot says it may (an ephemeral one none
 * at all), and, once every buffer is freed, gpuqd holds exactly the
 * descriptors it held after the warm-up and not much more memory. The
 * daemon must still answer.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/integration/soak.h"

static double now_seconds(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static pid_t spawn_client(struct soak_shared *sh, int k, unsigned seed)
{
	pid_t pid = fork();
	CHECKF(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		signal(SIGALRM, SIG_DFL);
		CHECK(setgid(NOGROUP) == 0 && setuid(SOAK_UID) == 0);
		soak_client(sh, k, seed);
	}
	return pid;
}

/* A client that ended: exited 0, or killed by the test; anything else is a failure. */
static void reap(struct soak_shared *sh, pid_t pid, bool killed_by_us)
{
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return;
	if (killed_by_us && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
		return;
	soak_fail(sh, "a client ended with status 0x%x", status);
}

struct phase_counts {
	unsigned kills, hups;
};

/* Runs the clients for `seconds`, killing and restarting them, then stops them all. */
static void run_phase(struct soak_shared *sh, const struct daemon_proc *d, double seconds,
		      unsigned seed, struct phase_counts *n)
{
	pid_t pids[SOAK_CLIENTS];
	atomic_store(&sh->stop, 0);
	for (int k = 0; k < SOAK_CLIENTS; k++)
		pids[k] = spawn_client(sh, k, seed + (unsigned)k);
	double end = now_seconds() + seconds, next_hup = now_seconds() + 0.5;
	uint64_t r = seed;
	while (now_seconds() < end) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		usleep((useconds_t)(10000 + (r >> 33) % 50000));
		int k = (int)((r >> 40) % SOAK_CLIENTS);
		kill(pids[k], SIGKILL);
		reap(sh, pids[k], true);
		pids[k] = spawn_client(sh, k, (unsigned)(r >> 16));
		n->kills++;
		if (now_seconds() >= next_hup) {
			kill(d->pid, SIGHUP);
			n->hups++;
			next_hup += 0.5;
		}
	}
	atomic_store(&sh->stop, 1);
	for (int k = 0; k < SOAK_CLIENTS; k++)
		reap(sh, pids[k], false);
}

/* A root request naming a soak buffer: buffer NAME@DEV with owner 65534. */
static struct gpuq_reply *on_soak_buffer(struct gpuq_client *c, const char *op, const char *name,
					 int device)
{
	struct mp_map req;
	char ref[32];
	gpuq_request_begin(c, &req, op);
	snprintf(ref, sizeof ref, "%s@%d", name, device);
	mp_put_str(&req, "buffer", ref);
	mp_put_u64(&req, "owner", SOAK_UID);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

/* The soak buffers that exist now: for each slot, whether its name is there (and its device). */
static unsigned list_soak_buffers(struct gpuq_client *c, int *device_of)
{
	struct mp_map req;
	unsigned n = 0;
	for (int i = 0; i < SOAK_CLIENTS * SOAK_SLOTS; i++)
		device_of[i] = -1;
	gpuq_request_begin(c, &req, "buffers");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	const msgpack_object *list = reply_path(r, "buffers");
	for (uint32_t i = 0; list && i < list->via.array.size; i++) {
		const msgpack_object *b = &list->via.array.ptr[i];
		const msgpack_object *name = msg_map_get(b, "name"), *dev = msg_map_get(b, "device");
		int k, j;
		char text[32];
		snprintf(text, sizeof text, "%.*s", (int)name->via.str.size, name->via.str.ptr);
		if (sscanf(text, "c%db%d", &k, &j) != 2 || k < 0 || k >= SOAK_CLIENTS || j < 0 ||
		    j >= SOAK_SLOTS)
			continue;
		device_of[k * SOAK_SLOTS + j] = (int)dev->via.i64;
		n++;
	}
	gpuq_reply_free(r);
	return n;
}

/* Checks one slot against what exists, as the test sees it once every client is gone. */
static void verify_slot(struct soak_shared *sh, struct gpuq_client *c, const struct soak_slot *s,
			int device)
{
	int state = atomic_load(&s->state);
	bool exists = device >= 0;
	if (s->ephemeral && state != SLOT_NONE && exists)
		soak_fail(sh, "ephemeral buffer %s survived every connection", s->name);
	if (s->ephemeral || state == SLOT_ALLOCATING || state == SLOT_FREEING)
		return;
	if (exists != (state != SLOT_NONE)) {
		soak_fail(sh, "buffer %s %s, but its slot says %d", s->name,
			  exists ? "exists" : "is gone", state);
		return;
	}
	if (!exists)
		return;
	struct gpuq_reply *r = on_soak_buffer(c, "checksum", s->name, device);
	expect_ok(r, "checksum of a soak buffer");
	uint64_t sum = reply_u64(r, "job.result.checksum");
	gpuq_reply_free(r);
	if ((state == SLOT_STABLE && sum != s->expected) ||
	    (state == SLOT_PENDING && sum != s->expected && sum != s->pending))
		soak_fail(sh, "buffer %s hashes to %016llx; its slot (state %d) allows %016llx / %016llx",
			  s->name, (unsigned long long)sum, state, (unsigned long long)s->expected,
			  (unsigned long long)s->pending);
}

/*
 * Once the clients are gone: waits for every job to end (and ephemeral
 * buffers to go), checks every slot, then frees every soak buffer and
 * forgets the slots, so that the next phase starts from nothing.
 */
static void settle(struct soak_shared *sh, struct gpuq_client *c)
{
	int device_of[SOAK_CLIENTS * SOAK_SLOTS];
	CHECKF(soak_wait_quiet(c, NULL), "jobs still running 20 s after the clients stopped");
	for (int i = 0; i < 300; i++) { /* ephemeral buffers go at the next tick at the latest */
		bool ephemeral_left = false;
		list_soak_buffers(c, device_of);
		for (int k = 0; k < SOAK_CLIENTS * SOAK_SLOTS; k++)
			ephemeral_left |= device_of[k] >= 0 && sh->slots[k / SOAK_SLOTS][k % SOAK_SLOTS].ephemeral;
		if (!ephemeral_left)
			break;
		usleep(10000);
	}
	for (int k = 0; k < SOAK_CLIENTS * SOAK_SLOTS; k++)
		verify_slot(sh, c, &sh->slots[k / SOAK_SLOTS][k % SOAK_SLOTS], device_of[k]);
	for (int k = 0; k < SOAK_CLIENTS * SOAK_SLOTS; k++) {
		struct soak_slot *s = &sh->slots[k / SOAK_SLOTS][k % SOAK_SLOTS];
		if (device_of[k] >= 0) {
			struct gpuq_reply *r = on_soak_buffer(c, "free", s->name, device_of[k]);
			expect_ok(r, "freeing a soak buffer");
			gpuq_reply_free(r);
		}
		memset(s, 0, sizeof *s);
	}
	CHECK(soak_wait_quiet(c, NULL));
}

/* The daemon's open descriptors and resident memory (kB), from /proc. */
static void measure(const struct daemon_proc *d, unsigned *fds, unsigned long *rss_kb)
{
	char path[64], line[256];
	*fds = daemon_fd_count(d);
	snprintf(path, sizeof path, "/proc/%d/status", (int)d->pid);
	FILE *f = fopen(path, "r");
	CHECK(f);
	*rss_kb = 0;
	while (fgets(line, sizeof line, f))
		sscanf(line, "VmRSS: %lu kB", rss_kb);
	fclose(f);
}

static bool sanitizer_build(void)
{
	const char *b = getenv("GPUQ_BUILD");
	return b && (strstr(b, "asan") || strstr(b, "tsan"));
}

static unsigned total_ops(const struct soak_shared *sh)
{
	unsigned n = 0;
	for (int i = 0; i < OP_COUNT; i++)
		n += atomic_load(&sh->ops[i]);
	return n;
}

TEST(soak_killed_and_reconnecting_clients_lose_nothing_and_leak_nothing)
{
	if (geteuid() != 0)
		SKIP("needs root to run the clients as uid %d", SOAK_UID);
	const char *env = getenv("GPUQ_SOAK_SECONDS");
	double seconds = env && atof(env) > 0 ? atof(env) : 4;
	double warm = seconds / 4 < 1 ? 1 : seconds / 4 > 30 ? 30 : seconds / 4;
	alarm((unsigned)(seconds * 2) + 120);
	struct daemon_proc d;
	daemon_start(&d, "--socket-group", "nogroup", "--job-history", "2000",
		     "--transfer-idle-timeout", "5000", NULL);
	struct soak_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
				      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED);
	memset(sh, 0, sizeof *sh);
	sh->d = &d;
	struct gpuq_client *root = client_open(&d);
	sh->devices = device_count(root);
	struct phase_counts n = { 0, 0 };
	unsigned fds0, fds1;
	unsigned long rss0, rss1;
	run_phase(sh, &d, warm, 1, &n);
	settle(sh, root);
	measure(&d, &fds0, &rss0);
	unsigned warm_ops = total_ops(sh);
	run_phase(sh, &d, seconds, 1000, &n);
	settle(sh, root);
	measure(&d, &fds1, &rss1);
	fprintf(stderr, "    soak: %.0f s (and %.0f s of warm-up), %d clients, %u ops, %u kills, %u SIGHUPs, "
		"%u recoveries; gpuqd: %u -> %u descriptors, %lu -> %lu kB resident\n",
		seconds, warm, SOAK_CLIENTS, total_ops(sh), n.kills, n.hups,
		atomic_load(&sh->recoveries), fds0, fds1, rss0, rss1);
	CHECKF(atomic_load(&sh->errors) == 0, "%u failures; the first: %s", atomic_load(&sh->errors),
	       sh->first_error);
	CHECKF(total_ops(sh) - warm_ops >= SOAK_CLIENTS && n.kills > 0,
	       "the soak did too little to mean anything (%u ops, %u kills)", total_ops(sh) - warm_ops,
	       n.kills);
	CHECKF(fds1 == fds0, "gpuqd holds %u descriptors after the soak, %u before", fds1, fds0);
	CHECKF(sanitizer_build() || rss1 <= rss0 + (rss0 / 4 > 65536 ? rss0 / 4 : 65536),
	       "gpuqd grew from %lu to %lu kB resident", rss0, rss1);
	CHECK(device_count(root) == sh->devices); /* it still answers */
	gpuq_close(root);
	munmap(sh, sizeof *sh);
	daemon_stop(&d);
}
