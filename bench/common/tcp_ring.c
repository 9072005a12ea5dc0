/* A bare TCP ring of a ring all-reduce's bytes (issue 17). A ring of P ranks on P workers moves
 * 2 (P - 1) / P of the buffer out of every worker and as much in, all at once; on one machine
 * every byte crosses loopback TCP, whose cost (two copies and the stack, on the same cores as
 * the reduce) bounds the collective's time. This probe moves exactly those bytes between P
 * forked processes with blocking send and recv, nothing else: a multi-worker row read against
 * it says how much of its time the transfer alone takes, in the same run. It is a reference,
 * not a hard floor (a transport with other buffer sizes or write patterns can beat it a little:
 * the 2-worker group call does). */
#include "tcp_ring.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define RING_CHUNK (512u << 10)
#define RING_MAX   16u

struct ring_half {
    int fd;
    uint8_t *buf;
    size_t bytes;
    bool ok;
};

/* Sends (out) or receives all n bytes of b, RING_CHUNK a call; false when the peer went. */
static bool
move_all(int fd, uint8_t *b, size_t n, bool out)
{
    while (n > 0) {
        size_t len = n < RING_CHUNK ? n : RING_CHUNK;
        ssize_t r  = out ? send(fd, b, len, MSG_NOSIGNAL) : recv(fd, b, len, 0);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return false;
        }
        b += r;
        n -= (size_t)r;
    }
    return true;
}

static void *
ring_send(void *arg)
{
    struct ring_half *h = arg;
    h->ok               = move_all(h->fd, h->buf, h->bytes, true);
    return NULL;
}

/* One rank: connects to its next, accepts its previous, then per repetition a token round
 * (all are ready), the timed transfer both ways, and its time to the parent. */
static int
ring_rank(unsigned me, unsigned procs, const int *listeners, const uint16_t *ports, uint64_t bytes,
          unsigned reps, int report)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    size_t moved         = (size_t)(2 * (procs - 1) * bytes / procs);
    uint8_t *out = malloc(moved), *in = malloc(moved), token = 1;
    int next, prev, one                                      = 1;

    a.sin_port = htons(ports[(me + 1) % procs]);
    if (out == NULL || in == NULL || (next = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
        connect(next, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        (prev = accept(listeners[me], NULL, NULL)) < 0) {
        return 1;
    }
    setsockopt(next, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(prev, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    memset(out, (int)me + 1, moved); /* every page touched before the clock runs */
    memset(in, 0, moved);
    for (unsigned r = 0; r < reps; r++) {
        struct ring_half h = { .fd = next, .buf = out, .bytes = moved };
        pthread_t t;
        uint64_t t0;
        double s;

        /* Rank 0's token goes round once: every rank is past its last repetition. */
        if ((me == 0 && !move_all(next, &token, 1, true)) || !move_all(prev, &token, 1, false) ||
            (me != 0 && !move_all(next, &token, 1, true))) {
            return 1;
        }
        t0 = bench_now_ns();
        if (pthread_create(&t, NULL, ring_send, &h) != 0) {
            return 1;
        }
        bool got = move_all(prev, in, moved, false);
        pthread_join(t, NULL);
        s = (double)(bench_now_ns() - t0) / 1e9;
        if (!got || !h.ok || in[0] != (uint8_t)((me + procs - 1) % procs + 1) ||
            write(report, &s, sizeof(s)) != (ssize_t)sizeof(s)) {
            return 1;
        }
    }
    return 0;
}

double
bench_tcp_ring(unsigned procs, uint64_t bytes, unsigned reps)
{
    int listeners[RING_MAX], fds[RING_MAX][2];
    uint16_t ports[RING_MAX];
    pid_t pids[RING_MAX];
    double *times, median = -1;
    bool ok = true;

    if (procs < 2 || procs > RING_MAX || reps == 0 ||
        (times = calloc((size_t)reps, sizeof(double))) == NULL) {
        return -1;
    }
    for (unsigned i = 0; i < procs; i++) {
        listeners[i] = fds[i][0] = fds[i][1] = -1;
        pids[i]                              = -1;
    }
    for (unsigned i = 0; i < procs && ok; i++) {
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len        = sizeof(a);
        ok                   = (listeners[i] = socket(AF_INET, SOCK_STREAM, 0)) >= 0 &&
             bind(listeners[i], (struct sockaddr *)&a, len) == 0 && listen(listeners[i], 1) == 0 &&
             getsockname(listeners[i], (struct sockaddr *)&a, &len) == 0 && pipe(fds[i]) == 0;
        ports[i] = ntohs(a.sin_port);
    }
    fflush(NULL);
    for (unsigned i = 0; i < procs && ok; i++) {
        if ((pids[i] = fork()) == 0) {
            /* Only its own listener and report pipe: a rank that fails closes its end, and the
             * parent reads the end of its reports at once. */
            for (unsigned j = 0; j < procs; j++) {
                close(fds[j][0]);
                if (j != i) {
                    close(fds[j][1]);
                    close(listeners[j]);
                }
            }
            _exit(ring_rank(i, procs, listeners, ports, bytes, reps, fds[i][1]));
        }
        ok = pids[i] > 0;
    }
    for (unsigned i = 0; i < procs; i++) {
        close(listeners[i]);
        close(fds[i][1]);
    }
    /* A repetition takes its slowest rank's time. */
    for (unsigned i = 0; ok && i < procs; i++) {
        for (unsigned r = 0; ok && r < reps; r++) {
            double s;
            ok       = read(fds[i][0], &s, sizeof(s)) == (ssize_t)sizeof(s);
            times[r] = ok && s > times[r] ? s : times[r];
        }
    }
    for (unsigned i = 0; i < procs; i++) {
        int status;
        if (pids[i] > 0) {
            if (!ok) {
                kill(pids[i], SIGKILL);
            }
            ok = waitpid(pids[i], &status, 0) == pids[i] && WIFEXITED(status) &&
                 WEXITSTATUS(status) == 0 && ok;
        }
        close(fds[i][0]);
    }
    if (ok) {
        median = bench_percentile(times, reps, 50);
    }
    free(times);
    return median;
}
