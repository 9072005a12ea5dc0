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
#include "rpc.h"

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
    assert_non_null(strstr(st.message, "tokens.yaml:1:3: expected an entry"));
    load("a: {b: worker}\n", &st, DC_INVALID_ARGUMENT);
    load("\"has space\": worker\n", &st, DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "printable characters"));
    load("# nothing\n", &st, DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "no tokens"));
    load("a: [worker\n", &st, DC_INVALID_ARGUMENT);
}

/* The list form: worker tokens name the workers they may register. */
static const char entries[] = "# example tokens\n"
                              "- {token: coord-secret, role: worker, names: []}\n"
                              "- token: wa-secret\n"
                              "  role: worker\n"
                              "  names: [wa]\n"
                              "- {token: wbc-secret, role: worker, names: [wc, wb]}\n"
                              "- {token: any-secret, role: worker}\n"
                              "- {role: trainer, token: t-secret}\n";

static void
test_worker_names(void **state)
{
    dc_status st;
    struct auth *a = load(entries, &st, DC_OK);

    (void)state;
    assert_int_equal(auth_role_of(a, "wa-secret"), ROLE_WORKER);
    assert_int_equal(auth_role_of(a, "t-secret"), ROLE_TRAINER);
    assert_true(auth_worker_may_be(a, "wa-secret", "wa"));
    assert_false(auth_worker_may_be(a, "wa-secret", "wb"));
    assert_false(auth_worker_may_be(a, "wa-secret", "w"));
    assert_false(auth_worker_may_be(a, "wa-secret", "wa2"));
    assert_true(auth_worker_may_be(a, "wbc-secret", "wb"));
    assert_true(auth_worker_may_be(a, "wbc-secret", "wc"));
    assert_false(auth_worker_may_be(a, "wbc-secret", "wa"));
    /* names: [] may register nobody (a token the coordinator only calls workers with);
     * no names at all, anybody. */
    assert_false(auth_worker_may_be(a, "coord-secret", "wa"));
    assert_true(auth_worker_may_be(a, "any-secret", "wa"));
    assert_true(auth_worker_may_be(a, "any-secret", "zz"));
    /* Other roles and unknown tokens may be no worker. */
    assert_false(auth_worker_may_be(a, "t-secret", "wa"));
    assert_false(auth_worker_may_be(a, "nope", "wa"));
    assert_false(auth_worker_may_be(a, "", "wa"));
    /* The first worker token of the file, as before. */
    assert_string_equal(auth_token_with(a, ROLE_WORKER), "coord-secret");
    auth_free(a);

    /* The `token: role` form: a worker token may be any worker. */
    a = load(tokens, &st, DC_OK);
    assert_true(auth_worker_may_be(a, "w-secret", "wa"));
    assert_true(auth_worker_may_be(a, "w-secret", "anyone"));
    assert_false(auth_worker_may_be(a, "t-secret", "wa"));
    auth_free(a);
}

/* Errors in the list form, each at its file:line:column; none quotes the file. */
static void
test_bad_entries(void **state)
{
    static const struct {
        const char *text;
        const char *says;
    } cases[] = {
        { "- {token: a, role: worker, name: [x]}\n",
          "tokens.yaml:1:28: unknown key (expected token, role or names)" },
        { "- {secret-token-here: worker}\n", "tokens.yaml:1:4: unknown key" },
        { "- {token: a, role: trainer, names: [x]}\n",
          "tokens.yaml:1:29: names are for worker tokens only" },
        { "- {token: a}\n", "tokens.yaml:1:3: an entry needs a token and a role" },
        { "- {role: worker}\n", "tokens.yaml:1:3: an entry needs a token and a role" },
        { "- {token: a, role: worker, names: x}\n",
          "tokens.yaml:1:35: names is a list of worker names" },
        { "- {token: a, role: worker, names: [ok, -bad]}\n",
          "tokens.yaml:1:40: invalid worker name" },
        { "- {token: a, role: worker, names: [[x]]}\n", "tokens.yaml:1:36: invalid worker name" },
        { "- {token: a, role: worker, role: trainer}\n",
          "tokens.yaml:1:28: role given twice in one entry" },
        { "- {token: a, role: wizard}\n", "tokens.yaml:1:20: unknown role" },
        { "- {token: \"a b\", role: worker}\n", "tokens.yaml:1:11: a token is 1 to 512" },
        { "- {token: [a], role: worker}\n", "tokens.yaml:1:11: a token is 1 to 512" },
        { "- {token: a, role: worker}\n- {token: b, role: worker}\n- {token: a, role: trainer}\n",
          "tokens.yaml:3:11: token listed twice" },
        { "- {token: &x a, role: worker}\n- {token: *x, role: trainer}\n",
          "tokens.yaml:2:11: aliases are not allowed" },
        { "- {token: a, role: worker}\n---\n- {token: b, role: worker}\n",
          "tokens.yaml:3:1: a tokens file holds one document" },
        { "- [a, worker]\n", "tokens.yaml:1:3: expected an entry" },
        { "just-a-token\n", "tokens.yaml:1:1: expected 'token: role' pairs or a list" },
        { "[]\n", "tokens.yaml: no tokens" },
    };
    dc_status st;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct auth *a = NULL;
        assert_int_equal(auth_parse("tokens.yaml", cases[i].text, strlen(cases[i].text), &a, &st),
                         DC_INVALID_ARGUMENT);
        assert_null(a);
        if (strstr(st.message, cases[i].says) == NULL) {
            fail_msg("case %zu: expected \"%s\" in \"%s\"", i, cases[i].says, st.message);
        }
    }
    /* The key that looked like a token is not in the message. */
    load("- {secret-token-here: worker}\n", &st, DC_INVALID_ARGUMENT);
    assert_null(strstr(st.message, "secret-token-here"));
}

