/*
 * devcoordctl: the operator CLI of devcoord. It uses only libdevcoord's public API. The
 * command line is read against the tables of cli.c; everything that can be checked without a
 * server (options, device lists, values) is checked before connecting; then one command runs
 * and prints a table or one JSON document.
 * Exit codes: 0 ok, 1 the server said no, 2 usage error, 3 cannot reach the server.
 */
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "devcoord/devcoord.h"
#include "http_get.h"
#include "human.h"
#include "json.h"
#include "text.h"

#define STR_(x) #x
#define STR(x)  STR_(x)
#define DEVCOORDCTL_VERSION \
    STR(DC_VERSION_MAJOR) "." STR(DC_VERSION_MINOR) "." STR(DC_VERSION_PATCH)

/* Transfers above this show their progress on a terminal. */
#define PROGRESS_MIN_BYTES ((size_t)4 << 20)
/* How often drain --wait asks whether the worker is idle. */
#define DRAIN_POLL_MS             200u
#define WATCH_DEFAULT_INTERVAL_MS 2000u
/* What --timeout defaults to (the library's call deadline), and so how long drain --wait
 * waits when given no --timeout. */
#define DEFAULT_TIMEOUT_MS 30000u

/* An unsigned decimal in [0, max]: no sign, no blanks, no trailing characters. */
static bool
parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    unsigned long long v;
    char *end;

    if (s[0] < '0' || s[0] > '9') {
        return false;
    }
    errno = 0;
    v     = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > max) {
        return false;
    }
    *out = v;
    return true;
}

static int
parse_u32_opt(const struct cli *cli, enum opt o, uint32_t *out)
{
    uint64_t v;

    if (!cli->seen[o]) {
        return 0;
    }
    if (!parse_u64(cli->val[o], UINT32_MAX, &v)) {
        return cli_usage_error("--%s wants a number from 0 to %u, not '%s'", cli_opt_name(o),
                               UINT32_MAX, cli->val[o]);
    }
    *out = (uint32_t)v;
    return 0;
}

/* ---- output helpers ------------------------------------------------------------------ */

/* An environment variable's value, or NULL when it is unset or empty. */
static const char *
env_or_null(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* Whether a failure is the transport's (no answer from the server) rather than a refusal. */
static bool
is_connection_failure(const dc_status *st)
{
    return st->transport;
}

/* One line: control characters a server may have put in a message become spaces. */
static void
print_sanitized(FILE *f, const char *s)
{
    for (; *s != '\0'; s++) {
        fputc((unsigned char)*s < 0x20 ? ' ' : *s, f);
    }
}

static void
print_error(const dc_status *st)
{
    fprintf(stderr, "devcoordctl: %s: ", dc_status_name(st->code));
    print_sanitized(stderr, st->message[0] != '\0' ? st->message : "(no message)");
    fputc('\n', stderr);
}

/* Reports a failed call; the exit code tells a refusal from an unreachable server. */
static int
fail(const dc_status *st)
{
    print_error(st);
    return is_connection_failure(st) ? EXIT_UNREACHABLE : EXIT_REFUSED;
}

static int
json_print(struct json *j)
{
    const char *text = json_text(j);

    if (text == NULL) {
        fputs("devcoordctl: RESOURCE_EXHAUSTED: out of memory writing JSON\n", stderr);
        return EXIT_REFUSED;
    }
    fputs(text, stdout);
    fputc('\n', stdout);
    return 0;
}

static const char *
or_dash(const char *s)
{
    return s != NULL && s[0] != '\0' ? s : "-";
}

/* Rows of strings printed with every column as wide as its widest cell. */
struct table {
    size_t ncols, nrows, cap;
    char **cells;
    bool failed;
};

static void
table_add(struct table *t, const char *const *row)
{
    if (t->failed) {
        return;
    }
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        char **grow;
        if (cap > SIZE_MAX / t->ncols / sizeof(*grow) ||
            (grow = realloc(t->cells, cap * t->ncols * sizeof(*grow))) == NULL) {
            t->failed = true;
            return;
        }
        t->cells = grow;
        t->cap   = cap;
    }
    for (size_t c = 0; c < t->ncols; c++) {
        char *cell = strdup(row[c] != NULL ? row[c] : "");
        if (cell == NULL) {
            for (size_t k = 0; k < c; k++) {
                free(t->cells[t->nrows * t->ncols + k]);
            }
            t->failed = true;
            return;
        }
        t->cells[t->nrows * t->ncols + c] = cell;
    }
    t->nrows++;
}

static void
table_init(struct table *t, size_t ncols, const char *const *header)
{
    memset(t, 0, sizeof(*t));
    t->ncols = ncols;
    table_add(t, header);
}

static void
table_free(struct table *t)
{
    for (size_t i = 0; i < t->nrows * t->ncols; i++) {
        free(t->cells[i]);
    }
    free(t->cells);
    memset(t, 0, sizeof(*t));
}

static int
table_print(struct table *t)
{
    size_t width[16] = { 0 };

    if (t->failed || t->ncols > 16) {
        table_free(t);
        fputs("devcoordctl: RESOURCE_EXHAUSTED: out of memory writing a table\n", stderr);
        return EXIT_REFUSED;
    }
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            size_t len = strlen(t->cells[r * t->ncols + c]);
            width[c]   = len > width[c] ? len : width[c];
        }
    }
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            const char *cell = t->cells[r * t->ncols + c];
            print_sanitized(stdout, cell);
            if (c + 1 < t->ncols) {
                for (size_t pad = strlen(cell); pad < width[c] + 2; pad++) {
                    fputc(' ', stdout);
                }
            }
        }
        fputc('\n', stdout);
    }
    table_free(t);
    return 0;
}

static void
fmt_u64(char *buf, size_t cap, uint64_t v)
{
    snprintf(buf, cap, "%" PRIu64, v);
}

static uint64_t
now_unix_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The age of something stamped `unix_ms` by the coordinator's clock; "-" when unstamped. A
 * stamp ahead of our clock (clocks differ between machines) counts as just now. */
static void
fmt_age_since(char *buf, size_t cap, uint64_t unix_ms, uint64_t now_ms)
{
    if (unix_ms == 0) {
        snprintf(buf, cap, "-");
        return;
    }
    human_age(buf, cap, now_ms > unix_ms ? now_ms - unix_ms : 0);
}

static void
fmt_shape(char *buf, size_t cap, const uint64_t *shape, size_t ndim)
{
    size_t n = 0;

    n += (size_t)snprintf(buf, cap, "[");
    for (size_t i = 0; i < ndim && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRIu64, i ? "," : "", shape[i]);
    }
    if (n < cap) {
        snprintf(buf + n, cap - n, "]");
    }
}

/* ---- registry commands --------------------------------------------------------------- */

static void
json_worker(struct json *j, const dc_worker_info *w)
{
    json_object_begin(j);
    json_key(j, "name");
    json_string(j, w->name);
    json_key(j, "address");
    json_string(j, w->address);
    json_key(j, "state");
    json_string(j, dc_worker_state_name(w->state));
    json_key(j, "epoch");
    json_uint(j, w->epoch);
    json_key(j, "devices");
    json_uint(j, w->device_count);
    json_key(j, "labels");
    json_object_begin(j);
    for (size_t i = 0; i < w->n_labels; i++) {
        json_key(j, w->labels[i].key);
        json_string(j, w->labels[i].value);
    }
    json_object_end(j);
    json_key(j, "executor");
    json_string(j, w->executor);
    json_key(j, "since_heartbeat_ms");
    json_uint(j, w->since_heartbeat_ms);
    json_key(j, "max_message_bytes");
    json_uint(j, w->max_message_bytes);
    json_object_end(j);
}

static void
worker_labels_text(const dc_worker_info *w, char *buf, size_t cap)
{
    size_t n = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < w->n_labels && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%s=%s", i ? "," : "", w->labels[i].key,
                              w->labels[i].value);
    }
}

static const char *const worker_header[] = { "NAME",    "ADDRESS",  "STATE",   "AGE",
                                             "DEVICES", "EXECUTOR", "LAST_HB", "LABELS" };

/* A worker's epoch is the coordinator's clock in ms when it registered (or one more than the
 * epoch before, when two registrations share a millisecond): the age of the registration. */
static void
worker_row(struct table *t, const dc_worker_info *w, uint64_t now_ms)
{
    char age[24], devices[24], hb[24], labels[1024];
    const char *row[8];

    fmt_age_since(age, sizeof(age), w->epoch, now_ms);
    fmt_u64(devices, sizeof(devices), w->device_count);
    human_age(hb, sizeof(hb), w->since_heartbeat_ms);
    worker_labels_text(w, labels, sizeof(labels));
    row[0] = w->name;
    row[1] = or_dash(w->address);
    row[2] = or_dash(dc_worker_state_name(w->state));
    row[3] = age;
    row[4] = devices;
    row[5] = or_dash(w->executor);
    row[6] = hb;
    row[7] = or_dash(labels);
    table_add(t, row);
}

static int
print_workers(const struct cli *cli, const dc_worker_info *workers, size_t n)
{
    if (cli->json) {
        struct json j;
        int rc;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "workers");
        json_array_begin(&j);
        for (size_t i = 0; i < n; i++) {
            json_worker(&j, &workers[i]);
        }
        json_array_end(&j);
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
        return rc;
    } else {
        struct table t;
        uint64_t now = now_unix_ms();
        table_init(&t, 8, worker_header);
        for (size_t i = 0; i < n; i++) {
            worker_row(&t, &workers[i], now);
        }
        return table_print(&t);
    }
}

static void
json_device(struct json *j, const dc_device_info *d)
{
    char concrete[DC_DEVICE_TEXT_SIZE];

    dc_device_format(&d->device, concrete, sizeof(concrete));
    json_object_begin(j);
    json_key(j, "name");
    json_string(j, d->name);
    json_key(j, "worker");
    json_string(j, d->worker);
    json_key(j, "device");
    json_string(j, concrete);
    json_key(j, "backend");
    json_string(j, dc_backend_name(d->device.backend));
    json_key(j, "state");
    json_string(j, dc_device_state_name(d->state));
    json_key(j, "memory_bytes");
    json_uint(j, d->memory_bytes);
    json_object_end(j);
}

static const char *const device_header[] = { "NAME",    "WORKER", "DEVICE",
                                             "BACKEND", "STATE",  "MEMORY" };

static void
device_rows(struct table *t, const dc_device_list *list)
{
    for (size_t i = 0; i < list->n; i++) {
        const dc_device_info *d = &list->devices[i];
        char concrete[DC_DEVICE_TEXT_SIZE], mem[24];
        const char *row[6];

        dc_device_format(&d->device, concrete, sizeof(concrete));
        if (d->memory_bytes == 0) {
            snprintf(mem, sizeof(mem), "-"); /* the worker did not say */
        } else {
            human_bytes(mem, sizeof(mem), d->memory_bytes);
        }
        row[0] = d->name;
        row[1] = d->worker;
        row[2] = concrete;
        row[3] = or_dash(dc_backend_name(d->device.backend));
        row[4] = or_dash(dc_device_state_name(d->state));
        row[5] = mem;
        table_add(t, row);
    }
}

