/*
 * Ranks as threads of one process (burn's model), through the public API: one dc_client shared
 * by every thread, one dc_group per thread. Each thread joins as one device of the list, then
 * makes ITERATIONS all-reduces (sum, i64 and f64) and one reduce, broadcast, all-gather,
 * reduce-scatter and barrier, one all-reduce the ranks disagree on (its failure
 * told with no dc_status), then IN_FLIGHT all-reduces started at once (_async) and
 * finished with dc_test/dc_wait, then an all-reduce, an all-gather and a reduce-scatter
 * several messages long (which the library splits), blocking and (the first two) _async
 * beside a small _async one, checking every result; then leaves. Prints "ok
 * N" and exits 0 when every thread saw every result right, else names the first wrong one and
 * exits 1. With HUGE, an all-reduce (sum) and a reduce (max, to the last rank) of HUGE i32 come
 * last, results checked too (past 64 MiB, across workers the library makes each as several
 * whole calls).
 *
 *   devcoord-group-threads ADDR DEVICE,DEVICE,... ITERATIONS [HUGE]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devcoord/devcoord.h"

#define COUNT     5 /* not a multiple of the usual 2 or 3 ranks */
#define IN_FLIGHT 4
/* Elements of the calls larger than one message (4 MiB): about 5 MB of i32 for the
 * all-reduce, 2.4 MB of i64 per rank for the others (their results or inputs hold one block
 * per rank). Not multiples of the parts the library cuts them into. */
#define BIG_REDUCE  1300007
#define BIG_BLOCKED 300007

struct rank_thread {
    pthread_t tid;
    dc_client *client;
    const char *devices;
    char self[DC_DEVICE_TEXT_SIZE];
    long iterations;
    size_t huge;
    char error[DC_STATUS_MESSAGE_MAX + DC_DEVICE_TEXT_SIZE + 128];
};

/* Starts a big all-reduce of a (BIG_REDUCE i32), a big all-gather of in into out
 * (BIG_BLOCKED i64 each) and a small all-reduce at once, then waits for all three; 0, or -1
 * with error set. The small one's result is checked here. */
static int
async_big_calls(dc_group *g, const char *self, int32_t *a, const int64_t *in, int64_t *out,
                char *error, size_t cap)
{
    uint32_t rank = dc_group_rank(g), n = dc_group_size(g);
    static const char *const what[3] = { "big async all-reduce", "big async all-gather",
                                         "small async all-reduce after them" };
    int64_t small[COUNT];
    dc_request *rq[3];
    dc_status st[3];
    int bad = -1;

    for (int i = 0; i < COUNT; i++) {
        small[i] = (int64_t)rank + i;
    }
    rq[0] = dc_all_reduce_async(g, a, BIG_REDUCE, DC_DTYPE_I32, DC_REDUCE_SUM, &st[0]);
    rq[1] = dc_all_gather_async(g, in, out, BIG_BLOCKED, DC_DTYPE_I64, &st[1]);
    rq[2] = dc_all_reduce_async(g, small, COUNT, DC_DTYPE_I64, DC_REDUCE_SUM, &st[2]);
    for (int i = 0; i < 3; i++) {
        if ((rq[i] == NULL || dc_wait(rq[i], &st[i]) != DC_OK) && bad < 0) {
            bad = i;
        }
    }
    if (bad >= 0) {
        snprintf(error, cap, "%s: %s: %s: %s", self, what[bad], dc_status_name(st[bad].code),
                 st[bad].message);
        return -1;
    }
    for (int i = 0; i < COUNT; i++) {
        if (small[i] != (int64_t)n * (n - 1) / 2 + (int64_t)n * i) {
            snprintf(error, cap, "%s: %s: [%d] = %lld", self, what[2], i, (long long)small[i]);
            return -1;
        }
    }
    return 0;
}

