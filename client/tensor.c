/*
 * libdevcoord's data plane: tensors travel straight between the caller and the worker that
 * owns the device, never through the coordinator, which is asked only where the
 * device lives. Bulk bytes ride in RPC attachments, in chunks under the message limit.
 */
#include "client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "device.h"
#include "status.h"

#define TENSOR_NAME_MAX 255

/* How long a worker that dropped an oversized chunk gets to take us back before the drop
 * counts as the worker being gone. */
#define RECONNECT_WAIT_MS 1000u

dc_code
tensor_expected_bytes(dc_dtype dtype, const uint64_t *shape, size_t ndim, size_t *out,
                      dc_status *st)
{
    size_t esize   = dc_dtype_size(dtype);
    uint64_t elems = 1;

    if (esize == 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "unknown dtype %d", (int)dtype);
    }
    if (ndim > DC_TENSOR_MAX_DIMS) {
        return status_set(st, DC_INVALID_ARGUMENT, "%zu dimensions, at most %d", ndim,
                          DC_TENSOR_MAX_DIMS);
    }
    if (ndim > 0 && shape == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "shape is NULL");
    }
    for (size_t i = 0; i < ndim; i++) {
        if (shape[i] != 0 && elems > UINT64_MAX / shape[i]) {
            return status_set(st, DC_INVALID_ARGUMENT, "tensor shape overflows (dimension %zu)", i);
        }
        elems *= shape[i];
    }
    if (elems > SIZE_MAX / esize) {
        return status_set(st, DC_INVALID_ARGUMENT, "tensor of %llu %s elements is too large",
                          (unsigned long long)elems, dc_dtype_name(dtype));
    }
    *out = (size_t)elems * esize;
    return DC_OK;
}

static dc_code
tensor_check_name(const char *name, dc_status *st)
{
    size_t len;

    if (name == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "tensor name is NULL");
    }
    len = strnlen(name, TENSOR_NAME_MAX + 1);
    if (len == 0 || len > TENSOR_NAME_MAX) {
        return status_set(st, DC_INVALID_ARGUMENT, "tensor name must be 1 to %d bytes",
                          TENSOR_NAME_MAX);
    }
    return DC_OK;
}

/* Where a device's tensors live. */
struct tensor_target {
    struct worker_conn *conn;
    struct {
        char name[DC_DEVICE_TEXT_SIZE];
        char worker[DC_WORKER_NAME_MAX + 1];
        dc_device device;
    } info;
};

/* Keeps chunks to the worker within the message limit it registered (nng drops a connection
 * that carries a bigger message); only ever down, 0 (not said) changes nothing. */
static void
chunk_fit(struct worker_conn *w, uint64_t max_message)
{
    size_t cur = atomic_load(&w->chunk);
    size_t fit;

    if (max_message <= 2 * RPC_FRAME_OVERHEAD) {
        return;
    }
    fit = max_message - RPC_FRAME_OVERHEAD < cur ? (size_t)(max_message - RPC_FRAME_OVERHEAD) : cur;
    while (fit < cur && !atomic_compare_exchange_weak(&w->chunk, &cur, fit)) {
    }
}

static dc_code
tensor_resolve(dc_client *c, const char *device, struct tensor_target *t, dc_status *st)
{
    dc_worker_list *workers = NULL;
    const dc_worker_info *w = NULL;
    dc_device_info info;
    dc_code code;

    if (device == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "device is NULL");
    }
    if ((code = dc_get_device(c, device, &info, st)) != DC_OK) {
        return code;
    }
    snprintf(t->info.name, sizeof(t->info.name), "%s", info.name);
    snprintf(t->info.worker, sizeof(t->info.worker), "%s", info.worker);
    t->info.device = info.device;
    dc_device_info_clear(&info);
    if ((code = dc_list_workers(c, &workers, st)) != DC_OK) {
        goto out;
    }
    for (size_t i = 0; i < workers->n; i++) {
        if (strcmp(workers->workers[i].name, t->info.worker) == 0) {
            w = &workers->workers[i];
            break;
        }
    }
    if (w == NULL) {
        code = status_set(st, DC_NOT_FOUND, "worker %s of device %s is not registered",
                          t->info.worker, t->info.name);
    } else if (w->state == DC_WORKER_DEAD) {
        code = status_set(st, DC_UNAVAILABLE, "worker %s is dead", w->name);
    } else if (w->address[0] == '\0') {
        code = status_set(st, DC_UNAVAILABLE, "worker %s has no data address", w->name);
    } else {
        if ((code = client_worker_conn(c, w->address, &t->conn, st)) == DC_OK) {
            chunk_fit(t->conn, w->max_message_bytes);
        } else if (st != NULL && st->transport) {
            /* The address is the one the worker registered, which may resolve or route on
             * its network but not on ours: say whose it is. */
            char prefix[DC_WORKER_NAME_MAX + 48];
            snprintf(prefix, sizeof(prefix), "data address advertised by worker %s", w->name);
            status_prefix(st, prefix);
        }
    }
    if (code != DC_OK) {
        status_set_worker(st, t->info.worker);
    }
