/*
 * A worker's side of the two-phase commit of ops. An op that ran here (Execute) leaves its
 * results in staging tensors nobody sees: it is *prepared*, and held here until the
 * coordinator, having heard every worker say so, sends Commit, which publishes them all at
 * once (executor_store_all); Abort discards them, and so do a later op on any of the same
 * devices (the coordinator starts it only after deciding this one) and the hold running out.
 * Once published, the op's idempotency key is remembered (outcomes.h). What became of the
 * last ops (committed, or discarded and why) is kept so that Commit answers truthfully.
 *
 * Ownership: the staging holds one reference to each tensor of a held op and drops it when
 * the op is committed (the executor keeps its own) or discarded. Every function may be
 * called from any thread; a thread of its own expires holds.
 */
#ifndef DEVCOORD_WORKER_STAGING_H
#define DEVCOORD_WORKER_STAGING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "executor.h"
#include "outcomes.h"

#define STAGING_MAX_OPS 1024 /* ops held at once */
#define STAGING_RECENT  1024 /* ended ops remembered for Commit's answer */

struct staging;

/* One tensor an op publishes: `name` on `device`. */
struct staging_output {
    dc_device device;
    char name[TENSOR_NAME_MAX + 1];
    struct tensor *tensor;
};

/* A prepared op, as staging_hold takes it. */
struct staging_op {
    const char *op_id;        /* at most OUTCOME_ID_MAX bytes */
    const char *key;          /* its idempotency key, "" for none */
    uint64_t hash;            /* the request's fingerprint, remembered with the key */
    const dc_device *devices; /* every device of the op on this worker (for supersession) */
    size_t n_devices;
    struct staging_output *outputs; /* may be none: the worker still remembers the key */
    size_t n_outputs;
    uint64_t expires_ms; /* rpc_now_ms() past which it is discarded */
};

/* NULL when out of memory. ex must outlive the staging. */
struct staging *staging_new(struct executor *ex);
/* Discards every held op and frees everything. */
void staging_free(struct staging *s);

/* Holds op. On DC_OK the staging owns the outputs' tensor references (the caller's array
 * is copied); otherwise they stay the caller's: ABORTED when op was aborted (or had ended)
 * already, RESOURCE_EXHAUSTED when too many are held or out of memory. */
dc_code staging_hold(struct staging *s, const struct staging_op *op, dc_status *st);

/* Publishes the tensors of held op op_id, all at once, and remembers its key; *published
 * says how many. A committed op committed again answers DC_OK with 0. One discarded (or
 * whose publication failed): ABORTED saying why; one never held here: NOT_FOUND. */
dc_code staging_commit(struct staging *s, const char *op_id, uint32_t *published, dc_status *st);

/* Discards held op op_id (Abort); false when none is held, and then an op_id held later is
 * refused (an Abort can overtake the end of its op). */
bool staging_abort(struct staging *s, const char *op_id);

/* Discards the held ops that use any of devices[0..n): op `by` is starting on them, so the
 * coordinator has decided those ops, and one it did not commit must never publish later
 * over what `by` computes (a duplicate Execute of `by` itself keeps its staging). */
void staging_supersede(struct staging *s, const dc_device *devices, size_t n, const char *by);

/* Whether an op with idempotency key `key` committed here; if so its fingerprint and id. */
bool staging_committed_key(struct staging *s, const char *key, uint64_t *hash, char *op_id,
                           size_t cap);

/* Held ops, for metrics and tests. */
size_t staging_held(struct staging *s);

#endif
