/*
 * The executor: where a worker keeps the tensors of its devices, and the only way the data
 * plane (tensors.c, collective.c) reaches their bytes. Tensors are named per device and
 * reference-counted, so a collective can hold one while a client replaces it. A tensor's
 * bytes belong to the executor that made it: the data plane sees its dtype and shape, never
 * its storage, and copies ranges in and out (tensor_write, tensor_read) or maps a range
 * (tensor_map) to get host-addressable bytes until it unmaps them.
 *
 * Two executors are built in (executor_new). `host` keeps every tensor in host memory,
 * whatever the backend's name; its map is a pointer into the tensor, so mapping costs no
 * copy and what is written through a map is in the tensor at once. `staged`, a test
 * executor, keeps each tensor's bytes in an allocation of their own that only the calls
 * below reach, as device memory is: a map is a staging buffer filled from the tensor (when
 * mapped for reading) and copied back by unmap (when mapped for writing), so data-plane code
 * that bypasses this interface, or counts on host aliasing, fails its tests there. An
 * executor for real device memory (CUDA) is a third implementation (executor_impl.h).
 *
 * Every function may be called from any thread. Copies and maps of disjoint ranges of one
 * tensor may run at the same time; what overlapping ones read is unspecified.
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

struct executor;

/* What the data plane knows of a tensor; the executor keeps its bytes. */
struct tensor {
    struct executor *owner; /* frees it when the last reference goes */
    atomic_int refs;
    dc_dtype dtype;
    size_t ndim;
    uint64_t shape[DC_TENSOR_MAX_DIMS];
    size_t elements;
    size_t size_bytes;
    uint64_t version; /* unique to this tensor (executor_create): GetTensor's TensorInfo.version */
    size_t charged;   /* the executor device its bytes count against (SIZE_MAX: none) */
};

enum tensor_access {
    TENSOR_READ       = 1, /* the map starts with the tensor's bytes */
    TENSOR_WRITE      = 2, /* unmap stores the map's bytes in the tensor */
    TENSOR_READ_WRITE = TENSOR_READ | TENSOR_WRITE,
};

/* A mapped range: `data` holds bytes [offset, offset + len) of `tensor` until tensor_unmap,
 * aligned for the tensor's dtype. A map without TENSOR_READ starts undefined: the caller
 * writes every byte of it. The map holds no reference: the caller holds the tensor. */
struct tensor_map {
    struct tensor *tensor;
    size_t offset, len;
    enum tensor_access access;
    void *data;
    void *impl; /* the executor's */
};

/* The executor `kind` ("host" or "staged") for a worker's devices; NULL for another kind or
 * when out of memory. Free it with executor_free, after every tensor reference is dropped. */
struct executor *executor_new(const char *kind, const dc_device *devices, size_t n);
void executor_free(struct executor *ex);

/* Bounds on the bytes of the tensors that exist (stored, staged for an op's Commit, being
 * uploaded, held by a running op): max_bytes for all of them (0: none), and device_memory[i]
 * (0: none) for those made for device i of the list executor_new was given. A tensor counts
 * from executor_create until its last reference goes. Call before any tensor is made. */
void executor_set_limits(struct executor *ex, uint64_t max_bytes, const uint64_t *device_memory);
/* fn(arg) is called when a tensor does not fit its bounds, before it is refused: it drops
 * what it can (uploads abandoned by their clients) and the tensor is tried once more. It may
 * run on any thread that makes a tensor, perhaps inside one of fn's own callers: it must not
 * wait for a lock such a caller may hold. NULL: none. Set it before any tensor is made, clear
 * it once none can be. */
void executor_set_reclaim(struct executor *ex, void (*fn)(void *arg), void *arg);
/* Bytes of the tensors that exist, on all devices; *limit (unless NULL) their bound. */
uint64_t executor_bytes_held(struct executor *ex, uint64_t *limit);

/* A new tensor for device dev (NULL: for none, counted only in the executor's total), not yet
 * visible under any name; its contents are undefined. The caller owns the one reference.
 * RESOURCE_EXHAUSTED, naming the limit, when its bytes would pass dev's memory or the
 * executor's max_bytes (executor_set_limits). */
dc_code executor_create(struct executor *ex, const dc_device *dev, dc_dtype dtype,
                        const uint64_t *shape, size_t ndim, struct tensor **out, dc_status *st);
/* Publishes t as `name` on dev, replacing any older tensor; takes a reference. */
dc_code executor_store(struct executor *ex, const dc_device *dev, const char *name,
                       struct tensor *t, dc_status *st);
/* One tensor to publish: t as `name` on `device`. */
struct executor_publish {
    const dc_device *device;
    const char *name;
    struct tensor *tensor;
};

/* Publishes every one of pubs[0..n) at once, each replacing any older tensor of its name,
 * under one lock: no lookup sees some of them and not the others, and on failure (a device
 * not here, out of memory) none is published. Takes a reference to each tensor. */
dc_code executor_store_all(struct executor *ex, const struct executor_publish *pubs, size_t n,
                           dc_status *st);
/* The tensor `name` on dev, with a reference the caller drops with tensor_release. */
dc_code executor_lookup(struct executor *ex, const dc_device *dev, const char *name,
                        struct tensor **out, dc_status *st);
dc_code executor_remove(struct executor *ex, const dc_device *dev, const char *name, dc_status *st);
/* Calls fn for every tensor on dev (under the executor's lock: fn must not call back). */
dc_code executor_list(struct executor *ex, const dc_device *dev,
                      void (*fn)(void *arg, const char *name, const struct tensor *t), void *arg,
                      dc_status *st);
/* A page of that: fn for the (at most) `limit` tensors on dev whose names come first in byte
 * order after `after` ("" for the first page), in that order, until fn returns false; *more
 * says whether tensors named after the last one fn took remain. The lock is held for one
 * pass over the device's names, O(n log limit). */
dc_code executor_list_page(struct executor *ex, const dc_device *dev, const char *after,
                           size_t limit,
                           bool (*fn)(void *arg, const char *name, const struct tensor *t),
                           void *arg, bool *more, dc_status *st);
/* Whether dev is one of this executor's devices. */
bool executor_has_device(struct executor *ex, const dc_device *dev);

/* Copies bytes [offset, offset + len) of t out to dst, or in from src. A range outside t is
 * OUT_OF_RANGE. */
dc_code tensor_read(const struct tensor *t, size_t offset, void *dst, size_t len, dc_status *st);
dc_code tensor_write(struct tensor *t, size_t offset, const void *src, size_t len, dc_status *st);

/* Maps bytes [offset, offset + len) of t for `access` into *m. Every map that succeeded is
 * ended by exactly one tensor_unmap, which stores the bytes back when the map has
 * TENSOR_WRITE and may fail only then; m->data is invalid after it. */
dc_code tensor_map(struct tensor *t, size_t offset, size_t len, enum tensor_access access,
                   struct tensor_map *m, dc_status *st);
dc_code tensor_unmap(struct tensor_map *m, dc_status *st);

/* Element count of shape and its size in bytes; false on overflow, too many dimensions or
 * an unknown dtype. */
bool tensor_size(dc_dtype dtype, const uint64_t *shape, size_t ndim, size_t *elements,
                 size_t *bytes);

void tensor_retain(struct tensor *t);
void tensor_release(struct tensor *t);

#endif
