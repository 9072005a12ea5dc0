#include "tensors.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "device.h"
#include "rpc.h"
#include "status.h"

/* One upload in progress. Chunks are taken in order: `received` is claimed before a chunk's
 * bytes are copied, `copying` counts copies under way, and the upload completes when the
 * last byte is claimed and no copy is left. A copy the executor fails breaks the upload:
 * the last copy under way drops it, and the client starts again. */
struct upload {
    uint64_t id;
    dc_device device;
    char name[TENSOR_NAME_MAX + 1];
    struct tensor *tensor;
    size_t received;
    unsigned copying;
    bool broken;
    uint64_t touched_ms;
};

struct tensors {
    struct executor *ex;
    size_t chunk; /* largest attachment a reply may carry */
    uint64_t max_tensor;
    uint64_t idle_ms; /* UPLOAD_IDLE_MS, unless a test set it */
    pthread_mutex_t mtx;
    uint64_t pending; /* bytes of the uploads in progress */
    struct upload uploads[UPLOADS_MAX];
};

static void tensors_reclaim(void *arg);

struct tensors *
tensors_new(struct executor *ex, size_t max_message_bytes, uint64_t max_tensor_bytes)
{
    struct tensors *t = calloc(1, sizeof(*t));

    if (t == NULL) {
        return NULL;
    }
    t->ex         = ex;
    t->max_tensor = max_tensor_bytes;
    t->idle_ms    = UPLOAD_IDLE_MS;
    t->chunk = max_message_bytes > 2 * RPC_FRAME_OVERHEAD ? max_message_bytes - RPC_FRAME_OVERHEAD
                                                          : RPC_FRAME_OVERHEAD;
    pthread_mutex_init(&t->mtx, NULL);
    executor_set_reclaim(ex, tensors_reclaim, t);
    return t;
}

void
tensors_set_upload_idle_ms(struct tensors *t, uint64_t ms)
{
    pthread_mutex_lock(&t->mtx);
    t->idle_ms = ms;
    pthread_mutex_unlock(&t->mtx);
}

void
tensors_free(struct tensors *t)
{
    if (t == NULL) {
        return;
    }
    executor_set_reclaim(t->ex, NULL, NULL); /* no tensor is made any more (main.c) */
    for (size_t i = 0; i < UPLOADS_MAX; i++) {
        tensor_release(t->uploads[i].tensor);
    }
    pthread_mutex_destroy(&t->mtx);
    free(t);
}

static void
fail(void *cd, ProtobufCClosure closure, const dc_status *st)
{
    *rpc_call_status(cd) = *st;
    closure(NULL, cd);
}

static dc_code
tensor_name_check(const char *name, dc_status *st)
{
    size_t len = strnlen(name, TENSOR_NAME_MAX + 1);

    if (len == 0 || len > TENSOR_NAME_MAX) {
        return status_set(st, DC_INVALID_ARGUMENT, "tensor names are 1 to %d bytes",
                          TENSOR_NAME_MAX);
    }
    return DC_OK;
}

/* Drops upload u if its client has left it idle for t->idle_ms. t->mtx held. */
static void
upload_drop_idle(struct tensors *t, struct upload *u, uint64_t now)
{
    if (u->tensor != NULL && u->copying == 0 && now > u->touched_ms &&
        now - u->touched_ms > t->idle_ms) {
        t->pending -= u->tensor->size_bytes;
        tensor_release(u->tensor);
        u->tensor = NULL;
    }
}

/* The executor's reclaim hook (executor_set_reclaim): a tensor does not fit, perhaps for
 * an upload abandoned by its client, which only the next put would drop otherwise (an op's
 * results would be refused until then). Not when t->mtx is taken: that is a put, which
 * drops them itself (upload_slot), here or on another thread. */
static void
tensors_reclaim(void *arg)
{
    struct tensors *t = arg;
    uint64_t now      = rpc_now_ms();

    if (pthread_mutex_trylock(&t->mtx) != 0) {
        return;
    }
    for (size_t i = 0; i < UPLOADS_MAX; i++) {
        upload_drop_idle(t, &t->uploads[i], now);
    }
    pthread_mutex_unlock(&t->mtx);
}

/* Finds the upload `id` for (device, name), or makes room for it (dropping idle ones).
 * t->mtx held. */
static struct upload *
upload_slot(struct tensors *t, uint64_t id, uint64_t now)
{
    struct upload *free_slot = NULL;

    for (size_t i = 0; i < UPLOADS_MAX; i++) {
        struct upload *u = &t->uploads[i];
        if (u->tensor != NULL && u->id == id) {
            return u;
        }
        upload_drop_idle(t, u, now);
        if (u->tensor == NULL && free_slot == NULL) {
            free_slot = u;
        }
    }
    return free_slot;
}

