#include "handshake.h"

#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "clock.h"
#include "log.h"
#include "rpc.h"
#include "threadname.h"

#define SCAN_MS 500

/* A peer's address as both nng and the kernel can give it: family, address, port. */
struct peer_key {
    int family; /* AF_INET or AF_INET6 */
    uint16_t port;
    uint8_t addr[16];
};

struct pending {
    int fd;
    struct peer_key peer;
    uint64_t first_seen_ms;
    bool seen; /* in the current scan */
};

struct handshake_watch {
    uint16_t port;
    uint32_t limit_ms;
    bool started;
    pthread_t thread;
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    bool stopping;
    /* Remote ends of live pipes (a multiset: counts in use), and their pipe ids, by which
     * they go. Guarded by mtx. */
    struct peer_key *pipes;
    uint32_t *pipe_ids;
    size_t n_pipes, cap_pipes;
    /* Accepted sockets not yet pipes, as of the last scan. The watch thread's own. */
    struct pending *pending;
    size_t n_pending, cap_pending;
    uint64_t reaped;
};

static bool
peer_from_nng(const nng_sockaddr *sa, struct peer_key *k)
{
    memset(k, 0, sizeof(*k));
    if (sa->s_family == NNG_AF_INET) {
        k->family = AF_INET;
        k->port   = sa->s_in.sa_port;
        memcpy(k->addr, &sa->s_in.sa_addr, 4);
        return true;
    }
    if (sa->s_family == NNG_AF_INET6) {
        k->family = AF_INET6;
        k->port   = sa->s_in6.sa_port;
        memcpy(k->addr, sa->s_in6.sa_addr, 16);
        return true;
    }
    return false;
}

/* The local port and the peer of socket fd; false for anything but a connected TCP/IP
 * socket. Ports stay in network byte order, as nng keeps them. */
static bool
peer_from_fd(int fd, uint16_t *local_port, struct peer_key *k)
{
    struct sockaddr_storage ss;
    socklen_t len  = sizeof(ss);
    int listening  = 0;
    socklen_t ilen = sizeof(listening);

    memset(k, 0, sizeof(*k));
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ilen) != 0 || listening) {
        return false;
    }
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        return false;
    }
    if (ss.ss_family == AF_INET) {
        *local_port = ((struct sockaddr_in *)&ss)->sin_port;
    } else if (ss.ss_family == AF_INET6) {
        *local_port = ((struct sockaddr_in6 *)&ss)->sin6_port;
    } else {
        return false;
    }
    len = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) {
        return false;
    }
    k->family = ss.ss_family;
    if (ss.ss_family == AF_INET) {
        k->port = ((struct sockaddr_in *)&ss)->sin_port;
        memcpy(k->addr, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    } else {
        k->port = ((struct sockaddr_in6 *)&ss)->sin6_port;
        memcpy(k->addr, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
    }
    return true;
}

static bool
peer_equal(const struct peer_key *a, const struct peer_key *b)
{
    return a->family == b->family && a->port == b->port && memcmp(a->addr, b->addr, 16) == 0;
}

/* Whether a live pipe has this remote end. w->mtx held. */
static bool
is_pipe_locked(const struct handshake_watch *w, const struct peer_key *k)
{
    for (size_t i = 0; i < w->n_pipes; i++) {
        if (peer_equal(&w->pipes[i], k)) {
            return true;
        }
    }
    return false;
}

void
handshake_watch_pipe(struct handshake_watch *w, uint32_t id, const nng_sockaddr *remote, bool up)
{
    struct peer_key k;

    if (w == NULL || (up && (remote == NULL || !peer_from_nng(remote, &k)))) {
        return;
    }
    pthread_mutex_lock(&w->mtx);
    if (up) {
        if (w->n_pipes == w->cap_pipes) {
            size_t cap             = w->cap_pipes ? w->cap_pipes * 2 : 64;
            struct peer_key *grown = realloc(w->pipes, cap * sizeof(*grown));
            uint32_t *ids = grown != NULL ? realloc(w->pipe_ids, cap * sizeof(*ids)) : NULL;
            if (grown != NULL) {
                w->pipes = grown; /* a larger block is as good */
            }
            if (ids == NULL) {
                /* Unrecorded, the pipe's socket looks like a stalled handshake: log it. */
                pthread_mutex_unlock(&w->mtx);
                log_warn("handshake watch: out of memory recording a connection");
                return;
            }
            w->pipe_ids  = ids;
            w->cap_pipes = cap;
        }
        w->pipe_ids[w->n_pipes] = id;
        w->pipes[w->n_pipes++]  = k;
    } else {
        for (size_t i = 0; i < w->n_pipes; i++) {
            if (w->pipe_ids[i] == id) {
                w->n_pipes--;
                w->pipes[i]    = w->pipes[w->n_pipes];
                w->pipe_ids[i] = w->pipe_ids[w->n_pipes];
                break;
            }
        }
    }
    pthread_mutex_unlock(&w->mtx);
}

static struct pending *
pending_find(struct handshake_watch *w, int fd, const struct peer_key *k)
{
    for (size_t i = 0; i < w->n_pending; i++) {
        if (w->pending[i].fd == fd && peer_equal(&w->pending[i].peer, k)) {
            return &w->pending[i];
        }
    }
    return NULL;
}

/* One look at every descriptor: accepted sockets that are not pipes are pending since the
 * scan that first saw them; past the limit they are shut down. */
static void
handshake_scan(struct handshake_watch *w)
{
    uint64_t now = rpc_now_ms();
    DIR *dir     = opendir("/proc/self/fd");
    struct dirent *e;

    if (dir == NULL) {
        return;
    }
    for (size_t i = 0; i < w->n_pending; i++) {
        w->pending[i].seen = false;
    }
    while ((e = readdir(dir)) != NULL) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        struct stat sb;
        struct peer_key k;
        struct pending *p;
        uint16_t port;
        bool piped;

        if (*end != '\0' || end == e->d_name || fd < 0 || fd > 1 << 24 || fd == dirfd(dir) ||
            fstat((int)fd, &sb) != 0 || !S_ISSOCK(sb.st_mode) ||
            !peer_from_fd((int)fd, &port, &k) || port != w->port) {
            continue;
        }
        pthread_mutex_lock(&w->mtx);
        piped = is_pipe_locked(w, &k);
        pthread_mutex_unlock(&w->mtx);
        if (piped) {
            continue;
        }
        if ((p = pending_find(w, (int)fd, &k)) == NULL) {
            if (w->n_pending == w->cap_pending) {
                size_t cap           = w->cap_pending ? w->cap_pending * 2 : 64;
                struct pending *more = realloc(w->pending, cap * sizeof(*more));
                if (more == NULL) {
                    continue;
                }
                w->pending     = more;
                w->cap_pending = cap;
            }
            p                = &w->pending[w->n_pending++];
            p->fd            = (int)fd;
            p->peer          = k;
            p->first_seen_ms = now;
        }
        p->seen = true;
        if (now - p->first_seen_ms >= w->limit_ms) {
            /* shutdown, not close: the descriptor is nng's, and it is the one to close it. */
            shutdown((int)fd, SHUT_RDWR);
            pthread_mutex_lock(&w->mtx);
            w->reaped++;
            pthread_mutex_unlock(&w->mtx);
            log_warn("closed a connection on port %u that did not finish its TLS handshake "
                     "within %u ms",
                     (unsigned)ntohs(w->port), w->limit_ms);
            p->seen = false; /* forgotten: a reused descriptor starts anew */
        }
    }
    closedir(dir);
    for (size_t i = 0; i < w->n_pending;) {
        if (!w->pending[i].seen) {
            w->pending[i] = w->pending[--w->n_pending];
        } else {
            i++;
        }
    }
}

