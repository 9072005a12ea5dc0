/*
 * Numeric results of every group call kind x reduce op x dtype on dc_group_alloc buffers
 * (issue 17: a one-worker group's all-reduce on shared memory is reduced in place, split
 * across threads). The ranks are threads of this process (SELF "all": one per device of the
 * list) or processes (one per SELF). Every rank knows every rank's input, a function of rank
 * and index with small integer values (exact in every dtype, f16 and bf16 included, and so
 * are their sums, products and means over 2 or 4 ranks), so each computes the expected
 * result itself, in rank order, and checks every element.
 *
 * For each count of COUNTS: all-reduce, reduce (root n-1; the others' buffers unchanged) and
 * reduce-scatter with every op, a reduce-scatter (sum) whose result is the start of its input
 * (not in place for rank 1), broadcast (root n/2) and all-gather, in every dtype; for each
 * of AR_COUNTS, all-reduce with every op and dtype (counts past one message go as one call
 * too: a group on one worker never splits them). Then one barrier. Prints "ok RANKS shared S calls
 * C" (S: ranks whose block was shared; C: calls made per rank) and exits 0, or names the first
 * wrong element.
 *
 *   devcoord-group-shm-numeric ADDR DEVICE,DEVICE,... SELF|all COUNT[,COUNT...] AR_COUNT[,...]
 *
 * With COUNTS "mismatch": rank 0 all-reduces AR_COUNT f32, the others as many f64; every
 * rank must get INVALID_ARGUMENT naming rank 1, and a right all-reduce after it must work (the
 * ranks' calls still matched).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devcoord/devcoord.h"

#define MAX_RANKS  8
#define MAX_COUNTS 8

static const dc_dtype dtypes[]  = { DC_DTYPE_F32, DC_DTYPE_F64, DC_DTYPE_I32,
                                    DC_DTYPE_I64, DC_DTYPE_F16, DC_DTYPE_BF16 };
static const dc_reduce_op ops[] = { DC_REDUCE_SUM, DC_REDUCE_PROD, DC_REDUCE_MIN, DC_REDUCE_MAX,
                                    DC_REDUCE_MEAN };
#define N_DTYPES (sizeof(dtypes) / sizeof(dtypes[0]))
#define N_OPS    (sizeof(ops) / sizeof(ops[0]))

struct args {
    bool mismatch;
    const char *devices;
    size_t counts[MAX_COUNTS], n_counts;
    size_t ar_counts[MAX_COUNTS], n_ar_counts;
};

struct rank_thread {
    pthread_t tid;
    const struct args *a;
    dc_client *client;
    char self[DC_DEVICE_TEXT_SIZE];
    bool shared;
    long calls;
    char error[DC_STATUS_MESSAGE_MAX + DC_DEVICE_TEXT_SIZE + 256];
};

/* ---- values: small integers, exact in every dtype ------------------------------------- */

static double
input(uint32_t rank, size_t i)
{
    double m = (double)((i + (size_t)rank) % 3 + 1); /* 1, 2, 3 */
    return i % 2 ? -m : m;
}

static double
f16_to_double(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h & 0x8000 ? -v : v;
}

/* v must be exact in f16 (these tests' values are). */
static uint16_t
double_to_f16(double v)
{
    uint16_t sign = v < 0 ? 0x8000 : 0;
    int e;
    double m;

    v = fabs(v);
    if (v == 0) {
        return sign;
    }
    m = frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024));
}

static void
put(dc_dtype t, void *buf, size_t i, double v)
{
    switch (t) {
    case DC_DTYPE_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case DC_DTYPE_F64:
        ((double *)buf)[i] = v;
        break;
    case DC_DTYPE_I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case DC_DTYPE_I64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case DC_DTYPE_F16:
        ((uint16_t *)buf)[i] = double_to_f16(v);
        break;
    case DC_DTYPE_BF16: {
        float f = (float)v;
        uint32_t bits;
        memcpy(&bits, &f, sizeof(bits));
        ((uint16_t *)buf)[i] = (uint16_t)(bits >> 16);
        break;
    }
    default:
        break;
    }
}

