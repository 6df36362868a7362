/*
 * libgpuq's side of zero-copy sharing (client/lib/gpuq.h): host regions this
 * process maps beside gpuqd, and shareable buffers it attaches. The CUDA
 * import of an attached buffer is libgpuq_cuda.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client/lib/gpuq.h"
#include "client/lib/libgpuq_cuda.h"
#include "client/lib/libgpuq_revocable.h"

/*
 * Sends req (with fds) and waits for its reply; a refusal becomes -1 with
 * the daemon's error. On 0 the caller owns *reply.
 */
static int share_call(struct gpuq_client *c, struct mp_map *req, const int *fds, int nfds,
		      struct gpuq_reply **reply, struct gpuq_error *err)
{
	if (gpuq_call(c, req, fds, nfds, reply, err) < 0)
		return -1;
	if (gpuq_reply_ok(*reply))
		return 0;
	gpuq_reply_error(*reply, err);
	gpuq_reply_free(*reply);
	*reply = NULL;
	return -1;
}

static int map_region(struct gpuq_region *r, int fd, const char *name, uint64_t bytes,
		      struct gpuq_error *err)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return gpuq_fail(err, GPUQ_E_IO, "cannot map region '%s' (%llu bytes): %s", name,
				 (unsigned long long)bytes, strerror(errno));
	snprintf(r->name, sizeof r->name, "%s", name);
	r->ptr = p;
	r->bytes = bytes;
	r->fd = fd;
	return 0;
}

/* A memfd of bytes, sealed against shrinking (what gpuqd requires of a region). */
static int region_memfd(const char *name, uint64_t bytes, struct gpuq_error *err)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return gpuq_fail(err, GPUQ_E_IO, "memfd_create for region '%s': %s", name,
				 strerror(errno));
	if (ftruncate(fd, (off_t)bytes) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		int e = errno;
		close(fd);
		return gpuq_fail(err, GPUQ_E_IO, "cannot size and seal the memfd of region '%s': %s",
				 name, strerror(e));
	}
	return fd;
}

int gpuq_region_create(struct gpuq_client *c, const char *name, uint64_t bytes, int device,
		       bool ephemeral, struct gpuq_region *out, struct gpuq_error *err)
{
	struct gpuq_reply *r;
	struct mp_map req;
	memset(out, 0, sizeof *out);
	out->fd = -1;
	int fd = region_memfd(name, bytes, err);
	if (fd < 0)
		return -1;
	gpuq_request_begin(c, &req, "region_create");
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "bytes", bytes);
	mp_put_u64(&req, "device", (uint64_t)device);
	mp_put_bool(&req, "ephemeral", ephemeral);
	mp_put_u64(&req, "fds", 1);
	mp_put_bool(&req, "wait", true);
	if (share_call(c, &req, &fd, 1, &r, err) < 0) {
		close(fd);
		return -1;
	}
	gpuq_reply_free(r);
	if (map_region(out, fd, name, bytes, err) < 0) {
		close(fd);
		return -1;
	}
	return 0;
}

int gpuq_region_open(struct gpuq_client *c, const char *name, struct gpuq_region *out,
		     struct gpuq_error *err)
{
	struct gpuq_reply *r;
	struct mp_map req;
	uint64_t bytes = 0;
	memset(out, 0, sizeof *out);
	out->fd = -1;
	gpuq_request_begin(c, &req, "region_open");
	mp_put_str(&req, "name", name);
	if (share_call(c, &req, NULL, 0, &r, err) < 0)
		return -1;
	int fd = gpuq_reply_take_fd(r, 0);
	int rc = msg_get_u64(r->root, "bytes", &bytes, err) == 1 && fd >= 0
			 ? map_region(out, fd, name, bytes, err)
			 : gpuq_fail(err, GPUQ_E_IO, "gpuqd's region_open reply lacks %s",
				     fd < 0 ? "the memfd" : "'bytes'");
	if (rc < 0 && fd >= 0)
		close(fd);
	gpuq_reply_free(r);
	return rc;
}

void gpuq_region_unmap(struct gpuq_region *r)
{
	if (r->ptr)
		munmap(r->ptr, r->bytes);
	if (r->fd >= 0)
		close(r->fd);
	r->ptr = NULL;
	r->fd = -1;
}

int gpuq_region_free(struct gpuq_client *c, const char *name, struct gpuq_error *err)
{
	struct gpuq_reply *r;
	struct mp_map req;
	gpuq_request_begin(c, &req, "region_free");
	mp_put_str(&req, "name", name);
	mp_put_bool(&req, "wait", true);
	if (share_call(c, &req, NULL, 0, &r, err) < 0)
		return -1;
	gpuq_reply_free(r);
	return 0;
}

