/*
 * The staged executor, for tests: it keeps tensors the way a device executor must, so that
 * the data plane is tested against the interface and not against host memory. Each
 * tensor's bytes ("device memory") are an allocation of their own that nothing outside this
 * file can reach: reads and writes copy, and a map is a staging buffer of its own, filled
 * from the tensor when mapped for reading and copied back by unmap when mapped for writing.
 * Bytes the caller may not rely on are poisoned: a new tensor, a map not mapped for
 * reading, and a staging buffer as it is freed. So code that writes through a read-only
 * map, reads a write-only one, keeps a map past its unmap, or counts on a write through a
 * map being visible before the unmap gets wrong numbers here where `host` would hide it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "executor_impl.h"

#define POISON_UNDEFINED 0xA5 /* bytes nobody has written */
#define POISON_UNMAPPED  0x5A /* a staging buffer after its unmap */

struct staged_tensor {
    struct tensor base;
    pthread_mutex_t mtx; /* copies in and out of `device` */
    uint8_t *device;
};

#define STAGED_TENSOR(t) ((struct staged_tensor *)(t))

static struct tensor *
staged_tensor_alloc(struct executor *ex, size_t bytes)
{
    struct staged_tensor *t;

    (void)ex;
    if ((t = calloc(1, sizeof(*t))) == NULL || (t->device = malloc(bytes ? bytes : 1)) == NULL) {
        free(t);
        return NULL;
    }
    memset(t->device, POISON_UNDEFINED, bytes);
    pthread_mutex_init(&t->mtx, NULL);
    return &t->base;
}

static void
staged_tensor_free(struct executor *ex, struct tensor *t)
{
    struct staged_tensor *s = STAGED_TENSOR(t);

    (void)ex;
    pthread_mutex_destroy(&s->mtx);
    free(s->device);
    free(s);
}

/* The only code that reads s->device. */
static void
copy_out(struct staged_tensor *s, size_t offset, void *dst, size_t len)
{
    pthread_mutex_lock(&s->mtx);
    memcpy(dst, s->device + offset, len);
    pthread_mutex_unlock(&s->mtx);
}

/* The only code that writes s->device (besides poisoning a new one). */
static void
copy_in(struct staged_tensor *s, size_t offset, const void *src, size_t len)
{
    pthread_mutex_lock(&s->mtx);
    memcpy(s->device + offset, src, len);
    pthread_mutex_unlock(&s->mtx);
}

static dc_code
staged_read(struct executor *ex, const struct tensor *t, size_t offset, void *dst, size_t len,
            dc_status *st)
{
    (void)ex;
    (void)st;
    copy_out(STAGED_TENSOR(t), offset, dst, len);
    return DC_OK;
}

static dc_code
staged_write(struct executor *ex, struct tensor *t, size_t offset, const void *src, size_t len,
             dc_status *st)
{
    (void)ex;
    (void)st;
    copy_in(STAGED_TENSOR(t), offset, src, len);
    return DC_OK;
}

static dc_code
staged_map(struct executor *ex, struct tensor_map *m, dc_status *st)
{
    uint8_t *staging;

    (void)ex;
    if ((staging = malloc(m->len ? m->len : 1)) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte staging buffer",
                          m->len);
    }
    if (m->access & TENSOR_READ) {
        copy_out(STAGED_TENSOR(m->tensor), m->offset, staging, m->len);
    } else {
        memset(staging, POISON_UNDEFINED, m->len);
    }
    m->data = staging;
    return DC_OK;
}

static dc_code
staged_unmap(struct executor *ex, struct tensor_map *m, dc_status *st)
{
    (void)ex;
    (void)st;
    if (m->access & TENSOR_WRITE) {
        copy_in(STAGED_TENSOR(m->tensor), m->offset, m->data, m->len);
    }
    memset(m->data, POISON_UNMAPPED, m->len);
    free(m->data);
    return DC_OK;
}

static void
staged_destroy(struct executor *ex)
{
    free(ex);
}

static const struct executor_ops staged_ops = {
    .tensor_alloc = staged_tensor_alloc,
    .tensor_free  = staged_tensor_free,
    .read         = staged_read,
    .write        = staged_write,
    .map          = staged_map,
    .unmap        = staged_unmap,
    .destroy      = staged_destroy,
};

struct executor *
staged_executor_new(const dc_device *devices, size_t n)
{
    struct executor *ex = calloc(1, sizeof(*ex));

    if (ex == NULL || !executor_init(ex, &staged_ops, devices, n)) {
        free(ex);
        return NULL;
    }
    return ex;
}
