/*
 * RSS over many all-reduces (issue 17): does the coordinator or a worker keep memory per
 * operation? Two real devcoord-worker processes (one cpu:0 device each) and a coordinator;
 * f32 sum all-reduce of 1 MiB repeated 10,000 times (1,000 with --quick, or --ops N), the
 * VmRSS of the coordinator and of each worker sampled every 500 ops (first sample after a
 * warmup of 50 ops, so allocator arenas and connection pools already exist).
 *
 * Two paths, each on its own fresh cluster:
 *   submit: the tensor put once on each worker, then dc_submit(ALL_REDUCE) repeated;
 *   group:  two rank threads (a libdevcoord client each) join one group and call
 *           dc_all_reduce repeated; the bench process samples between barriers.
 * Reported per process: first, last and max RSS, and the least-squares slope in KiB per
 * 1,000 ops over the whole run and over its second half. Bounded tables fill during the
 * first half (the coordinator keeps its last limits.op_history = 1024 ops), so "flat" is
 * judged on the second half: |slope| below 64 KiB per 1,000 ops (64 bytes per op; one
 * leaked 1 MiB buffer per op would be 1,000,000 KiB per 1,000 ops).
 *
 * A worker keeps group call buffers for reuse (groups.buffer_cache_bytes, bounded): each
 * worker's devcoord_group_buffer_cache_mapped_bytes is sampled with its RSS and reported
 * beside it (first and last), so a step of RSS can be told from more buffers mapped. Pages
 * of a mapped buffer count in RSS only once touched: a step with the mapped bytes unchanged
 * is cache memory touched for the first time, or memory outside the cache.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cluster.h"

static const char usage[] =
    "usage: bench_rss [--quick] [--ops N] [--path submit|group] [--out DIR] [--build DIR]\n";

#define N_WORKERS    2
#define N_PROCS      (1 + N_WORKERS) /* coordinator, w0, w1 */
#define BYTES        (1u << 20)
#define SAMPLE_EVERY 500u
#define WARMUP_OPS   50u
#define MAX_SAMPLES  1024
#define FLAT_KIB     64.0 /* per 1,000 ops */

struct series {
    const char *who;
    size_t n;
    double ops[MAX_SAMPLES];
    double kib[MAX_SAMPLES];
    double cache[MAX_SAMPLES];      /* KiB of group call buffers mapped (workers), or -1 */
    bool has_cache;                 /* every sample read the cache's size */
    double first, last, max;        /* KiB */
    double slope, late;             /* KiB per 1,000 ops: whole run, second half */
    double cache_first, cache_last; /* KiB */
};

struct path_result {
    const char *name;
    int ran;
    unsigned ops;
    double seconds;
    struct series s[N_PROCS];
};

static const char *const proc_names[N_PROCS] = { "coordinator", "worker w0", "worker w1" };

static void
sample(struct path_result *r, const struct cluster *c, unsigned done)
{
    pid_t pids[N_PROCS] = { c->coordinator, c->workers[0], c->workers[1] };

    for (size_t p = 0; p < N_PROCS; p++) {
        struct series *s = &r->s[p];
        if (s->n < MAX_SAMPLES) {
            double cache =
                p == 0
                    ? -1
                    : cluster_worker_metric(c, p - 1, "devcoord_group_buffer_cache_mapped_bytes");
            s->ops[s->n]   = done;
            s->kib[s->n]   = (double)bench_rss_bytes(pids[p]) / 1024.0;
            s->cache[s->n] = cache >= 0 ? cache / 1024.0 : -1;
            s->n++;
        }
    }
}

static void
finish(struct path_result *r)
{
    for (size_t p = 0; p < N_PROCS; p++) {
        struct series *s = &r->s[p];
        double x[MAX_SAMPLES], a = 0;

        s->who = proc_names[p];
        if (s->n == 0) {
            continue;
        }
        s->first = s->kib[0];
        s->last  = s->kib[s->n - 1];
        s->max   = s->first;
        for (size_t i = 0; i < s->n; i++) {
            s->max = s->kib[i] > s->max ? s->kib[i] : s->max;
            x[i]   = s->ops[i] / 1000.0;
        }
        s->has_cache = true;
        for (size_t i = 0; i < s->n; i++) {
            s->has_cache = s->has_cache && s->cache[i] >= 0;
        }
        s->cache_first = s->cache[0];
        s->cache_last  = s->cache[s->n - 1];
        s->slope       = s->n >= 2 ? bench_linfit(x, s->kib, s->n, &a) : 0;
        s->late        = s->slope;
        for (size_t i = 0; i < s->n; i++) {
            if (s->ops[i] * 2 >= s->ops[s->n - 1]) {
                s->late = s->n - i >= 2 ? bench_linfit(x + i, s->kib + i, s->n - i, &a) : 0;
                break;
            }
        }
    }
}

