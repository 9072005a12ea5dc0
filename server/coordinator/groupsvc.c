/*
 * GroupJoin, GroupLeave and ListGroups (see groupsvc.h). The table (groups.c) is guarded by
 * mtx; a completed rendezvous becomes a struct setup that lives until every worker of the
 * group has answered GroupSetup, and then answers every rank. Answers go out outside mtx.
 */
#include "groupsvc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "clock.h"
#include "device.h"
#include "devcoord/v1/methods.h"
#include "fanout.h"
#include "groups.h"
#include "log.h"
#include "metrics.h"
#include "plan.h"
#include "rpc.h"
#include "status.h"
#include "threadname.h"
#include "validate.h"

#define TIMER_TICK_MS 20
#define EXPIRE_BATCH  32

/* A parked join: the caller to answer and its rank. */
struct waiter {
    Devcoord__V1__GroupJoinResponse_Closure closure;
    void *cd;
    uint32_t rank;
    uint32_t pipe; /* the caller's connection */
};

/* Connections closed and not yet looked at by the timer. */
#define GONE_MAX 256

/* A completed rendezvous on its way to the workers. */
struct setup {
    struct groupsvc *g;
    struct group_done done; /* tags: struct waiter *, rank order */
    struct plan plan;
    struct fanout_conn **conns; /* one per plan.workers */
    unsigned pending;           /* GroupSetup calls not answered yet */
    dc_status fail;             /* the first failure; OK while none */
};

struct groupsvc {
    struct registry *registry;
    const struct config_coordinator *cfg;
    struct fanout *fanout;
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    struct group_table *table;
    const atomic_ullong *term; /* groupsvc_set_term; NULL: term 0 */
    unsigned setups;           /* struct setup alive */
    bool stopping;
    /* Connections closed since the timer last looked (more at once: the rest of their joins
     * wait for their deadline). */
    uint32_t gone[GONE_MAX];
    size_t n_gone;
    pthread_t timer;
    /* metrics, under mtx */
    uint64_t joins_ok, joins_failed, generations;
    /* Group RPCs served (GroupJoin, GroupLeave, ListGroups): a group call adds none. */
    atomic_uint_fast64_t rpcs[3];
};

enum { RPC_JOIN, RPC_LEAVE, RPC_LIST };

static void
answer_error(Devcoord__V1__GroupJoinResponse_Closure closure, void *cd, const dc_status *st)
{
    *rpc_call_status(cd) = *st;
    closure(NULL, cd);
}

/* ---- a completed rendezvous -------------------------------------------------------------- */

static void
setup_free(struct setup *s)
{
    if (s == NULL) {
        return;
    }
    for (size_t i = 0; s->conns != NULL && i < s->plan.n_workers; i++) {
        fanout_conn_put(s->g->fanout, s->conns[i]);
    }
    free(s->conns);
    plan_fini(&s->plan);
    group_done_fini(&s->done);
    free(s);
}

/* The index in plan.workers of the worker owning rank r. */
static size_t
owner_of(const struct plan *p, uint32_t r)
{
    for (size_t i = 0; i < p->n_workers; i++) {
        for (size_t k = 0; k < p->workers[i].n_ranks; k++) {
            if (p->workers[i].ranks[k] == r) {
                return i;
            }
        }
    }
    return 0;
}

