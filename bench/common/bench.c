#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#ifndef BENCH_BUILD_DIR
#define BENCH_BUILD_DIR "build-bench"
#endif
#ifndef BENCH_SOURCE_DIR
#define BENCH_SOURCE_DIR "bench"
#endif

/* ---- time and statistics ---------------------------------------------------------------- */

uint64_t
bench_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void
bench_sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int
double_compare(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;

    return a < b ? -1 : a > b ? 1 : 0;
}

double
bench_percentile(double *v, size_t n, double p)
{
    size_t rank;

    if (n == 0) {
        return 0;
    }
    qsort(v, n, sizeof(*v), double_compare);
    /* Nearest rank: the smallest value with at least p% of the samples at or below it. */
    rank = (size_t)ceil(p / 100.0 * (double)n);
    if (rank < 1) {
        rank = 1;
    }
    if (rank > n) {
        rank = n;
    }
    return v[rank - 1];
}

double
bench_linfit(const double *x, const double *y, size_t n, double *a)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0, d, b;

    for (size_t i = 0; i < n; i++) {
        sx += x[i];
        sy += y[i];
        sxx += x[i] * x[i];
        sxy += x[i] * y[i];
    }
    d = (double)n * sxx - sx * sx;
    b = d != 0 ? ((double)n * sxy - sx * sy) / d : 0;
    if (a != NULL) {
        *a = n > 0 ? (sy - b * sx) / (double)n : 0;
    }
    return b;
}

int
bench_samples_add(struct bench_samples *s, double x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        double *v  = realloc(s->v, cap * sizeof(*v));
        if (v == NULL) {
            return -1;
        }
        s->v   = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

void
bench_samples_free(struct bench_samples *s)
{
    free(s->v);
    memset(s, 0, sizeof(*s));
}

/* ---- command line ----------------------------------------------------------------------- */

int
bench_parse_args(int argc, char **argv, struct bench_args *a, const char *usage,
                 int (*extra)(int argc, char **argv, int i, void *arg), void *arg)
{
    static char default_out[1024];

    snprintf(default_out, sizeof(default_out), "%s/results", BENCH_SOURCE_DIR);
    a->quick   = false;
    a->out_dir = default_out;
    a->build_dir =
        getenv("DEVCOORD_BUILD_DIR") != NULL ? getenv("DEVCOORD_BUILD_DIR") : BENCH_BUILD_DIR;
    for (int i = 1; i < argc; i++) {
        int used;
        if (strcmp(argv[i], "--quick") == 0) {
            a->quick = true;
        } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            a->out_dir = argv[++i];
        } else if (strcmp(argv[i], "--build") == 0 && i + 1 < argc) {
            a->build_dir = argv[++i];
        } else if (extra != NULL && (used = extra(argc, argv, i, arg)) > 0) {
            i += used - 1;
        } else {
            fprintf(stderr, "%s", usage);
            return 2;
        }
    }
    return 0;
}

int
bench_parse_u64(const char *text, uint64_t min, uint64_t max, const char *what, uint64_t *out)
{
    unsigned long long v;
    char *end;

    errno = 0;
    v     = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || v < min || v > max) {
        fprintf(stderr, "bench: %s: expected a number in %llu..%llu, found '%s'\n", what,
                (unsigned long long)min, (unsigned long long)max, text);
        return -1;
    }
    *out = v;
    return 0;
}

int
bench_parse_double(const char *text, const char *what, double *out)
{
    char *end;
    double v;

    errno = 0;
    v     = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(v >= 0)) {
        fprintf(stderr, "bench: %s: expected a non-negative number, found '%s'\n", what, text);
        return -1;
    }
    *out = v;
    return 0;
}

void
bench_binary(const struct bench_args *a, const char *relative, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", a->build_dir, relative);
}

void
bench_source(const char *relative, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", BENCH_SOURCE_DIR, relative);
}

/* ---- processes -------------------------------------------------------------------------- */

#define MAX_CHILDREN 512

static pid_t children[MAX_CHILDREN];
static char tmpdir[512];
static bool tmpdir_kept; /* bench_keep_tmpdir: a failure's logs stay */

static void
child_forget(pid_t pid)
{
    for (size_t i = 0; i < MAX_CHILDREN; i++) {
        if (children[i] == pid) {
            children[i] = 0;
        }
    }
}

