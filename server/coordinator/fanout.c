/*
 * The coordinator's side of the control plane to workers.
 *
 * Why answers come back through callbacks. Execute lasts as long as the op, up to its
 * deadline, and the coordinator has two RPC handler threads: a handler that waited for
 * workers would stall every other call behind it. So SubmitOp only starts the calls; each
 * worker's answer arrives on an nng thread and goes to the op table through
 * fanout_events.executed, and the table answers the trainer at the last answer, the first
 * failure or the deadline. The tag the table passes with each call (its per-worker state)
 * comes back unread, so this file needs nothing of ops, as the registry tells ops what changed
 * through registry_events without knowing they exist.
 *
 * Why connections are shared and closed late. One connection per worker, shared by every op
 * that uses it, saves a dial (and a TLS handshake) per op. rpc_client_close waits until the
 * connection's callbacks have run, and those take the op table's lock, so a connection is
 * never closed on an nng thread nor by a caller holding that lock. One that is replaced (its
 * worker registered again at another address) stays open until the last op holding it lets
 * go; fanout_close_stale, called by the op table's timer thread, then closes it.
 */
#include "fanout.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "address.h"
#include "auth.h"
#include "devcoord/v1/methods.h"
#include "dlframe.h"
#include "log.h"
#include "rpc.h"
#include "strmap.h"
#include "tpool.h"
#include "clock.h"

#define WORKER_SVC (&devcoord__v1__worker__descriptor)

/* How long an Abort may take. Aborts are best effort: a worker that never hears of one still
 * gives up at the deadline its Execute carried. */
#define ABORT_TIMEOUT_MS 2000
/* Cap of the redial backoff towards a worker: a restarted worker is dialled again within it. */
#define RECONNECT_MAX_MS 500

/* Control links a worker keeps open between calls, and link calls in flight at once (past
 * either, calls go as RPCs). */
#define CTL_IDLE_MAX 8
#define CTL_BUSY_MAX 64
/* How long a control link's dial and HELLO may take (on a pool thread, off any op's path). */
#define CTL_DIAL_MS 2000
/* The Worker GroupLink call that learns a worker's data port. */
#define CTL_ASK_MS 5000

/* Whether a worker takes control links, as far as this connection knows. */
enum ctl_state {
    CTL_UNKNOWN, /* not asked yet (or its registration changed since) */
    CTL_ASKING,  /* GroupLink under way */
    CTL_READY,   /* ctl_url and ctl_secret known */
    CTL_NONE,    /* no: TLS, or a worker without them; RPCs only */
};

struct fanout_conn {
    char address[ADDRESS_MAX + 1];
    struct rpc_client *client; /* NULL once closed by fanout_close_all */
    unsigned refs;             /* the table's (while current) and each holder's */
    struct fanout_conn *next;  /* every connection not yet closed and freed */
    /* Control links (dlframe.h DLINK_HELLO_CONTROL): learned with GroupLink, dialled on a
     * pool thread, kept idle between calls, for the registration ctl_epoch: a link made
     * for an older one is closed, not kept. */
    enum ctl_state ctl;
    uint64_t ctl_epoch;
    char ctl_url[ADDRESS_MAX + 1];
    uint8_t ctl_secret[DLINK_SECRET_SIZE];
    struct dlink_out *idle[CTL_IDLE_MAX];
    unsigned n_idle, n_dialing;
};

/* Who sends a call's frame: the caller, on its own thread, when it is small, before the
 * pool thread that reads the answer is even woken (so neither that wake-up nor that thread
 * delays the frame, or the next worker's, on a machine with few CPUs), else the pool thread. */
enum ctl_send {
    CTL_SENT,        /* the caller sent it: the pool thread reads the answer */
    CTL_SEND_BY_JOB, /* the pool thread sends it, then reads the answer */
};

/* Frames up to this size are written by the caller (an nng thread, maybe: a control link
 * carries one call at a time, so the socket's buffer is empty and the write does not wait). */
#define CTL_CALLER_SEND_MAX (64u * 1024)