/* Answers every rank of s (with s->fail when it is set) and frees s. No lock held. */
static void
setup_answer(struct setup *s)
{
    struct groupsvc *g       = s->g;
    struct arena *a          = s->fail.code == DC_OK ? arena_new(ARENA_OWN_BUDGET) : NULL;
    Devcoord__V1__Plan *plan = a != NULL ? plan_pb(a, &s->plan) : NULL;
    dc_status fail           = s->fail;

    if (fail.code == DC_OK && plan == NULL) {
        status_set(&fail, DC_RESOURCE_EXHAUSTED, "out of memory answering the join");
    }
    for (size_t r = 0; r < s->done.n; r++) {
        struct waiter *w                    = s->done.tags[r];
        Devcoord__V1__GroupJoinResponse out = DEVCOORD__V1__GROUP_JOIN_RESPONSE__INIT;
        if (fail.code != DC_OK) {
            answer_error(w->closure, w->cd, &fail);
        } else {
            out.group_id       = s->done.group_id;
            out.generation     = s->done.generation;
            out.rank           = (uint32_t)r;
            out.size           = (uint32_t)s->done.n;
            out.plan           = plan;
            out.worker_address = s->plan.workers[owner_of(&s->plan, (uint32_t)r)].address;
            w->closure(&out, w->cd);
        }
        free(w);
    }
    if (fail.code != DC_OK) {
        log_warn("group %s generation %llu not set up: %s", s->done.group_id,
                 (unsigned long long)s->done.generation, fail.message);
    } else {
        log_info("group %s generation %llu set up: %zu ranks on %zu workers", s->done.group_id,
                 (unsigned long long)s->done.generation, s->done.n, s->plan.n_workers);
    }
    arena_free(a);
    pthread_mutex_lock(&g->mtx);
    if (fail.code == DC_OK) {
        g->joins_ok += s->done.n;
    } else {
        g->joins_failed += s->done.n;
    }
    pthread_mutex_unlock(&g->mtx);
    setup_free(s);
    pthread_mutex_lock(&g->mtx);
    g->setups--;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mtx);
}

/* A worker answered GroupSetup (nng thread). */
static void
setup_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct setup *s = arg;
    bool last;

    (void)reply;
    (void)keep;
    pthread_mutex_lock(&s->g->mtx);
    if (code != DC_OK && s->fail.code == DC_OK) {
        s->fail      = *st;
        s->fail.code = code;
    }
    last = --s->pending == 0;
    pthread_mutex_unlock(&s->g->mtx);
    if (last) {
        setup_answer(s);
    }
}

static bool
worker_address(void *arg, const char *name, char *address, size_t cap, uint64_t *epoch)
{
    return registry_worker_address(arg, name, address, cap, epoch);
}

/* Plans the new generation of done and tells its workers; answers its ranks when they have
 * all installed it (or at once when that cannot start). No lock held. */
static void
setup_start(struct groupsvc *g, struct group_done *done, const dc_device_ref *ranked)
{
    struct plan_lookup lookup           = { worker_address, g->registry };
    Devcoord__V1__GroupSetupRequest req = DEVCOORD__V1__GROUP_SETUP_REQUEST__INIT;
    struct setup *s                     = calloc(1, sizeof(*s));
    struct arena *a                     = NULL;
    size_t started                      = 0;
    dc_status st;

    status_clear(&st);
    if (s == NULL) {
        /* Nothing to hang the answers on: answer them here. */
        status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory setting up the group");
        for (size_t r = 0; r < done->n; r++) {
            struct waiter *w = done->tags[r];
            answer_error(w->closure, w->cd, &st);
            free(w);
        }
        group_done_fini(done);
        pthread_mutex_lock(&g->mtx);
        g->setups--;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mtx);
        return;
    }
    s->g    = g;
    s->done = *done;
    memset(done, 0, sizeof(*done));
    status_clear(&s->fail);
    if (plan_build(&s->plan, ranked, s->done.n, s->done.group_id, &lookup, &s->fail) != DC_OK) {
        goto answer;
    }
    if ((s->conns = calloc(s->plan.n_workers, sizeof(*s->conns))) == NULL ||
        (a = arena_new(ARENA_OWN_BUDGET)) == NULL || (req.plan = plan_pb(a, &s->plan)) == NULL) {
        status_set(&s->fail, DC_RESOURCE_EXHAUSTED, "out of memory setting up the group");
        goto answer;
    }
    for (size_t i = 0; i < s->plan.n_workers; i++) {
        const struct plan_worker *pw = &s->plan.workers[i];
        if (fanout_conn_get(g->fanout, pw->name, pw->address, &s->conns[i], &s->fail) != DC_OK) {
            goto answer;
        }
    }
    req.group_id   = s->done.group_id;
    req.generation = s->done.generation;
    req.term       = g->term != NULL ? atomic_load(g->term) : 0;
    if (g->term != NULL && req.term == 0) {
        status_set(&s->fail, DC_UNAVAILABLE, "group not set up: this coordinator no longer leads");
        goto answer;
    }
    s->pending = (unsigned)s->plan.n_workers + 1; /* one for this function */
    for (size_t i = 0; i < s->plan.n_workers; i++) {
        req.self  = (uint32_t)i;
        req.epoch = s->plan.workers[i].epoch;
        if (fanout_call(g->fanout, s->conns[i], M_WORKER_GROUP_SETUP, &req.base,
                        GROUPSVC_SETUP_TIMEOUT_MS, setup_done, s, &st) != DC_OK) {
            pthread_mutex_lock(&g->mtx);
            if (s->fail.code == DC_OK) {
                status_set(&s->fail, st.code, "worker %s: %s", s->plan.workers[i].name, st.message);
                status_set_worker(&s->fail, s->plan.workers[i].name);
            }
            pthread_mutex_unlock(&g->mtx);
            break;
        }
        started++;
    }
    arena_free(a);
    /* The calls that did not start will not answer; then this function's own share. */
    pthread_mutex_lock(&g->mtx);
    s->pending -= (unsigned)(s->plan.n_workers - started);
    if (--s->pending > 0) {
        pthread_mutex_unlock(&g->mtx);
        return;
    }
    pthread_mutex_unlock(&g->mtx);
    setup_answer(s);
    return;