/* The calls larger than one message; "" when all is well, else what went wrong. */
static void
big_calls(dc_group *g, const char *self, char *error, size_t cap)
{
    uint32_t rank = dc_group_rank(g), n = dc_group_size(g);
    int32_t *a   = malloc(BIG_REDUCE * sizeof(*a));
    int64_t *in  = malloc((size_t)n * BIG_BLOCKED * sizeof(*in));
    int64_t *out = malloc((size_t)n * BIG_BLOCKED * sizeof(*out));
    dc_status st;

    if (a == NULL || in == NULL || out == NULL) {
        snprintf(error, cap, "%s: out of memory", self);
        goto out;
    }
    for (size_t i = 0; i < BIG_REDUCE; i++) {
        a[i] = (int32_t)(i % 1000) + (int32_t)rank;
    }
    if (dc_all_reduce(g, a, BIG_REDUCE, DC_DTYPE_I32, DC_REDUCE_SUM, &st) != DC_OK) {
        snprintf(error, cap, "%s: big all-reduce: %s", self, st.message);
        goto out;
    }
    for (size_t i = 0; i < BIG_REDUCE; i++) {
        if (a[i] != (int32_t)(n * (i % 1000) + n * (n - 1) / 2)) {
            snprintf(error, cap, "%s: big all-reduce: [%zu] = %d", self, i, a[i]);
            goto out;
        }
    }
    /* A mean in f64 (between workers, large parts go round the ring): divided once, at the
     * end, by every rank. */
    {
        double *m  = (double *)(void *)in;
        size_t cnt = (size_t)n * BIG_BLOCKED * sizeof(*in) / sizeof(*m);
        for (size_t i = 0; i < cnt; i++) {
            m[i] = (double)(i % 7) + (double)rank;
        }
        if (dc_all_reduce(g, m, cnt, DC_DTYPE_F64, DC_REDUCE_MEAN, &st) != DC_OK) {
            snprintf(error, cap, "%s: big mean all-reduce: %s", self, st.message);
            goto out;
        }
        for (size_t i = 0; i < cnt; i++) {
            if (m[i] != (double)(i % 7) + (double)(n - 1) / 2) {
                snprintf(error, cap, "%s: big mean all-reduce: [%zu] = %g", self, i, m[i]);
                goto out;
            }
        }
    }
    /* Asynchronous ones that large too (a thread of the library makes the parts): two big
     * calls and a small one started at once, the small one after every part of the big
     * ones, then each waited for and checked. */
    for (size_t i = 0; i < BIG_REDUCE; i++) {
        a[i] = (int32_t)(i % 1000) + (int32_t)rank;
    }
    for (size_t i = 0; i < BIG_BLOCKED; i++) {
        in[i] = (int64_t)rank * BIG_BLOCKED + (int64_t)i;
    }
    if (async_big_calls(g, self, a, in, out, error, cap) != 0) {
        goto out;
    }
    for (size_t i = 0; i < BIG_REDUCE; i++) {
        if (a[i] != (int32_t)(n * (i % 1000) + n * (n - 1) / 2)) {
            snprintf(error, cap, "%s: big async all-reduce: [%zu] = %d", self, i, a[i]);
            goto out;
        }
    }
    for (size_t i = 0; i < (size_t)n * BIG_BLOCKED; i++) {
        if (out[i] != (int64_t)i) {
            snprintf(error, cap, "%s: big async all-gather: [%zu] = %lld", self, i,
                     (long long)out[i]);
            goto out;
        }
    }
    memset(out, 0, (size_t)n * BIG_BLOCKED * sizeof(*out));
    if (dc_all_gather(g, in, out, BIG_BLOCKED, DC_DTYPE_I64, &st) != DC_OK) {
        snprintf(error, cap, "%s: big all-gather: %s", self, st.message);
        goto out;
    }
    for (size_t i = 0; i < (size_t)n * BIG_BLOCKED; i++) {
        if (out[i] != (int64_t)i) {
            snprintf(error, cap, "%s: big all-gather: [%zu] = %lld", self, i, (long long)out[i]);
            goto out;
        }
    }
    /* Reduce-scatter of out plus 7 x rank: each rank gets n times its block, plus 7 times
     * the sum of the ranks (every rank's input counted once). */
    for (size_t i = 0; i < (size_t)n * BIG_BLOCKED; i++) {
        out[i] += 7 * (int64_t)rank;
    }
    if (dc_reduce_scatter(g, out, in, BIG_BLOCKED, DC_DTYPE_I64, DC_REDUCE_SUM, &st) != DC_OK) {
        snprintf(error, cap, "%s: big reduce-scatter: %s", self, st.message);
        goto out;
    }
    for (size_t i = 0; i < BIG_BLOCKED; i++) {
        if (in[i] != (int64_t)n * ((int64_t)rank * BIG_BLOCKED + (int64_t)i) +
                         7 * (int64_t)n * (n - 1) / 2) {
            snprintf(error, cap, "%s: big reduce-scatter: [%zu] = %lld", self, i, (long long)in[i]);
            goto out;
        }
    }
out:
    free(a);
    free(in);
    free(out);
}

