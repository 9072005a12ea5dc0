/*
 * The group path's all-reduce (issue 13): N ranks, threads of this process with a libdevcoord
 * client each, join one group and time dc_all_reduce (f32 sum, in place) repeated, at 4 KiB,
 * 1 MiB and 16 MiB, for 2 ranks on 2 workers, 4 on 4, 2 on 1 and 4 on 1 (real
 * devcoord-server and devcoord-worker processes, cpu devices), side by side with
 * torch.distributed's gloo on the same number of processes (peers/gloo_allreduce.py).
 *
 * A rank's time is what a trainer sees: from its call to the result in its own buffer. Rank
 * 0's times are reported (as gloo's are), median, min and max. The first call of every size
 * is checked: each rank passes rank+1 everywhere and must get n(n+1)/2 back.
 *
 * Each rank's buffer comes from dc_group_alloc (checked with dc_group_buffer_shared: a rank
 * whose worker refused the mapping fails the layout rather than quietly streaming), so no byte
 * moves between a rank and its worker, as for a trainer that allocates its buffers so; in the
 * one-worker layouts no byte moves at all. With --plain the multi-worker layouts pass malloc'd
 * buffers instead, streamed to the worker and back over RPC (what this bench did before).
 * Beside gloo, the 16 MiB one-worker rows are set against the shared-memory limit of this
 * machine (bench_shm_probe: two threads all-reduce two 16 MiB f32 arrays, issue 17).
 *
 * The 2-ranks-on-2-workers layout also sets the single-controller path against the group
 * path (issue 17: SubmitOp within 10 % of it): after its own timed calls, each size runs
 * paired rounds on the same cluster, one group call (every rank, started together) then one
 * dc_submit all-reduce by rank 0 over tensors of the same size parked on the same devices,
 * so both see the same load; the medians of the two series are compared.
 *
 * With --reduce-scatter (and --layout, for A/B runs) every call is dc_reduce_scatter instead:
 * each rank passes the size's bytes and gets its 1/n block of their sum (f32) right after
 * them in the same block; bus bandwidth is then (n-1)/n * bytes / median, the bytes a ring
 * moves per rank. With --all-gather, dc_all_gather: the size's bytes are the result, each
 * rank's 1/n of it its input, in its own block of the result (as torch's in-place
 * all_gather_into_tensor); bus bandwidth as for a reduce-scatter.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cluster.h"
#include "gloo.h"
#include "iperf.h"
#include "shm_probe.h"
#include "tcp_ring.h"

#define MAX_SIZES 4
#define MAX_RANKS 4
#define GB        1e9

#define PROBE_BYTES (16u << 20)

static const char usage[] =
    "usage: bench_group [--quick] [--out DIR] [--build DIR] [--one-worker] [--plain]\n"
    "                   [--layout RxW]\n"
    "  --one-worker: only the one-worker (shared memory) layouts and the probe, no gloo\n"
    "  --plain: the multi-worker layouts pass malloc'd buffers, not dc_group_alloc ones\n"
    "  --layout RxW: only the layout of R ranks on W workers, no gloo (for A/B runs);\n"
    "                1x1 (one rank: the call's own cost) and 4x2 (two ranks a worker)\n"
    "                only this way\n"
    "  --reduce-scatter: with --layout, time dc_reduce_scatter instead (no results written)\n"
    "  --all-gather: with --layout, time dc_all_gather instead (no results written)\n";

struct options {
    bool one_worker; /* for profiling the shared-memory path alone */
    bool plain;
    dc_op_kind kind;         /* all-reduce, or --reduce-scatter, --all-gather */
    unsigned ranks, workers; /* --layout: only this one (0: all) */
};

static int
extra_arg(int argc, char **argv, int i, void *arg)
{
    struct options *o = arg;

    (void)argc;
    if (strcmp(argv[i], "--one-worker") == 0) {
        o->one_worker = true;
        return 1;
    }
    if (strcmp(argv[i], "--plain") == 0) {
        o->plain = true;
        return 1;
    }
    if (strcmp(argv[i], "--reduce-scatter") == 0 || strcmp(argv[i], "--all-gather") == 0) {
        o->kind = argv[i][2] == 'r' ? DC_OP_REDUCE_SCATTER : DC_OP_ALL_GATHER;
        return 1;
    }
    if (strcmp(argv[i], "--layout") == 0 && i + 1 < argc) {
        char x;
        if (sscanf(argv[i + 1], "%u%c%u", &o->ranks, &x, &o->workers) != 3 || x != 'x' ||
            o->ranks == 0 || o->workers == 0) {
            fprintf(stderr, "bench_group: --layout wants RxW, e.g. 2x2\n");
            return -1;
        }
        return 2;
    }
    return 0;
}

