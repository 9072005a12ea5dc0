/* The worker's in-place local all-reduce, reduce-scatter, all-gather, reduce and broadcast
 * (issue 17, lreduce.c): its slices, and results bit-identical to reducing in rank order on
 * one thread (the general path's order), in every out (a reduce-scatter's: its block), for
 * every dtype and op, counts that no slice count divides and count 1, with the results in
 * place (a reduce-scatter's over its rank's own block; an all-gather's input in its own
 * block of its result) and apart, and a reduce to a root and a broadcast from it in place,
 * on 0, 1 and 3 helper threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lreduce.h"
#include "reduce.h"

#define MAX_N 4

static const dc_dtype dtypes[]  = { DC_DTYPE_F32, DC_DTYPE_F64, DC_DTYPE_I32,
                                    DC_DTYPE_I64, DC_DTYPE_F16, DC_DTYPE_BF16 };
static const dc_reduce_op ops[] = { DC_REDUCE_SUM, DC_REDUCE_PROD, DC_REDUCE_MIN, DC_REDUCE_MAX,
                                    DC_REDUCE_MEAN };

static void
test_slices(void **state)
{
    size_t bounds[LREDUCE_MAX_SLICES + 1];
    static const size_t counts[] = { 0, 1, 2, 15, 16, 17, 1000, 4099, 1u << 20, (1u << 20) + 3 };
    static const size_t elems[]  = { 2, 4, 8 };

    (void)state;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        for (size_t e = 0; e < 3; e++) {
            for (size_t max = 1; max <= LREDUCE_MAX_SLICES; max++) {
                for (size_t min = 1; min <= LREDUCE_MIN_SLICE_BYTES; min *= 64) {
                    size_t n = lreduce_slices(counts[c], elems[e], max, min, bounds);
                    assert_true(n >= 1 && n <= max);
                    assert_int_equal(bounds[0], 0);
                    assert_int_equal(bounds[n], counts[c]);
                    for (size_t k = 0; k < n; k++) {
                        assert_true(bounds[k] < bounds[k + 1] || counts[c] == 0);
                        assert_int_equal(bounds[k] * elems[e] % 64, 0);
                        /* Each slice of at least min bytes, unless it is the only one or
                         * the last's remainder. */
                        if (n > 1 && k + 1 < n) {
                            assert_true((bounds[k + 1] - bounds[k]) * elems[e] >= min);
                        }
                    }
                }
            }
        }
    }
    /* A big count with the default minimum uses every slice allowed; a small one, one. */
    assert_int_equal(lreduce_slices((16u << 20) / 4, 4, 2, LREDUCE_MIN_SLICE_BYTES, bounds), 2);
    assert_int_equal(lreduce_slices(1000, 4, 8, LREDUCE_MIN_SLICE_BYTES, bounds), 1);
    assert_int_equal(lreduce_slices(1, 8, 8, 1, bounds), 1);
}

/* Small values of every dtype (f16/bf16 bit patterns of small floats), so products stay
 * finite. */
static void
fill(dc_dtype t, uint8_t *buf, size_t count, unsigned *seed)
{
    for (size_t i = 0; i < count; i++) {
        int v   = (int)(rand_r(seed) % 7) - 3;
        float f = (float)v * 0.75f;
        switch (t) {
        case DC_DTYPE_F32:
            ((float *)buf)[i] = f;
            break;
        case DC_DTYPE_F64:
            ((double *)buf)[i] = (double)f / 3;
            break;
        case DC_DTYPE_I32:
            ((int32_t *)buf)[i] = v * 1000003;
            break;
        case DC_DTYPE_I64:
            ((int64_t *)buf)[i] = (int64_t)v * 100000000007;
            break;
        case DC_DTYPE_F16:
            ((uint16_t *)buf)[i] = dc_float_to_f16(f / 3);
            break;
        case DC_DTYPE_BF16:
            ((uint16_t *)buf)[i] = dc_float_to_bf16(f / 3);
            break;
        default:
            break;
        }
    }
}

/* An all-reduce of count elements per rank, or (scatter) a reduce-scatter of count elements
 * per rank's result. */
