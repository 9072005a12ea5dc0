/*
 * The registry under load (issue 5, items 3, 4 and 7), against a real devcoord-server:
 *
 * - Registration storm: a load generator sends RegisterWorker for N simulated workers with 8
 *   cpu devices each (unique names, advertised addresses nobody dials), 64 calls in flight
 *   over one connection; registrations/s and time until the last one is answered (then the
 *   registry's own count is checked). N = 1k and 10k, each on a fresh coordinator.
 * - Registry queries with 100k devices (12.5k simulated workers x 8): the full listing
 *   through dc_list_devices (every page, decoded and sorted by the client) and the listing
 *   filtered by one worker; median and p99.
 * - Memory: the coordinator's VmRSS after those 100k devices registered, minus its VmRSS
 *   before the first registration, per device.
 *
 * Simulated workers never heartbeat, so the coordinator runs with dead_after_ms of a day:
 * nothing dies during the measurement.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cluster.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "devcoord/v1/methods.h"
#include "rpc.h"

#define SVC               (&devcoord__v1__coordinator__descriptor)
#define DEVICES_PER       8
#define IN_FLIGHT         64
#define QUERY_WORKERS     12500
#define NEVER_DEAD_MS     86400000u
#define REGISTER_DEADLINE 30000

static const char usage[] = "usage: bench_registry [--quick] [--out DIR] [--build DIR]\n";

struct storm_result {
    unsigned workers;
    double seconds;
    double per_s;
    double p50_ms, p99_ms;
    uint64_t failed;
    int verified;
    unsigned shown_dead; /* registered, yet listed dead right after (should be 0) */
};

/* ---- the load generator -------------------------------------------------------------------- */

struct storm {
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    unsigned in_flight;
    uint64_t done, failed;
    struct bench_samples lat_ms;
    dc_status first_error;
};

struct storm_call {
    struct storm *s;
    uint64_t t0;
};

static void
storm_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct storm_call *call = arg;
    struct storm *s         = call->s;
    double ms               = (double)(bench_now_ns() - call->t0) / 1e6;

    (void)reply;
    (void)keep;
    pthread_mutex_lock(&s->mtx);
    if (code != DC_OK) {
        if (s->failed++ == 0) {
            s->first_error = *st;
        }
    }
    bench_samples_add(&s->lat_ms, ms);
    s->done++;
    s->in_flight--;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mtx);
}