static int
start_cluster(struct cluster *c, const struct bench_args *a, const char *tag)
{
    if (cluster_start(c, a, tag, NULL) != 0 || cluster_add_workers(c, N_WORKERS) != 0) {
        cluster_stop(c);
        return -1;
    }
    return 0;
}

/* ---- submit path -------------------------------------------------------------------------- */

static int
run_submit(const struct bench_args *a, unsigned ops, struct path_result *r)
{
    static const char name[] = "rss";
    dc_device_ref devs[N_WORKERS];
    char dev[N_WORKERS][64];
    const char *refs[N_WORKERS];
    struct cluster c;
    uint64_t t0;
    int rv = 0;

    r->name = "submit";
    if (start_cluster(&c, a, "rss-submit") != 0) {
        return -1;
    }
    for (size_t w = 0; w < N_WORKERS; w++) {
        cluster_device(&c, w, &devs[w]);
        snprintf(dev[w], sizeof(dev[w]), "%s/cpu:0", c.worker_names[w]);
        refs[w] = dev[w];
    }
    /* Zeros: sums of zeros stay zero however often they are reduced. */
    rv = cluster_put_f32(c.client, refs, N_WORKERS, name, BYTES, 0.0f, "bench_rss");
    t0 = bench_now_ns();
    for (unsigned i = 0; rv == 0 && i < WARMUP_OPS + ops; i++) {
        if (i >= WARMUP_OPS && (i - WARMUP_OPS) % SAMPLE_EVERY == 0) {
            if (i == WARMUP_OPS) {
                t0 = bench_now_ns();
            }
            sample(r, &c, i - WARMUP_OPS);
        }
        if (cluster_submit_all_reduce(c.client, devs, N_WORKERS, name, NULL, "bench_rss") < 0) {
            rv = -1;
        }
    }
    if (rv == 0) {
        sample(r, &c, ops);
        r->seconds = (double)(bench_now_ns() - t0) / 1e9;
        r->ops     = ops;
        r->ran     = 1;
        finish(r);
    }
    cluster_stop(&c);
    return rv;
}

/* ---- group path --------------------------------------------------------------------------- */

struct group_shared {
    char address[64];
    char devices[160];
    char self[N_WORKERS][48];
    unsigned ops;
    pthread_barrier_t barrier; /* the ranks and the sampling thread */
    atomic_int failed;
};

struct rank_arg {
    struct group_shared *sh;
    unsigned index;
};

/* Both ranks and the sampler meet at the barrier before op 0, then after every SAMPLE_EVERY
 * ops (after warmup), so the sampler reads RSS while no op is in flight. */
static int
group_checkpoint(unsigned i)
{
    return i >= WARMUP_OPS && (i - WARMUP_OPS) % SAMPLE_EVERY == 0;
}

static void *
rank_main(void *arg)
{
    struct rank_arg *ra     = arg;
    struct group_shared *sh = ra->sh;
    dc_client_options co    = { .fail_fast = false, .timeout_ms = 60000 };
    dc_group_options go     = { .timeout_ms = 60000, .call_timeout_ms = 60000 };
    size_t count            = BYTES / sizeof(float);
    float *buf              = calloc(count, sizeof(float));
    dc_client *client       = NULL;
    dc_group *g             = NULL;
    dc_status st;

    if (buf == NULL || dc_client_open(sh->address, &co, &client, &st) != DC_OK) {
        fprintf(stderr, "bench_rss: rank thread %u: client failed\n", ra->index);
        atomic_store(&sh->failed, 1);
    } else if (dc_group_join(client, sh->devices, sh->self[ra->index], &go, &g, &st) != DC_OK) {
        fprintf(stderr, "bench_rss: %s: join: %s: %s\n", sh->self[ra->index],
                dc_status_name(st.code), st.message);
        atomic_store(&sh->failed, 1);
        g = NULL;
    }
    for (unsigned i = 0; i <= WARMUP_OPS + sh->ops; i++) {
        if (group_checkpoint(i)) {
            pthread_barrier_wait(&sh->barrier); /* the sampler reads */
            pthread_barrier_wait(&sh->barrier);
        }
        if (i == WARMUP_OPS + sh->ops) {
            break;
        }
        if (g != NULL && !atomic_load(&sh->failed) &&
            dc_all_reduce(g, buf, count, DC_DTYPE_F32, DC_REDUCE_SUM, &st) != DC_OK) {
            fprintf(stderr, "bench_rss: rank %u: all-reduce %u: %s: %s\n", dc_group_rank(g), i,
                    dc_status_name(st.code), st.message);
            atomic_store(&sh->failed, 1);
        }
    }
    if (g != NULL) {
        dc_group_leave(g, &st);
    }
    if (client != NULL) {
        dc_client_close(client);
    }
    free(buf);
    return NULL;
}

