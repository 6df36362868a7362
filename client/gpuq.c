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
	{ "alloc", "NAME (--bytes SIZE | --count N --dtype T) [--device N] [--ephemeral]",
	  "allocate a named buffer on a device",
	  "Allocates buffer NAME on device N (default 0), sized either in bytes or\n"
	  "as N elements of dtype T (bytes u8 i32 i64 f16 bf16 f32 f64). A buffer\n"
	  "stays until it is freed, whatever becomes of the client that made it.\n"
	  "With --ephemeral it goes with this gpuq's connection instead: gpuq keeps\n"
	  "running, holding the buffer, until it is interrupted or killed, and the\n"
	  "daemon then frees it.\n",
	  JOB_OPTS | OPT_BYTES | OPT_COUNT | OPT_DTYPE | OPT_DEVICE | OPT_EPHEMERAL, 1, 1,
	  { "NAME" }, cmd_alloc },
	{ "free", "BUF", "free a buffer",
	  "Frees buffer BUF; refused (busy) while another job uses it.\n",
	  JOB_OPTS, 1, 1, { "BUF" }, cmd_free },
	{ "buffers", "[--device N]", "list your buffers (every user's for root)",
	  "Lists buffers, on device N only if given.\n", OPT_DEVICE, 0, 0, { NULL },
	  cmd_buffers },
	{ "put", "FILE BUF [--offset N] [--length N] [--verify] [--path P]",
	  "copy a file (or stdin) into a buffer",
	  "Copies FILE ('-': standard input) into BUF at --offset (default 0):\n"
	  "exactly --length bytes if given, else up to the end of FILE. BUF may\n"
	  "name the range itself: w0[4K:1M], w0@1[1G:] or w0[:100]. gpuq opens\n"
	  "FILE itself and hands gpuqd the descriptor; the daemon never opens paths.\n"
	  "Files and memfds are read by gpuqd's copy threads in parallel, pipes in\n"
	  "order. --verify compares the checksum of the bytes read with the\n"
	  "device's checksum of the range. --path auto (default), staged, or\n"
	  "registered (a memfd sealed against shrinking, pinned and copied\n"
	  "directly). On a terminal a progress bar shows on stderr; the summary\n"
	  "says bytes, time, GB/s and the path taken. FILE 'scratch:' is no file:\n"
	  "gpuqd makes up random bytes (to measure the path without a file).\n",
	  JOB_OPTS | OPT_OFFSET | OPT_LENGTH | OPT_VERIFY | OPT_PATH, 2, 2, { "FILE", "BUF" },
	  cmd_put },
	{ "get", "BUF FILE [--offset N] [--length N] [--verify] [--path P]",
	  "copy a buffer into a file (or stdout)",
	  "Copies BUF from --offset (default 0), --length bytes (default: to its\n"
	  "end), into FILE ('-': standard output, which must not be a terminal).\n"
	  "BUF may name the range itself, as for put. FILE is created or truncated\n"
	  "(mode 0666 less the umask). With FILE '-' the summary goes to stderr\n"
	  "and --json cannot be used. --verify hashes the device range first and\n"
	  "the bytes as they are written, and compares. --path as for put.\n"
	  "FILE 'scratch:' drops the bytes (to measure the path without a file).\n",
	  JOB_OPTS | OPT_OFFSET | OPT_LENGTH | OPT_VERIFY | OPT_PATH, 2, 2, { "BUF", "FILE" },
	  cmd_get },
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
	  "to the echo baseline.\n"
	  "\n"
	  "bench copy [--device N] [--sizes LIST] [--requests R]: gpuqd measures\n"
	  "its copy paths on device N as a job (default sizes 256M,1G,4G; R timed\n"
	  "repeats after a warm-up, default 5): cudaMemcpy pageable and pinned\n"
	  "against gpuq from a memfd, from a file and registered, both ways, then\n"
	  "device<->device where the daemon has bench_d2d. One table: GB/s and the\n"
	  "ratio to the pinned ceiling of the same run, each row verified.\n"
	  "\n"
	  "bench allreduce [--bytes MIN:MAX] [--factor F] [--devices LIST|all]\n"
	  "[--dtype T] [--op OP]: for each size from MIN to MAX (default 8:64M,\n"
	  "times F, default 2) a raw ncclAllReduce loop on a communicator of the\n"
	  "same devices (default all) timed by gpuqd with CUDA events, then the\n"
	  "same all-reduce as allreduce jobs sent from here, 8 in flight; both\n"
	  "results are checked element by element. An nccl-tests style table:\n"
	  "time, algbw, busbw (algbw x 2(n-1)/n), wrong elements, the ratio.\n"
	  "\n"
	  "bench chain [--device N] [--bytes SIZE] [--repeat N]: gpuqd measures\n"
	  "kernel chains on device N as a job: launch-bound, 1024 f32 elements and\n"
	  "chains of 1, 5 and 20 ops applied N times (default 1000), eager against\n"
	  "graph in µs per kernel; bandwidth-bound, SIZE of f32 (default 1G) and\n"
	  "sin | add 1 | sqrt | mul 2 | sub 3, each op alone and the chain eager,\n"
	  "graph and fused in GB/s beside cudaMemcpy device to device; and the\n"
	  "time to instantiate, update and find a cached graph. Medians of 10\n"
	  "timed replays; the H200 targets are marked met or missed.\n",
	  BENCH_OPTS, 1, 1, { "KIND" }, cmd_bench },
	{ "copy", "SRC DST [--engine ce|sm] [--verify] [--path auto|peer|host-staged]",
	  "copy bytes between buffers, on one GPU or between GPUs",
	  "Copies SRC into DST. Each is BUF (NAME or NAME@GPU) or a range of one:\n"
	  "BUF[OFFSET:LENGTH], BUF[OFFSET:] or BUF[:LENGTH] (sizes take K, M, G).\n"
	  "SRC's length is copied and DST's range must hold it; ranges in one buffer\n"
	  "must not overlap. Within one GPU --engine ce (the default) uses the copy\n"
	  "engine and --engine sm a kernel. Between GPUs the copy goes over their\n"
	  "peer link (NVLink or PCIe) where they have peer access, else through\n"
	  "pinned host memory (host-staged); --path peer or host-staged insists on\n"
	  "one. The summary says which path was taken; `gpuq devices` shows every\n"
	  "pair's. --verify compares checksums of both ranges,\n"
	  "each computed on its GPU. A cancel stops the copy at its next chunk.\n",
	  JOB_OPTS | OPT_ENGINE | OPT_VERIFY | OPT_PATH, 2, 2, { "SRC", "DST" }, cmd_copy },
	{ "run", "BUF CHAIN [--mode fused|graph|eager] [--repeat N] [--out BUF2]",
	  "apply a chain of elementwise ops to a buffer on its device",
	  "Applies CHAIN, one argument such as 'sin | add 1 | sqrt | mul 2 | sub 3',\n"
	  "to every element of BUF (f16, bf16, f32 or f64), in place or into BUF2\n"
	  "(--out: same device, dtype and count). --repeat N applies the whole chain\n"
	  "N times. Ops: sin cos tan exp log log2 sqrt rsqrt abs neg relu sigmoid\n"
	  "tanh floor ceil round; add C, sub C, mul C, div C, pow C, min C, max C;\n"
	  "clamp LO HI; fma A B (x*A+B). Constants are rounded to float for f16,\n"
	  "bf16 and f32. --mode: fused (default: one kernel for the whole chain,\n"
	  "replayed from a CUDA graph), graph (one kernel per op, captured into a\n"
	  "graph and replayed) or eager (one kernel per op, launched one by one).\n"
	  "Graphs are cached per device: `gpuq stats` shows hits and instantiations.\n",
	  JOB_OPTS | OPT_MODE | OPT_REPEAT | OPT_OUT, 2, 2, { "BUF", "CHAIN" }, cmd_run },
	{ "stats", "[--device N]", "show each device's job and kernel-chain counters",
	  "Per device: jobs run and failed, bytes moved, and the kernel-chain\n"
	  "counters: chains run, kernels launched, graph-cache hits, misses,\n"
	  "updates (only the buffers changed), instantiations and evictions, and\n"
	  "the plans cached out of the capacity (gpuqd --graph-cache).\n",
	  OPT_DEVICE, 0, 0, { NULL }, cmd_stats },
	{ "allreduce",
	  "NAME [--devices LIST|all] [--op sum|prod|min|max|avg] [--out NAME2] [--count N] "
	  "[--collective-timeout MS]",
	  "all-reduce buffer NAME across GPUs (NCCL, warm communicators)",
	  "Reduces the buffers called NAME on each of the GPUs in LIST (rank order\n"
	  "as given: 0-3, 3,1,0; 'all': every GPU; default: every GPU holding NAME)\n"
	  "with --op (default sum) and leaves the result in all of them, or in the\n"
	  "buffers called NAME2 (--out: same dtype and count on each). Every copy of\n"
	  "NAME must have the same dtype and count; --count N reduces the first N\n"
	  "elements only. Types: u8 i32 i64 f16 bf16 f32 f64. The communicator for\n"
	  "an ordered set of GPUs is made at its first use and kept warm.\n"
	  "--collective-timeout MS fails the job with `timeout` when a rank does not\n"
	  "arrive or the collective does not finish in time (default: gpuqd's\n"
	  "--collective-timeout, 30 s); the communicator is then dropped.\n",
	  JOB_OPTS | OPT_DEVICES | OPT_REDOP | OPT_OUT | OPT_COUNT | OPT_COLL_TIMEOUT, 1, 1,
	  { "NAME" }, cmd_allreduce },
	{ "metrics", "", "print gpuqd's metrics (Prometheus text format)",
	  "Prints the daemon's metrics in the Prometheus text exposition format:\n"
	  "jobs by op and result, job latency histograms, bytes moved by path,\n"
	  "queue depths, per-GPU memory and health, quota refusals, reloads.\n"
	  "gpuqd --metrics-textfile writes the same for node_exporter.\n",
	  0, 0, 0, { NULL }, cmd_metrics },
	{ "shutdown", "", "stop gpuqd (root and the admin group)",
	  "Asks gpuqd to stop as SIGTERM would: it stops accepting, cancels queued\n"
	  "jobs, lets running ones finish within its --shutdown-timeout, and exits.\n"
	  "Only root and members of gpuqd's admin group may. Under systemd, prefer\n"
	  "systemctl stop gpuqd (the socket starts it again at the next client).\n",
	  0, 0, 0, { NULL }, cmd_shutdown },
	{ NULL, NULL, NULL, NULL, 0, 0, 0, { NULL }, NULL },
};

static const char global_help[] =
	"Options (also accepted after COMMAND):\n"
	"  -s, --socket PATH  gpuqd's socket; by default $GPUQ_SOCKET, else\n"
	"                     /run/gpuq/gpuqd.sock for root and\n"
	"                     $XDG_RUNTIME_DIR/gpuq.sock for others (the\n"
	"                     system's /run/gpuq/gpuqd.sock if that is absent)\n"
	"                     (here and now: %s)\n"
	"  -j, --json         print the daemon's reply as JSON on stdout\n"
	"  -t, --timeout MS   stop waiting after MS milliseconds; for job commands\n"
	"                     and wait the daemon stops waiting and the job goes on\n"
	"  -h, --help         this help; gpuq COMMAND --help for one command\n"
	"  -V, --version      gpuq's version and protocol version\n"
	"\n"
	"BUF is NAME or NAME@GPU (w0@1). SIZE and N take K, M, G suffixes (powers\n"
	"of 1024). Job commands (noop alloc free put get copy fill checksum run)\n"
	"wait for the job and print what it did; --detach prints the job id at once.\n"
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