static void
json_devices(struct json *j, const dc_device_list *list)
{
    json_array_begin(j);
    for (size_t i = 0; i < list->n; i++) {
        json_device(j, &list->devices[i]);
    }
    json_array_end(j);
}

static int
cmd_status(const struct cli *cli, dc_client *c)
{
    static const char *const header[] = { "SECTION", "NAME", "COUNT" };
    dc_cluster_status cs;
    dc_status st;
    char buf[24];

    if (dc_cluster_status_get(c, &cs, &st) != DC_OK) {
        return fail(&st);
    }
    if (cli->json) {
        struct json j;
        int rc;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "workers");
        json_object_begin(&j);
        json_key(&j, "alive");
        json_uint(&j, cs.workers_alive);
        json_key(&j, "dead");
        json_uint(&j, cs.workers_dead);
        json_key(&j, "cordoned");
        json_uint(&j, cs.workers_cordoned);
        json_key(&j, "draining");
        json_uint(&j, cs.workers_draining);
        json_object_end(&j);
        json_key(&j, "devices");
        json_object_begin(&j);
        for (int b = 1; b < DC_BACKEND_COUNT; b++) {
            if (cs.devices_by_backend[b] > 0) {
                json_key(&j, dc_backend_name((dc_backend)b));
                json_uint(&j, cs.devices_by_backend[b]);
            }
        }
        json_object_end(&j);
        json_key(&j, "ops");
        json_object_begin(&j);
        json_key(&j, "in_flight");
        json_uint(&j, cs.ops_in_flight);
        json_key(&j, "done");
        json_uint(&j, cs.ops_done);
        json_key(&j, "failed");
        json_uint(&j, cs.ops_failed);
        json_object_end(&j);
        json_key(&j, "ready");
        json_bool(&j, cs.ready);
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
        return rc;
    } else {
        struct table t;
        const struct {
            const char *section, *name;
            uint64_t n;
        } rows[] = {
            { "workers", "alive", cs.workers_alive },
            { "workers", "dead", cs.workers_dead },
            { "workers", "cordoned", cs.workers_cordoned },
            { "workers", "draining", cs.workers_draining },
            { "ops", "in_flight", cs.ops_in_flight },
            { "ops", "done", cs.ops_done },
            { "ops", "failed", cs.ops_failed },
        };
        table_init(&t, 3, header);
        for (size_t i = 0; i < 4; i++) {
            const char *row[3] = { rows[i].section, rows[i].name, buf };
            fmt_u64(buf, sizeof(buf), rows[i].n);
            table_add(&t, row);
        }
        for (int b = 1; b < DC_BACKEND_COUNT; b++) {
            if (cs.devices_by_backend[b] > 0) {
                const char *row[3] = { "devices", dc_backend_name((dc_backend)b), buf };
                fmt_u64(buf, sizeof(buf), cs.devices_by_backend[b]);
                table_add(&t, row);
            }
        }
        for (size_t i = 4; i < sizeof(rows) / sizeof(rows[0]); i++) {
            const char *row[3] = { rows[i].section, rows[i].name, buf };
            fmt_u64(buf, sizeof(buf), rows[i].n);
            table_add(&t, row);
        }
        {
            const char *row[3] = { "coordinator", "ready", cs.ready ? "yes" : "no" };
            table_add(&t, row);
        }
        return table_print(&t);
    }
}

/* ---- watching ------------------------------------------------------------------------ */

static volatile sig_atomic_t interrupted;

static void
on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* SIGINT and SIGTERM end a watch cleanly instead of killing the process. */
static void
catch_interrupts(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* Sleeps in short steps: the signal may land on one of nng's threads, not on this one, so
 * the flag is what tells. */
static void
sleep_ms(uint32_t ms)
{
    while (ms > 0 && !interrupted) {
        uint32_t step      = ms < 50 ? ms : 50;
        struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)step * 1000000L };
        nanosleep(&ts, NULL);
        ms -= step;
    }
}

static uint64_t
monotonic_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* What a watch compares between two listings: everything but the heartbeat's age, which
 * moves all the time. NULL when out of memory. */
static char *
workers_signature(const dc_worker_list *list)
{
    struct json j;
    char *sig = NULL;

    json_init(&j);
    json_array_begin(&j);
    for (size_t i = 0; i < list->n; i++) {
        const dc_worker_info *w = &list->workers[i];
        json_array_begin(&j);
        json_string(&j, w->name);
        json_string(&j, w->address);
        json_uint(&j, (uint64_t)w->state);
        json_uint(&j, w->epoch);
        json_uint(&j, w->device_count);
        json_string(&j, w->executor);
        for (size_t k = 0; k < w->n_labels; k++) {
            json_string(&j, w->labels[k].key);
            json_string(&j, w->labels[k].value);
        }
        json_array_end(&j);
    }
    json_array_end(&j);
    if (json_text(&j) != NULL) {
        sig = strdup(json_text(&j));
    }
    json_free(&j);
    return sig;
}

/*
 * workers list -w: a listing every interval. A terminal shows the latest in place of the
 * last (ages move even when nothing else does); a pipe or file gets a new frame only when a
 * worker joined, left or changed, so a script reading it sees changes, not ticks. A lost
 * coordinator is reported once and waited for; a refusal ends the watch.
 */
static int
workers_watch(const struct cli *cli, dc_client *c, uint32_t interval_ms)
{
    bool redraw = isatty(STDOUT_FILENO) && !cli->json, outage = false;
    char *last    = NULL;
    size_t frames = 0;
    int rc        = 0;

    catch_interrupts();
    while (!interrupted && rc == 0) {
        dc_worker_list *list = NULL;
        dc_status st;
        char *sig;

        if (dc_list_workers(c, &list, &st) != DC_OK) {
            if (!st.transport) {
                rc = fail(&st);
                break;
            }
            if (!outage) {
                print_error(&st);
                outage = true;
            }
            sleep_ms(interval_ms);
            continue;
        }
        outage = false;
        if ((sig = workers_signature(list)) == NULL) {
            fputs("devcoordctl: RESOURCE_EXHAUSTED: out of memory\n", stderr);
            rc = EXIT_REFUSED;
        } else if (redraw || last == NULL || strcmp(sig, last) != 0) {
            if (redraw) {
                fputs("\033[H\033[2J", stdout);
                printf("devcoordctl workers list, every %" PRIu32 " ms (Ctrl-C ends)\n\n",
                       interval_ms);
            } else if (frames > 0 && !cli->json) {
                fputc('\n', stdout);
            }
            rc = print_workers(cli, list->workers, list->n);
            fflush(stdout);
            frames++;
            free(last);
            last = sig;
        } else {
            free(sig);
        }
        dc_worker_list_free(list);
        sleep_ms(interval_ms);
    }
    free(last);
    return rc;
}

static int
cmd_workers_list(const struct cli *cli, dc_client *c)
{
    dc_worker_list *list = NULL;
    dc_status st;
    int rc;

    if (cli->seen[O_WATCH]) {
        uint32_t interval = WATCH_DEFAULT_INTERVAL_MS;
        if (cli->seen[O_WATCH_INTERVAL]) {
            human_parse_duration(cli->val[O_WATCH_INTERVAL], &interval); /* checked before */
        }
        return workers_watch(cli, c, interval);
    }
    if (dc_list_workers(c, &list, &st) != DC_OK) {
        return fail(&st);
    }
    rc = print_workers(cli, list->workers, list->n);
    dc_worker_list_free(list);
    return rc;
}

static int
cmd_workers_show(const struct cli *cli, dc_client *c)
{
    const char *name        = cli->args[0];
    dc_worker_list *workers = NULL;
    dc_device_list *devices = NULL;
    dc_device_filter filter = { .worker = name };
    const dc_worker_info *w = NULL;
    dc_status st;
    int rc;

    if (dc_list_workers(c, &workers, &st) != DC_OK) {
        return fail(&st);
    }
    for (size_t i = 0; i < workers->n; i++) {
        if (strcmp(workers->workers[i].name, name) == 0) {
            w = &workers->workers[i];
        }
    }
    if (w == NULL) {
        snprintf(st.message, sizeof(st.message), "worker %s is not registered", name);
        st.code = DC_NOT_FOUND;
        rc      = fail(&st);
        goto out;
    }
    if (dc_list_devices(c, &filter, &devices, &st) != DC_OK) {
        rc = fail(&st);
        goto out;
    }
    if (cli->json) {
        struct json j;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "worker");
        json_worker(&j, w);
        json_key(&j, "devices");
        json_devices(&j, devices);
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
    } else {
        struct table t;
        table_init(&t, 8, worker_header);
        worker_row(&t, w, now_unix_ms());
        if ((rc = table_print(&t)) != 0) {
            goto out;
        }
        fputc('\n', stdout);
        table_init(&t, 6, device_header);
        device_rows(&t, devices);
        rc = table_print(&t);
    }
out:
    dc_device_list_free(devices);
    dc_worker_list_free(workers);
    return rc;
}

/* Whether op r still needs worker `name`: queued with it in the plan, or running and not
 * answered by it yet (a worker that answered has finished its part). */
static bool
op_uses_worker(const dc_op_result *r, const char *name)
{
    bool planned = false;

    if (r->state != DC_OP_STATE_QUEUED && r->state != DC_OP_STATE_RUNNING) {
        return false;
    }
    for (size_t i = 0; i < r->n_plan_workers && !planned; i++) {
        planned = strcmp(r->plan_workers[i].name, name) == 0;
    }
    if (!planned || r->state == DC_OP_STATE_QUEUED) {
        return planned;
    }
    for (size_t i = 0; i < r->n_waiting; i++) {
        if (strcmp(r->waiting_on[i], name) == 0) {
            return true;
        }
    }
    return false;
}

/* The ops in flight that use a worker: how many, and the ids of the first few. */
#define BUSY_IDS_MAX 16

struct busy_ops {
    long n;
    size_t shown;
    char id[BUSY_IDS_MAX][40];
};

/* Fills b with the ops in flight that use worker `name`; false with st saying why. */
static bool
ops_using_worker(dc_client *c, const char *name, struct busy_ops *b, dc_status *st)
{
    dc_cluster_status cs;
    dc_op_list *list = NULL;
    uint64_t limit;

    memset(b, 0, sizeof(*b));
    if (dc_cluster_status_get(c, &cs, st) != DC_OK) {
        return false;
    }
    if (cs.ops_in_flight == 0) {
        return true;
    }
    /* A listing puts the ops in flight first; a little more than their number allows for
     * ops submitted in between. */
    limit = cs.ops_in_flight + 64 > 65536 ? 65536 : cs.ops_in_flight + 64;
    if (dc_list_ops(c, (uint32_t)limit, &list, st) != DC_OK) {
        return false;
    }
    for (size_t i = 0; i < list->n; i++) {
        const dc_op_result *r = &list->ops[i];
        if (!op_uses_worker(r, name)) {
            continue;
        }
        if (b->shown < BUSY_IDS_MAX) {
            snprintf(b->id[b->shown++], sizeof(b->id[0]), "%s", r->op_id);
        }
        b->n++;
    }
    dc_op_list_free(list);
    return true;
}

