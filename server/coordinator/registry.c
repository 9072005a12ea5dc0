/*
 * The registry's one lock guards five views of the same workers — the name index and its
 * sorted order (for paging), the device indexes (by cluster name, and by concrete device for
 * resolving a device named without its worker), liveness and fencing, operator intent, and
 * the answers built from them — which is why they stay in one file of ~1,200 lines:
 * splitting them would spread one invariant (every index agrees with the workers under the
 * lock) over several files. The sections below follow that order.
 */
#include "registry.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "address.h"
#include "clock.h"
#include "device.h"
#include "log.h"
#include "metrics.h"
#include "pbwire.h"
#include "status.h"
#include "strmap.h"

struct reg_device {
    struct reg_worker *worker;
    dc_device device;
    uint64_t memory_bytes;
    bool healthy;
};

struct reg_label {
    char *key;
    char *value;
};

struct reg_worker {
    char name[DC_WORKER_NAME_MAX + 1];
    char *address;
    char *executor;
    struct reg_label *labels;
    size_t n_labels;
    struct reg_device *devices;
    size_t n_devices;
    bool collectives[DC_BACKEND_COUNT];
    uint64_t max_message_bytes; /* of its data address, 0: not said */
    uint64_t epoch;
    uint8_t secret[AUTH_SESSION_SECRET_SIZE]; /* of this epoch, see registry_session */
    uint64_t last_heartbeat_ms;
    uint64_t dead_since_ms; /* when the sweep found it dead; valid while !alive */
    bool alive;
};

/* Workers that own one concrete device name ("cuda:0"), to resolve unqualified refs. */
struct owners {
    size_t n, cap;
    struct reg_device **devs;
};

struct registry {
    pthread_rwlock_t lock;
    struct registry_opts opts;
    struct strmap workers;     /* name -> reg_worker */
    struct reg_worker **order; /* by name, for listing and paging */
    size_t n_order, cap_order;
    size_t n_devices;      /* of every registered worker, against max_devices */
    struct strmap devices; /* "worker/concrete" -> reg_device */
    struct strmap owners;  /* "concrete" -> owners */
    struct strmap intents; /* name -> (uintptr_t)enum registry_intent */
    /* Serializes intent changes from their save to their application (registry_store). */
    pthread_mutex_t intent_mu;
    uint64_t last_epoch;
    atomic_ullong heartbeats;
};

struct registry *
registry_new(const struct registry_opts *opts)
{
    struct registry *r = calloc(1, sizeof(*r));

    if (r == NULL) {
        return NULL;
    }
    pthread_rwlock_init(&r->lock, NULL);
    pthread_mutex_init(&r->intent_mu, NULL);
    r->opts = *opts;
    strmap_init(&r->workers);
    strmap_init(&r->devices);
    strmap_init(&r->owners);
    strmap_init(&r->intents);
    return r;
}

static void
reg_worker_free(struct reg_worker *w)
{
    if (w == NULL) {
        return;
    }
    free(w->address);
    free(w->executor);
    for (size_t i = 0; i < w->n_labels; i++) {
        free(w->labels[i].key);
        free(w->labels[i].value);
    }
    free(w->labels);
    free(w->devices);
    memset(w->secret, 0, sizeof(w->secret));
    free(w);
}

void
registry_free(struct registry *r)
{
    const char *k;
    void *v;

    if (r == NULL) {
        return;
    }
    for (size_t i = 0; i < r->n_order; i++) {
        reg_worker_free(r->order[i]);
    }
    for (size_t i = 0; strmap_next(&r->owners, &i, &k, &v);) {
        struct owners *o = v;
        free(o->devs);
        free(o);
    }
    free(r->order);
    strmap_fini(&r->workers);
    strmap_fini(&r->devices);
    strmap_fini(&r->owners);
    strmap_fini(&r->intents);
    pthread_mutex_destroy(&r->intent_mu);
    pthread_rwlock_destroy(&r->lock);
    free(r);
}

static enum registry_intent
intent_of(const struct registry *r, const char *name)
{
    return (enum registry_intent)(uintptr_t)strmap_get(&r->intents, name);
}

static dc_worker_state
worker_state(const struct registry *r, const struct reg_worker *w)
{
    if (!w->alive) {
        return DC_WORKER_DEAD;
    }
    switch (intent_of(r, w->name)) {
    case INTENT_CORDON:
        return DC_WORKER_CORDONED;
    case INTENT_DRAIN:
        return DC_WORKER_DRAINING;
    default:
        return DC_WORKER_ALIVE;
    }
}

static dc_device_state
device_state(const struct reg_device *d)
{
    if (!d->worker->alive) {
        return DC_DEVICE_DEAD;
    }
    return d->healthy ? DC_DEVICE_HEALTHY : DC_DEVICE_UNHEALTHY;
}

