/* The Coordinator service: one handler per RPC method of design §6. Registry methods answer
 * at once; SubmitOp hands the call to the ops module, which answers when the op ends. */
#include <string.h>

#include "arena.h"
#include "auth.h"
#include "calllink.h"
#include "coordinator.h"
#include "log.h"
#include "groupsvc.h"
#include "ha.h"
#include "ops.h"
#include "status.h"

#define COORD(svc) ((struct coordinator *)(void *)(svc))

/* Responses are built in an arena freed once the closure has packed them. */

static struct arena *
response_arena(void *cd, ProtobufCClosure closure)
{
    struct arena *a = arena_new(ARENA_OWN_BUDGET);

    if (a == NULL) {
        status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "out of memory");
        closure(NULL, cd);
    }
    return a;
}

static void
answer_error(void *cd, ProtobufCClosure closure, dc_code code, const dc_status *st)
{
    dc_status *out = rpc_call_status(cd);
    *out           = *st;
    out->code      = code;
    closure(NULL, cd);
}

static void
c_register_worker(Devcoord__V1__Coordinator_Service *svc,
                  const Devcoord__V1__RegisterWorkerRequest *in,
                  Devcoord__V1__RegisterWorkerResponse_Closure closure, void *cd)
{
    struct coordinator *c                    = COORD(svc);
    Devcoord__V1__RegisterWorkerResponse out = DEVCOORD__V1__REGISTER_WORKER_RESPONSE__INIT;
    struct registry_session session;
    dc_status st;
    dc_code code;

    status_clear(&st);
    /* A worker token names the workers it may be. The refusal does not list them: that
     * would tell a stolen token's holder which workers to try. */
    if (c->auth != NULL && !auth_current_worker_may_be(c->auth, rpc_call_token(cd), in->name)) {
        code = status_set(&st, DC_PERMISSION_DENIED, "this token may not register worker %.64s",
                          in->name);
    } else {
        code = registry_register(c->registry, in, rpc_now_ms(), &session, &st);
    }
    if (code != DC_OK) {
        log_warn("registration of worker '%.64s' refused: %s", in->name, st.message);
        answer_error(cd, (ProtobufCClosure)closure, code, &st);
        return;
    }
    log_info("worker %s registered at %s with %zu devices (epoch %llu)", in->name, in->address,
             in->n_devices, (unsigned long long)session.epoch);
    out.epoch                 = session.epoch;
    out.session_secret.data   = session.secret;
    out.session_secret.len    = sizeof(session.secret);
    out.heartbeat_interval_ms = c->cfg.heartbeat_interval_ms;
    out.dead_after_ms         = c->cfg.dead_after_ms;
    closure(&out, cd);
    memset(session.secret, 0, sizeof(session.secret));
}

static void
c_heartbeat(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__HeartbeatRequest *in,
            Devcoord__V1__HeartbeatResponse_Closure closure, void *cd)
{
    struct coordinator *c               = COORD(svc);
    Devcoord__V1__HeartbeatResponse out = DEVCOORD__V1__HEARTBEAT_RESPONSE__INIT;
    dc_worker_state state;
    dc_status st;
    dc_code code;

    status_clear(&st);
    if ((code = registry_heartbeat(c->registry, in, rpc_now_ms(), &state, &st)) != DC_OK) {
        answer_error(cd, (ProtobufCClosure)closure, code, &st);
        return;
    }
    out.state = (Devcoord__V1__WorkerState)state;
    closure(&out, cd);
}

static void
c_deregister_worker(Devcoord__V1__Coordinator_Service *svc,
                    const Devcoord__V1__DeregisterWorkerRequest *in,
                    Devcoord__V1__DeregisterWorkerResponse_Closure closure, void *cd)
{
    struct coordinator *c                      = COORD(svc);
    Devcoord__V1__DeregisterWorkerResponse out = DEVCOORD__V1__DEREGISTER_WORKER_RESPONSE__INIT;
    dc_status st;
    dc_code code;

    status_clear(&st);
    if ((code = registry_deregister(c->registry, in, &st)) != DC_OK) {
        answer_error(cd, (ProtobufCClosure)closure, code, &st);
        return;
    }
    log_info("worker %s deregistered (epoch %llu)", in->name, (unsigned long long)in->epoch);
    closure(&out, cd);
}

static void
c_list_workers(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__ListWorkersRequest *in,
               Devcoord__V1__ListWorkersResponse_Closure closure, void *cd)
{
    Devcoord__V1__ListWorkersResponse out;
    struct arena *a = response_arena(cd, (ProtobufCClosure)closure);
    dc_status st;
    dc_code code;

    (void)in;
    if (a == NULL) {
        return;
    }
    if ((code = registry_list_workers(COORD(svc)->registry, rpc_now_ms(), a, &out, &st)) != DC_OK) {
        answer_error(cd, (ProtobufCClosure)closure, code, &st);
    } else {
        closure(&out, cd);
    }
    arena_free(a);
}