out:
    dc_worker_list_free(workers);
    return code;
}

static uint64_t
upload_id_new(void)
{
    static atomic_uint_fast64_t counter;
    uint64_t id = 0;

    while (id == 0) {
        if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id)) {
            /* splitmix64 of the clock and a counter: unique enough when the kernel will not
             * give us randomness. */
            uint64_t z = rpc_now_us() + atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15ull;
            z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z          = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            id         = z ^ (z >> 31);
        }
    }
    return id;
}

static void
sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

    nanosleep(&ts, NULL);
}

/* Whether w's connection is up, or comes up within ms. */
static bool
connected_within(struct worker_conn *w, unsigned ms)
{
    for (unsigned waited = 0;; waited += 10) {
        if (rpc_client_connected(w->rpc)) {
            return true;
        }
        if (waited >= ms) {
            return false;
        }
        sleep_ms(10);
    }
}

/*
 * Whether a failed chunk of `len` bytes says the worker's message limit is below ours: the
 * request's size was refused (over the message limit, or over what may be in flight: the
 * RPC layer's texts), or a connection that was up dropped (nng closes on an oversized
 * message) and takes us back at once. Any other RESOURCE_EXHAUSTED (the tensor over
 * max_tensor_bytes, no room on the device, uploads in progress) is the answer: a smaller
 * chunk would get it again, and every later put on this connection would be slower.
 */
static bool
chunk_too_large(struct worker_conn *w, dc_code code, const dc_status *st, bool was_connected,
                size_t len)
{
    if (len <= TENSOR_CHUNK_MIN) {
        return false;
    }
    if (code == DC_RESOURCE_EXHAUSTED) {
        return rpc_refused_for_size(st);
    }
    if (code != DC_UNAVAILABLE || !was_connected) {
        return false;
    }
    sleep_ms(20);
    return connected_within(w, RECONNECT_WAIT_MS - 20);
}

static void
chunk_shrink(struct worker_conn *w, size_t from)
{
    size_t half = from / 2 < TENSOR_CHUNK_MIN ? TENSOR_CHUNK_MIN : from / 2;
    size_t cur  = atomic_load(&w->chunk);

    /* Only ever down: a concurrent caller may have learned a smaller limit already. */
    while (half < cur && !atomic_compare_exchange_weak(&w->chunk, &cur, half)) {
    }
}

dc_code
dc_tensor_put(dc_client *c, const char *device, const char *name, dc_dtype dtype,
              const uint64_t *shape, size_t ndim, const void *data, size_t bytes, dc_status *st)
{
    return dc_tensor_put_progress(c, device, name, dtype, shape, ndim, data, bytes, NULL, NULL, st);
}

