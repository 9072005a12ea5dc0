/*
 * The worker's data plane as the worker serves it: frames decoded with rpc_request_open /
 * rpc_request_body for the Worker service; PutTensor, GetTensor, DeleteTensor and
 * ListTensors run through the real handlers (server/worker/tensors.c) over a host executor
 * with two devices, cpu:0 and cuda:1; Exchange, Execute and Abort are decoded and read only
 * (their handlers need an op running, with threads and peers).
 *
 * Input: frames, each after its length as a big-endian u32 (the last may run to the end),
 * so one input can upload a tensor in chunks and read it back. Every input starts from an
 * empty worker.
 *
 * The handlers get a call of ours instead of a server's: rpc_call_attachment,
 * rpc_call_status and rpc_call_set_reply_attachment are redirected here at link time
 * (-Wl,--wrap, see CMakeLists.txt), so the handlers' object code is the worker's own.
 *
 * Besides the sanitizers, the target checks what a client relies on: every call is
 * answered exactly once, a reply has the method's type and fits a frame, and an upload is
 * complete only when every byte of it has been written. The worker's tensor limit
 * (limits.max_tensor_bytes) is UPLOAD_BYTES_MAX here: bigger tensors find nothing smaller
 * ones do not, and the worker refuses them before allocating anything.
 */
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "fuzz.h"
#include "rpc.h"
#include "tensors.h"
#include "wire.h"

#define FRAMES_MAX       64
#define UPLOAD_BYTES_MAX ((size_t)1 << 20)

struct rpc_call {
    const ProtobufCMethodDescriptor *method;
    const ProtobufCMessage *in;
    const uint8_t *attachment;
    size_t attachment_len;
    dc_status status;
    const void *reply_att;
    size_t reply_att_len;
    unsigned answers;
};

/* The link-time seam: tensors.o calls these in place of rpc_server.c's. */
const void *__wrap_rpc_call_attachment(struct rpc_call *call, size_t *len);
dc_status *__wrap_rpc_call_status(struct rpc_call *call);
void __wrap_rpc_call_set_reply_attachment(struct rpc_call *call, const void *data, size_t len);

const void *
__wrap_rpc_call_attachment(struct rpc_call *call, size_t *len)
{
    *len = call->attachment_len;
    return call->attachment;
}

dc_status *
__wrap_rpc_call_status(struct rpc_call *call)
{
    return &call->status;
}

void
__wrap_rpc_call_set_reply_attachment(struct rpc_call *call, const void *data, size_t len)
{
    call->reply_att     = data;
    call->reply_att_len = len;
}

/* What the target knows of the uploads in progress: which bytes their chunks covered. */
struct model_upload {
    uint64_t id;
    size_t bytes;
    uint8_t *written; /* one bit per byte */
};

static struct model_upload model[FRAMES_MAX];
static size_t n_model;

static void
model_drop(size_t i)
{
    free(model[i].written);
    model[i] = model[--n_model];
}

static void
model_reset(void)
{
    while (n_model > 0) {
        model_drop(0);
    }
}

/* A chunk the worker accepted: mark its bytes; once the worker calls the upload complete,
 * every byte must have been written, or GetTensor would serve heap memory nobody sent. */
static void
model_put(const Devcoord__V1__PutTensorRequest *in, size_t len,
          const Devcoord__V1__PutTensorResponse *out)
{
    struct model_upload *u = NULL;
    size_t elements, bytes;

    if (!tensor_size((dc_dtype)in->dtype, in->shape, in->n_shape, &elements, &bytes)) {
        return;
    }
    for (size_t i = 0; i < n_model && u == NULL; i++) {
        if (model[i].id == in->upload_id) {
            u = &model[i];
        }
    }
    if (u != NULL && u->bytes != bytes) {
        /* The worker started this id afresh (its old upload ended in an error). */
        free(u->written);
        u->written = NULL;
    } else if (u == NULL && n_model < FRAMES_MAX) {
        u = &model[n_model++];
        memset(u, 0, sizeof(*u));
    }
    if (u == NULL) {
        return;
    }
    if (u->written == NULL) {
        u->id    = in->upload_id;
        u->bytes = bytes;
        if ((u->written = calloc(bytes / 8 + 1, 1)) == NULL) {
            model_drop((size_t)(u - model));
            return;
        }
    }
    for (size_t b = (size_t)in->offset; b < in->offset + len; b++) {
        u->written[b / 8] |= (uint8_t)(1u << (b % 8));
    }
    if (!out->complete) {
        return;
    }
    for (size_t b = 0; b < bytes; b++) {
        if ((u->written[b / 8] & (1u << (b % 8))) == 0) {
            fuzz_finding("upload %llu of %zu bytes complete (received_bytes %llu) but byte %zu "
                         "was never sent",
                         (unsigned long long)in->upload_id, bytes,
                         (unsigned long long)out->received_bytes, b);
        }
    }
    model_drop((size_t)(u - model));
}

