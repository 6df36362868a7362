/* Quotas and rights (see quota.h). Main thread only. */
#include "daemon/quota.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/daemon.h"

#define MAX_PEER_GROUPS 1024
#define MAX_GOVERNING 64

void quota_set_free(struct quota_set *q)
{
	free(q->rules);
	memset(q, 0, sizeof *q);
}

void quota_usage_free(struct quota_usage *u)
{
	free(u->users);
	memset(u, 0, sizeof *u);
}

int quota_section(const char *section, enum quota_scope *scope, char *name, size_t namesize)
{
	const char *rest;
	if (strcmp(section, "default") == 0) {
		*scope = QUOTA_DEFAULT;
		snprintf(name, namesize, "*");
		return 1;
	}
	if (strncmp(section, "user:", 5) == 0) {
		*scope = QUOTA_USER;
		rest = section + 5;
	} else if (strncmp(section, "group:", 6) == 0) {
		*scope = QUOTA_GROUP;
		rest = section + 6;
	} else {
		return 0;
	}
	snprintf(name, namesize, "%s", rest);
	return 1;
}

/* A user or group name, or a decimal id; -1 with msg when there is no such one. */
static int resolve_id(enum quota_scope scope, const char *name, uint32_t *id, char *msg,
		      size_t msgsize)
{
	char *end;
	const char *what = scope == QUOTA_USER ? "user" : "group";
	if (!*name) {
		snprintf(msg, msgsize, "[%s:] needs a %s name or number", what, what);
		return -1;
	}
	unsigned long v = strtoul(name, &end, 10);
	if (!*end && name[0] >= '0' && name[0] <= '9' && v < UINT32_MAX) {
		*id = (uint32_t)v;
		return 0;
	}
	errno = 0;
	if (scope == QUOTA_USER) {
		struct passwd *pw = getpwnam(name);
		if (pw) {
			*id = (uint32_t)pw->pw_uid;
			return 0;
		}
	} else {
		struct group *gr = getgrnam(name);
		if (gr) {
			*id = (uint32_t)gr->gr_gid;
			return 0;
		}
	}
	snprintf(msg, msgsize, "no %s named '%s'%s%s", what, name, errno ? ": " : "",
		 errno ? strerror(errno) : "");
	return -1;
}

struct quota_rule *quota_rule_get(struct quota_set *q, enum quota_scope scope, const char *name,
				  const char *where, char *msg, size_t msgsize)
{
	uint32_t id = 0;
	if (scope != QUOTA_DEFAULT && resolve_id(scope, name, &id, msg, msgsize) < 0)
		return NULL;
	for (int i = 0; i < q->count; i++)
		if (q->rules[i].scope == scope && q->rules[i].id == id)
			return &q->rules[i];
	if (q->count == q->cap) {
		int cap = q->cap ? q->cap * 2 : 8;
		struct quota_rule *rules = realloc(q->rules, sizeof *rules * (size_t)cap);
		if (!rules) {
			snprintf(msg, msgsize, "no memory for another quota rule");
			return NULL;
		}
		q->rules = rules;
		q->cap = cap;
	}
	struct quota_rule *r = &q->rules[q->count++];
	memset(r, 0, sizeof *r);
	r->scope = scope;
	r->id = id;
	if (scope == QUOTA_DEFAULT)
		snprintf(r->label, sizeof r->label, "[default]");
	else
		snprintf(r->label, sizeof r->label, "[%s:%.80s]",
			 scope == QUOTA_USER ? "user" : "group", name);
	snprintf(r->where, sizeof r->where, "%s", where);
	return r;
}

