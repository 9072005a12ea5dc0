/*
 * What devcoordctl accepts: the tables of its options and commands, the parsing of argv
 * against them, and the help and shell-completion text generated from the same tables, so
 * that what `--help` shows, what completes and what parses cannot drift apart. The
 * commands themselves live in devcoordctl.c. A struct cli points into argv; nothing here
 * allocates.
 */
#ifndef DEVCOORD_CLIENT_CLI_H
#define DEVCOORD_CLIENT_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* The exit codes of devcoordctl. */
enum {
    EXIT_OK          = 0,
    EXIT_REFUSED     = 1, /* the server said no (or the command's goal was not met) */
    EXIT_USAGE       = 2, /* the command line, or a local file it names, is wrong */
    EXIT_UNREACHABLE = 3, /* no answer: the coordinator or a worker cannot be reached */
};

enum opt {
    /* global */
    O_SERVER,
    O_TOKEN_FILE,
    O_TLS_CA,
    O_TLS_CERT,
    O_TLS_KEY,
    O_OUTPUT,
    O_TIMEOUT,
    O_HELP,
    O_VERSION,
    /* per command */
    O_BACKEND,
    O_WORKER,
    O_STATE,
    O_LABEL,
    O_LIMIT,
    O_WATCH,
    O_WATCH_INTERVAL,
    O_WAIT,
    O_OP,
    O_REDUCE,
    O_ROOT,
    O_DEVICES,
    O_TENSOR,
    O_OP_TIMEOUT,
    O_OUTPUT_TENSOR,
    O_IDEMPOTENCY_KEY,
    O_DTYPE,
    O_VALUES,
    O_FILE,
    O_SHAPE,
    O_HTTP,
    O_SELF,
    O_ELEMENTS,
    O_REPEAT,
    O_COUNT
};

enum command {
    CMD_STATUS,
    CMD_WORKERS_LIST,
    CMD_WORKERS_SHOW,
    CMD_WORKERS_CORDON,
    CMD_WORKERS_UNCORDON,
    CMD_WORKERS_DRAIN,
    CMD_DEVICES_LIST,
    CMD_OPS_LIST,
    CMD_OPS_SHOW,
    CMD_PLAN,
    CMD_SUBMIT,
    CMD_TENSOR_PUT,
    CMD_TENSOR_GET,
    CMD_TENSOR_LIST,
    CMD_TENSOR_DELETE,
    CMD_COLLECTIVE,
    CMD_GROUPS_LIST,
    CMD_GROUPS_SHOW,
    CMD_HEALTH,
    CMD_VERSION,
    CMD_COMPLETION,
};

struct command_def {
    enum command id;
    const char *group;
    const char *sub;  /* NULL: a one-word command */
    int n_args;       /* positional arguments after the command words */
    const char *args; /* " NAME" */
    uint64_t opts;    /* the options it takes besides the global ones */
    const char *synopsis;
    const char *summary;
    const char *details;         /* NULL or a paragraph, lines split with \n */
    const char *const *examples; /* NULL-terminated, each after "devcoordctl " */
};

#define MAX_POSITIONAL 8

struct cli {
    const char *val[O_COUNT];
    bool seen[O_COUNT];
    const char *pos[MAX_POSITIONAL];
    int n_pos;
    const struct command_def *cmd;
    const char *const *args; /* the command's positional arguments */
    bool json;
    uint32_t timeout_ms; /* --timeout; 0 when not given */
    /* The coordinator's address: -s, else $DEVCOORD_ADDR, else the default. */
    const char *server;
};

/* Returned by cli_parse when the command is to run; any other value is the exit code (help
 * and --version printed: 0; a usage error printed: EXIT_USAGE). */
#define CLI_RUN (-1)

int cli_parse(struct cli *cli, int argc, char **argv);

/* Prints "devcoordctl: <message> (see 'devcoordctl CMD --help')" on stderr, naming the
 * command when one was recognised, and returns EXIT_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The bash completion script (devcoordctl completion bash). */
void cli_print_completion_bash(void);

/* "--name" of an option, for messages. */
const char *cli_opt_name(enum opt o);

#endif
