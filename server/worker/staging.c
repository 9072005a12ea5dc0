/*
 * The held ops of a worker (staging.h).
 *
 * Why a worker may discard on its own. A coordinator that dies between the phases would
 * leave staging held forever, so every hold has an end (ExecuteRequest.hold_ms, sized by the
 * coordinator to outlast its own wait for Commit answers). Discarding is safe for the data:
 * tensors keep their old values. It is the one way a commit can be partial: a Commit that
 * comes after the hold ran out finds the op discarded and says so (ABORTED), and the
 * coordinator reports the op as partially committed, naming this worker.
 *
 * Why the record of ended ops. Commit and Abort may come twice or late (a retried call, a
 * reply lost on the way); the record lets a second Commit answer OK without publishing
 * again, and a late one say truthfully that the op is gone and why.
 */
#include "staging.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "log.h"
#include "rpc.h"
#include "threadname.h"
#include "clock.h"

#define EXPIRE_TICK_MS 100

struct held {
    char id[OUTCOME_ID_MAX + 1];
    char key[DC_IDEMPOTENCY_KEY_MAX + 1];
    uint64_t hash;
    dc_device *devices;
    size_t n_devices;
    struct staging_output *outputs;
    size_t n_outputs;
    uint64_t expires_ms;
    struct held *next;
};

/* An op that left the staging: committed, or discarded and why. */
struct ended {
    char id[OUTCOME_ID_MAX + 1];
    bool committed;
    char why[160];
};

struct staging {
    struct executor *ex;
    pthread_mutex_t mtx;
    pthread_cond_t cv; /* wakes the expiry thread to stop */
    struct held *held;
    size_t n_held;
    struct outcomes outcomes;
    struct ended *ended; /* ring of STAGING_RECENT */
    size_t ended_next;
    bool stopping;
    pthread_t expirer;
};

static void
held_free(struct held *h)
{
    if (h == NULL) {
        return;
    }
    for (size_t i = 0; i < h->n_outputs; i++) {
        tensor_release(h->outputs[i].tensor);
    }
    free(h->outputs);
    free(h->devices);
    free(h);
}

/* Records how op id ended. s->mtx held. */
static void
ended_add_locked(struct staging *s, const char *id, bool committed, const char *why)
{
    struct ended *e = &s->ended[s->ended_next];

    snprintf(e->id, sizeof(e->id), "%s", id);
    e->committed = committed;
    snprintf(e->why, sizeof(e->why), "%s", why);
    s->ended_next = (s->ended_next + 1) % STAGING_RECENT;
}

static const struct ended *
ended_find_locked(const struct staging *s, const char *id)
{
    /* Newest first: an id is recorded once, but scan in the order that would matter. */
    for (size_t i = 0; i < STAGING_RECENT; i++) {
        const struct ended *e =
            &s->ended[(s->ended_next + STAGING_RECENT - 1 - i) % STAGING_RECENT];
        if (e->id[0] != '\0' && strcmp(e->id, id) == 0) {
            return e;
        }
    }
    return NULL;
}

/* Takes *pp out of the list, recording why; the caller frees it (outside the lock). s->mtx
 * held. */
static struct held *
held_unlink_locked(struct staging *s, struct held **pp, bool committed, const char *why)
{
    struct held *h = *pp;

    *pp     = h->next;
    h->next = NULL;
    s->n_held--;
    ended_add_locked(s, h->id, committed, why);
    return h;
}

static struct held **
held_find_locked(struct staging *s, const char *id)
{
    struct held **pp;

    for (pp = &s->held; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->id, id) == 0) {
            return pp;
        }
    }
    return NULL;
}

