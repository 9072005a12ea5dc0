#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devcoord/devcoord.h"
#include "human.h"

#define DEFAULT_ADDR "tcp://127.0.0.1:7400"
/* The group id of node-a/cuda:0 alone (the quickstart's), which ex_collective leaves behind. */
#define EXAMPLE_GROUP_ID "15284f939122477d"

/* ---- the tables ---------------------------------------------------------------------- */

struct opt_def {
    const char *name;
    char short_name;
    const char *metavar; /* NULL: a flag */
    const char *help;    /* lines split with \n */
    /* Values to complete, space-separated; "FILE" completes file names; NULL: free text. */
    const char *values;
};

#define OPT(o) ((uint64_t)1 << (o))
#define GLOBAL_OPTS                                                                         \
    (OPT(O_SERVER) | OPT(O_TOKEN_FILE) | OPT(O_TLS_CA) | OPT(O_TLS_CERT) | OPT(O_TLS_KEY) | \
     OPT(O_OUTPUT) | OPT(O_TIMEOUT) | OPT(O_HELP) | OPT(O_VERSION))

#define KINDS    "all-reduce reduce broadcast all-gather barrier"
#define REDUCES  "sum mean min max prod"
#define DTYPES   "f32 f64 i32 i64 f16 bf16"
#define BACKENDS "cpu cuda rocm metal vulkan wgpu webgpu flex ndarray libtorch remote"

static const struct opt_def opt_defs[O_COUNT] = {
    [O_SERVER] = {
        .name = "server",
        .short_name = 's',
        .metavar = "ADDR",
        .help = "coordinator: tcp://HOST:PORT, HOST:PORT (the same), tls+tcp://HOST:PORT\n"
                "or ipc://PATH (default $DEVCOORD_ADDR, then " DEFAULT_ADDR ");\n"
                "A,B,C: coordinators in high availability, their leader is followed",
    },
    [O_TOKEN_FILE] = {
        .name = "token-file",
        .metavar = "F",
        .help = "file whose first line is the bearer token (default $DEVCOORD_TOKEN,\n"
                "which holds the token itself, then $DEVCOORD_TOKEN_FILE, a file)",
        .values = "FILE",
    },
    [O_TLS_CA] = {
        .name = "tls-ca",
        .metavar = "F",
        .help = "CA certificate (PEM) that verifies tls+tcp:// servers\n"
                "(default $DEVCOORD_TLS_CA)",
        .values = "FILE",
    },
    [O_TLS_CERT] = {
        .name = "tls-cert",
        .metavar = "F",
        .help = "client certificate (PEM), when servers require one",
        .values = "FILE",
    },
    [O_TLS_KEY] = {
        .name = "tls-key",
        .metavar = "F",
        .help = "its private key (PEM)",
        .values = "FILE",
    },
    [O_OUTPUT] = {
        .name = "output",
        .short_name = 'o',
        .metavar = "FORMAT",
        .help = "table (default) or json: one JSON document",
        .values = "table json",
    },
    [O_TIMEOUT] = {
        .name = "timeout",
        .metavar = "D",
        .help = "how long each call may take: 500ms, 10s, 2m, 1h (default 30s); for\n"
                "submit also the op's deadline (unless --timeout-ms), for\n"
                "workers drain --wait the whole wait",
    },
    [O_HELP] = {
        .name = "help",
        .short_name = 'h',
        .help = "this text; after a command, that command's",
    },
    [O_VERSION] = {
        .name = "version",
        .help = "the client's version ('devcoordctl version': the server's too)",
    },
    [O_BACKEND] = {
        .name = "backend",
        .metavar = "B",
        .help = "only devices of this backend (cuda, rocm, cpu, ...)",
        .values = BACKENDS,
    },
    [O_WORKER] = {
        .name = "worker",
        .metavar = "W",
        .help = "only devices of this worker",
    },
    [O_STATE] = {
        .name = "state",
        .metavar = "S",
        .help = "only devices in this state: healthy, unhealthy or dead",
        .values = "healthy unhealthy dead",
    },
    [O_LABEL] = {
        .name = "label",
        .metavar = "K=V",
        .help = "only devices of workers labelled K=V",
    },
    [O_LIMIT] = {
        .name = "limit",
        .metavar = "N",
        .help = "at most N ops, in flight first, then the newest",
    },
    [O_WATCH] = {
        .name = "watch",
        .short_name = 'w',
        .help = "redraw whenever a worker joins, leaves or changes state, until\n"
                "interrupted (Ctrl-C, exit 0)",
    },
    [O_WATCH_INTERVAL] = {
        .name = "watch-interval",
        .metavar = "D",
        .help = "how often --watch asks (default 2s)",
    },
    [O_WAIT] = {
        .name = "wait",
        .help = "wait until no op in flight uses the worker (at most --timeout,\n"
                "default 30s)",
    },
    [O_OP] = {
        .name = "op",
        .metavar = "KIND",
        .help = "all-reduce, reduce, broadcast, all-gather or barrier",
        .values = KINDS,
    },
    [O_REDUCE] = {
        .name = "reduce",
        .metavar = "OP",
        .help = "sum, mean, min, max or prod (all-reduce, reduce, reduce-scatter)",
        .values = REDUCES,
    },
    [O_ROOT] = {
        .name = "root",
        .metavar = "I",
        .help = "rank of the root: an index into --devices (broadcast, reduce)",
    },
    [O_DEVICES] = {
        .name = "devices",
        .metavar = "REF,...",
        .help = "the devices in rank order, e.g. node-a/cuda:0,node-b/autodiff(cuda:0)",
    },
    [O_TENSOR] = {
        .name = "tensor",
        .metavar = "NAME",
        .help = "the tensor the op works on, on every device",
    },
    [O_OP_TIMEOUT] = {
        .name = "timeout-ms",
        .metavar = "N",
        .help = "the op's deadline in ms (default: --timeout when given, else\n"
                "the coordinator's limits.op_timeout_ms)",
    },
    [O_OUTPUT_TENSOR] = {
        .name = "output-tensor",
        .metavar = "NAME",
        .help = "where all-gather writes (default NAME.gathered)",
    },
    [O_IDEMPOTENCY_KEY] = {
        .name = "idempotency-key",
        .metavar = "K",
        .help = "name the op: submitting K again returns the first outcome\n"
                "and never runs the op twice (at most 128 bytes)",
    },
    [O_DTYPE] = {
        .name = "dtype",
        .metavar = "T",
        .help = "f32, f64, i32, i64, f16 or bf16",
        .values = DTYPES,
    },
    [O_VALUES] = {
        .name = "values",
        .metavar = "LIST",
        .help = "the values, comma-separated: 1,2,3",
    },
    [O_FILE] = {
        .name = "file",
        .metavar = "F",
        .help = "raw values in this machine's byte order; '-' is standard input\n"
                "(put) or standard output (get)",
        .values = "FILE",
    },
    [O_SHAPE] = {
        .name = "shape",
        .metavar = "DIMS",
        .help = "dimensions, e.g. 2,3 (default: one dimension)",
    },
    [O_SELF] = {
        .name = "self",
        .metavar = "REF",
        .help = "the entry of --devices this rank is",
    },
    [O_ELEMENTS] = {
        .name = "count",
        .metavar = "N",
        .help = "N elements, each the rank + 1 (instead of --values)",
    },
    [O_REPEAT] = {
        .name = "repeat",
        .metavar = "K",
        .help = "make the call K times and print the time per call (default 1)",
    },
    [O_HTTP] = {
        .name = "http",
        .metavar = "HOST:PORT",
        .help = "the coordinator's HTTP address (its `http:` setting), to read its\n"
                "version from /metrics",
    },
};

