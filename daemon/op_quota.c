/*
 * The quota request: the limits that govern a uid, as quota.c applies
 * them, beside what the uid holds now. Main thread only.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/daemon.h"
#include "daemon/reply.h"

struct quota_args {
	uint64_t uid;
	bool has_uid;
};

/* A uid other than the caller's is for root and the admin group, as their jobs are. */
static int quota_args_uid(struct request *req, void *args, struct gpuq_error *err)
{
	const struct quota_args *a = args;
	if (!a->has_uid)
		return 0;
	if (a->uid > UINT32_MAX - 1)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'uid': %llu is not a uid",
				 (unsigned long long)a->uid);
	if ((uid_t)a->uid != req->conn->uid && !quota_is_admin(req->d, req->conn))
		return gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
				 "uid %d may see its own quota, not uid %llu's (rule: a uid's quota is its "
				 "own, root's and the admin group's)",
				 (int)req->conn->uid, (unsigned long long)a->uid);
	return 0;
}

static const struct args_field quota_fields[] = {
	{ "uid", ARGS_U64, 0, ARGS_AT(struct quota_args, uid), ARGS_GIVEN(struct quota_args, has_uid),
	  .then = quota_args_uid },
};
const struct args_spec op_quota_args = ARGS_SPEC(struct quota_args, quota_fields, NULL);

/* value under the rule name's key ('_' for '-'), or nil (unlimited) unless limited. */
static void put_limit(struct mp_map *m, const char *name, bool limited, uint64_t value)
{
	char key[32];
	snprintf(key, sizeof key, "%s", name);
	for (char *p = key; *p; p++)
		if (*p == '-')
			*p = '_';
	if (limited)
		mp_put_u64(m, key, value);
	else
		mp_put_nil(m, key);
}

static void render_limits(const struct quota_rule *r, struct mp_map *out)
{
	put_limit(out, "device-memory", r->has_memory, r->device_memory);
	put_limit(out, "host-pinned", r->has_pinned, r->host_pinned);
	put_limit(out, "queued-jobs", r->has_jobs, r->queued_jobs);
	if (r->has_devices) {
		struct mp_array list;
		mp_array_init(&list);
		for (int i = 0; i < GPUQ_MAX_DEVICES; i++)
			if (r->devices >> i & 1)
				mp_array_u64(&list, (uint64_t)i);
		mp_put_array(out, "devices", &list);
	} else {
		mp_put_nil(out, "devices");
	}
	if (r->has_priority)
		mp_put_str(out, "max_priority", gpuq_priority_name((enum gpuq_priority)r->max_priority));
	else
		mp_put_nil(out, "max_priority");
	mp_put_f64(out, "weight", r->weight);
	mp_put_bool(out, "benchmarks", r->benchmarks);
	for (int k = 0; k < HOLD_KINDS; k++)
		put_limit(out, quota_hold_name((enum quota_hold)k), r->has_hold[k], r->hold[k]);
}

static void render_used(struct daemon *d, uid_t uid, struct mp_map *out)
{
	struct mp_array per_device;
	mp_array_init(&per_device);
	for (int i = 0; i < d->pool.count; i++) {
		uint64_t sum = 0;
		for (const struct buffer *b = d->buffers.head; b; b = b->next)
			if (b->owner == uid && b->device == i)
				sum += b->bytes;
		mp_array_u64(&per_device, sum);
	}
	mp_put_array(out, "device_memory", &per_device);
	mp_put_u64(out, "host_pinned", region_bytes_of(&d->regions, uid));
	const struct quota_user *e = quota_usage_of(&d->svc.usage, uid);
	mp_put_u64(out, "queued_jobs", e ? e->active : 0);
	for (int k = 0; k < HOLD_KINDS; k++) /* usage is never nil */
		put_limit(out, quota_hold_name((enum quota_hold)k), true, e ? e->held[k] : 0);
}

static void render_user(struct request *req, uid_t uid, struct mp_array *list)
{
	struct mp_map record, limits, used;
	struct quota_rule eff;
	bool groups_known;
	quota_effective(req->d, uid == req->conn->uid ? req->conn : NULL, uid, &eff, &groups_known);
	mp_map_init(&record);
	mp_map_init(&limits);
	mp_map_init(&used);
	mp_put_u64(&record, "uid", uid);
	mp_put_bool(&record, "groups_known", groups_known);
	render_limits(&eff, &limits);
	mp_put_map(&record, "limits", &limits);
	render_used(req->d, uid, &used);
	mp_put_map(&record, "used", &used);
	mp_array_map(list, &record);
}

#define QUOTA_MAX_UIDS 4096

void op_quota(struct request *req, void *args)
{
	const struct quota_args *a = args;
	struct mp_map body;
	struct mp_array list;
	mp_map_init(&body);
	mp_array_init(&list);
	if (a->has_uid) {
		render_user(req, (uid_t)a->uid, &list);
	} else if (quota_is_admin(req->d, req->conn)) {
		static uid_t uids[QUOTA_MAX_UIDS];
		int n = quota_uids(req->d, uids, QUOTA_MAX_UIDS);
		for (int i = 0; i < n; i++)
			render_user(req, uids[i], &list);
	} else {
		render_user(req, req->conn->uid, &list);
	}
	mp_put_array(&body, "users", &list);
	reply_ok(req, &body);
}
