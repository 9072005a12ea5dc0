/*
 * All-reduce bus bandwidth (issue 5, item 1): devcoord with 2 and 4 real devcoord-worker
 * processes (one cpu:0 device each) against torch.distributed's gloo backend on the same
 * number of processes over 127.0.0.1, and iperf3's single-stream loopback TCP throughput as
 * the limit. f32 sum, tensors put once per size, then dc_submit repeated; the median op time
 * gives bus bandwidth = 2(n-1)/n * bytes / time.
 *
 * devcoord's time is the whole dc_submit round trip: the client's call to the coordinator,
 * validation and planning, the fan-out to every worker, the workers' ring exchange and the
 * replies back. gloo's is one all_reduce call on rank 0 (no coordinator in its path).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "cluster.h"
#include "gloo.h"
#include "iperf.h"
#include "shm_probe.h"

#define MAX_SIZES       16
#define GB              1e9
#define SHM_PROBE_BYTES (16u << 20)

static const char usage[] =
    "usage: bench_allreduce [--quick] [--out DIR] [--build DIR]\n"
    "                       [--small REPS [--workers N] [--bytes B]]\n"
    "  --small REPS: only dc_submit of B (4096) bytes over N (2) workers, REPS times after a "
    "warmup; "
    "prints\n"
    "  the median and writes nothing (for A/B runs of two builds: bench/submit_ab.sh)\n";

struct point {
    uint64_t bytes;
    double median_s, min_s, max_s;
    double coord_elapsed_s;  /* the coordinator's own elapsed_us for the op, median */
    double worker_elapsed_s; /* the slowest worker's Execute (its own elapsed_us), median */
    unsigned reps;
    int ok;
};

struct run {
    unsigned workers;
    struct point dc[MAX_SIZES];
    struct point gloo[MAX_SIZES];
    int have_gloo;
};

struct plan {
    uint64_t sizes[MAX_SIZES];
    size_t n_sizes;
    double budget_s;
    unsigned min_reps, max_reps;
};

static double
busbw(unsigned n, uint64_t bytes, double seconds)
{
    if (seconds <= 0) {
        return NAN;
    }
    return 2.0 * (n - 1) / n * (double)bytes / seconds;
}

static unsigned
reps_for(const struct plan *p, double warm_s)
{
    double r = warm_s > 0 ? p->budget_s / warm_s : p->max_reps;

    if (r < p->min_reps) {
        return p->min_reps;
    }
    if (r > p->max_reps) {
        return p->max_reps;
    }
    return (unsigned)r;
}

static int
put_all(struct cluster *c, const char *name, uint64_t bytes)
{
    char devs[CLUSTER_MAX_WORKERS][64];
    const char *refs[CLUSTER_MAX_WORKERS];

    for (size_t w = 0; w < c->n_workers; w++) {
        snprintf(devs[w], sizeof(devs[w]), "%s/cpu:0", c->worker_names[w]);
        refs[w] = devs[w];
    }
    return cluster_put_f32(c->client, refs, c->n_workers, name, bytes, 1e-3f, "bench_allreduce");
}

static void
delete_all(struct cluster *c, const char *name)
{
    char dev[64];
    dc_status st;

    for (size_t w = 0; w < c->n_workers; w++) {
        snprintf(dev, sizeof(dev), "%s/cpu:0", c->worker_names[w]);
        dc_tensor_delete(c->client, dev, name, &st);
    }
}

/* One timed all-reduce; seconds, or -1 on failure. coord_s, worker_s (may be NULL): the
 * coordinator's time for it and the slowest worker's Execute. */
static double
one_op(struct cluster *c, const dc_device_ref *devs, const char *name, double *coord_s,
       double *worker_s)
{
    dc_op_result *res = NULL;
    double s =
        cluster_submit_all_reduce(c->client, devs, c->n_workers, name, &res, "bench_allreduce");

    if (s < 0) {
        return -1;
    }
    if (coord_s != NULL) {
        *coord_s = res != NULL ? (double)res->elapsed_us / 1e6 : 0;
    }
    if (worker_s != NULL) {
        *worker_s = 0;
        for (size_t i = 0; res != NULL && i < res->n_results; i++) {
            double w  = (double)res->results[i].elapsed_us / 1e6;
            *worker_s = w > *worker_s ? w : *worker_s;
        }
    }
    dc_op_result_free(res);
    return s;
}