answer:
    arena_free(a);
    setup_answer(s);
}

/* ---- GroupJoin --------------------------------------------------------------------------- */

static int
ref_compare(const void *a, const void *b)
{
    return device_ref_compare_concrete(a, b);
}

/* Rank of `self` among ranked[0..n): its concrete device (autodiff ignored), its worker when it
 * names one. INVALID_ARGUMENT when it is not there, or names no worker and matches several. */
static dc_code
find_self(const dc_device_ref *self, const dc_device_ref *ranked, size_t n, uint32_t *rank,
          dc_status *st)
{
    dc_device_ref want = *self;
    char text[DC_DEVICE_TEXT_SIZE];
    size_t found = 0;

    want.autodiff_depth = 0;
    for (size_t r = 0; r < n; r++) {
        dc_device_ref at = want;
        if (want.worker[0] == '\0') {
            memcpy(at.worker, ranked[r].worker, sizeof(at.worker));
        }
        if (device_ref_compare_concrete(&at, &ranked[r]) == 0) {
            *rank = (uint32_t)r;
            found++;
        }
    }
    dc_device_ref_format(self, text, sizeof(text));
    if (found == 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "self %s is not in the group's device list",
                          text);
    }
    if (found > 1) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "self %s matches several devices of the list: name its worker", text);
    }
    return DC_OK;
}

