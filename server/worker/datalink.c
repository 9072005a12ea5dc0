/* The data link between workers: framing, the data port and its connections (see datalink.h).
 * Every connection has a thread of its own that blocks on nng_aio_wait, never an nng callback. */
#include "datalink.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/supplemental/util/platform.h>

#include "auth.h"
#include "log.h"

/* ---- the data port ----------------------------------------------------------------------- */

struct dlink_conn {
    struct dlink_server *srv;
    nng_stream *stream;
    nng_aio *aio;
    pthread_t thread;
    bool started;
    atomic_bool done;
    char peer[DLINK_ADDRESS_MAX + 1];
    struct dlink_conn *next;
};

struct dlink_server {
    nng_stream_listener *listener;
    nng_aio *accept_aio;
    pthread_t accept_thread;
    bool accept_started;
    uint64_t max_frame;
    uint32_t handshake_ms;
    struct dlink_events ev;
    uint8_t secret[DLINK_SECRET_SIZE];
    int port;
    pthread_mutex_t mtx;
    bool stopping;
    struct dlink_conn *conns;
    size_t n_conns;
    atomic_uint_fast64_t refused;
    atomic_uint_fast64_t finished;
};

static void
conn_refuse(struct dlink_conn *c, const char *why)
{
    atomic_fetch_add(&c->srv->refused, 1);
    log_warn("data link: refused a connection%s%s: %s", c->peer[0] ? " from " : "", c->peer, why);
}

/* HELLO: the secret, then the sender's RPC address. */
static bool
conn_hello(struct dlink_conn *c)
{
    struct dlink_server *s = c->srv;
    uint8_t raw[DLINK_HDR_SIZE];
    uint8_t hello[DLINK_SECRET_SIZE + DLINK_ADDRESS_MAX];
    nng_iov iov = { raw, sizeof(raw) };
    struct dlink_hdr h;
    dc_status st;
    int rv;

    status_clear(&st);
    if ((rv = dlink_recv_all(c->stream, c->aio, &iov, 1, (nng_duration)s->handshake_ms)) != 0) {
        conn_refuse(c, rv == NNG_ETIMEDOUT ? "no HELLO in time" : nng_strerror(rv));
        return false;
    }
    if (dlink_hdr_decode(raw, s->max_frame, &h, &st) != DC_OK || h.kind != DLINK_HELLO) {
        conn_refuse(c, st.code != DC_OK ? st.message : "first frame is not HELLO");
        return false;
    }
    iov = (nng_iov){ hello, h.length };
    if ((rv = dlink_recv_all(c->stream, c->aio, &iov, 1, (nng_duration)s->handshake_ms)) != 0) {
        conn_refuse(c, "HELLO cut short");
        return false;
    }
    if (!auth_equal(hello, DLINK_SECRET_SIZE, s->secret, DLINK_SECRET_SIZE)) {
        conn_refuse(c, "wrong secret in HELLO");
        return false;
    }
    snprintf(c->peer, sizeof(c->peer), "%.*s", (int)(h.length - DLINK_SECRET_SIZE),
             (const char *)hello + DLINK_SECRET_SIZE);
    return true;
}

