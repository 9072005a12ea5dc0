/*
 * Load driver of the integration tests (tests/integration/test_faults.py): many trainer
 * threads, each doing rounds of data-plane and registry calls through libdevcoord's public
 * API and checking every answer, then one JSON summary on stdout for the test to assert on.
 *
 * A round of client i: put a known i64 tensor "load-<i>" on device cuda:<i mod K> of every
 * worker, all-reduce it (sum, max or min in turn) over those devices, read it back from
 * every worker and compare with the values computed here, then one registry query
 * (ListDevices, GetClusterStatus, ListWorkers or GetOp of the op just run) checked against
 * the cluster the test started. Clients whose ids differ modulo K use disjoint devices, so
 * their ops run concurrently; the others queue behind each other (design §5).
 *
 * Even-numbered threads share one dc_client; odd ones open their own. Exit status 0 when
 * every call was answered and every answer was right, 1 otherwise, 2 on a usage error.
 *
 *   devcoord-load-driver --address tcp://127.0.0.1:7400 --workers node-a,node-b
 *                        --devices-per-worker 8 [--clients 64] [--ops 500]
 *                        [--token-file F] [--tls-ca F]
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <devcoord/devcoord.h>

#define MAX_WORKERS 16
#define TENSOR_LEN  4
#define MAX_REPORTS 20

enum call_kind {
    CALL_PUT,
    CALL_GET,
    CALL_SUBMIT,
    CALL_LIST_DEVICES,
    CALL_STATUS,
    CALL_LIST_WORKERS,
    CALL_GET_OP,
    CALL_COUNT
};

static const char *const call_names[CALL_COUNT] = {
    [CALL_PUT]          = "put",
    [CALL_GET]          = "get",
    [CALL_SUBMIT]       = "submit",
    [CALL_LIST_DEVICES] = "list_devices",
    [CALL_STATUS]       = "cluster_status",
    [CALL_LIST_WORKERS] = "list_workers",
    [CALL_GET_OP]       = "get_op",
};

struct config {
    const char *address;
    const char *token_file;
    const char *tls_ca;
    char *worker_names[MAX_WORKERS];
    size_t n_workers;
    unsigned devices_per_worker;
    unsigned clients;
    unsigned ops;
};

/* What every thread adds to; reports keep the first MAX_REPORTS problems of each sort. */
struct totals {
    pthread_mutex_t lock;
    uint64_t calls[CALL_COUNT];
    uint64_t failed_calls; /* no answer or an error code */
    uint64_t wrong;        /* answered OK, but not what this client knows to be right */
    unsigned clients_done;
    size_t n_errors, n_wrong;
    char errors[MAX_REPORTS][512];
    char wrongs[MAX_REPORTS][512];
};

struct client {
    unsigned id;
    const struct config *cfg;
    dc_client *c;
    struct totals *totals;
    uint64_t calls[CALL_COUNT];
    uint64_t failed_calls, wrong;
};

static void
report(struct client *cl, bool wrong, const char *fmt, ...)
{
    struct totals *t = cl->totals;
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "client %u: ", cl->id);
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&t->lock);
    if (wrong && t->n_wrong < MAX_REPORTS) {
        memcpy(t->wrongs[t->n_wrong++], buf, sizeof(buf));
    } else if (!wrong && t->n_errors < MAX_REPORTS) {
        memcpy(t->errors[t->n_errors++], buf, sizeof(buf));
    }
    pthread_mutex_unlock(&t->lock);
    if (wrong) {
        cl->wrong++;
    } else {
        cl->failed_calls++;
    }
}

/* Counts a call; false (and a report) when it did not come back OK. */
static bool
call_ok(struct client *cl, enum call_kind kind, dc_code code, const dc_status *st)
{
    cl->calls[kind]++;
    if (code == DC_OK) {
        return true;
    }
    report(cl, false, "%s: %s%s: %s", call_names[kind], dc_status_name(code),
           st->transport ? " (no answer)" : "", st->message);
    return false;
}

static int64_t
value_of(unsigned client, unsigned round, size_t worker, size_t elem)
{
    /* Distinct per client, round, worker and element; small enough that sums stay exact. */
    return (int64_t)client * 1000003 + (int64_t)round * 101 + (int64_t)worker * 17 +
           (int64_t)elem * ((round % 2) ? -3 : 5);
}

static dc_reduce_op
reduce_of(unsigned round)
{
    static const dc_reduce_op ops[] = { DC_REDUCE_SUM, DC_REDUCE_MAX, DC_REDUCE_MIN };
    return ops[round % 3];
}

