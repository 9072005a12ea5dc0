#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "reduce.h"

static void
test_f32_ops(void **state)
{
    float dst[5];
    const float src[5]  = { 1.5f, -2.0f, 3.0f, 0.5f, 10.0f };
    const float init[5] = { 2.0f, 4.0f, -1.0f, 0.5f, 3.0f };

    (void)state;
    memcpy(dst, init, sizeof(dst));
    reduce_into(DC_DTYPE_F32, DC_REDUCE_SUM, dst, src, 5);
    assert_true(dst[0] == 3.5f && dst[1] == 2.0f && dst[2] == 2.0f && dst[4] == 13.0f);
    memcpy(dst, init, sizeof(dst));
    reduce_into(DC_DTYPE_F32, DC_REDUCE_PROD, dst, src, 5);
    assert_true(dst[0] == 3.0f && dst[1] == -8.0f && dst[2] == -3.0f && dst[4] == 30.0f);
    memcpy(dst, init, sizeof(dst));
    reduce_into(DC_DTYPE_F32, DC_REDUCE_MIN, dst, src, 5);
    assert_true(dst[0] == 1.5f && dst[1] == -2.0f && dst[2] == -1.0f && dst[4] == 3.0f);
    memcpy(dst, init, sizeof(dst));
    reduce_into(DC_DTYPE_F32, DC_REDUCE_MAX, dst, src, 5);
    assert_true(dst[0] == 2.0f && dst[1] == 4.0f && dst[2] == 3.0f && dst[4] == 10.0f);
    /* mean accumulates as a sum, then divides by the contributions */
    memcpy(dst, init, sizeof(dst));
    reduce_into(DC_DTYPE_F32, DC_REDUCE_MEAN, dst, src, 5);
    reduce_finish_mean(DC_DTYPE_F32, dst, 5, 2);
    assert_true(dst[0] == 1.75f && dst[1] == 1.0f && dst[4] == 6.5f);
}

static void
test_f64_and_integers(void **state)
{
    double d[2]         = { 1e300, -4.0 };
    const double ds[2]  = { 1e300, 2.0 };
    int32_t i[3]        = { INT32_MAX, -7, 9 };
    const int32_t is[3] = { 1, 2, -3 };
    int64_t l[2]        = { INT64_MAX, 10 };
    const int64_t ls[2] = { 2, -3 };

    (void)state;
    reduce_into(DC_DTYPE_F64, DC_REDUCE_SUM, d, ds, 2);
    assert_true(d[0] == 2e300 && d[1] == -2.0);
    /* Integer sums and products wrap like two's complement, as in torch. */
    reduce_into(DC_DTYPE_I32, DC_REDUCE_SUM, i, is, 3);
    assert_int_equal(i[0], INT32_MIN);
    assert_int_equal(i[1], -5);
    assert_int_equal(i[2], 6);
    reduce_into(DC_DTYPE_I64, DC_REDUCE_PROD, l, ls, 2);
    assert_true(l[0] == -2);
    assert_true(l[1] == -30);
    /* Integer mean truncates toward zero. */
    i[0] = 7;
    i[1] = -7;
    reduce_finish_mean(DC_DTYPE_I32, i, 2, 2);
    assert_int_equal(i[0], 3);
    assert_int_equal(i[1], -3);
    l[0] = 9;
    reduce_finish_mean(DC_DTYPE_I64, l, 1, 4);
    assert_true(l[0] == 2);
}

