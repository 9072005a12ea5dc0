/*
 * The op table: each op's life from SubmitOp to its answer and its place in the history,
 * the GetOp/ListOps/status queries, the timer that fails ops queued past their deadline, and
 * the ops metrics. Planning is plan.c, the ordering rule opqueue.c, the calls to workers
 * fanout.c. The table's lock (mtx) guards every op and the queues; fanout's own lock is only
 * ever taken inside it. Some 1,000 lines: an op's life, its queries and the timer all work on
 * struct op under that lock, and apart each would need the others' internals.
 *
 * An op's life, and why it has two phases. A collective moves data between workers while it
 * runs, so a failure part way (a worker dies, a deadline passes) would leave some tensors
 * with results, some with partial sums and some untouched, and a retry would compute garbage
 * from them. So workers compute into staging and change nothing until told: the op is queued,
 * then *prepares* (Execute to every worker; each answers OK once its results are staged), then
 * *commits* (Commit to every worker once all have prepared; each publishes its results at
 * once). A failure before Commit aborts every worker and changes nothing anywhere; the op is
 * answered only once every worker has confirmed Commit, or with DATA_LOSS naming those that
 * did not (README, "What holds when an op fails"). A barrier stages nothing and skips Commit.
 *
 * Idempotency keys. An op submitted with a key is found by it while the table remembers the
 * op (in flight, or in the history): the same key again waits for that op or gets its outcome
 * at once, and never starts another. A coordinator that does not know the key (restarted, or
 * the op left the history) runs the op, but with the key in its Execute: a worker that
 * committed the key answers already_committed, and then nothing new is committed and the op
 * is reported with the first op's id (a replay).
 */
#include "ops.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "clock.h"
#include "device.h"
#include "fanout.h"
#include "log.h"
#include "metrics.h"
#include "opkey.h"
#include "opqueue.h"
#include "plan.h"
#include "rpc.h"
#include "status.h"
#include "strmap.h"
#include "threadname.h"
#include "validate.h"

#define OP_ID_SIZE    40
#define LIST_DEFAULT  100
#define TIMER_TICK_MS 20
/* Workers get this much less time than the op, so that when one of them hangs the others
 * report whom they were waiting for before the coordinator's own deadline fires. */
#define WORKER_TIME_SHARE 0.9
/* Ends of ops answered per pass of ops_fail_where: their answers go out outside the lock. */
#define FAIL_BATCH 32
/* A worker holds a prepared op's staging for the op's time left plus the Commit timeout plus
 * this, so that it still holds it when the last Commit the coordinator can send arrives. */
#define HOLD_MARGIN_MS 5000
/* Submissions of one key that wait for its op in flight. */
#define KEY_WAITERS_MAX 64

enum op_state { OP_QUEUED = 1, OP_RUNNING, OP_DONE, OP_FAILED };

struct op;

/* What the op has heard from one worker of its plan (op->plan.workers[i]). code and message
 * are its last word: Execute's answer, then Commit's when that failed. */
struct op_worker {
    struct op *op;
    const struct plan_worker *plan;
    struct fanout_conn *conn; /* a reference, dropped when the op goes */
    bool answered;            /* to Execute */
    bool aborted;             /* sent Abort */
    bool transport_failed;    /* Execute failed without a worker's answer: it may hold staging */
    bool already;             /* answered that it committed the op's key before, as: */
    char committed_op_id[FANOUT_OP_ID_MAX + 1];
    bool commit_answered;
    bool commit_unknown; /* no answer to Commit came: it may or may not have published */
    dc_code code;
    char message[DC_STATUS_MESSAGE_MAX];
    uint64_t elapsed_us;
};

/* A later SubmitOp with the same idempotency key, answered with the op's outcome. */
struct op_waiter {
    Devcoord__V1__SubmitOpResponse_Closure closure;
    void *cd;
    struct op_waiter *next;
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
    struct plan plan;                     /* empty for a refused op */
    struct op_worker *workers;            /* one per plan.workers, same order */
    unsigned pending;                     /* workers not answered yet (Execute, then Commit) */
    char key[DC_IDEMPOTENCY_KEY_MAX + 1]; /* "" for none */
    uint64_t key_hash;                    /* the request's fingerprint (opkey.h) */
    bool committing;                      /* every worker prepared; Commit sent, no Abort */
    bool replay;   /* a worker committed the key before: nothing new is committed */
    uint64_t term; /* the leadership term its Execute carried, and its Commit carries */
    struct op_waiter *waiters;
    unsigned n_waiters;
    /* The first ABORTED answer, used only if no worker reports the cause. */
    dc_status secondary;
    bool have_secondary;
    uint64_t submitted_unix_ms, submitted_ms, started_us, elapsed_us;
    uint32_t timeout_ms;
    uint64_t deadline_ms;
    Devcoord__V1__SubmitOpResponse_Closure closure; /* NULL once answered */
    void *cd;
    unsigned refs; /* the tables, and each RPC in flight */
    struct op *next_active;
};

struct ops {
    struct registry *registry;
    const struct config_coordinator *cfg;
    struct fanout *fanout;
    pthread_mutex_t mtx;
    pthread_cond_t cv;    /* wakes the timer to stop */
    struct strmap by_id;  /* id -> op (active and history) */
    struct strmap by_key; /* idempotency key -> op, for the ops in by_id that have one */
    struct op *active;    /* queued and running, newest first */
    struct op **history;  /* ring of finished ops */
    size_t hist_cap, hist_len, hist_next;
    struct opqueue queues; /* of the active ops, per device */
    uint64_t counter;
    uint64_t in_flight, done, failed;
    /* metrics, guarded by mtx */
    uint64_t ended[DC_OP_COUNT][RPC_METRICS_CODES];
    struct histo duration[DC_OP_COUNT];
    struct histo fanout_workers;
    bool stopping;
    pthread_t timer;
    /* The leadership term orders carry (ops_set_term); NULL: a lone coordinator (term 0). */
    const atomic_ullong *term;
    bool (*leads)(void *arg); /* whether the lease is still fresh; NULL with term */
    void *leads_arg;
};

static void op_start_locked(struct ops *o, struct op *op);

/* Why an op of term ends when the leadership is gone; cause (may be NULL) is what else was
 * seen meanwhile. */
#define LEADERSHIP_LOST \
    "coordinator lost its leadership (term %llu) while the op was in flight; ask the new leader"

