/*
 * Ranks as threads of one process on buffers of dc_group_alloc (issue 13): every thread joins
 * as one device of the list, allocates a block (shared memory when its worker is on this host)
 * and makes ITERATIONS all-reduces, then a broadcast, an all-gather and a reduce-scatter with
 * both buffers in the block, checking every result; then a large reduce-scatter (a block of
 * RS_BLOCK i64 per rank, 512 KiB: round the ring across workers) in a block of its own,
 * its result checked and its input checked unchanged. Then the mix: an all-reduce on a plain
 * buffer and an all-gather from the block into a plain buffer (both copied as usual, 40 bytes
 * in each), and an all-reduce where even ranks pass the block and odd ones plain memory.
 * Then it allocates blocks until the worker's bound on regions refuses one: that
 * block is plain memory, and an all-reduce on it (40 bytes in) still works. Last, when its
 * block was shared, an asynchronous all-reduce of 80 KB of plain memory (staged) that rank 0
 * leaves the group under before the others have called (leave_with_a_staged_call). Prints
 * "ok N shared S" (S: ranks whose first block was shared) and exits 0 when every result was
 * right, else names the first wrong one and exits 1.
 *
 *   devcoord-group-shm ADDR DEVICE,DEVICE,... ITERATIONS
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devcoord/devcoord.h"

#define COUNT      5
#define MAX_RANKS  8
#define MAX_BLOCKS 16 /* the worker's GROUPS_SHM_MAX_REGIONS */
#define RS_BLOCK   65536

struct rank_thread {
    pthread_t tid;
    dc_client *client;
    const char *devices;
    char self[DC_DEVICE_TEXT_SIZE];
    long iterations;
    bool shared;
    char error[DC_STATUS_MESSAGE_MAX + DC_DEVICE_TEXT_SIZE + 128];
};

#define FAIL(t, ...)                                           \
    do {                                                       \
        snprintf((t)->error, sizeof((t)->error), __VA_ARGS__); \
        goto out;                                              \
    } while (0)

/* The blocks past the first up to the worker's bound: all shared, then one plain one that
 * still works. */
static void
blocks_to_the_bound(dc_group *g, struct rank_thread *t)
{
    void *extra[MAX_BLOCKS] = { 0 };
    uint32_t n              = dc_group_size(g);
    dc_status st;

    for (int i = 0; i < MAX_BLOCKS; i++) {
        if ((extra[i] = dc_group_alloc(g, 64, &st)) == NULL) {
            FAIL(t, "%s: alloc %d: %s", t->self, i, st.message);
        }
        /* With the first block plain (the worker shares none), none of them is shared. */
        if (dc_group_buffer_shared(g, extra[i]) != (t->shared && i < MAX_BLOCKS - 1)) {
            FAIL(t, "%s: block %d shared: %d", t->self, i + 1, !(t->shared && i < MAX_BLOCKS - 1));
        }
    }
    {
        int64_t *v = extra[MAX_BLOCKS - 1];
        for (int i = 0; i < COUNT; i++) {
            v[i] = 7 + i;
        }
        if (dc_all_reduce(g, v, COUNT, DC_DTYPE_I64, DC_REDUCE_SUM, &st) != DC_OK ||
            v[2] != (int64_t)n * 9) {
            FAIL(t, "%s: all-reduce on the plain block: %s %lld", t->self, st.message,
                 (long long)v[2]);
        }
    }
out:
    for (int i = 0; i < MAX_BLOCKS; i++) {
        dc_group_free(g, extra[i]);
    }
}

static int big_reduce_scatter(dc_group *g, struct rank_thread *t);
static void leave_with_a_staged_call(dc_group **g, int64_t **buf, struct rank_thread *t);