struct plan {
    uint64_t sizes[MAX_SIZES];
    size_t n_sizes;
    double budget_s;
    unsigned min_reps, max_reps;
};

struct layout {
    unsigned ranks, workers;
    bool plain;  /* malloc'd buffers (never for one worker) */
    bool paired; /* also the paired rounds against dc_submit (2x2 only) */
    dc_op_kind kind;
    struct bench_timing dc[MAX_SIZES];
    struct bench_timing pair_group[MAX_SIZES], pair_submit[MAX_SIZES];
    int ran;
};

/* What the rank threads of one layout share. */
struct shared {
    const struct plan *p;
    const char *address;
    unsigned ranks;
    bool shm; /* buffers from dc_group_alloc (all but --plain's multi-worker layouts) */
    /* All-reduces in place, or reduce-scatters into a second buffer after the input, or
     * all-gathers from the rank's own block of the result. */
    dc_op_kind kind;
    char devices[512];
    char self[MAX_RANKS][64];
    pthread_barrier_t barrier;
    unsigned reps;     /* chosen by rank 0 from its warmup, for every rank */
    atomic_int failed; /* any rank failed: the others stop at the next barrier */
    struct bench_timing *out;
    /* The paired rounds (layout.paired): rank 0's series of each. */
    bool paired;
    struct bench_timing *pair_group, *pair_submit;
};

struct rank_arg {
    struct shared *sh;
    unsigned index;
};

static double
busbw(unsigned n, uint64_t bytes, double seconds)
{
    return seconds > 0 ? 2.0 * (n - 1) / n * (double)bytes / seconds : NAN;
}

static unsigned
reps_for(const struct plan *p, double warm_s)
{
    double r = warm_s > 0 ? p->budget_s / warm_s : p->max_reps;

    return r < p->min_reps ? p->min_reps : r > p->max_reps ? p->max_reps : (unsigned)r;
}

/* One timed call of the layout's kind: an all-reduce of buf in place, a reduce-scatter of
 * buf's count floats into this rank's count / n in out, or an all-gather of this rank's
 * count / n at its block of buf into buf; seconds, or -1 (and sh->failed) on failure. */
static double
timed_call(struct shared *sh, dc_group *g, float *buf, float *out, size_t count)
{
    size_t block = count / sh->ranks;
    dc_status st;
    uint64_t t0 = bench_now_ns();
    dc_code code =
        sh->kind == DC_OP_REDUCE_SCATTER
            ? dc_reduce_scatter(g, buf, out, block, DC_DTYPE_F32, DC_REDUCE_SUM, &st)
        : sh->kind == DC_OP_ALL_GATHER
            ? dc_all_gather(g, buf + dc_group_rank(g) * block, buf, block, DC_DTYPE_F32, &st)
            : dc_all_reduce(g, buf, count, DC_DTYPE_F32, DC_REDUCE_SUM, &st);
    double s = (double)(bench_now_ns() - t0) / 1e9;

    if (code != DC_OK) {
        fprintf(stderr, "bench_group: rank %u: %s of %zu floats: %s: %s\n", dc_group_rank(g),
                dc_op_kind_name(sh->kind), count, dc_status_name(code), st.message);
        atomic_store(&sh->failed, 1);
        return -1;
    }
    return s;
}

/* Warmup of one size, the first call checked; the fastest warmup time, or -1. */
static double
warmup(struct shared *sh, dc_group *g, float *buf, float *out, size_t count)
{
    uint32_t rank  = dc_group_rank(g);
    float want     = (float)(sh->ranks * (sh->ranks + 1) / 2);
    double warm    = INFINITY, s;
    const float *r = sh->kind == DC_OP_REDUCE_SCATTER ? out : buf;
    size_t n       = sh->kind == DC_OP_REDUCE_SCATTER ? count / sh->ranks : count;

    for (size_t i = 0; i < count; i++) {
        buf[i] = (float)(rank + 1);
    }
    if (sh->kind == DC_OP_ALL_GATHER) {
        want = (float)sh->ranks; /* the last rank's block; checked at r[n - 1] only */
        n    = count;
    }
    for (int k = 0; k < (count * sizeof(float) >= (16u << 20) ? 1 : 2); k++) {
        if ((s = timed_call(sh, g, buf, out, count)) < 0) {
            return -1;
        }
        if (k == 0 &&
            (sh->kind == DC_OP_ALL_GATHER ? r[0] != 1 || r[n - 1] != want
                                          : r[0] != want || r[n / 2] != want || r[n - 1] != want)) {
            fprintf(stderr, "bench_group: rank %u: %s of %zu floats gave %g, want %g\n", rank,
                    dc_op_kind_name(sh->kind), count, (double)r[n - 1], (double)want);
            atomic_store(&sh->failed, 1);
            return -1;
        }
        memset(buf, 0, count * sizeof(float)); /* sums of zeros stay finite */
        warm = s < warm ? s : warm;
    }
    return warm;
}

