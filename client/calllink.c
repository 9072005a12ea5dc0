/*
 * SubmitOp on the coordinator's call link (README "SubmitOp on the call link"): the request
 * frame the RPC would carry goes on a raw connection to the coordinator's call link port and
 * its reply frame comes back on it, with no nng socket, protocol or context on either side.
 * The link is asked for (CallLink) and dialed on the second SubmitOp of a handle (a one-shot
 * devcoordctl submit pays nothing for it), kept, and used by one call at a time; every other
 * call, and any SubmitOp it cannot take, goes as an RPC.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "address.h"
#include "auth.h"
#include "client.h"
#include "dlframe.h"

/* The link's setup (CallLink, then the dial) is bounded by this. */
#define LINK_SETUP_MS 2000u
/* After a failed setup the link is tried again this long later, doubling up to the max. */
#define LINK_RETRY_MIN_MS 1000u
#define LINK_RETRY_MAX_MS (5u * 60 * 1000)

struct coord_link {
    pthread_mutex_t mtx; /* held by the call on the link */
    struct dlink_out *out;
    bool off;          /* the coordinator has none: RPCs only */
    uint64_t retry_at; /* no setup before this (rpc_now_ms) */
    uint32_t retry_ms; /* the next wait after a failed setup */
    uint64_t seq;
    bool wanted; /* a SubmitOp was made: the next one opens the link */
};