/* An all-reduce (sum) and a reduce (max, to the last rank) of `count` i32, checked. */
static void
huge_calls(dc_group *g, size_t count, const char *self, char *error, size_t cap)
{
    uint32_t rank = dc_group_rank(g), n = dc_group_size(g);
    int32_t *a = malloc(count * sizeof(*a));
    dc_status st;

    if (a == NULL) {
        snprintf(error, cap, "%s: out of memory", self);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        a[i] = (int32_t)(rank + 1) + (int32_t)(i % 1000);
    }
    if (dc_all_reduce(g, a, count, DC_DTYPE_I32, DC_REDUCE_SUM, &st) != DC_OK) {
        snprintf(error, cap, "%s: huge all-reduce: %s", self, st.message);
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        int32_t want = (int32_t)(n * (n + 1) / 2) + (int32_t)n * (int32_t)(i % 1000);
        if (a[i] != want) {
            snprintf(error, cap, "%s: huge all-reduce: [%zu] = %d, want %d", self, i, a[i], want);
            goto out;
        }
    }
    for (size_t i = 0; i < count; i++) {
        a[i] = (int32_t)((rank * 7 + i) % (n * 3));
    }
    if (dc_reduce(g, a, count, DC_DTYPE_I32, DC_REDUCE_MAX, n - 1, &st) != DC_OK) {
        snprintf(error, cap, "%s: huge reduce: %s", self, st.message);
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        int32_t want = (int32_t)((rank * 7 + i) % (n * 3));
        for (uint32_t r = 0; rank == n - 1 && r < n; r++) {
            int32_t v = (int32_t)((r * 7 + i) % (n * 3));
            want      = v > want ? v : want;
        }
        if (a[i] != want) {
            snprintf(error, cap, "%s: huge reduce: [%zu] = %d, want %d", self, i, a[i], want);
            goto out;
        }
    }
out:
    free(a);
}