/* Fills t from times[reps] (sorted by it). */
static void
timing_set(struct bench_timing *t, uint64_t bytes, double *times, unsigned reps)
{
    t->bytes    = bytes;
    t->reps     = reps;
    t->median_s = bench_percentile(times, reps, 50);
    t->min_s    = times[0];
    t->max_s    = times[reps - 1];
    t->ok       = 1;
}

/* One dc_submit all-reduce of `name` on every rank's device; seconds, or -1 (and
 * sh->failed). */
static double
timed_submit(struct shared *sh, dc_client *client, const dc_device_ref *devs, const char *name)
{
    double s = cluster_submit_all_reduce(client, devs, sh->ranks, name, NULL, "bench_group");

    if (s < 0) {
        atomic_store(&sh->failed, 1);
    }
    return s;
}

/* Rank 0 parks a tensor of `bytes` as `name` on every rank's device and runs one submit of
 * it (the warmup); 0, or -1 (and sh->failed). */
static int
submit_prepare(struct shared *sh, dc_client *client, const dc_device_ref *devs, const char *name,
               uint64_t bytes)
{
    const char *refs[MAX_RANKS];

    for (unsigned r = 0; r < sh->ranks; r++) {
        refs[r] = sh->self[r];
    }
    if (cluster_put_f32(client, refs, sh->ranks, name, bytes, 1e-3f, "bench_group") != 0) {
        atomic_store(&sh->failed, 1);
        return -1;
    }
    return timed_submit(sh, client, devs, name) >= 0 ? 0 : -1;
}

/* The paired rounds of one size (layout.paired): reps times, every rank makes one group call,
 * all started together, then rank 0 one dc_submit while the others wait. Every rank reaches
 * every barrier, failed or not. */
static void
run_paired(struct shared *sh, dc_client *client, dc_group *g, float *buf, size_t count,
           size_t size_index, unsigned reps)
{
    uint64_t bytes = count * sizeof(float);
    bool lead      = g != NULL && dc_group_rank(g) == 0;
    double *tg = NULL, *ts = NULL;
    dc_device_ref *devs = NULL;
    size_t n_devs       = 0;
    char name[64];
    dc_status st;
    unsigned k;

    snprintf(name, sizeof(name), "paired%llu", (unsigned long long)bytes);
    if (lead &&
        ((tg = calloc(reps, sizeof(*tg))) == NULL || (ts = calloc(reps, sizeof(*ts))) == NULL ||
         dc_device_list_parse(sh->devices, &devs, &n_devs, &st) != DC_OK ||
         submit_prepare(sh, client, devs, name, bytes) != 0)) {
        atomic_store(&sh->failed, 1);
    }
    for (k = 0; k < reps; k++) {
        pthread_barrier_wait(&sh->barrier);
        if (buf != NULL && !atomic_load(&sh->failed)) {
            double t = timed_call(sh, g, buf, NULL, count);
            if (lead) {
                tg[k] = t;
            }
        }
        pthread_barrier_wait(&sh->barrier);
        if (lead && !atomic_load(&sh->failed)) {
            ts[k] = timed_submit(sh, client, devs, name);
        }
    }
    if (lead && !atomic_load(&sh->failed)) {
        timing_set(&sh->pair_group[size_index], bytes, tg, reps);
        timing_set(&sh->pair_submit[size_index], bytes, ts, reps);
    }
    if (lead && n_devs > 0) {
        for (unsigned r = 0; r < sh->ranks; r++) {
            dc_tensor_delete(client, sh->self[r], name, &st);
        }
    }
    free(devs);
    free(tg);
    free(ts);
}

/* Every size: warmup, rank 0 picks the repeat count, then the timed calls. Every rank
 * reaches both barriers of every size, failed or not. */
