#include "ops.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "auth.h"
#include "clock.h"
#include "device.h"
#include "log.h"
#include "devcoord/v1/methods.h"
#include "metrics.h"
#include "rpc.h"
#include "status.h"
#include "strmap.h"
#include "validate.h"

#define WORKER_SVC (&devcoord__v1__worker__descriptor)

#define OP_ID_SIZE    40
#define LIST_DEFAULT  100
#define TIMER_TICK_MS 20
/* Workers get this much less time than the op, so that when one of them hangs the others
 * report whom they were waiting for before the coordinator's own deadline fires. */
#define WORKER_TIME_SHARE 0.9

enum op_state { OP_QUEUED = 1, OP_RUNNING, OP_DONE, OP_FAILED };

struct op;

struct wclient;

struct op_worker {
    struct op *op;
    char name[DC_WORKER_NAME_MAX + 1];
    char address[256];
    uint64_t epoch;
    struct wclient *wc; /* a reference, dropped when the op goes */
    struct rpc_client *client;
    uint32_t *ranks;
    size_t n_ranks;
    bool answered;
    dc_code code;
    char message[DC_STATUS_MESSAGE_MAX];
    uint64_t elapsed_us;
};

struct op {
    char id[OP_ID_SIZE];
    dc_op_kind kind;
    dc_reduce_op reduce;
    uint32_t root;
    char tensor[256];
    char output[256];
    enum op_state state;
    dc_status status;
    char group_id[VALIDATE_GROUP_ID_SIZE];
    dc_device_ref *devices; /* concrete, rank order */
    size_t n_devices;
    struct op_worker *workers;
    size_t n_workers;
    unsigned pending; /* workers not answered yet */
    /* The first ABORTED answer, used only if no worker reports the cause. */
    dc_status secondary;
    bool have_secondary;
    uint64_t submitted_unix_ms, submitted_ms, started_us, elapsed_us;
    uint32_t timeout_ms;
    uint64_t deadline_ms;
    Devcoord__V1__SubmitOpResponse_Closure closure; /* NULL once answered */
    void *cd;
    unsigned refs; /* the tables, and each RPC in flight */
    bool in_table;
    struct op *next_active;
};

/* Ops in submission order per device: an op runs when it heads every queue it is in. */
struct dqueue {
    struct op **items;
    size_t head, len, cap;
};

/* The connection to a worker's data address, shared by the ops that use it: the table of
 * current connections holds a reference, and so does every op. A connection replaced (its
 * worker moved to another address) is closed by the timer thread once no op holds it:
 * closing blocks, and the calls' callbacks run on nng threads. */
struct wclient {
    char address[256];
    struct rpc_client *client;
    unsigned refs;
    struct wclient *next_stale;
};

struct ops {
    struct registry *registry;
    const struct config_coordinator *cfg;
    const char *worker_token; /* what the coordinator shows workers, when auth is on */
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    struct strmap by_id; /* id -> op (active and history) */
    struct op *active;   /* queued and running */
    struct op **history; /* ring of finished ops */
    size_t hist_cap, hist_len, hist_next;
    struct strmap queues;  /* cluster device name -> dqueue */
    struct strmap clients; /* worker name -> wclient */
    struct wclient *stale; /* unreferenced, waiting to be closed */
    uint64_t counter;
    uint64_t in_flight, done, failed;
    /* metrics, guarded by mtx */
    uint64_t ended[DC_OP_COUNT][RPC_METRICS_CODES];
    struct histo duration[DC_OP_COUNT];
    struct histo fanout;
    bool stopping;
    pthread_t timer;
};

static void op_start_locked(struct ops *o, struct op *op);

/* Drops a reference to a connection; the last one queues it for closing. ops->mtx held. */
static void
wclient_put_locked(struct ops *o, struct wclient *wc)
{
    if (wc != NULL && --wc->refs == 0) {
        wc->next_stale = o->stale;
        o->stale       = wc;
        pthread_cond_broadcast(&o->cv);
    }
}

/* Frees op; its connection references must have been dropped (op_put_clients_locked). */
static void
op_free(struct op *op)
{
    for (size_t i = 0; op->workers != NULL && i < op->n_workers; i++) {
        free(op->workers[i].ranks);
    }
    free(op->workers);
    free(op->devices);
    free(op);
}

static void
op_put_clients_locked(struct ops *o, struct op *op)
{
    for (size_t i = 0; op->workers != NULL && i < op->n_workers; i++) {
        wclient_put_locked(o, op->workers[i].wc);
        op->workers[i].wc     = NULL;
        op->workers[i].client = NULL;
    }
}

/* Drops a reference; the op goes with the last. ops->mtx held. */
static void
op_unref_locked(struct ops *o, struct op *op)
{
    if (--op->refs == 0) {
        op_put_clients_locked(o, op);
        op_free(op);
    }
}

/* ---- the info messages ------------------------------------------------------------------- */

static char *
arena_str(struct arena *a, const char *s)
{
    size_t n = strlen(s);
    char *p  = arena_alloc(a, n + 1);

    if (p != NULL) {
        memcpy(p, s, n + 1);
    }
    return p;
}

static Devcoord__V1__Status *
status_pb(struct arena *a, const dc_status *st)
{
    Devcoord__V1__Status *s = arena_alloc(a, sizeof(*s));

    if (s == NULL) {
        return NULL;
    }
    devcoord__v1__status__init(s);
    s->code    = (Devcoord__V1__Code)st->code;
    s->message = arena_str(a, st->message);
    s->worker  = arena_str(a, st->worker);
    if (st->device_index >= 0) {
        s->detail_case  = DEVCOORD__V1__STATUS__DETAIL_DEVICE_INDEX;
        s->device_index = (uint32_t)st->device_index;
    }
    return s->message != NULL && s->worker != NULL ? s : NULL;
}