static void
busy_ops_text(const struct busy_ops *b, char *buf, size_t cap)
{
    size_t len = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < b->shown && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i > 0 ? ", " : "", b->id[i]);
        len += w > 0 ? (size_t)w : 0;
    }
    if ((size_t)b->n > b->shown && len < cap) {
        snprintf(buf + len, cap - len, ", ...");
    }
}

/* drain: cordon, then say which ops in flight still use the worker; with --wait, poll until
 * none does or --timeout runs out. */
static int
drain_report(const struct cli *cli, dc_client *c, const dc_worker_info *w)
{
    uint32_t bound    = cli->timeout_ms != 0 ? cli->timeout_ms : DEFAULT_TIMEOUT_MS;
    uint64_t deadline = monotonic_ms() + bound;
    bool wait         = cli->seen[O_WAIT];
    char ids[BUSY_IDS_MAX * 42 + 8], bound_text[24], line[sizeof(ids) + 256];
    struct busy_ops b;
    dc_status st;
    int rc = 0;

    if (!ops_using_worker(c, w->name, &b, &st)) {
        return fail(&st);
    }
    busy_ops_text(&b, ids, sizeof(ids));
    if (!cli->json) {
        if (b.n == 0) {
            snprintf(line, sizeof(line),
                     "draining %s: no new op will use its devices; no op in flight uses it",
                     w->name);
        } else {
            snprintf(line, sizeof(line),
                     "draining %s: no new op will use its devices; %s %ld op%s in flight: %s",
                     w->name, wait ? "waiting for" : "still used by", b.n, b.n == 1 ? "" : "s",
                     ids);
        }
        /* Names and ids come from the server: no control character reaches the terminal. */
        fputc('\n', stdout);
        print_sanitized(stdout, line);
        fputc('\n', stdout);
        fflush(stdout);
    }
    while (wait && b.n > 0 && monotonic_ms() < deadline) {
        uint64_t left = deadline - monotonic_ms();
        sleep_ms(left < DRAIN_POLL_MS ? (uint32_t)left : DRAIN_POLL_MS);
        if (!ops_using_worker(c, w->name, &b, &st)) {
            return fail(&st);
        }
    }
    busy_ops_text(&b, ids, sizeof(ids));
    if (cli->json) {
        struct json j;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "worker");
        json_worker(&j, w);
        json_key(&j, "ops_in_flight");
        json_uint(&j, (uint64_t)b.n);
        json_key(&j, "op_ids");
        json_array_begin(&j);
        for (size_t i = 0; i < b.shown; i++) {
            json_string(&j, b.id[i]);
        }
        json_array_end(&j);
        json_key(&j, "drained");
        json_bool(&j, b.n == 0);
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
    } else if (wait && b.n == 0) {
        snprintf(line, sizeof(line), "%s is drained: no op in flight uses it", w->name);
        print_sanitized(stdout, line);
        fputc('\n', stdout);
    }
    if (wait && b.n > 0) {
        human_age(bound_text, sizeof(bound_text), bound);
        snprintf(line, sizeof(line), "%s still has %ld op%s in flight after %s: %s", w->name, b.n,
                 b.n == 1 ? "" : "s", bound_text, ids);
        fputs("devcoordctl: DEADLINE_EXCEEDED: ", stderr);
        print_sanitized(stderr, line);
        fputc('\n', stderr);
        return EXIT_REFUSED;
    }
    return rc;
}

static int
cmd_workers_steer(const struct cli *cli, dc_client *c)
{
    dc_worker_info w;
    dc_status st;
    dc_code code;
    int rc;

    switch (cli->cmd->id) {
    case CMD_WORKERS_CORDON:
        code = dc_cordon_worker(c, cli->args[0], &w, &st);
        break;
    case CMD_WORKERS_UNCORDON:
        code = dc_uncordon_worker(c, cli->args[0], &w, &st);
        break;
    default:
        code = dc_drain_worker(c, cli->args[0], &w, &st);
        break;
    }
    if (code != DC_OK) {
        return fail(&st);
    }
    if (cli->cmd->id == CMD_WORKERS_DRAIN) {
        if (!cli->json && (rc = print_workers(cli, &w, 1)) != 0) {
            dc_worker_info_clear(&w);
            return rc;
        }
        rc = drain_report(cli, c, &w);
        dc_worker_info_clear(&w);
        return rc;
    }
    if (cli->json) {
        struct json j;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "worker");
        json_worker(&j, &w);
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
    } else {
        rc = print_workers(cli, &w, 1);
    }
    dc_worker_info_clear(&w);
    return rc;
}

struct devices_args {
    dc_device_filter filter;
};

static int
devices_prepare(const struct cli *cli, struct devices_args *a)
{
    memset(a, 0, sizeof(*a));
    if (cli->seen[O_BACKEND] &&
        (a->filter.backend = dc_backend_from_name(cli->val[O_BACKEND])) == DC_BACKEND_NONE) {
        return cli_usage_error("unknown backend '%s'", cli->val[O_BACKEND]);
    }
    if (cli->seen[O_STATE] &&
        (a->filter.state = dc_device_state_from_name(cli->val[O_STATE])) == DC_DEVICE_NONE) {
        return cli_usage_error("--state wants healthy, unhealthy or dead, not '%s'",
                               cli->val[O_STATE]);
    }
    if (cli->seen[O_LABEL]) {
        const char *eq = strchr(cli->val[O_LABEL], '=');
        if (eq == NULL || eq == cli->val[O_LABEL]) {
            return cli_usage_error("--label wants KEY=VALUE, not '%s'", cli->val[O_LABEL]);
        }
        a->filter.label = cli->val[O_LABEL];
    }
    a->filter.worker = cli->val[O_WORKER];
    return 0;
}

static int
cmd_devices_list(const struct cli *cli, dc_client *c, const struct devices_args *a)
{
    dc_device_list *list = NULL;
    dc_status st;
    int rc;

    if (dc_list_devices(c, &a->filter, &list, &st) != DC_OK) {
        return fail(&st);
    }
    if (cli->json) {
        struct json j;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "devices");
        json_devices(&j, list);
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
    } else {
        struct table t;
        table_init(&t, 6, device_header);
        device_rows(&t, list);
        rc = table_print(&t);
    }
    dc_device_list_free(list);
    return rc;
}

/* ---- operations ---------------------------------------------------------------------- */

static void
ref_text(const dc_device_ref *ref, char *buf, size_t cap)
{
    dc_device_ref_format(ref, buf, cap);
}

/* The document of an op (plan, submit, ops show): status from `st`, the rest from r, which
 * may be NULL when nothing was planned. */
static void
json_op(struct json *j, const dc_op_result *r, const dc_status *st, bool with_results)
{
    char text[DC_DEVICE_TEXT_SIZE];

    json_object_begin(j);
    json_key(j, "op_id");
    json_string(j, r != NULL ? r->op_id : "");
    json_key(j, "status");
    json_string(j, dc_status_name(st->code));
    json_key(j, "message");
    json_string(j, st->message);
    if (st->device_index >= 0) {
        json_key(j, "device_index");
        json_int(j, st->device_index);
    }
    if (st->worker[0] != '\0') {
        json_key(j, "worker");
        json_string(j, st->worker);
    }
    json_key(j, "plan");
    if (r == NULL || (r->n_devices == 0 && r->n_plan_workers == 0 && r->group_id[0] == '\0')) {
        json_null(j);
    } else {
        json_object_begin(j);
        json_key(j, "group_id");
        json_string(j, r->group_id);
        json_key(j, "devices");
        json_array_begin(j);
        for (size_t i = 0; i < r->n_devices; i++) {
            ref_text(&r->devices[i], text, sizeof(text));
            json_string(j, text);
        }
        json_array_end(j);
        json_key(j, "workers");
        json_array_begin(j);
        for (size_t i = 0; i < r->n_plan_workers; i++) {
            const dc_plan_worker *pw = &r->plan_workers[i];
            json_object_begin(j);
            json_key(j, "name");
            json_string(j, pw->name);
            json_key(j, "address");
            json_string(j, pw->address);
            json_key(j, "devices");
            json_array_begin(j);
            for (size_t k = 0; k < pw->n_ranks; k++) {
                ref_text(&r->devices[pw->ranks[k]], text, sizeof(text));
                json_string(j, text);
            }
            json_array_end(j);
            json_key(j, "ranks");
            json_array_begin(j);
            for (size_t k = 0; k < pw->n_ranks; k++) {
                json_uint(j, pw->ranks[k]);
            }
            json_array_end(j);
            json_object_end(j);
        }
        json_array_end(j);
        json_object_end(j);
    }
    if (r != NULL) {
        json_key(j, "kind");
        json_string(j, dc_op_kind_name(r->kind));
        json_key(j, "reduce");
        json_string(j, dc_reduce_op_name(r->reduce));
        json_key(j, "root");
        json_uint(j, r->root);
    }
    if (with_results && r != NULL) {
        json_key(j, "tensor");
        json_string(j, r->tensor);
        json_key(j, "output_tensor");
        json_string(j, r->output_tensor);
        json_key(j, "state");
        json_string(j, dc_op_state_name(r->state));
        json_key(j, "workers");
        json_array_begin(j);
        for (size_t i = 0; i < r->n_results; i++) {
            const dc_worker_result *w = &r->results[i];
            json_object_begin(j);
            json_key(j, "name");
            json_string(j, w->name);
            json_key(j, "status");
            json_string(j, dc_status_name(w->code));
            json_key(j, "message");
            json_string(j, w->message);
            json_key(j, "elapsed_us");
            json_uint(j, w->elapsed_us);
            json_object_end(j);
        }
        json_array_end(j);
        json_key(j, "waiting_on");
        json_array_begin(j);
        for (size_t i = 0; i < r->n_waiting; i++) {
            json_string(j, r->waiting_on[i]);
        }
        json_array_end(j);
        json_key(j, "submitted_unix_ms");
        json_uint(j, r->submitted_unix_ms);
        json_key(j, "elapsed_us");
        json_uint(j, r->elapsed_us);
    }
    json_object_end(j);
}

static int
print_op_json(const dc_op_result *r, const dc_status *st, bool with_results)
{
    struct json j;
    int rc;

    json_init(&j);
    json_op(&j, r, st, with_results);
    rc = json_print(&j);
    json_free(&j);
    return rc;
}

