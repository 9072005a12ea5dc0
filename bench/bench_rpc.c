/*
 * Unary RPC (issue 5, item 2): p50/p99 latency and QPS with 1, 8 and 64 calls in flight,
 * 64 B and 64 KiB payloads echoed back, for devcoord's RPC layer (rpc_devcoord: GetDevice
 * echoing its attachment), a bare nng req/rep echo (peers/nng_echo.c) and a gRPC C++ echo
 * (peers/grpc_echo.cc). Each system runs as a server process and a client process on
 * 127.0.0.1; every client is bench/common/load.c: N threads, one blocking call after
 * another over one shared connection, a warmup, then a fixed measured duration.
 *
 * The systems are interleaved, as bench/rpc_ab.sh does: every server runs the whole time,
 * and each cell runs ROUNDS rounds, one client per system in each (the order rotating from
 * round to round), so drifting load falls on all of them alike. A cell's p50, p99 and QPS
 * are the medians of its rounds'. (The systems used to run one after another, the whole
 * set of cells each: devcoord's 1-in-flight p50 then came out at 0.98x to 1.28x nng's in
 * three full runs of the same build in one evening.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "load.h"

static const char usage[] = "usage: bench_rpc [--quick] [--out DIR] [--build DIR]\n";

enum { SYS_DEVCOORD, SYS_NNG, SYS_GRPC, SYS_COUNT };
static const char *const sys_names[SYS_COUNT]    = { "devcoord", "nng", "grpc" };
static const char *const sys_binaries[SYS_COUNT] = { "bench/rpc_devcoord", "bench/nng_echo",
                                                     "bench/grpc_echo" };

static const unsigned inflights[] = { 1, 8, 64 };
static const unsigned payloads[]  = { 64, 65536 };
#define N_INFLIGHT 3
#define N_PAYLOAD  2
#define ROUNDS     3

struct cell {
    int ok;
    struct load_result r;
};

static struct cell cells[SYS_COUNT][N_PAYLOAD][N_INFLIGHT];

static int
system_built(const struct bench_args *a, int sys)
{
    char path[1024];
    FILE *f;

    bench_binary(a, sys_binaries[sys], path, sizeof(path));
    if ((f = fopen(path, "r")) == NULL) {
        return 0;
    }
    fclose(f);
    return 1;
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double
median_of(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Starts sys's server on a port of its own; its pid, or -1. */
static pid_t
server_start(const struct bench_args *a, int sys, char *url, size_t url_cap)
{
    char bin[1024], slog[1024];
    char *sargv[4];

    bench_binary(a, sys_binaries[sys], bin, sizeof(bin));
    snprintf(url, url_cap, "tcp://127.0.0.1:%d", bench_free_port());
    snprintf(slog, sizeof(slog), "%s/rpc-%s-server.log", bench_tmpdir(), sys_names[sys]);
    sargv[0] = bin;
    sargv[1] = "serve";
    sargv[2] = url;
    sargv[3] = NULL;
    return bench_spawn(sargv, slog);
}

/* One client of sys against url: 0 and *out, or -1 (reported). */
static int
client_run(const struct bench_args *a, int sys, const char *url, size_t p, size_t i, unsigned round,
           double seconds, double warmup, struct load_result *out)
{
    char bin[1024], clog[1024], threads[16], payload[16], secs[32], warm[32];
    char *cargv[8], *text;
    pid_t client;
    int ok = 0;

    bench_binary(a, sys_binaries[sys], bin, sizeof(bin));
    snprintf(clog, sizeof(clog), "%s/rpc-%s-%u-%u-%u.log", bench_tmpdir(), sys_names[sys],
             payloads[p], inflights[i], round);
    snprintf(threads, sizeof(threads), "%u", inflights[i]);
    snprintf(payload, sizeof(payload), "%u", payloads[p]);
    snprintf(secs, sizeof(secs), "%.3f", seconds);
    snprintf(warm, sizeof(warm), "%.3f", warmup);
    cargv[0] = bin;
    cargv[1] = "client";
    cargv[2] = (char *)url;
    cargv[3] = threads;
    cargv[4] = payload;
    cargv[5] = secs;
    cargv[6] = warm;
    cargv[7] = NULL;
    remove(clog);
    if ((client = bench_spawn(cargv, clog)) >= 0) {
        if (bench_wait(client, (unsigned)((seconds + warmup) * 1000) + 30000) < 0) {
            bench_kill(client);
        }
        if ((text = bench_read_file(clog, NULL)) != NULL) {
            ok = load_parse(text, out) == 0 && out->calls > 0;
            free(text);
        }
    }
    if (!ok) {
        bench_keep_tmpdir();
        fprintf(stderr, "bench_rpc: %s client (%s payload, %u in flight) failed; log %s\n",
                sys_names[sys], bench_size_text(payloads[p]), inflights[i], clog);
    }
    return ok ? 0 : -1;
}