/* The plan as the wire carries it; NULL when out of memory. */
static Devcoord__V1__Plan *
plan_pb(struct arena *a, const struct op *op)
{
    Devcoord__V1__Plan *p = arena_alloc(a, sizeof(*p));

    if (p == NULL) {
        return NULL;
    }
    devcoord__v1__plan__init(p);
    p->group_id = arena_str(a, op->group_id);
    p->devices  = arena_alloc(a, (op->n_devices + 1) * sizeof(*p->devices));
    p->workers  = arena_alloc(a, (op->n_workers + 1) * sizeof(*p->workers));
    if (p->group_id == NULL || p->devices == NULL || p->workers == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < op->n_devices; i++) {
        Devcoord__V1__DeviceRef *r = arena_alloc(a, sizeof(*r));
        Devcoord__V1__Device *d    = arena_alloc(a, sizeof(*d));
        if (r == NULL || d == NULL) {
            return NULL;
        }
        device_ref_to_pb(&op->devices[i], r, d);
        if ((r->worker = arena_str(a, op->devices[i].worker)) == NULL) {
            return NULL;
        }
        p->devices[i] = r;
    }
    p->n_devices = op->n_devices;
    for (size_t i = 0; i < op->n_workers; i++) {
        Devcoord__V1__PlanWorker *w = arena_alloc(a, sizeof(*w));
        if (w == NULL) {
            return NULL;
        }
        devcoord__v1__plan_worker__init(w);
        w->name    = arena_str(a, op->workers[i].name);
        w->address = arena_str(a, op->workers[i].address);
        w->ranks   = arena_alloc(a, (op->workers[i].n_ranks + 1) * sizeof(*w->ranks));
        if (w->name == NULL || w->address == NULL || w->ranks == NULL) {
            return NULL;
        }
        memcpy(w->ranks, op->workers[i].ranks, op->workers[i].n_ranks * sizeof(*w->ranks));
        w->n_ranks    = op->workers[i].n_ranks;
        p->workers[i] = w;
    }
    p->n_workers = op->n_workers;
    return p;
}

static const Devcoord__V1__OpState op_states[] = {
    [OP_QUEUED]  = DEVCOORD__V1__OP_STATE__OP_QUEUED,
    [OP_RUNNING] = DEVCOORD__V1__OP_STATE__OP_RUNNING,
    [OP_DONE]    = DEVCOORD__V1__OP_STATE__OP_DONE,
    [OP_FAILED]  = DEVCOORD__V1__OP_STATE__OP_FAILED,
};

/* A snapshot of op for GetOp, ListOps and the SubmitOp answer. ops->mtx held. */
static Devcoord__V1__OpInfo *
op_info(struct arena *a, const struct op *op)
{
    Devcoord__V1__OpInfo *info = arena_alloc(a, sizeof(*info));
    size_t nw = 0, nr = 0;

    if (info == NULL) {
        return NULL;
    }
    devcoord__v1__op_info__init(info);
    info->op_id             = arena_str(a, op->id);
    info->kind              = (Devcoord__V1__OpKind)op->kind;
    info->reduce            = (Devcoord__V1__ReduceOp)op->reduce;
    info->root              = op->root;
    info->tensor            = arena_str(a, op->tensor);
    info->output_tensor     = arena_str(a, op->output);
    info->state             = op_states[op->state];
    info->status            = status_pb(a, &op->status);
    info->plan              = op->n_devices > 0 ? plan_pb(a, op) : NULL;
    info->submitted_unix_ms = op->submitted_unix_ms;
    info->elapsed_us = op->state == OP_RUNNING ? rpc_now_us() - op->started_us : op->elapsed_us;
    info->workers    = arena_alloc(a, (op->n_workers + 1) * sizeof(*info->workers));
    info->waiting_on = arena_alloc(a, (op->n_workers + 1) * sizeof(*info->waiting_on));
    if (info->op_id == NULL || info->tensor == NULL || info->output_tensor == NULL ||
        info->status == NULL || (op->n_devices > 0 && info->plan == NULL) ||
        info->workers == NULL || info->waiting_on == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < op->n_workers; i++) {
        const struct op_worker *w = &op->workers[i];
        if (!w->answered) {
            if (op->state == OP_RUNNING) {
                info->waiting_on[nw++] = arena_str(a, w->name);
            }
            continue;
        }
        Devcoord__V1__WorkerResult *wr = arena_alloc(a, sizeof(*wr));
        dc_status ws;
        if (wr == NULL) {
            return NULL;
        }
        devcoord__v1__worker_result__init(wr);
        status_set(&ws, w->code, "%s", w->message);
        wr->name            = arena_str(a, w->name);
        wr->status          = status_pb(a, &ws);
        wr->elapsed_us      = w->elapsed_us;
        info->workers[nr++] = wr;
    }
    info->n_workers    = nr;
    info->n_waiting_on = nw;
    return info;
}

/* ---- queues ------------------------------------------------------------------------------ */

static bool
dqueue_push(struct ops *o, const char *name, struct op *op)
{
    struct dqueue *q = strmap_get(&o->queues, name);

    if (q == NULL) {
        if ((q = calloc(1, sizeof(*q))) == NULL || !strmap_put(&o->queues, name, q)) {
            free(q);
            return false;
        }
    }
    if (q->len == q->cap) {
        size_t cap        = q->cap ? q->cap * 2 : 4;
        struct op **items = malloc(cap * sizeof(*items));
        if (items == NULL) {
            return false;
        }
        for (size_t i = 0; i < q->len; i++) {
            items[i] = q->items[(q->head + i) % q->cap];
        }
        free(q->items);
        q->items = items;
        q->head  = 0;
        q->cap   = cap;
    }
    q->items[(q->head + q->len) % q->cap] = op;
    q->len++;
    return true;
}

