/* A raw link's connection: a plain socket, or an nng stream (see dlsock.h). */
#define _GNU_SOURCE /* accept4 */
#include "dlsock.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <nng/supplemental/util/platform.h>

#include "address.h"
#include "auth.h"
#include "clock.h"
#include "dltls.h"

/* The bound on resolving a listener's host name (a dial's is its own bound). */
#define LISTEN_RESOLVE_MS 10000

/* Scatter/gather entries handed to one system call (callers pass at most three). */
#define IOV_MAX_PER_CALL 8

struct dlsock {
    int fd;             /* a plain socket, or -1 */
    atomic_bool closed; /* dlsock_shutdown came (plain) */
    nng_stream *stream; /* else */
    nng_aio *aio;
    nng_aio *idle; /* the nng kind's idle watch: a one-byte read, made on first use */
    bool idle_on;
    uint8_t idle_byte;
    nng_duration rcvtimeo;  /* the plain socket's SO_RCVTIMEO, ms (0: none) */
    struct dltls_conn *tls; /* a plain socket's TLS (tls+tcp:// to a numeric address) */
};

struct dlsock_listener {
    int fd; /* a plain listening socket, or -1 */
    atomic_bool closed;
    nng_stream_listener *listener; /* else */
    nng_aio *aio;
    struct dltls *tls; /* for the plain listener's connections (a hold), or NULL */
};

/* ---- addresses --------------------------------------------------------------------------- */

/* The addresses a url's host stands for, in the resolver's order: a dial tries them in turn
 * (a name may stand for an IPv6 address first and the peer listen on IPv4 only), a listener
 * takes the first. */
#define ADDRS_MAX 8

struct addrs {
    struct sockaddr_storage ss[ADDRS_MAX];
    socklen_t len[ADDRS_MAX];
    unsigned n;
};

static void
addrs_take(struct addrs *a, const struct addrinfo *res)
{
    for (a->n = 0; res != NULL && a->n < ADDRS_MAX; res = res->ai_next) {
        if (res->ai_addr != NULL && res->ai_addrlen <= sizeof(a->ss[0])) {
            memcpy(&a->ss[a->n], res->ai_addr, res->ai_addrlen);
            a->len[a->n++] = res->ai_addrlen;
        }
    }
}

/* What resolves names (getaddrinfo, unless a test set another). */
static _Atomic(dlsock_resolve_fn) resolver = getaddrinfo;

void
dlsock_set_resolver(dlsock_resolve_fn fn)
{
    atomic_store(&resolver, fn != NULL ? fn : getaddrinfo);
}

/* Names being resolved, each on a thread of its own that the dial may stop waiting for:
 * getaddrinfo has no bound of its own (a DNS server that does not answer holds it for seconds
 * per try). At most DLSOCK_RESOLVE_MAX at once, so a process that keeps dialling names that
 * hang does not keep adding threads; a dial waits for a place within its bound. One lock and
 * one condition for all of them: a resolution's end frees a place and may answer a dial. */
static struct {
    pthread_mutex_t mtx;
    pthread_cond_t cv; /* a resolution ended */
    unsigned running;
} resolving                          = { .mtx = PTHREAD_MUTEX_INITIALIZER };
static pthread_once_t resolving_once = PTHREAD_ONCE_INIT;

static void
resolving_init(void)
{
    clock_cond_init(&resolving.cv);
}

/* A name's resolution, shared by the dial and the thread; the last to let go frees it. */
struct resolve {
    unsigned holds; /* 2, then 1 once the dial or the thread lets go (resolving.mtx) */
    bool done;
    char host[ADDRESS_MAX + 1], port[8];
    struct addrs addrs; /* none: not resolved */
};

/* resolving.mtx held. */
static void
resolve_let_go(struct resolve *r)
{
    if (--r->holds == 0) {
        free(r);
    }
}

static void *
resolve_main(void *arg)
{
    struct resolve *r     = arg;
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct addrinfo *res  = NULL;
    int rv                = atomic_load(&resolver)(r->host, r->port, &hints, &res);

    pthread_mutex_lock(&resolving.mtx);
    resolving.running--;
    if (rv == 0) {
        addrs_take(&r->addrs, res);
    }
    r->done = true;
    pthread_cond_broadcast(&resolving.cv);
    resolve_let_go(r);
    pthread_mutex_unlock(&resolving.mtx);
    if (res != NULL) {
        freeaddrinfo(res);
    }
    return NULL;
}

