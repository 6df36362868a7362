/* Unit tests for what not_found says: buffer.c's buffer_resolve, region.c's region_resolve. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"

#include "daemon/buffer.h"
#include "daemon/region.h"

static void add(struct buffer_table *t, const char *name, int device, uid_t owner)
{
	CHECK(buffer_add(t, name, device, owner, GPUQ_DTYPE_BYTES, 64, 64));
}

static void empty(struct buffer_table *t)
{
	while (t->head)
		buffer_remove(t, t->head);
}

/* The not_found message of resolving name (owner 1000) on device. */
static const char *missing(struct buffer_table *t, const char *name, int device)
{
	static struct gpuq_error err;
	CHECKF(!buffer_resolve(t, 1000, 1000, name, device, &err), "'%s' was found", name);
	CHECK_EQ(err.code, GPUQ_E_NOT_FOUND);
	return err.message;
}

TEST(buffer_resolve_lists_the_owners_buffers)
{
	struct buffer_table t = { 0 };
	CHECK_STR(missing(&t, "fz", -1), "buffer 'fz' not found (your buffers: none)");
	add(&t, "a", 0, 1000);
	add(&t, "b", 1, 1000);
	add(&t, "theirs", 0, 1001);
	CHECK_STR(missing(&t, "fz", -1), "buffer 'fz' not found (your buffers: b@1, a@0)");
	CHECK_STR(missing(&t, "b", 0), "buffer 'b' not found on device 0 (your buffers there: a@0)");
	empty(&t);
}

/* Root naming uid 1000's buffers hears of uid 1000's, not of "your" buffers. */
TEST(buffer_resolve_names_another_owner)
{
	struct buffer_table t = { 0 };
	struct gpuq_error err;
	add(&t, "a", 0, 1000);
	add(&t, "root's", 0, 0);
	CHECK(!buffer_resolve(&t, 1000, 0, "fz", -1, &err));
	CHECK_STR(err.message, "buffer 'fz' not found (uid 1000's buffers: a@0)");
	CHECK(!buffer_resolve(&t, 1000, 0, "fz", 1, &err));
	CHECK_STR(err.message, "buffer 'fz' not found on device 1 (uid 1000's buffers there: none)");
	empty(&t);
}

/*
 * Root not finding a name among its buffers (or uid N's) hears that another
 * uid has one of that name, and how to name it; a user never hears of
 * another's buffers.
 */
TEST(buffer_resolve_tells_root_of_another_owners_buffer)
{
	struct buffer_table t = { 0 };
	struct gpuq_error err;
	add(&t, "leftover", 0, 65534);
	CHECK(!buffer_resolve(&t, 0, 0, "leftover", 0, &err));
	CHECK_STR(err.message, "buffer 'leftover' not found on device 0 (your buffers there: none); "
			       "uid 65534 has 'leftover@0': name it with the request's `owner` 65534 "
			       "(gpuq --owner 65534)");
	CHECK(!buffer_resolve(&t, 0, 0, "leftover", -1, &err));
	CHECK_STR(err.message, "buffer 'leftover' not found (your buffers: none); uid 65534 has "
			       "'leftover@0': name it with the request's `owner` 65534 (gpuq --owner 65534)");
	CHECK(!buffer_resolve(&t, 0, 0, "leftover", 1, &err));
	CHECK_STR(err.message, "buffer 'leftover' not found on device 1 (your buffers there: none)");
	CHECK_STR(missing(&t, "leftover", 0),
		  "buffer 'leftover' not found on device 0 (your buffers there: none)");
	empty(&t);
}

/*
 * A list too long for the message ends "... and N more", after a whole
 * name: it had stopped mid-entry, at a dangling ", ", without saying how
 * many it left out.
 */
