/*
 * The executor: where a worker keeps the tensors of its devices. Tensors are named per
 * device and reference-counted, so a collective can hold one while a client replaces it. The
 * built-in `host` executor keeps every tensor in host memory, whatever the backend's name;
 * an executor for real device memory (CUDA) implements the same table and sets
 * host_memory = false, which makes the collective engine stage through host buffers.
 */
#ifndef DEVCOORD_WORKER_EXECUTOR_H
#define DEVCOORD_WORKER_EXECUTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devcoord/types.h"
#include "status.h"

#define TENSOR_NAME_MAX 255

struct tensor {
    atomic_int refs;
    dc_dtype dtype;
    size_t ndim;
    uint64_t shape[DC_TENSOR_MAX_DIMS];
    size_t elements;
    size_t size_bytes;
    void *data; /* host memory when the executor's host_memory is true */
};

struct executor;

struct executor_ops {
    /* A new tensor, not yet visible under any name; its contents are undefined. */
    dc_code (*create)(struct executor *ex, dc_dtype dtype, const uint64_t *shape, size_t ndim,
                      struct tensor **out, dc_status *st);
    /* Publishes t as `name` on dev, replacing any older tensor; takes a reference. */
    dc_code (*store)(struct executor *ex, const dc_device *dev, const char *name, struct tensor *t,
                     dc_status *st);
    /* The tensor `name` on dev, with a reference the caller drops with tensor_release. */
    dc_code (*lookup)(struct executor *ex, const dc_device *dev, const char *name,
                      struct tensor **out, dc_status *st);
    dc_code (*remove)(struct executor *ex, const dc_device *dev, const char *name, dc_status *st);
    /* Calls fn for every tensor on dev (under the executor's lock: fn must not call back). */
    dc_code (*list)(struct executor *ex, const dc_device *dev,
                    void (*fn)(void *arg, const char *name, const struct tensor *t), void *arg,
                    dc_status *st);
    /* Whether dev is one of this executor's devices. */
    bool (*has_device)(struct executor *ex, const dc_device *dev);
    void (*destroy)(struct executor *ex);
};

struct executor {
    const struct executor_ops *ops;
    const char *name;
    bool host_memory;
};

/* The host executor for the devices of a worker's config; NULL when out of memory. */
struct executor *host_executor_new(const dc_device *devices, size_t n);

/* Element count of shape and its size in bytes; false on overflow, too many dimensions or
 * an unknown dtype. */
bool tensor_size(dc_dtype dtype, const uint64_t *shape, size_t ndim, size_t *elements,
                 size_t *bytes);

void tensor_retain(struct tensor *t);
void tensor_release(struct tensor *t);

#endif