static struct op *
dqueue_head(struct ops *o, const char *name)
{
    struct dqueue *q = strmap_get(&o->queues, name);

    return q != NULL && q->len > 0 ? q->items[q->head] : NULL;
}

/* Takes op out of the queue (it is normally the head; a queued op that fails may not be). */
static void
dqueue_remove(struct ops *o, const char *name, struct op *op)
{
    struct dqueue *q = strmap_get(&o->queues, name);

    if (q == NULL) {
        return;
    }
    for (size_t i = 0; i < q->len; i++) {
        if (q->items[(q->head + i) % q->cap] == op) {
            for (size_t k = i; k + 1 < q->len; k++) {
                q->items[(q->head + k) % q->cap] = q->items[(q->head + k + 1) % q->cap];
            }
            q->len--;
            break;
        }
    }
    if (q->len == 0) {
        strmap_del(&o->queues, name);
        free(q->items);
        free(q);
    }
}

static bool
op_runnable(struct ops *o, struct op *op)
{
    char name[DC_DEVICE_TEXT_SIZE];

    for (size_t i = 0; i < op->n_devices; i++) {
        dc_device_ref_format(&op->devices[i], name, sizeof(name));
        if (dqueue_head(o, name) != op) {
            return false;
        }
    }
    return true;
}

/* ---- running ----------------------------------------------------------------------------- */

struct pending_answer {
    struct arena *arena;
    Devcoord__V1__SubmitOpResponse resp;
    Devcoord__V1__SubmitOpResponse_Closure closure;
    void *cd;
};

/* Sends the SubmitOp answer prepared under the lock. */
static void
answer_send(struct pending_answer *pa)
{
    if (pa->closure != NULL) {
        pa->closure(pa->resp.op != NULL ? &pa->resp : NULL, pa->cd);
    }
    arena_free(pa->arena);
}

struct call_ctx {
    struct ops *o;
    struct op_worker *w;
};

static void
ops_abort_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct call_ctx *c = arg;
    struct ops *o      = c->o;

    (void)code;
    (void)st;
    (void)reply;
    (void)keep;
    pthread_mutex_lock(&o->mtx);
    op_unref_locked(o, c->w->op);
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mtx);
    free(c);
}

/* Tells the workers of op that have not answered to stop. ops->mtx held. */
static void
op_abort_workers_locked(struct ops *o, struct op *op)
{
    Devcoord__V1__AbortRequest req = DEVCOORD__V1__ABORT_REQUEST__INIT;
    Devcoord__V1__Status reason    = DEVCOORD__V1__STATUS__INIT;

    reason.code    = (Devcoord__V1__Code)op->status.code;
    reason.message = op->status.message;
    reason.worker  = op->status.worker;
    req.op_id      = op->id;
    req.reason     = &reason;
    for (size_t i = 0; i < op->n_workers; i++) {
        struct op_worker *w = &op->workers[i];
        struct call_ctx *c;
        if (w->answered || w->client == NULL || (c = malloc(sizeof(*c))) == NULL) {
            continue;
        }
        c->o = o;
        c->w = w;
        op->refs++;
        if (rpc_call_async(w->client, WORKER_SVC, M_WORKER_ABORT, &req.base, NULL, 0, 2000,
                           ops_abort_done, c, NULL) != DC_OK) {
            op->refs--;
            free(c);
        }
    }
}

/* Starts every queued op that now heads all its queues. Starting one may end it (and
 * others) at once, so the scan begins again after each start. ops->mtx held. */
static void
ops_start_runnable_locked(struct ops *o)
{
    struct op *op;

    do {
        for (op = o->active; op != NULL; op = op->next_active) {
            if (op->state == OP_QUEUED && op_runnable(o, op)) {
                op_start_locked(o, op);
                break;
            }
        }
    } while (op != NULL);
}

static void
history_add_locked(struct ops *o, struct op *op)
{
    if (o->hist_cap == 0) {
        strmap_del(&o->by_id, op->id);
        op->in_table = false;
        op_unref_locked(o, op);
        return;
    }
    if (o->hist_len == o->hist_cap) {
        struct op *old = o->history[o->hist_next];
        strmap_del(&o->by_id, old->id);
        old->in_table = false;
        op_unref_locked(o, old);
    } else {
        o->hist_len++;
    }
    o->history[o->hist_next] = op;
    o->hist_next             = (o->hist_next + 1) % o->hist_cap;
}

/* Ends op with st (OK: done). Prepares the caller's answer in *pa; the caller sends it after
 * unlocking. ops->mtx held. */
static void
op_end_locked(struct ops *o, struct op *op, const dc_status *st, struct pending_answer *pa)
{
    char name[DC_DEVICE_TEXT_SIZE];

    op->status     = *st;
    op->state      = st->code == DC_OK ? OP_DONE : OP_FAILED;
    op->elapsed_us = op->started_us ? rpc_now_us() - op->started_us : 0;
    if ((unsigned)op->kind < DC_OP_COUNT && (unsigned)st->code < RPC_METRICS_CODES) {
        o->ended[op->kind][st->code]++;
        if (op->started_us != 0) {
            histo_observe(&o->duration[op->kind], op->elapsed_us);
        }
    }
    if (op->state == OP_DONE) {
        o->done++;
    } else {
        o->failed++;
        log_info("op %s failed: %s: %s", op->id, dc_status_name(st->code), st->message);
        op_abort_workers_locked(o, op);
    }
    o->in_flight--;
    for (struct op **pp = &o->active; *pp != NULL; pp = &(*pp)->next_active) {
        if (*pp == op) {
            *pp = op->next_active;
            break;
        }
    }
    for (size_t i = 0; i < op->n_devices; i++) {
        dc_device_ref_format(&op->devices[i], name, sizeof(name));
        dqueue_remove(o, name, op);
    }
    memset(pa, 0, sizeof(*pa));
    devcoord__v1__submit_op_response__init(&pa->resp);
    if (op->closure != NULL) {
        pa->closure              = op->closure;
        pa->cd                   = op->cd;
        op->closure              = NULL;
        *rpc_call_status(pa->cd) = op->status;
        if ((pa->arena = arena_new(ARENA_OWN_BUDGET)) == NULL ||
            (pa->resp.op = op_info(pa->arena, op)) == NULL) {
            status_set(rpc_call_status(pa->cd), DC_RESOURCE_EXHAUSTED, "out of memory answering");
        }
    }
    history_add_locked(o, op);
    ops_start_runnable_locked(o);
    pthread_cond_broadcast(&o->cv);
}

