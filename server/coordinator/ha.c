#include "ha.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "address.h"
#include "clock.h"
#include "etcd.h"
#include "log.h"
#include "rpc.h"
#include "state.h"
#include "threadname.h"

enum ha_role { ROLE_CANDIDATE, ROLE_FOLLOWER, ROLE_LEADER };

struct ha {
    struct ha_opts opts;
    struct etcd *etcd;
    char leader_key[256], intent_key[256];
    char advertise[ADDRESS_MAX + 1];
    uint32_t ttl_ms, margin_ms, tick_ms;
    pthread_t thread;
    bool running;

    pthread_mutex_t mu; /* a leaf: nothing is called while it is held */
    pthread_cond_t cv;
    bool stop;
    enum ha_role role;
    bool serving;  /* leader whose on_lead succeeded */
    uint64_t term; /* leader: ours; follower: the leader's */
    /* When the last round that renewed the lease and found the leader key still ours started
     * (monotonic): a renewal alone does not keep a leader serving, as its key may have been
     * deleted and made again by another coordinator with a lease of its own. */
    uint64_t renewed_ms;
    char leader[ADDRESS_MAX + 1];
    char why[160]; /* candidate: why no leader is known */

    /* Election thread only. */
    int64_t lease;
    bool renew_failing;     /* logged once per outage */
    bool confirm_failing;   /* the leader key could not be read back: logged once */
    char grant_failed[160]; /* the last lease grant failure logged ("" when it succeeded) */
};

/* Sleeps up to ms unless stopped; true when asked to stop. */
static bool
ha_sleep(struct ha *h, uint32_t ms)
{
    bool stop;

    pthread_mutex_lock(&h->mu);
    stop = clock_sleep_unless(&h->cv, &h->mu, ms, &h->stop);
    pthread_mutex_unlock(&h->mu);
    return stop;
}

/* Whether a leader renewed recently enough to serve; h->mu held. */
static bool
ha_fresh(const struct ha *h, uint64_t now)
{
    return h->renewed_ms != 0 && now >= h->renewed_ms &&
           now - h->renewed_ms < h->ttl_ms - h->margin_ms;
}

dc_code
ha_admit(struct ha *h, dc_status *st)
{
    uint64_t now = rpc_now_ms();
    dc_code code = DC_OK;

    pthread_mutex_lock(&h->mu);
    if (h->role == ROLE_LEADER && h->serving && ha_fresh(h, now)) {
        code = DC_OK;
    } else if (h->role == ROLE_LEADER) {
        code = status_set(st, DC_UNAVAILABLE,
                          "not the leader: this coordinator's etcd lease (term %" PRIu64
                          ") is not confirmed",
                          h->term);
    } else if (h->role == ROLE_FOLLOWER) {
        code = status_set(st, DC_UNAVAILABLE,
                          "not the leader; " HA_LEADER_HINT "%s (term %" PRIu64 ")", h->leader,
                          h->term);
    } else {
        code = status_set(st, DC_UNAVAILABLE, "not the leader; no leader elected yet (%s)",
                          h->why[0] != '\0' ? h->why : "campaigning");
    }
    pthread_mutex_unlock(&h->mu);
    return code;
}

uint64_t
ha_term(struct ha *h)
{
    uint64_t term = 0;

    pthread_mutex_lock(&h->mu);
    if (h->role == ROLE_LEADER && h->serving && ha_fresh(h, rpc_now_ms())) {
        term = h->term;
    }
    pthread_mutex_unlock(&h->mu);
    return term;
}

void
ha_describe(struct ha *h, char *buf, size_t cap)
{
    pthread_mutex_lock(&h->mu);
    switch (h->role) {
    case ROLE_LEADER:
        snprintf(buf, cap, "leader (term %" PRIu64 "%s)", h->term,
                 h->serving && ha_fresh(h, rpc_now_ms()) ? "" : ", not serving");
        break;
    case ROLE_FOLLOWER:
        snprintf(buf, cap, "follower of %s (term %" PRIu64 ")", h->leader, h->term);
        break;
    default:
        snprintf(buf, cap, "candidate (%s)", h->why[0] != '\0' ? h->why : "campaigning");
        break;
    }
    pthread_mutex_unlock(&h->mu);
}