/* ---- attach ---- */

/* The attach record's fields: what was attached, and where the daemon's device is. */
static int read_attach_result(const struct gpuq_reply *r, struct gpuq_attachment *a,
			      char *uuid, size_t uuid_size, bool *host, struct gpuq_error *err)
{
	const msgpack_object *job = gpuq_reply_get(r, "job");
	const msgpack_object *res = job && job->type == MSGPACK_OBJECT_MAP ? msg_map_get(job, "result")
									 : NULL;
	char dtype[16] = "", handle[16] = "";
	if (!res || msg_get_u64(res, "lease", &a->lease, err) != 1 ||
	    msg_get_u64(res, "bytes", &a->bytes, err) != 1 ||
	    msg_get_u64(res, "count", &a->count, err) != 1 ||
	    msg_get_str(res, "dtype", dtype, sizeof dtype, err) != 1 ||
	    msg_get_str(res, "uuid", uuid, uuid_size, err) != 1 ||
	    msg_get_str(res, "handle", handle, sizeof handle, err) != 1)
		return gpuq_fail(err, GPUQ_E_IO, "gpuqd's attach reply lacks the lease's fields");
	if (gpuq_dtype_from_name(dtype, strlen(dtype), &a->dtype) < 0)
		a->dtype = GPUQ_DTYPE_BYTES;
	*host = strcmp(handle, "memfd") == 0;
	return 0;
}