static void *
staging_expirer(void *arg)
{
    struct staging *s = arg;

    thread_name_set("dc-stage-expire");
    pthread_mutex_lock(&s->mtx);
    while (!s->stopping) {
        struct held *expired = NULL;
        uint64_t now         = rpc_now_ms();
        struct timespec ts;

        for (struct held **pp = &s->held; *pp != NULL;) {
            if ((*pp)->expires_ms <= now) {
                struct held *h = held_unlink_locked(s, pp, false,
                                                    "its hold ran out before Commit or Abort came");
                h->next        = expired;
                expired        = h;
            } else {
                pp = &(*pp)->next;
            }
        }
        pthread_mutex_unlock(&s->mtx);
        while (expired != NULL) {
            struct held *h = expired;
            expired        = h->next;
            log_info("op %s: staging discarded, no Commit or Abort came in time", h->id);
            held_free(h);
        }
        pthread_mutex_lock(&s->mtx);
        ts = clock_deadline_ms(EXPIRE_TICK_MS);
        if (!s->stopping) {
            pthread_cond_timedwait(&s->cv, &s->mtx, &ts);
        }
    }
    pthread_mutex_unlock(&s->mtx);
    return NULL;
}

struct staging *
staging_new(struct executor *ex)
{
    struct staging *s = calloc(1, sizeof(*s));

    if (s == NULL) {
        return NULL;
    }
    s->ex = ex;
    if ((s->ended = calloc(STAGING_RECENT, sizeof(*s->ended))) == NULL ||
        !outcomes_init(&s->outcomes, OUTCOMES_MAX)) {
        outcomes_fini(&s->outcomes);
        free(s->ended);
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->mtx, NULL);
    clock_cond_init(&s->cv);
    if (pthread_create(&s->expirer, NULL, staging_expirer, s) != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mtx);
        outcomes_fini(&s->outcomes);
        free(s->ended);
        free(s);
        return NULL;
    }
    return s;
}

void
staging_free(struct staging *s)
{
    if (s == NULL) {
        return;
    }
    pthread_mutex_lock(&s->mtx);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mtx);
    pthread_join(s->expirer, NULL);
    while (s->held != NULL) {
        struct held *h = s->held;
        s->held        = h->next;
        held_free(h);
    }
    outcomes_fini(&s->outcomes);
    free(s->ended);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mtx);
    free(s);
}

dc_code
staging_hold(struct staging *s, const struct staging_op *op, dc_status *st)
{
    struct held *h = calloc(1, sizeof(*h));

    if (h == NULL ||
        (h->devices = calloc(op->n_devices ? op->n_devices : 1, sizeof(*h->devices))) == NULL ||
        (h->outputs = calloc(op->n_outputs ? op->n_outputs : 1, sizeof(*h->outputs))) == NULL) {
        if (h != NULL) {
            free(h->devices);
            free(h);
        }
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory holding op %.64s", op->op_id);
    }
    snprintf(h->id, sizeof(h->id), "%s", op->op_id);
    snprintf(h->key, sizeof(h->key), "%s", op->key);
    h->hash       = op->hash;
    h->expires_ms = op->expires_ms;
    h->n_devices  = op->n_devices;
    if (op->n_devices > 0) {
        memcpy(h->devices, op->devices, op->n_devices * sizeof(*h->devices));
    }
    pthread_mutex_lock(&s->mtx);
    /* An Abort may come while the op is between its last exchange and here. */
    if (ended_find_locked(s, h->id) != NULL) {
        pthread_mutex_unlock(&s->mtx);
        held_free(h);
        return status_set(st, DC_ABORTED, "op %.64s was aborted before it was prepared", op->op_id);
    }
    if (s->n_held >= STAGING_MAX_OPS) {
        pthread_mutex_unlock(&s->mtx);
        held_free(h);
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "%d ops are prepared on this worker and wait for Commit",
                          STAGING_MAX_OPS);
    }
    /* The references move in only now that nothing can fail. */
    h->n_outputs = op->n_outputs;
    if (op->n_outputs > 0) {
        memcpy(h->outputs, op->outputs, op->n_outputs * sizeof(*h->outputs));
    }
    h->next = s->held;
    s->held = h;
    s->n_held++;
    pthread_mutex_unlock(&s->mtx);
    return DC_OK;
}