static void
execute_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct call_ctx *c       = arg;
    struct ops *o            = c->o;
    struct op_worker *w      = c->w;
    struct op *op            = w->op;
    struct pending_answer pa = { 0 };
    bool answer              = false;

    (void)keep;
    pthread_mutex_lock(&o->mtx);
    w->answered = true;
    w->code     = code;
    snprintf(w->message, sizeof(w->message), "%s", st->message);
    if (code == DC_OK && reply->body != NULL) {
        w->elapsed_us = ((Devcoord__V1__ExecuteResponse *)reply->body)->elapsed_us;
    }
    op->pending--;
    if (op->state == OP_RUNNING) {
        if (code != DC_OK) {
            dc_status fail;
            /* The coordinator's own call timing out (no answer came at all) is about this
             * worker; anything the worker answered may be about a peer it names. */
            if (code == DC_DEADLINE_EXCEEDED && st->transport) {
                status_set(&fail, code, "worker %s did not answer op %s within %u ms", w->name,
                           op->id, op->timeout_ms);
                status_set_worker(&fail, w->name);
            } else if (st->worker[0] != '\0' && strcmp(st->worker, w->name) != 0) {
                /* A worker reporting what it found about a peer: name the peer. */
                status_set(&fail, code, "worker %s: %s (reported by %s)", st->worker, st->message,
                           w->name);
                status_set_worker(&fail, st->worker);
            } else {
                status_set(&fail, code, "worker %s: %s", w->name, st->message);
                status_set_worker(&fail, w->name);
            }
            fail.device_index = st->device_index;
            /* ABORTED from a worker while others are still out is a reaction to a peer's
             * failure; the cause is on its way. Keep it only in case nothing better comes. */
            if (code == DC_ABORTED && op->pending > 0) {
                if (!op->have_secondary) {
                    op->secondary      = fail;
                    op->have_secondary = true;
                }
            } else {
                op_end_locked(o, op, &fail, &pa);
                answer = true;
            }
        } else if (op->pending == 0) {
            dc_status end;
            if (op->have_secondary) {
                end = op->secondary;
            } else {
                status_clear(&end);
            }
            op_end_locked(o, op, &end, &pa);
            answer = true;
        }
    }
    op_unref_locked(o, op);
    pthread_mutex_unlock(&o->mtx);
    free(c);
    if (answer) {
        answer_send(&pa);
    }
}

/* Sends Execute to every worker of op. ops->mtx held. */
static void
op_start_locked(struct ops *o, struct op *op)
{
    Devcoord__V1__ExecuteRequest req = DEVCOORD__V1__EXECUTE_REQUEST__INIT;
    struct arena *a                  = arena_new(ARENA_OWN_BUDGET);
    uint64_t now                     = rpc_now_ms();
    uint32_t left;
    dc_status st;

    op->state      = OP_RUNNING;
    op->started_us = rpc_now_us();
    histo_observe(&o->fanout, (uint64_t)op->n_workers * 1000000u);
    if (a == NULL || (req.plan = plan_pb(a, op)) == NULL) {
        struct pending_answer pa;
        arena_free(a);
        status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory starting op %s", op->id);
        op->refs++; /* op_end may free it from the history; keep it for the answer */
        op_end_locked(o, op, &st, &pa);
        op_unref_locked(o, op);
        /* Called with the lock held: the answer goes out through the closure anyway, which
         * only packs and queues a send. */
        answer_send(&pa);
        return;
    }
    left              = now < op->deadline_ms ? (uint32_t)(op->deadline_ms - now) : 1;
    req.op_id         = op->id;
    req.kind          = (Devcoord__V1__OpKind)op->kind;
    req.reduce        = (Devcoord__V1__ReduceOp)op->reduce;
    req.root          = op->root;
    req.tensor        = op->tensor;
    req.output_tensor = op->output;
    req.timeout_ms =
        (uint32_t)(left * WORKER_TIME_SHARE) > 0 ? (uint32_t)(left * WORKER_TIME_SHARE) : 1;
    for (size_t i = 0; i < op->n_workers; i++) {
        struct op_worker *w = &op->workers[i];
        struct call_ctx *c  = malloc(sizeof(*c));

        req.self  = (uint32_t)i;
        req.epoch = w->epoch;
        status_clear(&st);
        if (c == NULL) {
            status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory");
        } else {
            c->o = o;
            c->w = w;
            op->refs++;
            op->pending++;
            if (rpc_call_async(w->client, WORKER_SVC, M_WORKER_EXECUTE, &req.base, NULL, 0, left,
                               execute_done, c, &st) == DC_OK) {
                continue;
            }
            op->refs--;
            op->pending--;
            free(c);
        }
        /* Could not even send: the op fails like a worker that said no. */
        w->answered = true;
        w->code     = st.code;
        snprintf(w->message, sizeof(w->message), "%s", st.message);
        {
            struct pending_answer pa;
            dc_status fail;
            status_set(&fail, st.code, "worker %s: %s", w->name, st.message);
            status_set_worker(&fail, w->name);
            op->refs++;
            op_end_locked(o, op, &fail, &pa);
            op_unref_locked(o, op);
            answer_send(&pa);
        }
        break;
    }
    arena_free(a);
}

