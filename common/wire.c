#include "wire.h"

#include <stdbool.h>
#include <string.h>

static uint32_t
get_u32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void
put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

dc_code
wire_split(const void *buf, size_t len, struct wire_frame *f, dc_status *st)
{
    const uint8_t *p = buf;
    size_t rest      = len;
    uint32_t n;

    memset(f, 0, sizeof(*f));
    if (rest < 4) {
        return status_set(st, DC_INVALID_ARGUMENT, "truncated frame: %zu bytes", len);
    }
    n = get_u32(p);
    p += 4;
    rest -= 4;
    if (n > WIRE_HEADER_MAX || n > rest) {
        return status_set(st, DC_INVALID_ARGUMENT, "bad frame: header of %u bytes in %zu", n, rest);
    }
    f->header     = p;
    f->header_len = n;
    p += n;
    rest -= n;
    if (rest < 4) {
        return status_set(st, DC_INVALID_ARGUMENT, "truncated frame: no body length");
    }
    n = get_u32(p);
    p += 4;
    rest -= 4;
    if (n > rest) {
        return status_set(st, DC_INVALID_ARGUMENT, "bad frame: body of %u bytes in %zu", n, rest);
    }
    f->body           = p;
    f->body_len       = n;
    f->attachment     = p + n;
    f->attachment_len = rest - n;
    return DC_OK;
}

int
wire_pack(nng_msg **out, const ProtobufCMessage *header, const ProtobufCMessage *body,
          const void *attachment, size_t attachment_len, size_t limit)
{
    size_t hlen = protobuf_c_message_get_packed_size(header);
    size_t blen = body != NULL ? protobuf_c_message_get_packed_size(body) : 0;
    uint8_t *p;
    nng_msg *m;
    int rv;

    if (hlen > WIRE_HEADER_MAX || blen > UINT32_MAX || 8 + hlen + blen > limit ||
        attachment_len > limit - 8 - hlen - blen) {
        return NNG_EMSGSIZE;
    }
    if ((rv = nng_msg_alloc(&m, 8 + hlen + blen + attachment_len)) != 0) {
        return rv;
    }
    p = nng_msg_body(m);
    put_u32(p, (uint32_t)hlen);
    protobuf_c_message_pack(header, p + 4);
    put_u32(p + 4 + hlen, (uint32_t)blen);
    if (body != NULL) {
        protobuf_c_message_pack(body, p + 8 + hlen);
    }
    if (attachment_len > 0) {
        memcpy(p + 8 + hlen + blen, attachment, attachment_len);
    }
    *out = m;
    return 0;
}

int
wire_pack_into(nng_msg *m, const ProtobufCMessage *header, const ProtobufCMessage *body,
               const void *attachment, size_t attachment_len, size_t limit)
{
    size_t hlen  = protobuf_c_message_get_packed_size(header);
    size_t blen  = body != NULL ? protobuf_c_message_get_packed_size(body) : 0;
    uintptr_t at = (uintptr_t)attachment, start = (uintptr_t)nng_msg_body(m);
    size_t len  = nng_msg_len(m);
    bool inside = attachment_len > 0 && at >= start && at - start <= len &&
                  attachment_len <= len - (at - start);
    size_t offset = inside ? at - start : 0;
    uint8_t front[WIRE_PACK_INTO_FRONT_MAX];
    size_t total;
    uint8_t *p;
    int rv;

    if (hlen > WIRE_HEADER_MAX || blen > UINT32_MAX || 8 + hlen + blen > limit ||
        attachment_len > limit - 8 - hlen - blen) {
        return NNG_EMSGSIZE;
    }
    if (8 + hlen + blen > sizeof(front)) {
        return NNG_ENOSPC;
    }
    /* Header and body first, apart: they may point into m (a reply quoting its request). */
    put_u32(front, (uint32_t)hlen);
    protobuf_c_message_pack(header, front + 4);
    put_u32(front + 4 + hlen, (uint32_t)blen);
    if (body != NULL) {
        protobuf_c_message_pack(body, front + 8 + hlen);
    }
    /* Grow (a realloc keeps the contents, the attachment among them: it is found again by
     * its offset), move the attachment to its place, put the front before it, cut the rest. */
    total = 8 + hlen + blen + attachment_len;
    if (total > len && (rv = nng_msg_realloc(m, total)) != 0) {
        return rv;
    }
    p = nng_msg_body(m);
    if (attachment_len > 0) {
        memmove(p + 8 + hlen + blen, inside ? p + offset : attachment, attachment_len);
    }
    memcpy(p, front, 8 + hlen + blen);
    return nng_msg_chop(m, nng_msg_len(m) - total);
}

dc_code
wire_nng_status(int rv, const char *what, dc_status *st)
{
    dc_code code;

    switch (rv) {
    case 0:
        return DC_OK;
    case NNG_ETIMEDOUT:
        code = DC_DEADLINE_EXCEEDED;
        break;
    case NNG_ECANCELED:
        code = DC_CANCELLED;
        break;
    case NNG_ENOMEM:
    case NNG_EMSGSIZE:
        code = DC_RESOURCE_EXHAUSTED;
        break;
    case NNG_EINVAL:
    case NNG_EADDRINVAL:
    case NNG_ENOTSUP:
        code = DC_INVALID_ARGUMENT;
        break;
    case NNG_EPEERAUTH:
    case NNG_ECRYPTO:
        code = DC_UNAUTHENTICATED;
        break;
    default:
        code = DC_UNAVAILABLE;
        break;
    }
    return status_set(st, code, "%s: %s", what, nng_strerror(rv));
}

dc_code
wire_status_from_pb(const Devcoord__V1__Status *pb, dc_status *out)
{
    status_clear(out);
    if (pb == NULL) {
        return DC_OK;
    }
    status_set(out,
               (int)pb->code >= 0 && (int)pb->code <= (int)DC_UNAUTHENTICATED ? (dc_code)pb->code
                                                                              : DC_UNKNOWN,
               "%s", pb->message != NULL ? pb->message : "");
    if (pb->detail_case == DEVCOORD__V1__STATUS__DETAIL_DEVICE_INDEX &&
        pb->device_index <= INT32_MAX) {
        out->device_index = (int32_t)pb->device_index;
    }
    status_set_worker(out, pb->worker != NULL ? pb->worker : "");
    return out->code;
}