static void *
rank_main(void *arg)
{
    struct rank_thread *t = arg;
    dc_group_options opts = { .timeout_ms = 20000, .call_timeout_ms = 20000 };
    dc_group *g           = NULL;
    int64_t *buf          = NULL, plain[COUNT], gathered[COUNT * MAX_RANKS];
    dc_status st;
    uint32_t rank, n;

    if (dc_group_join(t->client, t->devices, t->self, &opts, &g, &st) != DC_OK) {
        snprintf(t->error, sizeof(t->error), "%s: join: %s: %s", t->self, dc_status_name(st.code),
                 st.message);
        return NULL;
    }
    rank = dc_group_rank(g);
    n    = dc_group_size(g);
    if (n > MAX_RANKS) {
        FAIL(t, "%s: more than %d ranks", t->self, MAX_RANKS);
    }
    /* [0, COUNT): the all-reduces' and the send side; [COUNT, COUNT * (n + 1)): results. */
    if ((buf = dc_group_alloc(g, sizeof(*buf) * COUNT * (n + 1), &st)) == NULL) {
        FAIL(t, "%s: alloc: %s", t->self, st.message);
    }
    t->shared = dc_group_buffer_shared(g, buf);
    for (long k = 0; k < t->iterations; k++) {
        for (int i = 0; i < COUNT; i++) {
            buf[i] = (int64_t)(rank + 1) * (k + 1) + i;
        }
        if (dc_all_reduce(g, buf, COUNT, DC_DTYPE_I64, DC_REDUCE_SUM, &st) != DC_OK) {
            FAIL(t, "%s: all-reduce %ld: %s: %s", t->self, k, dc_status_name(st.code), st.message);
        }
        for (int i = 0; i < COUNT; i++) {
            int64_t want = (int64_t)(k + 1) * n * (n + 1) / 2 + (int64_t)n * i;
            if (buf[i] != want) {
                FAIL(t, "%s: all-reduce %ld: [%d] = %lld, want %lld", t->self, k, i,
                     (long long)buf[i], (long long)want);
            }
        }
    }
    for (int i = 0; i < COUNT; i++) {
        buf[i] = (int64_t)rank * 10 + i;
    }
    if (dc_broadcast(g, buf, COUNT, DC_DTYPE_I64, n - 1, &st) != DC_OK ||
        buf[1] != (int64_t)(n - 1) * 10 + 1) {
        FAIL(t, "%s: broadcast: %s %lld", t->self, st.message, (long long)buf[1]);
    }
    for (int i = 0; i < COUNT; i++) {
        buf[i] = (int64_t)rank * 100 + i;
    }
    if (dc_all_gather(g, buf, buf + COUNT, COUNT, DC_DTYPE_I64, &st) != DC_OK) {
        FAIL(t, "%s: all-gather: %s", t->self, st.message);
    }
    for (uint32_t r = 0; r < n; r++) {
        for (int i = 0; i < COUNT; i++) {
            if (buf[COUNT + r * COUNT + i] != (int64_t)r * 100 + i) {
                FAIL(t, "%s: all-gather: [%u][%d] = %lld", t->self, r, i,
                     (long long)buf[COUNT + r * COUNT + i]);
            }
        }
    }
    /* Reduce-scatter of the gathered blocks (the same on every rank) into [0, COUNT). */
    if (dc_reduce_scatter(g, buf + COUNT, buf, COUNT, DC_DTYPE_I64, DC_REDUCE_SUM, &st) != DC_OK ||
        buf[3] != (int64_t)n * ((int64_t)rank * 100 + 3)) {
        FAIL(t, "%s: reduce-scatter: %s %lld", t->self, st.message, (long long)buf[3]);
    }
    if (big_reduce_scatter(g, t) != 0) {
        goto out;
    }
    /* The mix: a plain buffer, and the block into a plain one. */
    for (int i = 0; i < COUNT; i++) {
        plain[i] = (int64_t)rank + i;
        buf[i]   = (int64_t)rank * 1000 + i;
    }
    if (dc_all_reduce(g, plain, COUNT, DC_DTYPE_I64, DC_REDUCE_MAX, &st) != DC_OK ||
        plain[4] != (int64_t)n - 1 + 4) {
        FAIL(t, "%s: plain all-reduce: %s %lld", t->self, st.message, (long long)plain[4]);
    }
    if (dc_all_gather(g, buf, gathered, COUNT, DC_DTYPE_I64, &st) != DC_OK ||
        gathered[(n - 1) * COUNT + 2] != (int64_t)(n - 1) * 1000 + 2) {
        FAIL(t, "%s: all-gather into a plain buffer: %s", t->self, st.message);
    }
    /* One call, each rank its own way: even ranks on the block, odd ones on plain memory. */
    {
        int64_t *v = rank % 2 == 0 ? buf : plain;
        for (int i = 0; i < COUNT; i++) {
            v[i] = (int64_t)rank + 1;
        }
        if (dc_all_reduce(g, v, COUNT, DC_DTYPE_I64, DC_REDUCE_SUM, &st) != DC_OK ||
            v[COUNT - 1] != (int64_t)n * (n + 1) / 2) {
            FAIL(t, "%s: mixed all-reduce: %s %lld", t->self, st.message, (long long)v[COUNT - 1]);
        }
    }
    blocks_to_the_bound(g, t);
    if (t->error[0] == '\0' && t->shared) {
        leave_with_a_staged_call(&g, &buf, t);
    }
out:
    dc_group_free(g, buf);
    dc_group_leave(g, &st);
    return NULL;
}

/* An asynchronous call of 80 KB on plain memory (in a staging block of its own when the
 * worker is on this host) that rank 0 leaves the group under, before the others have made
 * it (they wait 300 ms): dc_group_leave waits for its reply, which copies the result out of
 * the block, and the request is finished after it. *g and *buf are the group's, NULL once
 * left. */