static int64_t
expected_of(unsigned client, unsigned round, size_t n_workers, size_t elem)
{
    int64_t acc = value_of(client, round, 0, elem);

    for (size_t w = 1; w < n_workers; w++) {
        int64_t v = value_of(client, round, w, elem);
        switch (reduce_of(round)) {
        case DC_REDUCE_SUM:
            acc += v;
            break;
        case DC_REDUCE_MAX:
            acc = v > acc ? v : acc;
            break;
        default:
            acc = v < acc ? v : acc;
            break;
        }
    }
    return acc;
}

/* The registry as the test set it up: every worker alive, every device healthy cuda. */
static void
check_registry(struct client *cl, unsigned round, const char *op_id)
{
    const struct config *cfg = cl->cfg;
    const size_t n_devices   = cfg->n_workers * cfg->devices_per_worker;
    dc_status st;

    switch (round % 4) {
    case 0: {
        dc_device_list *list = NULL;
        dc_code code         = dc_list_devices(cl->c, NULL, &list, &st);
        if (call_ok(cl, CALL_LIST_DEVICES, code, &st)) {
            size_t healthy = 0;
            for (size_t i = 0; i < list->n; i++) {
                healthy += list->devices[i].state == DC_DEVICE_HEALTHY &&
                           list->devices[i].device.backend == DC_BACKEND_CUDA;
            }
            if (list->n != n_devices || healthy != n_devices) {
                report(cl, true, "ListDevices: %zu devices, %zu healthy cuda; expected %zu",
                       list->n, healthy, n_devices);
            }
        }
        dc_device_list_free(list);
        break;
    }
    case 1: {
        dc_cluster_status cs;
        dc_code code = dc_cluster_status_get(cl->c, &cs, &st);
        if (call_ok(cl, CALL_STATUS, code, &st) &&
            (cs.workers_alive != cfg->n_workers || cs.workers_dead != 0 || !cs.ready ||
             cs.devices_by_backend[DC_BACKEND_CUDA] != n_devices)) {
            report(cl, true, "GetClusterStatus: %u alive, %u dead, ready %d, %u cuda devices",
                   cs.workers_alive, cs.workers_dead, (int)cs.ready,
                   cs.devices_by_backend[DC_BACKEND_CUDA]);
        }
        break;
    }
    case 2: {
        dc_worker_list *list = NULL;
        dc_code code         = dc_list_workers(cl->c, &list, &st);
        if (call_ok(cl, CALL_LIST_WORKERS, code, &st)) {
            size_t alive = 0;
            for (size_t i = 0; i < list->n; i++) {
                alive += list->workers[i].state == DC_WORKER_ALIVE;
            }
            if (list->n != cfg->n_workers || alive != cfg->n_workers) {
                report(cl, true, "ListWorkers: %zu workers, %zu alive; expected %zu", list->n,
                       alive, cfg->n_workers);
            }
        }
        dc_worker_list_free(list);
        break;
    }
    default: {
        dc_op_result *r = NULL;
        dc_code code    = dc_get_op(cl->c, op_id, &r, &st);
        if (call_ok(cl, CALL_GET_OP, code, &st) &&
            (strcmp(r->op_id, op_id) != 0 || r->state != DC_OP_STATE_DONE ||
             r->status.code != DC_OK || r->n_devices != cfg->n_workers)) {
            report(cl, true, "GetOp %s: got %s, state %s, %s, %zu devices", op_id, r->op_id,
                   dc_op_state_name(r->state), dc_status_name(r->status.code), r->n_devices);
        }
        dc_op_result_free(r);
        break;
    }
    }
}