static int
run_group(const struct bench_args *a, unsigned ops, struct path_result *r)
{
    struct group_shared sh = { .ops = ops };
    struct rank_arg args[N_WORKERS];
    pthread_t threads[N_WORKERS];
    struct cluster c;
    size_t used = 0;
    uint64_t t0 = 0;

    r->name = "group";
    if (start_cluster(&c, a, "rss-group") != 0) {
        return -1;
    }
    snprintf(sh.address, sizeof(sh.address), "%s", c.address);
    for (unsigned w = 0; w < N_WORKERS; w++) {
        snprintf(sh.self[w], sizeof(sh.self[w]), "%s/cpu:0", c.worker_names[w]);
        used += (size_t)snprintf(sh.devices + used, sizeof(sh.devices) - used, "%s%s", w ? "," : "",
                                 sh.self[w]);
    }
    atomic_init(&sh.failed, 0);
    pthread_barrier_init(&sh.barrier, NULL, N_WORKERS + 1);
    for (unsigned w = 0; w < N_WORKERS; w++) {
        args[w] = (struct rank_arg){ .sh = &sh, .index = w };
        if (pthread_create(&threads[w], NULL, rank_main, &args[w]) != 0) {
            /* The barrier counts every rank: without them all, nothing can run. */
            fprintf(stderr, "bench_rss: cannot start rank threads\n");
            abort();
        }
    }
    for (unsigned done = 0; done <= ops; done += SAMPLE_EVERY) {
        pthread_barrier_wait(&sh.barrier);
        if (done == 0) {
            t0 = bench_now_ns();
        }
        if (!atomic_load(&sh.failed)) {
            sample(r, &c, done);
        }
        pthread_barrier_wait(&sh.barrier);
    }
    for (unsigned w = 0; w < N_WORKERS; w++) {
        pthread_join(threads[w], NULL);
    }
    pthread_barrier_destroy(&sh.barrier);
    if (!atomic_load(&sh.failed)) {
        if (ops % SAMPLE_EVERY != 0) {
            sample(r, &c, ops);
        }
        r->seconds = (double)(bench_now_ns() - t0) / 1e9;
        r->ops     = ops;
        r->ran     = 1;
        finish(r);
    }
    cluster_stop(&c);
    return r->ran ? 0 : -1;
}

/* ---- main --------------------------------------------------------------------------------- */

struct options {
    unsigned ops;
    bool submit, group; /* the paths to run */
};

static int
parse_extra(int argc, char **argv, int i, void *arg)
{
    struct options *o = arg;
    uint64_t v;

    if (strcmp(argv[i], "--ops") == 0 && i + 1 < argc) {
        if (bench_parse_u64(argv[i + 1], SAMPLE_EVERY, 500000, "--ops", &v) != 0) {
            exit(2);
        }
        o->ops = (unsigned)v;
        return 2;
    }
    if (strcmp(argv[i], "--path") == 0 && i + 1 < argc) {
        o->submit = strcmp(argv[i + 1], "submit") == 0;
        o->group  = strcmp(argv[i + 1], "group") == 0;
        if (!o->submit && !o->group) {
            fprintf(stderr, "bench_rss: --path: submit or group, not %s\n", argv[i + 1]);
            exit(2);
        }
        return 2;
    }
    return 0;
}

static void
print_path(const struct path_result *r)
{
    if (!r->ran) {
        printf("\n%s path: failed\n", r->name);
        return;
    }
    printf("\n%s path: %u all-reduces of 1 MiB f32 over 2 workers in %.1f s (%.0f us each); "
           "VmRSS every %u ops\n",
           r->name, r->ops, r->seconds, r->seconds * 1e6 / r->ops, SAMPLE_EVERY);
    printf("%-12s | %10s | %10s | %10s | %12s | %15s | %s\n", "process", "first", "last", "max",
           "slope, all", "slope, 2nd half", "buffer cache mapped");
    for (size_t p = 0; p < N_PROCS; p++) {
        const struct series *s = &r->s[p];
        printf("%-12s | %6.0f KiB | %6.0f KiB | %6.0f KiB | %12.1f | %15.1f", s->who, s->first,
               s->last, s->max, s->slope, s->late);
        if (s->has_cache) {
            printf(" | %.0f -> %.0f KiB\n", s->cache_first, s->cache_last);
        } else {
            printf(" | -\n");
        }
    }
}

