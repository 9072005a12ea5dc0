#include "validate.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "log.h"
#include "status.h"

static const char *const policy_names[] = {
    [AUTODIFF_STRIP]      = "strip",
    [AUTODIFF_UNWRAP_ALL] = "unwrap-all",
    [AUTODIFF_REJECT]     = "reject",
};

const char *
autodiff_policy_name(enum autodiff_policy policy)
{
    if ((unsigned)policy > AUTODIFF_REJECT) {
        return NULL;
    }
    return policy_names[policy];
}

int
autodiff_policy_from_name(const char *name)
{
    for (int i = AUTODIFF_STRIP; i <= AUTODIFF_REJECT; i++) {
        if (strcmp(policy_names[i], name) == 0) {
            return i;
        }
    }
    return -1;
}

/* Fails with `code` and "<what>: devices[i] = <text of the entry as the request wrote it>". */
static dc_code
fail_at(dc_status *st, dc_code code, const struct op_spec *op, size_t i, const char *what)
{
    char text[DC_DEVICE_TEXT_SIZE];

    dc_device_ref_format(&op->devices[i], text, sizeof(text));
    status_set_index(st, code, (int32_t)i, "%s: devices[%zu] = %s", what, i, text);
    if (op->devices[i].worker[0] != '\0') {
        status_set_worker(st, op->devices[i].worker);
    }
    return code;
}

/* Rule 2. */
static dc_code
check_operation(const struct op_spec *op, dc_status *st)
{
    const char *kname = dc_op_kind_name(op->kind);

    if (kname == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid operation: unknown kind %d (expected all-reduce, reduce, "
                          "broadcast, all-gather or barrier)",
                          (int)op->kind);
    }
    if (op->kind == DC_OP_REDUCE_SCATTER) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid operation: reduce-scatter is a group call (every rank calls "
                          "it), not an op to submit");
    }
    if ((op->kind == DC_OP_ALL_REDUCE || op->kind == DC_OP_REDUCE) &&
        dc_reduce_op_name(op->reduce) == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid operation: %s needs a reduce op (sum, mean, min, max or prod)",
                          kname);
    }
    if ((op->kind == DC_OP_BROADCAST || op->kind == DC_OP_REDUCE) && op->root >= op->n_devices) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid operation: root %u is outside the %zu devices of the %s",
                          op->root, op->n_devices, kname);
    }
    return DC_OK;
}

/* Rule 3. */
static dc_code
check_autodiff(const struct op_spec *op, enum autodiff_policy policy, dc_status *st)
{
    for (size_t i = 0; i < op->n_devices; i++) {
        uint32_t depth = op->devices[i].autodiff_depth;
        if (policy == AUTODIFF_STRIP && depth >= 2) {
            return fail_at(st, DC_INVALID_ARGUMENT, op, i,
                           "autodiff should not wrap an autodiff device");
        }
        if (policy == AUTODIFF_REJECT && depth >= 1) {
            return fail_at(st, DC_INVALID_ARGUMENT, op, i, "autodiff devices are not accepted");
        }
    }
    return DC_OK;
}

/* Rule 4: one backend; under strip, wrapping counts as part of the variant. */
static dc_code
check_variant(const struct op_spec *op, enum autodiff_policy policy, dc_status *st)
{
    const dc_device_ref *first = &op->devices[0];

    for (size_t i = 1; i < op->n_devices; i++) {
        const dc_device_ref *d = &op->devices[i];
        if (d->device.backend != first->device.backend ||
            (policy == AUTODIFF_STRIP && (d->autodiff_depth > 0) != (first->autodiff_depth > 0))) {
            return fail_at(st, DC_INVALID_ARGUMENT, op, i,
                           "all devices are expected to be of the same variant");
        }
    }
    return DC_OK;
}

static int
ref_ptr_compare(const void *a, const void *b)
{
    const dc_device_ref *const *x = a;
    const dc_device_ref *const *y = b;
    int c                         = device_ref_compare_concrete(*x, *y);

    if (c != 0) {
        return c;
    }
    return *x < *y ? -1 : (*x > *y ? 1 : 0);
}

