/*
 * The plan of a validated op (design §4): its concrete devices in rank order, grouped by
 * owning worker with each worker's data address, epoch and ranks, plus the group id; and the
 * plan's wire form. Pure but for struct plan_lookup, through which it asks the registry for
 * worker addresses (tests fake it). The caller owns the struct plan; plan_fini frees what
 * plan_build put in it.
 */
#ifndef DEVCOORD_COORDINATOR_PLAN_H
#define DEVCOORD_COORDINATOR_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "address.h"
#include "arena.h"
#include "devcoord/types.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "status.h"
#include "validate.h"

struct plan_worker {
    char name[DC_WORKER_NAME_MAX + 1];
    char address[ADDRESS_MAX + 1]; /* its data address, where Execute goes */
    uint64_t epoch;                /* the registration the plan was made against */
    const uint32_t *ranks;         /* the ranks of its devices, ascending; inside the plan */
    size_t n_ranks;
};

struct plan {
    char group_id[VALIDATE_GROUP_ID_SIZE];
    dc_device_ref *devices; /* concrete, rank order: rank i is devices[i] of the request */
    size_t n_devices;
    struct plan_worker *workers; /* in order of each worker's first device */
    size_t n_workers;
    uint32_t *ranks; /* storage for every worker's ranks */
};

struct plan_lookup {
    /* The data address (into address[cap]) and epoch of worker `name` when it is registered
     * and alive; false otherwise. */
    bool (*worker)(void *arg, const char *name, char *address, size_t cap, uint64_t *epoch);
    void *arg;
};

/*
 * Builds *p (which need not be initialised) from validate_op's result: devices[0..n), the
 * concrete devices with their owning worker named, in request order, and their group id.
 * Asks lookup once per worker. On failure *p is empty (plan_fini is harmless) and st says why:
 * UNAVAILABLE naming a worker the lookup does not know as alive, or RESOURCE_EXHAUSTED.
 */
dc_code plan_build(struct plan *p, const dc_device_ref *devices, size_t n,
                   const char group_id[VALIDATE_GROUP_ID_SIZE], const struct plan_lookup *lookup,
                   dc_status *st);

/* Frees what plan_build allocated and empties *p. */
void plan_fini(struct plan *p);

/* The plan as the wire carries it, strings copied into a; NULL when out of memory. */
Devcoord__V1__Plan *plan_pb(struct arena *a, const struct plan *p);

/* The devices a peer sent (a request's repeated DeviceRef), checked one by one, in new arrays
 * *refs and *concrete (room for validation's output; the caller frees both, also on failure).
 * The count comes from the wire and sizes both: rule 1 bounds it before anything is allocated.
 */
dc_code plan_request_devices(Devcoord__V1__DeviceRef *const *devices, size_t n,
                             const struct validate_limits *limits, dc_device_ref **refs,
                             dc_device_ref **concrete, dc_status *st);

#endif
