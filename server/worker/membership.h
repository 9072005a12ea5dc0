/*
 * A worker's membership in the cluster: registers its devices with the coordinator,
 * heartbeats at the interval the coordinator hands out, registers again when told it is
 * unknown (a coordinator restart), keeps dialing with backoff while the coordinator is down,
 * and deregisters on stop. Runs on its own thread.
 */
#ifndef DEVCOORD_WORKER_MEMBERSHIP_H
#define DEVCOORD_WORKER_MEMBERSHIP_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"

struct membership;

/* Membership for cfg (which must outlive it), not yet running. on_fenced runs (on the
 * membership thread) when another instance took over this worker's name; the daemon should
 * stop. */
struct membership *membership_new(const struct config_worker *cfg, const char *token,
                                  void (*on_fenced)(void *), void *arg);

/* Starts registering and heartbeating (once the worker serves its address). */
bool membership_run(struct membership *m);

/* Deregisters (best effort, bounded wait), stops the thread and frees m. */
void membership_stop(struct membership *m);

/* Current epoch, 0 while not registered. */
uint64_t membership_epoch(const struct membership *m);

#endif