/* Every example runs against the quickstart's cluster (tests/integration/test_readme.py),
 * in the order the help lists them. */
static const char *const ex_status[] = {
    "status",
    "-o json status",
    NULL,
};
static const char *const ex_w_list[] = {
    "workers list",
    "workers list -w --watch-interval 1s",
    NULL,
};
static const char *const ex_w_show[] = {
    "workers show node-a",
    NULL,
};
static const char *const ex_w_cordon[] = {
    "workers cordon node-b",
    NULL,
};
static const char *const ex_w_drain[] = {
    "workers drain node-b --wait --timeout 2m",
    NULL,
};
static const char *const ex_w_uncordon[] = {
    "workers uncordon node-b",
    NULL,
};
static const char *const ex_d_list[] = {
    "devices list --backend cuda",
    "devices list --worker node-a --state healthy",
    "devices list --label rack=r1",
    NULL,
};
static const char *const ex_t_put[] = {
    "tensor put node-a/cuda:0 grad --dtype f32 --values 1,2,3",
    "tensor put node-a/cuda:1 w --dtype f64 --values 1,2,3,4,5,6 --shape 2,3",
    "tensor put node-b/cuda:0 grad --dtype f32 --file grad.bin",
    NULL,
};
static const char *const ex_t_get[] = {
    "tensor get node-a/cuda:0 grad",
    "tensor get node-a/cuda:0 grad --file grad.bin",
    NULL,
};
static const char *const ex_t_list[] = {
    "tensor list node-a/cuda:1",
    NULL,
};
static const char *const ex_t_del[] = {
    "tensor delete node-a/cuda:1 w",
    NULL,
};
static const char *const ex_plan[] = {
    "plan --op broadcast --root 1 --devices node-a/cuda:0,node-b/cuda:0",
    "plan --op all-reduce --reduce sum --devices 'node-a/autodiff(cuda:0),node-b/autodiff(cuda:0)'",
    NULL,
};
static const char *const ex_submit[] = {
    "submit --op all-reduce --reduce mean --tensor grad --devices node-a/cuda:0,node-b/cuda:0",
    "submit --op barrier --devices node-a/cuda:0,node-b/cuda:0 --timeout-ms 5000",
    NULL,
};
static const char *const ex_o_list[] = {
    "ops list --limit 5",
    NULL,
};
static const char *const ex_o_show[] = {
    "ops show $(devcoordctl ops list --limit 1 | awk 'NR == 2 {print $1}')",
    NULL,
};
static const char *const ex_collective[] = {
    "collective all-reduce --devices node-a/cuda:0 --self node-a/cuda:0 --dtype f32 "
    "--values 1,2,3 --reduce sum",
    "collective barrier --devices node-a/cuda:0 --self node-a/cuda:0 --repeat 10",
    NULL,
};
static const char *const ex_g_list[] = {
    "groups list",
    NULL,
};
static const char *const ex_g_show[] = {
    "groups show " EXAMPLE_GROUP_ID,
    NULL,
};
static const char *const ex_health[] = {
    "health",
    "-s 127.0.0.1:7400 --timeout 2s health",
    NULL,
};
static const char *const ex_version[] = {
    "version",
    "version --http 127.0.0.1:7480",
    NULL,
};
static const char *const ex_completion[] = {
    "completion bash",
    NULL,
};

