/* TLS for raw links on plain sockets, with mbedTLS (see dltls.h). */
#include "dltls.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crt.h>

#include <nng/supplemental/util/platform.h>

#include "clock.h"

struct dltls {
    atomic_uint holds;
    nng_tls_config *nng;
    mbedtls_ssl_config conf;
    mbedtls_x509_crt ca, own;
    mbedtls_pk_context key;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg; /* locks itself (MBEDTLS_THREADING_C, as Debian builds it) */
    char *server_name;
};

struct dltls_conn {
    struct dltls *t;
    int fd;
    pthread_mutex_t mtx; /* every call into ssl */
    mbedtls_ssl_context ssl;
    int failed;  /* nng's error once the connection is unusable, else 0 */
    int sys_err; /* errno of the last socket call that failed */
};

/* AEAD suites with forward secrecy, ChaCha20-Poly1305 first: mbedTLS 2.28 runs it at 0.36
 * GB/s a core here, AES-128-GCM at 0.23 (its GCM takes one block at a time, AES-NI or not). */
static const int SUITES[] = {
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    MBEDTLS_TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    MBEDTLS_TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    MBEDTLS_TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    0,
};

static dc_code
pem_error(dc_status *st, const char *what, int ret)
{
    char msg[160];

    mbedtls_strerror(ret, msg, sizeof(msg));
    return status_set(st, DC_INVALID_ARGUMENT, "TLS: not a usable %s: %s", what, msg);
}

dc_code
dltls_new(bool server, const char *ca_pem, const char *cert_pem, const char *key_pem,
          bool verify_peer, const char *server_name, nng_tls_config *nng, struct dltls **out,
          dc_status *st)
{
    static const char personal[] = "devcoord data link";
    struct dltls *t              = calloc(1, sizeof(*t));
    dc_code code                 = DC_OK;
    int ret;

    *out = NULL;
    /* Without a CA the server cannot be verified: refused rather than trusting anyone. */
    if (!server && ca_pem == NULL) {
        code = status_set(st, DC_INVALID_ARGUMENT,
                          "a tls+tcp:// dialer needs a CA certificate to verify the server");
    } else if (t == NULL ||
               (server_name != NULL && (t->server_name = strdup(server_name)) == NULL)) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (code != DC_OK) {
        free(t);
        if (nng != NULL) {
            nng_tls_config_free(nng);
        }
        return code;
    }
    atomic_init(&t->holds, 1);
    t->nng = nng;
    mbedtls_ssl_config_init(&t->conf);
    mbedtls_x509_crt_init(&t->ca);
    mbedtls_x509_crt_init(&t->own);
    mbedtls_pk_init(&t->key);
    mbedtls_entropy_init(&t->entropy);
    mbedtls_ctr_drbg_init(&t->drbg);
    if ((ret = mbedtls_ctr_drbg_seed(&t->drbg, mbedtls_entropy_func, &t->entropy,
                                     (const unsigned char *)personal, sizeof(personal) - 1)) != 0 ||
        (ret = mbedtls_ssl_config_defaults(
             &t->conf, server ? MBEDTLS_SSL_IS_SERVER : MBEDTLS_SSL_IS_CLIENT,
             MBEDTLS_SSL_TRANSPORT_STREAM, MBEDTLS_SSL_PRESET_DEFAULT)) != 0) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "TLS: cannot set up (-0x%04x)", -ret);
        goto fail;
    }
    mbedtls_ssl_conf_rng(&t->conf, mbedtls_ctr_drbg_random, &t->drbg);
    mbedtls_ssl_conf_min_version(&t->conf, MBEDTLS_SSL_MAJOR_VERSION_3,
                                 MBEDTLS_SSL_MINOR_VERSION_3);
    mbedtls_ssl_conf_max_version(&t->conf, MBEDTLS_SSL_MAJOR_VERSION_3,
                                 MBEDTLS_SSL_MINOR_VERSION_3);
    mbedtls_ssl_conf_ciphersuites(&t->conf, SUITES);
    mbedtls_ssl_conf_renegotiation(&t->conf, MBEDTLS_SSL_RENEGOTIATION_DISABLED);
    if (ca_pem != NULL) {
        if ((ret = mbedtls_x509_crt_parse(&t->ca, (const unsigned char *)ca_pem,
                                          strlen(ca_pem) + 1)) != 0) {
            code = pem_error(st, "CA certificate", ret);
            goto fail;
        }
        mbedtls_ssl_conf_ca_chain(&t->conf, &t->ca, NULL);
    }
    if (cert_pem != NULL && key_pem != NULL) {
        if ((ret = mbedtls_x509_crt_parse(&t->own, (const unsigned char *)cert_pem,
                                          strlen(cert_pem) + 1)) != 0) {
            code = pem_error(st, "certificate", ret);
            goto fail;
        }
        if ((ret = mbedtls_pk_parse_key(&t->key, (const unsigned char *)key_pem,
                                        strlen(key_pem) + 1, NULL, 0)) != 0) {
            code = pem_error(st, "key", ret);
            goto fail;
        }
        if ((ret = mbedtls_ssl_conf_own_cert(&t->conf, &t->own, &t->key)) != 0) {
            code = pem_error(st, "certificate and key", ret);
            goto fail;
        }
    }
    mbedtls_ssl_conf_authmode(&t->conf, !server || verify_peer ? MBEDTLS_SSL_VERIFY_REQUIRED
                                                               : MBEDTLS_SSL_VERIFY_NONE);
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
    mbedtls_ssl_config_free(&t->conf);
    mbedtls_x509_crt_free(&t->ca);
    mbedtls_x509_crt_free(&t->own);
    mbedtls_pk_free(&t->key);
    mbedtls_ctr_drbg_free(&t->drbg);
    mbedtls_entropy_free(&t->entropy);
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

