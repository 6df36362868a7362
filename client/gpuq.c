/*
 * gpuq: the command-line client of gpuqd.
 *
 *   gpuq [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]
 *
 * main parses the global options, finds the command in cli_commands, lets
 * it parse its own options and run, and returns its exit status.
 */
#include <stdio.h>
#include <string.h>

#include "client/cli.h"

#define JOB_OPTS (OPT_DETACH)

const struct cli_cmd cli_commands[] = {
	{ "ping", "", "check that gpuqd answers; show its version and backend",
	  "Asks gpuqd for its version, backend, device count, uptime and pid.\n",
	  0, 0, 0, { NULL }, cmd_ping },
	{ "devices", "", "list the devices: memory, health, queue",
	  "Lists the daemon's devices with their memory (as the driver reports it,\n"
	  "and what gpuq's buffers hold), health and queue depth. --json adds the\n"
	  "UUIDs, PCI bus ids, peer access and counters.\n",
	  0, 0, 0, { NULL }, cmd_devices },
	{ "noop", "[--device N]", "send an empty job through a device worker",
	  "Sends a job that does nothing through device N's worker (default 0):\n"
	  "it measures dispatch.\n",
	  JOB_OPTS | OPT_DEVICE, 0, 0, { NULL }, cmd_noop },
	{ "alloc", "NAME (--bytes SIZE | --count N --dtype T) [--device N]",
	  "allocate a named buffer on a device",
	  "Allocates buffer NAME on device N (default 0), sized either in bytes or\n"
	  "as N elements of dtype T (bytes u8 i32 i64 f16 bf16 f32 f64).\n",
	  JOB_OPTS | OPT_BYTES | OPT_COUNT | OPT_DTYPE | OPT_DEVICE, 1, 1, { "NAME" },
	  cmd_alloc },
	{ "free", "BUF", "free a buffer",
	  "Frees buffer BUF; refused (busy) while another job uses it.\n",
	  JOB_OPTS, 1, 1, { "BUF" }, cmd_free },
	{ "buffers", "[--device N]", "list your buffers (every user's for root)",
	  "Lists buffers, on device N only if given.\n", OPT_DEVICE, 0, 0, { NULL },
	  cmd_buffers },
	{ "put", "FILE BUF [--offset N] [--length N]",
	  "copy a file (or stdin) into a buffer",
	  "Copies FILE ('-': standard input) into BUF at --offset (default 0):\n"
	  "exactly --length bytes if given, else up to the end of FILE. gpuq opens\n"
	  "FILE itself and hands gpuqd the descriptor; the daemon never opens paths.\n",
	  JOB_OPTS | OPT_OFFSET | OPT_LENGTH, 2, 2, { "FILE", "BUF" }, cmd_put },
	{ "get", "BUF FILE [--offset N] [--length N]",
	  "copy a buffer into a file (or stdout)",
	  "Copies BUF from --offset (default 0), --length bytes (default: to its\n"
	  "end), into FILE ('-': standard output, which must not be a terminal).\n"
	  "FILE is created or truncated (mode 0666 less the umask). With FILE '-'\n"
	  "the summary goes to stderr and --json cannot be used.\n",
	  JOB_OPTS | OPT_OFFSET | OPT_LENGTH, 2, 2, { "BUF", "FILE" }, cmd_get },
	{ "fill", "BUF zero | value V | iota | random SEED",
	  "fill a buffer with a pattern",
	  "Fills BUF on its device: zero; value V (an integer or a float, converted\n"
	  "to BUF's dtype); iota (element i is i); random SEED (reproducible from\n"
	  "SEED: random bits for integer buffers, [0, 1) for float ones).\n",
	  JOB_OPTS, 2, 3, { "BUF", "PATTERN", "ARG" }, cmd_fill },
	{ "checksum", "BUF", "hash a buffer's bytes on its device",
	  "Prints BUF's 64-bit checksum, the same on every backend for the same\n"
	  "bytes.\n",
	  JOB_OPTS, 1, 1, { "BUF" }, cmd_checksum },
	{ "jobs", "", "list your jobs (every user's for root)",
	  "Lists jobs, oldest first; `gpuq status JOB` shows one in full.\n",
	  0, 0, 0, { NULL }, cmd_jobs },
	{ "status", "JOB", "show a job", "Shows every field of job JOB.\n", 0, 1, 1,
	  { "JOB" }, cmd_status },
	{ "wait", "JOB [--timeout MS]", "wait for a job to finish",
	  "Waits until job JOB finishes (at most --timeout MS) and prints what it\n"
	  "did. Exits 1 if the job failed or the wait ran out (the job goes on).\n",
	  0, 1, 1, { "JOB" }, cmd_wait },
	{ "cancel", "JOB", "cancel a job",
	  "Cancels job JOB: a queued job at once, a running put or get at its next\n"
	  "chunk (other jobs are too short to stop).\n",
	  0, 1, 1, { "JOB" }, cmd_cancel },
	{ "bench", "dispatch [--clients LIST] [--requests N] [--device N]",
	  "measure request latency against a bare socket echo",
	  "For each client count C in LIST (default 1,8), C threads with a\n"
	  "connection each make N round trips (default 2000, after 200 unmeasured)\n"
	  "to an echo thread in this process, then of ping, then of noop (waited,\n"
	  "on --device N). Prints p50/p99 latency, requests/s and the p50 ratio\n"
	  "to the echo baseline.\n",
	  BENCH_OPTS, 1, 1, { "KIND" }, cmd_bench },
	/* [copy] */
	/* [chain] */
	/* [collective] */
	/* [service] */
	{ NULL, NULL, NULL, NULL, 0, 0, 0, { NULL }, NULL },
};