pid_t
bench_spawn(char *const argv[], const char *log)
{
    pid_t pid;
    size_t slot;
    int fd;

    for (slot = 0; slot < MAX_CHILDREN && children[slot] != 0; slot++) {
    }
    if (slot == MAX_CHILDREN) {
        fprintf(stderr, "bench: too many child processes\n");
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    if ((pid = fork()) < 0) {
        perror("bench: fork");
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        if ((fd = open("/dev/null", O_RDONLY)) >= 0) {
            dup2(fd, 0);
            close(fd);
        }
        fd = open(log != NULL ? log : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    /* Both sides set the group, so a signal right after fork already reaches it. */
    setpgid(pid, pid);
    children[slot] = pid;
    return pid;
}

int
bench_wait(pid_t pid, unsigned timeout_ms)
{
    uint64_t end = bench_now_ns() + (uint64_t)timeout_ms * 1000000u;
    int status;

    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            child_forget(pid);
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        if (r < 0 && errno != EINTR) {
            child_forget(pid);
            return -1;
        }
        if (bench_now_ns() >= end) {
            return -1;
        }
        bench_sleep_ms(5);
    }
}

/* Whether the process has exited (without reaping it, so its group id stays ours). */
static bool
exited(pid_t pid)
{
    siginfo_t info;

    memset(&info, 0, sizeof(info));
    if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
        return true;
    }
    return info.si_pid == pid;
}

void
bench_stop(pid_t pid, unsigned grace_ms)
{
    uint64_t end = bench_now_ns() + (uint64_t)grace_ms * 1000000u;

    if (pid <= 0) {
        return;
    }
    kill(-pid, SIGTERM);
    while (!exited(pid) && bench_now_ns() < end) {
        bench_sleep_ms(5);
    }
    /* Stragglers of the group (a Python peer's ranks) go with it. */
    kill(-pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
    child_forget(pid);
}

void
bench_kill(pid_t pid)
{
    if (pid <= 0) {
        return;
    }
    kill(-pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
    child_forget(pid);
}

void
bench_stop_all(void)
{
    for (size_t i = 0; i < MAX_CHILDREN; i++) {
        if (children[i] != 0) {
            kill(-children[i], SIGKILL);
        }
    }
    for (size_t i = 0; i < MAX_CHILDREN; i++) {
        if (children[i] != 0) {
            waitpid(children[i], NULL, 0);
            children[i] = 0;
        }
    }
}

static void
tmpdir_remove(void)
{
    const char *keep = getenv("BENCH_KEEP");
    char path[1024];
    struct dirent *e;
    DIR *d;

    if (tmpdir[0] == '\0' || tmpdir_kept || (keep != NULL && strcmp(keep, "1") == 0)) {
        return;
    }
    if ((d = opendir(tmpdir)) != NULL) {
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                snprintf(path, sizeof(path), "%s/%s", tmpdir, e->d_name);
                unlink(path);
            }
        }
        closedir(d);
    }
    rmdir(tmpdir);
    tmpdir[0] = '\0';
}

static void
at_exit(void)
{
    bench_stop_all();
    tmpdir_remove();
}

/* Only async-signal-safe calls: kill the groups, then leave. */
static void
on_signal(int sig)
{
    for (size_t i = 0; i < MAX_CHILDREN; i++) {
        if (children[i] != 0) {
            kill(-children[i], SIGKILL);
        }
    }
    _exit(128 + sig);
}

void
bench_init(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    atexit(at_exit);
    /* Die with whoever runs us (run.sh killed by a timeout), so our children die too. */
    prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
}

uint64_t
bench_rss_bytes(pid_t pid)
{
    char path[64], *text, *line, *end;
    uint64_t kib = 0;
    size_t len;

    snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
    if ((text = bench_read_file(path, &len)) == NULL) {
        return 0;
    }
    if ((line = strstr(text, "\nVmRSS:")) != NULL) {
        errno = 0;
        kib   = strtoull(line + 7, &end, 10);
        if (errno != 0 || end == line + 7) {
            kib = 0;
        }
    }
    free(text);
    return kib * 1024;
}

/* ---- ports, files, directories ------------------------------------------------------------ */

/* The kernel may offer a port again at once, before the daemon given it the first time has
 * bound it: one of bench_fanout's 32 workers was once given another's port, failed to listen
 * and never registered. So no port is handed out twice by this process. */
int
bench_free_port(void)
{
    static uint8_t handed_out[65536 / 8];

    for (int tries = 0; tries < 1000; tries++) {
        struct sockaddr_in sa = { .sin_family = AF_INET };
        socklen_t len         = sizeof(sa);
        int fd, port = 0;

        if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0) {
            return 0;
        }
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
            getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
            port = ntohs(sa.sin_port);
        }
        close(fd);
        if (port == 0) {
            return 0;
        }
        if ((handed_out[port / 8] & (1u << (port % 8))) == 0) {
            handed_out[port / 8] |= (uint8_t)(1u << (port % 8));
            return port;
        }
    }
    return 0;
}