static void
run_sizes(struct shared *sh, dc_client *client, dc_group *g)
{
    const struct plan *p = sh->p;

    for (size_t i = 0; i < p->n_sizes; i++) {
        size_t count = (size_t)(p->sizes[i] / sizeof(float));
        float *buf = NULL, *out = NULL;
        double warm = -1, *times = NULL;
        unsigned reps;
        dc_status st;

        /* A reduce-scatter's output follows its input in the same block: one region, so the
         * call carries no byte on shared memory. */
        size_t alloc =
            (count + (sh->kind == DC_OP_REDUCE_SCATTER ? count / sh->ranks : 0)) * sizeof(float);

        if (!atomic_load(&sh->failed) && g != NULL) {
            buf = sh->shm ? dc_group_alloc(g, alloc, &st) : malloc(alloc);
            if (buf == NULL || (sh->shm && !dc_group_buffer_shared(g, buf))) {
                fprintf(stderr, "bench_group: rank %u: no %s buffer of %zu bytes%s%s\n",
                        dc_group_rank(g), sh->shm ? "shared" : "", alloc,
                        sh->shm && buf == NULL ? ": " : "",
                        sh->shm && buf == NULL ? st.message : "");
                atomic_store(&sh->failed, 1);
                if (sh->shm && buf != NULL) {
                    dc_group_free(g, buf);
                    buf = NULL;
                }
            }
        }

        if (buf != NULL) {
            out  = sh->kind == DC_OP_REDUCE_SCATTER ? buf + count : NULL;
            warm = warmup(sh, g, buf, out, count);
        }
        pthread_barrier_wait(&sh->barrier);
        if (g != NULL && dc_group_rank(g) == 0) {
            sh->reps = reps_for(p, warm);
        }
        pthread_barrier_wait(&sh->barrier);
        reps = sh->reps;
        if (buf != NULL && !atomic_load(&sh->failed) &&
            (times = calloc(reps, sizeof(*times))) != NULL) {
            unsigned k = 0;
            for (; k < reps && (times[k] = timed_call(sh, g, buf, out, count)) >= 0; k++) {
            }
            if (k == reps && dc_group_rank(g) == 0) {
                timing_set(&sh->out[i], p->sizes[i], times, reps);
            }
        }
        free(times);
        if (sh->paired) {
            run_paired(sh, client, g, buf, count, i, p->max_reps);
        }
        if (sh->shm && buf != NULL) {
            dc_group_free(g, buf);
        } else {
            free(buf);
        }
    }
}

static void *
rank_main(void *arg)
{
    struct rank_arg *ra  = arg;
    struct shared *sh    = ra->sh;
    dc_client_options co = { .fail_fast = false, .timeout_ms = 120000 };
    dc_group_options go  = { .timeout_ms = 60000, .call_timeout_ms = 120000 };
    dc_client *client    = NULL;
    dc_group *g          = NULL;
    dc_status st;

    if (dc_client_open(sh->address, &co, &client, &st) != DC_OK) {
        fprintf(stderr, "bench_group: rank thread %u: client: %s\n", ra->index, st.message);
        atomic_store(&sh->failed, 1);
    } else if (dc_group_join(client, sh->devices, sh->self[ra->index], &go, &g, &st) != DC_OK) {
        fprintf(stderr, "bench_group: %s: join: %s: %s\n", sh->self[ra->index],
                dc_status_name(st.code), st.message);
        atomic_store(&sh->failed, 1);
        g = NULL;
    }
    run_sizes(sh, client, g);
    if (g != NULL) {
        dc_group_leave(g, &st);
    }
    if (client != NULL) {
        dc_client_close(client);
    }
    return NULL;
}

static int
run_layout(const struct bench_args *a, const struct plan *p, struct layout *l)
{
    struct shared sh = { .p           = p,
                         .ranks       = l->ranks,
                         .shm         = !l->plain,
                         .kind        = l->kind,
                         .out         = l->dc,
                         .paired      = l->paired,
                         .pair_group  = l->pair_group,
                         .pair_submit = l->pair_submit };
    struct rank_arg args[MAX_RANKS];
    pthread_t threads[MAX_RANKS];
    struct cluster c;
    char tag[32];
    size_t used = 0, started = 0;
    unsigned per = l->ranks / l->workers; /* ranks on each worker */
    int rv;

    snprintf(tag, sizeof(tag), "group%ur%uw", l->ranks, l->workers);
    rv = cluster_start(&c, a, tag, NULL);
    for (unsigned w = 0; w < l->workers && rv == 0; w++) {
        rv = cluster_add_worker_devices(&c, per);
    }
    if (rv != 0) {
        cluster_stop(&c);
        return -1;
    }
    sh.address = c.address;
    for (unsigned r = 0; r < l->ranks; r++) {
        /* per ranks on each worker w0..: cpu:0..cpu:per-1. */
        snprintf(sh.self[r], sizeof(sh.self[r]), "%s/cpu:%u", c.worker_names[r / per], r % per);
        used += (size_t)snprintf(sh.devices + used, sizeof(sh.devices) - used, "%s%s", r ? "," : "",
                                 sh.self[r]);
    }
    atomic_init(&sh.failed, 0);
    pthread_barrier_init(&sh.barrier, NULL, l->ranks);
    for (; started < l->ranks; started++) {
        args[started] = (struct rank_arg){ .sh = &sh, .index = (unsigned)started };
        if (pthread_create(&threads[started], NULL, rank_main, &args[started]) != 0) {
            /* The barrier counts every rank: without them all, nothing can run. */
            fprintf(stderr, "bench_group: cannot start rank threads\n");
            abort();
        }
    }
    for (size_t r = 0; r < started; r++) {
        pthread_join(threads[r], NULL);
    }
    pthread_barrier_destroy(&sh.barrier);
    cluster_stop(&c);
    rv     = atomic_load(&sh.failed) ? -1 : 0;
    l->ran = rv == 0;
    return rv;
}