/* A pool thread's work on a control link: a call on it (method set) or its dial. */
struct ctl_job {
    struct fanout *f;
    struct fanout_conn *c; /* a reference held */
    uint64_t epoch;        /* c->ctl_epoch when the job started */
    struct dlink_out *out; /* the link (a call's, taken idle; a dial's once made) */
    const ProtobufCMethodDescriptor *method;
    nng_msg *req; /* the request frame */
    uint64_t request_id;
    uint32_t timeout_ms;
    rpc_done_fn done;
    void *arg;
    enum ctl_send send;          /* set before the job is submitted */
    struct ctl_job *next, *prev; /* f->jobs while its link is in use */
    struct ctl_job *orphan_next; /* f->orphans (ctl_call) */
};

struct fanout {
    struct fanout_opts opts;
    pthread_mutex_t mtx;
    struct strmap current;     /* worker name -> its connection at its current address */
    struct fanout_conn *conns; /* all of them: current, replaced but held, unheld */
    /* Control links (opts.control_links): the pool their calls and dials run on, the jobs
     * whose link is in use (fanout_close_all aborts those), links to close off any nng
     * thread, and counts. */
    struct tpool *pool;
    struct ctl_job *jobs;
    /* Calls sent whose reader could not be started (ctl_call): ctl_orphans_end fails them. */
    struct ctl_job *orphans;
    unsigned busy; /* jobs submitted and not finished */
    pthread_cond_t idle_cv;
    bool closing;
    struct dlink_out **doomed;
    size_t n_doomed, cap_doomed;
    _Atomic uint64_t next_id;
    _Atomic uint64_t link_calls, rpc_calls;
};

/* One call in flight. */
struct fanout_call {
    struct fanout *f;
    void *tag;
};

/* Closes c's idle control links (a thread of ours, never nng's). */
static void
ctl_drop_idle(struct fanout_conn *c)
{
    while (c->n_idle > 0) {
        dlink_out_close(c->idle[--c->n_idle]);
    }
}

/* Moves c's idle control links to where fanout_close_stale (a thread of ours) closes them:
 * this may run on an nng thread, which must not close streams. Out of memory, they are
 * closed here after all. mtx held. */
static bool
ctl_doomed_room_locked(struct fanout *f, size_t more)
{
    if (f->n_doomed + more > f->cap_doomed) {
        size_t cap            = (f->n_doomed + more) * 2;
        struct dlink_out **dd = realloc(f->doomed, cap * sizeof(*dd));
        if (dd == NULL) {
            return false;
        }
        f->doomed     = dd;
        f->cap_doomed = cap;
    }
    return true;
}

static void
ctl_doom_idle_locked(struct fanout *f, struct fanout_conn *c)
{
    if (!ctl_doomed_room_locked(f, c->n_idle)) {
        ctl_drop_idle(c);
        return;
    }
    while (c->n_idle > 0) {
        f->doomed[f->n_doomed++] = c->idle[--c->n_idle];
    }
}

/* The same for one link (NULL: none). mtx held. */
static void
ctl_doom_locked(struct fanout *f, struct dlink_out *out)
{
    if (out == NULL) {
        return;
    }
    if (!ctl_doomed_room_locked(f, 1)) {
        dlink_out_close(out);
        return;
    }
    f->doomed[f->n_doomed++] = out;
}

struct fanout *
fanout_new(const struct fanout_opts *opts)
{
    struct fanout *f = calloc(1, sizeof(*f));

    if (f == NULL) {
        return NULL;
    }
    f->opts = *opts;
    if (opts->control_links && (f->pool = tpool_new("dc-ctl-link", CTL_BUSY_MAX, 30000)) == NULL) {
        free(f);
        return NULL;
    }
    pthread_mutex_init(&f->mtx, NULL);
    clock_cond_init(&f->idle_cv);
    strmap_init(&f->current);
    return f;
}

