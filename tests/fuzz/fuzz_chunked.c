/* The coordinator's reading of etcd's chunked HTTP answers (etcd.c): the same bytes decoded
 * whole (etcd_dechunk) and as they come in reads (etcd_dechunk_more, one state), cut where
 * the input's first bytes say. Both must give the same verdict and, complete, the same body;
 * the state never lets decoded bytes overtake raw ones nor raw ones pass what has come. */
#include <stdlib.h>
#include <string.h>

#include "etcd.h"
#include "fuzz.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct etcd_dechunk d = { 0 };
    uint32_t cuts;
    size_t n, have = 0, whole_len;
    char *whole, *parts;
    int want, got = 0;

    if (size < 4) {
        return 0;
    }
    memcpy(&cuts, data, 4); /* read sizes: 1 to 16 bytes, picked from these bits in turn */
    data += 4;
    n = size - 4;
    if ((whole = malloc(n + 1)) == NULL || (parts = malloc(n + 1)) == NULL) {
        free(whole);
        return 0;
    }
    memcpy(whole, data, n);
    whole_len = n;
    want      = etcd_dechunk(whole, &whole_len);
    for (unsigned k = 0; have < n && got == 0; k++) {
        size_t step = 1 + ((cuts >> ((k * 4) % 32)) & 15);
        step        = step < n - have ? step : n - have;
        memcpy(parts + have, data + have, step);
        have += step;
        got = etcd_dechunk_more(parts, have, &d);
        if (d.out > d.in || d.in > have) {
            fuzz_finding("dechunk state out of bounds: out %zu, in %zu, have %zu", d.out, d.in,
                         have);
        }
    }
    if (got != want) {
        fuzz_finding("chunked body decoded whole: %d, in reads: %d", want, got);
    }
    if (want == 1 && (whole_len != d.out || memcmp(whole, parts, d.out) != 0)) {
        fuzz_finding("chunked body decoded whole (%zu bytes) and in reads (%zu) differ", whole_len,
                     d.out);
    }
    free(whole);
    free(parts);
    return 0;
}
