#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "arena.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "rpc.h"
#include "wire.h"
#include "clock.h"
#include "log.h"

/* A reusable nng context and aio for one call at a time. Slots go back to a free list when
 * their call completes and are freed only with the client, never inside their callback. */
struct rpc_slot {
    struct rpc_client *client;
    nng_ctx ctx;
    nng_aio *aio;
    /* rpc_call's, with no callback: its completion wakes the caller straight from the thread
     * that completes it, where aio's runs its callback on an nng task thread first (made on
     * the slot's first synchronous call). */
    nng_aio *saio;
    bool receiving;
    /* An rpc_call_async call not finished yet (cleared under the client's mtx as the slot
     * is put back): rpc_client_close finishes one that its stop left unanswered. */
    bool pending;
    bool raw_body; /* RPC_RAW_BODY: the reply's body is not decoded */
    uint64_t request_id;
    uint64_t deadline_ms;
    uint32_t timeout_ms;
    const ProtobufCMethodDescriptor *method;
    rpc_done_fn done;
    void *arg;
    struct rpc_slot *next_free;
};

struct rpc_client {
    nng_socket sock;
    nng_dialer dialer;
    char url[256];
    char *token;
    size_t max_message;
    void (*on_connection)(void *, bool);
    void *on_connection_arg;
    atomic_int pipes;
    /* When a connection last came up, and how many in a row the server closed within
     * RPC_CLOSED_AT_ONCE_MS of it (a server past its connection bound does that: rpc_server.c
     * closes the connection as nng adds it); a longer-lived one resets the count. */
    atomic_ullong added_ms;
    atomic_uint closed_at_once;
    atomic_ullong next_id;
    /* rpc_client_close began: connection events reach the owner no more (a close nng
     * abandons may report one after the owner is gone). */
    atomic_bool closing;

    pthread_mutex_t mtx;
    pthread_cond_t sync_cv; /* sync_calls dropped to 0 */
    unsigned sync_calls;    /* rpc_call's waiting on a slot's saio */
    struct rpc_slot *free_slots;
    struct rpc_slot **slots;
    size_t n_slots, cap_slots;
};

#define RPC_CLOSED_AT_ONCE_MS 100
#define RPC_AT_BOUND          "which a server at its connection bound (limits.max_connections) does"

static void rpc_slot_cb(void *arg);
static void rpc_slot_finish(struct rpc_slot *s, dc_code code, const dc_status *st,
                            struct rpc_reply *r);

/* For tests: run by a completion callback between a request's send and its reply's receive. */
static _Atomic(void (*)(void)) sent_hook;

void
rpc_client_set_sent_hook(void (*hook)(void))
{
    atomic_store(&sent_hook, hook);
}

void
rpc_reply_free(struct rpc_reply *r)
{
    if (r == NULL) {
        return;
    }
    arena_free(r->arena);
    if (r->msg != NULL) {
        nng_msg_free(r->msg);
    }
    memset(r, 0, sizeof(*r));
}

static void
rpc_client_pipe_cb(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    struct rpc_client *c = arg;
    int before;

    (void)pipe;
    if (atomic_load(&c->closing)) {
        return;
    }
    if (ev == NNG_PIPE_EV_ADD_POST) {
        atomic_store(&c->added_ms, rpc_now_ms());
        before = atomic_fetch_add(&c->pipes, 1);
        if (before == 0 && c->on_connection != NULL) {
            c->on_connection(c->on_connection_arg, true);
        }
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        if (rpc_now_ms() - atomic_load(&c->added_ms) < RPC_CLOSED_AT_ONCE_MS) {
            atomic_fetch_add(&c->closed_at_once, 1);
        } else {
            atomic_store(&c->closed_at_once, 0);
        }
        before = atomic_fetch_sub(&c->pipes, 1);
        if (before == 1 && c->on_connection != NULL) {
            c->on_connection(c->on_connection_arg, false);
        }
    }
}

