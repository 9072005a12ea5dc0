/*
 * The worker's guard against ranks' shared memory shrinking under it (as libwayland-server's
 * wl_shm pools): a fixed registry of mapped regions, readable from a signal handler without
 * locks, and a SIGBUS handler that maps anonymous zero pages over a region whose object was
 * truncated and marks it broken, so the faulting access retries and succeeds. Callers check
 * shmguard_broken after every access and fail the call. A SIGBUS outside every region goes to
 * the previous handler (or the default one: the worker dies, as a real bug should).
 *
 * Slots are published and retired by one thread at a time (the groups lock).
 */
#ifndef DEVCOORD_WORKER_SHMGUARD_H
#define DEVCOORD_WORKER_SHMGUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Regions mapped at once in a worker, all groups and ranks together. */
#define SHMGUARD_MAX 256

/* Installs the SIGBUS handler once (later calls do nothing). 0, or -1 with errno. */
int shmguard_install(void);
/* A slot for [base, base + len), or -1 when all SHMGUARD_MAX are in use. */
int shmguard_publish(void *base, size_t len);
/* Frees slot (after the region is unmapped, or before); -1 does nothing. */
void shmguard_retire(int slot);
/* Whether a SIGBUS hit slot's region since it was published. */
bool shmguard_broken(int slot);
/* The slot whose region holds addr, or -1 (async-signal-safe, lock-free). */
int shmguard_find(uintptr_t addr);

#endif
