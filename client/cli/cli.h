/*
 * What the gpuq CLI's files share. The CLI is thin: it turns argument syntax
 * into one request, sends it with libgpuq, and renders the reply; every rule
 * about buffers, devices and jobs is the daemon's.
 *
 *   gpuq.c      main, global options, the command table, --help
 *   args.c      the per-command option parser and value syntax
 *   commands.c  the commands that are not jobs (ping devices buffers jobs status wait cancel)
 *   jobs.c      the job commands (noop alloc free put get fill checksum)
 *   job_call.c  beginning a job request and finishing its reply, for every job command
 *   call.c      connecting, calling, rendering a reply or its refusal, holding the connection
 *   progress.c  the progress bar of a waiting job
 *   render.c    human output of replies, and JSON
 *   fields.c    reading a reply's fields; bytes and seconds for people
 *   table.c     aligned text tables
 *   bench.c     bench dispatch
 *   service.c   metrics, shutdown
 *   quota.c     quota: limits beside usage
 *   top*.c      gpuq top, the live view (top.h says which file does what)
 */
#ifndef GPUQ_CLI_H
#define GPUQ_CLI_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "client/lib/gpuq.h"

#define GPUQ_CLI_VERSION "0.1.0"

/* Exit status, as gpuq --help documents it. */
enum cli_exit {
	CLI_OK = 0,
	CLI_REFUSED = 1,     /* the daemon refused the request, or the job failed */
	CLI_USAGE = 2,       /* the command line is wrong (or FILE cannot be opened) */
	CLI_UNREACHABLE = 3, /* no daemon at the socket, or the connection broke */
};

/* Options beyond the global ones; a command lists those it takes. */
enum cli_opt {
	OPT_DEVICE = 1u << 0,
	OPT_OFFSET = 1u << 1,
	OPT_LENGTH = 1u << 2,
	OPT_BYTES = 1u << 3,
	OPT_COUNT = 1u << 4,
	OPT_DTYPE = 1u << 5,
	OPT_DETACH = 1u << 6,
	OPT_CLIENTS = 1u << 7,
	OPT_REQUESTS = 1u << 8,
	OPT_VERIFY = 1u << 9,  /* --verify: compare checksums of source and destination */
	OPT_PATH = 1u << 10,   /* --path P: how bytes move (put/get: auto, staged, registered) */
	OPT_SIZES = 1u << 11,  /* --sizes LIST: bench copy's transfer sizes */
	OPT_ENGINE = 1u << 12, /* --engine ce|sm: copy's engine within one GPU */
	OPT_MODE = 1u << 13,   /* --mode M: how run runs the chain (fused, graph, eager) */
	OPT_REPEAT = 1u << 14, /* --repeat N: run's passes; bench chain's launch-bound passes */
	OPT_OUT = 1u << 15,    /* --out BUF: run's output buffer */
	OPT_TOP = 1u << 16,    /* --interval MS, --once: top's refresh and its one-shot mode */
	OPT_DEVICES = 1u << 17,      /* --devices LIST|all: allreduce's ranks, in order */
	OPT_REDOP = 1u << 18,        /* --op sum|prod|min|max|avg */
	OPT_FACTOR = 1u << 19,       /* --factor F: bench allreduce's step between sizes */
	OPT_COLL_TIMEOUT = 1u << 20, /* --collective-timeout MS */
	OPT_PRIORITY = 1u << 21,     /* --priority high|normal|low: every job command */
	OPT_WAIT_MEMORY = 1u << 22,  /* --wait-memory MS: alloc waits for memory others free */
	OPT_ROOT = 1u << 23,         /* --root N: broadcast's and reduce's root rank */
	OPT_REDUCE = 1u << 24,       /* --reduce OP: bench collective's reduction (--op: its primitive) */
	OPT_KERNEL = 1u << 25,       /* --kernel auto|compiled|interpreted: run's and reduce's fused kernel */
	OPT_MATH = 1u << 26,         /* --math ieee|fast */
	OPT_EPHEMERAL = 1u << 27,    /* --ephemeral: alloc's buffer or region create's goes with the connection */
	OPT_SHAREABLE = 1u << 28,    /* --shareable: alloc a buffer clients may attach */
	OPT_READ_ONLY = 1u << 29,    /* --read-only: attach with a read lease */
	OPT_JOBS_SELECT = 1u << 30,  /* --last N, --running, --queued, --failed: which jobs to list */
	OPT_SAVE_JSON = 1u << 31,    /* --save-json FILE: a bench also writes its --json result to FILE */
};
/* Bits past 31, which an enum constant cannot hold in C11. */
#define OPT_UID (1ull << 32) /* --uid N: quota's user (root and the admin group) */
#define OPT_BINARY (1ull << 33) /* --binary PATH: admin restart's gpuqd binary */
#define OPT_OWNER (1ull << 34) /* --owner UID|USER: whose buffers the names mean (root) */