/* "all", "none", or a list such as 0,2-3 of device indices below GPUQ_MAX_DEVICES. */
static int parse_devices(const char *s, uint64_t *mask)
{
	char buf[256], *save = NULL;
	if (strcmp(s, "all") == 0) {
		*mask = UINT64_MAX;
		return 0;
	}
	*mask = 0;
	if (strcmp(s, "none") == 0)
		return 0;
	snprintf(buf, sizeof buf, "%s", s);
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *dash = strchr(tok, '-'), *end;
		if (dash)
			*dash = '\0';
		unsigned long lo = strtoul(tok, &end, 10);
		if (!*tok || *end || lo >= GPUQ_MAX_DEVICES)
			return -1;
		unsigned long hi = lo;
		if (dash) {
			hi = strtoul(dash + 1, &end, 10);
			if (!dash[1] || *end || hi < lo || hi >= GPUQ_MAX_DEVICES)
				return -1;
		}
		for (unsigned long d = lo; d <= hi; d++)
			*mask |= 1ull << d;
	}
	return *mask ? 0 : -1;
}

/* The limits on what a uid's connections hold (enum quota_hold). */
static const struct hold_limit {
	const char *name;  /* the rule's key and the metric's label */
	bool size;         /* a size (64M) rather than a count */
	uint64_t builtin;  /* where no rule sets it */
	const char *what;  /* what is counted, for refusals */
	const char *fix;
} hold_limits[HOLD_KINDS] = {
	[HOLD_CONNECTIONS] = { "connections", false, 512, "connections open", "close some" },
	[HOLD_PARKED_FDS] = { "parked-fds", false, 256, "descriptors received ahead of the requests that take them",
			      "send each request's descriptors with its first byte" },
	[HOLD_FRAME_BYTES] = { "pending-frame-bytes", true, 64ull << 20, "of incomplete request frames",
			       "finish sending one frame before starting another" },
	[HOLD_REPLY_BYTES] = { "reply-bytes", true, 256ull << 20, "of replies not yet read",
			       "read the replies to your requests" },
};

const char *quota_hold_name(enum quota_hold kind)
{
	return hold_limits[kind].name;
}

/* One of the hold limits: 1 if key names one (set, or -1 with msg), else 0. */
static int rule_set_hold(struct quota_rule *r, const char *key, const char *value, char *msg,
			 size_t msgsize)
{
	for (int k = 0; k < HOLD_KINDS; k++) {
		const struct hold_limit *h = &hold_limits[k];
		char *end;
		if (strcmp(key, h->name) != 0)
			continue;
		r->has_hold[k] = true;
		if (strcmp(value, "unlimited") == 0) {
			r->hold[k] = QUOTA_UNLIMITED;
			return 1;
		}
		unsigned long long n = strtoull(value, &end, 10);
		if (h->size ? gpuq_parse_size(value, &r->hold[k]) == 0
			    : (*value && !*end && value[0] != '-' && n <= UINT32_MAX && (r->hold[k] = n, true)))
			return 1;
		snprintf(msg, msgsize, "%s takes %s, or unlimited, not '%s'", key,
			 h->size ? "a size such as 64M" : "a number", value);
		return -1;
	}
	return 0;
}