static void
check_job(struct lreduce *lr, dc_dtype t, dc_reduce_op op, size_t n, size_t count, bool in_place,
          bool scatter, size_t min_slice, unsigned *seed)
{
    size_t elem = dc_dtype_size(t), out_bytes = count * elem, bytes = out_bytes * (scatter ? n : 1);
    uint8_t *in[MAX_N], *out[MAX_N], *want                          = malloc(bytes);
    struct lreduce_job j = {
        t, op, bytes / elem, n, (const uint8_t *const *)in, out, scatter ? count : 0, false, 0
    };

    assert_non_null(want);
    for (size_t r = 0; r < n; r++) {
        in[r] = malloc(bytes);
        assert_non_null(in[r]);
        fill(t, in[r], bytes / elem, seed);
        /* In place, a rank's block of the result goes over its own block of its input. */
        out[r] = in_place ? in[r] + (scatter ? r * out_bytes : 0) : malloc(out_bytes);
        assert_non_null(out[r]);
    }
    /* The reference: rank order on one thread, as the general path computes it. */
    memcpy(want, in[0], bytes);
    for (size_t r = 1; r < n; r++) {
        reduce_into(t, op, want, in[r], bytes / elem);
    }
    if (op == DC_REDUCE_MEAN) {
        reduce_finish_mean(t, want, bytes / elem, n);
    }
    assert_true(lreduce_run(lr, &j, min_slice));
    for (size_t r = 0; r < n; r++) {
        assert_memory_equal(out[r], want + (scatter ? r * out_bytes : 0), out_bytes);
        if (!in_place) {
            free(out[r]);
        }
        free(in[r]);
    }
    free(want);
}

/* An all-gather of count elements per rank: every out holds every input, in rank order; in
 * place, a rank's input is its own block of its out, and stays as it was. */
static void
check_gather(struct lreduce *lr, dc_dtype t, size_t n, size_t count, bool in_place,
             size_t min_slice, unsigned *seed)
{
    size_t elem = dc_dtype_size(t), block = count * elem, bytes = block * n;
    uint8_t *in[MAX_N], *out[MAX_N], *want                      = malloc(bytes);
    struct lreduce_job j = { .dtype  = t,
                             .count  = n * count,
                             .n      = n,
                             .in     = (const uint8_t *const *)in,
                             .out    = out,
                             .block  = count,
                             .gather = true };

    assert_non_null(want);
    for (size_t r = 0; r < n; r++) {
        out[r] = malloc(bytes);
        assert_non_null(out[r]);
        memset(out[r], 0xa5, bytes);
        in[r] = in_place ? out[r] + r * block : malloc(block);
        assert_non_null(in[r]);
        fill(t, in[r], count, seed);
        memcpy(want + r * block, in[r], block);
    }
    assert_true(lreduce_run(lr, &j, min_slice));
    for (size_t r = 0; r < n; r++) {
        assert_memory_equal(out[r], want, bytes);
        if (!in_place) {
            assert_memory_equal(in[r], want + r * block, block);
            free(in[r]);
        }
        free(out[r]);
    }
    free(want);
}

/* A reduce to root (the root's buffer becomes op over all, in rank order; the others stay)
 * or a broadcast from it (every buffer becomes the root's), each rank's buffer its input and
 * its result, as dc_reduce and dc_broadcast pass them. */
static void
check_rooted(struct lreduce *lr, dc_dtype t, dc_reduce_op op, size_t n, size_t count, size_t root,
             bool broadcast, unsigned *seed)
{
    size_t elem = dc_dtype_size(t), bytes = count * elem;
    uint8_t *buf[MAX_N], *was[MAX_N], *want = malloc(bytes);
    struct lreduce_job j = { .dtype  = t,
                             .op     = op,
                             .count  = count,
                             .n      = broadcast ? 1 : n,
                             .in     = broadcast ? (const uint8_t *const *)&buf[root]
                                                 : (const uint8_t *const *)buf,
                             .out    = broadcast ? buf : &buf[root],
                             .block  = count,
                             .gather = broadcast,
                             .n_out  = broadcast ? n : 1 };

    assert_non_null(want);
    for (size_t r = 0; r < n; r++) {
        assert_non_null(buf[r] = malloc(bytes));
        assert_non_null(was[r] = malloc(bytes));
        fill(t, buf[r], count, seed);
        memcpy(was[r], buf[r], bytes);
    }
    memcpy(want, buf[broadcast ? root : 0], bytes);
    for (size_t r = 1; r < n && !broadcast; r++) {
        reduce_into(t, op, want, buf[r], count);
    }
    if (op == DC_REDUCE_MEAN && !broadcast) {
        reduce_finish_mean(t, want, count, n);
    }
    assert_true(lreduce_run(lr, &j, 1));
    for (size_t r = 0; r < n; r++) {
        assert_memory_equal(buf[r], broadcast || r == root ? want : was[r], bytes);
        free(buf[r]);
        free(was[r]);
    }
    free(want);
}