static int
print_op_table(const dc_op_result *r, const dc_status *st, bool with_results)
{
    static const char *const kv_header[]   = { "FIELD", "VALUE" };
    static const char *const plan_header[] = { "RANK", "DEVICE", "WORKER", "ADDRESS" };
    static const char *const res_header[]  = { "WORKER", "STATUS", "ELAPSED", "MESSAGE" };
    char text[DC_DEVICE_TEXT_SIZE], num[24];
    struct table t;
    int rc;

    table_init(&t, 2, kv_header);
    {
        const char *rows[][2] = {
            { "op_id", or_dash(r->op_id) },
            { "kind", or_dash(dc_op_kind_name(r->kind)) },
            { "reduce", or_dash(dc_reduce_op_name(r->reduce)) },
            { "status", dc_status_name(st->code) },
            { "message", or_dash(st->message) },
            { "group_id", or_dash(r->group_id) },
        };
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
            table_add(&t, rows[i]);
        }
    }
    if (with_results) {
        const char *state[2]   = { "state", or_dash(dc_op_state_name(r->state)) };
        const char *tensor[2]  = { "tensor", or_dash(r->tensor) };
        const char *elapsed[2] = { "elapsed", num };
        char age[24];
        const char *age_row[2] = { "age", age };
        char waiting[1024];
        const char *wait_row[2] = { "waiting_on", waiting };
        size_t n                = 0;

        human_elapsed_us(num, sizeof(num), r->elapsed_us);
        fmt_age_since(age, sizeof(age), r->submitted_unix_ms, now_unix_ms());
        table_add(&t, state);
        table_add(&t, tensor);
        table_add(&t, age_row);
        table_add(&t, elapsed);
        waiting[0] = '\0';
        for (size_t i = 0; i < r->n_waiting && n < sizeof(waiting); i++) {
            n += (size_t)snprintf(waiting + n, sizeof(waiting) - n, "%s%s", i ? "," : "",
                                  r->waiting_on[i]);
        }
        wait_row[1] = or_dash(waiting);
        table_add(&t, wait_row);
    }
    if ((rc = table_print(&t)) != 0) {
        return rc;
    }
    if (r->n_devices > 0) {
        fputc('\n', stdout);
        table_init(&t, 4, plan_header);
        for (size_t i = 0; i < r->n_devices; i++) {
            const char *worker = r->devices[i].worker, *address = "";
            const char *row[4] = { num, text, worker, NULL };
            for (size_t w = 0; w < r->n_plan_workers; w++) {
                for (size_t k = 0; k < r->plan_workers[w].n_ranks; k++) {
                    if (r->plan_workers[w].ranks[k] == i) {
                        worker  = r->plan_workers[w].name;
                        address = r->plan_workers[w].address;
                    }
                }
            }
            snprintf(num, sizeof(num), "%zu", i);
            ref_text(&r->devices[i], text, sizeof(text));
            row[2] = or_dash(worker);
            row[3] = or_dash(address);
            table_add(&t, row);
        }
        if ((rc = table_print(&t)) != 0) {
            return rc;
        }
    }
    if (with_results && r->n_results > 0) {
        fputc('\n', stdout);
        table_init(&t, 4, res_header);
        for (size_t i = 0; i < r->n_results; i++) {
            const dc_worker_result *w = &r->results[i];
            const char *row[4] = { w->name, dc_status_name(w->code), num, or_dash(w->message) };
            human_elapsed_us(num, sizeof(num), w->elapsed_us);
            table_add(&t, row);
        }
        rc = table_print(&t);
    }
    return rc;
}

struct op_args {
    dc_op_request req;
    dc_device_ref *devices;
};

static int
op_prepare(const struct cli *cli, struct op_args *a)
{
    size_t n = 0;
    dc_status st;
    int rc;

    memset(a, 0, sizeof(*a));
    if (!cli->seen[O_OP]) {
        return cli_usage_error("%s needs --op KIND", cli->cmd->group);
    }
    if ((a->req.kind = dc_op_kind_from_name(cli->val[O_OP])) == DC_OP_NONE) {
        return cli_usage_error("--op wants all-reduce, reduce, broadcast, all-gather or barrier, "
                               "not '%s'",
                               cli->val[O_OP]);
    }
    if (cli->seen[O_REDUCE] &&
        (a->req.reduce = dc_reduce_op_from_name(cli->val[O_REDUCE])) == DC_REDUCE_NONE) {
        return cli_usage_error("--reduce wants sum, mean, min, max or prod, not '%s'",
                               cli->val[O_REDUCE]);
    }
    if ((rc = parse_u32_opt(cli, O_ROOT, &a->req.root)) != 0 ||
        (rc = parse_u32_opt(cli, O_OP_TIMEOUT, &a->req.timeout_ms)) != 0) {
        return rc;
    }
    if (!cli->seen[O_OP_TIMEOUT]) {
        a->req.timeout_ms = cli->timeout_ms; /* 0: the coordinator's */
    }
    if (!cli->seen[O_DEVICES]) {
        return cli_usage_error("%s needs --devices REF,REF,...", cli->cmd->group);
    }
    /* A barrier moves no data; everything else names the tensor it works on. */
    if (cli->cmd->id == CMD_SUBMIT && !cli->seen[O_TENSOR] && a->req.kind != DC_OP_BARRIER) {
        return cli_usage_error("submit needs --tensor NAME");
    }
    a->req.tensor        = cli->val[O_TENSOR];
    a->req.output_tensor = cli->val[O_OUTPUT_TENSOR];
    a->req.dry_run       = cli->cmd->id == CMD_PLAN;
    /* A list that does not parse is the command line's fault, found here whether or not a
     * server answers: a usage error. */
    if (dc_device_list_parse(cli->val[O_DEVICES], &a->devices, &n, &st) != DC_OK) {
        return cli_usage_error("--devices: %s", st.message);
    }
    a->req.devices   = a->devices;
    a->req.n_devices = n;
    return 0;
}

/* A refused op: its document on stdout with -o json, the error on stderr. */
static int
op_refused(const struct cli *cli, const dc_op_result *r, const dc_status *st)
{
    if (cli->json) {
        print_op_json(r, st, cli->cmd->id == CMD_SUBMIT);
    }
    print_error(st);
    return r == NULL && is_connection_failure(st) ? EXIT_UNREACHABLE : EXIT_REFUSED;
}

static int
cmd_op(const struct cli *cli, dc_client *c, struct op_args *a)
{
    bool submit       = cli->cmd->id == CMD_SUBMIT;
    dc_op_result *res = NULL;
    dc_status st;
    dc_code code;
    int rc;

    code = dc_submit_keyed(c, &a->req, cli->val[O_IDEMPOTENCY_KEY], &res, &st);
    if (code != DC_OK) {
        rc = op_refused(cli, res, &st);
    } else if (res == NULL) {
        st.code = DC_INTERNAL;
        snprintf(st.message, sizeof(st.message), "no op in the coordinator's answer");
        rc = op_refused(cli, NULL, &st);
    } else if (cli->json) {
        rc = print_op_json(res, &st, submit);
    } else {
        rc = print_op_table(res, &st, submit);
    }
    dc_op_result_free(res);
    return rc;
}

static int
cmd_ops_list(const struct cli *cli, dc_client *c)
{
    static const char *const header[] = { "OP_ID",  "KIND", "STATE",   "STATUS",    "DEVICES",
                                          "TENSOR", "AGE",  "ELAPSED", "WAITING_ON" };
    dc_op_list *list                  = NULL;
    uint32_t limit                    = 0;
    dc_status st;
    int rc;

    if ((rc = parse_u32_opt(cli, O_LIMIT, &limit)) != 0) {
        return rc;
    }
    if (dc_list_ops(c, limit, &list, &st) != DC_OK) {
        return fail(&st);
    }
    if (cli->json) {
        struct json j;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "ops");
        json_array_begin(&j);
        for (size_t i = 0; i < list->n; i++) {
            json_op(&j, &list->ops[i], &list->ops[i].status, true);
        }
        json_array_end(&j);
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
    } else {
        struct table t;
        uint64_t now = now_unix_ms();
        table_init(&t, 9, header);
        for (size_t i = 0; i < list->n; i++) {
            const dc_op_result *r = &list->ops[i];
            char ndev[24], age[24], elapsed[24], waiting[512];
            const char *row[9];
            size_t n = 0;

            waiting[0] = '\0';
            for (size_t k = 0; k < r->n_waiting && n < sizeof(waiting); k++) {
                n += (size_t)snprintf(waiting + n, sizeof(waiting) - n, "%s%s", k ? "," : "",
                                      r->waiting_on[k]);
            }
            snprintf(ndev, sizeof(ndev), "%zu", r->n_devices);
            fmt_age_since(age, sizeof(age), r->submitted_unix_ms, now);
            human_elapsed_us(elapsed, sizeof(elapsed), r->elapsed_us);
            row[0] = or_dash(r->op_id);
            row[1] = or_dash(dc_op_kind_name(r->kind));
            row[2] = or_dash(dc_op_state_name(r->state));
            row[3] = dc_status_name(r->status.code);
            row[4] = ndev;
            row[5] = or_dash(r->tensor);
            row[6] = age;
            row[7] = elapsed;
            row[8] = or_dash(waiting);
            table_add(&t, row);
        }
        rc = table_print(&t);
    }
    dc_op_list_free(list);
    return rc;
}

static int
cmd_ops_show(const struct cli *cli, dc_client *c)
{
    dc_op_result *r = NULL;
    dc_status st;
    int rc;

    if (dc_get_op(c, cli->args[0], &r, &st) != DC_OK) {
        return fail(&st);
    }
    rc = cli->json ? print_op_json(r, &r->status, true) : print_op_table(r, &r->status, true);
    dc_op_result_free(r);
    return rc;
}

/* ---- tensors ------------------------------------------------------------------------- */

struct put_args {
    dc_dtype dtype;
    uint64_t shape[DC_TENSOR_MAX_DIMS];
    size_t ndim;
    void *data;
    size_t bytes;
};

/* Parses one value of --values (between b and e) per dtype into slot. */
static bool
parse_value(const char *b, const char *e, dc_dtype dtype, unsigned char *slot)
{
    char buf[128];
    char *end;
    size_t len;

    text_trim(&b, &e);
    len = (size_t)(e - b);
    if (len == 0 || len >= sizeof(buf)) {
        return false;
    }
    memcpy(buf, b, len);
    buf[len] = '\0';
    errno    = 0;
    if (dtype == DC_DTYPE_F16 || dtype == DC_DTYPE_BF16) {
        /* Largest finite f16 and bf16; a bigger finite value would become inf. */
        double max = dtype == DC_DTYPE_F16 ? 65504.0 : 0x1.fep127;
        double v   = strtod(buf, &end);
        uint16_t h;
        if (*end != '\0' || (isfinite(v) && fabs(v) > max)) {
            return false;
        }
        h = dtype == DC_DTYPE_F16 ? dc_float_to_f16((float)v) : dc_float_to_bf16((float)v);
        memcpy(slot, &h, sizeof(h));
    } else if (dtype == DC_DTYPE_F32 || dtype == DC_DTYPE_F64) {
        double v = strtod(buf, &end);
        if (*end != '\0' || (errno == ERANGE && isinf(v)) ||
            (dtype == DC_DTYPE_F32 && isfinite(v) && fabs(v) > FLT_MAX)) {
            return false;
        }
        if (dtype == DC_DTYPE_F32) {
            float f = (float)v;
            memcpy(slot, &f, sizeof(f));
        } else {
            memcpy(slot, &v, sizeof(v));
        }
    } else {
        long long v = strtoll(buf, &end, 10);
        if (*end != '\0' || errno == ERANGE) {
            return false;
        }
        if (dtype == DC_DTYPE_I32) {
            int32_t i;
            if (v < INT32_MIN || v > INT32_MAX) {
                return false;
            }
            i = (int32_t)v;
            memcpy(slot, &i, sizeof(i));
        } else {
            int64_t i = (int64_t)v;
            memcpy(slot, &i, sizeof(i));
        }
    }
    return true;
}

