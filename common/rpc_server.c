#include <arpa/inet.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <malloc.h>
#include <string.h>
#include <time.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include "arena.h"
#include "clock.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "handshake.h"
#include "log.h"
#include "rpc.h"
#include "threadname.h"
#include "wire.h"

/* One nng context and the call it is serving. A context cycles RECV -> WORK -> SEND -> RECV;
 * in WORK the request is decoded and dispatched on a server thread, and the handler holds
 * the context until it calls the closure. */
struct rpc_call {
    struct rpc_server *server;
    nng_ctx ctx;
    nng_aio *aio;
    bool sending;
    nng_msg *req; /* the received message, kept until the reply is sent */
    /* Its connection (nng pipe id; 0: none known) and its bytes counted in flight, until it
     * is answered. */
    uint32_t pipe;
    size_t admitted;
    uint32_t reply_pipe; /* while its reply is being sent: the connection it goes to */
    struct rpc_request request;
    const ProtobufCMethodDescriptor *method;
    uint64_t request_id;
    uint64_t arrived_us;
    uint64_t deadline_ms;
    const void *reply_att;
    size_t reply_att_len;
    dc_status status;
    struct rpc_call *next; /* work queue */
    /* A call that came as a frame on another transport (rpc_server_serve_frame): its reply
     * frame goes to frame_answer, then the call is freed; ctx and aio are unused. */
    rpc_frame_answer_fn frame_answer;
    void *frame_arg;
    uint64_t frame_methods; /* the methods served on that transport (RPC_METHOD_BIT) */
};

struct rpc_pipe_load {
    uint32_t pipe; /* 0: empty slot (nng pipe ids start at 1) */
    size_t bytes;
    unsigned sending;     /* replies to it being sent */
    uint64_t progress_ms; /* when one of them last went, or the first began to wait */
    bool closed;          /* closed by a sweep (rpc_server_sweep) */
};

/* nng holds a reply's context until its connection takes the reply: a client that sends
 * and never reads would hold every context. So a reply's send takes at most what is left of
 * its call's deadline (at most RPC_REPLY_MAX_MS) and RPC_REPLY_SLACK_MS more, RPC_REPLY_MS
 * without a deadline (or undecoded); a connection with RPC_STUCK_SENDING replies waiting
 * that took none for RPC_STUCK_MS gets no more: its requests are dropped unanswered; and
 * one never has more than a quarter of the contexts in replies waiting: past that its
 * requests are dropped too. That bound holds from the first reply on: without it a flood of
 * small requests took every context within RPC_STUCK_MS, the server heard nobody until their
 * sends timed out, and then again, as the count fell under RPC_STUCK_SENDING with them. A
 * client that sends thousands before it reads is still answered (the default of 16384
 * contexts leaves it 4096 replies waiting). Over connections: once three quarters of the
 * contexts are in replies waiting, a connection with RPC_STUCK_SENDING of them gets no more,
 * so four such clients cannot take every context between them either. A few hundred could,
 * RPC_STUCK_SENDING each, and hold them until their sends timed out (6 s and more), again and
 * again. So once three quarters are in replies waiting, a server thread closes (every
 * RPC_SWEEP_MS at most) the connections none of whose replies went for RPC_STUCK_MS: closing
 * one ends its sends at once (nng counts them as sent), and a client that reads loses
 * nothing, since its replies go. */
#define RPC_STUCK_SENDING    16
#define RPC_STUCK_MS         1000
#define RPC_DEFAULT_CONTEXTS 16384
#define RPC_REPLY_SLACK_MS   1000
#define RPC_REPLY_MAX_MS     10000
#define RPC_REPLY_MS         5000
#define RPC_SWEEP_MS         100
#define RPC_SWEEP_MAX        64 /* connections closed by one sweep at most */

struct rpc_server {
    nng_socket sock;
    nng_listener listener;
    ProtobufCService *service;
    size_t max_message;
    rpc_authorize_fn authorize;
    void *authorize_arg;
    rpc_observe_fn observe;
    void *observe_arg;

    pthread_mutex_t mtx;
    pthread_cond_t cv;      /* work queued */
    pthread_cond_t idle_cv; /* the last call answered (or answer sent), once closing */
    bool inline_method[RPC_MAX_METHODS];
    bool inline_small[RPC_MAX_METHODS]; /* inline when at most inline_small_max bytes */
    size_t inline_small_max;
    struct rpc_call *head, *tail;
    bool closing;
    bool threads_exit;
    unsigned busy;      /* calls taken and not yet answered */
    unsigned sending;   /* replies waiting on every connection (their loads' sending) */
    unsigned answering; /* threads inside nng_ctx_send of an answer (see rpc_call_answer) */
    struct rpc_call **calls;
    unsigned n_calls, max_calls;
    atomic_uint receiving; /* contexts waiting for a request */

    /* Admission: request bytes received and not yet answered, in all and per connection
     * (pipe loads: an open-addressing table keyed by pipe id, an entry while its connection
     * has bytes in flight; at most max_calls entries, so half full at most). */
    size_t max_inflight, max_inflight_per_pipe;
    size_t inflight;
    struct rpc_pipe_load *pipes;
    size_t pipes_cap; /* power of two, >= 2 * max_calls */

    pthread_t *threads;
    unsigned n_threads;
    struct handshake_watch *handshake; /* tls+tcp:// listeners only */
    void (*on_disconnect)(void *arg, uint32_t pipe);
    void *on_disconnect_arg;
    size_t inflight_peak;    /* since in-flight bytes were last 0 */
    uint64_t dropped_unread; /* requests dropped: their connection took no replies */
    uint64_t closed_unread;  /* connections closed by sweeps */
    uint64_t swept_ms;       /* when the last sweep began */
    bool trim_due;           /* a burst ended: a server thread gives memory back */
    /* Request messages nng handed over, and those let go of since (freed, or reused as their
     * reply and handed back to nng): equal once the server is idle. A leak report at exit of
     * a message nng allocated is nng's own when the two are equal (rpc_server_free logs
     * them). */
    atomic_ullong reqs_taken, reqs_let_go;
    /* Connections at once (opts->max_connections, 0: no bound): the pipe ids of those open,
     * recorded as nng adds them; one past the bound is closed there, before it carries a
     * request, so that clients cannot take every file the daemon needs for its own work.
     * Without a bound they are only counted (nng reports the removal of every connection
     * it reported added, refused ones too: those are not in conns). */
    pthread_mutex_t conn_mtx;
    uint32_t *conns;
    unsigned n_conns, max_conns;
    uint64_t conns_refused;
};