static void *
rank_main(void *arg)
{
    struct rank_thread *t = arg;
    dc_group_options opts = { .timeout_ms = 20000, .call_timeout_ms = 20000 };
    dc_group *g           = NULL;
    dc_status st;
    int64_t iv[COUNT], *gathered = NULL;
    double dv[COUNT];
    uint32_t rank, n;

    if (dc_group_join(t->client, t->devices, t->self, &opts, &g, &st) != DC_OK) {
        snprintf(t->error, sizeof(t->error), "%s: join: %s: %s", t->self, dc_status_name(st.code),
                 st.message);
        return NULL;
    }
    rank = dc_group_rank(g);
    n    = dc_group_size(g);
    for (long k = 0; k < t->iterations; k++) {
        for (int i = 0; i < COUNT; i++) {
            iv[i] = (int64_t)(rank + 1) * (k + 1) + i;
            dv[i] = (double)(rank + 1) * 0.5;
        }
        if (dc_all_reduce(g, iv, COUNT, DC_DTYPE_I64, DC_REDUCE_SUM, &st) != DC_OK ||
            dc_all_reduce(g, dv, COUNT, DC_DTYPE_F64, DC_REDUCE_MAX, &st) != DC_OK) {
            snprintf(t->error, sizeof(t->error), "%s: call %ld: %s: %s", t->self, k,
                     dc_status_name(st.code), st.message);
            goto out;
        }
        for (int i = 0; i < COUNT; i++) {
            int64_t want = (int64_t)(k + 1) * n * (n + 1) / 2 + (int64_t)n * i;
            if (iv[i] != want || dv[i] != (double)n * 0.5) {
                snprintf(t->error, sizeof(t->error), "%s: call %ld: [%d] = %lld / %g, want %lld",
                         t->self, k, i, (long long)iv[i], dv[i], (long long)want);
                goto out;
            }
        }
    }
    /* One of each other kind. */
    for (int i = 0; i < COUNT; i++) {
        iv[i] = (int64_t)rank * 10 + i;
    }
    if (dc_broadcast(g, iv, COUNT, DC_DTYPE_I64, n - 1, &st) != DC_OK ||
        iv[1] != (n - 1) * 10 + 1) {
        snprintf(t->error, sizeof(t->error), "%s: broadcast: %s %lld", t->self, st.message,
                 (long long)iv[1]);
        goto out;
    }
    /* Reduce to rank 0: the product 1 * 2 * ... * n there, the others keep theirs. */
    iv[0] = rank + 1;
    if (dc_reduce(g, iv, 1, DC_DTYPE_I64, DC_REDUCE_PROD, 0, &st) != DC_OK) {
        snprintf(t->error, sizeof(t->error), "%s: reduce: %s", t->self, st.message);
        goto out;
    }
    {
        int64_t want = rank + 1;
        if (rank == 0) {
            for (uint32_t r = 2; r <= n; r++) {
                want *= r;
            }
        }
        if (iv[0] != want) {
            snprintf(t->error, sizeof(t->error), "%s: reduce: %lld, want %lld", t->self,
                     (long long)iv[0], (long long)want);
            goto out;
        }
    }
    if ((gathered = calloc((size_t)n * COUNT, sizeof(*gathered))) == NULL) {
        snprintf(t->error, sizeof(t->error), "%s: out of memory", t->self);
        goto out;
    }
    for (int i = 0; i < COUNT; i++) {
        iv[i] = (int64_t)rank * 100 + i;
    }
    if (dc_all_gather(g, iv, gathered, COUNT, DC_DTYPE_I64, &st) != DC_OK) {
        snprintf(t->error, sizeof(t->error), "%s: all-gather: %s", t->self, st.message);
        goto out;
    }
    for (uint32_t r = 0; r < n; r++) {
        for (int i = 0; i < COUNT; i++) {
            if (gathered[r * COUNT + i] != (int64_t)r * 100 + i) {
                snprintf(t->error, sizeof(t->error), "%s: all-gather: [%u][%d] = %lld", t->self, r,
                         i, (long long)gathered[r * COUNT + i]);
                goto out;
            }
        }
    }
    /* Reduce-scatter: gathered (n blocks) in, this rank's block of the sum out. */
    for (size_t i = 0; i < (size_t)n * COUNT; i++) {
        gathered[i] = (int64_t)rank + 1 + (int64_t)i;
    }
    if (dc_reduce_scatter(g, gathered, iv, COUNT, DC_DTYPE_I64, DC_REDUCE_SUM, &st) != DC_OK) {
        snprintf(t->error, sizeof(t->error), "%s: reduce-scatter: %s", t->self, st.message);
        goto out;
    }
    for (int i = 0; i < COUNT; i++) {
        int64_t want = (int64_t)n * (n + 1) / 2 + (int64_t)n * ((int64_t)rank * COUNT + i);
        if (iv[i] != want) {
            snprintf(t->error, sizeof(t->error), "%s: reduce-scatter: [%d] = %lld, want %lld",
                     t->self, i, (long long)iv[i], (long long)want);
            goto out;
        }
    }
    if (dc_barrier(g, &st) != DC_OK) {
        snprintf(t->error, sizeof(t->error), "%s: barrier: %s", t->self, st.message);
        goto out;
    }
    /* The ranks disagree on the op: the call fails on every rank, told with no dc_status
     * (the header allows it), and the group goes on. */
    if (n > 1 && dc_all_reduce(g, iv, COUNT, DC_DTYPE_I64,
                               rank == 0 ? DC_REDUCE_MAX : DC_REDUCE_SUM, NULL) == DC_OK) {
        snprintf(t->error, sizeof(t->error), "%s: an all-reduce with two ops succeeded", t->self);
        goto out;
    }
    if (dc_barrier(g, &st) != DC_OK) {
        snprintf(t->error, sizeof(t->error), "%s: barrier after a failed call: %s", t->self,
                 st.message);
        goto out;
    }
    /* Several calls in flight on the group, each with its own buffer. */
    {
        dc_request *reqs[IN_FLIGHT] = { 0 };
        int32_t bufs[IN_FLIGHT][COUNT];
        bool done = false;
        for (int q = 0; q < IN_FLIGHT; q++) {
            for (int i = 0; i < COUNT; i++) {
                bufs[q][i] = (int32_t)(rank + 1) * (q + 1) + i;
            }
            if ((reqs[q] = dc_all_reduce_async(g, bufs[q], COUNT, DC_DTYPE_I32, DC_REDUCE_SUM,
                                               &st)) == NULL) {
                snprintf(t->error, sizeof(t->error), "%s: all-reduce %d did not start: %s", t->self,
                         q, st.message);
            }
        }
        if (reqs[0] != NULL && dc_test(reqs[0], &done, &st) != DC_OK && done) {
            snprintf(t->error, sizeof(t->error), "%s: test: %s", t->self, st.message);
        }
        for (int q = IN_FLIGHT - 1; q >= 0; q--) { /* waited for in any order */
            if (reqs[q] != NULL && dc_wait(reqs[q], &st) != DC_OK && t->error[0] == '\0') {
                snprintf(t->error, sizeof(t->error), "%s: all-reduce %d: %s", t->self, q,
                         st.message);
            }
        }
        for (int q = 0; q < IN_FLIGHT && t->error[0] == '\0'; q++) {
            for (int i = 0; i < COUNT; i++) {
                int32_t want = (int32_t)((q + 1) * n * (n + 1) / 2 + n * i);
                if (bufs[q][i] != want) {
                    snprintf(t->error, sizeof(t->error), "%s: all-reduce %d: [%d] = %d, want %d",
                             t->self, q, i, bufs[q][i], want);
                    break;
                }
            }
        }
    }
    if (t->error[0] == '\0') {
        big_calls(g, t->self, t->error, sizeof(t->error));
    }
    if (t->error[0] == '\0' && t->huge > 0) {
        huge_calls(g, t->huge, t->self, t->error, sizeof(t->error));
    }
out:
    free(gathered);
    if (dc_group_leave(g, &st) != DC_OK && t->error[0] == '\0') {
        snprintf(t->error, sizeof(t->error), "%s: leave: %s", t->self, st.message);
    }
    return NULL;
}

