/* A raw link's connection (common/dlsock.c): plain sockets on 127.0.0.1 carrying bytes both
 * ways, timeouts, the peer closing, waits ended from another thread, and a dial that finds
 * nobody; an nng stream peer on the same listener. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "dlsock.h"

struct pair {
    struct dlsock_listener *l;
    int port;
    struct dlsock *a, *b; /* dialled, accepted */
};

static void
pair_open(struct pair *p)
{
    char url[64];

    assert_int_equal(dlsock_listen("tcp://127.0.0.1:0", NULL, &p->l, &p->port), 0);
    assert_true(p->port > 0);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", p->port);
    assert_int_equal(dlsock_dial(url, NULL, 2000, &p->a), 0);
    assert_int_equal(dlsock_accept(p->l, &p->b), 0);
}

static void
pair_close(struct pair *p)
{
    dlsock_free(p->a);
    dlsock_free(p->b);
    dlsock_listener_free(p->l);
}

struct sender {
    struct dlsock *s;
    nng_iov *iov;
    int rv;
};

static void *
send_one(void *arg)
{
    struct sender *x = arg;

    x->rv = dlsock_send_all(x->s, x->iov, 1, NNG_DURATION_INFINITE);
    return NULL;
}

static void
test_bytes_both_ways(void **state)
{
    static uint8_t big[3 << 20], back[3 << 20];
    uint8_t head[7] = "header", tail[5] = "tail", got_head[7], got_tail[5];
    nng_iov out[3] = { { head, sizeof(head) }, { NULL, 0 }, { tail, sizeof(tail) } };
    nng_iov in[2]  = { { got_head, sizeof(got_head) }, { got_tail, sizeof(got_tail) } };
    nng_iov bo = { big, sizeof(big) }, bi = { back, sizeof(back) };
    struct pair p;

    (void)state;
    pair_open(&p);
    /* Scattered parts (an empty one among them) arrive as one run of bytes. */
    assert_int_equal(dlsock_send_all(p.a, out, 3, 1000), 0);
    assert_int_equal(dlsock_recv_all(p.b, in, 2, 1000), 0);
    assert_memory_equal(got_head, head, sizeof(head));
    assert_memory_equal(got_tail, tail, sizeof(tail));
    /* More than the socket buffers hold: an unbounded writer on another thread waits in
     * the kernel for the reader, and every byte arrives in order. */
    for (size_t i = 0; i < sizeof(big); i++) {
        big[i] = (uint8_t)(i * 7 + 1);
    }
    struct sender snd = { p.b, &bo, -1 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, send_one, &snd), 0);
    assert_int_equal(dlsock_recv_all(p.a, &bi, 1, NNG_DURATION_INFINITE), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(snd.rv, 0);
    assert_memory_equal(back, big, sizeof(big));
    pair_close(&p);
}

static void
test_timeout_close_and_idle(void **state)
{
    uint8_t byte = 0, buf[4];
    nng_iov one = { &byte, 1 }, four = { buf, sizeof(buf) };
    struct pair p;

    (void)state;
    pair_open(&p);
    /* Nothing sent: a bounded read times out, and the idle watch finds the link fit. */
    assert_int_equal(dlsock_recv_all(p.b, &one, 1, 50), NNG_ETIMEDOUT);
    dlsock_idle_begin(p.a);
    assert_true(dlsock_idle_end(p.a));
    /* A stray byte, then the peer's close, make it unfit; reads then see the close. */
    one = (nng_iov){ &byte, 1 };
    assert_int_equal(dlsock_send_all(p.b, &one, 1, 1000), 0);
    nng_msleep(50);
    dlsock_idle_begin(p.a);
    assert_false(dlsock_idle_end(p.a));
    dlsock_free(p.b);
    p.b = NULL;
    assert_int_equal(dlsock_recv_all(p.a, &four, 1, 1000), NNG_ECLOSED); /* 1 byte, then EOF */
    pair_close(&p);
}

struct waiter {
    struct dlsock *s;
    struct dlsock_listener *l;
    int rv;
};

static void *
recv_forever(void *arg)
{
    struct waiter *w = arg;
    uint8_t buf[16];
    nng_iov iov = { buf, sizeof(buf) };

    w->rv = dlsock_recv_all(w->s, &iov, 1, NNG_DURATION_INFINITE);
    return NULL;
}

static void *
accept_forever(void *arg)
{
    struct waiter *w = arg;
    struct dlsock *s = NULL;

    w->rv = dlsock_accept(w->l, &s);
    dlsock_free(s);
    return NULL;
}