/* The closure every handler answers through: as rpc_call_answer, packs the reply. */
static void
answer(const ProtobufCMessage *body, struct rpc_call *call)
{
    Devcoord__V1__ReplyHeader hdr = DEVCOORD__V1__REPLY_HEADER__INIT;
    Devcoord__V1__Status status   = DEVCOORD__V1__STATUS__INIT;
    nng_msg *reply;
    int rv;

    if (++call->answers > 1) {
        fuzz_finding("%s answered twice", call->method->name);
    }
    fuzz_check_status(&call->status);
    if (body == NULL) {
        if (call->status.code == DC_OK) {
            fuzz_finding("%s answered without a reply or an error", call->method->name);
        }
        return;
    }
    if (body->descriptor != call->method->output) {
        fuzz_finding("%s answered with a %s", call->method->name, body->descriptor->name);
    }
    fuzz_walk_message(body);
    status.code    = (Devcoord__V1__Code)call->status.code;
    status.message = call->status.message;
    status.worker  = call->status.worker;
    hdr.status     = &status;
    rv             = wire_pack(&reply, &hdr.base, body, call->reply_att, call->reply_att_len,
                               RPC_DEFAULT_MAX_MESSAGE + RPC_FRAME_OVERHEAD);
    if (rv == 0) {
        nng_msg_free(reply);
    } else if (body->descriptor == &devcoord__v1__get_tensor_response__descriptor) {
        fuzz_finding("a GetTensor reply of %zu bytes does not fit a frame", call->reply_att_len);
    }
    if (call->status.code == DC_OK &&
        body->descriptor == &devcoord__v1__put_tensor_response__descriptor) {
        model_put((const Devcoord__V1__PutTensorRequest *)call->in, call->attachment_len,
                  (const Devcoord__V1__PutTensorResponse *)body);
    }
}

static void
put_answer(const Devcoord__V1__PutTensorResponse *out, void *cd)
{
    answer(out != NULL ? &out->base : NULL, cd);
}

static void
get_answer(const Devcoord__V1__GetTensorResponse *out, void *cd)
{
    answer(out != NULL ? &out->base : NULL, cd);
}

static void
delete_answer(const Devcoord__V1__DeleteTensorResponse *out, void *cd)
{
    answer(out != NULL ? &out->base : NULL, cd);
}

static void
list_answer(const Devcoord__V1__ListTensorsResponse *out, void *cd)
{
    answer(out != NULL ? &out->base : NULL, cd);
}

static void
serve(struct tensors *t, const uint8_t *frame, size_t len)
{
    const ProtobufCServiceDescriptor *svc = &devcoord__v1__worker__descriptor;
    const ProtobufCMessageDescriptor *d;
    struct rpc_call call;
    struct rpc_request r;

    memset(&call, 0, sizeof(call));
    status_clear(&call.status);
    if (rpc_request_open(frame, len, svc, &r, &call.status) != DC_OK ||
        rpc_request_body(&r, &call.status) != DC_OK) {
        fuzz_check_status(&call.status);
        goto out;
    }
    fuzz_walk_message(&r.header->base);
    if (fuzz_walk_message(r.input) == 0) {
        fuzz_check_repack(r.input);
    }
    call.method         = r.method;
    call.in             = r.input;
    call.attachment     = r.frame.attachment;
    call.attachment_len = r.frame.attachment_len;
    d                   = r.input->descriptor;
    if (d == &devcoord__v1__put_tensor_request__descriptor) {
        tensors_put(t, (const Devcoord__V1__PutTensorRequest *)r.input, put_answer, &call);
    } else if (d == &devcoord__v1__get_tensor_request__descriptor) {
        tensors_get(t, (const Devcoord__V1__GetTensorRequest *)r.input, get_answer, &call);
    } else if (d == &devcoord__v1__delete_tensor_request__descriptor) {
        tensors_delete(t, (const Devcoord__V1__DeleteTensorRequest *)r.input, delete_answer, &call);
    } else if (d == &devcoord__v1__list_tensors_request__descriptor) {
        tensors_list(t, (const Devcoord__V1__ListTensorsRequest *)r.input, list_answer, &call);
    } else {
        goto out;
    }
    if (call.answers != 1) {
        fuzz_finding("%s returned without answering", r.method->name);
    }
out:
    rpc_request_close(&r);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const dc_device devices[] = { { .backend = DC_BACKEND_CPU, .index = 0 },
                                         { .backend = DC_BACKEND_CUDA, .index = 1 } };
    struct executor *ex              = executor_new("host", devices, 2);
    struct tensors *t =
        ex != NULL ? tensors_new(ex, RPC_DEFAULT_MAX_MESSAGE, UPLOAD_BYTES_MAX) : NULL;

    for (unsigned i = 0; t != NULL && i < FRAMES_MAX && size >= 4; i++) {
        size_t n =
            ((size_t)data[0] << 24) | ((size_t)data[1] << 16) | ((size_t)data[2] << 8) | data[3];
        uint8_t *frame;

        data += 4;
        size -= 4;
        n = n < size ? n : size;
        /* A buffer of its own, so a read past the frame shows. */
        if ((frame = malloc(n ? n : 1)) == NULL) {
            break;
        }
        memcpy(frame, data, n);
        serve(t, frame, n);
        free(frame);
        data += n;
        size -= n;
    }
    model_reset();
    tensors_free(t);
    executor_free(ex);
    return 0;
}
