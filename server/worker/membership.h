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

/* Starts the membership thread for cfg (which must outlive it). on_fenced runs (on that
 * thread) when another instance took over this worker's name; the daemon should stop. */
struct membership *membership_start(const struct config_worker *cfg, void (*on_fenced)(void *),
                                    void *arg);

/* Deregisters (best effort, bounded wait) and stops the thread. */
void membership_stop(struct membership *m);

/* Current epoch, 0 while not registered. */
uint64_t membership_epoch(const struct membership *m);

#endif
