/*
 * The coordinator's registry: workers (name, data address, labels, epoch, liveness, operator
 * intent) and the devices they own, indexed for the lookups validation and queries need.
 * One read-write lock guards it; every function takes it itself. Responses are built with
 * their strings copied into the caller's arena, so they outlive the lock.
 */
#ifndef DEVCOORD_COORDINATOR_REGISTRY_H
#define DEVCOORD_COORDINATOR_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "auth.h"
#include "devcoord/types.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "validate.h"

#define REGISTRY_MAX_LABELS    64
#define REGISTRY_MAX_LABEL_LEN 256
#define REGISTRY_DEFAULT_PAGE  32768

/* Operator intent for a worker; it outlives the worker's registrations. */
enum registry_intent {
    INTENT_NONE = 0,
    INTENT_CORDON,
    INTENT_DRAIN,
};

/* Why a worker's current epoch ends. */
enum registry_gone {
    GONE_DEAD,         /* silent past dead_after */
    GONE_DEREGISTERED, /* said goodbye */
    GONE_REPLACED,     /* registered again: a restart */
};

struct registry_events {
    /* Called (outside the lock) when an epoch of a worker ends. */
    void (*worker_gone)(void *arg, const char *name, uint64_t epoch, enum registry_gone why);
    void *arg;
};

/* One worker's operator intent, as the store keeps it. */
struct registry_intent_entry {
    char name[DC_WORKER_NAME_MAX + 1];
    enum registry_intent intent;
};

/*
 * Where operator intent is kept across restarts (state.c). save gets every worker's intent
 * as it will be once a change is applied, before the registry applies it: an operator told
 * OK must find the change after a restart, so a change that cannot be saved is refused and
 * leaves the registry as it was. Changes are serialized: save is never called twice at
 * once, and is called outside the registry's lock (a slow disk must not stall heartbeats).
 */
struct registry_store {
    dc_code (*save)(void *arg, const struct registry_intent_entry *entries, size_t n,
                    dc_status *st);
    void *arg;
};

/* Limits and intervals; 0 for any of the last four: no limit, never forget. */
struct registry_opts {
    uint32_t heartbeat_interval_ms;
    uint32_t dead_after_ms;
    /* A worker dead this long is forgotten: it leaves the registry and every listing, and
     * must register again. Its operator intent is kept, so it gets it back. */
    uint32_t forget_after_ms;
    /* Registrations past these are refused with RESOURCE_EXHAUSTED naming the limit. A
     * worker registering again is counted once, with its new devices. */
    uint32_t max_workers;
    uint32_t max_devices_per_worker;
    uint32_t max_devices;
    struct registry_events events;
    struct registry_store store; /* save NULL: intent is not kept */
};

struct registry;

struct registry *registry_new(const struct registry_opts *opts);
void registry_free(struct registry *r);

/* One registration of a worker, as the registrant gets it: the epoch, and a random secret
 * that proves a later call comes from this registrant. The epoch alone cannot: ListWorkers
 * shows it to every trainer and operator, and it is a wall-clock time anyway. */
struct registry_session {
    uint64_t epoch;
    uint8_t secret[AUTH_SESSION_SECRET_SIZE];
};

/* Registers (or re-registers, ending the old epoch) a worker; out gets the new session, its
 * epoch higher than any before even across coordinator restarts. now_ms: monotonic clock.
 * Who may register which name is the caller's to check (auth_worker_may_be). */
dc_code registry_register(struct registry *r, const Devcoord__V1__RegisterWorkerRequest *req,
                          uint64_t now_ms, struct registry_session *out, dc_status *st);

/* NOT_FOUND for an unknown worker (it should register again), FAILED_PRECONDITION when the
 * epoch and session secret are not those of its current registration (fencing: a stale
 * incarnation, or someone else). The message never says the current epoch. A dead worker
 * heartbeating its current session is alive again. *state: the worker's state afterwards. */
dc_code registry_heartbeat(struct registry *r, const Devcoord__V1__HeartbeatRequest *req,
                           uint64_t now_ms, dc_worker_state *state, dc_status *st);

/* Ends the worker's current registration; refused as registry_heartbeat refuses. */
dc_code registry_deregister(struct registry *r, const Devcoord__V1__DeregisterWorkerRequest *req,
                            dc_status *st);

/* Marks workers silent past dead_after as dead, and forgets those dead for forget_after;
 * returns how many it marked dead. */
size_t registry_sweep(struct registry *r, uint64_t now_ms);

/* Records operator intent and applies it to the worker. NOT_FOUND when no such worker is
 * registered. When the intent changes it is saved first (registry_store): a failed save is
 * returned, prefixed "cannot save operator intent", and nothing changes. out (may be NULL)
 * gets the worker afterwards. */
dc_code registry_set_intent(struct registry *r, const char *name, enum registry_intent intent,
                            uint64_t now_ms, struct arena *a, Devcoord__V1__WorkerInfo **out,
                            dc_status *st);

/* Intent of every worker that has one: calls fn for each, under the read lock. */
void registry_each_intent(struct registry *r,
                          void (*fn)(void *arg, const char *name, enum registry_intent intent),
                          void *arg);

/* Forgets every worker and every intent (a coordinator that stops leading: what it knew
 * is another leader's now). Workers alive are reported gone (GONE_DEREGISTERED), so ops on
 * them fail. */
void registry_reset(struct registry *r);

/* Restores intent without saving it (loading persisted state). */
bool registry_restore_intent(struct registry *r, const char *name, enum registry_intent intent);

dc_code registry_list_workers(struct registry *r, uint64_t now_ms, struct arena *a,
                              Devcoord__V1__ListWorkersResponse *out, dc_status *st);
dc_code registry_list_devices(struct registry *r, const Devcoord__V1__ListDevicesRequest *req,
                              struct arena *a, Devcoord__V1__ListDevicesResponse *out,
                              dc_status *st);
dc_code registry_get_device(struct registry *r, const char *name, struct arena *a,
                            Devcoord__V1__DeviceInfo **out, dc_status *st);
void registry_cluster_status(struct registry *r, struct arena *a,
                             Devcoord__V1__GetClusterStatusResponse *out);

/* Validation against the registry (design §4 rules 6-8): validate_op with the registry as
 * lookup, under the read lock. */
dc_code registry_validate(struct registry *r, const struct op_spec *op,
                          const struct validate_limits *limits, dc_device_ref *out,
                          char group_id[VALIDATE_GROUP_ID_SIZE], dc_status *st);

/* The data address and epoch of a registered, live worker; false otherwise. */
bool registry_worker_address(struct registry *r, const char *name, char *address, size_t cap,
                             uint64_t *epoch);

/* Workers by state and devices by backend and state, as the metrics and the status page
 * show them (a dead worker's devices are dead). */
struct registry_counts {
    uint32_t workers[DC_WORKER_STATE_COUNT];
    uint32_t devices[DC_BACKEND_COUNT][DC_DEVICE_STATE_COUNT];
};
void registry_count(struct registry *r, struct registry_counts *out);

/* Workers by state, devices by backend and state, heartbeats received (Prometheus text). */
struct mbuf;
void registry_metrics_render(struct registry *r, struct mbuf *b);

#endif