/* A source that is not aligned for its dtype, longer than the staging buffer. */
static void
test_unaligned_source(void **state)
{
    enum { N = 3000 };
    static double dst[N], expect[N];
    static unsigned char raw[N * sizeof(double) + 1];

    (void)state;
    for (size_t k = 0; k < N; k++) {
        double v  = (double)k * 0.25;
        dst[k]    = (double)k;
        expect[k] = dst[k] > v ? dst[k] : v;
        memcpy(raw + 1 + k * sizeof(double), &v, sizeof(v));
    }
    for (size_t k = 0; k < N; k += 7) {
        double v = 1e9;
        memcpy(raw + 1 + k * sizeof(double), &v, sizeof(v));
        expect[k] = v;
    }
    reduce_into(DC_DTYPE_F64, DC_REDUCE_MAX, dst, raw + 1, N);
    assert_memory_equal(dst, expect, sizeof(dst));
}

/* f16 and bf16 combine in float and round once per combination. */
static void
test_half_precision(void **state)
{
    uint16_t h[4], hs[4], b[2], bs[2];
    const float hv[4] = { 1.5f, 2048.0f, -3.0f, 0.5f }, hsv[4] = { 2.25f, 1.0f, 4.0f, 0.25f };

    (void)state;
    for (int k = 0; k < 4; k++) {
        h[k]  = dc_float_to_f16(hv[k]);
        hs[k] = dc_float_to_f16(hsv[k]);
    }
    reduce_into(DC_DTYPE_F16, DC_REDUCE_SUM, h, hs, 4);
    assert_true(dc_f16_to_float(h[0]) == 3.75f);
    assert_true(dc_f16_to_float(h[1]) == 2048.0f); /* 2049 is not an f16: ties to even */
    assert_true(dc_f16_to_float(h[2]) == 1.0f);
    reduce_into(DC_DTYPE_F16, DC_REDUCE_MAX, h, hs, 4);
    assert_true(dc_f16_to_float(h[0]) == 3.75f && dc_f16_to_float(h[2]) == 4.0f);
    reduce_into(DC_DTYPE_F16, DC_REDUCE_MIN, h, hs, 4);
    assert_true(dc_f16_to_float(h[0]) == 2.25f && dc_f16_to_float(h[3]) == 0.25f);
    reduce_into(DC_DTYPE_F16, DC_REDUCE_PROD, h, hs, 4);
    assert_true(dc_f16_to_float(h[0]) == 5.0625f && dc_f16_to_float(h[2]) == 16.0f);
    reduce_finish_mean(DC_DTYPE_F16, h, 4, 2);
    assert_true(dc_f16_to_float(h[0]) == 2.53125f && dc_f16_to_float(h[2]) == 8.0f);

    b[0]  = dc_float_to_bf16(256.0f);
    b[1]  = dc_float_to_bf16(-1.5f);
    bs[0] = dc_float_to_bf16(1.0f);
    bs[1] = dc_float_to_bf16(0.25f);
    reduce_into(DC_DTYPE_BF16, DC_REDUCE_SUM, b, bs, 2);
    assert_true(dc_bf16_to_float(b[0]) == 256.0f); /* 257 needs 9 bits: ties to even */
    assert_true(dc_bf16_to_float(b[1]) == -1.25f);
    reduce_into(DC_DTYPE_BF16, DC_REDUCE_PROD, b, bs, 2);
    assert_true(dc_bf16_to_float(b[1]) == -0.3125f);
    reduce_finish_mean(DC_DTYPE_BF16, b, 2, 4);
    assert_true(dc_bf16_to_float(b[0]) == 64.0f);
}

/* reduce_into_many gives the bytes of reduce_into once per source, in order: every dtype
 * and op, 1 to 7 sources (three a pass, then the rest), aligned and unaligned sources. */
