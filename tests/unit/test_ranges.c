/*
 * The claims of an op step's byte ranges (server/worker/ranges.c): a range that overlaps
 * what came before is refused and changes nothing, and the set always equals the runs of a
 * plain byte map of what was claimed (sorted, disjoint, touching spans merged).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ranges.h"

#define SPACE 256

/* The set is exactly the runs of `have`. */
static void
assert_runs(const struct ranges *s, const bool *have)
{
    size_t n = 0;

    for (size_t b = 0; b < SPACE;) {
        size_t start;
        if (!have[b]) {
            b++;
            continue;
        }
        start = b;
        while (b < SPACE && have[b]) {
            b++;
        }
        assert_true(n < s->len);
        assert_int_equal(s->v[n].off, start);
        assert_int_equal(s->v[n].len, b - start);
        n++;
    }
    assert_int_equal(n, s->len);
}

static void
test_claims_match_a_byte_map(void **state)
{
    (void)state;
    srand(7);
    for (int round = 0; round < 200; round++) {
        struct ranges s  = { 0 };
        bool have[SPACE] = { false };

        for (int i = 0; i < 300; i++) {
            uint64_t off = (uint64_t)(rand() % SPACE), len = (uint64_t)(rand() % 9);
            bool overlap = false;

            if (off + len > SPACE) {
                len = SPACE - off;
            }
            for (uint64_t b = off; b < off + len; b++) {
                overlap = overlap || have[b];
            }
            assert_int_equal(ranges_claim(&s, off, len), overlap ? RANGES_OVERLAP : RANGES_CLAIMED);
            for (uint64_t b = off; !overlap && b < off + len; b++) {
                have[b] = true;
            }
            assert_runs(&s, have);
        }
        ranges_free(&s);
        assert_int_equal(s.len, 0);
    }
}

static void
test_by_hand(void **state)
{
    struct ranges s = { .max = 2 };

    (void)state;
    assert_int_equal(ranges_claim(&s, 100, 10), RANGES_CLAIMED);
    assert_int_equal(ranges_claim(&s, 100, 10), RANGES_OVERLAP); /* the same chunk again */
    assert_int_equal(ranges_claim(&s, 109, 1), RANGES_OVERLAP);  /* its last byte */
    assert_int_equal(ranges_claim(&s, 95, 6), RANGES_OVERLAP);   /* its first byte */
    assert_int_equal(ranges_claim(&s, 90, 30), RANGES_OVERLAP);  /* around it */
    assert_int_equal(ranges_claim(&s, 105, 0), RANGES_CLAIMED);  /* nothing, even inside */
    assert_int_equal(s.len, 1);
    assert_int_equal(ranges_claim(&s, 0, 10), RANGES_CLAIMED);
    assert_int_equal(s.len, 2);
    /* A third span is past max; one that touches a span does not add one. */
    assert_int_equal(ranges_claim(&s, 50, 10), RANGES_FULL);
    assert_int_equal(ranges_claim(&s, 110, 10), RANGES_CLAIMED);
    assert_int_equal(ranges_claim(&s, 90, 10), RANGES_CLAIMED);
    assert_int_equal(s.len, 2);
    /* Filling the gap makes one span of everything. */
    assert_int_equal(ranges_claim(&s, 10, 80), RANGES_CLAIMED);
    assert_int_equal(s.len, 1);
    assert_int_equal(s.v[0].off, 0);
    assert_int_equal(s.v[0].len, 120);
    ranges_free(&s);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_claims_match_a_byte_map),
        cmocka_unit_test(test_by_hand),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