static void
test_waits_ended_from_another_thread(void **state)
{
    struct pair p;
    struct waiter w = { 0 }, la = { 0 };
    pthread_t t;

    (void)state;
    pair_open(&p);
    /* An unbounded read on one thread ends when another shuts the socket, and every later
     * call fails at once. */
    w.s = p.a;
    assert_int_equal(pthread_create(&t, NULL, recv_forever, &w), 0);
    nng_msleep(50);
    dlsock_shutdown(p.a);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(w.rv, NNG_ECLOSED);
    assert_int_equal(recv_forever(&w), NULL);
    assert_int_equal(w.rv, NNG_ECLOSED);
    /* The peer sees the connection end. */
    w.s = p.b;
    recv_forever(&w);
    assert_int_equal(w.rv, NNG_ECLOSED);
    /* A waiting accept ends when the listener closes. */
    la.l = p.l;
    assert_int_equal(pthread_create(&t, NULL, accept_forever, &la), 0);
    nng_msleep(50);
    dlsock_listener_close(p.l);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(la.rv, NNG_ECLOSED);
    pair_close(&p);
}

static void
test_dial_refused_and_nng_peer(void **state)
{
    struct dlsock_listener *l;
    struct dlsock *s = NULL, *in = NULL;
    nng_stream_dialer *d;
    nng_stream *ns;
    nng_aio *aio;
    char url[64];
    uint8_t msg[5] = "hello", got[5];
    nng_iov iov    = { got, sizeof(got) };
    int port;

    (void)state;
    /* A port nobody listens on any more. */
    assert_int_equal(dlsock_listen("tcp://127.0.0.1:0", NULL, &l, &port), 0);
    dlsock_listener_free(l);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    assert_int_equal(dlsock_dial(url, NULL, 2000, &s), NNG_ECONNREFUSED);
    assert_null(s);
    /* An nng stream dialer is an ordinary TCP peer of a plain listener. */
    assert_int_equal(dlsock_listen("tcp://127.0.0.1:0", NULL, &l, &port), 0);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
    assert_int_equal(nng_stream_dialer_alloc(&d, url), 0);
    nng_stream_dialer_dial(d, aio);
    nng_aio_wait(aio);
    assert_int_equal(nng_aio_result(aio), 0);
    ns = nng_aio_get_output(aio, 0);
    assert_int_equal(dlsock_accept(l, &in), 0);
    nng_iov out = { msg, sizeof(msg) };
    assert_int_equal(nng_aio_set_iov(aio, 1, &out), 0);
    nng_stream_send(ns, aio);
    nng_aio_wait(aio);
    assert_int_equal(nng_aio_result(aio), 0);
    assert_int_equal(dlsock_recv_all(in, &iov, 1, 1000), 0);
    assert_memory_equal(got, msg, sizeof(msg));
    nng_stream_close(ns);
    nng_stream_free(ns);
    nng_stream_dialer_free(d);
    nng_aio_free(aio);
    dlsock_free(in);
    dlsock_listener_free(l);
}

/* Dials host on l's port and takes the connection: a plain socket on both ends. l freed. */
static void
assert_plain_both_ends(struct dlsock_listener *l, const char *host, int port)
{
    struct dlsock *a, *b;
    char url[320];

    snprintf(url, sizeof(url), "tcp://%s:%d", host, port);
    assert_int_equal(dlsock_dial(url, NULL, 2000, &a), 0);
    assert_int_equal(dlsock_accept(l, &b), 0);
    assert_true(dlsock_is_plain(a));
    assert_true(dlsock_is_plain(b));
    dlsock_free(a);
    dlsock_free(b);
    dlsock_listener_free(l);
}

/* Which addresses get plain sockets: numeric ones (IPv4, bracketed IPv6) and localhost, on
 * both ends (names: the next test); a url that is no tcp:// address goes to nng, which
 * refuses this one. */
static void
test_addresses(void **state)
{
    const char *hosts[] = { "127.0.0.1", "localhost", "[::1]" };
    struct dlsock *s    = NULL;

    (void)state;
    for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++) {
        struct dlsock_listener *l;
        char url[64];
        int port;

        snprintf(url, sizeof(url), "tcp://%s:0", hosts[i]);
        if (dlsock_listen(url, NULL, &l, &port) != 0) {
            assert_string_equal(hosts[i], "[::1]"); /* a machine without IPv6 loopback */
            continue;
        }
        assert_plain_both_ends(l, hosts[i], port);
    }
    assert_int_not_equal(dlsock_dial("tcp://127.0.0.1:http", NULL, 500, &s), 0);
    assert_null(s);
}