static void rpc_call_cb(void *arg);
static void rpc_call_take(struct rpc_call *call);

/* A connection as nng adds it: recorded, or closed when max_conns are open already. */
static void
rpc_server_conn_add(struct rpc_server *s, nng_pipe pipe)
{
    uint64_t refused = 0;
    unsigned open;

    pthread_mutex_lock(&s->conn_mtx);
    open = s->n_conns;
    if (s->conns == NULL) {
        s->n_conns++;
    } else if (s->n_conns < s->max_conns) {
        s->conns[s->n_conns++] = (uint32_t)nng_pipe_id(pipe);
    } else {
        refused = ++s->conns_refused;
    }
    pthread_mutex_unlock(&s->conn_mtx);
    if (refused == 0) {
        return;
    }
    if ((refused & (refused - 1)) == 0) { /* 1, 2, 4, ... */
        log_warn("connection refused: %u open, the most limits.max_connections allows (%llu "
                 "refused so far)",
                 open, (unsigned long long)refused);
    }
    nng_pipe_close(pipe); /* after the log line: its client may look for it once closed */
}

static void
rpc_server_conn_remove(struct rpc_server *s, nng_pipe pipe)
{
    uint32_t id = (uint32_t)nng_pipe_id(pipe);

    pthread_mutex_lock(&s->conn_mtx);
    if (s->conns == NULL) {
        if (s->n_conns > 0) {
            s->n_conns--;
        }
    } else {
        for (unsigned i = 0; i < s->n_conns; i++) {
            if (s->conns[i] == id) { /* not there: one refused */
                s->conns[i] = s->conns[--s->n_conns];
                break;
            }
        }
    }
    pthread_mutex_unlock(&s->conn_mtx);
}

/* Counts connections in and out (closing one past the bound), tells the handshake watch which
 * connections are pipes, and the owner which closed (nng thread: nothing here waits). */
static void
rpc_server_pipe_cb(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    struct rpc_server *s = arg;
    nng_sockaddr sa;

    if (ev == NNG_PIPE_EV_ADD_PRE) {
        rpc_server_conn_add(s, pipe);
        return;
    }
    if (ev == NNG_PIPE_EV_REM_POST) {
        rpc_server_conn_remove(s, pipe);
    }

    if (s->handshake != NULL && ev == NNG_PIPE_EV_ADD_POST &&
        nng_pipe_get_addr(pipe, NNG_OPT_REMADDR, &sa) == 0) {
        handshake_watch_pipe(s->handshake, (uint32_t)nng_pipe_id(pipe), &sa, true);
    } else if (s->handshake != NULL && ev == NNG_PIPE_EV_REM_POST) {
        /* By id: the address of a connection its peer closed is gone by now. */
        handshake_watch_pipe(s->handshake, (uint32_t)nng_pipe_id(pipe), NULL, false);
    }
    if (ev == NNG_PIPE_EV_REM_POST && s->on_disconnect != NULL) {
        s->on_disconnect(s->on_disconnect_arg, (uint32_t)nng_pipe_id(pipe));
    }
}

static size_t
rpc_pipe_home(const struct rpc_server *s, uint32_t pipe)
{
    return (size_t)((pipe * 2654435761u) & (s->pipes_cap - 1));
}

/* The slot of `pipe`, or the empty slot where it would go. mtx held. */
static struct rpc_pipe_load *
rpc_pipe_slot(struct rpc_server *s, uint32_t pipe)
{
    size_t i = rpc_pipe_home(s, pipe);

    while (s->pipes[i].pipe != 0 && s->pipes[i].pipe != pipe) {
        i = (i + 1) & (s->pipes_cap - 1);
    }
    return &s->pipes[i];
}

/* Empties a slot, shifting back the entries after it that probed past it. mtx held. */
static void
rpc_pipe_remove(struct rpc_server *s, struct rpc_pipe_load *slot)
{
    size_t mask = s->pipes_cap - 1;
    size_t hole = (size_t)(slot - s->pipes);

    for (size_t i = (hole + 1) & mask; s->pipes[i].pipe != 0; i = (i + 1) & mask) {
        size_t home = rpc_pipe_home(s, s->pipes[i].pipe);
        /* The entry may fill the hole unless its home lies cyclically in (hole, i]. */
        if (((i - home) & mask) >= ((i - hole) & mask)) {
            s->pipes[hole] = s->pipes[i];
            hole           = i;
        }
    }
    s->pipes[hole] = (struct rpc_pipe_load){ 0 };
}

/* Counts a received request in flight, or refuses it (false, with the reason in call's
 * status) when it would take its connection or the server over the limit. A request is
 * always taken when nothing else is in flight there, so a limit below the message size
 * slows a client down without locking it out. mtx held. */
static bool
rpc_server_admit(struct rpc_server *s, struct rpc_call *call, size_t len)
{
    struct rpc_pipe_load *load = call->pipe != 0 ? rpc_pipe_slot(s, call->pipe) : NULL;

    if (load != NULL && load->bytes > 0 && load->bytes + len > s->max_inflight_per_pipe) {
        status_set(&call->status, DC_RESOURCE_EXHAUSTED,
                   RPC_REFUSED_IN_FLIGHT
                   "%zu bytes refused: with the %zu bytes of requests already in "
                   "flight on this connection it would pass "
                   "limits.max_inflight_bytes_per_connection (%zu); wait for answers before "
                   "sending more",
                   len, load->bytes, s->max_inflight_per_pipe);
        return false;
    }
    if (s->inflight > 0 && s->inflight + len > s->max_inflight) {
        status_set(&call->status, DC_RESOURCE_EXHAUSTED,
                   RPC_REFUSED_IN_FLIGHT
                   "%zu bytes refused: with the %zu bytes of requests already in "
                   "flight on this server it would pass limits.max_inflight_bytes (%zu); "
                   "retry later",
                   len, s->inflight, s->max_inflight);
        return false;
    }
    if (load != NULL) {
        load->pipe = call->pipe;
        load->bytes += len;
    }
    s->inflight += len;
    if (s->inflight > s->inflight_peak) {
        s->inflight_peak = s->inflight;
    }
    call->admitted = len;
    return true;
}