static void *
conn_main(void *arg)
{
    struct dlink_conn *c   = arg;
    struct dlink_server *s = c->srv;
    uint8_t *chunk         = NULL; /* for payloads nobody wants; only once one comes */
    bool authed            = false;
    dc_status why;

    status_clear(&why);
    if (!(authed = conn_hello(c))) {
        goto out;
    }
    for (;;) {
        uint8_t raw[DLINK_HDR_SIZE];
        nng_iov iov = { raw, sizeof(raw) };
        struct dlink_hdr h;
        uint8_t *dst = NULL;
        void *pin    = NULL;
        int rv;

        if ((rv = dlink_recv_all(c->stream, c->aio, &iov, 1, NNG_DURATION_INFINITE)) != 0) {
            status_set(&why, DC_UNAVAILABLE, "its data connection dropped (%s)", nng_strerror(rv));
            break;
        }
        if (dlink_hdr_decode(raw, s->max_frame, &h, &why) != DC_OK || h.kind != DLINK_DATA) {
            if (why.code == DC_OK) {
                status_set(&why, DC_INVALID_ARGUMENT, "data link: a second HELLO");
            }
            conn_refuse(c, why.message);
            break;
        }
        if ((h.flags & DLINK_FLAG_OP) != 0) {
            /* An op's chunk: read into our own buffer, then the op applies it. */
            if (h.length > DLINK_CHUNK) {
                status_set(&why, DC_INVALID_ARGUMENT,
                           "data link: op frame of %u bytes (at most %u)", h.length, DLINK_CHUNK);
                conn_refuse(c, why.message);
                break;
            }
            if (chunk == NULL && (chunk = malloc(DLINK_CHUNK)) == NULL) {
                status_set(&why, DC_RESOURCE_EXHAUSTED, "data link: out of memory");
                break;
            }
            iov = (nng_iov){ chunk, h.length };
            if (h.length > 0 &&
                (rv = dlink_recv_all(c->stream, c->aio, &iov, 1, NNG_DURATION_INFINITE)) != 0) {
                status_set(&why, DC_UNAVAILABLE, "its data connection dropped mid-frame (%s)",
                           nng_strerror(rv));
                break;
            }
            if (s->ev.op_frame == NULL || !s->ev.op_frame(s->ev.arg, c->peer, &h, chunk, &why)) {
                if (why.code == DC_OK) {
                    status_set(&why, DC_INVALID_ARGUMENT, "data link: an op frame, not taken here");
                }
                conn_refuse(c, why.message);
                break;
            }
            continue;
        }
        s->ev.frame_begin(s->ev.arg, c->peer, &h, &dst, &pin);
        if (dst != NULL) {
            iov = (nng_iov){ dst, h.length };
            rv  = dlink_recv_all(c->stream, c->aio, &iov, 1, NNG_DURATION_INFINITE);
        } else if (h.length > 0 && chunk == NULL && (chunk = malloc(DLINK_CHUNK)) == NULL) {
            rv = NNG_ENOMEM;
        } else {
            /* Nobody wants it: read it through the chunk buffer. */
            for (size_t left = h.length; left > 0 && rv == 0;) {
                size_t n = left < DLINK_CHUNK ? left : DLINK_CHUNK;
                iov      = (nng_iov){ chunk, n };
                rv       = dlink_recv_all(c->stream, c->aio, &iov, 1, NNG_DURATION_INFINITE);
                left -= n;
            }
        }
        s->ev.frame_end(s->ev.arg, c->peer, &h, pin, rv == 0);
        if (rv != 0) {
            status_set(&why, DC_UNAVAILABLE, "its data connection dropped mid-frame (%s)",
                       nng_strerror(rv));
            break;
        }
    }
out:
    free(chunk);
    pthread_mutex_lock(&s->mtx);
    authed = authed && !s->stopping;
    pthread_mutex_unlock(&s->mtx);
    if (authed && why.code != DC_OK) {
        s->ev.peer_lost(s->ev.arg, c->peer, &why);
    }
    nng_stream_close(c->stream);
    atomic_fetch_add(&s->finished, 1);
    atomic_store(&c->done, true);
    return NULL;
}

static void
conn_free(struct dlink_conn *c)
{
    if (c->started) {
        pthread_join(c->thread, NULL);
    }
    nng_stream_free(c->stream);
    nng_aio_free(c->aio);
    free(c);
}

/* Joins the connections whose thread ended. mtx held. */
static void
server_reap_locked(struct dlink_server *s)
{
    for (struct dlink_conn **pp = &s->conns; *pp != NULL;) {
        struct dlink_conn *c = *pp;
        if (atomic_load(&c->done)) {
            *pp = c->next;
            s->n_conns--;
            conn_free(c);
        } else {
            pp = &c->next;
        }
    }
}

