#include "daemon.h"

#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include "auth.h"
#include "config.h"
#include "log.h"
#include "threadname.h"

static const char *
option_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);

    if (strncmp(argv[*i], name, n) == 0 && argv[*i][n] == '=') {
        return argv[*i] + n + 1;
    }
    if (strcmp(argv[*i], name) == 0) {
        if (*i + 1 >= argc) {
            return NULL;
        }
        return argv[++*i];
    }
    return NULL;
}

int
daemon_parse_args(int argc, char **argv, const char *prog, const char *usage,
                  struct daemon_args *out)
{
    static const char *const names[] = { "--config", "--listen",      "--http",
                                         "--name",   "--coordinator", "--check-config" };

    memset(out, 0, sizeof(*out));
    for (int i = 1; i < argc; i++) {
        const char **slots[] = { &out->config, &out->listen,      &out->http,
                                 &out->name,   &out->coordinator, &out->check_config };
        bool matched         = false;

        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("%s %s\n", prog, DEVCOORD_VERSION);
            return 0;
        }
        for (size_t k = 0; k < sizeof(names) / sizeof(names[0]) && !matched; k++) {
            size_t n = strlen(names[k]);
            if (strncmp(argv[i], names[k], n) != 0 || (argv[i][n] != '\0' && argv[i][n] != '=')) {
                continue;
            }
            matched = true;
            if ((*slots[k] = option_value(argc, argv, &i, names[k])) == NULL) {
                fprintf(stderr, "%s: %s needs a value (see --help)\n", prog, names[k]);
                return 2;
            }
        }
        if (!matched) {
            fprintf(stderr, "%s: unknown argument '%s' (see --help)\n", prog, argv[i]);
            return 2;
        }
    }
    if (out->check_config != NULL) {
        if (out->config != NULL && strcmp(out->config, out->check_config) != 0) {
            fprintf(stderr, "%s: --check-config FILE checks FILE; drop --config (see --help)\n",
                    prog);
            return 2;
        }
        out->config = out->check_config;
    }
    return -1;
}

int
daemon_override(char **slot, const char *value)
{
    char *copy;

    if (value == NULL) {
        return 0;
    }
    if ((copy = strdup(value)) == NULL) {
        return -1;
    }
    free(*slot);
    *slot = copy;
    return 0;
}

int
daemon_config_failed(const char *prog, const struct daemon_args *args, dc_code code,
                     const dc_status *st)
{
    if (args->check_config != NULL) {
        return daemon_check_config_result(prog, args->check_config, code, st);
    }
    fprintf(stderr, "%s: %s\n", prog, st->message);
    return code == DC_RESOURCE_EXHAUSTED ? 1 : 2;
}

int
daemon_check_config_result(const char *prog, const char *file, dc_code code, const dc_status *st)
{
    if (code != DC_OK) {
        fprintf(stderr, "%s: %s\n", prog, st->message);
        return 1;
    }
    printf("%s: ok\n", file);
    return 0;
}

static sigset_t
daemon_signals(void)
{
    sigset_t set;

    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    return set;
}

void
daemon_block_signals(void)
{
    sigset_t set = daemon_signals();

    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

unsigned long long
daemon_raise_open_files(unsigned long long want)
{
    struct rlimit rl;
    rlim_t was;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        log_warn("cannot read the open files limit: %s", strerror(errno));
        return 0;
    }
    was = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            log_warn("cannot raise the open files limit from %llu to %llu: %s",
                     (unsigned long long)was, (unsigned long long)rl.rlim_max, strerror(errno));
            rl.rlim_cur = was;
        } else {
            log_info("open files limit raised from %llu to %llu", (unsigned long long)was,
                     (unsigned long long)rl.rlim_cur);
        }
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        log_warn("open files limited to %llu, under the %llu this daemon's limits may need: "
                 "raise the hard limit (LimitNOFILE= in a systemd unit, ulimit -Hn in a shell)",
                 (unsigned long long)rl.rlim_cur, want);
    }
    return rl.rlim_cur == RLIM_INFINITY ? ~0ULL : (unsigned long long)rl.rlim_cur;
}

unsigned
daemon_auto_connections(unsigned long long open_files)
{
    unsigned long long n = open_files >= 2048 ? open_files - 1024 : open_files / 2;

    return n > (1u << 20) ? 1u << 20 : (unsigned)n;
}