static const char *
layout_text(const struct layout *l)
{
    return bench_fmt("%u ranks on %u worker%s, %s", l->ranks, l->workers,
                     l->workers == 1 ? "" : "s", l->plain ? "plain buffers" : "dc_group_alloc");
}

/* gloo's timings for `ranks` processes. */
static const struct bench_timing *
gloo_of(struct bench_timing gloo[][MAX_SIZES], unsigned ranks)
{
    return gloo[ranks == 2 ? 0 : 1];
}

static void
print_table(const struct plan *p, const struct layout *l, const struct bench_timing *g)
{
    /* A reduce-scatter's or all-gather's ring moves (n-1)/n of the bytes per rank, half an
     * all-reduce's. */
    double per_call = l->kind != DC_OP_ALL_REDUCE ? 2 : 1;

    printf("\nGroup %s f32 sum, %s; rank 0's time from the call to the result in its "
           "buffer; bus bandwidth = %s(n-1)/n * bytes / median\n",
           l->kind == DC_OP_REDUCE_SCATTER ? "reduce-scatter (bytes: each rank's input)"
           : l->kind == DC_OP_ALL_GATHER   ? "all-gather (bytes: each rank's result)"
                                           : "all-reduce",
           layout_text(l), l->kind != DC_OP_ALL_REDUCE ? "" : "2");
    printf("%-8s | %12s %12s %12s %9s %5s | %12s %9s %5s | %8s\n", "size", "median", "min", "max",
           "GB/s", "reps", "gloo", "GB/s", "reps", "dc/gloo");
    for (size_t i = 0; i < p->n_sizes; i++) {
        const struct bench_timing *d = &l->dc[i], *q = &g[i];
        printf("%-8s | %9.1f us %9.1f us %9.1f us %9.3f %5u | %9.1f us %9.3f %5u | %7.2fx\n",
               bench_size_text(p->sizes[i]), d->ok ? d->median_s * 1e6 : NAN,
               d->ok ? d->min_s * 1e6 : NAN, d->ok ? d->max_s * 1e6 : NAN,
               d->ok ? busbw(l->ranks, d->bytes, d->median_s) / per_call / GB : NAN, d->reps,
               q->ok ? q->median_s * 1e6 : NAN,
               q->ok ? busbw(l->ranks, q->bytes, q->median_s) / GB : NAN, q->reps,
               d->ok && q->ok ? d->median_s / q->median_s : NAN);
    }
}

/* The paired rounds of a layout: the group call's and dc_submit's medians, side by side. */
static void
print_paired(const struct plan *p, const struct layout *l)
{
    printf("\nPaired rounds, %s: one group call (rank 0's time) then one dc_submit all-reduce "
           "of the same size on the same devices (the controller's time), alternating\n",
           layout_text(l));
    printf("%-8s | %12s %5s | %12s %5s | %12s\n", "size", "group", "reps", "submit", "reps",
           "submit/group");
    for (size_t i = 0; i < p->n_sizes; i++) {
        const struct bench_timing *g = &l->pair_group[i], *s = &l->pair_submit[i];
        printf("%-8s | %9.1f us %5u | %9.1f us %5u | %11.2fx\n", bench_size_text(p->sizes[i]),
               g->ok ? g->median_s * 1e6 : NAN, g->reps, s->ok ? s->median_s * 1e6 : NAN, s->reps,
               g->ok && s->ok ? s->median_s / g->median_s : NAN);
    }
}

static void
json_points(FILE *f, unsigned ranks, const struct bench_timing *t, size_t n)
{
    int first = 1;

    for (size_t i = 0; i < n; i++) {
        if (!t[i].ok) {
            continue;
        }
        fprintf(f,
                "%s\n      {\"bytes\": %llu, \"median_s\": %.9f, \"min_s\": %.9f, \"max_s\": "
                "%.9f, \"reps\": %u, \"busbw_gbs\": %.4f}",
                first ? "" : ",", (unsigned long long)t[i].bytes, t[i].median_s, t[i].min_s,
                t[i].max_s, t[i].reps, busbw(ranks, t[i].bytes, t[i].median_s) / GB);
        first = 0;
    }
    fprintf(f, "]}");
}