/* Waits on resolving.cv (its mutex held) until `until`, or for good when timeout < 0; false
 * once the bound has passed. */
static bool
resolving_wait(nng_duration timeout, const struct timespec *until)
{
    if (timeout < 0) {
        pthread_cond_wait(&resolving.cv, &resolving.mtx);
        return true;
    }
    return pthread_cond_timedwait(&resolving.cv, &resolving.mtx, until) != ETIMEDOUT;
}

/* host's addresses for port, resolved within timeout ms (< 0: no bound): 0; -2 when the
 * bound passed first (waiting for a place among the resolutions under way included); -1 when
 * it did not resolve (or no thread could be had). */
static int
resolve_bounded(const char *host, const char *port, nng_duration timeout, struct addrs *out)
{
    struct resolve *r = calloc(1, sizeof(*r));
    struct timespec until;
    pthread_attr_t attr;
    pthread_t t;
    bool started;
    int rv = -2;

    if (r == NULL || strlen(host) >= sizeof(r->host) || strlen(port) >= sizeof(r->port)) {
        free(r);
        return -1;
    }
    r->holds = 2;
    snprintf(r->host, sizeof(r->host), "%s", host);
    snprintf(r->port, sizeof(r->port), "%s", port);
    until = clock_deadline_ms(timeout >= 0 ? (uint64_t)timeout : 0);
    pthread_once(&resolving_once, resolving_init);
    pthread_mutex_lock(&resolving.mtx);
    while (resolving.running >= DLSOCK_RESOLVE_MAX) {
        if (!resolving_wait(timeout, &until)) {
            pthread_mutex_unlock(&resolving.mtx);
            free(r);
            return -2;
        }
    }
    resolving.running++;
    pthread_mutex_unlock(&resolving.mtx);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    started = pthread_create(&t, &attr, resolve_main, r) == 0;
    pthread_attr_destroy(&attr);
    pthread_mutex_lock(&resolving.mtx);
    if (!started) {
        resolving.running--;
        pthread_cond_broadcast(&resolving.cv);
        pthread_mutex_unlock(&resolving.mtx);
        free(r);
        return -1;
    }
    while (!r->done && resolving_wait(timeout, &until)) {
    }
    if (r->done) {
        rv = r->addrs.n > 0 ? 0 : -1;
        if (rv == 0) {
            *out = r->addrs;
        }
    }
    resolve_let_go(r);
    pthread_mutex_unlock(&resolving.mtx);
    return rv;
}

/* The addresses of a "tcp://host:port" url, "tls+tcp://host:port" when tls (host: an IPv4 or
 * bracketed IPv6 address, "localhost", or a name resolved within timeout ms; empty or "*"
 * for any when passive): 0; -1 when url is anything else (another scheme) or its name did
 * not resolve, and it goes to nng; -2 when the name's resolution took all of timeout. */
static int
plain_addr(const char *url, bool tls, bool passive, nng_duration timeout, struct addrs *out)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
                              .ai_flags    = AI_NUMERICHOST | AI_NUMERICSERV };
    struct addrinfo *res  = NULL;
    const char *port      = strrchr(url, ':');
    char h[ADDRESS_MAX + 1];
    int rv;

    if (tls && strncmp(url, "tls+", 4) == 0) {
        url += 4;
    } else if (tls) {
        return -1;
    }
    if (strncmp(url, "tcp://", 6) != 0 || port == NULL || !address_port_valid(port + 1)) {
        return -1;
    }
    auth_url_host(url, h, sizeof(h));
    if (strcmp(h, "localhost") == 0) {
        snprintf(h, sizeof(h), "127.0.0.1");
    }
    if (h[0] == '\0' || strcmp(h, "*") == 0) {
        if (!passive) {
            return -1;
        }
        hints.ai_flags |= AI_PASSIVE;
        hints.ai_family = AF_INET;
    }
    if ((rv = getaddrinfo(hints.ai_flags & AI_PASSIVE ? NULL : h, port + 1, &hints, &res)) != 0) {
        /* Not a numeric address: a name. */
        return rv == EAI_NONAME ? resolve_bounded(h, port + 1, timeout, out) : -1;
    }
    addrs_take(out, res);
    freeaddrinfo(res);
    return out->n > 0 ? 0 : -1;
}