static int
parse_values(const char *text, struct put_args *a, size_t *count)
{
    size_t esize = dc_dtype_size(a->dtype);
    size_t n = 1, i = 0;
    const char *p;

    for (p = text; text_is_blank(*p); p++) {
    }
    if (*p == '\0') {
        *count = 0;
        return 0;
    }
    for (p = text; *p != '\0'; p++) {
        n += *p == ',';
    }
    if (n > SIZE_MAX / esize || (a->data = malloc(n * esize)) == NULL) {
        return cli_usage_error("--values: too many values");
    }
    for (p = text; i < n; i++) {
        const char *e = strchr(p, ',');
        if (e == NULL) {
            e = p + strlen(p);
        }
        if (!parse_value(p, e, a->dtype, (unsigned char *)a->data + i * esize)) {
            return cli_usage_error("--values: entry %zu '%.*s' is not a valid %s value", i,
                                   (int)(e - p > 64 ? 64 : e - p), p, dc_dtype_name(a->dtype));
        }
        p = *e == ',' ? e + 1 : e;
    }
    a->bytes = n * esize;
    *count   = n;
    return 0;
}

/* The bytes of `path`, or of standard input for "-". */
static int
read_file(const char *path, void **out, size_t *len)
{
    bool is_stdin      = strcmp(path, "-") == 0;
    FILE *f            = is_stdin ? stdin : fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;

    if (f == NULL) {
        return cli_usage_error("cannot read --file '%s': %s", path, strerror(errno));
    }
    for (;;) {
        size_t got;
        if (n == cap) {
            unsigned char *grow;
            cap = cap ? cap * 2 : 65536;
            if (cap < n || (grow = realloc(buf, cap)) == NULL) {
                rc = cli_usage_error("--file '%s' is too large to read", path);
                goto out;
            }
            buf = grow;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            break;
        }
    }
    if (ferror(f)) {
        rc = cli_usage_error("cannot read --file '%s'", path);
        goto out;
    }
    *out = buf;
    *len = n;
    buf  = NULL;
out:
    free(buf);
    if (!is_stdin) {
        fclose(f);
    }
    return rc;
}

/* Writes len bytes to `path`, or to standard output for "-". */
static int
write_file(const char *path, const void *data, size_t len)
{
    bool is_stdout = strcmp(path, "-") == 0;
    FILE *f        = is_stdout ? stdout : fopen(path, "wb");
    bool ok;

    if (f == NULL) {
        return cli_usage_error("cannot write --file '%s': %s", path, strerror(errno));
    }
    ok = len == 0 || fwrite(data, 1, len, f) == len;
    ok = (is_stdout ? fflush(f) == 0 : fclose(f) == 0) && ok;
    if (!ok) {
        return cli_usage_error("cannot write --file '%s': %s", path, strerror(errno));
    }
    return 0;
}

/* A transfer's progress on standard error, for people: only on a terminal, and only for
 * tensors big enough to take a while. */
struct progress {
    const char *verb, *device, *name;
    bool on, shown;
    int last_pct;
};

static void
progress_init(struct progress *p, const char *verb, const char *device, const char *name)
{
    memset(p, 0, sizeof(*p));
    p->verb   = verb;
    p->device = device;
    p->name   = name;
    p->on     = isatty(STDERR_FILENO) == 1;
}

static void
progress_show(size_t done, size_t total, void *arg)
{
    struct progress *p = arg;
    char d[24], t[24];
    int pct;

    if (!p->on || total < PROGRESS_MIN_BYTES) {
        return;
    }
    pct = (int)((double)done * 100.0 / (double)total);
    if (p->shown && pct == p->last_pct) {
        return;
    }
    human_bytes(d, sizeof(d), done);
    human_bytes(t, sizeof(t), total);
    /* \r and erase-to-end-of-line: one line, rewritten. */
    fprintf(stderr, "\r%s %s %s: %sB of %sB (%d%%)\033[K", p->verb, p->device, p->name, d, t, pct);
    fflush(stderr);
    p->shown    = true;
    p->last_pct = pct;
}

static void
progress_end(const struct progress *p)
{
    if (p->shown) {
        fputc('\n', stderr);
    }
}

/* DEVICE and NAME of the tensor commands, checked before any server is asked. */
static int
tensor_prepare(const struct cli *cli)
{
    const char *device = cli->args[0];
    dc_device_ref ref;
    dc_status st;

    if (dc_device_ref_parse(device, strlen(device), &ref, &st) != DC_OK) {
        return cli_usage_error("device '%.*s': %s", DC_DEVICE_TEXT_MAX, device, st.message);
    }
    if (cli->cmd->n_args > 1 && (cli->args[1][0] == '\0' || strlen(cli->args[1]) > 255)) {
        return cli_usage_error("a tensor name has 1 to 255 bytes");
    }
    if (cli->cmd->id == CMD_TENSOR_GET && cli->seen[O_FILE] && cli->json &&
        strcmp(cli->val[O_FILE], "-") == 0) {
        return cli_usage_error("--file - and -o json would both write to standard output");
    }
    return 0;
}

static int
put_prepare(const struct cli *cli, struct put_args *a)
{
    size_t esize, count = 0;
    uint64_t elems = 1;
    int rc;

    memset(a, 0, sizeof(*a));
    if (!cli->seen[O_DTYPE]) {
        return cli_usage_error("tensor put needs --dtype f32|f64|i32|i64|f16|bf16");
    }
    if ((a->dtype = dc_dtype_from_name(cli->val[O_DTYPE])) == DC_DTYPE_NONE) {
        return cli_usage_error("--dtype wants f32, f64, i32 or i64, not '%s'", cli->val[O_DTYPE]);
    }
    esize = dc_dtype_size(a->dtype);
    if (cli->seen[O_VALUES] == cli->seen[O_FILE]) {
        return cli_usage_error("tensor put needs one of --values or --file");
    }
    if (cli->seen[O_SHAPE]) {
        const char *p = cli->val[O_SHAPE];
        while (*p != '\0') {
            char dim[32];
            const char *e = strchr(p, ',');
            size_t len    = e != NULL ? (size_t)(e - p) : strlen(p);
            if (a->ndim == DC_TENSOR_MAX_DIMS) {
                return cli_usage_error("--shape: at most %d dimensions", DC_TENSOR_MAX_DIMS);
            }
            if (len == 0 || len >= sizeof(dim)) {
                return cli_usage_error("--shape wants sizes like 2,3, not '%s'", cli->val[O_SHAPE]);
            }
            memcpy(dim, p, len);
            dim[len] = '\0';
            if (!parse_u64(dim, UINT64_MAX, &a->shape[a->ndim])) {
                return cli_usage_error("--shape wants sizes like 2,3, not '%s'", cli->val[O_SHAPE]);
            }
            if (a->shape[a->ndim] != 0 && elems > UINT64_MAX / a->shape[a->ndim]) {
                return cli_usage_error("--shape '%s' is too large", cli->val[O_SHAPE]);
            }
            elems *= a->shape[a->ndim++];
            p += len;
            if (*p == ',') {
                if (*++p == '\0') {
                    return cli_usage_error("--shape wants sizes like 2,3, not '%s'",
                                           cli->val[O_SHAPE]);
                }
            }
        }
    }
    if (cli->seen[O_VALUES]) {
        if ((rc = parse_values(cli->val[O_VALUES], a, &count)) != 0) {
            return rc;
        }
    } else {
        if ((rc = read_file(cli->val[O_FILE], &a->data, &a->bytes)) != 0) {
            return rc;
        }
        if (a->bytes % esize != 0) {
            return cli_usage_error("--file '%s' has %zu bytes, not a whole number of %s values",
                                   cli->val[O_FILE], a->bytes, dc_dtype_name(a->dtype));
        }
        count = a->bytes / esize;
    }
    if (!cli->seen[O_SHAPE]) {
        a->shape[0] = count;
        a->ndim     = 1;
    } else if (elems != count) {
        return cli_usage_error("--shape %s holds %" PRIu64 " values, got %zu", cli->val[O_SHAPE],
                               elems, count);
    }
    return 0;
}

static void
json_tensor_head(struct json *j, const char *device, const char *name, dc_dtype dtype,
                 const uint64_t *shape, size_t ndim)
{
    json_key(j, "device");
    json_string(j, device);
    json_key(j, "name");
    json_string(j, name);
    json_key(j, "dtype");
    json_string(j, dc_dtype_name(dtype));
    json_key(j, "shape");
    json_array_begin(j);
    for (size_t i = 0; i < ndim; i++) {
        json_uint(j, shape[i]);
    }
    json_array_end(j);
}

static int
cmd_tensor_put(const struct cli *cli, dc_client *c, struct put_args *a)
{
    static const char *const header[] = { "DEVICE", "NAME", "DTYPE", "SHAPE", "BYTES" };
    struct progress p;
    dc_status st;
    dc_code code;

    progress_init(&p, "put", cli->args[0], cli->args[1]);
    code = dc_tensor_put_progress(c, cli->args[0], cli->args[1], a->dtype, a->shape, a->ndim,
                                  a->data, a->bytes, progress_show, &p, &st);
    progress_end(&p);
    if (code != DC_OK) {
        return fail(&st);
    }
    if (cli->json) {
        struct json j;
        int rc;
        json_init(&j);
        json_object_begin(&j);
        json_tensor_head(&j, cli->args[0], cli->args[1], a->dtype, a->shape, a->ndim);
        json_key(&j, "size_bytes");
        json_uint(&j, a->bytes);
        json_key(&j, "status");
        json_string(&j, "OK");
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
        return rc;
    } else {
        struct table t;
        char shape[256], bytes[24];
        const char *row[5] = { cli->args[0], cli->args[1], dc_dtype_name(a->dtype), shape, bytes };
        fmt_shape(shape, sizeof(shape), a->shape, a->ndim);
        snprintf(bytes, sizeof(bytes), "%zu", a->bytes);
        table_init(&t, 5, header);
        table_add(&t, row);
        return table_print(&t);
    }
}

/* Element i of an f16 or bf16 tensor as a float (exact: both fit in one). */
static float
half_value(const dc_tensor *t, const unsigned char *p)
{
    uint16_t h;

    memcpy(&h, p, sizeof(h));
    return t->dtype == DC_DTYPE_F16 ? dc_f16_to_float(h) : dc_bf16_to_float(h);
}