void
groupsvc_join(struct groupsvc *g, const Devcoord__V1__GroupJoinRequest *in,
              Devcoord__V1__GroupJoinResponse_Closure closure, void *cd)
{
    struct validate_limits limits = { .max_group_devices = g->cfg->max_group_devices,
                                      .autodiff          = g->cfg->autodiff };
    dc_device_ref *refs = NULL, *concrete = NULL, self;
    char group_id[VALIDATE_GROUP_ID_SIZE];
    uint32_t timeout_ms = in->timeout_ms ? in->timeout_ms : g->cfg->op_timeout_ms;

    atomic_fetch_add(&g->rpcs[RPC_JOIN], 1);
    struct group_done done;
    struct waiter *w = NULL;
    struct op_spec spec;
    bool completed = false;
    uint32_t rank  = 0;
    dc_status st;
    dc_code code;

    status_clear(&st);
    if ((code = plan_request_devices(in->devices, in->n_devices, &limits, &refs, &concrete, &st)) !=
        DC_OK) {
        goto out;
    }
    spec = (struct op_spec){ .kind = DC_OP_BARRIER, .devices = refs, .n_devices = in->n_devices };
    if ((code = registry_validate(g->registry, &spec, &limits, concrete, group_id, &st)) != DC_OK) {
        goto out;
    }
    if (in->self == NULL) {
        code = status_set(&st, DC_INVALID_ARGUMENT,
                          "no self: which device of the list is this "
                          "rank?");
        goto out;
    }
    if ((code = device_ref_from_pb(in->self, &self, &st)) != DC_OK) {
        status_prefix(&st, "invalid self");
        code = st.code = DC_INVALID_ARGUMENT;
        goto out;
    }
    /* Ranks: positions in the sorted canonical list, whatever order this caller used. */
    qsort(concrete, in->n_devices, sizeof(*concrete), ref_compare);
    if ((code = find_self(&self, concrete, in->n_devices, &rank, &st)) != DC_OK) {
        goto out;
    }
    if ((w = calloc(1, sizeof(*w))) == NULL) {
        code = status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    *w = (struct waiter){ closure, cd, rank, rpc_call_pipe(cd) };
    pthread_mutex_lock(&g->mtx);
    if (g->stopping) {
        code = status_set(&st, DC_UNAVAILABLE, "coordinator shutting down");
    } else {
        code = group_join(g->table, group_id, concrete, in->n_devices, rank,
                          rpc_now_ms() + timeout_ms, w, &completed, &done, &st);
    }
    if (code != DC_OK) {
        g->joins_failed++;
    } else if (completed) {
        /* Counted before the lock goes, so a shutdown waits for its answers. */
        g->setups++;
        g->generations++;
    }
    pthread_mutex_unlock(&g->mtx);
    if (code == DC_OK) {
        w = NULL; /* the table's, then the setup's */
        if (completed) {
            setup_start(g, &done, concrete);
        }
    }
out:
    free(refs);
    free(concrete);
    free(w);
    if (code != DC_OK) {
        log_info("group join refused: %s: %s", dc_status_name(code), st.message);
        st.code = code;
        answer_error(closure, cd, &st);
    }
}

/* ---- GroupLeave, ListGroups -------------------------------------------------------------- */

void
groupsvc_leave(struct groupsvc *g, const Devcoord__V1__GroupLeaveRequest *in,
               Devcoord__V1__GroupLeaveResponse_Closure closure, void *cd)
{
    Devcoord__V1__GroupLeaveResponse out = DEVCOORD__V1__GROUP_LEAVE_RESPONSE__INIT;
    dc_status st;
    dc_code code;

    atomic_fetch_add(&g->rpcs[RPC_LEAVE], 1);

    status_clear(&st);
    pthread_mutex_lock(&g->mtx);
    code = group_leave(g->table, in->group_id, in->generation, in->rank, &st);
    pthread_mutex_unlock(&g->mtx);
    if (code != DC_OK) {
        st.code              = code;
        *rpc_call_status(cd) = st;
        closure(NULL, cd);
        return;
    }
    closure(&out, cd);
}

struct list_ctx {
    struct registry *registry;
    struct arena *a;
    Devcoord__V1__ListGroupsResponse *out;
    bool oom;
};

/* The data addresses of the workers of v's devices (those the registry knows), once each. */
static bool
list_worker_addresses(struct list_ctx *lc, const struct group_view *v, Devcoord__V1__GroupInfo *gi)
{
    if ((gi->worker_addresses = arena_alloc(lc->a, (v->n + 1) * sizeof(char *))) == NULL) {
        return false;
    }
    for (size_t i = 0; i < v->n; i++) {
        char address[ADDRESS_MAX + 1];
        uint64_t epoch;
        bool seen = false;
        for (size_t k = 0; k < i && !seen; k++) {
            seen = strcmp(v->ranked[k].worker, v->ranked[i].worker) == 0;
        }
        if (seen || !registry_worker_address(lc->registry, v->ranked[i].worker, address,
                                             sizeof(address), &epoch)) {
            continue;
        }
        if ((gi->worker_addresses[gi->n_worker_addresses++] = arena_strdup(lc->a, address)) ==
            NULL) {
            return false;
        }
    }
    return true;
}

static void
list_one(void *arg, const struct group_view *v)
{
    struct list_ctx *lc         = arg;
    Devcoord__V1__GroupInfo *gi = arena_alloc(lc->a, sizeof(*gi));

    if (gi == NULL || lc->oom) {
        lc->oom = true;
        return;
    }
    devcoord__v1__group_info__init(gi);
    gi->group_id   = arena_strdup(lc->a, v->group_id);
    gi->devices    = arena_alloc(lc->a, (v->n + 1) * sizeof(*gi->devices));
    gi->generation = v->generation;
    gi->joined     = v->joined;
    gi->joining    = v->joining;
    if (gi->group_id == NULL || gi->devices == NULL) {
        lc->oom = true;
        return;
    }
    for (size_t i = 0; i < v->n; i++) {
        if ((gi->devices[i] = arena_strdup(lc->a, v->devices[i])) == NULL) {
            lc->oom = true;
            return;
        }
    }
    gi->n_devices = v->n;
    if (!list_worker_addresses(lc, v, gi)) {
        lc->oom = true;
        return;
    }
    lc->out->groups[lc->out->n_groups++] = gi;
}

void
groupsvc_list(struct groupsvc *g, const Devcoord__V1__ListGroupsRequest *in,
              Devcoord__V1__ListGroupsResponse_Closure closure, void *cd)
{
    Devcoord__V1__ListGroupsResponse out = DEVCOORD__V1__LIST_GROUPS_RESPONSE__INIT;
    struct arena *a                      = arena_new(ARENA_OWN_BUDGET);

    atomic_fetch_add(&g->rpcs[RPC_LIST], 1);
    if (a == NULL) {
        status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "out of memory");
        closure(NULL, cd);
        return;
    }
    if (groupsvc_list_into(g, in->group_id, a, &out, rpc_call_status(cd)) != DC_OK) {
        closure(NULL, cd);
    } else {
        closure(&out, cd);
    }
    arena_free(a);
}