/* Position of the first worker whose name is >= name in r->order. */
static size_t
order_lower_bound(const struct registry *r, const char *name)
{
    size_t lo = 0, hi = r->n_order;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(r->order[mid]->name, name) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* ---- indexes ----------------------------------------------------------------------------- */

static void
owners_remove(struct registry *r, const char *concrete, struct reg_device *d)
{
    struct owners *o = strmap_get(&r->owners, concrete);

    if (o == NULL) {
        return;
    }
    for (size_t i = 0; i < o->n; i++) {
        if (o->devs[i] == d) {
            o->devs[i] = o->devs[--o->n];
            break;
        }
    }
    if (o->n == 0) {
        strmap_del(&r->owners, concrete);
        free(o->devs);
        free(o);
    }
}

static bool
owners_add(struct registry *r, const char *concrete, struct reg_device *d)
{
    struct owners *o = strmap_get(&r->owners, concrete);

    if (o == NULL) {
        if ((o = calloc(1, sizeof(*o))) == NULL) {
            return false;
        }
        if (!strmap_put(&r->owners, concrete, o)) {
            free(o);
            return false;
        }
    }
    if (o->n == o->cap) {
        size_t cap               = o->cap ? o->cap * 2 : 2;
        struct reg_device **grow = realloc(o->devs, cap * sizeof(*grow));
        if (grow == NULL) {
            if (o->n == 0) {
                strmap_del(&r->owners, concrete);
                free(o);
            }
            return false;
        }
        o->devs = grow;
        o->cap  = cap;
    }
    o->devs[o->n++] = d;
    return true;
}

/* Takes w out of every index (not freed). */
static void
registry_unlink(struct registry *r, struct reg_worker *w)
{
    char name[DC_DEVICE_TEXT_SIZE];
    size_t at;

    for (size_t i = 0; i < w->n_devices; i++) {
        device_cluster_name(w->name, &w->devices[i].device, name, sizeof(name));
        strmap_del(&r->devices, name);
        dc_device_format(&w->devices[i].device, name, sizeof(name));
        owners_remove(r, name, &w->devices[i]);
    }
    strmap_del(&r->workers, w->name);
    at = order_lower_bound(r, w->name);
    if (at < r->n_order && r->order[at] == w) {
        memmove(&r->order[at], &r->order[at + 1], (r->n_order - at - 1) * sizeof(*r->order));
        r->n_order--;
        r->n_devices -= w->n_devices;
    }
}

/* Puts w into every index; on failure leaves none of it in. */
static bool
registry_link(struct registry *r, struct reg_worker *w)
{
    char name[DC_DEVICE_TEXT_SIZE];
    size_t at, linked = 0;

    if (r->n_order == r->cap_order) {
        size_t cap               = r->cap_order ? r->cap_order * 2 : 64;
        struct reg_worker **grow = realloc(r->order, cap * sizeof(*grow));
        if (grow == NULL) {
            return false;
        }
        r->order     = grow;
        r->cap_order = cap;
    }
    if (!strmap_put(&r->workers, w->name, w)) {
        return false;
    }
    for (; linked < w->n_devices; linked++) {
        struct reg_device *d = &w->devices[linked];
        device_cluster_name(w->name, &d->device, name, sizeof(name));
        if (!strmap_put(&r->devices, name, d)) {
            break;
        }
        dc_device_format(&d->device, name, sizeof(name));
        if (!owners_add(r, name, d)) {
            device_cluster_name(w->name, &d->device, name, sizeof(name));
            strmap_del(&r->devices, name);
            break;
        }
    }
    if (linked < w->n_devices) {
        size_t n     = w->n_devices;
        w->n_devices = linked;
        registry_unlink(r, w);
        w->n_devices = n;
        return false;
    }
    at = order_lower_bound(r, w->name);
    memmove(&r->order[at + 1], &r->order[at], (r->n_order - at) * sizeof(*r->order));
    r->order[at] = w;
    r->n_order++;
    r->n_devices += w->n_devices;
    return true;
}

/* ---- membership -------------------------------------------------------------------------- */

/* Builds a worker from a registration, checking every field a peer sent. */
static dc_code
reg_worker_from_request(const struct registry *r, const Devcoord__V1__RegisterWorkerRequest *req,
                        struct reg_worker **out, dc_status *st)
{
    struct reg_worker *w;
    size_t nlen = strnlen(req->name, DC_WORKER_NAME_MAX + 1);
    const char *why;
    dc_code code;

    *out = NULL;
    if (!device_worker_name_valid(req->name, nlen)) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid worker name (expected [A-Za-z0-9][A-Za-z0-9._-]{0,62})");
    }
    if ((why = address_problem(req->address)) != NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "invalid data address for worker %s: %s",
                          req->name, why);
    }
    if (req->n_devices == 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "worker %s registers 0 devices (at least 1)",
                          req->name);
    }
    if (r->opts.max_devices_per_worker != 0 && req->n_devices > r->opts.max_devices_per_worker) {
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "worker %s registers %zu devices, over limits.max_devices_per_worker "
                          "(%" PRIu32 ")",
                          req->name, req->n_devices, r->opts.max_devices_per_worker);
    }
    /* Names, labels and addresses end up in log lines, listings and terminals: a control
     * character in one could forge a log line or drive a terminal (address_problem and
     * the worker-name grammar refuse them too). */
    if (log_has_control(req->executor)) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "worker %s: control character in the executor name", req->name);
    }
    if (req->n_labels > REGISTRY_MAX_LABELS) {
        return status_set(st, DC_INVALID_ARGUMENT, "worker %s has %zu labels (at most %d)",
                          req->name, req->n_labels, REGISTRY_MAX_LABELS);
    }
    if ((w = calloc(1, sizeof(*w))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    memcpy(w->name, req->name, nlen);
    w->address  = strdup(req->address);
    w->executor = strndup(req->executor, 31);
    w->labels   = calloc(req->n_labels ? req->n_labels : 1, sizeof(*w->labels));
    w->devices  = calloc(req->n_devices, sizeof(*w->devices));
    if (w->address == NULL || w->executor == NULL || w->labels == NULL || w->devices == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < req->n_labels; i++) {
        const Devcoord__V1__Label *l = req->labels[i];
        if (strlen(l->key) == 0 || strlen(l->key) > REGISTRY_MAX_LABEL_LEN ||
            strlen(l->value) > REGISTRY_MAX_LABEL_LEN || strchr(l->key, '=') != NULL ||
            log_has_control(l->key) || log_has_control(l->value)) {
            code = status_set(st, DC_INVALID_ARGUMENT,
                              "worker %s: label %zu invalid (key 1 to %d bytes without '=', "
                              "value at most %d, no control characters in either)",
                              w->name, i, REGISTRY_MAX_LABEL_LEN, REGISTRY_MAX_LABEL_LEN);
            goto fail;
        }
        w->labels[i].key   = strdup(l->key);
        w->labels[i].value = strdup(l->value);
        w->n_labels        = i + 1;
        if (w->labels[i].key == NULL || w->labels[i].value == NULL) {
            code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            goto fail;
        }
    }
    for (size_t i = 0; i < req->n_devices; i++) {
        struct reg_device *d = &w->devices[i];
        if (req->devices[i] == NULL) {
            code = status_set(st, DC_INVALID_ARGUMENT, "worker %s: device %zu missing", w->name, i);
            goto fail;
        }
        if ((code = device_from_pb(req->devices[i]->device, &d->device, st)) != DC_OK) {
            status_prefix(st, "invalid device");
            goto fail;
        }
        d->worker       = w;
        d->memory_bytes = req->devices[i]->memory_bytes;
        d->healthy      = req->devices[i]->healthy;
    }
    for (size_t i = 0; i < req->n_collective_backends; i++) {
        int b = (int)req->collective_backends[i];
        if (b <= DC_BACKEND_NONE || b >= DC_BACKEND_COUNT) {
            code = status_set(st, DC_INVALID_ARGUMENT, "worker %s: unknown collective backend %d",
                              w->name, b);
            goto fail;
        }
        w->collectives[b] = true;
    }
    w->n_devices         = req->n_devices;
    w->max_message_bytes = req->max_message_bytes;
    *out                 = w;
    return DC_OK;
fail:
    reg_worker_free(w);
    return code;
}

/* Whether w fits within max_workers and max_devices, replacing old (NULL: a new name).
 * Lock held. Dead workers count until they are forgotten: they are still listed, and they
 * may come back. */
static dc_code
registry_room(const struct registry *r, const struct reg_worker *w, const struct reg_worker *old,
              dc_status *st)
{
    size_t devices = r->n_devices - (old != NULL ? old->n_devices : 0) + w->n_devices;

    if (old == NULL && r->opts.max_workers != 0 && r->n_order >= r->opts.max_workers) {
        size_t dead = 0;
        for (size_t i = 0; i < r->n_order; i++) {
            dead += !r->order[i]->alive;
        }
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "cannot register worker %s: limits.max_workers (%" PRIu32
                          ") reached, %zu of them dead (dead workers are forgotten after "
                          "heartbeat.forget_after_ms)",
                          w->name, r->opts.max_workers, dead);
    }
    if (r->opts.max_devices != 0 && devices > r->opts.max_devices) {
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "cannot register worker %s: its %zu devices would make %zu, over "
                          "limits.max_devices (%" PRIu32 ")",
                          w->name, w->n_devices, devices, r->opts.max_devices);
    }
    return DC_OK;
}

