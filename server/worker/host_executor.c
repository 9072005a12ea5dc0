/* The host executor: every tensor's bytes in host memory. A map is a pointer into the
 * tensor, so the data plane works on tensors in place, with no copy. */
#include <stdlib.h>
#include <string.h>

#include "executor_impl.h"

struct host_tensor {
    struct tensor base;
    uint8_t *data;
};

#define HOST_TENSOR(t) ((struct host_tensor *)(t))

static struct tensor *
host_tensor_alloc(struct executor *ex, size_t bytes)
{
    struct host_tensor *t;

    (void)ex;
    if ((t = calloc(1, sizeof(*t))) == NULL || (t->data = malloc(bytes ? bytes : 1)) == NULL) {
        free(t);
        return NULL;
    }
    return &t->base;
}

static void
host_tensor_free(struct executor *ex, struct tensor *t)
{
    (void)ex;
    free(HOST_TENSOR(t)->data);
    free(t);
}

static dc_code
host_read(struct executor *ex, const struct tensor *t, size_t offset, void *dst, size_t len,
          dc_status *st)
{
    (void)ex;
    (void)st;
    memcpy(dst, ((const struct host_tensor *)t)->data + offset, len);
    return DC_OK;
}

static dc_code
host_write(struct executor *ex, struct tensor *t, size_t offset, const void *src, size_t len,
           dc_status *st)
{
    (void)ex;
    (void)st;
    memcpy(HOST_TENSOR(t)->data + offset, src, len);
    return DC_OK;
}

static dc_code
host_map(struct executor *ex, struct tensor_map *m, dc_status *st)
{
    (void)ex;
    (void)st;
    m->data = HOST_TENSOR(m->tensor)->data + m->offset;
    return DC_OK;
}

static dc_code
host_unmap(struct executor *ex, struct tensor_map *m, dc_status *st)
{
    (void)ex;
    (void)m;
    (void)st;
    return DC_OK;
}

static void
host_destroy(struct executor *ex)
{
    free(ex);
}

static const struct executor_ops host_ops = {
    .tensor_alloc = host_tensor_alloc,
    .tensor_free  = host_tensor_free,
    .read         = host_read,
    .write        = host_write,
    .map          = host_map,
    .unmap        = host_unmap,
    .destroy      = host_destroy,
};

struct executor *
host_executor_new(const dc_device *devices, size_t n)
{
    struct executor *ex = calloc(1, sizeof(*ex));

    if (ex == NULL || !executor_init(ex, &host_ops, devices, n)) {
        free(ex);
        return NULL;
    }
    return ex;
}
