/* Request fingerprints (opkey.h): 64-bit FNV-1a over the fields in a fixed order, each string
 * with its length first and each number in 8 little-endian bytes, so that no two different
 * requests feed the hash the same bytes. */
#include "opkey.h"

#include <string.h>

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME  0x100000001b3ull

static uint64_t
fnv_bytes(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;

    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

static uint64_t
fnv_u64(uint64_t h, uint64_t v)
{
    unsigned char b[8];

    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(v >> (8 * i));
    }
    return fnv_bytes(h, b, sizeof(b));
}

static uint64_t
fnv_str(uint64_t h, const char *s)
{
    size_t len = s != NULL ? strlen(s) : 0;

    return fnv_bytes(fnv_u64(h, len), s, len);
}

uint64_t
opkey_fingerprint(const Devcoord__V1__SubmitOpRequest *in)
{
    uint64_t h = FNV_OFFSET;

    h = fnv_u64(h, (uint64_t)in->kind);
    h = fnv_u64(h, (uint64_t)in->reduce);
    h = fnv_u64(h, in->root);
    h = fnv_str(h, in->tensor);
    h = fnv_str(h, in->output_tensor);
    h = fnv_u64(h, in->n_devices);
    for (size_t i = 0; i < in->n_devices; i++) {
        const Devcoord__V1__DeviceRef *d = in->devices[i];
        h                                = fnv_str(h, d != NULL ? d->worker : "");
        h = fnv_u64(h, d != NULL && d->device != NULL ? (uint64_t)d->device->backend : 0);
        h = fnv_u64(h, d != NULL && d->device != NULL ? (uint64_t)d->device->kind : 0);
        h = fnv_u64(h, d != NULL && d->device != NULL ? d->device->index : 0);
        h = fnv_u64(h, d != NULL ? d->autodiff_depth : 0);
    }
    return h;
}
