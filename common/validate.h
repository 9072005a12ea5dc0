/*
 * Validation of a submitted operation (design §4, rules 1-8, in that order) and the plan's
 * device list it produces. Rules 1-5 are pure; rules 6-8 ask the registry through
 * struct validate_lookup, which the coordinator implements and tests fake. The caller owns
 * every buffer passed in.
 */
#ifndef DEVCOORD_COMMON_VALIDATE_H
#define DEVCOORD_COMMON_VALIDATE_H

#include <stdbool.h>
#include <stddef.h>

#include "devcoord/types.h"

enum autodiff_policy {
    AUTODIFF_STRIP = 0, /* depth 1 stripped, deeper rejected, mixed wrapping is a variant */
    AUTODIFF_UNWRAP_ALL,
    AUTODIFF_REJECT,
};

/* "strip", "unwrap-all", "reject"; from_name returns -1 for anything else. */
const char *autodiff_policy_name(enum autodiff_policy policy);
int autodiff_policy_from_name(const char *name);

struct op_spec {
    dc_op_kind kind;
    dc_reduce_op reduce;
    uint32_t root; /* rank of the root for broadcast and reduce */
    const dc_device_ref *devices;
    size_t n_devices;
};

/* What the registry knows of one device. */
struct validate_device_info {
    /* 0: no such device; 1: found; more: an unqualified reference several workers match. */
    uint32_t matches;
    char worker[DC_WORKER_NAME_MAX + 1]; /* owner, resolved when the reference named none */
    dc_worker_state worker_state;
    bool healthy;
    bool collectives; /* the worker's executor runs collectives for this backend */
};

struct validate_lookup {
    /* Fills *info for the concrete device of ref (ref->worker may be ""). Called with ref
     * already unwrapped; must not fail otherwise. */
    void (*find)(void *arg, const dc_device_ref *ref, struct validate_device_info *info);
    void *arg;
};

struct validate_limits {
    size_t max_group_devices;
    enum autodiff_policy autodiff;
};

#define VALIDATE_GROUP_ID_SIZE 17 /* 16 hex digits and a NUL */

/* Rule 1 alone: at least one device, at most limits->max_group_devices. validate_op starts
 * with it; a caller that sizes buffers from a peer's device count applies it first. */
dc_code validate_device_count(size_t n, const struct validate_limits *limits, dc_status *st);

/*
 * Checks op against rules 1-8. On DC_OK, out[0..op->n_devices) holds the concrete devices
 * (no autodiff, owning worker named) in request order, and group_id their order-independent
 * id. On failure st says which rule and which devices[i]. out must have room for
 * op->n_devices entries (it is not touched when rule 1 fails). lookup NULL skips rules 6-8.
 */
dc_code validate_op(const struct op_spec *op, const struct validate_limits *limits,
                    const struct validate_lookup *lookup, dc_device_ref *out,
                    char group_id[VALIDATE_GROUP_ID_SIZE], dc_status *st);

/* Hash of the sorted concrete device list as 16 hex digits: the same for any order of the
 * same devices. DC_RESOURCE_EXHAUSTED when scratch memory cannot be had. */
dc_code validate_group_id(const dc_device_ref *devs, size_t n, char out[VALIDATE_GROUP_ID_SIZE],
                          dc_status *st);

/* An op's idempotency key (SubmitOpRequest.idempotency_key): "" (none), or at most
 * DC_IDEMPOTENCY_KEY_MAX bytes without control characters; INVALID_ARGUMENT otherwise. */
dc_code validate_idempotency_key(const char *key, dc_status *st);

#endif