void
rpc_client_set_reconnect(struct rpc_client *c, uint32_t min_ms, uint32_t max_ms)
{
    nng_dialer_set_ms(c->dialer, NNG_OPT_RECONNMINT, min_ms);
    nng_dialer_set_ms(c->dialer, NNG_OPT_RECONNMAXT, max_ms);
}

bool
rpc_client_connected(const struct rpc_client *c)
{
    return atomic_load(&c->pipes) > 0;
}

dc_code
rpc_client_open(const struct rpc_client_opts *opts, struct rpc_client **out, dc_status *st)
{
    struct rpc_client *c;
    char what[300];
    dc_code code;
    int rv;

    if ((c = calloc(1, sizeof(*c))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&c->mtx, NULL);
    clock_cond_init(&c->sync_cv);
    snprintf(c->url, sizeof(c->url), "%s", opts->url);
    c->max_message   = opts->max_message_bytes ? opts->max_message_bytes : RPC_DEFAULT_MAX_MESSAGE;
    c->on_connection = opts->on_connection;
    c->on_connection_arg = opts->on_connection_arg;
    atomic_store(&c->next_id, ((uint64_t)rpc_now_us() << 16) ^ (uint64_t)(uintptr_t)c);
    if (opts->token != NULL && (c->token = strdup(opts->token)) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    snprintf(what, sizeof(what), "cannot reach %s", opts->url);
    if ((rv = nng_req0_open(&c->sock)) != 0) {
        code = wire_nng_status(rv, "req socket", st);
        goto fail;
    }
    /* At most once: never resend a request by ourselves. */
    if ((rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = rpc_socket_limits(c->sock, c->max_message)) != 0 ||
        (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_POST, rpc_client_pipe_cb, c)) != 0 ||
        (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, rpc_client_pipe_cb, c)) != 0 ||
        (rv = nng_dialer_create(&c->dialer, c->sock, opts->url)) != 0 ||
        (rv = nng_dialer_set_ms(c->dialer, NNG_OPT_RECONNMINT,
                                opts->reconnect_min_ms ? opts->reconnect_min_ms : 100)) != 0 ||
        (rv = nng_dialer_set_ms(c->dialer, NNG_OPT_RECONNMAXT,
                                opts->reconnect_max_ms ? opts->reconnect_max_ms : 2000)) != 0 ||
        (rv = nng_dialer_set_size(c->dialer, NNG_OPT_RECVMAXSZ,
                                  c->max_message + RPC_FRAME_OVERHEAD)) != 0 ||
        (opts->tls != NULL &&
         (rv = nng_dialer_set_ptr(c->dialer, NNG_OPT_TLS_CONFIG, opts->tls)) != 0) ||
        (rv = nng_dialer_start(c->dialer, opts->connect_now ? 0 : NNG_FLAG_NONBLOCK)) != 0) {
        code = wire_nng_status(rv, what, st);
        if (code == DC_INVALID_ARGUMENT) {
            snprintf(what, sizeof(what), "bad address '%s'", opts->url);
            wire_nng_status(rv, what, st);
        } else if (st != NULL) {
            st->transport = true;
        }
        nng_close(c->sock);
        goto fail;
    }
    *out = c;
    return DC_OK;
fail:
    free(c->token);
    pthread_cond_destroy(&c->sync_cv);
    pthread_mutex_destroy(&c->mtx);
    free(c);
    return code;
}

