/*
 * One soak client (see soak.h): mixed jobs on its own buffers, each job
 * that changes a buffer announced in the slot before it is sent, every
 * read of a buffer checked against what the slot says it holds. A client
 * that replaces a killed one first settles what its predecessor left:
 * waits for the jobs still on each buffer, checks that the bytes are one of
 * the values the slot allows, and that an ephemeral buffer went with the
 * dead connection.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "protocol/hash.h"
#include "tests/integration/soak.h"
#include "workers/backend/host_patterns.h"

/* The client's state: its connection, its slots, its random numbers. */
struct client {
	struct soak_shared *sh;
	struct gpuq_client *c;
	struct soak_slot *slots;
	uint64_t rng;
	uint64_t conn_tag; /* this connection, unique in the run (pid and reconnections) */
};

static uint64_t next_random(struct client *cl)
{
	cl->rng += GPUQ_GOLDEN;
	return gpuq_mix64(cl->rng);
}

void soak_fail(struct soak_shared *sh, const char *fmt, ...)
{
	atomic_fetch_add(&sh->errors, 1);
	if (atomic_flag_test_and_set(&sh->error_taken))
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(sh->first_error, sizeof sh->first_error, fmt, ap);
	va_end(ap);
}

uint64_t soak_stream_sum(uint32_t bytes, uint64_t seed)
{
	unsigned char *p = malloc(bytes);
	if (!p)
		abort();
	host_fill_random(p, bytes, GPUQ_DTYPE_BYTES, seed);
	uint64_t sum = host_checksum(p, bytes);
	free(p);
	return sum;
}

/* The reply to request id (sent already), or NULL with the failure recorded. */
static struct gpuq_reply *soak_recv(struct client *cl, uint64_t id)
{
	struct gpuq_reply *r;
	struct gpuq_error err;
	if (gpuq_recv(cl->c, id, &r, &err) == 0)
		return r;
	soak_fail(cl->sh, "a client lost its connection: %s: %s", gpuq_errc_name(err.code),
		  err.message);
	return NULL;
}

/* Sends req with fds; its reply, or NULL (recorded). */
static struct gpuq_reply *soak_call(struct client *cl, struct mp_map *req, uint64_t id,
				    const int *fds, int nfds)
{
	struct gpuq_error err;
	if (gpuq_send(cl->c, req, fds, nfds, &err) < 0) {
		soak_fail(cl->sh, "a client could not send: %s", err.message);
		return NULL;
	}
	return soak_recv(cl, id);
}

/* ok; or busy (a full queue: nothing was submitted); anything else is recorded. */
static bool settle_reply(struct client *cl, struct gpuq_reply *r, const char *what, bool *busy)
{
	struct gpuq_error err;
	*busy = false;
	if (!r)
		return false;
	if (gpuq_reply_ok(r))
		return true;
	gpuq_reply_error(r, &err);
	*busy = err.code == GPUQ_E_BUSY;
	if (!*busy)
		soak_fail(cl->sh, "%s failed: %s: %s", what, gpuq_errc_name(err.code), err.message);
	return false;
}

/* A job request on slot s's buffer, waited for unless detached; returns its id. */
static uint64_t begin_job(struct client *cl, struct mp_map *req, const char *op,
			  const struct soak_slot *s, bool detached)
{
	char ref[32];
	uint64_t id = gpuq_request_begin(cl->c, req, op);
	snprintf(ref, sizeof ref, "%s@%d", s->name, s->device);
	mp_put_str(req, "buffer", ref);
	mp_put_bool(req, "wait", !detached);
	return id;
}

static uint64_t begin_on(struct client *cl, struct mp_map *req, const char *op,
			 const struct soak_slot *s)
{
	return begin_job(cl, req, op, s, false);
}

/* A request that only needs to succeed. */
static bool simple_job(struct client *cl, struct mp_map *req, uint64_t id, const char *what)
{
	bool busy;
	struct gpuq_reply *r = soak_call(cl, req, id, NULL, 0);
	bool ok = settle_reply(cl, r, what, &busy);
	gpuq_reply_free(r);
	return ok;
}