TEST(buffer_resolve_cuts_a_long_list_cleanly)
{
	struct buffer_table t = { 0 };
	char name[BUFFER_NAME_MAX + 1];
	for (int i = 0; i < 40; i++) {
		snprintf(name, sizeof name, "buffer-number-%02d", i);
		add(&t, name, 0, 1000);
	}
	for (int device = -1; device <= 0; device++) {
		const char *m = missing(&t, "fz", device);
		const char *list = strstr(m, ": ");
		CHECKF(list, "\"%s\"", m);
		unsigned listed = 1, more = 0;
		for (const char *p = list + 2; (p = strstr(p, ", ")); p += 2)
			listed++;
		const char *tail = strstr(m, "@0 and ");
		CHECKF(tail && sscanf(tail, "@0 and %u more)", &more) == 1, "\"%s\"", m);
		CHECKF(strstr(tail, " more)") && strcmp(strstr(tail, " more)"), " more)") == 0,
		       "\"%s\" does not end with the count", m);
		CHECKF(listed + more == 40, "\"%s\": %u listed and %u more", m, listed, more);
		CHECKF(!strstr(m, ", )") && !strstr(m, ",  "), "\"%s\"", m);
		CHECKF(strstr(m, "buffer-number-39@0, buffer-number-38@0"), "\"%s\"", m);
	}
	empty(&t);
}

/* A list that fits whole is not cut, though it leaves no room for "and N more". */
TEST(buffer_resolve_lists_whole_what_fits)
{
	struct buffer_table t = { 0 };
	char name[BUFFER_NAME_MAX + 1];
	/* 12 entries of 18 characters and 11 separators: 238 of the list's 255 */
	for (int i = 0; i < 12; i++) {
		snprintf(name, sizeof name, "buffer-number-%02d", i);
		add(&t, name, 0, 1000);
	}
	const char *m = missing(&t, "fz", -1);
	CHECKF(!strstr(m, "more"), "\"%s\"", m);
	CHECKF(strstr(m, ": buffer-number-11@0, ") && strstr(m, ", buffer-number-00@0)"), "\"%s\"", m);
	empty(&t);
}

/* A name on more devices than the message holds whole ends as a long list does. */
TEST(buffer_resolve_cuts_the_devices_of_an_ambiguous_name)
{
	struct buffer_table t = { 0 };
	char name[BUFFER_NAME_MAX + 1];
	memset(name, 'n', BUFFER_NAME_MAX);
	name[BUFFER_NAME_MAX] = '\0';
	for (int device = 0; device < 8; device++)
		add(&t, name, device, 1000);
	struct gpuq_error err;
	CHECK(!buffer_resolve(&t, 1000, 1000, name, -1, &err));
	CHECK_EQ(err.code, GPUQ_E_BAD_REQUEST);
	CHECKF(strstr(err.message, "@7, ") && strstr(err.message, "@5 and 5 more); name one as NAME@GPU"),
	       "\"%s\"", err.message);
	empty(&t);
}

static void add_region(struct region_table *t, const char *name, uid_t owner)
{
	CHECK(region_add(t, name, 0, owner, 4096, -1));
}

/* Regions' not_found: the list cut as buffers' is, and whose regions it lists. */
TEST(region_resolve_lists_whole_names_and_whose)
{
	struct region_table t = { 0 };
	struct gpuq_error err;
	CHECK(!region_resolve(&t, 1000, 1000, "fz", &err));
	CHECK_STR(err.message, "region 'fz' not found (your regions: none)");
	add_region(&t, "r0", 1000);
	add_region(&t, "r1", 1000);
	CHECK(!region_resolve(&t, 1000, 0, "fz", &err));
	CHECK_STR(err.message, "region 'fz' not found (uid 1000's regions: r1, r0)");
	char name[BUFFER_NAME_MAX + 1];
	for (int i = 2; i < 40; i++) {
		snprintf(name, sizeof name, "region-number-%02d", i);
		add_region(&t, name, 1000);
	}
	CHECK(!region_resolve(&t, 1000, 1000, "fz", &err));
	CHECKF(strstr(err.message, "(your regions: region-number-39, ") &&
		       strstr(err.message, " more)") && !strstr(err.message, ", )"),
	       "\"%s\"", err.message);
	unsigned listed = 1, more = 0;
	for (const char *p = strstr(err.message, ": "); (p = strstr(p + 2, ", "));)
		listed++;
	CHECKF(sscanf(strstr(err.message, " and "), " and %u more)", &more) == 1 && listed + more == 40,
	       "\"%s\"", err.message);
	while (t.head)
		region_remove(&t, t.head);
}