static int
rpc_server_admission_init(struct rpc_server *s, const struct rpc_server_opts *opts)
{
    s->max_inflight =
        opts->max_inflight_bytes ? opts->max_inflight_bytes : RPC_DEFAULT_MAX_INFLIGHT;
    s->max_inflight_per_pipe = opts->max_inflight_bytes_per_connection
                                   ? opts->max_inflight_bytes_per_connection
                                   : RPC_DEFAULT_MAX_INFLIGHT_PER_CONNECTION;
    for (s->pipes_cap = 16; s->pipes_cap < 2 * (size_t)s->max_calls; s->pipes_cap *= 2) {
    }
    s->pipes = calloc(s->pipes_cap, sizeof(*s->pipes));
    return s->pipes != NULL ? 0 : NNG_ENOMEM;
}

/* The most replies one connection may have waiting: a quarter of the contexts. */
static unsigned
rpc_pipe_max_sending(const struct rpc_server *s)
{
    return s->max_calls / 4 > RPC_STUCK_SENDING ? s->max_calls / 4 : RPC_STUCK_SENDING;
}

/* Whether three quarters of the contexts are in replies waiting. mtx held. */
static bool
rpc_server_pressed(const struct rpc_server *s)
{
    return s->sending >= s->max_calls / 4 * 3;
}

/* Whether a request from a connection of this load gets no reply: the connection does not
 * take the replies it has (see RPC_STUCK_SENDING). mtx held. */
static bool
rpc_pipe_unread(const struct rpc_server *s, const struct rpc_pipe_load *load)
{
    return load->sending >= rpc_pipe_max_sending(s) ||
           (load->sending >= RPC_STUCK_SENDING &&
            (rpc_server_pressed(s) || rpc_now_ms() - load->progress_ms >= RPC_STUCK_MS));
}

/* Whether a server thread should sweep now. mtx held. */
static bool
rpc_server_sweep_due(const struct rpc_server *s)
{
    return rpc_server_pressed(s) && !s->threads_exit && !s->closing &&
           rpc_now_ms() - s->swept_ms >= RPC_SWEEP_MS;
}

/* Closes the connections none of whose replies went for RPC_STUCK_MS (RPC_SWEEP_MAX at most;
 * the next sweep takes more). mtx held on entry, released on return. */
static void
rpc_server_sweep(struct rpc_server *s)
{
    uint32_t ids[RPC_SWEEP_MAX];
    unsigned n = 0, sending = s->sending;
    uint64_t now = rpc_now_ms(), before = s->closed_unread;

    s->swept_ms = now;
    for (size_t i = 0; i < s->pipes_cap && n < RPC_SWEEP_MAX; i++) {
        struct rpc_pipe_load *load = &s->pipes[i];
        if (load->pipe != 0 && load->sending > 0 && !load->closed &&
            now - load->progress_ms >= RPC_STUCK_MS) {
            load->closed = true;
            ids[n++]     = load->pipe;
        }
    }
    s->closed_unread += n;
    pthread_mutex_unlock(&s->mtx);
    for (uint64_t k = before + 1; k <= before + n; k++) {
        if ((k & (k - 1)) == 0) { /* 1, 2, 4, ... */
            log_warn("closed a connection that took none of its replies for %d ms while replies "
                     "waiting held %u of %u contexts (%llu closed so far)",
                     RPC_STUCK_MS, sending, s->max_calls, (unsigned long long)k);
            break;
        }
    }
    for (unsigned i = 0; i < n; i++) {
        nng_pipe pipe = NNG_PIPE_INITIALIZER;
        pipe.id       = ids[i];
        nng_pipe_close(pipe); /* its waiting sends finish now, as sent */
    }
}

/* The call is answered: its bytes are no longer in flight. */
static void
rpc_server_release(struct rpc_server *s, struct rpc_call *call)
{
    struct rpc_pipe_load *load;

    if (call->admitted == 0) {
        return;
    }
    pthread_mutex_lock(&s->mtx);
    s->inflight -= call->admitted;
    /* A burst of big requests is over: hand its memory back to the system. glibc keeps
     * freed memory below its trim threshold (which the daemons raise for speed), so a
     * burst would otherwise leave its peak in RSS for good. A server thread trims: this
     * may run on nng's callback thread, which must not take the time. */
    if (s->inflight == 0 && s->inflight_peak >= RPC_TRIM_AFTER_BYTES) {
        s->inflight_peak = 0;
        s->trim_due      = true;
        pthread_cond_signal(&s->cv);
    }
    if (call->pipe != 0) {
        load = rpc_pipe_slot(s, call->pipe);
        if ((load->bytes -= call->admitted) == 0 && load->sending == 0) {
            rpc_pipe_remove(s, load);
        }
    }
    pthread_mutex_unlock(&s->mtx);
    call->admitted = 0;
}

uint64_t
rpc_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t
rpc_now_ms(void)
{
    return rpc_now_us() / 1000u;
}

bool
rpc_refused_for_size(const dc_status *st)
{
    return st->code == DC_RESOURCE_EXHAUSTED &&
           (strncmp(st->message, RPC_REFUSED_IN_FLIGHT, strlen(RPC_REFUSED_IN_FLIGHT)) == 0 ||
            strstr(st->message, RPC_REFUSED_OVER_LIMIT) != NULL);
}

uint64_t
rpc_ms_until(uint64_t until)
{
    uint64_t now = rpc_now_ms();

    if (until <= now) {
        return 0;
    }
    return until - now < INT32_MAX ? until - now : INT32_MAX;
}

size_t
rpc_decode_budget(size_t len)
{
    /* protobuf-c's unpacked form of a message costs at most a few dozen times its encoding
     * (an empty submessage: 2 bytes on the wire, a struct and a pointer in memory). */
    return 64 * 1024 + 16 * len;
}

void
rpc_method_path(const ProtobufCServiceDescriptor *svc, unsigned method, char *buf, size_t cap)
{
    snprintf(buf, cap, "/%s/%s", svc->name, svc->methods[method].name);
}

int
rpc_socket_limits(nng_socket sock, size_t max_message_bytes)
{
    return nng_socket_set_size(sock, NNG_OPT_RECVMAXSZ, max_message_bytes + RPC_FRAME_OVERHEAD);
}

dc_status *
rpc_call_status(struct rpc_call *call)
{
    return &call->status;
}