void
rpc_client_close(struct rpc_client *c)
{
    if (c == NULL) {
        return;
    }
    atomic_store(&c->closing, true);
    /* Stop every slot before the socket closes: a completion callback may still be inside
     * nng_ctx_recv on another thread after its call was answered, and the socket must
     * outlive it. Stopping also fails calls still in flight (their callbacks run now, with
     * NNG_ECANCELED), but for one whose callback was between its send and nng_ctx_recv: nng
     * refuses that receive without running the callback again, so the call is finished
     * here. */
    for (size_t i = 0; i < c->n_slots; i++) {
        struct rpc_slot *s = c->slots[i];
        struct rpc_reply r = { 0 };
        dc_status st;
        bool pending;

        nng_aio_stop(s->aio);
        pthread_mutex_lock(&c->mtx);
        pending = s->pending;
        pthread_mutex_unlock(&c->mtx);
        if (pending) {
            status_set(&st, DC_CANCELLED, "%s: the client to %s was closed", s->method->name,
                       c->url);
            st.transport = true;
            rpc_slot_finish(s, DC_CANCELLED, &st, &r);
        }
    }
    if (!rpc_close_bounded(c->sock)) {
        /* The close hangs (rpc_close_bounded): nng may still use the slots' aios and wake
         * the synchronous calls, so the client is left as it is (a leak, once; the daemon
         * then skips nng_fini, as rpc_server_abandoned says). */
        log_warn("rpc client: closing the socket to %s did not finish within %d ms (nng "
                 "1.5.2); left behind",
                 c->url, RPC_CLOSE_BOUND_MS);
        rpc_left_behind(c);
        return;
    }
    /* Closing failed the synchronous calls still waiting; they give their slots back. */
    pthread_mutex_lock(&c->mtx);
    while (c->sync_calls > 0) {
        pthread_cond_wait(&c->sync_cv, &c->mtx);
    }
    pthread_mutex_unlock(&c->mtx);
    for (size_t i = 0; i < c->n_slots; i++) {
        nng_aio_free(c->slots[i]->aio);
        if (c->slots[i]->saio != NULL) {
            nng_aio_free(c->slots[i]->saio);
        }
        free(c->slots[i]);
    }
    free(c->slots);
    free(c->token);
    pthread_cond_destroy(&c->sync_cv);
    pthread_mutex_destroy(&c->mtx);
    free(c);
}

static struct rpc_slot *
rpc_slot_get(struct rpc_client *c)
{
    struct rpc_slot *s;

    pthread_mutex_lock(&c->mtx);
    if ((s = c->free_slots) != NULL) {
        c->free_slots = s->next_free;
        pthread_mutex_unlock(&c->mtx);
        return s;
    }
    if (c->n_slots == c->cap_slots) {
        size_t cap             = c->cap_slots ? c->cap_slots * 2 : 16;
        struct rpc_slot **grow = realloc(c->slots, cap * sizeof(*grow));
        if (grow == NULL) {
            goto fail;
        }
        c->slots     = grow;
        c->cap_slots = cap;
    }
    if ((s = calloc(1, sizeof(*s))) == NULL) {
        goto fail;
    }
    s->client = c;
    if (nng_aio_alloc(&s->aio, rpc_slot_cb, s) != 0) {
        free(s);
        goto fail;
    }
    if (nng_ctx_open(&s->ctx, c->sock) != 0) {
        nng_aio_free(s->aio);
        free(s);
        goto fail;
    }
    c->slots[c->n_slots++] = s;
    pthread_mutex_unlock(&c->mtx);
    return s;
fail:
    pthread_mutex_unlock(&c->mtx);
    return NULL;
}

static void
rpc_slot_put(struct rpc_slot *s)
{
    struct rpc_client *c = s->client;

    pthread_mutex_lock(&c->mtx);
    s->pending    = false;
    s->next_free  = c->free_slots;
    c->free_slots = s;
    pthread_mutex_unlock(&c->mtx);
}

/* Time left before the slot's deadline, as an nng duration. */
static nng_duration
rpc_slot_remaining(const struct rpc_slot *s)
{
    uint64_t now;

    if (s->deadline_ms == 0) {
        return NNG_DURATION_INFINITE;
    }
    now = rpc_now_ms();
    return now >= s->deadline_ms ? 1 : (nng_duration)(s->deadline_ms - now);
}

