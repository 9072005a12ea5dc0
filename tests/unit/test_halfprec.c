/* f16 and bf16 conversions (common/halfprec.c): known encodings, round-to-nearest-even at
 * every midpoint, exact round trips of every 16-bit pattern, inf and NaN. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "devcoord/types.h"

static void
test_f16_known_values(void **state)
{
    (void)state;
    assert_int_equal(dc_float_to_f16(1.0f), 0x3c00);
    assert_int_equal(dc_float_to_f16(-2.0f), 0xc000);
    assert_int_equal(dc_float_to_f16(0.1f), 0x2e66);
    assert_int_equal(dc_float_to_f16(65504.0f), 0x7bff); /* largest finite */
    assert_int_equal(dc_float_to_f16(65519.0f), 0x7bff); /* below the midpoint */
    assert_int_equal(dc_float_to_f16(65520.0f), 0x7c00); /* midpoint, ties to even: inf */
    assert_int_equal(dc_float_to_f16(1e9f), 0x7c00);     /* overflow: inf */
    assert_int_equal(dc_float_to_f16(-1e9f), 0xfc00);
    assert_int_equal(dc_float_to_f16(0x1p-24f), 0x0001);     /* smallest subnormal */
    assert_int_equal(dc_float_to_f16(0x1p-25f), 0x0000);     /* half of it: ties to even */
    assert_int_equal(dc_float_to_f16(0x1.8p-25f), 0x0001);   /* above half: rounds up */
    assert_int_equal(dc_float_to_f16(0x1.ffcp-15f), 0x0400); /* tie: carries into the normals */
    assert_int_equal(dc_float_to_f16(-0.0f), 0x8000);
    assert_int_equal(dc_float_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie: even */
    assert_int_equal(dc_float_to_f16(1.0f + 0x1.8p-10f), 0x3c02);
    assert_true(dc_f16_to_float(0x3555) > 0.3332f && dc_f16_to_float(0x3555) < 0.3334f);
    assert_true(dc_f16_to_float(0x0001) == 0x1p-24f);
    assert_true(isinf(dc_f16_to_float(0x7c00)) && dc_f16_to_float(0xfc00) < 0);
    assert_true(isnan(dc_f16_to_float(0x7e00)));
    assert_true(isnan(dc_f16_to_float(dc_float_to_f16(NAN))));
}

static void
test_bf16_known_values(void **state)
{
    (void)state;
    assert_int_equal(dc_float_to_bf16(1.0f), 0x3f80);
    assert_int_equal(dc_float_to_bf16(-3.0f), 0xc040);
    assert_int_equal(dc_float_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie: even */
    assert_int_equal(dc_float_to_bf16(1.0f + 0x1.8p-7f), 0x3f82);
    assert_int_equal(dc_float_to_bf16(1.0f + 0x1.2p-8f), 0x3f81); /* above the midpoint */
    assert_int_equal(dc_float_to_bf16(0x1.ffp127f), 0x7f80);      /* rounds up to inf */
    assert_true(dc_bf16_to_float(0x4049) > 3.14f && dc_bf16_to_float(0x4049) < 3.15f);
    assert_true(isinf(dc_bf16_to_float(dc_float_to_bf16(INFINITY))));
    assert_true(isnan(dc_bf16_to_float(dc_float_to_bf16(NAN))));
    /* A NaN whose payload sits only in the low bits must not become inf. */
    {
        uint32_t bits = 0x7f800001u;
        float f;
        memcpy(&f, &bits, sizeof(f));
        assert_true(isnan(dc_bf16_to_float(dc_float_to_bf16(f))));
    }
}

/* Every finite pattern reads back as itself; every midpoint between two neighbours rounds
 * to the one with an even last bit (exact in float, since both types fit in one), and the
 * floats just either side of it to the nearer; every f16 NaN keeps its payload in float and
 * comes back quiet with it. */
static void
test_every_pattern(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = dc_f16_to_float((uint16_t)h), b = dc_bf16_to_float((uint16_t)h);
        if (!isnan(f)) {
            assert_int_equal(dc_float_to_f16(f), h);
        }
        if (!isnan(b)) {
            assert_int_equal(dc_float_to_bf16(b), h);
        }
        if ((h & 0x7fff) < 0x7bff) { /* f16: up to the largest finite */
            float next = dc_f16_to_float((uint16_t)(h + 1));
            float mid  = (float)(((double)f + (double)next) / 2);
            assert_int_equal(dc_float_to_f16(mid), (h & 1) ? h + 1 : h);
            assert_int_equal(dc_float_to_f16(nextafterf(mid, 0.0f)), h);
            assert_int_equal(dc_float_to_f16(nextafterf(mid, 2 * next)), h + 1);
        }
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) { /* f16 NaN */
            uint32_t bits;
            memcpy(&bits, &f, sizeof(bits));
            assert_int_equal(bits, ((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
            assert_int_equal(dc_float_to_f16(f), h | 0x200u);
        }
        if ((h & 0x7fff) < 0x7f7f) { /* bf16 */
            float next = dc_bf16_to_float((uint16_t)(h + 1));
            float mid  = (float)(((double)b + (double)next) / 2);
            assert_int_equal(dc_float_to_bf16(mid), (h & 1) ? h + 1 : h);
            assert_int_equal(dc_float_to_bf16(nextafterf(mid, 0.0f)), h);
            assert_int_equal(dc_float_to_bf16(nextafterf(mid, 2 * next)), h + 1);
        }
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_known_values),
        cmocka_unit_test(test_bf16_known_values),
        cmocka_unit_test(test_every_pattern),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
