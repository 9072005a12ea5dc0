#include <setjmp.h>
#include <stdarg.h>
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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_ops),
        cmocka_unit_test(test_f64_and_integers),
        cmocka_unit_test(test_unaligned_source),
        cmocka_unit_test(test_half_precision),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
