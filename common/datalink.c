/* The data link between workers: framing, the data port and its connections (see datalink.h).
 * Every connection has a thread of its own that blocks reading it (dlsock.h), never an nng
 * callback. */
#include "datalink.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/supplemental/util/platform.h>

#include "auth.h"
#include "dlsock.h"
#include "failinject.h"
#include "log.h"
#include "threadname.h"
#include "clock.h"

/* ---- the data port ----------------------------------------------------------------------- */

struct dlink_conn {
    struct dlink_server *srv;
    struct dlsock *sock;
    pthread_t thread;
    bool started;
    atomic_bool done;
    char peer[DLINK_ADDRESS_MAX + 1];
    struct dlink_conn *next;
    /* A call link (its HELLO showed the call secret) or a control link: the call's frame and
     * header, and whether its answer went out, set by dlink_call_answer under amtx. A control
     * link's answerer (the op's thread, or this one) writes the answer itself, so no hand-off
     * back to this thread delays it; a rank's is copied and written by this thread. */
    bool call;
    bool control; /* a control link (DLINK_HELLO_CONTROL): the coordinator's RPC frames */
    uint8_t *in;
    size_t in_cap;
    struct dlink_hdr ch;
    pthread_mutex_t amtx;
    pthread_cond_t acv;
    bool answered;
    bool answer_failed;
    /* A rank's answer, copied (or, dlink_call_answer_ref, referenced) for this connection's
     * thread to write: its answerer may hold the groups lock, and a rank slow to read must
     * not hold that up. */
    dc_code acode;
    uint8_t *out;
    size_t out_cap, out_len;
    const uint8_t *out_src;  /* what goes: out, a constant when out could not grow, or the
                              * answerer's own bytes (dlink_call_answer_ref) */
    void (*release)(void *); /* dlink_call_answer_ref's, once its bytes are written */
    void *release_arg;
};

/* For tests: the n-th growth of an answer's buffer from now on fails (failinject.h). */
static atomic_uint answer_fail_countdown;

void
dlink_answer_fail_after(unsigned n)
{
    atomic_store(&answer_fail_countdown, n);
}

struct dlink_server {
    struct dlsock_listener *listener;
    pthread_t accept_thread;
    bool accept_started;
    uint64_t max_frame;
    uint32_t handshake_ms;
    struct dlink_events ev;
    uint8_t secret[DLINK_SECRET_SIZE];
    uint8_t call_secret[DLINK_SECRET_SIZE];
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
    if ((rv = dlsock_recv_all(c->sock, &iov, 1, (nng_duration)s->handshake_ms)) != 0) {
        conn_refuse(c, rv == NNG_ETIMEDOUT ? "no HELLO in time" : nng_strerror(rv));
        return false;
    }
    if (dlink_hdr_decode(raw, s->max_frame, &h, &st) != DC_OK || h.kind != DLINK_HELLO) {
        conn_refuse(c, st.code != DC_OK ? st.message : "first frame is not HELLO");
        return false;
    }
    iov = (nng_iov){ hello, h.length };
    if ((rv = dlsock_recv_all(c->sock, &iov, 1, (nng_duration)s->handshake_ms)) != 0) {
        conn_refuse(c, "HELLO cut short");
        return false;
    }
    /* Both compared, whichever matches: the time taken says nothing of either. */
    c->call = auth_equal(hello, DLINK_SECRET_SIZE, s->call_secret, DLINK_SECRET_SIZE) &
              (s->ev.call != NULL);
    if (!auth_equal(hello, DLINK_SECRET_SIZE, s->secret, DLINK_SECRET_SIZE) && !c->call) {
        conn_refuse(c, "wrong secret in HELLO");
        return false;
    }
    /* A control link shows the peers' secret (the worker role's), not a rank's. */
    if ((h.flags & DLINK_HELLO_CONTROL) != 0) {
        if (c->call || s->ev.control == NULL) {
            conn_refuse(c, c->call ? "a control link with a call link's secret"
                                   : "control links are not taken here");
            return false;
        }
        c->control = true;
    }
    if (!c->call && !c->control && s->ev.frame_begin == NULL) {
        conn_refuse(c, "data connections are not taken here");
        return false;
    }
    snprintf(c->peer, sizeof(c->peer), "%.*s", (int)(h.length - DLINK_SECRET_SIZE),
             (const char *)hello + DLINK_SECRET_SIZE);
    return true;
}

