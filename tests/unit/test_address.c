#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "address.h"
#include "log.h"

static void
test_addresses_accepted(void **state)
{
    static const char *const good[] = {
        "tcp://127.0.0.1:7400", "tcp://node-a:0",    "tls+tcp://coord.example:443",
        "tcp://[::1]:7400",     "tcp4://10.0.0.1:1", "tcp6://[fe80::1]:65535",
        "ipc:///tmp/dc.sock",   "inproc://devcoord",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        if (address_problem(good[i]) != NULL) {
            fail_msg("%s refused: %s", good[i], address_problem(good[i]));
        }
    }
}

static void
test_addresses_refused(void **state)
{
    char long_addr[ADDRESS_MAX + 2];
    (void)state;
    assert_string_equal(address_problem("tcp://127.0.0.1:99999"),
                        "expected HOST:PORT with a port from 0 to 65535");
    assert_non_null(address_problem("tcp://127.0.0.1"));
    assert_non_null(address_problem("tcp://127.0.0.1:"));
    assert_non_null(address_problem("tcp://127.0.0.1:80x"));
    assert_non_null(address_problem("tcp://127.0.0.1:-1"));
    assert_string_equal(address_problem("tcp://"), "nothing after the scheme");
    assert_non_null(address_problem("ipc://"));
    assert_non_null(address_problem("0.0.0.0:7400"));
    assert_non_null(address_problem("http://a:1"));
    assert_non_null(address_problem(""));
    assert_string_equal(address_problem("tcp://a:1\nforged line"), "control character in address");
    assert_non_null(address_problem("tcp://a\x1b[31m:1"));
    memset(long_addr, 'a', sizeof(long_addr) - 1);
    memcpy(long_addr, "ipc://", 6);
    long_addr[sizeof(long_addr) - 1] = '\0';
    assert_string_equal(address_problem(long_addr), "too long (at most 255 bytes)");
    long_addr[ADDRESS_MAX] = '\0';
    assert_null(address_problem(long_addr));
}

static void
test_ports(void **state)
{
    (void)state;
    assert_true(address_port_valid("0"));
    assert_true(address_port_valid("65535"));
    assert_false(address_port_valid("65536"));
    assert_false(address_port_valid("0000065535"));
    assert_false(address_port_valid(""));
    assert_false(address_port_valid("7400 "));
}

/* The log's names are the ones configs use, and the only table of them. */
static void
test_log_names(void **state)
{
    (void)state;
    for (int l = LOG_DEBUG; l < LOG_LEVEL_COUNT; l++) {
        assert_int_equal(log_level_from_name(log_level_name((enum log_level)l)), l);
    }
    assert_string_equal(log_level_name(LOG_WARN), "warn");
    assert_int_equal(log_level_from_name("warning"), -1);
    assert_int_equal(log_format_from_name("json"), LOG_FORMAT_JSON);
    assert_int_equal(log_format_from_name("xml"), -1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_addresses_accepted),
        cmocka_unit_test(test_addresses_refused),
        cmocka_unit_test(test_ports),
        cmocka_unit_test(test_log_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