/* Decodes a reply message into r and st; takes msg. */
dc_code
rpc_reply_decode(const ProtobufCMethodDescriptor *method, bool raw, uint64_t request_id,
                 const char *from, nng_msg *msg, struct rpc_reply *r, dc_status *st)
{
    Devcoord__V1__ReplyHeader *hdr;
    ProtobufCAllocator alloc;
    struct wire_frame f;
    dc_code code;

    memset(r, 0, sizeof(*r));
    r->msg = msg;
    if (wire_split(nng_msg_body(msg), nng_msg_len(msg), &f, st) != DC_OK) {
        status_prefix(st, "undecodable reply");
        st->code = DC_INTERNAL;
        return DC_INTERNAL;
    }
    if ((r->arena = arena_new(rpc_decode_budget(f.header_len + f.body_len))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory decoding a reply");
    }
    alloc = arena_allocator(r->arena);
    hdr   = devcoord__v1__reply_header__unpack(&alloc, f.header_len, f.header);
    if (hdr == NULL && arena_exhausted(r->arena)) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory decoding a reply from %s",
                          from);
    }
    if (hdr == NULL || hdr->status == NULL) {
        return status_set(st, DC_INTERNAL, "undecodable reply header from %s", from);
    }
    if (hdr->request_id != request_id && hdr->request_id != 0) {
        return status_set(st, DC_INTERNAL, "reply to another request from %s", from);
    }
    code = wire_status_from_pb(hdr->status, st);
    if (raw) {
        r->raw_body     = f.body;
        r->raw_body_len = f.body_len;
    } else if (f.body_len > 0) {
        r->body = protobuf_c_message_unpack(method->output, &alloc, f.body_len, f.body);
        if (r->body == NULL) {
            return status_set(st, arena_exhausted(r->arena) ? DC_RESOURCE_EXHAUSTED : DC_INTERNAL,
                              "undecodable %s reply from %s", method->name, from);
        }
    }
    r->attachment     = f.attachment;
    r->attachment_len = f.attachment_len;
    return code;
}

static dc_code
rpc_slot_decode(struct rpc_slot *s, nng_msg *msg, struct rpc_reply *r, dc_status *st)
{
    return rpc_reply_decode(s->method, s->raw_body, s->request_id, s->client->url, msg, r, st);
}

static void
rpc_slot_finish(struct rpc_slot *s, dc_code code, const dc_status *st, struct rpc_reply *r)
{
    rpc_done_fn done = s->done;
    void *arg        = s->arg;
    bool keep        = false;

    done(arg, code, st, r, &keep);
    if (!keep) {
        rpc_reply_free(r);
    }
    rpc_slot_put(s);
}

/* A request that nng did not take (rv): its message freed, st says why. */
static dc_code
rpc_send_failed(struct rpc_slot *s, nng_aio *aio, int rv, dc_status *st)
{
    struct rpc_client *c = s->client;
    dc_code code;
    unsigned n;

    nng_msg_free(nng_aio_get_msg(aio));
    nng_aio_set_msg(aio, NULL);
    /* The deadline passed while waiting for a connection (calls wait for one, as gRPC's
     * wait-for-ready): a deadline, not a refusal. */
    if (rv == NNG_ETIMEDOUT && !rpc_client_connected(c) &&
        (n = atomic_load(&c->closed_at_once)) > 0) {
        code = status_set(st, DC_UNAVAILABLE,
                          "cannot reach %s within %u ms: the server closed the last %u "
                          "connection(s) as they opened, " RPC_AT_BOUND,
                          c->url, s->timeout_ms, n);
    } else if (rv == NNG_ETIMEDOUT && !rpc_client_connected(c)) {
        code = status_set(st, DC_DEADLINE_EXCEEDED, "cannot reach %s within %u ms: not connected",
                          c->url, s->timeout_ms);
    } else {
        code = wire_nng_status(rv, c->url, st);
    }
    st->transport = true;
    return code;
}

