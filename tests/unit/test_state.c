/* Operator intent on disk (server/coordinator/state.c) with a real registry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "registry.h"
#include "state.h"

static char dir[] = "/tmp/devcoord-state-XXXXXX";

static void
collect(void *arg, const char *name, enum registry_intent intent)
{
    char *out = arg;
    size_t n  = strlen(out);
    snprintf(out + n, 256 - n, "%s=%d;", name, (int)intent);
}

static void
write_file(const char *text)
{
    char path[256];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE);
    assert_non_null(f = fopen(path, "w"));
    fputs(text, f);
    fclose(f);
}

static struct registry *
fresh(void)
{
    struct registry_opts o = { .heartbeat_interval_ms = 1000, .dead_after_ms = 5000 };
    return registry_new(&o);
}

static void
test_round_trip(void **state)
{
    struct registry *a = fresh(), *b = fresh();
    char seen[256] = "";
    size_t n;
    dc_status st;

    (void)state;
    assert_true(registry_restore_intent(a, "node-a", INTENT_CORDON));
    assert_true(registry_restore_intent(a, "node-b", INTENT_DRAIN));
    assert_int_equal(state_save(dir, a, &st), DC_OK);
    assert_int_equal(state_load(dir, b, &n, &st), DC_OK);
    assert_int_equal(n, 2);
    registry_each_intent(b, collect, seen);
    assert_non_null(strstr(seen, "node-a=1;"));
    assert_non_null(strstr(seen, "node-b=2;"));
    registry_free(a);
    registry_free(b);
}

static void
test_missing_is_fine(void **state)
{
    struct registry *r = fresh();
    char path[256];
    size_t n = 9;
    dc_status st;

    (void)state;
    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE);
    unlink(path);
    assert_int_equal(state_load(dir, r, &n, &st), DC_OK);
    assert_int_equal(n, 0);
    registry_free(r);
}

static void
test_corrupt_is_reported_and_ignored(void **state)
{
    static const char *bad[] = {
        "devcoord-intent 1\ncordon node-a\n",           /* truncated: no end line */
        "devcoord-intent 1\ncordon node-a\nend 2\n",    /* count mismatch */
        "devcoord-intent 1\ncordon node-a\nend 1",      /* last line cut */
        "something else\nend 0\n",                      /* not ours */
        "devcoord-intent 1\nexplode node-a\nend 1\n",   /* unknown intent */
        "devcoord-intent 1\ncordon -bad name\nend 1\n", /* bad worker name */
        "",                                             /* empty */
        "devcoord-intent 1\nend 0\ncordon node-a\n",    /* data after the end */
    };
    char seen[256];
    size_t n;
    dc_status st;

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct registry *r = fresh();
        write_file(bad[i]);
        if (state_load(dir, r, &n, &st) != DC_DATA_LOSS) {
            fail_msg("case %zu accepted", i);
        }
        seen[0] = '\0';
        registry_each_intent(r, collect, seen);
        assert_string_equal(seen, ""); /* nothing half-applied */
        registry_free(r);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_missing_is_fine),
        cmocka_unit_test(test_corrupt_is_reported_and_ignored),
    };
    int rv;

    if (mkdtemp(dir) == NULL) {
        return 1;
    }
    rv = cmocka_run_group_tests(tests, NULL, NULL);
    {
        char path[256];
        snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE);
        unlink(path);
        rmdir(dir);
    }
    return rv;
}
