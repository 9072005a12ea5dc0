/*
 * gRPC-style unary calls over nng req0/rep0 (design §6).
 *
 * Server: requests arrive on many nng contexts at once; nng's callbacks only queue them, and
 * the server's own threads decode them (bounded by a budgeted arena), check the deadline
 * and the token, and dispatch through the protobuf-c service descriptor to the handler. A
 * handler answers by calling the closure it was given, at once or later from any thread;
 * until then it may keep the input message. Contexts are added under load up to a cap, so
 * long-running calls never starve short ones; what they may hold is capped too: a request
 * that would take the bytes received and not yet answered over a limit, on its connection
 * or in all, is refused at once with RESOURCE_EXHAUSTED, before anything is decoded.
 *
 * Client: one handle shared by many threads; each call gets its own nng context, a deadline,
 * and no silent resend (at most once): a call whose connection drops fails with UNAVAILABLE
 * at once. The dialer reconnects with backoff, so a client may start before its server.
 */
#ifndef DEVCOORD_COMMON_RPC_H
#define DEVCOORD_COMMON_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <protobuf-c/protobuf-c.h>

#include "status.h"
#include "wire.h"

/* Default limits (design §9 limits.max_message_bytes). */
#define RPC_DEFAULT_MAX_MESSAGE (4u * 1024 * 1024)
/* Room a frame needs besides its attachment: envelope and body of a chunk message. */
#define RPC_FRAME_OVERHEAD (16u * 1024)

/* Default admission limits (limits.max_inflight_bytes, ..._per_connection). */
#define RPC_DEFAULT_MAX_INFLIGHT                (64u * 1024 * 1024)
#define RPC_DEFAULT_MAX_INFLIGHT_PER_CONNECTION (16u * 1024 * 1024)
/* A worker's data plane pipelines by design: every op keeps up to 8 Exchange chunks of
 * 512 KiB in flight to each peer over one connection, and clients stream tensor chunks, so
 * its defaults leave room for 32 concurrent ops between two workers. */
#define RPC_WORKER_DEFAULT_MAX_INFLIGHT                (1024u * 1024 * 1024)
#define RPC_WORKER_DEFAULT_MAX_INFLIGHT_PER_CONNECTION (128u * 1024 * 1024)

/* ---- server ---------------------------------------------------------------------------- */

struct rpc_server;
struct rpc_call;

/* Decides whether `token` may call `method`: DC_OK, DC_UNAUTHENTICATED or
 * DC_PERMISSION_DENIED (with a message in st). */
typedef dc_code (*rpc_authorize_fn)(void *arg, const ProtobufCMethodDescriptor *method,
                                    const char *token, dc_status *st);
/* Told of every answered call: method (NULL when the request named none we know), final
 * code and time from arrival to reply. Runs on any thread; must not block. */
typedef void (*rpc_observe_fn)(void *arg, const ProtobufCMethodDescriptor *method, dc_code code,
                               uint64_t elapsed_us);

struct rpc_server_opts {
    const char *url;
    ProtobufCService *service; /* every handler set; must outlive the server */
    size_t max_message_bytes;  /* 0: RPC_DEFAULT_MAX_MESSAGE */
    unsigned contexts;         /* contexts armed at start (0: 16) */
    unsigned max_contexts;     /* cap when growing under load (0: 16384) */
    unsigned threads;          /* handler threads (0: 2) */
    rpc_authorize_fn authorize;
    void *authorize_arg;
    rpc_observe_fn observe;
    void *observe_arg;
    nng_tls_config *tls; /* for tls+tcp:// urls; the server takes a hold on it */
    /* NULL-terminated names of methods whose handlers are cheap and never wait: they run on
     * nng's callback thread, saving a hand-off. Everything else runs on the server threads. */
    const char *const *inline_methods;
    /* NULL-terminated names of methods that run inline when their request is at most
     * inline_small_max_bytes long (small requests are cheap ones), else on the server
     * threads. */
    const char *const *inline_small_methods;
    size_t inline_small_max_bytes;
    /* Admission: request bytes received and not yet answered, on all connections and on
     * one. A request over either is answered RESOURCE_EXHAUSTED at once, undecoded; one
     * request is always taken when nothing else is in flight there. 0: the defaults. */
    size_t max_inflight_bytes;
    size_t max_inflight_bytes_per_connection;
    /* Connections open at once; one more is closed as nng adds it, before it carries a
     * request (its client sees the connection lost), and logged. 0: no bound. */
    unsigned max_connections;
    /* tls+tcp:// only: a connection that has not finished its TLS handshake this long after
     * it was accepted is shut down (common/handshake.h says why nng does not). 0: the
     * default. */
    uint32_t handshake_timeout_ms;
    /* Told when a connection closes, with its pipe id (as rpc_call_pipe): a handler that
     * parks calls can let go of those whose caller left. nng thread: it must not block nor
     * answer calls; NULL for none. */
    void (*on_disconnect)(void *arg, uint32_t pipe);
    void *on_disconnect_arg;
};

