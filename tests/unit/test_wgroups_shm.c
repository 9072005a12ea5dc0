/* The worker's checks on shared memory regions (issue 13): names and ranges. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "groups.h"

static void
test_names(void **state)
{
    (void)state;
    assert_true(wgroups_shm_name_ok("/devcoord-0123456789abcdef0123456789abcdef"));
    assert_false(wgroups_shm_name_ok(NULL));
    assert_false(wgroups_shm_name_ok(""));
    assert_false(wgroups_shm_name_ok("/devcoord-"));
    /* One digit short or long, upper case, other characters, another prefix. */
    assert_false(wgroups_shm_name_ok("/devcoord-0123456789abcdef0123456789abcde"));
    assert_false(wgroups_shm_name_ok("/devcoord-0123456789abcdef0123456789abcdef0"));
    assert_false(wgroups_shm_name_ok("/devcoord-0123456789ABCDEF0123456789abcdef"));
    assert_false(wgroups_shm_name_ok("/devcoord-0123456789abcdef0123456789abcd/."));
    assert_false(wgroups_shm_name_ok("/devcoord-../../../etc/passwd000000000000000"));
    assert_false(wgroups_shm_name_ok("devcoord-0123456789abcdef0123456789abcdef0"));
    assert_false(wgroups_shm_name_ok("/dev/shm/devcoord-0123456789abcdef0123456789ab"));
}

static void
test_ranges(void **state)
{
    (void)state;
    assert_true(wgroups_shm_range_ok(0, 64, 64));
    assert_true(wgroups_shm_range_ok(48, 16, 64));
    assert_true(wgroups_shm_range_ok(64, 0, 64));
    assert_false(wgroups_shm_range_ok(49, 16, 64));
    assert_false(wgroups_shm_range_ok(0, 65, 64));
    assert_false(wgroups_shm_range_ok(65, 0, 64));
    /* No wrap-around. */
    assert_false(wgroups_shm_range_ok(UINT64_MAX - 7, 16, 64));
    assert_false(wgroups_shm_range_ok(8, UINT64_MAX - 4, 64));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
