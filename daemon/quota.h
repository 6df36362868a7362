/*
 * Quotas and rights. Main thread only.
 *
 * A quota rule applies to one user ([user:NAME]), to each member of one
 * group ([group:NAME]) or to everyone ([default]) and may set these limits:
 * device-memory (bytes a user's buffers may hold on any one device),
 * host-pinned (bytes a user's host regions may pin, all devices together),
 * queued-jobs (a user's jobs queued or running at once), devices (the
 * device indices a user's jobs may use), max-priority (the most urgent
 * priority a user's jobs may ask for), and what a user's connections may
 * hold in gpuqd at once: connections, parked-fds (descriptors received
 * ahead of the request that takes them), pending-frame-bytes (bytes of
 * request frames not yet complete) and reply-bytes (replies queued for
 * connections that have not read them); and a weight, the user's share of
 * each GPU against other users' within one priority (the scheduler's fair
 * share; a group's rules give the largest weight among them). For each
 * limit the most specific rules that set it govern: the user's rule; else
 * every rule of a group the client belongs to (all must hold, so the
 * strictest wins); else the default; the connection limits have built-in
 * defaults (quota.c), so that an unconfigured daemon is bounded too. Root
 * is never limited. A refusal is permission_denied naming the rule and
 * where it was written.
 *
 * Rights: root, and members of the admin group, may see and cancel every
 * job and stop the daemon. Benchmarks (the bench_* ops) run alone on their
 * devices, so they are for root, the admin group, gpuqd's own user (a
 * private daemon's owner) and users a rule grants them (benchmarks = yes;
 * the most specific rules decide, all of them must grant it, and no rule
 * means no). Group membership is the client's primary group
 * and its supplementary groups as the kernel reports them for the
 * connection (SO_PEERGROUPS), so no user database is read while serving.
 */
#ifndef GPUQ_QUOTA_H
#define GPUQ_QUOTA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "protocol/protocol.h"

struct conn;
struct daemon;
struct job;

enum quota_scope { QUOTA_DEFAULT, QUOTA_GROUP, QUOTA_USER };

/*
 * What a uid's connections hold in gpuqd, each bounded by a limit of its
 * name (quota.c has the names and the built-in defaults: 512 connections,
 * 256 descriptors, 64 MiB of incomplete frames, 256 MiB of unread replies).
 */
enum quota_hold { HOLD_CONNECTIONS, HOLD_PARKED_FDS, HOLD_FRAME_BYTES, HOLD_REPLY_BYTES, HOLD_KINDS };
/* A limit set to `unlimited`. */
#define QUOTA_UNLIMITED UINT64_MAX

struct quota_rule {
	enum quota_scope scope;
	uint32_t id;       /* uid or gid; 0 for the default */
	char label[96];    /* "[group:ml]", as written */
	char where[300];   /* "/etc/gpuq/gpuqd.conf:12" */
	bool has_memory, has_jobs, has_devices, has_priority, has_weight, has_pinned, has_benchmarks;
	bool benchmarks;        /* may run benchmarks (bench_* ops), which hold whole devices */
	uint64_t device_memory; /* bytes on any one device */
	uint64_t host_pinned;   /* bytes of host regions (pinned host memory), all devices together */
	uint64_t queued_jobs;   /* queued or running at once */
	uint64_t devices;       /* bit i: device i may be used */
	int max_priority;       /* the most urgent enum gpuq_priority a job may ask for */
	double weight;          /* the share of each GPU's time against other users' (fair share) */
	bool has_hold[HOLD_KINDS];
	uint64_t hold[HOLD_KINDS]; /* the most a uid's connections may hold at once */
};

/* The rules and rights of one configuration; replaced whole on reload. */
struct quota_set {
	struct quota_rule *rules;
	int count, cap;
	bool has_admin;
	gid_t admin_gid;
	char admin_group[64];
};

/* What each uid holds now: kept across reloads. */
struct quota_usage {
	struct quota_user {
		uid_t uid;
		unsigned active;            /* jobs queued or running */
		uint64_t held[HOLD_KINDS]; /* what its connections hold */
	} *users;
	int count, cap;
};

void quota_set_free(struct quota_set *q);
void quota_usage_free(struct quota_usage *u);

/*
 * Whether section names a rule: "default", "user:NAME" or "group:NAME"
 * (NAME or a number). 1 with *scope and name set; 0 if it is not a rule
 * section at all.
 */
int quota_section(const char *section, enum quota_scope *scope, char *name, size_t namesize);

/*
 * The rule for scope and name, created on first use (where says where it
 * starts, for refusals). Resolves NAME with the user or group database;
 * NULL with msg if there is no such user or group, or no memory.
 */