/* The buffer's checksum by a job; false (recorded unless busy) when it failed. */
static bool device_sum(struct client *cl, const struct soak_slot *s, uint64_t *sum)
{
	struct mp_map req;
	bool busy;
	uint64_t id = begin_on(cl, &req, "checksum", s);
	struct gpuq_reply *r = soak_call(cl, &req, id, NULL, 0);
	bool ok = settle_reply(cl, r, "checksum", &busy);
	if (ok) {
		const msgpack_object *o = msg_map_get(msg_map_get(gpuq_reply_get(r, "job"), "result"),
						      "checksum");
		*sum = o ? o->via.u64 : 0;
	}
	gpuq_reply_free(r);
	return ok;
}

/*
 * Announces that a job about to be sent writes bytes whose checksum is sum
 * into s: afterwards s holds them or (if the job never ran) what it held;
 * nothing known when it may stop part way or what it held was unknown.
 * Returns the state before.
 */
static int announce(struct soak_slot *s, uint64_t sum, bool may_stop_part_way)
{
	int before = atomic_load(&s->state);
	s->pending = sum;
	atomic_store(&s->state, may_stop_part_way || before == SLOT_UNKNOWN ? SLOT_UNKNOWN
									 : SLOT_PENDING);
	return before;
}

/* After a writing job's reply: it wrote the announced bytes, or (busy) nothing. */
static void settle_write(struct client *cl, struct soak_slot *s, struct gpuq_reply *r,
			 const char *what, int before)
{
	bool busy;
	if (settle_reply(cl, r, what, &busy)) {
		s->expected = s->pending;
		atomic_store(&s->state, SLOT_STABLE);
	} else if (busy) {
		atomic_store(&s->state, before);
	}
	gpuq_reply_free(r);
}

static void op_fill(struct client *cl, struct soak_slot *s)
{
	struct mp_map req;
	uint64_t seed = next_random(cl);
	uint64_t id = begin_on(cl, &req, "fill", s);
	mp_put_str(&req, "pattern", "random");
	mp_put_u64(&req, "seed", seed);
	int before = announce(s, soak_stream_sum(s->bytes, seed), false);
	settle_write(cl, s, soak_call(cl, &req, id, NULL, 0), "fill", before);
}

static void op_put_memfd(struct client *cl, struct soak_slot *s)
{
	struct mp_map req;
	uint64_t seed = next_random(cl);
	int fd = memfd_random(s->bytes, seed);
	uint64_t id = begin_on(cl, &req, "put", s);
	mp_put_u64(&req, "fds", 1);
	mp_put_bool(&req, "progress", true);
	int before = announce(s, soak_stream_sum(s->bytes, seed), false);
	settle_write(cl, s, soak_call(cl, &req, id, &fd, 1), "put from a memfd", before);
	close(fd);
}

static void write_all(int fd, const unsigned char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			abort();
		p += w;
		n -= (size_t)w;
	}
}

/*
 * The bytes go through a pipe the buffer fits in. Fast: all of them before
 * the request, so the put completes whatever becomes of the client. Slow:
 * half, the rest a moment after the request: a kill in between ends the
 * source early and leaves the buffer half written.
 */