/* The socket calls mbedTLS makes: never waiting (the waits are dltls_run's, unlocked). */
static int
bio_send(void *arg, const unsigned char *buf, size_t len)
{
    struct dltls_conn *c = arg;
    ssize_t r            = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);

    if (r >= 0) {
        return (int)r;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        return MBEDTLS_ERR_SSL_WANT_WRITE;
    }
    c->sys_err = errno;
    return MBEDTLS_ERR_NET_SEND_FAILED;
}

static int
bio_recv(void *arg, unsigned char *buf, size_t len)
{
    struct dltls_conn *c = arg;
    ssize_t r            = recv(c->fd, buf, len, MSG_DONTWAIT);

    if (r >= 0) {
        return (int)r; /* 0: the peer closed (mbedTLS: MBEDTLS_ERR_SSL_CONN_EOF) */
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        return MBEDTLS_ERR_SSL_WANT_READ;
    }
    c->sys_err = errno;
    return MBEDTLS_ERR_NET_RECV_FAILED;
}

struct dltls_conn *
dltls_conn_new(struct dltls *t, int fd)
{
    struct dltls_conn *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        return NULL;
    }
    mbedtls_ssl_init(&c->ssl);
    if (mbedtls_ssl_setup(&c->ssl, &t->conf) != 0 ||
        (t->server_name != NULL && mbedtls_ssl_set_hostname(&c->ssl, t->server_name) != 0)) {
        mbedtls_ssl_free(&c->ssl);
        free(c);
        return NULL;
    }
    c->t  = dltls_hold(t);
    c->fd = fd;
    pthread_mutex_init(&c->mtx, NULL);
    mbedtls_ssl_set_bio(&c->ssl, c, bio_send, bio_recv, NULL);
    return c;
}

void
dltls_conn_free(struct dltls_conn *c)
{
    if (c == NULL) {
        return;
    }
    mbedtls_ssl_free(&c->ssl);
    pthread_mutex_destroy(&c->mtx);
    dltls_free(c->t);
    free(c);
}

/* nng's error for mbedTLS's ret (not a WANT_*). mtx held. */
static int
conn_error(const struct dltls_conn *c, int ret)
{
    switch (ret) {
    case MBEDTLS_ERR_SSL_CONN_EOF:
    case MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY:
        return NNG_ECLOSED;
    case MBEDTLS_ERR_NET_SEND_FAILED:
    case MBEDTLS_ERR_NET_RECV_FAILED:
        return c->sys_err == ECONNRESET ? NNG_ECONNRESET
               : c->sys_err == EPIPE    ? NNG_ECONNSHUT
                                        : NNG_ESYSERR | c->sys_err;
    case MBEDTLS_ERR_X509_CERT_VERIFY_FAILED:
        return NNG_EPEERAUTH;
    default:
        return NNG_ECRYPTO;
    }
}

enum tls_step { STEP_HANDSHAKE, STEP_RECV, STEP_SEND };

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
            ret = step == STEP_HANDSHAKE ? mbedtls_ssl_handshake(&c->ssl)
                  : step == STEP_RECV    ? mbedtls_ssl_read(&c->ssl, buf, len)
                                         : mbedtls_ssl_write(&c->ssl, buf, len);
            if (ret >= 0 && step == STEP_RECV && ret == 0) {
                ret = MBEDTLS_ERR_SSL_CONN_EOF;
            }
            if (ret >= 0) {
                *done = (size_t)ret;
            } else if (ret == MBEDTLS_ERR_SSL_WANT_READ || ret == MBEDTLS_ERR_SSL_WANT_WRITE) {
                p.events = ret == MBEDTLS_ERR_SSL_WANT_READ ? POLLIN : POLLOUT;
            } else {
                rv = c->failed = conn_error(c, ret);
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