static int
device_cmp(const void *a, const void *b)
{
    const struct reg_device *x = a, *y = b;
    dc_device_ref rx = { .device = x->device }, ry = { .device = y->device };
    return device_ref_compare_concrete(&rx, &ry);
}

dc_code
registry_register(struct registry *r, const Devcoord__V1__RegisterWorkerRequest *req,
                  uint64_t now_ms, struct registry_session *out, dc_status *st)
{
    struct reg_worker *w, *old;
    uint64_t old_epoch = 0;
    bool old_alive     = false;
    dc_code code;

    if ((code = reg_worker_from_request(r, req, &w, st)) != DC_OK) {
        return code;
    }
    /* Devices in canonical order, so listings and pages are stable; a device named twice is
     * refused. */
    qsort(w->devices, w->n_devices, sizeof(*w->devices), device_cmp);
    for (size_t i = 1; i < w->n_devices; i++) {
        if (device_cmp(&w->devices[i - 1], &w->devices[i]) == 0) {
            char text[DC_DEVICE_TEXT_SIZE];
            dc_device_format(&w->devices[i].device, text, sizeof(text));
            reg_worker_free(w);
            return status_set(st, DC_INVALID_ARGUMENT, "worker %s registers %s twice", req->name,
                              text);
        }
    }
    if ((code = auth_random_bytes(w->secret, sizeof(w->secret), st)) != DC_OK) {
        reg_worker_free(w);
        return code;
    }
    w->last_heartbeat_ms = now_ms;
    w->alive             = true;

    pthread_rwlock_wrlock(&r->lock);
    old = strmap_get(&r->workers, w->name);
    if ((code = registry_room(r, w, old, st)) != DC_OK) {
        pthread_rwlock_unlock(&r->lock);
        reg_worker_free(w);
        return code;
    }
    if (old != NULL) {
        old_epoch = old->epoch;
        old_alive = old->alive;
        registry_unlink(r, old);
    }
    /* Epochs are wall-clock milliseconds when that is larger, so they keep growing across
     * coordinator restarts. */
    w->epoch      = r->last_epoch + 1 > clock_unix_ms() ? r->last_epoch + 1 : clock_unix_ms();
    r->last_epoch = w->epoch;
    if (!registry_link(r, w)) {
        if (old != NULL && !registry_link(r, old)) {
            reg_worker_free(old);
            old = NULL;
        }
        pthread_rwlock_unlock(&r->lock);
        reg_worker_free(w);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory registering a worker");
    }
    out->epoch = w->epoch;
    memcpy(out->secret, w->secret, sizeof(out->secret));
    pthread_rwlock_unlock(&r->lock);

    if (old != NULL) {
        reg_worker_free(old);
        if (old_alive && r->opts.events.worker_gone != NULL) {
            r->opts.events.worker_gone(r->opts.events.arg, req->name, old_epoch, GONE_REPLACED);
        }
    }
    return DC_OK;
}

/* Whether a call's epoch and secret are those of w's current registration. Both are
 * compared whatever the other's outcome, so that neither the time nor the answer (one
 * message for both, see session_refused) tells a caller whether its epoch was the current
 * one. The secret is what authorises: epochs are public. */
static bool
session_matches(const struct reg_worker *w, uint64_t epoch, const ProtobufCBinaryData *secret)
{
    bool epoch_ok  = w->epoch == epoch;
    bool secret_ok = auth_equal(w->secret, sizeof(w->secret), secret->data, secret->len);

    return epoch_ok & secret_ok;
}

/* The refusal of a stale or foreign session. It names no epoch: an epoch in an error would
 * tell whoever sent a wrong one which is current. */
static dc_code
session_refused(dc_status *st, const char *name)
{
    return status_set(st, DC_FAILED_PRECONDITION,
                      "worker %.64s: stale epoch or wrong session secret (only its current "
                      "registration may heartbeat or deregister)",
                      name);
}