static void
leadership_lost_status(dc_status *st, uint64_t term, const char *cause)
{
    if (cause == NULL) {
        status_set(st, DC_UNAVAILABLE, LEADERSHIP_LOST, (unsigned long long)term);
    } else {
        status_set(st, DC_UNAVAILABLE, LEADERSHIP_LOST " (%.600s)", (unsigned long long)term,
                   cause);
    }
}

/* Frees op; its connection references must have been dropped (op_put_conns). */
static void
op_free(struct op *op)
{
    if (op != NULL) {
        plan_fini(&op->plan);
        free(op->workers);
        free(op);
    }
}

/* Puts back op's connections (fanout has its own lock: this needs no other). */
static void
op_put_conns(struct ops *o, struct op *op)
{
    for (size_t i = 0; i < op->plan.n_workers; i++) {
        fanout_conn_put(o->fanout, op->workers[i].conn);
        op->workers[i].conn = NULL;
    }
}

/* An ended op that only one table (the history) holds puts back its connections: no call of
 * it starts any more, and one kept for it would keep a worker that is gone connected
 * (redialing) until the op left the history. ops->mtx held. */
static void
op_put_conns_if_idle(struct ops *o, struct op *op)
{
    if (op->refs == 1 && (op->state == OP_DONE || op->state == OP_FAILED)) {
        op_put_conns(o, op);
    }
}

/* Drops a reference; the op goes with the last. ops->mtx held. */
static void
op_unref_locked(struct ops *o, struct op *op)
{
    if (--op->refs == 0) {
        op_put_conns(o, op);
        op_free(op);
    } else {
        op_put_conns_if_idle(o, op);
    }
}

/* ---- the info messages ------------------------------------------------------------------- */