/* The host backend's stand-in: the buffer is a memfd; map it (read-only for a read lease). */
static int attach_host(struct gpuq_attachment *a, int fd, struct gpuq_error *err)
{
	int prot = PROT_READ | (a->read_write ? PROT_WRITE : 0);
	void *p = mmap(NULL, a->bytes, prot, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return gpuq_fail(err, GPUQ_E_IO, "cannot map the attached buffer's memfd: %s",
				 strerror(errno));
	a->ptr = p;
	a->host = true;
	a->cuda_device = -1;
	a->map_bytes = a->bytes;
	return 0;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Tells gpuqd the lease is over (the mapping here is gone already). */
static int release_lease(struct gpuq_client *c, uint64_t lease, struct gpuq_error *err)
{
	struct gpuq_reply *r;
	struct mp_map req;
	gpuq_request_begin(c, &req, "release");
	mp_put_u64(&req, "lease", lease);
	if (share_call(c, &req, NULL, 0, &r, err) < 0)
		return -1;
	gpuq_reply_free(r);
	return 0;
}

/* How much longer than its timeout_ms an attach waits for gpuqd's reply that it gave up. */
#define ATTACH_REPLY_GRACE_MS 5000

/*
 * The attach request, under the client's timeout: gpuqd is told it, so that
 * it gives the attach up in time. Were only this side to stop waiting,
 * gpuqd would grant the lease later to a caller that never learnt its id,
 * and the buffer's writers would wait for it as long as the connection
 * lives; so this side waits a little longer, for that reply.
 */
static int attach_call(struct gpuq_client *c, struct mp_map *req, int lock,
		       struct gpuq_reply **r, struct gpuq_error *err)
{
	unsigned timeout = gpuq_get_timeout(c);
	if (timeout) {
		mp_put_u64(req, "timeout_ms", timeout);
		gpuq_set_timeout(c, timeout < UINT_MAX - ATTACH_REPLY_GRACE_MS
					    ? timeout + ATTACH_REPLY_GRACE_MS : UINT_MAX);
	}
	int rc = share_call(c, req, lock >= 0 ? &lock : NULL, lock >= 0 ? 1 : 0, r, err);
	gpuq_set_timeout(c, timeout);
	return rc;
}

/*
 * The attach of buffer, another user's (owner) when owner is not NULL; a
 * revocable one when lock (revocable_lock_new) is not -1, which then
 * becomes the attachment's.
 */
static int attach_buffer(struct gpuq_client *c, const char *buffer, const uint64_t *owner,
			 bool read_write, int lock, struct gpuq_attachment *out,
			 struct gpuq_error *err)
{
	struct gpuq_reply *r;
	struct mp_map req;
	char uuid[64] = "";
	bool host = false;
	memset(out, 0, sizeof *out);
	out->read_write = read_write;
	out->lock_fd = -1;
	gpuq_request_begin(c, &req, "attach");
	mp_put_str(&req, "buffer", buffer);
	if (owner)
		mp_put_u64(&req, "owner", *owner);
	mp_put_str(&req, "mode", read_write ? "read-write" : "read");
	if (lock >= 0) {
		mp_put_bool(&req, "revocable", true);
		mp_put_u64(&req, "fds", 1); /* the lock */
	}
	mp_put_bool(&req, "wait", true);
	if (attach_call(c, &req, lock, &r, err) < 0)
		return -1;
	double start = now_s();
	int fd = gpuq_reply_take_fd(r, 0);
	int rc = read_attach_result(r, out, uuid, sizeof uuid, &host, err);
	gpuq_reply_free(r);
	if (rc == 0 && fd < 0)
		rc = gpuq_fail(err, GPUQ_E_IO, "gpuqd's attach reply came without the buffer's handle");
	if (rc == 0)
		rc = host ? attach_host(out, fd, err) : gpuq_cuda_import(out, fd, uuid, err);
	if (fd >= 0)
		close(fd); /* a mapping, or an imported handle, keeps what it needs */
	out->import_s = now_s() - start;
	if (rc < 0 && out->lease) {
		struct gpuq_error ignored;
		release_lease(c, out->lease, &ignored); /* nothing here maps it */
	}
	return rc;
}

int gpuq_buffer_attach(struct gpuq_client *c, const char *buffer, bool read_write,
		       struct gpuq_attachment *out, struct gpuq_error *err)
{
	return attach_buffer(c, buffer, NULL, read_write, -1, out, err);
}

int gpuq_buffer_attach_as(struct gpuq_client *c, const char *buffer, uint64_t owner,
			  bool read_write, struct gpuq_attachment *out, struct gpuq_error *err)
{
	return attach_buffer(c, buffer, &owner, read_write, -1, out, err);
}

int gpuq_buffer_attach_revocable(struct gpuq_client *c, const char *buffer, bool read_write,
				 struct gpuq_attachment *out, struct gpuq_error *err)
{
	int lock = revocable_lock_new(err);
	if (lock < 0)
		return -1;
	if (attach_buffer(c, buffer, NULL, read_write, lock, out, err) < 0) {
		close(lock); /* gpuqd's copy, if it took one, went with the lease */
		return -1;
	}
	out->revocable = true;
	out->uses = 1; /* byte 1, locked before the attach: the first use */
	out->lock_fd = lock;
	pthread_mutex_init(&out->use_mutex, NULL);
	return 0;
}

int gpuq_attachment_read(const struct gpuq_attachment *a, uint64_t offset, void *dst, size_t n,
			 bool pinned, double *seconds, struct gpuq_error *err)
{
	if (!a->ptr || offset > a->bytes || n > a->bytes - offset)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "attachment read: %zu bytes at %llu are outside the %llu-byte buffer", n,
				 (unsigned long long)offset, (unsigned long long)a->bytes);
	if (!a->host)
		return gpuq_cuda_read(a, offset, dst, n, pinned, seconds, err);
	double start = now_s();
	memcpy(dst, (const char *)a->ptr + offset, n);
	if (seconds)
		*seconds = now_s() - start;
	return 0;
}

/*
 * A revocable lease's release: none where it has ended already, and one that
 * ends meanwhile (gpuqd answers not_found) ended as asked. Its lock closes,
 * dropping this process's lock on byte 1 with it.
 */
static int release_revocable(struct gpuq_client *c, struct gpuq_attachment *a,
			     struct gpuq_error *err)
{
	int rc = 0;
	if (revocable_lease_lives(a->lock_fd) && release_lease(c, a->lease, err) < 0 &&
	    err->code != GPUQ_E_NOT_FOUND)
		rc = -1;
	if (a->lock_fd >= 0) { /* a second release finds it closed */
		close(a->lock_fd);
		pthread_mutex_destroy(&a->use_mutex);
	}
	a->lock_fd = -1;
	a->uses = 0;
	return rc;
}

int gpuq_buffer_release(struct gpuq_client *c, struct gpuq_attachment *a, struct gpuq_error *err)
{
	struct gpuq_error unmap_err;
	int rc = 0;
	if (a->host && a->ptr)
		munmap(a->ptr, a->map_bytes);
	else if (a->ptr)
		rc = gpuq_cuda_unimport(a, &unmap_err);
	a->ptr = NULL;
	if (a->revocable ? release_revocable(c, a, err) < 0 : release_lease(c, a->lease, err) < 0)
		return -1;
	if (rc < 0)
		*err = unmap_err;
	return rc;
}
