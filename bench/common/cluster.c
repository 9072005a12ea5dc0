#include "cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define START_TIMEOUT_MS 15000

static void
log_path(const struct cluster *c, const char *who, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s-%s.log", bench_tmpdir(), c->tag, who);
}

int
cluster_start(struct cluster *c, const struct bench_args *args, const char *tag,
              const struct cluster_opts *opts)
{
    char server[1024], config[1024], log[1024], yaml[2048];
    char *argv[8];
    dc_client_options co = { .fail_fast = false, .timeout_ms = 60000 };
    uint64_t end;
    dc_status st;
    int port;

    memset(c, 0, sizeof(*c));
    c->args = args;
    snprintf(c->tag, sizeof(c->tag), "%s", tag);
    if ((port = bench_free_port()) == 0) {
        fprintf(stderr, "bench: no free port\n");
        return -1;
    }
    snprintf(c->address, sizeof(c->address), "tcp://127.0.0.1:%d", port);
    snprintf(yaml, sizeof(yaml), "listen: %s\nheartbeat: {interval_ms: %u, dead_after_ms: %u}\n%s",
             c->address,
             opts != NULL && opts->heartbeat_interval_ms ? opts->heartbeat_interval_ms : 1000,
             opts != NULL && opts->dead_after_ms ? opts->dead_after_ms : 5000,
             opts != NULL && opts->extra_yaml != NULL ? opts->extra_yaml : "");
    snprintf(config, sizeof(config), "%s/%s-coordinator.yaml", bench_tmpdir(), tag);
    if (bench_write_file(config, yaml) != 0) {
        fprintf(stderr, "bench: cannot write %s\n", config);
        return -1;
    }
    bench_binary(args, "server/coordinator/devcoord-server", server, sizeof(server));
    log_path(c, "coordinator", log, sizeof(log));
    argv[0] = server;
    argv[1] = "--config";
    argv[2] = config;
    argv[3] = "--http";
    argv[4] = "";
    argv[5] = NULL;
    if ((c->coordinator = bench_spawn(argv, log)) < 0) {
        return -1;
    }
    if (dc_client_open(c->address, &co, &c->client, &st) != DC_OK) {
        fprintf(stderr, "bench: client: %s\n", st.message);
        cluster_stop(c);
        return -1;
    }
    end = bench_now_ns() + (uint64_t)START_TIMEOUT_MS * 1000000u;
    while (dc_health(c->client, &st) != DC_OK) {
        if (bench_now_ns() > end || bench_wait(c->coordinator, 0) >= 0) {
            bench_keep_tmpdir();
            fprintf(stderr, "bench: coordinator did not come up (%s); log: %s\n", st.message, log);
            c->coordinator = 0;
            cluster_stop(c);
            return -1;
        }
        bench_sleep_ms(20);
    }
    return 0;
}

/* Number of the named workers that the registry lists alive; with `tell`, those it does not
 * are named on stderr. */
static size_t
alive_count(struct cluster *c, size_t first, size_t n, bool tell)
{
    dc_worker_list *list = NULL;
    size_t alive         = 0;
    dc_status st;

    if (dc_list_workers(c->client, &list, &st) != DC_OK) {
        if (tell) {
            fprintf(stderr, "bench: cannot list the workers: %s\n", st.message);
        }
        return 0;
    }
    for (size_t k = first; k < first + n; k++) {
        bool up = false;
        for (size_t i = 0; i < list->n && !up; i++) {
            up = strcmp(list->workers[i].name, c->worker_names[k]) == 0 &&
                 list->workers[i].state == DC_WORKER_ALIVE;
        }
        alive += up;
        if (!up && tell) {
            char log[1024];
            log_path(c, c->worker_names[k], log, sizeof(log));
            fprintf(stderr, "bench: worker %s is not alive; log: %s\n", c->worker_names[k], log);
        }
    }
    dc_worker_list_free(list);
    return alive;
}

/* Starts worker c->n_workers, from a config with n_devices cpu devices when n_devices > 1,
 * else with the worker's default (one cpu:0). */
