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

#include "client/cli/cli.h"

static int cmd_reduce_either(struct cli *cli);

#define JOB_OPTS (OPT_DETACH | OPT_PRIORITY)
/* A job on buffers named by the caller: root may name another owner's (--owner). */
#define BUF_JOB_OPTS (JOB_OPTS | OPT_OWNER)
#define COLL_OPTS (OPT_DEVICES | OPT_REDOP | OPT_OUT | OPT_COUNT | OPT_COLL_TIMEOUT | OPT_ROOT)

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
	{ "alloc", "NAME[@GPU] (--bytes SIZE | --count N --dtype T) [--device N] [--wait-memory MS] [--ephemeral] [--shareable]",
	  "allocate a named buffer on a device",
	  "Allocates buffer NAME on device N (default 0; NAME@N says the same), sized\n"
	  "either in bytes or as N elements of dtype T (bytes u8 i32 i64 f16 bf16 f32\n"
	  "f64). Without room on the device it fails at once (out_of_memory), or with\n"
	  "--wait-memory MS waits up to MS milliseconds for other jobs to free\n"
	  "enough. A buffer stays until it is freed, whatever becomes of the client\n"
	  "that made it. With --ephemeral it goes with this gpuq's connection\n"
	  "instead: gpuq keeps running, holding the buffer, until it is interrupted\n"
	  "or killed, and the daemon then frees it. --shareable allocates it on its\n"
	  "own (not from the pool) so that your processes may attach it (gpuq attach,\n"
	  "gpuq_buffer_attach) and map it on the GPU.\n",
	  JOB_OPTS | OPT_BYTES | OPT_COUNT | OPT_DTYPE | OPT_DEVICE | OPT_WAIT_MEMORY | OPT_EPHEMERAL |
		  OPT_SHAREABLE,
	  1, 1, { "NAME" }, cmd_alloc },
	{ "free", "BUF", "free a buffer",
	  "Frees buffer BUF once the jobs already queued or running on it have\n"
	  "finished; no new job may use it meanwhile.\n",
	  BUF_JOB_OPTS, 1, 1, { "BUF" }, cmd_free },
	{ "region", "create NAME --bytes SIZE [--device N] [--ephemeral] | free NAME [--owner UID|USER]",
	  "make or free a host region: memory gpuqd pins once",
	  "create: makes a memfd of SIZE (a multiple of 4 KiB) and hands it to gpuqd,\n"
	  "which maps it, places its pages on device N's NUMA node (default 0) and\n"
	  "pins it once. put/get then move bytes between a range of it and a buffer\n"
	  "in one DMA: gpuq put region:NAME[START:STOP] BUF, gpuq get BUF\n"
	  "region:NAME. Programs map the same memory (gpuq_region_open). Regions\n"
	  "count against the host-pinned quota and gpuqd's RLIMIT_MEMLOCK. With\n"
	  "--ephemeral the region goes when this command's connection does: it holds\n"
	  "it until interrupted. free: after the jobs that use it; root frees another\n"
	  "user's region with --owner (gpuq regions lists every user's for root).\n",
	  OPT_BYTES | OPT_DEVICE | OPT_EPHEMERAL | OPT_OWNER, 2, 2, { "create|free", "NAME" },
	  cmd_region },
	{ "regions", "", "list your host regions (every user's for root)",
	  "Lists regions: size, the device that pinned them and its NUMA node, the jobs\n"
	  "using them, how long pinning took; and the bytes pinned beside gpuqd's\n"
	  "RLIMIT_MEMLOCK.\n",
	  0, 0, 0, { NULL }, cmd_regions },
	{ "attach", "BUF [--read-only] [--owner UID|USER]",
	  "map a shareable buffer here and hold a lease on it",
	  "Attaches BUF (allocated with --shareable) as a program does with\n"
	  "gpuq_buffer_attach: once the jobs before it on BUF are done, gpuqd sends\n"
	  "its handle and gpuq maps it on the GPU, then holds the lease until\n"
	  "interrupted (or broken). Meanwhile daemon jobs on BUF wait; with\n"
	  "--read-only (a read lease) jobs that only read it go on.\n",
	  OPT_READ_ONLY | OPT_OWNER, 1, 1, { "BUF" }, cmd_attach },
	{ "leases", "", "list leases: who has which buffer attached",
	  "Lists the leases on your buffers and your own (every lease for root and\n"
	  "the admin group): buffer, mode, holder uid and pid, how long held.\n",
	  0, 0, 0, { NULL }, cmd_leases },
	{ "quota", "[--uid N]", "show your quota limits beside what you use (every user's for root)",
	  "Shows the limits gpuqd's quota rules set for you, beside what you hold\n"
	  "now: device memory on each GPU, pinned host memory, jobs queued or\n"
	  "running, connections, descriptors, request and reply bytes; and the\n"
	  "devices, the most urgent priority, the fair-share weight and the\n"
	  "benchmarks right. Root and the admin group see every user that has a\n"
	  "rule or holds something, or user N alone with --uid N.\n",
	  OPT_UID, 0, 0, { NULL }, cmd_quota },
	{ "lease", "break LEASE", "break a lease (root and the admin group)",
	  "Ends lease LEASE: the jobs waiting behind it go on, and its holder is told\n"
	  "(an event lease_broken on its connection).\n",
	  0, 2, 2, { "break", "LEASE" }, cmd_lease },
	{ "buffers", "[--device N]", "list your buffers (every user's for root)",
	  "Lists buffers, on device N only if given.\n", OPT_DEVICE, 0, 0, { NULL },
	  cmd_buffers },
	{ "put", "FILE BUF [--offset N] [--length N] [--verify] [--path P]",
	  "copy a file (or stdin) into a buffer",
	  "Copies FILE ('-': standard input) into BUF at --offset (default 0):\n"
	  "exactly --length bytes if given, else up to the end of FILE. BUF may\n"
	  "name the range itself as a Python slice of its bytes, START up to STOP:\n"
	  "w0[4K:1M], w0@1[1G:] or w0[:100]. A BUF that does not exist is made\n"
	  "first, as bytes of FILE's size (on GPU N for NAME@N), when FILE is a\n"
	  "regular file put whole, as Python's put_array makes one for an array.\n"
	  "gpuq opens FILE itself and hands gpuqd the descriptor; the daemon never\n"
	  "opens paths.\n"
	  "Files and memfds are read by gpuqd's copy threads in parallel, pipes in\n"
	  "order. --verify compares the checksum of the bytes read with the\n"
	  "device's checksum of the range. --path auto (default), staged, or\n"
	  "registered (a memfd sealed against shrinking, pinned and copied\n"
	  "directly). On a terminal a progress bar shows on stderr; the summary\n"
	  "says bytes, time, GB/s and the path taken. FILE 'scratch:' is no file:\n"
	  "gpuqd makes up random bytes (to measure the path without a file).\n",
	  BUF_JOB_OPTS | OPT_OFFSET | OPT_LENGTH | OPT_VERIFY | OPT_PATH, 2, 2, { "FILE", "BUF" },
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
	  BUF_JOB_OPTS | OPT_OFFSET | OPT_LENGTH | OPT_VERIFY | OPT_PATH, 2, 2, { "BUF", "FILE" },
	  cmd_get },
	{ "fill", "BUF zero | value V | iota | random SEED",
	  "fill a buffer with a pattern",
	  "Fills BUF on its device: zero; value V (an integer or a float, converted\n"
	  "to BUF's dtype); iota (element i is i); random SEED (reproducible from\n"
	  "SEED: random bits for integer buffers, [0, 1) for float ones).\n",
	  BUF_JOB_OPTS, 2, 3, { "BUF", "PATTERN", "ARG" }, cmd_fill },
	{ "checksum", "BUF", "hash a buffer's bytes on its device",
	  "Prints BUF's 64-bit checksum, the same on every backend for the same\n"
	  "bytes.\n",
	  BUF_JOB_OPTS, 1, 1, { "BUF" }, cmd_checksum },
	{ "jobs", "[--last N] [--running] [--queued] [--failed]", "list your jobs, newest first (every user's for root)",
	  "Lists jobs, newest first; `gpuq status JOB` shows one in full. --last N\n"
	  "keeps the N newest; --running, --queued and --failed keep the jobs in\n"
	  "those states (several may be given). The daemon keeps the last\n"
	  "--job-history finished jobs.\n",
	  OPT_JOBS_SELECT, 0, 0, { NULL }, cmd_jobs },
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
	{ "bench", "KIND [OPTIONS]",
	  "measure gpuqd: dispatch copy chain allreduce collective sched attach",
	  "Runs benchmark KIND against gpuqd and prints what it measured. With\n"
	  "--json it prints its result as JSON instead, and with --save-json FILE\n"
	  "it also writes that JSON to FILE; `python -m gpuq plot FILE -o\n"
	  "PICTURE.png` draws it (client/python; needs matplotlib).\n"
	  "gpuq bench KIND --help describes one kind; the kinds:\n",
	  BENCH_OPTS, 1, 1, { "KIND" }, cmd_bench },
	{ "copy", "SRC DST [--engine ce|sm] [--verify] [--path auto|peer|host-staged]",
	  "copy bytes between buffers, on one GPU or between GPUs",
	  "Copies SRC into DST. Each is BUF (NAME or NAME@GPU) or a range of one:\n"
	  "BUF[START:STOP], BUF[START:] or BUF[:STOP] (sizes take K, M, G).\n"
	  "SRC's length is copied and DST's range must hold it; ranges in one buffer\n"
	  "must not overlap. Within one GPU --engine ce (the default) uses the copy\n"
	  "engine and --engine sm a kernel. Between GPUs the copy goes over their\n"
	  "peer link (NVLink or PCIe) where they have peer access, else through\n"
	  "pinned host memory (host-staged); --path peer or host-staged insists on\n"
	  "one. The summary says which path was taken; `gpuq devices` shows every\n"
	  "pair's. --verify compares checksums of both ranges,\n"
	  "each computed on its GPU. A cancel stops the copy at its next chunk.\n",
	  BUF_JOB_OPTS | OPT_ENGINE | OPT_VERIFY | OPT_PATH, 2, 2, { "SRC", "DST" }, cmd_copy },
	{ "run", "EXPR | BUF CHAIN [--mode fused|graph|eager] [--repeat N] [--out BUF2] "
	  "[--kernel auto|compiled|interpreted] [--math ieee|fast] [--device N]",
	  "run an expression over buffers, or a chain of ops on one, on their device",
	  "EXPR is one argument of statements OUT = EXPRESSION separated by ';', as\n"
	  "'y = a * x + y' or 'out = relu(x * 0.5 + bias)': buffers are variables\n"
	  "(NAME, NAME@GPU or `any-name`; one device, one count, or one element to\n"
	  "broadcast), with + - * / ( ), numbers, every op below as a function\n"
	  "(add(x, y), clamp(x, lo, hi), fma(x, a, b): x*a+b rounded once) and the\n"
	  "casts f16() bf16() f32() f64(); at most 8 inputs and 4 outputs. Mixed\n"
	  "dtypes compute in the wider type (f16 with bf16: f32). --device N picks\n"
	  "where names without @GPU live.\n"
	  "BUF CHAIN applies CHAIN, such as 'sin | add 1 | sqrt | mul 2 | sub 3', to\n"
	  "every element of BUF, in place or into BUF2 (--out: same device, dtype and\n"
	  "count): the expression BUF = sub(mul(sqrt(add(sin(BUF), 1)), 2), 3).\n"
	  "--repeat N runs the statements (the chain) N times. Ops: sin cos tan exp\n"
	  "log log2 sqrt rsqrt abs neg relu sigmoid tanh floor ceil round; add C,\n"
	  "sub C, mul C, div C, pow C, min C, max C; clamp LO HI; fma A B (x*A+B).\n"
	  "Buffers are f16, bf16, f32 or f64; constants are rounded to float except\n"
	  "for f64. --mode: fused (default: one kernel, replayed from a CUDA graph),\n"
	  "graph or eager (one kernel per op; a chain of ops on one buffer only).\n"
	  "Fused runs a kernel compiled for the expression (NVRTC; cached in memory\n"
	  "and on disk), or when none can be had an interpreting one, and says which\n"
	  "(--kernel insists on one). --math fast: CUDA's fast intrinsics (compiled\n"
	  "kernels only; gpuq(1) lists their errors). `gpuq stats` shows the caches.\n",
	  BUF_JOB_OPTS | OPT_MODE | OPT_REPEAT | OPT_OUT | OPT_KERNEL | OPT_MATH | OPT_DEVICE, 1, 2,
	  { "EXPR|BUF", "CHAIN" }, cmd_run },
	{ "stats", "[--device N]", "show each device's job and kernel-chain counters",
	  "Prints the backend and where compiled kernels are kept, then a row per\n"
	  "device (only device N with --device), counted since gpuqd started:\n"
	  "  GPU           the device\n"
	  "  JOBS, FAILED  jobs run, and how many of them failed\n"
	  "  CHAINS        kernel chains run (gpuq run, reduce EXPR, bench chain)\n"
	  "  KERNELS       kernels launched for them\n"
	  "  HITS, MISSES  graph-cache hits and misses\n"
	  "  UPDATES       cached graphs updated in place (only the buffers changed)\n"
	  "  INSTANTIATED  graphs instantiated\n"
	  "  EVICTED       graphs evicted from the cache\n"
	  "  CACHED        plans cached / the capacity (gpuqd --graph-cache)\n"
	  "  COMPILED      kernels compiled (NVRTC)\n"
	  "  DISK, MEMORY  compiled kernels found in the disk cache, in memory\n"
	  "  INTERPRETED   fused runs that fell back to the interpreting kernel\n"
	  "A '-' is a device without kernel-chain counters. Bytes moved are\n"
	  "counted by gpuq devices --json (counters) and gpuq metrics.\n",
	  OPT_DEVICE, 0, 0, { NULL }, cmd_stats },
	{ "allreduce",
	  "NAME [--devices LIST|all] [--op sum|prod|min|max|avg] [--out NAME2] [--count N] "
	  "[--collective-timeout MS]",
	  "all-reduce buffer NAME across GPUs (NCCL, warm communicators)",
	  "Reduces the buffers called NAME on each of the GPUs in LIST (rank order\n"
	  "as given: 0-3, 3,1,0; 'all': every GPU; default: every GPU holding NAME)\n"
	  "with --op (default sum) and leaves the result in all of them, or in the\n"
	  "buffers called NAME2 (--out). Every copy of NAME must have one dtype and\n"
	  "hold --count N elements (default: rank 0's count); an error names a\n"
	  "buffer that is too small and by how much. Types: u8 i32 i64 f16 bf16 f32\n"
	  "f64. The communicator for an ordered set of GPUs is made at its first use\n"
	  "and kept warm. --collective-timeout MS fails the job with `timeout` when\n"
	  "a rank has not arrived MS after submission (a rank still queued is taken\n"
	  "out of its queue) or the collective does not finish in time (default:\n"
	  "gpuqd's --collective-timeout, 30 s); the communicator is then dropped.\n"
	  "The other collectives: reduce-scatter, all-gather, broadcast, reduce,\n"
	  "sendrecv, all-to-all, group.\n",
	  BUF_JOB_OPTS | COLL_OPTS, 1, 1, { "NAME" }, cmd_collective },
	{ "reduce-scatter", "NAME [--devices LIST|all] [--op OP] [--out NAME2] [--count N]",
	  "reduce NAME across GPUs, leaving block r of the result on rank r",
	  "NCCL's reduce-scatter: every rank's NAME holds n blocks of --count N\n"
	  "elements (default: NAME's count / n); block r of the reduction (--op,\n"
	  "default sum) goes to rank r's NAME2 (--out, N elements), or in place to\n"
	  "block r of its NAME. --devices, --collective-timeout as for allreduce.\n",
	  BUF_JOB_OPTS | COLL_OPTS, 1, 1, { "NAME" }, cmd_collective },
	{ "all-gather", "NAME [--devices LIST|all] [--out NAME2] [--count N]",
	  "gather every rank's NAME into every rank's NAME2",
	  "NCCL's all-gather: rank r's NAME (--count N elements, default its count)\n"
	  "becomes block r of NAME2 (--out, n x N elements) on every rank. In place\n"
	  "(no --out) NAME holds the n blocks and rank r's own is block r of it\n"
	  "(N defaults to its count / n). Any dtype, bytes too.\n",
	  BUF_JOB_OPTS | COLL_OPTS, 1, 1, { "NAME" }, cmd_collective },
	{ "broadcast", "NAME --root N [--devices LIST|all] [--out NAME2] [--count N]",
	  "copy root rank N's NAME to every rank",
	  "NCCL's broadcast: --count elements (default the root's count) of NAME on\n"
	  "rank N (--root: an index into --devices, default 0) go to NAME on every\n"
	  "rank, or to NAME2 (--out; then only the root needs NAME). Any dtype.\n",
	  BUF_JOB_OPTS | COLL_OPTS, 1, 1, { "NAME" }, cmd_collective },
	{ "reduce", "EXPR [--count N] [--kernel K] [--math M] [--device N] | NAME --root N [--op OP] "
	  "[--devices LIST|all] [--out NAME2] [--count N]",
	  "reduce an expression to one number, or NAME across GPUs onto a root rank",
	  "With an EXPR (it has parentheses): sum, min, max, mean, norm2,\n"
	  "count_nonzero or argmax of an expression (as for run), or dot(a, b):\n"
	  "'sum(abs(x - y))', 'norm2(w)', 'dot(a, b)', on the buffers' device. The\n"
	  "result is an f64 (an i64 for count_nonzero and argmax), the same bits on\n"
	  "every run: values are added in f64 in one fixed order. NaN: sum, mean,\n"
	  "norm2 and dot give NaN; min and max give NaN; argmax the index of the\n"
	  "first NaN; count_nonzero counts it. --count N reduces the first N\n"
	  "elements (0: the empty reduction: sum 0, min inf, max -inf, mean NaN,\n"
	  "argmax -1). --kernel and --math as for run.\n"
	  "With a buffer NAME: NCCL's reduce: NAME of every rank, reduced with --op\n"
	  "(default sum), goes to NAME on rank N (--root, default 0), or to its\n"
	  "NAME2 (--out: only the root needs it).\n",
	  BUF_JOB_OPTS | COLL_OPTS | OPT_KERNEL | OPT_MATH | OPT_DEVICE, 1, 1, { "EXPR|NAME" },
	  cmd_reduce_either },
	{ "sendrecv", "SRC DST [--count N] [--devices LIST]",
	  "send a buffer range from one GPU to another (NCCL send/recv)",
	  "One job runs both ends: SRC (NAME@GPU, optionally [START:STOP]) is sent\n"
	  "to DST on another GPU with ncclSend and ncclRecv, --count elements\n"
	  "(default: SRC's range). The communicator is that of the two GPUs\n"
	  "(ascending), or of --devices, which must list both.\n",
	  BUF_JOB_OPTS | OPT_COUNT | OPT_DEVICES | OPT_COLL_TIMEOUT, 2, 2, { "SRC", "DST" },
	  cmd_sendrecv },
	{ "all-to-all", "NAME --out NAME2 [--devices LIST|all] [--count N]",
	  "exchange blocks: block j of rank r's NAME to block r of rank j's NAME2",
	  "NCCL's all-to-all, from grouped send/recv: every rank's NAME and NAME2\n"
	  "(--out, required: it cannot run in place) hold n blocks of --count N\n"
	  "elements (default NAME's count / n). Any dtype.\n",
	  BUF_JOB_OPTS | COLL_OPTS, 1, 1, { "NAME" }, cmd_collective },
	{ "group", "--devices LIST 'OP ARGS' ...",
	  "run several collectives as one NCCL group (one job)",
	  "Each argument is one collective as its command takes it, quoted:\n"
	  "'all-gather a --out b', 'reduce g --root 1 --op max', 'sendrecv x@0 y@1'\n"
	  "(options: --out, --op, --root, --count). All run on the ranks of\n"
	  "--devices between ncclGroupStart and ncclGroupEnd, as one job; none may\n"
	  "write a range another uses. An all-to-all of n GPUs is n x n sendrecvs.\n",
	  BUF_JOB_OPTS | OPT_DEVICES | OPT_COLL_TIMEOUT, 1, 64, { "OP" }, cmd_group },
	{ "metrics", "", "print gpuqd's metrics (Prometheus text format)",
	  "Prints the daemon's metrics in the Prometheus text exposition format:\n"
	  "jobs by op and result, job latency histograms, bytes moved by path,\n"
	  "queue depths, per-GPU memory and health, quota refusals, reloads.\n"
	  "gpuqd --metrics-textfile writes the same for node_exporter.\n",
	  0, 0, 0, { NULL }, cmd_metrics },
	{ "top", "[--interval MS] [--device N] [--once [--json]]",
	  "a live view of gpuqd: devices, engines, memory by user, jobs",
	  "Shows, refreshed every --interval MS (default 1000): per GPU the memory\n"
	  "gpuq's buffers hold, free and in all, each engine's busy share (H2D, D2H,\n"
	  "KERNEL, COPY, COLL, OTHER: the part of the interval with a job on it),\n"
	  "jobs in flight and queued, bytes moved and jobs done per second; the\n"
	  "memory each user's buffers hold per GPU; each user's jobs and device time\n"
	  "(over the interval, and over every job gpuqd still lists); the jobs\n"
	  "running and queued by priority, with why each waits. Rates compare two\n"
	  "polls, so they show '-' until the second. Non-root users see their own\n"
	  "buffers and jobs; root sees everyone's.\n"
	  "Keys: q quit; s sort the jobs by priority, age, device or owner; d show\n"
	  "all devices or one (each press the next); u one user or all; p pause;\n"
	  "h or ? explain the keys. Ctrl-C, SIGTERM and the daemon going away end\n"
	  "it too; the terminal is restored and the last line says why. A gpuqd\n"
	  "that answers on the socket again within --timeout (10 s without it) is\n"
	  "reconnected to: the last row says so, and the rates start again.\n"
	  "--device N starts with device N alone. --once prints one snapshot,\n"
	  "without escape sequences, after two polls --interval apart (so rates\n"
	  "exist), and exits; with --json as one JSON object: devices (busy_share\n"
	  "per engine, bytes_per_s, jobs_per_s), memory, users, jobs.\n",
	  OPT_TOP | OPT_DEVICE, 0, 0, { NULL }, cmd_top },
	{ "shutdown", "", "stop gpuqd (root and the admin group)",
	  "Asks gpuqd to stop as SIGTERM would: it stops accepting, cancels queued\n"
	  "jobs, lets running ones finish within its --shutdown-timeout, and exits.\n"
	  "Only root and members of gpuqd's admin group may. Under systemd, prefer\n"
	  "systemctl stop gpuqd (the socket starts it again at the next client).\n",
	  0, 0, 0, { NULL }, cmd_shutdown },
	{ "admin", "restart | drop-absent UUID",
	  "re-exec gpuqd in place; free a GPU's kept buffers (root, admin group)",
	  "admin restart [--binary PATH]: gpuqd stops taking jobs, lets running ones\n"
	  "finish within its --restart-drain (default 5 s), fails the rest with\n"
	  "`restarted`, and executes itself again (or PATH, an upgrade, which must\n"
	  "first show it can read gpuqd's state record) as the same process: every\n"
	  "buffer stays where it is (none is copied), clients keep their connections\n"
	  "and see a pause, and the queued jobs run then, under their ids (those that\n"
	  "passed a file or pipe fail with `restarted`). A binary that cannot take over\n"
	  "is refused and the running gpuqd serves on. Waits until gpuqd serves\n"
	  "again (--timeout MS, default 60 s): until the same gpuqd (a re-exec keeps\n"
	  "its pid) counts one more restart, and prints how long it took. Fails\n"
	  "when none does: exit 3 when no gpuqd answers (the new image did not\n"
	  "serve), 1 when another gpuqd answers (a new pid) or the count did not\n"
	  "move in time; the message says what it saw.\n"
	  "\n"
	  "admin drop-absent UUID: gpuqd keeps the buffers of a GPU it does not\n"
	  "serve (left out of --devices, gone, or one that did not open) until a\n"
	  "gpuqd serves it again; `gpuq devices` lists them. This lets them go for\n"
	  "good, a GPU removed or given to other work: their memory on it is freed.\n",
	  OPT_BINARY, 1, 2, { "ACTION", "UUID" }, cmd_admin },
	{ "reset-device", "GPU", "reset one GPU and serve it again (root and the admin group)",
	  "Cancels the GPU's running jobs, resets the device (cudaDeviceReset) once\n"
	  "they have ended and opens it again, as gpuqd does by itself after a fault;\n"
	  "the buffers there are lost (listed as such until freed). Also brings back\n"
	  "a GPU that faulted more often than --reset-limit allows. Waits until the\n"
	  "reset is done (--timeout MS, default 60 s) and prints the GPU's health.\n",
	  0, 1, 1, { "GPU" }, cmd_reset_device },
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
	"                     and wait the daemon stops waiting and the job goes on;\n"
	"                     also how long gpuq tries to reconnect (default 10 s)\n"
	"  -h, --help         this help; gpuq COMMAND --help for one command\n"
	"  -V, --version      gpuq's version and protocol version\n"
	"\n"
	"BUF is NAME or NAME@GPU (w0@1). SIZE and N take K, M, G, T suffixes, powers\n"
	"of 1024 (also KiB, MiB...); KB, MB, GB are powers of 1000. Job commands (noop alloc free put get copy fill checksum run and\n"
	"the collectives) wait for the job and print what it did; --detach prints\n"
	"the job id at once, and --priority high|normal|low says how urgent the job\n"
	"is (default normal). Root names another user's buffers with --owner UID|USER\n"
	"on the commands that take a BUF (free put get fill checksum copy run reduce\n"
	"and the collectives): `gpuq free w@0 --owner 1000`.\n"
	"\n"
	"When gpuqd restarts under a command (it crashed and a new gpuqd serves the\n"
	"socket, or a re-exec could not keep the connection), gpuq connects again\n"
	"within --timeout (10 s without it) and prints 'gpuq: gpuqd restarted (pid\n"
	"P); reconnected' on stderr, once per new connection. A request that reads\n"
	"and changes nothing (ping devices buffers jobs status wait stats quota\n"
	"metrics regions leases, and top's polls) goes again, status and wait only\n"
	"to a gpuqd that took the old one over (one started afresh numbers its jobs\n"
	"from 1 again); a job in flight is never sent again: it fails (exit 3)\n"
	"saying so, and may be submitted again.\n"
	"A re-exec in place (admin restart, SIGUSR2) keeps the connection: a job it\n"
	"cut short fails with `restarted` (exit 1), not sent again either. What a\n"
	"command holds (an --ephemeral buffer or region, attach) goes with its\n"
	"connection, which it never makes again.\n"
	"\n"
	"Exit status:\n"
	"  0  success\n"
	"  1  gpuqd refused the request, or the job failed or timed out\n"
	"  2  usage error (including a FILE that cannot be opened)\n"
	"  3  gpuqd cannot be reached or did not answer in time (--timeout),\n"
	"     or the connection broke\n";

