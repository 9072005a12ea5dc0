/*
 * The collective engine of a worker: runs the part of an operation the coordinator sent it
 * (Execute) among its peers, on a thread of its own per op.
 *
 * Each op first reduces or gathers across the worker's own devices, then moves data
 * worker-to-worker: a ring reduce-scatter then all-gather for all-reduce, reduce-scatter
 * then a gather to the root's worker for reduce, root-to-all for broadcast, all-to-all
 * blocks for all-gather; barrier needs no data. The tensor descriptions go in Exchange
 * calls; the data goes over the data link the groups own (groups.h: wgroups_op_send, the op
 * sink), or in Exchange calls to a peer this worker has no data link to. Chunks are applied
 * to the op's buffer as they arrive (by the Exchange handler, or by the data link's reader
 * thread, which waits for an op still preparing); Exchange chunks for an op not started yet
 * wait, bounded in time and bytes.
 *
 * An op writes no stored tensor: Execute computes into staging tensors and answers OK once
 * they hold the result (the op is prepared); Commit publishes them, Abort discards them
 * (staging.h). An Execute carrying an idempotency key this worker committed before runs
 * nothing and answers already_committed with that op's id.
 */
#ifndef DEVCOORD_WORKER_COLLECTIVE_H
#define DEVCOORD_WORKER_COLLECTIVE_H

#include <stdint.h>

#include "config.h"
#include "devcoord/v1/devcoord.pb-c.h"
#include "executor.h"
#include "membership.h"

struct wgroups;

struct collectives;

struct collectives_stats {
    uint64_t ops_done, ops_failed;
    uint64_t bytes_sent, bytes_received;
    uint64_t link_bytes_sent, link_bytes_received; /* of those, over the data link */
    uint64_t link_bytes_placed;    /* of those received, read straight into the op's buffer */
    uint64_t link_bytes_forwarded; /* of those sent, ring chunks passed on by the handler that
                                    * received them (cop_forward_now), not the op's thread */
    uint64_t ops_direct;           /* all-reduces run as one direct exchange, not round the ring */
    uint64_t ops_early;            /* of those, ops whose tensors went with the descriptions */
    uint64_t ops_ring_in_place;    /* ring all-reduces that read the only local rank in place */
};

/* token (may be NULL) is what this worker shows its peers; it must outlive co. wg (may be
 * NULL: Exchange calls only) owns the data link the ops' data goes over; it must outlive co
 * (collectives_free before wgroups_shutdown). */
struct collectives *collectives_new(const struct config_worker *cfg, const char *token,
                                    struct executor *ex, struct membership *m, struct wgroups *wg);
/* Aborts what is running, answers every waiting call and frees everything. */
void collectives_free(struct collectives *co);

/* Whether the calling thread may run an op itself, waiting on its peers (a control link's
 * thread, which would only wait for the answer otherwise), instead of handing it to a pool
 * thread: one wake-up less before the op's data moves. Per thread; off by default (nng's
 * threads must never wait). */
void collectives_run_here(bool may_wait);

void collectives_execute(struct collectives *co, const Devcoord__V1__ExecuteRequest *in,
                         Devcoord__V1__ExecuteResponse_Closure closure, void *cd);
void collectives_abort(struct collectives *co, const Devcoord__V1__AbortRequest *in,
                       Devcoord__V1__AbortResponse_Closure closure, void *cd);
void collectives_commit(struct collectives *co, const Devcoord__V1__CommitRequest *in,
                        Devcoord__V1__CommitResponse_Closure closure, void *cd);
void collectives_exchange(struct collectives *co, const Devcoord__V1__ExchangeRequest *in,
                          Devcoord__V1__ExchangeResponse_Closure closure, void *cd);

void collectives_stats(struct collectives *co, struct collectives_stats *out);

#endif
