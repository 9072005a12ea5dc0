/* TLS for raw links on plain sockets, with OpenSSL (see dltls.h). */
#include "dltls.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <nng/supplemental/util/platform.h>

#include "clock.h"

struct dltls {
    atomic_uint holds;
    nng_tls_config *nng;
    SSL_CTX *ctx;
    char *server_name;
};

struct dltls_conn {
    struct dltls *t;
    int fd;
    pthread_mutex_t mtx; /* every call into ssl */
    SSL *ssl;
    int failed;  /* nng's error once the connection is unusable, else 0 */
    int sys_err; /* errno of the last socket call that failed */
};

/* TLS 1.2's AEAD suites with forward secrecy, as nng's mbedTLS offers them (so either end may
 * be nng's), AES-128-GCM first: OpenSSL 3.0 runs it at 3.8 GB/s a core here with AES-NI,
 * ChaCha20-Poly1305 at 4.4 (`openssl speed -evp`, 16 KiB), against 0.23 and 0.36 for
 * mbedTLS 2.28. */
static const char SUITES[] = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                             "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
                             "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384";

/* What the bytes a record layer reads ahead fit in: several records a read(2). */
#define READ_AHEAD_BYTES (256u << 10)

/* OpenSSL's first queued error as text (and the queue emptied). */
static const char *
ssl_error_text(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();

    if (e == 0) {
        snprintf(buf, len, "OpenSSL gave no reason");
    } else {
        ERR_error_string_n(e, buf, len);
    }
    ERR_clear_error();
    return buf;
}

static dc_code
pem_error(dc_status *st, const char *what)
{
    char msg[200];

    return status_set(st, DC_INVALID_ARGUMENT, "TLS: not a usable %s: %s", what,
                      ssl_error_text(msg, sizeof(msg)));
}

/* OpenSSL's passphrase callback: none is asked for (its default prompts on the terminal, or
 * reads stdin, and waits). */
static int
no_passphrase(char *buf, int size, int rwflag, void *arg)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)arg;
    return -1;
}