const void *
rpc_call_attachment(struct rpc_call *call, size_t *len)
{
    *len = call->request.frame.attachment_len;
    return call->request.frame.attachment;
}

const char *
rpc_call_token(const struct rpc_call *call)
{
    return call->request.header != NULL ? call->request.header->token : "";
}

void
rpc_call_set_reply_attachment(struct rpc_call *call, const void *data, size_t len)
{
    call->reply_att     = data;
    call->reply_att_len = len;
}

uint64_t
rpc_call_deadline_ms(const struct rpc_call *call)
{
    return call->deadline_ms;
}

uint32_t
rpc_call_pipe(const struct rpc_call *call)
{
    return call->pipe;
}

/* Arms a context to receive. Called with mtx held. */
static void
rpc_call_arm(struct rpc_call *call)
{
    call->sending = false;
    nng_aio_set_timeout(call->aio, NNG_DURATION_INFINITE); /* a reply's send had one */
    atomic_fetch_add(&call->server->receiving, 1);
    nng_ctx_recv(call->ctx, call->aio);
}

/* A call is over (answered, or dropped): it no longer counts busy, and its context listens
 * again unless the server is closing (rpc_server_free waits for busy calls, once closing).
 * mtx held. */
static void
rpc_call_done_locked(struct rpc_call *call)
{
    struct rpc_server *s = call->server;

    if (--s->busy == 0 && s->closing) {
        pthread_cond_broadcast(&s->idle_cv);
    }
    if (!s->closing) {
        rpc_call_arm(call);
    }
}

static void
rpc_call_reset(struct rpc_call *call)
{
    rpc_server_release(call->server, call);
    call->pipe = 0;
    if (call->req != NULL) {
        nng_msg_free(call->req);
        call->req = NULL;
        atomic_fetch_add(&call->server->reqs_let_go, 1);
    }
    rpc_request_close(&call->request);
    call->method        = NULL;
    call->request_id    = 0;
    call->deadline_ms   = 0;
    call->reply_att     = NULL;
    call->reply_att_len = 0;
    status_clear(&call->status);
}

/* The closure every handler answers through. */
static void
rpc_call_answer(const ProtobufCMessage *body, void *data)
{
    struct rpc_call *call         = data;
    struct rpc_server *s          = call->server;
    Devcoord__V1__ReplyHeader hdr = DEVCOORD__V1__REPLY_HEADER__INIT;
    Devcoord__V1__Status status   = DEVCOORD__V1__STATUS__INIT;
    nng_msg *reply;
    uint64_t deadline, now, wait;
    uint32_t pipe;
    int rv;

    status.code    = (Devcoord__V1__Code)call->status.code;
    status.message = call->status.message;
    status.worker  = call->status.worker;
    if (call->status.device_index >= 0) {
        status.detail_case  = DEVCOORD__V1__STATUS__DETAIL_DEVICE_INDEX;
        status.device_index = (uint32_t)call->status.device_index;
    }
    hdr.request_id = call->request_id;
    hdr.status     = &status;
    if (body == NULL && call->status.code == DC_OK) {
        status.code    = DEVCOORD__V1__CODE__INTERNAL;
        status.message = "handler answered without a reply";
    }
    /* In the request's message when the front fits (one buffer per call, not two: fewer
     * page faults and heap trims per call), else in a new one. */
    rv = call->req != NULL
             ? wire_pack_into(call->req, &hdr.base, body, call->reply_att, call->reply_att_len,
                              s->max_message + RPC_FRAME_OVERHEAD)
             : NNG_ENOSPC;
    if (rv == 0) {
        reply     = call->req;
        call->req = NULL;
        atomic_fetch_add(&s->reqs_let_go, 1);
    } else if (rv != NNG_EMSGSIZE) {
        rv = wire_pack(&reply, &hdr.base, body, call->reply_att, call->reply_att_len,
                       s->max_message + RPC_FRAME_OVERHEAD);
    }
    if (rv != 0) {
        /* The reply does not fit: say so instead. */
        status.code    = DEVCOORD__V1__CODE__RESOURCE_EXHAUSTED;
        status.message = "reply too large";
        rv             = wire_pack(&reply, &hdr.base, NULL, NULL, 0, SIZE_MAX);
    }
    if (s->observe != NULL) {
        s->observe(s->observe_arg, call->method, (dc_code)status.code,
                   rpc_now_us() - call->arrived_us);
    }
    pipe     = call->pipe;
    deadline = call->deadline_ms;
    rpc_call_reset(call);
    if (call->frame_answer != NULL) {
        /* Answered on its own transport, also while closing: that one is still open. */
        call->frame_answer(call->frame_arg, rv == 0 ? nng_msg_body(reply) : NULL,
                           rv == 0 ? nng_msg_len(reply) : 0);
        if (rv == 0) {
            nng_msg_free(reply);
        }
        pthread_mutex_lock(&s->mtx);
        if (--s->busy == 0 && s->closing) {
            pthread_cond_broadcast(&s->idle_cv);
        }
        pthread_mutex_unlock(&s->mtx);
        free(call);
        return;
    }
    pthread_mutex_lock(&s->mtx);
    if (rv != 0 || s->closing) {
        /* Not even an error reply could be built: drop the request; the client times out.
         * Or the server is closing: closing its listener closed every connection, so the
         * reply has nowhere to go (and nng 1.5.2 leaks a message sent on a connection as it
         * closes). */
        if (rv == 0) {
            nng_msg_free(reply);
        }
        rpc_call_done_locked(call);
        pthread_mutex_unlock(&s->mtx);
        return;
    }
    /* The send may complete (and the call count as answered) before nng_ctx_send returns
     * here: rpc_server_free waits for this thread to leave it too, or it would close the
     * socket under it. */
    s->answering++;
    if (pipe != 0) {
        struct rpc_pipe_load *load = rpc_pipe_slot(s, pipe);
        load->pipe                 = pipe;
        if (load->sending++ == 0) {
            load->progress_ms = rpc_now_ms();
        }
        if (++s->sending == s->max_calls / 4 * 3) {
            pthread_cond_signal(&s->cv); /* a server thread sweeps from now on */
        }
        call->reply_pipe = pipe;
    }
    pthread_mutex_unlock(&s->mtx);
    call->sending = true;
    now           = rpc_now_ms();
    wait          = deadline == 0 ? RPC_REPLY_MS : deadline > now ? deadline - now : 0;
    nng_aio_set_timeout(call->aio,
                        (nng_duration)(wait < RPC_REPLY_MAX_MS ? wait : RPC_REPLY_MAX_MS) +
                            RPC_REPLY_SLACK_MS);
    nng_aio_set_msg(call->aio, reply);
    nng_ctx_send(call->ctx, call->aio);
    pthread_mutex_lock(&s->mtx);
    if (--s->answering == 0 && s->closing) {
        pthread_cond_broadcast(&s->idle_cv);
    }
    pthread_mutex_unlock(&s->mtx);
}

