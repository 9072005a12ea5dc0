/*
 * Stubs for a test's fake servers: Worker service handlers that answer UNIMPLEMENTED (a fake
 * worker that serves a few methods starts from DEVCOORD__V1__WORKER__INIT(unimpl_) and sets
 * those it serves), and an authorizer that lets every call in.
 */
#ifndef DEVCOORD_TESTS_WORKER_STUBS_H
#define DEVCOORD_TESTS_WORKER_STUBS_H

#include "devcoord/v1/devcoord.pb-c.h"
#include "rpc.h"
#include "status.h"

#define WORKER_STUB(name, Req, Closure)                                                        \
    static void unimpl_##name(Devcoord__V1__Worker_Service *s, const Req *in, Closure closure, \
                              void *cd)                                                        \
    {                                                                                          \
        (void)s;                                                                               \
        (void)in;                                                                              \
        status_set(rpc_call_status(cd), DC_UNIMPLEMENTED, "not in this test");                 \
        closure(NULL, cd);                                                                     \
    }
WORKER_STUB(execute, Devcoord__V1__ExecuteRequest, Devcoord__V1__ExecuteResponse_Closure)
WORKER_STUB(abort, Devcoord__V1__AbortRequest, Devcoord__V1__AbortResponse_Closure)
WORKER_STUB(commit, Devcoord__V1__CommitRequest, Devcoord__V1__CommitResponse_Closure)
WORKER_STUB(exchange, Devcoord__V1__ExchangeRequest, Devcoord__V1__ExchangeResponse_Closure)
WORKER_STUB(put_tensor, Devcoord__V1__PutTensorRequest, Devcoord__V1__PutTensorResponse_Closure)
WORKER_STUB(get_tensor, Devcoord__V1__GetTensorRequest, Devcoord__V1__GetTensorResponse_Closure)
WORKER_STUB(delete_tensor, Devcoord__V1__DeleteTensorRequest,
            Devcoord__V1__DeleteTensorResponse_Closure)
WORKER_STUB(list_tensors, Devcoord__V1__ListTensorsRequest,
            Devcoord__V1__ListTensorsResponse_Closure)
WORKER_STUB(group_setup, Devcoord__V1__GroupSetupRequest, Devcoord__V1__GroupSetupResponse_Closure)
WORKER_STUB(group_call, Devcoord__V1__GroupCallRequest, Devcoord__V1__GroupCallResponse_Closure)
WORKER_STUB(group_exchange, Devcoord__V1__GroupExchangeRequest,
            Devcoord__V1__GroupExchangeResponse_Closure)
WORKER_STUB(group_status, Devcoord__V1__GroupStatusRequest,
            Devcoord__V1__GroupStatusResponse_Closure)
WORKER_STUB(group_map, Devcoord__V1__GroupMapRequest, Devcoord__V1__GroupMapResponse_Closure)
WORKER_STUB(group_link, Devcoord__V1__GroupLinkRequest, Devcoord__V1__GroupLinkResponse_Closure)
WORKER_STUB(group_call_link, Devcoord__V1__GroupLinkRequest,
            Devcoord__V1__GroupLinkResponse_Closure)
WORKER_STUB(group_end, Devcoord__V1__GroupEndRequest, Devcoord__V1__GroupEndResponse_Closure)
#undef WORKER_STUB

static inline dc_code
stub_allow_all(void *arg, const ProtobufCMethodDescriptor *method, const char *token, dc_status *st)
{
    (void)arg;
    (void)method;
    (void)token;
    (void)st;
    return DC_OK;
}

#endif
