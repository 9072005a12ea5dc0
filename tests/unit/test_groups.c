/* The coordinator's group table (server/coordinator/groups.c): rendezvous, generations,
 * ALREADY_EXISTS, deadlines naming who never joined, leaves, bounds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "groups.h"

#define N 3

static dc_device_ref ranked[N];
static const char *const names[N] = { "node-a/cuda:0", "node-a/cuda:1", "node-b/cuda:0" };
static int tags[8]; /* addresses used as the callers' tags */

static int
setup(void **state)
{
    (void)state;
    for (size_t i = 0; i < N; i++) {
        dc_status st;
        assert_int_equal(dc_device_ref_parse(names[i], strlen(names[i]), &ranked[i], &st), DC_OK);
    }
    return 0;
}

static dc_code
join(struct group_table *t, uint32_t rank, uint64_t deadline, void *tag, bool *completed,
     struct group_done *done, dc_status *st)
{
    return group_join(t, "00000000000000aa", ranked, N, rank, deadline, tag, completed, done, st);
}

struct seen {
    size_t n;
    struct group_view v;
};

static void
remember(void *arg, const struct group_view *v)
{
    struct seen *s = arg;
    s->n++;
    s->v = *v;
}

static void
test_the_last_join_completes_with_every_tag_in_rank_order(void **state)
{
    struct group_table *t = group_table_new(16, 4);
    struct group_done done;
    struct seen seen = { 0 };
    bool completed;
    dc_status st;

    (void)state;
    /* Ranks arrive out of order; nothing completes until the last. */
    assert_int_equal(join(t, 2, 1000, &tags[2], &completed, &done, &st), DC_OK);
    assert_false(completed);
    assert_int_equal(join(t, 0, 1000, &tags[0], &completed, &done, &st), DC_OK);
    assert_false(completed);
    assert_int_equal(group_parked(t), 2);
    group_list(t, NULL, remember, &seen);
    assert_int_equal(seen.n, 1);
    assert_int_equal(seen.v.joining, 2);
    assert_int_equal(seen.v.generation, 0);
    assert_string_equal(seen.v.devices[2], "node-b/cuda:0");

    assert_int_equal(join(t, 1, 1000, &tags[1], &completed, &done, &st), DC_OK);
    assert_true(completed);
    assert_int_equal(done.generation, 1);
    assert_string_equal(done.group_id, "00000000000000aa");
    assert_int_equal(done.n, N);
    for (size_t r = 0; r < N; r++) {
        assert_ptr_equal(done.tags[r], &tags[r]);
    }
    group_done_fini(&done);
    assert_int_equal(group_parked(t), 0);
    memset(&seen, 0, sizeof(seen));
    group_list(t, "00000000000000aa", remember, &seen);
    assert_int_equal(seen.v.joined, N);
    assert_int_equal(seen.v.joining, 0);

    /* Joining again is the next generation. */
    for (uint32_t r = 0; r < N; r++) {
        assert_int_equal(join(t, r, 1000, &tags[r], &completed, &done, &st), DC_OK);
    }
    assert_true(completed);
    assert_int_equal(done.generation, 2);
    group_done_fini(&done);
    group_table_free(t);
}

static void
test_a_second_parked_join_of_a_rank_is_already_exists(void **state)
{
    struct group_table *t = group_table_new(16, 4);
    struct group_done done;
    bool completed;
    dc_status st;

    (void)state;
    assert_int_equal(join(t, 1, 1000, &tags[0], &completed, &done, &st), DC_OK);
    assert_int_equal(join(t, 1, 1000, &tags[1], &completed, &done, &st), DC_ALREADY_EXISTS);
    assert_non_null(strstr(st.message, "node-a/cuda:1"));
    assert_int_equal(group_parked(t), 1);
    /* Once it gave up (unparked), the rank may join again. */
    assert_true(group_unpark(t, &tags[0]));
    assert_false(group_unpark(t, &tags[0]));
    assert_int_equal(join(t, 1, 1000, &tags[1], &completed, &done, &st), DC_OK);
    group_table_free(t);
}

static void
test_expiry_names_the_devices_that_never_joined(void **state)
{
    struct group_table *t = group_table_new(16, 4);
    struct group_expired out[4];
    struct group_done done;
    bool completed;
    dc_status st;

    (void)state;
    assert_int_equal(join(t, 0, 100, &tags[0], &completed, &done, &st), DC_OK);
    assert_int_equal(join(t, 2, 500, &tags[2], &completed, &done, &st), DC_OK);
    assert_int_equal(group_expire(t, 99, out, 4), 0);
    assert_int_equal(group_expire(t, 100, out, 4), 1);
    assert_ptr_equal(out[0].tag, &tags[0]);
    assert_non_null(strstr(out[0].message, "not joined: node-a/cuda:1"));
    assert_null(strstr(out[0].message, "node-b/cuda:0,"));
    assert_null(strstr(out[0].message, "joined: node-a/cuda:0"));
    assert_int_equal(group_parked(t), 1);
    /* The second expiry names both ranks now missing. */
    assert_int_equal(group_expire(t, 500, out, 4), 1);
    assert_non_null(strstr(out[0].message, "node-a/cuda:0, node-a/cuda:1"));
    assert_int_equal(group_parked(t), 0);
    group_table_free(t);
}

