/*
 * A pool of threads for jobs that wait (a collective waiting for its peers): threads are
 * started on demand up to a cap, reused while busy, and leave after staying idle a while,
 * so a burst costs thread starts once and a quiet daemon keeps none.
 */
#ifndef DEVCOORD_COMMON_TPOOL_H
#define DEVCOORD_COMMON_TPOOL_H

#include <stdbool.h>

struct tpool;

/* Threads are named `name` (threadname.h). */
struct tpool *tpool_new(const char *name, unsigned max_threads, unsigned idle_ms);

/* Runs fn(arg) on a pool thread (queued when all max_threads are busy). false when out of
 * memory or stopping: fn will not run. */
bool tpool_submit(struct tpool *p, void (*fn)(void *), void *arg);

/* For tests of what a caller does when a job cannot be started: the n-th tpool_submit from
 * now (any pool's) fails as if out of memory; 0 injects nothing. */
void tpool_fail_after(unsigned n);

/* Waits for the jobs queued and running, then frees the pool. */
void tpool_free(struct tpool *p);

#endif
