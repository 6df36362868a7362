/*
 * The job commands: noop, alloc, free, put, get, fill, checksum. Each packs
 * its arguments into one request that, unless --detach, asks the daemon to
 * reply when the job has finished (job_call.c begins and finishes it).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/cli/cli.h"

static int job_send(struct cli *cli, struct mp_map *req, const int *fds, int nfds)
{
	struct gpuq_reply *r;
	int rc = progress_call(cli, req, fds, nfds, &r);

	return rc ? rc : cli_finish_job(cli, r);
}

int cmd_noop(struct cli *cli)
{
	struct mp_map req;
	int rc = cli_job_begin(cli, &req, "noop");

	if (rc)
		return rc;
	if (cli->has_device)
		mp_put_u64(&req, "device", cli->device);
	return job_send(cli, &req, NULL, 0);
}

/* alloc's size grammar: --bytes SIZE, or --count N with --dtype T. */
static int check_alloc_size(const struct cli *cli)
{
	if (!cli->has_bytes && !cli->has_count)
		return cli_usage(cli, "give the size: --bytes SIZE, or --count N with --dtype T");
	if (cli->has_bytes && cli->has_count)
		return cli_usage(cli, "--bytes and --count both give the size; keep one");
	if (cli->has_count && !cli->dtype)
		return cli_usage(cli, "--count needs --dtype T (one of %s)", gpuq_dtype_list());
	return 0;
}

/*
 * An ephemeral buffer lives as long as the connection that made it: keep
 * it open until a signal ends gpuq (the daemon then frees the buffer) or
 * the daemon closes it.
 */
static int hold_ephemeral(struct cli *cli)
{
	fprintf(stderr, "gpuq: holding ephemeral buffer %s until gpuq is interrupted or killed\n",
		cli->args[0]);
	fflush(NULL);
	return cli_hold_connection(cli, "the buffer");
}

/*
 * alloc NAME@GPU is alloc NAME --device GPU, as every other command reads
 * a buffer; both given, they must agree. *name_len is the NAME part's length.
 */
static int split_alloc_name(struct cli *cli, size_t *name_len)
{
	const char *name = cli->args[0], *at = strrchr(name, '@');
	*name_len = strlen(name);
	if (!at || at[1] < '0' || at[1] > '9')
		return 0; /* no device part: the daemon judges the name as it is */
	char *end;
	errno = 0;
	unsigned long long dev = strtoull(at + 1, &end, 10);
	if (*end != '\0' || errno != 0 || dev > INT_MAX)
		return cli_usage(cli, "'%s': the device after '@' is not a number", name);
	if (cli->has_device && cli->device != dev)
		return cli_usage(cli, "'%s' says device %llu but --device says %llu; give one", name,
				 dev, (unsigned long long)cli->device);
	cli->device = dev;
	cli->has_device = true;
	*name_len = (size_t)(at - name);
	return 0;
}

int cmd_alloc(struct cli *cli)
{
	struct mp_map req;
	size_t name_len;
	int rc = check_alloc_size(cli);

	if (rc || (rc = split_alloc_name(cli, &name_len)) || (rc = cli_job_begin(cli, &req, "alloc")))
		return rc;
	mp_put_strn(&req, "name", cli->args[0], name_len);
	if (cli->has_device)
		mp_put_u64(&req, "device", cli->device);
	if (cli->has_bytes)
		mp_put_u64(&req, "bytes", cli->bytes);
	if (cli->has_count)
		mp_put_u64(&req, "count", cli->count);
	if (cli->dtype)
		mp_put_str(&req, "dtype", cli->dtype);
	if (cli->has_wait_memory)
		mp_put_u64(&req, "wait_memory_ms", cli->wait_memory_ms);
	if (cli->ephemeral)
		mp_put_bool(&req, "ephemeral", true);
	if (cli->shareable)
		mp_put_bool(&req, "shareable", true);
	rc = job_send(cli, &req, NULL, 0);
	return rc == CLI_OK && cli->ephemeral ? hold_ephemeral(cli) : rc;
}

/* free and checksum: a job on one buffer with nothing else. */
static int buffer_job(struct cli *cli, const char *op)
{
	struct mp_map req;
	int rc = cli_job_begin(cli, &req, op);

	if (rc)
		return rc;
	mp_put_str(&req, "buffer", cli->args[0]);
	return job_send(cli, &req, NULL, 0);
}

int cmd_free(struct cli *cli)
{
	return buffer_job(cli, "free");
}

int cmd_checksum(struct cli *cli)
{
	return buffer_job(cli, "checksum");
}

