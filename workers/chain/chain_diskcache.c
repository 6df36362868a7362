/*
 * The disk cache of compiled kernels (workers/chain/chain_diskcache.h). Any
 * thread; gpuqd calls it from worker threads only.
 */
#include "workers/chain/chain_diskcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DISK_MAGIC "GPUQKRN1"
#define DISK_FORMAT 1u
#define DISK_FLAG_PTX 1u
/* No kernel image or source comes near this: a larger length is a corrupted header. */
#define DISK_MAX_PART (64u << 20)

struct disk_header {
	char magic[8];
	uint32_t format;
	uint32_t flags;
	uint64_t source_len;
	uint64_t image_len;
	uint64_t checksum; /* of the source, then the image */
	char arch[24];
	char toolkit[16];
};

uint64_t chain_diskcache_hash(uint64_t h, const void *data, size_t n)
{
	const unsigned char *p = data;
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

void chain_diskcache_name(char name[CHAIN_DISKCACHE_NAME_MAX], uint64_t source_hash,
			  const char *arch, const char *toolkit)
{
	snprintf(name, CHAIN_DISKCACHE_NAME_MAX, "%016" PRIx64 "-%s-nvrtc%s.kernel", source_hash,
		 arch, toolkit);
}

static uint64_t disk_checksum(const void *source, size_t source_len, const void *image,
			      size_t image_len)
{
	uint64_t h = chain_diskcache_hash(CHAIN_DISKCACHE_HASH_SEED, source, source_len);
	return chain_diskcache_hash(h, image, image_len);
}

/* Reads exactly n bytes (a short file gives fewer: *got says how many). */
static int read_all(int fd, void *buf, size_t n, size_t *got)
{
	*got = 0;
	while (*got < n) {
		ssize_t r = read(fd, (char *)buf + *got, n - *got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		*got += (size_t)r;
	}
	return 0;
}

static enum chain_disk_result reject(char *why, size_t whysize, const char *path, const char *what)
{
	snprintf(why, whysize, "%s: %s", path, what);
	return CHAIN_DISK_REJECTED;
}

/* Whether st is gpuqd's own and writable by no one else (see Trust in the header). */
static bool trusted(const struct stat *st)
{
	return st->st_uid == geteuid() && !(st->st_mode & (S_IWGRP | S_IWOTH));
}

static const char untrusted[] = "belongs to another user or is writable by others: its "
				"kernels are not loaded (they would reach every user's buffers)";

/* The header's promises: magic, format, sane lengths, the same arch and toolkit. */
static enum chain_disk_result check_header(const struct disk_header *h, const char *path,
					   size_t source_len, const char *arch, const char *toolkit,
					   char *why, size_t whysize)
{
	if (memcmp(h->magic, DISK_MAGIC, sizeof h->magic) != 0 || h->format != DISK_FORMAT)
		return reject(why, whysize, path, "not a gpuq kernel file of this format");
	if (h->source_len != source_len || h->image_len == 0 || h->image_len > DISK_MAX_PART)
		return reject(why, whysize, path, "its lengths do not match this kernel's source");
	if (strncmp(h->arch, arch, sizeof h->arch) != 0 ||
	    strncmp(h->toolkit, toolkit, sizeof h->toolkit) != 0)
		return reject(why, whysize, path, "compiled for another architecture or NVRTC");
	return CHAIN_DISK_HIT;
}

static enum chain_disk_result load_body(int fd, const char *path, const struct disk_header *h,
					const char *source, struct chain_image *out, char *why,
					size_t whysize)
{
	size_t n = (size_t)(h->source_len + h->image_len), got;
	char *body = malloc(n);
	if (!body) {
		snprintf(why, whysize, "no host memory to read %s", path);
		return CHAIN_DISK_ERROR;
	}
	if (read_all(fd, body, n, &got) < 0) {
		snprintf(why, whysize, "reading %s: %s", path, strerror(errno));
		free(body);
		return CHAIN_DISK_ERROR;
	}
	enum chain_disk_result r = CHAIN_DISK_HIT;
	if (got != n)
		r = reject(why, whysize, path, "truncated");
	else if (disk_checksum(body, h->source_len, body + h->source_len, h->image_len) != h->checksum)
		r = reject(why, whysize, path, "its checksum does not match: corrupted");
	else if (memcmp(body, source, h->source_len) != 0)
		r = reject(why, whysize, path, "it holds another source (a hash collision)");
	if (r != CHAIN_DISK_HIT) {
		free(body);
		return r;
	}
	memmove(body, body + h->source_len, h->image_len);
	out->data = body;
	out->size = h->image_len;
	out->ptx = h->flags & DISK_FLAG_PTX;
	snprintf(out->arch, sizeof out->arch, "%.*s", (int)sizeof h->arch, h->arch);
	return CHAIN_DISK_HIT;
}

enum chain_disk_result chain_diskcache_load(const char *dir, const char *name, const char *source,
					    size_t source_len, const char *arch, const char *toolkit,
					    struct chain_image *out, char *why, size_t whysize)
{
	char path[512];
	struct disk_header h;
	size_t got;
	memset(out, 0, sizeof *out);
	snprintf(path, sizeof path, "%s/%s", dir, name);
	struct stat st;
	if (stat(dir, &st) == 0 && !trusted(&st))
		return reject(why, whysize, dir, untrusted);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0 && errno == ENOENT)
		return CHAIN_DISK_MISS;
	if (fd < 0) {
		snprintf(why, whysize, "opening %s: %s", path, strerror(errno));
		return CHAIN_DISK_ERROR;
	}
	enum chain_disk_result r;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || !trusted(&st)) {
		r = reject(why, whysize, path, untrusted);
	} else if (read_all(fd, &h, sizeof h, &got) < 0) {
		snprintf(why, whysize, "reading %s: %s", path, strerror(errno));
		r = CHAIN_DISK_ERROR;
	} else if (got != sizeof h) {
		r = reject(why, whysize, path, "truncated");
	} else {
		r = check_header(&h, path, source_len, arch, toolkit, why, whysize);
		if (r == CHAIN_DISK_HIT)
			r = load_body(fd, path, &h, source, out, why, whysize);
	}
	if (r == CHAIN_DISK_HIT)
		futimens(fd, NULL); /* used now: the trimming keeps it longest (a failure only ages it) */
	close(fd);
	return r;
}

