/*
 * The coordinator's group table (design §13): for each group (its id, its concrete devices in
 * rank order), the joins parked in its rendezvous, its generation and which ranks of that
 * generation have not left. Pure: no RPC, no clock of its own (callers pass `now`), no lock
 * (the caller holds one). A parked join is the caller's opaque tag; the table hands tags back
 * when their rendezvous completes or their deadline passes, and the caller answers them.
 */
#ifndef DEVCOORD_COORDINATOR_GROUPS_H
#define DEVCOORD_COORDINATOR_GROUPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devcoord/types.h"
#include "validate.h"

struct group_table;

/* A rendezvous that completed: every rank's tag, in rank order (tags[r] joined as rank r).
 * Owned by the caller once returned; free with group_done_fini. */
struct group_done {
    char group_id[VALIDATE_GROUP_ID_SIZE];
    uint64_t generation;
    size_t n;
    void **tags;
};

void group_done_fini(struct group_done *d);

/* A parked join whose deadline passed: its tag and the message naming the devices that had
 * not joined. */
struct group_expired {
    void *tag;
    char message[DC_STATUS_MESSAGE_MAX];
};

/* What group_list reports of one group. Strings point into the table: valid until the table
 * changes. */
struct group_view {
    const char *group_id;
    const char *const *devices;  /* cluster names, rank order */
    const dc_device_ref *ranked; /* the same devices */
    size_t n;
    uint64_t generation;
    uint32_t joined;  /* ranks of the current generation that have not left */
    uint32_t joining; /* ranks parked in the next rendezvous */
};

/* max_parked bounds the joins parked in all groups together, max_groups the groups known.
 * A group everybody left stays known (listed, with its generation) until a new group needs
 * its room. NULL when out of memory. */
struct group_table *group_table_new(size_t max_parked, size_t max_groups);
void group_table_free(struct group_table *t);

/*
 * Parks rank `rank` of the group whose concrete devices in rank order are ranked[0..n) and
 * whose id is group_id, until every rank has joined or deadline_ms (on the caller's clock).
 * DC_OK: parked; when this join was the last, *completed is true and *done holds every tag
 * (this one included) and the new generation: the caller answers them all. Refusals:
 * ALREADY_EXISTS when the rank has a join parked already, RESOURCE_EXHAUSTED past
 * max_parked, FAILED_PRECONDITION when a group of that id has other devices (a hash
 * collision).
 */
dc_code group_join(struct group_table *t, const char group_id[VALIDATE_GROUP_ID_SIZE],
                   const dc_device_ref *ranked, size_t n, uint32_t rank, uint64_t deadline_ms,
                   void *tag, bool *completed, struct group_done *done, dc_status *st);

/* Removes the parked join of `tag` (its caller gave up); false when it is not parked. */
bool group_unpark(struct group_table *t, void *tag);

/* Takes every parked join whose deadline is <= now into out[0..cap) and returns how many;
 * call again while it returns cap. Each message names the devices that had not joined. */
size_t group_expire(struct group_table *t, uint64_t now, struct group_expired *out, size_t cap);

/* Takes every parked join (shutdown) into out[0..cap), as group_expire does. */
size_t group_take_all(struct group_table *t, void **out, size_t cap);
/* The same for the parked joins whose tag pred (NULL: every one) says true of. */
size_t group_take_if(struct group_table *t, bool (*pred)(void *tag, void *arg), void *arg,
                     void **out, size_t cap);

/* Rank `rank` of generation `generation` leaves group_id. NOT_FOUND for an unknown group,
 * FAILED_PRECONDITION for an old generation, INVALID_ARGUMENT for a rank out of range. */
dc_code group_leave(struct group_table *t, const char *group_id, uint64_t generation, uint32_t rank,
                    dc_status *st);

/* Groups, in the order they were first joined, through fn (which must not change the table);
 * only the one named group_id when it is not NULL or "". Returns how many there were (fn
 * NULL: only counts). */
size_t group_list(struct group_table *t, const char *group_id,
                  void (*fn)(void *arg, const struct group_view *v), void *arg);

/* Joins parked in all groups. */
size_t group_parked(const struct group_table *t);

#endif