/* The answer's header to the call in c->ch (code, then bytes of data) into raw. */
static void
conn_answer_header(const struct dlink_conn *c, dc_code code, size_t bytes,
                   uint8_t raw[DLINK_HDR_SIZE])
{
    struct dlink_hdr h = c->ch;

    h.kind   = DLINK_ANSWER;
    h.offset = (uint64_t)code;
    h.length = (uint32_t)bytes;
    h.total  = h.length;
    dlink_hdr_encode(&h, raw);
}

/* The time `bytes` may take to go or come once begun: the handshake bound, plus a
 * millisecond per kilobyte (a peer at 1 MB/s or more has time for any of them). */
static nng_duration
conn_bound(const struct dlink_conn *c, uint64_t bytes)
{
    uint64_t bound = c->srv->handshake_ms + bytes / 1000;

    return (nng_duration)(bound < INT32_MAX ? bound : INT32_MAX);
}

/* Reads (part of) a frame's payload, iov[0..n), by `until` (nng_clock), the frame being
 * `bytes` long: a peer that stops mid-frame, or trickles it, is dropped rather than holding
 * this thread and what the frame is read into. The wait for the next header has no bound (a
 * link may idle). nng's error or 0; *why says which. */
static int
conn_read_by(struct dlink_conn *c, nng_iov *iov, unsigned n, uint64_t bytes, nng_time until,
             dc_status *why)
{
    nng_time now = nng_clock();
    int rv =
        now < until ? dlsock_recv_all(c->sock, iov, n, (nng_duration)(until - now)) : NNG_ETIMEDOUT;

    if (rv == NNG_ETIMEDOUT) {
        status_set(why, DC_DEADLINE_EXCEEDED,
                   "a frame of %llu bytes did not come whole within %d ms of its header",
                   (unsigned long long)bytes, conn_bound(c, bytes));
        log_warn("data link: dropped the connection from %s: %s",
                 c->peer[0] != '\0' ? c->peer : "a peer without an address", why->message);
    } else if (rv != 0) {
        status_set(why, DC_UNAVAILABLE, "its data connection dropped mid-frame (%s)",
                   nng_strerror(rv));
    }
    return rv;
}

/* A whole frame's payload (`bytes`) within conn_bound. */
static int
conn_read(struct dlink_conn *c, nng_iov *iov, unsigned n, uint64_t bytes, dc_status *why)
{
    return conn_read_by(c, iov, n, bytes, nng_clock() + (nng_time)conn_bound(c, bytes), why);
}

/* Writes iov[0..n) within conn_bound: a caller that does not read its answer within it is
 * dropped. nng's error or 0. */
static int
conn_write(struct dlink_conn *c, nng_iov *iov, unsigned n)
{
    uint64_t bytes = 0;
    int rv;

    for (unsigned i = 0; i < n; i++) {
        bytes += iov[i].iov_len;
    }
    rv = dlsock_send_all(c->sock, iov, n, conn_bound(c, bytes));
    if (rv != 0) {
        log_info("call link: answer to %s not sent: %s", c->peer, nng_strerror(rv));
    }
    return rv;
}

/* Writes the answer to the call in c->ch: code, then bytes of data. nng's error or 0. */
static int
conn_answer_write(struct dlink_conn *c, dc_code code, const void *data, size_t bytes)
{
    uint8_t raw[DLINK_HDR_SIZE];
    nng_iov iov[2];

    conn_answer_header(c, code, bytes, raw);
    iov[0] = (nng_iov){ raw, sizeof(raw) };
    iov[1] = (nng_iov){ (void *)data, bytes };
    return conn_write(c, iov, bytes > 0 ? 2 : 1);
}

/* A control link's answer, written by its answerer as far as the socket takes it at once;
 * the rest (header included, if it did not go whole) is copied to c->out for the
 * connection's thread to write, so no answerer (an op's thread, maybe under its lock) waits
 * on a caller slow to read. amtx held. 0, or nng's error: the answer cannot go. */