#define DEVICES_OPTS (OPT(O_BACKEND) | OPT(O_WORKER) | OPT(O_STATE) | OPT(O_LABEL))
#define OP_OPTS      (OPT(O_OP) | OPT(O_REDUCE) | OPT(O_ROOT) | OPT(O_DEVICES))

/* In the order the global help lists them: look, steer, move data, run ops, check. */
static const struct command_def commands[] = {
    {
        .id       = CMD_STATUS,
        .group    = "status",
        .synopsis = "status",
        .summary  = "cluster summary: workers by state, devices by backend, ops",
        .examples = ex_status,
    },
    {
        .id       = CMD_WORKERS_LIST,
        .group    = "workers",
        .sub      = "list",
        .opts     = OPT(O_WATCH) | OPT(O_WATCH_INTERVAL),
        .synopsis = "workers list [-w] [--watch-interval D]",
        .summary  = "workers: address, state, age, devices, last heartbeat, labels",
        .details  = "AGE is the time since the worker registered, LAST_HB since its last\n"
                    "heartbeat (-o json keeps the raw epoch and since_heartbeat_ms). With -w, a\n"
                    "terminal shows the table redrawn in place every interval; a pipe or file\n"
                    "gets a new frame only when a worker joined, left or changed, frames\n"
                    "separated by a blank line (-o json: one document per line).",
        .examples = ex_w_list,
    },
    {
        .id       = CMD_WORKERS_SHOW,
        .group    = "workers",
        .sub      = "show",
        .n_args   = 1,
        .args     = " NAME",
        .synopsis = "workers show NAME",
        .summary  = "one worker and its devices",
        .examples = ex_w_show,
    },
    {
        .id       = CMD_WORKERS_CORDON,
        .group    = "workers",
        .sub      = "cordon",
        .n_args   = 1,
        .args     = " NAME",
        .synopsis = "workers cordon NAME",
        .summary  = "no new op will use the worker's devices; ops in flight finish",
        .details  = "Needs the operator role when auth is on.",
        .examples = ex_w_cordon,
    },
    {
        .id       = CMD_WORKERS_DRAIN,
        .group    = "workers",
        .sub      = "drain",
        .n_args   = 1,
        .args     = " NAME",
        .opts     = OPT(O_WAIT),
        .synopsis = "workers drain NAME [--wait]",
        .summary  = "no new op on the worker; names the ops in flight still using it",
        .details  = "An op uses the worker while it is queued with the worker in its plan, or\n"
                    "running and not yet answered by it. --wait waits until no op does, at most\n"
                    "--timeout (default 30s), and exits 1 naming the ops still in flight when\n"
                    "time runs out.",
        .examples = ex_w_drain,
    },
    {
        .id       = CMD_WORKERS_UNCORDON,
        .group    = "workers",
        .sub      = "uncordon",
        .n_args   = 1,
        .args     = " NAME",
        .synopsis = "workers uncordon NAME",
        .summary  = "undo cordon or drain: new ops may use the worker again",
        .examples = ex_w_uncordon,
    },
    {
        .id       = CMD_DEVICES_LIST,
        .group    = "devices",
        .sub      = "list",
        .opts     = DEVICES_OPTS,
        .synopsis = "devices list [--backend B] [--worker W] [--state S] [--label K=V]",
        .summary  = "devices by cluster name (node-a/cuda:0), with state and memory",
        .details  = "MEMORY is in binary units (80Gi); -o json keeps memory_bytes.",
        .examples = ex_d_list,
    },
    {
        .id       = CMD_TENSOR_PUT,
        .group    = "tensor",
        .sub      = "put",
        .n_args   = 2,
        .args     = " DEVICE NAME",
        .opts     = OPT(O_DTYPE) | OPT(O_VALUES) | OPT(O_FILE) | OPT(O_SHAPE),
        .synopsis = "tensor put DEVICE NAME --dtype T (--values LIST | --file F) [--shape DIMS]",
        .summary  = "store a tensor on a device (on the worker that owns it)",
        .details  = "Large tensors go in chunks; on a terminal, a transfer of more than 4 MiB\n"
                    "shows its progress on standard error. The built-in host executor keeps\n"
                    "every tensor in host memory, whatever the device's backend.",
        .examples = ex_t_put,
    },
    {
        .id       = CMD_TENSOR_GET,
        .group    = "tensor",
        .sub      = "get",
        .n_args   = 2,
        .args     = " DEVICE NAME",
        .opts     = OPT(O_FILE),
        .synopsis = "tensor get DEVICE NAME [--file F]",
        .summary  = "read a tensor: print its values or write its raw bytes to a file",
        .details  = "With --file the values are not printed (-o json: \"values\" is null and\n"
                    "\"file\" names where they went).",
        .examples = ex_t_get,
    },
    {
        .id       = CMD_TENSOR_LIST,
        .group    = "tensor",
        .sub      = "list",
        .n_args   = 1,
        .args     = " DEVICE",
        .synopsis = "tensor list DEVICE",
        .summary  = "the tensors on a device",
        .examples = ex_t_list,
    },
    {
        .id       = CMD_TENSOR_DELETE,
        .group    = "tensor",
        .sub      = "delete",
        .n_args   = 2,
        .args     = " DEVICE NAME",
        .synopsis = "tensor delete DEVICE NAME",
        .summary  = "delete a tensor",
        .examples = ex_t_del,
    },
    {
        .id       = CMD_PLAN,
        .group    = "plan",
        .opts     = OP_OPTS,
        .synopsis = "plan --op KIND [--reduce OP] [--root I] --devices REF,...",
        .summary  = "validate and plan an op without running it (dry run)",
        .details  = "A refusal is typed and names the offending entry, e.g.\n"
                    "devices[1] = node-b/cuda:0; with -o json the refused plan's document still\n"
                    "goes to standard output.",
        .examples = ex_plan,
    },
    {
        .id    = CMD_SUBMIT,
        .group = "submit",
        .opts  = OP_OPTS | OPT(O_TENSOR) | OPT(O_OP_TIMEOUT) | OPT(O_OUTPUT_TENSOR) |
                OPT(O_IDEMPOTENCY_KEY),
        .synopsis = "submit --op KIND [--reduce OP] [--root I] --tensor NAME --devices REF,...\n"
                    "       [--timeout-ms N] [--output-tensor NAME] [--idempotency-key K]",
        .summary  = "run an op on the tensors on the devices and wait for its result",
        .details  = "Every device must hold the tensor, with one dtype and size; a barrier needs\n"
                    "none. The coordinator's autodiff policy applies: under `strip` (the\n"
                    "default) one autodiff(...) layer is stripped, and wrapped next to bare\n"
                    "devices is refused.",
        .examples = ex_submit,
    },
    {
        .id       = CMD_OPS_LIST,
        .group    = "ops",
        .sub      = "list",
        .opts     = OPT(O_LIMIT),
        .synopsis = "ops list [--limit N]",
        .summary  = "recent and in-flight ops, with the workers not answered yet",
        .details  = "AGE is the time since the op was submitted; -o json keeps\n"
                    "submitted_unix_ms and elapsed_us.",
        .examples = ex_o_list,
    },
    {
        .id       = CMD_OPS_SHOW,
        .group    = "ops",
        .sub      = "show",
        .n_args   = 1,
        .args     = " ID",
        .synopsis = "ops show ID",
        .summary  = "one op: its plan and each worker's answer",
        .examples = ex_o_show,
    },
    {
        .id     = CMD_COLLECTIVE,
        .group  = "collective",
        .n_args = 1,
        .args   = " KIND",
        .opts   = OPT(O_DEVICES) | OPT(O_SELF) | OPT(O_DTYPE) | OPT(O_VALUES) | OPT(O_ELEMENTS) |
                OPT(O_REDUCE) | OPT(O_ROOT) | OPT(O_REPEAT),
        .synopsis = "collective KIND --devices REF,... --self REF --dtype T\n"
                    "       (--values LIST | --count N) [--reduce OP] [--root R] [--repeat K]",
        .summary  = "join a group as one rank, make a group call, print the result, leave",
        .details  = "Run it once per rank, all at once (each in its own process): the join\n"
                    "waits for every rank of --devices, ranks are the positions in the sorted\n"
                    "list, and each call waits for every rank's. KIND: all-reduce, reduce,\n"
                    "broadcast, all-gather, reduce-scatter (the values are one block per\n"
                    "rank; each rank gets its block of the reduction) or barrier (which\n"
                    "needs no --dtype nor values);\n"
                    "--root R is a rank in that sorted order.\n"
                    "--timeout bounds the join and each call.",
        .examples = ex_collective,
    },
    {
        .id       = CMD_GROUPS_LIST,
        .group    = "groups",
        .sub      = "list",
        .synopsis = "groups list",
        .summary  = "the groups ranks have joined: devices, generation, ranks in it",
        .examples = ex_g_list,
    },
    {
        .id       = CMD_GROUPS_SHOW,
        .group    = "groups",
        .sub      = "show",
        .n_args   = 1,
        .args     = " ID",
        .synopsis = "groups show ID",
        .summary  = "one group: its ranks and devices",
        .examples = ex_g_show,
    },
    {
        .id       = CMD_HEALTH,
        .group    = "health",
        .synopsis = "health",
        .summary  = "exit 0 when the coordinator answers and is ready",
        .examples = ex_health,
    },
    {
        .id       = CMD_VERSION,
        .group    = "version",
        .opts     = OPT(O_HTTP),
        .synopsis = "version [--http HOST:PORT]",
        .summary  = "the client's version and the coordinator's",
        .details  = "No RPC of the coordinator reports its version; its /metrics does\n"
                    "(devcoord_build_info), which --http reads. Without it the server's version\n"
                    "shows as unknown.",
        .examples = ex_version,
    },
    {
        .id       = CMD_COMPLETION,
        .group    = "completion",
        .n_args   = 1,
        .args     = " SHELL",
        .synopsis = "completion bash",
        .summary  = "print a shell completion script (bash)",
        .details  = "Load it into the running shell with: source <(devcoordctl completion bash)\n"
                    "or install it as /etc/bash_completion.d/devcoordctl.",
        .examples = ex_completion,
    },
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static const char *const global_examples[] = {
    "status",
    "-o json devices list --backend cuda",
    "-s 127.0.0.1:7400 --timeout 2s health",
    "tensor get --help",
    NULL,
};

/* ---- messages ------------------------------------------------------------------------ */

/* The command words the usage hint names: the command, else the group typed, else none. */
static char hint_words[64];

const char *
cli_opt_name(enum opt o)
{
    return opt_defs[o].name;
}

int
cli_usage_error(const char *fmt, ...)
{
    va_list ap;

    fputs("devcoordctl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see 'devcoordctl %s%s--help')\n", hint_words, hint_words[0] ? " " : "");
    return EXIT_USAGE;
}

static void
set_hint(const char *group, const char *sub)
{
    snprintf(hint_words, sizeof(hint_words), "%s%s%s", group, sub != NULL ? " " : "",
             sub != NULL ? sub : "");
}

/* ---- help ---------------------------------------------------------------------------- */

/* Text with lines split by \n, each printed after `indent` blanks. */
static void
print_indented(const char *text, int indent)
{
    while (*text != '\0') {
        const char *nl = strchr(text, '\n');
        size_t len     = nl != NULL ? (size_t)(nl - text) : strlen(text);
        printf("%*s%.*s\n", indent, "", (int)len, text);
        text += len + (nl != NULL);
    }
}

static void
print_option(enum opt o)
{
    const struct opt_def *d = &opt_defs[o];
    char left[64];
    const char *help = d->help, *nl;

    if (d->short_name != 0) {
        snprintf(left, sizeof(left), "-%c, --%s%s%s", d->short_name, d->name, d->metavar ? " " : "",
                 d->metavar ? d->metavar : "");
    } else {
        snprintf(left, sizeof(left), "--%s%s%s", d->name, d->metavar ? " " : "",
                 d->metavar ? d->metavar : "");
    }
    nl = strchr(help, '\n');
    if (strlen(left) > 20) {
        printf("  %s\n", left);
        print_indented(help, 24);
        return;
    }
    printf("  %-22s%.*s\n", left, nl != NULL ? (int)(nl - help) : (int)strlen(help), help);
    if (nl != NULL) {
        print_indented(nl + 1, 24);
    }
}

static void
print_examples(const char *const *examples)
{
    fputs("\nExamples:\n", stdout);
    for (size_t i = 0; examples[i] != NULL; i++) {
        printf("  devcoordctl %s\n", examples[i]);
    }
}

static void
command_words(const struct command_def *d, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s%s%s", d->group, d->sub ? " " : "", d->sub ? d->sub : "",
             d->args != NULL ? d->args : "");
}