static int
run_devcoord(const struct bench_args *a, const struct plan *p, struct run *r)
{
    dc_device_ref devs[CLUSTER_MAX_WORKERS];
    struct cluster c;
    char tag[32], name[64];
    int rv = 0;

    snprintf(tag, sizeof(tag), "allreduce%u", r->workers);
    if (cluster_start(&c, a, tag, NULL) != 0 || cluster_add_workers(&c, r->workers) != 0) {
        cluster_stop(&c);
        return -1;
    }
    for (size_t w = 0; w < r->workers; w++) {
        cluster_device(&c, w, &devs[w]);
    }
    for (size_t i = 0; i < p->n_sizes && rv == 0; i++) {
        struct point *pt = &r->dc[i];
        double *times, *coord, *worker, warm = INFINITY, s;
        unsigned reps;

        pt->bytes = p->sizes[i];
        snprintf(name, sizeof(name), "ar%llu", (unsigned long long)p->sizes[i]);
        if (put_all(&c, name, p->sizes[i]) != 0) {
            rv = -1;
            break;
        }
        for (int k = 0; k < (p->sizes[i] >= (16u << 20) ? 1 : 2); k++) {
            if ((s = one_op(&c, devs, name, NULL, NULL)) < 0) {
                rv = -1;
                break;
            }
            warm = s < warm ? s : warm;
        }
        if (rv != 0) {
            break;
        }
        reps   = reps_for(p, warm);
        times  = calloc(reps, sizeof(*times));
        coord  = calloc(reps, sizeof(*coord));
        worker = calloc(reps, sizeof(*worker));
        if (times == NULL || coord == NULL || worker == NULL) {
            free(times);
            free(coord);
            free(worker);
            rv = -1;
            break;
        }
        for (unsigned k = 0; k < reps; k++) {
            if ((times[k] = one_op(&c, devs, name, &coord[k], &worker[k])) < 0) {
                rv = -1;
                break;
            }
        }
        if (rv == 0) {
            pt->reps             = reps;
            pt->median_s         = bench_percentile(times, reps, 50);
            pt->min_s            = times[0];
            pt->max_s            = times[reps - 1];
            pt->coord_elapsed_s  = bench_percentile(coord, reps, 50);
            pt->worker_elapsed_s = bench_percentile(worker, reps, 50);
            pt->ok               = 1;
        }
        free(times);
        free(coord);
        free(worker);
        delete_all(&c, name);
    }
    cluster_stop(&c);
    return rv;
}

static int
run_gloo(const struct plan *p, struct run *r)
{
    struct bench_timing t[MAX_SIZES] = { { 0 } };
    int rv = bench_gloo_run("bench_allreduce", r->workers, p->sizes, p->n_sizes, p->budget_s,
                            p->min_reps, p->max_reps, t);

    for (size_t i = 0; rv > 0 && i < p->n_sizes; i++) {
        struct point *pt = &r->gloo[i];
        pt->bytes        = t[i].bytes;
        pt->median_s     = t[i].median_s;
        pt->min_s        = t[i].min_s;
        pt->max_s        = t[i].max_s;
        pt->reps         = t[i].reps;
        pt->ok           = t[i].ok;
    }
    r->have_gloo = rv > 0;
    return rv < 0 ? -1 : 0;
}

