/*
 * gpuq top: --once prints one snapshot (two polls --interval apart, so that
 * rates exist) as plain text or JSON; otherwise a live view on the terminal,
 * redrawn every --interval with ANSI escape sequences, the keys read in raw
 * mode (no curses: the static build needs no new library).
 *
 * The terminal is put back on every way out: q, SIGINT, SIGTERM, SIGHUP,
 * the daemon going away, and exit() from anywhere (atexit). Signals only
 * note themselves and write a byte to a pipe that the loop polls beside
 * stdin, so that the loop, not the handler, restores the terminal.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "client/cli/top.h"

#define TOP_DEFAULT_INTERVAL_MS 1000
#define TOP_MIN_INTERVAL_MS 50
#define TOP_MAX_INTERVAL_MS 3600000

/* The live loop's state: the last two snapshots, the view, the screen. */
struct top_live {
	struct gpuq_client *client;
	struct top_view view;
	struct top_snapshot snap;
	uint64_t interval_ms;
	bool paused, help;
	bool restarted; /* the last refresh reconnected: said on the keys' row until a key */
	int rows, cols;
};

static struct termios term_saved;
static bool term_raw;
static volatile sig_atomic_t top_stop_signal, top_resized;
static int top_wake[2] = { -1, -1 };

/* A refused poll is the daemon's answer (1); a broken connection, unreachable (3). */
static int poll_failed(const struct gpuq_error *err)
{
	return err->code == GPUQ_E_IO || err->code == GPUQ_E_TIMEOUT ? CLI_UNREACHABLE
								     : CLI_REFUSED;
}

/*
 * The first poll, which also checks that --device names one of the
 * daemon's devices. 0, or an exit code (printed): a missing device is
 * refused as the daemon refuses one (not_found).
 */
static int top_first_poll(struct gpuq_client *c, const struct top_view *v,
			  struct top_snapshot *out)
{
	struct gpuq_error err;
	int i;

	if (top_snapshot_poll(c, NULL, out, &err) < 0) {
		fprintf(stderr, "gpuq top: %s\n", err.message);
		return poll_failed(&err);
	}
	if (v->device < 0)
		return 0;
	for (i = 0; i < out->ndevices; i++)
		if (out->devices[i].index == (uint64_t)v->device)
			return 0;
	fprintf(stderr, "gpuq top: device %d does not exist (gpuqd has %d; `gpuq devices` lists them)\n",
		v->device, out->ndevices);
	top_snapshot_free(out);
	return CLI_REFUSED;
}

/*
 * A poll against prev. One that had to connect again (gpuqd restarted, its
 * counters begun anew) is taken again as a first poll, so that no rate
 * compares two gpuqd images; *restarted says whether it was. 0, or -1 with err.
 */
static int top_poll(struct gpuq_client *c, const struct top_snapshot *prev,
		    struct top_snapshot *out, bool *restarted, struct gpuq_error *err)
{
	unsigned before = gpuq_reconnects(c);

	if (top_snapshot_poll(c, prev, out, err) < 0)
		return -1;
	*restarted = gpuq_reconnects(c) != before;
	if (!*restarted || !prev)
		return 0;
	top_snapshot_free(out);
	return top_snapshot_poll(c, NULL, out, err);
}

/*
 * Two polls interval_ms apart, sorted; 0 or an exit code (printed). A
 * second poll that reconnected is a first one again: one more interval
 * follows it, so that the rates exist.
 */
static int top_poll_twice(struct gpuq_client *c, uint64_t interval_ms, const struct top_view *v,
			  struct top_snapshot *out)
{
	struct top_snapshot first;
	struct gpuq_error err;
	struct timespec ts = { .tv_sec = (time_t)(interval_ms / 1000),
			       .tv_nsec = (long)(interval_ms % 1000) * 1000000 };
	int rc = top_first_poll(c, v, &first);
	bool restarted = false;

