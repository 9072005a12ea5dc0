/*
 * What both daemons share at the edges: command-line parsing of the common options, signal
 * handling (SIGINT, SIGTERM and SIGHUP are blocked in every thread and waited for by main:
 * no signal handler runs, so a reload is ordinary code on the main thread), the reload that
 * SIGHUP asks for, readiness notices to systemd ($NOTIFY_SOCKET), and the bounded stop that
 * follows SIGINT/SIGTERM (a watchdog thread; see daemon.c for the order).
 */
#ifndef DEVCOORD_COMMON_DAEMON_H
#define DEVCOORD_COMMON_DAEMON_H

#include <stdbool.h>

#include "status.h"

struct auth_current;

struct daemon_args {
    const char *config;      /* --config FILE */
    const char *listen;      /* --listen ADDR: overrides the config's listen */
    const char *http;        /* --http HOST:PORT: overrides the config's http ("" turns it off) */
    const char *name;        /* --name NAME: overrides the worker's name */
    const char *coordinator; /* --coordinator ADDR: overrides the worker's coordinator */
    /* --check-config FILE: load and check FILE as a start would, then exit; `config` is set
     * to FILE as well. */
    const char *check_config;
};

/* Parses argv. Returns -1 to go on, or an exit code: 0 after --help/--version, 2 after a
 * usage error (a message on stderr). `prog` is the program's name (messages, --version),
 * `usage` the text for --help. */
int daemon_parse_args(int argc, char **argv, const char *prog, const char *usage,
                      struct daemon_args *out);

/* Replaces the string *slot with a copy of value (a command-line override); nothing when
 * value is NULL. -1 when out of memory. */
int daemon_override(char **slot, const char *value);

/* The exit code of a daemon whose config did not load (code, st): with --check-config that
 * of daemon_check_config_result, else 2 (1 when out of memory) after "prog: message" on
 * stderr. */
int daemon_config_failed(const char *prog, const struct daemon_args *args, dc_code code,
                         const dc_status *st);

/* The end of --check-config: prints "FILE: ok" on stdout and returns 0 when code is DC_OK,
 * else "prog: <st's message>" on stderr and returns 1. */
int daemon_check_config_result(const char *prog, const char *file, dc_code code,
                               const dc_status *st);

/* Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (threads started later inherit
 * it) and ignores SIGPIPE. Call first in main. */
void daemon_block_signals(void);

/* Raises the soft limit on open files to the hard one (a shell's soft limit is often 1024,
 * which a coordinator of a thousand workers passes: one connection from each, and one to
 * each). Logs the change at info level, and warns when the limit is below `want`, what the
 * daemon's own limits may need. Returns the soft limit now in force (0 when unknown). */
unsigned long long daemon_raise_open_files(unsigned long long want);

/* The RPC connections a daemon takes at once by default: its open-files limit
 * (daemon_raise_open_files) less 1024 kept for its own work (dials to peers, files), half of
 * it under 2048, at most 1,048,576; 0 (no bound) when the limit is not known. */
unsigned daemon_auto_connections(unsigned long long open_files);

/* Waits up to timeout_ms (-1: forever) for SIGINT, SIGTERM or SIGHUP; returns the signal,
 * or 0 when none came in time. */
int daemon_wait_signal(int timeout_ms);

/* What SIGHUP reloads, from the config file the daemon started with: log.level, and the
 * tokens of auth.tokens_file (the file named at start: turning auth on or off, or moving
 * the file, takes a restart and is logged as such). A file that does not load changes
 * nothing and is logged at error level; the tokens file is swapped as a whole, under the
 * calls that are checking tokens (auth_current). */
struct daemon_reload {
    const char *config;        /* --config FILE; NULL: started on defaults, nothing to reload */
    bool worker;               /* a worker's config, else a coordinator's */
    const char *tokens_file;   /* auth.tokens_file at start; NULL: auth is off */
    struct auth_current *auth; /* the table to replace; NULL when auth is off */
    const char *calls_with;    /* the worker token this daemon calls others with, or NULL:
                                  a reload that drops it is warned about (it stays in use) */
};

/* Reloads, telling systemd RELOADING=1 before and READY=1 after. Call on the main thread. */
void daemon_reload(const struct daemon_reload *r);

/* Sends `state` ("READY=1", "STOPPING=1", ...) as one datagram to the unix socket named by
 * $NOTIFY_SOCKET (a path, or an abstract name when it starts with '@'), as sd_notify(3)
 * does; nothing when it is unset. Failures are logged at debug level and otherwise
 * ignored: a daemon runs the same whether or not anyone listens. */
void daemon_notify(const char *state);

/* How long a daemon may take to stop once told to: under the 2 s that operators and the
 * tests allow, with room for scheduling. */
#define DAEMON_STOP_BOUND_MS 1500

/* Starts the stop watchdog as a daemon begins to stop: unless daemon_stop_end is called
 * within bound_ms, it logs a warning and ends the process at once with _exit(exit_code).
 * Call it before the first close; one watchdog per process. */
void daemon_stop_begin(unsigned bound_ms, int exit_code);

/* The stop finished in time (call it after nng_fini): the watchdog is told and joined.
 * Does nothing when daemon_stop_begin was not called. */
void daemon_stop_end(void);

#endif
