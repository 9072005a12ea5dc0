/* The pure parts of issue 16's etcd client and leader following: the chunked decoding of
 * the gateway's streamed answers, the follower's hint, the address lists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "address.h"
#include "etcd.h"
#include "rpc_leader.h"

static int
dechunk(const char *in, char *out, size_t cap)
{
    size_t len = strlen(in);
    int rv;

    assert_true(len < cap);
    memcpy(out, in, len + 1);
    rv = etcd_dechunk(out, &len);
    if (rv == 1) {
        out[len] = '\0';
    }
    return rv;
}

static void
test_dechunk(void **state)
{
    char buf[256];

    (void)state;
    assert_int_equal(dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", buf, sizeof(buf)), 1);
    assert_string_equal(buf, "hello world");
    assert_int_equal(
        dechunk("1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n", buf, sizeof(buf)), 1);
    assert_string_equal(buf, "abcdefghijklmnopqrstuvwxyz");
    assert_int_equal(dechunk("0\r\n\r\n", buf, sizeof(buf)), 1);
    assert_string_equal(buf, "");
    /* Not all here yet. */
    assert_int_equal(dechunk("", buf, sizeof(buf)), 0);
    assert_int_equal(dechunk("5\r\nhel", buf, sizeof(buf)), 0);
    assert_int_equal(dechunk("5\r\nhello\r\n", buf, sizeof(buf)), 0);
    assert_int_equal(dechunk("5\r\nhello\r\n0\r\n", buf, sizeof(buf)), 0);
    /* Malformed: never read past the buffer, never a size that wraps. */
    assert_int_equal(dechunk("x\r\nhello\r\n0\r\n\r\n", buf, sizeof(buf)), -1);
    assert_int_equal(dechunk("5\r\nhelloXX0\r\n\r\n", buf, sizeof(buf)), -1);
    assert_int_equal(dechunk("\r\n", buf, sizeof(buf)), -1);
    assert_int_equal(dechunk("fffffffff\r\n", buf, sizeof(buf)), -1);
    assert_int_equal(dechunk("ffffffff\r\nab", buf, sizeof(buf)), 0);
    assert_int_equal(dechunk("0\r\nX\n", buf, sizeof(buf)), -1);
    assert_int_equal(dechunk("0\r\n\n", buf, sizeof(buf)), -1);
    /* Trailers (the gateway's error answers have one) end at the blank line. */
    assert_int_equal(dechunk("0\r\nX\r\n", buf, sizeof(buf)), 0);
    assert_int_equal(
        dechunk("0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n", buf, sizeof(buf)), 0);
    assert_int_equal(dechunk("3\r\n{}\n\r\n0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n"
                             "\r\n",
                             buf, sizeof(buf)),
                     1);
    assert_string_equal(buf, "{}\n");
}

/* Feeds `in` to one etcd_dechunk_more state `step` bytes at a time, as reads append to one
 * buffer: the verdict after each read, the last one returned (and the body in out). */
static int
dechunk_in_reads(const char *in, size_t step, char *out, size_t cap)
{
    struct etcd_dechunk d = { 0 };
    size_t len = strlen(in), have = 0;
    int rv = 0;

    assert_true(len < cap);
    while (have < len && rv == 0) {
        size_t n = len - have < step ? len - have : step;
        memcpy(out + have, in + have, n); /* a read lands after what came before */
        have += n;
        rv = etcd_dechunk_more(out, have, &d);
        assert_true(d.out <= d.in && d.in <= have); /* decoded never overtakes raw */
    }
    if (rv == 1) {
        out[d.out] = '\0';
    }
    return rv;
}

/* The read loop decodes as bytes come (each parsed about once, not the whole body again per
 * read): split anywhere, a body decodes to what it does whole. */