int quota_rule_set(struct quota_rule *r, const char *key, const char *value, char *msg,
		   size_t msgsize)
{
	char *end;
	int rc = rule_set_hold(r, key, value, msg, msgsize);
	if (rc != 0)
		return rc < 0 ? -1 : 0;
	if (strcmp(key, "device-memory") == 0) {
		if (gpuq_parse_size(value, &r->device_memory) < 0) {
			snprintf(msg, msgsize, "device-memory takes a size such as 40G, not '%s'", value);
			return -1;
		}
		r->has_memory = true;
	} else if (strcmp(key, "host-pinned") == 0) {
		if (gpuq_parse_size(value, &r->host_pinned) < 0) {
			snprintf(msg, msgsize, "host-pinned takes a size such as 16G, not '%s'", value);
			return -1;
		}
		r->has_pinned = true;
	} else if (strcmp(key, "queued-jobs") == 0) {
		unsigned long long n = strtoull(value, &end, 10);
		if (!*value || *end || value[0] == '-' || n > UINT32_MAX) {
			snprintf(msg, msgsize, "queued-jobs takes a number of jobs, not '%s'", value);
			return -1;
		}
		r->queued_jobs = n;
		r->has_jobs = true;
	} else if (strcmp(key, "max-priority") == 0) {
		enum gpuq_priority p;
		if (gpuq_priority_from_name(value, strlen(value), &p) < 0) {
			snprintf(msg, msgsize, "max-priority takes high, normal or low, not '%s'", value);
			return -1;
		}
		r->max_priority = (int)p;
		r->has_priority = true;
	} else if (strcmp(key, "weight") == 0) {
		double w = strtod(value, &end);
		if (!*value || *end || !(w >= 0.01 && w <= 10000)) {
			snprintf(msg, msgsize, "weight takes a number from 0.01 to 10000, not '%s'", value);
			return -1;
		}
		r->weight = w;
		r->has_weight = true;
	} else if (strcmp(key, "benchmarks") == 0) {
		if (strcmp(value, "yes") != 0 && strcmp(value, "no") != 0) {
			snprintf(msg, msgsize, "benchmarks takes yes or no, not '%s'", value);
			return -1;
		}
		r->benchmarks = strcmp(value, "yes") == 0;
		r->has_benchmarks = true;
	} else if (strcmp(key, "devices") == 0) {
		if (parse_devices(value, &r->devices) < 0) {
			snprintf(msg, msgsize,
				 "devices takes all, none or a list of device indices such as 0,2-3 (below %d), not '%s'",
				 GPUQ_MAX_DEVICES, value);
			return -1;
		}
		r->has_devices = true;
	} else {
		snprintf(msg, msgsize,
			 "unknown limit '%s' in %s (limits: device-memory, host-pinned, queued-jobs, "
			 "devices, max-priority, weight, benchmarks, connections, parked-fds, "
			 "pending-frame-bytes, reply-bytes)", key, r->label);
		return -1;
	}
	return 0;
}

int quota_set_admin(struct quota_set *q, const char *group, char *msg, size_t msgsize)
{
	uint32_t gid;
	q->has_admin = false;
	snprintf(q->admin_group, sizeof q->admin_group, "%s", group);
	if (!*group)
		return 0;
	if (resolve_id(QUOTA_GROUP, group, &gid, msg, msgsize) < 0)
		return -1;
	q->has_admin = true;
	q->admin_gid = (gid_t)gid;
	return 0;
}

const char *quota_devices_text(uint64_t mask, char *buf, size_t size)
{
	size_t used = 0;
	buf[0] = '\0';
	for (int d = 0; d < GPUQ_MAX_DEVICES && used < size; d++) {
		if (!(mask >> d & 1) || (d > 0 && (mask >> (d - 1) & 1)))
			continue;
		int e = d;
		while (e + 1 < GPUQ_MAX_DEVICES && (mask >> (e + 1) & 1))
			e++;
		if (e == d)
			used += (size_t)snprintf(buf + used, size - used, "%s%d", used ? "," : "", d);
		else
			used += (size_t)snprintf(buf + used, size - used, "%s%d-%d", used ? "," : "", d, e);
	}
	if (!buf[0])
		snprintf(buf, size, "none");
	return buf;
}

/* The client's groups: its primary group and those the kernel reports for the connection. */
struct client_ids {
	uid_t uid;
	int ngroups;
	gid_t groups[MAX_PEER_GROUPS + 1];
};

static void client_ids(const struct conn *c, struct client_ids *ids)
{
	socklen_t len = sizeof(gid_t) * MAX_PEER_GROUPS;
	ids->uid = c->uid;
	ids->groups[0] = c->gid;
	ids->ngroups = 1;
	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, &ids->groups[1], &len) == 0)
		ids->ngroups += (int)(len / sizeof(gid_t));
	/* ERANGE (over 1024 groups): the primary group alone, which only ever loosens a limit */
}

static bool in_groups(const struct client_ids *ids, gid_t gid)
{
	for (int i = 0; i < ids->ngroups; i++)
		if (ids->groups[i] == gid)
			return true;
	return false;
}

bool quota_is_admin(struct daemon *d, const struct conn *c)
{
	const struct quota_set *q = &d->svc.quotas;
	if (c->uid == 0)
		return true;
	if (!q->has_admin)
		return false;
	struct client_ids ids;
	client_ids(c, &ids);
	return in_groups(&ids, q->admin_gid);
}