/* Every certificate in pem (at least one) into the context's trust store. */
static dc_code
load_ca(SSL_CTX *ctx, const char *pem, dc_status *st)
{
    X509_STORE *store = SSL_CTX_get_cert_store(ctx);
    BIO *b            = BIO_new_mem_buf(pem, -1);
    X509 *x;
    int n = 0;

    ERR_clear_error();
    if (b == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    while ((x = PEM_read_bio_X509(b, NULL, no_passphrase, NULL)) != NULL) {
        int ok = X509_STORE_add_cert(store, x);
        X509_free(x);
        if (!ok) {
            BIO_free(b);
            return pem_error(st, "CA certificate");
        }
        n++;
    }
    BIO_free(b);
    if (n == 0) {
        return pem_error(st, "CA certificate");
    }
    ERR_clear_error(); /* the end of the PEM text */
    return DC_OK;
}

/* The context's own certificate (the first in cert_pem, the others its chain) and key. */
static dc_code
load_own(SSL_CTX *ctx, const char *cert_pem, const char *key_pem, dc_status *st)
{
    BIO *b        = BIO_new_mem_buf(cert_pem, -1);
    EVP_PKEY *key = NULL;
    X509 *x;
    dc_code code = DC_OK;

    ERR_clear_error();
    if (b == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if ((x = PEM_read_bio_X509(b, NULL, no_passphrase, NULL)) == NULL) {
        BIO_free(b);
        return pem_error(st, "certificate");
    }
    if (!SSL_CTX_use_certificate(ctx, x)) {
        code = pem_error(st, "certificate");
    }
    while (code == DC_OK) {
        X509 *chain = PEM_read_bio_X509(b, NULL, no_passphrase, NULL);
        if (chain == NULL) {
            break;
        }
        if (!SSL_CTX_add0_chain_cert(ctx, chain)) {
            X509_free(chain);
            code = pem_error(st, "certificate chain");
        }
    }
    BIO_free(b);
    ERR_clear_error(); /* the end of the PEM text */
    if (code == DC_OK && (b = BIO_new_mem_buf(key_pem, -1)) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    } else if (code == DC_OK) {
        key = PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL);
        BIO_free(b);
        if (key == NULL && strstr(key_pem, "ENCRYPTED") != NULL) {
            ERR_clear_error();
            code =
                status_set(st, DC_INVALID_ARGUMENT,
                           "TLS: the key is encrypted: a key with a passphrase is not supported");
        } else if (key == NULL) {
            code = pem_error(st, "key");
        } else if (!X509_check_private_key(x, key)) {
            ERR_clear_error();
            code = status_set(st, DC_INVALID_ARGUMENT,
                              "TLS: the key is not the certificate's (their public keys differ)");
        } else if (!SSL_CTX_use_PrivateKey(ctx, key) || !SSL_CTX_check_private_key(ctx)) {
            code = pem_error(st, "certificate and key");
        }
    }
    EVP_PKEY_free(key);
    X509_free(x);
    return code;
}

/* Whether name is an IP address (sent as no server name: RFC 6066 names hosts only). */
static bool
is_ip_literal(const char *name)
{
    unsigned char addr[16];

    return inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1;
}

/* The server's certificate must name server_name (the SSL's app data: its connection) as a
 * DNS name (or as its common name when it has no subjectAltName), as nng's mbedTLS checks
 * it, or, for an IP address, as an IP address too. */
static int
verify_name(int ok, X509_STORE_CTX *x)
{
    SSL *ssl = X509_STORE_CTX_get_ex_data(x, SSL_get_ex_data_X509_STORE_CTX_idx());
    const struct dltls_conn *c = ssl != NULL ? SSL_get_app_data(ssl) : NULL;
    const char *name           = c != NULL ? c->t->server_name : NULL;
    X509 *cert                 = X509_STORE_CTX_get_current_cert(x);

    /* mbedTLS reads the common name only when the certificate has no subjectAltName at all,
     * and takes no partial wildcards (f*.example). */
    unsigned flags = X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS;

    if (!ok || name == NULL || X509_STORE_CTX_get_error_depth(x) != 0) {
        return ok;
    }
    if (cert != NULL && X509_get_ext_by_NID(cert, NID_subject_alt_name, -1) >= 0) {
        flags |= X509_CHECK_FLAG_NEVER_CHECK_SUBJECT;
    }
    if (cert == NULL || (X509_check_host(cert, name, 0, flags, NULL) != 1 &&
                         (!is_ip_literal(name) || X509_check_ip_asc(cert, name, 0) != 1))) {
        X509_STORE_CTX_set_error(x, X509_V_ERR_HOSTNAME_MISMATCH);
        return 0;
    }
    return 1;
}

dc_code
dltls_new(bool server, const char *ca_pem, const char *cert_pem, const char *key_pem,
          bool verify_peer, const char *server_name, nng_tls_config *nng, struct dltls **out,
          dc_status *st)
{
    struct dltls *t = calloc(1, sizeof(*t));
    dc_code code;

    *out = NULL;
    if (t == NULL) {
        if (nng != NULL) {
            nng_tls_config_free(nng);
        }
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    atomic_init(&t->holds, 1);
    t->nng = nng; /* dltls_free frees it from here on */
    /* Without a CA the server cannot be verified: refused rather than trusting anyone. */
    if (!server && ca_pem == NULL) {
        code = status_set(st, DC_INVALID_ARGUMENT,
                          "a tls+tcp:// dialer needs a CA certificate to verify the server");
        goto fail;
    }
    if (server_name != NULL && (t->server_name = strdup(server_name)) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    ERR_clear_error();
    if ((t->ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method())) == NULL ||
        !SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION) ||
        !SSL_CTX_set_max_proto_version(t->ctx, TLS1_2_VERSION) ||
        !SSL_CTX_set_cipher_list(t->ctx, SUITES)) {
        char msg[200];
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "TLS: cannot set up: %s",
                          ssl_error_text(msg, sizeof(msg)));
        goto fail;
    }
    /* No renegotiation, no sessions kept. (A peer's close without close_notify ends reads as
     * a close does, NNG_ECLOSED: our BIO says it is at no end of file, so OpenSSL answers
     * SSL_ERROR_SYSCALL with no errno; the data link's frames say where they end.) */
    SSL_CTX_set_options(t->ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_NO_TICKET);
    SSL_CTX_set_session_cache_mode(t->ctx, SSL_SESS_CACHE_OFF);
    /* A write takes a record at a time and may be retried from another place. */
    SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_read_ahead(t->ctx, 1);
    SSL_CTX_set_default_read_buffer_len(t->ctx, READ_AHEAD_BYTES);
    if (ca_pem != NULL && (code = load_ca(t->ctx, ca_pem, st)) != DC_OK) {
        goto fail;
    }
    if (cert_pem != NULL && key_pem != NULL &&
        (code = load_own(t->ctx, cert_pem, key_pem, st)) != DC_OK) {
        goto fail;
    }
    SSL_CTX_set_verify(t->ctx,
                       !server       ? SSL_VERIFY_PEER
                       : verify_peer ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
                                     : SSL_VERIFY_NONE,
                       server ? NULL : verify_name);
    *out = t;
    return DC_OK;
fail:
    dltls_free(t);
    return code;
}

