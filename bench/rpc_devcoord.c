/*
 * devcoord's RPC layer (common/rpc.h) as bench_rpc measures it: a server of the Coordinator
 * service whose GetDevice echoes the request's attachment back (every other method answers
 * UNIMPLEMENTED), and a client that calls it from N threads over one rpc_client.
 *
 *   rpc_devcoord serve URL
 *   rpc_devcoord client URL THREADS PAYLOAD_BYTES SECONDS WARMUP_SECONDS
 *
 * serve runs until SIGTERM/SIGINT; client prints load.h's result line.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "devcoord/v1/methods.h"
#include "load.h"
#include "rpc.h"

#define SVC (&devcoord__v1__coordinator__descriptor)

static const char usage[] = "usage: rpc_devcoord serve URL\n"
                            "       rpc_devcoord client URL THREADS PAYLOAD SECONDS WARMUP\n";

/* ---- server ------------------------------------------------------------------------------ */

static void
s_unimplemented(void *cd)
{
    status_set(rpc_call_status(cd), DC_UNIMPLEMENTED, "not served by the bench");
}

#define UNIMPL(name, Req, Closure)                                                               \
    static void s_##name(Devcoord__V1__Coordinator_Service *svc, const Req *in, Closure closure, \
                         void *cd)                                                               \
    {                                                                                            \
        (void)svc;                                                                               \
        (void)in;                                                                                \
        s_unimplemented(cd);                                                                     \
        closure(NULL, cd);                                                                       \
    }

UNIMPL(register_worker, Devcoord__V1__RegisterWorkerRequest,
       Devcoord__V1__RegisterWorkerResponse_Closure)
UNIMPL(heartbeat, Devcoord__V1__HeartbeatRequest, Devcoord__V1__HeartbeatResponse_Closure)
UNIMPL(deregister_worker, Devcoord__V1__DeregisterWorkerRequest,
       Devcoord__V1__DeregisterWorkerResponse_Closure)
UNIMPL(list_workers, Devcoord__V1__ListWorkersRequest, Devcoord__V1__ListWorkersResponse_Closure)
UNIMPL(list_devices, Devcoord__V1__ListDevicesRequest, Devcoord__V1__ListDevicesResponse_Closure)
UNIMPL(submit_op, Devcoord__V1__SubmitOpRequest, Devcoord__V1__SubmitOpResponse_Closure)
UNIMPL(get_op, Devcoord__V1__GetOpRequest, Devcoord__V1__GetOpResponse_Closure)
UNIMPL(list_ops, Devcoord__V1__ListOpsRequest, Devcoord__V1__ListOpsResponse_Closure)
UNIMPL(cordon_worker, Devcoord__V1__WorkerNameRequest, Devcoord__V1__WorkerNameResponse_Closure)
UNIMPL(uncordon_worker, Devcoord__V1__WorkerNameRequest, Devcoord__V1__WorkerNameResponse_Closure)
UNIMPL(drain_worker, Devcoord__V1__WorkerNameRequest, Devcoord__V1__WorkerNameResponse_Closure)
UNIMPL(get_cluster_status, Devcoord__V1__GetClusterStatusRequest,
       Devcoord__V1__GetClusterStatusResponse_Closure)
UNIMPL(group_join, Devcoord__V1__GroupJoinRequest, Devcoord__V1__GroupJoinResponse_Closure)
UNIMPL(group_leave, Devcoord__V1__GroupLeaveRequest, Devcoord__V1__GroupLeaveResponse_Closure)
UNIMPL(list_groups, Devcoord__V1__ListGroupsRequest, Devcoord__V1__ListGroupsResponse_Closure)
UNIMPL(call_link, Devcoord__V1__CallLinkRequest, Devcoord__V1__CallLinkResponse_Closure)

