/*
 * The gpuq command line: global options, then a command with its own
 * options and arguments. Only syntax is checked here (is it a number, is an
 * argument missing); whether a buffer, device or dtype exists is the
 * daemon's to say.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli/cli.h"

enum {
	LONG_DEVICE = 256,
	LONG_OFFSET,
	LONG_LENGTH,
	LONG_BYTES,
	LONG_COUNT,
	LONG_DTYPE,
	LONG_DETACH,
	LONG_CLIENTS,
	LONG_REQUESTS,
	LONG_VERIFY,
	LONG_PATH,
	LONG_SIZES,
	LONG_ENGINE,
	LONG_MODE,
	LONG_REPEAT,
	LONG_OUT,
	LONG_DEVICES,
	LONG_REDOP,
	LONG_FACTOR,
	LONG_COLL_TIMEOUT,
	LONG_PRIORITY,
	LONG_WAIT_MEMORY,
	LONG_ROOT,
	LONG_REDUCE,
	LONG_KERNEL,
	LONG_MATH,
	LONG_EPHEMERAL,
	LONG_SHAREABLE,
	LONG_READ_ONLY,
	LONG_LAST,
	LONG_RUNNING,
	LONG_QUEUED,
	LONG_FAILED,
	LONG_SAVE_JSON,
	LONG_INTERVAL,
	LONG_ONCE,
	LONG_UID,
	LONG_BINARY,
	LONG_OWNER,
};

/* Accepted before the command and after it. */
static const struct option global_options[] = {
	{ "socket", required_argument, NULL, 's' },
	{ "json", no_argument, NULL, 'j' },
	{ "timeout", required_argument, NULL, 't' },
	{ "help", no_argument, NULL, 'h' },
};
#define GLOBAL_SHORT "s:jt:h"
#define N_GLOBAL (sizeof(global_options) / sizeof(global_options[0]))

/* Every command option, with the enum cli_opt bit that allows it. */
static const struct {
	struct option opt;
	uint64_t bit;
} command_options[] = {
	{ { "device", required_argument, NULL, LONG_DEVICE }, OPT_DEVICE },
	{ { "offset", required_argument, NULL, LONG_OFFSET }, OPT_OFFSET },
	{ { "length", required_argument, NULL, LONG_LENGTH }, OPT_LENGTH },
	{ { "bytes", required_argument, NULL, LONG_BYTES }, OPT_BYTES },
	{ { "count", required_argument, NULL, LONG_COUNT }, OPT_COUNT },
	{ { "dtype", required_argument, NULL, LONG_DTYPE }, OPT_DTYPE },
	{ { "detach", no_argument, NULL, LONG_DETACH }, OPT_DETACH },
	{ { "clients", required_argument, NULL, LONG_CLIENTS }, OPT_CLIENTS },
	{ { "requests", required_argument, NULL, LONG_REQUESTS }, OPT_REQUESTS },
	{ { "verify", no_argument, NULL, LONG_VERIFY }, OPT_VERIFY },
	{ { "path", required_argument, NULL, LONG_PATH }, OPT_PATH },
	{ { "sizes", required_argument, NULL, LONG_SIZES }, OPT_SIZES },
	{ { "engine", required_argument, NULL, LONG_ENGINE }, OPT_ENGINE },
	{ { "mode", required_argument, NULL, LONG_MODE }, OPT_MODE },
	{ { "repeat", required_argument, NULL, LONG_REPEAT }, OPT_REPEAT },
	{ { "out", required_argument, NULL, LONG_OUT }, OPT_OUT },
	{ { "devices", required_argument, NULL, LONG_DEVICES }, OPT_DEVICES },
	{ { "op", required_argument, NULL, LONG_REDOP }, OPT_REDOP },
	{ { "factor", required_argument, NULL, LONG_FACTOR }, OPT_FACTOR },
	{ { "collective-timeout", required_argument, NULL, LONG_COLL_TIMEOUT }, OPT_COLL_TIMEOUT },
	{ { "priority", required_argument, NULL, LONG_PRIORITY }, OPT_PRIORITY },
	{ { "wait-memory", required_argument, NULL, LONG_WAIT_MEMORY }, OPT_WAIT_MEMORY },
	{ { "root", required_argument, NULL, LONG_ROOT }, OPT_ROOT },
	{ { "reduce", required_argument, NULL, LONG_REDUCE }, OPT_REDUCE },
	{ { "kernel", required_argument, NULL, LONG_KERNEL }, OPT_KERNEL },
	{ { "math", required_argument, NULL, LONG_MATH }, OPT_MATH },
	{ { "ephemeral", no_argument, NULL, LONG_EPHEMERAL }, OPT_EPHEMERAL },
	{ { "shareable", no_argument, NULL, LONG_SHAREABLE }, OPT_SHAREABLE },
	{ { "read-only", no_argument, NULL, LONG_READ_ONLY }, OPT_READ_ONLY },
	{ { "last", required_argument, NULL, LONG_LAST }, OPT_JOBS_SELECT },
	{ { "running", no_argument, NULL, LONG_RUNNING }, OPT_JOBS_SELECT },
	{ { "queued", no_argument, NULL, LONG_QUEUED }, OPT_JOBS_SELECT },
	{ { "failed", no_argument, NULL, LONG_FAILED }, OPT_JOBS_SELECT },
	{ { "save-json", required_argument, NULL, LONG_SAVE_JSON }, OPT_SAVE_JSON },
	{ { "interval", required_argument, NULL, LONG_INTERVAL }, OPT_TOP },
	{ { "once", no_argument, NULL, LONG_ONCE }, OPT_TOP },
	{ { "uid", required_argument, NULL, LONG_UID }, OPT_UID },
	{ { "binary", required_argument, NULL, LONG_BINARY }, OPT_BINARY },
	{ { "owner", required_argument, NULL, LONG_OWNER }, OPT_OWNER },
};
#define N_COMMAND (sizeof(command_options) / sizeof(command_options[0]))