dc_code
groupsvc_list_into(struct groupsvc *g, const char *group_id, struct arena *a,
                   Devcoord__V1__ListGroupsResponse *out, dc_status *st)
{
    struct list_ctx lc = { g->registry, a, out, false };
    size_t shown       = 0;

    devcoord__v1__list_groups_response__init(out);
    pthread_mutex_lock(&g->mtx);
    /* Room for every group: count them first. */
    out->groups =
        arena_alloc(a, (group_list(g->table, group_id, NULL, NULL) + 1) * sizeof(*out->groups));
    if (out->groups == NULL) {
        lc.oom = true;
    } else {
        shown = group_list(g->table, group_id, list_one, &lc);
    }
    pthread_mutex_unlock(&g->mtx);
    if (lc.oom) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory listing groups");
    }
    if (shown == 0 && group_id[0] != '\0') {
        return status_set(st, DC_NOT_FOUND, "no group %.32s", group_id);
    }
    return DC_OK;
}

void
groupsvc_metrics_render(struct groupsvc *g, struct mbuf *b)
{
    pthread_mutex_lock(&g->mtx);
    mbuf_printf(b,
                "# HELP devcoord_group_joins_total Group joins answered, by outcome.\n"
                "# TYPE devcoord_group_joins_total counter\n"
                "devcoord_group_joins_total{result=\"ok\"} %llu\n"
                "devcoord_group_joins_total{result=\"failed\"} %llu\n"
                "# HELP devcoord_group_generations_total Group rendezvous completed.\n"
                "# TYPE devcoord_group_generations_total counter\n"
                "devcoord_group_generations_total %llu\n"
                "# HELP devcoord_group_joins_waiting Joins parked in a rendezvous.\n"
                "# TYPE devcoord_group_joins_waiting gauge\n"
                "devcoord_group_joins_waiting %zu\n"
                "# HELP devcoord_group_coordinator_rpcs_total Group RPCs this coordinator served, "
                "by method. Group calls never reach it: this stays flat while ranks call.\n"
                "# TYPE devcoord_group_coordinator_rpcs_total counter\n"
                "devcoord_group_coordinator_rpcs_total{method=\"GroupJoin\"} %llu\n"
                "devcoord_group_coordinator_rpcs_total{method=\"GroupLeave\"} %llu\n"
                "devcoord_group_coordinator_rpcs_total{method=\"ListGroups\"} %llu\n",
                (unsigned long long)g->joins_ok, (unsigned long long)g->joins_failed,
                (unsigned long long)g->generations, group_parked(g->table),
                (unsigned long long)atomic_load(&g->rpcs[RPC_JOIN]),
                (unsigned long long)atomic_load(&g->rpcs[RPC_LEAVE]),
                (unsigned long long)atomic_load(&g->rpcs[RPC_LIST]));
    pthread_mutex_unlock(&g->mtx);
}