bool quota_may_see(struct daemon *d, const struct conn *c, uid_t owner)
{
	return owner == c->uid || quota_is_admin(d, c);
}

/* The limits; those from LIMIT_HOLD on are LIMIT_HOLD + an enum quota_hold. */
enum limit {
	LIMIT_MEMORY, LIMIT_JOBS, LIMIT_DEVICES, LIMIT_PRIORITY, LIMIT_WEIGHT, LIMIT_PINNED,
	LIMIT_BENCHMARKS, LIMIT_HOLD
};

static bool rule_sets(const struct quota_rule *r, int which)
{
	switch (which) {
	case LIMIT_MEMORY: return r->has_memory;
	case LIMIT_JOBS: return r->has_jobs;
	case LIMIT_DEVICES: return r->has_devices;
	case LIMIT_PRIORITY: return r->has_priority;
	case LIMIT_WEIGHT: return r->has_weight;
	case LIMIT_PINNED: return r->has_pinned;
	case LIMIT_BENCHMARKS: return r->has_benchmarks;
	}
	return which >= LIMIT_HOLD && which - LIMIT_HOLD < HOLD_KINDS && r->has_hold[which - LIMIT_HOLD];
}

/* What governs the hold limits where no rule sets them: hold_limits' defaults. */
static const struct quota_rule *builtin(void)
{
	static struct quota_rule r = {
		.scope = QUOTA_DEFAULT,
		.label = "[default]",
		.where = "gpuqd's built-in default; set the limit in [default] of the configuration file",
	};
	for (int k = 0; k < HOLD_KINDS; k++) {
		r.has_hold[k] = true;
		r.hold[k] = hold_limits[k].builtin;
	}
	return &r;
}

/*
 * The rules that govern one limit for the client: its user rule if that
 * sets the limit; else every rule of its groups that does; else the
 * default; else, for the connection limits, the built-in default.
 */
static int governing(const struct quota_set *q, const struct client_ids *ids, int which,
		     const struct quota_rule **out)
{
	int n = 0;
	for (int pass = QUOTA_USER; pass >= QUOTA_DEFAULT && n == 0; pass--) {
		for (int i = 0; i < q->count && n < MAX_GOVERNING; i++) {
			const struct quota_rule *r = &q->rules[i];
			if ((int)r->scope != pass || !rule_sets(r, which))
				continue;
			if ((pass == QUOTA_USER && r->id != ids->uid) ||
			    (pass == QUOTA_GROUP && !in_groups(ids, (gid_t)r->id)))
				continue;
			out[n++] = r;
		}
	}
	if (n == 0 && rule_sets(builtin(), which))
		out[n++] = builtin();
	return n;
}

static const char *size_text(uint64_t n, char *buf, size_t size)
{
	static const char *const units[] = { "bytes", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)n;
	int u = 0;
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, size, "%llu bytes", (unsigned long long)n);
	else
		snprintf(buf, size, "%.1f %s", v, units[u]);
	return buf;
}

