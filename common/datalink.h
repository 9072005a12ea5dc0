/*
 * The data link between workers: raw byte streams (nng's stream API, tcp:// or tls+tcp://)
 * that carry bulk bytes of group calls with a small fixed header and no protobuf around the
 * payload. The payload goes straight from the sender's memory onto the wire (a scatter/gather
 * iovec of header and payload) and from the wire into the memory the receiver names for it.
 *
 * Each worker listens on a data port of its own (the listen address's host, a port the kernel
 * picks) and tells its peers that port and a random secret through the authenticated RPC
 * (GroupLink): whoever may call GroupLink (the worker role's token, over TLS when the RPC
 * address is tls+tcp://) learns the secret, and a connection to the data port must show it in
 * its first frame (HELLO) before anything else is read. A connection is one direction: the
 * dialer sends, the listener's side receives; a worker dials each peer once and keeps it.
 *
 * Frames (all integers little-endian, DLINK_HDR_SIZE bytes of header, then `length` bytes):
 *   magic u32 "DCDL" | version u8 | kind u8 | flags u16 | from u32 | length u32 |
 *   group u64 (hash of the group id) | generation u64 | seq u64 | offset u64 | total u64
 * A header that does not decode (wrong magic, version or kind, a length above the limit
 * (limits.max_message_bytes), offset + length beyond total) drops the connection: its payload
 * is never allocated or read.
 */
#ifndef DEVCOORD_DATALINK_H
#define DEVCOORD_DATALINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#include "dlframe.h"
#include "status.h"

struct dlink_conn;

/* What a receiving connection asks of its owner (reader threads; may block briefly on the
 * owner's lock, never on the network). */
struct dlink_events {
    void *arg;
    /* A data frame's header came from the worker whose RPC address is `peer`: where its
     * payload goes (room for h->length bytes). *dst NULL: the payload is read and dropped
     * (a group or call no longer here). *pin is handed back to frame_end. *wait_ms (0 as
     * given: the link's own bound, the handshake's plus a millisecond per kilobyte): at most
     * that long for the payload, past which the connection drops. NULL (frame_end and
     * peer_lost unused then): only call and control links are taken, a connection showing
     * the peers' secret without DLINK_HELLO_CONTROL is refused. */
    void (*frame_begin)(void *arg, const char *peer, const struct dlink_hdr *h, uint8_t **dst,
                        void **pin, uint32_t *wait_ms);
    /* The payload is in (ok) or the connection failed while reading it (!ok). */
    void (*frame_end)(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok);
    /* An authenticated connection from `peer` dropped (not when the server closes). */
    void (*peer_lost)(void *arg, const char *peer, const dc_status *why);
    /* A DLINK_FLAG_OP frame's payload is in `payload` (h->length bytes, valid during the call;
     * may block until the op can take it, bounded by the op's deadline). false: the frame is
     * refused (it names bytes outside its op, or comes from a worker the op does not list)
     * and the connection drops. NULL: such frames are refused. */
    bool (*op_frame)(void *arg, const char *peer, const struct dlink_hdr *h, const uint8_t *payload,
                     dc_status *why);
    /* A call link's DLINK_CALL (a rank's group call): pb is its packed GroupCallRequest, data
     * its bytes, both valid until it is answered (data longer when call_place gave it: pin is
     * then call_place's, the handler's to give back, else NULL). It must be answered exactly
     * once, with dlink_call_answer or dlink_call_answer_ref,
     * from any thread (maybe before this returns); the connection reads nothing more until
     * then. NULL: call links are refused. */
    void (*call)(void *arg, struct dlink_conn *c, const uint8_t *pb, size_t pb_len,
                 const uint8_t *data, size_t bytes, void *pin);
    /* The most bytes a DLINK_CALL frame may carry (limits.max_message_bytes). */
    uint64_t call_max;
    /* A DLINK_PART frame's payload (h->length bytes, at most DLINK_CHUNK) is in `payload`,
     * valid during the call. false: refused (why says so) and the connection drops. NULL:
     * such frames are refused. */
    bool (*part)(void *arg, const char *peer, const struct dlink_hdr *h, const uint8_t *payload,
                 dc_status *why);
    /* A control link's DLINK_CALL (the coordinator's, dlframe.h DLINK_HELLO_CONTROL): frame is
     * a Worker RPC's request frame, len bytes (at most control_max), valid until answered. It
     * must be answered exactly once with dlink_call_answer (the reply frame), from any
     * thread. NULL: control links are refused. */
    void (*control)(void *arg, struct dlink_conn *c, const uint8_t *frame, size_t len);
    uint64_t control_max;
    /* Optional: where a DLINK_FLAG_OP frame's payload (h->length bytes, more than 0) may be
     * read straight to, or NULL to read it into the connection's buffer for op_frame as
     * usual. The read may take *wait_ms (the op's deadline): past it, the connection drops.
     * After a non-NULL answer op_landed runs once, with *pin, when the payload is in (ok) or
     * the read failed (!ok). op_landed false (when ok): refused, why says so, and the
     * connection drops. */
    uint8_t *(*op_place)(void *arg, const char *peer, const struct dlink_hdr *h, void **pin,
                         uint32_t *wait_ms);
    bool (*op_landed)(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok,
                      dc_status *why);
    /* Optional: where a call link's DLINK_CALL data (bytes, more than 0) is read straight to,
     * a buffer of the owner's that ev.call then gets with *pin (so the handler may keep the
     * bytes past its answer, with no copy), or NULL (out of memory: the connection drops).
     * call_unpin(arg, pin) gives it back when the read fails. NULL: the data is read into the
     * connection's own buffer, valid until answered. */
    uint8_t *(*call_place)(void *arg, size_t bytes, void **pin);
    void (*call_unpin)(void *arg, void *pin);
};

