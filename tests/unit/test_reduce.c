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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_ops),
        cmocka_unit_test(test_f64_and_integers),
        cmocka_unit_test(test_unaligned_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