	if (rc)
		return rc;
	for (int polls = 0; rc == 0 && polls < 2 && (polls == 0 || restarted); polls++) {
		struct timespec left = ts;
		if (polls > 0) {
			top_snapshot_free(&first);
			first = *out;
		}
		while (nanosleep(&left, &left) < 0 && errno == EINTR)
			;
		rc = top_poll(c, &first, out, &restarted, &err);
	}
	top_snapshot_free(&first);
	if (rc < 0) {
		fprintf(stderr, "gpuq top: %s\n", err.message);
		return poll_failed(&err);
	}
	top_snapshot_sort(out, v->sort);
	return 0;
}

/* --once: plain text (no escape sequences) or JSON, for scripts. */
static int top_once(struct gpuq_client *c, struct cli *cli, const struct top_view *v,
		    uint64_t interval_ms)
{
	struct top_snapshot s;
	int rc = top_poll_twice(c, interval_ms, v, &s);

	cli_say_reconnected(cli);
	if (rc)
		return rc;
	if (cli->json)
		top_view_json(stdout, &s, v);
	else
		top_view_text(stdout, &s, v);
	top_snapshot_free(&s);
	return CLI_OK;
}

static void term_restore(void)
{
	if (!term_raw)
		return;
	/* Show the cursor, leave the alternate screen. */
	fputs("\033[?25h\033[?1049l", stdout);
	fflush(stdout);
	tcsetattr(STDIN_FILENO, TCSAFLUSH, &term_saved);
	term_raw = false;
}

/*
 * Raw enough for single keys: no line buffering, no echo. ISIG stays, so
 * Ctrl-C is a SIGINT as everywhere else; Ctrl-Z is off, as a stopped top
 * would leave the terminal in raw mode.
 */
static int term_enter(void)
{
	struct termios raw;

	if (tcgetattr(STDIN_FILENO, &term_saved) < 0)
		return -1;
	raw = term_saved;
	raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
	raw.c_cc[VMIN] = 1;
	raw.c_cc[VTIME] = 0;
	raw.c_cc[VSUSP] = _POSIX_VDISABLE;
	if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) < 0)
		return -1;
	term_raw = true;
	atexit(term_restore);
	fputs("\033[?1049h\033[?25l", stdout); /* alternate screen, cursor hidden */
	fflush(stdout);
	return 0;
}

static void term_size(struct top_live *t)
{
	struct winsize ws;

	t->rows = 24;
	t->cols = 80;
	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
		t->rows = ws.ws_row;
		t->cols = ws.ws_col;
	}
}

static void on_signal(int sig)
{
	int saved = errno;

	if (sig == SIGWINCH)
		top_resized = 1;
	else
		top_stop_signal = sig;
	if (write(top_wake[1], "", 1) < 0) {
		/* The pipe is full: the loop is awake already. */
	}
	errno = saved;
}

static int signals_install(void)
{
	static const int sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGWINCH };
	struct sigaction sa;
	size_t i;

	if (pipe(top_wake) < 0)
		return -1;
	fcntl(top_wake[0], F_SETFL, O_NONBLOCK);
	fcntl(top_wake[1], F_SETFL, O_NONBLOCK);
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART; /* the loop's poll still wakes: the pipe */
	sigemptyset(&sa.sa_mask);
	for (i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
		sigaction(sigs[i], &sa, NULL);
	return 0;
}

/* Bytes of s that fit in cols columns (UTF-8: continuation bytes take none). */
static size_t fit_width(const char *s, size_t len, int cols)
{
	size_t i;
	int w = 0;

	for (i = 0; i < len; i++) {
		if (((unsigned char)s[i] & 0xC0) != 0x80 && w++ == cols)
			break;
	}
	return i;
}

static const char *keys_line(const struct top_live *t)
{
	if (t->restarted)
		return "gpuqd restarted; reconnected (rates start again)  q quit  h help";
	if (t->help)
		return "q quit | s sort jobs: priority, age, device, owner | d device: all, 0, 1... | "
		       "u user: all, each uid | p pause | h this help";
	return t->paused ? "PAUSED (p resumes)  q quit  s sort  d device  u user  h help"
			 : "q quit  s sort  d device  u user  p pause  h help";
}

/*
 * Writes one screen line, cut to the width. The row is cleared first: a
 * line as wide as the screen leaves the cursor past its end, where clearing
 * "to the end of the line" would take the last character with it.
 */