void
bench_keep_tmpdir(void)
{
    tmpdir_kept = true;
}

const char *
bench_tmpdir(void)
{
    if (tmpdir[0] == '\0') {
        const char *base = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
        snprintf(tmpdir, sizeof(tmpdir), "%s/devcoord-bench-XXXXXX", base);
        if (mkdtemp(tmpdir) == NULL) {
            perror("bench: mkdtemp");
            exit(1);
        }
    }
    return tmpdir;
}

int
bench_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    int rv  = 0;

    if (f == NULL) {
        return -1;
    }
    if (fputs(text, f) < 0) {
        rv = -1;
    }
    if (fclose(f) != 0) {
        rv = -1;
    }
    return rv;
}

char *
bench_read_file(const char *path, size_t *len)
{
    FILE *f   = fopen(path, "r");
    char *buf = NULL, *grow;
    size_t n = 0, cap = 0, got;

    if (f == NULL) {
        return NULL;
    }
    for (;;) {
        if (cap - n < 4096) {
            cap = cap ? cap * 2 : 8192;
            if ((grow = realloc(buf, cap)) == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = grow;
        }
        got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            break;
        }
    }
    fclose(f);
    buf[n] = '\0';
    if (len != NULL) {
        *len = n;
    }
    return buf;
}

/* ---- results ------------------------------------------------------------------------------ */

FILE *
bench_result_open(const struct bench_args *a, const char *name)
{
    char path[1024];
    FILE *f;

    mkdir(a->out_dir, 0755);
    snprintf(path, sizeof(path), "%s/%s", a->out_dir, name);
    if ((f = fopen(path, "w")) == NULL) {
        fprintf(stderr, "bench: cannot write %s: %s\n", path, strerror(errno));
    }
    return f;
}

int
bench_summary_open(struct bench_summary *s, const struct bench_args *a, const char *bench)
{
    char name[256];

    snprintf(name, sizeof(name), "%s.summary.tsv", bench);
    s->f = bench_result_open(a, name);
    return s->f != NULL ? 0 : -1;
}

void
bench_summary_row(struct bench_summary *s, const char *measure, const char *devcoord,
                  const char *peer, double ratio, const char *goal, int met)
{
    char r[32];

    if (s->f == NULL) {
        return;
    }
    if (isnan(ratio) || isinf(ratio)) {
        snprintf(r, sizeof(r), "-");
    } else {
        snprintf(r, sizeof(r), "%.2fx", ratio);
    }
    fprintf(s->f, "%s\t%s\t%s\t%s\t%s\t%s\n", measure, devcoord, peer != NULL ? peer : "-", r,
            goal != NULL ? goal : "-",
            met < 0 ? "-"
            : met   ? "yes"
                    : "NO");
    fflush(s->f);
}

void
bench_summary_close(struct bench_summary *s)
{
    if (s->f != NULL) {
        fclose(s->f);
        s->f = NULL;
    }
}

const char *
bench_fmt(const char *fmt, ...)
{
    static char bufs[8][128];
    static unsigned next;
    char *b = bufs[next++ % 8];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(b, sizeof(bufs[0]), fmt, ap);
    va_end(ap);
    return b;
}

const char *
bench_size_text(uint64_t bytes)
{
    if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) {
        return bench_fmt("%llu MiB", (unsigned long long)(bytes >> 20));
    }
    if (bytes >= 1024 && bytes % 1024 == 0) {
        return bench_fmt("%llu KiB", (unsigned long long)(bytes >> 10));
    }
    return bench_fmt("%llu B", (unsigned long long)bytes);
}