#define RPC_DEFAULT_HANDSHAKE_TIMEOUT_MS 10000u
/* A burst that had this many request bytes in flight gives its memory back when it ends. */
#define RPC_TRIM_AFTER_BYTES ((size_t)32 << 20)

#define RPC_MAX_METHODS 64

dc_code rpc_server_start(const struct rpc_server_opts *opts, struct rpc_server **out,
                         dc_status *st);

/* The TCP port the server listens on (useful with port 0), or 0. */
int rpc_server_port(const struct rpc_server *s);

/* Stops taking new calls: closes the listener, which in nng closes every connection it
 * accepted, so callers waiting hear the connection drop (UNAVAILABLE at once). Calls already
 * taken still run until their handlers answer, but those answers are dropped: no connection
 * is left to carry them. */
void rpc_server_close(struct rpc_server *s);

/* RPC connections open now, the bound (0: none), those refused so far past it, and those
 * closed for not reading their replies while replies waiting held most of the contexts; and
 * the replies waiting for their connections to take them now. */
struct rpc_connections {
    unsigned open, max;
    uint64_t refused;
    uint64_t closed_unread;
    unsigned replies_waiting;
};
void rpc_server_connections(struct rpc_server *s, struct rpc_connections *out);

/* Request messages taken from nng so far, and those let go of (freed, or reused as their
 * reply): equal whenever no call is under way. rpc_server_free logs both. */
void rpc_server_requests(const struct rpc_server *s, uint64_t *taken, uint64_t *let_go);

/* Waits until every taken call has been answered, then frees everything. The owner must
 * make its handlers answer (fail in-flight work) before calling this. */
void rpc_server_free(struct rpc_server *s);
/* Whether an rpc_server_free gave up waiting for nng_close (nng 1.5.2's hang on a connection
 * closed mid-read); then nng_fini would wait forever too and must not be called. */
bool rpc_server_abandoned(void);
/* nng_close(sock) on a thread of its own, waited for at most RPC_CLOSE_BOUND_MS (nng 1.5.2's
 * tcp close can wait forever for a read under way, rpc_server.c): true when it closed; false
 * when it was abandoned, and then whatever nng may still touch of the socket's must stay as it
 * is. */
#define RPC_CLOSE_BOUND_MS 3000
bool rpc_close_bounded(nng_socket sock);
/* For tests: the bound from now on (0: abandon every close not already done). */
void rpc_close_bound_set(unsigned ms);
/* Keeps p, left behind by an abandoned close, reachable until the process ends. */
void rpc_left_behind(void *p);

/* Where a frame's reply goes (rpc_server_serve_frame): the reply frame's bytes, valid during
 * the call, or NULL and 0 when not even an error reply could be built. Any thread. */
typedef void (*rpc_frame_answer_fn)(void *arg, const void *reply, size_t len);

/* The bit of method index m in rpc_server_serve_frame's `methods`. */
#define RPC_METHOD_BIT(m) ((uint64_t)1 << (m))