static void
test_many_sources_equal_one_at_a_time(void **state)
{
    enum { N = 37, MAX_SRC = 7 };
    static const dc_reduce_op ops[] = { DC_REDUCE_SUM, DC_REDUCE_MEAN, DC_REDUCE_MIN, DC_REDUCE_MAX,
                                        DC_REDUCE_PROD };
    uint64_t raw[MAX_SRC][N + 1], dst_many[N], dst_one[N], init[N] = { 0 };
    uint32_t seed = 12345;

    (void)state;
    for (size_t k = 0; k < sizeof(raw); k++) { /* bytes in a range every dtype reduces in */
        seed                = seed * 1103515245u + 12345u;
        ((uint8_t *)raw)[k] = (uint8_t)(seed >> 16) & 0x3f;
        ((uint8_t *)init)[k % sizeof(init)] ^= (uint8_t)((seed >> 8) & 0x3f);
    }
    for (int dt = DC_DTYPE_F32; dt < DC_DTYPE_COUNT; dt++) {
        size_t esize = dc_dtype_size((dc_dtype)dt);
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            for (size_t n_src = 1; n_src <= MAX_SRC; n_src++) {
                for (size_t shift = 0; shift < 2; shift++) { /* shift 1: unaligned sources */
                    const void *src[MAX_SRC];
                    size_t skew = shift * (n_src % 2 == 0 ? 1 : esize); /* odd: aligned again */
                    for (size_t r = 0; r < n_src; r++) {
                        src[r] = (const uint8_t *)raw[r] + (r == n_src - 1 ? skew : shift);
                    }
                    memcpy(dst_many, init, sizeof(init));
                    memcpy(dst_one, init, sizeof(init));
                    reduce_into_many((dc_dtype)dt, ops[o], dst_many, src, n_src, 0, N);
                    for (size_t r = 0; r < n_src; r++) {
                        reduce_into((dc_dtype)dt, ops[o], dst_one, src[r], N);
                    }
                    assert_memory_equal(dst_many, dst_one, N * esize);
                }
            }
        }
    }
    /* src_offset: each source from that byte on */
    memcpy(dst_many, init, sizeof(init));
    memcpy(dst_one, init, sizeof(init));
    {
        const void *src[3] = { raw[0], raw[1], raw[2] };
        reduce_into_many(DC_DTYPE_I64, DC_REDUCE_SUM, dst_many, src, 3, 16, 10);
        for (size_t r = 0; r < 3; r++) {
            reduce_into(DC_DTYPE_I64, DC_REDUCE_SUM, dst_one, raw[r] + 2, 10);
        }
        assert_memory_equal(dst_many, dst_one, 10 * sizeof(int64_t));
    }
}

/* reduce_pair gives the bytes of a copy then reduce_into, for every dtype and op, with the
 * sources aligned or not. */
static void
test_pair_equals_copy_then_reduce(void **state)
{
    enum { N = 41 };
    static const dc_reduce_op ops[] = { DC_REDUCE_SUM, DC_REDUCE_MEAN, DC_REDUCE_MIN, DC_REDUCE_MAX,
                                        DC_REDUCE_PROD };
    uint64_t x[N + 1], y[N + 1], pair[N], two[N];
    uint32_t seed = 777;

    (void)state;
    for (size_t k = 0; k < sizeof(x); k++) {
        seed              = seed * 1103515245u + 12345u;
        ((uint8_t *)x)[k] = (uint8_t)(seed >> 16) & 0x3f;
        ((uint8_t *)y)[k] = (uint8_t)(seed >> 8) & 0x3f;
    }
    for (int dt = DC_DTYPE_F32; dt < DC_DTYPE_COUNT; dt++) {
        size_t esize = dc_dtype_size((dc_dtype)dt);
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            for (size_t shift = 0; shift < 3; shift++) { /* 1: y unaligned; 2: x unaligned */
                const uint8_t *a = (const uint8_t *)x + (shift == 2);
                const uint8_t *b = (const uint8_t *)y + (shift == 1);
                memset(pair, 0xa5, sizeof(pair));
                reduce_pair((dc_dtype)dt, ops[o], pair, a, b, N);
                memcpy(two, a, N * esize);
                reduce_into((dc_dtype)dt, ops[o], two, b, N);
                assert_memory_equal(pair, two, N * esize);
            }
        }
    }
    /* Not a copy of either: 1.5 + 2.25 */
    {
        float a[2] = { 1.5f, -1.0f }, b[2] = { 2.25f, 4.0f }, d[2] = { 0 };
        reduce_pair(DC_DTYPE_F32, DC_REDUCE_SUM, d, a, b, 2);
        assert_true(d[0] == 3.75f && d[1] == 3.0f);
        reduce_pair(DC_DTYPE_F32, DC_REDUCE_MIN, d, a, b, 2);
        assert_true(d[0] == 1.5f && d[1] == -1.0f);
    }
}