/* FILE "scratch:": no file; gpuqd makes the bytes up (put) or drops them (get). */
#define SCRATCH "scratch:"
/* FILE "region:NAME[START:STOP]": a host region (gpuq region create), one DMA. */
#define REGION "region:"

/*
 * put and get: the buffer (BUF may carry a range, NAME[START:STOP]), the
 * window, the options, and the descriptor the bytes move through (-1: the
 * scratch source or sink). On a terminal a progress bar runs on stderr
 * while the job does; it is cleared before the summary is printed.
 */
static int transfer_via(struct cli *cli, const char *op, const char *buf, int fd,
			const char *region)
{
	struct progress_bar bar;
	struct gpuq_reply *r;
	struct mp_map req;
	char label[128];
	int rc = cli_job_begin(cli, &req, op);

	if (rc)
		return rc;
	mp_put_str(&req, "buffer", buf);
	if (region)
		mp_put_str(&req, "region", region);
	else if (fd >= 0)
		mp_put_u64(&req, "fds", 1);
	else
		mp_put_bool(&req, "scratch", true);
	if (cli->has_offset)
		mp_put_u64(&req, "offset", cli->offset);
	if (cli->has_length)
		mp_put_u64(&req, "length", cli->length);
	if (cli->verify)
		mp_put_bool(&req, "verify", true);
	if (cli->path)
		mp_put_str(&req, "path", cli->path);
	snprintf(label, sizeof(label), "%s %s", op, buf);
	progress_begin(cli, &req, &bar, label);
	rc = cli_call(cli, &req, &fd, fd >= 0 && !region, &r);
	progress_end(cli, &bar);
	return rc ? rc : cli_finish_job(cli, r);
}

static int transfer(struct cli *cli, const char *op, const char *buf, int fd)
{
	return transfer_via(cli, op, buf, fd, NULL);
}

/* put or get through a region (FILE region:NAME[START:STOP]): no descriptor, one DMA. */
static int region_transfer(struct cli *cli, const char *op, const char *buffer, const char *region)
{
	return transfer_via(cli, op, buffer, -1, region);
}

/* A FILE that cannot be opened is the command line's fault: exit 2. */
static int open_failed(const struct cli *cli, const char *path, const char *how)
{
	fprintf(stderr, "gpuq %s: cannot open '%s' for %s: %s\n", cli->cmd->name, path,
		how, strerror(errno));
	return CLI_USAGE;
}

int cmd_put(struct cli *cli)
{
	const char *path = cli->args[0];
	int fd, rc;

	if (strcmp(path, "-") == 0)
		return transfer(cli, "put", cli->args[1], STDIN_FILENO);
	if (strcmp(path, SCRATCH) == 0)
		return transfer(cli, "put", cli->args[1], -1);
	if (strncmp(path, REGION, strlen(REGION)) == 0)
		return region_transfer(cli, "put", cli->args[1], path + strlen(REGION));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return open_failed(cli, path, "reading");
	rc = put_make_missing(cli, cli->args[1], fd);
	if (rc == CLI_OK)
		rc = transfer(cli, "put", cli->args[1], fd);
	close(fd);
	return rc;
}

/* get to stdout: the bytes own stdout, so the summary moves to stderr. */
static int get_to_stdout(struct cli *cli)
{
	if (cli->json)
		return cli_usage(cli, "--json and FILE '-' would both write to stdout; "
				      "give a FILE or drop --json");
	if (isatty(STDOUT_FILENO))
		return cli_usage(cli, "refusing to write buffer bytes to a terminal; "
				      "redirect stdout or give a FILE");
	cli->out = stderr;
	return transfer(cli, "get", cli->args[0], STDOUT_FILENO);
}

/*
 * After a get into a regular file: what was there past the bytes written
 * goes (gpuqd leaves the descriptor's offset at their end), as if the file
 * had been truncated first.
 */
static int cut_to_what_was_written(const char *path, int fd)
{
	struct stat st;
	off_t end = lseek(fd, 0, SEEK_CUR);
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || end < 0 || st.st_size <= end)
		return CLI_OK;
	if (ftruncate(fd, end) == 0)
		return CLI_OK;
	fprintf(stderr, "gpuq get: cannot cut '%s' to the %lld bytes written: %s\n", path,
		(long long)end, strerror(errno));
	return CLI_REFUSED;
}

