/*
 * Failure detection (issue 5, item 6): a large all-reduce runs over 2 real workers; one is
 * SIGKILLed while the op is in flight. Measured from the kill: the time until dc_submit
 * returns (expected UNAVAILABLE naming the worker) and the time until the registry lists the
 * worker dead, with the default heartbeat (1000/5000 ms) and a short one (200/1000 ms).
 * The kill comes a third of the way into the op, timed by an undisturbed run first.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cluster.h"

static const char usage[] = "usage: bench_failure [--quick] [--out DIR] [--build DIR]\n";

#define WORKERS 2

struct config {
    const char *name;
    uint32_t interval_ms, dead_after_ms;
};

static const struct config configs[] = {
    { "default", 1000, 5000 },
    { "short", 200, 1000 },
};
#define N_CONFIGS 2
#define MAX_REPS  5

struct trial {
    int ok;
    double op_ms;   /* kill -> dc_submit returned */
    double dead_ms; /* kill -> registry says dead */
    double undisturbed_ms;
    dc_code code;
    char message[DC_STATUS_MESSAGE_MAX];
};

struct submitter {
    struct cluster *c;
    const dc_device_ref *devs;
    const char *tensor;
    uint64_t end_ns;
    dc_code code;
    dc_status st;
};

static void *
submit_thread(void *arg)
{
    struct submitter *s = arg;
    dc_op_request req   = { .kind       = DC_OP_ALL_REDUCE,
                            .reduce     = DC_REDUCE_SUM,
                            .devices    = s->devs,
                            .n_devices  = WORKERS,
                            .tensor     = s->tensor,
                            .timeout_ms = 60000 };
    dc_op_result *res   = NULL;

    s->code   = dc_submit(s->c->client, &req, &res, &s->st);
    s->end_ns = bench_now_ns();
    dc_op_result_free(res);
    return NULL;
}

static int
put_tensor(struct cluster *c, uint64_t bytes)
{
    size_t n          = (size_t)(bytes / sizeof(float));
    float *data       = malloc(n * sizeof(float));
    uint64_t shape[1] = { n };
    char dev[64];
    dc_status st;
    int rv = 0;

    if (data == NULL) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        data[i] = 1e-3f;
    }
    for (size_t w = 0; w < c->n_workers && rv == 0; w++) {
        snprintf(dev, sizeof(dev), "%s/cpu:0", c->worker_names[w]);
        if (dc_tensor_put(c->client, dev, "big", DC_DTYPE_F32, shape, 1, data, n * sizeof(float),
                          &st) != DC_OK) {
            fprintf(stderr, "bench_failure: put on %s: %s\n", dev, st.message);
            rv = -1;
        }
    }
    free(data);
    return rv;
}

static int
trial(const struct bench_args *a, const struct config *cfg, uint64_t bytes, unsigned index,
      struct trial *t)
{
    struct cluster_opts co = { .heartbeat_interval_ms = cfg->interval_ms,
                               .dead_after_ms         = cfg->dead_after_ms };
    dc_device_ref devs[WORKERS];
    struct submitter s;
    struct cluster c;
    pthread_t tid;
    uint64_t t0, t_kill, t_dead;
    char tag[32];
    int rv = -1;

    memset(t, 0, sizeof(*t));
    snprintf(tag, sizeof(tag), "failure-%s-%u", cfg->name, index);
    if (cluster_start(&c, a, tag, &co) != 0 || cluster_add_workers(&c, WORKERS) != 0 ||
        put_tensor(&c, bytes) != 0) {
        goto out;
    }
    for (size_t w = 0; w < WORKERS; w++) {
        cluster_device(&c, w, &devs[w]);
    }
    memset(&s, 0, sizeof(s));
    s.c      = &c;
    s.devs   = devs;
    s.tensor = "big";
    /* An undisturbed op first: how long the op takes, so the kill lands inside the next. */
    t0 = bench_now_ns();
    submit_thread(&s);
    if (s.code != DC_OK) {
        fprintf(stderr, "bench_failure: undisturbed all-reduce: %s\n", s.st.message);
        goto out;
    }
    t->undisturbed_ms = (double)(s.end_ns - t0) / 1e6;

    memset(&s.st, 0, sizeof(s.st));
    s.end_ns = 0;
    if (pthread_create(&tid, NULL, submit_thread, &s) != 0) {
        goto out;
    }
    bench_sleep_ms((unsigned)(t->undisturbed_ms / 3) + 1);
    t_kill = bench_now_ns();
    bench_kill(c.workers[1]);
    c.workers[1] = 0;
    if (cluster_wait_worker_state(&c, c.worker_names[1], DC_WORKER_DEAD,
                                  cfg->dead_after_ms * 4 + 10000) != 0) {
        fprintf(stderr, "bench_failure: %s never shown dead\n", c.worker_names[1]);
        pthread_join(tid, NULL);
        goto out;
    }
    t_dead = bench_now_ns();
    pthread_join(tid, NULL);
    if (s.end_ns < t_kill) {
        fprintf(stderr, "bench_failure: the op ended before the kill; trial void\n");
        goto out;
    }
    t->op_ms   = (double)(s.end_ns - t_kill) / 1e6;
    t->dead_ms = (double)(t_dead - t_kill) / 1e6;
    t->code    = s.code;
    snprintf(t->message, sizeof(t->message), "%s", s.st.message);
    t->ok = s.code != DC_OK;
    rv    = 0;
out:
    cluster_stop(&c);
    return rv;
}