static void
print_table(const struct plan *p, const struct run *r)
{
    printf("\nAll-reduce f32 sum, %u workers (one cpu:0 device each); bus bandwidth = "
           "2(n-1)/n * bytes / median time\n",
           r->workers);
    printf("devcoord time = dc_submit round trip through the coordinator (validate, plan, "
           "fan-out, ring exchange, replies)\n");
    printf("%-8s | %12s %12s %10s %5s | %12s %10s %5s | %8s\n", "size", "devcoord", "(coord)",
           "GB/s", "reps", "gloo", "GB/s", "reps", "dc/gloo");
    for (size_t i = 0; i < p->n_sizes; i++) {
        const struct point *d = &r->dc[i], *g = &r->gloo[i];
        double bd = d->ok ? busbw(r->workers, d->bytes, d->median_s) / GB : NAN;
        double bg = g->ok ? busbw(r->workers, g->bytes, g->median_s) / GB : NAN;
        printf("%-8s | %10.1f us %10.1f us %10.3f %5u | %10.1f us %10.3f %5u | %7.2fx\n",
               bench_size_text(p->sizes[i]), d->median_s * 1e6, d->coord_elapsed_s * 1e6, bd,
               d->reps, g->median_s * 1e6, bg, g->reps, bd / bg);
    }
}

static void
json_points(FILE *f, const char *system, unsigned workers, const struct point *pts, size_t n)
{
    int first = 1;

    fprintf(f, "    {\"system\": \"%s\", \"workers\": %u, \"points\": [", system, workers);
    for (size_t i = 0; i < n; i++) {
        if (!pts[i].ok) {
            continue;
        }
        fprintf(f,
                "%s\n      {\"bytes\": %llu, \"median_s\": %.9f, \"min_s\": %.9f, \"max_s\": "
                "%.9f, \"reps\": %u, \"busbw_gbs\": %.4f",
                first ? "" : ",", (unsigned long long)pts[i].bytes, pts[i].median_s, pts[i].min_s,
                pts[i].max_s, pts[i].reps, busbw(workers, pts[i].bytes, pts[i].median_s) / GB);
        if (strcmp(system, "devcoord") == 0) {
            fprintf(f, ", \"coordinator_elapsed_s\": %.9f", pts[i].coord_elapsed_s);
        }
        fprintf(f, "}");
        first = 0;
    }
    fprintf(f, "]}");
}

static size_t
size_index(const struct plan *p, uint64_t bytes)
{
    for (size_t i = 0; i < p->n_sizes; i++) {
        if (p->sizes[i] == bytes) {
            return i;
        }
    }
    return SIZE_MAX;
}

struct small_opts {
    uint64_t reps, workers, bytes;
};

static int
small_arg(int argc, char **argv, int i, void *arg)
{
    struct small_opts *o = arg;

    if (i + 1 >= argc) {
        return 0;
    }
    if (strcmp(argv[i], "--small") == 0) {
        return bench_parse_u64(argv[i + 1], 1, 100000, "--small", &o->reps) == 0 ? 2 : -1;
    }
    if (strcmp(argv[i], "--workers") == 0) {
        return bench_parse_u64(argv[i + 1], 2, 4, "--workers", &o->workers) == 0 ? 2 : -1;
    }
    if (strcmp(argv[i], "--bytes") == 0) {
        return bench_parse_u64(argv[i + 1], 4, 1u << 30, "--bytes", &o->bytes) == 0 ? 2 : -1;
    }
    return 0;
}

/* --small: one cell, the single-controller path's latency at one size (4 KiB unless
 * --bytes), nothing else. */
static int
run_small(const struct bench_args *a, const struct small_opts *o)
{
    struct plan p = { .sizes = { o->bytes / 4 * 4 }, .n_sizes = 1, .budget_s = 1e9 };
    struct run r  = { .workers = (unsigned)o->workers };

    p.min_reps = p.max_reps = (unsigned)o->reps;
    if (run_devcoord(a, &p, &r) != 0 || !r.dc[0].ok) {
        fprintf(stderr, "bench_allreduce: the %s run failed\n", bench_size_text(p.sizes[0]));
        return 1;
    }
    printf("submit all-reduce %s, %u workers: median_us=%.1f coord_us=%.1f worker_us=%.1f "
           "min_us=%.1f reps=%u\n",
           bench_size_text(p.sizes[0]), r.workers, r.dc[0].median_s * 1e6,
           r.dc[0].coord_elapsed_s * 1e6, r.dc[0].worker_elapsed_s * 1e6, r.dc[0].min_s * 1e6,
           r.dc[0].reps);
    return 0;
}