/* The reply's receive ended (rv): decoded into r, or st says why not. */
static dc_code
rpc_reply_take(struct rpc_slot *s, nng_aio *aio, int rv, struct rpc_reply *r, dc_status *st)
{
    struct rpc_client *c = s->client;
    nng_msg *msg;
    dc_code code;

    if (rv == NNG_ETIMEDOUT) {
        code = status_set(st, DC_DEADLINE_EXCEEDED, "%s: no reply from %s within %u ms",
                          s->method->name, c->url, s->timeout_ms);
    } else if ((rv == NNG_ECONNRESET || rv == NNG_ECONNSHUT) &&
               rpc_now_ms() - atomic_load(&c->added_ms) < RPC_CLOSED_AT_ONCE_MS) {
        code = status_set(
            st, DC_UNAVAILABLE,
            "%s: connection to %s lost: the server closed it as it opened, " RPC_AT_BOUND,
            s->method->name, c->url);
    } else if (rv == NNG_ECONNRESET || rv == NNG_ECONNSHUT || rv == NNG_ECLOSED) {
        code = status_set(st, rv == NNG_ECLOSED ? DC_CANCELLED : DC_UNAVAILABLE,
                          "%s: connection to %s lost", s->method->name, c->url);
    } else if (rv != 0) {
        code = wire_nng_status(rv, c->url, st);
    }
    if (rv != 0) {
        st->transport = true;
        return code;
    }
    msg = nng_aio_get_msg(aio);
    nng_aio_set_msg(aio, NULL);
    return rpc_slot_decode(s, msg, r, st);
}

static void
rpc_slot_cb(void *arg)
{
    struct rpc_slot *s = arg;
    int rv             = nng_aio_result(s->aio);
    struct rpc_reply r = { 0 };
    void (*hook)(void);
    dc_status st;
    dc_code code;

    status_clear(&st);
    if (!s->receiving) {
        if (rv != 0) {
            code = rpc_send_failed(s, s->aio, rv, &st);
            rpc_slot_finish(s, code, &st, &r);
            return;
        }
        if ((hook = atomic_load(&sent_hook)) != NULL) {
            hook();
        }
        s->receiving = true;
        nng_aio_set_timeout(s->aio, rpc_slot_remaining(s));
        nng_ctx_recv(s->ctx, s->aio);
        return;
    }
    code = rpc_reply_take(s, s->aio, rv, &r, &st);
    rpc_slot_finish(s, code, &st, &r);
}

dc_code
rpc_request_pack(const ProtobufCServiceDescriptor *svc, unsigned method,
                 const ProtobufCMessage *request, const void *attachment, size_t attachment_len,
                 const char *token, uint64_t request_id, uint32_t timeout_ms, size_t max_message,
                 nng_msg **out, dc_status *st)
{
    Devcoord__V1__RequestHeader hdr = DEVCOORD__V1__REQUEST_HEADER__INIT;
    char path[160];
    int rv;

    rpc_method_path(svc, method, path, sizeof(path));
    hdr.request_id = request_id;
    hdr.method     = path;
    hdr.timeout_ms = timeout_ms;
    hdr.token      = token != NULL ? (char *)token : "";
    if ((rv = wire_pack(out, &hdr.base, request, attachment, attachment_len,
                        max_message + RPC_FRAME_OVERHEAD)) != 0) {
        if (rv == NNG_EMSGSIZE) {
            return status_set(st, DC_RESOURCE_EXHAUSTED,
                              "%s request over the %zu" RPC_REFUSED_OVER_LIMIT,
                              svc->methods[method].name, max_message);
        }
        return wire_nng_status(rv, "packing a request", st);
    }
    return DC_OK;
}