static int
spawn_worker(struct cluster *c, unsigned n_devices)
{
    char worker[1024], log[1024], listen[64], http[64], config[1024], yaml[1024];
    size_t i = c->n_workers;
    char *argv[14];
    int port, http_port, argc = 0;

    if (i >= CLUSTER_MAX_WORKERS) {
        fprintf(stderr, "bench: at most %d workers\n", CLUSTER_MAX_WORKERS);
        return -1;
    }
    if ((port = bench_free_port()) == 0 || (http_port = bench_free_port()) == 0) {
        return -1;
    }
    bench_binary(c->args, "server/worker/devcoord-worker", worker, sizeof(worker));
    snprintf(http, sizeof(http), "127.0.0.1:%d", http_port);
    snprintf(c->worker_names[i], sizeof(c->worker_names[i]), "w%zu", i);
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", port);
    log_path(c, c->worker_names[i], log, sizeof(log));
    argv[argc++] = worker;
    if (n_devices > 1) {
        size_t used = (size_t)snprintf(yaml, sizeof(yaml), "devices:\n");
        for (unsigned d = 0; d < n_devices && used < sizeof(yaml); d++) {
            used +=
                (size_t)snprintf(yaml + used, sizeof(yaml) - used, "  - {device: \"cpu:%u\"}\n", d);
        }
        snprintf(config, sizeof(config), "%s/%s-%s.yaml", bench_tmpdir(), c->tag,
                 c->worker_names[i]);
        if (used >= sizeof(yaml) || bench_write_file(config, yaml) != 0) {
            fprintf(stderr, "bench: cannot write %s\n", config);
            return -1;
        }
        argv[argc++] = "--config";
        argv[argc++] = config;
    }
    argv[argc++] = "--name";
    argv[argc++] = c->worker_names[i];
    argv[argc++] = "--coordinator";
    argv[argc++] = c->address;
    argv[argc++] = "--listen";
    argv[argc++] = listen;
    argv[argc++] = "--http";
    argv[argc++] = http;
    argv[argc]   = NULL;
    if ((c->workers[i] = bench_spawn(argv, log)) < 0) {
        return -1;
    }
    c->worker_http_ports[i] = http_port;
    c->n_workers++;
    return 0;
}

double
cluster_worker_metric(const struct cluster *c, size_t i, const char *name)
{
    struct sockaddr_in sa       = { .sin_family = AF_INET };
    struct timeval tv           = { .tv_sec = 5 };
    static const char request[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    size_t cap = 1u << 20, len = 0, name_len = strlen(name);
    double value = -1;
    char *page;
    int fd;
    ssize_t n;

    if (i >= c->n_workers || (page = malloc(cap + 1)) == NULL) {
        return -1;
    }
    sa.sin_port        = htons((uint16_t)c->worker_http_ports[i]);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0) {
        free(page);
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        write(fd, request, sizeof(request) - 1) == (ssize_t)(sizeof(request) - 1)) {
        while (len < cap && (n = read(fd, page + len, cap - len)) > 0) {
            len += (size_t)n;
        }
    }
    close(fd);
    page[len] = '\0';
    for (char *line = page; line != NULL && *line != '\0';) {
        char *next = strchr(line, '\n');
        if (strncmp(line, name, name_len) == 0 && line[name_len] == ' ') {
            value = strtod(line + name_len + 1, NULL);
            break;
        }
        line = next != NULL ? next + 1 : NULL;
    }
    free(page);
    return value;
}

/* Waits until the workers from `first` on are alive in the registry; 0 or -1. */
static int
wait_alive(struct cluster *c, size_t first)
{
    size_t n     = c->n_workers - first;
    uint64_t end = bench_now_ns() + (uint64_t)START_TIMEOUT_MS * 1000000u;

    while (alive_count(c, first, n, false) < n) {
        for (size_t k = first; k < c->n_workers; k++) {
            int rc = c->workers[k] > 0 ? bench_wait(c->workers[k], 0) : -1;
            if (rc >= 0) { /* it will not register: no need to wait the timeout out */
                char log[1024];
                log_path(c, c->worker_names[k], log, sizeof(log));
                fprintf(stderr,
                        "bench: worker %s exited (status %d) before it registered; log: %s\n",
                        c->worker_names[k], rc, log);
                c->workers[k] = 0;
                bench_keep_tmpdir();
                return -1;
            }
        }
        if (bench_now_ns() > end) {
            fprintf(stderr, "bench: workers did not register; logs in %s\n", bench_tmpdir());
            alive_count(c, first, n, true);
            bench_keep_tmpdir();
            return -1;
        }
        bench_sleep_ms(20);
    }
    return 0;
}