/* ---- submit ------------------------------------------------------------------------------ */

/* Queues a connection nobody uses for the timer thread to close. ops->mtx held. */
static void
stale_push_closed(struct ops *o, struct wclient *wc)
{
    wc->refs       = 0;
    wc->next_stale = o->stale;
    o->stale       = wc;
    pthread_cond_broadcast(&o->cv);
}

/* Closes the connections no op uses any more (outside the lock: closing waits for
 * callbacks, which take it). */
static void
stale_close_all(struct ops *o)
{
    struct wclient *list;

    pthread_mutex_lock(&o->mtx);
    list     = o->stale;
    o->stale = NULL;
    pthread_mutex_unlock(&o->mtx);
    while (list != NULL) {
        struct wclient *wc = list;
        list               = wc->next_stale;
        rpc_client_close(wc->client);
        free(wc);
    }
}

/* The connection to a worker's data address, opened on first use, with a reference for the
 * caller. A worker that comes back at the same address (a restart) keeps its connection: the
 * epoch travels in each Execute. ops->mtx held. */
static struct wclient *
worker_client_locked(struct ops *o, const char *name, const char *address, dc_status *st)
{
    struct wclient *wc = strmap_get(&o->clients, name), *fresh;

    if (wc != NULL && strcmp(wc->address, address) == 0) {
        wc->refs++;
        return wc;
    }
    if ((fresh = calloc(1, sizeof(*fresh))) == NULL) {
        status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    if (auth_client_open(address, o->worker_token, &o->cfg->tls, o->cfg->max_message_bytes, 500,
                         &fresh->client, st) != DC_OK) {
        free(fresh);
        return NULL;
    }
    if (!strmap_put(&o->clients, name, fresh)) {
        stale_push_closed(o, fresh);
        status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    snprintf(fresh->address, sizeof(fresh->address), "%s", address);
    fresh->refs = 2; /* the table's and the caller's */
    if (wc != NULL) {
        wclient_put_locked(o, wc); /* the table's reference to the old address */
    }
    return fresh;
}

/* Groups the concrete devices by worker, in order of first appearance. */
static dc_code
op_plan_workers(struct ops *o, struct op *op, dc_status *st)
{
    op->workers = calloc(op->n_devices, sizeof(*op->workers));
    if (op->workers == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory planning");
    }
    for (size_t r = 0; r < op->n_devices; r++) {
        struct op_worker *w = NULL;
        for (size_t i = 0; i < op->n_workers; i++) {
            if (strcmp(op->workers[i].name, op->devices[r].worker) == 0) {
                w = &op->workers[i];
                break;
            }
        }
        if (w == NULL) {
            w     = &op->workers[op->n_workers++];
            w->op = op;
            snprintf(w->name, sizeof(w->name), "%s", op->devices[r].worker);
            if (!registry_worker_address(o->registry, w->name, w->address, sizeof(w->address),
                                         &w->epoch)) {
                status_set(st, DC_UNAVAILABLE, "worker %s is dead", w->name);
                status_set_worker(st, w->name);
                return DC_UNAVAILABLE;
            }
            if ((w->ranks = calloc(op->n_devices, sizeof(*w->ranks))) == NULL) {
                return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory planning");
            }
        }
        w->ranks[w->n_ranks++] = (uint32_t)r;
    }
    return DC_OK;
}

/* Answers a refused or dry-run submission right away, from op (not recorded). */
static void
answer_now(struct op *op, Devcoord__V1__SubmitOpResponse_Closure closure, void *cd)
{
    Devcoord__V1__SubmitOpResponse resp = DEVCOORD__V1__SUBMIT_OP_RESPONSE__INIT;
    struct arena *a                     = arena_new(ARENA_OWN_BUDGET);

    *rpc_call_status(cd) = op->status;
    if (a == NULL || (resp.op = op_info(a, op)) == NULL) {
        status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "out of memory answering");
        closure(NULL, cd);
    } else {
        closure(&resp, cd);
    }
    arena_free(a);
}

/* Reads the request into op: kind, names, devices (checked as a peer sent them). */
static dc_code
op_from_request(struct op *op, const Devcoord__V1__SubmitOpRequest *in,
                const struct config_coordinator *cfg, const struct validate_limits *limits,
                dc_device_ref **refs, dc_status *st)
{
    dc_code rv;

    op->kind   = (dc_op_kind)in->kind;
    op->reduce = (dc_reduce_op)in->reduce;
    op->root   = in->root;
    snprintf(op->tensor, sizeof(op->tensor), "%s", in->tensor);
    if (in->output_tensor[0] != '\0') {
        snprintf(op->output, sizeof(op->output), "%s", in->output_tensor);
    } else if (op->kind == DC_OP_ALL_GATHER && strlen(in->tensor) + 9 < sizeof(op->output)) {
        snprintf(op->output, sizeof(op->output), "%s.gathered", in->tensor);
    }
    op->timeout_ms = in->timeout_ms ? in->timeout_ms : cfg->op_timeout_ms;
    /* The count comes from the wire and sizes the buffers below: rule 1 bounds it first. */
    if ((rv = validate_device_count(in->n_devices, limits, st)) != DC_OK) {
        return rv;
    }
    if ((*refs = calloc(in->n_devices, sizeof(**refs))) == NULL ||
        (op->devices = calloc(in->n_devices, sizeof(*op->devices))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < in->n_devices; i++) {
        if (device_ref_from_pb(in->devices[i], &(*refs)[i], st) != DC_OK) {
            char where[64];
            snprintf(where, sizeof(where), "invalid device: devices[%zu]", i);
            status_prefix(st, where);
            st->device_index = (int32_t)i;
            return DC_INVALID_ARGUMENT;
        }
    }
    return DC_OK;
}

void
ops_submit(struct ops *o, const Devcoord__V1__SubmitOpRequest *in,
           Devcoord__V1__SubmitOpResponse_Closure closure, void *cd)
{
    struct op *op = calloc(1, sizeof(*op));
    struct validate_limits limits;
    struct op_spec spec;
    dc_device_ref *refs = NULL;
    dc_status st;
    dc_code code;

    if (op == NULL) {
        status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "out of memory");
        closure(NULL, cd);
        return;
    }
    status_clear(&st);
    op->submitted_unix_ms = clock_unix_ms();
    op->submitted_ms      = rpc_now_ms();
    op->state             = OP_FAILED;
    limits = (struct validate_limits){ .max_group_devices = o->cfg->max_group_devices,
                                       .autodiff          = o->cfg->autodiff };
    code   = op_from_request(op, in, o->cfg, &limits, &refs, &st);
    if (code == DC_OK) {
        spec = (struct op_spec){ .kind      = op->kind,
                                 .reduce    = op->reduce,
                                 .root      = op->root,
                                 .devices   = refs,
                                 .n_devices = in->n_devices };
        code = registry_validate(o->registry, &spec, &limits, op->devices, op->group_id, &st);
    }
    if (code == DC_OK) {
        op->n_devices = in->n_devices;
        if (!in->dry_run && op->kind != DC_OP_BARRIER && op->tensor[0] == '\0') {
            code = status_set(&st, DC_INVALID_ARGUMENT,
                              "invalid operation: %s needs a tensor name (SubmitOpRequest.tensor)",
                              dc_op_kind_name(op->kind));
        } else if (!in->dry_run && op->kind == DC_OP_ALL_GATHER && op->output[0] == '\0') {
            code = status_set(&st, DC_INVALID_ARGUMENT, "invalid operation: no output tensor");
        } else {
            code = op_plan_workers(o, op, &st);
        }
    }
    free(refs);
    if (code != DC_OK || in->dry_run) {
        /* Refusals and dry runs are answered now and run nothing. */
        op->status = st;
        op->state  = code == DC_OK ? OP_QUEUED : OP_FAILED;
        if (code == DC_OK) {
            status_clear(&op->status);
        }
        answer_now(op, closure, cd);
        op_free(op);
        return;
    }

    pthread_mutex_lock(&o->mtx);
    if (o->stopping) {
        pthread_mutex_unlock(&o->mtx);
        status_set(&op->status, DC_UNAVAILABLE, "coordinator shutting down");
        answer_now(op, closure, cd);
        op_free(op);
        return;
    }
    for (size_t i = 0; i < op->n_workers; i++) {
        struct wclient *wc =
            worker_client_locked(o, op->workers[i].name, op->workers[i].address, &st);
        if (wc == NULL) {
            op_put_clients_locked(o, op);
            pthread_mutex_unlock(&o->mtx);
            op->status = st;
            answer_now(op, closure, cd);
            op_free(op);
            return;
        }
        op->workers[i].wc     = wc;
        op->workers[i].client = wc->client;
    }
    snprintf(op->id, sizeof(op->id), "op-%llx-%llx", (unsigned long long)op->submitted_unix_ms,
             (unsigned long long)++o->counter);
    op->deadline_ms = op->submitted_ms + op->timeout_ms;
    op->state       = OP_QUEUED;
    op->closure     = closure;
    op->cd          = cd;
    op->refs        = 1;
    op->in_table    = true;
    if (!strmap_put(&o->by_id, op->id, op)) {
        op_put_clients_locked(o, op);
        pthread_mutex_unlock(&o->mtx);
        status_set(&op->status, DC_RESOURCE_EXHAUSTED, "out of memory");
        answer_now(op, closure, cd);
        op_free(op);
        return;
    }
    for (size_t i = 0; i < op->n_devices; i++) {
        char name[DC_DEVICE_TEXT_SIZE];
        dc_device_ref_format(&op->devices[i], name, sizeof(name));
        if (!dqueue_push(o, name, op)) {
            /* Out of memory: undo what was queued. */
            for (size_t k = 0; k < i; k++) {
                dc_device_ref_format(&op->devices[k], name, sizeof(name));
                dqueue_remove(o, name, op);
            }
            strmap_del(&o->by_id, op->id);
            op_put_clients_locked(o, op);
            pthread_mutex_unlock(&o->mtx);
            status_set(&op->status, DC_RESOURCE_EXHAUSTED, "out of memory");
            answer_now(op, closure, cd);
            op_free(op);
            return;
        }
    }
    op->next_active = o->active;
    o->active       = op;
    o->in_flight++;
    if (op_runnable(o, op)) {
        op_start_locked(o, op);
    }
    pthread_mutex_unlock(&o->mtx);
}

/* ---- queries ----------------------------------------------------------------------------- */

void
ops_get(struct ops *o, const Devcoord__V1__GetOpRequest *in,
        Devcoord__V1__GetOpResponse_Closure closure, void *cd)
{
    Devcoord__V1__GetOpResponse resp = DEVCOORD__V1__GET_OP_RESPONSE__INIT;
    struct arena *a                  = arena_new(ARENA_OWN_BUDGET);
    struct op *op;

    if (a == NULL) {
        status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "out of memory");
        closure(NULL, cd);
        return;
    }
    pthread_mutex_lock(&o->mtx);
    if ((op = strmap_get(&o->by_id, in->op_id)) == NULL) {
        status_set(rpc_call_status(cd), DC_NOT_FOUND, "no op %.64s (unknown or too old)",
                   in->op_id);
    } else if ((resp.op = op_info(a, op)) == NULL) {
        status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_unlock(&o->mtx);
    closure(resp.op != NULL ? &resp : NULL, cd);
    arena_free(a);
}

void
ops_list(struct ops *o, const Devcoord__V1__ListOpsRequest *in,
         Devcoord__V1__ListOpsResponse_Closure closure, void *cd)
{
    Devcoord__V1__ListOpsResponse resp = DEVCOORD__V1__LIST_OPS_RESPONSE__INIT;
    size_t limit                       = in->limit ? in->limit : LIST_DEFAULT;
    struct arena *a                    = arena_new(ARENA_OWN_BUDGET);
    bool oom                           = a == NULL;

    pthread_mutex_lock(&o->mtx);
    if (!oom && (resp.ops = arena_alloc(a, (limit + 1) * sizeof(*resp.ops))) == NULL) {
        oom = true;
    }
    /* In flight first (newest first: active is a stack), then the history, newest first. */
    for (struct op *op = o->active; !oom && op != NULL && resp.n_ops < limit;
         op            = op->next_active) {
        oom = (resp.ops[resp.n_ops++] = op_info(a, op)) == NULL;
    }
    for (size_t i = 0; !oom && i < o->hist_len && resp.n_ops < limit; i++) {
        struct op *op = o->history[(o->hist_next + o->hist_cap - 1 - i) % o->hist_cap];
        oom           = (resp.ops[resp.n_ops++] = op_info(a, op)) == NULL;
    }
    pthread_mutex_unlock(&o->mtx);
    if (oom) {
        status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "out of memory listing ops");
        closure(NULL, cd);
    } else {
        closure(&resp, cd);
    }
    arena_free(a);
}