/* Loading is about linear in the number of tokens (it was quadratic: 20,000 tokens took
 * seconds); lookups find the first and the last and miss the rest. */
static void
test_many_tokens(void **state)
{
    enum { N = 20000, TOKEN_LEN = 64 };
    size_t cap = (size_t)N * (TOKEN_LEN + 16);
    char *text = malloc(cap), *p = text;
    char first[TOKEN_LEN + 1], last[TOKEN_LEN + 1], near[TOKEN_LEN + 1];
    dc_status st;
    struct auth *a;

    (void)state;
    assert_non_null(text);
    for (int i = 0; i < N; i++) {
        char tok[TOKEN_LEN + 1];
        /* Tokens that share long prefixes, as generated tokens with a common tag do. */
        snprintf(tok, sizeof(tok), "dc-%061d", i * 7919);
        p += snprintf(p, cap - (size_t)(p - text), "%s: %s\n", tok,
                      i % 3 == 0   ? "worker"
                      : i % 3 == 1 ? "trainer"
                                   : "operator");
        if (i == 0) {
            memcpy(first, tok, sizeof(first));
        }
        if (i == N - 1) {
            memcpy(last, tok, sizeof(last));
        }
    }
    a = load(text, &st, DC_OK);
    assert_int_equal(auth_role_of(a, first), ROLE_WORKER);
    assert_int_equal(auth_role_of(a, last), (N - 1) % 3 == 0   ? ROLE_WORKER
                                            : (N - 1) % 3 == 1 ? ROLE_TRAINER
                                                               : ROLE_OPERATOR);
    memcpy(near, last, sizeof(near));
    near[TOKEN_LEN - 1] = near[TOKEN_LEN - 1] == '9' ? '8' : '9';
    assert_int_equal(auth_role_of(a, near), ROLE_NONE);
    near[TOKEN_LEN - 1] = '\0';
    assert_int_equal(auth_role_of(a, near), ROLE_NONE);
    assert_int_equal(auth_role_of(a, "dc-missing"), ROLE_NONE);
    assert_true(auth_worker_may_be(a, first, "any-name"));
    assert_string_equal(auth_token_with(a, ROLE_WORKER), first);
    auth_free(a);

    /* A repeat at the very end is still found, at its own line. */
    p += snprintf(p, cap - (size_t)(p - text), "%s: trainer\n", first);
    load(text, &st, DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "tokens.yaml:20001:1: token listed twice"));
    free(text);
}

static void
test_equal_and_random(void **state)
{
    uint8_t x[32] = { 0 }, y[32] = { 0 };
    dc_status st;

    (void)state;
    assert_true(auth_equal("abc", 3, "abc", 3));
    assert_false(auth_equal("abc", 3, "abd", 3));
    assert_false(auth_equal("abc", 3, "abc\0", 4));
    assert_false(auth_equal("abc", 3, NULL, 0));
    assert_true(auth_equal(NULL, 0, NULL, 0));
    assert_int_equal(auth_random_bytes(x, sizeof(x), &st), DC_OK);
    assert_int_equal(auth_random_bytes(y, sizeof(y), &st), DC_OK);
    assert_memory_not_equal(x, y, sizeof(x));
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

/* A reload swaps the table under a reader: the reader's table stays whole until it lets go,
 * new readers get the new table. (ASan and valgrind see a use after free if not.) */
static void
test_current_swap_under_a_reader(void **state)
{
    static const char fresh_text[] = "n-secret: trainer\n";
    struct auth_current *cur;
    struct auth *held, *now;
    dc_status st;

    (void)state;
    assert_int_equal(auth_current_new(load(tokens, &st, DC_OK), &cur, &st), DC_OK);
    held = auth_current_get(cur);
    assert_int_equal(auth_role_of(held, "t-secret"), ROLE_TRAINER);
    auth_current_set(cur, load(fresh_text, &st, DC_OK));
    /* The old table, still held, still answers as before. */
    assert_int_equal(auth_role_of(held, "t-secret"), ROLE_TRAINER);
    assert_int_equal(auth_role_of(held, "n-secret"), ROLE_NONE);
    auth_free(held);
    now = auth_current_get(cur);
    assert_int_equal(auth_role_of(now, "t-secret"), ROLE_NONE);
    assert_int_equal(auth_role_of(now, "n-secret"), ROLE_TRAINER);
    auth_free(now);
    assert_true(auth_current_worker_may_be(cur, "n-secret", "wa") == false);
    auth_current_free(cur);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roles),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_worker_names),
        cmocka_unit_test(test_bad_entries),
        cmocka_unit_test(test_many_tokens),
        cmocka_unit_test(test_equal_and_random),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_token_file),
        cmocka_unit_test(test_url_host),
        cmocka_unit_test(test_tls_needs_files),
        cmocka_unit_test(test_current_swap_under_a_reader),
    };
    int rv = cmocka_run_group_tests(tests, NULL, NULL);
    if (!rpc_server_abandoned()) {
        nng_fini(); /* it would wait for the abandoned close too */
    }
    return rv;
}