static Devcoord__V1__Status *
status_pb(struct arena *a, const dc_status *st)
{
    Devcoord__V1__Status *s = arena_alloc(a, sizeof(*s));

    if (s == NULL) {
        return NULL;
    }
    devcoord__v1__status__init(s);
    s->code    = (Devcoord__V1__Code)st->code;
    s->message = arena_strdup(a, st->message);
    s->worker  = arena_strdup(a, st->worker);
    if (st->device_index >= 0) {
        s->detail_case  = DEVCOORD__V1__STATUS__DETAIL_DEVICE_INDEX;
        s->device_index = (uint32_t)st->device_index;
    }
    return s->message != NULL && s->worker != NULL ? s : NULL;
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
    size_t n_workers           = op->plan.n_workers;
    size_t nw = 0, nr = 0;

    if (info == NULL) {
        return NULL;
    }
    devcoord__v1__op_info__init(info);
    info->op_id             = arena_strdup(a, op->id);
    info->kind              = (Devcoord__V1__OpKind)op->kind;
    info->reduce            = (Devcoord__V1__ReduceOp)op->reduce;
    info->root              = op->root;
    info->tensor            = arena_strdup(a, op->tensor);
    info->output_tensor     = arena_strdup(a, op->output);
    info->idempotency_key   = arena_strdup(a, op->key);
    info->state             = op_states[op->state];
    info->status            = status_pb(a, &op->status);
    info->plan              = op->plan.n_devices > 0 ? plan_pb(a, &op->plan) : NULL;
    info->submitted_unix_ms = op->submitted_unix_ms;
    info->elapsed_us = op->state == OP_RUNNING ? rpc_now_us() - op->started_us : op->elapsed_us;
    info->workers    = arena_alloc(a, (n_workers + 1) * sizeof(*info->workers));
    info->waiting_on = arena_alloc(a, (n_workers + 1) * sizeof(*info->waiting_on));
    if (info->op_id == NULL || info->tensor == NULL || info->output_tensor == NULL ||
        info->idempotency_key == NULL || info->status == NULL ||
        (op->plan.n_devices > 0 && info->plan == NULL) || info->workers == NULL ||
        info->waiting_on == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n_workers; i++) {
        const struct op_worker *w = &op->workers[i];
        if (op->committing && !w->commit_answered && op->state == OP_RUNNING) {
            info->waiting_on[nw++] = arena_strdup(a, w->plan->name);
        }
        if (!w->answered) {
            if (op->state == OP_RUNNING) {
                info->waiting_on[nw++] = arena_strdup(a, w->plan->name);
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
        wr->name            = arena_strdup(a, w->plan->name);
        wr->status          = status_pb(a, &ws);
        wr->elapsed_us      = w->elapsed_us;
        info->workers[nr++] = wr;
    }
    info->n_workers    = nr;
    info->n_waiting_on = nw;
    return info;
}

/* ---- ending ------------------------------------------------------------------------------ */

/* The answer to an op's submitter and to every later submission of its key, prepared under
 * the lock and sent after it. */
struct pending_answer {
    struct arena *arena;
    Devcoord__V1__SubmitOpResponse resp;
    dc_status status;
    Devcoord__V1__SubmitOpResponse_Closure closure;
    void *cd;
    struct op_waiter *waiters;
};

/* Sends the SubmitOp answer prepared under the lock. */
static void
answer_send(struct pending_answer *pa)
{
    if (pa->closure != NULL) {
        *rpc_call_status(pa->cd) = pa->status;
        pa->closure(pa->resp.op != NULL ? &pa->resp : NULL, pa->cd);
    }
    while (pa->waiters != NULL) {
        struct op_waiter *w     = pa->waiters;
        pa->waiters             = w->next;
        *rpc_call_status(w->cd) = pa->status;
        w->closure(pa->resp.op != NULL ? &pa->resp : NULL, w->cd);
        free(w);
    }
    arena_free(pa->arena);
}

/* Prepares in *pa the answer of op as it stands, for its submitter (closure, cd: NULL for
 * none) and its key's waiters (moved out of op). ops->mtx held. */
static void
answer_prepare_locked(const struct op *op, Devcoord__V1__SubmitOpResponse_Closure closure, void *cd,
                      struct op_waiter *waiters, struct pending_answer *pa)
{
    memset(pa, 0, sizeof(*pa));
    devcoord__v1__submit_op_response__init(&pa->resp);
    pa->closure = closure;
    pa->cd      = cd;
    pa->waiters = waiters;
    pa->status  = op->status;
    if (closure == NULL && waiters == NULL) {
        return;
    }
    if ((pa->arena = arena_new(ARENA_OWN_BUDGET)) == NULL ||
        (pa->resp.op = op_info(pa->arena, op)) == NULL) {
        status_set(&pa->status, DC_RESOURCE_EXHAUSTED, "out of memory answering");
    }
}

/* Tells every worker of op that may hold its staging to drop it and stop: those still
 * running it and those that prepared. Each Abort holds a reference to op until
 * ops_on_aborted. Never once Commit went out. ops->mtx held. */
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
    if (op->committing) {
        return;
    }
    for (size_t i = 0; i < op->plan.n_workers; i++) {
        struct op_worker *w = &op->workers[i];
        dc_status st;
        /* A worker that answered a failure holds nothing; one that committed the key before
         * runs nothing. One whose call failed on the way (timeout, lost connection) may have
         * prepared: it is told too. */
        if (w->aborted || w->conn == NULL || w->already ||
            (w->answered && w->code != DC_OK && !w->transport_failed)) {
            continue;
        }
        w->aborted = true;
        op->refs++;
        /* Best effort: a worker not told stops at its own deadline and discards its staging
         * when its hold runs out. */
        if (fanout_abort(o->fanout, w->conn, &req, w, &st) != DC_OK) {
            op->refs--;
        }
    }
}

static void
ops_on_aborted(void *arg, void *tag)
{
    struct ops *o       = arg;
    struct op_worker *w = tag;

    pthread_mutex_lock(&o->mtx);
    op_unref_locked(o, w->op);
    pthread_mutex_unlock(&o->mtx);
}

/* Starts every queued op that now heads all its queues. Starting one may end it (and
 * others) at once, so the scan begins again after each start. ops->mtx held. */
static void
ops_start_runnable_locked(struct ops *o)
{
    struct op *op;

    do {
        for (op = o->active; op != NULL; op = op->next_active) {
            if (op->state == OP_QUEUED &&
                opqueue_runnable(&o->queues, op, op->plan.devices, op->plan.n_devices)) {
                op_start_locked(o, op);
                break;
            }
        }
    } while (op != NULL);
}

/* Takes op out of the lookup tables. ops->mtx held. */
static void
op_forget_locked(struct ops *o, struct op *op)
{
    strmap_del(&o->by_id, op->id);
    if (op->key[0] != '\0' && strmap_get(&o->by_key, op->key) == op) {
        strmap_del(&o->by_key, op->key);
    }
}

static void
history_add_locked(struct ops *o, struct op *op)
{
    if (o->hist_cap == 0) {
        op_forget_locked(o, op);
        op_unref_locked(o, op);
        return;
    }
    if (o->hist_len == o->hist_cap) {
        struct op *old = o->history[o->hist_next];
        op_forget_locked(o, old);
        op_unref_locked(o, old);
    } else {
        o->hist_len++;
    }
    o->history[o->hist_next] = op;
    o->hist_next             = (o->hist_next + 1) % o->hist_cap;
    op_put_conns_if_idle(o, op);
}

static void op_commit_verdict(const struct op *op, const dc_status *cause, dc_status *out);

/* Ends op with st (OK: done). Prepares the caller's answer in *pa; the caller sends it after
 * unlocking. An op ended from outside while Commit is out (shutdown) reports what its
 * workers confirmed so far. ops->mtx held. */
static void
op_end_locked(struct ops *o, struct op *op, const dc_status *st, struct pending_answer *pa)
{
    dc_status verdict;

    if (op->committing && st->code != DC_OK) {
        op_commit_verdict(op, st, &verdict);
        st = &verdict;
    }
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
        /* A failure changed nothing (DATA_LOSS aside: then some workers committed, and they
         * remember the key too): a later submit under the key runs the op again. */
        if (st->code != DC_DATA_LOSS && op->key[0] != '\0' &&
            strmap_get(&o->by_key, op->key) == op) {
            strmap_del(&o->by_key, op->key);
        }
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
    opqueue_remove(&o->queues, op, op->plan.devices, op->plan.n_devices);
    answer_prepare_locked(op, op->closure, op->cd, op->waiters, pa);
    op->closure   = NULL;
    op->waiters   = NULL;
    op->n_waiters = 0;
    history_add_locked(o, op);
    ops_start_runnable_locked(o);
}

/* Ends op with st at once, answering its caller. Called with the lock held: the answer goes
 * out through the closure anyway, which only packs and queues a send. ops->mtx held. */
static void
op_fail_now_locked(struct ops *o, struct op *op, const dc_status *st)
{
    struct pending_answer pa;

    op->refs++; /* op_end may free it from the history; keep it for the answer */
    op_end_locked(o, op, st, &pa);
    op_unref_locked(o, op);
    answer_send(&pa);
}

/* ---- running ----------------------------------------------------------------------------- */

/* Appends ", name" (or "name" first) to buf, as much as fits. */
static void
names_add(char *buf, size_t cap, const char *name)
{
    size_t n = strlen(buf);

    snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", name);
}

/* The outcome of op's Commit from what its workers answered; cause: why it ends before every
 * answer came (NULL when all came). A worker that answered anything but OK did not publish
 * (Commit publishes all of a worker's tensors or none); one that did not answer may have.
 * ops->mtx held. */
static void
op_commit_verdict(const struct op *op, const dc_status *cause, dc_status *out)
{
    char done[256] = "", refused[256] = "", unknown[256] = "", why[300] = "";
    const struct op_worker *first = NULL;
    size_t n_done = 0, n_unknown = 0;

    for (size_t i = 0; i < op->plan.n_workers; i++) {
        const struct op_worker *w = &op->workers[i];
        if (w->commit_answered && w->code == DC_OK) {
            names_add(done, sizeof(done), w->plan->name);
            n_done++;
            continue;
        }
        if (!w->commit_answered || w->commit_unknown) {
            names_add(unknown, sizeof(unknown), w->plan->name);
            n_unknown++;
        } else {
            names_add(refused, sizeof(refused), w->plan->name);
        }
        if (first == NULL) {
            first = w;
        }
    }
    if (first == NULL) {
        status_clear(out);
        return;
    }
    if (first->commit_answered) {
        snprintf(why, sizeof(why), "worker %.63s: %.220s", first->plan->name, first->message);
    } else {
        snprintf(why, sizeof(why), "%.290s", cause != NULL ? cause->message : "no answer");
    }
    if (n_done == 0 && n_unknown == 0) {
        status_set(out, DC_ABORTED, "op %s changed nothing: no worker committed it (%s)", op->id,
                   why);
    } else {
        status_set(out, DC_DATA_LOSS,
                   "op %s was committed partially: committed on [%s], not committed on [%s], "
                   "unconfirmed on [%s] (%s); each worker holds all of the op's results or none "
                   "of them",
                   op->id, done, refused, unknown, why);
    }
    status_set_worker(out, first->plan->name);
}

/* Every worker prepared: sends Commit to each. Each call holds a reference to op until
 * ops_on_committed. May end op at once (answers in *pa, *answer set). ops->mtx held. */
static void
op_commit_locked(struct ops *o, struct op *op, struct pending_answer *pa, bool *answer)
{
    Devcoord__V1__CommitRequest req = DEVCOORD__V1__COMMIT_REQUEST__INIT;

    op->committing = true;
    req.op_id      = op->id;
    req.term       = op->term;
    for (size_t i = 0; i < op->plan.n_workers; i++) {
        struct op_worker *w = &op->workers[i];
        dc_status st;

        op->refs++;
        op->pending++;
        if (fanout_commit(o->fanout, w->conn, &req, w, &st) == DC_OK) {
            continue;
        }
        /* Not sent: that worker surely did not publish. */
        op->refs--;
        op->pending--;
        w->commit_answered = true;
        w->code            = st.code;
        snprintf(w->message, sizeof(w->message), "commit not sent: %.990s", st.message);
    }
    if (op->pending == 0) {
        dc_status end;
        op_commit_verdict(op, NULL, &end);
        op_end_locked(o, op, &end, pa);
        *answer = true;
    }
}

/* The outcome of an op whose key a worker had committed before: nothing was run or
 * committed now. When every worker says so, naming the same op, that op's success is the
 * answer, under its id; otherwise the key's first op was committed partially (or some worker
 * forgot it), which is what the answer says. ops->mtx held. */
static void
op_replay_verdict(struct ops *o, struct op *op, dc_status *out)
{
    char already[256] = "", other[256] = "";
    const char *original = NULL;
    bool same            = true;

    for (size_t i = 0; i < op->plan.n_workers; i++) {
        const struct op_worker *w = &op->workers[i];
        if (w->already) {
            names_add(already, sizeof(already), w->plan->name);
            if (original == NULL) {
                original = w->committed_op_id;
            } else if (strcmp(original, w->committed_op_id) != 0) {
                same = false;
            }
        } else {
            names_add(other, sizeof(other), w->plan->name);
            same = false;
        }
    }
    if (same && original != NULL) {
        log_info("op %s: key '%s' was committed as op %s on every worker; reported as that op",
                 op->id, op->key, original);
        /* The first op's id, unless this table knows another op by it. */
        if (strlen(original) < sizeof(op->id) && strmap_get(&o->by_id, original) == NULL &&
            strmap_put(&o->by_id, original, op)) {
            strmap_del(&o->by_id, op->id);
            memcpy(op->id, original, strlen(original) + 1); /* fits: checked above */
        }
        status_clear(out);
        return;
    }
    status_set(out, DC_DATA_LOSS,
               "idempotency key '%s' was committed before as op %s on [%s] but not on [%s] (its "
               "commit was partial, or those workers restarted or forgot it); nothing was run "
               "again",
               op->key, original != NULL ? original : "?", already, other);
}

/* Whether id has the form of the op ids this coordinator makes ("op-<hex>-<hex>"). */
static bool
committed_op_id_ok(const char *id)
{
    size_t n = strlen(id);

    if (n < 4 || n >= OP_ID_SIZE || strncmp(id, "op-", 3) != 0) {
        return false;
    }
    for (size_t i = 3; i < n; i++) {
        if (!isxdigit((unsigned char)id[i]) && id[i] != '-') {
            return false;
        }
    }
    return true;
}

/* A worker's answer to Execute (fanout_events.executed): the op fails at the first failure;
 * at the last answer it commits (or ends: a barrier, or a replay). */
static void
ops_on_executed(void *arg, void *tag, dc_code code, const dc_status *st,
                const struct fanout_prepared *p)
{
    struct ops *o            = arg;
    struct op_worker *w      = tag;
    struct op *op            = w->op;
    const char *name         = w->plan->name;
    struct pending_answer pa = { 0 };
    bool answer              = false;
    dc_status bad            = { 0 };

    pthread_mutex_lock(&o->mtx);
    w->answered         = true;
    w->code             = code;
    w->transport_failed = code != DC_OK && st->transport;
    w->elapsed_us       = p->elapsed_us;
    snprintf(w->message, sizeof(w->message), "%s", st->message);
    if (code == DC_OK && p->already_committed &&
        (op->key[0] == '\0' || !committed_op_id_ok(p->committed_op_id))) {
        /* Only a keyed op can have been committed before, under an op id of ours. */
        status_set(&bad, DC_INTERNAL, "answered already_committed %s",
                   op->key[0] == '\0' ? "for an op without an idempotency key"
                                      : "with a malformed committed_op_id");
        code    = DC_INTERNAL;
        st      = &bad;
        w->code = code;
        snprintf(w->message, sizeof(w->message), "%s", bad.message);
    } else if (code == DC_OK && p->already_committed) {
        w->already = true;
        snprintf(w->committed_op_id, sizeof(w->committed_op_id), "%s", p->committed_op_id);
        snprintf(w->message, sizeof(w->message), "committed before as op %s; not run again",
                 p->committed_op_id);
    }
    op->pending--;
    if (op->state == OP_RUNNING && !op->committing) {
        if (w->already && !op->replay) {
            /* Nothing may be committed now: stop the others, which wait for this one. */
            op->replay = true;
            op_abort_workers_locked(o, op);
        }
        if (op->replay) {
            if (op->pending == 0) {
                dc_status end;
                op_replay_verdict(o, op, &end);
                op_end_locked(o, op, &end, &pa);
                answer = true;
            }
        } else if (code != DC_OK) {
            dc_status fail;
            /* The coordinator's own call timing out (no answer came at all) is about this
             * worker; anything the worker answered may be about a peer it names. */
            if (code == DC_DEADLINE_EXCEEDED && st->transport) {
                status_set(&fail, code, "worker %s did not answer op %s within %u ms", name, op->id,
                           op->timeout_ms);
                status_set_worker(&fail, name);
            } else if (st->worker[0] != '\0' && strcmp(st->worker, name) != 0) {
                /* A worker reporting what it found about a peer: name the peer. */
                status_set(&fail, code, "worker %s: %s (reported by %s)", st->worker, st->message,
                           name);
                status_set_worker(&fail, st->worker);
            } else {
                status_set(&fail, code, "worker %s: %s", name, st->message);
                status_set_worker(&fail, name);
            }
            fail.device_index = st->device_index;
            if (o->leads != NULL && !o->leads(o->leads_arg)) {
                /* Paused past the lease: the refusal is likely a worker that moved on to
                 * the new leader (new epoch, newer term). Either way this op is not ours
                 * to report any more. */
                char cause[sizeof(fail.message)];
                snprintf(cause, sizeof(cause), "%s", fail.message);
                leadership_lost_status(&fail, op->term, cause);
            }
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
                op_end_locked(o, op, &op->secondary, &pa);
                answer = true;
            } else if (op->kind == DC_OP_BARRIER) {
                status_clear(&end);
                op_end_locked(o, op, &end, &pa);
                answer = true;
            } else if (o->leads != NULL && !o->leads(o->leads_arg)) {
                /* Its lease went stale while the op ran (etcd out of reach): another
                 * coordinator may lead by now, and this one's Commit could publish beside
                 * that one's orders. Nothing is committed; op_end aborts the staging. */
                leadership_lost_status(&end, op->term,
                                       "the lease was not renewed in time; "
                                       "nothing was committed");
                op_end_locked(o, op, &end, &pa);
                answer = true;
            } else {
                op_commit_locked(o, op, &pa, &answer);
            }
        }
    }
    op_unref_locked(o, op);
    pthread_mutex_unlock(&o->mtx);
    if (answer) {
        answer_send(&pa);
    }
}