static void op_put_pipe(struct client *cl, struct soak_slot *s, bool slow)
{
	struct mp_map req;
	struct gpuq_error err;
	int p[2];
	uint64_t seed = next_random(cl);
	unsigned char *bytes = malloc(s->bytes);
	if (!bytes || pipe(p) < 0)
		abort();
	host_fill_random(bytes, s->bytes, GPUQ_DTYPE_BYTES, seed);
	size_t first = slow ? s->bytes / 2 : s->bytes;
	write_all(p[1], bytes, first);
	if (!slow)
		close(p[1]);
	uint64_t id = begin_on(cl, &req, "put", s);
	mp_put_u64(&req, "fds", 1);
	mp_put_u64(&req, "length", s->bytes);
	int before = announce(s, soak_stream_sum(s->bytes, seed), slow);
	int sent = gpuq_send(cl->c, &req, &p[0], 1, &err);
	close(p[0]);
	if (slow) {
		usleep(20000);
		write_all(p[1], bytes + first, s->bytes - first);
		close(p[1]);
	}
	free(bytes);
	if (sent < 0)
		soak_fail(cl->sh, "a client could not send a put: %s", err.message);
	settle_write(cl, s, sent < 0 ? NULL : soak_recv(cl, id), "put from a pipe", before);
}