static void
write_results(const struct bench_args *a, const struct plan *p, const struct layout *ls, size_t nl,
              struct bench_timing gloo[][MAX_SIZES], double probe_s, double bidir,
              const double *ring_s)
{
    struct bench_summary sum;
    FILE *f;

    if ((f = bench_result_open(a, "group.json")) != NULL) {
        fprintf(f, "{\"bench\": \"group\",\n \"note\": \"devcoord: dc_all_reduce on a joined "
                   "group, rank 0's time from the call to the result in its buffer (ranks are "
                   "threads of one process, a client each); gloo: one all_reduce on rank 0 of "
                   "as many processes\",\n \"dtype\": \"f32\", \"op\": \"sum\",\n");
        if (probe_s > 0) {
            fprintf(f,
                    " \"shm_probe\": {\"bytes\": %u, \"median_s\": %.9f, \"busbw_gbs\": %.4f},\n",
                    PROBE_BYTES, probe_s, busbw(2, PROBE_BYTES, probe_s) / GB);
        }
        for (unsigned w = 2; w <= 4; w += 2) {
            if (ring_s[w] > 0) {
                fprintf(f,
                        " \"tcp_ring_probe_%u\": {\"bytes\": %u, \"median_s\": %.9f, "
                        "\"busbw_gbs\": %.4f},\n",
                        w, PROBE_BYTES, ring_s[w], busbw(w, PROBE_BYTES, ring_s[w]) / GB);
            }
        }
        fprintf(f, " \"runs\": [");
        for (size_t k = 0; k < nl; k++) {
            fprintf(f,
                    "\n    {\"system\": \"devcoord\", \"ranks\": %u, \"workers\": %u, "
                    "\"memory\": \"%s\", \"points\": [",
                    ls[k].ranks, ls[k].workers,
                    ls[k].plain ? "streamed to the worker" : "dc_group_alloc");
            json_points(f, ls[k].ranks, ls[k].dc, p->n_sizes);
            fprintf(f, ",");
            if (ls[k].paired) {
                fprintf(f,
                        "\n    {\"system\": \"devcoord, paired rounds: group call\", \"ranks\": "
                        "%u, \"workers\": %u, \"points\": [",
                        ls[k].ranks, ls[k].workers);
                json_points(f, ls[k].ranks, ls[k].pair_group, p->n_sizes);
                fprintf(f,
                        ",\n    {\"system\": \"devcoord, paired rounds: dc_submit\", \"ranks\": "
                        "%u, \"workers\": %u, \"points\": [",
                        ls[k].ranks, ls[k].workers);
                json_points(f, ls[k].ranks, ls[k].pair_submit, p->n_sizes);
                fprintf(f, ",");
            }
        }
        for (unsigned r = 2; r <= 4; r += 2) {
            fprintf(f, "\n    {\"system\": \"gloo\", \"ranks\": %u, \"points\": [", r);
            json_points(f, r, gloo_of(gloo, r), p->n_sizes);
            fprintf(f, r == 2 ? "," : "\n ]}\n");
        }
        fclose(f);
    }
    /* gnuplot: bytes, then rank 0's median time (us) of every layout, then gloo 2 and 4. */
    if ((f = bench_result_open(a, "group.dat")) != NULL) {
        fprintf(f, "# bytes");
        for (size_t k = 0; k < nl; k++) {
            fprintf(f, " dc%ur%uw", ls[k].ranks, ls[k].workers);
        }
        fprintf(f, " gloo2 gloo4 (median us)\n");
        for (size_t i = 0; i < p->n_sizes; i++) {
            fprintf(f, "%llu", (unsigned long long)p->sizes[i]);
            for (size_t k = 0; k < nl; k++) {
                fprintf(f, " %.1f", ls[k].dc[i].ok ? ls[k].dc[i].median_s * 1e6 : NAN);
            }
            for (unsigned r = 2; r <= 4; r += 2) {
                const struct bench_timing *g = &gloo_of(gloo, r)[i];
                fprintf(f, " %.1f", g->ok ? g->median_s * 1e6 : NAN);
            }
            fprintf(f, "\n");
        }
        fclose(f);
    }
    /* The summary rows: each with issue 17's goal for it, or none. */
    if (bench_summary_open(&sum, a, "group") != 0) {
        return;
    }
    for (size_t k = 0; k < nl; k++) {
        for (size_t i = 0; i < p->n_sizes; i++) {
            const struct bench_timing *d = &ls[k].dc[i], *g = &gloo_of(gloo, ls[k].ranks)[i];
            double ratio = d->ok && g->ok ? d->median_s / g->median_s : NAN;
            const char *goal;
            int met = -1;

            /* Issue 17's goals: across workers, 4 KiB in <= 0.5x gloo's time (2 workers) or
             * 0.8x (4 workers), 16 MiB at >= 1.2x gloo's bus bandwidth; on one worker, 16 MiB
             * at >= 8x gloo's. */
            if (p->sizes[i] <= 4096 && ls[k].workers > 1) {
                double want = ls[k].workers == 2 ? 0.5 : 0.8;
                goal        = bench_fmt("<= %.1fx gloo time (issue 17)", want);
                met         = isnan(ratio) ? -1 : ratio <= want;
            } else if (p->sizes[i] >= (16u << 20) && ls[k].workers == 1) {
                goal = "bus BW >= 8x gloo: time <= 0.125x (issue 17)";
                met  = isnan(ratio) ? -1 : ratio <= 1 / 8.0;
            } else if (p->sizes[i] >= (16u << 20)) {
                goal = "bus BW >= 1.2x gloo: time <= 0.833x (issue 17)";
                met  = isnan(ratio) ? -1 : ratio <= 1 / 1.2;
            } else {
                goal = "- (issue 17 sets none)";
            }
            bench_summary_row(
                &sum,
                bench_fmt("group all-reduce %s, %s: time", bench_size_text(p->sizes[i]),
                          layout_text(&ls[k])),
                d->ok ? bench_fmt("%.1f us", d->median_s * 1e6) : "-",
                g->ok ? bench_fmt("gloo %u procs %.1f us", ls[k].ranks, g->median_s * 1e6) : "-",
                ratio, goal, met);
            if (ls[k].workers == 2 && p->sizes[i] == PROBE_BYTES) {
                /* The TCP limit of a 2-worker ring: what one direction of iperf3 --bidir gets. */
                double bw = d->ok ? busbw(ls[k].ranks, d->bytes, d->median_s) : NAN;
                double r  = isnan(bw) || isnan(bidir) ? NAN : bw / bidir;
                bench_summary_row(
                    &sum,
                    bench_fmt("group all-reduce %s, %s: bus BW", bench_size_text(p->sizes[i]),
                              layout_text(&ls[k])),
                    d->ok ? bench_fmt("%.2f GB/s", bw / GB) : "-",
                    isnan(bidir) ? "-" : bench_fmt("iperf3 --bidir %.2f GB/s", bidir / GB), r,
                    ">= 0.9x --bidir per direction (issue 17)", isnan(r) ? -1 : r >= 0.9);
            }
            if (ls[k].workers > 1 && p->sizes[i] == PROBE_BYTES) {
                /* The ring's bytes alone, over a bare loopback TCP ring (tcp_ring.c). */
                double pr = ring_s[ls[k].workers];
                double r  = d->ok && pr > 0 ? d->median_s / pr : NAN;
                bench_summary_row(&sum,
                                  bench_fmt("group all-reduce %s, %s: time over a bare TCP ring",
                                            bench_size_text(p->sizes[i]), layout_text(&ls[k])),
                                  d->ok ? bench_fmt("%.1f us", d->median_s * 1e6) : "-",
                                  pr > 0 ? bench_fmt("TCP ring probe %.1f us", pr * 1e6) : "-", r,
                                  "- (the same bytes, no reduce: a reference)", -1);
            }
            if (ls[k].paired) {
                /* Issue 17: SubmitOp all-reduce of 16 MiB within 10 % of the group path. */
                const struct bench_timing *pg = &ls[k].pair_group[i], *ps = &ls[k].pair_submit[i];
                double r = pg->ok && ps->ok ? ps->median_s / pg->median_s : NAN;
                bool big = p->sizes[i] >= PROBE_BYTES;
                bench_summary_row(
                    &sum,
                    bench_fmt("SubmitOp all-reduce %s, %u workers, paired with the group path",
                              bench_size_text(p->sizes[i]), ls[k].workers),
                    ps->ok ? bench_fmt("%.1f us", ps->median_s * 1e6) : "-",
                    pg->ok ? bench_fmt("group call %.1f us", pg->median_s * 1e6) : "-", r,
                    big ? "<= 1.1x the group path (issue 17)" : "- (issue 17 sets none)",
                    big && !isnan(r) ? r <= 1.1 : -1);
            }
            if (ls[k].workers == 1 && p->sizes[i] == PROBE_BYTES) {
                /* The shared-memory limit: bus bandwidth against the 2-thread probe's. */
                double bw = d->ok ? busbw(ls[k].ranks, d->bytes, d->median_s) : NAN;
                double pb = probe_s > 0 ? busbw(2, PROBE_BYTES, probe_s) : NAN;
                double r  = isnan(bw) || isnan(pb) ? NAN : bw / pb;
                bench_summary_row(&sum,
                                  bench_fmt("group all-reduce %s, %s: bus BW",
                                            bench_size_text(p->sizes[i]), layout_text(&ls[k])),
                                  d->ok ? bench_fmt("%.2f GB/s", bw / GB) : "-",
                                  probe_s > 0 ? bench_fmt("shm probe %.2f GB/s", pb / GB) : "-", r,
                                  ">= 0.5x the shm probe (issue 17)", isnan(r) ? -1 : r >= 0.5);
            }
        }
    }
    bench_summary_close(&sum);
}