static void
ha_set_why(struct ha *h, const char *why)
{
    pthread_mutex_lock(&h->mu);
    snprintf(h->why, sizeof(h->why), "%.150s", why);
    pthread_mutex_unlock(&h->mu);
}

/* One of a round's etcd steps failed (message: why), or went through again (message NULL).
 * A failure is the candidate's `why`; a leader logs the first of a run of them (`what`: why,
 * not serving once `stale`) and the step's return (`what`), as *failing remembers. */
static void
ha_failing(struct ha *h, bool *failing, const char *what, const char *message, const char *stale)
{
    bool leading;

    if (message == NULL) {
        if (*failing) {
            log_info("%s", what);
        }
        *failing = false;
        return;
    }
    pthread_mutex_lock(&h->mu);
    leading = h->role == ROLE_LEADER;
    snprintf(h->why, sizeof(h->why), "%.150s", message);
    pthread_mutex_unlock(&h->mu);
    if (leading && !*failing) {
        log_warn("%s: %s (not serving once %s)", what, message, stale);
    }
    *failing = true;
}

/* Leaves the leadership of term (if held): refuse first, then tell the owner. */
static void
ha_step_down(struct ha *h, enum ha_role next, const char *why)
{
    uint64_t term = 0;
    bool was      = false;

    pthread_mutex_lock(&h->mu);
    if (h->role == ROLE_LEADER) {
        was  = true;
        term = h->term;
    }
    h->role    = next;
    h->serving = false;
    pthread_mutex_unlock(&h->mu);
    if (was) {
        log_warn("stepping down as leader (term %" PRIu64 "): %s", term, why);
        if (h->opts.cb.on_step_down != NULL) {
            h->opts.cb.on_step_down(h->opts.cb.arg, term);
        }
    }
}