/* Three f16 sources in one pass still round after each combination: 2048 + 1 is 2048 in
 * f16 (ties to even), so 2048 + 1 + 1 + 0 stays 2048 (2050 if summed in float first). */
static void
test_many_sources_round_each_combination(void **state)
{
    uint16_t dst[1] = { dc_float_to_f16(2048.0f) }, one[1] = { dc_float_to_f16(1.0f) },
             zero[1] = { dc_float_to_f16(0.0f) };
    uint16_t bdst[1] = { dc_float_to_bf16(256.0f) }, bone[1] = { dc_float_to_bf16(1.0f) };
    const void *src[3] = { one, one, zero }, *bsrc[3] = { bone, bone, bone };

    (void)state;
    reduce_into_many(DC_DTYPE_F16, DC_REDUCE_SUM, dst, src, 3, 0, 1);
    assert_true(dc_f16_to_float(dst[0]) == 2048.0f);
    reduce_into_many(DC_DTYPE_BF16, DC_REDUCE_SUM, bdst, bsrc, 3, 0, 1);
    assert_true(dc_bf16_to_float(bdst[0]) == 256.0f); /* 257 needs 9 bits: each +1 is lost */
}

/* The sources fold in their order: 1 + -1 + 2^-30 is 2^-30, 1 + 2^-30 + -1 is 0. */
static void
test_many_sources_keep_their_order(void **state)
{
    float f = 1.0f, fm = -1.0f, ft = 0x1p-30f, fz = 0.0f;
    double d = 1.0, dm = -1.0, dt = 0x1p-60, dz = 0.0;
    const void *fsrc[3] = { &fm, &ft, &fz }, *dsrc[4] = { &dz, &dz, &dm, &dt };

    (void)state;
    reduce_into_many(DC_DTYPE_F32, DC_REDUCE_SUM, &f, fsrc, 3, 0, 1);
    assert_true(f == 0x1p-30f);
    reduce_into_many(DC_DTYPE_F64, DC_REDUCE_SUM, &d, dsrc, 4, 0, 1); /* one pass, then one */
    assert_true(d == 0x1p-60);
}

/* reduce_fan: every out holds in[0] op in[1] op ... in that order (reduce_into_many's bytes),
 * for every dtype and non-MEAN op and 1 to 7 buffers, in place and apart, only over
 * [first, first + count) (counts that are no multiple of a block); MEAN, a misaligned buffer
 * or no buffer is refused with nothing touched. */
