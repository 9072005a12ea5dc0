/*
 * The worker daemon's state: config, membership, the executor holding tensors, the
 * collectives in flight, and the RPC server that serves the Worker service (data plane).
 */
#ifndef DEVCOORD_WORKER_H
#define DEVCOORD_WORKER_H

#include "config.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "membership.h"
#include "rpc.h"

struct executor;
struct tensors;
struct collectives;

struct worker {
    /* First member: handlers get &service and find the rest from it. */
    Devcoord__V1__Worker_Service service;
    struct config_worker cfg;
    struct membership *membership;
    struct executor *executor;
    struct tensors *tensors;
    struct collectives *collectives;
    struct rpc_server *rpc;
};

void worker_service_init(struct worker *w);

#endif
