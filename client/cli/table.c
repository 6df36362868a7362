/*
 * Aligned text tables: cells are collected first so that every column can
 * be as wide as its widest cell, then printed with two spaces between
 * columns. The last column is not padded, so lines carry no trailing blanks.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli/cli.h"

void table_init(struct table *t, const struct table_col *cols, int ncols)
{
	memset(t, 0, sizeof(*t));
	t->cols = cols;
	t->ncols = ncols < TABLE_MAX_COLS ? ncols : TABLE_MAX_COLS;
}

void table_cell(struct table *t, const char *fmt, ...)
{
	va_list ap;
	char *s;

	if (t->ncells == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 64;
		char **cells = realloc(t->cells, cap * sizeof(*cells));

		if (!cells)
			return; /* out of memory: the table comes out short */
		t->cells = cells;
		t->cap = cap;
	}
	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	va_end(ap);
	t->cells[t->ncells++] = s;
}

/* Columns on screen, not bytes: "µs" is three bytes and two columns. */
static size_t display_width(const char *s)
{
	size_t w = 0;

	for (; s && *s; s++)
		if (((unsigned char)*s & 0xC0) != 0x80)
			w++;
	return w;
}

static void print_cell(FILE *f, const char *s, size_t width, bool right, bool last)
{
	size_t pad = width - display_width(s);

	if (right)
		fprintf(f, "%*s%s", (int)pad, "", s);
	else if (last)
		fputs(s, f);
	else
		fprintf(f, "%s%*s", s, (int)pad, "");
	fputs(last ? "\n" : "  ", f);
}

void table_print(const struct table *t, FILE *f)
{
	size_t width[TABLE_MAX_COLS] = { 0 };
	size_t i, nrows = t->ncells / (size_t)t->ncols;
	int c;

	for (c = 0; c < t->ncols; c++)
		width[c] = display_width(t->cols[c].name);
	for (i = 0; i < nrows * (size_t)t->ncols; i++) {
		size_t w = display_width(t->cells[i]);

		c = (int)(i % (size_t)t->ncols);
		if (w > width[c])
			width[c] = w;
	}
	for (c = 0; c < t->ncols; c++)
		print_cell(f, t->cols[c].name, width[c], t->cols[c].right, c == t->ncols - 1);
	for (i = 0; i < nrows * (size_t)t->ncols; i++) {
		c = (int)(i % (size_t)t->ncols);
		print_cell(f, t->cells[i] ? t->cells[i] : "?", width[c], t->cols[c].right,
			   c == t->ncols - 1);
	}
}

void table_free(struct table *t)
{
	size_t i;

	for (i = 0; i < t->ncells; i++)
		free(t->cells[i]);
	free(t->cells);
	memset(t, 0, sizeof(*t));
}