static void
test_parked_joins_and_groups_are_bounded(void **state)
{
    struct group_table *t = group_table_new(2, 1);
    struct group_done done;
    dc_device_ref other[1];
    bool completed;
    dc_status st;

    (void)state;
    assert_int_equal(join(t, 0, 1000, &tags[0], &completed, &done, &st), DC_OK);
    assert_int_equal(join(t, 1, 1000, &tags[1], &completed, &done, &st), DC_OK);
    assert_int_equal(join(t, 2, 1000, &tags[2], &completed, &done, &st), DC_RESOURCE_EXHAUSTED);
    /* One group at most, and this one is in use. */
    other[0] = ranked[0];
    assert_true(group_unpark(t, &tags[1]));
    assert_int_equal(
        group_join(t, "00000000000000bb", other, 1, 0, 1000, &tags[3], &completed, &done, &st),
        DC_RESOURCE_EXHAUSTED);
    assert_true(group_unpark(t, &tags[0]));
    /* Never completed and now empty: gone, so the other group fits. */
    assert_int_equal(group_list(t, NULL, NULL, NULL), 0);
    assert_int_equal(
        group_join(t, "00000000000000bb", other, 1, 0, 1000, &tags[3], &completed, &done, &st),
        DC_OK);
    assert_true(completed);
    group_done_fini(&done);
    group_table_free(t);
}

static void
test_leave_checks_group_generation_and_rank(void **state)
{
    struct group_table *t = group_table_new(16, 4);
    struct group_done done;
    struct seen seen = { 0 };
    bool completed;
    dc_status st;

    (void)state;
    for (uint32_t r = 0; r < N; r++) {
        assert_int_equal(join(t, r, 1000, &tags[r], &completed, &done, &st), DC_OK);
    }
    group_done_fini(&done);
    assert_int_equal(group_leave(t, "ffffffffffffffff", 1, 0, &st), DC_NOT_FOUND);
    assert_int_equal(group_leave(t, "00000000000000aa", 2, 0, &st), DC_FAILED_PRECONDITION);
    assert_int_equal(group_leave(t, "00000000000000aa", 1, 7, &st), DC_INVALID_ARGUMENT);
    assert_int_equal(group_leave(t, "00000000000000aa", 1, 1, &st), DC_OK);
    group_list(t, NULL, remember, &seen);
    assert_int_equal(seen.v.joined, N - 1);
    /* Everybody left: still listed with its generation. */
    assert_int_equal(group_leave(t, "00000000000000aa", 1, 0, &st), DC_OK);
    assert_int_equal(group_leave(t, "00000000000000aa", 1, 2, &st), DC_OK);
    memset(&seen, 0, sizeof(seen));
    group_list(t, NULL, remember, &seen);
    assert_int_equal(seen.n, 1);
    assert_int_equal(seen.v.joined, 0);
    assert_int_equal(seen.v.generation, 1);
    group_table_free(t);
}

static void
test_another_device_list_under_the_same_id_is_refused(void **state)
{
    struct group_table *t = group_table_new(16, 4);
    struct group_done done;
    bool completed;
    dc_status st;

    (void)state;
    assert_int_equal(join(t, 0, 1000, &tags[0], &completed, &done, &st), DC_OK);
    assert_int_equal(
        group_join(t, "00000000000000aa", ranked, 2, 0, 1000, &tags[1], &completed, &done, &st),
        DC_FAILED_PRECONDITION);
    assert_int_equal(
        group_join(t, "00000000000000aa", ranked, N, N, 1000, &tags[1], &completed, &done, &st),
        DC_INVALID_ARGUMENT);
    group_table_free(t);
}

static bool
is_tag2(void *tag, void *arg)
{
    (void)arg;
    return tag == &tags[2];
}

static void
test_take_if_hands_back_only_the_matching_joins(void **state)
{
    struct group_table *t = group_table_new(16, 4);
    struct group_done done;
    void *out[4];
    bool completed;
    dc_status st;

    (void)state;
    assert_int_equal(join(t, 0, 1000, &tags[0], &completed, &done, &st), DC_OK);
    assert_int_equal(join(t, 2, 1000, &tags[2], &completed, &done, &st), DC_OK);
    assert_int_equal(group_take_if(t, is_tag2, NULL, out, 4), 1);
    assert_ptr_equal(out[0], &tags[2]);
    assert_int_equal(group_parked(t), 1);
    /* Its rank may join again; the other is still parked. */
    assert_int_equal(join(t, 2, 1000, &tags[3], &completed, &done, &st), DC_OK);
    assert_int_equal(join(t, 0, 1000, &tags[4], &completed, &done, &st), DC_ALREADY_EXISTS);
    group_table_free(t);
}

static void
test_take_all_hands_back_every_parked_join(void **state)
{
    struct group_table *t = group_table_new(16, 4);
    struct group_done done;
    void *out[4];
    bool completed;
    dc_status st;

    (void)state;
    assert_int_equal(join(t, 0, 1000, &tags[0], &completed, &done, &st), DC_OK);
    assert_int_equal(join(t, 2, 1000, &tags[2], &completed, &done, &st), DC_OK);
    assert_int_equal(group_take_all(t, out, 1), 1);
    assert_int_equal(group_take_all(t, out + 1, 3), 1);
    assert_true((out[0] == &tags[0] && out[1] == &tags[2]) ||
                (out[0] == &tags[2] && out[1] == &tags[0]));
    assert_int_equal(group_parked(t), 0);
    group_table_free(t);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_last_join_completes_with_every_tag_in_rank_order),
        cmocka_unit_test(test_a_second_parked_join_of_a_rank_is_already_exists),
        cmocka_unit_test(test_expiry_names_the_devices_that_never_joined),
        cmocka_unit_test(test_parked_joins_and_groups_are_bounded),
        cmocka_unit_test(test_leave_checks_group_generation_and_rank),
        cmocka_unit_test(test_another_device_list_under_the_same_id_is_refused),
        cmocka_unit_test(test_take_all_hands_back_every_parked_join),
        cmocka_unit_test(test_take_if_hands_back_only_the_matching_joins),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