/* nng's code for errno e. */
static int
nng_code(int e)
{
    switch (e) {
    case ECONNREFUSED:
        return NNG_ECONNREFUSED;
    case ECONNRESET:
        return NNG_ECONNRESET;
    case EPIPE:
    case ESHUTDOWN:
        return NNG_ECONNSHUT;
    case ETIMEDOUT:
        return NNG_ETIMEDOUT;
    case ENOMEM:
    case ENOBUFS:
        return NNG_ENOMEM;
    case EMFILE:
    case ENFILE:
        return NNG_ENOFILES;
    case EADDRINUSE:
        return NNG_EADDRINUSE;
    case ENETUNREACH:
    case EHOSTUNREACH:
        return NNG_EUNREACHABLE;
    default:
        return NNG_ESYSERR | e;
    }
}

/* Waits until fd is ready for events, up to timeout. 0, NNG_ETIMEDOUT or an error. */
static int
plain_wait(int fd, short events, nng_duration timeout)
{
    struct pollfd p = { .fd = fd, .events = events };
    int rv;

    do {
        rv = poll(&p, 1, timeout < 0 ? -1 : (int)timeout);
    } while (rv < 0 && errno == EINTR);
    if (rv < 0) {
        return nng_code(errno);
    }
    return rv == 0 ? NNG_ETIMEDOUT : 0;
}

/* Drops the first `done` bytes of iov[0..*n), advancing iov. */
static nng_iov *
iov_advance(nng_iov *iov, unsigned *n, size_t done)
{
    while (*n > 0 && done >= iov[0].iov_len) {
        done -= iov[0].iov_len;
        iov++;
        (*n)--;
    }
    if (*n > 0) {
        iov[0].iov_buf = (uint8_t *)iov[0].iov_buf + done;
        iov[0].iov_len -= done;
    }
    return iov;
}

static unsigned
iov_copy(struct iovec *out, const nng_iov *iov, unsigned n)
{
    unsigned k = n < IOV_MAX_PER_CALL ? n : IOV_MAX_PER_CALL;

    for (unsigned i = 0; i < k; i++) {
        out[i] = (struct iovec){ iov[i].iov_buf, iov[i].iov_len };
    }
    return k;
}

/* The milliseconds left of `timeout` counted from `start` (clock_left_ms): 0 once it has
 * passed; NNG_DURATION_INFINITE stays so. */
static nng_duration
time_left(nng_time start, nng_duration timeout)
{
    return clock_left_ms(start, timeout, nng_clock());
}

/* Sets the plain socket's SO_RCVTIMEO to ms (> 0) rounded up to 100 ms, unless it is that
 * already: bounds that shrink by the millisecond (an op's deadline) cost no system call per
 * read. A read then ends up to 100 ms past its bound; plain_io checks the bound after it. */
