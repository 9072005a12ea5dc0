/*
 * A worker's side of groups (design §13). GroupSetup (from the coordinator, at each completed
 * join) installs a generation of a group: its ranks in order, its workers with their data
 * addresses, which ranks are this worker's. GroupCall (from a rank's client) parks until the
 * k-th calls of all this worker's ranks are in; the worker then sends what they passed and
 * their data, reduced (or gathered) across its own ranks, to every other worker of the group
 * (GroupExchange), and once it has every worker's part it checks that all ranks agree,
 * computes the result in a fixed order (so every worker gets the same bytes) and answers its
 * ranks. What the ranks passed goes in GroupExchange (RPC) to every other worker, with the
 * part's bytes when they are few (GROUPS_LINK_MIN_BYTES); larger parts go over the data link
 * (datalink.h: raw framed streams, one connection per peer, kept), straight from the part's
 * memory onto the wire and from the wire into the buffer the receiver keeps for it: to every
 * other worker directly, or, for an all-reduce part of GROUPS_RING_MIN_BYTES or more, round
 * the ring of workers (reduce-scatter, then all-gather).
 *
 * Bounds: calls in progress per group (GROUPS_MAX_CALLS), groups per worker (GROUPS_MAX),
 * bytes per call (one message: limits.max_message_bytes). A call's deadline fails its waiting
 * ranks naming the missing ones; a peer whose connection drops ends the generation (every
 * pending and later call fails UNAVAILABLE naming it) until the next GroupSetup.
 *
 * Memory: a call's buffers (this worker's part, the ring's receive buffer, peers' parts, the
 * result) come from one cache per worker (bufcache.h, groups.buffer_cache_bytes) and go back
 * to it when the call completes, so calls of a steady size allocate nothing large and RSS
 * stays flat; what is left idle for GROUPS_BUFFER_IDLE_MS is unmapped.
 */
#ifndef DEVCOORD_WORKER_GROUPS_H
#define DEVCOORD_WORKER_GROUPS_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "datalink.h"
#include "devcoord/v1/devcoord.pb-c.h"

#define GROUPS_MAX       1024
#define GROUPS_MAX_CALLS 64
#define GROUPS_MAX_RANKS 4096
/* A part smaller than this rides in the GroupExchange message itself: one message costs
 * less than a message and a frame on the data link. */
#define GROUPS_LINK_MIN_BYTES (64u * 1024)
/* An all-reduce part at least this large goes round the ring of the group's workers on the
 * data link (reduce-scatter, then all-gather); smaller ones go to every worker directly. */
#define GROUPS_RING_MIN_BYTES (256u * 1024)
/* Buffers kept for group calls (bufcache.h) and unused this long are unmapped. */
#define GROUPS_BUFFER_IDLE_MS 5000
/* A call's deadline when the rank gives none. */
#define GROUPS_DEFAULT_TIMEOUT_MS 30000
/* Shared memory regions a rank may have its worker map (bytes: groups.shm_max_bytes). */
#define GROUPS_SHM_MAX_REGIONS 16
#define GROUPS_SHM_NAME_PREFIX "/devcoord-"
#define GROUPS_SHM_NAME_HEX    32

struct wgroups;
struct mbuf;

/* token (may be NULL) is what this worker shows its peers; it must outlive wg. */
struct wgroups *wgroups_new(const struct config_worker *cfg, const char *token);
/* Fails every waiting call and refuses new ones (UNAVAILABLE), closes the connections to
 * peers. Handlers may still run (and are refused) until wgroups_free. */
void wgroups_shutdown(struct wgroups *wg);
/* The worker begins to stop: groups that end from now on are not announced to their peers
 * (GroupEnd), which see this worker go anyway. NULL: nothing. */
void wgroups_leaving(struct wgroups *wg);
/* wgroups_shutdown if not done, then frees everything: no handler may run any more. */
void wgroups_free(struct wgroups *wg);

void wgroups_setup(struct wgroups *wg, const Devcoord__V1__GroupSetupRequest *in,
                   Devcoord__V1__GroupSetupResponse_Closure closure, void *cd);
void wgroups_call(struct wgroups *wg, const Devcoord__V1__GroupCallRequest *in,
                  Devcoord__V1__GroupCallResponse_Closure closure, void *cd);
void wgroups_exchange(struct wgroups *wg, const Devcoord__V1__GroupExchangeRequest *in,
                      Devcoord__V1__GroupExchangeResponse_Closure closure, void *cd);
/* Where this worker's data link listens and its secret (GroupLink, for peers). */
void wgroups_link(struct wgroups *wg, const Devcoord__V1__GroupLinkRequest *in,
                  Devcoord__V1__GroupLinkResponse_Closure closure, void *cd);
/* Where this worker's data port listens and the secret of a call link (GroupCallLink, for its
 * ranks): a rank that dials it makes its calls there, in frames (dlframe.h), not in RPCs. */
void wgroups_call_link(struct wgroups *wg, const Devcoord__V1__GroupLinkRequest *in,
                       Devcoord__V1__GroupLinkResponse_Closure closure, void *cd);
/* A peer ended a generation of a group it shares with this worker (GroupEnd): so does this
 * worker, with the peer's reason. */
void wgroups_end(struct wgroups *wg, const Devcoord__V1__GroupEndRequest *in,
                 Devcoord__V1__GroupEndResponse_Closure closure, void *cd);