int cli_parse_uint(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end)
		return -1;
	*out = v;
	return 0;
}

int cli_usage(const struct cli *cli, const char *fmt, ...)
{
	const char *name = cli->cmd ? cli->cmd->name : NULL;
	va_list ap;

	fprintf(stderr, "gpuq%s%s: ", name ? " " : "", name ? name : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (name)
		fprintf(stderr, "\nusage: gpuq %s%s%s%s\n(gpuq %s --help says more)\n", name,
			*cli->cmd->synopsis ? " " : "", cli->cmd->synopsis, cli->cmd->opts & OPT_DETACH ? " [--detach]" : "",
			name);
	else
		fprintf(stderr, "\nusage: gpuq [--socket PATH] [--json] [--timeout MS] "
				"COMMAND [ARGS]\n(gpuq --help lists the commands)\n");
	return CLI_USAGE;
}

int cli_parse_job(const struct cli *cli, const char *s, uint64_t *out)
{
	if (cli_parse_uint(s, out) < 0 || *out == 0)
		return cli_usage(cli, "JOB '%s' is not a job id; give the number that "
				      "a job command or `gpuq jobs` printed", s);
	return 0;
}

/* --offset, --length, --bytes, --count: a size with an optional unit (gpuq_parse_size). */
static int parse_size_opt(const struct cli *cli, const char *opt, const char *s,
			  uint64_t *out, bool *has)
{
	if (gpuq_parse_size(s, out) < 0)
		return cli_usage(cli, "--%s '%s' is not a size; give a number with an "
				      "optional unit (4096, 64K, 1.5G, 64KiB, 100MB)", opt, s);
	*has = true;
	return 0;
}

static int parse_uint_opt(const struct cli *cli, const char *opt, const char *s,
			  const char *what, uint64_t *out, bool *has)
{
	if (cli_parse_uint(s, out) < 0)
		return cli_usage(cli, "--%s '%s' is not %s", opt, s, what);
	*has = true;
	return 0;
}

/*
 * --owner UID|USER: a uid as it is, or a user name looked up here (the
 * protocol's `owner` is a uid). Whether the caller may name another owner
 * is the daemon's to say.
 */
static int parse_owner_opt(struct cli *cli, const char *arg)
{
	if (cli_parse_uint(arg, &cli->owner) == 0) {
		cli->has_owner = true;
		return 0;
	}
	const struct passwd *pw = getpwnam(arg);
	if (!pw)
		return cli_usage(cli, "--owner '%s' is neither a uid nor a user name known here",
				 arg);
	cli->owner = (uint64_t)pw->pw_uid;
	cli->has_owner = true;
	return 0;
}

/* The options every command shares; 1 if c was one of them, else 0 or an exit code. */
static int parse_global_opt(struct cli *cli, int c, const char *arg)
{
	switch (c) {
	case 's':
		cli->socket = arg;
		return 1;
	case 'j':
		cli->json = true;
		return 1;
	case 't':
		if (parse_uint_opt(cli, "timeout", arg, "a time in milliseconds (e.g. 5000)",
				   &cli->timeout_ms, &cli->has_timeout) != 0)
			return -CLI_USAGE;
		if (cli->timeout_ms > UINT32_MAX / 2)
			return -cli_usage(cli, "--timeout %s is too long; give at most %u ms",
					  arg, UINT32_MAX / 2);
		return 1;
	}
	return 0;
}

/* A command option (not a global one); 0 or CLI_USAGE. */
static int parse_command_opt(struct cli *cli, int c, const char *arg)
{
	switch (c) {
	case LONG_DEVICE:
		return parse_uint_opt(cli, "device", arg,
				      "a device index; `gpuq devices` lists them",
				      &cli->device, &cli->has_device);
	case LONG_OFFSET:
		return parse_size_opt(cli, "offset", arg, &cli->offset, &cli->has_offset);
	case LONG_LENGTH:
		return parse_size_opt(cli, "length", arg, &cli->length, &cli->has_length);
	case LONG_BYTES:
		if (cli->cmd->run == cmd_bench && strchr(arg, ':')) {
			cli->bytes_range = arg; /* bench allreduce --bytes MIN:MAX */
			return 0;
		}
		return parse_size_opt(cli, "bytes", arg, &cli->bytes, &cli->has_bytes);
	case LONG_COUNT:
		return parse_size_opt(cli, "count", arg, &cli->count, &cli->has_count);
	case LONG_DTYPE:
		cli->dtype = arg;
		return 0;
	case LONG_DETACH:
		cli->detach = true;
		return 0;
	case LONG_CLIENTS:
		cli->clients = arg;
		return 0;
	case LONG_REQUESTS:
		return parse_uint_opt(cli, "requests", arg, "a number of requests per client",
				      &cli->requests, &cli->has_requests);
	case LONG_VERIFY:
		cli->verify = true;
		return 0;
	case LONG_EPHEMERAL:
		cli->ephemeral = true;
		return 0;
	case LONG_PATH:
		cli->path = arg;
		return 0;
	case LONG_SIZES:
		cli->sizes = arg;
		return 0;
	case LONG_ENGINE:
		cli->engine = arg;
		return 0;
	case LONG_MODE:
		cli->mode = arg;
		return 0;
	case LONG_REPEAT:
		return parse_uint_opt(cli, "repeat", arg, "a number of passes (1, 2, ...)",
				      &cli->repeat, &cli->has_repeat);
	case LONG_OUT:
		cli->out_buffer = arg;
		return 0;
	case LONG_DEVICES:
		cli->devices = arg;
		return 0;
	case LONG_REDOP:
		cli->redop = arg;
		return 0;
	case LONG_FACTOR:
		return parse_uint_opt(cli, "factor", arg, "a whole factor between sizes (2, 4, ...)",
				      &cli->factor, &cli->has_factor);
	case LONG_COLL_TIMEOUT:
		return parse_uint_opt(cli, "collective-timeout", arg, "a time in milliseconds",
				      &cli->coll_timeout_ms, &cli->has_coll_timeout);
	case LONG_PRIORITY:
		cli->priority = arg; /* the daemon says which names it takes */
		return 0;
	case LONG_WAIT_MEMORY:
		return parse_uint_opt(cli, "wait-memory", arg, "a time in milliseconds",
				      &cli->wait_memory_ms, &cli->has_wait_memory);
	case LONG_UID:
		return parse_uint_opt(cli, "uid", arg, "a user id (e.g. 1000)", &cli->uid,
				      &cli->has_uid);
	case LONG_ROOT:
		return parse_uint_opt(cli, "root", arg, "a rank (an index into --devices)",
				      &cli->root, &cli->has_root);
	case LONG_REDUCE:
		cli->reduce = arg;
		return 0;
	case LONG_BINARY:
		cli->binary = arg;
		return 0;
	case LONG_OWNER:
		return parse_owner_opt(cli, arg);
	case LONG_KERNEL:
		cli->kernel = arg;
		return 0;
	case LONG_MATH:
		cli->math = arg;
		return 0;
	case LONG_SHAREABLE:
		cli->shareable = true;
		return 0;
	case LONG_READ_ONLY:
		cli->read_only = true;
		return 0;
	case LONG_LAST:
		if (cli_parse_uint(arg, &cli->last) < 0 || cli->last == 0)
			return cli_usage(cli, "--last '%s' is not a positive number of jobs", arg);
		cli->has_last = true;
		return 0;
	case LONG_RUNNING:
		cli->job_states |= CLI_JOBS_RUNNING;
		return 0;
	case LONG_QUEUED:
		cli->job_states |= CLI_JOBS_QUEUED;
		return 0;
	case LONG_FAILED:
		cli->job_states |= CLI_JOBS_FAILED;
		return 0;
	case LONG_SAVE_JSON:
		cli->save_json = arg;
		return 0;
	case LONG_INTERVAL:
		return parse_uint_opt(cli, "interval", arg, "a time in milliseconds (e.g. 500)",
				      &cli->interval_ms, &cli->has_interval);
	case LONG_ONCE:
		cli->once = true;
		return 0;
	}
	return cli_usage(cli, "unknown option");
}

/* An unknown option, or one missing its value; returns CLI_USAGE. */
static int bad_option(const struct cli *cli, int c, const char *arg)
{
	const char *name = cli->cmd ? cli->cmd->name : NULL;
	char shown[4];

	/* For a short option getopt names the letter; argv may hold a cluster. */
	if (optopt > 0 && optopt < 256 && strncmp(arg, "--", 2) != 0) {
		snprintf(shown, sizeof(shown), "-%c", optopt);
		arg = shown;
	}
	if (c == ':')
		return cli_usage(cli, "option '%s' needs a value", arg);
	return cli_usage(cli, "'%s' is not an option of gpuq%s%s", arg, name ? " " : "",
			 name ? name : "");
}

/*
 * Parses the options before the command. Returns the index of the command in
 * argv, or -(exit code) when gpuq should stop (--help, --version, an error).
 */
int cli_parse_global(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "timeout", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	int c, rc;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "+:" GLOBAL_SHORT "V", opts, NULL)) != -1) {
		if (c == 'h' || c == 'V')
			return -c;
		if (c == '?' || c == ':')
			return -bad_option(cli, c, argv[optind - 1]);
		if ((rc = parse_global_opt(cli, c, optarg)) < 0)
			return rc;
	}
	if (optind >= argc)
		return -cli_usage(cli, "no command given");
	return optind;
}

