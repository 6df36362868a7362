/*
 * Long runs in chunks: a fused or graph run whose work exceeds one chunk is
 * launched chunk by chunk and checks its cancel flag between chunks, so a
 * cancel stops it (`cancelled`, the buffer holding what the chunks before
 * wrote) instead of it running to its end; and a chunked run that is not
 * cancelled gives exactly the bytes one launch gives (eager passes, or a
 * reference computed here). The sizes exceed the host backend's chunk (2^22
 * element-ops) and the CUDA backend's (2^34) where a test needs chunking.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/chain_util.h"

/* Waits (at most ~20 s) until the job leaves `queued`. */
static void await_running(struct gpuq_client *c, uint64_t job)
{
	char state[16] = "queued";
	for (int i = 0; i < 20000 && strcmp(state, "queued") == 0; i++) {
		struct gpuq_reply *r = job_request(c, "status", job, 0);
		reply_str(r, "job.state", state, sizeof state);
		gpuq_reply_free(r);
		if (strcmp(state, "queued") == 0)
			usleep(1000);
	}
	CHECKF(strcmp(state, "running") == 0, "job %llu is %s, not running",
	       (unsigned long long)job, state);
}

/*
 * Every element of f32 buffer name (count of them, all 0 before `add 1`
 * repeat times) is a whole number below repeat: the run was cut short.
 * Returns the largest.
 */
static float expect_cut_short(struct gpuq_client *c, const char *name, size_t count,
			      uint64_t repeat)
{
	float *v = tget(c, name, count * sizeof *v);
	float most = 0;
	for (size_t i = 0; i < count; i++) {
		CHECKF(v[i] >= 0 && v[i] == floorf(v[i]) && v[i] < (float)repeat,
		       "%s[%zu] = %.9g: not a whole number of passes below %llu", name, i, v[i],
		       (unsigned long long)repeat);
		if (v[i] > most)
			most = v[i];
	}
	free(v);
	return most;
}

/* Runs `add 1` repeat times on zeros (into out when given), cancels it while it runs. */
static void cancel_long_run(const char *mode, uint64_t repeat, bool out_of_place)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "1G", NULL);
	struct gpuq_client *c = client_open(&d);
	/* Hours of host work at full length, seconds at least on a GPU. */
	const size_t count = test_backend_is_cuda() ? (64u << 20) : (1u << 20);
	talloc(c, "x", &tdtype_f32, count, 0);
	tfill_value(c, "x", 0);
	if (out_of_place) {
		talloc(c, "y", &tdtype_f32, count, 0);
		tfill_value(c, "y", 0);
	}
	uint64_t job = run_chain_detached(c, "x", "add 1", mode, repeat, out_of_place ? "y" : NULL);
	await_running(c, job);
	usleep(100000); /* a few chunks in */
	struct gpuq_reply *r = job_request(c, "cancel", job, 0);
	expect_ok(r, "cancel");
	CHECK(reply_path(r, "cancel_requested")->via.boolean);
	gpuq_reply_free(r);
	r = job_request(c, "wait", job, 20000);
	expect_error(r, GPUQ_E_CANCELLED, "run cancelled");
	gpuq_reply_free(r);
	float most = expect_cut_short(c, out_of_place ? "y" : "x", count, repeat);
	if (out_of_place) { /* the input is untouched */
		CHECK(expect_cut_short(c, "x", count, 1) == 0);
	}
	CHECK(most < (float)repeat);
	char state[16];
	buffer_state(c, out_of_place ? "y" : "x", state, sizeof state, NULL, 0); /* partly written */
	CHECK_STR(state, "suspect");
	if (out_of_place) {
		buffer_state(c, "x", state, sizeof state, NULL, 0); /* only read */
		CHECK_STR(state, "ready");
	}
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(chunks_cancel_stops_a_long_fused_run)
{
	cancel_long_run("fused", 1000000, false);
}

TEST(chunks_cancel_stops_a_long_fused_run_into_another_buffer)
{
	cancel_long_run("fused", 1000000, true);
}

TEST(chunks_cancel_stops_a_long_graph_replay)
{
	cancel_long_run("graph", 65536, false);
}

/* Runs chain on a copy of the same random data in mode, out of place when out, and returns the result. */
static void *run_on(struct gpuq_client *c, const struct tdtype *t, const void *data, size_t count,
		    const char *chain, const char *mode, const char *kernel, uint64_t repeat,
		    bool out)
{
	tput(c, "in", data, count * t->size);
	struct gpuq_reply *r = run_chain_kernel(c, "in", chain, mode, repeat, out ? "out" : NULL,
						kernel);
	char what[200];
	snprintf(what, sizeof what, "%s %s '%s' repeat %llu", t->name, mode, chain,
		 (unsigned long long)repeat);
	expect_ok(r, what);
	gpuq_reply_free(r);
	return tget(c, out ? "out" : "in", count * t->size);
}

