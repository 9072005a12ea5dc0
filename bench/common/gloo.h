/*
 * The torch.distributed (gloo) peer of the all-reduce benches: peers/gloo_allreduce.py run
 * with `world` processes on 127.0.0.1, f32 sum of every size, the repeat count chosen from a
 * warmup so each size takes about budget_s seconds (min_reps..max_reps), timed on rank 0.
 */
#ifndef DEVCOORD_BENCH_GLOO_H
#define DEVCOORD_BENCH_GLOO_H

#include <stddef.h>
#include <stdint.h>

/* One size's timing; ok is 0 when there is none. */
struct bench_timing {
    uint64_t bytes;
    double median_s, min_s, max_s;
    unsigned reps;
    int ok;
};

/* Fills out[i] for sizes[i] (n sizes). Returns 1 when it ran, 0 when this build has no
 * torch (a message says so), -1 on failure (with a message naming `who` and the log). */
int bench_gloo_run(const char *who, unsigned world, const uint64_t *sizes, size_t n,
                   double budget_s, unsigned min_reps, unsigned max_reps, struct bench_timing *out);

#endif