/* ---- timer and life ---------------------------------------------------------------------- */

void
groupsvc_worker_gone(struct groupsvc *g, const char *name)
{
    fanout_forget(g->fanout, name);
}

void
groupsvc_disconnected(struct groupsvc *g, uint32_t pipe)
{
    pthread_mutex_lock(&g->mtx);
    if (g->n_gone < GONE_MAX) {
        g->gone[g->n_gone++] = pipe;
    }
    pthread_mutex_unlock(&g->mtx);
}

struct gone_set {
    const uint32_t *pipes;
    size_t n;
};

static bool
waiter_gone(void *tag, void *arg)
{
    const struct waiter *w   = tag;
    const struct gone_set *s = arg;

    for (size_t i = 0; i < s->n; i++) {
        if (s->pipes[i] == w->pipe) {
            return true;
        }
    }
    return false;
}

/* Lets go of the joins whose caller's connection closed: their rank may join again at once.
 * Their calls are answered (CANCELLED), though nobody hears it. mtx held; released and taken
 * again to answer. */
static void
release_gone_locked(struct groupsvc *g)
{
    uint32_t pipes[GONE_MAX];
    struct gone_set set = { pipes, g->n_gone };
    void *tags[EXPIRE_BATCH];
    dc_status st;
    size_t n;

    if (g->n_gone == 0) {
        return;
    }
    memcpy(pipes, g->gone, g->n_gone * sizeof(*pipes));
    g->n_gone = 0;
    status_set(&st, DC_CANCELLED, "the caller's connection closed");
    do {
        n = group_take_if(g->table, waiter_gone, &set, tags, EXPIRE_BATCH);
        g->joins_failed += n;
        pthread_mutex_unlock(&g->mtx);
        for (size_t i = 0; i < n; i++) {
            struct waiter *w = tags[i];
            answer_error(w->closure, w->cd, &st);
            free(w);
        }
        pthread_mutex_lock(&g->mtx);
    } while (n == EXPIRE_BATCH);
}

/* Fails the joins whose deadline passed, naming who never joined; closes stale connections. */
static void *
groupsvc_timer(void *arg)
{
    struct groupsvc *g = arg;
    struct group_expired out[EXPIRE_BATCH];

    thread_name_set("dc-group-timer");
    pthread_mutex_lock(&g->mtx);
    while (!g->stopping) {
        size_t n;

        do {
            n = group_expire(g->table, rpc_now_ms(), out, EXPIRE_BATCH);
            g->joins_failed += n;
            pthread_mutex_unlock(&g->mtx);
            for (size_t i = 0; i < n; i++) {
                struct waiter *w = out[i].tag;
                dc_status st;
                status_set(&st, DC_DEADLINE_EXCEEDED, "%s", out[i].message);
                answer_error(w->closure, w->cd, &st);
                free(w);
            }
            pthread_mutex_lock(&g->mtx);
        } while (n == EXPIRE_BATCH);
        release_gone_locked(g);
        pthread_mutex_unlock(&g->mtx);
        fanout_close_stale(g->fanout);
        pthread_mutex_lock(&g->mtx);
        if (!g->stopping) {
            clock_cond_wait_ms(&g->cv, &g->mtx, TIMER_TICK_MS);
        }
    }
    pthread_mutex_unlock(&g->mtx);
    return NULL;
}

static void
no_executed(void *arg, void *tag, dc_code code, const dc_status *st,
            const struct fanout_prepared *p)
{
    (void)arg, (void)tag, (void)code, (void)st, (void)p;
}

static void
no_committed(void *arg, void *tag, dc_code code, const dc_status *st)
{
    (void)arg, (void)tag, (void)code, (void)st;
}

static void
no_aborted(void *arg, void *tag)
{
    (void)arg, (void)tag;
}

void
groupsvc_set_term(struct groupsvc *g, const atomic_ullong *term)
{
    g->term = term;
}