/* Every element of got has the bits of want (or both are NaN). */
static void expect_same(const struct tdtype *t, const void *want, const void *got, size_t count,
			const char *what)
{
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < count; i++) {
		if (!same_value(t, want, got, i) && bad++ == 0)
			first = i;
	}
	CHECKF(bad == 0, "%s: %zu of %zu elements differ from the eager passes, the first at %zu "
	       "(%.9Lg, not %.9Lg)", what, bad, count, first, tload(t, got, first),
	       tload(t, want, first));
}

struct chunk_case {
	const struct tdtype *t;
	size_t count;
	const char *chain;
	uint64_t repeat;
	bool out;
};

TEST(chunks_uncancelled_runs_give_the_bytes_of_one_launch)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "1G", NULL);
	struct gpuq_client *c = client_open(&d);
	/*
	 * On the host backend: element chunks with a tail (3 ops on 3M+ elements
	 * a repeat), repeat chunks with a shorter last one (2 ops on 100003
	 * elements, 20 repeats a chunk), both out of place. On a GPU the second
	 * kind (2 ops on 4M elements, repeat 3001) splits by repeats too.
	 */
	bool gpu = test_backend_is_cuda();
	const struct chunk_case cases[] = {
		{ &tdtype_f32, (3u << 20) + 5, "sin | mul 1.5 | add 0.25", 3, false },
		{ &tdtype_f64, (3u << 20) + 5, "mul 0.999 | add 0.5 | tanh", 2, true },
		{ &tdtype_f16, gpu ? (4u << 20) + 3 : 100003, "mul 1.001 | add 0.5", gpu ? 3001 : 57, true },
		{ &tdtype_bf16, gpu ? (4u << 20) + 3 : 100003, "sin | add 0.125", gpu ? 3001 : 57, false },
	};
	static const char *const kernels[] = { NULL, "interpreted" };
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		const struct chunk_case *cc = &cases[k];
		talloc(c, "in", cc->t, cc->count, 0);
		talloc(c, "out", cc->t, cc->count, 0);
		void *data = trandom(cc->t, cc->count, -2, 2, 11 + k);
		void *want = run_on(c, cc->t, data, cc->count, cc->chain, "eager", NULL, cc->repeat,
				    cc->out);
		for (int m = 0; m < 3; m++) {
			const char *mode = m < 2 ? "fused" : "graph";
			const char *kernel = m < 2 ? kernels[m] : NULL;
			if (m == 2 && cc->repeat * 3 > 65536)
				continue;
			void *got = run_on(c, cc->t, data, cc->count, cc->chain, mode, kernel,
					   cc->repeat, cc->out);
			char what[200];
			snprintf(what, sizeof what, "%s %s%s%s '%s' repeat %llu on %zu", cc->t->name,
				 mode, kernel ? " " : "", kernel ? kernel : "", cc->chain,
				 (unsigned long long)cc->repeat, cc->count);
			expect_same(cc->t, want, got, cc->count, what);
			free(got);
		}
		free(want);
		free(data);
		do_free(c, "in");
		do_free(c, "out");
	}
	gpuq_close(c);
	daemon_stop(&d);
}

/*
 * An expression with a broadcast operand, in chunks of repeats and of
 * elements, against the same arithmetic done here (float, each operation
 * rounded once: y = a * x + y is mul then add, never an fma).
 */
TEST(chunks_uncancelled_expression_gives_the_reference_bytes)
{
	struct daemon_proc d;
	daemon_start(&d, "--host-mem", "1G", NULL);
	struct gpuq_client *c = client_open(&d);
	const size_t count = test_backend_is_cuda() ? (16u << 20) + 7 : (2u << 20) + 7;
	const uint64_t repeat = test_backend_is_cuda() ? 1001 : 5;
	talloc(c, "a", &tdtype_f32, 1, 0);
	talloc(c, "x", &tdtype_f32, count, 0);
	talloc(c, "y", &tdtype_f32, count, 0);
	float a = 0.75f;
	tput(c, "a", &a, sizeof a);
	float *x = trandom(&tdtype_f32, count, -1, 1, 5);
	float *y = trandom(&tdtype_f32, count, -1, 1, 6);
	tput(c, "x", x, count * sizeof *x);
	tput(c, "y", y, count * sizeof *y);
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	o.repeat = repeat;
	gpuq_reply_free(expr_ok(c, "y = a * x + y", &o));
	float *got = tget(c, "y", count * sizeof *got);
	for (size_t i = 0; i < count; i++) {
		volatile float v = y[i];
		for (uint64_t r = 0; r < repeat; r++) {
			volatile float p = a * x[i];
			v = p + v;
		}
		y[i] = v;
	}
	expect_same(&tdtype_f32, y, got, count, "y = a * x + y");
	free(got);
	free(x);
	free(y);
	gpuq_close(c);
	daemon_stop(&d);
}
