/*
 * The coordinator daemon's state: its config, the registry, the operations in flight and
 * the RPC server that serves the Coordinator service. main.c owns one; service.c answers
 * calls against it.
 */
#ifndef DEVCOORD_COORDINATOR_H
#define DEVCOORD_COORDINATOR_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "config.h"
#include "metrics.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "registry.h"
#include "rpc.h"

struct ops;
struct groupsvc;
struct auth_current;
struct ha;

struct coordinator {
    /* First member: handlers get &service and find the rest from it. */
    Devcoord__V1__Coordinator_Service service;
    struct config_coordinator cfg;
    struct registry *registry;
    struct ops *ops;
    struct groupsvc *groups;
    struct auth_current *auth; /* NULL: no tokens file, every call is let in; swapped on
                                  SIGHUP (daemon_reload) */
    struct rpc_server *rpc;
    struct call_link *link; /* NULL: no call link (calllink.h) */
    struct rpc_metrics rpc_metrics;
    struct http_server *http;
    atomic_bool ready;
    /* state.backend etcd (issue 16): the election, NULL for a lone coordinator; term is
     * the term this coordinator leads in (0: it does not), carried by every order. */
    struct ha *ha;
    atomic_ullong term;
};

/* The Coordinator service's handlers (service.c). */
void coordinator_service_init(struct coordinator *c);

/* What GetClusterStatus answers, strings in a. */
void coordinator_cluster_status(struct coordinator *c, struct arena *a,
                                Devcoord__V1__GetClusterStatusResponse *out);

/* Serves /healthz, /readyz, /metrics and the status page (/) on cfg.http (nothing when it is
 * ""). */
dc_code coordinator_http_start(struct coordinator *c, dc_status *st);

/* rpc_authorize_fn for the Coordinator service: the roles of design §8. arg: the
 * coordinator. */
dc_code coordinator_authorize(void *arg, const ProtobufCMethodDescriptor *method, const char *token,
                              dc_status *st);

/* Whether token (NULL: none) may see the status page: DC_OK without auth, else as
 * coordinator_authorize for each call whose answer the page shows (UNAUTHENTICATED,
 * PERMISSION_DENIED naming the first refused). */
dc_code coordinator_authorize_status_page(struct coordinator *c, const char *token, dc_status *st);

#endif
