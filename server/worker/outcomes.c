/* The committed ops a worker remembers by idempotency key (outcomes.h): a ring of slots in
 * commit order, so the bound is a plain count and the oldest goes first, with a map from key
 * to slot so a lookup on every keyed Execute costs no scan. */
#include "outcomes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool
outcomes_init(struct outcomes *o, size_t cap)
{
    memset(o, 0, sizeof(*o));
    strmap_init(&o->by_key);
    if (cap == 0) {
        cap = 1;
    }
    if ((o->ring = calloc(cap, sizeof(*o->ring))) == NULL) {
        return false;
    }
    o->cap = cap;
    return true;
}

void
outcomes_fini(struct outcomes *o)
{
    strmap_fini(&o->by_key);
    free(o->ring);
    memset(o, 0, sizeof(*o));
}

bool
outcomes_add(struct outcomes *o, const char *key, uint64_t hash, const char *op_id)
{
    struct outcome *slot = strmap_get(&o->by_key, key);

    if (slot == NULL) {
        /* In the map first, then the slot's old key out: a failure changes nothing. */
        slot = &o->ring[o->next];
        if (!strmap_put(&o->by_key, key, slot)) {
            return false;
        }
        if (slot->key[0] != '\0') {
            strmap_del(&o->by_key, slot->key);
        }
        o->next = (o->next + 1) % o->cap;
        if (o->len < o->cap) {
            o->len++;
        }
    }
    snprintf(slot->key, sizeof(slot->key), "%s", key);
    snprintf(slot->op_id, sizeof(slot->op_id), "%s", op_id);
    slot->hash = hash;
    return true;
}

const struct outcome *
outcomes_find(const struct outcomes *o, const char *key)
{
    return key[0] != '\0' ? strmap_get(&o->by_key, key) : NULL;
}
