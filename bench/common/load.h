/*
 * The closed-loop load generator every unary-RPC client of bench_rpc uses (devcoord's RPC
 * layer, bare nng, gRPC), so the three differ only in the call itself: `threads` client
 * threads each issue one blocking call after another over one shared connection, for a
 * warmup and then a measured duration; the latency of every call started in the measured
 * window is kept. C and C++ includable.
 */
#ifndef DEVCOORD_BENCH_LOAD_H
#define DEVCOORD_BENCH_LOAD_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct load_opts {
    unsigned threads;
    double warmup_s;
    double duration_s;
    /* Per-thread state: thread_init(arg, index) before the first call (NULL: failure),
     * thread_fini after the last. */
    void *(*thread_init)(void *arg, unsigned index);
    void (*thread_fini)(void *state);
    /* One call; 0 when it succeeded. */
    int (*call)(void *state);
    void *arg;
};

struct load_result {
    uint64_t calls;  /* succeeded in the measured window */
    uint64_t errors; /* failed in the measured window */
    double seconds;  /* length of the measured window */
    double qps;
    double p50_us, p99_us, mean_us;
};

/* Runs the load; 0, or -1 when a thread could not start. */
int load_run(const struct load_opts *opts, struct load_result *out);

/* "result calls=... errors=... qps=... p50_us=... p99_us=... mean_us=..." plus a newline:
 * what bench_rpc parses from a client process. */
void load_print(FILE *f, const struct load_result *r);
/* Parses that line out of a text; 0 or -1. */
int load_parse(const char *text, struct load_result *out);

#ifdef __cplusplus
}
#endif

#endif