dc_code
registry_heartbeat(struct registry *r, const Devcoord__V1__HeartbeatRequest *req, uint64_t now_ms,
                   dc_worker_state *state, dc_status *st)
{
    struct reg_worker *w;

    atomic_fetch_add(&r->heartbeats, 1);
    pthread_rwlock_wrlock(&r->lock);
    if ((w = strmap_get(&r->workers, req->name)) == NULL) {
        pthread_rwlock_unlock(&r->lock);
        return status_set(st, DC_NOT_FOUND, "worker %.64s is not registered: register again",
                          req->name);
    }
    if (!session_matches(w, req->epoch, &req->session_secret)) {
        pthread_rwlock_unlock(&r->lock);
        return session_refused(st, req->name);
    }
    if (req->n_devices > w->n_devices) {
        /* Each is matched against every registered device under the write lock: a list
         * longer than the registration is no health report, and would stall the registry. */
        size_t registered = w->n_devices;
        pthread_rwlock_unlock(&r->lock);
        return status_set(st, DC_INVALID_ARGUMENT,
                          "heartbeat of worker %.64s names %zu devices; it registered %zu",
                          req->name, req->n_devices, registered);
    }
    w->last_heartbeat_ms = now_ms;
    w->alive             = true;
    for (size_t i = 0; i < req->n_devices; i++) {
        dc_device dev;
        if (req->devices[i] == NULL ||
            device_from_pb(req->devices[i]->device, &dev, NULL) != DC_OK) {
            continue;
        }
        for (size_t k = 0; k < w->n_devices; k++) {
            dc_device_ref a = { .device = dev }, b = { .device = w->devices[k].device };
            if (device_ref_compare_concrete(&a, &b) == 0) {
                w->devices[k].healthy = req->devices[i]->healthy;
            }
        }
    }
    *state = worker_state(r, w);
    pthread_rwlock_unlock(&r->lock);
    return DC_OK;
}

dc_code
registry_deregister(struct registry *r, const Devcoord__V1__DeregisterWorkerRequest *req,
                    dc_status *st)
{
    struct reg_worker *w;
    bool was_alive;

    pthread_rwlock_wrlock(&r->lock);
    if ((w = strmap_get(&r->workers, req->name)) == NULL) {
        pthread_rwlock_unlock(&r->lock);
        return status_set(st, DC_NOT_FOUND, "worker %.64s is not registered", req->name);
    }
    if (!session_matches(w, req->epoch, &req->session_secret)) {
        pthread_rwlock_unlock(&r->lock);
        return session_refused(st, req->name);
    }
    was_alive = w->alive;
    registry_unlink(r, w);
    pthread_rwlock_unlock(&r->lock);
    reg_worker_free(w);
    if (was_alive && r->opts.events.worker_gone != NULL) {
        r->opts.events.worker_gone(r->opts.events.arg, req->name, req->epoch, GONE_DEREGISTERED);
    }
    return DC_OK;
}

/* Whether w, dead, has been dead for forget_after. */
static bool
worker_forgettable(const struct registry *r, const struct reg_worker *w, uint64_t now_ms)
{
    return !w->alive && r->opts.forget_after_ms != 0 && now_ms > w->dead_since_ms &&
           now_ms - w->dead_since_ms >= r->opts.forget_after_ms;
}

/*
 * Dead workers are forgotten rather than kept forever: a registry that only grows lets any
 * peer with a worker token fill the coordinator's memory with names that never come back
 * (issue 12). Their operator intent stays in r->intents (and in the state file), so a
 * returning worker is cordoned or draining again as it was left, unless an uncordon of the
 * name cleared it meanwhile (registry_set_intent).
 */
size_t
registry_sweep(struct registry *r, uint64_t now_ms)
{
    struct died {
        char name[DC_WORKER_NAME_MAX + 1];
        uint64_t epoch;
    } *died                  = NULL;
    struct reg_worker **gone = NULL;
    size_t n = 0, n_gone = 0;

    pthread_rwlock_wrlock(&r->lock);
    for (size_t i = 0; i < r->n_order; i++) {
        struct reg_worker *w = r->order[i];
        /* now_ms was read before the lock: a heartbeat may have landed since, later than
         * it. Such a worker is not late. */
        if (w->alive && now_ms > w->last_heartbeat_ms &&
            now_ms - w->last_heartbeat_ms > r->opts.dead_after_ms) {
            struct died *grow = realloc(died, (n + 1) * sizeof(*died));
            w->alive          = false;
            w->dead_since_ms  = now_ms;
            if (grow == NULL) {
                continue; /* still dead; only the notice is lost */
            }
            died = grow;
            memcpy(died[n].name, w->name, sizeof(died[n].name));
            died[n++].epoch = w->epoch;
        } else if (worker_forgettable(r, w, now_ms)) {
            struct reg_worker **grow = realloc(gone, (n_gone + 1) * sizeof(*gone));
            if (grow == NULL) {
                continue; /* forgotten at a later sweep */
            }
            gone           = grow;
            gone[n_gone++] = w;
            registry_unlink(r, w);
            i--; /* r->order moved down by one */
        }
    }
    pthread_rwlock_unlock(&r->lock);
    for (size_t i = 0; i < n && r->opts.events.worker_gone != NULL; i++) {
        r->opts.events.worker_gone(r->opts.events.arg, died[i].name, died[i].epoch, GONE_DEAD);
    }
    for (size_t i = 0; i < n_gone; i++) {
        log_info("worker %s forgotten: dead for %" PRIu32 " ms (heartbeat.forget_after_ms)",
                 gone[i]->name, r->opts.forget_after_ms);
        reg_worker_free(gone[i]);
    }
    free(died);
    free(gone);
    return n;
}