static void
test_fan_equals_reduce_then_copy(void **state)
{
    enum { N = 83, FIRST = 3, COUNT = 71, MAX_BUFS = 7 };
    static const dc_reduce_op ops[] = { DC_REDUCE_SUM, DC_REDUCE_MIN, DC_REDUCE_MAX,
                                        DC_REDUCE_PROD };
    uint64_t raw[MAX_BUFS][N + 1], outs[MAX_BUFS][N], ins[MAX_BUFS][N], want[N];
    uint32_t seed = 4242;

    (void)state;
    for (size_t k = 0; k < sizeof(raw); k++) {
        seed                = seed * 1103515245u + 12345u;
        ((uint8_t *)raw)[k] = (uint8_t)(seed >> 16) & 0x3f;
    }
    for (int dt = DC_DTYPE_F32; dt < DC_DTYPE_COUNT; dt++) {
        size_t esize = dc_dtype_size((dc_dtype)dt), lo = FIRST * esize, len = COUNT * esize;
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            for (size_t n = 1; n <= MAX_BUFS; n++) {
                for (int in_place = 0; in_place < 2; in_place++) {
                    const void *in[MAX_BUFS], *rest[MAX_BUFS];
                    void *out[MAX_BUFS];
                    memcpy(want, raw[0], sizeof(want));
                    for (size_t r = 0; r < n; r++) {
                        memcpy(ins[r], raw[r], sizeof(ins[r]));
                        memset(outs[r], 0xa5, sizeof(outs[r]));
                        in[r]   = ins[r];
                        out[r]  = in_place ? (void *)ins[r] : (void *)outs[r];
                        rest[r] = (const uint8_t *)raw[r] + lo;
                    }
                    reduce_into_many((dc_dtype)dt, ops[o], (uint8_t *)want + lo, rest + 1, n - 1, 0,
                                     COUNT);
                    assert_true(reduce_fan((dc_dtype)dt, ops[o], out, in, n, FIRST, COUNT));
                    for (size_t r = 0; r < n; r++) {
                        const uint8_t *got = out[r], *before = in_place ? (const uint8_t *)raw[r]
                                                                        : (const uint8_t *)NULL;
                        assert_memory_equal(got + lo, (uint8_t *)want + lo, len);
                        if (before != NULL) { /* outside the range: as it was */
                            assert_memory_equal(got, before, lo);
                            assert_memory_equal(got + lo + len, before + lo + len,
                                                N * esize - lo - len);
                        } else {
                            assert_int_equal(got[lo - 1], 0xa5);
                            assert_int_equal(got[lo + len], 0xa5);
                            assert_memory_equal(ins[r], raw[r], sizeof(ins[r])); /* ins kept */
                        }
                    }
                }
            }
        }
    }
    /* Refused, nothing written: MEAN, a misaligned buffer, no buffer. */
    {
        float a[4] = { 1, 2, 3, 4 }, b[4] = { 5, 6, 7, 8 };
        uint8_t odd[sizeof(float) * 5];
        const void *in[2] = { a, b }, *bad[2] = { a, odd + 1 };
        void *out[2] = { a, b };
        assert_false(reduce_fan(DC_DTYPE_F32, DC_REDUCE_MEAN, out, in, 2, 0, 4));
        assert_false(reduce_fan(DC_DTYPE_F32, DC_REDUCE_SUM, out, bad, 2, 0, 4));
        assert_false(reduce_fan(DC_DTYPE_F32, DC_REDUCE_SUM, out, in, 0, 0, 4));
        assert_true(a[0] == 1.0f && b[3] == 8.0f);
    }
    /* The order and the rounding after each combination: 1 + -1 + 2^-30 is 2^-30 (1 + 2^-30
     * + -1 would be 0); in f16, 2048 + 1 + 1 stays 2048 (2050 if summed in float first). */
    {
        float f[3]    = { 1.0f, -1.0f, 0x1p-30f };
        uint16_t h[3] = { dc_float_to_f16(2048.0f), dc_float_to_f16(1.0f), dc_float_to_f16(1.0f) };
        const void *fin[3] = { &f[0], &f[1], &f[2] }, *hin[3] = { &h[0], &h[1], &h[2] };
        void *fout[3] = { &f[0], &f[1], &f[2] }, *hout[3] = { &h[0], &h[1], &h[2] };
        assert_true(reduce_fan(DC_DTYPE_F32, DC_REDUCE_SUM, fout, fin, 3, 0, 1));
        assert_true(f[0] == 0x1p-30f && f[1] == 0x1p-30f && f[2] == 0x1p-30f);
        assert_true(reduce_fan(DC_DTYPE_F16, DC_REDUCE_SUM, hout, hin, 3, 0, 1));
        assert_true(dc_f16_to_float(h[0]) == 2048.0f && h[1] == h[0] && h[2] == h[0]);
    }
}