/* Registers workers prefix-00000 .. prefix-(n-1) on the coordinator at url. */
static int
storm_run(const char *url, const char *prefix, unsigned n, struct storm_result *out)
{
    struct rpc_client_opts co               = { .url = url, .connect_now = true };
    Devcoord__V1__RegisterWorkerRequest req = DEVCOORD__V1__REGISTER_WORKER_REQUEST__INIT;
    Devcoord__V1__DeviceSpec specs[DEVICES_PER], *spec_ptrs[DEVICES_PER];
    Devcoord__V1__Device devs[DEVICES_PER];
    Devcoord__V1__Label label = DEVCOORD__V1__LABEL__INIT, *label_ptrs[1] = { &label };
    Devcoord__V1__Backend backends[1] = { DEVCOORD__V1__BACKEND__BACKEND_CPU };
    struct storm_call *calls          = calloc(n, sizeof(*calls));
    struct storm s                    = { .in_flight = 0 };
    struct rpc_client *client;
    char name[64], rack[16];
    uint64_t t0, t1;
    dc_status st;
    int rv = 0;

    memset(out, 0, sizeof(*out));
    if (calls == NULL) {
        return -1;
    }
    if (rpc_client_open(&co, &client, &st) != DC_OK) {
        fprintf(stderr, "bench_registry: %s\n", st.message);
        free(calls);
        return -1;
    }
    pthread_mutex_init(&s.mtx, NULL);
    pthread_cond_init(&s.cv, NULL);
    for (unsigned d = 0; d < DEVICES_PER; d++) {
        devcoord__v1__device__init(&devs[d]);
        devcoord__v1__device_spec__init(&specs[d]);
        devs[d].backend       = DEVCOORD__V1__BACKEND__BACKEND_CPU;
        devs[d].index         = d;
        specs[d].device       = &devs[d];
        specs[d].memory_bytes = 16ull << 30;
        specs[d].healthy      = true;
        spec_ptrs[d]          = &specs[d];
    }
    req.name                  = name;
    req.address               = "tcp://127.0.0.1:1";
    req.executor              = "host";
    req.devices               = spec_ptrs;
    req.n_devices             = DEVICES_PER;
    req.labels                = label_ptrs;
    req.n_labels              = 1;
    label.key                 = "rack";
    label.value               = rack;
    req.collective_backends   = backends;
    req.n_collective_backends = 1;

    t0 = bench_now_ns();
    for (unsigned i = 0; i < n; i++) {
        pthread_mutex_lock(&s.mtx);
        while (s.in_flight >= IN_FLIGHT) {
            pthread_cond_wait(&s.cv, &s.mtx);
        }
        s.in_flight++;
        pthread_mutex_unlock(&s.mtx);
        snprintf(name, sizeof(name), "%s-%05u", prefix, i);
        snprintf(rack, sizeof(rack), "r%u", i % 16);
        calls[i].s  = &s;
        calls[i].t0 = bench_now_ns();
        if (rpc_call_async(client, SVC, M_COORDINATOR_REGISTER_WORKER, &req.base, NULL, 0,
                           REGISTER_DEADLINE, storm_done, &calls[i], &st) != DC_OK) {
            fprintf(stderr, "bench_registry: register %s: %s\n", name, st.message);
            pthread_mutex_lock(&s.mtx);
            s.in_flight--;
            s.failed++;
            s.done++;
            pthread_mutex_unlock(&s.mtx);
        }
    }
    pthread_mutex_lock(&s.mtx);
    while (s.done < n) {
        pthread_cond_wait(&s.cv, &s.mtx);
    }
    pthread_mutex_unlock(&s.mtx);
    t1 = bench_now_ns();

    if (s.failed > 0) {
        fprintf(stderr, "bench_registry: %llu of %u registrations failed; first: %s: %s\n",
                (unsigned long long)s.failed, n, dc_status_name(s.first_error.code),
                s.first_error.message);
        rv = -1;
    }
    out->workers = n;
    out->seconds = (double)(t1 - t0) / 1e9;
    out->per_s   = (double)n / out->seconds;
    out->failed  = s.failed;
    out->p50_ms  = bench_percentile(s.lat_ms.v, s.lat_ms.n, 50);
    out->p99_ms  = bench_percentile(s.lat_ms.v, s.lat_ms.n, 99);
    bench_samples_free(&s.lat_ms);
    rpc_client_close(client);
    free(calls);
    return rv;
}

/*
 * Whether the registry lists every one of the `workers` simulated workers with its 8 devices.
 * Counts those it shows dead: none should be (dead_after is a day), but a registration that
 * lands while the coordinator's sweep runs can be (see the report's note on registry_sweep).
 */
static int
storm_verify(struct cluster *c, unsigned workers, struct storm_result *out)
{
    dc_worker_list *list = NULL;
    unsigned listed = 0, dead = 0;
    int devices_ok = 1;
    dc_status st;

    if (dc_list_workers(c->client, &list, &st) != DC_OK) {
        fprintf(stderr, "bench_registry: ListWorkers: %s\n", st.message);
        return 0;
    }
    for (size_t i = 0; i < list->n; i++) {
        if (strncmp(list->workers[i].name, "sim-", 4) != 0) {
            continue;
        }
        listed++;
        if (list->workers[i].state == DC_WORKER_DEAD) {
            dead++;
        }
        if (list->workers[i].device_count != DEVICES_PER) {
            devices_ok = 0;
        }
    }
    dc_worker_list_free(list);
    out->shown_dead = dead;
    if (listed != workers || !devices_ok) {
        fprintf(stderr, "bench_registry: registry lists %u of %u workers%s\n", listed, workers,
                devices_ok ? "" : ", some without their 8 devices");
        return 0;
    }
    if (dead > 0) {
        fprintf(stderr,
                "bench_registry: %u of %u freshly registered workers shown dead (dead_after_ms "
                "is %u): the coordinator's sweep raced the registrations\n",
                dead, workers, NEVER_DEAD_MS);
    }
    return 1;
}

