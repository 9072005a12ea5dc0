#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "status.h"

static void
test_names_match_grpc(void **state)
{
    (void)state;
    assert_string_equal(dc_status_name(DC_OK), "OK");
    assert_string_equal(dc_status_name(DC_INVALID_ARGUMENT), "INVALID_ARGUMENT");
    assert_string_equal(dc_status_name(DC_FAILED_PRECONDITION), "FAILED_PRECONDITION");
    assert_string_equal(dc_status_name(DC_UNAUTHENTICATED), "UNAUTHENTICATED");
    assert_string_equal(dc_status_name((dc_code)99), "UNKNOWN");
    assert_int_equal(DC_UNAVAILABLE, 14);
    assert_int_equal(DC_DEADLINE_EXCEEDED, 4);
    for (int c = 0; c <= DC_UNAUTHENTICATED; c++) {
        assert_int_equal(dc_status_from_name(dc_status_name((dc_code)c)), c);
    }
    assert_int_equal(dc_status_from_name("NOPE"), -1);
}

static void
test_set_and_prefix(void **state)
{
    dc_status st;
    char big[3000];

    (void)state;
    status_clear(&st);
    assert_int_equal(st.code, DC_OK);
    assert_int_equal(st.device_index, -1);
    assert_int_equal(status_set_index(&st, DC_NOT_FOUND, 3, "unknown device: %s", "x"),
                     DC_NOT_FOUND);
    assert_int_equal(st.device_index, 3);
    assert_string_equal(st.message, "unknown device: x");
    status_prefix(&st, "submit");
    assert_string_equal(st.message, "submit: unknown device: x");
    assert_int_equal(st.code, DC_NOT_FOUND);

    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    status_set(&st, DC_INTERNAL, "%s", big);
    assert_int_equal(strlen(st.message), DC_STATUS_MESSAGE_MAX - 1);
    assert_int_equal(st.device_index, -1);
    assert_int_equal(status_set(NULL, DC_ABORTED, "no status object"), DC_ABORTED);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_match_grpc),
        cmocka_unit_test(test_set_and_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
