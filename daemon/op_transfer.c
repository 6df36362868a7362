/*
 * put and get: bytes between a client's descriptor and a buffer. The main
 * thread checks the descriptor and the range before anything moves, so a
 * refused request changes no byte; the worker does the moving
 * (workers/transfer.c). Main thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"

/* The one descriptor a put/get carries, checked for the access it needs. */
static int read_descriptor(struct request *req, bool for_reading, struct gpuq_error *err)
{
	const char *op = for_reading ? "put" : "get";
	if (req->nfds != 1)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "%s needs exactly one descriptor attached (fds: 1), not %d", op,
				 req->nfds);
	int flags = fcntl(req->fds[0], F_GETFL);
	if (flags < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "the descriptor passed to %s: %s", op,
				 strerror(errno));
	int mode = flags & O_ACCMODE;
	if (for_reading && mode == O_WRONLY)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the descriptor passed to put is open for writing only; open the source for reading");
	if (!for_reading && mode == O_RDONLY)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "the descriptor passed to get is open for reading only; open the destination for writing");
	return 0;
}

/* offset and length within b; *has_length says whether length was given. */
static int read_range(struct request *req, const struct buffer *b, uint64_t *offset,
		      uint64_t *length, int *has_length, struct gpuq_error *err)
{
	*offset = 0;
	if (msg_get_u64(req->map, "offset", offset, err) < 0 ||
	    (*has_length = msg_get_u64(req->map, "length", length, err)) < 0)
		return -1;
	if (*offset > b->bytes)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "offset %llu is past the end of buffer '%s@%d' (%llu bytes)",
				 (unsigned long long)*offset, b->name, b->device,
				 (unsigned long long)b->bytes);
	if (!*has_length) {
		*length = b->bytes - *offset;
	} else if (*length > b->bytes - *offset) {
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "range [%llu, %llu) is outside buffer '%s@%d' (%llu bytes)",
				 (unsigned long long)*offset,
				 (unsigned long long)(*offset + *length), b->name, b->device,
				 (unsigned long long)b->bytes);
	}
	return 0;
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

static void submit_transfer(struct request *req, bool put)
{
	struct gpuq_error err;
	uint64_t offset = 0, length = 0;
	int has_length = 0;
	struct buffer *b = read_buffer(req, &err);
	int rc = b ? read_descriptor(req, put, &err) : -1;
	if (rc == 0)
		rc = read_range(req, b, &offset, &length, &has_length, &err);
	if (rc == 0 && put && !has_length)
		rc = check_source_fits(req->fds[0], b, offset, length, &err);
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
	job->work.length_exact = put && has_length;
	job->work.fd = req->fds[0];
	req->fds[0] = -1; /* the job closes it when done */
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