struct cli;

struct cli_cmd {
	const char *name;
	const char *synopsis;   /* what follows "gpuq NAME" in usage lines */
	const char *summary;    /* one line for gpuq --help */
	const char *help;       /* the rest of gpuq NAME --help */
	uint64_t opts;          /* enum cli_opt bits, and OPT_UID */
	int min_args, max_args; /* positional arguments (at most 64) */
	const char *arg_names[3];
	int (*run)(struct cli *cli);
};

/* The parsed command line and the connection, for one run of gpuq. */
struct cli {
	const struct cli_cmd *cmd;
	/* Global options (also accepted after the command). */
	const char *socket;
	bool json;
	bool has_timeout;
	uint64_t timeout_ms;
	/* Command options; has_* say which were given. */
	bool detach;
	bool has_device, has_offset, has_length, has_bytes, has_count, has_requests;
	uint64_t device, offset, length, bytes, count, requests;
	const char *dtype, *clients;
	bool verify;                /* --verify */
	bool ephemeral;             /* --ephemeral */
	const char *path;           /* --path */
	const char *sizes;          /* --sizes */
	const char *engine;         /* --engine */
	const char *mode;           /* --mode */
	const char *kernel;         /* --kernel */
	const char *math;           /* --math */
	const char *out_buffer;     /* --out */
	bool has_repeat;
	uint64_t repeat;            /* --repeat */
	const char *devices;        /* --devices */
	const char *redop;          /* --op */
	const char *bytes_range;    /* bench --bytes MIN:MAX */
	bool has_factor, has_coll_timeout, has_wait_memory;
	uint64_t factor, coll_timeout_ms, wait_memory_ms;
	const char *priority;       /* --priority */
	bool has_root;
	uint64_t root;              /* --root */
	const char *reduce;         /* --reduce */
	bool shareable, read_only;  /* --shareable, --read-only */
	bool has_last;
	uint64_t last;              /* --last */
	const char *binary;         /* --binary: NULL, gpuqd's own */
	bool has_uid;
	uint64_t uid;               /* --uid */
	bool has_owner;
	uint64_t owner;             /* --owner, as a uid: the request's `owner` */
	unsigned job_states;        /* --running, --queued, --failed: enum cli_job_state bits */
	const char *save_json;      /* bench --save-json FILE */
	/* Where a bench writes its JSON result: stdout with --json, the
	 * --save-json file (beside the table), or NULL for neither. */
	FILE *json_out;
	bool once, has_interval;    /* top --once, --interval */
	uint64_t interval_ms;
	char **args;
	int nargs;
	/* Where human output goes: stdout, or stderr when stdout carries data. */
	FILE *out;
	struct gpuq_client *client;
	/* The client's reconnects already reported (cli_say_reconnected). */
	unsigned reconnects_said;
	/* The request sent asks the daemon to wait (timeout_ms): allow it time. */
	bool daemon_waits;
};

