/*
 * What both daemons share at the edges: command-line parsing of the common options, signal
 * handling (SIGINT/SIGTERM are blocked in every thread and waited for by main), and the
 * bounded stop that follows the signal (a watchdog thread; see daemon.c for the order).
 */
#ifndef DEVCOORD_COMMON_DAEMON_H
#define DEVCOORD_COMMON_DAEMON_H

#include <stdbool.h>

struct daemon_args {
    const char *config;      /* --config FILE */
    const char *listen;      /* --listen ADDR: overrides the config's listen */
    const char *http;        /* --http HOST:PORT: overrides the config's http ("" turns it off) */
    const char *name;        /* --name NAME: overrides the worker's name */
    const char *coordinator; /* --coordinator ADDR: overrides the worker's coordinator */
};

/* Parses argv. Returns -1 to go on, or an exit code: 0 after --help/--version, 2 after a
 * usage error (a message on stderr). `usage` is the text for --help. */
int daemon_parse_args(int argc, char **argv, const char *usage, struct daemon_args *out);

/* Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (threads started later inherit
 * it) and ignores SIGPIPE. Call first in main. */
void daemon_block_signals(void);

/* Waits up to timeout_ms (-1: forever) for SIGINT or SIGTERM; returns the signal or 0. */
int daemon_wait_signal(int timeout_ms);

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