/* One round: renew (or get) the lease, then campaign / check the leader key. */
static void
ha_round(struct ha *h)
{
    uint64_t started = rpc_now_ms();
    struct etcd_kv kv;
    dc_status st;
    bool won = false;

    status_clear(&st);
    if (h->lease == 0) {
        int64_t id = 0, granted = 0;
        if (etcd_lease_grant(h->etcd, (int64_t)((h->ttl_ms + 999) / 1000), &id, &granted, &st) !=
            DC_OK) {
            /* Cannot campaign at all (etcd down, TLS refused, wrong password): said once
             * per distinct cause, not every tick. */
            if (strncmp(h->grant_failed, st.message, sizeof(h->grant_failed) - 1) != 0) {
                log_warn("cannot campaign for leadership, no lease from etcd: %s", st.message);
                snprintf(h->grant_failed, sizeof(h->grant_failed), "%.159s", st.message);
            }
            ha_set_why(h, st.message);
            return;
        }
        h->grant_failed[0] = '\0';
        h->lease           = id;
        log_info("etcd lease %" PRIx64 " granted for %" PRId64 " s", (uint64_t)id, granted);
    } else {
        int64_t ttl = 0;
        if (etcd_lease_keepalive(h->etcd, h->lease, &ttl, &st) != DC_OK) {
            /* etcd unreachable: the lease may live on. ha_admit stops serving once it is
             * stale; the leadership itself is only given up when it is known lost. */
            ha_failing(h, &h->renew_failing, "etcd lease renewal failed", st.message,
                       "the lease is stale");
            return;
        }
        ha_failing(h, &h->renew_failing, "etcd lease renewed again", NULL, NULL);
        if (ttl <= 0) {
            h->lease = 0;
            ha_step_down(h, ROLE_CANDIDATE, "its etcd lease expired");
            ha_set_why(h, "lease expired; campaigning again");
            return;
        }
    }
    if (etcd_create(h->etcd, h->leader_key, h->advertise, h->lease, &won, &kv, &st) != DC_OK) {
        ha_failing(h, &h->confirm_failing, "cannot read the leader key back from etcd", st.message,
                   "the last confirmation is stale");
        return;
    }
    ha_failing(h, &h->confirm_failing, "the leader key is read back from etcd again", NULL, NULL);
    if (won || (kv.lease == h->lease && kv.create_revision > 0)) {
        uint64_t term = (uint64_t)kv.create_revision;
        bool new_term;

        pthread_mutex_lock(&h->mu);
        new_term = h->role != ROLE_LEADER || h->term != term || !h->serving;
        if (h->role == ROLE_LEADER && h->term != term) {
            pthread_mutex_unlock(&h->mu);
            ha_step_down(h, ROLE_CANDIDATE, "its term changed");
            pthread_mutex_lock(&h->mu);
        }
        h->role       = ROLE_LEADER;
        h->term       = term;
        h->renewed_ms = started; /* the lease renewed and the key ours, both since started */
        snprintf(h->leader, sizeof(h->leader), "%s", h->advertise);
        pthread_mutex_unlock(&h->mu);
        if (new_term) {
            if (h->opts.cb.on_lead != NULL &&
                h->opts.cb.on_lead(h->opts.cb.arg, term, &st) != DC_OK) {
                log_error("leader (term %" PRIu64 ") but not serving yet: %s", term, st.message);
            } else {
                pthread_mutex_lock(&h->mu);
                h->serving = !h->stop; /* ha_stop may have come meanwhile: it stays down */
                pthread_mutex_unlock(&h->mu);
                log_info("leading as %s (term %" PRIu64 ")", h->advertise, term);
            }
        }
    } else if (kv.create_revision > 0) {
        char addr[ADDRESS_MAX + 1];
        bool changed;

        snprintf(addr, sizeof(addr), "%.*s", (int)(kv.len < ADDRESS_MAX ? kv.len : ADDRESS_MAX),
                 kv.value != NULL ? kv.value : "");
        if (address_problem(addr) != NULL) {
            snprintf(addr, sizeof(addr), "(unreadable address)");
        }
        ha_step_down(h, ROLE_FOLLOWER, "another coordinator holds the leader key");
        pthread_mutex_lock(&h->mu);
        changed = h->term != (uint64_t)kv.create_revision || strcmp(h->leader, addr) != 0;
        h->role = ROLE_FOLLOWER;
        h->term = (uint64_t)kv.create_revision;
        snprintf(h->leader, sizeof(h->leader), "%s", addr);
        pthread_mutex_unlock(&h->mu);
        if (changed) {
            log_info("following %s (term %" PRIu64 ")", addr, (uint64_t)kv.create_revision);
        }
    }
    etcd_kv_clear(&kv);
}

static void *
ha_thread(void *arg)
{
    struct ha *h = arg;

    thread_name_set("dc-ha");
    for (;;) {
        uint64_t started = rpc_now_ms(), spent;

        ha_round(h);
        spent = rpc_now_ms() - started;
        if (ha_sleep(h, spent >= h->tick_ms ? 1 : h->tick_ms - (uint32_t)spent)) {
            return NULL;
        }
    }
}