dc_code
coord_link_new(dc_client *c, const char *url, dc_status *st)
{
    const char *env = getenv("DEVCOORD_CALL_LINK");
    struct coord_link *l;

    /* Plain tcp:// only, and one coordinator: a list follows their leader by RPC. */
    if (url == NULL || strncmp(url, "tcp://", 6) != 0 || (env != NULL && strcmp(env, "off") == 0)) {
        return DC_OK;
    }
    if ((l = calloc(1, sizeof(*l))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&l->mtx, NULL);
    l->retry_ms = LINK_RETRY_MIN_MS;
    c->link     = l;
    return DC_OK;
}

void
coord_link_free(dc_client *c)
{
    struct coord_link *l = c->link;

    if (l == NULL) {
        return;
    }
    dlink_out_close(l->out);
    pthread_mutex_destroy(&l->mtx);
    free(l);
    c->link = NULL;
}

static void
link_drop(struct coord_link *l)
{
    dlink_out_close(l->out);
    l->out = NULL;
}

/* One call on l->out. *sent: its frame went whole, so the call is the link's whatever
 * becomes of it (made at most once); until then the link is dropped on any failure and the
 * call can still go as an RPC. Failures read as the RPC's would. l->mtx held. */
static dc_code
link_roundtrip(dc_client *c, struct coord_link *l, unsigned method, const ProtobufCMessage *req,
               uint32_t timeout_ms, struct rpc_reply *r, dc_status *st, bool *sent)
{
    const char *name   = COORD_SVC->methods[method].name;
    struct dlink_hdr h = { .kind = DLINK_CALL };
    nng_msg *msg = NULL, *answer = NULL;
    dc_code code;

    *sent = false;
    memset(r, 0, sizeof(*r));
    if ((code = rpc_request_pack(COORD_SVC, method, req, NULL, 0, c->token, ++l->seq, timeout_ms,
                                 RPC_DEFAULT_MAX_MESSAGE, &msg, st)) != DC_OK) {
        return code;
    }
    h.seq = l->seq;
    code  = dlink_call_send(l->out, &h, nng_msg_body(msg), nng_msg_len(msg), timeout_ms, st);
    nng_msg_free(msg);
    if (code != DC_OK) {
        link_drop(l); /* the coordinator drops a frame cut short unread */
        return code;
    }
    *sent = true;
    code  = dlink_call_recv_any(l->out, h.seq, RPC_DEFAULT_MAX_MESSAGE + RPC_FRAME_OVERHEAD,
                                timeout_ms, &answer, st);
    if (code == DC_OK) {
        return rpc_reply_decode(&COORD_SVC->methods[method], false, h.seq, c->coord_url, answer, r,
                                st);
    }
    if (st->transport) { /* as rpc_call words it: dlframe's message names a worker */
        link_drop(l);
        if (code == DC_DEADLINE_EXCEEDED) {
            status_set(st, code, "%s: no reply from %s within %u ms (call link)", name,
                       c->coord_url, timeout_ms);
        } else {
            status_set(st, code, "%s: connection to %s lost (call link)", name, c->coord_url);
        }
        st->transport = true;
    }
    return code;
}

/* Asks the coordinator where its link listens, dials it and makes a first CallLink on it:
 * a connection the coordinator turned away (a wrong secret, too many connections) fails
 * there, not under a SubmitOp. Failing, calls go as RPCs: for good when the coordinator has
 * no link, or when the setup failed slowly (a firewall dropping the port would cost every
 * retry that long), else until retry_at. l->mtx held. */
static void
link_open(dc_client *c, struct coord_link *l)
{
    Devcoord__V1__CallLinkRequest req = DEVCOORD__V1__CALL_LINK_REQUEST__INIT;
    Devcoord__V1__CallLinkResponse *resp;
    struct rpc_reply r, probe;
    char host[256], url[300];
    dc_status st;
    dc_code code;
    uint64_t began = 0;
    bool sent;

    if (l->off || rpc_now_ms() < l->retry_at) {
        return;
    }
    code = rpc_call(c->coord, COORD_SVC, M_COORDINATOR_CALL_LINK, &req.base, NULL, 0, LINK_SETUP_MS,
                    &r, &st);
    resp = (Devcoord__V1__CallLinkResponse *)r.body;
    if (code == DC_UNIMPLEMENTED || (code == DC_OK && (resp == NULL || resp->port == 0))) {
        l->off = true; /* an older coordinator, or its link is off */
    } else if (code == DC_OK && resp->port <= 65535 && resp->secret.len == DLINK_SECRET_SIZE) {
        auth_url_host(c->coord_url, host, sizeof(host));
        address_url(url, sizeof(url), "tcp", host, resp->port);
        began = rpc_now_ms();
        if (dlink_dial_as(url, NULL, resp->secret.data, "libdevcoord", DLINK_HELLO_CONTROL,
                          LINK_SETUP_MS, &l->out, &st) == DC_OK) {
            if (link_roundtrip(c, l, M_COORDINATOR_CALL_LINK, &req.base, LINK_SETUP_MS, &probe, &st,
                               &sent) != DC_OK &&
                l->out != NULL) {
                link_drop(l);
            }
            rpc_reply_free(&probe);
        }
    }
    rpc_reply_free(&r);
    if (l->out != NULL) {
        l->retry_ms = LINK_RETRY_MIN_MS;
    } else if (began != 0 && rpc_now_ms() - began >= LINK_SETUP_MS / 2) {
        l->off = true; /* the dial or the first call on the link was slow to fail */
    } else if (!l->off) {
        l->retry_at = rpc_now_ms() + l->retry_ms;
        l->retry_ms = l->retry_ms >= LINK_RETRY_MAX_MS / 2 ? LINK_RETRY_MAX_MS : l->retry_ms * 2;
    }
}

bool
coord_link_call(dc_client *c, unsigned method, const ProtobufCMessage *req, uint32_t timeout_ms,
                struct rpc_reply *r, dc_status *st, dc_code *code)
{
    struct coord_link *l = c->link;
    dc_status ls;
    bool sent = false;

    if (l == NULL || pthread_mutex_trylock(&l->mtx) != 0) {
        return false; /* no link, or another call is on it */
    }
    if (l->out != NULL && !dlink_out_idle_end(l->out)) {
        link_drop(l); /* the coordinator closed it (restarted, stopping): a new one */
    }
    if (l->out == NULL && l->wanted) {
        link_open(c, l);
    }
    l->wanted = true;
    status_clear(&ls);
    if (l->out != NULL) { /* else, or when not sent, the RPC makes it (or says why not) */
        *code = link_roundtrip(c, l, method, req, timeout_ms, r, &ls, &sent);
    }
    if (l->out != NULL) {
        dlink_out_idle_begin(l->out); /* watched until the next call */
    }
    pthread_mutex_unlock(&l->mtx);
    if (sent && st != NULL) {
        *st = ls;
    }
    return sent;
}