static void
value_text(const dc_tensor *t, size_t i, char *buf, size_t cap)
{
    const unsigned char *p = (const unsigned char *)t->data + i * dc_dtype_size(t->dtype);

    switch (t->dtype) {
    case DC_DTYPE_F16:
    case DC_DTYPE_BF16:
        json_format_number(buf, cap, half_value(t, p), true);
        break;
    case DC_DTYPE_F32: {
        float f;
        memcpy(&f, p, sizeof(f));
        json_format_number(buf, cap, f, true);
        break;
    }
    case DC_DTYPE_F64: {
        double d;
        memcpy(&d, p, sizeof(d));
        json_format_number(buf, cap, d, false);
        break;
    }
    case DC_DTYPE_I32: {
        int32_t v;
        memcpy(&v, p, sizeof(v));
        snprintf(buf, cap, "%" PRId32, v);
        break;
    }
    default: {
        int64_t v;
        memcpy(&v, p, sizeof(v));
        snprintf(buf, cap, "%" PRId64, v);
        break;
    }
    }
}

static void
json_value(struct json *j, const dc_tensor *t, size_t i)
{
    const unsigned char *p = (const unsigned char *)t->data + i * dc_dtype_size(t->dtype);

    switch (t->dtype) {
    case DC_DTYPE_F16:
    case DC_DTYPE_BF16:
        json_float(j, half_value(t, p));
        break;
    case DC_DTYPE_F32: {
        float f;
        memcpy(&f, p, sizeof(f));
        json_float(j, f);
        break;
    }
    case DC_DTYPE_F64: {
        double d;
        memcpy(&d, p, sizeof(d));
        json_double(j, d);
        break;
    }
    case DC_DTYPE_I32: {
        int32_t v;
        memcpy(&v, p, sizeof(v));
        json_int(j, v);
        break;
    }
    default: {
        int64_t v;
        memcpy(&v, p, sizeof(v));
        json_int(j, v);
        break;
    }
    }
}

static int
cmd_tensor_get(const struct cli *cli, dc_client *c)
{
    static const char *const header[] = { "DEVICE", "NAME", "DTYPE", "SHAPE", "BYTES" };
    const char *file                  = cli->seen[O_FILE] ? cli->val[O_FILE] : NULL;
    dc_tensor *t                      = NULL;
    struct progress p;
    size_t n;
    dc_status st;
    dc_code code;
    int rc;

    progress_init(&p, "get", cli->args[0], cli->args[1]);
    code = dc_tensor_get_progress(c, cli->args[0], cli->args[1], &t, progress_show, &p, &st);
    progress_end(&p);
    if (code != DC_OK) {
        return fail(&st);
    }
    n = dc_dtype_size(t->dtype) ? t->size_bytes / dc_dtype_size(t->dtype) : 0;
    if (file != NULL && (rc = write_file(file, t->data, t->size_bytes)) != 0) {
        dc_tensor_free(t);
        return rc;
    }
    if (file != NULL && strcmp(file, "-") == 0) {
        rc = 0; /* the bytes were the output */
    } else if (cli->json) {
        struct json j;
        json_init(&j);
        json_object_begin(&j);
        json_tensor_head(&j, t->device, t->name, t->dtype, t->shape, t->ndim);
        json_key(&j, "values");
        if (file != NULL) {
            json_null(&j);
            json_key(&j, "file");
            json_string(&j, file);
            json_key(&j, "size_bytes");
            json_uint(&j, t->size_bytes);
        } else {
            json_array_begin(&j);
            for (size_t i = 0; i < n; i++) {
                json_value(&j, t, i);
            }
            json_array_end(&j);
        }
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
    } else if (file != NULL) {
        struct table tab;
        char shape[256], bytes[24];
        const char *row[5] = { t->device, t->name, dc_dtype_name(t->dtype), shape, bytes };

        fmt_shape(shape, sizeof(shape), t->shape, t->ndim);
        snprintf(bytes, sizeof(bytes), "%zu", t->size_bytes);
        table_init(&tab, 5, header);
        table_add(&tab, row);
        if ((rc = table_print(&tab)) == 0) {
            printf("\nwrote %zu bytes to %s\n", t->size_bytes, file);
        }
    } else {
        struct table tab;
        char shape[256], bytes[24], v[40];
        const char *row[5] = { t->device, t->name, dc_dtype_name(t->dtype), shape, bytes };
        /* One line per row of the last dimension. */
        size_t per_line = t->ndim > 0 && t->shape[t->ndim - 1] > 0 ? t->shape[t->ndim - 1] : 1;

        fmt_shape(shape, sizeof(shape), t->shape, t->ndim);
        snprintf(bytes, sizeof(bytes), "%zu", t->size_bytes);
        table_init(&tab, 5, header);
        table_add(&tab, row);
        if ((rc = table_print(&tab)) == 0) {
            fputc('\n', stdout);
            for (size_t i = 0; i < n; i++) {
                value_text(t, i, v, sizeof(v));
                fputs(v, stdout);
                fputc((i + 1) % per_line == 0 || i + 1 == n ? '\n' : ' ', stdout);
            }
        }
    }
    dc_tensor_free(t);
    return rc;
}

static int
cmd_tensor_list(const struct cli *cli, dc_client *c)
{
    static const char *const header[] = { "NAME", "DTYPE", "SHAPE", "BYTES" };
    dc_tensor_list *list              = NULL;
    dc_status st;
    int rc;

    if (dc_tensor_list_get(c, cli->args[0], &list, &st) != DC_OK) {
        return fail(&st);
    }
    if (cli->json) {
        struct json j;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "device");
        json_string(&j, list->n > 0 ? list->tensors[0].device : cli->args[0]);
        json_key(&j, "tensors");
        json_array_begin(&j);
        for (size_t i = 0; i < list->n; i++) {
            const dc_tensor *t = &list->tensors[i];
            json_object_begin(&j);
            json_tensor_head(&j, t->device, t->name, t->dtype, t->shape, t->ndim);
            json_key(&j, "size_bytes");
            json_uint(&j, t->size_bytes);
            json_object_end(&j);
        }
        json_array_end(&j);
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
    } else {
        struct table tab;
        table_init(&tab, 4, header);
        for (size_t i = 0; i < list->n; i++) {
            const dc_tensor *t = &list->tensors[i];
            char shape[256], bytes[24];
            const char *row[4] = { t->name, dc_dtype_name(t->dtype), shape, bytes };
            fmt_shape(shape, sizeof(shape), t->shape, t->ndim);
            snprintf(bytes, sizeof(bytes), "%zu", t->size_bytes);
            table_add(&tab, row);
        }
        rc = table_print(&tab);
    }
    dc_tensor_list_free(list);
    return rc;
}

static int
cmd_tensor_delete(const struct cli *cli, dc_client *c)
{
    dc_status st;

    if (dc_tensor_delete(c, cli->args[0], cli->args[1], &st) != DC_OK) {
        return fail(&st);
    }
    if (cli->json) {
        struct json j;
        int rc;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "device");
        json_string(&j, cli->args[0]);
        json_key(&j, "name");
        json_string(&j, cli->args[1]);
        json_key(&j, "status");
        json_string(&j, "OK");
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
        return rc;
    }
    printf("deleted %s on %s\n", cli->args[1], cli->args[0]);
    return 0;
}

static int
cmd_health(const struct cli *cli, dc_client *c)
{
    dc_status st;

    if (dc_health(c, &st) != DC_OK) {
        return fail(&st);
    }
    if (cli->json) {
        struct json j;
        int rc;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "status");
        json_string(&j, "OK");
        json_key(&j, "ready");
        json_bool(&j, true);
        json_object_end(&j);
        rc = json_print(&j);
        json_free(&j);
        return rc;
    }
    puts("ok");
    return 0;
}

/* ---- version ------------------------------------------------------------------------- */

/* The first `needle` inside line[0..len), or NULL. */
static const char *
find_in(const char *line, size_t len, const char *needle)
{
    size_t n = strlen(needle);

    for (size_t i = 0; i + n <= len; i++) {
        if (memcmp(line + i, needle, n) == 0) {
            return line + i;
        }
    }
    return NULL;
}

/* The coordinator's version in its /metrics text (devcoord_build_info{component=
 * "coordinator",version="0.3.0"} 1) into buf; false when it is not there. */
static bool
metrics_version(const char *metrics, char *buf, size_t cap)
{
    static const char series[] = "devcoord_build_info{";
    const char *line           = metrics;

    for (; line != NULL && *line != '\0';
         line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        const char *end = strchr(line, '\n'), *v;
        size_t len, n = 0;

        len = end != NULL ? (size_t)(end - line) : strlen(line);
        if (strncmp(line, series, sizeof(series) - 1) != 0 ||
            find_in(line, len, "component=\"coordinator\"") == NULL ||
            (v = find_in(line, len, "version=\"")) == NULL) {
            continue;
        }
        v += 9;
        while (v + n < line + len && v[n] != '"' && (unsigned char)v[n] >= 0x20 && n + 1 < cap) {
            n++;
        }
        if (n == 0 || v + n == line + len || v[n] != '"') {
            continue;
        }
        memcpy(buf, v, n);
        buf[n] = '\0';
        return true;
    }
    return false;
}

/*
 * version: the client's own, and the coordinator's. No RPC of the coordinator carries its
 * version (GetClusterStatus does not), so the server's comes from its /metrics when --http
 * names its HTTP address, and is "unknown" otherwise; whether the coordinator answers is
 * said either way.
 */
static int
cmd_version(const struct cli *cli, const dc_client_options *opts)
{
    char server_version[64] = "", source[320] = "", why[DC_STATUS_MESSAGE_MAX + 64] = "";
    uint32_t timeout = cli->timeout_ms != 0 ? cli->timeout_ms : DEFAULT_TIMEOUT_MS;
    bool reachable   = false;
    dc_client *c     = NULL;
    dc_cluster_status cs;
    dc_status st;
    int rc = 0;

    if (dc_client_open(cli->server, opts, &c, &st) != DC_OK && !st.transport) {
        return cli_usage_error("%s", st.message);
    }
    if (c != NULL && dc_cluster_status_get(c, &cs, &st) == DC_OK) {
        reachable = true;
    } else {
        snprintf(why, sizeof(why), "%s: %s", dc_status_name(st.code), st.message);
        rc = st.transport ? EXIT_UNREACHABLE : EXIT_REFUSED;
    }
    dc_client_close(c);
    if (cli->seen[O_HTTP]) {
        char *body = NULL, err[512];
        const char *hp =
            strncmp(cli->val[O_HTTP], "http://", 7) == 0 ? cli->val[O_HTTP] + 7 : cli->val[O_HTTP];
        snprintf(source, sizeof(source), "http://%s/metrics", hp);
        if (http_get(hp, "/metrics", timeout, (size_t)16 << 20, &body, err, sizeof(err)) != 0) {
            snprintf(why, sizeof(why), "%s", err);
        } else if (!metrics_version(body, server_version, sizeof(server_version))) {
            snprintf(why, sizeof(why), "%s names no coordinator version (devcoord_build_info)",
                     source);
        }
        free(body);
    } else if (reachable) {
        snprintf(why, sizeof(why),
                 "the coordinator's RPCs do not report it; --http HOST:PORT reads its /metrics");
    }
    if (cli->json) {
        struct json j;
        int jrc;
        json_init(&j);
        json_object_begin(&j);
        json_key(&j, "client");
        json_object_begin(&j);
        json_key(&j, "devcoordctl");
        json_string(&j, DEVCOORDCTL_VERSION);
        json_key(&j, "libdevcoord");
        json_string(&j, dc_version());
        json_object_end(&j);
        json_key(&j, "server");
        json_object_begin(&j);
        json_key(&j, "address");
        json_string(&j, cli->server);
        json_key(&j, "reachable");
        json_bool(&j, reachable);
        json_key(&j, "version");
        json_string(&j, server_version[0] != '\0' ? server_version : NULL);
        json_key(&j, "version_from");
        json_string(&j, server_version[0] != '\0' ? source : NULL);
        json_key(&j, "message");
        json_string(&j, why);
        json_object_end(&j);
        json_object_end(&j);
        jrc = json_print(&j);
        json_free(&j);
        rc = rc != 0 ? rc : jrc;
    } else {
        printf("client: devcoordctl %s, libdevcoord %s\n", DEVCOORDCTL_VERSION, dc_version());
        if (server_version[0] != '\0') {
            printf("server: %s (%s, from %s)\n", server_version, cli->server, source);
        } else {
            fputs("server: unknown (", stdout);
            print_sanitized(stdout, why);
            fputs(")\n", stdout);
        }
        if (!reachable) {
            printf("        %s does not answer\n", cli->server);
        }
    }
    return rc;
}