/* One line of gpuq --help: "  NAME SYNOPSIS" and the summary in a column, or under a long synopsis. */
static void print_help_line(FILE *f, const char *name, const char *synopsis, const char *summary)
{
	int w = fprintf(f, "  %s%s%s", name, *synopsis ? " " : "", synopsis);

	if (w > 27)
		fprintf(f, "\n%30s%s\n", "", summary);
	else
		fprintf(f, "%*s%s\n", 30 - w, "", summary);
}

/* Every command of cli_commands, and under bench every kind of bench_kind_rows. */
static void print_help(FILE *f)
{
	const struct cli_cmd *cmd;

	fprintf(f, "usage: gpuq [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]\n\n"
		   "Talks to gpuqd, the GPU job daemon, over its UNIX socket.\n\n"
		   "Commands (job commands also take --detach and --priority):\n");
	for (cmd = cli_commands; cmd->name; cmd++) {
		if (cmd->run != cmd_bench) {
			print_help_line(f, cmd->name, cmd->synopsis, cmd->summary);
			continue;
		}
		for (const struct bench_kind_row *k = bench_kind_rows; k->name; k++) {
			char name[64];
			snprintf(name, sizeof name, "bench %s", k->name);
			print_help_line(f, name, k->synopsis, k->summary);
		}
	}
	fprintf(f, "\n");
	fprintf(f, global_help, gpuq_default_socket());
}

