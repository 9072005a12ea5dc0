/*
 * A devcoord cluster on 127.0.0.1 for the benches: one devcoord-server and real
 * devcoord-worker processes (one cpu:0 device each, or cpu:0..n-1 from
 * cluster_add_worker_devices; named w0, w1, ...), free ports, logs in the bench's temporary
 * directory, and a libdevcoord client of the coordinator. Every
 * process started here is stopped by cluster_stop (and by bench.c at exit).
 */
#ifndef DEVCOORD_BENCH_CLUSTER_H
#define DEVCOORD_BENCH_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "bench.h"
#include "devcoord/devcoord.h"

#define CLUSTER_MAX_WORKERS 64

struct cluster_opts {
    uint32_t heartbeat_interval_ms; /* 0: the default (1000) */
    uint32_t dead_after_ms;         /* 0: the default (5000) */
    const char *extra_yaml;         /* more coordinator config lines, or NULL */
};

struct cluster {
    const struct bench_args *args;
    pid_t coordinator;
    char address[64];
    dc_client *client;
    size_t n_workers;
    pid_t workers[CLUSTER_MAX_WORKERS];
    char worker_names[CLUSTER_MAX_WORKERS][32];
    int worker_http_ports[CLUSTER_MAX_WORKERS]; /* each worker's health and metrics port */
    char tag[32];
};

/* Starts the coordinator (tag names its log file) and waits until it answers healthy;
 * 0 or -1 with a message. */
int cluster_start(struct cluster *c, const struct bench_args *args, const char *tag,
                  const struct cluster_opts *opts);
/* Starts n more workers and waits until the registry lists all of them alive; 0 or -1. */
int cluster_add_workers(struct cluster *c, size_t n);
/* Starts one more worker with n_devices cpu devices (cpu:0 .. cpu:n-1) and waits until the
 * registry lists it alive; 0 or -1. */
int cluster_add_worker_devices(struct cluster *c, unsigned n_devices);
/* Waits until worker `name` has state `state` in the registry, at most timeout_ms; 0 or -1. */
int cluster_wait_worker_state(struct cluster *c, const char *name, dc_worker_state state,
                              unsigned timeout_ms);
/* Stops workers and the coordinator (SIGTERM, then SIGKILL) and closes the client. */
void cluster_stop(struct cluster *c);

/* The value of an unlabelled metric `name` on worker i's /metrics page, or -1 when the page
 * cannot be read or lacks it. */
double cluster_worker_metric(const struct cluster *c, size_t i, const char *name);

/* "w3/cpu:0" as a device reference. */
void cluster_device(const struct cluster *c, size_t worker, dc_device_ref *out);

/* Parks `name`, `bytes` of f32 each equal to value, on each of devices[0..n) through client:
 * 0, or -1 (said on stderr after `who`). */
int cluster_put_f32(dc_client *client, const char *const *devices, size_t n, const char *name,
                    uint64_t bytes, float value, const char *who);
/* One dc_submit all-reduce (f32 sum) of tensor `name` on devs[0..n): its seconds, or -1 (said
 * on stderr after `who`). res (NULL: not wanted) gets the result on success, for
 * dc_op_result_free. */
double cluster_submit_all_reduce(dc_client *client, const dc_device_ref *devs, size_t n,
                                 const char *name, dc_op_result **res, const char *who);

#endif