static int
plain_rcvtimeo(struct dlsock *s, nng_duration ms)
{
    struct timeval tv;

    ms = ms < INT32_MAX - 99 ? (ms + 99) / 100 * 100 : ms;
    if (s->rcvtimeo == ms) {
        return 0;
    }
    tv = (struct timeval){ .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
    if (setsockopt(s->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
        return nng_code(errno);
    }
    s->rcvtimeo = ms;
    return 0;
}

/* *done (when not NULL) counts the bytes that went, whatever the outcome. */
static int
plain_io(struct dlsock *s, bool recv, nng_iov *iov, unsigned n, nng_duration timeout, size_t *done)
{
    nng_time start    = nng_clock();
    nng_duration left = timeout;

    while (n > 0) {
        struct iovec v[IOV_MAX_PER_CALL];
        struct msghdr m = { .msg_iov = v, .msg_iovlen = iov_copy(v, iov, n) };
        ssize_t r;
        int rv;

        if (atomic_load(&s->closed)) {
            return NNG_ECLOSED;
        }
        /* A read waits in the kernel for all it asks (one wake-up per part, not per
         * segment); bounded, the kernel ends it at what is left of the bound (SO_RCVTIMEO,
         * which an unbounded read after it outlasts by polling). A bounded write, and a read
         * bounded 0, take what goes at once and then poll. */
        if (recv && timeout > 0) {
            if ((rv = plain_rcvtimeo(s, left)) != 0) {
                return rv;
            }
            r = recvmsg(s->fd, &m, MSG_WAITALL);
        } else if (recv) {
            r = recvmsg(s->fd, &m, timeout < 0 ? MSG_WAITALL : MSG_DONTWAIT);
        } else {
            r = sendmsg(s->fd, &m, MSG_NOSIGNAL | (timeout < 0 ? 0 : MSG_DONTWAIT));
        }
        if (r > 0) {
            iov = iov_advance(iov, &n, (size_t)r);
            if (done != NULL) {
                *done += (size_t)r;
            }
            if (n > 0 && recv && timeout > 0 && (left = time_left(start, timeout)) == 0) {
                return NNG_ETIMEDOUT;
            }
            continue;
        }
        if (r == 0) {
            return NNG_ECLOSED; /* the peer closed, or dlsock_shutdown */
        }
        if (errno == EINTR) {
            if (timeout > 0 && (left = time_left(start, timeout)) == 0) {
                return NNG_ETIMEDOUT;
            }
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            return atomic_load(&s->closed) ? NNG_ECLOSED : nng_code(errno);
        }
        if ((left = time_left(start, timeout)) == 0) {
            return NNG_ETIMEDOUT;
        }
        if ((rv = plain_wait(s->fd, recv ? POLLIN : POLLOUT, left)) != 0) {
            return rv;
        }
    }
    return 0;
}

static int
stream_io(struct dlsock *s, bool recv, nng_iov *iov, unsigned n, nng_duration timeout)
{
    nng_time start    = nng_clock();
    nng_duration left = timeout;

    while (n > 0) {
        size_t done;
        int rv;

        nng_aio_set_timeout(s->aio, left);
        if ((rv = nng_aio_set_iov(s->aio, n, iov)) != 0) {
            return rv;
        }
        if (recv) {
            nng_stream_recv(s->stream, s->aio);
        } else {
            nng_stream_send(s->stream, s->aio);
        }
        nng_aio_wait(s->aio);
        if ((rv = nng_aio_result(s->aio)) != 0) {
            return rv;
        }
        if ((done = nng_aio_count(s->aio)) == 0) {
            return NNG_ECLOSED;
        }
        iov = iov_advance(iov, &n, done);
        if (n > 0 && (left = time_left(start, timeout)) == 0) {
            return NNG_ETIMEDOUT;
        }
    }
    return 0;
}

/* Through the socket's TLS: a record at a time, each part's bytes read straight into it. */
static int
tls_io(struct dlsock *s, bool recv, nng_iov *iov, unsigned n, nng_duration timeout)
{
    nng_time start = nng_clock();

    while (n > 0) {
        size_t done;
        int rv;

        if (iov[0].iov_len == 0) {
            iov++;
            n--;
            continue;
        }
        rv = recv ? dltls_recv(s->tls, iov[0].iov_buf, iov[0].iov_len, &done, start, timeout,
                               &s->closed)
                  : dltls_send(s->tls, iov[0].iov_buf, iov[0].iov_len, &done, start, timeout,
                               &s->closed);
        if (rv != 0) {
            return rv;
        }
        iov = iov_advance(iov, &n, done);
    }
    return 0;
}

static int
sock_io(struct dlsock *s, bool recv, nng_iov *iov, unsigned n, nng_duration timeout)
{
    /* Empty parts first are done at once (nng would read nothing for them and take that for
     * the peer closing). */
    while (n > 0 && iov[0].iov_len == 0) {
        iov++;
        n--;
    }
    return s->tls != NULL ? tls_io(s, recv, iov, n, timeout)
           : s->fd >= 0   ? plain_io(s, recv, iov, n, timeout, NULL)
                          : stream_io(s, recv, iov, n, timeout);
}

int
dlsock_recv_all(struct dlsock *s, nng_iov *iov, unsigned n, nng_duration timeout)
{
    return sock_io(s, true, iov, n, timeout);
}

int
dlsock_send_all(struct dlsock *s, nng_iov *iov, unsigned n, nng_duration timeout)
{
    return sock_io(s, false, iov, n, timeout);
}

int
dlsock_send_now(struct dlsock *s, const nng_iov *iov, unsigned n, size_t *sent)
{
    nng_iov left[IOV_MAX_PER_CALL]; /* plain_io advances what it is given */
    int rv;

    *sent = 0;
    if (s->fd < 0 || s->tls != NULL || n > IOV_MAX_PER_CALL) {
        return NNG_ENOTSUP;
    }
    memcpy(left, iov, n * sizeof(*iov));
    rv = plain_io(s, false, left, n, 0, sent); /* bound 0: what goes at once */
    return rv == NNG_ETIMEDOUT ? 0 : rv;
}

/* ---- connections ------------------------------------------------------------------------- */

static struct dlsock *
sock_new(int fd, nng_stream *stream)
{
    struct dlsock *s = calloc(1, sizeof(*s));

    if (s == NULL) {
        return NULL;
    }
    s->fd = fd;
    atomic_init(&s->closed, false);
    if (fd < 0 && nng_aio_alloc(&s->aio, NULL, NULL) != 0) {
        free(s);
        return NULL;
    }
    s->stream = stream;
    return s;
}

/* *out for a plain socket fd, or NNG_ENOMEM (fd closed). */
static int
sock_of_fd(int fd, struct dlsock **out)
{
    if ((*out = sock_new(fd, NULL)) == NULL) {
        close(fd);
        return NNG_ENOMEM;
    }
    return 0;
}

/* *out for an nng stream, or NNG_ENOMEM (the stream closed and freed). */
static int
sock_of_stream(nng_stream *stream, struct dlsock **out)
{
    if ((*out = sock_new(-1, stream)) == NULL) {
        nng_stream_close(stream);
        nng_stream_free(stream);
        return NNG_ENOMEM;
    }
    return 0;
}

/* Keepalive probes: a peer silent this long after an idle connection's last byte is probed
 * every KEEPALIVE_INTERVAL_S, and given up after KEEPALIVE_PROBES unanswered (~50 s). */
#define KEEPALIVE_IDLE_S     30
#define KEEPALIVE_INTERVAL_S 5
#define KEEPALIVE_PROBES     4

static void
nodelay(int fd)
{
    int one = 1, idle = KEEPALIVE_IDLE_S, intvl = KEEPALIVE_INTERVAL_S, cnt = KEEPALIVE_PROBES;

    /* A link carries frames one way at a time, so the peer's ACKs ride on nothing and are
     * delayed (40 ms on Linux): with Nagle on, a small frame behind one not yet acknowledged
     * would wait for that. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* A reader waits for the next frame without a bound, and the receiving end of a one-way
     * link never writes: without probes, a peer whose host died or was cut off would hold
     * the connection, its thread and what its frame pinned for good. */
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

static int
plain_dial(const struct sockaddr_storage *ss, socklen_t len, uint32_t timeout_ms, int *out)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), rv = 0;
    int err        = 0;
    socklen_t elen = sizeof(err);

    if (fd < 0) {
        return nng_code(errno);
    }
    if (connect(fd, (const struct sockaddr *)ss, len) != 0) {
        if (errno != EINPROGRESS) {
            rv = nng_code(errno);
        } else if ((rv = plain_wait(fd, POLLOUT, (nng_duration)timeout_ms)) == 0) {
            /* Writable: connected, or failed with the error SO_ERROR holds. */
            rv = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 ? nng_code(errno)
                 : err != 0                                             ? nng_code(err)
                                                                        : 0;
        }
    }
    if (rv == 0 && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        rv = nng_code(errno);
    }
    if (rv != 0) {
        close(fd);
        return rv;
    }
    nodelay(fd);
    *out = fd;
    return 0;
}

/* s's TLS, as a dialer (handshake within what is left of the dial's bound) or an acceptor
 * (handshake at the first read); s freed on failure. */
static int
sock_tls(struct dlsock **s, struct dltls *tls, bool dialer, nng_time start, uint32_t timeout_ms)
{
    int rv = 0;

    if (((*s)->tls = dltls_conn_new(tls, (*s)->fd)) == NULL) {
        rv = NNG_ENOMEM;
    } else if (dialer) {
        rv = dltls_handshake((*s)->tls, start, (nng_duration)timeout_ms, &(*s)->closed);
    }
    if (rv != 0) {
        dlsock_free(*s);
        *s = NULL;
    }
    return rv;
}

int
dlsock_dial(const char *url, struct dltls *tls, uint32_t timeout_ms, struct dlsock **out)
{
    struct addrs a;
    nng_stream_dialer *d = NULL;
    nng_aio *aio         = NULL;
    nng_time start       = nng_clock();
    nng_duration left;
    int fd = -1, rv;

    *out = NULL;
    if ((rv = plain_addr(url, tls != NULL, false, (nng_duration)timeout_ms, &a)) == -2) {
        return NNG_ETIMEDOUT; /* nng's resolver, the same getaddrinfo, would not do better */
    }
    if (rv == 0) {
        /* Each address in turn, with what is left of the bound: a refused one costs nothing,
         * one that does not answer may take all of it. The last one's error. */
        rv = NNG_ETIMEDOUT;
        for (unsigned i = 0; i < a.n; i++) {
            left = time_left(start, (nng_duration)timeout_ms);
            if (left <= 0) {
                rv = NNG_ETIMEDOUT;
                break;
            }
            if ((rv = plain_dial(&a.ss[i], a.len[i], (uint32_t)left, &fd)) == 0) {
                break;
            }
        }
        if (rv != 0 || (rv = sock_of_fd(fd, out)) != 0) {
            return rv;
        }
        return tls != NULL ? sock_tls(out, tls, true, start, timeout_ms) : 0;
    }
    if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0 ||
        (rv = nng_stream_dialer_alloc(&d, url)) != 0 ||
        (tls != NULL &&
         (rv = nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, dltls_nng(tls))) != 0)) {
        goto out;
    }
    (void)nng_stream_dialer_set_bool(d, NNG_OPT_TCP_NODELAY, true);
    (void)nng_stream_dialer_set_bool(d, NNG_OPT_TCP_KEEPALIVE, true); /* the system's timing */
    /* What is left of the bound (a name that failed to resolve took some of it). */
    left = time_left(start, (nng_duration)timeout_ms);
    nng_aio_set_timeout(aio, left > 0 ? left : 1);
    nng_stream_dialer_dial(d, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio)) == 0) {
        rv = sock_of_stream(nng_aio_get_output(aio, 0), out);
    }