static void
print_global_help(void)
{
    char words[64];

    fputs("Usage: devcoordctl [OPTIONS] COMMAND [ARGS] [OPTIONS]\n"
          "\n"
          "Queries and steers a devcoord cluster: the coordinator's registry and operations,\n"
          "and the tensors on the workers.\n"
          "\n"
          "Commands:\n",
          stdout);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        command_words(&commands[i], words, sizeof(words));
        printf("  %-27s%s\n", words, commands[i].summary);
    }
    printf("  %-27s%s\n", "help [COMMAND]", "a command's options and examples (as COMMAND --help)");
    fputs("\nOptions (anywhere on the line):\n", stdout);
    for (int o = 0; o < O_COUNT; o++) {
        if (GLOBAL_OPTS & OPT(o)) {
            print_option((enum opt)o);
        }
    }
    fputs("\n"
          "KIND: all-reduce reduce broadcast all-gather barrier.  OP: sum mean min max prod.\n"
          "T: f32 f64 i32 i64 f16 bf16.  REF: [worker/]device, e.g. node-a/cuda:0, "
          "node-a/autodiff(rocm:1).\n"
          "Exit codes: 0 ok, 1 the server said no, 2 usage error, 3 cannot reach the server (or\n"
          "the worker a tensor lives on).\n",
          stdout);
    print_examples(global_examples);
    fputs("\n'devcoordctl COMMAND --help' shows a command's options and examples.\n", stdout);
}