void
ops_counts(struct ops *o, uint64_t *in_flight, uint64_t *done, uint64_t *failed)
{
    pthread_mutex_lock(&o->mtx);
    *in_flight = o->in_flight;
    *done      = o->done;
    *failed    = o->failed;
    pthread_mutex_unlock(&o->mtx);
}

/* ---- failures from outside --------------------------------------------------------------- */

/* Fails every active op matching `match` with st; answers after unlocking. */
static void
ops_fail_where(struct ops *o, bool (*match)(const struct op *, const void *), const void *arg,
               const dc_status *st_in)
{
    struct pending_answer answers[32];
    size_t n;

    do {
        n = 0;
        pthread_mutex_lock(&o->mtx);
        for (struct op *op = o->active; op != NULL && n < 32;) {
            struct op *next = op->next_active;
            if (match(op, arg)) {
                dc_status st = *st_in;
                op->refs++;
                op_end_locked(o, op, &st, &answers[n++]);
                op_unref_locked(o, op);
                next = o->active; /* the list changed under us: start over */
            }
            op = next;
        }
        pthread_mutex_unlock(&o->mtx);
        for (size_t i = 0; i < n; i++) {
            answer_send(&answers[i]);
        }
    } while (n == 32);
}

struct gone {
    const char *name;
    uint64_t epoch;
};