static void *
handshake_watch_run(void *arg)
{
    struct handshake_watch *w = arg;

    thread_name_set("dc-handshake");
    pthread_mutex_lock(&w->mtx);
    while (!w->stopping) {

        pthread_mutex_unlock(&w->mtx);
        handshake_scan(w);
        pthread_mutex_lock(&w->mtx);
        if (!w->stopping) {
            clock_cond_wait_ms(&w->cv, &w->mtx, SCAN_MS);
        }
    }
    pthread_mutex_unlock(&w->mtx);
    return NULL;
}

struct handshake_watch *
handshake_watch_new(uint32_t limit_ms)
{
    struct handshake_watch *w = calloc(1, sizeof(*w));

    if (w == NULL) {
        return NULL;
    }
    w->limit_ms = limit_ms;
    pthread_mutex_init(&w->mtx, NULL);
    clock_cond_init(&w->cv);
    return w;
}

bool
handshake_watch_start(struct handshake_watch *w, uint16_t port)
{
    w->port    = htons(port);
    w->started = pthread_create(&w->thread, NULL, handshake_watch_run, w) == 0;
    return w->started;
}

size_t
handshake_watch_pipes(struct handshake_watch *w)
{
    size_t n;

    pthread_mutex_lock(&w->mtx);
    n = w->n_pipes;
    pthread_mutex_unlock(&w->mtx);
    return n;
}

uint64_t
handshake_watch_reaped(struct handshake_watch *w)
{
    uint64_t n;

    pthread_mutex_lock(&w->mtx);
    n = w->reaped;
    pthread_mutex_unlock(&w->mtx);
    return n;
}

void
handshake_watch_stop(struct handshake_watch *w)
{
    if (w == NULL) {
        return;
    }
    pthread_mutex_lock(&w->mtx);
    w->stopping = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mtx);
    if (w->started) {
        pthread_join(w->thread, NULL);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mtx);
    free(w->pipes);
    free(w->pipe_ids);
    free(w->pending);
    free(w);
}