void
registry_reset(struct registry *r)
{
    struct reg_worker **all;
    size_t n;

    pthread_mutex_lock(&r->intent_mu);
    pthread_rwlock_wrlock(&r->lock);
    n   = r->n_order;
    all = r->order;
    /* The indexes are emptied whole rather than worker by worker. */
    r->order     = NULL;
    r->n_order   = 0;
    r->cap_order = 0;
    r->n_devices = 0;
    {
        const char *k;
        void *v;
        for (size_t i = 0; strmap_next(&r->owners, &i, &k, &v);) {
            struct owners *o = v;
            free(o->devs);
            free(o);
        }
    }
    strmap_fini(&r->workers);
    strmap_fini(&r->devices);
    strmap_fini(&r->owners);
    strmap_fini(&r->intents);
    strmap_init(&r->workers);
    strmap_init(&r->devices);
    strmap_init(&r->owners);
    strmap_init(&r->intents);
    pthread_rwlock_unlock(&r->lock);
    pthread_mutex_unlock(&r->intent_mu);
    for (size_t i = 0; i < n; i++) {
        if (all[i]->alive && r->opts.events.worker_gone != NULL) {
            r->opts.events.worker_gone(r->opts.events.arg, all[i]->name, all[i]->epoch,
                                       GONE_DEREGISTERED);
        }
        reg_worker_free(all[i]);
    }
    free(all);
}

/* ---- responses --------------------------------------------------------------------------- */

static Devcoord__V1__WorkerInfo *
worker_info(const struct registry *r, const struct reg_worker *w, uint64_t now_ms, struct arena *a)
{
    Devcoord__V1__WorkerInfo *wi = arena_alloc(a, sizeof(*wi));
    size_t nc                    = 0;

    if (wi == NULL) {
        return NULL;
    }
    devcoord__v1__worker_info__init(wi);
    wi->name                = arena_strdup(a, w->name);
    wi->address             = arena_strdup(a, w->address);
    wi->executor            = arena_strdup(a, w->executor);
    wi->state               = (Devcoord__V1__WorkerState)worker_state(r, w);
    wi->epoch               = w->epoch;
    wi->max_message_bytes   = w->max_message_bytes;
    wi->device_count        = (uint32_t)w->n_devices;
    wi->since_heartbeat_ms  = now_ms - w->last_heartbeat_ms;
    wi->labels              = arena_alloc(a, (w->n_labels + 1) * sizeof(*wi->labels));
    wi->collective_backends = arena_alloc(a, DC_BACKEND_COUNT * sizeof(*wi->collective_backends));
    if (wi->name == NULL || wi->address == NULL || wi->executor == NULL || wi->labels == NULL ||
        wi->collective_backends == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < w->n_labels; i++) {
        Devcoord__V1__Label *l = arena_alloc(a, sizeof(*l));
        if (l == NULL) {
            return NULL;
        }
        devcoord__v1__label__init(l);
        l->key   = arena_strdup(a, w->labels[i].key);
        l->value = arena_strdup(a, w->labels[i].value);
        if (l->key == NULL || l->value == NULL) {
            return NULL;
        }
        wi->labels[i] = l;
    }
    wi->n_labels = w->n_labels;
    for (int b = 1; b < DC_BACKEND_COUNT; b++) {
        if (w->collectives[b]) {
            wi->collective_backends[nc++] = (Devcoord__V1__Backend)b;
        }
    }
    wi->n_collective_backends = nc;
    return wi;
}

/* d as a DeviceInfo in *pb and *dev, its cluster name written into name (DC_DEVICE_TEXT_SIZE
 * bytes); the strings stay the caller's and the registry's. False when the name does not fit. */
static bool
device_info_fill(const struct reg_device *d, char *name, Devcoord__V1__DeviceInfo *pb,
                 Devcoord__V1__Device *dev)
{
    if (device_cluster_name(d->worker->name, &d->device, name, DC_DEVICE_TEXT_SIZE) >=
        DC_DEVICE_TEXT_SIZE) {
        return false;
    }
    devcoord__v1__device_info__init(pb);
    device_to_pb(&d->device, dev);
    pb->name         = name;
    pb->worker       = d->worker->name;
    pb->device       = dev;
    pb->state        = (Devcoord__V1__DeviceState)device_state(d);
    pb->memory_bytes = d->memory_bytes;
    return true;
}

/* d as a DeviceInfo in a, strings and all (GetDevice). */
static Devcoord__V1__DeviceInfo *
device_info(const struct reg_device *d, struct arena *a)
{
    /* One allocation for the message and its device. */
    struct {
        Devcoord__V1__DeviceInfo di;
        Devcoord__V1__Device dev;
    } *m = arena_alloc(a, sizeof(*m));
    char name[DC_DEVICE_TEXT_SIZE];

    if (m == NULL || !device_info_fill(d, name, &m->di, &m->dev) ||
        (m->di.name = arena_strdup(a, name)) == NULL ||
        (m->di.worker = arena_strdup(a, d->worker->name)) == NULL) {
        return NULL;
    }
    return &m->di;
}

dc_code
registry_list_workers(struct registry *r, uint64_t now_ms, struct arena *a,
                      Devcoord__V1__ListWorkersResponse *out, dc_status *st)
{
    dc_code code = DC_OK;

    devcoord__v1__list_workers_response__init(out);
    pthread_rwlock_rdlock(&r->lock);
    out->workers = arena_alloc(a, (r->n_order + 1) * sizeof(*out->workers));
    for (size_t i = 0; out->workers != NULL && i < r->n_order; i++) {
        if ((out->workers[i] = worker_info(r, r->order[i], now_ms, a)) == NULL) {
            break;
        }
        out->n_workers = i + 1;
    }
    if (out->workers == NULL || out->n_workers != r->n_order) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory listing workers");
    }
    pthread_rwlock_unlock(&r->lock);
    return code;
}

static bool
worker_has_label(const struct reg_worker *w, const char *kv)
{
    const char *eq = strchr(kv, '=');
    size_t klen    = eq != NULL ? (size_t)(eq - kv) : strlen(kv);

    for (size_t i = 0; i < w->n_labels; i++) {
        if (strlen(w->labels[i].key) == klen && memcmp(w->labels[i].key, kv, klen) == 0 &&
            (eq == NULL || strcmp(w->labels[i].value, eq + 1) == 0)) {
            return true;
        }
    }
    return false;
}