void
fanout_free(struct fanout *f)
{
    if (f == NULL) {
        return;
    }
    tpool_free(f->pool); /* no job left: fanout_close_all waited for them, if any ran */
    while (f->conns != NULL) {
        struct fanout_conn *c = f->conns;
        f->conns              = c->next;
        rpc_client_close(c->client);
        ctl_drop_idle(c);
        free(c);
    }
    for (size_t i = 0; i < f->n_doomed; i++) {
        dlink_out_close(f->doomed[i]);
    }
    free(f->doomed);
    strmap_fini(&f->current);
    pthread_cond_destroy(&f->idle_cv);
    pthread_mutex_destroy(&f->mtx);
    free(f);
}

dc_code
fanout_conn_get(struct fanout *f, const char *worker, const char *address, struct fanout_conn **out,
                dc_status *st)
{
    struct fanout_conn *old, *fresh = NULL;
    dc_code rv = DC_OK;

    pthread_mutex_lock(&f->mtx);
    old = strmap_get(&f->current, worker);
    if (old != NULL && strcmp(old->address, address) == 0) {
        old->refs++;
        *out = old;
        goto out;
    }
    if ((fresh = calloc(1, sizeof(*fresh))) == NULL) {
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if ((rv = auth_client_open(address, f->opts.token, f->opts.tls, f->opts.max_message_bytes,
                               RECONNECT_MAX_MS, &fresh->client, st)) != DC_OK) {
        free(fresh);
        goto out;
    }
    snprintf(fresh->address, sizeof(fresh->address), "%s", address);
    fresh->next = f->conns;
    f->conns    = fresh;
    if (!strmap_put(&f->current, worker, fresh)) {
        /* Unheld: the next fanout_close_stale closes it. */
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    fresh->refs = 2; /* the table's and the caller's */
    if (old != NULL) {
        old->refs--; /* the table's, on the old address */
    }
    *out = fresh;
out:
    pthread_mutex_unlock(&f->mtx);
    return rv;
}

void
fanout_forget(struct fanout *f, const char *worker)
{
    struct fanout_conn *c;

    pthread_mutex_lock(&f->mtx);
    if ((c = strmap_del(&f->current, worker)) != NULL) {
        c->refs--; /* the table's */
    }
    pthread_mutex_unlock(&f->mtx);
}

size_t
fanout_conn_count(struct fanout *f)
{
    size_t n = 0;

    pthread_mutex_lock(&f->mtx);
    for (const struct fanout_conn *c = f->conns; c != NULL; c = c->next) {
        n++;
    }
    pthread_mutex_unlock(&f->mtx);
    return n;
}

void
fanout_conn_put(struct fanout *f, struct fanout_conn *c)
{
    if (c != NULL) {
        pthread_mutex_lock(&f->mtx);
        c->refs--;
        pthread_mutex_unlock(&f->mtx);
    }
}

static void
execute_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct fanout_call *call = arg;
    struct fanout_prepared p = { 0 };

    (void)keep;
    if (code == DC_OK && reply->body != NULL) {
        const Devcoord__V1__ExecuteResponse *r = (const Devcoord__V1__ExecuteResponse *)reply->body;
        p.elapsed_us                           = r->elapsed_us;
        p.already_committed                    = r->already_committed;
        snprintf(p.committed_op_id, sizeof(p.committed_op_id), "%s", r->committed_op_id);
    }
    call->f->opts.events.executed(call->f->opts.events.arg, call->tag, code, st, &p);
    free(call);
}

static void
commit_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct fanout_call *call = arg;

    (void)reply;
    (void)keep;
    call->f->opts.events.committed(call->f->opts.events.arg, call->tag, code, st);
    free(call);
}

static void
abort_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct fanout_call *call = arg;

    (void)code;
    (void)st;
    (void)reply;
    (void)keep;
    call->f->opts.events.aborted(call->f->opts.events.arg, call->tag);
    free(call);
}

