/*
 * Planning: from the validated concrete device list to the per-worker groups every worker of
 * the op receives. Ranks are positions in the request, so a caller decides who is rank 0;
 * the group id (computed by validation) depends only on the set of devices.
 */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

void
plan_fini(struct plan *p)
{
    free(p->devices);
    free(p->workers);
    free(p->ranks);
    memset(p, 0, sizeof(*p));
}

/* *index: where worker `name` is in p->workers, added (its address looked up) on first
 * sight. */
static dc_code
plan_worker_find(struct plan *p, const char *name, const struct plan_lookup *lookup, size_t *index,
                 dc_status *st)
{
    struct plan_worker *w;

    for (size_t i = 0; i < p->n_workers; i++) {
        if (strcmp(p->workers[i].name, name) == 0) {
            *index = i;
            return DC_OK;
        }
    }
    w = &p->workers[p->n_workers];
    snprintf(w->name, sizeof(w->name), "%s", name);
    if (!lookup->worker(lookup->arg, w->name, w->address, sizeof(w->address), &w->epoch)) {
        status_set(st, DC_UNAVAILABLE, "worker %s is dead", name);
        status_set_worker(st, name);
        return DC_UNAVAILABLE;
    }
    *index = p->n_workers++;
    return DC_OK;
}

dc_code
plan_build(struct plan *p, const dc_device_ref *devices, size_t n,
           const char group_id[VALIDATE_GROUP_ID_SIZE], const struct plan_lookup *lookup,
           dc_status *st)
{
    size_t *owner = NULL; /* rank -> index of its worker in p->workers */
    size_t start  = 0;
    dc_code rv    = DC_OK;

    memset(p, 0, sizeof(*p));
    snprintf(p->group_id, sizeof(p->group_id), "%s", group_id);
    if ((p->devices = calloc(n ? n : 1, sizeof(*p->devices))) == NULL ||
        (p->workers = calloc(n ? n : 1, sizeof(*p->workers))) == NULL ||
        (p->ranks = calloc(n ? n : 1, sizeof(*p->ranks))) == NULL ||
        (owner = calloc(n ? n : 1, sizeof(*owner))) == NULL) {
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory planning");
        goto out;
    }
    memcpy(p->devices, devices, n * sizeof(*devices));
    p->n_devices = n;
    for (size_t r = 0; r < n; r++) {
        if ((rv = plan_worker_find(p, devices[r].worker, lookup, &owner[r], st)) != DC_OK) {
            goto out;
        }
        p->workers[owner[r]].n_ranks++;
    }
    if (p->n_workers < n) {
        /* Made for one worker per device; an op is kept (history) with its plan. */
        struct plan_worker *fit = realloc(p->workers, p->n_workers * sizeof(*fit));
        if (fit != NULL) {
            p->workers = fit;
        }
    }
    /* Each worker's ranks are one slice of p->ranks, sized by the counts above; one pass in
     * rank order then fills every slice in ascending order. */
    for (size_t i = 0; i < p->n_workers; i++) {
        p->workers[i].ranks = p->ranks + start;
        start += p->workers[i].n_ranks;
        p->workers[i].n_ranks = 0;
    }
    for (size_t r = 0; r < n; r++) {
        struct plan_worker *w = &p->workers[owner[r]];
        size_t at             = (size_t)(w->ranks - p->ranks) + w->n_ranks++;
        p->ranks[at]          = (uint32_t)r;
    }
out:
    free(owner);
    if (rv != DC_OK) {
        plan_fini(p);
    }
    return rv;
}

Devcoord__V1__Plan *
plan_pb(struct arena *a, const struct plan *p)
{
    Devcoord__V1__Plan *pb = arena_alloc(a, sizeof(*pb));

    if (pb == NULL) {
        return NULL;
    }
    devcoord__v1__plan__init(pb);
    pb->group_id = arena_strdup(a, p->group_id);
    pb->devices  = arena_alloc(a, (p->n_devices + 1) * sizeof(*pb->devices));
    pb->workers  = arena_alloc(a, (p->n_workers + 1) * sizeof(*pb->workers));
    if (pb->group_id == NULL || pb->devices == NULL || pb->workers == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < p->n_devices; i++) {
        Devcoord__V1__DeviceRef *r = arena_alloc(a, sizeof(*r));
        Devcoord__V1__Device *d    = arena_alloc(a, sizeof(*d));
        if (r == NULL || d == NULL) {
            return NULL;
        }
        device_ref_to_pb(&p->devices[i], r, d);
        if ((r->worker = arena_strdup(a, p->devices[i].worker)) == NULL) {
            return NULL;
        }
        pb->devices[i] = r;
    }
    pb->n_devices = p->n_devices;
    for (size_t i = 0; i < p->n_workers; i++) {
        const struct plan_worker *pw = &p->workers[i];
        Devcoord__V1__PlanWorker *w  = arena_alloc(a, sizeof(*w));
        if (w == NULL) {
            return NULL;
        }
        devcoord__v1__plan_worker__init(w);
        w->name    = arena_strdup(a, pw->name);
        w->address = arena_strdup(a, pw->address);
        w->ranks   = arena_alloc(a, (pw->n_ranks + 1) * sizeof(*w->ranks));
        if (w->name == NULL || w->address == NULL || w->ranks == NULL) {
            return NULL;
        }
        memcpy(w->ranks, pw->ranks, pw->n_ranks * sizeof(*w->ranks));
        w->n_ranks     = pw->n_ranks;
        pb->workers[i] = w;
    }
    pb->n_workers = p->n_workers;
    return pb;
}

/* The request's devices as a peer sent them, checked one by one, in *refs; *concrete gets room
 * for validation's output. The count comes from the wire and sizes both: rule 1 bounds it
 * before anything is allocated. */
dc_code
plan_request_devices(Devcoord__V1__DeviceRef *const *devices, size_t n,
                     const struct validate_limits *limits, dc_device_ref **refs,
                     dc_device_ref **concrete, dc_status *st)
{
    dc_code rv;

    if ((rv = validate_device_count(n, limits, st)) != DC_OK) {
        return rv;
    }
    if ((*refs = calloc(n, sizeof(**refs))) == NULL ||
        (*concrete = calloc(n, sizeof(**concrete))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        if (device_ref_from_pb(devices[i], &(*refs)[i], st) != DC_OK) {
            char where[64];
            snprintf(where, sizeof(where), "invalid device: devices[%zu]", i);
            status_prefix(st, where);
            st->device_index = (int32_t)i;
            return DC_INVALID_ARGUMENT;
        }
    }
    return DC_OK;
}