static void
leave_with_a_staged_call(dc_group **g, int64_t **buf, struct rank_thread *t)
{
    enum { N = 20000 };
    uint32_t rank = dc_group_rank(*g), n = dc_group_size(*g);
    float *a = malloc(N * sizeof(*a));
    dc_request *rq;
    dc_status st;
    dc_code code;

    if (a == NULL) {
        FAIL(t, "%s: out of memory", t->self);
    }
    for (int i = 0; i < N; i++) {
        a[i] = (float)rank + 1;
    }
    if (rank != 0) {
        nanosleep(&(struct timespec){ .tv_nsec = 300 * 1000 * 1000 }, NULL);
    }
    if ((rq = dc_all_reduce_async(*g, a, N, DC_DTYPE_F32, DC_REDUCE_SUM, &st)) == NULL) {
        FAIL(t, "%s: staged async all-reduce: %s", t->self, st.message);
    }
    if (rank == 0) {
        dc_group_free(*g, *buf);
        *buf = NULL;
        dc_group_leave(*g, &st); /* the others' calls still to come */
        *g = NULL;
    }
    if ((code = dc_wait(rq, &st)) != DC_OK || a[N - 1] != (float)(n * (n + 1) / 2)) {
        FAIL(t, "%s: staged async all-reduce left behind: %s: %s, %g", t->self,
             dc_status_name(code), st.message, (double)a[N - 1]);
    }
out:
    free(a);
}

/* A reduce-scatter of n blocks of RS_BLOCK i64, rank-dependent, into the RS_BLOCK after them
 * in one dc_group_alloc block: each rank's block of the sum checked, and the input left as
 * it was (the worker reads it in place). 0, or -1 with t->error set. */
static int
big_reduce_scatter(dc_group *g, struct rank_thread *t)
{
    uint32_t rank = dc_group_rank(g), n = dc_group_size(g);
    size_t in_n = (size_t)n * RS_BLOCK;
    dc_status st;
    int64_t *b = dc_group_alloc(g, (in_n + RS_BLOCK) * sizeof(*b), &st);
    int rv     = -1;

    if (b == NULL) {
        FAIL(t, "%s: big reduce-scatter: no block: %s", t->self, st.message);
    }
    for (size_t i = 0; i < in_n; i++) {
        b[i] = (int64_t)i * 3 + (int64_t)rank * 1000003;
    }
    if (dc_reduce_scatter(g, b, b + in_n, RS_BLOCK, DC_DTYPE_I64, DC_REDUCE_SUM, &st) != DC_OK) {
        FAIL(t, "%s: big reduce-scatter: %s: %s", t->self, dc_status_name(st.code), st.message);
    }
    for (size_t i = 0; i < RS_BLOCK; i++) {
        int64_t want = (int64_t)n * (((int64_t)rank * RS_BLOCK + (int64_t)i) * 3) +
                       (int64_t)1000003 * n * (n - 1) / 2;
        if (b[in_n + i] != want) {
            FAIL(t, "%s: big reduce-scatter: [%zu] = %lld, want %lld", t->self, i,
                 (long long)b[in_n + i], (long long)want);
        }
    }
    for (size_t i = 0; i < in_n; i++) {
        if (b[i] != (int64_t)i * 3 + (int64_t)rank * 1000003) {
            FAIL(t, "%s: big reduce-scatter changed its input: [%zu] = %lld", t->self, i,
                 (long long)b[i]);
        }
    }
    rv = 0;
out:
    dc_group_free(g, b);
    return rv;
}

int
main(int argc, char **argv)
{
    dc_client_options copts = { .fail_fast = true };
    struct rank_thread threads[MAX_RANKS];
    dc_client *c;
    dc_status st;
    size_t n = 0, shared = 0;
    char *list, *save    = NULL;
    int rc = 0;

    if (argc != 4) {
        fprintf(stderr, "usage: %s ADDR DEVICE,DEVICE,... ITERATIONS\n", argv[0]);
        return 2;
    }
    if (dc_client_open(argv[1], &copts, &c, &st) != DC_OK) {
        fprintf(stderr, "open: %s\n", st.message);
        return 1;
    }
    memset(threads, 0, sizeof(threads));
    if ((list = strdup(argv[2])) == NULL) {
        return 1;
    }
    for (char *tok = strtok_r(list, ",", &save); tok != NULL && n < MAX_RANKS;
         tok       = strtok_r(NULL, ",", &save)) {
        struct rank_thread *t = &threads[n++];
        t->client             = c;
        t->devices            = argv[2];
        t->iterations         = atol(argv[3]);
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
        shared += threads[i].shared;
    }
    if (rc == 0) {
        printf("ok %zu shared %zu\n", n, shared);
    }
    dc_client_close(c);
    free(list);
    return rc;
}