/* ---- control links ----------------------------------------------------------------------
 *
 * Execute and Commit are the op's round trips to each worker. As RPCs each costs a trip
 * through nng's request/reply layers on both ends: a dozen thread hand-offs on this
 * coordinator alone, where a frame on a raw link wakes only the thread waiting for it
 * (dlsock.h). So for workers that offer it (GroupLink's WGROUPS_FEATURE_CONTROL; plain
 * tcp:// only), these calls go as the same request frames over control links: connections
 * to the worker's data port, one call at a time each, made on a pool thread and kept idle
 * between calls. The worker serves each frame through its RPC server as if it had come as an
 * RPC (token, limits, handlers, metrics), and the reply frame decodes here as an RPC's does.
 * A call goes as an RPC whenever no idle link is at hand (the first calls to a worker, a
 * burst past the links open, CTL_BUSY_MAX calls already out): it never waits for a dial. A
 * link call is at most once like an RPC: a link that fails mid-call fails the call
 * (UNAVAILABLE, st->transport), and is closed. */

static void ctl_job_finish(struct ctl_job *j);

/* A dial for a new idle link of j->c. */
static void
ctl_dial_run(void *arg)
{
    struct ctl_job *j     = arg;
    struct fanout *f      = j->f;
    struct fanout_conn *c = j->c;
    char url[ADDRESS_MAX + 1];
    uint8_t secret[DLINK_SECRET_SIZE];
    struct dlink_out *out = NULL;
    dc_status st;

    pthread_mutex_lock(&f->mtx);
    snprintf(url, sizeof(url), "%s", c->ctl_url);
    memcpy(secret, c->ctl_secret, sizeof(secret));
    pthread_mutex_unlock(&f->mtx);
    if (dlink_dial_as(url, NULL, secret, "coordinator", DLINK_HELLO_CONTROL, CTL_DIAL_MS, &out,
                      &st) != DC_OK) {
        log_info("control link to %s (%s) not made, its calls go as RPCs: %s", c->address, url,
                 st.message);
        out = NULL;
    }
    pthread_mutex_lock(&f->mtx);
    c->n_dialing--;
    if (out == NULL && c->ctl_epoch == j->epoch) {
        c->ctl = CTL_NONE; /* until the worker registers again */
    } else if (out != NULL && !f->closing && c->ctl_epoch == j->epoch && c->ctl == CTL_READY &&
               c->n_idle < CTL_IDLE_MAX) {
        c->idle[c->n_idle++] = out;
        out                  = NULL;
        log_info("control link to %s (%s) made: %u idle", c->address, url, c->n_idle);
    }
    pthread_mutex_unlock(&f->mtx);
    dlink_out_close(out);
    ctl_job_finish(j);
}

/* Starts a dial job for c when it has room for one more link. mtx held. */
static void
ctl_dial_locked(struct fanout *f, struct fanout_conn *c)
{
    struct ctl_job *j;

    if (f->closing || c->ctl != CTL_READY || c->n_idle + c->n_dialing >= CTL_IDLE_MAX ||
        f->busy >= CTL_BUSY_MAX || (j = calloc(1, sizeof(*j))) == NULL) {
        return;
    }
    j->f     = f;
    j->c     = c;
    j->epoch = c->ctl_epoch;
    c->refs++;
    c->n_dialing++;
    f->busy++;
    if (!tpool_submit(f->pool, ctl_dial_run, j)) {
        c->refs--;
        c->n_dialing--;
        f->busy--;
        free(j);
    }
}

struct ctl_ask {
    struct fanout *f;
    struct fanout_conn *c; /* a reference held */
    uint64_t epoch;
};

/* GroupLink's answer: where the worker's data port is and its secret, and whether it takes
 * control links. nng thread. */
