/*
 * The tensor methods of the Worker service: chunked uploads (PutTensor), chunked reads
 * (GetTensor), DeleteTensor and ListTensors over the executor. An upload's chunks come in
 * order and fill a tensor nobody sees until its last byte lands; then it replaces the old
 * one. Uploads idle for a minute are dropped. A tensor is at most max_tensor_bytes, and the
 * uploads in progress together at most twice that.
 */
#ifndef DEVCOORD_WORKER_TENSORS_H
#define DEVCOORD_WORKER_TENSORS_H

#include "devcoord/v1/devcoord.pb-c.h"
#include "executor.h"

#define UPLOADS_MAX    256
#define UPLOAD_IDLE_MS 60000

struct tensors;

struct tensors *tensors_new(struct executor *ex, size_t max_message_bytes,
                            uint64_t max_tensor_bytes);
void tensors_free(struct tensors *t);
/* For tests: how long an upload may be left idle before it is dropped (UPLOAD_IDLE_MS). */
void tensors_set_upload_idle_ms(struct tensors *t, uint64_t ms);

void tensors_put(struct tensors *t, const Devcoord__V1__PutTensorRequest *in,
                 Devcoord__V1__PutTensorResponse_Closure closure, void *cd);
void tensors_get(struct tensors *t, const Devcoord__V1__GetTensorRequest *in,
                 Devcoord__V1__GetTensorResponse_Closure closure, void *cd);
void tensors_delete(struct tensors *t, const Devcoord__V1__DeleteTensorRequest *in,
                    Devcoord__V1__DeleteTensorResponse_Closure closure, void *cd);
void tensors_list(struct tensors *t, const Devcoord__V1__ListTensorsRequest *in,
                  Devcoord__V1__ListTensorsResponse_Closure closure, void *cd);

#endif
