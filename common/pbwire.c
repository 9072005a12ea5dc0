#include "pbwire.h"

#include <limits.h>
#include <string.h>

/* The most bytes a varint takes. */
#define VARINT_MAX 10

/* Wire types. */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

static size_t
put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;

    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* A varint field, left out when 0 (proto3). */
static size_t
put_uint_field(uint8_t *p, unsigned field, uint64_t v)
{
    if (v == 0) {
        return 0;
    }
    p[0] = (uint8_t)(field << 3 | WT_VARINT);
    return 1 + put_varint(p + 1, v);
}

/* A string field, left out when empty (proto3). */
static size_t
put_bytes_field(uint8_t *p, unsigned field, const char *s, size_t len)
{
    size_t n;

    if (len == 0) {
        return 0;
    }
    p[0] = (uint8_t)(field << 3 | WT_LEN);
    n    = 1 + put_varint(p + 1, len);
    memcpy(p + n, s, len);
    return n + len;
}

/* protobuf-c writes an enum as an int32: a negative one takes ten bytes. */
static uint64_t
enum_wire(int32_t v)
{
    return (uint64_t)(int64_t)v;
}

size_t
pbwire_device_info(uint8_t *out, const Devcoord__V1__DeviceInfo *pb)
{
    uint8_t dev[PBWIRE_DEVICE_MAX];
    size_t n = 0, dn = 0;

    n += put_bytes_field(out + n, 1, pb->name, strnlen(pb->name, DC_DEVICE_TEXT_MAX));
    n += put_bytes_field(out + n, 2, pb->worker, strnlen(pb->worker, DC_WORKER_NAME_MAX));
    if (pb->device != NULL) {
        dn += put_uint_field(dev + dn, 1, enum_wire((int32_t)pb->device->backend));
        dn += put_uint_field(dev + dn, 2, enum_wire((int32_t)pb->device->kind));
        dn += put_uint_field(dev + dn, 3, pb->device->index);
        out[n++] = 3 << 3 | WT_LEN; /* a message field is written whenever it is set, even empty */
        n += put_varint(out + n, dn);
        memcpy(out + n, dev, dn);
        n += dn;
    }
    n += put_uint_field(out + n, 4, enum_wire((int32_t)pb->state));
    n += put_uint_field(out + n, 5, pb->memory_bytes);
    return n;
}

bool
pbwire_device_info_field(struct arena *a, uint32_t field, const Devcoord__V1__DeviceInfo *pb,
                         ProtobufCMessageUnknownField *f)
{
    uint8_t buf[PBWIRE_DEVICE_INFO_MAX], len_bytes[VARINT_MAX];
    size_t len    = pbwire_device_info(buf, pb);
    size_t prefix = put_varint(len_bytes, len);
    uint8_t *p;

    /* The field's data is what follows its tag: the message's length, then its bytes. */
    if ((p = arena_alloc(a, prefix + len)) == NULL) {
        return false;
    }
    memcpy(p, len_bytes, prefix);
    memcpy(p + prefix, buf, len);
    f->tag       = field;
    f->wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
    f->len       = prefix + len;
    f->data      = p;
    return true;
}

/* ---- reading ---------------------------------------------------------------------------- */

static bool
get_varint(const uint8_t *p, size_t len, size_t *at, uint64_t *v)
{
    uint64_t r = 0;

    for (unsigned shift = 0; shift < 64 && *at < len; shift += 7) {
        uint8_t b = p[(*at)++];
        r |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            *v = r;
            return true;
        }
    }
    return false; /* truncated, or longer than ten bytes */
}

/* A field's key at *at, read as protobuf-c 1.4 reads one (parse_tag_and_wiretype): at most
 * five bytes, the wire type and the first bits of the number in the first byte, which must
 * hold some bits of the number (a zero there is no field). */
static bool
get_key(const uint8_t *p, size_t len, size_t *at, uint32_t *field, unsigned *wt)
{
    const uint8_t *d = p + *at;
    size_t rem       = len - *at;
    size_t max       = rem < 5 ? rem : 5;
    uint32_t tag;
    unsigned shift = 4;
    size_t i;

    if (rem == 0 || (d[0] & 0xf8) == 0) {
        return false;
    }
    tag = (uint32_t)(d[0] & 0x7f) >> 3;
    *wt = d[0] & 7;
    for (i = 0; (d[i] & 0x80) != 0;) {
        if (++i == max) {
            return false;
        }
        tag |= (uint32_t)(d[i] & 0x7f) << shift;
        shift += 7;
    }
    *at += i + 1;
    *field = tag;
    return true;
}

/* A field as read: its number, its wire type, its value (WT_VARINT) or where its bytes are
 * (WT_LEN). */
struct field {
    uint32_t num;
    unsigned wt;
    uint64_t v;
    const uint8_t *data;
    size_t len;
};