static int refuse(struct daemon *d, const char *limit, struct gpuq_error *err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int refuse(struct daemon *d, const char *limit, struct gpuq_error *err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	gpuq_vfail(err, GPUQ_E_PERMISSION_DENIED, fmt, ap);
	va_end(ap);
	metrics_quota_refusal(&d->svc.metrics, limit);
	return -1;
}

static int check_device(struct daemon *d, const struct client_ids *ids, int device,
			struct gpuq_error *err)
{
	const struct quota_rule *rules[MAX_GOVERNING];
	int n = governing(&d->svc.quotas, ids, LIMIT_DEVICES, rules);
	char list[256];
	for (int i = 0; i < n; i++)
		if (device < 0 || device >= GPUQ_MAX_DEVICES || !(rules[i]->devices >> device & 1))
			return refuse(d, "devices", err,
				      "quota %s (%s) allows uid %d devices %s, not device %d",
				      rules[i]->label, rules[i]->where, (int)ids->uid,
				      quota_devices_text(rules[i]->devices, list, sizeof list), device);
	return 0;
}

int quota_check_job(struct daemon *d, const struct conn *c, const struct job *job,
		    struct gpuq_error *err)
{
	if (c->uid == 0 || d->svc.quotas.count == 0)
		return 0;
	struct client_ids ids;
	client_ids(c, &ids);
	for (int i = 0; i < job_nworks(job); i++)
		if (check_device(d, &ids, job_device(job, i), err) < 0)
			return -1;
	const struct quota_rule *rules[MAX_GOVERNING];
	int n = governing(&d->svc.quotas, &ids, LIMIT_JOBS, rules);
	unsigned active = quota_active_jobs(&d->svc.usage, c->uid);
	for (int i = 0; i < n; i++)
		if (active >= rules[i]->queued_jobs)
			return refuse(d, "queued-jobs", err,
				      "quota %s (%s): queued-jobs %llu reached; uid %d has %u jobs queued or running (wait for one to finish)",
				      rules[i]->label, rules[i]->where,
				      (unsigned long long)rules[i]->queued_jobs, (int)c->uid, active);
	return 0;
}

/* The rules that govern one limit for the client: none for root or without rules. */
static int rules_for(struct daemon *d, const struct conn *c, enum limit which,
		     const struct quota_rule **rules)
{
	if (c->uid == 0 || d->svc.quotas.count == 0)
		return 0;
	struct client_ids ids;
	client_ids(c, &ids);
	return governing(&d->svc.quotas, &ids, which, rules);
}

int quota_check_benchmarks(struct daemon *d, const struct conn *c, const char *op,
			   struct gpuq_error *err)
{
	/* gpuqd's own user can stop it anyway: a private daemon's owner runs its benchmarks */
	if (c->uid == geteuid() || quota_is_admin(d, c))
		return 0;
	const struct quota_rule *rules[MAX_GOVERNING];
	int n = rules_for(d, c, LIMIT_BENCHMARKS, rules);
	for (int i = 0; i < n; i++)
		if (!rules[i]->benchmarks)
			return refuse(d, "benchmarks", err,
				      "quota %s (%s): benchmarks = no; uid %d may not run %s, which "
				      "holds whole devices (root or the admin group may, or a rule "
				      "that sets benchmarks = yes)",
				      rules[i]->label, rules[i]->where, (int)c->uid, op);
	if (n > 0)
		return 0;
	return refuse(d, "benchmarks", err,
		      "%s holds whole devices, so it is for root, the admin group (%s) and users "
		      "whose quota rule sets benchmarks = yes; uid %d is none of these (ask for "
		      "'benchmarks = yes' in its [user:NAME] or [group:NAME] rule of gpuqd.conf)",
		      op, d->svc.quotas.has_admin ? d->svc.quotas.admin_group : "none configured",
		      (int)c->uid);
}

int quota_default_priority(struct daemon *d, const struct conn *c)
{
	const struct quota_rule *rules[MAX_GOVERNING];
	int n = rules_for(d, c, LIMIT_PRIORITY, rules);
	int priority = GPUQ_PRIORITY_NORMAL;
	for (int i = 0; i < n; i++)
		if (rules[i]->max_priority > priority)
			priority = rules[i]->max_priority;
	return priority;
}

int quota_check_priority(struct daemon *d, const struct conn *c, int priority,
			 struct gpuq_error *err)
{
	const struct quota_rule *rules[MAX_GOVERNING];
	int n = rules_for(d, c, LIMIT_PRIORITY, rules);
	for (int i = 0; i < n; i++)
		if (priority < rules[i]->max_priority)
			return refuse(d, "max-priority", err,
				      "quota %s (%s): max-priority %s; uid %d may not ask for priority %s",
				      rules[i]->label, rules[i]->where,
				      gpuq_priority_name((enum gpuq_priority)rules[i]->max_priority),
				      (int)c->uid, gpuq_priority_name((enum gpuq_priority)priority));
	return 0;
}

double quota_weight(struct daemon *d, const struct conn *c)
{
	if (d->svc.quotas.count == 0)
		return 1;
	struct client_ids ids;
	client_ids(c, &ids);
	const struct quota_rule *rules[MAX_GOVERNING];
	int n = governing(&d->svc.quotas, &ids, LIMIT_WEIGHT, rules);
	double w = n ? rules[0]->weight : 1;
	for (int i = 1; i < n; i++)
		if (rules[i]->weight > w)
			w = rules[i]->weight;
	return w;
}

static uint64_t owner_bytes_on(const struct buffer_table *t, uid_t owner, int device)
{
	uint64_t sum = 0;
	for (const struct buffer *b = t->head; b; b = b->next)
		if (b->owner == owner && b->device == device)
			sum += b->bytes;
	return sum;
}

int quota_check_alloc(struct daemon *d, const struct conn *c, int device, uint64_t bytes,
		      struct gpuq_error *err)
{
	if (c->uid == 0 || d->svc.quotas.count == 0)
		return 0;
	struct client_ids ids;
	client_ids(c, &ids);
	if (check_device(d, &ids, device, err) < 0)
		return -1;
	const struct quota_rule *rules[MAX_GOVERNING];
	int n = governing(&d->svc.quotas, &ids, LIMIT_MEMORY, rules);
	if (n == 0)
		return 0;
	uint64_t held = owner_bytes_on(&d->buffers, c->uid, device);
	char limit[32], have[32], want[32];
	for (int i = 0; i < n; i++)
		if (bytes > rules[i]->device_memory || held > rules[i]->device_memory - bytes)
			return refuse(d, "device-memory", err,
				      "quota %s (%s): device-memory %s per device; uid %d holds %s on device %d and asks for %s more",
				      rules[i]->label, rules[i]->where,
				      size_text(rules[i]->device_memory, limit, sizeof limit), (int)c->uid,
				      size_text(held, have, sizeof have), device,
				      size_text(bytes, want, sizeof want));
	return 0;
}

int quota_check_pinned(struct daemon *d, const struct conn *c, uint64_t bytes,
		       struct gpuq_error *err)
{
	const struct quota_rule *rules[MAX_GOVERNING];
	int n = rules_for(d, c, LIMIT_PINNED, rules);
	uint64_t held = region_bytes_of(&d->regions, c->uid);
	char limit[32], have[32], want[32];
	for (int i = 0; i < n; i++)
		if (bytes > rules[i]->host_pinned || held > rules[i]->host_pinned - bytes)
			return refuse(d, "host-pinned", err,
				      "quota %s (%s): host-pinned %s; uid %d holds %s of regions and asks for %s more",
				      rules[i]->label, rules[i]->where,
				      size_text(rules[i]->host_pinned, limit, sizeof limit), (int)c->uid,
				      size_text(held, have, sizeof have), size_text(bytes, want, sizeof want));
	return 0;
}

static struct quota_user *usage_find(const struct quota_usage *u, uid_t uid)
{
	for (int i = 0; i < u->count; i++)
		if (u->users[i].uid == uid)
			return &u->users[i];
	return NULL;
}

/* uid's entry, made on first use; NULL when out of memory. */
static struct quota_user *usage_get(struct quota_usage *u, uid_t uid)
{
	struct quota_user *e = usage_find(u, uid);
	if (e)
		return e;
	if (u->count == u->cap) {
		int cap = u->cap ? u->cap * 2 : 16;
		struct quota_user *users = realloc(u->users, sizeof *users * (size_t)cap);
		if (!users)
			return NULL;
		u->users = users;
		u->cap = cap;
	}
	e = &u->users[u->count++];
	memset(e, 0, sizeof *e);
	e->uid = uid;
	return e;
}

void quota_job_started(struct quota_usage *u, uid_t uid)
{
	struct quota_user *e = usage_get(u, uid);
	if (e) /* uncounted otherwise: the quota is only ever looser for it */
		e->active++;
}

void quota_job_ended(struct quota_usage *u, uid_t uid)
{
	struct quota_user *e = usage_find(u, uid);
	if (e && e->active > 0)
		e->active--;
}

unsigned quota_active_jobs(const struct quota_usage *u, uid_t uid)
{
	const struct quota_user *e = usage_find(u, uid);
	return e ? e->active : 0;
}

/* The first rule governing hold `kind` that total would break, or NULL. */
static const struct quota_rule *hold_limit_broken(struct daemon *d, const struct conn *c,
						  enum quota_hold kind, uint64_t total)
{
	const struct quota_rule *rules[MAX_GOVERNING];
	struct client_ids ids;
	client_ids(c, &ids);
	int n = governing(&d->svc.quotas, &ids, LIMIT_HOLD + (int)kind, rules);
	for (int i = 0; i < n; i++)
		if (total > rules[i]->hold[kind])
			return rules[i];
	return NULL;
}

static const char *hold_text(enum quota_hold kind, uint64_t n, char *buf, size_t size)
{
	if (hold_limits[kind].size)
		return size_text(n, buf, size);
	snprintf(buf, size, "%llu", (unsigned long long)n);
	return buf;
}

/* Checks each hold that grows from held to now against the uid's limits. */
static int hold_limits_check(struct daemon *d, const struct conn *c, const struct quota_user *e,
			     const struct quota_conn_held *held, const struct quota_conn_held *now,
			     struct gpuq_error *err)
{
	for (int k = 0; k < HOLD_KINDS; k++) {
		const struct hold_limit *h = &hold_limits[k];
		uint64_t total = e->held[k] - held->n[k] + now->n[k];
		const struct quota_rule *r;
		char limit[32], have[32];
		if (now->n[k] <= held->n[k] || !(r = hold_limit_broken(d, c, (enum quota_hold)k, total)))
			continue;
		return refuse(d, h->name, err,
			      "quota %s (%s): %s %s exceeded; uid %d's connections would hold %s %s (%s)",
			      r->label, r->where, h->name,
			      hold_text((enum quota_hold)k, r->hold[k], limit, sizeof limit), (int)c->uid,
			      hold_text((enum quota_hold)k, total, have, sizeof have), h->what, h->fix);
	}
	return 0;
}

int quota_conn_hold(struct daemon *d, const struct conn *c, struct quota_conn_held *held,
		    const struct quota_conn_held *now, struct gpuq_error *err)
{
	struct quota_user *e = usage_get(&d->svc.usage, c->uid);
	if (!e)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory to account for uid %d",
				 (int)c->uid);
	if (c->uid != 0 && hold_limits_check(d, c, e, held, now, err) < 0)
		return -1;
	for (int k = 0; k < HOLD_KINDS; k++)
		e->held[k] = e->held[k] - held->n[k] + now->n[k];
	*held = *now;
	return 0;
}