/* gpuq.c */
extern const struct cli_cmd cli_commands[];
void cli_print_command_help(FILE *f, const struct cli_cmd *cmd);

/* args.c */
int cli_parse_global(struct cli *cli, int argc, char **argv);
int cli_parse_command(struct cli *cli, int argc, char **argv);
/* Prints "gpuq CMD: <message>" and the command's usage line; returns CLI_USAGE. */
int cli_usage(const struct cli *cli, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Strict decimal: 0 and *out, or -1 (and nothing printed). */
int cli_parse_uint(const char *s, uint64_t *out);
/* A job id argument; on error prints a usage message and returns CLI_USAGE. */
int cli_parse_job(const struct cli *cli, const char *s, uint64_t *out);

/* call.c: connecting and calling, beneath every command file */
/*
 * Connects if not yet connected, reconnecting after a restart of gpuqd
 * within --timeout (default 10 s); 0, or CLI_UNREACHABLE (printed).
 */
int cli_connect(struct cli *cli);
/* Prints, once per new connection libgpuq made, that gpuqd restarted. */
void cli_say_reconnected(struct cli *cli);
/* Connects if needed and starts a request; 0, or CLI_UNREACHABLE (printed). */
int cli_begin(struct cli *cli, struct mp_map *req, const char *op);
/* Sends req; 0 with *out, or CLI_UNREACHABLE after printing why. */
int cli_call(struct cli *cli, struct mp_map *req, const int *fds, int nfds,
	     struct gpuq_reply **out);
/* Prints a failed reply's error; returns CLI_REFUSED. */
int cli_report_refusal(const struct gpuq_reply *r);
/*
 * Sends req (consumed) and prints the reply with render, or as JSON with
 * --json, or the refusal. The exit status.
 */
int cli_call_and_render(struct cli *cli, struct mp_map *req,
			void (*render)(FILE *f, const msgpack_object *reply));
/* cli_call_and_render of a request with nothing but its op. */
int cli_call_op_and_render(struct cli *cli, const char *op,
			   void (*render)(FILE *f, const msgpack_object *reply));
void cli_print_error(const struct gpuq_error *err);
/*
 * Keeps cli's connection, and what goes with it (an ephemeral buffer or
 * region, a lease), until SIGINT or SIGTERM, or until the daemon closes it
 * (then says that `what` went with it). Whatever the daemon sends meanwhile
 * (a lease_broken event) is read by a ping, which hands events to the
 * handler. CLI_OK once interrupted; CLI_UNREACHABLE when the daemon is gone.
 */
int cli_hold_connection(struct cli *cli, const char *what);
/* Ends cli_hold_connection's hold as a signal would (an event handler's way: lease_broken). */
void cli_hold_stop(void);

/* commands.c: the commands answered at once */
int cmd_ping(struct cli *cli);
int cmd_devices(struct cli *cli);
int cmd_buffers(struct cli *cli);
int cmd_jobs(struct cli *cli);
int cmd_status(struct cli *cli);
int cmd_wait(struct cli *cli);
int cmd_cancel(struct cli *cli);

/* job_call.c: what the job commands share, beneath them */
/* Sends --timeout as the daemon-side timeout_ms (the client then waits longer). */
void cli_put_timeout(struct cli *cli, struct mp_map *req);
/* Starts a job request: op, plus wait and the timeout unless --detach. */
int cli_job_begin(struct cli *cli, struct mp_map *req, const char *op);
/* Renders a job reply (a job request's, or wait's) and returns the exit code. */
int cli_finish_job(struct cli *cli, struct gpuq_reply *r);

/* put_new.c: put FILE NEWBUF makes the missing buffer, of FILE's size, first */
int put_make_missing(struct cli *cli, const char *spec, int fd);

/* jobs.c: the job commands */
int cmd_noop(struct cli *cli);
int cmd_alloc(struct cli *cli);
int cmd_free(struct cli *cli);
int cmd_put(struct cli *cli);
int cmd_get(struct cli *cli);
int cmd_fill(struct cli *cli);
int cmd_checksum(struct cli *cli);

/* bench.c */
int cmd_bench(struct cli *cli);
/* A bench kind: gpuq bench NAME SYNOPSIS, its gpuq --help line and its --help. */
struct bench_kind_row {
	const char *name, *synopsis, *summary, *help;
	int (*run)(struct cli *cli);
};
extern const struct bench_kind_row bench_kind_rows[]; /* ends with a NULL name */
const struct bench_kind_row *bench_kind_find(const char *name);
/* bench KIND: one function per kind, each in its own client/bench/bench_KIND.c. */
int bench_dispatch(struct cli *cli);
/* bench_copy.c: gpuq bench copy (bench_copy, then the daemon's bench_d2d if it has one) */
int bench_copy(struct cli *cli);
/* bench_alloc.c: gpuq bench alloc (bench_alloc: alloc/free latency, pool against slabs) */
int bench_alloc(struct cli *cli);
/* copy.c: gpuq copy SRC DST (render.c renders its summary line) */
int cmd_copy(struct cli *cli);
/*
 * progress.c: a progress bar on stderr, drawn from the daemon's progress
 * events while a job request waits. progress_begin asks for the events (adds
 * `progress: true` to req) only when stderr is a terminal.
 */
struct progress_bar {
	const char *label; /* "put w0" */
	bool drawn;
};
void progress_begin(struct cli *cli, struct mp_map *req, struct progress_bar *bar,
		    const char *label);
void progress_end(struct cli *cli, struct progress_bar *bar);
/*
 * cli_call of a job request (or wait) with a progress line on a terminal,
 * labelled with the command and its first argument ("fill w0", "wait 12").
 */
int progress_call(struct cli *cli, struct mp_map *req, const int *fds, int nfds,
		  struct gpuq_reply **out);
/* chain.c: run a kernel chain or an expression; reduce; the devices' counters */
int cmd_run(struct cli *cli);
int cmd_reduce(struct cli *cli);
int cmd_stats(struct cli *cli);
/* bench_chain.c */
int bench_chain(struct cli *cli);
/*
 * collectives.c: gpuq allreduce, reduce-scatter, all-gather, broadcast,
 * reduce, all-to-all (cmd_collective: the op is the command's name),
 * sendrecv and group; the --devices syntax, shared with bench collective.
 */
int cmd_collective(struct cli *cli);
int cmd_sendrecv(struct cli *cli);
int cmd_group(struct cli *cli);
/*
 * Parses --devices: "all" (the daemon's devices, asked with ping), or a list
 * such as 0-3 or 3,1,0 (rank order as given). Returns the count, or
 * -(exit code) after printing why.
 */
int cli_parse_devices(struct cli *cli, const char *list, int *devices, int max);
/*
 * The protocol's name of a collective given as the command line spells it
 * (all-gather or all_gather); NULL if it names none.
 */
const char *cli_collective_op(const char *name);
/* bench_collective.c: bench allreduce, and bench collective --op PRIMITIVE */
int bench_allreduce(struct cli *cli);
int bench_collective(struct cli *cli);
/* bench_sched.c (and bench_sched_*.c, bench_sched.h): gpuq bench sched */
int bench_sched(struct cli *cli);
/* service.c: the daemon as a service */
/* share.c: host regions and attached buffers */
int cmd_region(struct cli *cli);
int cmd_regions(struct cli *cli);
int cmd_attach(struct cli *cli);
int cmd_leases(struct cli *cli);
int cmd_quota(struct cli *cli);
int cmd_lease(struct cli *cli);
/* bench_attach.c: a new process attaching a resident buffer, beside get and cudaMemcpy */
int bench_attach(struct cli *cli);
/* bench_restart.c: gpuqd re-executing itself with many buffers resident */
int bench_restart(struct cli *cli);
int cmd_metrics(struct cli *cli);
int cmd_shutdown(struct cli *cli);
int cmd_admin(struct cli *cli);
int cmd_reset_device(struct cli *cli);
/* top.c (top_snapshot.c, top_view.c, top.h): gpuq top, the live view */
int cmd_top(struct cli *cli);

/* Options every bench kind may take (gpuq bench KIND --help says which it uses). */
#define BENCH_OPTS                                                             \
	(OPT_CLIENTS | OPT_REQUESTS | OPT_DEVICE | OPT_SIZES | OPT_BYTES |       \
	 OPT_REPEAT | OPT_DEVICES | OPT_REDOP | OPT_FACTOR | OPT_DTYPE | OPT_ROOT | OPT_REDUCE | \
	 OPT_SAVE_JSON)

/* render.c: human output of replies, and JSON */
void render_json(FILE *f, const msgpack_object *obj);
void render_ping(FILE *f, const msgpack_object *reply);
void render_devices(FILE *f, const msgpack_object *reply);
void render_buffers(FILE *f, const msgpack_object *reply);
void render_jobs(FILE *f, const msgpack_object *reply);
/* jobs' selection: newest first, only the states in job_states (0: all), at most last (0: all). */
enum cli_job_state { CLI_JOBS_QUEUED = 1, CLI_JOBS_RUNNING = 2, CLI_JOBS_FAILED = 4 };
struct jobs_filter {
	unsigned states;
	uint64_t last;
};
void render_jobs_selected(FILE *f, const msgpack_object *reply, const struct jobs_filter *flt,
			  bool json);
/* One line saying what a finished job did ("put w0: 1.00 GiB in ..."). */
void render_job_summary(FILE *f, const msgpack_object *record);
/* Every field of a job record, one per line. */
void render_job_record(FILE *f, const msgpack_object *record);
void render_cancel(FILE *f, const msgpack_object *reply);
/* The summary line of a done copy job (its result map). */
void render_copy_summary(FILE *f, const msgpack_object *res);
/* Under `gpuq devices`, with several devices: how copies between them travel. */
void render_peer_paths(FILE *f, const msgpack_object *devs);
/* Under `gpuq devices`: the reply's `absent`, buffers kept for GPUs the daemon does not serve. */
void render_absent(FILE *f, const msgpack_object *absent);

/* fields.c: the bottom of the CLI's output */
/* Field access for rendering: the value, or dflt when absent or mistyped. */
uint64_t field_u64(const msgpack_object *map, const char *key, uint64_t dflt);
double field_f64(const msgpack_object *map, const char *key, double dflt);
bool field_bool(const msgpack_object *map, const char *key, bool dflt);
/* The array at key, or NULL when absent or not an array. */
const msgpack_object *field_array(const msgpack_object *map, const char *key);
/* Copies a string field into buf (dflt when absent) and returns buf. */
const char *field_str(const msgpack_object *map, const char *key, char *buf,
		      size_t size, const char *dflt);
/* "1.0 GiB" with decimals digits after the point ("512 B" below 1 KiB). */
const char *human_bytes(char *buf, size_t size, uint64_t n, int decimals);
/* "41 µs", "1.2 ms", "0.52 s", "3m07s", "2h05m". */
const char *human_seconds(char *buf, size_t size, double s);

/* table.c: columns sized to their widest cell, headers in capitals. */
struct table_col {
	const char *name;
	bool right; /* right-aligned (numbers) */
};

#define TABLE_MAX_COLS 16

struct table {
	const struct table_col *cols;
	int ncols;
	char **cells; /* row-major */
	size_t ncells, cap;
};

void table_init(struct table *t, const struct table_col *cols, int ncols);
/* Appends the next cell, left to right and row by row. */
void table_cell(struct table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void table_print(const struct table *t, FILE *f);
void table_free(struct table *t);

#endif