static void paint_line(FILE *out, const char *s, size_t len, int cols)
{
	fputs("\033[2K", out);
	fwrite(s, 1, fit_width(s, len, cols), out);
	fputs("\r\n", out);
}

/*
 * Paints text's lines from the top row, cut to the width; when they do not
 * fit above the keys' row, the last row they may use counts the rest.
 */
static void paint_body(FILE *out, const char *text, size_t len, const struct top_live *t)
{
	const char *p = text, *end = text + len, *nl;
	char more[96];
	int row, lines = 0;

	for (nl = text; nl < end; nl++)
		lines += *nl == '\n';
	for (row = 0; p < end && row < t->rows - 1; row++, p = nl + 1) {
		if (!(nl = memchr(p, '\n', (size_t)(end - p))))
			nl = end;
		if (row == t->rows - 2 && lines - row > 1) {
			snprintf(more, sizeof more,
				 "... %d more lines (a taller terminal, or d/u to filter)", lines - row);
			paint_line(out, more, strlen(more), t->cols);
			break;
		}
		paint_line(out, p, (size_t)(nl - p), t->cols);
	}
}

/* Redraws the whole screen in one write, the keys in reverse video on the last row. */
static void top_paint(const struct top_live *t)
{
	char *text = NULL, *screen = NULL;
	size_t tlen = 0, slen = 0;
	const char *keys = keys_line(t);
	FILE *view = open_memstream(&text, &tlen), *out;

	if (!view)
		return;
	top_view_text(view, &t->snap, &t->view);
	fclose(view);
	if ((out = open_memstream(&screen, &slen))) {
		fputs("\033[H", out);
		paint_body(out, text, tlen, t);
		fprintf(out, "\033[J\033[%d;1H\033[2K\033[7m", t->rows);
		fwrite(keys, 1, fit_width(keys, strlen(keys), t->cols), out);
		fputs("\033[m", out);
		fclose(out);
		fwrite(screen, 1, slen, stdout);
		fflush(stdout);
	}
	free(text);
	free(screen);
}

/* The device after the current one in the filter's cycle: all, then each index. */
static int next_device(const struct top_snapshot *s, int device)
{
	int i;

	for (i = 0; i < s->ndevices; i++)
		if (device < 0 || (int)s->devices[i].index > device)
			return (int)s->devices[i].index;
	return -1;
}

static int64_t next_owner(const struct top_snapshot *s, int64_t owner)
{
	int64_t best = -1;
	int i;

	/* The smallest uid above owner; users are listed unordered. */
	for (i = 0; i < s->nusers; i++) {
		int64_t u = (int64_t)s->users[i].owner;
		if (u > owner && (best < 0 || u < best))
			best = u;
	}
	return best;
}

/* One key; false to quit. */
static bool top_key(struct top_live *t, char c)
{
	switch (c) {
	case 'q':
	case 'Q':
		return false;
	case 's':
		t->view.sort = (t->view.sort + 1) % TOP_SORTS;
		top_snapshot_sort(&t->snap, t->view.sort);
		break;
	case 'd':
		t->view.device = next_device(&t->snap, t->view.device);
		break;
	case 'u':
		t->view.owner = next_owner(&t->snap, t->view.owner);
		break;
	case 'p':
		t->paused = !t->paused;
		break;
	case 'h':
	case '?':
		t->help = !t->help;
		break;
	}
	return true;
}

/* Reads the keys waiting on stdin; false once q is pressed or stdin ends. */
static bool top_read_keys(struct top_live *t)
{
	char buf[64];
	ssize_t n = read(STDIN_FILENO, buf, sizeof buf);

	if (n == 0)
		return false;
	t->restarted = false;
	for (ssize_t i = 0; i < n; i++)
		if (!top_key(t, buf[i]))
			return false;
	return true;
}