/* Pointers to devs[0..n) sorted by concrete device, then by position. Caller frees. */
static const dc_device_ref **
sorted_refs(const dc_device_ref *devs, size_t n)
{
    const dc_device_ref **v = calloc(n ? n : 1, sizeof(*v));

    if (v == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = &devs[i];
    }
    qsort(v, n, sizeof(*v), ref_ptr_compare);
    return v;
}

/* Rule 5 on the concrete list: reports the first entry, in request order, that repeats an
 * earlier one. */
static dc_code
check_duplicates(const struct op_spec *op, const dc_device_ref *concrete, dc_status *st)
{
    const dc_device_ref **v = sorted_refs(concrete, op->n_devices);
    size_t dup = SIZE_MAX, first = 0;
    char text[DC_DEVICE_TEXT_SIZE];

    if (v == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory checking duplicates");
    }
    for (size_t i = 1; i < op->n_devices; i++) {
        /* v is ordered by position within a run of equal devices, so v[i] repeats v[i-1]
         * and the run's first element is the earlier occurrence. */
        if (device_ref_compare_concrete(v[i - 1], v[i]) == 0) {
            size_t at = (size_t)(v[i] - concrete);
            if (at < dup) {
                size_t j = i - 1;
                while (j > 0 && device_ref_compare_concrete(v[j - 1], v[i]) == 0) {
                    j--;
                }
                dup   = at;
                first = (size_t)(v[j] - concrete);
            }
        }
    }
    free(v);
    if (dup == SIZE_MAX) {
        return DC_OK;
    }
    /* "duplicate device: devices[3] = x (same as devices[1])" */
    dc_device_ref_format(&op->devices[dup], text, sizeof(text));
    status_set_index(st, DC_INVALID_ARGUMENT, (int32_t)dup,
                     "duplicate device: devices[%zu] = %s (same as devices[%zu])", dup, text,
                     first);
    if (op->devices[dup].worker[0] != '\0') {
        status_set_worker(st, op->devices[dup].worker);
    }
    return DC_INVALID_ARGUMENT;
}

/* Rules 6-8, each over the whole list before the next. */
static dc_code
check_registry(const struct op_spec *op, const dc_device_ref *concrete,
               const struct validate_device_info *info, dc_status *st)
{
    char what[DC_STATUS_MESSAGE_MAX / 2];
    char name[DC_DEVICE_TEXT_SIZE];

    for (size_t i = 0; i < op->n_devices; i++) {
        if (info[i].matches == 0) {
            return fail_at(st, DC_NOT_FOUND, op, i, "unknown device");
        }
        if (info[i].matches > 1) {
            snprintf(what, sizeof(what),
                     "unknown device (ambiguous: %u workers have it; name one as worker/device)",
                     info[i].matches);
            return fail_at(st, DC_INVALID_ARGUMENT, op, i, what);
        }
    }
    for (size_t i = 0; i < op->n_devices; i++) {
        dc_code code = DC_FAILED_PRECONDITION;
        const char *state;

        switch (info[i].worker_state) {
        case DC_WORKER_ALIVE:
            state = NULL;
            break;
        case DC_WORKER_DEAD:
            code  = DC_UNAVAILABLE;
            state = "dead";
            break;
        case DC_WORKER_CORDONED:
            state = "cordoned";
            break;
        case DC_WORKER_DRAINING:
            state = "draining";
            break;
        default:
            state = "not alive";
            break;
        }
        if (state != NULL) {
            snprintf(what, sizeof(what), "worker %s is %s", info[i].worker, state);
            fail_at(st, code, op, i, what);
            status_set_worker(st, info[i].worker);
            return code;
        }
        if (!info[i].healthy) {
            dc_device_ref_format(&concrete[i], name, sizeof(name));
            snprintf(what, sizeof(what), "device %s is unhealthy", name);
            fail_at(st, DC_FAILED_PRECONDITION, op, i, what);
            status_set_worker(st, info[i].worker);
            return DC_FAILED_PRECONDITION;
        }
    }
    for (size_t i = 0; i < op->n_devices; i++) {
        if (!info[i].collectives) {
            dc_device_ref_format(&concrete[i], name, sizeof(name));
            snprintf(what, sizeof(what),
                     "distributed operations are not supported for device %s (worker %s runs no "
                     "collectives for %s)",
                     name, info[i].worker, dc_backend_name(concrete[i].device.backend));
            fail_at(st, DC_FAILED_PRECONDITION, op, i, what);
            status_set_worker(st, info[i].worker);
            return DC_FAILED_PRECONDITION;
        }
    }
    return DC_OK;
}