struct groupsvc *
groupsvc_new(struct registry *registry, const struct config_coordinator *cfg,
             const char *worker_token)
{
    struct fanout_opts fo = { .token             = worker_token,
                              .tls               = &cfg->tls,
                              .max_message_bytes = cfg->max_message_bytes,
                              .events = { no_executed, no_committed, no_aborted, NULL } };
    struct groupsvc *g    = calloc(1, sizeof(*g));

    if (g == NULL) {
        return NULL;
    }
    g->registry = registry;
    g->cfg      = cfg;
    if ((g->table = group_table_new(GROUPSVC_MAX_PARKED, GROUPSVC_MAX_GROUPS)) == NULL ||
        (g->fanout = fanout_new(&fo)) == NULL) {
        group_table_free(g->table);
        free(g);
        return NULL;
    }
    pthread_mutex_init(&g->mtx, NULL);
    clock_cond_init(&g->cv);
    if (pthread_create(&g->timer, NULL, groupsvc_timer, g) != 0) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mtx);
        fanout_free(g->fanout);
        group_table_free(g->table);
        free(g);
        return NULL;
    }
    return g;
}

void
groupsvc_shutdown(struct groupsvc *g)
{
    void *tags[EXPIRE_BATCH];
    dc_status st;
    size_t n;

    pthread_mutex_lock(&g->mtx);
    if (g->stopping) {
        pthread_mutex_unlock(&g->mtx);
        return;
    }
    g->stopping = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mtx);
    pthread_join(g->timer, NULL);
    status_set(&st, DC_UNAVAILABLE, "coordinator shutting down");
    do {
        pthread_mutex_lock(&g->mtx);
        n = group_take_all(g->table, tags, EXPIRE_BATCH);
        pthread_mutex_unlock(&g->mtx);
        for (size_t i = 0; i < n; i++) {
            struct waiter *w = tags[i];
            answer_error(w->closure, w->cd, &st);
            free(w);
        }
    } while (n == EXPIRE_BATCH);
    /* Setups still out end now (their calls fail) and answer their ranks. */
    fanout_close_all(g->fanout);
    pthread_mutex_lock(&g->mtx);
    while (g->setups > 0) {
        pthread_cond_wait(&g->cv, &g->mtx);
    }
    pthread_mutex_unlock(&g->mtx);
}

void
groupsvc_free(struct groupsvc *g)
{
    if (g == NULL) {
        return;
    }
    groupsvc_shutdown(g);
    fanout_free(g->fanout);
    group_table_free(g->table);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mtx);
    free(g);
}

/* ---- what the workers say of the groups' calls (the status page) ------------------------- */

struct ask_all;

struct ask {
    struct ask_all *all;
    size_t group;
    struct fanout_conn *conn;
    struct rpc_reply reply; /* kept from the callback when OK */
    bool ok;
};

struct ask_all {
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    struct groupsvc *g;
    unsigned refs; /* the asker, and each call out */
    unsigned out;  /* calls not answered yet */
    size_t n;
    struct ask *asks;
};

/* Drops a reference; the last frees everything. all->mtx held, released here. */
static void
ask_all_unref_unlock(struct ask_all *all)
{
    bool last = --all->refs == 0;

    pthread_mutex_unlock(&all->mtx);
    if (!last) {
        return;
    }
    for (size_t i = 0; i < all->n; i++) {
        fanout_conn_put(all->g->fanout, all->asks[i].conn);
        rpc_reply_free(&all->asks[i].reply);
    }
    free(all->asks);
    pthread_cond_destroy(&all->cv);
    pthread_mutex_destroy(&all->mtx);
    free(all);
}

static void
ask_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct ask *k       = arg;
    struct ask_all *all = k->all;

    (void)st;
    pthread_mutex_lock(&all->mtx);
    if (code == DC_OK && reply->body != NULL) {
        k->reply = *reply;
        k->ok    = true;
        *keep    = true;
    }
    if (--all->out == 0) {
        pthread_cond_signal(&all->cv);
    }
    ask_all_unref_unlock(all);
}