static void __attribute__((format(printf, 3, 4)))
rpc_call_fail(struct rpc_call *call, dc_code code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(call->status.message, sizeof(call->status.message), fmt, ap);
    va_end(ap);
    call->status.code = code;
    rpc_call_answer(NULL, call);
}

dc_code
rpc_request_open(const void *buf, size_t len, const ProtobufCServiceDescriptor *svc,
                 struct rpc_request *r, dc_status *st)
{
    ProtobufCAllocator alloc;
    const char *name;
    size_t plen;

    memset(r, 0, sizeof(*r));
    if (wire_split(buf, len, &r->frame, st) != DC_OK) {
        status_prefix(st, "undecodable request");
        return DC_INVALID_ARGUMENT;
    }
    if ((r->arena = arena_new(rpc_decode_budget(r->frame.header_len + r->frame.body_len))) ==
        NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    alloc     = arena_allocator(r->arena);
    r->header = devcoord__v1__request_header__unpack(&alloc, r->frame.header_len, r->frame.header);
    if (r->header == NULL) {
        if (arena_exhausted(r->arena)) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory decoding a request");
        }
        return status_set(st, DC_INVALID_ARGUMENT, "undecodable request header");
    }
    /* "/<package.Service>/<Method>" */
    name = r->header->method;
    plen = strlen(svc->name);
    if (name[0] != '/' || strncmp(name + 1, svc->name, plen) != 0 || name[plen + 1] != '/' ||
        (r->method = protobuf_c_service_descriptor_get_method_by_name(svc, name + plen + 2)) ==
            NULL) {
        return status_set(st, DC_UNIMPLEMENTED, "unknown method '%.200s'", name);
    }
    return DC_OK;
}

dc_code
rpc_request_body(struct rpc_request *r, dc_status *st)
{
    ProtobufCAllocator alloc = arena_allocator(r->arena);

    r->input =
        protobuf_c_message_unpack(r->method->input, &alloc, r->frame.body_len, r->frame.body);
    if (r->input != NULL) {
        return DC_OK;
    }
    if (arena_exhausted(r->arena)) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "%s request too costly to decode",
                          r->method->name);
    }
    return status_set(st, DC_INVALID_ARGUMENT, "undecodable %s request", r->method->name);
}

void
rpc_request_close(struct rpc_request *r)
{
    arena_free(r->arena);
    memset(r, 0, sizeof(*r));
}

/* Decodes the envelope of a received request: true when the call goes on to a handler,
 * false when it has been answered already (undecodable, unknown method). */
static bool
rpc_call_open(struct rpc_call *call)
{
    struct rpc_server *s  = call->server;
    struct rpc_request *r = &call->request;
    dc_code code;

    code = rpc_request_open(nng_msg_body(call->req), nng_msg_len(call->req), s->service->descriptor,
                            r, &call->status);
    if (r->header != NULL) {
        call->request_id = r->header->request_id;
        if (r->header->timeout_ms > 0) {
            call->deadline_ms = call->arrived_us / 1000 + r->header->timeout_ms;
        }
    }
    if (code != DC_OK) {
        rpc_call_answer(NULL, call);
        return false;
    }
    call->method = r->method;
    return true;
}

/* Checks deadline and token, decodes the body and hands the call to its handler. */
static void
rpc_call_dispatch(struct rpc_call *call)
{
    struct rpc_server *s  = call->server;
    struct rpc_request *r = &call->request;

    if (s->closing) {
        rpc_call_fail(call, DC_UNAVAILABLE, "server shutting down");
        return;
    }
    if (call->deadline_ms != 0 && rpc_now_ms() >= call->deadline_ms) {
        rpc_call_fail(call, DC_DEADLINE_EXCEEDED, "deadline passed before %s started",
                      call->method->name);
        return;
    }
    if ((s->authorize != NULL &&
         s->authorize(s->authorize_arg, call->method, r->header->token, &call->status) != DC_OK) ||
        rpc_request_body(r, &call->status) != DC_OK) {
        rpc_call_answer(NULL, call);
        return;
    }
    s->service->invoke(s->service, (unsigned)(call->method - s->service->descriptor->methods),
                       r->input, rpc_call_answer, call);
}

/* Opens one more context and arms it; false at the cap or out of memory. */
static bool
rpc_server_add_context(struct rpc_server *s)
{
    struct rpc_call *call;
    bool ok = false;

    pthread_mutex_lock(&s->mtx);
    if (s->closing || s->n_calls >= s->max_calls || (call = calloc(1, sizeof(*call))) == NULL) {
        goto out;
    }
    call->server = s;
    status_clear(&call->status);
    if (nng_aio_alloc(&call->aio, rpc_call_cb, call) != 0) {
        free(call);
    } else if (nng_ctx_open(&call->ctx, s->sock) != 0) {
        nng_aio_free(call->aio);
        free(call);
    } else {
        s->calls[s->n_calls++] = call;
        rpc_call_arm(call);
        ok = true;
    }
out:
    pthread_mutex_unlock(&s->mtx);
    return ok;
}

/* Adds a context when few are left waiting, so calls held by long handlers never leave the
 * server deaf. */
static void
rpc_server_grow(struct rpc_server *s)
{
    if (atomic_load(&s->receiving) < 2) {
        rpc_server_add_context(s);
    }
}