static const char global_help[] =
	"Options (also accepted after COMMAND):\n"
	"  -s, --socket PATH  gpuqd's socket; by default $GPUQ_SOCKET, else\n"
	"                     /run/gpuq/gpuqd.sock for root and\n"
	"                     $XDG_RUNTIME_DIR/gpuq.sock for others\n"
	"                     (here and now: %s)\n"
	"  -j, --json         print the daemon's reply as JSON on stdout\n"
	"  -t, --timeout MS   stop waiting after MS milliseconds; for job commands\n"
	"                     and wait the daemon stops waiting and the job goes on\n"
	"  -h, --help         this help; gpuq COMMAND --help for one command\n"
	"  -V, --version      gpuq's version and protocol version\n"
	"\n"
	"BUF is NAME or NAME@GPU (w0@1). SIZE and N take K, M, G suffixes (powers\n"
	"of 1024). Job commands (noop alloc free put get fill checksum) wait for\n"
	"the job and print what it did; --detach prints the job id at once.\n"
	"\n"
	"Exit status:\n"
	"  0  success\n"
	"  1  gpuqd refused the request, or the job failed or timed out\n"
	"  2  usage error (including a FILE that cannot be opened)\n"
	"  3  gpuqd cannot be reached or did not answer in time (--timeout),\n"
	"     or the connection broke\n";

static void print_help(FILE *f)
{
	const struct cli_cmd *cmd;

	fprintf(f, "usage: gpuq [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]\n\n"
		   "Talks to gpuqd, the GPU job daemon, over its UNIX socket.\n\n"
		   "Commands (job commands also take --detach):\n");
	for (cmd = cli_commands; cmd->name; cmd++) {
		int w = fprintf(f, "  %s%s%s", cmd->name, *cmd->synopsis ? " " : "",
				cmd->synopsis);

		/* The summary goes in a column, or under a synopsis too long for it. */
		if (w > 27)
			fprintf(f, "\n%30s%s\n", "", cmd->summary);
		else
			fprintf(f, "%*s%s\n", 30 - w, "", cmd->summary);
	}
	fprintf(f, "\n");
	fprintf(f, global_help, gpuq_default_socket());
}

void cli_print_command_help(FILE *f, const struct cli_cmd *cmd)
{
	fprintf(f, "usage: gpuq %s%s%s%s\n\n%s", cmd->name, *cmd->synopsis ? " " : "",
		cmd->synopsis,
		cmd->opts & OPT_DETACH ? " [--detach]" : "", cmd->help);
	if (cmd->opts & OPT_DETACH)
		fprintf(f, "\n--detach prints the job id as soon as the job is queued;\n"
			   "`gpuq wait JOB` waits for it later. --timeout MS bounds the wait.\n");
	fprintf(f, "\nThe global options (--socket, --json, --timeout) work here too;\n"
		   "gpuq --help lists them and the exit status.\n");
}

static const struct cli_cmd *find_command(const char *name)
{
	const struct cli_cmd *cmd;

	for (cmd = cli_commands; cmd->name; cmd++)
		if (strcmp(cmd->name, name) == 0)
			return cmd;
	return NULL;
}

static int unknown_command(const char *name)
{
	const struct cli_cmd *cmd;

	fprintf(stderr, "gpuq: unknown command '%s'; the commands are:", name);
	for (cmd = cli_commands; cmd->name; cmd++)
		fprintf(stderr, " %s", cmd->name);
	fprintf(stderr, "\n(gpuq --help says more)\n");
	return CLI_USAGE;
}

/* Output that could not be written (a full disk, a closed pipe) is a failure. */
static int finish_output(int rc)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		perror("gpuq: writing to stdout");
		return rc ? rc : CLI_REFUSED;
	}
	return rc;
}

int main(int argc, char **argv)
{
	struct cli cli = { .out = stdout };
	int at, rc;

	at = cli_parse_global(&cli, argc, argv);
	if (at == -'h' || at == -'V') {
		if (at == -'h')
			print_help(stdout);
		else
			printf("gpuq %s (protocol %d)\n", GPUQ_CLI_VERSION,
			       GPUQ_PROTOCOL_VERSION);
		return finish_output(CLI_OK);
	}
	if (at < 0)
		return -at;
	cli.cmd = find_command(argv[at]);
	if (!cli.cmd)
		return unknown_command(argv[at]);
	rc = cli_parse_command(&cli, argc - at, argv + at);
	if (rc == -'h') {
		cli_print_command_help(stdout, cli.cmd);
		return finish_output(CLI_OK);
	}
	if (rc == 0)
		rc = cli.cmd->run(&cli);
	gpuq_close(cli.client);
	return finish_output(rc);
}