static void
test_dechunk_in_reads(void **state)
{
    static const struct {
        const char *raw, *body; /* body NULL: malformed */
    } cases[] = {
        { "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "hello world" },
        { "1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n1\r\n!\r\n0\r\n\r\n",
          "abcdefghijklmnopqrstuvwxyz!" },
        { "3\r\n{}\n\r\n0\r\nGrpc-Trailer-Content-Type: application/grpc\r\nX: y\r\n\r\n", "{}\n" },
        { "0\r\n\r\n", "" },
        { "5\r\nhelloXX0\r\n\r\n", NULL },
        { "2\r\nab\r\nz\r\n", NULL },
        { "2\r\nab\r\n0\r\nX\n", NULL },
    };
    char buf[256];

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (size_t step = 1; step <= strlen(cases[i].raw); step++) {
            int rv = dechunk_in_reads(cases[i].raw, step, buf, sizeof(buf));
            if (cases[i].body == NULL) {
                assert_int_equal(rv, -1);
            } else {
                assert_int_equal(rv, 1);
                assert_string_equal(buf, cases[i].body);
            }
        }
    }
    /* Not yet whole after any strict prefix. */
    assert_int_equal(dechunk_in_reads("5\r\nhello\r\n0\r\n\r", 1, buf, sizeof(buf)), 0);
}

static void
test_leader_hint(void **state)
{
    char buf[64];

    (void)state;
    assert_true(
        rpc_leader_hint("not the leader; leader: tcp://10.0.0.2:7400 (term 12)", buf, sizeof(buf)));
    assert_string_equal(buf, "tcp://10.0.0.2:7400");
    assert_true(rpc_leader_hint("leader: tcp://a:1", buf, sizeof(buf)));
    assert_string_equal(buf, "tcp://a:1");
    assert_false(
        rpc_leader_hint("not the leader; no leader elected yet (campaigning)", buf, sizeof(buf)));
    assert_false(rpc_leader_hint("leader: ", buf, sizeof(buf)));
    assert_false(rpc_leader_hint(NULL, buf, sizeof(buf)));
    assert_false(rpc_leader_hint("leader: tcp://a-very-long-host-name:1", buf, 8));
}

static void
test_split_list(void **state)
{
    const char *out[3];
    char buf[64];

    (void)state;
    assert_int_equal(address_split_list("tcp://a:1,tcp://b:2", buf, sizeof(buf), out, 3), 2);
    assert_string_equal(out[0], "tcp://a:1");
    assert_string_equal(out[1], "tcp://b:2");
    assert_int_equal(address_split_list("a,b,c,d", buf, sizeof(buf), out, 3), 0);
    assert_int_equal(address_split_list("", buf, sizeof(buf), out, 3), 0);
    assert_int_equal(address_split_list(NULL, buf, sizeof(buf), out, 3), 0);
    assert_int_equal(address_split_list("tcp://a:1", buf, 4, out, 3), 0);
}

/* Counts the opens; never reached for an address refused before it. */
static dc_code
count_open(void *arg, const char *url, struct rpc_client **out, dc_status *st)
{
    (void)url;
    (*(int *)arg)++;
    *out = NULL;
    return status_set(st, DC_UNAVAILABLE, "not opened in this test");
}

static void
test_leader_new_refuses_a_long_address(void **state)
{
    char list[2 * ADDRESS_MAX];
    struct rpc_leader *l = NULL;
    dc_status st;
    int opens = 0;

    (void)state;
    memcpy(list, "tcp://", 6);
    memset(list + 6, 'a', ADDRESS_MAX - 6 + 1); /* one byte over ADDRESS_MAX */
    list[ADDRESS_MAX + 1] = '\0';
    status_clear(&st);
    assert_int_equal(rpc_leader_new(list, count_open, &opens, &l, &st), DC_INVALID_ARGUMENT);
    assert_null(l);
    assert_int_equal(opens, 0);
    assert_non_null(strstr(st.message, "address longer than"));
    /* ADDRESS_MAX exactly is copied whole and handed to open. */
    list[ADDRESS_MAX] = '\0';
    assert_int_equal(rpc_leader_new(list, count_open, &opens, &l, &st), DC_UNAVAILABLE);
    assert_int_equal(opens, 1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dechunk),
        cmocka_unit_test(test_dechunk_in_reads),
        cmocka_unit_test(test_leader_hint),
        cmocka_unit_test(test_split_list),
        cmocka_unit_test(test_leader_new_refuses_a_long_address),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