const struct quota_user *quota_usage_of(const struct quota_usage *u, uid_t uid)
{
	return usage_find(u, uid);
}

/* uid's ids: c's when given, else one of uid's open connections'; false when neither. */
static bool uid_ids(struct daemon *d, const struct conn *c, uid_t uid, struct client_ids *ids,
		    const struct conn **found)
{
	for (const struct conn *o = d->server.conns; !c && o; o = o->next)
		if (o->uid == uid && !o->closed)
			c = o;
	*found = c;
	if (c) {
		client_ids(c, ids);
		return true;
	}
	ids->uid = uid;
	ids->ngroups = 0;
	return false;
}

/* The smaller of a limit so far (none yet when first) and v. */
static uint64_t stricter(bool first, uint64_t have, uint64_t v)
{
	return first || v < have ? v : have;
}

/* The strictest of the governing rules for one limit, into out's field. */
static void effective_one(const struct quota_set *q, const struct client_ids *ids, int which,
			  struct quota_rule *out)
{
	const struct quota_rule *rules[MAX_GOVERNING];
	int n = governing(q, ids, which, rules);
	for (int i = 0; i < n; i++) {
		const struct quota_rule *r = rules[i];
		bool first = i == 0;
		int k = which - LIMIT_HOLD;
		switch (which) {
		case LIMIT_MEMORY:
			out->device_memory = stricter(first, out->device_memory, r->device_memory);
			out->has_memory = true;
			break;
		case LIMIT_PINNED:
			out->host_pinned = stricter(first, out->host_pinned, r->host_pinned);
			out->has_pinned = true;
			break;
		case LIMIT_JOBS:
			out->queued_jobs = stricter(first, out->queued_jobs, r->queued_jobs);
			out->has_jobs = true;
			break;
		case LIMIT_DEVICES:
			out->devices = first ? r->devices : out->devices & r->devices;
			out->has_devices = true;
			break;
		case LIMIT_PRIORITY: /* a larger value is less urgent: the strictest */
			if (first || r->max_priority > out->max_priority)
				out->max_priority = r->max_priority;
			out->has_priority = true;
			break;
		default: /* a hold; a rule's unlimited binds nothing */
			if (r->hold[k] == QUOTA_UNLIMITED)
				break;
			out->hold[k] = stricter(!out->has_hold[k], out->hold[k], r->hold[k]);
			out->has_hold[k] = true;
		}
	}
}