/* Adds what one worker said of gi (same generation only) to gi, in arena a. */
static void
ask_merge(Devcoord__V1__GroupInfo *gi, const Devcoord__V1__GroupStatusResponse *r, struct arena *a)
{
    Devcoord__V1__GroupStalledRank **grow;

    if (r->generation != gi->generation || r->n_stalled > gi->n_devices) {
        return;
    }
    if (r->calls > gi->calls) {
        gi->calls = r->calls;
    }
    if (r->n_stalled == 0 ||
        (grow = arena_alloc(a, (gi->n_stalled + r->n_stalled) * sizeof(*grow))) == NULL) {
        return;
    }
    if (gi->n_stalled > 0) {
        memcpy(grow, gi->stalled, gi->n_stalled * sizeof(*grow));
    }
    for (size_t i = 0; i < r->n_stalled; i++) {
        Devcoord__V1__GroupStalledRank *s = arena_alloc(a, sizeof(*s));
        const char *device                = arena_strdup(a, r->stalled[i]->device);
        if (s == NULL || device == NULL) {
            break; /* out of page memory: the ranks so far are shown */
        }
        devcoord__v1__group_stalled_rank__init(s);
        s->rank               = r->stalled[i]->rank;
        s->waiting_ms         = r->stalled[i]->waiting_ms;
        s->device             = (char *)device;
        grow[gi->n_stalled++] = s;
    }
    gi->stalled = grow;
}

void
groupsvc_ask_workers(struct groupsvc *g, Devcoord__V1__ListGroupsResponse *groups, struct arena *a,
                     uint32_t timeout_ms)
{
    Devcoord__V1__GroupStatusRequest req = DEVCOORD__V1__GROUP_STATUS_REQUEST__INIT;
    struct ask_all *all;
    size_t n = 0;
    uint64_t until, left;
    dc_status st;

    for (size_t i = 0; i < groups->n_groups; i++) {
        n += groups->groups[i]->n_worker_addresses;
    }
    if (n == 0 || (all = calloc(1, sizeof(*all))) == NULL) {
        return;
    }
    if ((all->asks = calloc(n, sizeof(*all->asks))) == NULL) {
        free(all);
        return;
    }
    pthread_mutex_init(&all->mtx, NULL);
    clock_cond_init(&all->cv);
    all->g    = g;
    all->refs = 1;
    for (size_t i = 0; i < groups->n_groups; i++) {
        const Devcoord__V1__GroupInfo *gi = groups->groups[i];
        req.group_id                      = gi->group_id;
        for (size_t w = 0; w < gi->n_worker_addresses; w++) {
            struct ask *k = &all->asks[all->n++];
            k->all        = all;
            k->group      = i;
            /* Keyed by address: the page asks whoever serves there now. Not kept past the
             * ask (fanout_forget): no worker's end forgets an address for it, and one that
             * moved would leave a connection redialing the old one for good. */
            if (fanout_conn_get(g->fanout, gi->worker_addresses[w], gi->worker_addresses[w],
                                &k->conn, &st) != DC_OK) {
                continue;
            }
            fanout_forget(g->fanout, gi->worker_addresses[w]);
            pthread_mutex_lock(&all->mtx);
            all->refs++;
            all->out++;
            pthread_mutex_unlock(&all->mtx);
            if (fanout_call(g->fanout, k->conn, M_WORKER_GROUP_STATUS, &req.base, timeout_ms,
                            ask_done, k, &st) != DC_OK) {
                pthread_mutex_lock(&all->mtx);
                all->refs--;
                all->out--;
                pthread_mutex_unlock(&all->mtx);
            }
        }
    }
    until = rpc_now_ms() + timeout_ms;
    pthread_mutex_lock(&all->mtx);
    while (all->out > 0 && (left = rpc_ms_until(until)) > 0) {
        clock_cond_wait_ms(&all->cv, &all->mtx, (unsigned)left + 1);
    }
    /* The answers in by now; later ones are dropped with the last reference. */
    for (size_t i = 0; i < all->n; i++) {
        if (all->asks[i].ok) {
            ask_merge(groups->groups[all->asks[i].group],
                      (const Devcoord__V1__GroupStatusResponse *)all->asks[i].reply.body, a);
        }
    }
    ask_all_unref_unlock(all);
}