static void
c_list_devices(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__ListDevicesRequest *in,
               Devcoord__V1__ListDevicesResponse_Closure closure, void *cd)
{
    Devcoord__V1__ListDevicesResponse out;
    struct arena *a = response_arena(cd, (ProtobufCClosure)closure);
    dc_status st;
    dc_code code;

    if (a == NULL) {
        return;
    }
    if ((code = registry_list_devices(COORD(svc)->registry, in, a, &out, &st)) != DC_OK) {
        answer_error(cd, (ProtobufCClosure)closure, code, &st);
    } else {
        closure(&out, cd);
    }
    arena_free(a);
}

static void
c_get_device(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__GetDeviceRequest *in,
             Devcoord__V1__GetDeviceResponse_Closure closure, void *cd)
{
    Devcoord__V1__GetDeviceResponse out = DEVCOORD__V1__GET_DEVICE_RESPONSE__INIT;
    struct arena *a                     = response_arena(cd, (ProtobufCClosure)closure);
    dc_status st;
    dc_code code;

    if (a == NULL) {
        return;
    }
    if ((code = registry_get_device(COORD(svc)->registry, in->name, a, &out.device, &st)) !=
        DC_OK) {
        answer_error(cd, (ProtobufCClosure)closure, code, &st);
    } else {
        closure(&out, cd);
    }
    arena_free(a);
}

static void
set_intent(struct coordinator *c, const char *name, enum registry_intent intent,
           Devcoord__V1__WorkerNameResponse_Closure closure, void *cd)
{
    static const char *const verbs[]     = { "uncordoned", "cordoned", "set draining" };
    Devcoord__V1__WorkerNameResponse out = DEVCOORD__V1__WORKER_NAME_RESPONSE__INIT;
    struct arena *a                      = response_arena(cd, (ProtobufCClosure)closure);
    dc_status st;
    dc_code code;

    if (a == NULL) {
        return;
    }
    code = registry_set_intent(c->registry, name, intent, rpc_now_ms(), a, &out.worker, &st);
    if (code != DC_OK) {
        if (code != DC_NOT_FOUND) { /* a failed save: the operator's answer is not enough */
            log_error("worker %s not %s: %s", name, verbs[intent], st.message);
        }
        answer_error(cd, (ProtobufCClosure)closure, code, &st);
    } else {
        log_info("worker %s %s by an operator", name, verbs[intent]);
        closure(&out, cd);
    }
    arena_free(a);
}

static void
c_cordon_worker(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__WorkerNameRequest *in,
                Devcoord__V1__WorkerNameResponse_Closure closure, void *cd)
{
    set_intent(COORD(svc), in->name, INTENT_CORDON, closure, cd);
}

static void
c_uncordon_worker(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__WorkerNameRequest *in,
                  Devcoord__V1__WorkerNameResponse_Closure closure, void *cd)
{
    set_intent(COORD(svc), in->name, INTENT_NONE, closure, cd);
}

static void
c_drain_worker(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__WorkerNameRequest *in,
               Devcoord__V1__WorkerNameResponse_Closure closure, void *cd)
{
    set_intent(COORD(svc), in->name, INTENT_DRAIN, closure, cd);
}

static void
c_get_cluster_status(Devcoord__V1__Coordinator_Service *svc,
                     const Devcoord__V1__GetClusterStatusRequest *in,
                     Devcoord__V1__GetClusterStatusResponse_Closure closure, void *cd)
{
    Devcoord__V1__GetClusterStatusResponse out;
    struct arena *a = response_arena(cd, (ProtobufCClosure)closure);

    (void)in;
    if (a == NULL) {
        return;
    }
    coordinator_cluster_status(COORD(svc), a, &out);
    closure(&out, cd);
    arena_free(a);
}

void
coordinator_cluster_status(struct coordinator *c, struct arena *a,
                           Devcoord__V1__GetClusterStatusResponse *out)
{
    devcoord__v1__get_cluster_status_response__init(out);
    registry_cluster_status(c->registry, a, out);
    ops_counts(c->ops, &out->ops_in_flight, &out->ops_done, &out->ops_failed);
    out->ready         = atomic_load(&c->ready);
    out->op_timeout_ms = c->cfg.op_timeout_ms;
}

static void
c_submit_op(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__SubmitOpRequest *in,
            Devcoord__V1__SubmitOpResponse_Closure closure, void *cd)
{
    ops_submit(COORD(svc)->ops, in, closure, cd);
}

static void
c_get_op(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__GetOpRequest *in,
         Devcoord__V1__GetOpResponse_Closure closure, void *cd)
{
    ops_get(COORD(svc)->ops, in, closure, cd);
}