static void
json_path(FILE *f, const struct path_result *r)
{
    fprintf(f, "\"%s\": {\"ran\": %s, \"ops\": %u, \"seconds\": %.2f, \"processes\": [", r->name,
            r->ran ? "true" : "false", r->ops, r->seconds);
    for (size_t p = 0; r->ran && p < N_PROCS; p++) {
        const struct series *s = &r->s[p];
        fprintf(f,
                "%s\n   {\"process\": \"%s\", \"first_kib\": %.0f, \"last_kib\": %.0f, "
                "\"max_kib\": %.0f, \"slope_kib_per_1000_ops\": %.2f, "
                "\"slope_second_half\": %.2f, ",
                p ? "," : "", s->who, s->first, s->last, s->max, s->slope, s->late);
        if (s->has_cache) {
            fprintf(f, "\"cache_mapped_first_kib\": %.0f, \"cache_mapped_last_kib\": %.0f, ",
                    s->cache_first, s->cache_last);
        }
        fprintf(f, "\"samples\": [");
        for (size_t i = 0; i < s->n; i++) {
            fprintf(f, "%s[%.0f, %.0f, %.0f]", i ? ", " : "", s->ops[i], s->kib[i], s->cache[i]);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "]}");
}

int
main(int argc, char **argv)
{
    static struct path_result paths[2] = { { .name = "submit" }, { .name = "group" } };
    struct options o                   = { .submit = true, .group = true };
    struct bench_summary sum;
    struct bench_args a;
    unsigned ops;
    FILE *f;
    int rv, failed = 0;

    bench_init();
    if ((rv = bench_parse_args(argc, argv, &a, usage, parse_extra, &o)) != 0) {
        return rv;
    }
    ops = o.ops ? o.ops : a.quick ? 1000 : 10000;
    if (o.submit) {
        printf("submit path: coordinator + 2 workers, %u all-reduces of 1 MiB ...\n", ops);
        fflush(stdout);
        failed |= run_submit(&a, ops, &paths[0]) != 0;
    }
    if (o.group) {
        printf("group path: coordinator + 2 workers, 2 rank threads, %u all-reduces of 1 MiB ...\n",
               ops);
        fflush(stdout);
        failed |= run_group(&a, ops, &paths[1]) != 0;
    }

    bool chosen[2] = { o.submit, o.group };
    for (size_t i = 0; i < 2; i++) {
        if (chosen[i]) {
            print_path(&paths[i]);
        }
    }
    printf("slopes in KiB per 1000 ops; flat: |slope over the 2nd half| < %.0f\n", FLAT_KIB);

    if ((f = bench_result_open(&a, "rss.json")) != NULL) {
        fprintf(f,
                "{\"bench\": \"rss\", \"bytes\": %u, \"sample_every\": %u, \"warmup_ops\": %u,\n ",
                BYTES, SAMPLE_EVERY, WARMUP_OPS);
        for (size_t i = 0, n = 0; i < 2; i++) {
            if (chosen[i]) {
                fprintf(f, "%s", n++ ? ",\n " : "");
                json_path(f, &paths[i]);
            }
        }
        fprintf(f, "}\n");
        fclose(f);
    }
    if (bench_summary_open(&sum, &a, "rss") == 0) {
        for (size_t i = 0; i < 2; i++) {
            const struct path_result *r = &paths[i];
            for (size_t p = 0; chosen[i] && p < N_PROCS; p++) {
                const struct series *s = &r->s[p];
                bench_summary_row(
                    &sum,
                    bench_fmt("RSS slope, %s, %s path, %u x 1 MiB all-reduce", proc_names[p],
                              r->name, r->ops),
                    !r->ran ? "failed"
                    : s->has_cache
                        ? bench_fmt("%.1f KiB/1000 ops 2nd half (all %.1f; %.0f->%.0f KiB; "
                                    "buffer cache mapped %.0f->%.0f KiB)",
                                    s->late, s->slope, s->first, s->last, s->cache_first,
                                    s->cache_last)
                        : bench_fmt("%.1f KiB/1000 ops 2nd half (all %.1f; %.0f->%.0f KiB)",
                                    s->late, s->slope, s->first, s->last),
                    "-", NAN, bench_fmt("flat (2nd half <%.0f KiB/1000 ops)", FLAT_KIB),
                    r->ran ? fabs(s->late) < FLAT_KIB : -1);
            }
        }
        bench_summary_close(&sum);
    }
    return failed ? 1 : 0;
}