static int
conn_control_answer_locked(struct dlink_conn *c, dc_code code, const void *data, size_t bytes)
{
    uint8_t raw[DLINK_HDR_SIZE];
    nng_iov iov[2];
    unsigned n  = bytes > 0 ? 2 : 1;
    size_t sent = 0, rest;
    int rv;

    conn_answer_header(c, code, bytes, raw);
    iov[0]     = (nng_iov){ raw, sizeof(raw) };
    iov[1]     = (nng_iov){ (void *)data, bytes };
    c->out_len = 0;
    if ((rv = dlsock_send_now(c->sock, iov, n, &sent)) != 0 && rv != NNG_ENOTSUP) {
        return rv;
    }
    if ((rest = sizeof(raw) + bytes - sent) == 0) {
        return 0;
    }
    if (rest > c->out_cap) {
        uint8_t *grow = failinject_hit(&answer_fail_countdown) ? NULL : realloc(c->out, rest);
        if (grow == NULL) {
            return NNG_ENOMEM;
        }
        c->out     = grow;
        c->out_cap = rest;
    }
    /* The unsent end of header then data. */
    if (sent < sizeof(raw)) {
        memcpy(c->out, raw + sent, sizeof(raw) - sent);
        if (bytes > 0) {
            memcpy(c->out + sizeof(raw) - sent, data, bytes);
        }
    } else {
        memcpy(c->out, (const uint8_t *)data + (sent - sizeof(raw)), rest);
    }
    c->out_src = c->out;
    c->out_len = rest;
    return 0;
}

void
dlink_call_answer(struct dlink_conn *c, const dc_status *st, const void *data, size_t bytes)
{
    char text[DLINK_ANSWER_ERROR_MAX];
    dc_code code = st != NULL ? st->code : DC_OK;
    int n, rv = 0;

    if (code != DC_OK) {
        /* The worker's name, a NUL, the message: cut to what the rank reads. */
        n     = snprintf(text, sizeof(text), "%s%c%s", st->worker, '\0', st->message);
        data  = text;
        bytes = n < 0 ? 0 : (size_t)n < sizeof(text) ? (size_t)n : sizeof(text) - 1;
    }
    if (c->control) {
        /* This connection's thread reads nothing until answered: its socket is free here. */
        pthread_mutex_lock(&c->amtx);
        rv               = conn_control_answer_locked(c, code, data, bytes);
        c->answer_failed = rv != 0;
        if (rv != 0) {
            log_info("call link: answer to %s not sent: %s", c->peer, nng_strerror(rv));
        }
    } else {
        /* No worker's name, a NUL, the message. */
        static const char oom[] = "\0out of memory for the answer";

        pthread_mutex_lock(&c->amtx);
        c->out_src = c->out;
        if (bytes > c->out_cap) {
            uint8_t *grow = failinject_hit(&answer_fail_countdown) ? NULL : realloc(c->out, bytes);
            if (grow == NULL) {
                /* Not into out, which may be smaller than even this text. */
                code       = DC_RESOURCE_EXHAUSTED;
                c->out_src = (const uint8_t *)oom;
                bytes      = sizeof(oom) - 1;
            } else {
                c->out     = grow;
                c->out_cap = bytes;
                c->out_src = grow;
            }
        }
        if (bytes > 0 && c->out_src == c->out) {
            memcpy(c->out, data, bytes);
        }
        c->out_len = bytes;
    }
    c->acode    = code;
    c->answered = true;
    pthread_cond_signal(&c->acv);
    pthread_mutex_unlock(&c->amtx);
}

void
dlink_call_answer_ref(struct dlink_conn *c, const void *data, size_t bytes, void (*release)(void *),
                      void *rel)
{
    if (c->control) {
        dlink_call_answer(c, NULL, data, bytes);
        release(rel);
        return;
    }
    pthread_mutex_lock(&c->amtx);
    c->out_src     = data;
    c->out_len     = bytes;
    c->release     = release;
    c->release_arg = rel;
    c->acode       = DC_OK;
    c->answered    = true;
    pthread_cond_signal(&c->acv);
    pthread_mutex_unlock(&c->amtx);
}

void
dlink_call_answer_frame(void *arg, const void *reply, size_t len)
{
    dc_status st;

    if (reply == NULL) {
        status_set(&st, DC_INTERNAL, "no reply could be made");
        dlink_call_answer(arg, &st, NULL, 0);
        return;
    }
    dlink_call_answer(arg, NULL, reply, len);
}

