/*
 * The progress line of a job the CLI waits for: the daemon sends progress
 * events (after about a second, four a second; see docs/protocol.md) and
 * each redraws one line on stderr. put, get and copy count bytes:
 *
 *   put w0  1.25 GiB / 4.00 GiB  [#########...................]  31%  5.21 GB/s  ETA 2.6 s
 *
 * jobs that count none (fill, checksum, run, reduce) say their state and time:
 *
 *   run y  queued 1.5 s          (behind other jobs, or waiting for memory)
 *   run y  running 12.3 s
 *
 * Only on a terminal: where stderr is a file or a pipe the events are not
 * even asked for. The final statistics (bytes, seconds, GB/s, path) are the
 * job summary's, printed either way.
 */
#include <string.h>
#include <unistd.h>

#include "client/cli/cli.h"

#define BAR_WIDTH 28

/* Decimal units, as the job summary writes rates. */
static const char *rate_text(char *buf, size_t size, double gbps)
{
	if (gbps >= 1)
		snprintf(buf, size, "%.2f GB/s", gbps);
	else
		snprintf(buf, size, "%.1f MB/s", gbps * 1e3);
	return buf;
}

static void draw(struct progress_bar *bar, uint64_t bytes, uint64_t total, double gbps,
		 double eta, bool has_eta)
{
	char done[32], all[32], rate[32], when[32], cells[BAR_WIDTH + 1];
	human_bytes(done, sizeof done, bytes, 2);
	rate_text(rate, sizeof rate, gbps);
	fprintf(stderr, "\r\033[K%s  %s", bar->label, done);
	if (total > 0) {
		double frac = bytes >= total ? 1.0 : (double)bytes / (double)total;
		int fill = (int)(frac * BAR_WIDTH);
		memset(cells, '#', (size_t)fill);
		memset(cells + fill, '.', (size_t)(BAR_WIDTH - fill));
		cells[BAR_WIDTH] = '\0';
		fprintf(stderr, " / %s  [%s] %3d%%", human_bytes(all, sizeof all, total, 2), cells,
			(int)(frac * 100));
	}
	fprintf(stderr, "  %s", rate);
	if (has_eta)
		fprintf(stderr, "  ETA %s", human_seconds(when, sizeof when, eta));
	fflush(stderr);
	bar->drawn = true;
}

/* A job that moves no bytes, or has not started: its state and how long. */
static void draw_state(struct progress_bar *bar, const char *state, double elapsed)
{
	char when[32];
	fprintf(stderr, "\r\033[K%s  %s %s", bar->label, state,
		human_seconds(when, sizeof when, elapsed));
	fflush(stderr);
	bar->drawn = true;
}

static void on_event(const msgpack_object *ev, void *arg)
{
	struct progress_bar *bar = arg;
	char kind[32], state[16];
	if (strcmp(field_str(ev, "event", kind, sizeof kind, ""), "progress") != 0)
		return;
	field_str(ev, "state", state, sizeof state, "running");
	if (field_u64(ev, "bytes", 0) == 0 && field_u64(ev, "total", 0) == 0) {
		draw_state(bar, state, field_f64(ev, "elapsed_s", 0));
		return;
	}
	double eta = field_f64(ev, "eta_s", -1);
	draw(bar, field_u64(ev, "bytes", 0), field_u64(ev, "total", 0), field_f64(ev, "gbps", 0),
	     eta, eta >= 0);
}

void progress_begin(struct cli *cli, struct mp_map *req, struct progress_bar *bar,
		    const char *label)
{
	memset(bar, 0, sizeof *bar);
	bar->label = label;
	if (cli->detach || !cli->client || !isatty(STDERR_FILENO))
		return;
	mp_put_bool(req, "progress", true);
	gpuq_set_event_handler(cli->client, on_event, bar);
}

void progress_end(struct cli *cli, struct progress_bar *bar)
{
	if (cli->client)
		gpuq_set_event_handler(cli->client, NULL, NULL);
	if (bar->drawn)
		fputs("\r\033[K", stderr);
	fflush(stderr);
	bar->drawn = false;
}

int progress_call(struct cli *cli, struct mp_map *req, const int *fds, int nfds,
		  struct gpuq_reply **out)
{
	struct progress_bar bar;
	char label[128];
	snprintf(label, sizeof label, "%s%s%s", cli->cmd->name, cli->nargs > 0 ? " " : "",
		 cli->nargs > 0 ? cli->args[0] : "");
	progress_begin(cli, req, &bar, label);
	int rc = cli_call(cli, req, fds, nfds, out);
	progress_end(cli, &bar);
	return rc;
}