static void
ctl_ask_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct ctl_ask *a     = arg;
    struct fanout *f      = a->f;
    struct fanout_conn *c = a->c;
    const Devcoord__V1__GroupLinkResponse *r =
        code == DC_OK ? (const Devcoord__V1__GroupLinkResponse *)reply->body : NULL;

    (void)keep;
    pthread_mutex_lock(&f->mtx);
    if (c->ctl_epoch == a->epoch && c->ctl == CTL_ASKING) {
        if (r != NULL && (r->features & FANOUT_WORKER_FEATURE_CONTROL) != 0 &&
            r->secret.len == DLINK_SECRET_SIZE && strncmp(r->address, "tcp://", 6) == 0 &&
            strlen(r->address) < sizeof(c->ctl_url)) {
            snprintf(c->ctl_url, sizeof(c->ctl_url), "%s", r->address);
            memcpy(c->ctl_secret, r->secret.data, DLINK_SECRET_SIZE);
            c->ctl = CTL_READY;
            ctl_dial_locked(f, c);
        } else {
            log_info("no control links to %s, its calls go as RPCs: %s", c->address,
                     code != DC_OK ? st->message : "its GroupLink answer does not offer them");
            c->ctl = CTL_NONE;
        }
    }
    c->refs--;
    pthread_mutex_unlock(&f->mtx);
    free(a);
}

/* Asks c's worker for its data port (GroupLink), once per registration. mtx held. */
static void
ctl_ask_locked(struct fanout *f, struct fanout_conn *c)
{
    Devcoord__V1__GroupLinkRequest req = DEVCOORD__V1__GROUP_LINK_REQUEST__INIT;
    struct ctl_ask *a;
    dc_status st;

    if (strncmp(c->address, "tcp://", 6) != 0 || c->client == NULL || f->closing) {
        c->ctl = CTL_NONE; /* TLS: its calls stay RPCs */
        return;
    }
    if ((a = malloc(sizeof(*a))) == NULL) {
        return;
    }
    *a     = (struct ctl_ask){ f, c, c->ctl_epoch };
    c->ctl = CTL_ASKING;
    c->refs++;
    if (rpc_call_async(c->client, WORKER_SVC, M_WORKER_GROUP_LINK, &req.base, NULL, 0, CTL_ASK_MS,
                       ctl_ask_done, a, &st) != DC_OK) {
        c->ctl = CTL_NONE;
        c->refs--;
        free(a);
    }
}

/* Takes j off f->jobs. mtx held. */
static void
ctl_job_unlink_locked(struct fanout *f, struct ctl_job *j)
{
    if (j->prev != NULL) {
        j->prev->next = j->next;
    } else {
        f->jobs = j->next;
    }
    if (j->next != NULL) {
        j->next->prev = j->prev;
    }
    j->next = j->prev = NULL;
}

/* A call on a control link taken idle: its frame sent (by the caller, or here), its answer
 * read and handed to the events. */
static void
ctl_call_run(void *arg)
{
    struct ctl_job *j     = arg;
    struct fanout *f      = j->f;
    struct fanout_conn *c = j->c;
    struct rpc_reply r    = { 0 };
    nng_msg *answer       = NULL;
    bool keep             = false;
    dc_status st;
    dc_code code;

    status_clear(&st);
    if (j->send == CTL_SEND_BY_JOB) {
        struct dlink_hdr h = { .seq = j->request_id };
        code = dlink_call_send(j->out, &h, nng_msg_body(j->req), nng_msg_len(j->req), j->timeout_ms,
                               &st);
        nng_msg_free(j->req);
        j->req = NULL;
    } else {
        code = DC_OK;
    }
    if (code == DC_OK) {
        code = dlink_call_recv_any(j->out, j->request_id,
                                   f->opts.max_message_bytes + RPC_FRAME_OVERHEAD, j->timeout_ms,
                                   &answer, &st);
    }
    if (code == DC_OK) {
        code = rpc_reply_decode(j->method, false, j->request_id, c->address, answer, &r, &st);
    }
    pthread_mutex_lock(&f->mtx);
    ctl_job_unlink_locked(f, j); /* first: fanout_close_all aborts only the links listed */
    if (!st.transport && !f->closing && c->ctl_epoch == j->epoch && c->client != NULL &&
        c->n_idle < CTL_IDLE_MAX) {
        c->idle[c->n_idle++] = j->out;
        j->out               = NULL;
    }
    pthread_mutex_unlock(&f->mtx);
    dlink_out_close(j->out);
    j->done(j->arg, code, &st, &r, &keep);
    if (!keep) {
        rpc_reply_free(&r);
    }
    ctl_job_finish(j);
}

