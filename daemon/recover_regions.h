/*
 * Taking over the host regions and the leases the previous gpuqd image
 * held (docs/ARCHITECTURE.md, Durable state, "The re-exec"), beside
 * recover.c's buffers. A region's memfd comes through the execve (its
 * descriptor number is in the record); its device's worker maps and pins
 * it again before it serves, as region_create's work does. A lease goes
 * back into its device's ledger before any job of the new image is
 * queued, and back to its holder's connection once the connections serve
 * again; one whose holder did not come along ends, as at a disconnect.
 *
 * Main thread only, at start-up, in this order: recover_regions_plan
 * (from recover_begin, before the workers start), recover_regions and
 * recover_leases (from recover_buffers, once the workers have opened and
 * the buffers are listed), recover_holders (after recover_conns).
 */
#ifndef GPUQ_RECOVER_REGIONS_H
#define GPUQ_RECOVER_REGIONS_H

struct daemon;
struct recover;

/* Adds the record's regions whose descriptors check out to r->adopt, for the workers. */
void recover_regions_plan(struct recover *r);
/* Lists the regions the workers pinned again; closes the descriptors of the others (logged). */
void recover_regions(struct daemon *d);
/* Holds again, in their devices' ledgers, the leases the record lists on buffers taken over. */
void recover_leases(struct daemon *d);
/* Ties ephemeral regions and leases to the connections that came through; the rest end. */
void recover_holders(struct daemon *d);

#endif