/* A worker's answer to Commit (fanout_events.committed): the op ends at the last. */
static void
ops_on_committed(void *arg, void *tag, dc_code code, const dc_status *st)
{
    struct ops *o            = arg;
    struct op_worker *w      = tag;
    struct op *op            = w->op;
    struct pending_answer pa = { 0 };
    bool answer              = false;

    pthread_mutex_lock(&o->mtx);
    if (!w->commit_answered) {
        w->commit_answered = true;
        /* No answer, or a worker too old to know Commit (it wrote its results in place at
         * Execute): either way it may hold the results. */
        w->commit_unknown = code != DC_OK && (st->transport || code == DC_UNIMPLEMENTED);
        w->code           = code;
        if (code != DC_OK) {
            if (code == DC_DEADLINE_EXCEEDED && st->transport) {
                snprintf(w->message, sizeof(w->message), "no answer to Commit within %d ms",
                         FANOUT_COMMIT_TIMEOUT_MS);
            } else {
                snprintf(w->message, sizeof(w->message), "commit: %.1000s", st->message);
            }
        }
    }
    op->pending--;
    if (op->state == OP_RUNNING && op->committing && op->pending == 0) {
        dc_status end;
        op_commit_verdict(op, NULL, &end);
        op_end_locked(o, op, &end, &pa);
        answer = true;
    }
    op_unref_locked(o, op);
    pthread_mutex_unlock(&o->mtx);
    if (answer) {
        answer_send(&pa);
    }
}