struct dltls *
dltls_hold(struct dltls *t)
{
    atomic_fetch_add(&t->holds, 1);
    return t;
}

void
dltls_free(struct dltls *t)
{
    if (t == NULL || atomic_fetch_sub(&t->holds, 1) != 1) {
        return;
    }
    SSL_CTX_free(t->ctx);
    if (t->nng != NULL) {
        nng_tls_config_free(t->nng);
    }
    free(t->server_name);
    free(t);
}

nng_tls_config *
dltls_nng(const struct dltls *t)
{
    return t->nng;
}

/* ---- a connection ------------------------------------------------------------------------ */

/* The socket calls OpenSSL makes, through a BIO of our own: never waiting (the waits are
 * dltls_run's, unlocked), whatever the socket's mode. */
static int
bio_write(BIO *b, const char *buf, size_t len, size_t *written)
{
    struct dltls_conn *c = BIO_get_data(b);
    ssize_t r            = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);

    BIO_clear_retry_flags(b);
    if (r >= 0) {
        *written = (size_t)r;
        return 1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        BIO_set_retry_write(b);
    } else {
        c->sys_err = errno;
    }
    return 0;
}

static int
bio_read(BIO *b, char *buf, size_t len, size_t *got)
{
    struct dltls_conn *c = BIO_get_data(b);
    ssize_t r            = recv(c->fd, buf, len, MSG_DONTWAIT);

    BIO_clear_retry_flags(b);
    if (r > 0) {
        *got = (size_t)r;
        return 1;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        BIO_set_retry_read(b);
    } else if (r < 0) {
        c->sys_err = errno;
    }
    return 0; /* r == 0: the peer closed */
}

static long
bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0; /* nothing is buffered here */
}

static int
bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static void
bio_method_make(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "devcoord dlsock");

    if (m != NULL && BIO_meth_set_write_ex(m, bio_write) && BIO_meth_set_read_ex(m, bio_read) &&
        BIO_meth_set_ctrl(m, bio_ctrl) && BIO_meth_set_create(m, bio_create)) {
        bio_method = m;
    } else if (m != NULL) {
        BIO_meth_free(m);
    }
}

struct dltls_conn *
dltls_conn_new(struct dltls *t, int fd)
{
    struct dltls_conn *c = calloc(1, sizeof(*c));
    BIO *bio             = NULL;

    if (c == NULL || pthread_once(&bio_once, bio_method_make) != 0 || bio_method == NULL) {
        free(c);
        return NULL;
    }
    if ((c->ssl = SSL_new(t->ctx)) == NULL || (bio = BIO_new(bio_method)) == NULL ||
        (t->server_name != NULL && !is_ip_literal(t->server_name) &&
         !SSL_set_tlsext_host_name(c->ssl, t->server_name))) {
        BIO_free(bio);
        SSL_free(c->ssl);
        ERR_clear_error();
        free(c);
        return NULL;
    }
    BIO_set_data(bio, c);
    SSL_set_app_data(c->ssl, c);   /* verify_name's */
    SSL_set_bio(c->ssl, bio, bio); /* the SSL owns it now */
    if (SSL_is_server(c->ssl)) {   /* as its context's method says */
        SSL_set_accept_state(c->ssl);
    } else {
        SSL_set_connect_state(c->ssl);
    }
    c->t  = dltls_hold(t);
    c->fd = fd;
    pthread_mutex_init(&c->mtx, NULL);
    return c;
}

void
dltls_conn_free(struct dltls_conn *c)
{
    if (c == NULL) {
        return;
    }
    SSL_free(c->ssl);
    pthread_mutex_destroy(&c->mtx);
    dltls_free(c->t);
    free(c);
}

