/* The shared-memory limit of an all-reduce on this machine (issue 17): two threads of one
 * process, each owning an f32 array; reduce-scatter by halves (each thread sums one half of
 * both arrays into its own), then each copies its reduced half into the other's array. No
 * synchronisation but two barriers, no allocation in the timed loop. */
#include "shm_probe.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

struct probe {
    float *a[2];
    size_t n;
    unsigned reps;
    pthread_barrier_t bar;
    double *times; /* per repetition, seconds (thread 0 measures) */
};

struct probe_arg {
    struct probe *p;
    unsigned rank;
};

static void *
probe_rank(void *arg)
{
    const struct probe_arg *pa = arg;
    struct probe *p            = pa->p;
    unsigned me = pa->rank, peer = 1 - pa->rank;
    size_t half = p->n / 2, lo = me == 0 ? 0 : half, hi = me == 0 ? half : p->n;
    float *mine = p->a[me], *theirs = p->a[peer];

    for (unsigned r = 0; r < p->reps; r++) {
        uint64_t t0;
        pthread_barrier_wait(&p->bar);
        t0 = bench_now_ns();
        for (size_t i = lo; i < hi; i++) {
            mine[i] += theirs[i];
        }
        pthread_barrier_wait(&p->bar);
        memcpy(theirs + lo, mine + lo, (hi - lo) * sizeof(float));
        pthread_barrier_wait(&p->bar);
        if (me == 0) {
            p->times[r] = (double)(bench_now_ns() - t0) / 1e9;
        }
    }
    return NULL;
}

double
bench_shm_probe(uint64_t bytes, unsigned reps)
{
    struct probe p           = { .n = (size_t)(bytes / sizeof(float)), .reps = reps };
    struct probe_arg args[2] = { { &p, 0 }, { &p, 1 } };
    pthread_t t;
    double median = -1;

    if (reps == 0 || p.n < 2 || (p.times = calloc(reps, sizeof(double))) == NULL) {
        return -1;
    }
    p.a[0] = malloc(p.n * sizeof(float));
    p.a[1] = malloc(p.n * sizeof(float));
    if (p.a[0] != NULL && p.a[1] != NULL && pthread_barrier_init(&p.bar, NULL, 2) == 0) {
        for (size_t i = 0; i < p.n; i++) { /* small values: sums stay finite over reps */
            p.a[0][i] = (float)(i % 7) * 1e-6f;
            p.a[1][i] = (float)(i % 5) * 1e-6f;
        }
        if (pthread_create(&t, NULL, probe_rank, &args[1]) == 0) {
            probe_rank(&args[0]);
            pthread_join(t, NULL);
            median = bench_percentile(p.times, reps, 50);
        }
        pthread_barrier_destroy(&p.bar);
    }
    free(p.a[0]);
    free(p.a[1]);
    free(p.times);
    return median;
}