static double
get(dc_dtype t, const void *buf, size_t i)
{
    switch (t) {
    case DC_DTYPE_F32:
        return ((const float *)buf)[i];
    case DC_DTYPE_F64:
        return ((const double *)buf)[i];
    case DC_DTYPE_I32:
        return ((const int32_t *)buf)[i];
    case DC_DTYPE_I64:
        return (double)((const int64_t *)buf)[i];
    case DC_DTYPE_F16:
        return f16_to_double(((const uint16_t *)buf)[i]);
    case DC_DTYPE_BF16: {
        uint32_t bits = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof(f));
        return f;
    }
    default:
        return NAN;
    }
}

static bool
is_int(dc_dtype t)
{
    return t == DC_DTYPE_I32 || t == DC_DTYPE_I64;
}

/* The reduction of element j of every rank's input, in rank order. */
static double
expected(dc_dtype t, dc_reduce_op op, uint32_t n, size_t j)
{
    double acc = input(0, j);

    for (uint32_t r = 1; r < n; r++) {
        double x = input(r, j);
        switch (op) {
        case DC_REDUCE_PROD:
            acc *= x;
            break;
        case DC_REDUCE_MIN:
            acc = x < acc ? x : acc;
            break;
        case DC_REDUCE_MAX:
            acc = x > acc ? x : acc;
            break;
        default:
            acc += x;
            break;
        }
    }
    if (op == DC_REDUCE_MEAN) {
        acc = is_int(t) ? (double)((int64_t)acc / (int64_t)n) : acc / n; /* n: 2 or 4 */
    }
    return acc;
}

#define FAIL(t, ...)                                           \
    do {                                                       \
        snprintf((t)->error, sizeof((t)->error), __VA_ARGS__); \
        return -1;                                             \
    } while (0)

/* Element i of buf is want, or t->error says which call and element are wrong. */
static int
check(struct rank_thread *t, const char *what, dc_dtype dt, dc_reduce_op op, size_t count,
      const void *buf, size_t i, double want)
{
    double got = get(dt, buf, i);

    if (got != want) {
        FAIL(t, "%s: %s %s %s count %zu: [%zu] = %g, want %g", t->self, what, dc_dtype_name(dt),
             op ? dc_reduce_op_name(op) : "-", count, i, got, want);
    }
    return 0;
}

static int
called(struct rank_thread *t, const char *what, dc_dtype dt, size_t count, dc_code code,
       const dc_status *st)
{
    t->calls++;
    if (code != DC_OK) {
        FAIL(t, "%s: %s %s count %zu: %s: %s", t->self, what, dc_dtype_name(dt), count,
             dc_status_name(code), st->message);
    }
    return 0;
}

static int
all_reduce_one(struct rank_thread *t, dc_group *g, uint8_t *buf, size_t count, dc_dtype dt,
               dc_reduce_op op)
{
    uint32_t rank = dc_group_rank(g), n = dc_group_size(g);
    dc_status st;

    for (size_t i = 0; i < count; i++) {
        put(dt, buf, i, input(rank, i));
    }
    if (called(t, "all-reduce", dt, count, dc_all_reduce(g, buf, count, dt, op, &st), &st) != 0) {
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        if (check(t, "all-reduce", dt, op, count, buf, i, expected(dt, op, n, i)) != 0) {
            return -1;
        }
    }
    return 0;
}