int cmd_get(struct cli *cli)
{
	const char *path = cli->args[1];
	int fd, rc;

	if (strcmp(path, "-") == 0)
		return get_to_stdout(cli);
	if (strcmp(path, SCRATCH) == 0)
		return transfer(cli, "get", cli->args[0], -1);
	if (strncmp(path, REGION, strlen(REGION)) == 0)
		return region_transfer(cli, "get", cli->args[0], path + strlen(REGION));
	/*
	 * Read and write where allowed: gpuqd can then map the file and write it
	 * in parallel. Not truncated first: a get that fails before it writes
	 * (a mistyped name, a stopped gpuqd) must not have emptied the file.
	 */
	struct stat st;
	bool existed = stat(path, &st) == 0;
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0 && errno == EACCES)
		fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0)
		return open_failed(cli, path, "writing");
	rc = transfer(cli, "get", cli->args[0], fd);
	if (rc == CLI_OK)
		rc = cut_to_what_was_written(path, fd);
	else if (!existed)
		unlink(path); /* the file this get made, and wrote nothing good to */
	close(fd);
	return rc;
}

/*
 * fill's argument, parsed before anything is sent. V travels as an integer
 * when it reads as one (so that i64 buffers get every bit), else as a float;
 * the daemon checks the range.
 */
struct fill_arg {
	enum { FILL_ARG_NONE, FILL_ARG_INT, FILL_ARG_UINT, FILL_ARG_FLOAT, FILL_ARG_SEED } kind;
	int64_t i;
	uint64_t u;
	double d;
};

/* An optional '-', then decimal digits only. */
static bool is_integer_literal(const char *s)
{
	if (*s == '-')
		s++;
	size_t digits = strspn(s, "0123456789");
	return digits > 0 && s[digits] == '\0';
}

static int parse_fill_value(const struct cli *cli, const char *s, struct fill_arg *a)
{
	char *end;

	errno = 0;
	a->i = strtoll(s, &end, 10);
	if (*s && !*end && !errno) {
		a->kind = FILL_ARG_INT;
		return 0;
	}
	errno = 0;
	a->u = strtoull(s, &end, 10);
	if (*s && *s != '-' && !*end && !errno) {
		a->kind = FILL_ARG_UINT;
		return 0;
	}
	/* Sent as a float, it would round to a value an integer buffer takes (-2^63 - 1 to -2^63). */
	if (is_integer_literal(s))
		return cli_usage(cli, "V '%s' is beyond every integer dtype (-2^63 to 2^64-1); for a "
				      "float buffer write it as a float, such as 1.8e19", s);
	a->d = strtod(s, &end);
	if (!*s || *end)
		return cli_usage(cli, "V '%s' is not a number (an integer, or a float "
				      "such as 0.5 or 1e-3)", s);
	a->kind = FILL_ARG_FLOAT;
	return 0;
}

/* Checks that the pattern's argument is there exactly when it takes one, and parses it. */
static int parse_fill_arg(const struct cli *cli, const char *pattern, struct fill_arg *a)
{
	bool value = strcmp(pattern, "value") == 0, random = strcmp(pattern, "random") == 0;

	a->kind = FILL_ARG_NONE;
	if ((value || random) && cli->nargs < 3)
		return cli_usage(cli, "pattern '%s' needs %s", pattern,
				 value ? "a value V" : "a SEED");
	if (!value && !random && cli->nargs > 2)
		return cli_usage(cli, "pattern '%s' takes no argument (only value V and "
				      "random SEED do), but '%s' follows it",
				 pattern, cli->args[2]);
	if (value)
		return parse_fill_value(cli, cli->args[2], a);
	if (random && cli_parse_uint(cli->args[2], &a->u) < 0)
		return cli_usage(cli, "SEED '%s' is not a number (0 to 2^64-1)", cli->args[2]);
	if (random)
		a->kind = FILL_ARG_SEED;
	return 0;
}

static void put_fill_arg(struct mp_map *req, const struct fill_arg *a)
{
	switch (a->kind) {
	case FILL_ARG_INT:
		mp_put_i64(req, "value", a->i);
		break;
	case FILL_ARG_UINT:
		mp_put_u64(req, "value", a->u);
		break;
	case FILL_ARG_FLOAT:
		mp_put_f64(req, "value", a->d);
		break;
	case FILL_ARG_SEED:
		mp_put_u64(req, "seed", a->u);
		break;
	case FILL_ARG_NONE:
		break;
	}
}

int cmd_fill(struct cli *cli)
{
	const char *pattern = cli->args[1];
	struct fill_arg arg;
	struct mp_map req;
	int rc = parse_fill_arg(cli, pattern, &arg);

	if (rc || (rc = cli_job_begin(cli, &req, "fill")))
		return rc;
	mp_put_str(&req, "buffer", cli->args[0]);
	mp_put_str(&req, "pattern", pattern);
	put_fill_arg(&req, &arg);
	return job_send(cli, &req, NULL, 0);
}
