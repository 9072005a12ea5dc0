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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "address.h"
#include "auth.h"
#include "devcoord/v1/methods.h"
#include "rpc.h"
#include "strmap.h"

#define WORKER_SVC (&devcoord__v1__worker__descriptor)

/* How long an Abort may take. Aborts are best effort: a worker that never hears of one still
 * gives up at the deadline its Execute carried. */
#define ABORT_TIMEOUT_MS 2000
/* Cap of the redial backoff towards a worker: a restarted worker is dialled again within it. */
#define RECONNECT_MAX_MS 500

struct fanout_conn {
    char address[ADDRESS_MAX + 1];
    struct rpc_client *client; /* NULL once closed by fanout_close_all */
    unsigned refs;             /* the table's (while current) and each holder's */
    struct fanout_conn *next;  /* every connection not yet closed and freed */
};

struct fanout {
    struct fanout_opts opts;
    pthread_mutex_t mtx;
    struct strmap current;     /* worker name -> its connection at its current address */
    struct fanout_conn *conns; /* all of them: current, replaced but held, unheld */
};

/* One call in flight. */
struct fanout_call {
    struct fanout *f;
    void *tag;
};

struct fanout *
fanout_new(const struct fanout_opts *opts)
{
    struct fanout *f = calloc(1, sizeof(*f));

    if (f == NULL) {
        return NULL;
    }
    f->opts = *opts;
    pthread_mutex_init(&f->mtx, NULL);
    strmap_init(&f->current);
    return f;
}

void
fanout_free(struct fanout *f)
{
    if (f == NULL) {
        return;
    }
    while (f->conns != NULL) {
        struct fanout_conn *c = f->conns;
        f->conns              = c->next;
        rpc_client_close(c->client);
        free(c);
    }
    strmap_fini(&f->current);
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
    if ((rv = fanout_call(f, c, method, req, timeout_ms, done, call, st)) != DC_OK) {
        free(call);
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
    pthread_mutex_unlock(&f->mtx);
    while (unheld != NULL) {
        struct fanout_conn *c = unheld;
        unheld                = c->next;
        rpc_client_close(c->client);
        free(c);
    }
}

void
fanout_close_all(struct fanout *f)
{
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
