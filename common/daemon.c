#include "daemon.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

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
daemon_parse_args(int argc, char **argv, const char *usage, struct daemon_args *out)
{
    static const char *const names[] = { "--config", "--listen", "--http", "--name",
                                         "--coordinator" };

    memset(out, 0, sizeof(*out));
    for (int i = 1; i < argc; i++) {
        const char **slots[] = { &out->config, &out->listen, &out->http, &out->name,
                                 &out->coordinator };
        bool matched         = false;

        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("%s %s\n", argv[0], DEVCOORD_VERSION);
            return 0;
        }
        for (size_t k = 0; k < sizeof(names) / sizeof(names[0]) && !matched; k++) {
            size_t n = strlen(names[k]);
            if (strncmp(argv[i], names[k], n) != 0 || (argv[i][n] != '\0' && argv[i][n] != '=')) {
                continue;
            }
            matched = true;
            if ((*slots[k] = option_value(argc, argv, &i, names[k])) == NULL) {
                fprintf(stderr, "%s: %s needs a value (see --help)\n", argv[0], names[k]);
                return 2;
            }
        }
        if (!matched) {
            fprintf(stderr, "%s: unknown argument '%s' (see --help)\n", argv[0], argv[i]);
            return 2;
        }
    }
    return -1;
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

int
daemon_wait_signal(int timeout_ms)
{
    sigset_t set = daemon_signals();
    struct timespec ts;
    int sig;

    if (timeout_ms < 0) {
        while (sigwait(&set, &sig) != 0) {
        }
        return sig == SIGHUP ? 0 : sig;
    }
    ts.tv_sec  = timeout_ms / 1000;
    ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
    sig        = sigtimedwait(&set, NULL, &ts);
    return sig == SIGINT || sig == SIGTERM ? sig : 0;
}