static void
print_command_help(const struct command_def *d)
{
    char first = d->summary[0];

    printf("Usage: devcoordctl %s\n\n", d->synopsis);
    printf("%c%s.\n", first >= 'a' && first <= 'z' ? first - 'a' + 'A' : first, d->summary + 1);
    if (d->details != NULL) {
        print_indented(d->details, 0);
    }
    if (d->opts != 0) {
        fputs("\nOptions:\n", stdout);
        for (int o = 0; o < O_COUNT; o++) {
            if (d->opts & OPT(o)) {
                print_option((enum opt)o);
            }
        }
    }
    print_examples(d->examples);
    fputs("\nGlobal options (devcoordctl --help): -s ADDR, --token-file F, -o table|json,\n"
          "--timeout D, --tls-ca F, --tls-cert F, --tls-key F.\n",
          stdout);
}

static void
print_group_help(const char *group)
{
    char words[64];

    printf("Usage: devcoordctl %s COMMAND ...\n\nCommands:\n", group);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(commands[i].group, group) == 0) {
            command_words(&commands[i], words, sizeof(words));
            printf("  %-27s%s\n", words, commands[i].summary);
        }
    }
    printf("\n'devcoordctl %s COMMAND --help' shows a command's options and examples.\n", group);
}

/* ---- finding commands ---------------------------------------------------------------- */