dc_code
dc_tensor_put_progress(dc_client *c, const char *device, const char *name, dc_dtype dtype,
                       const uint64_t *shape, size_t ndim, const void *data, size_t bytes,
                       dc_progress_fn progress, void *arg, dc_status *st)
{
    Devcoord__V1__PutTensorRequest req = DEVCOORD__V1__PUT_TENSOR_REQUEST__INIT;
    Devcoord__V1__Device dev_pb;
    struct tensor_target t = { 0 };
    struct rpc_reply r     = { 0 };
    size_t want, offset = 0;
    dc_code code;

    status_clear(st);
    if (c == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "client is NULL");
    }
    if ((code = tensor_check_name(name, st)) != DC_OK ||
        (code = tensor_expected_bytes(dtype, shape, ndim, &want, st)) != DC_OK) {
        return code;
    }
    if (want != bytes) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "a %s tensor of this shape takes %zu bytes, got %zu",
                          dc_dtype_name(dtype), want, bytes);
    }
    if (bytes > 0 && data == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "data is NULL");
    }
    if ((code = tensor_resolve(c, device, &t, st)) != DC_OK) {
        return code;
    }
    device_to_pb(&t.info.device, &dev_pb);
    req.device    = &dev_pb;
    req.name      = (char *)name;
    req.dtype     = (Devcoord__V1__DType)dtype;
    req.n_shape   = ndim;
    req.shape     = (uint64_t *)shape;
    req.upload_id = upload_id_new();
    /* One chunk even for an empty tensor: its arrival is what makes the tensor appear. */
    do {
        const Devcoord__V1__PutTensorResponse *resp;
        size_t chunk = atomic_load(&t.conn->chunk);
        size_t len   = bytes - offset < chunk ? bytes - offset : chunk;
        /* A first chunk on a connection still being dialed (the first call to this worker)
         * waits for it: a drop of an oversized chunk then reads as one, not as the worker
         * being gone (chunk_too_large). */
        bool was_up      = offset == 0 ? connected_within(t.conn, RECONNECT_WAIT_MS)
                                       : rpc_client_connected(t.conn->rpc);
        const void *part = len > 0 ? (const unsigned char *)data + offset : NULL;

        req.offset = offset;
        code       = rpc_call(t.conn->rpc, WORKER_SVC, M_WORKER_PUT_TENSOR, &req.base, part, len,
                              c->timeout_ms, &r, st);
        if (code != DC_OK) {
            if (offset == 0 && chunk_too_large(t.conn, code, st, was_up, len)) {
                chunk_shrink(t.conn, len);
                rpc_reply_free(&r);
                status_clear(st);
                /* The refused chunk may have landed after all: start a new upload. */
                req.upload_id = upload_id_new();
                continue;
            }
            status_set_worker(st, t.info.worker);
            goto out;
        }
        offset += len;
        if (progress != NULL) {
            progress(offset, bytes, arg);
        }
        resp = (const Devcoord__V1__PutTensorResponse *)r.body;
        if (offset == bytes && (resp == NULL || !resp->complete)) {
            code = status_set(st, DC_DATA_LOSS,
                              "worker %s did not complete tensor %s after all %zu bytes",
                              t.info.worker, name, bytes);
            goto out;
        }
        rpc_reply_free(&r);
    } while (offset < bytes);
out:
    rpc_reply_free(&r);
    return code;
}

void
dc_tensor_free(dc_tensor *t)
{
    if (t == NULL) {
        return;
    }
    free(t->data);
    free(t);
}

/* Checks a TensorInfo from a worker and copies what it says into t (not the data). */
static dc_code
tensor_info_from_pb(const Devcoord__V1__TensorInfo *pb, dc_tensor *t, dc_status *st)
{
    size_t want;
    dc_code code;

    if (pb == NULL) {
        return status_set(st, DC_INTERNAL, "malformed reply: tensor info missing");
    }
    if ((code = client_copy_field(t->name, sizeof(t->name), pb->name, "tensor name", st)) !=
        DC_OK) {
        return code;
    }
    if (pb->n_shape > DC_TENSOR_MAX_DIMS) {
        return status_set(st, DC_INTERNAL, "malformed reply: tensor %s has %zu dimensions", t->name,
                          pb->n_shape);
    }
    if (tensor_expected_bytes((dc_dtype)pb->dtype, pb->shape, pb->n_shape, &want, st) != DC_OK) {
        status_prefix(st, "malformed reply");
        if (st != NULL) {
            st->code = DC_INTERNAL;
        }
        return DC_INTERNAL;
    }
    if (pb->size_bytes != (uint64_t)want) {
        return status_set(st, DC_INTERNAL,
                          "malformed reply: tensor %s says %llu bytes, its shape %zu", t->name,
                          (unsigned long long)pb->size_bytes, want);
    }
    t->dtype = (dc_dtype)pb->dtype;
    t->ndim  = pb->n_shape;
    for (size_t i = 0; i < pb->n_shape; i++) {
        t->shape[i] = pb->shape[i];
    }
    t->size_bytes = want;
    return DC_OK;
}

static bool
tensor_same_layout(const dc_tensor *a, const dc_tensor *b)
{
    return a->dtype == b->dtype && a->ndim == b->ndim && a->size_bytes == b->size_bytes &&
           memcmp(a->shape, b->shape, a->ndim * sizeof(a->shape[0])) == 0;
}

dc_code
dc_tensor_get(dc_client *c, const char *device, const char *name, dc_tensor **out, dc_status *st)
{
    return dc_tensor_get_progress(c, device, name, out, NULL, NULL, st);
}