int
main(int argc, char **argv)
{
    struct bench_args a;
    struct plan p      = { 0 };
    struct run runs[2] = { { .workers = 2 }, { .workers = 4 } };
    struct bench_summary sum;
    double loop, bidir, shm_s, shm;
    size_t i16, i4;
    FILE *f;
    int rv;

    struct small_opts small = { .reps = 0, .workers = 2, .bytes = 4096 };

    bench_init();
    if ((rv = bench_parse_args(argc, argv, &a, usage, small_arg, &small)) != 0) {
        return rv;
    }
    if (small.reps > 0) {
        return run_small(&a, &small);
    }
    if (a.quick) {
        const uint64_t q[] = { 4096, 65536, 1u << 20, 16u << 20 };
        memcpy(p.sizes, q, sizeof(q));
        p.n_sizes  = 4;
        p.budget_s = 0.5;
        p.min_reps = 3;
        p.max_reps = 20;
    } else {
        for (uint64_t s = 4096; s <= (64u << 20); s *= 4) {
            p.sizes[p.n_sizes++] = s;
        }
        /* Up to 300 ops a cell, as the budget allows (both sides alike): the small sizes' cells
         * are a fraction of a second each, and 50 ops' median swung by a third between runs. */
        p.budget_s = 2.0;
        p.min_reps = 5;
        p.max_reps = 300;
    }
    loop  = bench_iperf(a.quick ? 1 : 3, 0);
    bidir = bench_iperf(a.quick ? 1 : 3, 1);
    shm_s = bench_shm_probe(SHM_PROBE_BYTES, a.quick ? 5 : 20);
    shm   = shm_s > 0 ? (double)SHM_PROBE_BYTES / shm_s : NAN; /* 2 ranks: busbw = bytes/t */
    printf("loopback TCP (iperf3): one stream %.3f GB/s; --bidir %.3f GB/s per direction\n",
           loop / GB, bidir / GB);
    printf("shared-memory probe (2 threads all-reduce 16 MiB f32): %.3f ms, %.3f GB/s\n",
           shm_s * 1e3, shm / GB);
    for (size_t r = 0; r < 2; r++) {
        printf("running devcoord all-reduce with %u workers ...\n", runs[r].workers);
        fflush(stdout);
        if (run_devcoord(&a, &p, &runs[r]) != 0) {
            fprintf(stderr, "bench_allreduce: devcoord run with %u workers failed\n",
                    runs[r].workers);
        }
        printf("running gloo all-reduce with %u processes ...\n", runs[r].workers);
        fflush(stdout);
        if (run_gloo(&p, &runs[r]) != 0) {
            fprintf(stderr, "bench_allreduce: gloo run with %u processes failed\n",
                    runs[r].workers);
        }
        print_table(&p, &runs[r]);
    }

    if ((f = bench_result_open(&a, "allreduce.json")) != NULL) {
        fprintf(f,
                "{\"bench\": \"allreduce\",\n \"note\": \"devcoord time is the dc_submit round "
                "trip through the coordinator (validate, plan, fan-out, ring exchange among the "
                "workers, replies); gloo time is one all_reduce call on rank 0\",\n"
                " \"dtype\": \"f32\", \"op\": \"sum\", \"loopback_tcp_gbs\": %.4f,\n"
                " \"loopback_tcp_bidir_per_direction_gbs\": %.4f,\n"
                " \"shm_probe\": {\"bytes\": %u, \"median_s\": %.9f, \"busbw_gbs\": %.4f},\n"
                " \"runs\": [\n",
                loop / GB, bidir / GB, SHM_PROBE_BYTES, shm_s, shm / GB);
        for (size_t r = 0; r < 2; r++) {
            json_points(f, "devcoord", runs[r].workers, runs[r].dc, p.n_sizes);
            fprintf(f, ",\n");
            json_points(f, "gloo", runs[r].workers, runs[r].gloo, p.n_sizes);
            fprintf(f, r == 0 ? ",\n" : "\n");
        }
        fprintf(f, " ]}\n");
        fclose(f);
    }
    /* gnuplot data: bytes, then GB/s of devcoord and gloo at 2 and 4 workers, and loopback. */
    if ((f = bench_result_open(&a, "allreduce.dat")) != NULL) {
        fprintf(f, "# bytes dc2 gloo2 dc4 gloo4 loopback (GB/s)\n");
        for (size_t i = 0; i < p.n_sizes; i++) {
            fprintf(f, "%llu", (unsigned long long)p.sizes[i]);
            for (size_t r = 0; r < 2; r++) {
                const struct point *d = &runs[r].dc[i], *g = &runs[r].gloo[i];
                fprintf(f, " %.4f %.4f",
                        d->ok ? busbw(runs[r].workers, d->bytes, d->median_s) / GB : NAN,
                        g->ok ? busbw(runs[r].workers, g->bytes, g->median_s) / GB : NAN);
            }
            fprintf(f, " %.4f\n", loop / GB);
        }
        fclose(f);
    }

    if (bench_summary_open(&sum, &a, "allreduce") == 0) {
        i16 = size_index(&p, 16u << 20);
        i4  = size_index(&p, 4096);
        for (size_t r = 0; r < 2; r++) {
            unsigned n = runs[r].workers;
            if (i16 != SIZE_MAX) {
                const struct point *d = &runs[r].dc[i16], *g = &runs[r].gloo[i16];
                double bd = d->ok ? busbw(n, d->bytes, d->median_s) : NAN;
                double bg = g->ok ? busbw(n, g->bytes, g->median_s) : NAN;
                bench_summary_row(&sum, bench_fmt("all-reduce 16 MiB, %u workers: bus BW", n),
                                  bench_fmt("%.3f GB/s", bd / GB),
                                  g->ok ? bench_fmt("gloo %.3f GB/s", bg / GB) : "-", bd / bg,
                                  ">= 1.6x gloo", isnan(bd / bg) ? -1 : bd / bg >= 1.6);
                if (n == 2) { /* a 2-rank ring sends both ways at once: --bidir is its limit */
                    bench_summary_row(
                        &sum, "all-reduce 16 MiB, 2 workers: vs --bidir (per direction)",
                        bench_fmt("%.3f GB/s", bd / GB),
                        isnan(bidir) ? "-" : bench_fmt("iperf3 --bidir %.3f GB/s", bidir / GB),
                        bd / bidir, ">= 0.9x --bidir", isnan(bd / bidir) ? -1 : bd / bidir >= 0.9);
                    bench_summary_row(&sum, "all-reduce 16 MiB, 2 ranks: vs shared-memory probe",
                                      bench_fmt("%.3f GB/s", bd / GB),
                                      isnan(shm) ? "-" : bench_fmt("probe %.3f GB/s", shm / GB),
                                      bd / shm, "(limit of shared memory)", -1);
                }
                bench_summary_row(&sum, bench_fmt("all-reduce 16 MiB, %u workers: vs loopback", n),
                                  bench_fmt("%.3f GB/s", bd / GB),
                                  isnan(loop) ? "-" : bench_fmt("iperf3 %.3f GB/s", loop / GB),
                                  bd / loop, ">= 0.75x loopback",
                                  isnan(bd / loop) ? -1 : bd / loop >= 0.75);
            }
            if (i4 != SIZE_MAX) {
                const struct point *d = &runs[r].dc[i4], *g = &runs[r].gloo[i4];
                double ratio = d->ok && g->ok ? d->median_s / g->median_s : NAN;
                bench_summary_row(&sum, bench_fmt("all-reduce 4 KiB, %u workers: time", n),
                                  d->ok ? bench_fmt("%.1f us", d->median_s * 1e6) : "-",
                                  g->ok ? bench_fmt("gloo %.1f us", g->median_s * 1e6) : "-", ratio,
                                  "<= 1.5x gloo time (issue 17)", isnan(ratio) ? -1 : ratio <= 1.5);
            }
        }
        bench_summary_close(&sum);
    }
    return 0;
}