dc_code
staging_commit(struct staging *s, const char *op_id, uint32_t *published, dc_status *st)
{
    struct executor_publish *pubs = NULL;
    const struct ended *e;
    struct held **pp, *h = NULL;
    dc_code rv = DC_OK;

    *published = 0;
    pthread_mutex_lock(&s->mtx);
    if ((pp = held_find_locked(s, op_id)) == NULL) {
        if ((e = ended_find_locked(s, op_id)) == NULL) {
            rv = status_set(st, DC_NOT_FOUND, "no prepared op %.64s on this worker", op_id);
        } else if (!e->committed) {
            rv = status_set(st, DC_ABORTED, "op %.64s was discarded on this worker: %s", op_id,
                            e->why);
        }
        goto out;
    }
    h = *pp;
    if ((pubs = calloc(h->n_outputs ? h->n_outputs : 1, sizeof(*pubs))) == NULL) {
        h  = held_unlink_locked(s, pp, false, "out of memory publishing it");
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory publishing op %.64s", op_id);
        goto out;
    }
    for (size_t i = 0; i < h->n_outputs; i++) {
        pubs[i] = (struct executor_publish){ &h->outputs[i].device, h->outputs[i].name,
                                             h->outputs[i].tensor };
    }
    if ((rv = executor_store_all(s->ex, pubs, h->n_outputs, st)) != DC_OK) {
        char why[160];
        snprintf(why, sizeof(why), "publishing failed: %.120s", st->message);
        h = held_unlink_locked(s, pp, false, why);
        goto out;
    }
    /* Remembered by key once published: a retry must then find it. Out of memory here only
     * costs the memory of this key, not the commit. */
    if (h->key[0] != '\0' && !outcomes_add(&s->outcomes, h->key, h->hash, h->id)) {
        log_warn("op %s: out of memory remembering its idempotency key", h->id);
    }
    *published = (uint32_t)h->n_outputs;
    h          = held_unlink_locked(s, pp, true, "committed");
out:
    pthread_mutex_unlock(&s->mtx);
    free(pubs);
    held_free(h);
    return rv;
}

bool
staging_abort(struct staging *s, const char *op_id)
{
    struct held **pp, *h = NULL;

    pthread_mutex_lock(&s->mtx);
    if ((pp = held_find_locked(s, op_id)) != NULL) {
        h = held_unlink_locked(s, pp, false, "aborted by the coordinator");
    } else if (ended_find_locked(s, op_id) == NULL) {
        /* Not prepared yet, perhaps about to be: staging_hold will refuse it. */
        ended_add_locked(s, op_id, false, "aborted by the coordinator");
    }
    pthread_mutex_unlock(&s->mtx);
    held_free(h);
    return h != NULL;
}

static bool
held_uses(const struct held *h, const dc_device *devices, size_t n)
{
    for (size_t i = 0; i < h->n_devices; i++) {
        for (size_t j = 0; j < n; j++) {
            dc_device_ref a = { .device = h->devices[i] }, b = { .device = devices[j] };
            if (device_ref_compare_concrete(&a, &b) == 0) {
                return true;
            }
        }
    }
    return false;
}

void
staging_supersede(struct staging *s, const dc_device *devices, size_t n, const char *by)
{
    struct held *gone = NULL;
    char why[160];

    snprintf(why, sizeof(why), "op %.64s started on its devices before Commit came", by);
    pthread_mutex_lock(&s->mtx);
    for (struct held **pp = &s->held; *pp != NULL;) {
        if (strcmp((*pp)->id, by) != 0 && held_uses(*pp, devices, n)) {
            struct held *h = held_unlink_locked(s, pp, false, why);
            h->next        = gone;
            gone           = h;
        } else {
            pp = &(*pp)->next;
        }
    }
    pthread_mutex_unlock(&s->mtx);
    while (gone != NULL) {
        struct held *h = gone;
        gone           = h->next;
        log_info("op %s: staging discarded, %s", h->id, why);
        held_free(h);
    }
}

bool
staging_committed_key(struct staging *s, const char *key, uint64_t *hash, char *op_id, size_t cap)
{
    const struct outcome *o;
    bool found;

    pthread_mutex_lock(&s->mtx);
    if ((found = (o = outcomes_find(&s->outcomes, key)) != NULL)) {
        *hash = o->hash;
        snprintf(op_id, cap, "%s", o->op_id);
    }
    pthread_mutex_unlock(&s->mtx);
    return found;
}

size_t
staging_held(struct staging *s)
{
    size_t n;

    pthread_mutex_lock(&s->mtx);
    n = s->n_held;
    pthread_mutex_unlock(&s->mtx);
    return n;
}