/* mkdir -p with mode 0700 for what it makes. */
static int make_dirs(const char *dir, char *why, size_t whysize)
{
	char path[512];
	snprintf(path, sizeof path, "%s", dir);
	for (char *p = path + 1;; p++) {
		bool end = *p == '\0';
		if (*p != '/' && !end)
			continue;
		*p = '\0';
		if (mkdir(path, 0700) < 0 && errno != EEXIST) {
			snprintf(why, whysize, "cannot make the kernel cache directory %s: %s", path,
				 strerror(errno));
			return -1;
		}
		if (end)
			return 0;
		*p = '/';
	}
}

static int write_all(int fd, const void *buf, size_t n)
{
	size_t done = 0;
	while (done < n) {
		ssize_t w = write(fd, (const char *)buf + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -1;
		done += (size_t)w;
	}
	return 0;
}

static int write_file(int fd, const char *source, size_t source_len, const char *toolkit,
		      const struct chain_image *img)
{
	struct disk_header h;
	memset(&h, 0, sizeof h);
	memcpy(h.magic, DISK_MAGIC, sizeof h.magic);
	h.format = DISK_FORMAT;
	h.flags = img->ptx ? DISK_FLAG_PTX : 0;
	h.source_len = source_len;
	h.image_len = img->size;
	h.checksum = disk_checksum(source, source_len, img->data, img->size);
	snprintf(h.arch, sizeof h.arch, "%s", img->arch);
	snprintf(h.toolkit, sizeof h.toolkit, "%s", toolkit);
	if (write_all(fd, &h, sizeof h) < 0 || write_all(fd, source, source_len) < 0 ||
	    write_all(fd, img->data, img->size) < 0 || fsync(fd) < 0)
		return -1;
	return 0;
}

/* A kernel file of the directory and when it was last used. */
struct disk_file {
	char name[CHAIN_DISKCACHE_NAME_MAX];
	struct timespec used;
};

static int older(const void *a, const void *b)
{
	const struct timespec *x = &((const struct disk_file *)a)->used;
	const struct timespec *y = &((const struct disk_file *)b)->used;
	if (x->tv_sec != y->tv_sec)
		return x->tv_sec < y->tv_sec ? -1 : 1;
	return x->tv_nsec < y->tv_nsec ? -1 : x->tv_nsec > y->tv_nsec;
}

/* Removes dead writers' temporaries (an hour old) and lists the kernels into *files. */
static size_t list_files(int dfd, struct disk_file **files)
{
	DIR *d = fdopendir(dfd);
	struct dirent *e;
	size_t n = 0, cap = 0;
	time_t now = time(NULL);
	*files = NULL;
	while (d && (e = readdir(d)) != NULL) {
		struct stat st;
		size_t len = strlen(e->d_name);
		if (len >= CHAIN_DISKCACHE_NAME_MAX || fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(st.st_mode))
			continue;
		if (e->d_name[0] == '.') {
			if (now - st.st_mtime > 3600)
				unlinkat(dfd, e->d_name, 0);
			continue;
		}
		if (len < 7 || strcmp(e->d_name + len - 7, ".kernel") != 0)
			continue;
		if (n == cap) {
			struct disk_file *more = realloc(*files, (cap = cap ? cap * 2 : 64) * sizeof *more);
			if (!more)
				break;
			*files = more;
		}
		memcpy((*files)[n].name, e->d_name, len + 1);
		(*files)[n++].used = st.st_mtim;
	}
	if (d)
		closedir(d); /* closes dfd */
	return n;
}

/* Keeps the max most recently used kernels of dir. */
static void trim(const char *dir, unsigned max)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return;
	struct disk_file *files;
	size_t n = list_files(dfd, &files);
	if (n > max) {
		qsort(files, n, sizeof *files, older);
		dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		for (size_t i = 0; dfd >= 0 && i < n - max; i++)
			unlinkat(dfd, files[i].name, 0);
		if (dfd >= 0)
			close(dfd);
	}
	free(files);
}

int chain_diskcache_store(const char *dir, const char *name, const char *source, size_t source_len,
			  const char *toolkit, const struct chain_image *img, unsigned max,
			  char *why, size_t whysize)
{
	char tmp[512], path[512];
	struct stat st;
	if (make_dirs(dir, why, whysize) < 0)
		return -1;
	if (stat(dir, &st) == 0 && !trusted(&st)) {
		snprintf(why, whysize, "%s %s", dir, untrusted);
		return -1;
	}
	snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", dir, name);
	snprintf(path, sizeof path, "%s/%s", dir, name);
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		snprintf(why, whysize, "cannot create a file in %s: %s", dir, strerror(errno));
		return -1;
	}
	int rc = write_file(fd, source, source_len, toolkit, img);
	int saved = errno;
	if (close(fd) < 0 && rc == 0) {
		rc = -1;
		saved = errno;
	}
	if (rc == 0 && rename(tmp, path) < 0) {
		rc = -1;
		saved = errno;
	}
	if (rc < 0) {
		unlink(tmp);
		snprintf(why, whysize, "cannot write %s: %s", path, strerror(saved));
		return -1;
	}
	trim(dir, max);
	return 0;
}