/* Serves one request frame (as a client's rpc_call sends it: wire.h's header and body) that
 * came over another transport: admitted, authorized, decoded and dispatched as if it had come
 * on the socket (inline methods run on the caller's thread, the rest on the server threads);
 * answer gets the reply frame exactly once, maybe before this returns. Only the methods whose
 * RPC_METHOD_BIT is set in `methods` are served so; any other is answered UNIMPLEMENTED
 * before its body is decoded (a link serves the calls it was made for, nothing else). Calls
 * so served count as busy until answered: the caller must stop serving frames before
 * rpc_server_free. */
void rpc_server_serve_frame(struct rpc_server *s, const void *frame, size_t len, uint64_t methods,
                            rpc_frame_answer_fn answer, void *arg);

/* The call's status: a handler fills it (status_set) and then calls closure(NULL, call) to
 * answer with an error, or closure(msg, call) to answer with a body (and the status, if it
 * set one: a refused SubmitOp still carries its body). */
dc_status *rpc_call_status(struct rpc_call *call);
/* Bytes that came after the request body (chunk data); valid until the call is answered. */
const void *rpc_call_attachment(struct rpc_call *call, size_t *len);
/* Bytes to send after the reply body; copied when the closure runs, so they must stay valid
 * until then. */
void rpc_call_set_reply_attachment(struct rpc_call *call, const void *data, size_t len);
/* Absolute deadline on the monotonic clock in ms (rpc_now_ms), or 0 for none. */
uint64_t rpc_call_deadline_ms(const struct rpc_call *call);
/* The connection (nng pipe id) the call came on; 0 when unknown. */
uint32_t rpc_call_pipe(const struct rpc_call *call);
/* The bearer token the caller sent ("" for none), already accepted by the authorize
 * callback; for handlers that bind what a call may name to who makes it. Valid until the call
 * is answered. */
const char *rpc_call_token(const struct rpc_call *call);

/* Decoding a request as the server does, in two steps so a caller can be refused (token)
 * before its body is decoded. Memory comes from r->arena, sized for the frame; close frees
 * it. open: frame, header and method (UNIMPLEMENTED for a method svc lacks); body: the
 * method's input message. */
struct rpc_request {
    struct wire_frame frame;
    struct arena *arena;
    struct Devcoord__V1__RequestHeader *header;
    const ProtobufCMethodDescriptor *method;
    ProtobufCMessage *input;
};

dc_code rpc_request_open(const void *buf, size_t len, const ProtobufCServiceDescriptor *svc,
                         struct rpc_request *r, dc_status *st);
dc_code rpc_request_body(struct rpc_request *r, dc_status *st);
void rpc_request_close(struct rpc_request *r);

/* ---- client ---------------------------------------------------------------------------- */

struct rpc_client;

struct rpc_client_opts {
    const char *url;
    size_t max_message_bytes;  /* largest reply accepted; 0: RPC_DEFAULT_MAX_MESSAGE */
    uint32_t reconnect_min_ms; /* 0: 100 */
    uint32_t reconnect_max_ms; /* 0: 2000 */
    /* Fail rpc_client_open with UNAVAILABLE when the server cannot be reached now
     * (a CLI wants that); otherwise keep dialing in the background (daemons). */
    bool connect_now;
    const char *token; /* sent with every call; copied */
    nng_tls_config *tls;
    /* Told when the connection comes up (true) or drops (false); nng thread, no blocking. */
    void (*on_connection)(void *arg, bool up);
    void *on_connection_arg;
};

dc_code rpc_client_open(const struct rpc_client_opts *opts, struct rpc_client **out, dc_status *st);
/* Fails calls still in flight with CANCELLED and frees the client. Must not be called from
 * a completion callback. */
void rpc_client_close(struct rpc_client *c);
bool rpc_client_connected(const struct rpc_client *c);
/* For tests: hook (NULL: none) runs on an asynchronous call's completion thread between its
 * request's send and its reply's receive. */
void rpc_client_set_sent_hook(void (*hook)(void));
/* Changes the reconnect backoff of a running client. */
void rpc_client_set_reconnect(struct rpc_client *c, uint32_t min_ms, uint32_t max_ms);

