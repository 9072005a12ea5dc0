/*
 * For implementers of an executor (host_executor.c, staged_executor.c), not for the data
 * plane, which includes executor.h only. executor.c keeps what every executor shares: the
 * name table of each device and the checks of every range. An implementation supplies the
 * storage: it embeds struct executor first in its own state and struct tensor first in its
 * own tensors, and fills a table of storage operations.
 */
#ifndef DEVCOORD_WORKER_EXECUTOR_IMPL_H
#define DEVCOORD_WORKER_EXECUTOR_IMPL_H

#include <pthread.h>

#include "executor.h"
#include "strmap.h"

/* Storage operations. executor.c has checked every range against the tensor before it calls
 * read, write or map, and calls unmap once per successful map. */
struct executor_ops {
    /* A tensor with room for `bytes` bytes (contents undefined, struct tensor zeroed); NULL
     * when out of memory. */
    struct tensor *(*tensor_alloc)(struct executor *ex, size_t bytes);
    /* Frees a tensor whose last reference went. */
    void (*tensor_free)(struct executor *ex, struct tensor *t);
    dc_code (*read)(struct executor *ex, const struct tensor *t, size_t offset, void *dst,
                    size_t len, dc_status *st);
    dc_code (*write)(struct executor *ex, struct tensor *t, size_t offset, const void *src,
                     size_t len, dc_status *st);
    /* Sets m->data (and m->impl as it likes); m's other fields are filled in. */
    dc_code (*map)(struct executor *ex, struct tensor_map *m, dc_status *st);
    dc_code (*unmap)(struct executor *ex, struct tensor_map *m, dc_status *st);
    /* Frees the implementation's state, after every tensor is gone. */
    void (*destroy)(struct executor *ex);
};

struct executor_device {
    dc_device device;
    struct strmap tensors; /* name -> struct tensor, one reference each */
    uint64_t memory;       /* the bound on `held` (0: none) */
    _Atomic uint64_t held; /* bytes of the tensors made for this device that exist */
};

struct executor {
    const struct executor_ops *ops;
    pthread_mutex_t mtx; /* the name tables */
    struct executor_device *devices;
    size_t n_devices;
    uint64_t max_bytes; /* the bound on `held` (0: none) */
    void (*reclaim)(void *arg);
    void *reclaim_arg;
    _Atomic uint64_t held; /* bytes of every tensor that exists */
};

/* Fills the shared part for devices; false when out of memory (nothing to undo). */
bool executor_init(struct executor *ex, const struct executor_ops *ops, const dc_device *devices,
                   size_t n);

struct executor *host_executor_new(const dc_device *devices, size_t n);
struct executor *staged_executor_new(const dc_device *devices, size_t n);

#endif