dc_code
validate_device_count(size_t n, const struct validate_limits *limits, dc_status *st)
{
    if (n == 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "empty device list");
    }
    if (n > limits->max_group_devices) {
        return status_set(st, DC_INVALID_ARGUMENT, "too many devices: %zu, at most %zu", n,
                          limits->max_group_devices);
    }
    return DC_OK;
}

dc_code
validate_op(const struct op_spec *op, const struct validate_limits *limits,
            const struct validate_lookup *lookup, dc_device_ref *out,
            char group_id[VALIDATE_GROUP_ID_SIZE], dc_status *st)
{
    struct validate_device_info *info = NULL;
    dc_code rv;

    if ((rv = validate_device_count(op->n_devices, limits, st)) != DC_OK ||
        (rv = check_operation(op, st)) != DC_OK ||
        (rv = check_autodiff(op, limits->autodiff, st)) != DC_OK ||
        (rv = check_variant(op, limits->autodiff, st)) != DC_OK) {
        return rv;
    }
    for (size_t i = 0; i < op->n_devices; i++) {
        out[i]                = op->devices[i];
        out[i].autodiff_depth = 0;
        if (out[i].device.kind == DC_KIND_NONE) {
            out[i].device.kind = device_default_kind(out[i].device.backend);
        }
    }
    if (lookup != NULL) {
        /* Resolve unqualified references before looking for duplicates, so "cuda:0" and
         * "node-a/cuda:0" on a one-worker cluster are seen as the same device. */
        if ((info = calloc(op->n_devices, sizeof(*info))) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory validating devices");
        }
        for (size_t i = 0; i < op->n_devices; i++) {
            lookup->find(lookup->arg, &out[i], &info[i]);
            if (out[i].worker[0] == '\0' && info[i].matches == 1) {
                memcpy(out[i].worker, info[i].worker, sizeof(out[i].worker));
            }
        }
    }
    if ((rv = check_duplicates(op, out, st)) != DC_OK ||
        (info != NULL && (rv = check_registry(op, out, info, st)) != DC_OK)) {
        goto out;
    }
    rv = validate_group_id(out, op->n_devices, group_id, st);
out:
    free(info);
    return rv;
}

dc_code
validate_group_id(const dc_device_ref *devs, size_t n, char out[VALIDATE_GROUP_ID_SIZE],
                  dc_status *st)
{
    const dc_device_ref **v = sorted_refs(devs, n);
    uint64_t h              = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    char name[DC_DEVICE_TEXT_SIZE];

    if (v == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory hashing the device group");
    }
    for (size_t i = 0; i < n; i++) {
        dc_device_ref c = *v[i];
        size_t len;

        c.autodiff_depth = 0;
        len              = dc_device_ref_format(&c, name, sizeof(name));
        for (size_t k = 0; k < len && k < sizeof(name) - 1; k++) {
            h = (h ^ (unsigned char)name[k]) * 0x100000001b3ull;
        }
        h = (h ^ '\n') * 0x100000001b3ull;
    }
    free(v);
    snprintf(out, VALIDATE_GROUP_ID_SIZE, "%016llx", (unsigned long long)h);
    return DC_OK;
}

dc_code
validate_idempotency_key(const char *key, dc_status *st)
{
    size_t len = strnlen(key, DC_IDEMPOTENCY_KEY_MAX + 1);

    if (len > DC_IDEMPOTENCY_KEY_MAX) {
        return status_set(st, DC_INVALID_ARGUMENT, "idempotency key longer than %d bytes",
                          DC_IDEMPOTENCY_KEY_MAX);
    }
    if (log_has_control(key)) {
        return status_set(st, DC_INVALID_ARGUMENT, "control character in the idempotency key");
    }
    return DC_OK;
}
