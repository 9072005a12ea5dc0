/*
 * Groups on the coordinator (design §13): GroupJoin validates the device list (design §4),
 * ranks it in sorted canonical order and parks the caller in the group's rendezvous
 * (groups.c); when the last rank joins, every worker of the group gets the new generation
 * (GroupSetup) and then every rank its answer. GroupLeave and ListGroups read and change the
 * table. Nothing here is in a group call's path: after the join, ranks talk to their workers.
 * Asynchronous like ops: no handler thread waits for a rendezvous or a worker.
 */
#ifndef DEVCOORD_COORDINATOR_GROUPSVC_H
#define DEVCOORD_COORDINATOR_GROUPSVC_H

#include <stdatomic.h>

#include "config.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "registry.h"

/* Joins parked at once, in all groups. */
#define GROUPSVC_MAX_PARKED 4096
/* Groups known at once (in use or kept for listing). */
#define GROUPSVC_MAX_GROUPS 1024
/* How long a worker has to install a generation (GroupSetup). */
#define GROUPSVC_SETUP_TIMEOUT_MS 5000

struct groupsvc;
struct mbuf;

/* worker_token (NULL without auth) is what workers are called with; it must outlive it. */
struct groupsvc *groupsvc_new(struct registry *registry, const struct config_coordinator *cfg,
                              const char *worker_token);
/* Fails every parked join (UNAVAILABLE, "coordinator shutting down") and ends the calls to
 * workers still out. */
void groupsvc_shutdown(struct groupsvc *g);
void groupsvc_free(struct groupsvc *g);
/* GroupSetup carries *term from now on (as ops_set_term). */
void groupsvc_set_term(struct groupsvc *g, const atomic_ullong *term);

void groupsvc_join(struct groupsvc *g, const Devcoord__V1__GroupJoinRequest *in,
                   Devcoord__V1__GroupJoinResponse_Closure closure, void *cd);
void groupsvc_leave(struct groupsvc *g, const Devcoord__V1__GroupLeaveRequest *in,
                    Devcoord__V1__GroupLeaveResponse_Closure closure, void *cd);
void groupsvc_list(struct groupsvc *g, const Devcoord__V1__ListGroupsRequest *in,
                   Devcoord__V1__ListGroupsResponse_Closure closure, void *cd);
/* What ListGroups answers, the coordinator's view only (no calls, no stalled ranks: the
 * workers know those), built in a (group_id "" for all; NOT_FOUND for an unknown one). */
struct arena;
dc_code groupsvc_list_into(struct groupsvc *g, const char *group_id, struct arena *a,
                           Devcoord__V1__ListGroupsResponse *out, dc_status *st);
/* Adds to each group of `groups` (from groupsvc_list_into, arena a) what its workers say
 * (GroupStatus, as devcoordctl groups list asks): calls done and stalled ranks. Waits at
 * most timeout_ms; a worker that has not answered by then adds nothing. Not from an nng
 * callback. */
void groupsvc_ask_workers(struct groupsvc *g, Devcoord__V1__ListGroupsResponse *groups,
                          struct arena *a, uint32_t timeout_ms);

/* A connection of the coordinator's RPC server closed (rpc_server_opts.on_disconnect): the
 * joins parked on it are let go within a timer tick, so that their ranks may join again. */
void groupsvc_disconnected(struct groupsvc *g, uint32_t pipe);
/* Worker `name` is gone (dead or deregistered): its connection is not kept. */
void groupsvc_worker_gone(struct groupsvc *g, const char *name);

/* Joins by outcome, generations completed (Prometheus text). */
void groupsvc_metrics_render(struct groupsvc *g, struct mbuf *b);

#endif