/* The getopt_long table for cmd: its own options and the global ones. */
static void build_options(const struct cli_cmd *cmd, struct option *out)
{
	size_t i, n = 0;

	for (i = 0; i < N_COMMAND; i++)
		if (cmd->opts & command_options[i].bit)
			out[n++] = command_options[i].opt;
	for (i = 0; i < N_GLOBAL; i++)
		out[n++] = global_options[i];
	memset(&out[n], 0, sizeof(out[n]));
}

/* True for "-1", "-0.5", "-.5": a value (fill's), not an option. */
static bool is_negative_number(const char *s)
{
	return s[0] == '-' && ((s[1] >= '0' && s[1] <= '9') || s[1] == '.');
}

/* Checks the positional count against the command's; 0 or CLI_USAGE. */
static int check_args(const struct cli *cli)
{
	const struct cli_cmd *cmd = cli->cmd;

	if (cli->nargs < cmd->min_args)
		return cli_usage(cli, "missing argument %s", cmd->arg_names[cli->nargs]);
	if (cli->nargs > cmd->max_args)
		return cli_usage(cli, "unexpected argument '%s'", cli->args[cmd->max_args]);
	return 0;
}

/*
 * Parses argv (argv[0] is the command's name): its options, anywhere on the
 * line, and its arguments. 0, -'h' for --help, or an exit code.
 *
 * getopt would take a negative number ("fill w0 value -1") for an option, so
 * the dash is hidden for the duration of the parse (argv strings are
 * writable) and put back afterwards.
 */
int cli_parse_command(struct cli *cli, int argc, char **argv)
{
	struct option opts[N_COMMAND + N_GLOBAL + 1];
	int c, i, rc = 0;

	build_options(cli->cmd, opts);
	for (i = 1; i < argc; i++)
		if (is_negative_number(argv[i]))
			argv[i][0] = '\x1f';
	optind = 0;
	opterr = 0;
	while (rc == 0 && (c = getopt_long(argc, argv, ":" GLOBAL_SHORT, opts, NULL)) != -1) {
		if (optarg && optarg[0] == '\x1f')
			optarg[0] = '-';
		if (c == 'h')
			rc = -'h';
		else if (c == '?' || c == ':')
			rc = bad_option(cli, c, argv[optind - 1]);
		else if ((rc = parse_global_opt(cli, c, optarg)) != 0)
			rc = rc < 0 ? -rc : 0;
		else
			rc = parse_command_opt(cli, c, optarg);
	}
	for (i = 1; i < argc; i++)
		if (argv[i][0] == '\x1f')
			argv[i][0] = '-';
	if (rc != 0)
		return rc;
	cli->args = argv + optind;
	cli->nargs = argc - optind;
	return check_args(cli);
}
