/*
 * Fan-out (issue 5, item 5): SubmitOp barrier latency against the number of workers (1, 2,
 * 4, 8, 16, 32 real devcoord-worker processes, one cpu:0 device each), and the cost of each
 * extra worker as the slope of a least-squares line through the medians. All 32 workers run
 * for the whole bench; a barrier over the first n devices involves exactly n of them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cluster.h"

static const char usage[] = "usage: bench_fanout [--quick] [--out DIR] [--build DIR]\n";

static const unsigned counts[] = { 1, 2, 4, 8, 16, 32 };
#define N_COUNTS   6
#define MAX_WORKER 32

struct point {
    unsigned workers;
    unsigned reps;
    double p50_us, p99_us, min_us;
    int ok;
};

static int
measure(struct cluster *c, const dc_device_ref *devs, unsigned n, unsigned reps, unsigned warm,
        struct point *pt)
{
    dc_op_request req = {
        .kind = DC_OP_BARRIER, .devices = devs, .n_devices = n, .timeout_ms = 30000
    };
    double *v = calloc(reps, sizeof(*v));

    memset(pt, 0, sizeof(*pt));
    pt->workers = n;
    if (v == NULL) {
        return -1;
    }
    for (unsigned i = 0; i < warm + reps; i++) {
        dc_op_result *res = NULL;
        dc_status st;
        uint64_t t0  = bench_now_ns();
        dc_code code = dc_submit(c->client, &req, &res, &st);
        double us    = (double)(bench_now_ns() - t0) / 1e3;
        dc_op_result_free(res);
        if (code != DC_OK) {
            fprintf(stderr, "bench_fanout: barrier over %u: %s: %s\n", n, dc_status_name(code),
                    st.message);
            free(v);
            return -1;
        }
        if (i >= warm) {
            v[i - warm] = us;
        }
    }
    pt->reps   = reps;
    pt->p50_us = bench_percentile(v, reps, 50);
    pt->p99_us = bench_percentile(v, reps, 99);
    pt->min_us = v[0];
    pt->ok     = 1;
    free(v);
    return 0;
}

int
main(int argc, char **argv)
{
    dc_device_ref devs[MAX_WORKER];
    struct point pts[N_COUNTS] = { { 0 } };
    double xs[N_COUNTS], ys[N_COUNTS], slope = 0, intercept = 0;
    size_t n_fit = 0;
    struct bench_args a;
    struct bench_summary sum;
    struct cluster c;
    unsigned reps;
    FILE *f;
    int rv;

    bench_init();
    if ((rv = bench_parse_args(argc, argv, &a, usage, NULL, NULL)) != 0) {
        return rv;
    }
    reps = a.quick ? 30 : 200;
    printf("starting a coordinator and %d workers ...\n", MAX_WORKER);
    fflush(stdout);
    if (cluster_start(&c, &a, "fanout", NULL) != 0 || cluster_add_workers(&c, MAX_WORKER) != 0) {
        cluster_stop(&c);
        return 1;
    }
    for (size_t w = 0; w < MAX_WORKER; w++) {
        cluster_device(&c, w, &devs[w]);
    }
    for (size_t i = 0; i < N_COUNTS; i++) {
        if (measure(&c, devs, counts[i], reps, 10, &pts[i]) == 0) {
            xs[n_fit] = counts[i];
            ys[n_fit] = pts[i].p50_us;
            n_fit++;
        }
    }
    cluster_stop(&c);
    if (n_fit >= 2) {
        slope = bench_linfit(xs, ys, n_fit, &intercept);
    }

    printf("\nFan-out: dc_submit(barrier) over n workers (one cpu:0 device each), %u reps\n", reps);
    printf("%-8s | %10s | %10s | %10s\n", "workers", "median", "p99", "min");
    for (size_t i = 0; i < N_COUNTS; i++) {
        if (pts[i].ok) {
            printf("%-8u | %7.1f us | %7.1f us | %7.1f us\n", pts[i].workers, pts[i].p50_us,
                   pts[i].p99_us, pts[i].min_us);
        } else {
            printf("%-8u | %10s |\n", counts[i], "failed");
        }
    }
    printf("least squares over the medians: %.1f us + %.1f us per worker\n", intercept, slope);

    if ((f = bench_result_open(&a, "fanout.json")) != NULL) {
        int first = 1;
        fprintf(f, "{\"bench\": \"fanout\", \"op\": \"barrier\", \"reps\": %u,\n \"points\": [",
                reps);
        for (size_t i = 0; i < N_COUNTS; i++) {
            if (!pts[i].ok) {
                continue;
            }
            fprintf(f,
                    "%s\n  {\"workers\": %u, \"median_us\": %.2f, \"p99_us\": %.2f, \"min_us\": "
                    "%.2f}",
                    first ? "" : ",", pts[i].workers, pts[i].p50_us, pts[i].p99_us, pts[i].min_us);
            first = 0;
        }
        fprintf(f, "\n ],\n \"fit\": {\"intercept_us\": %.2f, \"per_worker_us\": %.2f}}\n",
                intercept, slope);
        fclose(f);
    }
    if ((f = bench_result_open(&a, "fanout.dat")) != NULL) {
        fprintf(f, "# workers median_us p99_us fit_us\n");
        for (size_t i = 0; i < N_COUNTS; i++) {
            if (pts[i].ok) {
                fprintf(f, "%u %.2f %.2f %.2f\n", pts[i].workers, pts[i].p50_us, pts[i].p99_us,
                        intercept + slope * pts[i].workers);
            }
        }
        fclose(f);
    }
    if (bench_summary_open(&sum, &a, "fanout") == 0) {
        for (size_t i = 0; i < N_COUNTS; i += N_COUNTS - 1) {
            bench_summary_row(&sum, bench_fmt("barrier latency, %u workers (median)", counts[i]),
                              pts[i].ok ? bench_fmt("%.0f us", pts[i].p50_us) : "failed", "-", NAN,
                              "-", -1);
        }
        bench_summary_row(&sum, "barrier cost per extra worker (fit)",
                          n_fit >= 2 ? bench_fmt("%.1f us", slope) : "-", "-", NAN, "-", -1);
        bench_summary_close(&sum);
    }
    return n_fit == N_COUNTS ? 0 : 1;
}