static int
all_reduce(struct rank_thread *t, dc_group *g, uint8_t *buf, size_t count)
{
    for (size_t d = 0; d < N_DTYPES; d++) {
        for (size_t o = 0; o < N_OPS; o++) {
            if (all_reduce_one(t, g, buf, count, dtypes[d], ops[o]) != 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* Reduce, reduce-scatter, broadcast and all-gather of count elements per rank. */
static int
other_kinds(struct rank_thread *t, dc_group *g, uint8_t *buf, size_t count)
{
    uint32_t rank = dc_group_rank(g), n = dc_group_size(g);
    dc_status st;

    for (size_t d = 0; d < N_DTYPES; d++) {
        dc_dtype dt  = dtypes[d];
        uint8_t *out = buf + (size_t)n * count * dc_dtype_size(dt); /* after n blocks */
        for (size_t o = 0; o < N_OPS; o++) {
            for (size_t i = 0; i < count; i++) {
                put(dt, buf, i, input(rank, i));
            }
            if (called(t, "reduce", dt, count, dc_reduce(g, buf, count, dt, ops[o], n - 1, &st),
                       &st) != 0) {
                return -1;
            }
            for (size_t i = 0; i < count; i++) {
                double want = rank == n - 1 ? expected(dt, ops[o], n, i) : input(rank, i);
                if (check(t, "reduce", dt, ops[o], count, buf, i, want) != 0) {
                    return -1;
                }
            }
            /* Reduce-scatter: n blocks of count in, this rank's block of the result out. */
            for (size_t j = 0; j < (size_t)n * count; j++) {
                put(dt, buf, j, input(rank, j));
            }
            if (called(t, "reduce-scatter", dt, count,
                       dc_reduce_scatter(g, buf, out, count, dt, ops[o], &st), &st) != 0) {
                return -1;
            }
            for (size_t i = 0; i < count; i++) {
                if (check(t, "reduce-scatter", dt, ops[o], count, out, i,
                          expected(dt, ops[o], n, (size_t)rank * count + i)) != 0) {
                    return -1;
                }
            }
        }
        /* Reduce-scatter with each rank's result over the start of its input: rank 1's is not
         * its own block, so the worker cannot write the results while it reads the inputs;
         * it must take its general path, with every result still right. */
        for (size_t j = 0; j < (size_t)n * count; j++) {
            put(dt, buf, j, input(rank, j));
        }
        if (called(t, "reduce-scatter over its input", dt, count,
                   dc_reduce_scatter(g, buf, buf, count, dt, DC_REDUCE_SUM, &st), &st) != 0) {
            return -1;
        }
        for (size_t i = 0; i < count; i++) {
            if (check(t, "reduce-scatter over its input", dt, DC_REDUCE_SUM, count, buf, i,
                      expected(dt, DC_REDUCE_SUM, n, (size_t)rank * count + i)) != 0) {
                return -1;
            }
        }
        for (size_t i = 0; i < count; i++) {
            put(dt, buf, i, input(rank, i));
        }
        if (called(t, "broadcast", dt, count, dc_broadcast(g, buf, count, dt, n / 2, &st), &st) !=
            0) {
            return -1;
        }
        for (size_t i = 0; i < count; i++) {
            if (check(t, "broadcast", dt, 0, count, buf, i, input(n / 2, i)) != 0) {
                return -1;
            }
        }
        for (size_t i = 0; i < count; i++) {
            put(dt, buf, i, input(rank, i) * 2);
        }
        if (called(t, "all-gather", dt, count, dc_all_gather(g, buf, out, count, dt, &st), &st) !=
            0) {
            return -1;
        }
        for (uint32_t r = 0; r < n; r++) {
            for (size_t i = 0; i < count; i++) {
                if (check(t, "all-gather", dt, 0, count, out, (size_t)r * count + i,
                          input(r, i) * 2) != 0) {
                    return -1;
                }
            }
        }
    }
    return 0;
}

/* COUNTS "mismatch" (see the top). */
static int
mismatch(struct rank_thread *t, dc_group *g, uint8_t *buf, size_t count)
{
    uint32_t rank = dc_group_rank(g);
    dc_dtype dt   = rank == 0 ? DC_DTYPE_F32 : DC_DTYPE_F64;
    dc_status st;
    dc_code code;

    for (size_t i = 0; i < count; i++) {
        put(dt, buf, i, input(rank, i));
    }
    t->calls++;
    code = dc_all_reduce(g, buf, count, dt, DC_REDUCE_SUM, &st);
    if (code != DC_INVALID_ARGUMENT || strstr(st.message, "rank 1") == NULL) {
        FAIL(t, "%s: mismatched all-reduce: %s: %s, want INVALID_ARGUMENT naming rank 1", t->self,
             dc_status_name(code), st.message);
    }
    return all_reduce_one(t, g, buf, count, DC_DTYPE_F32, DC_REDUCE_SUM);
}

static void *
rank_main(void *arg)
{
    struct rank_thread *t = arg;
    const struct args *a  = t->a;
    dc_group_options opts = { .timeout_ms = 60000, .call_timeout_ms = 60000 };
    dc_group *g           = NULL;
    uint8_t *buf          = NULL;
    size_t most           = 0, bytes;
    dc_status st;
    uint32_t n;

    if (dc_group_join(t->client, a->devices, t->self, &opts, &g, &st) != DC_OK) {
        snprintf(t->error, sizeof(t->error), "%s: join: %s: %s", t->self, dc_status_name(st.code),
                 st.message);
        return NULL;
    }
    n = dc_group_size(g);
    for (size_t k = 0; k < a->n_counts; k++) {
        most = a->counts[k] * (n + 1) > most ? a->counts[k] * (n + 1) : most;
    }
    for (size_t k = 0; k < a->n_ar_counts; k++) {
        most = a->ar_counts[k] > most ? a->ar_counts[k] : most;
    }
    bytes = most * sizeof(double);
    if (n > MAX_RANKS || (n & (n - 1)) != 0) {
        snprintf(t->error, sizeof(t->error), "%s: %u ranks: 2 or 4 (means must be exact)", t->self,
                 n);
    } else if ((buf = dc_group_alloc(g, bytes, &st)) == NULL) {
        snprintf(t->error, sizeof(t->error), "%s: alloc %zu: %s", t->self, bytes, st.message);
    } else {
        int rv    = 0;
        t->shared = dc_group_buffer_shared(g, buf);
        for (size_t k = 0; a->mismatch && rv == 0 && k < a->n_ar_counts; k++) {
            rv = mismatch(t, g, buf, a->ar_counts[k]);
        }
        for (size_t k = 0; rv == 0 && k < a->n_counts; k++) {
            rv = all_reduce(t, g, buf, a->counts[k]);
            rv = rv == 0 ? other_kinds(t, g, buf, a->counts[k]) : rv;
        }
        for (size_t k = 0; !a->mismatch && rv == 0 && k < a->n_ar_counts; k++) {
            rv = all_reduce(t, g, buf, a->ar_counts[k]);
        }
        if (rv == 0) {
            called(t, "barrier", DC_DTYPE_F32, 0, dc_barrier(g, &st), &st);
        }
        dc_group_free(g, buf);
    }
    dc_group_leave(g, &st);
    return NULL;
}

static size_t
parse_counts(const char *text, size_t *out)
{
    size_t n = 0;

    for (const char *p = text; *p != '\0' && n < MAX_COUNTS;) {
        char *end;
        out[n++] = strtoul(p, &end, 10);
        p        = *end == ',' ? end + 1 : end;
        if (end == p && *p != '\0') {
            break;
        }
    }
    return n;
}

int
main(int argc, char **argv)
{
    dc_client_options copts = { .fail_fast = true };
    struct rank_thread threads[MAX_RANKS];
    struct args a = { 0 };
    dc_client *c;
    dc_status st;
    size_t n = 0, shared = 0;
    char *list, *save    = NULL;
    int rc = 0;

    if (argc != 6) {
        fprintf(stderr, "usage: %s ADDR DEVICE,DEVICE,... SELF|all COUNTS AR_COUNTS\n", argv[0]);
        return 2;
    }
    a.devices     = argv[2];
    a.mismatch    = strcmp(argv[4], "mismatch") == 0;
    a.n_counts    = a.mismatch ? 0 : parse_counts(argv[4], a.counts);
    a.n_ar_counts = parse_counts(argv[5], a.ar_counts);
    if (dc_client_open(argv[1], &copts, &c, &st) != DC_OK) {
        fprintf(stderr, "open: %s\n", st.message);
        return 1;
    }
    memset(threads, 0, sizeof(threads));
    if ((list = strdup(strcmp(argv[3], "all") == 0 ? argv[2] : argv[3])) == NULL) {
        return 1;
    }
    for (char *tok = strtok_r(list, ",", &save); tok != NULL && n < MAX_RANKS;
         tok       = strtok_r(NULL, ",", &save)) {
        struct rank_thread *t = &threads[n++];
        t->a                  = &a;
        t->client             = c;
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
        printf("ok %zu shared %zu calls %ld\n", n, shared, threads[0].calls);
    }
    dc_client_close(c);
    free(list);
    return rc;
}