/* gpuq bench --help: the kinds; gpuq bench KIND --help: that kind. */
static void print_bench_help(FILE *f, const struct cli_cmd *cmd, const struct bench_kind_row *kind)
{
	if (kind) {
		fprintf(f, "usage: gpuq bench %s %s\n\n%s", kind->name, kind->synopsis, kind->help);
	} else {
		fprintf(f, "usage: gpuq bench %s\n\n%s\n", cmd->synopsis, cmd->help);
		for (const struct bench_kind_row *k = bench_kind_rows; k->name; k++)
			fprintf(f, "gpuq bench %s %s\n%s\n", k->name, k->synopsis, k->help);
	}
	fprintf(f, "\nThe global options (--socket, --json, --timeout) work here too;\n"
		   "gpuq --help lists them and the exit status.\n");
}

void cli_print_command_help(FILE *f, const struct cli_cmd *cmd)
{
	if (cmd->run == cmd_bench) {
		print_bench_help(f, cmd, NULL);
		return;
	}
	fprintf(f, "usage: gpuq %s%s%s%s\n\n%s", cmd->name, *cmd->synopsis ? " " : "",
		cmd->synopsis,
		cmd->opts & OPT_DETACH ? " [--detach]" : "", cmd->help);
	if (cmd->opts & OPT_DETACH)
		fprintf(f, "\n--detach prints the job id as soon as the job is queued;\n"
			   "`gpuq wait JOB` waits for it later. --timeout MS bounds the wait.\n"
			   "--priority high|normal|low: the job's priority on its GPU (default\n"
			   "normal; a quota rule may cap it).\n");
	if (cmd->opts & OPT_OWNER)
		fprintf(f, "--owner UID|USER (root only): the buffer names are that user's, as\n"
			   "`gpuq buffers` lists them with their OWNER (gpuq free w@0 --owner 1000);\n"
			   "anyone else is refused unless UID is their own.\n");
	fprintf(f, "\nThe global options (--socket, --json, --timeout) work here too;\n"
		   "gpuq --help lists them and the exit status.\n");
}

/* gpuq reduce: an expression (parentheses: no buffer name has them), or NCCL's reduce. */
static int cmd_reduce_either(struct cli *cli)
{
	return strchr(cli->args[0], '(') ? cmd_reduce(cli) : cmd_collective(cli);
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
		const struct bench_kind_row *kind = NULL;
		for (int i = at + 1; cli.cmd->run == cmd_bench && i < argc && !kind; i++)
			kind = bench_kind_find(argv[i]);
		if (kind)
			print_bench_help(stdout, cli.cmd, kind);
		else
			cli_print_command_help(stdout, cli.cmd);
		return finish_output(CLI_OK);
	}
	if (rc == 0)
		rc = cli.cmd->run(&cli);
	gpuq_close(cli.client);
	return finish_output(rc);
}
