/*
 * A string-keyed hash map (open addressing, linear probing, backward-shift deletion). The
 * map copies keys; values are the caller's. Not thread-safe.
 */
#ifndef DEVCOORD_COMMON_STRMAP_H
#define DEVCOORD_COMMON_STRMAP_H

#include <stdbool.h>
#include <stddef.h>

struct strmap_slot {
    char *key; /* NULL: empty */
    size_t hash;
    void *value;
};

struct strmap {
    struct strmap_slot *slots;
    size_t cap; /* power of two, or 0 */
    size_t len;
};

void strmap_init(struct strmap *m);
/* Frees the keys and the table; values are left alone. */
void strmap_fini(struct strmap *m);

void *strmap_get(const struct strmap *m, const char *key);
/* Inserts or replaces; false when out of memory (nothing changed). Replacing the value of
 * a key already in never fails. */
bool strmap_put(struct strmap *m, const char *key, void *value);
/* Removes key; returns its value, or NULL. */
void *strmap_del(struct strmap *m, const char *key);

/* Iteration: for (size_t i = 0; strmap_next(m, &i, &k, &v);) ... */
bool strmap_next(const struct strmap *m, size_t *i, const char **key, void **value);

#endif