/* The cheap method: the name back in a DeviceInfo, the attachment back as the reply's. */
static void
s_get_device(Devcoord__V1__Coordinator_Service *svc, const Devcoord__V1__GetDeviceRequest *in,
             Devcoord__V1__GetDeviceResponse_Closure closure, void *cd)
{
    Devcoord__V1__GetDeviceResponse resp = DEVCOORD__V1__GET_DEVICE_RESPONSE__INIT;
    Devcoord__V1__DeviceInfo info        = DEVCOORD__V1__DEVICE_INFO__INIT;
    size_t len;
    const void *att = rpc_call_attachment(cd, &len);

    (void)svc;
    info.name   = in->name;
    resp.device = &info;
    rpc_call_set_reply_attachment(cd, att, len);
    closure(&resp, cd);
}

static Devcoord__V1__Coordinator_Service echo_service = DEVCOORD__V1__COORDINATOR__INIT(s_);

static int
serve(const char *url)
{
    /* As devcoord-server configures its server (server/coordinator/main.c), where GetDevice
     * is one of the cheap methods answered on nng's callback thread. */
    static const char *const inline_methods[] = { "GetDevice", NULL };
    struct rpc_server_opts so                 = {
                        .url = url, .service = &echo_service.base, .threads = 2, .inline_methods = inline_methods
    };
    struct rpc_server *server;
    dc_status st;
    sigset_t set;
    int sig;

    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    if (rpc_server_start(&so, &server, &st) != DC_OK) {
        fprintf(stderr, "rpc_devcoord: %s\n", st.message);
        return 1;
    }
    sigwait(&set, &sig);
    rpc_server_close(server);
    rpc_server_free(server);
    return 0;
}

/* ---- client ------------------------------------------------------------------------------ */

struct client {
    struct rpc_client *rpc;
    const uint8_t *payload;
    size_t len;
};

static void *
c_thread_init(void *arg, unsigned index)
{
    (void)index;
    return arg;
}

static int
c_call(void *state)
{
    struct client *c                   = state;
    Devcoord__V1__GetDeviceRequest req = DEVCOORD__V1__GET_DEVICE_REQUEST__INIT;
    struct rpc_reply reply;
    dc_status st;
    dc_code code;

    req.name = "bench/cpu:0";
    code     = rpc_call(c->rpc, SVC, M_COORDINATOR_GET_DEVICE, &req.base, c->payload, c->len, 10000,
                        &reply, &st);
    if (code == DC_OK && reply.attachment_len != c->len) {
        code = DC_DATA_LOSS;
    }
    rpc_reply_free(&reply);
    return code == DC_OK ? 0 : -1;
}

static int
client(char **argv)
{
    struct rpc_client_opts co = { .url = argv[0], .connect_now = true };
    struct load_opts lo       = { 0 };
    struct load_result r;
    struct client c = { 0 };
    uint64_t threads, len;
    uint8_t *payload;
    dc_status st;
    int rv;

    if (bench_parse_u64(argv[1], 1, 4096, "THREADS", &threads) != 0 ||
        bench_parse_u64(argv[2], 0, 1u << 30, "PAYLOAD", &len) != 0 ||
        bench_parse_double(argv[3], "SECONDS", &lo.duration_s) != 0 ||
        bench_parse_double(argv[4], "WARMUP", &lo.warmup_s) != 0) {
        return 2;
    }
    if ((payload = malloc(len ? len : 1)) == NULL) {
        return 1;
    }
    memset(payload, 0xa5, len);
    if (rpc_client_open(&co, &c.rpc, &st) != DC_OK) {
        fprintf(stderr, "rpc_devcoord: %s\n", st.message);
        free(payload);
        return 1;
    }
    c.payload      = payload;
    c.len          = len;
    lo.threads     = (unsigned)threads;
    lo.thread_init = c_thread_init;
    lo.call        = c_call;
    lo.arg         = &c;
    rv             = load_run(&lo, &r);
    load_print(stdout, &r);
    rpc_client_close(c.rpc);
    free(payload);
    return rv == 0 ? 0 : 1;
}

int
main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "serve") == 0) {
        return serve(argv[2]);
    }
    if (argc == 7 && strcmp(argv[1], "client") == 0) {
        return client(argv + 2);
    }
    fprintf(stderr, "%s", usage);
    return 2;
}