/* This machine's own name into name, when it resolves to an IPv4 loopback address first. */
static bool
own_name_on_loopback(char *name, size_t cap)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
    bool loopback;

    if (gethostname(name, cap) != 0 || getaddrinfo(name, NULL, &hints, &res) != 0) {
        return false;
    }
    loopback = res->ai_family == AF_INET &&
               (ntohl(((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    freeaddrinfo(res);
    return loopback;
}

/* A host given by name is resolved (within the dial's bound) and dialled on a plain socket,
 * not handed to nng: this machine's own name, when it resolves to an IPv4 loopback address
 * first (else the test is skipped). */
static void
test_a_name_is_a_plain_socket(void **state)
{
    struct dlsock_listener *l;
    char name[256];
    int port;

    (void)state;
    if (!own_name_on_loopback(name, sizeof(name))) {
        skip();
    }
    assert_int_equal(dlsock_listen("tcp://0.0.0.0:0", NULL, &l, &port), 0);
    assert_plain_both_ends(l, name, port);
}

static atomic_int resolved;

/* "two.test" stands for 127.0.0.2, where nothing listens, then 127.0.0.1; "none.test" for
 * 127.0.0.2 alone. A list of two glibc lists, which freeaddrinfo frees node by node. */
static int
two_addresses(const char *host, const char *port, const struct addrinfo *hints,
              struct addrinfo **res)
{
    struct addrinfo numeric = *hints, *first = NULL, *second = NULL, *end;
    bool two = strcmp(host, "two.test") == 0;

    atomic_fetch_add(&resolved, 1);
    if (!two && strcmp(host, "none.test") != 0) {
        return EAI_NONAME;
    }
    numeric.ai_flags |= AI_NUMERICHOST;
    if (getaddrinfo("127.0.0.2", port, &numeric, &first) != 0) {
        return EAI_FAIL;
    }
    if (two && getaddrinfo("127.0.0.1", port, &numeric, &second) != 0) {
        freeaddrinfo(first);
        return EAI_FAIL;
    }
    for (end = first; end->ai_next != NULL; end = end->ai_next) {
    }
    end->ai_next = second;
    *res         = first;
    return 0;
}

/* A name's addresses are tried in turn: the first refuses, the second takes the connection. */
static void
test_a_name_tries_each_address(void **state)
{
    struct dlsock_listener *l;
    struct dlsock *a = NULL;
    char url[64];
    int port;

    (void)state;
    atomic_store(&resolved, 0);
    dlsock_set_resolver(two_addresses);
    assert_int_equal(dlsock_listen("tcp://127.0.0.1:0", NULL, &l, &port), 0);
    assert_plain_both_ends(l, "two.test", port); /* frees l */
    assert_int_equal(atomic_load(&resolved), 1);
    /* With no address that takes it, the last one's refusal. */
    snprintf(url, sizeof(url), "tcp://none.test:%d", port);
    assert_int_equal(dlsock_dial(url, NULL, 2000, &a), NNG_ECONNREFUSED);
    assert_null(a);
    assert_int_equal(atomic_load(&resolved), 2);
    dlsock_set_resolver(NULL);
}

static atomic_int stalls_done;

/* Knows no name, and says so a second late (no DNS is asked). */
static int
stalled(const char *host, const char *port, const struct addrinfo *hints, struct addrinfo **res)
{
    (void)host;
    (void)port;
    (void)hints;
    (void)res;
    nng_msleep(1000);
    atomic_fetch_add(&stalls_done, 1);
    return EAI_NONAME;
}

/* A name that does not resolve within the dial's bound ends the dial NNG_ETIMEDOUT, without
 * waiting for the resolution (nng's resolver, the same getaddrinfo, would not do better; it
 * used to get the whole bound again). */
static void
test_a_name_not_resolved_in_time_ends_the_dial(void **state)
{
    struct dlsock *a = NULL;

    (void)state;
    atomic_store(&stalls_done, 0);
    dlsock_set_resolver(stalled);
    assert_int_equal(dlsock_dial("tcp://slow.test:7", NULL, 300, &a), NNG_ETIMEDOUT);
    assert_null(a);
    assert_int_equal(atomic_load(&stalls_done), 0); /* it was not waited for */
    /* The stalled resolution ends on its own thread, and frees what it holds. */
    for (int i = 0; i < 500 && atomic_load(&stalls_done) == 0; i++) {
        nng_msleep(10);
    }
    assert_int_equal(atomic_load(&stalls_done), 1);
    dlsock_set_resolver(NULL);
}

/* Fails every name at once, as a resolver with no answer yet does. */
static int
no_answer_yet(const char *host, const char *port, const struct addrinfo *hints,
              struct addrinfo **res)
{
    (void)host;
    (void)port;
    (void)hints;
    (void)res;
    return EAI_AGAIN;
}

/* A name that did not resolve, with time left, goes to nng, which resolves it itself: the
 * connection is made, as an nng stream. */
static void
test_a_name_that_did_not_resolve_goes_to_nng(void **state)
{
    struct dlsock_listener *l;
    struct dlsock *a, *b;
    char name[256], url[320];
    int port;

    (void)state;
    if (!own_name_on_loopback(name, sizeof(name))) {
        skip();
    }
    dlsock_set_resolver(no_answer_yet);
    assert_int_equal(dlsock_listen("tcp://0.0.0.0:0", NULL, &l, &port), 0);
    snprintf(url, sizeof(url), "tcp://%s:%d", name, port);
    assert_int_equal(dlsock_dial(url, NULL, 2000, &a), 0);
    assert_int_equal(dlsock_accept(l, &b), 0);
    assert_false(dlsock_is_plain(a));
    dlsock_free(a);
    dlsock_free(b);
    dlsock_listener_free(l);
    dlsock_set_resolver(NULL);
}

/* A resolver that holds every call until released, counting how many it holds at most, then
 * knows no name (no DNS is asked). */
static struct {
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    bool released;
    unsigned in, most;
} held = { .mtx = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static int
held_resolver(const char *host, const char *port, const struct addrinfo *hints,
              struct addrinfo **res)
{
    (void)host;
    (void)port;
    (void)hints;
    (void)res;
    pthread_mutex_lock(&held.mtx);
    if (++held.in > held.most) {
        held.most = held.in;
    }
    while (!held.released) {
        pthread_cond_wait(&held.cv, &held.mtx);
    }
    held.in--;
    pthread_cond_broadcast(&held.cv);
    pthread_mutex_unlock(&held.mtx);
    return EAI_NONAME;
}

struct dialer {
    struct dlsock *s;
    int rv;
};

static void *
dial_one(void *arg)
{
    struct dialer *d = arg;

    d->rv = dlsock_dial("tcp://hang.test:7", NULL, 300, &d->s);
    return NULL;
}

/* Names whose resolution hangs: at most DLSOCK_RESOLVE_MAX resolver threads at once, however
 * many dials time out waiting for them (each left one behind before). The dials still end,
 * NNG_ETIMEDOUT, within their bounds, and once the resolutions end a name resolves again. */
static void
test_resolutions_that_hang_hold_a_bounded_number_of_threads(void **state)
{
    enum { DIALS = DLSOCK_RESOLVE_MAX + 4 };
    static struct dialer d[DIALS];
    pthread_t t[DIALS];
    struct dlsock_listener *l;
    int port;

    (void)state;
    held.released = false;
    held.in = held.most = 0;
    dlsock_set_resolver(held_resolver);
    for (int i = 0; i < DIALS; i++) {
        d[i] = (struct dialer){ 0 };
        assert_int_equal(pthread_create(&t[i], NULL, dial_one, &d[i]), 0);
    }
    for (int i = 0; i < DIALS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(d[i].rv, NNG_ETIMEDOUT);
        assert_null(d[i].s);
    }
    pthread_mutex_lock(&held.mtx);
    assert_int_equal(held.most, DLSOCK_RESOLVE_MAX);
    assert_int_equal(held.in, DLSOCK_RESOLVE_MAX);
    held.released = true;
    pthread_cond_broadcast(&held.cv);
    while (held.in > 0) {
        pthread_cond_wait(&held.cv, &held.mtx);
    }
    pthread_mutex_unlock(&held.mtx);
    /* The places come free (a dial waits for one): a name resolves on a plain socket. */
    dlsock_set_resolver(two_addresses);
    assert_int_equal(dlsock_listen("tcp://127.0.0.1:0", NULL, &l, &port), 0);
    assert_plain_both_ends(l, "two.test", port);
    dlsock_set_resolver(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_both_ways),
        cmocka_unit_test(test_timeout_close_and_idle),
        cmocka_unit_test(test_waits_ended_from_another_thread),
        cmocka_unit_test(test_dial_refused_and_nng_peer),
        cmocka_unit_test(test_addresses),
        cmocka_unit_test(test_a_name_is_a_plain_socket),
        cmocka_unit_test(test_a_name_tries_each_address),
        cmocka_unit_test(test_a_name_not_resolved_in_time_ends_the_dial),
        cmocka_unit_test(test_a_name_that_did_not_resolve_goes_to_nng),
        cmocka_unit_test(test_resolutions_that_hang_hold_a_bounded_number_of_threads),
    };
    int rv = cmocka_run_group_tests(tests, NULL, NULL);

    nng_fini();
    return rv;
}
