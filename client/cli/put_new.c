/*
 * gpuq put FILE NEWBUF: a buffer that does not exist yet is made first, of
 * FILE's size, as the Python client's put_array makes one for an array.
 * Only for a regular file put whole, whose size is known before a byte
 * moves: a pipe, --offset/--length or a range into a missing buffer still
 * fail with the daemon's not_found. The buffer is made as bytes (a file
 * has no dtype): gpuq alloc --count N --dtype T first for a typed one.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/cli/cli.h"

/* NAME and, after '@', the device (-1 when none); 0, or -1 when malformed (the daemon says why). */
static int split_ref(const char *spec, char *name, size_t size, long *device)
{
	const char *at = strrchr(spec, '@');
	size_t len = at ? (size_t)(at - spec) : strlen(spec);
	*device = -1;
	if (len == 0 || len >= size)
		return -1;
	memcpy(name, spec, len);
	name[len] = '\0';
	if (!at)
		return 0;
	char *end;
	errno = 0;
	long d = strtol(at + 1, &end, 10);
	if (at[1] < '0' || at[1] > '9' || *end != '\0' || errno != 0 || d > INT_MAX)
		return -1;
	*device = d;
	return 0;
}

/* Whether the caller owns a buffer called name (on device, if >= 0): 1, 0, or a CLI_ code < 0. */
static int buffer_exists(struct cli *cli, const char *name, long device, int *rc)
{
	struct mp_map req;
	struct gpuq_reply *r;
	if ((*rc = cli_begin(cli, &req, "buffers")))
		return -1;
	if (device >= 0)
		mp_put_u64(&req, "device", (uint64_t)device);
	if ((*rc = cli_call(cli, &req, NULL, 0, &r)))
		return -1;
	if (!gpuq_reply_ok(r)) {
		*rc = cli_report_refusal(r);
		gpuq_reply_free(r);
		return -1;
	}
	const msgpack_object *rows = field_array(r->root, "buffers");
	int found = 0;
	char have[256];
	for (uint32_t i = 0; rows && i < rows->via.array.size && !found; i++) {
		const msgpack_object *b = &rows->via.array.ptr[i];
		field_str(b, "name", have, sizeof have, "");
		found = strcmp(have, name) == 0 && field_u64(b, "owner", getuid()) == getuid();
	}
	gpuq_reply_free(r);
	return found;
}

/* The alloc job, waited for; its summary printed unless --json (then only put's reply is). */
static int alloc_bytes(struct cli *cli, const char *name, long device, uint64_t bytes)
{
	struct mp_map req;
	struct gpuq_reply *r;
	int rc = cli_begin(cli, &req, "alloc");
	if (rc)
		return rc;
	mp_put_str(&req, "name", name);
	if (device >= 0)
		mp_put_u64(&req, "device", (uint64_t)device);
	mp_put_u64(&req, "bytes", bytes);
	if (cli->priority)
		mp_put_str(&req, "priority", cli->priority);
	mp_put_bool(&req, "wait", true);
	if ((rc = cli_call(cli, &req, NULL, 0, &r)))
		return rc;
	if (!gpuq_reply_ok(r))
		rc = cli_report_refusal(r);
	else if (!cli->json) {
		const msgpack_object *rec = gpuq_reply_get(r, "job");
		if (rec && rec->type == MSGPACK_OBJECT_MAP)
			render_job_summary(cli->out, rec);
	}
	gpuq_reply_free(r);
	return rc;
}

int put_make_missing(struct cli *cli, const char *spec, int fd)
{
	struct stat st;
	char name[256];
	long device;
	int rc = CLI_OK;
	if (cli->has_owner)
		return CLI_OK; /* another owner's buffer: root does not make one for them */
	if (strchr(spec, '[') || cli->has_offset || cli->has_length || fstat(fd, &st) < 0 ||
	    !S_ISREG(st.st_mode) || split_ref(spec, name, sizeof name, &device) < 0)
		return CLI_OK; /* not a whole file into a plain name: the put itself answers */
	int exists = buffer_exists(cli, name, device, &rc);
	if (exists != 0)
		return exists > 0 ? CLI_OK : rc;
	return alloc_bytes(cli, name, device, (uint64_t)st.st_size);
}
