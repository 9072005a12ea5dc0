/*
 * Prometheus text exposition for the daemons: a growable text buffer, fixed-bucket
 * histograms and per-method RPC counters and latencies fed by the RPC server's observe
 * hook. Counters are atomics: observing never takes a lock.
 */
#ifndef DEVCOORD_COMMON_METRICS_H
#define DEVCOORD_COMMON_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "status.h"

struct mbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

void mbuf_printf(struct mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mbuf_free(struct mbuf *b);

#define HISTO_MAX_BUCKETS 20

/* Bucket bounds are in the histogram's unit (seconds for durations); values are observed in
 * micro-units and rendered divided by 1e6, so sums stay integers. */
struct histo {
    const double *bounds;
    size_t n;
    atomic_ullong buckets[HISTO_MAX_BUCKETS + 1];
    atomic_ullong count;
    atomic_ullong sum_micro;
};

extern const double histo_seconds[]; /* 100 us .. 30 s */
extern const size_t histo_seconds_n;

void histo_init(struct histo *h, const double *bounds, size_t n);
void histo_observe(struct histo *h, uint64_t micro);
/* Writes name_bucket{labels,le=..}, name_sum, name_count; labels may be "". */
void histo_render(struct mbuf *b, const char *name, const char *labels, const struct histo *h);

#define RPC_METRICS_METHODS 32
#define RPC_METRICS_CODES   17

struct rpc_metrics {
    const ProtobufCServiceDescriptor *svc;
    atomic_ullong calls[RPC_METRICS_METHODS + 1][RPC_METRICS_CODES]; /* last row: unknown */
    struct histo latency[RPC_METRICS_METHODS + 1];
};

void rpc_metrics_init(struct rpc_metrics *m, const ProtobufCServiceDescriptor *svc);
/* An rpc_observe_fn; arg is the rpc_metrics. */
void rpc_metrics_observe(void *arg, const ProtobufCMethodDescriptor *method, dc_code code,
                         uint64_t elapsed_us);
void rpc_metrics_render(struct mbuf *b, const struct rpc_metrics *m);

struct rpc_server;
/* The RPC server's devcoord_rpc_connections (open), devcoord_rpc_connections_limit
 * (limits.max_connections, 0: none) and devcoord_rpc_connections_refused_total; nothing when
 * s is NULL. */
void rpc_connections_render(struct mbuf *b, struct rpc_server *s);

/* A tiny HTTP server (nng's) answering GET on a few paths. A route's render runs on an nng
 * thread: it must not block. It fills body (text) and returns the HTTP status. */
struct http_route {
    const char *path;
    const char *content_type;
    int (*render)(void *arg, struct mbuf *body);
    void *arg;
    /* Optional: more response headers, name then value, ending with NULL. */
    const char *const *headers;
    /* Optional: runs before render with the request's Authorization header (NULL when it
     * has none). Returns 0 to serve the route, or the HTTP status of the refusal (401, 403)
     * with body filled with why, as "CODE: message" in text. */
    int (*authorize)(void *arg, const char *authorization, struct mbuf *body);
};

struct http_server;

/* Serves routes on "host:port". */
dc_code http_start(const char *hostport, const struct http_route *routes, size_t n,
                   struct http_server **out, dc_status *st);
void http_stop(struct http_server *s);

#endif
