/* A bounded cache of the data path's large buffers (issue 17: flat worker RSS). A group call
 * takes a buffer or three of its part's size (this worker's part, the ring's receive buffer,
 * the result) and gives them back when it completes, on whichever thread drops the last
 * reference. From malloc, with the worker's raised mmap and trim thresholds, they spread over
 * glibc's per-thread arenas, and every arena keeps its own peak for good: RSS climbs in
 * buffer-sized steps for thousands of calls. Here, buffers of BUFCACHE_MIN_BYTES or more are
 * mapped in size classes (at most 1/8 larger than asked) and, once given back, kept for the
 * next take of their class, up to max_bytes in all; bufcache_trim unmaps those of classes
 * left idle. Smaller buffers, and every buffer when max_bytes is 0, come from malloc.
 *
 * Any thread may take, give back or trim (one mutex, never held across mmap or munmap). */
#ifndef DEVCOORD_WORKER_BUFCACHE_H
#define DEVCOORD_WORKER_BUFCACHE_H

#include <stddef.h>
#include <stdint.h>

#define BUFCACHE_MIN_BYTES ((size_t)64 * 1024)
/* The largest buffer a take may ask for (64 TiB): past it, a take fails as out of memory. */
#define BUFCACHE_MAX_BYTES ((size_t)1 << 46)

struct bufcache;

struct bufcache_stats {
    uint64_t hits;     /* takes served by a kept buffer */
    uint64_t misses;   /* takes of a large buffer that mapped a new one */
    uint64_t unmapped; /* buffers unmapped: given back to a full cache, or trimmed */
    size_t kept_bytes; /* given back and kept (at most max_bytes) */
    size_t kept;
    size_t mapped_bytes; /* large buffers mapped: in use and kept */
    size_t max_bytes;
};

/* A cache keeping at most max_bytes of buffers given back (0: no cache, malloc for all).
 * NULL when out of memory. Free with bufcache_free once every buffer is given back. */
struct bufcache *bufcache_new(size_t max_bytes);
void bufcache_free(struct bufcache *bc);

/* A buffer of at least `bytes` bytes, aligned for any type, or NULL (out of memory). Its
 * bytes are whatever its last user left. Give it back with bufcache_give. */
void *bufcache_take(struct bufcache *bc, size_t bytes);

/* Gives back p (from bufcache_take on bc; NULL does nothing): kept for reuse while the
 * cache has room, else unmapped (or freed). */
void bufcache_give(struct bufcache *bc, void *p);

/* Unmaps the kept buffers of every size class no buffer of which was taken or given back in
 * the last idle_ms. Returns how many. */
size_t bufcache_trim(struct bufcache *bc, uint64_t idle_ms);

void bufcache_stats(struct bufcache *bc, struct bufcache_stats *out);

#endif
