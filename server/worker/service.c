/* The Worker service (design §6): tensors for clients, Execute, Commit and Abort for the
 * coordinator, Exchange for peers. */
#include "auth.h"
#include "collective.h"
#include "groups.h"
#include "tensors.h"
#include "worker.h"

#define WORKER(svc) ((struct worker *)(void *)(svc))

/* Fencing (issue 16): whether an order of coordinator term `term` may run; answers the
 * call FAILED_PRECONDITION when not. The newest term seen only grows. A term-0 order (a
 * lone coordinator) after a term was seen is refused too: it cannot be the leader's. */
static bool
term_admits(struct worker *w, uint64_t term, ProtobufCClosure closure, void *cd)
{
    unsigned long long seen = atomic_load(&w->max_term);

    while (term > seen && !atomic_compare_exchange_weak(&w->max_term, &seen, term)) {
    }
    if (term >= seen) {
        return true;
    }
    status_set(rpc_call_status(cd), DC_FAILED_PRECONDITION,
               "order from an older coordinator term %llu < %llu", (unsigned long long)term,
               (unsigned long long)seen);
    closure(NULL, cd);
    return false;
}

static void
w_execute(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__ExecuteRequest *in,
          Devcoord__V1__ExecuteResponse_Closure closure, void *cd)
{
    if (!term_admits(WORKER(svc), in->term, (ProtobufCClosure)closure, cd)) {
        return;
    }
    collectives_execute(WORKER(svc)->collectives, in, closure, cd);
}

static void
w_abort(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__AbortRequest *in,
        Devcoord__V1__AbortResponse_Closure closure, void *cd)
{
    collectives_abort(WORKER(svc)->collectives, in, closure, cd);
}

static void
w_commit(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__CommitRequest *in,
         Devcoord__V1__CommitResponse_Closure closure, void *cd)
{
    if (!term_admits(WORKER(svc), in->term, (ProtobufCClosure)closure, cd)) {
        return;
    }
    collectives_commit(WORKER(svc)->collectives, in, closure, cd);
}

static void
w_exchange(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__ExchangeRequest *in,
           Devcoord__V1__ExchangeResponse_Closure closure, void *cd)
{
    collectives_exchange(WORKER(svc)->collectives, in, closure, cd);
}

static void
w_put_tensor(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__PutTensorRequest *in,
             Devcoord__V1__PutTensorResponse_Closure closure, void *cd)
{
    tensors_put(WORKER(svc)->tensors, in, closure, cd);
}

static void
w_get_tensor(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__GetTensorRequest *in,
             Devcoord__V1__GetTensorResponse_Closure closure, void *cd)
{
    tensors_get(WORKER(svc)->tensors, in, closure, cd);
}

static void
w_delete_tensor(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__DeleteTensorRequest *in,
                Devcoord__V1__DeleteTensorResponse_Closure closure, void *cd)
{
    tensors_delete(WORKER(svc)->tensors, in, closure, cd);
}

static void
w_list_tensors(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__ListTensorsRequest *in,
               Devcoord__V1__ListTensorsResponse_Closure closure, void *cd)
{
    tensors_list(WORKER(svc)->tensors, in, closure, cd);
}

static void
w_group_setup(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__GroupSetupRequest *in,
              Devcoord__V1__GroupSetupResponse_Closure closure, void *cd)
{
    if (!term_admits(WORKER(svc), in->term, (ProtobufCClosure)closure, cd)) {
        return;
    }
    wgroups_setup(WORKER(svc)->groups, in, closure, cd);
}

static void
w_group_call(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__GroupCallRequest *in,
             Devcoord__V1__GroupCallResponse_Closure closure, void *cd)
{
    wgroups_call(WORKER(svc)->groups, in, closure, cd);
}

static void
w_group_exchange(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__GroupExchangeRequest *in,
                 Devcoord__V1__GroupExchangeResponse_Closure closure, void *cd)
{
    wgroups_exchange(WORKER(svc)->groups, in, closure, cd);
}

static void
w_group_status(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__GroupStatusRequest *in,
               Devcoord__V1__GroupStatusResponse_Closure closure, void *cd)
{
    wgroups_status(WORKER(svc)->groups, in, closure, cd);
}

static void
w_group_map(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__GroupMapRequest *in,
            Devcoord__V1__GroupMapResponse_Closure closure, void *cd)
{
    wgroups_map(WORKER(svc)->groups, in, closure, cd);
}

static void
w_group_link(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__GroupLinkRequest *in,
             Devcoord__V1__GroupLinkResponse_Closure closure, void *cd)
{
    wgroups_link(WORKER(svc)->groups, in, closure, cd);
}

static void
w_group_call_link(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__GroupLinkRequest *in,
                  Devcoord__V1__GroupLinkResponse_Closure closure, void *cd)
{
    wgroups_call_link(WORKER(svc)->groups, in, closure, cd);
}

static void
w_group_end(Devcoord__V1__Worker_Service *svc, const Devcoord__V1__GroupEndRequest *in,
            Devcoord__V1__GroupEndResponse_Closure closure, void *cd)
{
    wgroups_end(WORKER(svc)->groups, in, closure, cd);
}

void
worker_service_init(struct worker *w)
{
    Devcoord__V1__Worker_Service svc = DEVCOORD__V1__WORKER__INIT(w_);
    w->service                       = svc;
}

static const struct auth_rule worker_rules[] = {
    { "Execute", ROLE_WORKER },        { "Abort", ROLE_WORKER },
    { "Commit", ROLE_WORKER },         { "Exchange", ROLE_WORKER },
    { "PutTensor", ROLE_TRAINER },     { "GetTensor", ROLE_TRAINER | ROLE_OPERATOR },
    { "DeleteTensor", ROLE_TRAINER },  { "ListTensors", ROLE_TRAINER | ROLE_OPERATOR },
    { "GroupSetup", ROLE_WORKER },     { "GroupCall", ROLE_TRAINER },
    { "GroupExchange", ROLE_WORKER },  { "GroupStatus", ROLE_TRAINER | ROLE_OPERATOR },
    { "GroupMap", ROLE_TRAINER },      { "GroupLink", ROLE_WORKER },
    { "GroupCallLink", ROLE_TRAINER }, { "GroupEnd", ROLE_WORKER },
};

dc_code
worker_authorize(void *arg, const ProtobufCMethodDescriptor *method, const char *token,
                 dc_status *st)
{
    struct worker *w = arg;

    return auth_current_check(w->auth, worker_rules, sizeof(worker_rules) / sizeof(worker_rules[0]),
                              method, token, st);
}