static bool
group_known(const char *group)
{
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(commands[i].group, group) == 0) {
            return true;
        }
    }
    return strcmp(group, "help") == 0;
}

static bool
group_has_subs(const char *group)
{
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(commands[i].group, group) == 0) {
            return commands[i].sub != NULL;
        }
    }
    return false;
}

static const struct command_def *
command_find(const char *group, const char *sub)
{
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const struct command_def *d = &commands[i];
        if (strcmp(d->group, group) == 0 &&
            (d->sub == NULL || (sub != NULL && strcmp(d->sub, sub) == 0))) {
            return d;
        }
    }
    return NULL;
}

/* " (did you mean 'x'?)" for the command group nearest to `word`, or "". */
static void
suggest_group(const char *word, char *buf, size_t cap)
{
    const char *names[N_COMMANDS + 1];
    const char *near;
    size_t n = 0;

    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (n == 0 || strcmp(names[n - 1], commands[i].group) != 0) {
            names[n++] = commands[i].group;
        }
    }
    names[n++] = "help";
    near       = human_nearest(word, names, n);
    buf[0]     = '\0';
    if (near != NULL) {
        snprintf(buf, cap, " (did you mean '%s'?)", near);
    }
}

static void
suggest_sub(const char *group, const char *word, char *buf, size_t cap)
{
    const char *names[N_COMMANDS];
    const char *near;
    size_t n = 0;

    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(commands[i].group, group) == 0 && commands[i].sub != NULL) {
            names[n++] = commands[i].sub;
        }
    }
    near   = human_nearest(word, names, n);
    buf[0] = '\0';
    if (near != NULL) {
        snprintf(buf, cap, " (did you mean '%s %s'?)", group, near);
    }
}

/* Help for the command named by words[0..n): the global help when n is 0. */
static int
help_for(const char *const *words, int n)
{
    const struct command_def *d;
    char hint[96];

    if (n == 0 || strcmp(words[0], "help") == 0) {
        print_global_help();
        return EXIT_OK;
    }
    if (!group_known(words[0])) {
        suggest_group(words[0], hint, sizeof(hint));
        return cli_usage_error("unknown command '%s'%s", words[0], hint);
    }
    set_hint(words[0], NULL);
    if (n == 1 && group_has_subs(words[0])) {
        print_group_help(words[0]);
        return EXIT_OK;
    }
    if ((d = command_find(words[0], n > 1 ? words[1] : NULL)) == NULL) {
        suggest_sub(words[0], words[1], hint, sizeof(hint));
        return cli_usage_error("unknown command '%s %s'%s", words[0], words[1], hint);
    }
    print_command_help(d);
    return EXIT_OK;
}

/* ---- argv ---------------------------------------------------------------------------- */

static int
opt_find_long(const char *name, size_t len)
{
    for (int o = 0; o < O_COUNT; o++) {
        if (strlen(opt_defs[o].name) == len && memcmp(opt_defs[o].name, name, len) == 0) {
            return o;
        }
    }
    return -1;
}

static int
opt_find_short(char c)
{
    for (int o = 0; o < O_COUNT; o++) {
        if (opt_defs[o].short_name != 0 && opt_defs[o].short_name == c) {
            return o;
        }
    }
    return -1;
}

/* An unknown --word: the nearest option the command takes (any option when the command is
 * not known), and the command's help as the hint. */
static int
unknown_long_option(const struct cli *cli, const char *word)
{
    const struct command_def *d = NULL;
    const char *names[O_COUNT];
    const char *near;
    size_t n      = 0;
    uint64_t mask = ~(uint64_t)0;

    if (cli->n_pos > 0 && group_known(cli->pos[0]) &&
        (d = command_find(cli->pos[0], cli->n_pos > 1 ? cli->pos[1] : NULL)) != NULL) {
        set_hint(d->group, d->sub);
        mask = GLOBAL_OPTS | d->opts;
    }
    for (int o = 0; o < O_COUNT; o++) {
        if (mask & OPT(o)) {
            names[n++] = opt_defs[o].name;
        }
    }
    if ((near = human_nearest(word, names, n)) != NULL) {
        return cli_usage_error("unknown option '--%s' (did you mean '--%s'?)", word, near);
    }
    return cli_usage_error("unknown option '--%s'", word);
}

/* Options may come anywhere (before or after the command); "--" ends them. An unknown
 * --option is reported once the command words are in, to suggest from that command's. */