/* The next field at *at into *f; *at moves past it. False when malformed or truncated, as
 * protobuf-c 1.4 would find it (a length prefix takes at most five bytes, at most INT_MAX),
 * or when a field of number 1 to n does not have the wire type wire[number - 1] (protobuf-c
 * refuses a known field of another type; an unknown one it skips). */
static bool
next_field(const uint8_t *p, size_t len, size_t *at, const uint8_t *wire, uint32_t n,
           struct field *f)
{
    uint64_t size;
    size_t start;

    *f = (struct field){ 0 };
    if (!get_key(p, len, at, &f->num, &f->wt) ||
        (f->num >= 1 && f->num <= n && f->wt != wire[f->num - 1])) {
        return false;
    }
    switch (f->wt) {
    case WT_VARINT:
        return get_varint(p, len, at, &f->v);
    case WT_I64:
    case WT_I32:
        size = f->wt == WT_I64 ? 8 : 4;
        if (len - *at < size) {
            return false;
        }
        *at += size;
        return true;
    case WT_LEN:
        start = *at;
        if (!get_varint(p, len, at, &size) || *at - start > 5 || size > INT_MAX ||
            size > len - *at) {
            return false;
        }
        f->data = p + *at;
        f->len  = (size_t)size;
        *at += (size_t)size;
        return true;
    default:
        return false; /* groups (3, 4) and the reserved types: nothing we send */
    }
}

/* The wire types of the known fields, by number from 1. */
static const uint8_t device_wire[]      = { WT_VARINT, WT_VARINT, WT_VARINT };
static const uint8_t device_info_wire[] = { WT_LEN, WT_LEN, WT_LEN, WT_VARINT, WT_VARINT };
static const uint8_t page_wire[]        = { WT_LEN, WT_LEN, WT_VARINT };

/* A string's bytes into buf: at most max + 1 of them (so one too long still reads too long),
 * NUL-terminated. */
static char *
copy_string(const uint8_t *data, size_t dlen, char *buf, size_t max)
{
    size_t n = dlen < max + 1 ? dlen : max + 1;

    memcpy(buf, data, n);
    buf[n] = '\0';
    return buf;
}

static bool
read_device(const uint8_t *p, size_t len, Devcoord__V1__Device *dev)
{
    size_t at = 0;
    struct field f;

    while (at < len) {
        if (!next_field(p, len, &at, device_wire, 3, &f)) {
            return false;
        }
        if (f.num == 1) {
            dev->backend = (Devcoord__V1__Backend)(int32_t)(uint32_t)f.v;
        } else if (f.num == 2) {
            dev->kind = (Devcoord__V1__Kind)(int32_t)(uint32_t)f.v;
        } else if (f.num == 3) {
            dev->index = (uint32_t)f.v;
        }
    }
    return true;
}

bool
pbwire_read_device_info(const uint8_t *p, size_t len, Devcoord__V1__DeviceInfo *pb,
                        Devcoord__V1__Device *dev, char *name, char *worker)
{
    size_t at = 0;
    struct field f;

    devcoord__v1__device_info__init(pb);
    devcoord__v1__device__init(dev);
    name[0]    = '\0';
    worker[0]  = '\0';
    pb->name   = name;
    pb->worker = worker;
    while (at < len) {
        if (!next_field(p, len, &at, device_info_wire, 5, &f)) {
            return false;
        }
        switch (f.num) {
        case 1:
            copy_string(f.data, f.len, name, DC_DEVICE_TEXT_MAX);
            break;
        case 2:
            copy_string(f.data, f.len, worker, DC_WORKER_NAME_MAX);
            break;
        case 3:
            /* A message seen twice: the last one, as protobuf-c 1.4 reads it (no merge). */
            devcoord__v1__device__init(dev);
            if (!read_device(f.data, f.len, dev)) {
                return false;
            }
            pb->device = dev;
            break;
        case 4:
            pb->state = (Devcoord__V1__DeviceState)(int32_t)(uint32_t)f.v;
            break;
        case 5:
            pb->memory_bytes = f.v;
            break;
        default:
            break; /* a field from a newer server */
        }
    }
    return true;
}

bool
pbwire_scan_page(const uint8_t *p, size_t len, struct pbwire_page *out)
{
    size_t at = 0;
    struct field f;

    memset(out, 0, sizeof(*out));
    while (at < len) {
        if (!next_field(p, len, &at, page_wire, 3, &f)) {
            return false;
        }
        if (f.num == 1) {
            out->n_devices++;
        } else if (f.num == 2) {
            out->token     = f.data;
            out->token_len = f.len;
        } else if (f.num == 3) {
            out->total = f.v;
        }
    }
    return true;
}

bool
pbwire_next_device(const uint8_t *p, size_t len, size_t *at, const uint8_t **dev, size_t *dev_len)
{
    struct field f;

    while (*at < len) {
        if (!next_field(p, len, at, page_wire, 3, &f)) {
            return false;
        }
        if (f.num == 1) {
            *dev     = f.data;
            *dev_len = f.len;
            return true;
        }
    }
    return false;
}