/* ---- groups ------------------------------------------------------------------------------ */

struct collective_args {
    dc_op_kind kind;
    dc_reduce_op reduce;
    uint32_t root;
    uint64_t repeat;
    struct put_args in; /* dtype, data, bytes */
    size_t count;
    bool with_values; /* --values (printed back), not --count */
};

static int
collective_prepare(const struct cli *cli, struct collective_args *a)
{
    uint64_t v;
    int rc;

    memset(a, 0, sizeof(*a));
    a->repeat = 1;
    if ((a->kind = dc_op_kind_from_name(cli->args[0])) == DC_OP_NONE) {
        return cli_usage_error("collective KIND: all-reduce, reduce, broadcast, all-gather, "
                               "reduce-scatter or barrier, not '%s'",
                               cli->args[0]);
    }
    if (!cli->seen[O_DEVICES] || !cli->seen[O_SELF]) {
        return cli_usage_error("collective needs --devices REF,... and --self REF");
    }
    if (cli->seen[O_REPEAT]) {
        if (!parse_u64(cli->val[O_REPEAT], 1000000, &v) || v == 0) {
            return cli_usage_error("--repeat wants a number from 1 to 1000000, not '%s'",
                                   cli->val[O_REPEAT]);
        }
        a->repeat = v;
    }
    if ((rc = parse_u32_opt(cli, O_ROOT, &a->root)) != 0) {
        return rc;
    }
    if (cli->seen[O_REDUCE] &&
        (a->reduce = dc_reduce_op_from_name(cli->val[O_REDUCE])) == DC_REDUCE_NONE) {
        return cli_usage_error("--reduce wants sum, mean, min, max or prod, not '%s'",
                               cli->val[O_REDUCE]);
    }
    if ((a->kind == DC_OP_ALL_REDUCE || a->kind == DC_OP_REDUCE ||
         a->kind == DC_OP_REDUCE_SCATTER) &&
        !cli->seen[O_REDUCE]) {
        return cli_usage_error("%s needs --reduce OP", cli->args[0]);
    }
    if (a->kind == DC_OP_BARRIER) {
        return 0;
    }
    if (!cli->seen[O_DTYPE] ||
        (a->in.dtype = dc_dtype_from_name(cli->val[O_DTYPE])) == DC_DTYPE_NONE) {
        return cli_usage_error("collective %s needs --dtype f32|f64|i32|i64", cli->args[0]);
    }
    if (cli->seen[O_VALUES] == cli->seen[O_ELEMENTS]) {
        return cli_usage_error("collective %s needs one of --values or --count", cli->args[0]);
    }
    if (cli->seen[O_VALUES]) {
        a->with_values = true;
        if ((rc = parse_values(cli->val[O_VALUES], &a->in, &a->count)) != 0 || a->count > 0) {
            return rc;
        }
        /* No values: as --count 0, which the group call refuses with its own message. */
        if ((a->in.data = calloc(1, 1)) == NULL) {
            return cli_usage_error("out of memory");
        }
        return 0;
    }
    if (!parse_u64(cli->val[O_ELEMENTS], (uint64_t)(SIZE_MAX / 8), &v)) {
        return cli_usage_error("--count wants a number, not '%s'", cli->val[O_ELEMENTS]);
    }
    a->count    = (size_t)v;
    a->in.bytes = a->count * dc_dtype_size(a->in.dtype);
    if ((a->in.data = calloc(1, a->in.bytes + 1)) == NULL) {
        return cli_usage_error("--count %s: too many elements", cli->val[O_ELEMENTS]);
    }
    return 0;
}

/* --count's values: every element is rank + 1. */
static void
fill_rank(void *buf, size_t count, dc_dtype dtype, uint32_t rank)
{
    double d    = (double)rank + 1;
    float f     = (float)d;
    int32_t i32 = (int32_t)rank + 1;
    int64_t i64 = (int64_t)rank + 1;

    for (size_t i = 0; i < count; i++) {
        unsigned char *slot = (unsigned char *)buf + i * dc_dtype_size(dtype);
        switch (dtype) {
        case DC_DTYPE_F32:
            memcpy(slot, &f, sizeof(f));
            break;
        case DC_DTYPE_F64:
            memcpy(slot, &d, sizeof(d));
            break;
        case DC_DTYPE_I32:
            memcpy(slot, &i32, sizeof(i32));
            break;
        default:
            memcpy(slot, &i64, sizeof(i64));
            break;
        }
    }
}

static int
compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : (x > y ? 1 : 0);
}

static double
mono_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One call of a's kind on g: in is the rank's input, out its result. */
static dc_code
collective_call(dc_group *g, const struct collective_args *a, const void *in, void *out,
                dc_status *st)
{
    switch (a->kind) {
    case DC_OP_ALL_REDUCE:
        memcpy(out, in, a->in.bytes);
        return dc_all_reduce(g, out, a->count, a->in.dtype, a->reduce, st);
    case DC_OP_REDUCE:
        memcpy(out, in, a->in.bytes);
        return dc_reduce(g, out, a->count, a->in.dtype, a->reduce, a->root, st);
    case DC_OP_BROADCAST:
        memcpy(out, in, a->in.bytes);
        return dc_broadcast(g, out, a->count, a->in.dtype, a->root, st);
    case DC_OP_ALL_GATHER:
        return dc_all_gather(g, in, out, a->count, a->in.dtype, st);
    case DC_OP_REDUCE_SCATTER:
        return dc_reduce_scatter(g, in, out, a->count / dc_group_size(g), a->in.dtype, a->reduce,
                                 st);
    default:
        return dc_barrier(g, st);
    }
}

static void
print_collective_json(const struct collective_args *a, const dc_group *g, const dc_status *st,
                      const void *out, size_t out_count, uint64_t calls, const double *secs,
                      bool timed)
{
    dc_tensor t = { .dtype = a->in.dtype, .data = (void *)out };
    struct json j;

    json_init(&j);
    json_object_begin(&j);
    json_key(&j, "group_id");
    json_string(&j, g != NULL ? dc_group_id(g) : "");
    json_key(&j, "generation");
    json_uint(&j, dc_group_generation(g));
    json_key(&j, "rank");
    json_uint(&j, dc_group_rank(g));
    json_key(&j, "size");
    json_uint(&j, dc_group_size(g));
    json_key(&j, "status");
    json_string(&j, dc_status_name(st->code));
    json_key(&j, "message");
    json_string(&j, st->message);
    json_key(&j, "kind");
    json_string(&j, dc_op_kind_name(a->kind));
    if (a->with_values) {
        json_key(&j, "values");
        if (st->code == DC_OK && out != NULL) {
            json_array_begin(&j);
            for (size_t i = 0; i < out_count; i++) {
                json_value(&j, &t, i);
            }
            json_array_end(&j);
        } else {
            json_null(&j);
        }
    }
    json_key(&j, "calls");
    json_uint(&j, calls);
    if (timed && calls > 0) {
        json_key(&j, "seconds");
        json_object_begin(&j);
        json_key(&j, "min");
        json_double(&j, secs[0]);
        json_key(&j, "median");
        json_double(&j, secs[calls / 2]);
        json_key(&j, "max");
        json_double(&j, secs[calls - 1]);
        json_object_end(&j);
    }
    json_object_end(&j);
    json_print(&j);
    json_free(&j);
}

static void
print_collective_text(const struct collective_args *a, const dc_group *g, const dc_status *st,
                      const void *out, size_t out_count, uint64_t calls, const double *secs,
                      bool timed)
{
    dc_tensor t = { .dtype = a->in.dtype, .data = (void *)out };
    char v[40];

    if (g == NULL) {
        return;
    }
    printf("group %s generation %llu: rank %u of %u (%s)\n", dc_group_id(g),
           (unsigned long long)dc_group_generation(g), dc_group_rank(g), dc_group_size(g),
           dc_group_device(g, dc_group_rank(g)));
    if (st->code != DC_OK) {
        return;
    }
    if (a->with_values && out != NULL) {
        printf("%s:", dc_op_kind_name(a->kind));
        for (size_t i = 0; i < out_count; i++) {
            value_text(&t, i, v, sizeof(v));
            printf(" %s", v);
        }
        fputc('\n', stdout);
    } else {
        printf("%s: %llu call%s ok\n", dc_op_kind_name(a->kind), (unsigned long long)calls,
               calls == 1 ? "" : "s");
    }
    if (timed && calls > 0) {
        char lo[24], mid[24], hi[24];
        human_elapsed_us(lo, sizeof(lo), (uint64_t)(secs[0] * 1e6));
        human_elapsed_us(mid, sizeof(mid), (uint64_t)(secs[calls / 2] * 1e6));
        human_elapsed_us(hi, sizeof(hi), (uint64_t)(secs[calls - 1] * 1e6));
        printf("%llu calls: min %s, median %s, max %s\n", (unsigned long long)calls, lo, mid, hi);
    }
}