static bool
half_nan(dc_dtype dtype, uint16_t h)
{
    uint16_t exp = dtype == DC_DTYPE_F16 ? 0x7c00 : 0x7f80;

    return (h & exp) == exp && (h & (uint16_t) ~(exp | 0x8000)) != 0;
}

/* got (vector conversions) and want (portable) are the same bits, but in a SUM or PROD
 * (nan_pairs) where two or more of the n inputs at an element are NaNs: then both are NaNs
 * (which payload is kept is the compiler's choice). */
static void
assert_half_same(dc_dtype dtype, const uint16_t *got, const uint16_t *want,
                 const uint16_t *const *in, size_t n, size_t first, size_t count, bool nan_pairs)
{
    for (size_t i = first; i < first + count; i++) {
        size_t nans = 0;
        if (got[i] == want[i]) {
            continue;
        }
        for (size_t r = 0; r < n; r++) {
            nans += half_nan(dtype, in[r][i]) ? 1 : 0;
        }
        if (!nan_pairs || nans < 2 || !half_nan(dtype, got[i]) || !half_nan(dtype, want[i])) {
            fail_msg("%s element %zu: vector 0x%04x, portable 0x%04x (inputs with %zu NaNs)",
                     dtype == DC_DTYPE_F16 ? "f16" : "bf16", i, got[i], want[i], nans);
        }
    }
}

/* f16 and bf16 with the processor's vector conversions (reduce_simd: F16C, AVX2) give the
 * portable kernels' bits for every reduce op, over every kind of value (random bits:
 * subnormals, infinities, NaNs quiet and signalling) in every kernel: one source, a pair,
 * many, the fan of 1 to 5 buffers, MEAN's division, with counts that leave a tail past the
 * last vector. */
