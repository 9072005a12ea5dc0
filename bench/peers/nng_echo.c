/*
 * The bare-nng peer of bench_rpc: what req0/rep0 costs with nothing on top. The server keeps
 * many rep contexts armed (as devcoord's RPC server does) and sends every request message
 * straight back from the nng callback; the client calls from N threads, one req context
 * each, over one socket, with resends off (devcoord's calls are at-most-once too).
 *
 *   nng_echo serve URL
 *   nng_echo client URL THREADS PAYLOAD_BYTES SECONDS WARMUP_SECONDS
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "bench.h"
#include "load.h"

#define SERVER_CONTEXTS 256

static const char usage[] = "usage: nng_echo serve URL\n"
                            "       nng_echo client URL THREADS PAYLOAD SECONDS WARMUP\n";

/* ---- server ------------------------------------------------------------------------------ */

struct echo_ctx {
    nng_ctx ctx;
    nng_aio *aio;
    int sending;
};

static void
echo_cb(void *arg)
{
    struct echo_ctx *e = arg;
    nng_msg *msg;

    if (nng_aio_result(e->aio) != 0) {
        if (e->sending) {
            nng_msg_free(nng_aio_get_msg(e->aio));
        }
        if (nng_aio_result(e->aio) == NNG_ECLOSED) {
            return;
        }
        e->sending = 0;
        nng_ctx_recv(e->ctx, e->aio);
        return;
    }
    if (e->sending) {
        e->sending = 0;
        nng_ctx_recv(e->ctx, e->aio);
        return;
    }
    msg = nng_aio_get_msg(e->aio);
    nng_aio_set_msg(e->aio, msg);
    e->sending = 1;
    nng_ctx_send(e->ctx, e->aio);
}

static int
serve(const char *url)
{
    static struct echo_ctx ctxs[SERVER_CONTEXTS];
    nng_socket sock;
    sigset_t set;
    int rv, sig;

    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    if ((rv = nng_rep0_open(&sock)) != 0 ||
        (rv = nng_socket_set_size(sock, NNG_OPT_RECVMAXSZ, 64u << 20)) != 0 ||
        (rv = nng_listen(sock, url, NULL, 0)) != 0) {
        fprintf(stderr, "nng_echo: %s: %s\n", url, nng_strerror(rv));
        return 1;
    }
    for (size_t i = 0; i < SERVER_CONTEXTS; i++) {
        if ((rv = nng_ctx_open(&ctxs[i].ctx, sock)) != 0 ||
            (rv = nng_aio_alloc(&ctxs[i].aio, echo_cb, &ctxs[i])) != 0) {
            fprintf(stderr, "nng_echo: %s\n", nng_strerror(rv));
            return 1;
        }
        nng_ctx_recv(ctxs[i].ctx, ctxs[i].aio);
    }
    sigwait(&set, &sig);
    nng_close(sock);
    for (size_t i = 0; i < SERVER_CONTEXTS; i++) {
        nng_aio_stop(ctxs[i].aio);
        nng_aio_free(ctxs[i].aio);
    }
    return 0;
}

/* ---- client ------------------------------------------------------------------------------ */

struct client {
    nng_socket sock;
    const uint8_t *payload;
    size_t len;
};

struct client_thread {
    struct client *c;
    nng_ctx ctx;
    nng_aio *aio;
};

static void *
c_thread_init(void *arg, unsigned index)
{
    struct client_thread *t = calloc(1, sizeof(*t));

    (void)index;
    if (t == NULL) {
        return NULL;
    }
    t->c = arg;
    if (nng_ctx_open(&t->ctx, t->c->sock) != 0 || nng_aio_alloc(&t->aio, NULL, NULL) != 0) {
        free(t);
        return NULL;
    }
    nng_aio_set_timeout(t->aio, 10000);
    return t;
}

static void
c_thread_fini(void *state)
{
    struct client_thread *t = state;

    nng_aio_free(t->aio);
    nng_ctx_close(t->ctx);
    free(t);
}

static int
c_call(void *state)
{
    struct client_thread *t = state;
    nng_msg *msg;
    int ok;

    if (nng_msg_alloc(&msg, 0) != 0) {
        return -1;
    }
    if (nng_msg_append(msg, t->c->payload, t->c->len) != 0) {
        nng_msg_free(msg);
        return -1;
    }
    nng_aio_set_msg(t->aio, msg);
    nng_ctx_send(t->ctx, t->aio);
    nng_aio_wait(t->aio);
    if (nng_aio_result(t->aio) != 0) {
        nng_msg_free(nng_aio_get_msg(t->aio));
        return -1;
    }
    nng_ctx_recv(t->ctx, t->aio);
    nng_aio_wait(t->aio);
    if (nng_aio_result(t->aio) != 0) {
        return -1;
    }
    msg = nng_aio_get_msg(t->aio);
    ok  = nng_msg_len(msg) == t->c->len;
    nng_msg_free(msg);
    return ok ? 0 : -1;
}

static int
client(char **argv)
{
    struct load_opts lo = { 0 };
    struct client c     = { 0 };
    struct load_result r;
    uint64_t threads, len;
    uint8_t *payload;
    int rv;

    if (bench_parse_u64(argv[1], 1, 4096, "THREADS", &threads) != 0 ||
        bench_parse_u64(argv[2], 0, 1u << 30, "PAYLOAD", &len) != 0 ||
        bench_parse_double(argv[3], "SECONDS", &lo.duration_s) != 0 ||
        bench_parse_double(argv[4], "WARMUP", &lo.warmup_s) != 0) {
        return 2;
    }
    if ((payload = malloc(len ? len : 1)) == NULL) {
        return 1;
    }
    memset(payload, 0xa5, len);
    if ((rv = nng_req0_open(&c.sock)) != 0 ||
        (rv = nng_socket_set_ms(c.sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_socket_set_size(c.sock, NNG_OPT_RECVMAXSZ, 64u << 20)) != 0 ||
        (rv = nng_dial(c.sock, argv[0], NULL, 0)) != 0) {
        fprintf(stderr, "nng_echo: %s: %s\n", argv[0], nng_strerror(rv));
        free(payload);
        return 1;
    }
    c.payload      = payload;
    c.len          = len;
    lo.threads     = (unsigned)threads;
    lo.thread_init = c_thread_init;
    lo.thread_fini = c_thread_fini;
    lo.call        = c_call;
    lo.arg         = &c;
    rv             = load_run(&lo, &r);
    load_print(stdout, &r);
    nng_close(c.sock);
    free(payload);
    return rv == 0 ? 0 : 1;
}

int
main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "serve") == 0) {
        return serve(argv[2]);
    }
    if (argc == 7 && strcmp(argv[1], "client") == 0) {
        return client(argv + 2);
    }
    fprintf(stderr, "%s", usage);
    return 2;
}