static void *
rpc_server_thread(void *arg)
{
    struct rpc_server *s = arg;
    struct rpc_call *call;

    thread_name_set("dc-rpc");
    for (;;) {
        pthread_mutex_lock(&s->mtx);
        while (s->head == NULL && !s->threads_exit && !s->trim_due && !rpc_server_sweep_due(s)) {
            if (rpc_server_pressed(s)) {
                clock_cond_wait_ms(&s->cv, &s->mtx, RPC_SWEEP_MS);
            } else {
                pthread_cond_wait(&s->cv, &s->mtx);
            }
        }
        if (rpc_server_sweep_due(s)) {
            rpc_server_sweep(s);
            continue;
        }
        if (s->trim_due && s->head == NULL && !s->threads_exit) {
            s->trim_due = false;
            pthread_mutex_unlock(&s->mtx);
            malloc_trim(0);
            continue;
        }
        if ((call = s->head) == NULL) {
            pthread_mutex_unlock(&s->mtx);
            return NULL;
        }
        s->head = call->next;
        if (s->head == NULL) {
            s->tail = NULL;
        }
        pthread_mutex_unlock(&s->mtx);
        rpc_server_grow(s);
        rpc_call_dispatch(call);
    }
}

/* Sets marks[m] for each method m named in names (NULL-terminated; NULL: none). */
static dc_code
rpc_server_mark(struct rpc_server *s, const char *const *names, bool *marks, dc_status *st)
{
    for (size_t i = 0; names != NULL && names[i] != NULL; i++) {
        const ProtobufCMethodDescriptor *m =
            protobuf_c_service_descriptor_get_method_by_name(s->service->descriptor, names[i]);
        if (m == NULL) {
            return status_set(st, DC_INTERNAL, "no method %s to run inline", names[i]);
        }
        marks[m - s->service->descriptor->methods] = true;
    }
    return DC_OK;
}

/* nng callback: a request arrived, or a reply went out. Never blocks: requests are queued
 * for the server threads. */
static void
rpc_call_cb(void *arg)
{
    struct rpc_call *call = arg;
    struct rpc_server *s  = call->server;
    int rv                = nng_aio_result(call->aio);
    int id;

    if (call->sending) {
        if (rv != 0) {
            nng_msg_free(nng_aio_get_msg(call->aio));
        }
        pthread_mutex_lock(&s->mtx);
        if (call->reply_pipe != 0) {
            struct rpc_pipe_load *load = rpc_pipe_slot(s, call->reply_pipe);
            if (rv == 0) {
                load->progress_ms = rpc_now_ms();
            }
            s->sending--;
            if (--load->sending == 0 && load->bytes == 0) {
                rpc_pipe_remove(s, load);
            }
            call->reply_pipe = 0;
        }
        rpc_call_done_locked(call);
        pthread_mutex_unlock(&s->mtx);
        return;
    }
    atomic_fetch_sub(&s->receiving, 1);
    if (rv != 0) {
        /* Closed or cancelled: the context stays idle. Anything else: listen again. */
        pthread_mutex_lock(&s->mtx);
        if (!s->closing && rv != NNG_ECLOSED && rv != NNG_ECANCELED) {
            rpc_call_arm(call);
        }
        pthread_mutex_unlock(&s->mtx);
        return;
    }
    call->req        = nng_aio_get_msg(call->aio);
    call->arrived_us = rpc_now_us();
    atomic_fetch_add(&s->reqs_taken, 1);
    id         = nng_pipe_id(nng_msg_get_pipe(call->req));
    call->pipe = id > 0 ? (uint32_t)id : 0;
    nng_aio_set_msg(call->aio, NULL);
    pthread_mutex_lock(&s->mtx);
    s->busy++;
    pthread_mutex_unlock(&s->mtx);
    rpc_call_take(call);
}

/* A request in call->req (counted busy): admitted, decoded and dispatched, inline or on the
 * server threads, or answered at once. */
static void
rpc_call_take(struct rpc_call *call)
{
    struct rpc_server *s = call->server;
    size_t method;
    bool admitted, unread = false;

    if (call->frame_answer == NULL) {
        rpc_server_grow(s); /* whatever becomes of this one, others are heard meanwhile */
    }
    pthread_mutex_lock(&s->mtx);
    if (call->pipe != 0) {
        struct rpc_pipe_load *load = rpc_pipe_slot(s, call->pipe);
        unread                     = load->pipe == call->pipe && rpc_pipe_unread(s, load);
    }
    admitted = !unread && rpc_server_admit(s, call, nng_msg_len(call->req));
    if (unread) {
        /* Its connection does not take its replies: no more are made for it. */
        s->dropped_unread++;
        if ((s->dropped_unread & (s->dropped_unread - 1)) == 0) { /* 1, 2, 4, ... */
            log_warn("a connection does not read its replies: %llu requests dropped unanswered",
                     (unsigned long long)s->dropped_unread);
        }
        nng_msg_free(call->req);
        call->req  = NULL;
        call->pipe = 0;
        atomic_fetch_add(&s->reqs_let_go, 1);
        rpc_call_done_locked(call);
        pthread_mutex_unlock(&s->mtx);
        return;
    }
    pthread_mutex_unlock(&s->mtx);
    if (!admitted) {
        /* Answered at once, undecoded: a refusal costs no memory beyond its reply. */
        rpc_call_answer(NULL, call);
        return;
    }
    if (!rpc_call_open(call)) {
        return;
    }
    method = (size_t)(call->method - s->service->descriptor->methods);
    if (call->frame_answer != NULL && (call->frame_methods & RPC_METHOD_BIT(method)) == 0) {
        rpc_call_fail(call, DC_UNIMPLEMENTED, "%s is not served on this link; call it as an RPC",
                      call->method->name);
        return;
    }
    /* Cheap methods run here, on nng's thread (or a frame's): no hand-off. They never wait;
     * the rest goes to the server threads. */
    if (s->inline_method[method] ||
        (s->inline_small[method] && nng_msg_len(call->req) <= s->inline_small_max)) {
        rpc_call_dispatch(call);
        return;
    }
    pthread_mutex_lock(&s->mtx);
    call->next = NULL;
    if (s->tail != NULL) {
        s->tail->next = call;
    } else {
        s->head = call;
    }
    s->tail = call;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mtx);
}

void
rpc_server_serve_frame(struct rpc_server *s, const void *frame, size_t len, uint64_t methods,
                       rpc_frame_answer_fn answer, void *arg)
{
    struct rpc_call *call = calloc(1, sizeof(*call));
    nng_msg *req          = NULL;

    if (call == NULL || nng_msg_alloc(&req, len) != 0) {
        free(call);
        answer(arg, NULL, 0);
        return;
    }
    memcpy(nng_msg_body(req), frame, len);
    call->server = s;
    call->req    = req;
    atomic_fetch_add(&s->reqs_taken, 1);
    call->arrived_us    = rpc_now_us();
    call->frame_answer  = answer;
    call->frame_arg     = arg;
    call->frame_methods = methods;
    status_clear(&call->status);
    pthread_mutex_lock(&s->mtx);
    s->busy++;
    pthread_mutex_unlock(&s->mtx);
    rpc_call_take(call);
}