/* Every cell, each in ROUNDS interleaved rounds over the systems with a server up. */
static void
run_cells(const struct bench_args *a, const int *up, char urls[][64], unsigned rounds,
          double seconds, double warmup)
{
    for (size_t p = 0; p < N_PAYLOAD; p++) {
        for (size_t i = 0; i < N_INFLIGHT; i++) {
            struct load_result r[SYS_COUNT][ROUNDS];
            unsigned got[SYS_COUNT] = { 0 };

            for (unsigned k = 0; k < rounds; k++) {
                for (int j = 0; j < SYS_COUNT; j++) {
                    int sys = (int)((j + k) % SYS_COUNT);
                    if (up[sys] && client_run(a, sys, urls[sys], p, i, k, seconds, warmup,
                                              &r[sys][got[sys]]) == 0) {
                        got[sys]++;
                    }
                }
            }
            for (int sys = 0; sys < SYS_COUNT; sys++) {
                struct cell *cell = &cells[sys][p][i];
                double p50[ROUNDS], p99[ROUNDS], qps[ROUNDS];
                if (!up[sys]) {
                    continue;
                }
                cell->ok = got[sys] == rounds; /* a failed round fails the cell */
                for (unsigned k = 0; k < got[sys]; k++) {
                    p50[k] = r[sys][k].p50_us;
                    p99[k] = r[sys][k].p99_us;
                    qps[k] = r[sys][k].qps;
                    cell->r.calls += r[sys][k].calls;
                    cell->r.errors += r[sys][k].errors;
                    cell->r.seconds += r[sys][k].seconds;
                    cell->r.mean_us += r[sys][k].mean_us / got[sys];
                }
                if (cell->ok) {
                    cell->r.p50_us = median_of(p50, got[sys]);
                    cell->r.p99_us = median_of(p99, got[sys]);
                    cell->r.qps    = median_of(qps, got[sys]);
                }
                printf("  %-8s %-7s %2u in flight: %s\n", sys_names[sys],
                       bench_size_text(payloads[p]), inflights[i],
                       cell->ok ? bench_fmt("p50 %.1f us, p99 %.1f us, %.0f calls/s",
                                            cell->r.p50_us, cell->r.p99_us, cell->r.qps)
                                : "failed");
            }
            fflush(stdout);
        }
    }
}

static const char *
cell_text(const struct cell *c, int what)
{
    if (!c->ok) {
        return "-";
    }
    switch (what) {
    case 0:
        return bench_fmt("%.1f", c->r.p50_us);
    case 1:
        return bench_fmt("%.1f", c->r.p99_us);
    default:
        return bench_fmt("%.0f", c->r.qps);
    }
}