/* Fans op out: sends Execute with the whole plan to every worker of it. Each call holds a
 * reference to op until ops_on_executed. ops->mtx held. */
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
    histo_observe(&o->fanout_workers, (uint64_t)op->plan.n_workers * 1000000u);
    if (a == NULL || (req.plan = plan_pb(a, &op->plan)) == NULL) {
        status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory starting op %s", op->id);
        op_fail_now_locked(o, op, &st);
        goto out;
    }
    op->term = o->term != NULL ? atomic_load(o->term) : 0;
    /* Not while the lease is stale either: queued ops start as earlier ones end, with no
     * RPC to refuse them. */
    if (o->term != NULL && (op->term == 0 || (o->leads != NULL && !o->leads(o->leads_arg)))) {
        status_set(&st, DC_UNAVAILABLE, "op %s not started: this coordinator no longer leads",
                   op->id);
        op_fail_now_locked(o, op, &st);
        goto out;
    }
    left              = now < op->deadline_ms ? (uint32_t)(op->deadline_ms - now) : 1;
    req.term          = op->term;
    req.op_id         = op->id;
    req.kind          = (Devcoord__V1__OpKind)op->kind;
    req.reduce        = (Devcoord__V1__ReduceOp)op->reduce;
    req.root          = op->root;
    req.tensor        = op->tensor;
    req.output_tensor = op->output;
    req.timeout_ms =
        (uint32_t)(left * WORKER_TIME_SHARE) > 0 ? (uint32_t)(left * WORKER_TIME_SHARE) : 1;
    req.idempotency_key = op->key;
    req.request_hash    = op->key_hash;
    /* The last Commit can go out at the op's deadline and take FANOUT_COMMIT_TIMEOUT_MS to
     * arrive; the staging must still be there then. */
    req.hold_ms = left > UINT32_MAX - FANOUT_COMMIT_TIMEOUT_MS - HOLD_MARGIN_MS
                      ? UINT32_MAX
                      : left + FANOUT_COMMIT_TIMEOUT_MS + HOLD_MARGIN_MS;
    for (size_t i = 0; i < op->plan.n_workers; i++) {
        struct op_worker *w = &op->workers[i];
        dc_status fail;

        req.self  = (uint32_t)i;
        req.epoch = w->plan->epoch;
        status_clear(&st);
        op->refs++;
        op->pending++;
        if (fanout_execute(o->fanout, w->conn, &req, left, w, &st) == DC_OK) {
            continue;
        }
        op->refs--;
        op->pending--;
        /* Could not even send: the op fails like a worker that said no. */
        w->answered = true;
        w->code     = st.code;
        snprintf(w->message, sizeof(w->message), "%s", st.message);
        status_set(&fail, st.code, "worker %s: %s", w->plan->name, st.message);
        status_set_worker(&fail, w->plan->name);
        op_fail_now_locked(o, op, &fail);
        break;
    }
out:
    arena_free(a);
}

/* ---- submit ------------------------------------------------------------------------------ */

/* Answers a submission that runs nothing, at once: a refusal (op NULL when it could not even
 * be had) or a dry run. Frees op. */