static bool
device_matches(const Devcoord__V1__ListDevicesRequest *req, const struct reg_device *d)
{
    if (req->backend != DEVCOORD__V1__BACKEND__BACKEND_UNSPECIFIED &&
        (int)req->backend != (int)d->device.backend) {
        return false;
    }
    if (req->state != DEVCOORD__V1__DEVICE_STATE__DEVICE_STATE_UNSPECIFIED &&
        (int)req->state != (int)device_state(d)) {
        return false;
    }
    return req->label[0] == '\0' || worker_has_label(d->worker, req->label);
}

/* Device d of a listing, packed (pbwire) as field 1 of ListDevicesResponse into *f: protobuf-c
 * writes a message's unknown fields as they are, after its known ones. Packed this way, the
 * page costs one pass over its devices, where protobuf-c's packing of 32k DeviceInfo structs
 * walks each one's descriptor three times (sizes, then sizes again, then bytes). */
static bool
list_device(const struct reg_device *d, struct arena *a, ProtobufCMessageUnknownField *f)
{
    char name[DC_DEVICE_TEXT_SIZE];
    Devcoord__V1__DeviceInfo pb;
    Devcoord__V1__Device dev;

    return device_info_fill(d, name, &pb, &dev) && pbwire_device_info_field(a, 1, &pb, f);
}

/* Page tokens are "<worker>/<n>": resume at that worker, after its first n devices. */
static bool
page_token_parse(const char *token, char worker[DC_WORKER_NAME_MAX + 1], size_t *skip)
{
    const char *slash = strrchr(token, '/');
    char *end;
    unsigned long long n;

    if (slash == NULL || slash == token || (size_t)(slash - token) > DC_WORKER_NAME_MAX) {
        return false;
    }
    n = strtoull(slash + 1, &end, 10);
    if (*end != '\0' || end == slash + 1 || n > UINT32_MAX) {
        return false;
    }
    memcpy(worker, token, (size_t)(slash - token));
    worker[slash - token] = '\0';
    *skip                 = (size_t)n;
    return true;
}

dc_code
registry_list_devices(struct registry *r, const Devcoord__V1__ListDevicesRequest *req,
                      struct arena *a, Devcoord__V1__ListDevicesResponse *out, dc_status *st)
{
    size_t page  = req->page_size ? req->page_size : REGISTRY_DEFAULT_PAGE;
    size_t first = 0, last, skip = 0;
    char resume[DC_WORKER_NAME_MAX + 1] = "";
    dc_code code                        = DC_OK;

    devcoord__v1__list_devices_response__init(out);
    if (page > REGISTRY_DEFAULT_PAGE) {
        page = REGISTRY_DEFAULT_PAGE;
    }
    if (req->page_token[0] != '\0' && !page_token_parse(req->page_token, resume, &skip)) {
        return status_set(st, DC_INVALID_ARGUMENT, "invalid page token");
    }
    /* The devices go out already packed, each as field 1 of the reply (see list_device). */
    if ((out->base.unknown_fields = arena_alloc(a, page * sizeof(*out->base.unknown_fields))) ==
        NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory listing devices");
    }
    pthread_rwlock_rdlock(&r->lock);
    last = r->n_order;
    if (req->worker[0] != '\0') {
        first = order_lower_bound(r, req->worker);
        last  = first < r->n_order && strcmp(r->order[first]->name, req->worker) == 0 ? first + 1
                                                                                      : first;
    }
    if (resume[0] != '\0') {
        size_t at = order_lower_bound(r, resume);
        if (at > first) {
            first = at;
        }
        if (first < r->n_order && strcmp(r->order[first]->name, resume) != 0) {
            skip = 0; /* that worker left: carry on with the next */
        }
    }
    for (size_t i = first; i < last && code == DC_OK; i++, skip = 0) {
        struct reg_worker *w = r->order[i];
        for (size_t k = skip; k < w->n_devices; k++) {
            if (!device_matches(req, &w->devices[k])) {
                continue;
            }
            if (out->base.n_unknown_fields == page) {
                char token[DC_WORKER_NAME_MAX + 24];
                snprintf(token, sizeof(token), "%s/%zu", w->name, k);
                out->next_page_token = arena_strdup(a, token);
                goto done;
            }
            if (!list_device(&w->devices[k], a,
                             &out->base.unknown_fields[out->base.n_unknown_fields])) {
                code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory listing devices");
                break;
            }
            out->base.n_unknown_fields++;
        }
    }
done:
    if (req->page_token[0] == '\0' && out->next_page_token != NULL) {
        /* A first page that is not the last: count the rest too (cheap: no messages). */
        out->total = out->base.n_unknown_fields;
        for (size_t i = first; i < last; i++) {
            struct reg_worker *w = r->order[i];
            for (size_t k = 0; k < w->n_devices; k++) {
                out->total += device_matches(req, &w->devices[k]);
            }
        }
        out->total -= out->base.n_unknown_fields; /* the loop counted this page's again */
    } else if (req->page_token[0] == '\0') {
        out->total = out->base.n_unknown_fields;
    }
    pthread_rwlock_unlock(&r->lock);
    if (out->next_page_token == NULL) {
        out->next_page_token = (char *)protobuf_c_empty_string;
    }
    return code;
}

dc_code
registry_get_device(struct registry *r, const char *name, struct arena *a,
                    Devcoord__V1__DeviceInfo **out, dc_status *st)
{
    dc_device_ref ref;
    char key[DC_DEVICE_TEXT_SIZE];
    struct reg_device *d = NULL;
    dc_code code;

    if ((code = dc_device_ref_parse(name, strnlen(name, DC_DEVICE_TEXT_MAX + 1), &ref, st)) !=
        DC_OK) {
        status_prefix(st, "invalid device name");
        return code;
    }
    if (ref.autodiff_depth > 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "a device name has no autodiff: %.256s", name);
    }
    pthread_rwlock_rdlock(&r->lock);
    if (ref.worker[0] != '\0') {
        device_cluster_name(ref.worker, &ref.device, key, sizeof(key));
        d = strmap_get(&r->devices, key);
    } else {
        struct owners *o;
        dc_device_format(&ref.device, key, sizeof(key));
        if ((o = strmap_get(&r->owners, key)) != NULL && o->n > 1) {
            pthread_rwlock_unlock(&r->lock);
            return status_set(st, DC_INVALID_ARGUMENT,
                              "device %s is on %zu workers: name one as worker/%s", key, o->n, key);
        }
        d = o != NULL ? o->devs[0] : NULL;
    }
    if (d == NULL) {
        pthread_rwlock_unlock(&r->lock);
        return status_set(st, DC_NOT_FOUND, "unknown device %.256s", name);
    }
    *out = device_info(d, a);
    pthread_rwlock_unlock(&r->lock);
    return *out != NULL ? DC_OK : status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
}

