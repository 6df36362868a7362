/*
 * Host-side hashing and filling for copies, split across the copy threads.
 * The checksum is protocol/hash.h's: a sum of per-word terms, so any part of
 * a range can be hashed on its own and the parts added. Any thread.
 */
#ifndef GPUQ_COPY_HASH_H
#define GPUQ_COPY_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "workers/transfer/copy_pool.h"

/*
 * The sum of the checksum terms of n bytes at p, whose first byte starts
 * word first_word of the hashed range; a trailing partial word is zero-padded
 * (so only the range's last part may end off a word boundary).
 */
uint64_t copy_hash_terms(const void *p, size_t n, uint64_t first_word);

/* copy_hash_terms of n bytes at p (from word 0), split across the pool's threads. */
uint64_t copy_hash_terms_parallel(struct copy_pool *pool, const void *p, size_t n);

/* gpuq's checksum of n bytes at p, hashed by the pool's threads in parallel. */
uint64_t copy_hash_parallel(struct copy_pool *pool, const void *p, size_t n);

/*
 * Words first_word.. of the random stream of seed (protocol/hash.h) into n
 * bytes at p; the last word cut short when n is not a multiple of 8.
 */
void copy_fill_random_words(void *p, size_t n, uint64_t seed, uint64_t first_word);

/* Fills n bytes at p with the random stream of seed (as fill random on bytes), in parallel. */
void copy_fill_random_parallel(struct copy_pool *pool, void *p, size_t n, uint64_t seed);

#endif