void quota_effective(struct daemon *d, const struct conn *c, uid_t uid, struct quota_rule *out,
		     bool *groups_known)
{
	const struct quota_set *q = &d->svc.quotas;
	struct client_ids ids;
	const struct conn *found;
	memset(out, 0, sizeof *out);
	*groups_known = uid_ids(d, c, uid, &ids, &found);
	out->weight = 1;
	if (q->count > 0) {
		const struct quota_rule *rules[MAX_GOVERNING];
		int n = governing(q, &ids, LIMIT_WEIGHT, rules);
		for (int i = 0; i < n; i++)
			if (i == 0 || rules[i]->weight > out->weight)
				out->weight = rules[i]->weight;
	}
	bool admin = uid == 0 || (found && quota_is_admin(d, found));
	out->has_benchmarks = true;
	out->benchmarks = admin || uid == geteuid();
	if (uid == 0)
		return;
	if (!out->benchmarks) {
		const struct quota_rule *rules[MAX_GOVERNING];
		int n = governing(q, &ids, LIMIT_BENCHMARKS, rules);
		out->benchmarks = n > 0;
		for (int i = 0; i < n; i++)
			out->benchmarks = out->benchmarks && rules[i]->benchmarks;
	}
	for (int k = 0; k < HOLD_KINDS; k++)
		effective_one(q, &ids, LIMIT_HOLD + k, out);
	if (q->count == 0) /* the checks of the other limits apply only with rules */
		return;
	static const int others[] = { LIMIT_MEMORY, LIMIT_PINNED, LIMIT_JOBS, LIMIT_DEVICES,
				      LIMIT_PRIORITY };
	for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
		effective_one(q, &ids, others[i], out);
}