/* A job no longer holds its connection nor counts as busy. mtx held. */
static void
ctl_job_end_locked(struct fanout *f, struct ctl_job *j)
{
    j->c->refs--;
    if (--f->busy == 0) {
        pthread_cond_broadcast(&f->idle_cv);
    }
}

static void
ctl_job_finish(struct ctl_job *j)
{
    struct fanout *f = j->f;

    pthread_mutex_lock(&f->mtx);
    ctl_job_end_locked(f, j);
    pthread_mutex_unlock(&f->mtx);
    free(j);
}

/* Starts `method` on an idle control link of c: true when it went (done runs once, from the
 * pool), false when it goes as an RPC instead (no link at hand, a frame that could not be
 * sent whole, out of memory). */
static bool
ctl_call(struct fanout *f, struct fanout_conn *c, unsigned method, const ProtobufCMessage *req,
         uint32_t timeout_ms, rpc_done_fn done, void *arg)
{
    struct ctl_job *j = calloc(1, sizeof(*j));
    struct dlink_hdr h;
    bool by_caller;
    dc_status st;
    dc_code code;

    if (j == NULL) {
        return false;
    }
    j->request_id = atomic_fetch_add(&f->next_id, 1) + 1;
    if (rpc_request_pack(WORKER_SVC, method, req, NULL, 0, f->opts.token, j->request_id, timeout_ms,
                         f->opts.max_message_bytes, &j->req, &st) != DC_OK) {
        free(j);
        return false; /* the RPC path refuses it the same way */
    }
    by_caller = nng_msg_len(j->req) <= CTL_CALLER_SEND_MAX;
    pthread_mutex_lock(&f->mtx);
    if (c->ctl == CTL_UNKNOWN) {
        ctl_ask_locked(f, c);
    }
    if (c->ctl != CTL_READY || c->n_idle == 0 || f->busy >= CTL_BUSY_MAX || f->closing ||
        c->client == NULL) {
        if (c->ctl == CTL_READY) {
            ctl_dial_locked(f, c); /* for the calls after this one */
        }
        pthread_mutex_unlock(&f->mtx);
        nng_msg_free(j->req);
        free(j);
        return false;
    }
    j->f          = f;
    j->c          = c;
    j->epoch      = c->ctl_epoch;
    j->out        = c->idle[--c->n_idle];
    j->method     = &WORKER_SVC->methods[method];
    j->timeout_ms = timeout_ms;
    j->done       = done;
    j->arg        = arg;
    j->send       = by_caller ? CTL_SENT : CTL_SEND_BY_JOB;
    j->next       = f->jobs;
    if (f->jobs != NULL) {
        f->jobs->prev = j;
    }
    f->jobs = j;
    c->refs++;
    f->busy++;
    if (!by_caller) {
        if (!tpool_submit(f->pool, ctl_call_run, j)) {
            ctl_job_unlink_locked(f, j);
            c->idle[c->n_idle++] = j->out;
            ctl_job_end_locked(f, j);
            pthread_mutex_unlock(&f->mtx);
            nng_msg_free(j->req);
            free(j);
            return false;
        }
        pthread_mutex_unlock(&f->mtx);
        atomic_fetch_add(&f->link_calls, 1);
        return true;
    }
    pthread_mutex_unlock(&f->mtx);
    h    = (struct dlink_hdr){ .seq = j->request_id };
    code = dlink_call_send(j->out, &h, nng_msg_body(j->req), nng_msg_len(j->req), timeout_ms, &st);
    nng_msg_free(j->req);
    j->req = NULL;
    if (code != DC_OK) {
        /* Not sent whole, so not taken (the worker drops a frame cut short unread): the call
         * goes as an RPC, and the link is closed by a thread of ours (this may be nng's). */
        log_info("control link to %s failed (%s): the call goes as an RPC", c->address, st.message);
        pthread_mutex_lock(&f->mtx);
        ctl_job_unlink_locked(f, j);
        ctl_doom_locked(f, j->out);
        ctl_job_end_locked(f, j);
        pthread_mutex_unlock(&f->mtx);
        free(j);
        return false;
    }
    /* Sent: from here the call is on the link, and its answer needs a reader. */
    atomic_fetch_add(&f->link_calls, 1);
    if (!tpool_submit(f->pool, ctl_call_run, j)) {
        /* None can be started (out of memory or threads): the call fails as a lost link, from
         * the next ctl_orphans_end (the caller may hold the locks done takes). */
        pthread_mutex_lock(&f->mtx);
        j->orphan_next = f->orphans;
        f->orphans     = j;
        pthread_cond_broadcast(&f->idle_cv); /* fanout_close_all may be waiting for it */
        pthread_mutex_unlock(&f->mtx);
    }
    return true;
}