static void
run_all(unsigned helpers)
{
    struct lreduce *lr           = lreduce_new(helpers);
    static const size_t counts[] = { 1, 2, 3, 17, 1001, 4099, 70001 };
    unsigned seed                = 17 + helpers;

    assert_non_null(lr);
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            for (size_t n = 2; n <= MAX_N; n++) {
                for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                    /* min_slice 1: as many slices as threads, whatever the count. */
                    for (int scatter = 0; scatter < 2; scatter++) {
                        check_job(lr, dtypes[d], ops[o], n, counts[c], true, scatter, 1, &seed);
                        check_job(lr, dtypes[d], ops[o], n, counts[c], false, scatter, 1, &seed);
                    }
                }
            }
        }
    }
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        for (size_t n = 1; n <= MAX_N; n++) {
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                check_gather(lr, dtypes[d], n, counts[c], true, 1, &seed);
                check_gather(lr, dtypes[d], n, counts[c], false, 1, &seed);
            }
        }
    }
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        for (size_t n = 2; n <= MAX_N; n++) {
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
                    check_rooted(lr, dtypes[d], ops[o], n, counts[c], c % n, false, &seed);
                }
                check_rooted(lr, dtypes[d], DC_REDUCE_SUM, n, counts[c], n - 1 - c % n, true,
                             &seed);
            }
        }
    }
    /* The default minimum on a count worth splitting. */
    check_job(lr, DC_DTYPE_F32, DC_REDUCE_SUM, 4, (1u << 20) + 3, true, false,
              LREDUCE_MIN_SLICE_BYTES, &seed);
    check_job(lr, DC_DTYPE_F32, DC_REDUCE_SUM, 4, (1u << 18) + 3, true, true,
              LREDUCE_MIN_SLICE_BYTES, &seed);
    check_gather(lr, DC_DTYPE_F32, 4, (1u << 18) + 3, true, LREDUCE_MIN_SLICE_BYTES, &seed);
    lreduce_free(lr);
}

static void
test_no_helper(void **state)
{
    (void)state;
    run_all(0);
}

static void
test_one_helper(void **state)
{
    (void)state;
    run_all(1);
}

static void
test_three_helpers(void **state)
{
    (void)state;
    run_all(3);
}

/* A job that does not add up is refused and touches nothing: a count that is not its outs'
 * blocks, an all-reduce with fewer outs than inputs, no input. */
static void
test_refused_jobs(void **state)
{
    struct lreduce *lr = lreduce_new(1);
    float a[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, b[8] = { 1, 1, 1, 1, 1, 1, 1, 1 }, out[8] = { 0 };
    const uint8_t *in[2]       = { (const uint8_t *)a, (const uint8_t *)b };
    uint8_t *outs[2]           = { (uint8_t *)out, (uint8_t *)out };
    struct lreduce_job j       = { .dtype = DC_DTYPE_F32,
                                   .op    = DC_REDUCE_SUM,
                                   .count = 7,
                                   .n     = 2,
                                   .in    = in,
                                   .out   = outs,
                                   .block = 4 };
    static const float zero[8] = { 0 };

    (void)state;
    assert_non_null(lr);
    assert_false(lreduce_run(lr, &j, 1)); /* 7 elements are not 2 blocks of 4 */
    j.block = 0;
    j.n_out = 1;
    assert_false(lreduce_run(lr, &j, 1)); /* an all-reduce writes every input's out */
    j.n_out = 0;
    j.n     = 0;
    assert_false(lreduce_run(lr, &j, 1));
    assert_memory_equal(out, zero, sizeof(out));
    j.n = 2;
    assert_true(lreduce_run(lr, &j, 1));
    assert_true(out[0] == 2 && out[6] == 8 && out[7] == 0);
    lreduce_free(lr);
}

/* Many jobs in a row on one pool: no wake-up lost, none left running. */
static void
test_many_jobs(void **state)
{
    struct lreduce *lr = lreduce_new(3);
    unsigned seed      = 5;

    (void)state;
    assert_non_null(lr);
    for (int k = 0; k < 2000; k++) {
        check_job(lr, DC_DTYPE_I32, DC_REDUCE_SUM, 2, 64 + (size_t)k % 61, true, k % 2, 1, &seed);
    }
    lreduce_free(lr);
    lreduce_free(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices),     cmocka_unit_test(test_no_helper),
        cmocka_unit_test(test_one_helper), cmocka_unit_test(test_three_helpers),
        cmocka_unit_test(test_many_jobs),  cmocka_unit_test(test_refused_jobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
