/* TLS on a raw link's own socket (common/dltls.c through common/dlsock.c): certificates made
 * here with the openssl command; the handshake and the bytes both ways at once (a reader and
 * a writer on each end, as the data link has), a server whose certificate another CA signed
 * or names another host, a client certificate required, garbage instead of a ClientHello,
 * a read's timeout, and a blocked read ended from another thread. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "auth.h"
#include "dlsock.h"
#include "dltls.h"

static char dir[] = "/tmp/devcoord-test-dltls-XXXXXX";

/* Path of `name` in dir. */
static const char *
at(const char *name)
{
    static char buf[8][256];
    static int k;

    k = (k + 1) % 8;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

/* A CA (name.pem, name.key) and certificates it signs: `who`.pem/.key for CN=cn. */
static void
make_ca(const char *name)
{
    char cmd[1024];

    snprintf(cmd, sizeof(cmd),
             "cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
             "-nodes -keyout %s.key -out %s.pem -days 1 -subj /CN=%s "
             "-addext basicConstraints=critical,CA:TRUE >/dev/null 2>&1",
             dir, name, name, name);
    assert_int_equal(system(cmd), 0);
}

/* `who`.pem/.key for CN=cn with subjectAltName san (NULL: DNS:cn), signed by ca. */
static void
make_cert_san(const char *ca, const char *who, const char *cn, const char *san)
{
    char cmd[1024], dns[128];

    if (san == NULL) {
        snprintf(dns, sizeof(dns), "DNS:%s", cn);
        san = dns;
    }
    snprintf(cmd, sizeof(cmd),
             "cd %s && printf 'subjectAltName=%s\\n' > %s.cnf && "
             "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout %s.key -out %s.csr -subj /CN=%s >/dev/null 2>&1 && "
             "openssl x509 -req -in %s.csr -CA %s.pem -CAkey %s.key -CAcreateserial -out %s.pem "
             "-days 1 -extfile %s.cnf >/dev/null 2>&1",
             dir, san, who, who, who, cn, who, ca, ca, who, who);
    assert_int_equal(system(cmd), 0);
}

static void
make_cert(const char *ca, const char *who, const char *cn)
{
    make_cert_san(ca, who, cn, NULL);
}

static int
setup(void **state)
{
    char cmd[300];

    (void)state;
    if (mkdtemp(dir) == NULL) {
        return -1;
    }
    make_ca("ca");
    make_ca("other-ca");
    make_cert("ca", "server", "127.0.0.1");
    make_cert("other-ca", "stranger", "127.0.0.1");
    make_cert("ca", "client", "a-client");
    make_cert_san("ca", "by-ip", "a-host", "IP:127.0.0.1");
    make_cert_san("ca", "part-wild", "part-wild", "DNS:f*.example.test");
    snprintf(cmd, sizeof(cmd),
             "cd %s && openssl pkcs8 -topk8 -v2 aes-256-cbc -passout pass:secret -in server.key "
             "-out encrypted.key >/dev/null 2>&1",
             dir);
    if (system(cmd) != 0) {
        return -1;
    }
    snprintf(cmd, sizeof(cmd), "test -s %s/client.pem", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int
teardown(void **state)
{
    char cmd[300];

    (void)state;
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static struct dltls *
server_tls(const char *who, bool require_client_cert)
{
    char cert[64], key[64];
    struct config_tls t = { 0 };
    struct dltls *out   = NULL;
    dc_status st;

    snprintf(cert, sizeof(cert), "%s.pem", who);
    snprintf(key, sizeof(key), "%s.key", who);
    t.cert                = (char *)at(cert);
    t.key                 = (char *)at(key);
    t.ca                  = (char *)at("ca.pem");
    t.require_client_cert = require_client_cert;
    assert_int_equal(auth_dltls_server(&t, &out, &st), DC_OK);
    return out;
}

static struct dltls *
client_tls(const char *ca, const char *server_name, bool with_cert)
{
    struct dltls *out = NULL;
    dc_status st;

    assert_int_equal(auth_dltls_client(at(ca), with_cert ? at("client.pem") : NULL,
                                       with_cert ? at("client.key") : NULL, server_name, &out, &st),
                     DC_OK);
    return out;
}

/* A dial on its own thread (its handshake needs the accepting end to read), then one byte
 * sent. */
struct dialer {
    char url[64];
    struct dltls *tls;
    struct dlsock *s;
    int rv, hello_rv;
};

static void *
dial_main(void *arg)
{
    struct dialer *d = arg;
    uint8_t byte     = 42;
    nng_iov iov      = { &byte, 1 };

    if ((d->rv = dlsock_dial(d->url, d->tls, 3000, &d->s)) == 0) {
        d->hello_rv = dlsock_send_all(d->s, &iov, 1, 3000);
    }
    return NULL;
}

struct pair {
    struct dlsock_listener *l;
    int port;
    struct dlsock *a, *b; /* dialled, accepted */
    int dial_rv, hello_rv, accept_read_rv;
};

/* Listens with srv, dials with cli, accepts, and has the accepted end read the one byte the
 * dialer sends once connected (its handshake is made by that read, within 3 s); an accepted
 * end whose read failed is freed at once. */
static void
pair_open(struct pair *p, struct dltls *srv, struct dltls *cli)
{
    struct dialer d = { .tls = cli };
    pthread_t t;
    uint8_t byte = 0;
    nng_iov iov  = { &byte, 1 };

    memset(p, 0, sizeof(*p));
    assert_int_equal(dlsock_listen("tls+tcp://127.0.0.1:0", srv, &p->l, &p->port), 0);
    snprintf(d.url, sizeof(d.url), "tls+tcp://127.0.0.1:%d", p->port);
    assert_int_equal(pthread_create(&t, NULL, dial_main, &d), 0);
    assert_int_equal(dlsock_accept(p->l, &p->b), 0);
    assert_false(dlsock_is_plain(p->b));
    if ((p->accept_read_rv = dlsock_recv_all(p->b, &iov, 1, 3000)) != 0) {
        dlsock_free(p->b); /* as the data link drops it: the dialer sees it go */
        p->b = NULL;
    }
    pthread_join(t, NULL);
    p->a        = d.s;
    p->dial_rv  = d.rv;
    p->hello_rv = d.hello_rv;
    if (p->accept_read_rv == 0) {
        assert_int_equal(byte, 42);
    }
}

static void
pair_close(struct pair *p)
{
    dlsock_free(p->a);
    dlsock_free(p->b);
    dlsock_listener_free(p->l);
}

/* A stream of `len` pattern bytes written by one thread while another reads what the other
 * end writes: every end reads and writes at once. */
struct pump {
    struct dlsock *s;
    size_t len;
    unsigned seed;
    bool slow; /* pump_recv: in small reads, with pauses */
    int rv;
};

static void *
pump_send(void *arg)
{
    struct pump *x = arg;
    uint8_t *buf   = malloc(x->len);

    for (size_t i = 0; i < x->len; i++) {
        buf[i] = (uint8_t)(i * x->seed + (i >> 13));
    }
    /* In uneven parts, so records and reads do not line up. */
    for (size_t off = 0, k = 1; off < x->len && x->rv == 0; k++) {
        size_t n    = x->len - off < k * 1777 ? x->len - off : k * 1777;
        nng_iov iov = { buf + off, n };
        x->rv       = dlsock_send_all(x->s, &iov, 1, 10000);
        off += n;
    }
    free(buf);
    return NULL;
}

/* Reads the stream whole, or, slow, in 64 KiB reads with a pause every 16 (the writer finds
 * the socket full again and again); checks its pattern. */
static void *
pump_recv(void *arg)
{
    struct pump *x = arg;
    uint8_t *buf   = malloc(x->len);
    size_t step    = x->slow ? 64u << 10 : x->len;

    for (size_t off = 0, k = 0; off < x->len && x->rv == 0; k++) {
        size_t n    = x->len - off < step ? x->len - off : step;
        nng_iov iov = { buf + off, n };
        x->rv       = dlsock_recv_all(x->s, &iov, 1, 10000);
        off += n;
        if (x->slow && k % 16 == 15) {
            nng_msleep(2);
        }
    }
    for (size_t i = 0; i < x->len && x->rv == 0; i++) {
        if (buf[i] != (uint8_t)(i * x->seed + (i >> 13))) {
            x->rv = -1;
        }
    }
    free(buf);
    return NULL;
}

static void
test_bytes_both_ways_at_once(void **state)
{
    struct dltls *srv = server_tls("server", false),
                 *cli = client_tls("ca.pem", "127.0.0.1", false);
    struct pump as = { .len = 3 << 20, .seed = 7 }, ar = { .len = 3 << 20, .seed = 11 },
                bs = { .len = 3 << 20, .seed = 11 }, br = { .len = 3 << 20, .seed = 7 };
    pthread_t t[4];
    struct pair p;

    (void)state;
    pair_open(&p, srv, cli);
    assert_int_equal(p.dial_rv, 0);
    assert_int_equal(p.hello_rv, 0);
    assert_int_equal(p.accept_read_rv, 0);
    as.s = ar.s = p.a;
    bs.s = br.s = p.b;
    pthread_create(&t[0], NULL, pump_send, &as);
    pthread_create(&t[1], NULL, pump_recv, &ar);
    pthread_create(&t[2], NULL, pump_send, &bs);
    pthread_create(&t[3], NULL, pump_recv, &br);
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
    }
    assert_int_equal(as.rv, 0);
    assert_int_equal(bs.rv, 0);
    assert_int_equal(ar.rv, 0); /* a got b's stream, whole and in order */
    assert_int_equal(br.rv, 0);
    assert_true(dltls_nng(srv) != NULL && dltls_nng(cli) != NULL);
    pair_close(&p);
    dltls_free(srv);
    dltls_free(cli);
}

/* One write of 8 MiB (records that the socket takes in part) to a reader that takes it
 * slowly: every byte arrives, in order. */
static void
test_one_large_write_to_a_slow_reader(void **state)
{
    struct dltls *srv = server_tls("server", false),
                 *cli = client_tls("ca.pem", "127.0.0.1", false);
    const size_t len  = 8u << 20;
    struct pump r     = { .len = len, .seed = 5, .slow = true };
    uint8_t *buf      = malloc(len);
    nng_iov iov       = { buf, len };
    struct pair p;
    pthread_t t;

    (void)state;
    for (size_t i = 0; i < len; i++) {
        buf[i] = (uint8_t)(i * 5 + (i >> 13));
    }
    pair_open(&p, srv, cli);
    assert_int_equal(p.accept_read_rv, 0);
    r.s = p.b;
    assert_int_equal(pthread_create(&t, NULL, pump_recv, &r), 0);
    assert_int_equal(dlsock_send_all(p.a, &iov, 1, 10000), 0);
    pthread_join(t, NULL);
    assert_int_equal(r.rv, 0);
    free(buf);
    pair_close(&p);
    dltls_free(srv);
    dltls_free(cli);
}

/* A pair opened with srv and cli: the dial ends with dial_want (ANY_ERROR: any error), and
 * the accepting end's first read gets the byte (through) or fails. */
#define ANY_ERROR (-1)
static void
expect_pair(struct dltls *srv, struct dltls *cli, int dial_want, bool through)
{
    struct pair p;

    pair_open(&p, srv, cli);
    if (dial_want == ANY_ERROR) {
        assert_int_not_equal(p.dial_rv, 0);
    } else {
        assert_int_equal(p.dial_rv, dial_want);
    }
    if (p.dial_rv != 0) {
        assert_null(p.a);
    }
    if (through) {
        assert_int_equal(p.accept_read_rv, 0);
    } else {
        assert_int_not_equal(p.accept_read_rv, 0);
    }
    pair_close(&p);
}

/* The dialer refuses a server whose certificate another CA signed, or that names another
 * host; the accepting end's read fails too. Nothing is carried. */
static void
test_a_server_the_client_cannot_verify_is_refused(void **state)
{
    struct dltls *stranger = server_tls("stranger", false), *srv = server_tls("server", false);
    struct dltls *cli       = client_tls("ca.pem", "127.0.0.1", false);
    struct dltls *elsewhere = client_tls("ca.pem", "db.example", false);

    (void)state;
    expect_pair(stranger, cli, NNG_EPEERAUTH, false);
    expect_pair(srv, elsewhere, NNG_EPEERAUTH, false);
    expect_pair(srv, cli, 0, true); /* the same server and client, as they should be */
    dltls_free(stranger);
    dltls_free(srv);
    dltls_free(cli);
    dltls_free(elsewhere);
}

/* A server with `who`'s certificate, dialed as `name`: the dial ends with want (0: through,
 * and the server reads the client's byte). */
static void
expect_name(const char *who, const char *name, int want)
{
    struct dltls *srv = server_tls(who, false), *cli = client_tls("ca.pem", name, false);

    expect_pair(srv, cli, want, want == 0);
    dltls_free(srv);
    dltls_free(cli);
}

/* Names as nng's mbedTLS checks them, and IP addresses too: by-ip's certificate names its
 * host by IP address only (its common name is a-host, not read beside a subjectAltName);
 * part-wild's is a partial wildcard (f*.example.test), which names no host. */
static void
test_server_names(void **state)
{
    (void)state;
    expect_name("by-ip", "127.0.0.1", 0);
    expect_name("by-ip", "127.0.0.2", NNG_EPEERAUTH);
    expect_name("by-ip", "a-host", NNG_EPEERAUTH);
    expect_name("part-wild", "foo.example.test", NNG_EPEERAUTH);
}

/* A server that requires a client certificate takes nothing from a client without one, and
 * talks to a client whose certificate its CA signed. */
static void
test_a_required_client_certificate(void **state)
{
    struct dltls *srv  = server_tls("server", true);
    struct dltls *bare = client_tls("ca.pem", "127.0.0.1", false),
                 *with = client_tls("ca.pem", "127.0.0.1", true);

    (void)state;
    expect_pair(srv, bare, ANY_ERROR, false);
    expect_pair(srv, with, 0, true);
    dltls_free(srv);
    dltls_free(bare);
    dltls_free(with);
}

/* Bytes that are no ClientHello end the accepted end's first read with an error, at once
 * (not its timeout). */
static void
test_garbage_instead_of_a_client_hello(void **state)
{
    struct dltls *srv = server_tls("server", false);
    struct dlsock_listener *l;
    struct dlsock *b;
    struct sockaddr_in sa = { .sin_family = AF_INET };
    uint8_t junk[64], byte;
    nng_iov iov = { &byte, 1 };
    int port, fd;

    (void)state;
    memset(junk, 0x5a, sizeof(junk));
    assert_int_equal(dlsock_listen("tls+tcp://127.0.0.1:0", srv, &l, &port), 0);
    sa.sin_port        = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_true((fd = socket(AF_INET, SOCK_STREAM, 0)) >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    assert_int_equal(dlsock_accept(l, &b), 0);
    assert_int_equal(dlsock_recv_all(b, &iov, 1, 60000), NNG_ECRYPTO);
    close(fd);
    dlsock_free(b);
    dlsock_listener_free(l);
    dltls_free(srv);
}

struct reader {
    struct dlsock *s;
    int rv;
};

static void *
read_forever(void *arg)
{
    struct reader *r = arg;
    uint8_t byte;
    nng_iov iov = { &byte, 1 };

    r->rv = dlsock_recv_all(r->s, &iov, 1, NNG_DURATION_INFINITE);
    return NULL;
}

/* A read that times out leaves the link usable; a read with no bound ends when another
 * thread shuts the connection. */
static void
test_a_read_times_out_and_a_shutdown_ends_one(void **state)
{
    struct dltls *srv = server_tls("server", false),
                 *cli = client_tls("ca.pem", "127.0.0.1", false);
    uint8_t out[5] = { 1, 2, 3, 4, 5 }, in[5] = { 0 };
    nng_iov o = { out, sizeof(out) }, i = { in, sizeof(in) };
    struct reader r;
    struct pair p;
    pthread_t t;

    (void)state;
    pair_open(&p, srv, cli);
    assert_int_equal(p.accept_read_rv, 0);
    assert_int_equal(dlsock_recv_all(p.b, &i, 1, 50), NNG_ETIMEDOUT);
    i = (nng_iov){ in, sizeof(in) };
    assert_int_equal(dlsock_send_all(p.a, &o, 1, 3000), 0);
    assert_int_equal(dlsock_recv_all(p.b, &i, 1, 3000), 0);
    assert_memory_equal(in, out, sizeof(in));
    /* Idle and nothing came: fit; the peer gone: not. */
    dlsock_idle_begin(p.b);
    assert_true(dlsock_idle_end(p.b));
    r.s = p.b;
    assert_int_equal(pthread_create(&t, NULL, read_forever, &r), 0);
    nng_msleep(100);
    dlsock_shutdown(p.b);
    pthread_join(t, NULL);
    assert_int_equal(r.rv, NNG_ECLOSED);
    pair_close(&p);
    dltls_free(srv);
    dltls_free(cli);
}

/* Two writes that land together, one read of the first's bytes: the second's record, read
 * ahead by TLS and in no socket buffer, still makes the idle link unfit; read, it is fit. */
static void
test_records_read_ahead_make_an_idle_link_unfit(void **state)
{
    struct dltls *srv = server_tls("server", false),
                 *cli = client_tls("ca.pem", "127.0.0.1", false);
    uint8_t one[3] = { 1, 2, 3 }, two[4] = { 4, 5, 6, 7 }, in[4];
    nng_iov o1 = { one, sizeof(one) }, o2 = { two, sizeof(two) }, i = { in, sizeof(one) };
    struct pair p;

    (void)state;
    pair_open(&p, srv, cli);
    assert_int_equal(p.accept_read_rv, 0);
    assert_int_equal(dlsock_send_all(p.a, &o1, 1, 3000), 0);
    assert_int_equal(dlsock_send_all(p.a, &o2, 1, 3000), 0);
    nng_msleep(100); /* both records in b's socket before its read */
    assert_int_equal(dlsock_recv_all(p.b, &i, 1, 3000), 0);
    assert_memory_equal(in, one, sizeof(one));
    dlsock_idle_begin(p.b);
    assert_false(dlsock_idle_end(p.b));
    i = (nng_iov){ in, sizeof(two) };
    assert_int_equal(dlsock_recv_all(p.b, &i, 1, 3000), 0);
    assert_memory_equal(in, two, sizeof(two));
    dlsock_idle_begin(p.b);
    assert_true(dlsock_idle_end(p.b));
    pair_close(&p);
    dltls_free(srv);
    dltls_free(cli);
}

struct one_op {
    struct dlsock *s;
    bool recv;
    int rv;
};

static void *
one_byte(void *arg)
{
    struct one_op *o = arg;
    uint8_t byte     = 9;
    nng_iov iov      = { &byte, 1 };

    o->rv = o->recv ? dlsock_recv_all(o->s, &iov, 1, 5000) : dlsock_send_all(o->s, &iov, 1, 5000);
    return NULL;
}

/* An accepted end whose first calls are a write and a read at once (either may make the
 * handshake; the read may end it while the write waits for its input): the write's byte
 * reaches the dialer at once, every time. */
static void
test_a_write_and_a_read_racing_into_the_handshake(void **state)
{
    struct dltls *srv = server_tls("server", false),
                 *cli = client_tls("ca.pem", "127.0.0.1", false);
    struct dlsock_listener *l;
    int port;

    (void)state;
    assert_int_equal(dlsock_listen("tls+tcp://127.0.0.1:0", srv, &l, &port), 0);
    for (int k = 0; k < 10; k++) {
        struct dialer d = { .tls = cli };
        struct one_op w = { .recv = false }, r = { .recv = true };
        pthread_t td, tw, tr;
        uint8_t byte = 0;
        nng_iov iov  = { &byte, 1 };
        struct dlsock *b;

        snprintf(d.url, sizeof(d.url), "tls+tcp://127.0.0.1:%d", port);
        assert_int_equal(pthread_create(&td, NULL, dial_main, &d), 0);
        assert_int_equal(dlsock_accept(l, &b), 0);
        w.s = r.s = b;
        assert_int_equal(pthread_create(&tw, NULL, one_byte, &w), 0);
        assert_int_equal(pthread_create(&tr, NULL, one_byte, &r), 0);
        pthread_join(td, NULL); /* dialed, and its hello byte sent: r takes it */
        assert_int_equal(d.rv, 0);
        assert_int_equal(dlsock_recv_all(d.s, &iov, 1, 2000), 0); /* w's, well before its bound */
        assert_int_equal(byte, 9);
        pthread_join(tw, NULL);
        pthread_join(tr, NULL);
        assert_int_equal(w.rv, 0);
        assert_int_equal(r.rv, 0);
        dlsock_free(d.s);
        dlsock_free(b);
    }
    dlsock_listener_free(l);
    dltls_free(srv);
    dltls_free(cli);
}

/* Blocking nng stream I/O of exactly len bytes (the nng side of the interop test). */
static int
stream_all(nng_stream *st, bool recv, uint8_t *buf, size_t len)
{
    nng_aio *aio;
    int rv = nng_aio_alloc(&aio, NULL, NULL);

    while (rv == 0 && len > 0) {
        nng_iov iov = { buf, len };
        nng_aio_set_timeout(aio, 5000);
        nng_aio_set_iov(aio, 1, &iov);
        if (recv) {
            nng_stream_recv(st, aio);
        } else {
            nng_stream_send(st, aio);
        }
        nng_aio_wait(aio);
        if ((rv = nng_aio_result(aio)) == 0) {
            buf += nng_aio_count(aio);
            len -= nng_aio_count(aio);
        }
    }
    nng_aio_free(aio);
    return rv;
}

struct sock_reader {
    struct dlsock *s;
    nng_iov iov;
    int rv;
};

static void *
sock_read_main(void *arg)
{
    struct sock_reader *r = arg;

    r->rv = dlsock_recv_all(r->s, &r->iov, 1, 5000);
    return NULL;
}

struct nng_end {
    nng_stream_listener *l;
    nng_stream *st;
    int rv;
};

static void *
nng_accept_echo(void *arg)
{
    struct nng_end *e = arg;
    nng_aio *aio;
    uint8_t buf[70000];

    if ((e->rv = nng_aio_alloc(&aio, NULL, NULL)) != 0) {
        return NULL;
    }
    nng_aio_set_timeout(aio, 5000);
    nng_stream_listener_accept(e->l, aio);
    nng_aio_wait(aio);
    if ((e->rv = nng_aio_result(aio)) == 0) {
        e->st = nng_aio_get_output(aio, 0);
        if ((e->rv = stream_all(e->st, true, buf, sizeof(buf))) == 0) {
            e->rv = stream_all(e->st, false, buf, sizeof(buf));
        }
    }
    nng_aio_free(aio);
    return NULL;
}

/* Links to a host given by name keep nng's TLS (dlsock.h), so either end may be nng's: an
 * nng TLS client against the socket's TLS server, and the socket's TLS client against an nng
 * TLS server, each carrying 70,000 bytes there and back. */
static void
test_nng_tls_at_the_other_end(void **state)
{
    struct dltls *srv = server_tls("server", false),
                 *cli = client_tls("ca.pem", "127.0.0.1", false);
    uint8_t out[70000], in[70000];
    nng_iov o = { out, sizeof(out) }, i = { in, sizeof(in) };
    struct nng_end e = { 0 };
    struct sock_reader r;
    struct dlsock_listener *l;
    nng_stream_dialer *d;
    struct dlsock *s;
    nng_aio *aio;
    nng_stream *st;
    pthread_t t;
    char url[64];
    int port;

    (void)state;
    for (size_t k = 0; k < sizeof(out); k++) {
        out[k] = (uint8_t)(k * 31 + 7);
    }
    /* nng's client, our server. */
    assert_int_equal(dlsock_listen("tls+tcp://127.0.0.1:0", srv, &l, &port), 0);
    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", port);
    assert_int_equal(nng_stream_dialer_alloc(&d, url), 0);
    assert_int_equal(nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, dltls_nng(cli)), 0);
    assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
    nng_aio_set_timeout(aio, 5000);
    nng_stream_dialer_dial(d, aio);
    assert_int_equal(dlsock_accept(l, &s), 0);
    /* Our end's handshake is made by its read: on a thread of its own, as the data link's. */
    r.s   = s;
    r.iov = i;
    assert_int_equal(pthread_create(&t, NULL, sock_read_main, &r), 0);
    nng_aio_wait(aio);
    assert_int_equal(nng_aio_result(aio), 0);
    st = nng_aio_get_output(aio, 0);
    assert_int_equal(stream_all(st, false, out, sizeof(out)), 0);
    pthread_join(t, NULL);
    assert_int_equal(r.rv, 0);
    assert_memory_equal(in, out, sizeof(in));
    nng_stream_free(st);
    nng_stream_dialer_free(d);
    nng_aio_free(aio);
    dlsock_free(s);
    dlsock_listener_free(l);
    /* Our client, nng's server (it echoes). */
    memset(in, 0, sizeof(in));
    i = (nng_iov){ in, sizeof(in) };
    assert_int_equal(nng_stream_listener_alloc(&e.l, "tls+tcp://127.0.0.1:0"), 0);
    assert_int_equal(nng_stream_listener_set_ptr(e.l, NNG_OPT_TLS_CONFIG, dltls_nng(srv)), 0);
    assert_int_equal(nng_stream_listener_listen(e.l), 0);
    assert_int_equal(nng_stream_listener_get_int(e.l, NNG_OPT_TCP_BOUND_PORT, &port), 0);
    assert_int_equal(pthread_create(&t, NULL, nng_accept_echo, &e), 0);
    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", port);
    assert_int_equal(dlsock_dial(url, cli, 5000, &s), 0);
    assert_int_equal(dlsock_send_all(s, &o, 1, 5000), 0);
    assert_int_equal(dlsock_recv_all(s, &i, 1, 5000), 0);
    pthread_join(t, NULL);
    assert_int_equal(e.rv, 0);
    assert_memory_equal(in, out, sizeof(in));
    dlsock_free(s);
    nng_stream_free(e.st);
    nng_stream_listener_free(e.l);
    dltls_free(srv);
    dltls_free(cli);
}

/* PEM text that does not parse, and a dialer without a CA, are refused as such. */
static void
test_configurations_that_cannot_work(void **state)
{
    struct dltls *t = NULL;
    dc_status st;

    (void)state;
    assert_int_equal(dltls_new(false, "not a certificate", NULL, NULL, true, "h", NULL, &t, &st),
                     DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "CA certificate"));
    assert_int_equal(dltls_new(false, NULL, NULL, NULL, true, "h", NULL, &t, &st),
                     DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "needs a CA"));
    assert_null(t);
}

/* The whole of file `name` in dir, NUL-terminated (the caller frees it). */
static char *
slurp(const char *name)
{
    FILE *f   = fopen(at(name), "r");
    char *buf = calloc(1, 1 << 16);
    size_t n;

    assert_non_null(f);
    assert_non_null(buf);
    n = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    assert_true(n > 0);
    return buf;
}

/* A key with a passphrase is refused as such at once (OpenSSL would prompt for it on the
 * terminal and wait), and so is a key that is not the certificate's. */
static void
test_keys_that_cannot_be_used(void **state)
{
    char *cert = slurp("server.pem"), *enc = slurp("encrypted.key"), *other = slurp("client.key");
    struct dltls *t = NULL;
    dc_status st;

    (void)state;
    assert_int_equal(dltls_new(true, NULL, cert, enc, false, NULL, NULL, &t, &st),
                     DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "encrypted"));
    assert_int_equal(dltls_new(true, NULL, cert, other, false, NULL, NULL, &t, &st),
                     DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "not the certificate's"));
    assert_null(t);
    free(cert);
    free(enc);
    free(other);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_both_ways_at_once),
        cmocka_unit_test(test_one_large_write_to_a_slow_reader),
        cmocka_unit_test(test_a_server_the_client_cannot_verify_is_refused),
        cmocka_unit_test(test_server_names),
        cmocka_unit_test(test_a_write_and_a_read_racing_into_the_handshake),
        cmocka_unit_test(test_a_required_client_certificate),
        cmocka_unit_test(test_garbage_instead_of_a_client_hello),
        cmocka_unit_test(test_a_read_times_out_and_a_shutdown_ends_one),
        cmocka_unit_test(test_records_read_ahead_make_an_idle_link_unfit),
        cmocka_unit_test(test_nng_tls_at_the_other_end),
        cmocka_unit_test(test_configurations_that_cannot_work),
        cmocka_unit_test(test_keys_that_cannot_be_used),
    };
    int rv = cmocka_run_group_tests(tests, setup, teardown);

    nng_fini();
    return rv;
}