void
tensors_put(struct tensors *t, const Devcoord__V1__PutTensorRequest *in,
            Devcoord__V1__PutTensorResponse_Closure closure, void *cd)
{
    Devcoord__V1__PutTensorResponse out = DEVCOORD__V1__PUT_TENSOR_RESPONSE__INIT;
    struct executor *ex                 = t->ex;
    struct tensor *done                 = NULL;
    struct upload *u;
    dc_device dev;
    size_t len, elements, bytes;
    const uint8_t *data = rpc_call_attachment(cd, &len);
    uint64_t now        = rpc_now_ms();
    dc_status st;
    dc_code code;

    status_clear(&st);
    if (device_from_pb(in->device, &dev, &st) != DC_OK ||
        tensor_name_check(in->name, &st) != DC_OK) {
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    if (in->n_shape > DC_TENSOR_MAX_DIMS ||
        !tensor_size((dc_dtype)in->dtype, in->shape, in->n_shape, &elements, &bytes)) {
        status_set(
            &st, DC_INVALID_ARGUMENT,
            "invalid tensor: a dtype (f32, f64, i32, i64, f16, bf16) and at most %d dimensions",
            DC_TENSOR_MAX_DIMS);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    if (bytes > t->max_tensor) {
        status_set(&st, DC_RESOURCE_EXHAUSTED,
                   "a %zu-byte tensor is over this worker's limits.max_tensor_bytes (%llu)", bytes,
                   (unsigned long long)t->max_tensor);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    if (in->offset > bytes || len > bytes - in->offset) {
        status_set(&st, DC_OUT_OF_RANGE, "chunk [%llu, +%zu) outside a %zu-byte tensor",
                   (unsigned long long)in->offset, len, bytes);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    /* Checked before anything is allocated for it. */
    if (!executor_has_device(ex, &dev)) {
        char text[DC_DEVICE_TEXT_SIZE];
        dc_device_format(&dev, text, sizeof(text));
        status_set(&st, DC_NOT_FOUND, "device %s is not on this worker", text);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }

    pthread_mutex_lock(&t->mtx);
    if ((u = upload_slot(t, in->upload_id, now)) == NULL) {
        pthread_mutex_unlock(&t->mtx);
        status_set(&st, DC_RESOURCE_EXHAUSTED, "%d uploads in progress already", UPLOADS_MAX);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    if (u->tensor == NULL) {
        if (in->offset != 0) {
            pthread_mutex_unlock(&t->mtx);
            status_set(&st, DC_FAILED_PRECONDITION,
                       "upload %llu is unknown here (expired?): start again from offset 0",
                       (unsigned long long)in->upload_id);
            fail(cd, (ProtobufCClosure)closure, &st);
            return;
        }
        if (t->pending + bytes > 2 * t->max_tensor) {
            pthread_mutex_unlock(&t->mtx);
            status_set(&st, DC_RESOURCE_EXHAUSTED,
                       "uploads in progress already hold %llu bytes; try again later",
                       (unsigned long long)t->pending);
            fail(cd, (ProtobufCClosure)closure, &st);
            return;
        }
        if (executor_create(ex, &dev, (dc_dtype)in->dtype, in->shape, in->n_shape, &u->tensor,
                            &st) != DC_OK) {
            pthread_mutex_unlock(&t->mtx);
            fail(cd, (ProtobufCClosure)closure, &st);
            return;
        }
        t->pending += bytes;
        u->id         = in->upload_id;
        u->device     = dev;
        u->received   = 0;
        u->copying    = 0;
        u->broken     = false;
        u->touched_ms = now;
        snprintf(u->name, sizeof(u->name), "%s", in->name);
    } else if (u->tensor->size_bytes != bytes || u->tensor->dtype != (dc_dtype)in->dtype ||
               u->tensor->ndim != in->n_shape ||
               (in->n_shape > 0 &&
                memcmp(u->tensor->shape, in->shape, in->n_shape * sizeof(*in->shape)) != 0) ||
               strcmp(u->name, in->name) != 0 ||
               device_ref_compare_concrete(&(dc_device_ref){ .device = u->device },
                                           &(dc_device_ref){ .device = dev }) != 0) {
        pthread_mutex_unlock(&t->mtx);
        status_set(&st, DC_INVALID_ARGUMENT, "chunk does not match upload %llu",
                   (unsigned long long)in->upload_id);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    if (u->broken) {
        pthread_mutex_unlock(&t->mtx);
        status_set(&st, DC_FAILED_PRECONDITION, "upload %llu failed: start again from offset 0",
                   (unsigned long long)in->upload_id);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    if (in->offset != u->received) {
        size_t expected = u->received;
        pthread_mutex_unlock(&t->mtx);
        status_set(&st, DC_FAILED_PRECONDITION,
                   "upload %llu expects its chunk at offset %zu, got %llu",
                   (unsigned long long)in->upload_id, expected, (unsigned long long)in->offset);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    /* Claim the range, copy without the lock, then see whether this was the last byte. */
    u->received += len;
    u->copying++;
    u->touched_ms = now;
    done          = u->tensor;
    tensor_retain(done);
    pthread_mutex_unlock(&t->mtx);
    code = tensor_write(done, in->offset, data, len, &st);
    pthread_mutex_lock(&t->mtx);
    u->copying--;
    if (code != DC_OK || u->broken) {
        u->broken = true;
        if (u->copying == 0) {
            u->tensor = NULL;
            t->pending -= bytes;
            tensor_release(done); /* the slot's reference */
        }
        pthread_mutex_unlock(&t->mtx);
        tensor_release(done);
        if (code == DC_OK) {
            status_set(&st, DC_ABORTED, "upload %llu failed: start again from offset 0",
                       (unsigned long long)in->upload_id);
        }
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    out.received_bytes = u->received;
    if (u->received == bytes && u->copying == 0) {
        out.complete = true;
        u->tensor    = NULL;
        t->pending -= bytes;
        tensor_release(done); /* the slot's reference; ours goes to the store */
    }
    pthread_mutex_unlock(&t->mtx);
    if (out.complete && executor_store(ex, &dev, in->name, done, &st) != DC_OK) {
        tensor_release(done);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    tensor_release(done);
    closure(&out, cd);
}

static void
tensor_info(Devcoord__V1__TensorInfo *info, Devcoord__V1__Device *dev_pb, const dc_device *dev,
            const char *name, const struct tensor *tn)
{
    devcoord__v1__tensor_info__init(info);
    device_to_pb(dev, dev_pb);
    info->device     = dev_pb;
    info->name       = (char *)name;
    info->dtype      = (Devcoord__V1__DType)tn->dtype;
    info->shape      = (uint64_t *)tn->shape;
    info->n_shape    = tn->ndim;
    info->size_bytes = tn->size_bytes;
    info->version    = tn->version;
}

void
tensors_get(struct tensors *t, const Devcoord__V1__GetTensorRequest *in,
            Devcoord__V1__GetTensorResponse_Closure closure, void *cd)
{
    Devcoord__V1__GetTensorResponse out = DEVCOORD__V1__GET_TENSOR_RESPONSE__INIT;
    Devcoord__V1__TensorInfo info;
    Devcoord__V1__Device dev_pb;
    struct tensor *tn;
    struct tensor_map map;
    dc_device dev;
    size_t len;
    dc_status st;

    status_clear(&st);
    if (device_from_pb(in->device, &dev, &st) != DC_OK ||
        tensor_name_check(in->name, &st) != DC_OK ||
        executor_lookup(t->ex, &dev, in->name, &tn, &st) != DC_OK) {
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    if (in->version != 0 && in->version != tn->version) {
        status_set(&st, DC_ABORTED,
                   "tensor '%.255s' was replaced while it was being read; read it again", in->name);
        tensor_release(tn);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    if (in->offset > tn->size_bytes) {
        status_set(&st, DC_OUT_OF_RANGE, "offset %llu past the end of a %zu-byte tensor",
                   (unsigned long long)in->offset, tn->size_bytes);
        tensor_release(tn);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    len = tn->size_bytes - in->offset;
    if (len > t->chunk) {
        len = t->chunk;
    }
    if (in->max_bytes != 0 && len > in->max_bytes) {
        len = in->max_bytes;
    }
    /* The reply copies the mapped bytes when the closure runs: unmap after it. */
    if (tensor_map(tn, in->offset, len, TENSOR_READ, &map, &st) != DC_OK) {
        tensor_release(tn);
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    tensor_info(&info, &dev_pb, &dev, in->name, tn);
    out.tensor = &info;
    out.offset = in->offset;
    rpc_call_set_reply_attachment(cd, map.data, len);
    closure(&out, cd);
    tensor_unmap(&map, &st); /* a read-only map has nothing to store back */
    tensor_release(tn);
}

void
tensors_delete(struct tensors *t, const Devcoord__V1__DeleteTensorRequest *in,
               Devcoord__V1__DeleteTensorResponse_Closure closure, void *cd)
{
    Devcoord__V1__DeleteTensorResponse out = DEVCOORD__V1__DELETE_TENSOR_RESPONSE__INIT;
    dc_device dev;
    dc_status st;

    status_clear(&st);
    if (device_from_pb(in->device, &dev, &st) != DC_OK ||
        tensor_name_check(in->name, &st) != DC_OK ||
        executor_remove(t->ex, &dev, in->name, &st) != DC_OK) {
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    closure(&out, cd);
}

/* The most tensors one page of ListTensors lists, whatever its page_size. */
#define LIST_PAGE_MAX 4096

struct list_ctx {
    struct arena *arena;
    const dc_device *dev;
    Devcoord__V1__ListTensorsResponse *out;
    size_t cap;
    bool oom;
    bool paged;    /* a page: stop where the reply is full */
    size_t budget; /* paged: the reply's bytes left */
};

/* Adds tn to the listing; false (paged) when it does not fit in the reply any more. */
static bool
list_add(void *arg, const char *name, const struct tensor *tn)
{
    struct list_ctx *l = arg;
    Devcoord__V1__TensorInfo *info;
    Devcoord__V1__Device *dev_pb;
    char *name_copy;
    uint64_t *shape;
    size_t bytes;

    if (l->oom) {
        return false;
    }
    if (l->out->n_tensors == l->cap) {
        size_t cap                      = l->cap ? l->cap * 2 : 16;
        Devcoord__V1__TensorInfo **grow = arena_alloc(l->arena, cap * sizeof(*grow));
        if (grow == NULL) {
            l->oom = true;
            return false;
        }
        if (l->out->n_tensors > 0) {
            memcpy(grow, l->out->tensors, l->out->n_tensors * sizeof(*grow));
        }
        l->out->tensors = grow;
        l->cap          = cap;
    }
    info      = arena_alloc(l->arena, sizeof(*info));
    dev_pb    = arena_alloc(l->arena, sizeof(*dev_pb));
    name_copy = arena_alloc(l->arena, strlen(name) + 1);
    shape     = arena_alloc(l->arena, (tn->ndim + 1) * sizeof(*shape));
    if (info == NULL || dev_pb == NULL || name_copy == NULL || shape == NULL) {
        l->oom = true;
        return false;
    }
    memcpy(name_copy, name, strlen(name) + 1);
    memcpy(shape, tn->shape, tn->ndim * sizeof(*shape));
    tensor_info(info, dev_pb, l->dev, name_copy, tn);
    info->shape = shape;
    if (l->paged) {
        /* Its field in the reply: the message, a tag and a length of up to 5 bytes. The
         * first always goes (one is far below any message limit). */
        bytes = protobuf_c_message_get_packed_size(&info->base) + 6;
        if (bytes > l->budget && l->out->n_tensors > 0) {
            return false;
        }
        l->budget = bytes < l->budget ? l->budget - bytes : 0;
    }
    l->out->tensors[l->out->n_tensors++] = info;
    return true;
}

static void
list_one(void *arg, const char *name, const struct tensor *tn)
{
    (void)list_add(arg, name, tn);
}

void
tensors_list(struct tensors *t, const Devcoord__V1__ListTensorsRequest *in,
             Devcoord__V1__ListTensorsResponse_Closure closure, void *cd)
{
    Devcoord__V1__ListTensorsResponse out = DEVCOORD__V1__LIST_TENSORS_RESPONSE__INIT;
    struct list_ctx l                     = { .out = &out };
    bool more                             = false;
    dc_device dev;
    dc_status st;
    dc_code code;

    status_clear(&st);
    if (device_from_pb(in->device, &dev, &st) != DC_OK) {
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    if ((l.arena = arena_new(ARENA_OWN_BUDGET)) == NULL) {
        status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory");
        fail(cd, (ProtobufCClosure)closure, &st);
        return;
    }
    l.dev = &dev;
    if (in->page_size > 0) {
        l.paged  = true;
        l.budget = t->chunk;
        code     = executor_list_page(t->ex, &dev, in->after != NULL ? in->after : "",
                                  in->page_size < LIST_PAGE_MAX ? in->page_size : LIST_PAGE_MAX,
                                      list_add, &l, &more, &st);
    } else {
        code = executor_list(t->ex, &dev, list_one, &l, &st);
    }
    if (code != DC_OK) {
        fail(cd, (ProtobufCClosure)closure, &st);
    } else if (l.oom) {
        status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory listing tensors");
        fail(cd, (ProtobufCClosure)closure, &st);
    } else {
        out.more = more;
        closure(&out, cd);
    }
    arena_free(l.arena);
}