dc_code
rpc_server_start(const struct rpc_server_opts *opts, struct rpc_server **out, dc_status *st)
{
    struct rpc_server *s;
    unsigned initial;
    dc_code code = DC_OK;
    int rv;

    if ((s = calloc(1, sizeof(*s))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&s->mtx, NULL);
    pthread_mutex_init(&s->conn_mtx, NULL);
    clock_cond_init(&s->cv);
    clock_cond_init(&s->idle_cv);
    s->service = opts->service;
    if (s->service->descriptor->n_methods > RPC_MAX_METHODS) {
        code = status_set(st, DC_INTERNAL, "service with more than %d methods", RPC_MAX_METHODS);
        goto fail;
    }
    if ((code = rpc_server_mark(s, opts->inline_methods, s->inline_method, st)) != DC_OK ||
        (code = rpc_server_mark(s, opts->inline_small_methods, s->inline_small, st)) != DC_OK) {
        goto fail;
    }
    s->inline_small_max = opts->inline_small_max_bytes;
    s->max_message   = opts->max_message_bytes ? opts->max_message_bytes : RPC_DEFAULT_MAX_MESSAGE;
    s->authorize     = opts->authorize;
    s->authorize_arg = opts->authorize_arg;
    s->observe       = opts->observe;
    s->observe_arg   = opts->observe_arg;
    s->max_calls     = opts->max_contexts ? opts->max_contexts : RPC_DEFAULT_CONTEXTS;
    s->n_threads     = opts->threads ? opts->threads : 2;
    initial          = opts->contexts ? opts->contexts : 16;
    if (initial > s->max_calls) {
        initial = s->max_calls;
    }

    s->calls     = calloc(s->max_calls, sizeof(*s->calls));
    s->threads   = calloc(s->n_threads, sizeof(*s->threads));
    s->max_conns = opts->max_connections;
    if (s->max_conns > 0) {
        s->conns = calloc(s->max_conns, sizeof(*s->conns));
    }
    if (s->calls == NULL || s->threads == NULL || (s->max_conns > 0 && s->conns == NULL) ||
        rpc_server_admission_init(s, opts) != 0) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    if ((rv = nng_rep0_open(&s->sock)) != 0) {
        code = wire_nng_status(rv, "rep socket", st);
        goto fail;
    }
    s->on_disconnect     = opts->on_disconnect;
    s->on_disconnect_arg = opts->on_disconnect_arg;
    if (strncmp(opts->url, "tls+tcp://", 10) == 0) {
        /* Pipes are recorded from the first one on, before the listener starts. */
        s->handshake =
            handshake_watch_new(opts->handshake_timeout_ms != 0 ? opts->handshake_timeout_ms
                                                                : RPC_DEFAULT_HANDSHAKE_TIMEOUT_MS);
        if (s->handshake == NULL ||
            (rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_POST, rpc_server_pipe_cb, s)) != 0 ||
            (rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, rpc_server_pipe_cb, s)) != 0) {
            code = s->handshake == NULL ? status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory")
                                        : wire_nng_status(rv, "pipe notify", st);
            goto fail_sock;
        }
    } else if ((rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, rpc_server_pipe_cb, s)) != 0) {
        code = wire_nng_status(rv, "pipe notify", st);
        goto fail_sock;
    }
    if ((rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, rpc_server_pipe_cb, s)) != 0) {
        code = wire_nng_status(rv, "pipe notify", st);
        goto fail_sock;
    }
    if ((rv = rpc_socket_limits(s->sock, s->max_message)) != 0 ||
        (rv = nng_listener_create(&s->listener, s->sock, opts->url)) != 0 ||
        (opts->tls != NULL &&
         (rv = nng_listener_set_ptr(s->listener, NNG_OPT_TLS_CONFIG, opts->tls)) != 0) ||
        (rv = nng_listener_set_size(s->listener, NNG_OPT_RECVMAXSZ,
                                    s->max_message + RPC_FRAME_OVERHEAD)) != 0 ||
        (rv = nng_listener_start(s->listener, 0)) != 0) {
        char what[300];
        snprintf(what, sizeof(what), "listen on %s", opts->url);
        code = wire_nng_status(rv, what, st);
        goto fail_sock;
    }
    if (s->handshake != NULL &&
        !handshake_watch_start(s->handshake, (uint16_t)rpc_server_port(s))) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "cannot start the handshake watch");
        goto fail_sock;
    }
    for (unsigned i = 0; i < s->n_threads; i++) {
        if (pthread_create(&s->threads[i], NULL, rpc_server_thread, s) != 0) {
            s->n_threads = i;
            code         = status_set(st, DC_RESOURCE_EXHAUSTED, "cannot start server threads");
            goto fail_threads;
        }
    }
    for (unsigned i = 0; i < initial; i++) {
        rpc_server_add_context(s);
    }
    if (s->n_calls == 0) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "cannot open server contexts");
        goto fail_threads;
    }
    *out = s;
    return DC_OK;

fail_threads:
    rpc_server_close(s);
    rpc_server_free(s);
    return code;
fail_sock:
    nng_close(s->sock);
    handshake_watch_stop(s->handshake);
fail:
    free(s->calls);
    free(s->threads);
    free(s->pipes);
    free(s->conns);
    pthread_cond_destroy(&s->idle_cv);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->conn_mtx);
    pthread_mutex_destroy(&s->mtx);
    free(s);
    return code;
}

int
rpc_server_port(const struct rpc_server *s)
{
    nng_sockaddr sa;

    if (nng_listener_get_addr(s->listener, NNG_OPT_LOCADDR, &sa) != 0) {
        return 0;
    }
    if (sa.s_family == NNG_AF_INET) {
        return ntohs(sa.s_in.sa_port);
    }
    if (sa.s_family == NNG_AF_INET6) {
        return ntohs(sa.s_in6.sa_port);
    }
    return 0;
}

void
rpc_server_close(struct rpc_server *s)
{
    pthread_mutex_lock(&s->mtx);
    s->closing = true;
    pthread_mutex_unlock(&s->mtx);
    /* Idle contexts stop waiting; busy ones finish their call and then stay idle. */
    nng_listener_close(s->listener);
}