/* One round; the number of calls it made. */
static unsigned
client_round(struct client *cl, unsigned round)
{
    const struct config *cfg = cl->cfg;
    const uint64_t shape[1]  = { TENSOR_LEN };
    const unsigned index     = cl->id % cfg->devices_per_worker;
    dc_device_ref refs[MAX_WORKERS];
    char devices[MAX_WORKERS][DC_DEVICE_TEXT_SIZE];
    char name[32], op_id[40] = "";
    unsigned calls = 0;
    bool put_ok    = true;
    dc_status st;

    snprintf(name, sizeof(name), "load-%u", cl->id);
    for (size_t w = 0; w < cfg->n_workers; w++) {
        int64_t v[TENSOR_LEN];
        snprintf(devices[w], sizeof(devices[w]), "%s/cuda:%u", cfg->worker_names[w], index);
        memset(&refs[w], 0, sizeof(refs[w]));
        snprintf(refs[w].worker, sizeof(refs[w].worker), "%s", cfg->worker_names[w]);
        refs[w].device.backend = DC_BACKEND_CUDA;
        refs[w].device.index   = index;
        for (size_t e = 0; e < TENSOR_LEN; e++) {
            v[e] = value_of(cl->id, round, w, e);
        }
        calls++;
        put_ok &= call_ok(
            cl, CALL_PUT,
            dc_tensor_put(cl->c, devices[w], name, DC_DTYPE_I64, shape, 1, v, sizeof(v), &st), &st);
    }
    if (!put_ok) {
        return calls;
    }

    {
        dc_op_request req = { .kind      = DC_OP_ALL_REDUCE,
                              .reduce    = reduce_of(round),
                              .devices   = refs,
                              .n_devices = cfg->n_workers,
                              .tensor    = name };
        dc_op_result *r   = NULL;
        dc_code code      = dc_submit(cl->c, &req, &r, &st);
        bool ok           = call_ok(cl, CALL_SUBMIT, code, &st);
        calls++;
        if (ok && (r == NULL || r->status.code != DC_OK || r->n_results != cfg->n_workers)) {
            report(cl, true, "SubmitOp answered OK but the result says %s with %zu results",
                   r ? dc_status_name(r->status.code) : "nothing", r ? r->n_results : 0);
            ok = false;
        }
        if (ok) {
            snprintf(op_id, sizeof(op_id), "%s", r->op_id);
        }
        dc_op_result_free(r);
        if (!ok) {
            return calls;
        }
    }

    for (size_t w = 0; w < cfg->n_workers; w++) {
        dc_tensor *t = NULL;
        calls++;
        if (!call_ok(cl, CALL_GET, dc_tensor_get(cl->c, devices[w], name, &t, &st), &st)) {
            continue;
        }
        if (t->dtype != DC_DTYPE_I64 || t->ndim != 1 || t->shape[0] != TENSOR_LEN ||
            t->size_bytes != sizeof(int64_t) * TENSOR_LEN) {
            report(cl, true, "GetTensor %s %s: dtype %d, %zu dims, %zu bytes", devices[w], name,
                   (int)t->dtype, t->ndim, t->size_bytes);
        } else {
            const int64_t *got = t->data;
            for (size_t e = 0; e < TENSOR_LEN; e++) {
                int64_t want = expected_of(cl->id, round, cfg->n_workers, e);
                if (got[e] != want) {
                    report(cl, true,
                           "round %u (%s, op %s): %s %s[%zu] = %" PRId64 ", expected %" PRId64,
                           round, dc_reduce_op_name(reduce_of(round)), op_id, devices[w], name, e,
                           got[e], want);
                    break;
                }
            }
        }
        dc_tensor_free(t);
    }

    calls++;
    check_registry(cl, round, op_id);
    return calls;
}

static void *
client_main(void *arg)
{
    struct client *cl = arg;
    unsigned done     = 0;

    for (unsigned round = 0; done < cl->cfg->ops; round++) {
        done += client_round(cl, round);
    }
    pthread_mutex_lock(&cl->totals->lock);
    for (int k = 0; k < CALL_COUNT; k++) {
        cl->totals->calls[k] += cl->calls[k];
    }
    cl->totals->failed_calls += cl->failed_calls;
    cl->totals->wrong += cl->wrong;
    cl->totals->clients_done++;
    pthread_mutex_unlock(&cl->totals->lock);
    return NULL;
}

static bool
parse_uint(const char *text, unsigned min, unsigned max, unsigned *out)
{
    char *end;
    unsigned long v;

    errno = 0;
    v     = strtoul(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || v < min || v > max) {
        return false;
    }
    *out = (unsigned)v;
    return true;
}

/* Splits "a,b,c" into cfg->worker_names (pointers into the copy it keeps). */
static bool
parse_workers(char *text, struct config *cfg)
{
    char *save = NULL;

    for (char *tok = strtok_r(text, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (cfg->n_workers == MAX_WORKERS || tok[0] == '\0') {
            return false;
        }
        cfg->worker_names[cfg->n_workers++] = tok;
    }
    return cfg->n_workers > 0;
}

static int
usage(void)
{
    fprintf(stderr, "usage: devcoord-load-driver --address ADDR --workers A,B,... "
                    "--devices-per-worker K [--clients N] [--ops N] [--token-file F] "
                    "[--tls-ca F]\n");
    return 2;
}

static void
json_string(const char *s)
{
    putchar('"');
    for (; *s != '\0'; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            printf("\\%c", ch);
        } else if (ch < 0x20) {
            printf("\\u%04x", ch);
        } else {
            putchar(ch);
        }
    }
    putchar('"');
}

static void
json_strings(const char *key, char (*items)[512], size_t n)
{
    printf(", \"%s\": [", key);
    for (size_t i = 0; i < n; i++) {
        if (i > 0) {
            printf(", ");
        }
        json_string(items[i]);
    }
    printf("]");
}