static int
parse_argv(struct cli *cli, int argc, char **argv)
{
    bool opts_done   = false;
    char unknown[72] = "";

    for (int i = 1; i < argc; i++) {
        const char *a     = argv[i];
        const char *value = NULL;
        int o;

        if (!opts_done && strcmp(a, "--") == 0) {
            opts_done = true;
            continue;
        }
        if (!opts_done && a[0] == '-' && a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t len     = eq != NULL ? (size_t)(eq - (a + 2)) : strlen(a + 2);
            if ((o = opt_find_long(a + 2, len)) < 0) {
                if (unknown[0] == '\0') {
                    snprintf(unknown, sizeof(unknown), "%.*s", (int)(len > 64 ? 64 : len), a + 2);
                }
                continue;
            }
            if (opt_defs[o].metavar != NULL) {
                if (eq != NULL) {
                    value = eq + 1;
                } else if (i + 1 < argc) {
                    value = argv[++i];
                } else {
                    return cli_usage_error("option --%s needs a value (%s)", opt_defs[o].name,
                                           opt_defs[o].metavar);
                }
            } else if (eq != NULL) {
                return cli_usage_error("option --%s takes no value", opt_defs[o].name);
            }
        } else if (!opts_done && a[0] == '-' && a[1] != '\0') {
            if ((o = opt_find_short(a[1])) < 0) {
                return cli_usage_error("unknown option '-%c'", a[1]);
            }
            if (opt_defs[o].metavar != NULL) {
                if (a[2] != '\0') {
                    value = a + 2;
                } else if (i + 1 < argc) {
                    value = argv[++i];
                } else {
                    return cli_usage_error("option -%c needs a value (%s)", a[1],
                                           opt_defs[o].metavar);
                }
            } else if (a[2] != '\0') {
                return cli_usage_error("option -%c takes no value", a[1]);
            }
        } else {
            if (cli->n_pos == MAX_POSITIONAL) {
                return cli_usage_error("too many arguments");
            }
            cli->pos[cli->n_pos++] = a;
            continue;
        }
        cli->seen[o] = true;
        cli->val[o]  = value;
    }
    return unknown[0] != '\0' ? unknown_long_option(cli, unknown) : 0;
}

static int
find_command(struct cli *cli)
{
    const char *group = cli->pos[0];
    const char *sub   = cli->n_pos > 1 ? cli->pos[1] : NULL;
    char hint[96];
    int words;

    if (!group_known(group)) {
        suggest_group(group, hint, sizeof(hint));
        return cli_usage_error("unknown command '%s'%s", group, hint);
    }
    set_hint(group, NULL);
    if ((cli->cmd = command_find(group, sub)) == NULL) {
        if (sub == NULL) {
            return cli_usage_error("'%s' needs a subcommand", group);
        }
        suggest_sub(group, sub, hint, sizeof(hint));
        return cli_usage_error("unknown command '%s %s'%s", group, sub, hint);
    }
    set_hint(cli->cmd->group, cli->cmd->sub);
    words = cli->cmd->sub != NULL ? 2 : 1;
    if (cli->n_pos - words != cli->cmd->n_args) {
        return cli_usage_error("'%s' takes %s", hint_words,
                               cli->cmd->n_args > 0 ? cli->cmd->args + 1 : "no arguments");
    }
    cli->args = cli->pos + words;
    for (int o = 0; o < O_COUNT; o++) {
        if (cli->seen[o] && !((GLOBAL_OPTS | cli->cmd->opts) & OPT(o))) {
            return cli_usage_error("option --%s does not apply to '%s'", opt_defs[o].name,
                                   hint_words);
        }
    }
    return 0;
}

/* -s, else $DEVCOORD_ADDR, else the default (libdevcoord reads HOST:PORT as TCP). */
static void
resolve_server(struct cli *cli)
{
    const char *addr = cli->val[O_SERVER];

    if (addr == NULL || addr[0] == '\0') {
        addr = getenv("DEVCOORD_ADDR");
    }
    cli->server = addr != NULL && addr[0] != '\0' ? addr : DEFAULT_ADDR;
}

int
cli_parse(struct cli *cli, int argc, char **argv)
{
    int rc;

    hint_words[0] = '\0';
    if ((rc = parse_argv(cli, argc, argv)) != 0) {
        return rc;
    }
    if (cli->seen[O_HELP]) {
        return help_for(cli->pos, cli->n_pos);
    }
    if (cli->n_pos > 0 && strcmp(cli->pos[0], "help") == 0) {
        return help_for(cli->pos + 1, cli->n_pos - 1);
    }
    if (cli->seen[O_VERSION]) {
        printf("devcoordctl %d.%d.%d\n", DC_VERSION_MAJOR, DC_VERSION_MINOR, DC_VERSION_PATCH);
        return EXIT_OK;
    }
    if (cli->n_pos == 0) {
        return cli_usage_error("no command given");
    }
    if ((rc = find_command(cli)) != 0) {
        return rc;
    }
    if (cli->seen[O_OUTPUT]) {
        if (strcmp(cli->val[O_OUTPUT], "json") == 0) {
            cli->json = true;
        } else if (strcmp(cli->val[O_OUTPUT], "table") != 0) {
            return cli_usage_error("-o wants table or json, not '%s'", cli->val[O_OUTPUT]);
        }
    }
    if (cli->seen[O_TIMEOUT] && !human_parse_duration(cli->val[O_TIMEOUT], &cli->timeout_ms)) {
        return cli_usage_error("--timeout wants a duration like 500ms, 10s or 2m, not '%s'",
                               cli->val[O_TIMEOUT]);
    }
    resolve_server(cli);
    return CLI_RUN;
}

/* ---- completion ---------------------------------------------------------------------- */

/* Options with a value, as a bash case pattern: -s|--server|... */
static void
print_value_options(uint64_t mask, bool with_values)
{
    bool first = true;

    for (int o = 0; o < O_COUNT; o++) {
        const struct opt_def *d = &opt_defs[o];
        if (!(mask & OPT(o)) || d->metavar == NULL || (d->values != NULL) != with_values) {
            continue;
        }
        printf("%s--%s", first ? "" : "|", d->name);
        if (d->short_name != 0) {
            printf("|-%c", d->short_name);
        }
        first = false;
    }
}

