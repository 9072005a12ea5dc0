/*
 * The TLS handshake watch's record of live pipes (common/handshake.c): a pipe goes by its
 * id, because when its peer closed first nng no longer knows its address by the time it
 * reports the pipe gone (a lookup by address missed it, and the record grew with every
 * such close, taking a later connection from that address and port for a live pipe).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "handshake.h"

static nng_sockaddr
addr4(uint32_t ip, uint16_t port)
{
    nng_sockaddr sa;

    memset(&sa, 0, sizeof(sa));
    sa.s_in.sa_family = NNG_AF_INET;
    sa.s_in.sa_addr   = ip;
    sa.s_in.sa_port   = port;
    return sa;
}

static void
test_pipes_go_by_id(void **state)
{
    struct handshake_watch *w = handshake_watch_new(1000);
    nng_sockaddr a = addr4(0x0100007f, 4000), b = addr4(0x0100007f, 4001);

    (void)state;
    assert_non_null(w);
    for (uint32_t id = 1; id <= 100; id++) { /* more than the first allocation holds */
        handshake_watch_pipe(w, id, id % 2 ? &a : &b, true);
    }
    assert_int_equal(handshake_watch_pipes(w), 100);
    /* Gone with no address (as nng reports a pipe whose peer closed): each by its id. */
    for (uint32_t id = 1; id <= 99; id++) {
        handshake_watch_pipe(w, id, NULL, false);
    }
    assert_int_equal(handshake_watch_pipes(w), 1);
    handshake_watch_pipe(w, 12345, NULL, false); /* unknown: nothing */
    assert_int_equal(handshake_watch_pipes(w), 1);
    handshake_watch_pipe(w, 100, NULL, false);
    assert_int_equal(handshake_watch_pipes(w), 0);
    handshake_watch_stop(w);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipes_go_by_id),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
