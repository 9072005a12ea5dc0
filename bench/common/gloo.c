#include "gloo.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

int
bench_gloo_run(const char *who, unsigned world, const uint64_t *sizes, size_t n, double budget_s,
               unsigned min_reps, unsigned max_reps, struct bench_timing *out)
{
#ifdef BENCH_HAVE_TORCH
    char script[1024], path[1024], log[1024], list[512], w[16], budget[32], minr[16], maxr[16];
    char *argv[16], *text, *line, *end;
    pid_t pid;
    int rc;

    bench_source("peers/gloo_allreduce.py", script, sizeof(script));
    snprintf(path, sizeof(path), "%s/%s-gloo%u.txt", bench_tmpdir(), who, world);
    snprintf(log, sizeof(log), "%s/%s-gloo%u.log", bench_tmpdir(), who, world);
    list[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof(list) - used, "%s%llu", i ? "," : "",
                 (unsigned long long)sizes[i]);
    }
    snprintf(w, sizeof(w), "%u", world);
    snprintf(budget, sizeof(budget), "%.3f", budget_s);
    snprintf(minr, sizeof(minr), "%u", min_reps);
    snprintf(maxr, sizeof(maxr), "%u", max_reps);
    argv[0]  = BENCH_PYTHON;
    argv[1]  = script;
    argv[2]  = "--world";
    argv[3]  = w;
    argv[4]  = "--sizes";
    argv[5]  = list;
    argv[6]  = "--budget";
    argv[7]  = budget;
    argv[8]  = "--min-reps";
    argv[9]  = minr;
    argv[10] = "--max-reps";
    argv[11] = maxr;
    argv[12] = "--out";
    argv[13] = path;
    argv[14] = NULL;
    if ((pid = bench_spawn(argv, log)) < 0) {
        return -1;
    }
    if ((rc = bench_wait(pid, 900000)) != 0) {
        bench_kill(pid);
        bench_keep_tmpdir();
        fprintf(stderr, "%s: gloo peer failed (%d); log: %s\n", who, rc, log);
        return -1;
    }
    if ((text = bench_read_file(path, NULL)) == NULL) {
        fprintf(stderr, "%s: gloo peer wrote no %s\n", who, path);
        return -1;
    }
    /* One line per size: "bytes median_s reps min_s max_s". */
    line = text;
    while (*line != '\0') {
        unsigned long long bytes;
        errno = 0;
        bytes = strtoull(line, &end, 10);
        if (errno != 0 || end == line) {
            break;
        }
        for (size_t i = 0; i < n; i++) {
            if (sizes[i] == bytes) {
                struct bench_timing *t = &out[i];
                char *e2;
                t->bytes    = bytes;
                t->median_s = strtod(end, &e2);
                t->reps     = (unsigned)strtoul(e2, &end, 10);
                t->min_s    = strtod(end, &e2);
                t->max_s    = strtod(e2, &end);
                t->ok       = t->median_s > 0;
            }
        }
        line = strchr(end, '\n');
        if (line == NULL) {
            break;
        }
        line++;
    }
    free(text);
    return 1;
#else
    (void)world;
    (void)sizes;
    (void)n;
    (void)budget_s;
    (void)min_reps;
    (void)max_reps;
    (void)out;
    fprintf(stderr,
            "%s: built without torch (python3-torch missing at configure time): no gloo "
            "peer\n",
            who);
    return 0;
#endif
}