dc_code
dc_tensor_get_progress(dc_client *c, const char *device, const char *name, dc_tensor **out,
                       dc_progress_fn progress, void *arg, dc_status *st)
{
    Devcoord__V1__GetTensorRequest req = DEVCOORD__V1__GET_TENSOR_REQUEST__INIT;
    Devcoord__V1__Device dev_pb;
    struct tensor_target tt = { 0 };
    struct rpc_reply r      = { 0 };
    dc_tensor *t            = NULL;
    size_t offset           = 0;
    size_t max;
    dc_code code;

    status_clear(st);
    if (out == NULL || c == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "%s is NULL", out == NULL ? "out" : "client");
    }
    *out = NULL;
    if ((code = tensor_check_name(name, st)) != DC_OK ||
        (code = tensor_resolve(c, device, &tt, st)) != DC_OK) {
        return code;
    }
    device_to_pb(&tt.info.device, &dev_pb);
    req.device = &dev_pb;
    req.name   = (char *)name;
    max        = atomic_load(&tt.conn->chunk);
    for (;;) {
        const Devcoord__V1__GetTensorResponse *resp;
        dc_tensor info = { 0 };

        req.offset    = offset;
        req.max_bytes = max;
        code          = rpc_call(tt.conn->rpc, WORKER_SVC, M_WORKER_GET_TENSOR, &req.base, NULL, 0,
                                 c->timeout_ms, &r, st);
        if (code == DC_RESOURCE_EXHAUSTED && max > TENSOR_CHUNK_MIN) {
            /* The worker's reply limit is below ours. */
            chunk_shrink(tt.conn, max);
            max = max / 2 < TENSOR_CHUNK_MIN ? TENSOR_CHUNK_MIN : max / 2;
            rpc_reply_free(&r);
            status_clear(st);
            continue;
        }
        if (code != DC_OK) {
            status_set_worker(st, tt.info.worker);
            goto out;
        }
        resp = (const Devcoord__V1__GetTensorResponse *)r.body;
        if (resp == NULL || resp->tensor == NULL) {
            code = status_set(st, DC_INTERNAL, "malformed reply: GetTensor without tensor info");
            goto out;
        }
        if ((code = tensor_info_from_pb(resp->tensor, &info, st)) != DC_OK) {
            goto out;
        }
        if (t == NULL) {
            if ((t = calloc(1, sizeof(*t))) == NULL ||
                (t->data = malloc(info.size_bytes > 0 ? info.size_bytes : 1)) == NULL) {
                code = status_set(st, DC_RESOURCE_EXHAUSTED,
                                  "out of memory for a tensor of %zu bytes", info.size_bytes);
                goto out;
            }
            snprintf(t->name, sizeof(t->name), "%s", name);
            snprintf(t->device, sizeof(t->device), "%s", tt.info.name);
            t->dtype      = info.dtype;
            t->ndim       = info.ndim;
            t->size_bytes = info.size_bytes;
            memcpy(t->shape, info.shape, sizeof(t->shape));
            /* The later chunks must come from this same tensor (0: a worker too old to
             * say, where only a change of layout shows). */
            req.version = resp->tensor->version;
        } else if (!tensor_same_layout(t, &info)) {
            code = status_set(st, DC_ABORTED, "tensor %s changed while it was read; read it again",
                              name);
            goto out;
        }
        if (resp->offset != offset) {
            code =
                status_set(st, DC_INTERNAL, "malformed reply: data at offset %llu, asked for %zu",
                           (unsigned long long)resp->offset, offset);
            goto out;
        }
        if (r.attachment_len > t->size_bytes - offset) {
            code = status_set(st, DC_INTERNAL, "malformed reply: data past the tensor's end");
            goto out;
        }
        if (r.attachment_len == 0 && offset < t->size_bytes) {
            code = status_set(st, DC_DATA_LOSS, "worker %s sent no data at offset %zu of %zu",
                              tt.info.worker, offset, t->size_bytes);
            goto out;
        }
        if (r.attachment_len > 0) {
            memcpy((unsigned char *)t->data + offset, r.attachment, r.attachment_len);
        }
        offset += r.attachment_len;
        rpc_reply_free(&r);
        if (progress != NULL) {
            progress(offset, t->size_bytes, arg);
        }
        if (offset == t->size_bytes) {
            break;
        }
    }
    *out = t;
    t    = NULL;
out:
    dc_tensor_free(t);
    rpc_reply_free(&r);
    return code;
}

