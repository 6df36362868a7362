/* Unit tests for what a job id that names no job is told: job.c's job_not_found. */
#include "tests/harness.h"

#include "daemon/job.h"

static const char *not_found(const struct job_table *t, uint64_t id)
{
	static struct gpuq_error err;
	job_not_found(t, id, &err);
	CHECK_EQ(err.code, GPUQ_E_NOT_FOUND);
	return err.message;
}

/*
 * After gpuqd came back from a crash its ids skip ahead (past every id the
 * dead gpuqd gave out): until a job is submitted, no "newest job" exists,
 * and the id below the skip was never given out.
 */
TEST(job_not_found_after_a_crash_names_no_job_never_given_out)
{
	struct job_table t;
	job_table_init(&t, 10);
	CHECK_STR(not_found(&t, 5), "job 5 not found (no job was submitted yet)");
	t.next_id = 3; /* jobs 1 and 2 were given out */
	CHECK_STR(not_found(&t, 5),
		  "job 5 not found (the newest job is 2; the last 10 finished jobs are kept)");
	job_table_skip_ids(&t, 1048577);
	CHECK_STR(not_found(&t, 5),
		  "job 5 not found (no job was submitted since gpuqd came back after it died; "
		  "the ids of this run start at 1048577, those of the gpuqd that died are gone)");
	t.next_id++; /* job 1048577 was given out */
	CHECK_STR(not_found(&t, 5), "job 5 not found (the newest job is 1048577; the last 10 "
				    "finished jobs are kept)");
	job_table_destroy(&t);
}
