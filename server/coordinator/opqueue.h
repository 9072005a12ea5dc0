/*
 * The ordering of ops on the coordinator's devices: per device, the ops that use it in
 * submission order; an op may run once it heads the queue of every device it uses. The queues
 * hold the caller's op pointers without owning them. Not thread-safe: the op table calls it
 * under its lock. Knows nothing of RPC, workers or what an op is.
 */
#ifndef DEVCOORD_COORDINATOR_OPQUEUE_H
#define DEVCOORD_COORDINATOR_OPQUEUE_H

#include <stdbool.h>
#include <stddef.h>

#include "devcoord/types.h"
#include "strmap.h"

struct opqueue {
    struct strmap by_device; /* cluster device name ("node-a/cuda:0") -> its queue */
};

void opqueue_init(struct opqueue *q);
/* Frees the queues; the ops still in them are the caller's and are left alone. */
void opqueue_fini(struct opqueue *q);

/* Appends op to the queue of each of devices[0..n) (concrete, no device twice). False when
 * out of memory, and then op is in no queue. */
bool opqueue_push(struct opqueue *q, void *op, const dc_device_ref *devices, size_t n);

/* Takes op out of the queues of devices[0..n), wherever it stands: an op that ends heads its
 * queues, one that fails while queued may not. */
void opqueue_remove(struct opqueue *q, const void *op, const dc_device_ref *devices, size_t n);

/* Whether op heads the queue of every one of devices[0..n). */
bool opqueue_runnable(const struct opqueue *q, const void *op, const dc_device_ref *devices,
                      size_t n);

#endif