static bool
op_uses_worker(const struct op *op, const void *arg)
{
    const struct gone *g = arg;

    for (size_t i = 0; i < op->n_workers; i++) {
        if (strcmp(op->workers[i].name, g->name) == 0 && op->workers[i].epoch == g->epoch) {
            return true;
        }
    }
    return false;
}

void
ops_worker_gone(struct ops *o, const char *name, uint64_t epoch, enum registry_gone why)
{
    static const char *const words[] = {
        [GONE_DEAD]         = "is dead (no heartbeat)",
        [GONE_DEREGISTERED] = "deregistered",
        [GONE_REPLACED]     = "restarted",
    };
    struct gone g = { name, epoch };
    dc_status st;

    status_set(&st, DC_UNAVAILABLE, "worker %s %s", name, words[why]);
    status_set_worker(&st, name);
    ops_fail_where(o, op_uses_worker, &g, &st);
}

static bool
op_any(const struct op *op, const void *arg)
{
    (void)op;
    (void)arg;
    return true;
}

/* Fails queued ops whose deadline passed while they waited for their devices. */
static bool
op_queued_too_long(const struct op *op, const void *arg)
{
    const uint64_t *now = arg;
    return op->state == OP_QUEUED && *now >= op->deadline_ms;
}

static void *
ops_timer(void *arg)
{
    struct ops *o = arg;

    pthread_mutex_lock(&o->mtx);
    while (!o->stopping) {
        struct timespec ts;
        uint64_t now = rpc_now_ms();
        bool late    = false;

        for (struct op *op = o->active; op != NULL; op = op->next_active) {
            late = late || (op->state == OP_QUEUED && now >= op->deadline_ms);
        }
        if (o->stale != NULL) {
            pthread_mutex_unlock(&o->mtx);
            stale_close_all(o);
            pthread_mutex_lock(&o->mtx);
        }
        if (late) {
            dc_status st;
            pthread_mutex_unlock(&o->mtx);
            status_set(&st, DC_DEADLINE_EXCEEDED,
                       "deadline passed while waiting behind earlier ops on the same devices");
            ops_fail_where(o, op_queued_too_long, &now, &st);
            pthread_mutex_lock(&o->mtx);
        }
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += TIMER_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&o->cv, &o->mtx, &ts);
    }
    pthread_mutex_unlock(&o->mtx);
    return NULL;
}

/* ---- metrics ----------------------------------------------------------------------------- */

/* Workers per op (observed in millionths, like every histogram). */
static const double fanout_buckets[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024 };