out:
    nng_stream_dialer_free(d);
    nng_aio_free(aio);
    return rv;
}

void
dlsock_idle_begin(struct dlsock *s)
{
    nng_iov iov = { &s->idle_byte, 1 };

    if (s->fd >= 0 || s->idle_on || (s->idle == NULL && nng_aio_alloc(&s->idle, NULL, NULL) != 0)) {
        return; /* a plain socket is polled at idle_end; else no watch: nothing found wrong */
    }
    nng_aio_set_timeout(s->idle, NNG_DURATION_INFINITE);
    if (nng_aio_set_iov(s->idle, 1, &iov) != 0) {
        return;
    }
    s->idle_on = true;
    nng_stream_recv(s->stream, s->idle);
}

bool
dlsock_idle_end(struct dlsock *s)
{
    if (s->fd >= 0) {
        /* Anything to read (a byte, the peer's close, an error, records TLS read ahead)
         * makes the link unfit. */
        struct pollfd p = { .fd = s->fd, .events = POLLIN };
        int rv;

        while ((rv = poll(&p, 1, 0)) < 0 && errno == EINTR) {
        }
        return rv == 0 && !atomic_load(&s->closed) && (s->tls == NULL || !dltls_pending(s->tls));
    }
    if (!s->idle_on) {
        return true;
    }
    s->idle_on = false;
    nng_aio_cancel(s->idle);
    nng_aio_wait(s->idle);
    return nng_aio_result(s->idle) == NNG_ECANCELED;
}