/* Answers the call a DLINK_CALL handed to ev.call or ev.control: st's error, or (st NULL or
 * DC_OK) the result's bytes. A call link's answer is copied and written by the connection's
 * thread (its answerer may hold locks); a control link's is written by the caller, at once
 * (bounded by the handshake timeout), so it must hold no lock others wait on. */
void dlink_call_answer(struct dlink_conn *c, const dc_status *st, const void *data, size_t bytes);
/* A call link's answer of the result's bytes, written from where they are (no copy) by the
 * connection's thread, which then calls release(rel), with no lock held, whether or not they
 * could be written; data stays as it is until then. On a control link, the same as
 * dlink_call_answer, release called before this returns. */
void dlink_call_answer_ref(struct dlink_conn *c, const void *data, size_t bytes,
                           void (*release)(void *), void *rel);
/* A control link's answer from the RPC server (rpc.h's rpc_frame_answer_fn, arg the
 * connection): the reply frame, or INTERNAL when no reply could be made (reply NULL). */
void dlink_call_answer_frame(void *arg, const void *reply, size_t len);

struct dlink_server;

/* Listens on url (tcp://host:0 or tls+tcp://host:0; tls required for the latter) and serves
 * connections on threads of its own. max_frame bounds a frame's length and total (the worker
 * passes the larger of limits.max_message_bytes and groups.shm_max_bytes: a call on shared
 * memory is not bounded by one message);
 * handshake_ms bounds the wait for the whole HELLO. Caller frees with dlink_server_free. */
dc_code dlink_server_start(const char *url, struct dltls *tls, uint64_t max_frame,
                           uint32_t handshake_ms, const struct dlink_events *ev,
                           struct dlink_server **out, dc_status *st);
/* The port the kernel gave, and the secret a peer must show. */
int dlink_server_port(const struct dlink_server *s);
const uint8_t *dlink_server_secret(const struct dlink_server *s);
/* The secret a call link's HELLO shows (a rank's, given by GroupCallLink): a connection that
 * shows it may only send DLINK_CALL frames and gets DLINK_ANSWERs back. */
const uint8_t *dlink_server_call_secret(const struct dlink_server *s);
/* Connections refused so far (bad HELLO, bad frame, too many). */
uint64_t dlink_server_refused(struct dlink_server *s);
/* Connections the server is done with so far: accepted, then closed at accept or served until
 * their thread ended. Once a connection counts here, no event of it runs any more (a test that
 * closed its side waits on this before it looks at what the events got). */
uint64_t dlink_server_finished(struct dlink_server *s);
/* Closes the listener and every connection, joins the threads: no event runs after it. */
void dlink_server_free(struct dlink_server *s);

/* For tests: the n-th time from now on that an answer on a call link needs a larger buffer,
 * the growth fails (the caller is answered RESOURCE_EXHAUSTED); 0 injects nothing. */
void dlink_answer_fail_after(unsigned n);

#endif
