/*
 * The worker daemon's state: config, membership, the executor holding tensors, the
 * collectives in flight, and the RPC server that serves the Worker service (data plane).
 */
#ifndef DEVCOORD_WORKER_H
#define DEVCOORD_WORKER_H

#include <stdatomic.h>

#include "config.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "membership.h"
#include "metrics.h"
#include "rpc.h"

struct auth_current;
struct executor;
struct tensors;
struct collectives;
struct wgroups;

struct worker {
    /* First member: handlers get &service and find the rest from it. */
    Devcoord__V1__Worker_Service service;
    struct config_worker cfg;
    char *token; /* from token_file: what this worker shows others */
    /* from auth.tokens_file: whom it lets in; NULL lets everyone in; swapped on SIGHUP */
    struct auth_current *auth;
    struct membership *membership;
    struct executor *executor;
    struct tensors *tensors;
    struct collectives *collectives;
    struct wgroups *groups;
    struct rpc_server *rpc;
    struct rpc_metrics rpc_metrics;
    struct http_server *http;
    /* The newest coordinator term an order carried (ExecuteRequest.term): older ones are
     * refused, so a deposed leader cannot drive this worker (issue 16). */
    atomic_ullong max_term;
};

void worker_service_init(struct worker *w);

/* Serves /healthz, /readyz and /metrics on cfg.http (nothing when it is ""). */
dc_code worker_http_start(struct worker *w, dc_status *st);

/* rpc_authorize_fn for the Worker service: the coordinator and peers need a worker token,
 * clients a trainer's (an operator's may read). arg: the worker. */
dc_code worker_authorize(void *arg, const ProtobufCMethodDescriptor *method, const char *token,
                         dc_status *st);

#endif
