/* Hashing and filling split across the copy threads. Any thread (see copy_hash.h). */
#include "workers/transfer/copy_hash.h"

#include <stdlib.h>
#include <string.h>

#include "protocol/hash.h"

/* Parts of at least this size go to the pool; smaller ranges are done inline. */
#define PART_BYTES ((size_t)8 << 20)
#define MAX_PARTS 64

uint64_t copy_hash_terms(const void *p, size_t n, uint64_t first_word)
{
	const unsigned char *b = p;
	size_t words = n / 8;
	uint64_t sum = 0;
	for (size_t i = 0; i < words; i++) {
		uint64_t w;
		memcpy(&w, b + i * 8, 8); /* little-endian host, as protocol/hash.h assumes */
		sum += gpuq_checksum_term(w, first_word + i);
	}
	if (n % 8) {
		uint64_t w = 0;
		memcpy(&w, b + words * 8, n % 8);
		sum += gpuq_checksum_term(w, first_word + words);
	}
	return sum;
}

void copy_fill_random_words(void *p, size_t n, uint64_t seed, uint64_t first_word)
{
	unsigned char *b = p;
	size_t words = n / 8;
	for (size_t i = 0; i < words; i++) {
		uint64_t w = gpuq_random_word(seed, first_word + i);
		memcpy(b + i * 8, &w, 8);
	}
	if (n % 8) {
		uint64_t w = gpuq_random_word(seed, first_word + words);
		memcpy(b + words * 8, &w, n % 8);
	}
}

struct part {
	struct copy_task task; /* first: the task is the part */
	unsigned char *p;
	size_t n;
	uint64_t first_word;
	uint64_t seed;
	uint64_t sum;
};

static void part_hash(struct copy_task *task)
{
	struct part *pt = (struct part *)task;
	pt->sum = copy_hash_terms(pt->p, pt->n, pt->first_word);
}

static void part_fill(struct copy_task *task)
{
	struct part *pt = (struct part *)task;
	copy_fill_random_words(pt->p, pt->n, pt->seed, pt->first_word);
}

/* Cuts [p, p + n) into word-aligned parts, runs fn on each in the pool, returns the sum of their sums. */
static uint64_t run_parts(struct copy_pool *pool, unsigned char *p, size_t n, uint64_t seed,
			  copy_task_fn fn)
{
	struct part parts[MAX_PARTS];
	struct copy_group group;
	size_t part = n / MAX_PARTS + 1;
	part = part < PART_BYTES ? PART_BYTES : (part + 7) / 8 * 8;
	unsigned count = 0;
	copy_group_init(&group);
	for (size_t at = 0; at < n; at += part, count++) {
		struct part *pt = &parts[count];
		memset(pt, 0, sizeof *pt);
		pt->task.fn = fn;
		pt->task.group = &group;
		pt->p = p + at;
		pt->n = n - at < part ? n - at : part;
		pt->first_word = at / 8;
		pt->seed = seed;
		copy_pool_submit(pool, &pt->task);
	}
	uint64_t sum = 0;
	for (unsigned i = 0; i < count; i++) {
		copy_task_wait(&parts[i].task);
		sum += parts[i].sum;
	}
	copy_group_destroy(&group);
	return sum;
}

uint64_t copy_hash_terms_parallel(struct copy_pool *pool, const void *p, size_t n)
{
	return run_parts(pool, (unsigned char *)(uintptr_t)p, n, 0, part_hash);
}

uint64_t copy_hash_parallel(struct copy_pool *pool, const void *p, size_t n)
{
	return gpuq_checksum_finish(copy_hash_terms_parallel(pool, p, n), n);
}

void copy_fill_random_parallel(struct copy_pool *pool, void *p, size_t n, uint64_t seed)
{
	run_parts(pool, p, n, seed, part_fill);
}