/* 12.5k workers are more than limits.max_workers allows by default (4096); their 100k
 * devices fit the default limits.max_devices. */
static const struct cluster_opts never_dead = { .heartbeat_interval_ms = 1000,
                                                .dead_after_ms         = NEVER_DEAD_MS,
                                                .extra_yaml = "limits: {max_workers: 16384}\n" };

static int
storm_fresh(const struct bench_args *a, unsigned n, struct storm_result *out)
{
    struct cluster c;
    char tag[32];
    int rv;

    snprintf(tag, sizeof(tag), "storm%u", n);
    if (cluster_start(&c, a, tag, &never_dead) != 0) {
        return -1;
    }
    rv            = storm_run(c.address, "sim", n, out);
    out->verified = storm_verify(&c, n, out);
    cluster_stop(&c);
    return rv;
}

/* ---- queries and memory ------------------------------------------------------------------ */

struct query_result {
    unsigned devices;
    unsigned full_reps, filtered_reps;
    double full_p50_ms, full_p99_ms, full_min_ms;
    double filtered_p50_ms, filtered_p99_ms;
    size_t full_count, filtered_count;
    uint64_t rss_base, rss_after;
    double bytes_per_device;
    struct storm_result storm;
    int ok;
};

static int
queries(const struct bench_args *a, struct query_result *q)
{
    struct cluster c;
    dc_device_list *list = NULL;
    double *full, *filtered;
    char worker[64];
    dc_status st;
    int rv = -1;

    memset(q, 0, sizeof(*q));
    q->full_reps     = a->quick ? 5 : 20;
    q->filtered_reps = a->quick ? 200 : 1000;
    full             = calloc(q->full_reps, sizeof(*full));
    filtered         = calloc(q->filtered_reps, sizeof(*filtered));
    if (full == NULL || filtered == NULL || cluster_start(&c, a, "query", &never_dead) != 0) {
        free(full);
        free(filtered);
        return -1;
    }
    /* Baseline after the server has answered a listing (its threads and buffers are up). */
    if (dc_list_devices(c.client, NULL, &list, &st) == DC_OK) {
        dc_device_list_free(list);
    }
    bench_sleep_ms(200);
    q->rss_base = bench_rss_bytes(c.coordinator);
    if (storm_run(c.address, "sim", QUERY_WORKERS, &q->storm) != 0 ||
        !(q->storm.verified = storm_verify(&c, QUERY_WORKERS, &q->storm))) {
        goto out;
    }
    bench_sleep_ms(200);
    q->rss_after        = bench_rss_bytes(c.coordinator);
    q->devices          = QUERY_WORKERS * DEVICES_PER;
    q->bytes_per_device = ((double)q->rss_after - (double)q->rss_base) / q->devices;

    /* One listing to warm up, then the measured ones. */
    for (unsigned i = 0; i <= q->full_reps; i++) {
        uint64_t t0 = bench_now_ns();
        if (dc_list_devices(c.client, NULL, &list, &st) != DC_OK) {
            fprintf(stderr, "bench_registry: ListDevices: %s\n", st.message);
            goto out;
        }
        if (i > 0) {
            full[i - 1] = (double)(bench_now_ns() - t0) / 1e6;
        }
        q->full_count = list->n;
        dc_device_list_free(list);
    }
    for (unsigned i = 0; i <= q->filtered_reps; i++) {
        dc_device_filter filter = { .worker = worker };
        uint64_t t0;
        snprintf(worker, sizeof(worker), "sim-%05u", (i * 7919u) % QUERY_WORKERS);
        t0 = bench_now_ns();
        if (dc_list_devices(c.client, &filter, &list, &st) != DC_OK) {
            fprintf(stderr, "bench_registry: ListDevices --worker %s: %s\n", worker, st.message);
            goto out;
        }
        if (i > 0) {
            filtered[i - 1] = (double)(bench_now_ns() - t0) / 1e6;
        }
        q->filtered_count = list->n;
        dc_device_list_free(list);
    }
    q->full_p50_ms     = bench_percentile(full, q->full_reps, 50);
    q->full_p99_ms     = bench_percentile(full, q->full_reps, 99);
    q->full_min_ms     = full[0];
    q->filtered_p50_ms = bench_percentile(filtered, q->filtered_reps, 50);
    q->filtered_p99_ms = bench_percentile(filtered, q->filtered_reps, 99);
    q->ok              = q->full_count == q->devices && q->filtered_count == DEVICES_PER;
    if (!q->ok) {
        fprintf(stderr,
                "bench_registry: listings returned %zu and %zu devices, expected %u and %d\n",
                q->full_count, q->filtered_count, q->devices, DEVICES_PER);
    }
    rv = 0;
out:
    cluster_stop(&c);
    free(full);
    free(filtered);
    return rv;
}