/* A call's request packed into *msg, on a slot of its own (*out) set for it. */
static dc_code
rpc_prepare(struct rpc_client *c, const ProtobufCServiceDescriptor *svc, unsigned method,
            const ProtobufCMessage *request, const void *attachment, size_t attachment_len,
            uint32_t timeout_ms, struct rpc_slot **out, nng_msg **out_msg, dc_status *st)
{
    struct rpc_slot *s;
    nng_msg *msg;
    bool raw = (method & RPC_RAW_BODY) != 0;
    uint64_t request_id;

    method &= ~RPC_RAW_BODY;
    if (method >= svc->n_methods) {
        return status_set(st, DC_INTERNAL, "method %u outside %s", method, svc->name);
    }
    request_id = atomic_fetch_add(&c->next_id, 1);
    if (rpc_request_pack(svc, method, request, attachment, attachment_len, c->token, request_id,
                         timeout_ms, c->max_message, &msg, st) != DC_OK) {
        return st->code;
    }
    if ((s = rpc_slot_get(c)) == NULL) {
        nng_msg_free(msg);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory starting a call");
    }
    s->receiving   = false;
    s->request_id  = request_id;
    s->timeout_ms  = timeout_ms;
    s->deadline_ms = timeout_ms ? rpc_now_ms() + timeout_ms : 0;
    s->method      = &svc->methods[method];
    s->raw_body    = raw;
    *out           = s;
    *out_msg       = msg;
    return DC_OK;
}

dc_code
rpc_call_async(struct rpc_client *c, const ProtobufCServiceDescriptor *svc, unsigned method,
               const ProtobufCMessage *request, const void *attachment, size_t attachment_len,
               uint32_t timeout_ms, rpc_done_fn done, void *arg, dc_status *st)
{
    struct rpc_slot *s = NULL;
    nng_msg *msg       = NULL;
    dc_code code;

    if ((code = rpc_prepare(c, svc, method, request, attachment, attachment_len, timeout_ms, &s,
                            &msg, st)) != DC_OK) {
        return code;
    }
    s->done    = done;
    s->arg     = arg;
    s->pending = true; /* published by nng_ctx_send */
    nng_aio_set_msg(s->aio, msg);
    nng_aio_set_timeout(s->aio, rpc_slot_remaining(s));
    nng_ctx_send(s->ctx, s->aio);
    return DC_OK;
}

/* Made and waited for on the caller's thread: the send, then the receive of the reply, on the
 * slot's callback-less aio, so the reply wakes the caller directly. */
dc_code
rpc_call(struct rpc_client *c, const ProtobufCServiceDescriptor *svc, unsigned method,
         const ProtobufCMessage *request, const void *attachment, size_t attachment_len,
         uint32_t timeout_ms, struct rpc_reply *reply, dc_status *st)
{
    struct rpc_slot *s = NULL;
    nng_msg *msg       = NULL;
    dc_status ls;
    dc_code code;
    int rv;

    memset(reply, 0, sizeof(*reply));
    status_clear(&ls);
    if ((code = rpc_prepare(c, svc, method, request, attachment, attachment_len, timeout_ms, &s,
                            &msg, &ls)) != DC_OK) {
        goto out;
    }
    if (s->saio == NULL && nng_aio_alloc(&s->saio, NULL, NULL) != 0) {
        s->saio = NULL;
        nng_msg_free(msg);
        rpc_slot_put(s);
        code = status_set(&ls, DC_RESOURCE_EXHAUSTED, "out of memory starting a call");
        goto out;
    }
    pthread_mutex_lock(&c->mtx);
    c->sync_calls++;
    pthread_mutex_unlock(&c->mtx);
    nng_aio_set_msg(s->saio, msg);
    nng_aio_set_timeout(s->saio, rpc_slot_remaining(s));
    nng_ctx_send(s->ctx, s->saio);
    nng_aio_wait(s->saio);
    if ((rv = nng_aio_result(s->saio)) != 0) {
        code = rpc_send_failed(s, s->saio, rv, &ls);
    } else {
        nng_aio_set_timeout(s->saio, rpc_slot_remaining(s));
        nng_ctx_recv(s->ctx, s->saio);
        nng_aio_wait(s->saio);
        code = rpc_reply_take(s, s->saio, nng_aio_result(s->saio), reply, &ls);
    }
    rpc_slot_put(s);
    pthread_mutex_lock(&c->mtx);
    if (--c->sync_calls == 0) {
        pthread_cond_broadcast(&c->sync_cv);
    }
    pthread_mutex_unlock(&c->mtx);
out:
    if (st != NULL) {
        *st = ls;
    }
    return code;
}