bool
dlsock_is_plain(const struct dlsock *s)
{
    return s->fd >= 0 && s->tls == NULL;
}

void
dlsock_shutdown(struct dlsock *s)
{
    if (s == NULL) {
        return;
    }
    if (s->fd >= 0) {
        /* Wakes a read or poll under way on another thread; the descriptor stays ours until
         * dlsock_free, so no other connection can take its number meanwhile. */
        atomic_store(&s->closed, true);
        (void)shutdown(s->fd, SHUT_RDWR);
    } else if (s->stream != NULL) {
        nng_stream_close(s->stream);
    }
}

void
dlsock_free(struct dlsock *s)
{
    if (s == NULL) {
        return;
    }
    dltls_conn_free(s->tls);
    if (s->fd >= 0) {
        close(s->fd);
    }
    if (s->idle != NULL) {
        nng_aio_stop(s->idle);
    }
    if (s->stream != NULL) {
        nng_stream_close(s->stream);
        nng_stream_free(s->stream);
    }
    nng_aio_free(s->idle);
    nng_aio_free(s->aio);
    free(s);
}

/* ---- listening --------------------------------------------------------------------------- */

int
dlsock_listen(const char *url, struct dltls *tls, struct dlsock_listener **out, int *port)
{
    struct dlsock_listener *l = calloc(1, sizeof(*l));
    struct sockaddr_storage ss;
    struct addrs a;
    socklen_t len;
    int rv = 0, one = 1;

    *out = NULL;
    if (l == NULL) {
        return NNG_ENOMEM;
    }
    l->fd = -1;
    atomic_init(&l->closed, false);
    if (plain_addr(url, tls != NULL, true, LISTEN_RESOLVE_MS, &a) == 0) {
        ss     = a.ss[0];
        len    = a.len[0];
        l->tls = tls != NULL ? dltls_hold(tls) : NULL;
        if ((l->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
            setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
            bind(l->fd, (struct sockaddr *)&ss, len) != 0 || listen(l->fd, 128) != 0 ||
            getsockname(l->fd, (struct sockaddr *)&ss, &len) != 0) {
            rv = nng_code(errno);
            goto fail;
        }
        *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
        *out  = l;
        return 0;
    }
    if ((rv = nng_stream_listener_alloc(&l->listener, url)) != 0) {
        goto fail;
    }
    /* Keepalive as for plain sockets (nodelay), on the system's timing: best effort. */
    (void)nng_stream_listener_set_bool(l->listener, NNG_OPT_TCP_KEEPALIVE, true);
    if ((tls != NULL && (rv = nng_stream_listener_set_ptr(l->listener, NNG_OPT_TLS_CONFIG,
                                                          dltls_nng(tls))) != 0) ||
        (rv = nng_stream_listener_listen(l->listener)) != 0 ||
        (rv = nng_stream_listener_get_int(l->listener, NNG_OPT_TCP_BOUND_PORT, port)) != 0 ||
        (rv = nng_aio_alloc(&l->aio, NULL, NULL)) != 0) {
        goto fail;
    }
    *out = l;
    return 0;
fail:
    dlsock_listener_free(l);
    return rv;
}

int
dlsock_accept(struct dlsock_listener *l, struct dlsock **out)
{
    int rv;

    *out = NULL;
    if (l->fd >= 0) {
        for (;;) {
            int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) {
                nodelay(fd);
                return (rv = sock_of_fd(fd, out)) != 0 || l->tls == NULL
                           ? rv
                           : sock_tls(out, l->tls, false, 0, 0);
            }
            if (atomic_load(&l->closed)) {
                return NNG_ECLOSED;
            }
            if (errno != EINTR && errno != ECONNABORTED) {
                return nng_code(errno);
            }
        }
    }
    nng_stream_listener_accept(l->listener, l->aio);
    nng_aio_wait(l->aio);
    if ((rv = nng_aio_result(l->aio)) == 0 && atomic_load(&l->closed)) {
        /* Accepted just as the listener closed: not handed out, not leaked. */
        nng_stream *stream = nng_aio_get_output(l->aio, 0);
        nng_stream_close(stream);
        nng_stream_free(stream);
    }
    if (atomic_load(&l->closed)) {
        return NNG_ECLOSED; /* whatever nng says of a stopped aio */
    }
    return rv != 0 ? rv : sock_of_stream(nng_aio_get_output(l->aio, 0), out);
}

void
dlsock_listener_close(struct dlsock_listener *l)
{
    atomic_store(&l->closed, true);
    if (l->fd >= 0) {
        (void)shutdown(l->fd, SHUT_RDWR); /* wakes accept4 (EINVAL) */
    } else if (l->listener != NULL) {
        nng_stream_listener_close(l->listener);
        if (l->aio != NULL) {
            nng_aio_stop(l->aio);
        }
    }
}

void
dlsock_listener_free(struct dlsock_listener *l)
{
    if (l == NULL) {
        return;
    }
    if (l->fd >= 0) {
        close(l->fd);
    }
    dltls_free(l->tls);
    nng_aio_free(l->aio);
    nng_stream_listener_free(l->listener);
    free(l);
}