/* ---- output ------------------------------------------------------------------------------ */

static void
json_storm(FILE *f, const struct storm_result *s)
{
    fprintf(f,
            "{\"workers\": %u, \"devices\": %u, \"in_flight\": %d, \"seconds\": %.4f, "
            "\"registrations_per_s\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"failed\": %llu, "
            "\"verified\": %s, \"shown_dead_after\": %u}",
            s->workers, s->workers * DEVICES_PER, IN_FLIGHT, s->seconds, s->per_s, s->p50_ms,
            s->p99_ms, (unsigned long long)s->failed, s->verified ? "true" : "false",
            s->shown_dead);
}

int
main(int argc, char **argv)
{
    static const unsigned storm_sizes[] = { 1000, 10000 };
    struct storm_result storms[2];
    int storm_ok[2];
    struct query_result q;
    int q_ok;
    struct bench_args a;
    struct bench_summary sum;
    FILE *f;
    int rv;

    bench_init();
    if ((rv = bench_parse_args(argc, argv, &a, usage, NULL, NULL)) != 0) {
        return rv;
    }
    for (size_t i = 0; i < 2; i++) {
        printf("registration storm: %u workers x %d devices, %d in flight ...\n", storm_sizes[i],
               DEVICES_PER, IN_FLIGHT);
        fflush(stdout);
        storm_ok[i] = storm_fresh(&a, storm_sizes[i], &storms[i]) == 0 && storms[i].verified;
    }
    printf("registry queries: %d workers x %d devices ...\n", QUERY_WORKERS, DEVICES_PER);
    fflush(stdout);
    q_ok = queries(&a, &q) == 0 && q.ok;

    printf("\nRegistration storm (RegisterWorker, %d devices each, %d in flight, one connection)\n",
           DEVICES_PER, IN_FLIGHT);
    printf("%-8s | %9s | %14s | %10s | %10s | %s\n", "workers", "all in", "registrations/s", "p50",
           "p99", "registry check");
    for (size_t i = 0; i < 2; i++) {
        printf("%-8u | %7.3f s | %14.0f | %7.2f ms | %7.2f ms | %s\n", storms[i].workers,
               storms[i].seconds, storms[i].per_s, storms[i].p50_ms, storms[i].p99_ms,
               !storms[i].verified    ? "MISMATCH"
               : storms[i].shown_dead ? bench_fmt("all listed, %u shown dead", storms[i].shown_dead)
                                      : "all listed alive");
    }
    printf("%-8u | %7.3f s | %14.0f | %7.2f ms | %7.2f ms | %s  (the query fixture)\n",
           q.storm.workers, q.storm.seconds, q.storm.per_s, q.storm.p50_ms, q.storm.p99_ms,
           !q.storm.verified    ? "MISMATCH"
           : q.storm.shown_dead ? bench_fmt("all listed, %u shown dead", q.storm.shown_dead)
                                : "all listed alive");

    printf("\nRegistry queries with %u devices (dc_list_devices: all pages, decoded and sorted)\n",
           q.devices);
    printf("%-22s | %6s | %10s | %10s | %8s\n", "query", "reps", "median", "p99", "devices");
    printf("%-22s | %6u | %7.2f ms | %7.2f ms | %8zu\n", "all devices", q.full_reps, q.full_p50_ms,
           q.full_p99_ms, q.full_count);
    printf("%-22s | %6u | %7.3f ms | %7.3f ms | %8zu\n", "filtered by worker", q.filtered_reps,
           q.filtered_p50_ms, q.filtered_p99_ms, q.filtered_count);

    printf("\nCoordinator memory: VmRSS %.1f MiB before, %.1f MiB with %u devices: %.0f bytes "
           "per device\n",
           (double)q.rss_base / (1 << 20), (double)q.rss_after / (1 << 20), q.devices,
           q.bytes_per_device);

    if ((f = bench_result_open(&a, "registry.json")) != NULL) {
        fprintf(f,
                "{\"bench\": \"registry\",\n \"note\": \"simulated workers (no processes), "
                "8 cpu devices each, registered over one connection with %d calls in flight; "
                "dead_after_ms %u so none dies\",\n \"storm\": [",
                IN_FLIGHT, NEVER_DEAD_MS);
        for (size_t i = 0; i < 2; i++) {
            fprintf(f, "%s\n  ", i ? "," : "");
            json_storm(f, &storms[i]);
        }
        fprintf(f, ",\n  ");
        json_storm(f, &q.storm);
        fprintf(f,
                "\n ],\n \"queries\": {\"devices\": %u, \"all\": {\"reps\": %u, \"median_ms\": "
                "%.3f, \"p99_ms\": %.3f, \"min_ms\": %.3f, \"count\": %zu},\n   \"by_worker\": "
                "{\"reps\": %u, \"median_ms\": %.4f, \"p99_ms\": %.4f, \"count\": %zu}},\n"
                " \"memory\": {\"devices\": %u, \"rss_before_bytes\": %llu, \"rss_after_bytes\": "
                "%llu, \"bytes_per_device\": %.1f}}\n",
                q.devices, q.full_reps, q.full_p50_ms, q.full_p99_ms, q.full_min_ms, q.full_count,
                q.filtered_reps, q.filtered_p50_ms, q.filtered_p99_ms, q.filtered_count, q.devices,
                (unsigned long long)q.rss_base, (unsigned long long)q.rss_after,
                q.bytes_per_device);
        fclose(f);
    }

    if (bench_summary_open(&sum, &a, "registry") == 0) {
        for (size_t i = 0; i < 2; i++) {
            bench_summary_row(
                &sum, bench_fmt("registration storm, %uk workers x 8", storms[i].workers / 1000),
                storm_ok[i]
                    ? bench_fmt("%.0f/s (all in %.2f s)", storms[i].per_s, storms[i].seconds)
                    : "failed",
                "-", storm_ok[i] ? storms[i].per_s / 10000 : NAN, ">= 10000/s",
                storm_ok[i] ? storms[i].per_s >= 10000 : 0);
        }
        bench_summary_row(
            &sum, "ListDevices, all 100k devices (median)",
            q_ok ? bench_fmt("%.1f ms (p99 %.1f)", q.full_p50_ms, q.full_p99_ms) : "failed", "-",
            q_ok ? q.full_p50_ms / 50 : NAN, "<= 50 ms", q_ok ? q.full_p50_ms <= 50 : 0);
        bench_summary_row(
            &sum, "ListDevices, one worker of 100k devices (median)",
            q_ok ? bench_fmt("%.3f ms (p99 %.3f)", q.filtered_p50_ms, q.filtered_p99_ms) : "failed",
            "-", q_ok ? q.filtered_p50_ms / 1 : NAN, "<= 1 ms", q_ok ? q.filtered_p50_ms <= 1 : 0);
        bench_summary_row(&sum, "coordinator RSS per device at 100k",
                          q.rss_after > 0 ? bench_fmt("%.0f B", q.bytes_per_device) : "failed", "-",
                          q.rss_after > 0 ? q.bytes_per_device / 1024 : NAN, "<= 1024 B",
                          q.rss_after > 0 ? q.bytes_per_device <= 1024 : 0);
        bench_summary_close(&sum);
    }
    return storm_ok[0] && storm_ok[1] && q_ok ? 0 : 1;
}
