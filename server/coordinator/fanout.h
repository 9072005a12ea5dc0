/*
 * Fan-out from the coordinator to its workers: a cache of connections to workers' data
 * addresses, shared by the ops that use them, and the Execute, Commit and Abort calls sent on
 * them.
 * Answers come back through struct fanout_events with the caller's tag; nothing here knows
 * what an op is. Thread-safe: one lock of its own, never held while the events run, so the
 * events may take the caller's lock (taken before this one, never after). A caller holds a
 * connection from fanout_conn_get until fanout_conn_put; the cache holds its own.
 */
#ifndef DEVCOORD_COORDINATOR_FANOUT_H
#define DEVCOORD_COORDINATOR_FANOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "rpc.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "status.h"

/* How long a worker has to answer Commit. Commit only swaps names, so this is short; the
 * workers hold their staging longer than the coordinator waits (ExecuteRequest.hold_ms). */
#define FANOUT_COMMIT_TIMEOUT_MS 3000
/* Bytes of an op id a worker may name in its answer. */
#define FANOUT_OP_ID_MAX 64

struct fanout;
struct fanout_conn;

/* What a worker's OK to Execute says besides OK. */
struct fanout_prepared {
    uint64_t elapsed_us;    /* the worker's own timing */
    bool already_committed; /* it committed an op with the request's idempotency key before, */
    char committed_op_id[FANOUT_OP_ID_MAX + 1]; /* this one, and ran nothing now */
};

struct fanout_events {
    /* A worker answered Execute, or no answer came: code and st say which (p: what an OK
     * said; zeroed otherwise). Runs once per call fanout_execute started, on an nng thread:
     * it may take the caller's lock, must not block otherwise. */
    void (*executed)(void *arg, void *tag, dc_code code, const dc_status *st,
                     const struct fanout_prepared *p);
    /* A worker answered Commit, or no answer came (st->transport). Same thread rules. */
    void (*committed)(void *arg, void *tag, dc_code code, const dc_status *st);
    /* An Abort call fanout_abort started has ended, however it went. Same thread rules. */
    void (*aborted)(void *arg, void *tag);
    void *arg;
};

struct fanout_opts {
    const char *token; /* what workers are called with (NULL without auth); must outlive it */
    const struct config_tls *tls; /* for tls+tcp:// workers; must outlive it */
    size_t max_message_bytes;
    struct fanout_events events;
    /* Execute and Commit over control links where workers offer them (fanout.c says how):
     * the op table's fanout, not the groups'. */
    bool control_links;
};

/* GroupLink's features bit for control links (the worker's WGROUPS_FEATURE_CONTROL). */
#define FANOUT_WORKER_FEATURE_CONTROL 4u

/* NULL when out of memory. */
struct fanout *fanout_new(const struct fanout_opts *opts);
/* Closes and frees every connection. Every reference must have been put back. */
void fanout_free(struct fanout *f);

/* The connection to worker `worker` at `address`, opened on first use, with a reference for
 * the caller. A worker that comes back at the same address keeps its connection; one that
 * moved gets a new one, and the old one is closed once nobody holds it. */
dc_code fanout_conn_get(struct fanout *f, const char *worker, const char *address,
                        struct fanout_conn **out, dc_status *st);
/* Drops a reference (NULL: nothing). May be called from an events callback. */
void fanout_conn_put(struct fanout *f, struct fanout_conn *c);
/* Forgets the connection kept for `worker` (gone: dead or deregistered): the next
 * fanout_close_stale closes it once no caller holds it, and the next fanout_conn_get for
 * that name opens a new one. Nothing when none is kept. */
void fanout_forget(struct fanout *f, const char *worker);
/* Connections open (kept or held, not yet closed by fanout_close_stale). */
size_t fanout_conn_count(struct fanout *f);
/* The worker's registration (its epoch) the next calls on c are for: a new one forgets what
 * was learned of its data port and the control links made to it. */
void fanout_conn_epoch(struct fanout *f, struct fanout_conn *c, uint64_t epoch);
/* Execute and Commit calls started on control links and as RPCs, since start. */
void fanout_counts(struct fanout *f, uint64_t *link_calls, uint64_t *rpc_calls);

/* Sends req on c (on a control link when one is at hand). On DC_OK events.executed runs once
 * with tag, on an nng thread or a control link's; otherwise it never runs and st says why the
 * call could not start. */
dc_code fanout_execute(struct fanout *f, struct fanout_conn *c,
                       const Devcoord__V1__ExecuteRequest *req, uint32_t timeout_ms, void *tag,
                       dc_status *st);
/* Sends req on c, with FANOUT_COMMIT_TIMEOUT_MS; the same contract, with events.committed. */
dc_code fanout_commit(struct fanout *f, struct fanout_conn *c,
                      const Devcoord__V1__CommitRequest *req, void *tag, dc_status *st);
/* Sends req on c; the same contract, with events.aborted. */
dc_code fanout_abort(struct fanout *f, struct fanout_conn *c, const Devcoord__V1__AbortRequest *req,
                     void *tag, dc_status *st);

/* Sends method `method` of the Worker service with req on c; done(arg, ...) runs once on an
 * nng thread (the rpc_done_fn rules) when DC_OK is returned, never otherwise. For calls the
 * events above do not cover (GroupSetup). */
dc_code fanout_call(struct fanout *f, struct fanout_conn *c, unsigned method,
                    const ProtobufCMessage *req, uint32_t timeout_ms, rpc_done_fn done, void *arg,
                    dc_status *st);

/* Closes the connections nobody holds any more. Closing waits for their callbacks: call it
 * from a thread that holds no lock the events take, never from a callback. */
void fanout_close_stale(struct fanout *f);
/* Shutdown: closes every connection, held or not, so calls still out end now (CANCELLED) and
 * their events run before this returns. Held connections stay valid until put back; calls on
 * them fail. The same thread rules as fanout_close_stale. */
void fanout_close_all(struct fanout *f);

#endif