struct quota_rule *quota_rule_get(struct quota_set *q, enum quota_scope scope, const char *name,
				  const char *where, char *msg, size_t msgsize);

/* Sets one limit of r from key = value; 0, or -1 with msg. */
int quota_rule_set(struct quota_rule *r, const char *key, const char *value, char *msg,
		   size_t msgsize);

/* Resolves the admin group (empty: none); 0, or -1 with msg. */
int quota_set_admin(struct quota_set *q, const char *group, char *msg, size_t msgsize);

/* "devices 0-1,3" style: the set bits of mask as a list, "none" when empty. */
const char *quota_devices_text(uint64_t mask, char *buf, size_t size);

/* Root, or a member of the admin group. */
bool quota_is_admin(struct daemon *d, const struct conn *c);
/* Whether the client may see and cancel a job of owner: its own, or an admin's right. */
bool quota_may_see(struct daemon *d, const struct conn *c, uid_t owner);

/*
 * Whether the client may run benchmark op (a bench_* op, named in the
 * refusal): 0, or -1 with permission_denied saying how to get the right.
 */
int quota_check_benchmarks(struct daemon *d, const struct conn *c, const char *op,
			   struct gpuq_error *err);

/*
 * Before a job is handed to its worker: the device quota for the job's
 * device and the queued-jobs quota. 0, or -1 with permission_denied.
 */
int quota_check_job(struct daemon *d, const struct conn *c, const struct job *job,
		    struct gpuq_error *err);
/*
 * The priority of a job that asks for none: normal, or the least urgent
 * max-priority of the caller's rules when that is less urgent (a user
 * capped at low gets low, not a refusal).
 */
int quota_default_priority(struct daemon *d, const struct conn *c);
/* A job asks for priority: 0, or -1 with permission_denied naming the max-priority rule. */
int quota_check_priority(struct daemon *d, const struct conn *c, int priority,
			 struct gpuq_error *err);
/* The client's fair-share weight (1 unless a rule says otherwise). */
double quota_weight(struct daemon *d, const struct conn *c);

/*
 * Before an allocation: the device quota, then the device-memory quota
 * (the client's buffers on device plus bytes). 0, or -1 with permission_denied.
 */
int quota_check_alloc(struct daemon *d, const struct conn *c, int device, uint64_t bytes,
		      struct gpuq_error *err);

/*
 * Before a region is pinned: the host-pinned quota (the client's regions
 * plus bytes). 0, or -1 with permission_denied.
 */
int quota_check_pinned(struct daemon *d, const struct conn *c, uint64_t bytes,
		       struct gpuq_error *err);

/*
 * What connection c holds in gpuqd, by enum quota_hold: 1 or 0 connections,
 * parked descriptors, bytes of its incomplete frame, bytes of replies it has
 * not read. Records the change from what c held (*held, the connection's own
 * account) in the uid's usage; growth is first checked against the limits,
 * and refused whole (nothing recorded) with permission_denied naming the
 * rule. Shrinking never fails.
 */
struct quota_conn_held {
	uint64_t n[HOLD_KINDS];
};
/* The name of a hold's limit ("parked-fds"), as rules and metrics write it. */
const char *quota_hold_name(enum quota_hold kind);
int quota_conn_hold(struct daemon *d, const struct conn *c, struct quota_conn_held *held,
		    const struct quota_conn_held *now, struct gpuq_error *err);

/*
 * The limits that govern uid as the checks above apply them (the quota op):
 * out's has_* flags say which limits bind (root: none; a hold limit set to
 * unlimited: none), each value the strictest of the governing rules
 * (devices: their intersection; weight: the largest); benchmarks is the
 * right quota_check_benchmarks grants. c is uid's own connection when the
 * caller is uid; otherwise one of uid's open connections supplies its
 * groups, and with none *groups_known is false and group rules are left
 * out (no user database is read while serving).
 */
void quota_effective(struct daemon *d, const struct conn *c, uid_t uid, struct quota_rule *out,
		     bool *groups_known);
/*
 * What uid holds by enum quota_hold, and its jobs queued or running; NULL
 * when nothing was ever counted for it.
 */
const struct quota_user *quota_usage_of(const struct quota_usage *u, uid_t uid);
/*
 * Every uid that a user rule names or that holds something (connections,
 * jobs, buffers, regions), ascending, into out (at most max); the count.
 */
int quota_uids(struct daemon *d, uid_t *out, int max);

/* A job of uid reached its worker / finished (keeps queued-jobs counts). */
void quota_job_started(struct quota_usage *u, uid_t uid);
void quota_job_ended(struct quota_usage *u, uid_t uid);
unsigned quota_active_jobs(const struct quota_usage *u, uid_t uid);

#endif
