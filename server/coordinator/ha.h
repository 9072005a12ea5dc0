/*
 * Coordinators in high availability on etcd (state.backend etcd, issue 16).
 *
 * Every coordinator runs one election thread. It grants itself an etcd lease of
 * state.lease_ttl_ms (rounded up to whole seconds, as etcd counts), renews it every tick
 * (a sixth of the TTL) and campaigns with a txn on PREFIX/leader: "if the key does not exist,
 * put it with my lease", the value being "<advertised address> <term>". The winner's term is
 * the key's create revision, which only grows. Losers read the key and know the leader.
 *
 * A leader serves only while its last renewal that succeeded STARTED less than
 * lease_ttl_ms - margin ago (margin: a third of the TTL), measured on the monotonic clock at
 * each call (ha_admit), not by the thread: a process paused by SIGSTOP finds, the moment it
 * runs again, that it must not answer, and etcd cannot have let its lease expire before
 * that, since a renewal extends the lease from when etcd took it, after it was sent. The
 * thread then sees the lease gone (keepalive TTL 0) or the key another's, steps down
 * (on_step_down: in-flight work fails with UNAVAILABLE, the registry is emptied) and follows.
 * A leader cut off from etcd for a while without losing its lease (etcd restarted) pauses
 * (calls refused) and resumes with the same term once a renewal succeeds.
 *
 * Operator intent lives under PREFIX/intent, in state.c's text format, read when a
 * coordinator becomes leader (before it serves) and written through on every change with
 * a txn guarded by the leader key's create revision: a deposed leader cannot write.
 */
#ifndef DEVCOORD_COORDINATOR_HA_H
#define DEVCOORD_COORDINATOR_HA_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "registry.h"
#include "status.h"

/* Followers' refusals name the leader after this (rpc_leader.c parses it). */
#define HA_LEADER_HINT "leader: "

struct ha;

struct ha_callbacks {
    /* Election thread, once this coordinator has won term, before it serves: load what
     * the leader needs (intent). Not DC_OK: it does not serve and tries again next tick. */
    dc_code (*on_lead)(void *arg, uint64_t term, dc_status *st);
    /* Election thread, when it stops leading term: fail in-flight work, forget workers. */
    void (*on_step_down)(void *arg, uint64_t term);
    void *arg;
};

struct ha_opts {
    const struct config_state *state;
    const char *advertise; /* the address clients and workers reach this coordinator at */
    struct ha_callbacks cb;
};

/* Opens etcd (nothing is sent yet). */
dc_code ha_new(const struct ha_opts *opts, struct ha **out, dc_status *st);
/* Starts the election thread (the first campaign runs at once). */
dc_code ha_run(struct ha *h, dc_status *st);

/* Stops the thread; a leader revokes its lease so another takes over at once. Bounded by
 * two etcd request timeouts. ha_admit refuses from then on; h stays valid for the RPC
 * threads until ha_free (after the RPC server is freed). */
void ha_stop(struct ha *h);
void ha_free(struct ha *h);

/* DC_OK while this coordinator leads and its lease is fresh; else DC_UNAVAILABLE with
 * "not the leader; leader: ADDR (term N)" or why none is known. Any thread, never blocks. */
dc_code ha_admit(struct ha *h, dc_status *st);

/* The term this coordinator leads in, 0 when it does not (or its lease is stale). */
uint64_t ha_term(struct ha *h);

/* "leader (term N)", "follower of ADDR (term N)", "candidate (etcd: reason)". */
void ha_describe(struct ha *h, char *buf, size_t cap);

/* registry_store's save for etcd: PREFIX/intent, guarded by the term. UNAVAILABLE when this
 * coordinator does not lead (any more). */
dc_code ha_save_intent(struct ha *h, const struct registry_intent_entry *entries, size_t n,
                       dc_status *st);

/* Restores PREFIX/intent into r (nothing when there is none). Intent that does not parse
 * (DC_DATA_LOSS) is kept under PREFIX/intent.unreadable first, as the next change would
 * replace it; st says where it went. */
dc_code ha_load_intent(struct ha *h, struct registry *r, size_t *restored, dc_status *st);

#endif