int
main(int argc, char **argv)
{
    struct bench_args a;
    struct plan p      = { .sizes = { 4096, 1u << 20, 16u << 20 }, .n_sizes = 3 };
    struct layout ls[] = { { .ranks = 2, .workers = 2 },
                           { .ranks = 4, .workers = 4 },
                           { .ranks = 2, .workers = 1 },
                           { .ranks = 4, .workers = 1 },
                           /* Only with --layout 4x2: two ranks on each of two workers, as
                            * nodes of two accelerators are run. */
                           { .ranks = 4, .workers = 2 },
                           /* Only with --layout 1x1: one rank's call to its worker and back,
                            * nothing to wait for (the call's own cost). */
                           { .ranks = 1, .workers = 1 } };
    struct bench_timing gloo[2][MAX_SIZES] = { { { 0 } } };
    size_t nl                              = sizeof(ls) / sizeof(ls[0]);
    double probe_s, bidir = NAN, ring_s[5] = { -1, -1, -1, -1, -1 };
    struct options o = { false, false, DC_OP_ALL_REDUCE, 0, 0 };
    int rv;

    bench_init();
    if ((rv = bench_parse_args(argc, argv, &a, usage, extra_arg, &o)) != 0) {
        return rv;
    }
    if (o.kind != DC_OP_ALL_REDUCE && o.ranks == 0) {
        fprintf(stderr, "bench_group: --reduce-scatter and --all-gather want --layout RxW\n");
        return 2;
    }
    if (o.ranks == 0) {
        nl -= 2; /* no 4x2, no 1x1 */
    }
    for (size_t k = 0; k < nl; k++) {
        ls[k].plain  = o.plain && ls[k].workers > 1;
        ls[k].paired = ls[k].ranks == 2 && ls[k].workers == 2 && o.kind == DC_OP_ALL_REDUCE;
        ls[k].kind   = o.kind;
    }
    p.budget_s = a.quick ? 0.5 : 2.0;
    p.min_reps = a.quick ? 3 : 5;
    p.max_reps = a.quick ? 20 : 50;
    printf("multi-worker layouts: %s\n", o.plain ? "plain buffers" : "dc_group_alloc");
    probe_s = bench_shm_probe(PROBE_BYTES, a.quick ? 5 : 20);
    if (probe_s > 0) {
        printf("shared-memory probe (2 threads, 16 MiB f32): %.1f us, bus BW %.2f GB/s\n",
               probe_s * 1e6, busbw(2, PROBE_BYTES, probe_s) / GB);
    }
    if (!o.one_worker && o.ranks == 0) {
        bidir = bench_iperf(a.quick ? 1 : 3, 1);
        printf("loopback TCP (iperf3 --bidir): %.3f GB/s per direction\n", bidir / GB);
        for (unsigned w = 2; w <= 4; w += 2) {
            ring_s[w] = bench_tcp_ring(w, PROBE_BYTES, a.quick ? 5 : 20);
            printf("loopback TCP ring of %u processes, a 16 MiB all-reduce's bytes: %.1f us\n", w,
                   ring_s[w] * 1e6);
        }
    }
    for (unsigned r = 2; r <= 4 && !o.one_worker && o.ranks == 0; r += 2) {
        printf("running gloo all-reduce with %u processes ...\n", r);
        fflush(stdout);
        if (bench_gloo_run("bench_group", r, p.sizes, p.n_sizes, p.budget_s, p.min_reps, p.max_reps,
                           gloo[r == 2 ? 0 : 1]) < 0) {
            fprintf(stderr, "bench_group: gloo run with %u processes failed\n", r);
        }
    }
    for (size_t k = 0; k < nl; k++) {
        if ((o.one_worker && ls[k].workers != 1) ||
            (o.ranks != 0 && (ls[k].ranks != o.ranks || ls[k].workers != o.workers))) {
            continue;
        }
        printf("running the group all-reduce, %s ...\n", layout_text(&ls[k]));
        fflush(stdout);
        if (run_layout(&a, &p, &ls[k]) != 0) {
            fprintf(stderr, "bench_group: %s failed\n", layout_text(&ls[k]));
        }
        print_table(&p, &ls[k], gloo_of(gloo, ls[k].ranks));
        if (ls[k].paired) {
            print_paired(&p, &ls[k]);
        }
    }
    if (o.kind == DC_OP_ALL_REDUCE) {
        write_results(&a, &p, ls, nl, gloo, probe_s, bidir, ring_s);
    }
    return 0;
}
