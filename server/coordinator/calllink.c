/* The coordinator's call link (see calllink.h). */
#include "calllink.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "address.h"
#include "auth.h"
#include "config.h"
#include "datalink.h"
#include "devcoord/v1/methods.h"
#include "log.h"

/* What the client sends on the link: its SubmitOps, and the CallLink that checks a new one.
 * Anything else (a GroupJoin, which is tied to its RPC connection's end) goes as an RPC. */
#define LINK_METHODS \
    (RPC_METHOD_BIT(M_COORDINATOR_SUBMIT_OP) | RPC_METHOD_BIT(M_COORDINATOR_CALL_LINK))

struct call_link {
    struct dlink_server *dl;
    _Atomic(struct rpc_server *) rpc;
    atomic_uint_fast64_t calls;
};

/* A frame: served on this connection's thread when its method runs inline (a small SubmitOp
 * does), else by the server threads while this one waits for the answer; a method not in
 * LINK_METHODS is answered UNIMPLEMENTED. */
static void
link_call(void *arg, struct dlink_conn *conn, const uint8_t *frame, size_t len)
{
    struct call_link *l    = arg;
    struct rpc_server *rpc = atomic_load(&l->rpc);
    dc_status st;

    if (rpc == NULL) {
        status_set(&st, DC_UNAVAILABLE, "coordinator starting");
        dlink_call_answer(conn, &st, NULL, 0);
        return;
    }
    atomic_fetch_add(&l->calls, 1);
    rpc_server_serve_frame(rpc, frame, len, LINK_METHODS, dlink_call_answer_frame, conn);
}

dc_code
call_link_start(const struct config_coordinator *cfg, struct call_link **out, dc_status *st)
{
    struct dlink_events ev = { 0 };
    struct call_link *l;
    char host[256], url[300];
    dc_code code;

    *out = NULL;
    if (!cfg->call_link || strncmp(cfg->listen, "tcp://", 6) != 0) {
        return DC_OK;
    }
    if ((l = calloc(1, sizeof(*l))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    ev.arg         = l;
    ev.control     = link_call;
    ev.control_max = cfg->max_message_bytes + RPC_FRAME_OVERHEAD;
    auth_url_host(cfg->listen, host, sizeof(host));
    address_url(url, sizeof(url), "tcp", host[0] ? host : "0.0.0.0", cfg->call_link_port);
    if ((code = dlink_server_start(url, NULL, ev.control_max,
                                   cfg->handshake_timeout_ms ? cfg->handshake_timeout_ms : 10000,
                                   &ev, &l->dl, st)) != DC_OK) {
        status_prefix(st, "call link");
        free(l);
        return code;
    }
    address_url(url, sizeof(url), "tcp", host[0] ? host : "0.0.0.0",
                (unsigned)dlink_server_port(l->dl));
    log_info("call link listening on %s", url);
    *out = l;
    return DC_OK;
}

void
call_link_serve(struct call_link *l, struct rpc_server *rpc)
{
    if (l != NULL) {
        atomic_store(&l->rpc, rpc);
    }
}

void
call_link_describe(const struct call_link *l, Devcoord__V1__CallLinkResponse *out)
{
    if (l == NULL) {
        out->port = 0;
        return;
    }
    out->port        = (uint32_t)dlink_server_port(l->dl);
    out->secret.data = (uint8_t *)dlink_server_secret(l->dl);
    out->secret.len  = DLINK_SECRET_SIZE;
}

uint64_t
call_link_calls(struct call_link *l)
{
    return l != NULL ? atomic_load(&l->calls) : 0;
}

void
call_link_free(struct call_link *l)
{
    if (l == NULL) {
        return;
    }
    dlink_server_free(l->dl);
    free(l);
}