static void
c_list_ops(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__ListOpsRequest *in,
           Devcoord__V1__ListOpsResponse_Closure closure, void *cd)
{
    ops_list(COORD(svc)->ops, in, closure, cd);
}

static void
c_group_join(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__GroupJoinRequest *in,
             Devcoord__V1__GroupJoinResponse_Closure closure, void *cd)
{
    groupsvc_join(COORD(svc)->groups, in, closure, cd);
}

static void
c_group_leave(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__GroupLeaveRequest *in,
              Devcoord__V1__GroupLeaveResponse_Closure closure, void *cd)
{
    groupsvc_leave(COORD(svc)->groups, in, closure, cd);
}

static void
c_list_groups(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__ListGroupsRequest *in,
              Devcoord__V1__ListGroupsResponse_Closure closure, void *cd)
{
    groupsvc_list(COORD(svc)->groups, in, closure, cd);
}

/* Where the call link listens (calllink.h), port 0 when there is none. */
static void
c_call_link(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__CallLinkRequest *in,
            Devcoord__V1__CallLinkResponse_Closure closure, void *cd)
{
    Devcoord__V1__CallLinkResponse out = DEVCOORD__V1__CALL_LINK_RESPONSE__INIT;

    (void)in;
    call_link_describe(COORD(svc)->link, &out);
    closure(&out, cd);
}

void
coordinator_service_init(struct coordinator *c)
{
    Devcoord__V1__Coordinator_Service svc = DEVCOORD__V1__COORDINATOR__INIT(c_);
    c->service                            = svc;
}

/* Who may call what (design §8): workers keep their membership, trainers read and submit,
 * operators read and steer; anyone with a token may ask for the cluster's health. */
static const struct auth_rule coordinator_rules[] = {
    { "RegisterWorker", ROLE_WORKER },
    { "Heartbeat", ROLE_WORKER },
    { "DeregisterWorker", ROLE_WORKER },
    { "ListWorkers", ROLE_TRAINER | ROLE_OPERATOR },
    { "ListDevices", ROLE_TRAINER | ROLE_OPERATOR },
    { "GetDevice", ROLE_TRAINER | ROLE_OPERATOR },
    { "SubmitOp", ROLE_TRAINER },
    { "GetOp", ROLE_TRAINER | ROLE_OPERATOR },
    { "ListOps", ROLE_TRAINER | ROLE_OPERATOR },
    { "CordonWorker", ROLE_OPERATOR },
    { "UncordonWorker", ROLE_OPERATOR },
    { "DrainWorker", ROLE_OPERATOR },
    { "GetClusterStatus", ROLE_ANY },
    { "GroupJoin", ROLE_TRAINER },
    { "GroupLeave", ROLE_TRAINER },
    { "ListGroups", ROLE_TRAINER | ROLE_OPERATOR },
    { "CallLink", ROLE_TRAINER },
};

/* The status page shows what these calls answer, so a token sees it only if it may make
 * every one of them: the page shows nobody more than the API would. */
static const char *const status_page_methods[] = { "GetClusterStatus", "ListWorkers", "ListDevices",
                                                   "ListOps" };

dc_code
coordinator_authorize_status_page(struct coordinator *c, const char *token, dc_status *st)
{
    const ProtobufCServiceDescriptor *svc = &devcoord__v1__coordinator__descriptor;

    if (c->auth == NULL) {
        return DC_OK;
    }
    for (size_t i = 0; i < sizeof(status_page_methods) / sizeof(status_page_methods[0]); i++) {
        const ProtobufCMethodDescriptor *m =
            protobuf_c_service_descriptor_get_method_by_name(svc, status_page_methods[i]);
        dc_code code;

        if (m == NULL) {
            return status_set(st, DC_INTERNAL, "no method %s", status_page_methods[i]);
        }
        if ((code = auth_current_check(c->auth, coordinator_rules,
                                       sizeof(coordinator_rules) / sizeof(coordinator_rules[0]), m,
                                       token, st)) != DC_OK) {
            return code;
        }
    }
    return DC_OK;
}

dc_code
coordinator_authorize(void *arg, const ProtobufCMethodDescriptor *method, const char *token,
                      dc_status *st)
{
    struct coordinator *c = arg;
    dc_code code          = DC_OK;

    if (c->auth != NULL &&
        (code = auth_current_check(c->auth, coordinator_rules,
                                   sizeof(coordinator_rules) / sizeof(coordinator_rules[0]), method,
                                   token, st)) != DC_OK) {
        return code;
    }
    /* Only the leader answers (issue 16); a follower names it. */
    return c->ha != NULL ? ha_admit(c->ha, st) : DC_OK;
}
