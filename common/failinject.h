/*
 * Failure injection for tests: a countdown that a test sets to n (arena_fail_after,
 * tpool_fail_after) makes the n-th check from then on say "fail", once; 0 injects nothing.
 */
#ifndef DEVCOORD_COMMON_FAILINJECT_H
#define DEVCOORD_COMMON_FAILINJECT_H

#include <stdatomic.h>
#include <stdbool.h>

/* Whether this check is the one the countdown names (it counts down, any thread). */
static inline bool
failinject_hit(atomic_uint *countdown)
{
    unsigned n = atomic_load(countdown);

    while (n > 0) {
        if (atomic_compare_exchange_weak(countdown, &n, n - 1)) {
            return n == 1;
        }
    }
    return false;
}

#endif
