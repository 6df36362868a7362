/*
 * Compiled chain kernels on disk (--kernel-cache DIR), so that a new daemon,
 * or another daemon on the machine, loads a kernel instead of compiling it.
 *
 * One file per kernel, DIR/<name>, the name built from what decides the
 * compiled code: a hash of the whole source NVRTC compiled (the headers,
 * the generated text and the options), the architecture and NVRTC's
 * version ("3f2a...-sm_90-nvrtc13.0.kernel"). A file holds a header (magic,
 * format, lengths, arch, toolkit, a checksum of the rest), the source and
 * the image. Loading checks all of it, the source byte for byte, so a
 * truncated, corrupted or colliding file is rejected (and the kernel
 * compiled and stored again), never loaded.
 *
 * Writes are atomic and safe for daemons sharing the directory: a file is
 * written whole under a temporary name in DIR, flushed (fsync), then
 * renamed over the final name, so a reader sees a complete old file or a
 * complete new one; two daemons storing the same kernel store the same
 * bytes and the last rename wins. Worker threads (file I/O only).
 *
 * Size. The directory keeps at most CHAIN_DISKCACHE_MAX_FILES kernels:
 * after a store the least recently used go (a load marks a file used by
 * touching its mtime), and temporaries older than an hour (a writer that
 * died) with them. Removing is safe beside other daemons: a reader keeps
 * the file it opened, and a missing file is compiled again.
 *
 * Trust. A kernel loaded from here runs on the GPU with access to every
 * user's buffers, so only files nobody else could have written are loaded:
 * DIR and the file must belong to gpuqd's user and be writable by no group
 * or other (daemons sharing DIR run as one user). Anything else is
 * rejected, and stores into such a DIR are refused.
 */
#ifndef GPUQ_CHAIN_DISKCACHE_H
#define GPUQ_CHAIN_DISKCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "workers/chain/chain_nvrtc.h"

#define CHAIN_DISKCACHE_NAME_MAX 96
#define CHAIN_DISKCACHE_MAX_FILES 4096 /* about 160 MiB of kernels */

enum chain_disk_result {
	CHAIN_DISK_HIT,      /* *out holds the image */
	CHAIN_DISK_MISS,     /* no such file */
	CHAIN_DISK_REJECTED, /* a file that is not a whole, matching kernel (why says how) */
	CHAIN_DISK_ERROR,    /* the file could not be read (why says so) */
};

/* A 64-bit FNV-1a hash of data, continuing from h (start with CHAIN_DISKCACHE_HASH_SEED). */
#define CHAIN_DISKCACHE_HASH_SEED 0xcbf29ce484222325ull
uint64_t chain_diskcache_hash(uint64_t h, const void *data, size_t n);

/* The file name of a kernel: its source's hash, arch and toolkit ("13.0"). */
void chain_diskcache_name(char name[CHAIN_DISKCACHE_NAME_MAX], uint64_t source_hash,
			  const char *arch, const char *toolkit);

/* Reads DIR/name and checks it against source, arch and toolkit. */
enum chain_disk_result chain_diskcache_load(const char *dir, const char *name, const char *source,
					    size_t source_len, const char *arch, const char *toolkit,
					    struct chain_image *out, char *why, size_t whysize);

/*
 * Writes DIR/name atomically (making DIR, mode 0700, if needed), then trims
 * DIR to max files. 0, or -1 with why.
 */
int chain_diskcache_store(const char *dir, const char *name, const char *source, size_t source_len,
			  const char *toolkit, const struct chain_image *img, unsigned max,
			  char *why, size_t whysize);

#endif
