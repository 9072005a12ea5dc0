/* What every executor shares: the name tables, the tensor object and the range checks. */
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "executor_impl.h"
#include "human.h"

static const struct {
    const char *kind;
    struct executor *(*make)(const dc_device *devices, size_t n);
} executor_kinds[] = {
    { "host", host_executor_new },
    { "staged", staged_executor_new },
};

struct executor *
executor_new(const char *kind, const dc_device *devices, size_t n)
{
    for (size_t i = 0; i < sizeof(executor_kinds) / sizeof(executor_kinds[0]); i++) {
        if (strcmp(kind, executor_kinds[i].kind) == 0) {
            return executor_kinds[i].make(devices, n);
        }
    }
    return NULL;
}

bool
executor_init(struct executor *ex, const struct executor_ops *ops, const dc_device *devices,
              size_t n)
{
    if ((ex->devices = calloc(n ? n : 1, sizeof(*ex->devices))) == NULL) {
        return false;
    }
    pthread_mutex_init(&ex->mtx, NULL);
    for (size_t i = 0; i < n; i++) {
        ex->devices[i].device = devices[i];
        strmap_init(&ex->devices[i].tensors);
    }
    ex->n_devices = n;
    ex->ops       = ops;
    return true;
}

void
executor_free(struct executor *ex)
{
    const char *k;
    void *v;

    if (ex == NULL) {
        return;
    }
    for (size_t i = 0; i < ex->n_devices; i++) {
        for (size_t j = 0; strmap_next(&ex->devices[i].tensors, &j, &k, &v);) {
            tensor_release(v);
        }
        strmap_fini(&ex->devices[i].tensors);
    }
    free(ex->devices);
    pthread_mutex_destroy(&ex->mtx);
    ex->ops->destroy(ex);
}

bool
tensor_size(dc_dtype dtype, const uint64_t *shape, size_t ndim, size_t *elements, size_t *bytes)
{
    size_t esize = dc_dtype_size(dtype);
    size_t n     = 1;

    if (esize == 0 || ndim > DC_TENSOR_MAX_DIMS) {
        return false;
    }
    for (size_t i = 0; i < ndim; i++) {
        if (shape[i] != 0 && n > SIZE_MAX / shape[i]) {
            return false;
        }
        n *= (size_t)shape[i];
    }
    if (n > SIZE_MAX / esize) {
        return false;
    }
    *elements = n;
    *bytes    = n * esize;
    return true;
}

/* Gives back what executor_charge counted: bytes in all, and on device index `charged`
 * (SIZE_MAX: none). */
static void
executor_uncharge(struct executor *ex, size_t charged, size_t bytes)
{
    atomic_fetch_sub(&ex->held, bytes);
    if (charged < ex->n_devices) {
        atomic_fetch_sub(&ex->devices[charged].held, bytes);
    }
}

void
tensor_retain(struct tensor *t)
{
    atomic_fetch_add(&t->refs, 1);
}

void
tensor_release(struct tensor *t)
{
    if (t != NULL && atomic_fetch_sub(&t->refs, 1) == 1) {
        executor_uncharge(t->owner, t->charged, t->size_bytes);
        t->owner->ops->tensor_free(t->owner, t);
    }
}

static struct executor_device *
executor_find(struct executor *ex, const dc_device *dev)
{
    for (size_t i = 0; i < ex->n_devices; i++) {
        dc_device_ref a = { .device = ex->devices[i].device }, b = { .device = *dev };
        if (device_ref_compare_concrete(&a, &b) == 0) {
            return &ex->devices[i];
        }
    }
    return NULL;
}

static dc_code
no_device(const dc_device *dev, dc_status *st)
{
    char text[DC_DEVICE_TEXT_SIZE];

    dc_device_format(dev, text, sizeof(text));
    return status_set(st, DC_NOT_FOUND, "device %s is not on this worker", text);
}

static dc_code
no_tensor(const dc_device *dev, const char *name, dc_status *st)
{
    char text[DC_DEVICE_TEXT_SIZE];

    dc_device_format(dev, text, sizeof(text));
    return status_set(st, DC_NOT_FOUND, "no tensor '%.255s' on %s", name, text);
}

void
executor_set_limits(struct executor *ex, uint64_t max_bytes, const uint64_t *device_memory)
{
    ex->max_bytes = max_bytes;
    for (size_t i = 0; i < ex->n_devices; i++) {
        ex->devices[i].memory = device_memory != NULL ? device_memory[i] : 0;
    }
}

