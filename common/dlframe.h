/*
 * The data link's frames and its dialing side (datalink.h has the whole
 * story and the listening side): shared by workers, which send a group's bytes to their peers,
 * and by libdevcoord, whose ranks make calls on their worker's data port (the call link).
 */
#ifndef DEVCOORD_DLFRAME_H
#define DEVCOORD_DLFRAME_H

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
/* With DLINK_FLAG_OP: the op's tensor descriptions (collective.c's META entries), not data:
 * seq = the op's description step, generation = the sender's features, offset 0, total =
 * length. Sent only to a worker whose GroupLink answer has WGROUPS_FEATURE_OP_META; one that
 * comes before its op is kept (bounded) until the op's Execute does. */
#define DLINK_FLAG_OP_META 0x4000u

/* In a HELLO's flags, with the peers' secret (GroupLink's, which only the worker role
 * learns): a control link, the coordinator's. Its DLINK_CALL frames carry a Worker RPC's
 * request frame (wire.h: header with method and token, body) as their data (no pb), served
 * as if it had come as an RPC; each DLINK_ANSWER carries the reply frame (DC_OK), or an error
 * when no reply could be made. Only to a worker whose GroupLink answer has
 * WGROUPS_FEATURE_CONTROL. */
#define DLINK_HELLO_CONTROL 0x0001u

enum dlink_kind {
    DLINK_HELLO = 1, /* payload: the secret, then the sender's RPC address */
    DLINK_DATA  = 2, /* payload: bytes [offset, offset + length) of a part of `total` bytes */
    /* The call link: a rank's group call to its own worker, on a connection whose HELLO showed
     * the call secret (GroupCallLink). Payload: a packed GroupCallRequest of `offset` bytes
     * (at most DLINK_CALL_PB_MAX), then the call's bytes; seq = the call's seq. */
    DLINK_CALL = 3,
    /* The worker's answer to a DLINK_CALL, on the same connection: seq = the call's, offset =
     * its dc_code; payload = the result's bytes (DC_OK), else the name of the worker the
     * failure is about, a NUL, and the message. */
    DLINK_ANSWER = 4,
    /* A worker's whole part of a small group call, on its data link to a peer: payload = a
     * packed GroupExchangeRequest of `offset` bytes, then the part's bytes (what the
     * GroupExchange RPC would carry, with no reply); seq = the call's. At most DLINK_CHUNK. */
    DLINK_PART = 5,
};

#define DLINK_CALL_PB_MAX 1024
/* The most payload an error ANSWER has: a worker name, a NUL and a message. */
#define DLINK_ANSWER_ERROR_MAX 1024

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

struct dlink_out;
struct dltls; /* dltls.h */

/* Dials url (tls: the client config for tls+tcp://, else NULL), sends HELLO with secret and
 * self (this worker's RPC address), within timeout_ms. Caller closes with dlink_out_close. */
dc_code dlink_dial(const char *url, struct dltls *tls, const uint8_t *secret, const char *self,
                   uint32_t timeout_ms, struct dlink_out **out, dc_status *st);
/* dlink_dial with flags in the HELLO frame (DLINK_HELLO_CONTROL). */
dc_code dlink_dial_as(const char *url, struct dltls *tls, const uint8_t *secret, const char *self,
                      uint16_t hello_flags, uint32_t timeout_ms, struct dlink_out **out,
                      dc_status *st);
/* Sends h's part [h->offset, h->offset + len) from data as frames of DLINK_CHUNK (h->length
 * is set per frame). Blocking; one sender at a time. UNAVAILABLE when the connection fails:
 * the connection is then unusable. */
dc_code dlink_send(struct dlink_out *o, const struct dlink_hdr *h, const uint8_t *data, size_t len,
                   dc_status *st);
/* dlink_send, failing (UNAVAILABLE, the connection unusable) if the peer has not taken it
 * all within timeout_ms: for a writer that must not wait on a peer that stopped reading. */
dc_code dlink_send_within(struct dlink_out *o, const struct dlink_hdr *h, const uint8_t *data,
                          size_t len, uint32_t timeout_ms, dc_status *st);
/* Makes a dlink_send under way on another thread fail at once (the connection is closed);
 * dlink_out_close still frees it. */
void dlink_out_abort(struct dlink_out *o);
/* Sends one frame: h (its length set to len) and data. Blocking; one sender at a time;
 * UNAVAILABLE when the connection fails (it is then unusable). */
dc_code dlink_send_frame(struct dlink_out *o, const struct dlink_hdr *h, const uint8_t *data,
                         size_t len, dc_status *st);
/* A call on the call link (dlink_dial'ed with the call secret): sends a DLINK_CALL frame of
 * h's group, generation, seq and from, pb (pb_len bytes) then data, and waits up to
 * timeout_ms for its answer. The answer's bytes, exactly recv_bytes (any, up to
 * DLINK_ANSWER_ERROR_MAX, are dropped when recv_bytes is 0), go to recv; an error
 * answer is returned with its message. A connection that fails or stays silent gives
 * DC_UNAVAILABLE or DC_DEADLINE_EXCEEDED with st->transport set: the link is then unusable.
 * One call at a time. */
dc_code dlink_call(struct dlink_out *o, const struct dlink_hdr *h, const void *pb, size_t pb_len,
                   const void *data, size_t bytes, void *recv, size_t recv_bytes,
                   uint32_t timeout_ms, dc_status *st);
/* dlink_call in two steps, for a call whose answer is read on another thread: send sends
 * the DLINK_CALL frame (data only, no pb); recv_any reads the answer to seq, of any size up to
 * max_answer, into a new message (*answer, the caller's on DC_OK) instead of a buffer the
 * caller sized. The same failures as dlink_call: a failed send has not reached the worker
 * whole (it drops a frame cut short unread). */
dc_code dlink_call_send(struct dlink_out *o, const struct dlink_hdr *h, const void *data,
                        size_t bytes, uint32_t timeout_ms, dc_status *st);
dc_code dlink_call_recv_any(struct dlink_out *o, uint64_t seq, size_t max_answer,
                            uint32_t timeout_ms, nng_msg **answer, dc_status *st);
void dlink_out_close(struct dlink_out *o);
/* Between calls on a link that only answers (a call link): leaves a one-byte read posted,
 * which completes only when the peer sends something unasked or the connection ends (the
 * peer closed it, restarted, or went). dlink_out_idle_end takes it back before the next
 * call: true when it was still waiting (the link is fit to use), false when the link ended
 * or broke its protocol (the caller closes it, and can still make the call another way). */
void dlink_out_idle_begin(struct dlink_out *o);
bool dlink_out_idle_end(struct dlink_out *o);

#endif