/* nng's error for OpenSSL's answer err to a call (not a WANT_*). mtx held. */
static int
conn_error(const struct dltls_conn *c, int err)
{
    switch (err) {
    case SSL_ERROR_ZERO_RETURN:
        return NNG_ECLOSED;
    case SSL_ERROR_SYSCALL:
        return c->sys_err == 0            ? NNG_ECLOSED /* the peer closed mid-handshake */
               : c->sys_err == ECONNRESET ? NNG_ECONNRESET
               : c->sys_err == EPIPE      ? NNG_ECONNSHUT
                                          : NNG_ESYSERR | c->sys_err;
    default:
        return SSL_get_verify_result(c->ssl) != X509_V_OK ? NNG_EPEERAUTH : NNG_ECRYPTO;
    }
}

enum tls_step { STEP_HANDSHAKE, STEP_RECV, STEP_SEND };

/* How long a write that waits for the handshake's input polls before it looks again. */
#define HANDSHAKE_SLICE_MS 10

/* One step under the lock, then waits for the socket outside it, until the step is done. */
static int
dltls_run(struct dltls_conn *c, enum tls_step step, uint8_t *buf, size_t len, size_t *done,
          nng_time start, nng_duration timeout, const atomic_bool *closed)
{
    for (;;) {
        struct pollfd p = { .fd = c->fd };
        nng_duration left;
        int ret, rv;

        if (closed != NULL && atomic_load(closed)) {
            return NNG_ECLOSED;
        }
        pthread_mutex_lock(&c->mtx);
        if ((rv = c->failed) == 0) {
            ERR_clear_error(); /* SSL_get_error reads this thread's queue */
            ret = step == STEP_HANDSHAKE ? SSL_do_handshake(c->ssl)
                  : step == STEP_RECV    ? SSL_read_ex(c->ssl, buf, len, done)
                                         : SSL_write_ex(c->ssl, buf, len, done);
            if (ret != 1) {
                int err = SSL_get_error(c->ssl, ret);
                if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
                    p.events = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
                } else {
                    rv = c->failed = conn_error(c, err);
                }
                ERR_clear_error();
            }
        }
        pthread_mutex_unlock(&c->mtx);
        if (rv != 0 || p.events == 0) {
            return rv;
        }
        if ((left = clock_left_ms(start, timeout, nng_clock())) == 0) {
            if (step != STEP_RECV) {
                /* Part of a record or of the handshake may have gone: the stream is cut. */
                pthread_mutex_lock(&c->mtx);
                c->failed = c->failed != 0 ? c->failed : NNG_ETIMEDOUT;
                pthread_mutex_unlock(&c->mtx);
            }
            return NNG_ETIMEDOUT;
        }
        if (step != STEP_RECV && p.events == POLLIN && (left < 0 || left > HANDSHAKE_SLICE_MS)) {
            /* A write (or dltls_handshake) waits for the handshake's input: a read of the other
             * thread may take that input and end the handshake meanwhile, leaving nothing to
             * wake this poll. It looks again every slice. */
            left = HANDSHAKE_SLICE_MS;
        }
        /* dlsock_shutdown's shutdown(2) wakes it (the socket reads its end). */
        do {
            rv = poll(&p, 1, (int)left);
        } while (rv < 0 && errno == EINTR);
        if (rv < 0) {
            return NNG_ESYSERR | errno;
        }
    }
}

int
dltls_handshake(struct dltls_conn *c, nng_time start, nng_duration timeout,
                const atomic_bool *closed)
{
    size_t done;

    return dltls_run(c, STEP_HANDSHAKE, NULL, 0, &done, start, timeout, closed);
}

int
dltls_recv(struct dltls_conn *c, uint8_t *buf, size_t len, size_t *done, nng_time start,
           nng_duration timeout, const atomic_bool *closed)
{
    *done = 0;
    return dltls_run(c, STEP_RECV, buf, len, done, start, timeout, closed);
}

int
dltls_send(struct dltls_conn *c, const uint8_t *buf, size_t len, size_t *done, nng_time start,
           nng_duration timeout, const atomic_bool *closed)
{
    *done = 0;
    return dltls_run(c, STEP_SEND, (uint8_t *)buf, len, done, start, timeout, closed);
}

bool
dltls_pending(struct dltls_conn *c)
{
    bool pending;

    pthread_mutex_lock(&c->mtx);
    pending = SSL_has_pending(c->ssl) != 0;
    pthread_mutex_unlock(&c->mtx);
    return pending;
}
