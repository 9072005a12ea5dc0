/* Log lines (common/log.c): whatever text a line carries stays on that one line, in the
 * text format as in JSON, so a peer's name or label cannot forge another line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

/* Runs log_msg(LOG_WARN, "%s", text) with stderr sent to a file; out gets what it wrote. */
static void
capture(enum log_format format, const char *text, char *out, size_t cap)
{
    char path[] = "/tmp/devcoord-log-XXXXXX";
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    FILE *f;
    size_t n;

    assert_true(fd >= 0 && saved >= 0);
    fflush(stderr);
    assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    log_configure(LOG_INFO, format, "test");
    log_msg(LOG_WARN, "worker '%s' refused", text);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fd);
    assert_non_null(f = fopen(path, "r"));
    n      = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
    unlink(path);
}

static size_t
count_lines(const char *s)
{
    size_t n = 0;

    for (; *s != '\0'; s++) {
        n += *s == '\n';
    }
    return n;
}

static void
test_text_lines_cannot_be_forged(void **state)
{
    char out[4096];

    (void)state;
    capture(LOG_FORMAT_TEXT,
            "node-z\n2026-01-01T00:00:00.000Z error coordinator: forged\r\x1b[2K\x7f\ttab", out,
            sizeof(out));
    assert_int_equal(count_lines(out), 1);
    assert_non_null(strstr(out, " warn  test: worker 'node-z\\n2026-01-01T00:00:00.000Z error "
                                "coordinator: forged\\r\\x1b[2K\\x7f\\ttab' refused\n"));
}

static void
test_json_lines_cannot_be_forged(void **state)
{
    char out[4096];

    (void)state;
    capture(LOG_FORMAT_JSON, "a\nb\"c\\d\x1b", out, sizeof(out));
    assert_int_equal(count_lines(out), 1);
    assert_non_null(strstr(out, "\"msg\":\"worker 'a\\nb\\\"c\\\\d\\u001b' refused\"}\n"));
}

static void
test_plain_text_is_unchanged(void **state)
{
    char out[4096];

    (void)state;
    capture(LOG_FORMAT_TEXT, "node-a at tcp://10.0.0.1:7500 (rack=r1, zone=\xc3\xa9t\xc3\xa9)", out,
            sizeof(out));
    assert_non_null(strstr(out, "worker 'node-a at tcp://10.0.0.1:7500 (rack=r1, "
                                "zone=\xc3\xa9t\xc3\xa9)' refused\n"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_lines_cannot_be_forged),
        cmocka_unit_test(test_json_lines_cannot_be_forged),
        cmocka_unit_test(test_plain_text_is_unchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