static void
submit_answer_now(struct op *op, dc_code code, const dc_status *st,
                  Devcoord__V1__SubmitOpResponse_Closure closure, void *cd)
{
    Devcoord__V1__SubmitOpResponse resp = DEVCOORD__V1__SUBMIT_OP_RESPONSE__INIT;
    struct arena *a                     = NULL;

    *rpc_call_status(cd) = *st;
    if (code == DC_OK) {
        status_clear(rpc_call_status(cd));
    }
    if (op != NULL) {
        op->status = *rpc_call_status(cd);
        op->state  = code == DC_OK ? OP_QUEUED : OP_FAILED;
        a          = arena_new(ARENA_OWN_BUDGET);
        if (a == NULL || (resp.op = op_info(a, op)) == NULL) {
            status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "out of memory answering");
        }
    }
    closure(resp.op != NULL ? &resp : NULL, cd);
    arena_free(a);
    op_free(op);
}

/* A new op with what the request says besides its devices. */
static struct op *
op_new(const Devcoord__V1__SubmitOpRequest *in, const struct config_coordinator *cfg)
{
    struct op *op = calloc(1, sizeof(*op));

    if (op == NULL) {
        return NULL;
    }
    op->submitted_unix_ms = clock_unix_ms();
    op->submitted_ms      = rpc_now_ms();
    op->kind              = (dc_op_kind)in->kind;
    op->reduce            = (dc_reduce_op)in->reduce;
    op->root              = in->root;
    snprintf(op->tensor, sizeof(op->tensor), "%s", in->tensor);
    if (in->output_tensor[0] != '\0') {
        snprintf(op->output, sizeof(op->output), "%s", in->output_tensor);
    } else if (op->kind == DC_OP_ALL_GATHER && strlen(in->tensor) + 9 < sizeof(op->output)) {
        snprintf(op->output, sizeof(op->output), "%s.gathered", in->tensor);
    }
    op->timeout_ms = in->timeout_ms ? in->timeout_ms : cfg->op_timeout_ms;
    /* A dry run runs nothing, so it has nothing to remember under a key. */
    if (!in->dry_run) {
        snprintf(op->key, sizeof(op->key), "%.*s", DC_IDEMPOTENCY_KEY_MAX, in->idempotency_key);
        op->key_hash = opkey_fingerprint(in);
    }
    return op;
}

/* The tensors an op that runs needs (a dry run runs nothing, so it needs none), names op
 * keeps whole, and a deadline nng can count (a duration is a signed 32-bit count). */
static dc_code
op_check_tensors(const struct op *op, const Devcoord__V1__SubmitOpRequest *in, bool dry_run,
                 dc_status *st)
{
    if (strlen(in->tensor) >= sizeof(op->tensor) ||
        strlen(in->output_tensor) >= sizeof(op->output)) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid operation: tensor names are at most %zu bytes",
                          sizeof(op->tensor) - 1);
    }
    if (in->timeout_ms > INT32_MAX) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid operation: timeout_ms %u is more than %d", in->timeout_ms,
                          INT32_MAX);
    }
    if (!dry_run && op->kind != DC_OP_BARRIER && op->tensor[0] == '\0') {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid operation: %s needs a tensor name (SubmitOpRequest.tensor)",
                          dc_op_kind_name(op->kind));
    }
    if (!dry_run && op->kind == DC_OP_ALL_GATHER && op->output[0] == '\0') {
        return status_set(st, DC_INVALID_ARGUMENT, "invalid operation: no output tensor");
    }
    return DC_OK;
}

static bool
ops_worker_address(void *arg, const char *name, char *address, size_t cap, uint64_t *epoch)
{
    return registry_worker_address(arg, name, address, cap, epoch);
}

/* Plans op from the validated devices, with a worker state for each worker of the plan. */
static dc_code
op_plan(struct ops *o, struct op *op, const dc_device_ref *concrete, size_t n, const char *group_id,
        dc_status *st)
{
    struct plan_lookup lookup = { ops_worker_address, o->registry };
    dc_code rv;

    if ((rv = plan_build(&op->plan, concrete, n, group_id, &lookup, st)) != DC_OK) {
        return rv;
    }
    if ((op->workers = calloc(op->plan.n_workers, sizeof(*op->workers))) == NULL) {
        plan_fini(&op->plan);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory planning");
    }
    for (size_t i = 0; i < op->plan.n_workers; i++) {
        op->workers[i].op   = op;
        op->workers[i].plan = &op->plan.workers[i];
    }
    return DC_OK;
}

/* Enters op in the table and behind earlier ops on its devices. On DC_OK the table owns op;
 * otherwise op is as it was. ops->mtx held. */