int
main(int argc, char **argv)
{
    struct bench_args a;
    struct bench_summary sum;
    int built[SYS_COUNT];
    pid_t servers[SYS_COUNT] = { 0 };
    char urls[SYS_COUNT][64];
    unsigned rounds;
    double seconds, warmup;
    FILE *f;
    int rv;

    bench_init();
    if ((rv = bench_parse_args(argc, argv, &a, usage, NULL, NULL)) != 0) {
        return rv;
    }
    rounds  = a.quick ? 1 : ROUNDS;
    seconds = 1.0; /* per round */
    warmup  = a.quick ? 0.2 : 0.3;
    for (int s = 0; s < SYS_COUNT; s++) {
        built[s] = system_built(&a, s);
        if (!built[s]) {
            printf("bench_rpc: %s peer not built (missing at configure time): skipped\n",
                   sys_names[s]);
            continue;
        }
        if ((servers[s] = server_start(&a, s, urls[s], sizeof(urls[s]))) < 0) {
            built[s] = 0;
        }
    }
    bench_sleep_ms(300);
    printf("running every cell in %u round%s of %.1f s per system, interleaved ...\n", rounds,
           rounds == 1 ? "" : "s", seconds);
    fflush(stdout);
    run_cells(&a, built, urls, rounds, seconds, warmup);
    for (int s = 0; s < SYS_COUNT; s++) {
        if (built[s]) {
            bench_stop(servers[s], 2000);
        }
    }

    printf("\nUnary RPC echo on 127.0.0.1: N client threads over one connection, medians of %u "
           "interleaved round%s of %.1f s per cell (latency in us)\n",
           rounds, rounds == 1 ? "" : "s", seconds);
    printf("%-8s %-9s | %-27s | %-27s | %-27s\n", "payload", "in flight", "devcoord p50/p99/QPS",
           "bare nng p50/p99/QPS", "gRPC p50/p99/QPS");
    for (size_t p = 0; p < N_PAYLOAD; p++) {
        for (size_t i = 0; i < N_INFLIGHT; i++) {
            printf("%-8s %-9u", bench_size_text(payloads[p]), inflights[i]);
            for (int s = 0; s < SYS_COUNT; s++) {
                const struct cell *c = &cells[s][p][i];
                printf(" | %8s %8s %9s", cell_text(c, 0), cell_text(c, 1), cell_text(c, 2));
            }
            printf("\n");
        }
    }

    if ((f = bench_result_open(&a, "rpc.json")) != NULL) {
        int first = 1;
        fprintf(f,
                "{\"bench\": \"rpc\", \"rounds\": %u, \"seconds_per_round\": %.3f, "
                "\"warmup_s\": %.3f,\n"
                " \"client\": \"N threads, blocking calls, one shared connection\",\n"
                " \"cells\": [",
                rounds, seconds, warmup);
        for (int s = 0; s < SYS_COUNT; s++) {
            for (size_t p = 0; p < N_PAYLOAD; p++) {
                for (size_t i = 0; i < N_INFLIGHT; i++) {
                    const struct cell *c = &cells[s][p][i];
                    if (!c->ok) {
                        continue;
                    }
                    fprintf(f,
                            "%s\n  {\"system\": \"%s\", \"payload_bytes\": %u, \"in_flight\": %u, "
                            "\"calls\": %llu, \"errors\": %llu, \"qps\": %.1f, \"p50_us\": %.2f, "
                            "\"p99_us\": %.2f, \"mean_us\": %.2f}",
                            first ? "" : ",", sys_names[s], payloads[p], inflights[i],
                            (unsigned long long)c->r.calls, (unsigned long long)c->r.errors,
                            c->r.qps, c->r.p50_us, c->r.p99_us, c->r.mean_us);
                    first = 0;
                }
            }
        }
        fprintf(f, "\n ]}\n");
        fclose(f);
    }

    if (bench_summary_open(&sum, &a, "rpc") == 0) {
        for (size_t p = 0; p < N_PAYLOAD; p++) {
            for (size_t i = 0; i < N_INFLIGHT; i++) {
                const struct cell *d = &cells[SYS_DEVCOORD][p][i], *n = &cells[SYS_NNG][p][i];
                double ratio = d->ok && n->ok ? d->r.p50_us / n->r.p50_us : NAN;
                bench_summary_row(&sum,
                                  bench_fmt("RPC p50, %s, %u in flight",
                                            bench_size_text(payloads[p]), inflights[i]),
                                  d->ok ? bench_fmt("%.1f us", d->r.p50_us) : "-",
                                  n->ok ? bench_fmt("nng %.1f us", n->r.p50_us) : "-", ratio,
                                  "<= 1.1x nng", isnan(ratio) ? -1 : ratio <= 1.1);
            }
        }
        for (size_t p = 0; p < N_PAYLOAD; p++) {
            const struct cell *d = &cells[SYS_DEVCOORD][p][2], *g = &cells[SYS_GRPC][p][2];
            double ratio = d->ok && g->ok ? d->r.qps / g->r.qps : NAN;
            double goal  = payloads[p] >= 65536 ? 2.5 : 1.1;
            bench_summary_row(&sum,
                              bench_fmt("RPC QPS, %s, 64 in flight", bench_size_text(payloads[p])),
                              d->ok ? bench_fmt("%.0f/s", d->r.qps) : "-",
                              g->ok ? bench_fmt("gRPC %.0f/s", g->r.qps) : "-", ratio,
                              bench_fmt(">= %.1fx gRPC", goal), isnan(ratio) ? -1 : ratio >= goal);
        }
        bench_summary_close(&sum);
    }
    return 0;
}