/* A decoded reply. body is NULL when the server sent none. Free with rpc_reply_free. */
struct rpc_reply {
    ProtobufCMessage *body;
    /* The body's bytes, left undecoded (body NULL) for a call whose method carried
     * RPC_RAW_BODY: for a caller that reads them faster itself (pbwire). */
    const uint8_t *raw_body;
    size_t raw_body_len;
    const uint8_t *attachment;
    size_t attachment_len;
    nng_msg *msg;        /* internal */
    struct arena *arena; /* internal */
};

void rpc_reply_free(struct rpc_reply *r);

/* A call's request frame as rpc_call sends it, for another transport (the coordinator's
 * control link to workers): method `method` of svc (below svc->n_methods) with request,
 * attachment, token ("" for NULL), request_id and timeout; RESOURCE_EXHAUSTED past
 * max_message. The caller owns *out. */
dc_code rpc_request_pack(const ProtobufCServiceDescriptor *svc, unsigned method,
                         const ProtobufCMessage *request, const void *attachment,
                         size_t attachment_len, const char *token, uint64_t request_id,
                         uint32_t timeout_ms, size_t max_message, nng_msg **out, dc_status *st);
/* A reply frame in msg (taken: freed with r) decoded as rpc_call decodes it: the status in st
 * and returned, the body (method's output; raw: left as bytes) in r. from names the server
 * in messages. Free r with rpc_reply_free whatever is returned. */
dc_code rpc_reply_decode(const ProtobufCMethodDescriptor *method, bool raw, uint64_t request_id,
                         const char *from, nng_msg *msg, struct rpc_reply *r, dc_status *st);

/* Or'ed into a call's method number: the reply's body comes as bytes (raw_body), not
 * decoded. */
#define RPC_RAW_BODY 0x80000000u

/* Calls method number `method` of service `svc` and waits for the reply, at most
 * timeout_ms (0: none). Returns the call's code, with st telling why; on return *reply holds
 * whatever body the server sent, even with an error code. */
dc_code rpc_call(struct rpc_client *c, const ProtobufCServiceDescriptor *svc, unsigned method,
                 const ProtobufCMessage *request, const void *attachment, size_t attachment_len,
                 uint32_t timeout_ms, struct rpc_reply *reply, dc_status *st);

/* Completion of an asynchronous call; runs on an nng thread and must not block. The callee
 * owns `reply` only for the duration of the callback unless it sets *keep = true, in which
 * case it frees it later with rpc_reply_free. */
typedef void (*rpc_done_fn)(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply,
                            bool *keep);

/* Starts a call; done runs exactly once (unless this returns an error, in which case it
 * never runs). */
dc_code rpc_call_async(struct rpc_client *c, const ProtobufCServiceDescriptor *svc, unsigned method,
                       const ProtobufCMessage *request, const void *attachment,
                       size_t attachment_len, uint32_t timeout_ms, rpc_done_fn done, void *arg,
                       dc_status *st);

/* ---- helpers ----------------------------------------------------------------------------- */

uint64_t rpc_now_ms(void);
uint64_t rpc_now_us(void);
/* Whether a RESOURCE_EXHAUSTED status is a request refused for its size (over the message
 * limit, or over the bytes a server lets be in flight), which a smaller request may pass,
 * rather than a handler's answer. */
bool rpc_refused_for_size(const dc_status *st);
/* How those refusals' messages start and end (rpc_server.c, rpc_client.c). */
#define RPC_REFUSED_IN_FLIGHT  "request of "
#define RPC_REFUSED_OVER_LIMIT "-byte message limit"
/* Milliseconds from now until `until` (rpc_now_ms's clock), 0 once it has passed, capped at
 * INT32_MAX (what nng's durations hold). The clock is read once: `until - rpc_now_ms()` after
 * a separate check wraps to ~49 days if the moment passes between the two reads. */
uint64_t rpc_ms_until(uint64_t until);

/* "/devcoord.v1.Coordinator/SubmitOp" into buf. */
void rpc_method_path(const ProtobufCServiceDescriptor *svc, unsigned method, char *buf, size_t cap);

/* Decode budget for a message of len bytes: what its unpacked form may cost. */
size_t rpc_decode_budget(size_t len);

/* Sets the receive limit and the at-most-once options on a socket. */
int rpc_socket_limits(nng_socket sock, size_t max_message_bytes);

#endif
