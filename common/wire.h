/*
 * The frame every call and reply travels in (see the top of devcoord.proto):
 *   u32 header length | header | u32 body length | body | attachment
 * Splitting checks every length against the buffer and copies nothing; packing writes the
 * header, the body and the attachment straight into one nng message.
 */
#ifndef DEVCOORD_COMMON_WIRE_H
#define DEVCOORD_COMMON_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <protobuf-c/protobuf-c.h>

#include "devcoord/v1/devcoord.pb-c.h"
#include "status.h"

struct wire_frame {
    const uint8_t *header;
    size_t header_len;
    const uint8_t *body;
    size_t body_len;
    const uint8_t *attachment;
    size_t attachment_len;
};

/* Splits buf; DC_INVALID_ARGUMENT when a length runs past the end or the header is larger
 * than WIRE_HEADER_MAX. The frame points into buf. */
dc_code wire_split(const void *buf, size_t len, struct wire_frame *f, dc_status *st);

#define WIRE_HEADER_MAX 8192

/* A new message holding header, body (may be NULL: empty) and attachment; 0 or an NNG_E*
 * code (NNG_EMSGSIZE when it would exceed limit bytes). On success the caller owns *out. */
int wire_pack(nng_msg **out, const ProtobufCMessage *header, const ProtobufCMessage *body,
              const void *attachment, size_t attachment_len, size_t limit);

/* As wire_pack, into m instead of a new message: m's body becomes the frame, its buffer
 * reused (a server answers in the request's message, as a bare nng echo does, so a call
 * costs one message buffer rather than two). The attachment may lie inside m's body (a
 * reply echoing part of its request), and header and body may point into it. 0, or an
 * NNG_E* code and m unchanged: NNG_ENOSPC when header and body together take more than
 * WIRE_PACK_INTO_FRONT_MAX bytes (then use wire_pack). */
#define WIRE_PACK_INTO_FRONT_MAX 4096
int wire_pack_into(nng_msg *m, const ProtobufCMessage *header, const ProtobufCMessage *body,
                   const void *attachment, size_t attachment_len, size_t limit);

/* Maps an nng error to a status code and message ("<what>: <nng_strerror>"). */
dc_code wire_nng_status(int rv, const char *what, dc_status *st);

/* A Status from the wire into *out (cleared when pb is NULL): a code outside the enum reads
 * as DC_UNKNOWN; returns the code. */
dc_code wire_status_from_pb(const Devcoord__V1__Status *pb, dc_status *out);

#endif