/*
 * nng 1.5.2's tcp transport can start reading a request body on a connection that is already
 * closed (tcptran_pipe_recv_cb; fixed in nng 1.6.0, PR #1636), and nng_close then waits for
 * that read forever. So the close runs on a thread of its own and is waited for at most
 * RPC_CLOSE_BOUND_MS (rpc.h); past that it is abandoned (rpc_server_abandoned() says so, and
 * nng_fini, which would wait for it too, must not be called).
 */
static atomic_uint close_bound_ms = RPC_CLOSE_BOUND_MS;
static atomic_bool close_abandoned;

void
rpc_close_bound_set(unsigned ms)
{
    atomic_store(&close_bound_ms, ms);
}

/* What an abandoned close left behind (a server, a client): nng may still touch it, so it is
 * never freed. Kept here so that it stays reachable: a leak checker then tells it from a real
 * leak (valgrind's "still reachable", not "definitely lost"). One close a socket, and only when
 * nng 1.5.2 hangs: a few in a process's life; past RPC_LEFT_BEHIND_MAX a leak checker reports
 * them. */
#define RPC_LEFT_BEHIND_MAX 64
static void *left_behind[RPC_LEFT_BEHIND_MAX];
static size_t n_left_behind;
static pthread_mutex_t left_behind_mtx = PTHREAD_MUTEX_INITIALIZER;

void
rpc_left_behind(void *p)
{
    pthread_mutex_lock(&left_behind_mtx);
    if (n_left_behind < RPC_LEFT_BEHIND_MAX) {
        left_behind[n_left_behind++] = p;
    }
    pthread_mutex_unlock(&left_behind_mtx);
}

struct closer {
    nng_socket sock;
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    bool done;
    bool abandoned; /* the waiter gave up: the thread frees c when its close ends */
};

static void *
closer_run(void *arg)
{
    struct closer *c = arg;
    bool abandoned;

    thread_name_set("dc-rpc-close");
    nng_close(c->sock);
    pthread_mutex_lock(&c->mtx);
    c->done   = true;
    abandoned = c->abandoned;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mtx);
    if (abandoned) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mtx);
        free(c);
    }
    return NULL;
}

bool
rpc_close_bounded(nng_socket sock)
{
    struct closer *c = calloc(1, sizeof(*c));
    pthread_t t;
    bool done;

    if (c == NULL) {
        nng_close(sock);
        return true;
    }
    c->sock = sock;
    pthread_mutex_init(&c->mtx, NULL);
    clock_cond_init(&c->cv);
    if (pthread_create(&t, NULL, closer_run, c) != 0) {
        closer_run(c);
        done = true;
    } else {
        uint64_t until = rpc_now_ms() + atomic_load(&close_bound_ms), left;
        pthread_mutex_lock(&c->mtx);
        while (!c->done && (left = rpc_ms_until(until)) > 0) {
            clock_cond_wait_ms(&c->cv, &c->mtx, (unsigned)left + 1);
        }
        done         = c->done;
        c->abandoned = !done;
        pthread_mutex_unlock(&c->mtx);
        if (!done) {
            atomic_store(&close_abandoned, true);
            pthread_detach(t);
            return false; /* the thread frees c if its close ever ends */
        }
        pthread_join(t, NULL);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mtx);
    free(c);
    return done;
}

bool
rpc_server_abandoned(void)
{
    return atomic_load(&close_abandoned);
}

void
rpc_server_connections(struct rpc_server *s, struct rpc_connections *out)
{
    pthread_mutex_lock(&s->conn_mtx);
    out->open    = s->n_conns;
    out->max     = s->max_conns;
    out->refused = s->conns_refused;
    pthread_mutex_unlock(&s->conn_mtx);
    pthread_mutex_lock(&s->mtx);
    out->closed_unread   = s->closed_unread;
    out->replies_waiting = s->sending;
    pthread_mutex_unlock(&s->mtx);
}

void
rpc_server_requests(const struct rpc_server *s, uint64_t *taken, uint64_t *let_go)
{
    *let_go = atomic_load(&s->reqs_let_go);
    *taken  = atomic_load(&s->reqs_taken);
}

void
rpc_server_free(struct rpc_server *s)
{
    uint64_t taken, let_go;
    unsigned n;

    if (s == NULL) {
        return;
    }
    pthread_mutex_lock(&s->mtx);
    s->closing = true;
    /* Calls already queued or in a handler are answered first, and every answer has left
     * nng_ctx_send. */
    while (s->busy > 0 || s->answering > 0) {
        pthread_cond_wait(&s->idle_cv, &s->mtx);
    }
    s->threads_exit = true;
    pthread_cond_broadcast(&s->cv);
    n = s->n_threads;
    pthread_mutex_unlock(&s->mtx);
    for (unsigned i = 0; i < n; i++) {
        pthread_join(s->threads[i], NULL);
    }
    /* No callback may be inside an nng call on a context when the socket goes. */
    for (unsigned i = 0; i < s->n_calls; i++) {
        nng_aio_stop(s->calls[i]->aio);
    }
    if (!rpc_close_bounded(s->sock)) {
        /* The server is left as it is: the stuck close may still reach any of it. */
        log_warn("rpc server: closing its socket did not finish within %d ms (nng 1.5.2 "
                 "waits for a read on a connection already closed, fixed in nng 1.6.0); left "
                 "behind",
                 RPC_CLOSE_BOUND_MS);
        rpc_left_behind(s);
        return;
    }
    /* After the socket: closing it reports its pipes' removal to the watch. */
    handshake_watch_stop(s->handshake);
    for (unsigned i = 0; i < s->n_calls; i++) {
        nng_aio_free(s->calls[i]->aio);
        rpc_call_reset(s->calls[i]);
        free(s->calls[i]);
    }
    rpc_server_requests(s, &taken, &let_go);
    if (taken == let_go) {
        log_info("rpc server closed: %llu requests taken, %llu let go", (unsigned long long)taken,
                 (unsigned long long)let_go);
    } else {
        log_warn("rpc server closed: %llu requests taken, only %llu let go",
                 (unsigned long long)taken, (unsigned long long)let_go);
    }
    free(s->calls);
    free(s->threads);
    free(s->pipes);
    free(s->conns);
    pthread_cond_destroy(&s->idle_cv);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->conn_mtx);
    pthread_mutex_destroy(&s->mtx);
    free(s);
}
