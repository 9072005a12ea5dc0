/* The host executor: tensors in host memory, one name table per configured device. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "executor.h"
#include "strmap.h"

struct host_device {
    dc_device device;
    struct strmap tensors; /* name -> struct tensor */
};

struct host_executor {
    struct executor base;
    pthread_mutex_t mtx;
    struct host_device *devices;
    size_t n;
};

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

void
tensor_retain(struct tensor *t)
{
    atomic_fetch_add(&t->refs, 1);
}

void
tensor_release(struct tensor *t)
{
    if (t != NULL && atomic_fetch_sub(&t->refs, 1) == 1) {
        free(t->data);
        free(t);
    }
}

static struct host_device *
host_find(struct host_executor *h, const dc_device *dev)
{
    for (size_t i = 0; i < h->n; i++) {
        dc_device_ref a = { .device = h->devices[i].device }, b = { .device = *dev };
        if (device_ref_compare_concrete(&a, &b) == 0) {
            return &h->devices[i];
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
host_create(struct executor *ex, dc_dtype dtype, const uint64_t *shape, size_t ndim,
            struct tensor **out, dc_status *st)
{
    struct tensor *t;
    size_t elements, bytes;

    (void)ex;
    if (!tensor_size(dtype, shape, ndim, &elements, &bytes)) {
        return status_set(st, DC_INVALID_ARGUMENT, "invalid tensor shape or dtype");
    }
    if ((t = calloc(1, sizeof(*t))) == NULL || (t->data = malloc(bytes ? bytes : 1)) == NULL) {
        free(t);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte tensor", bytes);
    }
    atomic_store(&t->refs, 1);
    t->dtype = dtype;
    t->ndim  = ndim;
    if (ndim > 0) {
        memcpy(t->shape, shape, ndim * sizeof(*shape));
    }
    t->elements   = elements;
    t->size_bytes = bytes;
    *out          = t;
    return DC_OK;
}

static dc_code
host_store(struct executor *ex, const dc_device *dev, const char *name, struct tensor *t,
           dc_status *st)
{
    struct host_executor *h = (struct host_executor *)ex;
    struct host_device *d;
    struct tensor *old;

    pthread_mutex_lock(&h->mtx);
    if ((d = host_find(h, dev)) == NULL) {
        pthread_mutex_unlock(&h->mtx);
        return no_device(dev, st);
    }
    old = strmap_get(&d->tensors, name);
    if (!strmap_put(&d->tensors, name, t)) {
        pthread_mutex_unlock(&h->mtx);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    tensor_retain(t);
    pthread_mutex_unlock(&h->mtx);
    tensor_release(old);
    return DC_OK;
}

static dc_code
host_lookup(struct executor *ex, const dc_device *dev, const char *name, struct tensor **out,
            dc_status *st)
{
    struct host_executor *h = (struct host_executor *)ex;
    struct host_device *d;
    char text[DC_DEVICE_TEXT_SIZE];

    pthread_mutex_lock(&h->mtx);
    if ((d = host_find(h, dev)) == NULL) {
        pthread_mutex_unlock(&h->mtx);
        return no_device(dev, st);
    }
    if ((*out = strmap_get(&d->tensors, name)) == NULL) {
        pthread_mutex_unlock(&h->mtx);
        dc_device_format(dev, text, sizeof(text));
        return status_set(st, DC_NOT_FOUND, "no tensor '%.255s' on %s", name, text);
    }
    tensor_retain(*out);
    pthread_mutex_unlock(&h->mtx);
    return DC_OK;
}

static dc_code
host_remove(struct executor *ex, const dc_device *dev, const char *name, dc_status *st)
{
    struct host_executor *h = (struct host_executor *)ex;
    struct host_device *d;
    struct tensor *t;
    char text[DC_DEVICE_TEXT_SIZE];

    pthread_mutex_lock(&h->mtx);
    if ((d = host_find(h, dev)) == NULL) {
        pthread_mutex_unlock(&h->mtx);
        return no_device(dev, st);
    }
    t = strmap_del(&d->tensors, name);
    pthread_mutex_unlock(&h->mtx);
    if (t == NULL) {
        dc_device_format(dev, text, sizeof(text));
        return status_set(st, DC_NOT_FOUND, "no tensor '%.255s' on %s", name, text);
    }
    tensor_release(t);
    return DC_OK;
}

static dc_code
host_list(struct executor *ex, const dc_device *dev,
          void (*fn)(void *arg, const char *name, const struct tensor *t), void *arg, dc_status *st)
{
    struct host_executor *h = (struct host_executor *)ex;
    struct host_device *d;
    const char *k;
    void *v;

    pthread_mutex_lock(&h->mtx);
    if ((d = host_find(h, dev)) == NULL) {
        pthread_mutex_unlock(&h->mtx);
        return no_device(dev, st);
    }
    for (size_t i = 0; strmap_next(&d->tensors, &i, &k, &v);) {
        fn(arg, k, v);
    }
    pthread_mutex_unlock(&h->mtx);
    return DC_OK;
}

static bool
host_has_device(struct executor *ex, const dc_device *dev)
{
    struct host_executor *h = (struct host_executor *)ex;
    bool found;

    pthread_mutex_lock(&h->mtx);
    found = host_find(h, dev) != NULL;
    pthread_mutex_unlock(&h->mtx);
    return found;
}

static void
host_destroy(struct executor *ex)
{
    struct host_executor *h = (struct host_executor *)ex;
    const char *k;
    void *v;

    for (size_t i = 0; i < h->n; i++) {
        for (size_t j = 0; strmap_next(&h->devices[i].tensors, &j, &k, &v);) {
            tensor_release(v);
        }
        strmap_fini(&h->devices[i].tensors);
    }
    free(h->devices);
    pthread_mutex_destroy(&h->mtx);
    free(h);
}

static const struct executor_ops host_ops = {
    .create     = host_create,
    .store      = host_store,
    .lookup     = host_lookup,
    .remove     = host_remove,
    .list       = host_list,
    .has_device = host_has_device,
    .destroy    = host_destroy,
};

struct executor *
host_executor_new(const dc_device *devices, size_t n)
{
    struct host_executor *h = calloc(1, sizeof(*h));

    if (h == NULL || (h->devices = calloc(n ? n : 1, sizeof(*h->devices))) == NULL) {
        free(h);
        return NULL;
    }
    pthread_mutex_init(&h->mtx, NULL);
    for (size_t i = 0; i < n; i++) {
        h->devices[i].device = devices[i];
        strmap_init(&h->devices[i].tensors);
    }
    h->n                = n;
    h->base.ops         = &host_ops;
    h->base.name        = "host";
    h->base.host_memory = true;
    return &h->base;
}