/* Reads n bytes written into fd (a memfd from offset 0, or a pipe) and checks them. */
static void check_got(struct client *cl, const struct soak_slot *s, int fd, bool is_pipe)
{
	unsigned char *buf = malloc(s->bytes);
	size_t got = 0;
	if (!buf)
		abort();
	while (got < s->bytes) {
		ssize_t n = is_pipe ? read(fd, buf + got, s->bytes - got)
				    : pread(fd, buf + got, s->bytes - got, (off_t)got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (got != s->bytes)
		soak_fail(cl->sh, "get of %s gave %zu of %u bytes", s->name, got, s->bytes);
	else if (atomic_load(&s->state) == SLOT_STABLE && host_checksum(buf, got) != s->expected)
		soak_fail(cl->sh, "get of %s: its bytes hash to %016llx, not the %016llx it holds",
			  s->name, (unsigned long long)host_checksum(buf, got),
			  (unsigned long long)s->expected);
	free(buf);
}

static void op_get(struct client *cl, struct soak_slot *s, bool into_pipe)
{
	struct mp_map req;
	bool busy;
	int p[2] = { -1, -1 };
	if (into_pipe ? pipe(p) < 0 : (p[0] = p[1] = memfd_create("soak", MFD_CLOEXEC)) < 0)
		abort();
	uint64_t id = begin_on(cl, &req, "get", s);
	mp_put_u64(&req, "fds", 1);
	mp_put_bool(&req, "verify", true);
	struct gpuq_reply *r = soak_call(cl, &req, id, &p[1], 1);
	if (settle_reply(cl, r, "get", &busy))
		check_got(cl, s, p[0], into_pipe);
	gpuq_reply_free(r);
	close(p[0]);
	if (into_pipe)
		close(p[1]);
}

static void op_checksum(struct client *cl, struct soak_slot *s)
{
	uint64_t sum;
	if (device_sum(cl, s, &sum) && atomic_load(&s->state) == SLOT_STABLE && sum != s->expected)
		soak_fail(cl->sh, "checksum of %s is %016llx, not the %016llx it holds", s->name,
			  (unsigned long long)sum, (unsigned long long)s->expected);
}

/* s into another of the client's buffers of its size on its device, if there is one. */
static void op_copy(struct client *cl, struct soak_slot *s)
{
	struct soak_slot *t = NULL;
	for (int j = 0; j < SOAK_SLOTS && !t; j++) {
		struct soak_slot *o = &cl->slots[j];
		if (o != s && o->device == s->device && o->bytes == s->bytes &&
		    atomic_load(&o->state) == SLOT_STABLE)
			t = o;
	}
	if (!t)
		return;
	struct mp_map req;
	char src[32], dst[32];
	uint64_t id = gpuq_request_begin(cl->c, &req, "copy");
	snprintf(src, sizeof src, "%s@%d", s->name, s->device);
	snprintf(dst, sizeof dst, "%s@%d", t->name, t->device);
	mp_put_str(&req, "src", src);
	mp_put_str(&req, "dst", dst);
	mp_put_bool(&req, "wait", true);
	int before = announce(t, s->expected, false);
	settle_write(cl, t, soak_call(cl, &req, id, NULL, 0), "copy", before);
}

static void op_noop(struct client *cl, const struct soak_slot *s)
{
	struct mp_map req;
	uint64_t id = gpuq_request_begin(cl->c, &req, "noop");
	mp_put_u64(&req, "device", (uint64_t)s->device);
	mp_put_bool(&req, "wait", true);
	mp_put_bool(&req, "progress", true);
	simple_job(cl, &req, id, "noop");
}

/* A job submitted without waiting, whose id comes back; 0 if refused. */
static uint64_t detached_checksum(struct client *cl, const struct soak_slot *s)
{
	struct mp_map req;
	bool busy;
	uint64_t id = begin_job(cl, &req, "checksum", s, true), job = 0;
	struct gpuq_reply *r = soak_call(cl, &req, id, NULL, 0);
	if (settle_reply(cl, r, "a detached checksum", &busy)) {
		const msgpack_object *o = msg_map_get(gpuq_reply_get(r, "job"), "job");
		job = o ? o->via.u64 : 0;
	}
	gpuq_reply_free(r);
	return job;
}

/* wait for a job of one's own, with progress events and a timeout. */
static void op_wait(struct client *cl, const struct soak_slot *s)
{
	uint64_t job = detached_checksum(cl, s);
	if (!job)
		return;
	struct mp_map req;
	uint64_t id = gpuq_request_begin(cl->c, &req, "wait");
	mp_put_u64(&req, "job", job);
	mp_put_u64(&req, "timeout_ms", 20000);
	mp_put_bool(&req, "progress", true);
	simple_job(cl, &req, id, "wait");
}

/* Whether s's buffer exists now. */
static bool buffer_exists(struct client *cl, const struct soak_slot *s)
{
	struct mp_map req;
	struct gpuq_reply *r;
	bool found = false;
	uint64_t id = gpuq_request_begin(cl->c, &req, "buffers");
	mp_put_u64(&req, "device", (uint64_t)s->device);
	if (!(r = soak_call(cl, &req, id, NULL, 0)))
		return false;
	const msgpack_object *list = gpuq_reply_get(r, "buffers");
	for (uint32_t i = 0; list && list->type == MSGPACK_OBJECT_ARRAY && i < list->via.array.size; i++) {
		const msgpack_object *n = msg_map_get(&list->via.array.ptr[i], "name");
		found |= n && n->via.str.size == strlen(s->name) &&
			 memcmp(n->via.str.ptr, s->name, n->via.str.size) == 0;
	}
	gpuq_reply_free(r);
	return found;
}

/* A new buffer for s (a random device, size and kind), filled. */
static void slot_create(struct client *cl, struct soak_slot *s)
{
	static const uint32_t sizes[] = { 4096, 40000, 65536 };
	struct mp_map req;
	s->device = (int)(next_random(cl) % (uint64_t)cl->sh->devices);
	s->bytes = sizes[next_random(cl) % 3];
	s->ephemeral = next_random(cl) % 4 == 0;
	s->conn_tag = cl->conn_tag;
	atomic_store(&s->state, SLOT_ALLOCATING);
	uint64_t id = gpuq_request_begin(cl->c, &req, "alloc");
	mp_put_bool(&req, "wait", true);
	mp_put_str(&req, "name", s->name);
	mp_put_u64(&req, "device", (uint64_t)s->device);
	mp_put_u64(&req, "bytes", s->bytes);
	mp_put_bool(&req, "ephemeral", s->ephemeral);
	if (!simple_job(cl, &req, id, "alloc")) {
		atomic_store(&s->state, SLOT_NONE);
		return;
	}
	s->expected = 0;
	atomic_store(&s->state, SLOT_UNKNOWN); /* a new buffer's bytes are whatever they are */
	op_fill(cl, s);
}

static void slot_free(struct client *cl, struct soak_slot *s)
{
	struct mp_map req;
	atomic_store(&s->state, SLOT_FREEING);
	uint64_t id = begin_on(cl, &req, "free", s);
	if (simple_job(cl, &req, id, "free"))
		atomic_store(&s->state, SLOT_NONE);
	else
		atomic_store(&s->state, SLOT_UNKNOWN);
}

/*
 * What a killed predecessor (or a closed connection) left in s, settled:
 * once no job is on the buffer, an ephemeral one must be gone, one that was
 * being made or freed is freed, and any other must hold bytes the slot
 * allows. Ends with a buffer that holds known bytes, or none.
 */
static void slot_recover(struct client *cl, struct soak_slot *s)
{
	char label[32];
	int state = atomic_load(&s->state);
	uint64_t sum;
	snprintf(label, sizeof label, "%s@%d", s->name, s->device);
	if (state != SLOT_NONE && !soak_wait_quiet(cl->c, label))
		soak_fail(cl->sh, "jobs on %s did not end within 20 s", label);
	if (state != SLOT_NONE && s->ephemeral && s->conn_tag != cl->conn_tag) {
		for (int i = 0; i < 300 && buffer_exists(cl, s); i++)
			usleep(10000);
		if (buffer_exists(cl, s))
			soak_fail(cl->sh, "ephemeral buffer %s outlived the connection that made it", label);
		else
			atomic_store(&s->state, state = SLOT_NONE);
	}
	if (state == SLOT_ALLOCATING || state == SLOT_FREEING) {
		if (buffer_exists(cl, s))
			slot_free(cl, s);
		else
			atomic_store(&s->state, SLOT_NONE);
		state = atomic_load(&s->state);
	}
	if (state == SLOT_NONE) {
		slot_create(cl, s);
		return;
	}
	if (!device_sum(cl, s, &sum))
		return;
	if ((state == SLOT_STABLE && sum != s->expected) ||
	    (state == SLOT_PENDING && sum != s->expected && sum != s->pending))
		soak_fail(cl->sh, "%s holds bytes that hash to %016llx; it may hold %016llx%s%016llx", label,
			  (unsigned long long)sum, (unsigned long long)s->expected,
			  state == SLOT_PENDING ? " or " : ", not ",
			  (unsigned long long)(state == SLOT_PENDING ? s->pending : sum));
	s->expected = sum;
	atomic_store(&s->state, SLOT_STABLE);
	atomic_fetch_add(&cl->sh->recoveries, 1);
}

/* Closes the connection with a wait outstanding and opens another. */
static void op_disconnect(struct client *cl, const struct soak_slot *s)
{
	uint64_t job = detached_checksum(cl, s);
	struct mp_map req;
	struct gpuq_error err;
	gpuq_request_begin(cl->c, &req, "wait");
	mp_put_u64(&req, "job", job);
	mp_put_bool(&req, "progress", true);
	gpuq_send(cl->c, &req, NULL, 0, &err);
	gpuq_close(cl->c);
	cl->c = client_open(cl->sh->d);
	cl->conn_tag++;
	gpuq_set_timeout(cl->c, 30000);
	for (int j = 0; j < SOAK_SLOTS; j++) /* the ephemeral ones went with the connection */
		if (cl->slots[j].ephemeral && atomic_load(&cl->slots[j].state) != SLOT_NONE)
			slot_recover(cl, &cl->slots[j]);
}

static void op_realloc(struct client *cl, struct soak_slot *s)
{
	slot_free(cl, s);
	if (atomic_load(&s->state) == SLOT_NONE)
		slot_create(cl, s);
}

static void run_op(struct client *cl, enum soak_op op, struct soak_slot *s)
{
	switch (op) {
	case OP_FILL: op_fill(cl, s); break;
	case OP_PUT_MEMFD: op_put_memfd(cl, s); break;
	case OP_PUT_PIPE: op_put_pipe(cl, s, false); break;
	case OP_PUT_SLOW: op_put_pipe(cl, s, true); break;
	case OP_GET_MEMFD: op_get(cl, s, false); break;
	case OP_GET_PIPE: op_get(cl, s, true); break;
	case OP_CHECKSUM: op_checksum(cl, s); break;
	case OP_COPY: op_copy(cl, s); break;
	case OP_NOOP: op_noop(cl, s); break;
	case OP_WAIT: op_wait(cl, s); break;
	case OP_DISCONNECT: op_disconnect(cl, s); break;
	case OP_REALLOC: op_realloc(cl, s); break;
	case OP_COUNT: break;
	}
	atomic_fetch_add(&cl->sh->ops[op], 1);
}

/* The mix: weights per op, out of 100. */
static enum soak_op pick_op(struct client *cl)
{
	static const unsigned weights[OP_COUNT] = {
		[OP_FILL] = 14, [OP_PUT_MEMFD] = 12, [OP_PUT_PIPE] = 8, [OP_PUT_SLOW] = 4,
		[OP_GET_MEMFD] = 12, [OP_GET_PIPE] = 6, [OP_CHECKSUM] = 14, [OP_COPY] = 6,
		[OP_NOOP] = 8, [OP_WAIT] = 8, [OP_DISCONNECT] = 3, [OP_REALLOC] = 5,
	};
	unsigned r = (unsigned)(next_random(cl) % 100);
	for (int op = 0; op < OP_COUNT; op++) {
		if (r < weights[op])
			return (enum soak_op)op;
		r -= weights[op];
	}
	return OP_CHECKSUM;
}

_Noreturn void soak_client(struct soak_shared *sh, int k, unsigned seed)
{
	struct client cl = { .sh = sh, .slots = sh->slots[k], .rng = seed,
			     .conn_tag = (atomic_fetch_add(&sh->next_tag, 1) + 1) << 16 };
	cl.c = client_open(sh->d);
	gpuq_set_timeout(cl.c, 30000);
	for (int j = 0; j < SOAK_SLOTS; j++) {
		snprintf(cl.slots[j].name, sizeof cl.slots[j].name, "c%db%d", k, j);
		slot_recover(&cl, &cl.slots[j]);
	}
	while (!atomic_load(&sh->stop)) {
		struct soak_slot *s = &cl.slots[next_random(&cl) % SOAK_SLOTS];
		if (atomic_load(&s->state) == SLOT_STABLE)
			run_op(&cl, pick_op(&cl), s);
		else
			slot_recover(&cl, s);
	}
	gpuq_close(cl.c);
	_exit(0);
}

/* Whether a job record is queued or running and on label (any buffer when NULL). */
static bool record_busy(const msgpack_object *rec, const char *label)
{
	const msgpack_object *state = msg_map_get(rec, "state");
	const msgpack_object *buffer = msg_map_get(rec, "buffer");
	if (!state || state->type != MSGPACK_OBJECT_STR ||
	    (strncmp(state->via.str.ptr, "queued", state->via.str.size) != 0 &&
	     strncmp(state->via.str.ptr, "running", state->via.str.size) != 0))
		return false;
	return !label || (buffer && buffer->type == MSGPACK_OBJECT_STR &&
			  buffer->via.str.size == strlen(label) &&
			  memcmp(buffer->via.str.ptr, label, buffer->via.str.size) == 0);
}

bool soak_wait_quiet(struct gpuq_client *c, const char *label)
{
	for (int i = 0; i < 1000; i++) {
		struct mp_map req;
		struct gpuq_reply *r;
		struct gpuq_error err;
		bool busy = false;
		gpuq_request_begin(c, &req, "jobs");
		if (gpuq_call(c, &req, NULL, 0, &r, &err) < 0)
			return false;
		const msgpack_object *list = gpuq_reply_get(r, "jobs");
		for (uint32_t j = 0; list && list->type == MSGPACK_OBJECT_ARRAY && j < list->via.array.size; j++)
			busy |= record_busy(&list->via.array.ptr[j], label);
		gpuq_reply_free(r);
		if (!busy)
			return true;
		usleep(20000);
	}
	return false;
}