static dc_code
op_enqueue_locked(struct ops *o, struct op *op, Devcoord__V1__SubmitOpResponse_Closure closure,
                  void *cd, dc_status *st)
{
    dc_code rv = DC_OK;

    if (o->stopping) {
        return status_set(st, DC_UNAVAILABLE, "coordinator shutting down");
    }
    for (size_t i = 0; i < op->plan.n_workers; i++) {
        const struct plan_worker *pw = &op->plan.workers[i];
        if ((rv = fanout_conn_get(o->fanout, pw->name, pw->address, &op->workers[i].conn, st)) !=
            DC_OK) {
            goto out;
        }
        fanout_conn_epoch(o->fanout, op->workers[i].conn, pw->epoch);
    }
    snprintf(op->id, sizeof(op->id), "op-%llx-%llx", (unsigned long long)op->submitted_unix_ms,
             (unsigned long long)++o->counter);
    if (!strmap_put(&o->by_id, op->id, op)) {
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if (op->key[0] != '\0' && !strmap_put(&o->by_key, op->key, op)) {
        strmap_del(&o->by_id, op->id);
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if (!opqueue_push(&o->queues, op, op->plan.devices, op->plan.n_devices)) {
        op_forget_locked(o, op);
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    op->deadline_ms = op->submitted_ms + op->timeout_ms;
    op->state       = OP_QUEUED;
    op->closure     = closure;
    op->cd          = cd;
    op->refs        = 1;
    op->next_active = o->active;
    o->active       = op;
    o->in_flight++;
out:
    if (rv != DC_OK) {
        op_put_conns(o, op);
    }
    return rv;
}

/* A submission naming the key of op prev (which the table knows) with request fingerprint
 * hash: it gets prev's outcome, now if prev has ended (*answer set, the answer in *pa), or
 * when prev ends. A different request under the same key, or too many waiting, is refused
 * (and nothing changed). ops->mtx held. */
static dc_code
op_key_join_locked(struct op *prev, uint64_t hash, Devcoord__V1__SubmitOpResponse_Closure closure,
                   void *cd, struct pending_answer *pa, bool *answer, dc_status *st)
{
    struct op_waiter *w;

    *answer = false;
    if (prev->key_hash != hash) {
        return status_set(st, DC_FAILED_PRECONDITION,
                          "idempotency key '%s' was used by op %s for a different request",
                          prev->key, prev->id);
    }
    if (prev->state == OP_DONE || prev->state == OP_FAILED) {
        answer_prepare_locked(prev, closure, cd, NULL, pa);
        *answer = true;
        return DC_OK;
    }
    if (prev->n_waiters >= KEY_WAITERS_MAX) {
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "%d submissions of idempotency key '%s' already wait for op %s",
                          KEY_WAITERS_MAX, prev->key, prev->id);
    }
    if ((w = calloc(1, sizeof(*w))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    w->closure    = closure;
    w->cd         = cd;
    w->next       = prev->waiters;
    prev->waiters = w;
    prev->n_waiters++;
    return DC_OK;
}

/* If the table knows op's key: joins the op that has it (true, *code saying how that went;
 * on DC_OK the caller is answered and op is not needed). ops->mtx held. */
static bool
op_key_known_locked(struct ops *o, const struct op *op,
                    Devcoord__V1__SubmitOpResponse_Closure closure, void *cd,
                    struct pending_answer *pa, bool *answer, dc_code *code, dc_status *st)
{
    struct op *prev = op->key[0] != '\0' ? strmap_get(&o->by_key, op->key) : NULL;

    *answer = false;
    if (prev == NULL) {
        return false;
    }
    if ((*code = op_key_join_locked(prev, op->key_hash, closure, cd, pa, answer, st)) == DC_OK) {
        log_info("op %s: idempotency key '%s' submitted again; answered with that op", prev->id,
                 prev->key);
    }
    return true;
}

void
ops_submit(struct ops *o, const Devcoord__V1__SubmitOpRequest *in,
           Devcoord__V1__SubmitOpResponse_Closure closure, void *cd)
{
    struct validate_limits limits = { .max_group_devices = o->cfg->max_group_devices,
                                      .autodiff          = o->cfg->autodiff };
    /* Read now: once the op is queued, its answer (which frees in) may come at any time. */
    const bool dry_run  = in->dry_run;
    dc_device_ref *refs = NULL, *concrete = NULL;
    char group_id[VALIDATE_GROUP_ID_SIZE];
    struct op_spec spec;
    struct pending_answer pa;
    struct op *op;
    dc_status st;
    dc_code code;
    bool known, answer;

    status_clear(&st);
    if ((op = op_new(in, o->cfg)) == NULL) {
        code = status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    /* A key the table knows gets its op's outcome, before any check: the retry of an op
     * whose worker has died since must still learn what that op did. */
    if ((code = validate_idempotency_key(in->idempotency_key, &st)) != DC_OK) {
        goto out;
    }
    pthread_mutex_lock(&o->mtx);
    known = op_key_known_locked(o, op, closure, cd, &pa, &answer, &code, &st);
    pthread_mutex_unlock(&o->mtx);
    if (known) {
        goto joined;
    }
    /* Validate (design §4), then the tensors a run needs. */
    if ((code = plan_request_devices(in->devices, in->n_devices, &limits, &refs, &concrete, &st)) !=
        DC_OK) {
        goto out;
    }
    spec = (struct op_spec){ .kind      = op->kind,
                             .reduce    = op->reduce,
                             .root      = op->root,
                             .devices   = refs,
                             .n_devices = in->n_devices };
    if ((code = registry_validate(o->registry, &spec, &limits, concrete, group_id, &st)) != DC_OK ||
        (code = op_check_tensors(op, in, dry_run, &st)) != DC_OK) {
        goto out;
    }
    /* Plan; a dry run ends here. */
    if ((code = op_plan(o, op, concrete, in->n_devices, group_id, &st)) != DC_OK || dry_run) {
        goto out;
    }
    /* Queue behind earlier ops on the same devices, and fan out if none is ahead; unless the
     * same key came in meanwhile and has its op now. */
    pthread_mutex_lock(&o->mtx);
    if ((known = op_key_known_locked(o, op, closure, cd, &pa, &answer, &code, &st))) {
        /* answered below */
    } else if ((code = op_enqueue_locked(o, op, closure, cd, &st)) == DC_OK &&
               opqueue_runnable(&o->queues, op, op->plan.devices, op->plan.n_devices)) {
        op_start_locked(o, op);
    }
    pthread_mutex_unlock(&o->mtx);
joined:
    if (known && code == DC_OK) {
        if (answer) {
            answer_send(&pa);
        }
        op_free(op);
        op   = NULL;
        code = DC_OK;
    }
out:
    free(refs);
    free(concrete);
    if (op != NULL && (code != DC_OK || dry_run)) {
        submit_answer_now(op, code, &st, closure, cd);
    } else if (op == NULL && code != DC_OK) {
        submit_answer_now(NULL, code, &st, closure, cd);
    }
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

dc_code
ops_list_into(struct ops *o, size_t limit, struct arena *a, Devcoord__V1__ListOpsResponse *out,
              size_t *total, dc_status *st)
{
    bool oom = false;

    devcoord__v1__list_ops_response__init(out);
    pthread_mutex_lock(&o->mtx);
    if (total != NULL) {
        *total = (size_t)o->in_flight + o->hist_len;
    }
    if ((out->ops = arena_alloc(a, (limit + 1) * sizeof(*out->ops))) == NULL) {
        oom = true;
    }
    /* In flight first (newest first: active is a stack), then the history, newest first. */
    for (struct op *op = o->active; !oom && op != NULL && out->n_ops < limit;
         op            = op->next_active) {
        oom = (out->ops[out->n_ops++] = op_info(a, op)) == NULL;
    }
    for (size_t i = 0; !oom && i < o->hist_len && out->n_ops < limit; i++) {
        struct op *op = o->history[(o->hist_next + o->hist_cap - 1 - i) % o->hist_cap];
        oom           = (out->ops[out->n_ops++] = op_info(a, op)) == NULL;
    }
    pthread_mutex_unlock(&o->mtx);
    if (oom) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory listing ops");
    }
    return DC_OK;
}

void
ops_list(struct ops *o, const Devcoord__V1__ListOpsRequest *in,
         Devcoord__V1__ListOpsResponse_Closure closure, void *cd)
{
    Devcoord__V1__ListOpsResponse resp;
    struct arena *a = arena_new(ARENA_OWN_BUDGET);

    if (a == NULL) {
        status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "out of memory listing ops");
        closure(NULL, cd);
        return;
    }
    if (ops_list_into(o, in->limit ? in->limit : LIST_DEFAULT, a, &resp, NULL,
                      rpc_call_status(cd)) != DC_OK) {
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
    struct pending_answer answers[FAIL_BATCH];
    size_t n;

    do {
        n = 0;
        pthread_mutex_lock(&o->mtx);
        for (struct op *op = o->active; op != NULL && n < FAIL_BATCH;) {
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
    } while (n == FAIL_BATCH);
}

struct gone {
    const char *name;
    uint64_t epoch;
};

/* An op whose Commit is out is not failed for a worker gone: its answer to Commit (or the
 * lack of one, within FANOUT_COMMIT_TIMEOUT_MS) decides what the op reports. */
static bool
op_uses_worker(const struct op *op, const void *arg)
{
    const struct gone *g = arg;

    if (op->committing) {
        return false;
    }
    for (size_t i = 0; i < op->plan.n_workers; i++) {
        const struct plan_worker *w = &op->plan.workers[i];
        if (strcmp(w->name, g->name) == 0 && w->epoch == g->epoch) {
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
    if (why != GONE_REPLACED) {
        /* Kept, its connection would redial a worker that may never come back under this
         * name (a container's host name is new after each restart) for good. */
        fanout_forget(o->fanout, name);
    }
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

/* Every tick: fails ops queued past their deadline and closes the worker connections no op
 * holds any more, both without the lock (answering and closing must not hold it). */
static void *
ops_timer(void *arg)
{
    struct ops *o = arg;
    dc_status late;

    thread_name_set("dc-ops-timer");
    status_set(&late, DC_DEADLINE_EXCEEDED,
               "deadline passed while waiting behind earlier ops on the same devices");
    pthread_mutex_lock(&o->mtx);
    while (!o->stopping) {
        uint64_t now;

        pthread_mutex_unlock(&o->mtx);
        now = rpc_now_ms();
        ops_fail_where(o, op_queued_too_long, &now, &late);
        fanout_close_stale(o->fanout);
        pthread_mutex_lock(&o->mtx);
        if (!o->stopping) {
            clock_cond_wait_ms(&o->cv, &o->mtx, TIMER_TICK_MS);
        }
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
    uint64_t link_calls, rpc_calls;

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
    histo_render(b, "devcoord_op_fanout_workers", "", &o->fanout_workers);
    fanout_counts(o->fanout, &link_calls, &rpc_calls);
    mbuf_printf(b,
                "# HELP devcoord_op_worker_calls_total Execute and Commit calls to workers, by "
                "how they went: as frames on a control link, or as RPCs.\n"
                "# TYPE devcoord_op_worker_calls_total counter\n"
                "devcoord_op_worker_calls_total{transport=\"link\"} %llu\n"
                "devcoord_op_worker_calls_total{transport=\"rpc\"} %llu\n"
                "# HELP devcoord_op_worker_connections Connections to workers the op table keeps "
                "or an op holds (one per worker that is not gone).\n"
                "# TYPE devcoord_op_worker_connections gauge\n"
                "devcoord_op_worker_connections %zu\n",
                (unsigned long long)link_calls, (unsigned long long)rpc_calls,
                fanout_conn_count(o->fanout));
}

/* ---- life -------------------------------------------------------------------------------- */

struct ops *
ops_new(struct registry *registry, const struct config_coordinator *cfg, const char *worker_token)
{
    struct fanout_opts fo = { .token             = worker_token,
                              .tls               = &cfg->tls,
                              .max_message_bytes = cfg->max_message_bytes,
                              .control_links     = true };
    struct ops *o         = calloc(1, sizeof(*o));

    if (o == NULL) {
        return NULL;
    }
    o->registry = registry;
    o->cfg      = cfg;
    o->hist_cap = cfg->op_history;
    fo.events   = (struct fanout_events){ ops_on_executed, ops_on_committed, ops_on_aborted, o };
    if ((o->history = calloc(o->hist_cap ? o->hist_cap : 1, sizeof(*o->history))) == NULL ||
        (o->fanout = fanout_new(&fo)) == NULL) {
        free(o->history);
        free(o);
        return NULL;
    }
    pthread_mutex_init(&o->mtx, NULL);
    clock_cond_init(&o->cv);
    strmap_init(&o->by_id);
    strmap_init(&o->by_key);
    opqueue_init(&o->queues);
    for (int k = 0; k < DC_OP_COUNT; k++) {
        histo_init(&o->duration[k], histo_seconds, histo_seconds_n);
    }
    histo_init(&o->fanout_workers, fanout_buckets,
               sizeof(fanout_buckets) / sizeof(fanout_buckets[0]));
    if (pthread_create(&o->timer, NULL, ops_timer, o) != 0) {
        opqueue_fini(&o->queues);
        strmap_fini(&o->by_key);
        strmap_fini(&o->by_id);
        pthread_cond_destroy(&o->cv);
        pthread_mutex_destroy(&o->mtx);
        fanout_free(o->fanout);
        free(o->history);
        free(o);
        return NULL;
    }
    return o;
}

void
ops_set_term(struct ops *o, const atomic_ullong *term, bool (*leads)(void *arg), void *arg)
{
    o->term      = term;
    o->leads     = leads;
    o->leads_arg = arg;
}

void
ops_leadership_lost(struct ops *o, uint64_t term)
{
    dc_status st;

    leadership_lost_status(&st, term, NULL);
    ops_fail_where(o, op_any, NULL, &st);
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

/*
 * Why this order. Every op has ended (ops_shutdown), but calls may still be out: Executes
 * the workers have not answered and the Aborts the ends sent, each holding a reference to its
 * op. Closing every connection ends them now, and their callbacks drop those references;
 * closing waits for the callbacks, which take mtx, so it runs without it. Then only the
 * history holds ops, and dropping it puts back the last connection references.
 */
void
ops_free(struct ops *o)
{
    if (o == NULL) {
        return;
    }
    if (!o->stopping) {
        ops_shutdown(o);
    }
    fanout_close_all(o->fanout);
    pthread_mutex_lock(&o->mtx);
    for (size_t i = 0; i < o->hist_len; i++) {
        op_unref_locked(o, o->history[i]);
    }
    pthread_mutex_unlock(&o->mtx);
    fanout_free(o->fanout);
    opqueue_fini(&o->queues);
    strmap_fini(&o->by_key);
    strmap_fini(&o->by_id);
    free(o->history);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mtx);
    free(o);
}