void
ops_metrics_render(struct ops *o, struct mbuf *b)
{
    pthread_mutex_lock(&o->mtx);
    mbuf_printf(b, "# HELP devcoord_ops_total Operations ended, by kind and code.\n"
                   "# TYPE devcoord_ops_total counter\n");
    for (int k = DC_OP_ALL_REDUCE; k < DC_OP_COUNT; k++) {
        for (int c = 0; c < RPC_METRICS_CODES; c++) {
            if (o->ended[k][c] > 0 || c == DC_OK) {
                mbuf_printf(b, "devcoord_ops_total{kind=\"%s\",code=\"%s\"} %llu\n",
                            dc_op_kind_name((dc_op_kind)k), dc_status_name((dc_code)c),
                            (unsigned long long)o->ended[k][c]);
            }
        }
    }
    mbuf_printf(b,
                "# HELP devcoord_ops_in_flight Operations queued or running.\n"
                "# TYPE devcoord_ops_in_flight gauge\n"
                "devcoord_ops_in_flight %llu\n",
                (unsigned long long)o->in_flight);
    pthread_mutex_unlock(&o->mtx);
    mbuf_printf(b, "# HELP devcoord_op_duration_seconds Time from an op's start to its end.\n"
                   "# TYPE devcoord_op_duration_seconds histogram\n");
    for (int k = DC_OP_ALL_REDUCE; k < DC_OP_COUNT; k++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "kind=\"%s\"", dc_op_kind_name((dc_op_kind)k));
        histo_render(b, "devcoord_op_duration_seconds", labels, &o->duration[k]);
    }
    mbuf_printf(b, "# HELP devcoord_op_fanout_workers Workers an op was sent to.\n"
                   "# TYPE devcoord_op_fanout_workers histogram\n");
    histo_render(b, "devcoord_op_fanout_workers", "", &o->fanout);
}

/* ---- life -------------------------------------------------------------------------------- */

struct ops *
ops_new(struct registry *registry, const struct config_coordinator *cfg, const char *worker_token)
{
    struct ops *o = calloc(1, sizeof(*o));

    if (o == NULL) {
        return NULL;
    }
    o->registry     = registry;
    o->cfg          = cfg;
    o->worker_token = worker_token;
    o->hist_cap     = cfg->op_history;
    if ((o->history = calloc(o->hist_cap ? o->hist_cap : 1, sizeof(*o->history))) == NULL) {
        free(o);
        return NULL;
    }
    pthread_mutex_init(&o->mtx, NULL);
    pthread_cond_init(&o->cv, NULL);
    strmap_init(&o->by_id);
    strmap_init(&o->queues);
    strmap_init(&o->clients);
    for (int k = 0; k < DC_OP_COUNT; k++) {
        histo_init(&o->duration[k], histo_seconds, histo_seconds_n);
    }
    histo_init(&o->fanout, fanout_buckets, sizeof(fanout_buckets) / sizeof(fanout_buckets[0]));
    if (pthread_create(&o->timer, NULL, ops_timer, o) != 0) {
        pthread_cond_destroy(&o->cv);
        pthread_mutex_destroy(&o->mtx);
        free(o->history);
        free(o);
        return NULL;
    }
    return o;
}

void
ops_shutdown(struct ops *o)
{
    dc_status st;

    pthread_mutex_lock(&o->mtx);
    o->stopping = true;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mtx);
    pthread_join(o->timer, NULL);
    status_set(&st, DC_UNAVAILABLE, "coordinator shutting down");
    ops_fail_where(o, op_any, NULL, &st);
}

/* One of op's connections still open, taken (its wclient's client is NULL from now on), or
 * NULL. ops->mtx held. */
static struct rpc_client *
op_client_take(struct op *op)
{
    for (size_t w = 0; w < op->n_workers; w++) {
        struct wclient *wc = op->workers[w].wc;
        if (wc != NULL && wc->client != NULL) {
            struct rpc_client *c = wc->client;
            wc->client           = NULL;
            return c;
        }
    }
    return NULL;
}

/* A connection still open, taken (its wclient's client is NULL from now on), or NULL: the
 * table's, and the replaced ones ops still hold. ops->mtx held. */
static struct rpc_client *
open_client_take_locked(struct ops *o)
{
    struct rpc_client *c = NULL;
    const char *k;
    void *v;

    for (size_t i = 0; c == NULL && strmap_next(&o->clients, &i, &k, &v);) {
        struct wclient *wc = v;
        c                  = wc->client;
        wc->client         = NULL;
    }
    for (size_t i = 0; c == NULL && i < o->hist_len; i++) {
        c = op_client_take(o->history[i]);
    }
    for (struct op *op = o->active; c == NULL && op != NULL; op = op->next_active) {
        c = op_client_take(op);
    }
    return c;
}

void
ops_free(struct ops *o)
{
    struct rpc_client *c;
    const char *k;
    void *v;

    if (o == NULL) {
        return;
    }
    if (!o->stopping) {
        ops_shutdown(o);
    }
    /* Closing every connection completes every call still out (aborts included): their
     * callbacks drop their references to the ops. Closing waits for them: not under mtx. */
    for (;;) {
        pthread_mutex_lock(&o->mtx);
        c = open_client_take_locked(o);
        pthread_mutex_unlock(&o->mtx);
        if (c == NULL) {
            break;
        }
        rpc_client_close(c);
    }
    pthread_mutex_lock(&o->mtx);
    for (size_t i = 0; i < o->hist_len; i++) {
        struct op *op = o->history[i];
        op->in_table  = false;
        op_unref_locked(o, op);
    }
    /* Every op is gone: what is left in the table holds only the table's reference. */
    for (size_t i = 0; strmap_next(&o->clients, &i, &k, &v);) {
        struct wclient *wc = v;
        wc->client         = NULL;
        free(wc);
    }
    pthread_mutex_unlock(&o->mtx);
    strmap_fini(&o->clients);
    stale_close_all(o);
    strmap_fini(&o->by_id);
    strmap_fini(&o->queues);
    free(o->history);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mtx);
    free(o);
}
