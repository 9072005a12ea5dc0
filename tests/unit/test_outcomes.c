/*
 * What a worker remembers of committed ops by idempotency key (server/worker/outcomes.c):
 * bounded, oldest forgotten first, a key remembered again keeps its place.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "outcomes.h"

static void
test_remembers_up_to_cap_and_forgets_the_oldest(void **state)
{
    struct outcomes o;
    char key[32], id[32];

    (void)state;
    assert_true(outcomes_init(&o, 4));
    assert_null(outcomes_find(&o, "k0"));
    assert_null(outcomes_find(&o, ""));
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        snprintf(id, sizeof(id), "op-%d", i);
        assert_true(outcomes_add(&o, key, (uint64_t)i * 100, id));
    }
    assert_int_equal(o.len, 4);
    assert_null(outcomes_find(&o, "k0"));
    assert_null(outcomes_find(&o, "k1"));
    for (int i = 2; i < 6; i++) {
        const struct outcome *found;
        snprintf(key, sizeof(key), "k%d", i);
        snprintf(id, sizeof(id), "op-%d", i);
        assert_non_null(found = outcomes_find(&o, key));
        assert_string_equal(found->op_id, id);
        assert_int_equal(found->hash, (uint64_t)i * 100);
    }
    assert_int_equal(o.by_key.len, 4);
    outcomes_fini(&o);
}

static void
test_a_key_again_takes_the_new_values_in_its_slot(void **state)
{
    struct outcomes o;
    const struct outcome *found;

    (void)state;
    assert_true(outcomes_init(&o, 2));
    assert_true(outcomes_add(&o, "a", 1, "op-1"));
    assert_true(outcomes_add(&o, "b", 2, "op-2"));
    assert_true(outcomes_add(&o, "a", 3, "op-3"));
    assert_int_equal(o.len, 2);
    assert_non_null(found = outcomes_find(&o, "a"));
    assert_string_equal(found->op_id, "op-3");
    assert_int_equal(found->hash, 3);
    /* "a" kept its (oldest) slot: the next key replaces it, not "b". */
    assert_true(outcomes_add(&o, "c", 4, "op-4"));
    assert_null(outcomes_find(&o, "a"));
    assert_non_null(outcomes_find(&o, "b"));
    assert_non_null(outcomes_find(&o, "c"));
    outcomes_fini(&o);
}

static void
test_long_values_are_cut_to_fit(void **state)
{
    char key[DC_IDEMPOTENCY_KEY_MAX + 1], id[200];
    const struct outcome *found;
    struct outcomes o;

    (void)state;
    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    memset(id, 'i', sizeof(id) - 1);
    id[sizeof(id) - 1] = '\0';
    assert_true(outcomes_init(&o, 0)); /* room for one at least */
    assert_true(outcomes_add(&o, key, 9, id));
    assert_non_null(found = outcomes_find(&o, key));
    assert_int_equal(strlen(found->key), DC_IDEMPOTENCY_KEY_MAX);
    assert_int_equal(strlen(found->op_id), OUTCOME_ID_MAX);
    outcomes_fini(&o);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_remembers_up_to_cap_and_forgets_the_oldest),
        cmocka_unit_test(test_a_key_again_takes_the_new_values_in_its_slot),
        cmocka_unit_test(test_long_values_are_cut_to_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
