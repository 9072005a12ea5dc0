/*
 * What both daemons share at the edges: command-line parsing of the common options, and
 * signal handling (SIGINT/SIGTERM are blocked in every thread and waited for by main).
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

#endif