/* Ends the calls ctl_call sent but could not start a reader for: each fails as a lost
 * control link (its answer unread, the link closed). No lock held: done takes the events'. */
static void
ctl_orphans_end(struct fanout *f)
{
    struct ctl_job *list;

    pthread_mutex_lock(&f->mtx);
    list       = f->orphans;
    f->orphans = NULL;
    for (struct ctl_job *j = list; j != NULL; j = j->orphan_next) {
        ctl_job_unlink_locked(f, j);
        ctl_doom_locked(f, j->out);
        j->out = NULL;
    }
    pthread_mutex_unlock(&f->mtx);
    while (list != NULL) {
        struct ctl_job *j  = list;
        struct rpc_reply r = { 0 };
        bool keep          = false;
        dc_status st;

        list = j->orphan_next;
        status_set(&st, DC_UNAVAILABLE, "control link to %s: no thread to read the answer",
                   j->c->address);
        st.transport = true;
        j->done(j->arg, DC_UNAVAILABLE, &st, &r, &keep);
        if (!keep) {
            rpc_reply_free(&r);
        }
        ctl_job_finish(j);
    }
}

void
fanout_conn_epoch(struct fanout *f, struct fanout_conn *c, uint64_t epoch)
{
    pthread_mutex_lock(&f->mtx);
    if (c->ctl_epoch != epoch) {
        /* Another registration: another process, perhaps, with another data port. */
        c->ctl_epoch = epoch;
        c->ctl       = CTL_UNKNOWN;
        ctl_doom_idle_locked(f, c);
    }
    pthread_mutex_unlock(&f->mtx);
}

void
fanout_counts(struct fanout *f, uint64_t *link_calls, uint64_t *rpc_calls)
{
    *link_calls = atomic_load(&f->link_calls);
    *rpc_calls  = atomic_load(&f->rpc_calls);
}

dc_code
fanout_call(struct fanout *f, struct fanout_conn *c, unsigned method, const ProtobufCMessage *req,
            uint32_t timeout_ms, rpc_done_fn done, void *arg, dc_status *st)
{
    dc_code rv;

    pthread_mutex_lock(&f->mtx);
    if (c->client == NULL) {
        rv = status_set(st, DC_UNAVAILABLE, "connection to %s closed", c->address);
    } else {
        rv = rpc_call_async(c->client, WORKER_SVC, method, req, NULL, 0, timeout_ms, done, arg, st);
    }
    pthread_mutex_unlock(&f->mtx);
    return rv;
}

/* Starts `method` on c with done(call) as its completion. The lock is held across the start
 * so fanout_close_all cannot close the client under it; completions run on nng threads, never
 * inside rpc_call_async. */