int
main(int argc, char **argv)
{
    dc_client_options copts = { .fail_fast = true };
    struct rank_thread *threads;
    dc_client *c;
    dc_status st;
    size_t n = 0;
    char *list, *save = NULL;
    int rc = 0;

    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s ADDR DEVICE,DEVICE,... ITERATIONS [HUGE]\n", argv[0]);
        return 2;
    }
    if (dc_client_open(argv[1], &copts, &c, &st) != DC_OK) {
        fprintf(stderr, "open: %s\n", st.message);
        return 1;
    }
    list    = strdup(argv[2]);
    threads = calloc(strlen(argv[2]) + 1, sizeof(*threads));
    if (list == NULL || threads == NULL) {
        return 1;
    }
    for (char *tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        struct rank_thread *t = &threads[n++];
        t->client             = c;
        t->devices            = argv[2];
        t->iterations         = atol(argv[3]);
        t->huge               = argc == 5 ? (size_t)atol(argv[4]) : 0;
        snprintf(t->self, sizeof(t->self), "%s", tok);
    }
    for (size_t i = 0; i < n; i++) {
        if (pthread_create(&threads[i].tid, NULL, rank_main, &threads[i]) != 0) {
            fprintf(stderr, "cannot start a thread\n");
            return 1;
        }
    }
    for (size_t i = 0; i < n; i++) {
        pthread_join(threads[i].tid, NULL);
        if (threads[i].error[0] != '\0') {
            fprintf(stderr, "%s\n", threads[i].error);
            rc = 1;
        }
    }
    if (rc == 0) {
        printf("ok %zu\n", n);
    }
    dc_client_close(c);
    free(threads);
    free(list);
    return rc;
}
