/*
 * The configuration file (see config.h). inih does the INI syntax; a line
 * reader of ours counts lines, so that every error names FILE:LINE even
 * though inih's handler is not told the line (Debian builds it without
 * INI_HANDLER_LINENO). The handler itself never fails: it records each
 * error and goes on, and only syntax errors are left to inih, which reports
 * the first.
 */
#include "daemon/config.h"

#include <errno.h>
#include <grp.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct parse {
	FILE *f;
	const char *path;
	char *buf; /* getline's */
	size_t bufsize;
	int line;            /* the line inih is parsing */
	int section_line;    /* where the current section's header is */
	int reported_section; /* the section whose header error was reported */
	int rule;            /* index of the current section's rule; -1 if none */
	char rule_section[128];
	struct options *o;
	struct quota_set *q;
	struct config_report *r;
	int admin_group_line, socket_group_line;
};

void config_error(struct config_report *r, const char *fmt, ...)
{
	if (r->count < CONFIG_MAX_ERRORS) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r->errors[r->count], sizeof r->errors[0], fmt, ap);
		va_end(ap);
	}
	r->count++;
}

/* inih's reader: one line per call, counted; an overlong line is reported and skipped. */
static char *read_line(char *str, int num, void *stream)
{
	struct parse *p = stream;
	ssize_t n = getline(&p->buf, &p->bufsize, p->f);
	if (n < 0)
		return NULL;
	p->line++;
	const char *s = p->buf + strspn(p->buf, " \t");
	if (*s == '[')
		p->section_line = p->line;
	if (n >= num) {
		config_error(p->r, "%s:%d: line longer than %d characters", p->path, p->line, num - 1);
		snprintf(str, (size_t)num, ";\n"); /* a comment: inih skips it */
		return str;
	}
	memcpy(str, p->buf, (size_t)n + 1);
	return str;
}

static void set_option(struct parse *p, const char *name, const char *value)
{
	char msg[512];
	int rc = options_set(p->o, name, value, msg, sizeof msg);
	if (rc == -2)
		config_error(p->r, "%s:%d: unknown option '%s' (options: %s)", p->path, p->line, name,
			     options_names());
	else if (rc < 0)
		config_error(p->r, "%s:%d: %s", p->path, p->line, msg);
	else if (strcmp(name, "admin-group") == 0)
		p->admin_group_line = p->line;
	else if (strcmp(name, "socket-group") == 0)
		p->socket_group_line = p->line;
}

/* The rule of the current section, found or created once per section. */
static struct quota_rule *section_rule(struct parse *p, const char *section,
				       enum quota_scope scope, const char *name)
{
	if (strcmp(section, p->rule_section) != 0 || p->rule < 0) {
		char where[300], msg[512];
		snprintf(p->rule_section, sizeof p->rule_section, "%s", section);
		snprintf(where, sizeof where, "%s:%d", p->path, p->section_line);
		struct quota_rule *r = quota_rule_get(p->q, scope, name, where, msg, sizeof msg);
		p->rule = r ? (int)(r - p->q->rules) : -1;
		if (!r && p->reported_section != p->section_line) {
			config_error(p->r, "%s:%d: [%s]: %s", p->path, p->section_line, section, msg);
			p->reported_section = p->section_line;
		}
	}
	return p->rule >= 0 ? &p->q->rules[p->rule] : NULL;
}

static int on_value(void *user, const char *section, const char *name, const char *value)
{
	struct parse *p = user;
	enum quota_scope scope;
	char rname[128], msg[512];
	if (!*section || strcmp(section, "gpuqd") == 0) {
		set_option(p, name, value);
		return 1;
	}
	if (!quota_section(section, &scope, rname, sizeof rname)) {
		if (p->reported_section != p->section_line)
			config_error(p->r,
				     "%s:%d: unknown section [%s] (sections: [gpuqd], [default], [user:NAME], [group:NAME])",
				     p->path, p->section_line, section);
		p->reported_section = p->section_line;
		return 1;
	}
	struct quota_rule *r = section_rule(p, section, scope, rname);
	if (r && quota_rule_set(r, name, value, msg, sizeof msg) < 0)
		config_error(p->r, "%s:%d: %s", p->path, p->line, msg);
	return 1;
}

static void parse_file(struct parse *p)
{
	int rc = ini_parse_stream(read_line, p, on_value, p);
	if (rc > 0)
		config_error(p->r, "%s:%d: syntax error: expected NAME = VALUE, [SECTION], or a # comment",
			     p->path, rc);
	else if (rc < 0)
		config_error(p->r, "%s: out of memory while parsing", p->path);
	if (ferror(p->f))
		config_error(p->r, "%s: read error: %s", p->path, strerror(errno));
}

/* The groups the final options name must exist; the error cites the file if the value is its. */
static void check_groups(const struct parse *p, const struct options *file, struct options *o,
			 struct quota_set *q)
{
	char msg[512];
	if (quota_set_admin(q, o->admin_group, msg, sizeof msg) < 0) {
		if (p->admin_group_line && strcmp(file->admin_group, o->admin_group) == 0)
			config_error(p->r, "%s:%d: admin-group: %s", p->path, p->admin_group_line, msg);
		else
			config_error(p->r, "--admin-group: %s", msg);
	}
	if (o->socket_group[0] && !getgrnam(o->socket_group)) {
		if (p->socket_group_line && strcmp(file->socket_group, o->socket_group) == 0)
			config_error(p->r, "%s:%d: socket-group: no group named '%s'", p->path,
				     p->socket_group_line, o->socket_group);
		else
			config_error(p->r, "--socket-group: no group named '%s'", o->socket_group);
	}
}

int config_build(const struct options *cli, int argc, char **argv, struct options *o,
		 struct quota_set *q, struct config_report *r)
{
	struct parse p = { .path = cli->config_path, .rule = -1, .o = o, .q = q, .r = r };
	memset(r, 0, sizeof *r);
	memset(q, 0, sizeof *q);
	options_defaults(o);
	p.f = fopen(cli->config_path, "re");
	if (p.f) {
		r->file_read = true;
		parse_file(&p);
		fclose(p.f);
		free(p.buf);
	} else if (cli->config_given || errno != ENOENT) {
		config_error(r, "%s: %s", cli->config_path, strerror(errno));
	}
	struct options file = *o;
	if (options_parse(o, argc, argv) != 0) /* the command line wins; it parsed once already */
		config_error(r, "the command line no longer parses");
	check_groups(&p, &file, o, q);
	return r->count;
}