dc_code
dc_tensor_delete(dc_client *c, const char *device, const char *name, dc_status *st)
{
    Devcoord__V1__DeleteTensorRequest req = DEVCOORD__V1__DELETE_TENSOR_REQUEST__INIT;
    Devcoord__V1__Device dev_pb;
    struct tensor_target t = { 0 };
    struct rpc_reply r     = { 0 };
    dc_code code;

    status_clear(st);
    if (c == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "client is NULL");
    }
    if ((code = tensor_check_name(name, st)) != DC_OK ||
        (code = tensor_resolve(c, device, &t, st)) != DC_OK) {
        return code;
    }
    device_to_pb(&t.info.device, &dev_pb);
    req.device = &dev_pb;
    req.name   = (char *)name;
    code       = rpc_call(t.conn->rpc, WORKER_SVC, M_WORKER_DELETE_TENSOR, &req.base, NULL, 0,
                          c->timeout_ms, &r, st);
    if (code != DC_OK) {
        status_set_worker(st, t.info.worker);
    }
    rpc_reply_free(&r);
    return code;
}

void
dc_tensor_list_free(dc_tensor_list *list)
{
    if (list == NULL) {
        return;
    }
    free(list->tensors);
    free(list);
}

dc_code
dc_tensor_list_get(dc_client *c, const char *device, dc_tensor_list **out, dc_status *st)
{
    static const Devcoord__V1__ListTensorsResponse empty =
        DEVCOORD__V1__LIST_TENSORS_RESPONSE__INIT;
    Devcoord__V1__ListTensorsRequest req = DEVCOORD__V1__LIST_TENSORS_REQUEST__INIT;
    const Devcoord__V1__ListTensorsResponse *resp;
    Devcoord__V1__Device dev_pb;
    struct tensor_target t                     = { 0 };
    struct rpc_reply r                         = { 0 };
    dc_tensor_list *list                       = NULL;
    char after[sizeof(((dc_tensor *)0)->name)] = "";
    bool more;
    dc_code code;

    status_clear(st);
    if (out == NULL || c == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "%s is NULL", out == NULL ? "out" : "client");
    }
    *out = NULL;
    if ((code = tensor_resolve(c, device, &t, st)) != DC_OK) {
        return code;
    }
    device_to_pb(&t.info.device, &dev_pb);
    req.device    = &dev_pb;
    req.page_size = TENSOR_LIST_PAGE;
    req.after     = after;
    if ((list = calloc(1, sizeof(*list))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    /* Page by page, in name order (a worker from before paging sends all at once, more
     * unset). Each page starts after the last name listed, so a tensor put or deleted
     * meanwhile is listed or not, never twice. */
    do {
        dc_tensor *grow;
        code = rpc_call(t.conn->rpc, WORKER_SVC, M_WORKER_LIST_TENSORS, &req.base, NULL, 0,
                        c->timeout_ms, &r, st);
        if (code != DC_OK) {
            status_set_worker(st, t.info.worker);
            goto out;
        }
        resp = r.body != NULL ? (const Devcoord__V1__ListTensorsResponse *)r.body : &empty;
        if (resp->n_tensors >= SIZE_MAX / sizeof(*grow) - list->n || /* the + 1 below too */
            (grow = realloc(list->tensors, (list->n + resp->n_tensors + 1) * sizeof(*grow))) ==
                NULL) {
            code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        list->tensors = grow;
        for (size_t i = 0; i < resp->n_tensors; i++) {
            dc_tensor *e = &list->tensors[list->n];
            memset(e, 0, sizeof(*e));
            if ((code = tensor_info_from_pb(resp->tensors[i], e, st)) != DC_OK) {
                goto out;
            }
            snprintf(e->device, sizeof(e->device), "%s", t.info.name);
            list->n++;
        }
        /* A page that does not move past `after` would be asked for again and again. */
        if (resp->more &&
            (resp->n_tensors == 0 || strcmp(list->tensors[list->n - 1].name, after) <= 0)) {
            code = status_set(
                st, DC_INTERNAL,
                "worker %s says more tensors remain after '%.64s' but listed none after it",
                t.info.worker, after);
            goto out;
        }
        if (resp->more) {
            snprintf(after, sizeof(after), "%s", list->tensors[list->n - 1].name);
        }
        more = resp->more;
        rpc_reply_free(&r);
    } while (more);
    *out = list;
    list = NULL;
out:
    dc_tensor_list_free(list);
    rpc_reply_free(&r);
    return code;
}
