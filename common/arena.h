/*
 * A budgeted bump allocator for decoding untrusted bytes: protobuf-c's unpack allocates
 * through it, so what one message may cost is bounded, and everything it allocated goes at
 * once with arena_free. Not thread-safe: one arena per decoded message.
 */
#ifndef DEVCOORD_COMMON_ARENA_H
#define DEVCOORD_COMMON_ARENA_H

#include <stdbool.h>
#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

struct arena;

/* The budget of an arena for a message we build ourselves (an answer, a plan): trusted
 * content, so the budget is only a backstop against a bug, not a limit a peer can reach. */
#define ARENA_OWN_BUDGET ((size_t)1 << 30)

/* An arena that hands out at most `budget` bytes in all; NULL when out of memory. */
struct arena *arena_new(size_t budget);
void arena_free(struct arena *a);

/* Memory from the arena, 16-byte aligned; NULL once the budget is spent. */
void *arena_alloc(struct arena *a, size_t size);

/* A copy of the string s in the arena; NULL once the budget is spent. */
char *arena_strdup(struct arena *a, const char *s);

/* Whether an allocation was refused (the decode failed for want of budget, not of form). */
bool arena_exhausted(const struct arena *a);

/* A protobuf-c allocator drawing on a (free is a no-op: arena_free releases everything). */
ProtobufCAllocator arena_allocator(struct arena *a);

/* Tests: make the n-th allocation from now on fail (0 = never), across all arenas. */
void arena_fail_after(unsigned n);

#endif