void
registry_cluster_status(struct registry *r, struct arena *a,
                        Devcoord__V1__GetClusterStatusResponse *out)
{
    uint32_t by_backend[DC_BACKEND_COUNT] = { 0 };
    size_t n                              = 0;

    pthread_rwlock_rdlock(&r->lock);
    for (size_t i = 0; i < r->n_order; i++) {
        struct reg_worker *w = r->order[i];
        switch (worker_state(r, w)) {
        case DC_WORKER_DEAD:
            out->workers_dead++;
            continue; /* its devices are counted as gone */
        case DC_WORKER_CORDONED:
            out->workers_cordoned++;
            break;
        case DC_WORKER_DRAINING:
            out->workers_draining++;
            break;
        default:
            out->workers_alive++;
            break;
        }
        for (size_t k = 0; k < w->n_devices; k++) {
            by_backend[w->devices[k].device.backend]++;
        }
    }
    pthread_rwlock_unlock(&r->lock);
    out->devices = arena_alloc(a, DC_BACKEND_COUNT * sizeof(*out->devices));
    for (int b = 1; out->devices != NULL && b < DC_BACKEND_COUNT; b++) {
        Devcoord__V1__BackendCount *bc;
        if (by_backend[b] == 0 || (bc = arena_alloc(a, sizeof(*bc))) == NULL) {
            continue;
        }
        devcoord__v1__backend_count__init(bc);
        bc->backend       = (Devcoord__V1__Backend)b;
        bc->count         = by_backend[b];
        out->devices[n++] = bc;
    }
    out->n_devices = n;
}

/* ---- intent ------------------------------------------------------------------------------ */

/* What an uncordon answers for a name not registered: the name, dead, nothing else. */
static Devcoord__V1__WorkerInfo *
absent_info(const char *name, struct arena *a)
{
    Devcoord__V1__WorkerInfo *wi = arena_alloc(a, sizeof(*wi));

    if (wi == NULL) {
        return NULL;
    }
    devcoord__v1__worker_info__init(wi);
    wi->name  = arena_strdup(a, name);
    wi->state = DEVCOORD__V1__WORKER_STATE__WORKER_DEAD;
    return wi->name != NULL ? wi : NULL;
}

/* Every worker's intent as it will be once `name` has `intent`: what the store saves.
 * Lock held. The caller frees *out. */
static bool
intent_snapshot(const struct registry *r, const char *name, enum registry_intent intent,
                struct registry_intent_entry **out, size_t *n)
{
    struct registry_intent_entry *e = malloc((r->intents.len + 1) * sizeof(*e));
    const char *k;
    void *v;

    *out = e;
    *n   = 0;
    if (e == NULL) {
        return false;
    }
    for (size_t i = 0; strmap_next(&r->intents, &i, &k, &v);) {
        enum registry_intent in = (enum registry_intent)(uintptr_t)v;
        if (in != INTENT_NONE && strcmp(k, name) != 0) {
            snprintf(e[*n].name, sizeof(e[*n].name), "%s", k);
            e[(*n)++].intent = in;
        }
    }
    if (intent != INTENT_NONE) {
        snprintf(e[*n].name, sizeof(e[*n].name), "%s", name);
        e[(*n)++].intent = intent;
    }
    return true;
}

/*
 * Save first, then apply: the new intent is written to the store before anyone can see it,
 * and a failed save leaves the registry as it was. So that applying cannot fail once the
 * save has succeeded, the worker's key is put into the intent map (with INTENT_NONE, which
 * reads as no intent) before the save: replacing a value never allocates. intent_mu keeps
 * other changes out between the snapshot and the application.
 */
dc_code
registry_set_intent(struct registry *r, const char *name, enum registry_intent intent,
                    uint64_t now_ms, struct arena *a, Devcoord__V1__WorkerInfo **out, dc_status *st)
{
    struct registry_intent_entry *entries = NULL;
    struct reg_worker *w;
    size_t n = 0;
    bool change, ok = true, reserved = false;
    dc_code code = DC_OK;

    pthread_mutex_lock(&r->intent_mu);
    pthread_rwlock_wrlock(&r->lock);
    if (strmap_get(&r->workers, name) == NULL &&
        (intent != INTENT_NONE || intent_of(r, name) == INTENT_NONE)) {
        /* Only an uncordon reaches a name not registered: it clears the intent kept for a
         * worker that was forgotten (or deregistered), which nothing else could. */
        pthread_rwlock_unlock(&r->lock);
        pthread_mutex_unlock(&r->intent_mu);
        return status_set(st, DC_NOT_FOUND, "worker %.64s is not registered", name);
    }
    change = intent_of(r, name) != intent;
    if (change && r->opts.store.save != NULL) {
        if (intent != INTENT_NONE && intent_of(r, name) == INTENT_NONE) {
            reserved = strmap_put(&r->intents, name, (void *)(uintptr_t)INTENT_NONE);
            ok       = reserved;
        }
        ok = ok && intent_snapshot(r, name, intent, &entries, &n);
    }
    pthread_rwlock_unlock(&r->lock);
    if (!ok) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    } else if (change && r->opts.store.save != NULL) {
        if ((code = r->opts.store.save(r->opts.store.arg, entries, n, st)) != DC_OK) {
            status_prefix(st, "cannot save operator intent");
        }
    }
    free(entries);

    pthread_rwlock_wrlock(&r->lock);
    if (code != DC_OK) {
        if (reserved) {
            strmap_del(&r->intents, name);
        }
    } else if (change && intent == INTENT_NONE) {
        strmap_del(&r->intents, name);
    } else if (change && !strmap_put(&r->intents, name, (void *)(uintptr_t)intent)) {
        /* Only without a store: with one, the key was reserved above. */
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (code == DC_OK && out != NULL) {
        if ((w = strmap_get(&r->workers, name)) == NULL && intent == INTENT_NONE) {
            /* Not registered (or it left meanwhile): nothing kept for it any more. */
            if ((*out = absent_info(name, a)) == NULL) {
                code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory describing worker %s",
                                  name);
            }
        } else if (w == NULL) {
            /* It deregistered (or was forgotten) while the lock was not held. */
            code = status_set(st, DC_NOT_FOUND,
                              "worker %s left meanwhile; its intent is kept for its return", name);
        } else if ((*out = worker_info(r, w, now_ms, a)) == NULL) {
            code =
                status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory describing worker %s", name);
        }
    }
    pthread_rwlock_unlock(&r->lock);
    pthread_mutex_unlock(&r->intent_mu);
    return code;
}