dc_code
ha_new(const struct ha_opts *opts, struct ha **out, dc_status *st)
{
    struct ha *h;
    dc_code code;

    *out = NULL;
    if ((h = calloc(1, sizeof(*h))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    h->opts      = *opts;
    h->ttl_ms    = opts->state->lease_ttl_ms;
    h->margin_ms = h->ttl_ms / 3;
    h->tick_ms   = h->ttl_ms / 6;
    snprintf(h->advertise, sizeof(h->advertise), "%s", opts->advertise);
    snprintf(h->leader_key, sizeof(h->leader_key), "%s/leader", opts->state->prefix);
    snprintf(h->intent_key, sizeof(h->intent_key), "%s/intent", opts->state->prefix);
    pthread_mutex_init(&h->mu, NULL);
    clock_cond_init(&h->cv);
    /* A request that takes longer than a quarter of the TTL is as good as failed. */
    if ((code = etcd_open(opts->state, h->ttl_ms / 4, &h->etcd, st)) != DC_OK) {
        goto fail;
    }
    *out = h;
    return DC_OK;
fail:
    etcd_free(h->etcd);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
    return code;
}

dc_code
ha_run(struct ha *h, dc_status *st)
{
    if (pthread_create(&h->thread, NULL, ha_thread, h) != 0) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "cannot start the election thread");
    }
    h->running = true;
    return DC_OK;
}

void
ha_stop(struct ha *h)
{
    dc_status st;

    if (h == NULL) {
        return;
    }
    pthread_mutex_lock(&h->mu);
    h->stop    = true;
    h->serving = false;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (h->running) {
        pthread_join(h->thread, NULL);
        h->running = false;
    }
    pthread_mutex_lock(&h->mu);
    h->serving = false; /* whatever the last round did: nothing is led once the lease goes */
    pthread_mutex_unlock(&h->mu);
    /* Revoking deletes the leader key with it: the next leader need not wait for the TTL. */
    if (h->lease != 0 && etcd_lease_revoke(h->etcd, h->lease, &st) != DC_OK) {
        log_warn("etcd lease not revoked (it expires by itself): %s", st.message);
    }
    h->lease = 0;
}

void
ha_free(struct ha *h)
{
    if (h == NULL) {
        return;
    }
    ha_stop(h);
    etcd_free(h->etcd);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

dc_code
ha_save_intent(struct ha *h, const struct registry_intent_entry *entries, size_t n, dc_status *st)
{
    uint64_t term = ha_term(h);
    char *text    = NULL;
    size_t len    = 0;
    dc_code code;

    if (term == 0) {
        return status_set(st, DC_UNAVAILABLE, "not the leader: intent not written");
    }
    if ((code = state_format(entries, n, &text, &len, st)) != DC_OK) {
        return code;
    }
    code = etcd_put_guarded(h->etcd, h->intent_key, text, len, h->leader_key, (int64_t)term, st);
    free(text);
    if (code == DC_FAILED_PRECONDITION) {
        code = DC_UNAVAILABLE; /* the caller should ask the leader */
    }
    return code;
}

dc_code
ha_load_intent(struct ha *h, struct registry *r, size_t *restored, dc_status *st)
{
    struct etcd_kv kv;
    dc_code code;

    *restored = 0;
    if ((code = etcd_get(h->etcd, h->intent_key, &kv, st)) == DC_NOT_FOUND) {
        return DC_OK;
    }
    if (code != DC_OK) {
        return code;
    }
    code = state_load_text(h->intent_key, kv.value, kv.len, r, restored, st);
    if (code == DC_DATA_LOSS) {
        /* The next change would replace it: what it held is kept under a key of its own,
         * for the operator (as the term allows: this runs as the leader starts). */
        char kept[sizeof(h->intent_key) + sizeof(STATE_UNREADABLE_SUFFIX)];
        dc_status put;
        uint64_t term;

        pthread_mutex_lock(&h->mu);
        term = h->role == ROLE_LEADER ? h->term : 0;
        pthread_mutex_unlock(&h->mu);
        snprintf(kept, sizeof(kept), "%s%s", h->intent_key, STATE_UNREADABLE_SUFFIX);
        status_clear(&put);
        if (term == 0) {
            status_set(&put, DC_UNAVAILABLE, "not the leader");
        } else {
            (void)etcd_put_guarded(h->etcd, kept, kv.value, kv.len, h->leader_key, (int64_t)term,
                                   &put);
        }
        state_note_kept(st, kept, put.code == DC_OK ? NULL : put.message);
    }
    etcd_kv_clear(&kv);
    return code;
}
