#include "fuzz.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

/* Values read land here, so the reads are not optimized away. */
static volatile uint64_t fuzz_sink;

void
fuzz_finding(const char *fmt, ...)
{
    va_list ap;

    fputs("FINDING: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void
fuzz_check_status(const dc_status *st)
{
    if (st->code > DC_UNAUTHENTICATED) {
        fuzz_finding("status code %d is not a dc_code", (int)st->code);
    }
    if (memchr(st->message, '\0', sizeof(st->message)) == NULL ||
        memchr(st->worker, '\0', sizeof(st->worker)) == NULL) {
        fuzz_finding("status message or worker not terminated");
    }
    fuzz_sink += strlen(st->message) + strlen(st->worker);
}

static bool
device_ref_equal(const dc_device_ref *a, const dc_device_ref *b)
{
    return strcmp(a->worker, b->worker) == 0 && a->device.backend == b->device.backend &&
           a->device.kind == b->device.kind && a->device.index == b->device.index &&
           a->autodiff_depth == b->autodiff_depth;
}

void
fuzz_check_device(const Devcoord__V1__Device *pb)
{
    char text[DC_DEVICE_TEXT_SIZE];
    dc_device dev;
    dc_status st;

    status_clear(&st);
    if (device_from_pb(pb, &dev, &st) != DC_OK) {
        fuzz_check_status(&st);
        return;
    }
    if (dc_device_format(&dev, text, sizeof(text)) >= sizeof(text)) {
        fuzz_finding("a device's text form does not fit DC_DEVICE_TEXT_SIZE");
    }
}

void
fuzz_check_device_ref(const Devcoord__V1__DeviceRef *pb)
{
    char text[DC_DEVICE_TEXT_SIZE];
    dc_device_ref ref, again;
    dc_status st;
    size_t n;

    status_clear(&st);
    if (device_ref_from_pb(pb, &ref, &st) != DC_OK) {
        fuzz_check_status(&st);
        return;
    }
    /* The coordinator formats wire references in its error messages (validate.c fail_at),
     * whatever their depth. */
    n = dc_device_ref_format(&ref, text, sizeof(text));
    if (ref.autodiff_depth > DC_AUTODIFF_MAX) {
        return;
    }
    if (n >= sizeof(text)) {
        fuzz_finding("wire reference formats to %zu bytes, more than DC_DEVICE_TEXT_SIZE", n);
    }
    if (dc_device_ref_parse(text, n, &again, &st) != DC_OK) {
        fuzz_finding("wire reference formats as '%s', which does not parse: %s", text, st.message);
    }
    if (!device_ref_equal(&ref, &again)) {
        fuzz_finding("wire reference formats as '%s', which parses to another reference", text);
    }
}

/* Size of one element of a repeated field of this type, as protobuf-c lays it out. */
static size_t
field_elem_size(ProtobufCType type)
{
    switch (type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    }
    fuzz_finding("field of unknown type %d", (int)type);
}

static size_t
walk_value(const ProtobufCFieldDescriptor *f, const void *v)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT: {
        uint32_t x;
        memcpy(&x, v, sizeof(x));
        fuzz_sink += x;
        break;
    }
    case PROTOBUF_C_TYPE_ENUM: {
        int32_t x;
        memcpy(&x, v, sizeof(x));
        fuzz_sink += protobuf_c_enum_descriptor_get_value(f->descriptor, x) != NULL;
        break;
    }
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: {
        uint64_t x;
        memcpy(&x, v, sizeof(x));
        fuzz_sink += x;
        break;
    }
    case PROTOBUF_C_TYPE_BOOL:
        fuzz_sink += *(const protobuf_c_boolean *)v != 0;
        break;
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)v;
        fuzz_sink += s != NULL ? strlen(s) : 0;
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = v;
        for (size_t i = 0; i < b->len; i++) {
            fuzz_sink += b->data[i];
        }
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(ProtobufCMessage *const *)v;
        return m != NULL ? fuzz_walk_message(m) : 0;
    }
    }
    return 0;
}

size_t
fuzz_walk_message(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base                    = (const char *)m;
    size_t unknown                      = m->n_unknown_fields;

    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const void *member                = base + f->offset;

        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n          = *(const size_t *)(const void *)(base + f->quantifier_offset);
            const char *items = *(char *const *)member;
            size_t esize      = field_elem_size(f->type);
            for (size_t k = 0; k < n; k++) {
                unknown += walk_value(f, items + k * esize);
            }
        } else if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0) {
            uint32_t which = *(const uint32_t *)(const void *)(base + f->quantifier_offset);
            if (which == f->id) {
                unknown += walk_value(f, member);
            }
        } else {
            unknown += walk_value(f, member);
        }
    }
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &m->unknown_fields[i];
        for (size_t k = 0; k < u->len; k++) {
            fuzz_sink += u->data[k];
        }
    }
    if (d == &devcoord__v1__device_ref__descriptor) {
        fuzz_check_device_ref((const Devcoord__V1__DeviceRef *)m);
    } else if (d == &devcoord__v1__device__descriptor) {
        fuzz_check_device((const Devcoord__V1__Device *)m);
    }
    return unknown;
}

void
fuzz_check_repack(const ProtobufCMessage *m)
{
    size_t n1 = protobuf_c_message_get_packed_size(m), n2;
    uint8_t *p1, *p2 = NULL;
    ProtobufCMessage *again;

    if ((p1 = malloc(n1 ? n1 : 1)) == NULL) {
        return;
    }
    if (protobuf_c_message_pack(m, p1) != n1) {
        fuzz_finding("%s packs to another size than it said", m->descriptor->name);
    }
    if ((again = protobuf_c_message_unpack(m->descriptor, NULL, n1, p1)) == NULL) {
        fuzz_finding("%s packs to bytes that do not decode", m->descriptor->name);
    }
    n2 = protobuf_c_message_get_packed_size(again);
    if (n2 != n1) {
        fuzz_finding("%s encodes to %zu bytes, then to %zu", m->descriptor->name, n1, n2);
    }
    if ((p2 = malloc(n2 ? n2 : 1)) != NULL &&
        (protobuf_c_message_pack(again, p2) != n2 || memcmp(p1, p2, n1) != 0)) {
        fuzz_finding("%s encodes differently after a round trip", m->descriptor->name);
    }
    free(p2);
    protobuf_c_message_free_unpacked(again, NULL);
    free(p1);
}
