#include "ops.h"

#include <stdlib.h>

#include "rpc.h"

struct ops {
    struct registry *registry;
};

struct ops *
ops_new(struct registry *registry, const struct config_coordinator *cfg)
{
    struct ops *o = calloc(1, sizeof(*o));
    (void)cfg;
    if (o != NULL) {
        o->registry = registry;
    }
    return o;
}

void
ops_shutdown(struct ops *o)
{
    (void)o;
}

void
ops_free(struct ops *o)
{
    free(o);
}

void
ops_submit(struct ops *o, const Devcoord__V1__SubmitOpRequest *in,
           Devcoord__V1__SubmitOpResponse_Closure closure, void *cd)
{
    (void)o;
    (void)in;
    status_set(rpc_call_status(cd), DC_UNIMPLEMENTED, "SubmitOp");
    closure(NULL, cd);
}

void
ops_get(struct ops *o, const Devcoord__V1__GetOpRequest *in,
        Devcoord__V1__GetOpResponse_Closure closure, void *cd)
{
    (void)o;
    (void)in;
    status_set(rpc_call_status(cd), DC_UNIMPLEMENTED, "GetOp");
    closure(NULL, cd);
}

void
ops_list(struct ops *o, const Devcoord__V1__ListOpsRequest *in,
         Devcoord__V1__ListOpsResponse_Closure closure, void *cd)
{
    (void)o;
    (void)in;
    status_set(rpc_call_status(cd), DC_UNIMPLEMENTED, "ListOps");
    closure(NULL, cd);
}

void
ops_counts(struct ops *o, uint64_t *in_flight, uint64_t *done, uint64_t *failed)
{
    (void)o;
    *in_flight = *done = *failed = 0;
}

void
ops_worker_gone(struct ops *o, const char *name, uint64_t epoch, enum registry_gone why)
{
    (void)o;
    (void)name;
    (void)epoch;
    (void)why;
}