static int
cmd_collective(const struct cli *cli, dc_client *c, struct collective_args *a)
{
    dc_group_options go = { .timeout_ms = cli->timeout_ms, .call_timeout_ms = cli->timeout_ms };
    dc_group *g         = NULL;
    double *secs        = NULL;
    void *out           = NULL;
    size_t out_count    = a->count;
    uint64_t calls      = 0;
    dc_status st, leave_st;
    int rc = 0;

    memset(&st, 0, sizeof(st));
    if (dc_group_join(c, cli->val[O_DEVICES], cli->val[O_SELF], &go, &g, &st) != DC_OK) {
        goto out;
    }
    if (a->kind == DC_OP_ALL_GATHER) {
        out_count = a->count * dc_group_size(g);
    } else if (a->kind == DC_OP_REDUCE_SCATTER) {
        /* The rank's input is one block per rank; it gets its own block back. */
        out_count = a->count / dc_group_size(g);
        if (a->count % dc_group_size(g) != 0) {
            st.code = DC_INVALID_ARGUMENT;
            snprintf(st.message, sizeof(st.message),
                     "invalid operation: reduce-scatter of %zu elements: not a multiple of the "
                     "%u ranks",
                     a->count, dc_group_size(g));
            goto out;
        }
    }
    if (!a->with_values && a->in.data != NULL) {
        fill_rank(a->in.data, a->count, a->in.dtype, dc_group_rank(g));
    }
    if ((secs = calloc(a->repeat, sizeof(*secs))) == NULL ||
        (out = calloc(1, out_count * dc_dtype_size(a->in.dtype) + 1)) == NULL) {
        st.code = DC_RESOURCE_EXHAUSTED;
        snprintf(st.message, sizeof(st.message), "out of memory");
        goto out;
    }
    for (; calls < a->repeat; calls++) {
        double t0 = mono_seconds();
        if (collective_call(g, a, a->in.data, out, &st) != DC_OK) {
            break;
        }
        secs[calls] = mono_seconds() - t0;
    }
    if (calls > 1) {
        qsort(secs, calls, sizeof(*secs), compare_double);
    }
out:
    if (cli->json) {
        print_collective_json(a, g, &st, out, out_count, calls, secs, cli->seen[O_REPEAT]);
    } else {
        print_collective_text(a, g, &st, out, out_count, calls, secs, cli->seen[O_REPEAT]);
    }
    if (st.code != DC_OK) {
        rc = fail(&st);
    }
    if (g != NULL && dc_group_leave(g, &leave_st) != DC_OK && rc == 0) {
        rc = fail(&leave_st);
    }
    free(secs);
    free(out);
    return rc;
}

static void
json_group(struct json *j, const dc_group_info *gi)
{
    json_object_begin(j);
    json_key(j, "group_id");
    json_string(j, gi->group_id);
    json_key(j, "devices");
    json_array_begin(j);
    for (size_t d = 0; d < gi->n_devices; d++) {
        json_string(j, gi->devices[d]);
    }
    json_array_end(j);
    json_key(j, "generation");
    json_uint(j, gi->generation);
    json_key(j, "joined");
    json_uint(j, gi->joined);
    json_key(j, "joining");
    json_uint(j, gi->joining);
    json_key(j, "calls");
    json_uint(j, gi->calls);
    json_key(j, "stalled");
    json_array_begin(j);
    for (size_t i = 0; i < gi->n_stalled; i++) {
        json_object_begin(j);
        json_key(j, "rank");
        json_uint(j, gi->stalled[i].rank);
        json_key(j, "device");
        json_string(j, gi->stalled[i].device);
        json_key(j, "waiting_ms");
        json_uint(j, gi->stalled[i].waiting_ms);
        json_object_end(j);
    }
    json_array_end(j);
    json_object_end(j);
}

static int
print_groups_table(const dc_group_list *l, bool show)
{
    static const char *const header[]  = { "GROUP_ID", "GENERATION", "JOINED", "JOINING",
                                           "CALLS",    "STALLED",    "DEVICES" };
    static const char *const rheader[] = { "RANK", "DEVICE", "STALLED" };
    struct table t;
    int rc;

    table_init(&t, 7, header);
    for (size_t i = 0; i < l->n; i++) {
        const dc_group_info *gi = &l->groups[i];
        char gen[24], joined[48], joining[24], calls[24], stalled[24], devs[1024];
        const char *row[7] = { gi->group_id, gen, joined, joining, calls, stalled, devs };
        size_t n           = 0;
        snprintf(gen, sizeof(gen), "%llu", (unsigned long long)gi->generation);
        snprintf(calls, sizeof(calls), "%llu", (unsigned long long)gi->calls);
        snprintf(stalled, sizeof(stalled), "%zu", gi->n_stalled);
        snprintf(joined, sizeof(joined), "%u/%zu", gi->joined, gi->n_devices);
        snprintf(joining, sizeof(joining), "%u", gi->joining);
        devs[0] = '\0';
        for (size_t d = 0; d < gi->n_devices && n < sizeof(devs); d++) {
            n += (size_t)snprintf(devs + n, sizeof(devs) - n, "%s%s", d ? "," : "", gi->devices[d]);
        }
        table_add(&t, row);
    }
    if ((rc = table_print(&t)) != 0 || !show || l->n == 0) {
        return rc;
    }
    fputc('\n', stdout);
    table_init(&t, 3, rheader);
    for (size_t d = 0; d < l->groups[0].n_devices; d++) {
        char r[24], waiting[32] = "-";
        const char *row[3] = { r, l->groups[0].devices[d], waiting };
        snprintf(r, sizeof(r), "%zu", d);
        for (size_t k = 0; k < l->groups[0].n_stalled; k++) {
            if (l->groups[0].stalled[k].rank == d) {
                human_elapsed_us(waiting, sizeof(waiting),
                                 l->groups[0].stalled[k].waiting_ms * 1000);
            }
        }
        table_add(&t, row);
    }
    return table_print(&t);
}

static int
cmd_groups(const struct cli *cli, dc_client *c)
{
    bool show        = cli->cmd->id == CMD_GROUPS_SHOW;
    dc_group_list *l = NULL;
    dc_status st;
    int rc;

    if (dc_list_groups(c, show ? cli->args[0] : NULL, &l, &st) != DC_OK) {
        return fail(&st);
    }
    if (cli->json) {
        struct json j;
        json_init(&j);
        if (show && l->n > 0) {
            json_group(&j, &l->groups[0]);
        } else {
            json_object_begin(&j);
            json_key(&j, "groups");
            json_array_begin(&j);
            for (size_t i = 0; i < l->n; i++) {
                json_group(&j, &l->groups[i]);
            }
            json_array_end(&j);
            json_object_end(&j);
        }
        rc = json_print(&j);
        json_free(&j);
    } else {
        rc = print_groups_table(l, show);
    }
    dc_group_list_free(l);
    return rc;
}

/* ---- main ---------------------------------------------------------------------------- */

static int
run(struct cli *cli)
{
    dc_client_options opts = { .token_file = cli->val[O_TOKEN_FILE],
                               .timeout_ms = cli->timeout_ms,
                               .fail_fast  = true,
                               .tls_ca     = cli->val[O_TLS_CA] != NULL
                                                 ? cli->val[O_TLS_CA]
                                                 : env_or_null("DEVCOORD_TLS_CA"),
                               .tls_cert   = cli->val[O_TLS_CERT],
                               .tls_key    = cli->val[O_TLS_KEY] };
    struct devices_args dev_args;
    struct op_args op_args           = { 0 };
    struct put_args put_args         = { 0 };
    struct collective_args coll_args = { 0 };
    dc_client *c                     = NULL;
    uint32_t interval;
    dc_status st;
    int rc = 0;

    /* Everything that needs no server is checked first. */
    switch (cli->cmd->id) {
    case CMD_WORKERS_LIST:
        if (cli->seen[O_WATCH_INTERVAL] &&
            (!cli->seen[O_WATCH] || !human_parse_duration(cli->val[O_WATCH_INTERVAL], &interval))) {
            rc = cli_usage_error(
                cli->seen[O_WATCH] ? "--watch-interval wants a duration like 500ms or 2s, not '%s'"
                                   : "--watch-interval '%s' needs --watch",
                cli->val[O_WATCH_INTERVAL]);
        }
        break;
    case CMD_WORKERS_DRAIN:
        break;
    case CMD_DEVICES_LIST:
        rc = devices_prepare(cli, &dev_args);
        break;
    case CMD_PLAN:
    case CMD_SUBMIT:
        rc = op_prepare(cli, &op_args);
        break;
    case CMD_TENSOR_PUT:
        if ((rc = tensor_prepare(cli)) == 0) {
            rc = put_prepare(cli, &put_args);
        }
        break;
    case CMD_TENSOR_GET:
    case CMD_TENSOR_LIST:
    case CMD_TENSOR_DELETE:
        rc = tensor_prepare(cli);
        break;
    case CMD_COLLECTIVE:
        rc = collective_prepare(cli, &coll_args);
        break;
    case CMD_COMPLETION:
        if (strcmp(cli->args[0], "bash") != 0) {
            rc = cli_usage_error("completion for '%s': only bash is supported", cli->args[0]);
        } else {
            cli_print_completion_bash();
        }
        goto out;
    case CMD_VERSION:
        rc = cmd_version(cli, &opts);
        goto out;
    default:
        break;
    }
    if (rc != 0) {
        goto out;
    }
    if (dc_client_open(cli->server, &opts, &c, &st) != DC_OK) {
        /* No answer is "cannot reach"; anything else (the address, a token or TLS file)
         * is the command line's. */
        if (is_connection_failure(&st)) {
            print_error(&st);
            rc = EXIT_UNREACHABLE;
        } else {
            rc = cli_usage_error("%s", st.message);
        }
        goto out;
    }
    switch (cli->cmd->id) {
    case CMD_STATUS:
        rc = cmd_status(cli, c);
        break;
    case CMD_WORKERS_LIST:
        rc = cmd_workers_list(cli, c);
        break;
    case CMD_WORKERS_SHOW:
        rc = cmd_workers_show(cli, c);
        break;
    case CMD_WORKERS_CORDON:
    case CMD_WORKERS_UNCORDON:
    case CMD_WORKERS_DRAIN:
        rc = cmd_workers_steer(cli, c);
        break;
    case CMD_DEVICES_LIST:
        rc = cmd_devices_list(cli, c, &dev_args);
        break;
    case CMD_OPS_LIST:
        rc = cmd_ops_list(cli, c);
        break;
    case CMD_OPS_SHOW:
        rc = cmd_ops_show(cli, c);
        break;
    case CMD_PLAN:
    case CMD_SUBMIT:
        rc = cmd_op(cli, c, &op_args);
        break;
    case CMD_TENSOR_PUT:
        rc = cmd_tensor_put(cli, c, &put_args);
        break;
    case CMD_TENSOR_GET:
        rc = cmd_tensor_get(cli, c);
        break;
    case CMD_TENSOR_LIST:
        rc = cmd_tensor_list(cli, c);
        break;
    case CMD_TENSOR_DELETE:
        rc = cmd_tensor_delete(cli, c);
        break;
    case CMD_COLLECTIVE:
        rc = cmd_collective(cli, c, &coll_args);
        break;
    case CMD_GROUPS_LIST:
    case CMD_GROUPS_SHOW:
        rc = cmd_groups(cli, c);
        break;
    case CMD_HEALTH:
        rc = cmd_health(cli, c);
        break;
    case CMD_VERSION:
    case CMD_COMPLETION:
        break;
    }
out:
    dc_client_close(c);
    free(op_args.devices);
    free(put_args.data);
    free(coll_args.in.data);
    return rc;
}

int
main(int argc, char **argv)
{
    struct cli cli = { 0 };
    int rc;

    if ((rc = cli_parse(&cli, argc, argv)) == CLI_RUN) {
        rc = run(&cli);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fputs("devcoordctl: cannot write the output\n", stderr);
        return rc != 0 ? rc : EXIT_REFUSED;
    }
    return rc;
}