static void
test_simd_gives_the_portable_bits(void **state)
{
    enum { N = 1003, BUFS = 5, FIRST = 5, SPECIALS = 14 };
    static const dc_reduce_op ops[] = { DC_REDUCE_SUM, DC_REDUCE_PROD, DC_REDUCE_MEAN,
                                        DC_REDUCE_MIN, DC_REDUCE_MAX };
    static const dc_dtype dtypes[]  = { DC_DTYPE_F16, DC_DTYPE_BF16 };
    /* Signalling and quiet NaNs, infinities, the largest, the least subnormal, the largest
     * subnormal, the least normal, zeros, one. */
    static const uint16_t special[2][SPECIALS] = {
        { 0x7c01, 0x7e55, 0xfd00, 0x7c00, 0xfc00, 0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff, 0x0400,
          0x0000, 0x8000, 0x3c00 },
        { 0x7f81, 0x7fc5, 0xffa0, 0x7f80, 0xff80, 0x7f7f, 0xff7f, 0x0001, 0x8001, 0x007f, 0x0080,
          0x0000, 0x8000, 0x3f80 },
    };
    uint16_t raw[BUFS][N], got[BUFS][N], want[BUFS][N];
    const uint16_t *in[BUFS];
    uint32_t seed = 77;

    (void)state;
    if (!reduce_simd(1)) {
        reduce_simd(0);
        skip(); /* neither F16C nor AVX2 here: only the portable kernels run */
    }
    for (size_t t = 0; t < 2; t++) {
        dc_dtype dt = dtypes[t];
        for (size_t r = 0; r < BUFS; r++) {
            for (size_t i = 0; i < N; i++) {
                seed      = seed * 1103515245u + 12345u;
                raw[r][i] = (uint16_t)(seed >> 12);
            }
            /* Every special value against every other one, in every buffer's turn. */
            for (size_t i = 0; i < SPECIALS; i++) {
                raw[r][100 + r * 20 + i]              = special[t][i];
                raw[(r + 1) % BUFS][100 + r * 20 + i] = special[t][(i + r) % SPECIALS];
            }
            in[r] = raw[r];
        }
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            const void *rest[BUFS - 1] = { raw[1], raw[2], raw[3], raw[4] };
            bool pairs                 = ops[o] != DC_REDUCE_MIN && ops[o] != DC_REDUCE_MAX;
            for (int hw = 0; hw < 2; hw++) {
                uint16_t(*dst)[N] = hw ? got : want;
                assert_int_equal(reduce_simd(hw), hw);
                memcpy(dst[0], raw[0], sizeof(raw[0]));
                reduce_into(dt, ops[o], dst[0], raw[1], N);
                reduce_pair(dt, ops[o], dst[1], raw[0], raw[1], N);
                memcpy(dst[2], raw[0], sizeof(raw[0]));
                reduce_into_many(dt, ops[o], dst[2], rest, BUFS - 1, 0, N);
            }
            assert_half_same(dt, got[0], want[0], in, 2, 0, N, pairs);
            assert_half_same(dt, got[1], want[1], in, 2, 0, N, pairs);
            assert_half_same(dt, got[2], want[2], in, BUFS, 0, N, pairs);
            if (ops[o] == DC_REDUCE_MEAN) {
                /* Its division at the end, by 3 (which rounds) and by 4. */
                for (size_t k = 3; k <= 4; k++) {
                    for (int hw = 0; hw < 2; hw++) {
                        uint16_t(*dst)[N] = hw ? got : want;
                        assert_int_equal(reduce_simd(hw), hw);
                        memcpy(dst[3], raw[0], sizeof(raw[0]));
                        reduce_finish_mean(dt, dst[3], N, k);
                    }
                    assert_half_same(dt, got[3], want[3], in, 1, 0, N, false);
                }
                continue; /* no fan: its division is not folded in */
            }
            for (size_t n = 1; n <= BUFS; n++) {
                const void *fin[BUFS];
                void *fout[BUFS];
                for (int hw = 0; hw < 2; hw++) {
                    uint16_t(*dst)[N] = hw ? got : want;
                    assert_int_equal(reduce_simd(hw), hw);
                    for (size_t r = 0; r < n; r++) {
                        fin[r]  = raw[r];
                        fout[r] = dst[r];
                    }
                    assert_true(reduce_fan(dt, ops[o], fout, fin, n, FIRST, N - FIRST - 2));
                }
                for (size_t r = 0; r < n; r++) {
                    assert_half_same(dt, got[r], want[r], in, n, FIRST, N - FIRST - 2, pairs);
                }
            }
        }
    }
    reduce_simd(1);
}

/* Every test but the comparison runs twice: f16 and bf16 with vector conversions where this
 * processor has them, then with the portable kernels. */
static int
simd_on(void **state)
{
    (void)state;
    reduce_simd(1);
    return 0;
}

static int
simd_off(void **state)
{
    (void)state;
    reduce_simd(0);
    return 0;
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_ops),
        cmocka_unit_test(test_f64_and_integers),
        cmocka_unit_test(test_unaligned_source),
        cmocka_unit_test(test_half_precision),
        cmocka_unit_test(test_many_sources_equal_one_at_a_time),
        cmocka_unit_test(test_many_sources_round_each_combination),
        cmocka_unit_test(test_many_sources_keep_their_order),
        cmocka_unit_test(test_pair_equals_copy_then_reduce),
        cmocka_unit_test(test_fan_equals_reduce_then_copy),
    };
    const struct CMUnitTest both[] = {
        cmocka_unit_test(test_simd_gives_the_portable_bits),
    };
    int failed = cmocka_run_group_tests_name("16-bit floats with vector conversions where present",
                                             tests, simd_on, NULL);

    failed += cmocka_run_group_tests_name("16-bit floats portable", tests, simd_off, NULL);
    return failed + cmocka_run_group_tests_name("vector against portable", both, NULL, NULL);
}