void
executor_set_reclaim(struct executor *ex, void (*fn)(void *arg), void *arg)
{
    ex->reclaim     = fn;
    ex->reclaim_arg = arg;
}

uint64_t
executor_bytes_held(struct executor *ex, uint64_t *limit)
{
    if (limit != NULL) {
        *limit = ex->max_bytes;
    }
    return atomic_load(&ex->held);
}

/* Adds bytes to *held unless that passes limit (0: none); else false and *was what it held. */
static bool
charge(_Atomic uint64_t *held, uint64_t limit, uint64_t bytes, uint64_t *was)
{
    uint64_t cur = atomic_load(held);

    do {
        if (limit != 0 && (bytes > limit || cur > limit - bytes)) {
            *was = cur;
            return false;
        }
    } while (!atomic_compare_exchange_weak(held, &cur, cur + bytes));
    return true;
}

/* Counts a new tensor of `bytes` against dev's memory and the executor's bound; dev NULL
 * counts it in the total only. *charged (on DC_OK): the device's index, or SIZE_MAX. */
static dc_code
executor_charge(struct executor *ex, const dc_device *dev, size_t bytes, size_t *charged,
                dc_status *st)
{
    char size[32], used[32], limit[32], text[DC_DEVICE_TEXT_SIZE];
    struct executor_device *d = dev != NULL ? executor_find(ex, dev) : NULL;
    uint64_t was;

    human_bytes(size, sizeof(size), bytes);
    if (d != NULL && !charge(&d->held, d->memory, bytes, &was)) {
        human_bytes(used, sizeof(used), was);
        human_bytes(limit, sizeof(limit), d->memory);
        dc_device_format(dev, text, sizeof(text));
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "no room for a %s tensor on %s: its tensors hold %s of its memory "
                          "(%s, devices[].memory in the worker's configuration)",
                          size, text, used, limit);
    }
    if (!charge(&ex->held, ex->max_bytes, bytes, &was)) {
        if (d != NULL) {
            atomic_fetch_sub(&d->held, bytes);
        }
        human_bytes(used, sizeof(used), was);
        human_bytes(limit, sizeof(limit), ex->max_bytes);
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "no room for a %s tensor: this worker's tensors hold %s of its "
                          "limits.max_stored_bytes (%s)",
                          size, used, limit);
    }
    *charged = d != NULL ? (size_t)(d - ex->devices) : SIZE_MAX;
    return DC_OK;
}

/* The version of the next tensor made (tensor.version). */
static atomic_ullong next_version = 1;

dc_code
executor_create(struct executor *ex, const dc_device *dev, dc_dtype dtype, const uint64_t *shape,
                size_t ndim, struct tensor **out, dc_status *st)
{
    struct tensor *t;
    size_t elements, bytes, charged;
    dc_code code;

    if (!tensor_size(dtype, shape, ndim, &elements, &bytes)) {
        return status_set(st, DC_INVALID_ARGUMENT, "invalid tensor shape or dtype");
    }
    if ((code = executor_charge(ex, dev, bytes, &charged, st)) != DC_OK) {
        if (ex->reclaim == NULL) {
            return code;
        }
        ex->reclaim(ex->reclaim_arg);
        if ((code = executor_charge(ex, dev, bytes, &charged, st)) != DC_OK) {
            return code;
        }
    }
    if ((t = ex->ops->tensor_alloc(ex, bytes)) == NULL) {
        executor_uncharge(ex, charged, bytes);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte tensor", bytes);
    }
    t->owner   = ex;
    t->charged = charged;
    atomic_store(&t->refs, 1);
    t->dtype = dtype;
    t->ndim  = ndim;
    if (ndim > 0) {
        memcpy(t->shape, shape, ndim * sizeof(*shape));
    }
    t->elements   = elements;
    t->size_bytes = bytes;
    t->version    = atomic_fetch_add(&next_version, 1);
    *out          = t;
    return DC_OK;
}