int
daemon_wait_signal(int timeout_ms)
{
    sigset_t set = daemon_signals();
    struct timespec ts;
    int sig;

    if (timeout_ms < 0) {
        while (sigwait(&set, &sig) != 0) {
        }
        return sig;
    }
    ts.tv_sec  = timeout_ms / 1000;
    ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
    sig        = sigtimedwait(&set, NULL, &ts);
    return sig == SIGINT || sig == SIGTERM || sig == SIGHUP ? sig : 0;
}

void
daemon_notify(const char *state)
{
    const char *name = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa;
    size_t n;
    int fd;

    if (name == NULL || name[0] == '\0') {
        return;
    }
    n = strlen(name);
    if ((name[0] != '/' && name[0] != '@') || n >= sizeof(sa.sun_path)) {
        log_debug("NOTIFY_SOCKET is neither an absolute path nor an abstract name: not "
                  "notifying");
        return;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, name, n);
    if (name[0] == '@') {
        sa.sun_path[0] = '\0'; /* the abstract namespace: the name is the n bytes, no NUL */
    }
    if ((fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0) {
        log_debug("NOTIFY_SOCKET: socket: %s", strerror(errno));
        return;
    }
    if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (const struct sockaddr *)&sa,
               (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0) {
        log_debug("NOTIFY_SOCKET %s: %s: %s", name, state, strerror(errno));
    }
    close(fd);
}

/* Where a reload takes its values: the config file loaded again, as at start. */
struct reload_values {
    enum log_level level;
    char *tokens_file;
};

static dc_code
reload_values_load(const struct daemon_reload *r, struct reload_values *out, dc_status *st)
{
    union {
        struct config_worker worker;
        struct config_coordinator coordinator;
    } cfg;
    const struct config_log *log;
    char **tokens_file;
    dc_code code;

    memset(&cfg, 0, sizeof(cfg)); /* all of it, whichever member is larger */
    memset(out, 0, sizeof(*out));
    if (r->worker) {
        log         = &cfg.worker.log;
        tokens_file = &cfg.worker.tokens_file;
        if ((code = config_worker_defaults(&cfg.worker, st)) == DC_OK) {
            code = config_worker_load(r->config, &cfg.worker, st);
        }
    } else {
        log         = &cfg.coordinator.log;
        tokens_file = &cfg.coordinator.tokens_file;
        if ((code = config_coordinator_defaults(&cfg.coordinator, st)) == DC_OK) {
            code = config_coordinator_load(r->config, &cfg.coordinator, st);
        }
    }
    if (code == DC_OK) {
        out->level       = log->level;
        out->tokens_file = *tokens_file;
        *tokens_file     = NULL;
    }
    if (r->worker) {
        config_worker_free(&cfg.worker);
    } else {
        config_coordinator_free(&cfg.coordinator);
    }
    return code;
}

static bool
same_path(const char *a, const char *b)
{
    return a == NULL || b == NULL ? a == b : strcmp(a, b) == 0;
}

/* Replaces the tokens with those of r->tokens_file, or logs why not. */
static void
reload_tokens(const struct daemon_reload *r)
{
    struct auth *fresh = NULL;
    dc_status st;

    if (auth_load(r->tokens_file, &fresh, &st) != DC_OK) {
        log_error("reload: %s: keeping the tokens loaded before", st.message);
        return;
    }
    if (r->calls_with != NULL && auth_role_of(fresh, r->calls_with) != ROLE_WORKER) {
        log_warn("reload: %s no longer holds the worker token this daemon calls workers "
                 "with; it keeps calling with it until restarted",
                 r->tokens_file);
    }
    auth_current_set(r->auth, fresh);
    log_info("reload: tokens of %s in use", r->tokens_file);
}

void
daemon_reload(const struct daemon_reload *r)
{
    struct reload_values now;
    dc_status st;

    daemon_notify("RELOADING=1");
    if (r->config == NULL) {
        log_info("SIGHUP: started without --config, nothing to reload");
    } else if (reload_values_load(r, &now, &st) != DC_OK) {
        log_error("reload: %s: keeping the running configuration", st.message);
    } else {
        log_set_level(now.level);
        log_info("reload: %s: log level %s", r->config, log_level_name(now.level));
        if (!same_path(now.tokens_file, r->tokens_file)) {
            log_warn("reload: auth.tokens_file changed from %s to %s: that takes a restart%s",
                     r->tokens_file != NULL ? r->tokens_file : "(none)",
                     now.tokens_file != NULL ? now.tokens_file : "(none)",
                     r->tokens_file != NULL ? "; reloading the file named at start" : "");
        }
        if (r->tokens_file != NULL && r->auth != NULL) {
            reload_tokens(r);
        }
        free(now.tokens_file);
    }
    daemon_notify("READY=1");
}

/*
 * The bounded stop. Both daemons stop in one order, each step making the next one short:
 *
 *  1. Close the listener. Nothing new connects, and nng closes the connections the listener
 *     accepted as well: a caller still waiting hears UNAVAILABLE at once (connection lost)
 *     rather than at its deadline, and no further request arrives.
 *  2. Stop taking requests: the RPC server does not start what it received but had not
 *     started, arms no context again, and drops answers rather than sending them (they have
 *     no connection left, and nng 1.5.2 leaks a message sent as its connection closes).
 *  3. Answer or cancel what is in flight: the coordinator fails its ops, the worker leaves
 *     the cluster and fails its collectives; every handler answers, every outgoing call ends.
 *  4. Persist state: the coordinator writes operator intent at every change, before the
 *     change is acknowledged; rpc_server_free waits for the handlers, so for any write still
 *     under way. The worker has nothing to keep (tensors live in memory).
 *  5. Close the sockets, then nng itself (nng_close, nng_fini).
 *
 * Step 5 is where nng 1.5.2 can hang: its tcp transport may start reading a request body on
 * a connection that is already closed (tcptran_pipe_recv_cb; fixed in nng 1.6.0, PR #1636),
 * and closing the socket then waits forever for that read. It takes a request arriving just
 * as the daemon closes, so it is rare when idle and common under load. By then nothing is
 * left to do that matters: callers were answered or cut off in steps 1-3 and state is on disk
 * after step 4. So the stop runs under a watchdog that ends the process with the normal exit
 * code once the bound has passed, and says so in the log. The bound counts from the signal,
 * not from step 5, so it holds whichever step is slow; an intent write it cuts short leaves
 * the previous file (writes are atomic) and was never acknowledged. When the closes finish
 * in time, as they nearly always do, the watchdog is joined and the process exits normally,
 * nng_fini included, which keeps valgrind and ASan runs clean.
 */
static struct {
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    pthread_t thread;
    struct timespec deadline; /* CLOCK_MONOTONIC */
    unsigned bound_ms;
    int exit_code;
    bool running;
    bool done;
} stop = { .mtx = PTHREAD_MUTEX_INITIALIZER };

static void *
daemon_stop_watchdog(void *arg)
{
    int rv = 0;

    thread_name_set("dc-stop-watch");
    (void)arg;
    pthread_mutex_lock(&stop.mtx);
    while (!stop.done && rv != ETIMEDOUT) {
        rv = pthread_cond_timedwait(&stop.cv, &stop.mtx, &stop.deadline);
    }
    if (!stop.done) {
        log_warn("not stopped within %u ms (nng 1.5.2 can wait forever closing a connection "
                 "that was receiving): exiting now, with calls answered and state saved",
                 stop.bound_ms);
        _exit(stop.exit_code);
    }
    pthread_mutex_unlock(&stop.mtx);
    return NULL;
}

void
daemon_stop_begin(unsigned bound_ms, int exit_code)
{
    pthread_condattr_t attr;

    pthread_mutex_lock(&stop.mtx);
    if (stop.running) {
        pthread_mutex_unlock(&stop.mtx);
        return;
    }
    clock_gettime(CLOCK_MONOTONIC, &stop.deadline);
    stop.deadline.tv_sec += (time_t)(bound_ms / 1000);
    stop.deadline.tv_nsec += (long)(bound_ms % 1000) * 1000000L;
    if (stop.deadline.tv_nsec >= 1000000000L) {
        stop.deadline.tv_sec++;
        stop.deadline.tv_nsec -= 1000000000L;
    }
    stop.bound_ms  = bound_ms;
    stop.exit_code = exit_code;
    stop.done      = false;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&stop.cv, &attr);
    pthread_condattr_destroy(&attr);
    stop.running = pthread_create(&stop.thread, NULL, daemon_stop_watchdog, NULL) == 0;
    if (!stop.running) {
        pthread_cond_destroy(&stop.cv);
        log_warn("cannot start the stop watchdog: stopping without a time bound");
    }
    pthread_mutex_unlock(&stop.mtx);
}

void
daemon_stop_end(void)
{
    pthread_mutex_lock(&stop.mtx);
    if (!stop.running) {
        pthread_mutex_unlock(&stop.mtx);
        return;
    }
    stop.done = true;
    pthread_cond_signal(&stop.cv);
    pthread_mutex_unlock(&stop.mtx);
    pthread_join(stop.thread, NULL);
    pthread_mutex_lock(&stop.mtx);
    stop.running = false;
    pthread_cond_destroy(&stop.cv);
    pthread_mutex_unlock(&stop.mtx);
}
