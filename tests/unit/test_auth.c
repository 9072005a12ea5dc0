#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "auth.h"
#include "devcoord/v1/devcoord.pb-c.h"

static const char tokens[] = "# example tokens\n"
                             "w-secret: worker\n"
                             "t-secret: trainer\n"
                             "o-secret: operator\n"
                             "t2-secret: trainer\n";

static struct auth *
load(const char *text, dc_status *st, dc_code expect)
{
    struct auth *a = NULL;

    assert_int_equal(auth_parse("tokens.yaml", text, strlen(text), &a, st), expect);
    return a;
}

static void
test_roles(void **state)
{
    dc_status st;
    struct auth *a = load(tokens, &st, DC_OK);

    (void)state;
    assert_int_equal(auth_role_of(a, "w-secret"), ROLE_WORKER);
    assert_int_equal(auth_role_of(a, "t-secret"), ROLE_TRAINER);
    assert_int_equal(auth_role_of(a, "t2-secret"), ROLE_TRAINER);
    assert_int_equal(auth_role_of(a, "o-secret"), ROLE_OPERATOR);
    /* Prefixes, extensions and case changes are other tokens. */
    assert_int_equal(auth_role_of(a, "w-secre"), ROLE_NONE);
    assert_int_equal(auth_role_of(a, "w-secret2"), ROLE_NONE);
    assert_int_equal(auth_role_of(a, "W-secret"), ROLE_NONE);
    assert_int_equal(auth_role_of(a, ""), ROLE_NONE);
    assert_string_equal(auth_token_with(a, ROLE_WORKER), "w-secret");
    assert_string_equal(auth_token_with(a, ROLE_TRAINER), "t-secret");
    auth_free(a);
}

static void
test_bad_files(void **state)
{
    dc_status st;

    (void)state;
    load("w: wizard\n", &st, DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "tokens.yaml:1:4: unknown role"));
    load("a: worker\na: trainer\n", &st, DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "tokens.yaml:2:1: token listed twice"));
    load("- a\n- b\n", &st, DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "tokens.yaml:1:1"));
    load("a: {b: worker}\n", &st, DC_INVALID_ARGUMENT);
    load("\"has space\": worker\n", &st, DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "printable characters"));
    load("# nothing\n", &st, DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "no tokens"));
    load("a: [worker\n", &st, DC_INVALID_ARGUMENT);
}

static void
test_rules(void **state)
{
    static const struct auth_rule rules[] = {
        { "SubmitOp", ROLE_TRAINER },
        { "CordonWorker", ROLE_OPERATOR },
        { "GetClusterStatus", ROLE_ANY },
    };
    const ProtobufCServiceDescriptor *svc = &devcoord__v1__coordinator__descriptor;
    const ProtobufCMethodDescriptor *submit =
        protobuf_c_service_descriptor_get_method_by_name(svc, "SubmitOp");
    const ProtobufCMethodDescriptor *cordon =
        protobuf_c_service_descriptor_get_method_by_name(svc, "CordonWorker");
    const ProtobufCMethodDescriptor *status =
        protobuf_c_service_descriptor_get_method_by_name(svc, "GetClusterStatus");
    const ProtobufCMethodDescriptor *reg =
        protobuf_c_service_descriptor_get_method_by_name(svc, "RegisterWorker");
    dc_status st;
    struct auth *a = load(tokens, &st, DC_OK);

    (void)state;
    assert_int_equal(auth_check(a, rules, 3, submit, "t-secret", &st), DC_OK);
    assert_int_equal(auth_check(a, rules, 3, submit, "o-secret", &st), DC_PERMISSION_DENIED);
    assert_string_equal(st.message, "SubmitOp needs role trainer; this token has role operator");
    assert_int_equal(auth_check(a, rules, 3, submit, "", &st), DC_UNAUTHENTICATED);
    assert_int_equal(auth_check(a, rules, 3, submit, "nope", &st), DC_UNAUTHENTICATED);
    assert_string_equal(st.message, "unknown token");
    assert_int_equal(auth_check(a, rules, 3, cordon, "o-secret", &st), DC_OK);
    assert_int_equal(auth_check(a, rules, 3, cordon, "w-secret", &st), DC_PERMISSION_DENIED);
    for (const char *t = "w-secret"; t != NULL;
         t             = strcmp(t, "w-secret") == 0 ? "o-secret" : NULL) {
        assert_int_equal(auth_check(a, rules, 3, status, t, &st), DC_OK);
    }
    /* A method the rules do not name is refused to everyone. */
    assert_int_equal(auth_check(a, rules, 3, reg, "w-secret", &st), DC_PERMISSION_DENIED);
    /* The token never appears in a message. */
    assert_null(strstr(st.message, "secret"));
    auth_free(a);
}

static void
test_token_file(void **state)
{
    char path[] = "/tmp/devcoord-token-XXXXXX";
    int fd      = mkstemp(path);
    char *tok   = NULL;
    dc_status st;

    (void)state;
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "  abc123  \nsecond line\n", 23), 23);
    close(fd);
    assert_int_equal(auth_read_token_file(path, &tok, &st), DC_OK);
    assert_string_equal(tok, "abc123");
    free(tok);
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "\n", 1), 1);
    close(fd);
    assert_int_equal(auth_read_token_file(path, &tok, &st), DC_INVALID_ARGUMENT);
    unlink(path);
    assert_int_equal(auth_read_token_file(path, &tok, &st), DC_NOT_FOUND);
}

static void
test_url_host(void **state)
{
    char h[64];

    (void)state;
    auth_url_host("tls+tcp://node-a:7500", h, sizeof(h));
    assert_string_equal(h, "node-a");
    auth_url_host("tls+tcp://[::1]:7500", h, sizeof(h));
    assert_string_equal(h, "::1");
    auth_url_host("tls+tcp://127.0.0.1:1", h, sizeof(h));
    assert_string_equal(h, "127.0.0.1");
}

static void
test_tls_needs_files(void **state)
{
    struct config_tls none = { 0 };
    nng_tls_config *cfg;
    dc_status st;

    (void)state;
    assert_int_equal(auth_tls_server(&none, &cfg, &st), DC_INVALID_ARGUMENT);
    assert_int_equal(auth_tls_client(NULL, NULL, NULL, "x", &cfg, &st), DC_INVALID_ARGUMENT);
    assert_int_equal(auth_tls_client("/nonexistent.pem", NULL, NULL, "x", &cfg, &st), DC_NOT_FOUND);
    assert_int_equal(auth_tls_client("/etc/hostname", "c.pem", NULL, "x", &cfg, &st),
                     DC_INVALID_ARGUMENT);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roles),    cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_rules),    cmocka_unit_test(test_token_file),
        cmocka_unit_test(test_url_host), cmocka_unit_test(test_tls_needs_files),
    };
    int rv = cmocka_run_group_tests(tests, NULL, NULL);
    nng_fini();
    return rv;
}
