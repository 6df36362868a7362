/*
 * put and get: bytes between a client's descriptor and a buffer. The main
 * thread checks the descriptor, the range and the options before anything
 * moves, so a refused request changes no byte; the worker does the moving
 * (workers/transfer/transfer.c). Main thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "workers/transfer/transfer.h"

/* The one descriptor a put/get carries, checked for the access it needs. */
static int read_descriptor(struct request *req, bool for_reading, struct gpuq_error *err)
{
	const char *op = for_reading ? "put" : "get";
	struct stat st;
	if (req->nfds != 1)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "%s needs exactly one descriptor attached (fds: 1), not %d", op,
				 req->nfds);
	int flags = fcntl(req->fds[0], F_GETFL);
	if (flags < 0 || fstat(req->fds[0], &st) < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "the descriptor passed to %s: %s", op,
				 strerror(errno));
	int mode = flags & O_ACCMODE;
	if (flags & O_PATH)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the descriptor passed to %s was opened with O_PATH and can be neither "
				 "read nor written", op);
	if (for_reading && mode == O_WRONLY)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the descriptor passed to put is open for writing only; open the source for reading");
	if (!for_reading && mode == O_RDONLY)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the descriptor passed to get is open for reading only; open the destination for writing");
	if (S_ISDIR(st.st_mode))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "the descriptor passed to %s is a directory",
				 op);
	return 0;
}

/*
 * offset and length within b: from the reference's [OFFSET:LENGTH] or from
 * the `offset` and `length` fields, not both. *has_length says whether a
 * length was given.
 */
static int read_range(struct request *req, const struct buffer *b, const struct buffer_ref *ref,
		      uint64_t *offset, uint64_t *length, bool *has_length, struct gpuq_error *err)
{
	int has_offset = msg_get_u64(req->map, "offset", offset, err);
	int has_len = has_offset < 0 ? -1 : msg_get_u64(req->map, "length", length, err);
	if (has_len < 0)
		return -1;
	if (ref->has_range && (has_offset || has_len))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "buffer '%s@%d' is given a range both in 'buffer' ([OFFSET:LENGTH]) and "
				 "in 'offset'/'length'; give one",
				 b->name, b->device);
	if (ref->has_range) {
		*offset = ref->offset;
		*length = ref->length;
		has_len = ref->has_length;
	} else if (!has_offset) {
		*offset = 0;
	}
	*has_length = has_len;
	return buffer_range_check(b, *offset, *has_length, *length, length, err);
}

/* A regular file that holds more than the room would fail late: refuse it now. */
static int check_source_fits(int fd, const struct buffer *b, uint64_t offset, uint64_t room,
			     struct gpuq_error *err)
{
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		return 0;
	off_t pos = lseek(fd, 0, SEEK_CUR);
	uint64_t left = pos >= 0 && pos < st.st_size ? (uint64_t)(st.st_size - pos) : 0;
	if (left > room)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the source holds %llu bytes but buffer '%s@%d' has room for %llu from offset %llu; "
				 "give --length or use a larger buffer",
				 (unsigned long long)left, b->name, b->device, (unsigned long long)room,
				 (unsigned long long)offset);
	return 0;
}

/* `verify` (bool), `path` (auto, staged, registered), `seed` (scratch). */
static int read_copy_options(struct request *req, bool put, struct work *w,
			     struct gpuq_error *err)
{
	char path[16] = "auto";
	w->verify = false;
	if (msg_get_bool(req->map, "verify", &w->verify, err) < 0 ||
	    msg_get_str(req->map, "path", path, sizeof path, err) < 0 ||
	    msg_get_u64(req->map, "seed", &w->seed, err) < 0)
		return -1;
	if (strcmp(path, "auto") == 0)
		w->path = TRANSFER_PATH_AUTO;
	else if (strcmp(path, "staged") == 0)
		w->path = TRANSFER_PATH_STAGED;
	else if (strcmp(path, "registered") == 0)
		w->path = TRANSFER_PATH_REGISTERED;
	else
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'path': '%s' is not auto, staged or registered", path);
	if (w->path == TRANSFER_PATH_REGISTERED && w->scratch)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "path registered needs a memfd; a scratch %s has none",
				 put ? "source" : "sink");
	if (w->path != TRANSFER_PATH_AUTO && msg_map_get(req->map, "region"))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'path': a region is pinned already and always takes path region; "
				 "leave path out (or auto)");
	if (w->path == TRANSFER_PATH_REGISTERED)
		return transfer_check_registrable(req->fds[0], put, err);
	return 0;
}

/*
 * `scratch` or `region`: no descriptor; otherwise exactly one, with the
 * access it needs.
 */
static int read_endpoint(struct request *req, bool put, struct work *w, struct gpuq_error *err)
{
	bool region = msg_map_get(req->map, "region") != NULL;
	w->scratch = false;
	if (msg_get_bool(req->map, "scratch", &w->scratch, err) < 0)
		return -1;
	if (region && (w->scratch || req->nfds != 0))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "a %s through a region takes no descriptor and no scratch (%d descriptors came)",
				 put ? "put" : "get", req->nfds);
	if (region)
		return 0;
	if (!w->scratch)
		return read_descriptor(req, put, err);
	if (req->nfds != 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "a scratch %s takes no descriptor, but %d came with the request",
				 put ? "source" : "sink", req->nfds);
	return 0;
}

static void submit_transfer(struct request *req, bool put)
{
	struct gpuq_error err;
	struct buffer_ref ref;
	struct work opts;
	struct region_span span = { NULL, 0 };
	uint64_t offset = 0, length = 0;
	bool has_length = false;
	memset(&opts, 0, sizeof opts);
	struct buffer *b = read_buffer_ref(req, "buffer", &ref, &err);
	int rc = b ? read_endpoint(req, put, &opts, &err) : -1;
	if (rc == 0)
		rc = read_range(req, b, &ref, &offset, &length, &has_length, &err);
	if (rc == 0 && (rc = region_transfer_read(req, put, b, offset, &length, has_length,
							  &span, &err)) > 0)
		has_length = true; /* the region's range says how many bytes move */
	if (rc == 0 && put && !has_length && !opts.scratch)
		rc = check_source_fits(req->fds[0], b, offset, length, &err);
	if (rc >= 0)
		rc = read_copy_options(req, put, &opts, &err);
	if (rc < 0) {
		reply_error(req, &err);
		return;
	}
	struct job *job = new_job(req, put ? &kind_put : &kind_get, put ? WORK_PUT : WORK_GET,
				  b->device);
	if (!job)
		return;
	job_attach_buffer(job, b);
	job->work.offset = offset;
	job->work.length = length;
	work_narrow_access(&job->work, offset, length, put);
	job->work.length_exact = put && has_length;
	job->work.verify = opts.verify;
	job->work.path = opts.path;
	job->work.scratch = opts.scratch;
	job->work.seed = opts.seed;
	job->work.idle_timeout_ms = req->d->opt.transfer_idle_timeout_ms;
	if (span.region)
		region_transfer_hold(job, &span, put);
	else if (!opts.scratch) {
		job->work.fd = req->fds[0];
		req->fds[0] = -1; /* the job closes it when done */
	}
	job_submit(req, job);
}

void op_put(struct request *req)
{
	submit_transfer(req, true);
}

void op_get(struct request *req)
{
	submit_transfer(req, false);
}
