/* The Worker service (design §6): tensors, Execute, Abort and peer Exchange. */
#include "status.h"
#include "worker.h"

#define UNIMPLEMENTED(fn, Req, Closure)                                                           \
    static void w_##fn(Devcoord__V1__Worker_Service *svc, const Req *in, Closure closure,         \
                       void *cd)                                                                  \
    {                                                                                             \
        (void)svc;                                                                                \
        (void)in;                                                                                 \
        status_set(rpc_call_status(cd), DC_UNIMPLEMENTED, #fn " is not implemented yet");         \
        closure(NULL, cd);                                                                        \
    }

UNIMPLEMENTED(execute, Devcoord__V1__ExecuteRequest, Devcoord__V1__ExecuteResponse_Closure)
UNIMPLEMENTED(abort, Devcoord__V1__AbortRequest, Devcoord__V1__AbortResponse_Closure)
UNIMPLEMENTED(exchange, Devcoord__V1__ExchangeRequest, Devcoord__V1__ExchangeResponse_Closure)
UNIMPLEMENTED(put_tensor, Devcoord__V1__PutTensorRequest, Devcoord__V1__PutTensorResponse_Closure)
UNIMPLEMENTED(get_tensor, Devcoord__V1__GetTensorRequest, Devcoord__V1__GetTensorResponse_Closure)
UNIMPLEMENTED(delete_tensor, Devcoord__V1__DeleteTensorRequest,
              Devcoord__V1__DeleteTensorResponse_Closure)
UNIMPLEMENTED(list_tensors, Devcoord__V1__ListTensorsRequest,
              Devcoord__V1__ListTensorsResponse_Closure)

void
worker_service_init(struct worker *w)
{
    Devcoord__V1__Worker_Service svc = DEVCOORD__V1__WORKER__INIT(w_);
    w->service                       = svc;
}