static bool uid_listed(const uid_t *list, int n, uid_t uid)
{
	for (int i = 0; i < n; i++)
		if (list[i] == uid)
			return true;
	return false;
}

static int uid_cmp(const void *a, const void *b)
{
	uid_t x = *(const uid_t *)a, y = *(const uid_t *)b;
	return x < y ? -1 : x > y;
}

static void uid_add(uid_t *out, int *n, int max, uid_t uid)
{
	if (*n < max && !uid_listed(out, *n, uid))
		out[(*n)++] = uid;
}

int quota_uids(struct daemon *d, uid_t *out, int max)
{
	int n = 0;
	const struct quota_set *q = &d->svc.quotas;
	for (int i = 0; i < q->count; i++)
		if (q->rules[i].scope == QUOTA_USER)
			uid_add(out, &n, max, (uid_t)q->rules[i].id);
	for (int i = 0; i < d->svc.usage.count; i++) {
		const struct quota_user *e = &d->svc.usage.users[i];
		bool holds = e->active > 0;
		for (int k = 0; k < HOLD_KINDS; k++)
			holds = holds || e->held[k] > 0;
		if (holds)
			uid_add(out, &n, max, e->uid);
	}
	for (const struct buffer *b = d->buffers.head; b; b = b->next)
		uid_add(out, &n, max, b->owner);
	for (const struct region *r = d->regions.head; r; r = r->next)
		uid_add(out, &n, max, r->owner);
	qsort(out, (size_t)n, sizeof *out, uid_cmp);
	return n;
}