int
main(int argc, char **argv)
{
    struct config cfg      = { .clients = 64, .ops = 500 };
    struct totals *totals  = NULL;
    struct client *clients = NULL;
    pthread_t *threads     = NULL;
    dc_client *shared      = NULL;
    char *workers_text     = NULL;
    unsigned started       = 0;
    uint64_t total_calls   = 0;
    struct timespec t0, t1;
    dc_status st;
    int rc = 1;

    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (val == NULL) {
            return usage();
        }
        i++;
        if (strcmp(opt, "--address") == 0) {
            cfg.address = val;
        } else if (strcmp(opt, "--token-file") == 0) {
            cfg.token_file = val;
        } else if (strcmp(opt, "--tls-ca") == 0) {
            cfg.tls_ca = val;
        } else if (strcmp(opt, "--workers") == 0) {
            free(workers_text);
            if ((workers_text = strdup(val)) == NULL || !parse_workers(workers_text, &cfg)) {
                free(workers_text);
                return usage();
            }
        } else if (strcmp(opt, "--devices-per-worker") == 0) {
            if (!parse_uint(val, 1, 1024, &cfg.devices_per_worker)) {
                free(workers_text);
                return usage();
            }
        } else if (strcmp(opt, "--clients") == 0) {
            if (!parse_uint(val, 1, 4096, &cfg.clients)) {
                free(workers_text);
                return usage();
            }
        } else if (strcmp(opt, "--ops") == 0) {
            if (!parse_uint(val, 1, 10000000, &cfg.ops)) {
                free(workers_text);
                return usage();
            }
        } else {
            free(workers_text);
            return usage();
        }
    }
    if (cfg.address == NULL || cfg.n_workers == 0 || cfg.devices_per_worker == 0) {
        free(workers_text);
        return usage();
    }

    if ((totals = calloc(1, sizeof(*totals))) == NULL) {
        fprintf(stderr, "devcoord-load-driver: out of memory\n");
        free(workers_text);
        return 1;
    }
    pthread_mutex_init(&totals->lock, NULL);
    if ((clients = calloc(cfg.clients, sizeof(*clients))) == NULL ||
        (threads = calloc(cfg.clients, sizeof(*threads))) == NULL) {
        fprintf(stderr, "devcoord-load-driver: out of memory\n");
        goto out;
    }

    {
        dc_client_options opts = { .token_file = cfg.token_file,
                                   .tls_ca     = cfg.tls_ca,
                                   .fail_fast  = true };
        if (dc_client_open(cfg.address, &opts, &shared, &st) != DC_OK) {
            fprintf(stderr, "devcoord-load-driver: %s: %s: %s\n", cfg.address,
                    dc_status_name(st.code), st.message);
            goto out;
        }
        for (unsigned i = 0; i < cfg.clients; i++) {
            clients[i].id     = i;
            clients[i].cfg    = &cfg;
            clients[i].totals = totals;
            clients[i].c      = shared;
            if (i % 2 == 1 && dc_client_open(cfg.address, &opts, &clients[i].c, &st) != DC_OK) {
                fprintf(stderr, "devcoord-load-driver: client %u: %s: %s\n", i,
                        dc_status_name(st.code), st.message);
                clients[i].c = NULL;
                goto out;
            }
        }
    }

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (; started < cfg.clients; started++) {
        if (pthread_create(&threads[started], NULL, client_main, &clients[started]) != 0) {
            fprintf(stderr, "devcoord-load-driver: cannot start thread %u\n", started);
            break;
        }
    }
    for (unsigned i = 0; i < started; i++) {
        pthread_join(threads[i], NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);

    for (int k = 0; k < CALL_COUNT; k++) {
        total_calls += totals->calls[k];
    }
    printf("{\"clients\": %u, \"clients_done\": %u, \"ops_per_client\": %u, \"shared_client\": "
           "%u, \"calls\": %" PRIu64 ", \"failed_calls\": %" PRIu64 ", \"wrong\": %" PRIu64
           ", \"elapsed_s\": %.3f, \"by_kind\": {",
           cfg.clients, totals->clients_done, cfg.ops, (cfg.clients + 1) / 2, total_calls,
           totals->failed_calls, totals->wrong,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    for (int k = 0; k < CALL_COUNT; k++) {
        printf("%s\"%s\": %" PRIu64, k > 0 ? ", " : "", call_names[k], totals->calls[k]);
    }
    printf("}");
    json_strings("errors", totals->errors, totals->n_errors);
    json_strings("wrong_results", totals->wrongs, totals->n_wrong);
    printf("}\n");
    rc = (started == cfg.clients && totals->clients_done == cfg.clients &&
          totals->failed_calls == 0 && totals->wrong == 0)
             ? 0
             : 1;
out:
    if (clients != NULL) {
        for (unsigned i = 1; i < cfg.clients; i += 2) {
            dc_client_close(clients[i].c);
        }
    }
    dc_client_close(shared);
    pthread_mutex_destroy(&totals->lock);
    free(threads);
    free(clients);
    free(totals);
    free(workers_text);
    return rc;
}