static void
print_option_words(uint64_t mask)
{
    for (int o = 0; o < O_COUNT; o++) {
        if (mask & OPT(o)) {
            printf(" --%s", opt_defs[o].name);
            if (opt_defs[o].short_name != 0) {
                printf(" -%c", opt_defs[o].short_name);
            }
        }
    }
}

void
cli_print_completion_bash(void)
{
    uint64_t all = 0;

    for (int o = 0; o < O_COUNT; o++) {
        all |= OPT(o);
    }
    fputs("# bash completion for devcoordctl, from 'devcoordctl completion bash'.\n"
          "# Load it with: source <(devcoordctl completion bash)\n"
          "_devcoordctl() {\n"
          "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
          "    local ctl=${COMP_WORDS[0]} i w group='' sub='' nargs=0 opts\n"
          "    COMPREPLY=()\n"
          "    case $prev in\n",
          stdout);
    for (int o = 0; o < O_COUNT; o++) {
        const struct opt_def *d = &opt_defs[o];
        if (d->metavar == NULL || d->values == NULL) {
            continue;
        }
        printf("    --%s", d->name);
        if (d->short_name != 0) {
            printf("|-%c", d->short_name);
        }
        fputs(")\n", stdout);
        if (strcmp(d->values, "FILE") == 0) {
            fputs("        COMPREPLY=($(compgen -f -- \"$cur\"))\n", stdout);
        } else {
            printf("        COMPREPLY=($(compgen -W '%s' -- \"$cur\"))\n", d->values);
        }
        fputs("        return ;;\n", stdout);
    }
    fputs("    ", stdout);
    print_value_options(all, false);
    fputs(")\n        return ;;\n    esac\n", stdout);
    /* The command words so far, skipping options and their values. */
    fputs("    for ((i = 1; i < COMP_CWORD; i++)); do\n"
          "        w=${COMP_WORDS[i]}\n"
          "        case $w in\n"
          "        ",
          stdout);
    print_value_options(all, true);
    fputs("|", stdout);
    print_value_options(all, false);
    fputs(")\n"
          "            ((i++)) ;;\n"
          "        -*) ;;\n"
          "        *)\n"
          "            if [[ -z $group ]]; then group=$w\n"
          "            elif [[ -z $sub ]]; then sub=$w\n"
          "            else ((nargs++)); fi ;;\n"
          "        esac\n"
          "    done\n"
          "    if [[ $cur == -* ]]; then\n"
          "        case \"$group $sub\" in\n",
          stdout);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const struct command_def *d = &commands[i];
        if (d->sub != NULL) {
            printf("        '%s %s')", d->group, d->sub);
        } else {
            printf("        '%s '*)", d->group);
        }
        fputs(" opts='", stdout);
        print_option_words(d->opts);
        fputs("' ;;\n", stdout);
    }
    fputs("        *) opts='' ;;\n"
          "        esac\n"
          "        COMPREPLY=($(compgen -W \"$opts",
          stdout);
    print_option_words(GLOBAL_OPTS);
    fputs("\" -- \"$cur\"))\n"
          "        return\n"
          "    fi\n"
          "    if [[ -z $group ]]; then\n"
          "        COMPREPLY=($(compgen -W '",
          stdout);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (i == 0 || strcmp(commands[i].group, commands[i - 1].group) != 0) {
            printf("%s ", commands[i].group);
        }
    }
    fputs("help' -- \"$cur\"))\n"
          "        return\n"
          "    fi\n"
          "    if [[ -z $sub ]]; then\n"
          "        case $group in\n",
          stdout);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const struct command_def *d = &commands[i];
        if (d->sub == NULL || (i > 0 && strcmp(commands[i - 1].group, d->group) == 0)) {
            continue;
        }
        printf("        %s) COMPREPLY=($(compgen -W '", d->group);
        for (size_t k = i; k < N_COMMANDS && strcmp(commands[k].group, d->group) == 0; k++) {
            printf("%s%s", k > i ? " " : "", commands[k].sub);
        }
        fputs("' -- \"$cur\")) ;;\n", stdout);
    }
    /* Dynamic: worker and device names from the coordinator in $DEVCOORD_ADDR. */
    fputs("        completion) COMPREPLY=($(compgen -W 'bash' -- \"$cur\")) ;;\n"
          "        help) COMPREPLY=($(compgen -W '",
          stdout);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (i == 0 || strcmp(commands[i].group, commands[i - 1].group) != 0) {
            printf("%s%s", i ? " " : "", commands[i].group);
        }
    }
    fputs(
        "' -- \"$cur\")) ;;\n"
        "        esac\n"
        "        return\n"
        "    fi\n"
        "    if ((nargs == 0)); then\n"
        "        case \"$group $sub\" in\n"
        "        'workers show'|'workers cordon'|'workers drain'|'workers uncordon')\n"
        "            COMPREPLY=($(compgen -W \"$(\"$ctl\" --timeout 2s workers list 2>/dev/null |\n"
        "                awk 'NR > 1 {print $1}')\" -- \"$cur\")) ;;\n"
        "        'tensor '*)\n"
        "            COMPREPLY=($(compgen -W \"$(\"$ctl\" --timeout 2s devices list 2>/dev/null |\n"
        "                awk 'NR > 1 {print $1}')\" -- \"$cur\")) ;;\n"
        "        esac\n"
        "    fi\n"
        "}\n"
        "complete -F _devcoordctl devcoordctl\n",
        stdout);
}