/* A new snapshot against the last one; 0, or -1 with err. */
static int top_refresh(struct top_live *t, struct gpuq_error *err)
{
	struct top_snapshot next;

	bool restarted;

	if (top_poll(t->client, &t->snap, &next, &restarted, err) < 0)
		return -1;
	t->restarted = t->restarted || restarted;
	top_snapshot_free(&t->snap);
	t->snap = next;
	top_snapshot_sort(&t->snap, t->view.sort);
	return 0;
}

/*
 * The live loop: waits for a key, a signal, the daemon's socket or the next
 * refresh, whichever comes first. The socket is watched because top sends
 * nothing between refreshes (and nothing at all while paused): when it
 * turns readable the daemon has closed it, and refreshing at once says so.
 * Returns the exit code; *why says what ended it.
 */
static int top_loop(struct top_live *t, char *why, size_t size)
{
	double next = top_now_s() + (double)t->interval_ms / 1e3; /* the next refresh */
	struct gpuq_error err;

	for (;;) {
		struct pollfd fds[3] = { { .fd = STDIN_FILENO, .events = POLLIN },
					 { .fd = top_wake[0], .events = POLLIN },
					 { .fd = gpuq_fd(t->client), .events = POLLIN } };
		double left = (next - top_now_s()) * 1e3; /* ms */
		char drain[16];

		poll(fds, 3, t->paused ? -1 : left > 0 ? (int)left + 1 : 0);
		while (read(top_wake[0], drain, sizeof drain) > 0)
			;
		if (top_stop_signal) {
			snprintf(why, size, "stopped by %s", strsignal(top_stop_signal));
			return CLI_OK;
		}
		if (top_resized) {
			top_resized = 0;
			term_size(t);
		}
		if ((fds[0].revents & (POLLIN | POLLHUP)) && !top_read_keys(t)) {
			snprintf(why, size, "quit");
			return CLI_OK;
		}
		if (fds[2].revents || (!t->paused && top_now_s() >= next)) {
			if (top_refresh(t, &err) < 0) {
				snprintf(why, size, "gpuqd went away: %s", err.message);
				return poll_failed(&err);
			}
			next = top_now_s() + (double)t->interval_ms / 1e3;
		}
		top_paint(t);
	}
}

static int top_live(struct gpuq_client *c, const struct top_view *v, uint64_t interval_ms)
{
	struct top_live t = { .client = c, .view = *v, .interval_ms = interval_ms };
	char why[600];
	int rc = top_first_poll(c, v, &t.snap);

	if (rc)
		return rc;
	top_snapshot_sort(&t.snap, t.view.sort);
	if (signals_install() < 0 || term_enter() < 0) {
		perror("gpuq top: setting up the terminal");
		top_snapshot_free(&t.snap);
		return CLI_REFUSED;
	}
	term_size(&t);
	top_paint(&t);
	rc = top_loop(&t, why, sizeof why);
	term_restore();
	fprintf(rc ? stderr : stdout, "gpuq top: %s\n", why);
	top_snapshot_free(&t.snap);
	return rc;
}

int cmd_top(struct cli *cli)
{
	struct top_view v = { .device = cli->has_device ? (int)cli->device : -1, .owner = -1 };
	uint64_t interval = cli->has_interval ? cli->interval_ms : TOP_DEFAULT_INTERVAL_MS;

	if (interval < TOP_MIN_INTERVAL_MS || interval > TOP_MAX_INTERVAL_MS)
		return cli_usage(cli, "--interval %llu is out of range; give %d to %d ms",
				 (unsigned long long)interval, TOP_MIN_INTERVAL_MS, TOP_MAX_INTERVAL_MS);
	if (cli->json && !cli->once)
		return cli_usage(cli, "--json needs --once (the live view is for people)");
	if (!cli->once && (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)))
		return cli_usage(cli, "the live view needs a terminal on stdin and stdout; "
				      "--once prints one snapshot for scripts");
	if (cli_connect(cli) != 0)
		return CLI_UNREACHABLE;
	/* A daemon that stops answering must not freeze the screen. */
	gpuq_set_timeout(cli->client, cli->has_timeout ? (unsigned)cli->timeout_ms : 10000);
	if (cli->once)
		return top_once(cli->client, cli, &v, interval);
	return top_live(cli->client, &v, interval);
}
