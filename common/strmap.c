#include "strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static size_t
strmap_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s != '\0'; s++) {
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    }
    return (size_t)(h ^ (h >> 29));
}

void
strmap_init(struct strmap *m)
{
    m->slots = NULL;
    m->cap   = 0;
    m->len   = 0;
}

void
strmap_fini(struct strmap *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        free(m->slots[i].key);
    }
    free(m->slots);
    strmap_init(m);
}

static struct strmap_slot *
strmap_find(const struct strmap *m, const char *key, size_t hash)
{
    size_t mask = m->cap - 1;

    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        struct strmap_slot *s = &m->slots[i];
        if (s->key == NULL || (s->hash == hash && strcmp(s->key, key) == 0)) {
            return s;
        }
    }
}

void *
strmap_get(const struct strmap *m, const char *key)
{
    struct strmap_slot *s;

    if (m->cap == 0) {
        return NULL;
    }
    s = strmap_find(m, key, strmap_hash(key));
    return s->key != NULL ? s->value : NULL;
}

static bool
strmap_grow(struct strmap *m)
{
    size_t cap               = m->cap ? m->cap * 2 : 16;
    struct strmap_slot *old  = m->slots;
    size_t old_cap           = m->cap;
    struct strmap_slot *grow = calloc(cap, sizeof(*grow));

    if (grow == NULL) {
        return false;
    }
    m->slots = grow;
    m->cap   = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].key != NULL) {
            *strmap_find(m, old[i].key, old[i].hash) = old[i];
        }
    }
    free(old);
    return true;
}

bool
strmap_put(struct strmap *m, const char *key, void *value)
{
    size_t hash = strmap_hash(key);
    struct strmap_slot *s;

    /* Replacing a value never allocates, so it cannot fail: callers that reserve a key
     * first (the registry's operator intent) rely on it. */
    if (m->cap > 0) {
        s = strmap_find(m, key, hash);
        if (s->key != NULL) {
            s->value = value;
            return true;
        }
    }
    /* Keep the load under 3/4 so probes stay short. */
    if ((m->len + 1) * 4 > m->cap * 3 && !strmap_grow(m)) {
        return false;
    }
    s = strmap_find(m, key, hash);
    if (s->key == NULL) {
        if ((s->key = strdup(key)) == NULL) {
            return false;
        }
        s->hash = hash;
        m->len++;
    }
    s->value = value;
    return true;
}

void *
strmap_del(struct strmap *m, const char *key)
{
    size_t mask, i, j;
    struct strmap_slot *s;
    void *value;

    if (m->cap == 0) {
        return NULL;
    }
    mask = m->cap - 1;
    s    = strmap_find(m, key, strmap_hash(key));
    if (s->key == NULL) {
        return NULL;
    }
    value = s->value;
    free(s->key);
    s->key = NULL;
    m->len--;
    /* Backward shift: pull later members of the probe run into the hole. */
    i = (size_t)(s - m->slots);
    for (j = (i + 1) & mask; m->slots[j].key != NULL; j = (j + 1) & mask) {
        size_t home = m->slots[j].hash & mask;
        /* j may move to i when its home is not inside (i, j] cyclically. */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->slots[i]     = m->slots[j];
            m->slots[j].key = NULL;
            i               = j;
        }
    }
    return value;
}

bool
strmap_next(const struct strmap *m, size_t *i, const char **key, void **value)
{
    for (; *i < m->cap; (*i)++) {
        if (m->slots[*i].key != NULL) {
            *key   = m->slots[*i].key;
            *value = m->slots[*i].value;
            (*i)++;
            return true;
        }
    }
    return false;
}
