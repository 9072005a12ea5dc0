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
#ifndef DEVCOORD_WORKER_DATALINK_H
#define DEVCOORD_WORKER_DATALINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#include "status.h"

#define DLINK_MAGIC    0x4c444344u /* "DCDL" as bytes on the wire */
#define DLINK_VERSION  1
#define DLINK_HDR_SIZE 56
/* Payload bytes per data frame: a slice the receiver's caches hold while it lands. */
#define DLINK_CHUNK       (512u * 1024)
#define DLINK_SECRET_SIZE 32
/* Room for the sender's RPC address after the secret in a HELLO frame. */
#define DLINK_ADDRESS_MAX 255
/* Connections a worker's data port keeps at once; more are closed at accept. */
#define DLINK_MAX_CONNS 256
/* A data frame of a SubmitOp (collective.c), not of a group call: group = dlink_group_hash of
 * the op id, generation = the rank the bytes are about, seq = the op's exchange step, offset
 * in the op's buffer, total = that buffer's size (not bounded by max_frame: nothing is
 * allocated from it). Its payload (at most DLINK_CHUNK bytes, else the connection drops) is
 * read into the connection's own buffer and handed to op_frame. */
#define DLINK_FLAG_OP 0x8000u

enum dlink_kind {
    DLINK_HELLO = 1, /* payload: the secret, then the sender's RPC address */
    DLINK_DATA  = 2, /* payload: bytes [offset, offset + length) of a part of `total` bytes */
};

struct dlink_hdr {
    uint8_t kind;
    uint16_t flags;
    uint32_t from; /* the sender's index among the group's workers */
    uint32_t length;
    uint64_t group; /* dlink_group_hash of the group id */
    uint64_t generation;
    uint64_t seq;
    uint64_t offset;
    uint64_t total;
};

/* Pure. */
void dlink_hdr_encode(const struct dlink_hdr *h, uint8_t out[DLINK_HDR_SIZE]);
/* DC_OK and *h, or DC_INVALID_ARGUMENT (bad magic, version, kind, offset/length/total) or
 * DC_OUT_OF_RANGE (length or total above max_frame) with a message. */
dc_code dlink_hdr_decode(const uint8_t in[DLINK_HDR_SIZE], uint64_t max_frame, struct dlink_hdr *h,
                         dc_status *st);
/* FNV-1a 64 of a group id. */
uint64_t dlink_group_hash(const char *id);

/* What a receiving connection asks of its owner (reader threads; may block briefly on the
 * owner's lock, never on the network). */
struct dlink_events {
    void *arg;
    /* A data frame's header came from the worker whose RPC address is `peer`: where its
     * payload goes (room for h->length bytes). *dst NULL: the payload is read and dropped
     * (a group or call no longer here). *pin is handed back to frame_end. */
    void (*frame_begin)(void *arg, const char *peer, const struct dlink_hdr *h, uint8_t **dst,
                        void **pin);
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
};

struct dlink_server;

/* Listens on url (tcp://host:0 or tls+tcp://host:0; tls required for the latter) and serves
 * connections on threads of its own. max_frame bounds a frame's length and total (the worker
 * passes the larger of limits.max_message_bytes and groups.shm_max_bytes: a call on shared
 * memory is not bounded by one message);
 * handshake_ms bounds the wait for HELLO. Caller frees with dlink_server_free. */
dc_code dlink_server_start(const char *url, nng_tls_config *tls, uint64_t max_frame,
                           uint32_t handshake_ms, const struct dlink_events *ev,
                           struct dlink_server **out, dc_status *st);
/* The port the kernel gave, and the secret a peer must show. */
int dlink_server_port(const struct dlink_server *s);
const uint8_t *dlink_server_secret(const struct dlink_server *s);
/* Connections refused so far (bad HELLO, bad frame, too many). */
uint64_t dlink_server_refused(struct dlink_server *s);
/* Connections the server is done with so far: accepted, then closed at accept or served until
 * their thread ended. Once a connection counts here, no event of it runs any more (a test that
 * closed its side waits on this before it looks at what the events got). */
uint64_t dlink_server_finished(struct dlink_server *s);
/* Closes the listener and every connection, joins the threads: no event runs after it. */
void dlink_server_free(struct dlink_server *s);

struct dlink_out;

/* Dials url (tls: the client config for tls+tcp://, else NULL), sends HELLO with secret and
 * self (this worker's RPC address), within timeout_ms. Caller closes with dlink_out_close. */
dc_code dlink_dial(const char *url, nng_tls_config *tls, const uint8_t *secret, const char *self,
                   uint32_t timeout_ms, struct dlink_out **out, dc_status *st);
/* Sends h's part [h->offset, h->offset + len) from data as frames of DLINK_CHUNK (h->length
 * is set per frame). Blocking; one sender at a time. UNAVAILABLE when the connection fails:
 * the connection is then unusable. */
dc_code dlink_send(struct dlink_out *o, const struct dlink_hdr *h, const uint8_t *data, size_t len,
                   dc_status *st);
/* Makes a dlink_send under way on another thread fail at once (the connection is closed);
 * dlink_out_close still frees it. */
void dlink_out_abort(struct dlink_out *o);
void dlink_out_close(struct dlink_out *o);

#endif