bool
registry_restore_intent(struct registry *r, const char *name, enum registry_intent intent)
{
    bool ok = true;

    pthread_rwlock_wrlock(&r->lock);
    if (intent != INTENT_NONE) {
        ok = strmap_put(&r->intents, name, (void *)(uintptr_t)intent);
    }
    pthread_rwlock_unlock(&r->lock);
    return ok;
}

void
registry_each_intent(struct registry *r,
                     void (*fn)(void *arg, const char *name, enum registry_intent intent),
                     void *arg)
{
    const char *k;
    void *v;

    pthread_rwlock_rdlock(&r->lock);
    for (size_t i = 0; strmap_next(&r->intents, &i, &k, &v);) {
        if ((enum registry_intent)(uintptr_t)v != INTENT_NONE) { /* not a reserved key */
            fn(arg, k, (enum registry_intent)(uintptr_t)v);
        }
    }
    pthread_rwlock_unlock(&r->lock);
}

/* ---- validation -------------------------------------------------------------------------- */

static void
registry_find(void *arg, const dc_device_ref *ref, struct validate_device_info *info)
{
    struct registry *r = arg;
    char key[DC_DEVICE_TEXT_SIZE];
    struct reg_device *d = NULL;

    memset(info, 0, sizeof(*info));
    if (ref->worker[0] != '\0') {
        device_cluster_name(ref->worker, &ref->device, key, sizeof(key));
        d             = strmap_get(&r->devices, key);
        info->matches = d != NULL;
    } else {
        struct owners *o;
        dc_device_format(&ref->device, key, sizeof(key));
        if ((o = strmap_get(&r->owners, key)) != NULL) {
            info->matches = (uint32_t)o->n;
            d             = o->devs[0];
        }
    }
    if (d == NULL) {
        return;
    }
    memcpy(info->worker, d->worker->name, sizeof(info->worker));
    info->worker_state = worker_state(r, d->worker);
    info->healthy      = d->healthy;
    info->collectives  = d->worker->collectives[d->device.backend];
}

dc_code
registry_validate(struct registry *r, const struct op_spec *op,
                  const struct validate_limits *limits, dc_device_ref *out,
                  char group_id[VALIDATE_GROUP_ID_SIZE], dc_status *st)
{
    struct validate_lookup lookup = { registry_find, r };
    dc_code code;

    pthread_rwlock_rdlock(&r->lock);
    code = validate_op(op, limits, &lookup, out, group_id, st);
    pthread_rwlock_unlock(&r->lock);
    return code;
}

bool
registry_worker_address(struct registry *r, const char *name, char *address, size_t cap,
                        uint64_t *epoch)
{
    struct reg_worker *w;
    bool ok = false;

    pthread_rwlock_rdlock(&r->lock);
    if ((w = strmap_get(&r->workers, name)) != NULL && w->alive) {
        snprintf(address, cap, "%s", w->address);
        *epoch = w->epoch;
        ok     = true;
    }
    pthread_rwlock_unlock(&r->lock);
    return ok;
}

void
registry_count(struct registry *r, struct registry_counts *out)
{
    memset(out, 0, sizeof(*out));
    pthread_rwlock_rdlock(&r->lock);
    for (size_t i = 0; i < r->n_order; i++) {
        struct reg_worker *w = r->order[i];
        out->workers[worker_state(r, w)]++;
        for (size_t k = 0; k < w->n_devices; k++) {
            out->devices[w->devices[k].device.backend][device_state(&w->devices[k])]++;
        }
    }
    pthread_rwlock_unlock(&r->lock);
}

void
registry_metrics_render(struct registry *r, struct mbuf *b)
{
    struct registry_counts counts;

    registry_count(r, &counts);
    mbuf_printf(b, "# HELP devcoord_workers Registered workers by state.\n"
                   "# TYPE devcoord_workers gauge\n");
    for (int s = DC_WORKER_ALIVE; s < DC_WORKER_STATE_COUNT; s++) {
        mbuf_printf(b, "devcoord_workers{state=\"%s\"} %u\n",
                    dc_worker_state_name((dc_worker_state)s), counts.workers[s]);
    }
    mbuf_printf(b, "# HELP devcoord_devices Registered devices by backend and state.\n"
                   "# TYPE devcoord_devices gauge\n");
    for (int bk = DC_BACKEND_CPU; bk < DC_BACKEND_COUNT; bk++) {
        for (int s = DC_DEVICE_HEALTHY; s < DC_DEVICE_STATE_COUNT; s++) {
            if (counts.devices[bk][s] > 0) {
                mbuf_printf(b, "devcoord_devices{backend=\"%s\",state=\"%s\"} %u\n",
                            dc_backend_name((dc_backend)bk),
                            dc_device_state_name((dc_device_state)s), counts.devices[bk][s]);
            }
        }
    }
    mbuf_printf(b,
                "# HELP devcoord_heartbeats_total Heartbeats received.\n"
                "# TYPE devcoord_heartbeats_total counter\n"
                "devcoord_heartbeats_total %llu\n",
                (unsigned long long)atomic_load(&r->heartbeats));
}