int
cluster_add_workers(struct cluster *c, size_t n)
{
    size_t first = c->n_workers;

    for (size_t i = 0; i < n; i++) {
        if (spawn_worker(c, 1) != 0) {
            return -1;
        }
    }
    return wait_alive(c, first);
}

int
cluster_add_worker_devices(struct cluster *c, unsigned n_devices)
{
    size_t first = c->n_workers;

    if (spawn_worker(c, n_devices) != 0) {
        return -1;
    }
    return wait_alive(c, first);
}

int
cluster_wait_worker_state(struct cluster *c, const char *name, dc_worker_state state,
                          unsigned timeout_ms)
{
    uint64_t end = bench_now_ns() + (uint64_t)timeout_ms * 1000000u;

    for (;;) {
        dc_worker_list *list = NULL;
        dc_status st;
        int found = 0;
        if (dc_list_workers(c->client, &list, &st) == DC_OK) {
            for (size_t i = 0; i < list->n; i++) {
                if (strcmp(list->workers[i].name, name) == 0 && list->workers[i].state == state) {
                    found = 1;
                }
            }
            dc_worker_list_free(list);
        }
        if (found) {
            return 0;
        }
        if (bench_now_ns() > end) {
            return -1;
        }
        bench_sleep_ms(2);
    }
}

void
cluster_stop(struct cluster *c)
{
    for (size_t i = 0; i < c->n_workers; i++) {
        if (c->workers[i] > 0) {
            kill(-c->workers[i], SIGTERM);
        }
    }
    for (size_t i = 0; i < c->n_workers; i++) {
        bench_stop(c->workers[i], 3000);
        c->workers[i] = 0;
    }
    c->n_workers = 0;
    if (c->client != NULL) {
        dc_client_close(c->client);
        c->client = NULL;
    }
    if (c->coordinator > 0) {
        bench_stop(c->coordinator, 3000);
        c->coordinator = 0;
    }
}

void
cluster_device(const struct cluster *c, size_t worker, dc_device_ref *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->worker, sizeof(out->worker), "%s", c->worker_names[worker]);
    out->device.backend = DC_BACKEND_CPU;
    out->device.kind    = DC_KIND_NONE;
    out->device.index   = 0;
}

int
cluster_put_f32(dc_client *client, const char *const *devices, size_t n, const char *name,
                uint64_t bytes, float value, const char *who)
{
    size_t count      = (size_t)(bytes / sizeof(float));
    float *data       = malloc(count ? count * sizeof(float) : 1);
    uint64_t shape[1] = { count };
    dc_status st;
    int rv = 0;

    if (data == NULL) {
        fprintf(stderr, "%s: out of memory for %s\n", who, name);
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        data[i] = value;
    }
    for (size_t k = 0; k < n && rv == 0; k++) {
        if (dc_tensor_put(client, devices[k], name, DC_DTYPE_F32, shape, 1, data,
                          count * sizeof(float), &st) != DC_OK) {
            fprintf(stderr, "%s: put %s on %s: %s\n", who, name, devices[k], st.message);
            rv = -1;
        }
    }
    free(data);
    return rv;
}

double
cluster_submit_all_reduce(dc_client *client, const dc_device_ref *devs, size_t n, const char *name,
                          dc_op_result **res, const char *who)
{
    dc_op_request req = { .kind       = DC_OP_ALL_REDUCE,
                          .reduce     = DC_REDUCE_SUM,
                          .devices    = devs,
                          .n_devices  = n,
                          .tensor     = name,
                          .timeout_ms = 120000 };
    dc_op_result *r   = NULL;
    dc_status st;
    uint64_t t0  = bench_now_ns();
    dc_code code = dc_submit(client, &req, &r, &st);
    double s     = (double)(bench_now_ns() - t0) / 1e9;

    if (code != DC_OK) {
        fprintf(stderr, "%s: all-reduce %s: %s: %s\n", who, name, dc_status_name(code), st.message);
        dc_op_result_free(r);
        return -1;
    }
    if (res != NULL) {
        *res = r;
    } else {
        dc_op_result_free(r);
    }
    return s;
}
