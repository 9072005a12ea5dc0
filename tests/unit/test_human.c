/* Text for people (common/human.c): durations it reads, sizes and ages it
 * prints, and the nearest word it suggests for a typo. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "human.h"

static void
test_parse_duration(void **state)
{
    static const struct {
        const char *text;
        uint32_t ms;
    } good[] = {
        { "1ms", 1 },
        { "500ms", 500 },
        { "10s", 10000 },
        { "2m", 120000 },
        { "1h", 3600000 },
        { "4294967295ms", UINT32_MAX },
        { "4294967s", 4294967000u },
    };
    static const char *const bad[] = {
        "",    "5",    "0s",           "0ms",      "-1s",    "+1s",   " 1s",
        "1s ", "1.5s", "1 s",          "1sec",     "1d",     "ms",    "s",
        "1S",  "1ms2", "4294967296ms", "4294968s", "71583m", "1194h", "99999999999999999999999s",
    };
    uint32_t ms;

    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        ms = 0;
        if (!human_parse_duration(good[i].text, &ms)) {
            fail_msg("'%s' refused", good[i].text);
        }
        assert_int_equal(ms, good[i].ms);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (human_parse_duration(bad[i], &ms)) {
            fail_msg("'%s' accepted as %u ms", bad[i], ms);
        }
    }
}

static void
assert_bytes(uint64_t bytes, const char *want)
{
    char buf[32];

    human_bytes(buf, sizeof(buf), bytes);
    assert_string_equal(buf, want);
}

static void
test_bytes(void **state)
{
    (void)state;
    assert_bytes(0, "0");
    assert_bytes(1023, "1023");
    assert_bytes(1024, "1Ki");
    assert_bytes(1536, "1.5Ki");
    assert_bytes((uint64_t)80 << 30, "80Gi");
    assert_bytes((uint64_t)3 << 29, "1.5Gi");
    assert_bytes((uint64_t)640 << 20, "640Mi");
    assert_bytes((uint64_t)1 << 40, "1Ti");
    /* Just under a unit rounds up into it, not to "1024.0Mi". */
    assert_bytes(((uint64_t)1 << 30) - 1, "1.0Gi");
    assert_bytes(((uint64_t)1 << 20) + 1, "1.0Mi");
    assert_bytes(UINT64_MAX, "16.0Ei");
}

static void
assert_age(uint64_t ms, const char *want)
{
    char buf[32];

    human_age(buf, sizeof(buf), ms);
    assert_string_equal(buf, want);
}

static void
assert_elapsed(uint64_t us, const char *want)
{
    char buf[32];

    human_elapsed_us(buf, sizeof(buf), us);
    assert_string_equal(buf, want);
}

static void
test_age_and_elapsed(void **state)
{
    (void)state;
    assert_age(0, "0ms");
    assert_age(999, "999ms");
    assert_age(1000, "1s");
    assert_age(12345, "12s");
    assert_age(119999, "119s");
    assert_age(120000, "2m");
    assert_age(3 * 60000 + 59000, "3m");
    assert_age(2 * 3600000, "2h");
    assert_age(47 * 3600000ull + 3599999, "47h");
    assert_age(48 * 3600000ull, "2d");
    assert_age(UINT64_MAX, "213503982334d");
    assert_elapsed(0, "0us");
    assert_elapsed(999, "999us");
    assert_elapsed(1234, "1.2ms");
    assert_elapsed(4560000, "4.56s");
    assert_elapsed(180000000, "3m");
}

static void
test_edit_distance(void **state)
{
    char long_word[100];

    (void)state;
    assert_int_equal(human_edit_distance("", ""), 0);
    assert_int_equal(human_edit_distance("status", "status"), 0);
    assert_int_equal(human_edit_distance("stauts", "status"), 1); /* a swap */
    assert_int_equal(human_edit_distance("statu", "status"), 1);
    assert_int_equal(human_edit_distance("sttus", "status"), 1);
    assert_int_equal(human_edit_distance("xtatus", "status"), 1);
    assert_int_equal(human_edit_distance("kitten", "sitting"), 3);
    assert_int_equal(human_edit_distance("", "abc"), 3);
    memset(long_word, 'a', sizeof(long_word) - 1);
    long_word[sizeof(long_word) - 1] = '\0';
    assert_true(human_edit_distance(long_word, "a") == SIZE_MAX);
}

static void
test_nearest(void **state)
{
    static const char *const commands[] = { "status", "workers", "devices", "tensor",
                                            "plan",   "submit",  "ops",     "health" };
    static const char *const subs[]     = { "list", "show", "cordon", "uncordon", "drain" };
    const size_t nc                     = sizeof(commands) / sizeof(commands[0]);
    const size_t ns                     = sizeof(subs) / sizeof(subs[0]);

    (void)state;
    assert_string_equal(human_nearest("stauts", commands, nc), "status");
    assert_string_equal(human_nearest("wrokers", commands, nc), "workers");
    assert_string_equal(human_nearest("devics", commands, nc), "devices");
    assert_string_equal(human_nearest("subimt", commands, nc), "submit");
    assert_string_equal(human_nearest("op", commands, nc), "ops");
    assert_string_equal(human_nearest("lst", subs, ns), "list");
    assert_string_equal(human_nearest("cordn", subs, ns), "cordon");
    /* A prefix that names one candidate. */
    assert_string_equal(human_nearest("hea", commands, nc), "health");
    assert_string_equal(human_nearest("unc", subs, ns), "uncordon");
    /* Nothing near. */
    assert_null(human_nearest("frobnicate", commands, nc));
    assert_null(human_nearest("x", commands, nc));
    assert_null(human_nearest("", commands, nc));
    /* Two candidates start with "s" (status, submit): no guess. */
    assert_null(human_nearest("s", commands, nc));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_duration),  cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_age_and_elapsed), cmocka_unit_test(test_edit_distance),
        cmocka_unit_test(test_nearest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