static void *
accept_main(void *arg)
{
    struct dlink_server *s = arg;

    for (;;) {
        struct dlink_conn *c;
        nng_stream *stream;
        int rv;

        nng_stream_listener_accept(s->listener, s->accept_aio);
        nng_aio_wait(s->accept_aio);
        if ((rv = nng_aio_result(s->accept_aio)) != 0) {
            if (rv == NNG_ECLOSED || rv == NNG_ECANCELED) {
                return NULL;
            }
            nng_msleep(10);
            continue;
        }
        stream = nng_aio_get_output(s->accept_aio, 0);
        pthread_mutex_lock(&s->mtx);
        server_reap_locked(s);
        if (s->stopping || s->n_conns >= DLINK_MAX_CONNS || (c = calloc(1, sizeof(*c))) == NULL) {
            if (!s->stopping) {
                atomic_fetch_add(&s->refused, 1);
                log_warn("data link: refused a connection: %zu open already", s->n_conns);
            }
            pthread_mutex_unlock(&s->mtx);
            nng_stream_close(stream);
            nng_stream_free(stream);
            atomic_fetch_add(&s->finished, 1);
            continue;
        }
        c->srv    = s;
        c->stream = stream;
        if (nng_aio_alloc(&c->aio, NULL, NULL) != 0 ||
            pthread_create(&c->thread, NULL, conn_main, c) != 0) {
            pthread_mutex_unlock(&s->mtx);
            nng_stream_close(stream);
            nng_stream_free(stream);
            nng_aio_free(c->aio);
            free(c);
            atomic_fetch_add(&s->finished, 1);
            continue;
        }
        c->started = true;
        c->next    = s->conns;
        s->conns   = c;
        s->n_conns++;
        pthread_mutex_unlock(&s->mtx);
    }
}

dc_code
dlink_server_start(const char *url, nng_tls_config *tls, uint64_t max_frame, uint32_t handshake_ms,
                   const struct dlink_events *ev, struct dlink_server **out, dc_status *st)
{
    struct dlink_server *s = calloc(1, sizeof(*s));
    dc_code code           = DC_OK;
    int rv;

    *out = NULL;
    if (s == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    s->max_frame    = max_frame;
    s->handshake_ms = handshake_ms;
    s->ev           = *ev;
    pthread_mutex_init(&s->mtx, NULL);
    if ((code = auth_random_bytes(s->secret, sizeof(s->secret), st)) != DC_OK) {
        goto fail;
    }
    if ((rv = nng_stream_listener_alloc(&s->listener, url)) != 0 ||
        (tls != NULL &&
         (rv = nng_stream_listener_set_ptr(s->listener, NNG_OPT_TLS_CONFIG, tls)) != 0) ||
        (rv = nng_stream_listener_listen(s->listener)) != 0 ||
        (rv = nng_stream_listener_get_int(s->listener, NNG_OPT_TCP_BOUND_PORT, &s->port)) != 0 ||
        (rv = nng_aio_alloc(&s->accept_aio, NULL, NULL)) != 0) {
        code = status_set(st, DC_UNAVAILABLE, "cannot listen for the data link on %s: %s", url,
                          nng_strerror(rv));
        goto fail;
    }
    if (pthread_create(&s->accept_thread, NULL, accept_main, s) != 0) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "cannot start the data link's thread");
        goto fail;
    }
    s->accept_started = true;
    *out              = s;
    return DC_OK;
fail:
    dlink_server_free(s);
    return code;
}

int
dlink_server_port(const struct dlink_server *s)
{
    return s->port;
}

const uint8_t *
dlink_server_secret(const struct dlink_server *s)
{
    return s->secret;
}

uint64_t
dlink_server_refused(struct dlink_server *s)
{
    return atomic_load(&s->refused);
}

uint64_t
dlink_server_finished(struct dlink_server *s)
{
    return atomic_load(&s->finished);
}

void
dlink_server_free(struct dlink_server *s)
{
    if (s == NULL) {
        return;
    }
    pthread_mutex_lock(&s->mtx);
    s->stopping = true;
    pthread_mutex_unlock(&s->mtx);
    if (s->listener != NULL) {
        nng_stream_listener_close(s->listener);
    }
    if (s->accept_aio != NULL) {
        nng_aio_stop(s->accept_aio);
    }
    if (s->accept_started) {
        pthread_join(s->accept_thread, NULL);
    }
    /* The accept thread is gone: the list is ours. Closing a stream ends its thread's wait. */
    for (struct dlink_conn *c = s->conns; c != NULL; c = c->next) {
        nng_stream_close(c->stream);
    }
    while (s->conns != NULL) {
        struct dlink_conn *c = s->conns;
        s->conns             = c->next;
        conn_free(c);
    }
    nng_aio_free(s->accept_aio);
    nng_stream_listener_free(s->listener);
    pthread_mutex_destroy(&s->mtx);
    free(s);
}