/* A call link: each DLINK_CALL is read whole, handed to ev.call (a control link's to
 * ev.control), and answered before the next is read. Any other frame, or one larger than
 * ev.call_max (ev.control_max), drops the connection. */
static void
conn_calls(struct dlink_conn *c)
{
    struct dlink_server *s = c->srv;
    uint64_t max           = c->control ? s->ev.control_max : s->ev.call_max;
    void *pin              = NULL; /* call_place's, until ev.call takes it */

    for (;;) {
        uint8_t raw[DLINK_HDR_SIZE];
        nng_iov iov[2] = { { raw, sizeof(raw) } };
        struct dlink_hdr h;
        dc_status why;
        uint8_t *data = NULL; /* call_place's, for the call's bytes */
        size_t in_len;
        bool failed;

        status_clear(&why);
        if (dlsock_recv_all(c->sock, iov, 1, NNG_DURATION_INFINITE) != 0) {
            return; /* the rank went: nothing is waiting on this connection */
        }
        if (dlink_hdr_decode(raw, max, &h, &why) != DC_OK || h.kind != DLINK_CALL ||
            (c->control && h.offset != 0)) {
            conn_refuse(c, why.code != DC_OK ? why.message : "call link: not a call frame");
            return;
        }
        /* The request into in; a call's bytes into the owner's buffer when it gives one. */
        in_len = h.length;
        if (!c->control && s->ev.call_place != NULL && h.length > h.offset) {
            in_len = (size_t)h.offset;
            if ((data = s->ev.call_place(s->ev.arg, h.length - in_len, &pin)) == NULL) {
                conn_refuse(c, "call link: out of memory for the call's bytes");
                return;
            }
        }
        if (in_len > c->in_cap) {
            uint8_t *grow = realloc(c->in, in_len);
            if (grow == NULL) {
                conn_refuse(c, "call link: out of memory");
                goto unpin;
            }
            c->in     = grow;
            c->in_cap = in_len;
        }
        iov[0] = (nng_iov){ c->in, in_len };
        iov[1] = (nng_iov){ data, h.length - in_len };
        if (conn_read(c, iov, data != NULL ? 2 : 1, h.length, &why) != 0) {
            log_info("call link: %s: %s", c->peer, why.message);
            goto unpin;
        }
        pthread_mutex_lock(&c->amtx);
        c->answered = false;
        c->release  = NULL;
        pthread_mutex_unlock(&c->amtx);
        c->ch = h;
        if (c->control) {
            s->ev.control(s->ev.arg, c, c->in, h.length);
        } else {
            s->ev.call(s->ev.arg, c, c->in, (size_t)h.offset,
                       data != NULL ? data : c->in + h.offset, h.length - (size_t)h.offset, pin);
            pin = NULL;
        }
        pthread_mutex_lock(&c->amtx);
        while (!c->answered) {
            pthread_cond_wait(&c->acv, &c->amtx);
        }
        failed = c->answer_failed;
        pthread_mutex_unlock(&c->amtx);
        if (!c->control && conn_answer_write(c, c->acode, c->out_src, c->out_len) != 0) {
            failed = true;
        } else if (c->control && !failed && c->out_len > 0) {
            nng_iov rest = { (void *)c->out_src, c->out_len }; /* the answer's unsent end */
            failed       = conn_write(c, &rest, 1) != 0;
        }
        if (c->release != NULL) {
            c->release(c->release_arg);
            c->release = NULL;
        }
        if (failed) {
            return;
        }
        /* Small calls keep their buffers; a large one's go back (a link per rank). */
        if (c->in_cap > DLINK_CHUNK) {
            free(c->in);
            c->in     = NULL;
            c->in_cap = 0;
        }
        if (c->out_cap > DLINK_CHUNK) {
            free(c->out);
            c->out     = NULL;
            c->out_cap = 0;
        }
    }
unpin:
    if (pin != NULL) {
        s->ev.call_unpin(s->ev.arg, pin);
    }
}

