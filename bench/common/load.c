#include "load.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum { PHASE_WARMUP, PHASE_MEASURE, PHASE_STOP };

struct load_thread {
    const struct load_opts *opts;
    atomic_int *phase;
    unsigned index;
    pthread_t tid;
    int failed;
    uint64_t errors;
    struct bench_samples lat;
};

static void *
load_thread_main(void *arg)
{
    struct load_thread *t = arg;
    void *state           = t->opts->thread_init(t->opts->arg, t->index);

    if (state == NULL) {
        t->failed = 1;
        return NULL;
    }
    for (;;) {
        int phase = atomic_load(t->phase);
        uint64_t t0;
        int rv;

        if (phase == PHASE_STOP) {
            break;
        }
        t0 = bench_now_ns();
        rv = t->opts->call(state);
        if (phase != PHASE_MEASURE) {
            continue;
        }
        if (rv != 0) {
            t->errors++;
        } else if (bench_samples_add(&t->lat, (double)(bench_now_ns() - t0) / 1e3) != 0) {
            t->failed = 1;
            break;
        }
    }
    if (t->opts->thread_fini != NULL) {
        t->opts->thread_fini(state);
    }
    return NULL;
}

int
load_run(const struct load_opts *opts, struct load_result *out)
{
    struct load_thread *ts   = calloc(opts->threads, sizeof(*ts));
    struct bench_samples all = { 0 };
    atomic_int phase         = PHASE_WARMUP;
    uint64_t start, end;
    double sum = 0;
    unsigned started;
    int rv = 0;

    memset(out, 0, sizeof(*out));
    if (ts == NULL) {
        return -1;
    }
    for (started = 0; started < opts->threads; started++) {
        ts[started].opts  = opts;
        ts[started].phase = &phase;
        ts[started].index = started;
        if (pthread_create(&ts[started].tid, NULL, load_thread_main, &ts[started]) != 0) {
            rv = -1;
            break;
        }
    }
    bench_sleep_ms((unsigned)(opts->warmup_s * 1000));
    start = bench_now_ns();
    atomic_store(&phase, PHASE_MEASURE);
    bench_sleep_ms((unsigned)(opts->duration_s * 1000));
    atomic_store(&phase, PHASE_STOP);
    end = bench_now_ns();
    for (unsigned i = 0; i < started; i++) {
        pthread_join(ts[i].tid, NULL);
        if (ts[i].failed) {
            rv = -1;
        }
        out->errors += ts[i].errors;
        for (size_t k = 0; k < ts[i].lat.n; k++) {
            if (bench_samples_add(&all, ts[i].lat.v[k]) != 0) {
                rv = -1;
            }
            sum += ts[i].lat.v[k];
        }
        bench_samples_free(&ts[i].lat);
    }
    out->calls   = all.n;
    out->seconds = (double)(end - start) / 1e9;
    out->qps     = out->seconds > 0 ? (double)all.n / out->seconds : 0;
    out->mean_us = all.n > 0 ? sum / (double)all.n : 0;
    out->p50_us  = bench_percentile(all.v, all.n, 50);
    out->p99_us  = bench_percentile(all.v, all.n, 99);
    bench_samples_free(&all);
    free(ts);
    return rv;
}

void
load_print(FILE *f, const struct load_result *r)
{
    fprintf(f,
            "result calls=%llu errors=%llu seconds=%.3f qps=%.1f p50_us=%.2f p99_us=%.2f "
            "mean_us=%.2f\n",
            (unsigned long long)r->calls, (unsigned long long)r->errors, r->seconds, r->qps,
            r->p50_us, r->p99_us, r->mean_us);
    fflush(f);
}

/* The number after `key=` in line, or -1 when absent or malformed. */
static double
field(const char *line, const char *key)
{
    char pat[32];
    const char *at;
    char *end;
    double v;

    snprintf(pat, sizeof(pat), " %s=", key);
    if ((at = strstr(line, pat)) == NULL) {
        return -1;
    }
    at += strlen(pat);
    errno = 0;
    v     = strtod(at, &end);
    if (errno != 0 || end == at) {
        return -1;
    }
    return v;
}

int
load_parse(const char *text, struct load_result *out)
{
    const char *line = strstr(text, "result calls=");
    double calls;

    if (line == NULL) {
        return -1;
    }
    /* " calls=" needs the space that "result" is followed by. */
    line += strlen("result");
    calls = field(line, "calls");
    if (calls < 0) {
        return -1;
    }
    out->calls   = (uint64_t)calls;
    out->errors  = (uint64_t)field(line, "errors");
    out->seconds = field(line, "seconds");
    out->qps     = field(line, "qps");
    out->p50_us  = field(line, "p50_us");
    out->p99_us  = field(line, "p99_us");
    out->mean_us = field(line, "mean_us");
    return out->qps < 0 || out->p50_us < 0 ? -1 : 0;
}
