/*
 * What a worker remembers of the ops it committed under an idempotency key: the key, the
 * fingerprint of the request it named and the op's id, for the last `cap` keys (the oldest
 * is forgotten first). This memory is what keeps a retry safe across a coordinator restart:
 * a new coordinator does not know the key, sends Execute with it, and a worker that finds it
 * here answers with the op that committed it instead of running the op again. Pure, no
 * locks: the caller (staging.c) serialises. The caller owns struct outcomes.
 */
#ifndef DEVCOORD_WORKER_OUTCOMES_H
#define DEVCOORD_WORKER_OUTCOMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devcoord/types.h"
#include "strmap.h"

#define OUTCOMES_MAX   1024 /* keys a worker remembers */
#define OUTCOME_ID_MAX 64   /* bytes of an op id */

struct outcome {
    char key[DC_IDEMPOTENCY_KEY_MAX + 1]; /* "" for a free slot */
    uint64_t hash;                        /* the request's fingerprint */
    char op_id[OUTCOME_ID_MAX + 1];
};

struct outcomes {
    struct outcome *ring; /* cap slots, filled in order; next is the oldest once full */
    size_t cap, len, next;
    struct strmap by_key; /* key -> its slot */
};

/* Room for cap keys (at least 1); false when out of memory (fini is then harmless). */
bool outcomes_init(struct outcomes *o, size_t cap);
void outcomes_fini(struct outcomes *o);

/* Remembers that op_id committed under key (non-empty, at most DC_IDEMPOTENCY_KEY_MAX bytes;
 * op_id is cut to OUTCOME_ID_MAX) with request fingerprint hash, forgetting the oldest key
 * when full. A key already remembered takes the new values in its slot. False when out of
 * memory, and then nothing changed. */
bool outcomes_add(struct outcomes *o, const char *key, uint64_t hash, const char *op_id);

/* The outcome remembered for key, or NULL. Valid until the next outcomes_add. */
const struct outcome *outcomes_find(const struct outcomes *o, const char *key);

#endif
