#include "arena.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "failinject.h"

#define ARENA_ALIGN     16
#define ARENA_CHUNK_MIN 16384
#define ARENA_CHUNK_MAX (1u << 20)

struct arena_chunk {
    struct arena_chunk *next;
    size_t size;
    size_t used;
    _Alignas(ARENA_ALIGN) unsigned char data[];
};

struct arena {
    struct arena_chunk *chunks;
    size_t next_chunk; /* chunks double up to ARENA_CHUNK_MAX: a big message costs few mallocs */
    size_t budget;
    size_t spent;
    bool exhausted;
};

static atomic_uint fail_countdown;

void
arena_fail_after(unsigned n)
{
    atomic_store(&fail_countdown, n);
}

struct arena *
arena_new(size_t budget)
{
    struct arena *a;

    if (failinject_hit(&fail_countdown) || (a = calloc(1, sizeof(*a))) == NULL) {
        return NULL;
    }
    a->budget = budget;
    return a;
}

void
arena_free(struct arena *a)
{
    struct arena_chunk *c, *next;

    if (a == NULL) {
        return;
    }
    for (c = a->chunks; c != NULL; c = next) {
        next = c->next;
        free(c);
    }
    free(a);
}

void *
arena_alloc(struct arena *a, size_t size)
{
    struct arena_chunk *c = a->chunks;
    size_t want;

    if (size == 0) {
        size = 1;
    }
    if (size > SIZE_MAX - ARENA_ALIGN) {
        a->exhausted = true;
        return NULL;
    }
    want = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (want > a->budget - a->spent || failinject_hit(&fail_countdown)) {
        a->exhausted = true;
        return NULL;
    }
    if (c == NULL || c->size - c->used < want) {
        size_t csize = a->next_chunk > ARENA_CHUNK_MIN ? a->next_chunk : ARENA_CHUNK_MIN;
        if (csize < ARENA_CHUNK_MAX) {
            a->next_chunk = csize * 2;
        }
        if (csize > a->budget - a->spent) {
            csize = a->budget - a->spent;
        }
        if (csize < want) {
            csize = want;
        }
        if ((c = malloc(sizeof(*c) + csize)) == NULL) {
            a->exhausted = true;
            return NULL;
        }
        c->size = csize;
        c->used = 0;
        /* Keep the chunk with room in front; a big one-off goes behind it. */
        if (a->chunks != NULL && want == csize && want > ARENA_CHUNK_MIN) {
            c->next         = a->chunks->next;
            a->chunks->next = c;
        } else {
            c->next   = a->chunks;
            a->chunks = c;
        }
    }
    a->spent += want;
    c->used += want;
    return c->data + c->used - want;
}

char *
arena_strdup(struct arena *a, const char *s)
{
    size_t len = strlen(s);
    char *p    = arena_alloc(a, len + 1);

    if (p != NULL) {
        memcpy(p, s, len + 1);
    }
    return p;
}

bool
arena_exhausted(const struct arena *a)
{
    return a->exhausted;
}

static void *
arena_pb_alloc(void *data, size_t size)
{
    return arena_alloc(data, size);
}

static void
arena_pb_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr;
}

ProtobufCAllocator
arena_allocator(struct arena *a)
{
    ProtobufCAllocator alloc = { .alloc          = arena_pb_alloc,
                                 .free           = arena_pb_free,
                                 .allocator_data = a };
    return alloc;
}