int
main(int argc, char **argv)
{
    struct trial trials[N_CONFIGS][MAX_REPS];
    double op_med[N_CONFIGS], dead_med[N_CONFIGS];
    unsigned n_ok[N_CONFIGS] = { 0 };
    struct bench_args a;
    struct bench_summary sum;
    unsigned reps;
    uint64_t bytes;
    FILE *f;
    int rv;

    bench_init();
    if ((rv = bench_parse_args(argc, argv, &a, usage, NULL, NULL)) != 0) {
        return rv;
    }
    reps  = a.quick ? 1 : 3;
    bytes = a.quick ? (64u << 20) : (256u << 20);
    for (size_t k = 0; k < N_CONFIGS; k++) {
        double ops[MAX_REPS], deads[MAX_REPS];
        for (unsigned r = 0; r < reps; r++) {
            printf("failure: heartbeat %u/%u ms, trial %u: %s all-reduce over %d workers, "
                   "SIGKILL w1 ...\n",
                   configs[k].interval_ms, configs[k].dead_after_ms, r + 1, bench_size_text(bytes),
                   WORKERS);
            fflush(stdout);
            /* A void trial (the op beat the kill) is retried once. */
            if (trial(&a, &configs[k], bytes, r, &trials[k][r]) != 0 &&
                trial(&a, &configs[k], bytes, r, &trials[k][r]) != 0) {
                continue;
            }
            if (trials[k][r].ok) {
                ops[n_ok[k]]   = trials[k][r].op_ms;
                deads[n_ok[k]] = trials[k][r].dead_ms;
                n_ok[k]++;
            }
        }
        op_med[k]   = n_ok[k] ? bench_percentile(ops, n_ok[k], 50) : NAN;
        dead_med[k] = n_ok[k] ? bench_percentile(deads, n_ok[k], 50) : NAN;
    }

    printf("\nFailure detection: SIGKILL of a worker during a %s all-reduce over %d workers\n",
           bench_size_text(bytes), WORKERS);
    printf("%-16s | %5s | %12s | %14s | %12s | %s\n", "heartbeat", "trial", "op (no kill)",
           "kill->op fails", "kill->dead", "dc_submit said");
    for (size_t k = 0; k < N_CONFIGS; k++) {
        for (unsigned r = 0; r < reps; r++) {
            const struct trial *t = &trials[k][r];
            printf("%-16s | %5u | %9.1f ms | %11.1f ms | %9.1f ms | %s: %.90s\n",
                   bench_fmt("%u/%u ms", configs[k].interval_ms, configs[k].dead_after_ms), r + 1,
                   t->undisturbed_ms, t->op_ms, t->dead_ms,
                   t->ok ? dc_status_name(t->code) : "(failed trial)", t->message);
        }
    }

    if ((f = bench_result_open(&a, "failure.json")) != NULL) {
        fprintf(
            f, "{\"bench\": \"failure\", \"tensor_bytes\": %llu, \"workers\": %d,\n \"configs\": [",
            (unsigned long long)bytes, WORKERS);
        for (size_t k = 0; k < N_CONFIGS; k++) {
            fprintf(f,
                    "%s\n  {\"heartbeat_interval_ms\": %u, \"dead_after_ms\": %u, "
                    "\"op_fails_median_ms\": %.2f, \"dead_median_ms\": %.2f, \"trials\": [",
                    k ? "," : "", configs[k].interval_ms, configs[k].dead_after_ms,
                    isnan(op_med[k]) ? -1 : op_med[k], isnan(dead_med[k]) ? -1 : dead_med[k]);
            for (unsigned r = 0; r < reps; r++) {
                const struct trial *t = &trials[k][r];
                fprintf(f,
                        "%s{\"ok\": %s, \"undisturbed_ms\": %.2f, \"op_fails_ms\": %.2f, "
                        "\"dead_ms\": %.2f, \"code\": \"%s\"}",
                        r ? ", " : "", t->ok ? "true" : "false", t->undisturbed_ms, t->op_ms,
                        t->dead_ms, dc_status_name(t->code));
            }
            fprintf(f, "]}");
        }
        fprintf(f, "\n ]}\n");
        fclose(f);
    }
    if (bench_summary_open(&sum, &a, "failure") == 0) {
        for (size_t k = 0; k < N_CONFIGS; k++) {
            const char *hb =
                bench_fmt("hb %u/%u", configs[k].interval_ms, configs[k].dead_after_ms);
            bench_summary_row(&sum, bench_fmt("SIGKILL -> in-flight op fails (%s)", hb),
                              n_ok[k] ? bench_fmt("%.0f ms", op_med[k]) : "failed", "-",
                              op_med[k] / 1000, "<= 1000 ms", n_ok[k] ? op_med[k] <= 1000 : 0);
            bench_summary_row(&sum, bench_fmt("SIGKILL -> registry shows dead (%s)", hb),
                              n_ok[k] ? bench_fmt("%.0f ms", dead_med[k]) : "failed", "-", NAN, "-",
                              -1);
        }
        bench_summary_close(&sum);
    }
    return n_ok[0] && n_ok[1] ? 0 : 1;
}