static void *
conn_main(void *arg)
{
    struct dlink_conn *c   = arg;
    struct dlink_server *s = c->srv;
    uint8_t *chunk         = NULL; /* for payloads nobody wants; only once one comes */
    bool authed            = false;
    dc_status why;

    thread_name_set("dc-link-rx");
    status_clear(&why);
    if (!(authed = conn_hello(c))) {
        goto out;
    }
    if (c->call || c->control) {
        authed = false; /* not a peer: its end is nobody's loss */
        conn_calls(c);
        goto out;
    }
    for (;;) {
        uint8_t raw[DLINK_HDR_SIZE];
        nng_iov iov = { raw, sizeof(raw) };
        struct dlink_hdr h;
        uint8_t *dst     = NULL;
        uint32_t wait_ms = 0;
        void *pin        = NULL;
        int rv;

        if ((rv = dlsock_recv_all(c->sock, &iov, 1, NNG_DURATION_INFINITE)) != 0) {
            status_set(&why, DC_UNAVAILABLE, "its data connection dropped (%s)", nng_strerror(rv));
            break;
        }
        if (dlink_hdr_decode(raw, s->max_frame, &h, &why) != DC_OK ||
            (h.kind != DLINK_DATA && h.kind != DLINK_PART)) {
            if (why.code == DC_OK) {
                status_set(&why, DC_INVALID_ARGUMENT, "data link: a frame of kind %u, not data",
                           h.kind);
            }
            conn_refuse(c, why.message);
            break;
        }
        if ((h.flags & DLINK_FLAG_OP) != 0 || h.kind == DLINK_PART) {
            /* An op's chunk or a small call's part: read into our own buffer, then the op or
             * the call takes it. */
            if (h.length > DLINK_CHUNK) {
                status_set(&why, DC_INVALID_ARGUMENT,
                           "data link: %s frame of %u bytes (at most %u)",
                           h.kind == DLINK_PART ? "part" : "op", h.length, DLINK_CHUNK);
                conn_refuse(c, why.message);
                break;
            }
            if (h.kind == DLINK_DATA && h.length > 0 && s->ev.op_place != NULL &&
                (dst = s->ev.op_place(s->ev.arg, c->peer, &h, &pin, &wait_ms)) != NULL) {
                /* Straight into the op's memory, no copy out of our buffer; within the op's
                 * deadline, as the op waits for the frame before it lets its buffer go. */
                bool took;

                iov  = (nng_iov){ dst, h.length };
                rv   = dlsock_recv_all(c->sock, &iov, 1, (nng_duration)wait_ms);
                took = s->ev.op_landed(s->ev.arg, c->peer, &h, pin, rv == 0, &why);
                if (rv == NNG_ETIMEDOUT) {
                    status_set(&why, DC_DEADLINE_EXCEEDED,
                               "an op frame of %u bytes did not come whole within its op's "
                               "deadline (%u ms)",
                               h.length, wait_ms);
                    break;
                }
                if (rv != 0) {
                    status_set(&why, DC_UNAVAILABLE, "its data connection dropped mid-frame (%s)",
                               nng_strerror(rv));
                    break;
                }
                if (!took) {
                    if (why.code == DC_OK) {
                        status_set(&why, DC_INVALID_ARGUMENT, "data link: an op frame refused");
                    }
                    conn_refuse(c, why.message);
                    break;
                }
                continue;
            }
            if (chunk == NULL && (chunk = malloc(DLINK_CHUNK)) == NULL) {
                status_set(&why, DC_RESOURCE_EXHAUSTED, "data link: out of memory");
                break;
            }
            iov = (nng_iov){ chunk, h.length };
            if (h.length > 0 && conn_read(c, &iov, 1, h.length, &why) != 0) {
                break;
            }
            if (h.kind == DLINK_PART) {
                if (s->ev.part == NULL || !s->ev.part(s->ev.arg, c->peer, &h, chunk, &why)) {
                    if (why.code == DC_OK) {
                        status_set(&why, DC_INVALID_ARGUMENT,
                                   "data link: a part frame, not taken here");
                    }
                    conn_refuse(c, why.message);
                    break;
                }
                continue;
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
        s->ev.frame_begin(s->ev.arg, c->peer, &h, &dst, &pin, &wait_ms);
        if (dst != NULL) {
            nng_time until = nng_clock() + (nng_time)conn_bound(c, h.length);
            if (wait_ms > 0 && nng_clock() + wait_ms < until) {
                until = nng_clock() + wait_ms; /* the owner's bound is shorter */
            }
            iov = (nng_iov){ dst, h.length };
            rv  = conn_read_by(c, &iov, 1, h.length, until, &why);
        } else if (h.length > 0 && chunk == NULL && (chunk = malloc(DLINK_CHUNK)) == NULL) {
            rv = NNG_ENOMEM;
            status_set(&why, DC_RESOURCE_EXHAUSTED, "data link: out of memory");
        } else {
            /* Nobody wants it: read it through the chunk buffer, all of it within the
             * frame's bound (not a fresh one per piece). */
            nng_time until = nng_clock() + (nng_time)conn_bound(c, h.length);
            for (size_t left = h.length; left > 0 && rv == 0;) {
                size_t n = left < DLINK_CHUNK ? left : DLINK_CHUNK;
                iov      = (nng_iov){ chunk, n };
                rv       = conn_read_by(c, &iov, 1, h.length, until, &why);
                left -= n;
            }
        }
        s->ev.frame_end(s->ev.arg, c->peer, &h, pin, rv == 0);
        if (rv != 0) {
            break;
        }
    }
out:
    free(chunk);
    pthread_mutex_lock(&s->mtx);
    authed = authed && !s->stopping;
    pthread_mutex_unlock(&s->mtx);
    if (authed && why.code != DC_OK && s->ev.peer_lost != NULL) {
        s->ev.peer_lost(s->ev.arg, c->peer, &why);
    }
    dlsock_shutdown(c->sock);
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
    dlsock_free(c->sock);
    pthread_cond_destroy(&c->acv);
    pthread_mutex_destroy(&c->amtx);
    free(c->out);
    free(c->in);
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

    thread_name_set("dc-link-accept");
    for (;;) {
        struct dlink_conn *c;
        struct dlsock *sock;
        int rv;

        if ((rv = dlsock_accept(s->listener, &sock)) != 0) {
            if (rv == NNG_ECLOSED) {
                return NULL;
            }
            nng_msleep(10);
            continue;
        }
        pthread_mutex_lock(&s->mtx);
        server_reap_locked(s);
        if (s->stopping || s->n_conns >= DLINK_MAX_CONNS || (c = calloc(1, sizeof(*c))) == NULL) {
            if (!s->stopping) {
                atomic_fetch_add(&s->refused, 1);
                log_warn("data link: refused a connection: %zu open already", s->n_conns);
            }
            pthread_mutex_unlock(&s->mtx);
            dlsock_free(sock);
            atomic_fetch_add(&s->finished, 1);
            continue;
        }
        c->srv  = s;
        c->sock = sock;
        pthread_mutex_init(&c->amtx, NULL);
        clock_cond_init(&c->acv);
        if (pthread_create(&c->thread, NULL, conn_main, c) != 0) {
            pthread_mutex_unlock(&s->mtx);
            dlsock_free(sock);
            pthread_cond_destroy(&c->acv);
            pthread_mutex_destroy(&c->amtx);
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
dlink_server_start(const char *url, struct dltls *tls, uint64_t max_frame, uint32_t handshake_ms,
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
    if ((code = auth_random_bytes(s->secret, sizeof(s->secret), st)) != DC_OK ||
        (code = auth_random_bytes(s->call_secret, sizeof(s->call_secret), st)) != DC_OK) {
        goto fail;
    }
    if ((rv = dlsock_listen(url, tls, &s->listener, &s->port)) != 0) {
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

const uint8_t *
dlink_server_call_secret(const struct dlink_server *s)
{
    return s->call_secret;
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
        dlsock_listener_close(s->listener);
    }
    if (s->accept_started) {
        pthread_join(s->accept_thread, NULL);
    }
    /* The accept thread is gone: the list is ours. Shutting a socket ends its thread's wait. */
    for (struct dlink_conn *c = s->conns; c != NULL; c = c->next) {
        dlsock_shutdown(c->sock);
    }
    while (s->conns != NULL) {
        struct dlink_conn *c = s->conns;
        s->conns             = c->next;
        conn_free(c);
    }
    dlsock_listener_free(s->listener);
    pthread_mutex_destroy(&s->mtx);
    free(s);
}