/* Calls completed in the group and this worker's stalled ranks (groups list | show). */
void wgroups_status(struct wgroups *wg, const Devcoord__V1__GroupStatusRequest *in,
                    Devcoord__V1__GroupStatusResponse_Closure closure, void *cd);

/* Maps (or unmaps) a rank's shared memory region (dc_group_alloc). The name must be
 * "/devcoord-" and 32 lowercase hex digits, the object exactly `bytes` long, the rank's regions
 * at most GROUPS_SHM_MAX_REGIONS and groups.shm_max_bytes in all. Regions go when the rank
 * unmaps them or the generation ends (replaced, a peer lost, the worker stopping). */
void wgroups_map(struct wgroups *wg, const Devcoord__V1__GroupMapRequest *in,
                 Devcoord__V1__GroupMapResponse_Closure closure, void *cd);
/* Pure: whether name is a region name the library makes. */
bool wgroups_shm_name_ok(const char *name);
/* Pure: whether [off, off + len) lies inside a region of size bytes. */
bool wgroups_shm_range_ok(uint64_t off, uint64_t len, uint64_t size);

/* ---- The data link for SubmitOp's bytes (collective.c) ----------------------------------
 * Ops share the data port, the per-peer connections and their sender threads with groups:
 * their frames carry DLINK_FLAG_OP (datalink.h) and go to the op sink. */

/* Makes sure this worker has a data link to the peer whose RPC address is `address`
 * (GroupLink, then a dial; blocking, within a few seconds). DC_OK: wgroups_op_send may queue
 * to it. A failure (an older peer without GroupLink, a dial that fails) is remembered for a
 * few seconds, in which the call fails at once: the op sends over RPC meanwhile. */
dc_code wgroups_peer_link(struct wgroups *wg, const char *address, dc_status *st);
/* Whether a data link to that peer is up now, and what else its data port takes (*features,
 * its GroupLink answer's: WGROUPS_FEATURE_*); never dials nor waits for a dial (a peer that
 * hangs must not hold up the caller). */
#define WGROUPS_FEATURE_OP_META  1u /* DLINK_FLAG_OP_META frames */
#define WGROUPS_FEATURE_OP_EARLY 2u /* those frames carrying the sender's tensors too */
#define WGROUPS_FEATURE_CONTROL  4u /* control links: the coordinator's calls (dlframe.h) */
bool wgroups_peer_linked(struct wgroups *wg, const char *address, uint32_t *features);

/* Told when an op's chunk was written to the peer's connection (bytes: its length) or could
 * not be (bytes 0); runs on the peer's sender thread or in wgroups_op_cancel, no lock held. */
typedef void (*wgroups_sent_fn)(void *arg, size_t bytes, dc_code code, const dc_status *st);

/* Queues len bytes at data (at most DLINK_CHUNK; they stay the caller's until done runs) as
 * one frame with header h (flags get DLINK_FLAG_OP) to the peer at `address`, behind what is
 * queued to it already. owner names the op for wgroups_op_cancel. done runs exactly once
 * when DC_OK is returned, never otherwise. may_write: a small frame to an idle peer may be
 * written by the calling thread itself (for an op's own thread; never a data link reader's,
 * which must not stop reading to wait on a peer). */
dc_code wgroups_op_send(struct wgroups *wg, const char *address, const struct dlink_hdr *h,
                        const uint8_t *data, size_t len, const void *owner, wgroups_sent_fn done,
                        void *arg, bool may_write, dc_status *st);

/* Takes owner's queued chunks off every queue (their done says ABORTED) and, with
 * abort_current, makes a chunk of owner's being written fail at once by closing that
 * connection (the next chunk to that peer dials again). */
void wgroups_op_cancel(struct wgroups *wg, const void *owner, bool abort_current);

/* Where DLINK_FLAG_OP frames go: datalink.h's op_frame, called on a reader thread without
 * the groups lock. NULL removes it and returns once no call into the old one runs. */
struct wgroups_op_sink {
    void *arg;
    bool (*frame)(void *arg, const char *peer, const struct dlink_hdr *h, const uint8_t *payload,
                  dc_status *why);
    /* datalink.h's op_place and op_landed (both or neither may be NULL). */
    uint8_t *(*place)(void *arg, const char *peer, const struct dlink_hdr *h, void **pin,
                      uint32_t *wait_ms);
    bool (*landed)(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok,
                   dc_status *why);
};
void wgroups_set_op_sink(struct wgroups *wg, const struct wgroups_op_sink *sink);

/* Where a control link's calls go (datalink.h's control, on the connection's thread without
 * the groups lock): frame is a Worker RPC's request frame, to be answered with
 * dlink_call_answer on conn. Set once, before the RPC server starts, so every GroupLink
 * answer offers WGROUPS_FEATURE_CONTROL; it stays until wgroups_shutdown closes the data
 * port (the worker stops its RPC server only after that). Until set, calls are refused. */
struct wgroups_control {
    void *arg;
    void (*call)(void *arg, struct dlink_conn *conn, const uint8_t *frame, size_t len);
};
void wgroups_set_control(struct wgroups *wg, const struct wgroups_control *control);

/* devcoord_group_calls_total{kind}, devcoord_group_call_seconds, devcoord_group_stalls_total. */
void wgroups_metrics_render(struct wgroups *wg, struct mbuf *b);

#endif
