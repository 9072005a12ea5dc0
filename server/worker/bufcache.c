/* The data path's large buffers, kept for reuse (see bufcache.h). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "bufcache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

/* Under AddressSanitizer, what malloc's redzones would catch is caught here too: the bytes
 * past what a take asked for, and the whole of a buffer while it is kept, are poisoned (and
 * unpoisoned before they are unmapped, for whatever is mapped there next). */
#if defined(__SANITIZE_ADDRESS__)
#define BUFCACHE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BUFCACHE_ASAN 1
#endif
#endif
#ifdef BUFCACHE_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Every buffer starts with this header; the caller's bytes follow it, 64-byte aligned in a
 * mapping. */
struct bufhdr {
    size_t mapped;       /* bytes of the mapping; 0: from malloc */
    size_t cls;          /* its size class, an index into classes */
    struct bufhdr *next; /* the next kept buffer of its class */
    unsigned char pad[40];
};

_Static_assert(sizeof(struct bufhdr) == 64, "bufhdr keeps the caller's bytes 64-byte aligned");

/* Size classes: 8 per power of two from BUFCACHE_MIN_BYTES to BUFCACHE_MAX_BYTES (each a
 * multiple of BUFCACHE_MIN_BYTES / 8, a whole number of pages). */
#define MIN_LOG2  16
#define MAX_LOG2  46
#define PER_LOG2  8
#define N_CLASSES ((MAX_LOG2 - MIN_LOG2 + 1) * PER_LOG2 + 1)

_Static_assert(BUFCACHE_MIN_BYTES == (size_t)1 << MIN_LOG2, "MIN_LOG2");
_Static_assert(BUFCACHE_MAX_BYTES == (size_t)1 << MAX_LOG2, "MAX_LOG2");

struct bufcache {
    pthread_mutex_t mtx;
    size_t max_bytes;
    struct bufhdr *classes[N_CLASSES]; /* kept buffers, the last given back first */
    uint64_t used_ms[N_CLASSES];       /* when a buffer of the class was last taken or given */
    struct bufcache_stats stats;
};

static uint64_t
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The mapping length for n bytes (header included, BUFCACHE_MIN_BYTES <= n <=
 * BUFCACHE_MAX_BYTES + header) and its class. */
static size_t
class_of(size_t n, size_t *cls)
{
    unsigned lg  = 63u - (unsigned)__builtin_clzll((unsigned long long)n);
    size_t pow   = (size_t)1 << lg;
    size_t step  = pow / PER_LOG2;
    size_t bytes = (n + step - 1) / step * step;

    *cls = (size_t)(lg - MIN_LOG2) * PER_LOG2 + (bytes - pow) / step;
    return bytes;
}

struct bufcache *
bufcache_new(size_t max_bytes)
{
    struct bufcache *bc = calloc(1, sizeof(*bc));

    if (bc == NULL) {
        return NULL;
    }
    pthread_mutex_init(&bc->mtx, NULL);
    bc->max_bytes       = max_bytes;
    bc->stats.max_bytes = max_bytes;
    return bc;
}

void
bufcache_free(struct bufcache *bc)
{
    if (bc == NULL) {
        return;
    }
    for (size_t c = 0; c < N_CLASSES; c++) {
        while (bc->classes[c] != NULL) {
            struct bufhdr *h = bc->classes[c];
            bc->classes[c]   = h->next;
            UNPOISON(h, h->mapped);
            munmap(h, h->mapped);
        }
    }
    pthread_mutex_destroy(&bc->mtx);
    free(bc);
}

void *
bufcache_take(struct bufcache *bc, size_t bytes)
{
    size_t n = bytes + sizeof(struct bufhdr), len, cls;
    uint64_t now;
    struct bufhdr *h;
    void *m;

    if (bytes > BUFCACHE_MAX_BYTES) {
        return NULL;
    }
    if (n < BUFCACHE_MIN_BYTES || bc->max_bytes == 0) {
        if ((h = malloc(n)) == NULL) {
            return NULL;
        }
        h->mapped = 0;
        return h + 1;
    }
    len = class_of(n, &cls);
    now = now_ms();
    pthread_mutex_lock(&bc->mtx);
    bc->used_ms[cls] = now;
    if ((h = bc->classes[cls]) != NULL) {
        bc->classes[cls] = h->next;
        UNPOISON(h + 1, bytes);
        bc->stats.kept_bytes -= len;
        bc->stats.kept--;
        bc->stats.hits++;
    } else {
        bc->stats.misses++;
        bc->stats.mapped_bytes += len;
    }
    pthread_mutex_unlock(&bc->mtx);
    if (h != NULL) {
        return h + 1;
    }
    if ((m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) ==
        MAP_FAILED) {
        pthread_mutex_lock(&bc->mtx);
        bc->stats.mapped_bytes -= len;
        pthread_mutex_unlock(&bc->mtx);
        return NULL;
    }
    h         = m;
    h->mapped = len;
    h->cls    = cls;
    POISON((unsigned char *)(h + 1) + bytes, len - n);
    return h + 1;
}

void
bufcache_give(struct bufcache *bc, void *p)
{
    struct bufhdr *h = p != NULL ? (struct bufhdr *)p - 1 : NULL;
    uint64_t now;
    bool keep;

    if (h == NULL) {
        return;
    }
    if (h->mapped == 0) {
        free(h);
        return;
    }
    now = now_ms();
    pthread_mutex_lock(&bc->mtx);
    bc->used_ms[h->cls] = now;
    keep                = h->mapped <= bc->max_bytes - bc->stats.kept_bytes;
    if (keep) {
        POISON(h + 1, h->mapped - sizeof(*h));
        h->next             = bc->classes[h->cls];
        bc->classes[h->cls] = h;
        bc->stats.kept_bytes += h->mapped;
        bc->stats.kept++;
    } else {
        bc->stats.mapped_bytes -= h->mapped;
        bc->stats.unmapped++;
    }
    pthread_mutex_unlock(&bc->mtx);
    if (!keep) {
        UNPOISON(h, h->mapped);
        munmap(h, h->mapped);
    }
}

size_t
bufcache_trim(struct bufcache *bc, uint64_t idle_ms)
{
    struct bufhdr *old = NULL;
    uint64_t now       = now_ms();
    size_t n           = 0;

    pthread_mutex_lock(&bc->mtx);
    for (size_t c = 0; c < N_CLASSES; c++) {
        /* A class still in use keeps all it has: what a burst of overlapping calls needed
         * the next burst needs too, and mapping it afresh each time would only move RSS up
         * and down. */
        if (now - bc->used_ms[c] < idle_ms) {
            continue;
        }
        while (bc->classes[c] != NULL) {
            struct bufhdr *h = bc->classes[c];
            bc->classes[c]   = h->next;
            bc->stats.kept_bytes -= h->mapped;
            bc->stats.kept--;
            bc->stats.mapped_bytes -= h->mapped;
            bc->stats.unmapped++;
            h->next = old;
            old     = h;
            n++;
        }
    }
    pthread_mutex_unlock(&bc->mtx);
    while (old != NULL) {
        struct bufhdr *h = old;
        old              = h->next;
        UNPOISON(h, h->mapped);
        munmap(h, h->mapped);
    }
    return n;
}

void
bufcache_stats(struct bufcache *bc, struct bufcache_stats *out)
{
    pthread_mutex_lock(&bc->mtx);
    *out = bc->stats;
    pthread_mutex_unlock(&bc->mtx);
}