static dc_code
fanout_send(struct fanout *f, struct fanout_conn *c, unsigned method, const ProtobufCMessage *req,
            uint32_t timeout_ms, rpc_done_fn done, void *tag, dc_status *st)
{
    struct fanout_call *call = malloc(sizeof(*call));
    dc_code rv;

    if (call == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    call->f   = f;
    call->tag = tag;
    if (f->pool != NULL && (method == M_WORKER_EXECUTE || method == M_WORKER_COMMIT) &&
        ctl_call(f, c, method, req, timeout_ms, done, call)) {
        return DC_OK;
    }
    if ((rv = fanout_call(f, c, method, req, timeout_ms, done, call, st)) != DC_OK) {
        free(call);
    } else if (method == M_WORKER_EXECUTE || method == M_WORKER_COMMIT) {
        atomic_fetch_add(&f->rpc_calls, 1);
    }
    return rv;
}

dc_code
fanout_execute(struct fanout *f, struct fanout_conn *c, const Devcoord__V1__ExecuteRequest *req,
               uint32_t timeout_ms, void *tag, dc_status *st)
{
    return fanout_send(f, c, M_WORKER_EXECUTE, &req->base, timeout_ms, execute_done, tag, st);
}

dc_code
fanout_commit(struct fanout *f, struct fanout_conn *c, const Devcoord__V1__CommitRequest *req,
              void *tag, dc_status *st)
{
    return fanout_send(f, c, M_WORKER_COMMIT, &req->base, FANOUT_COMMIT_TIMEOUT_MS, commit_done,
                       tag, st);
}

dc_code
fanout_abort(struct fanout *f, struct fanout_conn *c, const Devcoord__V1__AbortRequest *req,
             void *tag, dc_status *st)
{
    return fanout_send(f, c, M_WORKER_ABORT, &req->base, ABORT_TIMEOUT_MS, abort_done, tag, st);
}

void
fanout_close_stale(struct fanout *f)
{
    struct fanout_conn *unheld = NULL;
    struct dlink_out **doomed;
    size_t n_doomed;

    ctl_orphans_end(f);
    pthread_mutex_lock(&f->mtx);
    for (struct fanout_conn **pp = &f->conns; *pp != NULL;) {
        struct fanout_conn *c = *pp;
        if (c->refs == 0) {
            *pp     = c->next;
            c->next = unheld;
            unheld  = c;
        } else {
            pp = &c->next;
        }
    }
    doomed        = f->doomed;
    n_doomed      = f->n_doomed;
    f->doomed     = NULL;
    f->n_doomed   = 0;
    f->cap_doomed = 0;
    pthread_mutex_unlock(&f->mtx);
    for (size_t i = 0; i < n_doomed; i++) {
        dlink_out_close(doomed[i]);
    }
    free(doomed);
    while (unheld != NULL) {
        struct fanout_conn *c = unheld;
        unheld                = c->next;
        rpc_client_close(c->client);
        ctl_drop_idle(c);
        free(c);
    }
}

void
fanout_close_all(struct fanout *f)
{
    /* Control link calls fail now (their links closed under them); dials end within
     * CTL_DIAL_MS. Their events run before this goes on. */
    pthread_mutex_lock(&f->mtx);
    f->closing = true;
    for (struct ctl_job *j = f->jobs; j != NULL; j = j->next) {
        dlink_out_abort(j->out);
    }
    while (f->busy > 0) {
        if (f->orphans != NULL) {
            pthread_mutex_unlock(&f->mtx);
            ctl_orphans_end(f); /* their busy counts go with them */
            pthread_mutex_lock(&f->mtx);
            continue;
        }
        pthread_cond_wait(&f->idle_cv, &f->mtx);
    }
    for (struct fanout_conn *c = f->conns; c != NULL; c = c->next) {
        ctl_doom_idle_locked(f, c);
    }
    pthread_mutex_unlock(&f->mtx);
    fanout_close_stale(f); /* closes the links doomed, and connections nobody holds */
    for (;;) {
        struct rpc_client *client = NULL;

        pthread_mutex_lock(&f->mtx);
        for (struct fanout_conn *c = f->conns; client == NULL && c != NULL; c = c->next) {
            client    = c->client;
            c->client = NULL;
        }
        pthread_mutex_unlock(&f->mtx);
        if (client == NULL) {
            return;
        }
        rpc_client_close(client);
    }
}
