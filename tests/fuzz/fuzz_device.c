/* The device grammar (design §3): dc_device_ref_parse on the raw bytes. What parses must
 * format canonically and round-trip exactly, through the text and through the wire form;
 * what does not must say why. */
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "fuzz.h"

static bool
ref_equal(const dc_device_ref *a, const dc_device_ref *b)
{
    return strcmp(a->worker, b->worker) == 0 && a->device.backend == b->device.backend &&
           a->device.kind == b->device.kind && a->device.index == b->device.index &&
           a->autodiff_depth == b->autodiff_depth;
}

/* Formatting into a buffer of exactly `cap` bytes (so ASan sees a write past it) must
 * return the full length and leave a terminated prefix of the text, as snprintf does. */
static void
check_truncated(const dc_device_ref *ref, const char *text, size_t len, size_t cap)
{
    char *buf = malloc(cap ? cap : 1);
    size_t n;

    if (buf == NULL) {
        return;
    }
    n = dc_device_ref_format(ref, cap ? buf : NULL, cap);
    if (n != len) {
        fuzz_finding("'%s' formats to %zu bytes into %zu, %zu into a full buffer", text, n, cap,
                     len);
    }
    if (cap > 0) {
        size_t keep = len < cap - 1 ? len : cap - 1;
        if (memcmp(buf, text, keep) != 0 || buf[keep] != '\0') {
            fuzz_finding("'%s' formatted into %zu bytes is not its terminated prefix", text, cap);
        }
    }
    free(buf);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char text[DC_DEVICE_TEXT_SIZE], again_text[DC_DEVICE_TEXT_SIZE];
    dc_device_ref ref, again, from_wire;
    Devcoord__V1__DeviceRef pb;
    Devcoord__V1__Device pb_dev;
    dc_status st;
    size_t len;

    status_clear(&st);
    if (dc_device_ref_parse((const char *)data, size, &ref, &st) != DC_OK) {
        fuzz_check_status(&st);
        if (st.code != DC_INVALID_ARGUMENT || strstr(st.message, " at ") == NULL) {
            fuzz_finding("parse error %d without a position: %s", (int)st.code, st.message);
        }
        return 0;
    }
    len = dc_device_ref_format(&ref, text, sizeof(text));
    if (len >= sizeof(text)) {
        fuzz_finding("a parsed reference formats to %zu bytes", len);
    }
    if (dc_device_ref_parse(text, len, &again, &st) != DC_OK) {
        fuzz_finding("canonical text '%s' does not parse: %s", text, st.message);
    }
    if (!ref_equal(&ref, &again)) {
        fuzz_finding("canonical text '%s' parses to another reference", text);
    }
    if (dc_device_ref_format(&again, again_text, sizeof(again_text)) != len ||
        strcmp(text, again_text) != 0) {
        fuzz_finding("'%s' formats as '%s' after a round trip", text, again_text);
    }
    check_truncated(&ref, text, len, 0);
    check_truncated(&ref, text, len, 1);
    check_truncated(&ref, text, len, len / 2);
    check_truncated(&ref, text, len, len);

    device_ref_to_pb(&ref, &pb, &pb_dev);
    if (device_ref_from_pb(&pb, &from_wire, &st) != DC_OK) {
        fuzz_finding("'%s' is refused on the wire: %s", text, st.message);
    }
    if (!ref_equal(&ref, &from_wire)) {
        fuzz_finding("'%s' changes on its way through the wire form", text);
    }
    return 0;
}