dc_code
executor_store(struct executor *ex, const dc_device *dev, const char *name, struct tensor *t,
               dc_status *st)
{
    struct executor_device *d;
    struct tensor *old;

    pthread_mutex_lock(&ex->mtx);
    if ((d = executor_find(ex, dev)) == NULL) {
        pthread_mutex_unlock(&ex->mtx);
        return no_device(dev, st);
    }
    old = strmap_get(&d->tensors, name);
    if (!strmap_put(&d->tensors, name, t)) {
        pthread_mutex_unlock(&ex->mtx);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    tensor_retain(t);
    pthread_mutex_unlock(&ex->mtx);
    tensor_release(old);
    return DC_OK;
}

dc_code
executor_store_all(struct executor *ex, const struct executor_publish *pubs, size_t n,
                   dc_status *st)
{
    struct executor_device **devs = calloc(n ? n : 1, sizeof(*devs));
    struct tensor **olds          = calloc(n ? n : 1, sizeof(*olds));
    dc_code rv                    = DC_OK;
    size_t i;

    if (devs == NULL || olds == NULL) {
        free(devs);
        free(olds);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_lock(&ex->mtx);
    for (i = 0; i < n; i++) {
        if ((devs[i] = executor_find(ex, pubs[i].device)) == NULL) {
            pthread_mutex_unlock(&ex->mtx);
            rv = no_device(pubs[i].device, st);
            goto out;
        }
    }
    for (i = 0; i < n; i++) {
        olds[i] = strmap_get(&devs[i]->tensors, pubs[i].name);
        if (!strmap_put(&devs[i]->tensors, pubs[i].name, pubs[i].tensor)) {
            break;
        }
        tensor_retain(pubs[i].tensor);
    }
    if (i < n) {
        olds[i] = NULL; /* still published: not ours to drop */
        /* Undo in reverse, so a name given twice gets its first old tensor back. Putting back
         * a name that is in never fails. */
        while (i-- > 0) {
            if (olds[i] != NULL) {
                strmap_put(&devs[i]->tensors, pubs[i].name, olds[i]);
            } else {
                strmap_del(&devs[i]->tensors, pubs[i].name);
            }
            tensor_release(pubs[i].tensor);
            olds[i] = NULL;
        }
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_unlock(&ex->mtx);
    for (i = 0; i < n; i++) {
        tensor_release(olds[i]);
    }
out:
    free(devs);
    free(olds);
    return rv;
}

dc_code
executor_lookup(struct executor *ex, const dc_device *dev, const char *name, struct tensor **out,
                dc_status *st)
{
    struct executor_device *d;

    pthread_mutex_lock(&ex->mtx);
    if ((d = executor_find(ex, dev)) == NULL) {
        pthread_mutex_unlock(&ex->mtx);
        return no_device(dev, st);
    }
    if ((*out = strmap_get(&d->tensors, name)) == NULL) {
        pthread_mutex_unlock(&ex->mtx);
        return no_tensor(dev, name, st);
    }
    tensor_retain(*out);
    pthread_mutex_unlock(&ex->mtx);
    return DC_OK;
}

dc_code
executor_remove(struct executor *ex, const dc_device *dev, const char *name, dc_status *st)
{
    struct executor_device *d;
    struct tensor *t;

    pthread_mutex_lock(&ex->mtx);
    if ((d = executor_find(ex, dev)) == NULL) {
        pthread_mutex_unlock(&ex->mtx);
        return no_device(dev, st);
    }
    t = strmap_del(&d->tensors, name);
    pthread_mutex_unlock(&ex->mtx);
    if (t == NULL) {
        return no_tensor(dev, name, st);
    }
    tensor_release(t);
    return DC_OK;
}

dc_code
executor_list(struct executor *ex, const dc_device *dev,
              void (*fn)(void *arg, const char *name, const struct tensor *t), void *arg,
              dc_status *st)
{
    struct executor_device *d;
    const char *k;
    void *v;

    pthread_mutex_lock(&ex->mtx);
    if ((d = executor_find(ex, dev)) == NULL) {
        pthread_mutex_unlock(&ex->mtx);
        return no_device(dev, st);
    }
    for (size_t i = 0; strmap_next(&d->tensors, &i, &k, &v);) {
        fn(arg, k, v);
    }
    pthread_mutex_unlock(&ex->mtx);
    return DC_OK;
}

struct named {
    const char *name;
    const struct tensor *t;
};

/* A max-heap of named entries by name: heap[0] is the greatest. */
static void
heap_sift_down(struct named *heap, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && strcmp(heap[l].name, heap[top].name) > 0) {
            top = l;
        }
        if (r < n && strcmp(heap[r].name, heap[top].name) > 0) {
            top = r;
        }
        if (top == i) {
            return;
        }
        struct named tmp = heap[i];
        heap[i]          = heap[top];
        heap[top]        = tmp;
        i                = top;
    }
}

static void
heap_sift_up(struct named *heap, size_t i)
{
    while (i > 0 && strcmp(heap[(i - 1) / 2].name, heap[i].name) < 0) {
        struct named tmp  = heap[i];
        heap[i]           = heap[(i - 1) / 2];
        heap[(i - 1) / 2] = tmp;
        i                 = (i - 1) / 2;
    }
}

static int
named_cmp(const void *a, const void *b)
{
    return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

dc_code
executor_list_page(struct executor *ex, const dc_device *dev, const char *after, size_t limit,
                   bool (*fn)(void *arg, const char *name, const struct tensor *t), void *arg,
                   bool *more, dc_status *st)
{
    struct named *heap = limit > 0 ? malloc(limit * sizeof(*heap)) : NULL;
    struct executor_device *d;
    size_t n = 0, taken = 0;
    const char *k;
    void *v;

    *more = false;
    if (heap == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory listing tensors");
    }
    pthread_mutex_lock(&ex->mtx);
    if ((d = executor_find(ex, dev)) == NULL) {
        pthread_mutex_unlock(&ex->mtx);
        free(heap);
        return no_device(dev, st);
    }
    /* The `limit` least names past `after`: a bounded max-heap, its top the one to drop. */
    for (size_t i = 0; strmap_next(&d->tensors, &i, &k, &v);) {
        if (strcmp(k, after) <= 0) {
            continue;
        }
        if (n < limit) {
            heap[n] = (struct named){ k, v };
            heap_sift_up(heap, n++);
        } else {
            *more = true;
            if (strcmp(k, heap[0].name) < 0) {
                heap[0] = (struct named){ k, v };
                heap_sift_down(heap, n, 0);
            }
        }
    }
    qsort(heap, n, sizeof(*heap), named_cmp);
    while (taken < n && fn(arg, heap[taken].name, heap[taken].t)) {
        taken++;
    }
    *more = *more || taken < n;
    pthread_mutex_unlock(&ex->mtx);
    free(heap);
    return DC_OK;
}

bool
executor_has_device(struct executor *ex, const dc_device *dev)
{
    bool found;

    pthread_mutex_lock(&ex->mtx);
    found = executor_find(ex, dev) != NULL;
    pthread_mutex_unlock(&ex->mtx);
    return found;
}

/* ---- bytes ------------------------------------------------------------------------------- */

static dc_code
range_check(const struct tensor *t, size_t offset, size_t len, dc_status *st)
{
    if (offset > t->size_bytes || len > t->size_bytes - offset) {
        return status_set(st, DC_OUT_OF_RANGE, "range [%zu, +%zu) outside a %zu-byte tensor",
                          offset, len, t->size_bytes);
    }
    return DC_OK;
}

dc_code
tensor_read(const struct tensor *t, size_t offset, void *dst, size_t len, dc_status *st)
{
    dc_code code;

    if ((code = range_check(t, offset, len, st)) != DC_OK || len == 0) {
        return code;
    }
    return t->owner->ops->read(t->owner, t, offset, dst, len, st);
}

dc_code
tensor_write(struct tensor *t, size_t offset, const void *src, size_t len, dc_status *st)
{
    dc_code code;

    if ((code = range_check(t, offset, len, st)) != DC_OK || len == 0) {
        return code;
    }
    return t->owner->ops->write(t->owner, t, offset, src, len, st);
}

dc_code
tensor_map(struct tensor *t, size_t offset, size_t len, enum tensor_access access,
           struct tensor_map *m, dc_status *st)
{
    dc_code code;

    memset(m, 0, sizeof(*m));
    if ((code = range_check(t, offset, len, st)) != DC_OK) {
        return code;
    }
    m->tensor = t;
    m->offset = offset;
    m->len    = len;
    m->access = access;
    if ((code = t->owner->ops->map(t->owner, m, st)) != DC_OK) {
        memset(m, 0, sizeof(*m));
    }
    return code;
}

dc_code
tensor_unmap(struct tensor_map *m, dc_status *st)
{
    struct executor *ex = m->tensor->owner;
    dc_code code        = ex->ops->unmap(ex, m, st);

    memset(m, 0, sizeof(*m));
    return code;
}
