/*
 * Operations on the coordinator: SubmitOp validates (design §4) and plans a request, queues
 * it behind earlier ops on any of its devices, fans the plan out to the workers (Execute)
 * and answers the caller once every worker has answered, at the first failure or at the
 * deadline; failures abort the other workers. GetOp/ListOps read the in-flight ops and a
 * bounded history. Everything here is asynchronous: no handler thread waits for a worker.
 */
#ifndef DEVCOORD_COORDINATOR_OPS_H
#define DEVCOORD_COORDINATOR_OPS_H

#include <stdint.h>

#include "config.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include <stdatomic.h>

#include "registry.h"

struct ops;

/* worker_token (NULL without auth) is what the coordinator calls workers with; it must
 * outlive the ops. */
struct ops *ops_new(struct registry *registry, const struct config_coordinator *cfg,
                    const char *worker_token);
/* Fails every op still in flight (UNAVAILABLE, "coordinator shutting down") and waits
 * until their callers have been answered. */
void ops_shutdown(struct ops *o);
void ops_free(struct ops *o);
/* Orders carry *term from now on (state.backend etcd); an op started while it is 0 (this
 * coordinator does not lead) fails UNAVAILABLE. leads(arg) says whether this coordinator
 * still leads by its own clock (its lease fresh): a worker refusing an Execute while it does
 * not fails the op as the leadership lost, not with the worker's reason. A coordinator
 * paused past its lease hears the workers that moved on to the new leader before its own
 * etcd round notices. Set before serving. */
void ops_set_term(struct ops *o, const atomic_ullong *term, bool (*leads)(void *arg), void *arg);
/* Fails every op in flight UNAVAILABLE: this coordinator stepped down from term. */
void ops_leadership_lost(struct ops *o, uint64_t term);

void ops_submit(struct ops *o, const Devcoord__V1__SubmitOpRequest *in,
                Devcoord__V1__SubmitOpResponse_Closure closure, void *cd);
void ops_get(struct ops *o, const Devcoord__V1__GetOpRequest *in,
             Devcoord__V1__GetOpResponse_Closure closure, void *cd);
void ops_list(struct ops *o, const Devcoord__V1__ListOpsRequest *in,
              Devcoord__V1__ListOpsResponse_Closure closure, void *cd);
void ops_counts(struct ops *o, uint64_t *in_flight, uint64_t *done, uint64_t *failed);

/* What ListOps answers, at most limit ops: those in flight, newest first, then the history,
 * newest first; strings in a. total (may be NULL) gets how many ops there are to list. */
dc_code ops_list_into(struct ops *o, size_t limit, struct arena *a,
                      Devcoord__V1__ListOpsResponse *out, size_t *total, dc_status *st);

/* Ops by kind and final code, durations and fan-out sizes (Prometheus text). */
struct mbuf;
void ops_metrics_render(struct ops *o, struct mbuf *b);

/* The registry says an epoch of a worker ended: its in-flight ops fail with UNAVAILABLE. */
void ops_worker_gone(struct ops *o, const char *name, uint64_t epoch, enum registry_gone why);

#endif
