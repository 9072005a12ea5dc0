/*
 * Shared helpers of the benchmarks: clocks and statistics, child processes that die with the
 * bench (every one started here is killed at exit, on SIGINT/SIGTERM, and through
 * PR_SET_PDEATHSIG when the bench itself is killed), free ports, temporary directories, and
 * the result files every bench writes (JSON plus summary rows that bench/run.sh collects).
 * C and C++ includable: the gRPC peer uses the load generator too.
 */
#ifndef DEVCOORD_BENCH_H
#define DEVCOORD_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- time and statistics ---------------------------------------------------------------- */

uint64_t bench_now_ns(void);
void bench_sleep_ms(unsigned ms);

/* Sorts v in place and returns the p-th percentile (0..100, nearest rank); 0 when n == 0. */
double bench_percentile(double *v, size_t n, double p);
/* Least-squares line y = a + b*x; returns b and sets *a. */
double bench_linfit(const double *x, const double *y, size_t n, double *a);

/* A growable array of doubles (latencies in microseconds, mostly). */
struct bench_samples {
    double *v;
    size_t n, cap;
};
int bench_samples_add(struct bench_samples *s, double x);
void bench_samples_free(struct bench_samples *s);

/* ---- command line ----------------------------------------------------------------------- */

/* Options every bench takes: --quick, --out DIR (default bench/results), --build DIR (where
 * the devcoord binaries are; default: the build tree this bench came from). Returns 0, or 2
 * after printing usage (unknown option). Unknown options are left to the caller when
 * `extra` is given: it is called for each and returns the number of argv entries it used
 * (0: unknown). */
struct bench_args {
    bool quick;
    const char *out_dir;
    const char *build_dir;
};
int bench_parse_args(int argc, char **argv, struct bench_args *a, const char *usage,
                     int (*extra)(int argc, char **argv, int i, void *arg), void *arg);

/* Parses a decimal number within [min, max]; 0 or -1 (with a message naming what). */
int bench_parse_u64(const char *text, uint64_t min, uint64_t max, const char *what, uint64_t *out);
/* Parses a decimal fraction (seconds); 0 or -1. */
int bench_parse_double(const char *text, const char *what, double *out);

/* Path of a devcoord binary under the build dir ("server/coordinator/devcoord-server"). */
void bench_binary(const struct bench_args *a, const char *relative, char *buf, size_t cap);
/* Path of a file of the bench source tree ("peers/gloo_allreduce.py"). */
void bench_source(const char *relative, char *buf, size_t cap);

/* ---- processes -------------------------------------------------------------------------- */

/* Starts argv[0] (a path) in its own process group, stdin from /dev/null, stdout and stderr
 * appended to log (NULL: /dev/null); returns its pid or -1. */
pid_t bench_spawn(char *const argv[], const char *log);
/* SIGTERM, then SIGKILL after grace_ms, to the process group; reaps it. */
void bench_stop(pid_t pid, unsigned grace_ms);
/* SIGKILL to the process group, and reaps it. */
void bench_kill(pid_t pid);
/* Waits for the process to exit, at most timeout_ms; its exit status (or -1 on timeout, then
 * it is still running). */
int bench_wait(pid_t pid, unsigned timeout_ms);
/* Kills every process still running that bench_spawn started. Also runs at exit. */
void bench_stop_all(void);
/* Installs the exit and signal handlers; call first. */
void bench_init(void);
/* VmRSS of a process in bytes, or 0. */
uint64_t bench_rss_bytes(pid_t pid);

/* ---- ports, files, directories ------------------------------------------------------------ */

/* A TCP port on 127.0.0.1 nothing listened on a moment ago and not handed out before by this
 * process, or 0. */
int bench_free_port(void);
/* A fresh temporary directory (removed with its files at exit unless $BENCH_KEEP=1). */
const char *bench_tmpdir(void);
/* Keeps the temporary directory at exit: call it where a failure points at the logs there. */
void bench_keep_tmpdir(void);
/* Writes text to path; 0 or -1. */
int bench_write_file(const char *path, const char *text);
/* Reads a whole file (NUL-terminated); caller frees. NULL on error. */
char *bench_read_file(const char *path, size_t *len);

/* ---- results ------------------------------------------------------------------------------ */

/* Opens <out_dir>/<name> for writing (creating out_dir); NULL on error, with a message. */
FILE *bench_result_open(const struct bench_args *a, const char *name);

/* One row of bench/run.sh's summary table, appended to <out_dir>/<bench>.summary.tsv:
 * measure, devcoord figure, peer figure ("-" when none), ratio devcoord/peer or figure/goal
 * ("-"), the goal as text, and met ("yes", "no", "-"). */
struct bench_summary {
    FILE *f;
};
int bench_summary_open(struct bench_summary *s, const struct bench_args *a, const char *bench);
void bench_summary_row(struct bench_summary *s, const char *measure, const char *devcoord,
                       const char *peer, double ratio, const char *goal, int met);
void bench_summary_close(struct bench_summary *s);

/* Formats like snprintf into a static rotating buffer (8 slots): for table cells. */
const char *bench_fmt(const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Human-readable size: "4 KiB", "16 MiB". */
const char *bench_size_text(uint64_t bytes);

#ifdef __cplusplus
}
#endif

#endif
