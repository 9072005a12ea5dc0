/*
 * The collective engine (collective.h). It is one file, longer than the others, because
 * everything in it works on one object, struct cop, from several kinds of thread at once: the
 * op's own thread (cop_run: describe, check, prepare, send, finish, answer), the server
 * threads that apply peers' Exchange chunks (cop_apply), the data link's reader threads that
 * apply peers' frames (cop_link_frame) and pass ring chunks on (cop_forward_now), nng's
 * callbacks that count acknowledged sends
 * (cop_sent) and the data link's sender threads that count written frames (cop_link_sent).
 * The rules that keep them apart (op->mtx for counters,
 * co->mtx and op->refs for the op's lifetime, the phases that say when chunks may land,
 * which thread frees the op) are read and checked together; split across files they would
 * need struct cop in a header and the rules in several places. What is pure moved out: the
 * ring schedule to ring.c, the reduction kernels to reduce.c, tensor storage to the
 * executor. In order below: helpers, the ring's forwarding queue, receiving (and chunks that
 * come before their op), sending (and whom to blame at the deadline; the data link), the
 * algorithms per op kind, an op from start to end, and the Worker service entry points.
 *
 * Tensors are reached only through the executor (executor.h), and an op never writes one
 * that is stored under a name: its results go to staging tensors made for it (executor_create),
 * which are handed to the staging (staging.h) when the op is prepared and published only by
 * Commit. So an op that fails, here or on any other worker, at any point, leaves every tensor
 * as it was, and a retry reads the old values. All-reduce and a broadcast receiver map their
 * first staging tensor as the op's work buffer for the whole op and unmap it once no handler
 * can write to it any more (cop_release_work); the root of a broadcast maps its own tensor
 * for reading, and so does a ring all-reduce with one local rank (cop_ring_in_place);
 * everything else is copied in and out.
 */
#include "collective.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "clock.h"
#include "datalink.h"
#include "device.h"
#include "devcoord/v1/methods.h"
#include "groups.h"
#include "log.h"
#include "reduce.h"
#include "ranges.h"
#include "ring.h"
#include "rpc.h"
#include "staging.h"
#include "threadname.h"
#include "tpool.h"
#include "validate.h"

#define WORKER_SVC (&devcoord__v1__worker__descriptor)

#define CHUNK_BYTES (512u << 10) /* bytes per Exchange call */
#define SEND_WINDOW 8            /* Exchange calls in flight per op */
/* Chunks an op has queued to the data link at once (each DLINK_CHUNK bytes at most, sent from
 * the op's own memory by the peer's sender thread), and how long an op that failed waits for
 * the one being written before it closes that connection to get its memory back. */
#define LINK_WINDOW        16
#define LINK_WINDOW_DIRECT (2 * LINK_WINDOW)
#define LINK_GRACE_MS      1000
/* Exchange calls for ops this worker has not been told of yet (a peer's Execute came first)
 * wait for ours, each holding an RPC context. A peer sends at most SEND_WINDOW calls per op
 * at once, so a few windows per connection is all a real cluster needs; more is a peer
 * gone wrong or an attack, and is refused at once rather than allowed to hold the contexts
 * every other method needs (4,800 such calls once made a worker deaf for ~10 s). */
#define ORPHAN_MAX_BYTES    ((size_t)256 << 20)
#define ORPHAN_MAX_MS       10000
#define ORPHAN_MAX_CALLS    256
#define ORPHAN_MAX_PER_PEER (4 * SEND_WINDOW)
/* A small all-reduce goes as one direct exchange (every worker sends its ranks' tensors to
 * every other, each reduces them all in rank order) rather than the ring's 2(W - 1) steps
 * one after the other: at most DIRECT_MAX_WORKERS workers, DIRECT_MAX_TENSOR bytes per
 * tensor and DIRECT_MAX_TOTAL bytes of every rank's tensor together, and only when every
 * worker of the op says it can (ExchangeRequest.features, with the descriptions). */
#define FEATURE_DIRECT 1u
/* A descriptions frame on the data link (never an Exchange call) that also carries the
 * sender's tensors, in its ranks' order after the descriptions: sent when the op will surely
 * be direct if the descriptions agree (cop_early_bytes), to peers that take it
 * (WGROUPS_FEATURE_OP_EARLY), so the data does not wait a round for the descriptions. */
#define FEATURE_EARLY      2u
#define DIRECT_MAX_WORKERS 8u
#define DIRECT_MAX_TENSOR  ((size_t)64 << 10)
#define DIRECT_MAX_TOTAL   ((size_t)1 << 20)
/* Calls parked on a known op that is still starting, per worker of the op. */
#define PARKED_MAX_PER_WORKER (SEND_WINDOW + 2)
/* The ranges one step's data may come in (ranges.h): a sender's chunks in order make one,
 * SEND_WINDOW calls in flight at most that many more. */
#define STEP_PIECES_MAX        1024
#define STEP_PIECES_PER_WORKER (2 * SEND_WINDOW)
#define RECENT_OPS             512
#define OP_ID_MAX              64
#define PLAN_MAX_WORKERS       4096
#define PLAN_MAX_DEVICES       (1u << 20)

/* An op's time when Execute names none. A prepared op's staging is held for
 * ExecuteRequest.hold_ms, never longer than twice the op's time plus HOLD_MAX_EXTRA_MS. An
 * Execute without hold_ms comes from a coordinator older than Commit and is refused (but for
 * a barrier, which stages nothing). */
#define EXECUTE_DEFAULT_TIMEOUT_MS 30000
#define HOLD_MAX_EXTRA_MS          60000

/* An Exchange call waiting for its op to start (or to be ready for data). */
struct parked {
    const Devcoord__V1__ExchangeRequest *in;
    Devcoord__V1__ExchangeResponse_Closure closure;
    void *cd;
    size_t bytes;
    uint32_t pipe; /* the connection it came on, for the per-peer bound */
    uint64_t expires_ms;
    struct parked *next;
};

struct peer {
    char address[256];
    struct rpc_client *client;
};

/* Tensor descriptions that came on the data link (DLINK_FLAG_OP_META) before their op's
 * Execute: kept, under the Exchange orphans' bounds, until it comes or ORPHAN_MAX_MS. */
struct link_orphan {
    char peer[256];
    struct dlink_hdr h;
    uint8_t *data; /* h.length bytes */
    uint64_t expires_ms;
    struct link_orphan *next;
};

enum cop_phase { PHASE_STARTING, PHASE_READY, PHASE_DONE };

struct range {
    size_t off, len;
};

struct cop_meta {
    bool known;
    dc_dtype dtype; /* DC_DTYPE_NONE: the tensor is missing on that device */
    uint64_t elements;
};

struct cop;

struct cop_send_ctx {
    struct cop *op;
    uint32_t to;
};

/* A META chunk's attachment: per rank of the sender, u32 rank, u32 dtype, u64 elements,
 * little-endian. */
#define META_ENTRY 16

/* Ranges waiting to be forwarded: v[head .. head + len), growing as needed. */
struct range_queue {
    struct range *v;
    size_t head, len, cap;
};

/* One op in flight on this worker. The op's thread (cop_run) runs it; Exchange handlers
 * apply received chunks to `work` or `gathered` without op->mtx (each first claims its bytes
 * under it, cop_chunk_claim, so no two overlap), and count them under it. */
/* Set by collectives_run_here on a thread that may run an op itself. */
static _Thread_local bool run_here;

struct cop {
    struct collectives *co;
    char id[OP_ID_MAX + 1];
    const Devcoord__V1__ExecuteRequest *req; /* answered (and freed) with the op */
    Devcoord__V1__ExecuteResponse_Closure closure;
    void *cd;
    uint64_t started_us;

    /* The plan. Ranks are positions in its device list, workers positions in its worker
     * list; `self` is this worker's. */
    uint32_t self, n_workers, n_ranks;
    dc_device_ref *devices;        /* per rank */
    uint32_t *worker_of;           /* per rank: the worker that owns it */
    size_t n_local;                /* ranks of this worker */
    uint32_t *local_ranks;         /* n_local of them, in plan order */
    struct tensor **local_tensors; /* per local rank (index as local_ranks); NULL: missing */
    struct peer **peers;           /* per worker (NULL for self) */
    struct ring ring;              /* all-reduce and reduce: who sends what when */

    /* The tensor every rank has (checked alike on every worker before data moves). */
    dc_dtype dtype;
    size_t elements, elem_size, tensor_bytes;
    /* The op's data, tensor_bytes long: all-reduce and a broadcast receiver map their first
     * staging tensor (work_map), a broadcast root its own tensor, read only; reduce works on a
     * copy it owns. */
    uint8_t *work;
    struct tensor_map work_map;
    bool work_mapped, work_owned;
    /* A ring all-reduce of this worker's only rank reads that rank's tensor in place (in_map,
     * until the work buffer is released) instead of copying it into work first: step 0 sends
     * from it, and each reduce-scatter chunk goes into work as `in op chunk`; the ring writes
     * every byte of work (cop_ring_in_place). NULL otherwise. */
    const uint8_t *in;
    struct tensor_map in_map;
    bool read_in_place; /* op->in was used (devcoord_worker_ring_in_place_ops_total) */
    uint8_t *gathered;  /* all-gather: every rank's tensor in rank order, n_ranks * tensor_bytes */
    /* The results: new tensors, one per local device the op changes, that go to the staging
     * once the op is prepared (then n_outputs is 0 here). */
    struct staging_output *outputs;
    size_t n_outputs;
    uint64_t hold_until_ms; /* when the staging gives up waiting for Commit */

    /* Steps 0 .. n_steps-1: data steps (the ring's, or step 0 of broadcast and all-gather),
     * then meta_step. Per step, bytes this worker expects and has received; for ring ops,
     * ranges that arrived at step s - 1 and go on at step s, and bytes sent at step s. */
    size_t n_steps;
    uint64_t *step_expected, *step_received;
    /* Per step, the bytes claimed by chunks being applied or applied (ranges.h): a chunk
     * that overlaps them is refused, so the count above means every byte came once. */
    struct ranges *step_have;
    struct range_queue *step_forward;
    uint64_t *step_sent;
    /* The one step where several workers send to this one (reduce's fan-in to the root,
     * all-gather, broadcast's receivers), or SIZE_MAX; per worker, bytes expected from it
     * and received at that step. */
    size_t fan_in_step;
    uint64_t *fan_in_expected, *fan_in_received;
    uint64_t *bytes_from; /* per worker, every data byte it sent us (for blame at the deadline) */

    /* What every rank's tensor is, learned from the peers before anything is touched. */
    struct cop_meta *metas;
    uint32_t meta_step; /* the Exchange step that carries them */
    size_t metas_received;
    bool peers_direct; /* every peer's descriptions said FEATURE_DIRECT */
    bool direct;       /* a small all-reduce as one exchange (cop_prepare decides) */
    /* Per worker: the tensors it sent with its descriptions (FEATURE_EARLY, early_len bytes,
     * in its plan ranks' order), applied once the op is prepared; whether we sent ours so to
     * it. */
    uint8_t **early;
    size_t *early_len;
    bool *early_sent;
    struct cop_send_ctx *send_ctx; /* per worker index: the callback argument of a send */
    /* The data link (groups.h's wgroups_op_send): per worker, whether data goes to it there
     * (else in Exchange calls), and its chunks queued and not yet written, which read the
     * op's memory: the op waits for them before it changes or releases that memory. */
    uint64_t hash; /* dlink_group_hash(id): how its frames name it */
    bool *link;
    uint8_t *meta_buf; /* our descriptions, sent from here (the link reads them later) */
    unsigned *link_pending;
    unsigned link_in_flight;
    /* Ring chunks a data handler forwards itself (cop_forward_now) and has not yet handed to
     * the link; once links_closing is set (cop_wait_links) none starts. */
    unsigned forwarding;
    bool links_closing;
    uint64_t link_bytes_sent, link_bytes_received;
    uint64_t link_bytes_placed;    /* of those, read straight into the op's buffer */
    uint64_t link_bytes_forwarded; /* of those sent, by cop_forward_now */
    bool answering;   /* the op's thread answers: its request (op->req) goes with the answer */
    bool thread_done; /* the op's thread has answered; the last send frees it */

    pthread_mutex_t mtx;
    pthread_cond_t cv;
    enum cop_phase phase;
    bool failed;
    dc_status failure; /* the first failure */
    unsigned sends_in_flight;
    uint64_t deadline_ms;
    uint64_t bytes_sent, bytes_received;
    struct parked *parked; /* Exchange calls that came before PHASE_READY */

    int refs; /* guarded by co->mtx: the op thread and each handler applying data */
    struct cop *next;
};

struct collectives {
    const struct config_worker *cfg;
    const char *token;
    struct executor *ex;
    struct membership *m;
    struct wgroups *wg;      /* owns the data link (NULL: Exchange calls only) */
    struct staging *staging; /* prepared ops waiting for Commit, committed keys */
    size_t chunk;
    struct tpool *pool;

    pthread_mutex_t mtx;
    pthread_cond_t cv;        /* an op released a reference or ended */
    pthread_cond_t reaper_cv; /* stopping (the reaper's own: it is woken by nothing else) */
    struct cop *ops;
    struct parked *orphans;
    struct link_orphan *link_orphans;
    size_t orphan_bytes, n_link_orphans;
    char recent[RECENT_OPS][OP_ID_MAX + 1];
    uint64_t recent_hash[RECENT_OPS]; /* dlink_group_hash of each */
    size_t recent_next;
    struct peer **peers;
    size_t n_peers;
    unsigned threads; /* op threads running */
    bool stopping;
    pthread_t reaper;
    struct collectives_stats stats;
};

static void cop_free(struct cop *op);

/* ---- small helpers ----------------------------------------------------------------------- */

static void
cop_device_name(const struct cop *op, uint32_t rank, char *buf, size_t cap)
{
    dc_device_ref_format(&op->devices[rank], buf, cap);
}

/* Bytes [*start, *end) of ring segment seg of the op's buffer. */
static void
cop_segment(const struct cop *op, uint32_t seg, size_t *start, size_t *end)
{
    ring_segment(op->elements, op->n_workers, seg, start, end);
    *start *= op->elem_size;
    *end *= op->elem_size;
}

/* Records the first failure; later ones are dropped. Call with op->mtx held. */
static void
cop_fail_locked(struct cop *op, const dc_status *st)
{
    if (!op->failed) {
        op->failed  = true;
        op->failure = *st;
    }
    pthread_cond_broadcast(&op->cv);
}

static bool
cop_failed(struct cop *op)
{
    bool failed;

    pthread_mutex_lock(&op->mtx);
    failed = op->failed;
    pthread_mutex_unlock(&op->mtx);
    return failed;
}

static bool
recent_has(const struct collectives *co, const char *id)
{
    for (size_t i = 0; i < RECENT_OPS; i++) {
        if (strcmp(co->recent[i], id) == 0) {
            return true;
        }
    }
    return false;
}

/* Remembers an op id that ended (or was aborted before it began). co->mtx held. */
static void
recent_add(struct collectives *co, const char *id)
{
    snprintf(co->recent[co->recent_next], sizeof(co->recent[0]), "%s", id);
    co->recent_hash[co->recent_next] = dlink_group_hash(id);
    co->recent_next                  = (co->recent_next + 1) % RECENT_OPS;
}

/* Keeps descriptions that came before their op (within the orphans' bounds: past them, or
 * for an op that ended here, they are dropped and the sender's op fails at its deadline).
 * co->mtx held. */
static void
link_orphan_keep_locked(struct collectives *co, const char *peer, const struct dlink_hdr *h,
                        const uint8_t *payload)
{
    struct link_orphan *o;

    for (size_t i = 0; i < RECENT_OPS; i++) {
        if (co->recent_hash[i] == h->group && co->recent[i][0] != '\0') {
            return;
        }
    }
    if (co->n_link_orphans >= ORPHAN_MAX_CALLS || co->orphan_bytes + h->length > ORPHAN_MAX_BYTES) {
        log_debug("dropped tensor descriptions from %.200s for an op not here yet (too many "
                  "waiting)",
                  peer);
        return;
    }
    if ((o = calloc(1, sizeof(*o))) == NULL ||
        (o->data = malloc(h->length ? h->length : 1)) == NULL) {
        log_debug("dropped tensor descriptions from %.200s: out of memory", peer);
        free(o);
        return;
    }
    memcpy(o->data, payload, h->length);
    snprintf(o->peer, sizeof(o->peer), "%s", peer);
    o->h             = *h;
    o->expires_ms    = rpc_now_ms() + ORPHAN_MAX_MS;
    o->next          = co->link_orphans;
    co->link_orphans = o;
    co->n_link_orphans++;
    co->orphan_bytes += h->length;
}

/* Frees a list of kept descriptions. */
static void
link_orphans_free(struct link_orphan *list)
{
    while (list != NULL) {
        struct link_orphan *o = list;
        list                  = o->next;
        free(o->data);
        free(o);
    }
}

/* Takes out the kept descriptions of the op whose hash is *hash (hash NULL: none by hash) and
 * those expired by `now` (0: none; UINT64_MAX: all). co->mtx held. */
static struct link_orphan *
link_orphans_take_locked(struct collectives *co, const uint64_t *hash, uint64_t now)
{
    struct link_orphan *taken = NULL;

    for (struct link_orphan **pp = &co->link_orphans; *pp != NULL;) {
        struct link_orphan *o = *pp;
        if ((hash != NULL && o->h.group == *hash) || o->expires_ms <= now) {
            *pp     = o->next;
            o->next = taken;
            taken   = o;
            co->n_link_orphans--;
            co->orphan_bytes -= o->h.length;
        } else {
            pp = &o->next;
        }
    }
    return taken;
}

/* Whether an all-reduce of this op's workers and ranks, with tensors of `bytes` each, is small
 * enough to go as one direct exchange. */
static bool
cop_direct_fits(const struct cop *op, size_t bytes)
{
    return op->n_workers > 1 && op->n_workers <= DIRECT_MAX_WORKERS && bytes <= DIRECT_MAX_TENSOR &&
           (size_t)op->n_ranks * bytes <= DIRECT_MAX_TOTAL;
}

static struct cop *
cop_find_locked(struct collectives *co, const char *id)
{
    for (struct cop *op = co->ops; op != NULL; op = op->next) {
        if (strcmp(op->id, id) == 0) {
            return op;
        }
    }
    return NULL;
}

static void
answer_exchange(struct parked *p, dc_code code, const char *message)
{
    Devcoord__V1__ExchangeResponse out = DEVCOORD__V1__EXCHANGE_RESPONSE__INIT;

    if (code != DC_OK) {
        status_set(rpc_call_status(p->cd), code, "%s", message);
        p->closure(NULL, p->cd);
    } else {
        p->closure(&out, p->cd);
    }
}

/* The client for a peer's data address, opened on first use and kept. */
static struct peer *
peer_get(struct collectives *co, const char *address, dc_status *st)
{
    struct peer *p = NULL, **grow;

    pthread_mutex_lock(&co->mtx);
    for (size_t i = 0; i < co->n_peers; i++) {
        if (strcmp(co->peers[i]->address, address) == 0) {
            p = co->peers[i];
            goto out;
        }
    }
    if ((grow = realloc(co->peers, (co->n_peers + 1) * sizeof(*grow))) == NULL ||
        (p = calloc(1, sizeof(*p))) == NULL) {
        if (grow != NULL) {
            co->peers = grow;
        }
        status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    co->peers = grow;
    snprintf(p->address, sizeof(p->address), "%s", address);
    if (auth_client_open(address, co->token, &co->cfg->tls, co->cfg->max_message_bytes, 500,
                         &p->client, st) != DC_OK) {
        free(p);
        p = NULL;
        goto out;
    }
    co->peers[co->n_peers++] = p;
out:
    pthread_mutex_unlock(&co->mtx);
    return p;
}

/* ---- the ring ---------------------------------------------------------------------------
 *
 * ring.h says who sends which segment when. Here: each chunk received at step s of the ring
 * is queued to go on at step s + 1 (cop_forward_push), and cop_ring sends whatever is
 * queued, lowest step first, so a segment's chunks flow on while the rest still arrives. */

static bool
cop_is_ring(const struct cop *op)
{
    dc_op_kind kind = (dc_op_kind)op->req->kind;
    return (kind == DC_OP_ALL_REDUCE && !op->direct) || kind == DC_OP_REDUCE;
}

/* Queues a range received at step s - 1 to go on at step s. op->mtx held. */
static bool
cop_forward_push(struct cop *op, uint32_t s, size_t off, size_t len)
{
    struct range_queue *q = &op->step_forward[s];

    if (q->head + q->len == q->cap) {
        if (q->head > 0) {
            memmove(q->v, q->v + q->head, q->len * sizeof(*q->v));
            q->head = 0;
        } else {
            size_t cap         = q->cap ? q->cap * 2 : 16;
            struct range *grow = realloc(q->v, cap * sizeof(*grow));
            if (grow == NULL) {
                return false;
            }
            q->v   = grow;
            q->cap = cap;
        }
    }
    q->v[q->head + q->len++] = (struct range){ off, len };
    return true;
}

/* ---- receiving --------------------------------------------------------------------------- */

static bool cop_forward_direct_locked(struct cop *op, uint32_t to, uint32_t step, size_t len);
static bool cop_step_sent_all_locked(const struct cop *op, uint32_t step);
static void cop_forward_now(struct cop *op, uint32_t to, uint32_t step, size_t off, size_t len);

enum apply_mode { APPLY_REDUCE, APPLY_COPY };

/* Where a chunk of `step` from worker `from` about rank `rank` lands: the buffer, the byte
 * range it must fall in and how it is applied. false when this worker expects nothing from
 * `from` at that step. Ranges of one step from different senders never overlap. */
static bool
cop_step_target(const struct cop *op, uint32_t step, uint32_t from, uint32_t rank, uint8_t **base,
                size_t *start, size_t *end, enum apply_mode *mode)
{
    dc_op_kind kind = (dc_op_kind)op->req->kind;
    uint32_t seg, to;

    *base = op->work;
    *mode = APPLY_COPY;
    if (cop_is_ring(op)) {
        switch (ring_recv(&op->ring, op->self, step, &seg)) {
        case RING_RECV_REDUCE:
            *mode = APPLY_REDUCE;
            /* fall through */
        case RING_RECV_COPY:
            cop_segment(op, seg, start, end);
            return from == ring_prev(&op->ring, op->self);
        case RING_RECV_FAN_IN:
            if (!ring_send(&op->ring, from, step, &to, &seg) || to != op->self) {
                return false;
            }
            cop_segment(op, seg, start, end);
            return true;
        case RING_RECV_NONE:
            return false;
        }
        return false;
    }
    if (kind == DC_OP_BROADCAST && step == 0) {
        *start = 0;
        *end   = op->tensor_bytes;
        return op->self != op->worker_of[op->req->root] && from == op->worker_of[op->req->root];
    }
    /* All-gather, and a direct all-reduce: every rank's tensor to its place in gathered. */
    if ((kind == DC_OP_ALL_GATHER || op->direct) && step == 0 && rank < op->n_ranks &&
        op->worker_of[rank] == from && from != op->self) {
        *base  = op->gathered;
        *start = (size_t)rank * op->tensor_bytes;
        *end   = *start + op->tensor_bytes;
        return true;
    }
    return false;
}

/* Records a peer's tensor descriptions (a META chunk). Any phase: they are what the op
 * waits for before it touches a tensor. */
static dc_code
cop_apply_meta(struct cop *op, uint32_t from, uint32_t features, const uint8_t *data, size_t len,
               dc_status *st)
{
    if (len == 0 || len % META_ENTRY != 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "malformed tensor descriptions for op %s",
                          op->id);
    }
    pthread_mutex_lock(&op->mtx);
    for (size_t i = 0; i < len / META_ENTRY; i++) {
        const uint8_t *e = data + i * META_ENTRY;
        uint32_t rank =
            (uint32_t)e[0] | (uint32_t)e[1] << 8 | (uint32_t)e[2] << 16 | (uint32_t)e[3] << 24;
        uint32_t dtype =
            (uint32_t)e[4] | (uint32_t)e[5] << 8 | (uint32_t)e[6] << 16 | (uint32_t)e[7] << 24;
        uint64_t elements = 0;

        for (int b = 7; b >= 0; b--) {
            elements = elements << 8 | e[8 + b];
        }
        if (rank >= op->n_ranks || op->worker_of[rank] != from || op->metas[rank].known ||
            dtype >= DC_DTYPE_COUNT) {
            pthread_mutex_unlock(&op->mtx);
            return status_set(st, DC_INVALID_ARGUMENT, "malformed tensor descriptions for op %s",
                              op->id);
        }
        op->metas[rank] = (struct cop_meta){ true, (dc_dtype)dtype, elements };
        op->metas_received++;
    }
    if ((features & FEATURE_DIRECT) == 0) {
        op->peers_direct = false;
    }
    pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mtx);
    return DC_OK;
}

/* Where bytes [offset, offset + len) of step `step` from worker `from` about rank `rank` go
 * in a ready op: *dst, and whether they are reduced in or copied. INVALID_ARGUMENT: the chunk
 * lies outside the op. */
static dc_code
cop_chunk_target(struct cop *op, uint32_t from, uint32_t step, uint32_t rank, uint64_t offset,
                 size_t len, uint8_t **dst, enum apply_mode *mode, dc_status *st)
{
    uint8_t *base;
    size_t start, end;

    if (from >= op->n_workers || from == op->self || rank >= op->n_ranks ||
        op->worker_of[rank] != from) {
        return status_set(st, DC_INVALID_ARGUMENT, "exchange from a worker outside op %s", op->id);
    }
    if (step >= op->n_steps || step == op->meta_step ||
        !cop_step_target(op, step, from, rank, &base, &start, &end, mode) || offset < start ||
        offset > end || len > end - offset || len % op->elem_size != 0 ||
        offset % op->elem_size != 0) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "exchange chunk outside op %s (step %u, offset %llu, %zu bytes)", op->id,
                          step, (unsigned long long)offset, len);
    }
    *dst = base + offset;
    return DC_OK;
}

/* Claims a chunk's bytes (cop_chunk_target's) before they are applied. INVALID_ARGUMENT:
 * some of them came before (counted, a chunk sent twice would stand in for one never sent and
 * leave stale bytes in the result); RESOURCE_EXHAUSTED: the step's data came in more pieces
 * than honest senders make. */
static dc_code
cop_chunk_claim(struct cop *op, uint32_t from, uint32_t step, uint64_t offset, size_t len,
                dc_status *st)
{
    enum ranges_claim claim;

    pthread_mutex_lock(&op->mtx);
    claim = ranges_claim(&op->step_have[step], offset, len);
    pthread_mutex_unlock(&op->mtx);
    switch (claim) {
    case RANGES_CLAIMED:
        return DC_OK;
    case RANGES_OVERLAP:
        return status_set(st, DC_INVALID_ARGUMENT,
                          "worker %s sent bytes %llu..%llu of step %u of op %s a second time",
                          op->req->plan->workers[from]->name, (unsigned long long)offset,
                          (unsigned long long)(offset + len), step, op->id);
    case RANGES_NOMEM:
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory in op %s", op->id);
    case RANGES_FULL:
        break;
    }
    return status_set(st, DC_RESOURCE_EXHAUSTED,
                      "the data of step %u of op %s came in more than %zu pieces", step, op->id,
                      op->step_have[step].max);
}

/* Counts a chunk that is in (claimed and applied): the step's bytes, the ring's forward of
 * it, the op's counters. */
static void
cop_chunk_landed(struct cop *op, uint32_t from, uint32_t step, uint64_t offset, size_t len,
                 bool link, bool placed)
{
    uint32_t to = 0, seg;
    bool direct = false, wake = false;

    pthread_mutex_lock(&op->mtx);
    op->step_received[step] += len;
    if (step == op->fan_in_step) {
        op->fan_in_received[from] += len;
    }
    if (cop_is_ring(op) && ring_send(&op->ring, op->self, step + 1, &to, &seg)) {
        if ((direct = cop_forward_direct_locked(op, to, step + 1, len))) {
            wake = cop_step_sent_all_locked(op, step + 1); /* the op's thread may be done */
        } else if (!cop_forward_push(op, step + 1, offset, len)) {
            dc_status oom;
            status_set(&oom, DC_RESOURCE_EXHAUSTED, "out of memory in op %s", op->id);
            cop_fail_locked(op, &oom);
        } else {
            wake = true; /* the op's thread sends it */
        }
    }
    op->bytes_received += len;
    if (link) {
        op->link_bytes_received += len;
    }
    if (placed) {
        op->link_bytes_placed += len;
    }
    op->bytes_from[from] += len;
    /* Woken for what it waits on: a range to send, a step all in or all sent, a failure. */
    if (wake || op->failed || op->step_received[step] == op->step_expected[step]) {
        pthread_cond_broadcast(&op->cv);
    }
    pthread_mutex_unlock(&op->mtx);
    if (direct) {
        cop_forward_now(op, to, step + 1, offset, len);
    }
}

/* Applies one received data chunk (an Exchange call's or a data link frame's) to a ready op:
 * bytes [offset, offset + len) of step `step` from worker `from` about rank `rank`. Runs on
 * a server or data link thread, without op->mtx while the bytes move: a chunk claims its bytes
 * first, so chunks of one op never overlap. INVALID_ARGUMENT: the chunk lies outside the op
 * or some of its bytes came before. */
static dc_code
cop_apply_chunk(struct cop *op, uint32_t from, uint32_t step, uint32_t rank, uint64_t offset,
                const uint8_t *data, size_t len, bool link, dc_status *st)
{
    enum apply_mode mode = APPLY_COPY;
    uint8_t *dst         = NULL;

    if (cop_chunk_target(op, from, step, rank, offset, len, &dst, &mode, st) != DC_OK ||
        cop_chunk_claim(op, from, step, offset, len, st) != DC_OK) {
        return st->code;
    }
    if (mode == APPLY_REDUCE && op->in != NULL) {
        /* base is work, the ring all-reduce reading in place: the first and only time this
         * worker reduces these bytes, ours then theirs, in one pass. */
        reduce_pair(op->dtype, (dc_reduce_op)op->req->reduce, dst, op->in + offset, data,
                    len / op->elem_size);
    } else if (mode == APPLY_REDUCE) {
        reduce_into(op->dtype, (dc_reduce_op)op->req->reduce, dst, data, len / op->elem_size);
    } else {
        memcpy(dst, data, len);
    }
    cop_chunk_landed(op, from, step, offset, len, link, false);
    return DC_OK;
}

/* Applies one received Exchange call to an op: its tensor descriptions (any phase), or a
 * chunk of data (a ready op). */
static dc_code
cop_apply(struct cop *op, const Devcoord__V1__ExchangeRequest *in, const uint8_t *data, size_t len,
          dc_status *st)
{
    char mine[DC_DEVICE_TEXT_SIZE], theirs[DC_DEVICE_TEXT_SIZE];

    if (in->from >= op->n_workers || in->from == op->self || in->rank >= op->n_ranks ||
        op->worker_of[in->rank] != in->from) {
        return status_set(st, DC_INVALID_ARGUMENT, "exchange from a worker outside op %s", op->id);
    }
    if (in->step == op->meta_step) {
        return cop_apply_meta(op, in->from, in->features, data, len, st);
    }
    if ((dc_dtype)in->dtype != op->dtype || in->elements != op->elements) {
        cop_device_name(op, op->local_ranks[0], mine, sizeof(mine));
        cop_device_name(op, in->rank, theirs, sizeof(theirs));
        return status_set(st, DC_FAILED_PRECONDITION,
                          "tensor '%s' on %s is %s with %llu elements, but on %s it is %s with "
                          "%zu elements",
                          op->req->tensor, theirs,
                          dc_dtype_name((dc_dtype)in->dtype) ? dc_dtype_name((dc_dtype)in->dtype)
                                                             : "of no known dtype",
                          (unsigned long long)in->elements, mine, dc_dtype_name(op->dtype),
                          op->elements);
    }
    return cop_apply_chunk(op, in->from, in->step, in->rank, in->offset, data, len, false, st);
}

/* Applies a parked or fresh chunk and answers its call; a failure also fails the op. */
static void
cop_take(struct cop *op, struct parked *p)
{
    size_t len;
    const uint8_t *data = rpc_call_attachment(p->cd, &len);
    dc_status st;

    status_clear(&st);
    if (cop_apply(op, p->in, data, len, &st) != DC_OK) {
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &st);
        pthread_mutex_unlock(&op->mtx);
        answer_exchange(p, st.code, st.message);
        return;
    }
    answer_exchange(p, DC_OK, NULL);
}

void
collectives_exchange(struct collectives *co, const Devcoord__V1__ExchangeRequest *in,
                     Devcoord__V1__ExchangeResponse_Closure closure, void *cd)
{
    struct parked p = { .in = in, .closure = closure, .cd = cd, .pipe = rpc_call_pipe(cd) }, *copy;
    struct cop *op;
    char message[160];
    size_t calls = 0, from_peer = 0;

    rpc_call_attachment(cd, &p.bytes);
    pthread_mutex_lock(&co->mtx);
    if ((op = cop_find_locked(co, in->op_id)) != NULL) {
        pthread_mutex_lock(&op->mtx);
        /* Tensor descriptions are taken at once: the op waits for them before it is ready. */
        if ((op->phase == PHASE_READY && !op->failed) ||
            (in->step == op->meta_step && op->phase != PHASE_DONE)) {
            pthread_mutex_unlock(&op->mtx);
            op->refs++;
            pthread_mutex_unlock(&co->mtx);
            cop_take(op, &p);
            pthread_mutex_lock(&co->mtx);
            op->refs--;
            pthread_cond_broadcast(&co->cv);
            pthread_mutex_unlock(&co->mtx);
            return;
        }
        for (const struct parked *q = op->parked; q != NULL; q = q->next) {
            calls++;
        }
        if (op->phase == PHASE_STARTING && calls >= op->n_workers * PARKED_MAX_PER_WORKER) {
            pthread_mutex_unlock(&op->mtx);
            pthread_mutex_unlock(&co->mtx);
            answer_exchange(&p, DC_RESOURCE_EXHAUSTED,
                            "too many calls waiting for this op to start here");
            return;
        }
        if (op->phase == PHASE_STARTING && (copy = malloc(sizeof(*copy))) != NULL) {
            *copy      = p;
            copy->next = op->parked;
            op->parked = copy;
            pthread_mutex_unlock(&op->mtx);
            pthread_mutex_unlock(&co->mtx);
            return;
        }
        snprintf(message, sizeof(message), "op %.64s is ending on this worker", in->op_id);
        pthread_mutex_unlock(&op->mtx);
        pthread_mutex_unlock(&co->mtx);
        answer_exchange(&p, DC_ABORTED, message);
        return;
    }
    if (recent_has(co, in->op_id) || co->stopping) {
        pthread_mutex_unlock(&co->mtx);
        snprintf(message, sizeof(message), "op %.64s is not running on this worker", in->op_id);
        answer_exchange(&p, DC_ABORTED, message);
        return;
    }
    /* The peer is ahead of us: hold the chunk until our Execute arrives, within bounds. */
    for (const struct parked *q = co->orphans; q != NULL; q = q->next) {
        calls++;
        from_peer += q->pipe == p.pipe;
    }
    if (co->orphan_bytes + p.bytes > ORPHAN_MAX_BYTES || calls >= ORPHAN_MAX_CALLS ||
        from_peer >= ORPHAN_MAX_PER_PEER || (copy = malloc(sizeof(*copy))) == NULL) {
        pthread_mutex_unlock(&co->mtx);
        snprintf(message, sizeof(message),
                 "too many calls waiting for ops not started here (at most %d per connection, "
                 "%d in all)",
                 ORPHAN_MAX_PER_PEER, ORPHAN_MAX_CALLS);
        answer_exchange(&p, DC_RESOURCE_EXHAUSTED, message);
        return;
    }
    *copy            = p;
    copy->expires_ms = rpc_now_ms() + ORPHAN_MAX_MS;
    if (rpc_call_deadline_ms(cd) != 0 && rpc_call_deadline_ms(cd) < copy->expires_ms) {
        copy->expires_ms = rpc_call_deadline_ms(cd);
    }
    copy->next  = co->orphans;
    co->orphans = copy;
    co->orphan_bytes += p.bytes;
    pthread_mutex_unlock(&co->mtx);
}

/* Answers orphans whose op never came. */
static void *
collectives_reaper(void *arg)
{
    struct collectives *co = arg;

    thread_name_set("dc-op-reaper");
    pthread_mutex_lock(&co->mtx);
    while (!co->stopping) {
        struct timespec ts;
        struct parked *expired = NULL, **pp = &co->orphans;
        uint64_t now              = rpc_now_ms();
        struct link_orphan *stale = link_orphans_take_locked(co, NULL, now);

        while (*pp != NULL) {
            struct parked *p = *pp;
            if (p->expires_ms <= now) {
                *pp     = p->next;
                p->next = expired;
                expired = p;
                co->orphan_bytes -= p->bytes;
            } else {
                pp = &p->next;
            }
        }
        pthread_mutex_unlock(&co->mtx);
        link_orphans_free(stale);
        while (expired != NULL) {
            struct parked *p = expired;
            char message[160];
            expired = p->next;
            snprintf(message, sizeof(message), "no op %.64s on this worker", p->in->op_id);
            answer_exchange(p, DC_NOT_FOUND, message);
            free(p);
        }
        pthread_mutex_lock(&co->mtx);
        ts = clock_deadline_ms(100);
        pthread_cond_timedwait(&co->reaper_cv, &co->mtx, &ts);
    }
    pthread_mutex_unlock(&co->mtx);
    return NULL;
}

/* ---- sending ----------------------------------------------------------------------------- */

/* A send was answered. A failure names the peer it was about; the op's last send frees an
 * op whose thread has already answered (failed ops do not wait for their sends). */
static void
cop_sent(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct cop_send_ctx *ctx = arg;
    struct cop *op           = ctx->op;
    bool free_op;

    (void)reply;
    (void)keep;
    pthread_mutex_lock(&op->mtx);
    op->sends_in_flight--;
    if (code != DC_OK && !op->failed && !op->answering) {
        dc_status peer   = *st;
        const char *name = op->req->plan->workers[ctx->to]->name;
        if (st->transport) {
            char where[DC_WORKER_NAME_MAX + 32];
            snprintf(where, sizeof(where), "%s %s",
                     code == DC_DEADLINE_EXCEEDED ? "no answer from worker" : "lost worker", name);
            status_prefix(&peer, where);
            peer.transport = false; /* reported on: no longer a failure of our own call */
        }
        /* The peer's own answer names what it found; either way the failure is about it. */
        if (peer.worker[0] == '\0') {
            status_set_worker(&peer, name);
        }
        cop_fail_locked(op, &peer);
    }
    pthread_cond_broadcast(&op->cv);
    free_op = op->thread_done && op->sends_in_flight == 0;
    pthread_mutex_unlock(&op->mtx);
    if (free_op) {
        cop_free(op);
    }
}

/* Whom a wait at the deadline blames, and how (see cop_wait_locked). */
enum blame_kind {
    BLAME_NONE,
    BLAME_SENDER, /* the worker whose data we wait for */
    BLAME_ACKS,   /* the worker that does not acknowledge what we sent */
};

/* Waits on op->cv until the deadline; false (and the op failed) once it has passed. At the
 * deadline the op fails naming `who`: a sender that sent us nothing at all, or a receiver
 * that stopped acknowledging, is the cause (DEADLINE_EXCEEDED); a sender that sent part of
 * its data is itself waiting on someone else, so this is only a reaction (ABORTED, which the
 * coordinator ranks below the cause). op->mtx held. */
static bool
cop_wait_locked(struct cop *op, const char *waiting_for, enum blame_kind blame, uint32_t who)
{
    struct timespec ts;
    uint64_t now = rpc_now_ms(), left;

    if (now >= op->deadline_ms) {
        dc_status st;
        const char *name = blame != BLAME_NONE ? op->req->plan->workers[who]->name : NULL;
        if (blame == BLAME_SENDER && op->bytes_from[who] > 0) {
            status_set(&st, DC_ABORTED,
                       "gave up on op %s after %llu ms waiting for worker %s, which sent part of "
                       "its data and waits on its own peers",
                       op->id, (unsigned long long)op->req->timeout_ms, name);
        } else {
            status_set(&st, DC_DEADLINE_EXCEEDED, "%s within %llu ms", waiting_for,
                       (unsigned long long)op->req->timeout_ms);
        }
        if (name != NULL) {
            status_set_worker(&st, name);
        }
        cop_fail_locked(op, &st);
        return false;
    }
    left = op->deadline_ms - now;
    ts   = clock_deadline_ms(left);
    pthread_cond_timedwait(&op->cv, &op->mtx, &ts);
    return true;
}

/* ---- the data link --------------------------------------------------------------------
 *
 * An op's data chunks go to a peer over the data link (datalink.h) when this worker has one
 * to it (decided once per op and peer, cop_choose_links), else in Exchange calls. Tensor
 * descriptions go as a DLINK_FLAG_OP_META frame to a peer whose link is up already and takes
 * them (cop_link_takes), else in an Exchange call. A frame is a chunk with the Exchange
 * call's fields in its header; the receiver applies it with the same checks. */

/* A chunk queued to the data link was written (or not): the window moves on; a failure
 * fails the op, naming the peer. Sender thread or wgroups_op_cancel, no lock held. */
static void
cop_link_sent(void *arg, size_t bytes, dc_code code, const dc_status *st)
{
    struct cop_send_ctx *ctx = arg;
    struct cop *op           = ctx->op;
    bool wake;

    pthread_mutex_lock(&op->mtx);
    op->link_in_flight--;
    op->link_pending[ctx->to]--;
    op->link_bytes_sent += bytes;
    /* Waiters: a send for room in the window, cop_wait_links for none left, a failure. */
    wake = op->link_in_flight == LINK_WINDOW - 1 || op->link_in_flight == 0 || code != DC_OK;
    if (code != DC_OK && !op->failed) {
        dc_status peer;
        const char *name = op->req->plan->workers[ctx->to]->name;
        status_set(&peer, code == DC_ABORTED ? DC_ABORTED : DC_UNAVAILABLE,
                   "lost worker %s: %s (op %s, data link)", name, st->message, op->id);
        status_set_worker(&peer, name);
        cop_fail_locked(op, &peer);
    }
    if (wake) {
        pthread_cond_broadcast(&op->cv);
    }
    pthread_mutex_unlock(&op->mtx);
}

/* The first worker with chunks of the op still queued or being written. op->mtx held. */
static uint32_t
cop_link_laggard(const struct cop *op)
{
    for (uint32_t w = 0; w < op->n_workers; w++) {
        if (op->link_pending[w] > 0) {
            return w;
        }
    }
    return 0;
}

/* Waits until no chunk of the op is queued or being written to the data link, so that its
 * memory may change or go. A peer that does not take them fails the op at its deadline; a
 * failed op drops what is queued and gives the chunk being written LINK_GRACE_MS before it
 * closes that connection. */
static void
cop_wait_links(struct cop *op)
{
    char waiting[200];
    uint64_t until, left;

    pthread_mutex_lock(&op->mtx);
    /* No handler forwards a chunk from here, and none is left half queued. */
    op->links_closing = true;
    while (op->forwarding > 0) {
        pthread_cond_wait(&op->cv, &op->mtx);
    }
    while (!op->failed && op->link_in_flight > 0) {
        uint32_t who = cop_link_laggard(op);
        snprintf(waiting, sizeof(waiting), "worker %.64s did not take data of op %.64s",
                 op->req->plan->workers[who]->name, op->id);
        if (!cop_wait_locked(op, waiting, BLAME_ACKS, who)) {
            break;
        }
    }
    if (op->link_in_flight == 0) {
        pthread_mutex_unlock(&op->mtx);
        return;
    }
    pthread_mutex_unlock(&op->mtx);
    wgroups_op_cancel(op->co->wg, op, false);
    pthread_mutex_lock(&op->mtx);
    until = rpc_now_ms() + LINK_GRACE_MS;
    while (op->link_in_flight > 0 && (left = rpc_ms_until(until)) > 0) {
        clock_cond_wait_ms(&op->cv, &op->mtx, (unsigned)left);
    }
    if (op->link_in_flight > 0) {
        pthread_mutex_unlock(&op->mtx);
        wgroups_op_cancel(op->co->wg, op, true);
        pthread_mutex_lock(&op->mtx);
        while (op->link_in_flight > 0) {
            pthread_cond_wait(&op->cv, &op->mtx);
        }
    }
    pthread_mutex_unlock(&op->mtx);
}

/* Sends bytes [start, end) of base (a buffer of `extent` bytes) to worker `to` over the data
 * link, as frames of step `step` about rank `rank`. */
static bool
cop_link_send(struct cop *op, uint32_t to, uint32_t step, const uint8_t *base, size_t extent,
              size_t start, size_t end, uint32_t rank)
{
    struct dlink_hdr h = { .kind       = DLINK_DATA,
                           .from       = op->self,
                           .group      = op->hash,
                           .generation = rank,
                           .seq        = step,
                           .total      = extent };
    char waiting[200];

    snprintf(waiting, sizeof(waiting), "worker %.64s did not take data of op %.64s",
             op->req->plan->workers[to]->name, op->id);
    for (size_t off = start; off < end;) {
        size_t len = end - off < DLINK_CHUNK ? end - off : DLINK_CHUNK;
        dc_status st;

        pthread_mutex_lock(&op->mtx);
        while (!op->failed && op->link_in_flight >= LINK_WINDOW &&
               cop_wait_locked(op, waiting, BLAME_ACKS, to)) {
        }
        if (op->failed) {
            pthread_mutex_unlock(&op->mtx);
            return false;
        }
        op->link_in_flight++;
        op->link_pending[to]++;
        op->bytes_sent += len;
        pthread_mutex_unlock(&op->mtx);
        h.offset = off;
        if (wgroups_op_send(op->co->wg, op->peers[to]->address, &h, base + off, len, op,
                            cop_link_sent, &op->send_ctx[to], true, &st) != DC_OK) {
            pthread_mutex_lock(&op->mtx);
            op->link_in_flight--;
            op->link_pending[to]--;
            status_prefix(&st, "data link");
            cop_fail_locked(op, &st);
            pthread_mutex_unlock(&op->mtx);
            return false;
        }
        off += len;
    }
    return true;
}

/* Whether the data handler that got a ring chunk forwards it to worker `to` at `step` itself
 * (cop_forward_now), as the group path does, instead of waking the op's thread to do it: a
 * chunk no longer waits for that thread to be scheduled, per chunk, on a busy machine. Only
 * over the data link (an Exchange call would wait for its window on this thread) and while
 * the queue is short: past LINK_WINDOW_DIRECT chunks queued the op's thread takes them, so
 * the queue stays bounded and the handler never waits. Counts the chunk as sent and in
 * flight when it says yes. op->mtx held. */
static bool
cop_forward_direct_locked(struct cop *op, uint32_t to, uint32_t step, size_t len)
{
    if (!op->link[to] || op->failed || op->links_closing ||
        op->link_in_flight >= LINK_WINDOW_DIRECT) {
        return false;
    }
    op->link_in_flight++;
    op->link_pending[to]++;
    op->forwarding++;
    op->step_sent[step] += len;
    op->bytes_sent += len;
    op->link_bytes_forwarded += len;
    return true;
}

/* Whether this worker has sent all it sends at ring step `step`. op->mtx held. */
static bool
cop_step_sent_all_locked(const struct cop *op, uint32_t step)
{
    uint32_t to, seg;
    size_t start, end;

    if (!ring_send(&op->ring, op->self, step, &to, &seg)) {
        return true;
    }
    cop_segment(op, seg, &start, &end);
    return op->step_sent[step] == end - start;
}

/* Queues a chunk cop_forward_direct_locked took to the data link to `to`; a failure fails
 * the op. Any thread, no lock held. */
static void
cop_forward_now(struct cop *op, uint32_t to, uint32_t step, size_t off, size_t len)
{
    struct dlink_hdr h = { .kind       = DLINK_DATA,
                           .from       = op->self,
                           .group      = op->hash,
                           .generation = op->local_ranks[0],
                           .seq        = step,
                           .total      = op->tensor_bytes,
                           .offset     = off };
    dc_status st;
    /* Queued, never written here: this may be a data link reader, which must keep reading. */
    dc_code code = wgroups_op_send(op->co->wg, op->peers[to]->address, &h, op->work + off, len, op,
                                   cop_link_sent, &op->send_ctx[to], false, &st);

    pthread_mutex_lock(&op->mtx);
    if (code != DC_OK) {
        op->link_in_flight--;
        op->link_pending[to]--;
        status_prefix(&st, "data link");
        cop_fail_locked(op, &st);
    }
    if (--op->forwarding == 0 && op->links_closing) {
        pthread_cond_broadcast(&op->cv);
    }
    pthread_mutex_unlock(&op->mtx);
}

/* Which peers get the op's data over the data link: those this worker has (or can open) a
 * link to; the others (an older worker, a link that fails to open) get Exchange calls. */
static void
cop_choose_links(struct cop *op)
{
    for (uint32_t w = 0; w < op->n_workers; w++) {
        dc_status st;
        op->link[w] = false;
        if (w == op->self || op->co->wg == NULL) {
            continue;
        }
        status_clear(&st);
        if (wgroups_peer_link(op->co->wg, op->peers[w]->address, &st) == DC_OK) {
            op->link[w] = true;
        } else {
            log_info("op %s: data to worker %s goes in Exchange calls: %s", op->id,
                     op->req->plan->workers[w]->name, st.message);
        }
    }
}

/* Whether a frame of op (header h, from the connection of `peer`) comes from the worker of
 * the op it says, at that worker's address, with fields that fit; else why not. */
static dc_code
cop_frame_sender_ok(const struct cop *op, const char *peer, const struct dlink_hdr *h,
                    dc_status *why)
{
    if (h->from >= op->n_workers || h->from == op->self ||
        strcmp(op->req->plan->workers[h->from]->address, peer) != 0 || h->seq > UINT32_MAX ||
        h->generation > UINT32_MAX) {
        return status_set(why, DC_INVALID_ARGUMENT,
                          "data link: a frame of op %s from %.200s, which is not worker %u of it",
                          op->id, peer, h->from);
    }
    return DC_OK;
}

/* Applies a descriptions frame (DLINK_FLAG_OP_META) from worker h->from to op.
 * INVALID_ARGUMENT: it is malformed or not where descriptions go. */
static dc_code
cop_link_meta(struct cop *op, const struct dlink_hdr *h, const uint8_t *payload, dc_status *st)
{
    uint32_t features = (uint32_t)h->generation;
    size_t n, metas_len, data_len;
    uint8_t *copy;
    bool twice;

    if (h->seq != op->meta_step || h->offset != 0) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "data link: tensor descriptions of op %s at step %llu", op->id,
                          (unsigned long long)h->seq);
    }
    if ((features & FEATURE_EARLY) == 0) {
        return cop_apply_meta(op, h->from, features, payload, h->length, st);
    }
    /* The sender's ranks' descriptions, then their tensors, the same size each, no larger
     * than a direct all-reduce takes (h->from is a worker of op: cop_frame_sender_ok). */
    n         = op->req->plan->workers[h->from]->n_ranks;
    metas_len = n * META_ENTRY;
    data_len  = h->length > metas_len ? h->length - metas_len : 0;
    if (n == 0 || data_len == 0 || data_len % n != 0 || !cop_direct_fits(op, data_len / n)) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "data link: malformed tensor descriptions with data for op %s", op->id);
    }
    if ((copy = malloc(data_len)) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory in op %s", op->id);
    }
    memcpy(copy, payload + metas_len, data_len);
    /* In place before the descriptions count: the op goes on as soon as it has the last of
     * them. Freed with the op. */
    pthread_mutex_lock(&op->mtx);
    twice = op->early[h->from] != NULL;
    if (!twice) {
        op->early[h->from]     = copy;
        op->early_len[h->from] = data_len;
    }
    pthread_mutex_unlock(&op->mtx);
    if (twice) {
        free(copy);
        return status_set(st, DC_INVALID_ARGUMENT,
                          "data link: worker %u described its tensors for op %s twice",
                          (unsigned)h->from, op->id);
    }
    return cop_apply_meta(op, h->from, features, payload, metas_len, st);
}

/* Whether our tensors went with our descriptions to any peer. */
static bool
cop_sent_early(const struct cop *op)
{
    for (uint32_t w = 0; w < op->n_workers; w++) {
        if (op->early_sent[w]) {
            return true;
        }
    }
    return false;
}

/* Applies the tensors that came with the descriptions to a prepared op, as their senders'
 * step 0 data. INVALID_ARGUMENT: the op is no direct all-reduce, or they are not the
 * sender's ranks' tensors. */
static dc_code
cop_take_early(struct cop *op, dc_status *st)
{
    /* Ours as we sent them: what the peers sum (a tensor rewritten since must not change
     * it), and what goes to the peers that get our data after the descriptions. */
    if (op->direct && cop_sent_early(op)) {
        for (size_t i = 0; i < op->n_local; i++) {
            memcpy(op->gathered + (size_t)op->local_ranks[i] * op->tensor_bytes,
                   op->meta_buf + op->n_local * META_ENTRY + i * op->tensor_bytes,
                   op->tensor_bytes);
        }
    }
    for (uint32_t w = 0; w < op->n_workers; w++) {
        const Devcoord__V1__PlanWorker *pw = op->req->plan->workers[w];
        const uint8_t *data;
        size_t len;

        pthread_mutex_lock(&op->mtx);
        data = op->early[w];
        len  = op->early_len[w];
        pthread_mutex_unlock(&op->mtx);
        if (data == NULL) {
            continue;
        }
        if (!op->direct) {
            return status_set(st, DC_INVALID_ARGUMENT,
                              "worker %s sent its tensors with its descriptions, but op %s is not "
                              "one direct exchange",
                              pw->name, op->id);
        }
        if (len != pw->n_ranks * op->tensor_bytes) {
            return status_set(st, DC_INVALID_ARGUMENT,
                              "worker %s sent %zu bytes of tensors with its descriptions for op "
                              "%s, not its ranks' %zu-byte tensors",
                              pw->name, len, op->id, op->tensor_bytes);
        }
        /* In the sender's plan order (its local_ranks). */
        for (size_t i = 0; i < pw->n_ranks; i++) {
            uint32_t r = pw->ranks[i];
            if (cop_apply_chunk(op, w, 0, r, (uint64_t)r * op->tensor_bytes,
                                data + i * op->tensor_bytes, op->tensor_bytes, true, st) != DC_OK) {
                return st->code;
            }
        }
    }
    return DC_OK;
}

/* Waits (within the op's deadline) for a frame's op to be ready for data: false when it
 * failed or is past that. */
static bool
cop_wait_ready(struct cop *op)
{
    bool ready;

    pthread_mutex_lock(&op->mtx);
    while (op->phase == PHASE_STARTING && !op->failed &&
           cop_wait_locked(op, "op did not get ready", BLAME_NONE, 0)) {
    }
    ready = op->phase == PHASE_READY && !op->failed;
    pthread_mutex_unlock(&op->mtx);
    return ready;
}

/* The op running here whose id hashes to `hash` (a data link frame's group), or NULL. co->mtx
 * held. */
static struct cop *
cop_by_hash_locked(struct collectives *co, uint64_t hash)
{
    struct cop *op = co->ops;

    while (op != NULL && op->hash != hash) {
        op = op->next;
    }
    return op;
}

/* Drops a data handler's reference to op (taken under co->mtx); the op's thread may be
 * waiting for it. */
static void
cop_unref(struct collectives *co, struct cop *op)
{
    pthread_mutex_lock(&co->mtx);
    op->refs--;
    pthread_cond_broadcast(&co->cv);
    pthread_mutex_unlock(&co->mtx);
}

/* A data link frame of an op (groups.c's op sink, on the connection's reader thread): the op
 * it names by hash, if it runs here, applies it once it is ready, as an Exchange chunk. A
 * frame from a worker the op does not list at that address, or naming bytes outside the op,
 * is refused (false: the connection drops); one for an op not (or no longer) running is
 * dropped. */
static bool
cop_link_frame(void *arg, const char *peer, const struct dlink_hdr *h, const uint8_t *payload,
               dc_status *why)
{
    struct collectives *co = arg;
    struct cop *op         = NULL;
    dc_status st;
    bool ok = true, ready;

    pthread_mutex_lock(&co->mtx);
    op = cop_by_hash_locked(co, h->group);
    if (op == NULL && !co->stopping && (h->flags & DLINK_FLAG_OP_META) != 0) {
        link_orphan_keep_locked(co, peer, h, payload);
        pthread_mutex_unlock(&co->mtx);
        return true;
    }
    if (op == NULL || co->stopping) {
        pthread_mutex_unlock(&co->mtx);
        return true;
    }
    if (cop_frame_sender_ok(op, peer, h, why) != DC_OK) {
        pthread_mutex_unlock(&co->mtx);
        return false;
    }
    op->refs++;
    pthread_mutex_unlock(&co->mtx);

    if ((h->flags & DLINK_FLAG_OP_META) != 0) {
        /* Descriptions: taken in any phase, they are what the op waits for. */
        status_clear(&st);
        if (cop_link_meta(op, h, payload, &st) != DC_OK) {
            pthread_mutex_lock(&op->mtx);
            cop_fail_locked(op, &st);
            pthread_mutex_unlock(&op->mtx);
            *why = st;
            ok   = false;
        }
        cop_unref(co, op);
        return ok;
    }
    /* The sender had our tensor descriptions, so the op is here; it may still be preparing. */
    ready = cop_wait_ready(op);
    status_clear(&st);
    if (ready && cop_apply_chunk(op, h->from, (uint32_t)h->seq, (uint32_t)h->generation, h->offset,
                                 payload, h->length, true, &st) != DC_OK) {
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &st);
        pthread_mutex_unlock(&op->mtx);
        *why = st;
        ok   = st.code != DC_INVALID_ARGUMENT;
    }
    cop_unref(co, op);
    return ok;
}

/* Where an op frame's payload may be read straight to (datalink.h's op_place): bytes of a
 * ready op that are copied, not reduced (the ring's all-gather steps, a broadcast's, an
 * all-gather's or a direct all-reduce's), so they skip the link's buffer and a copy. NULL
 * for anything else, which then comes to cop_link_frame as before (and is refused there if
 * it does not fit). A reference to the op is held until cop_link_landed. */
static uint8_t *
cop_link_place(void *arg, const char *peer, const struct dlink_hdr *h, void **pin,
               uint32_t *wait_ms)
{
    struct collectives *co = arg;
    enum apply_mode mode;
    uint8_t *dst = NULL;
    struct cop *op;
    dc_status st;
    bool ready;

    if ((h->flags & DLINK_FLAG_OP_META) != 0) {
        return NULL; /* descriptions: cop_link_frame's */
    }
    pthread_mutex_lock(&co->mtx);
    op = cop_by_hash_locked(co, h->group);
    if (op == NULL || co->stopping || cop_frame_sender_ok(op, peer, h, &st) != DC_OK) {
        pthread_mutex_unlock(&co->mtx);
        return NULL;
    }
    op->refs++;
    pthread_mutex_unlock(&co->mtx);
    ready = cop_wait_ready(op);
    status_clear(&st);
    if (ready &&
        cop_chunk_target(op, h->from, (uint32_t)h->seq, (uint32_t)h->generation, h->offset,
                         h->length, &dst, &mode, &st) == DC_OK &&
        mode == APPLY_COPY &&
        cop_chunk_claim(op, h->from, (uint32_t)h->seq, h->offset, h->length, &st) == DC_OK) {
        uint64_t now  = rpc_now_ms();
        uint64_t left = op->deadline_ms > now ? op->deadline_ms - now : 1;

        *wait_ms = left < INT32_MAX ? (uint32_t)left : INT32_MAX;
        *pin     = op;
        return dst;
    }
    cop_unref(co, op);
    return NULL;
}

/* A frame cop_link_place placed is in (ok), or its connection dropped mid-frame (the op
 * then fails as its peer is lost; what landed of it counts for nothing). */
static bool
cop_link_landed(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok,
                dc_status *why)
{
    struct collectives *co = arg;
    struct cop *op         = pin;

    (void)peer;
    (void)why;
    if (ok) {
        cop_chunk_landed(op, h->from, (uint32_t)h->seq, h->offset, h->length, true, true);
    }
    cop_unref(co, op);
    return true;
}

/* Sends bytes [start, end) of base (a buffer of `extent` bytes) to worker `to` as chunks of
 * `step`: over the data link when the op has one to it, else in Exchange calls. */
static bool
cop_send(struct cop *op, uint32_t to, uint32_t step, const uint8_t *base, size_t extent,
         size_t start, size_t end, uint32_t rank)
{
    Devcoord__V1__ExchangeRequest req = DEVCOORD__V1__EXCHANGE_REQUEST__INIT;
    char waiting[200];

    if (op->link[to]) {
        return cop_link_send(op, to, step, base, extent, start, end, rank);
    }

    req.op_id    = op->id;
    req.from     = op->self;
    req.step     = step;
    req.dtype    = (Devcoord__V1__DType)op->dtype;
    req.elements = op->elements;
    req.rank     = rank;
    snprintf(waiting, sizeof(waiting), "worker %.64s did not acknowledge data of op %.64s",
             op->req->plan->workers[to]->name, op->id);
    for (size_t off = start; off < end;) {
        size_t len = end - off < op->co->chunk ? end - off : op->co->chunk;
        uint64_t left;
        dc_status st;

        pthread_mutex_lock(&op->mtx);
        while (!op->failed && op->sends_in_flight >= SEND_WINDOW &&
               cop_wait_locked(op, waiting, BLAME_ACKS, to)) {
        }
        if (op->failed) {
            pthread_mutex_unlock(&op->mtx);
            return false;
        }
        op->sends_in_flight++;
        op->bytes_sent += len;
        pthread_mutex_unlock(&op->mtx);

        left       = rpc_ms_until(op->deadline_ms);
        left       = left > 0 ? left : 1;
        req.offset = off;
        if (rpc_call_async(op->peers[to]->client, WORKER_SVC, M_WORKER_EXCHANGE, &req.base,
                           base + off, len, (uint32_t)left, cop_sent, &op->send_ctx[to],
                           &st) != DC_OK) {
            pthread_mutex_lock(&op->mtx);
            op->sends_in_flight--;
            cop_fail_locked(op, &st);
            pthread_mutex_unlock(&op->mtx);
            return false;
        }
        off += len;
    }
    return true;
}

/* Waits until everything expected at `step` has arrived. */
static bool
cop_wait_step(struct cop *op, uint32_t step)
{
    char waiting[200];
    bool ok;

    pthread_mutex_lock(&op->mtx);
    while (!op->failed && op->step_received[step] < op->step_expected[step]) {
        uint32_t from = ring_prev(&op->ring, op->self);
        if (step == op->fan_in_step || (dc_op_kind)op->req->kind == DC_OP_BROADCAST) {
            for (uint32_t w = 0; w < op->n_workers; w++) {
                if (op->fan_in_received[w] < op->fan_in_expected[w]) {
                    from = w;
                    break;
                }
            }
        }
        snprintf(waiting, sizeof(waiting), "worker %.64s did not send its data for op %.64s",
                 op->req->plan->workers[from]->name, op->id);
        if (!cop_wait_locked(op, waiting, BLAME_SENDER, from)) {
            break;
        }
    }
    ok = !op->failed;
    pthread_mutex_unlock(&op->mtx);
    return ok;
}

/* ---- the algorithms ---------------------------------------------------------------------- */

/* Runs the ring of an all-reduce or reduce: sends what is ready, lowest step first, until
 * every step has sent its segment, then waits for the last data to land. */
static bool
cop_ring(struct cop *op)
{
    uint32_t prev_worker = ring_prev(&op->ring, op->self);
    const char *prev     = op->req->plan->workers[prev_worker]->name;
    uint32_t steps       = ring_steps(&op->ring);
    uint32_t to, seg;
    size_t start, end;
    char waiting[200];

    snprintf(waiting, sizeof(waiting), "worker %.64s did not send its data for op %.64s", prev,
             op->id);
    pthread_mutex_lock(&op->mtx);
    /* Step 0 sends this worker's own data; every later step forwards what arrived. */
    if (ring_send(&op->ring, op->self, 0, &to, &seg)) {
        cop_segment(op, seg, &start, &end);
        if (end > start && !cop_forward_push(op, 0, start, end - start)) {
            pthread_mutex_unlock(&op->mtx);
            return false;
        }
    }
    for (;;) {
        struct range r;
        uint32_t s;
        bool done = true;

        for (s = 0; s < steps && op->step_forward[s].len == 0; s++) {
        }
        if (s == steps) {
            for (uint32_t k = 0; k < steps && done; k++) {
                done = cop_step_sent_all_locked(op, k);
            }
            if (done || op->failed) {
                break;
            }
            if (!cop_wait_locked(op, waiting, BLAME_SENDER, prev_worker)) {
                break;
            }
            continue;
        }
        r = op->step_forward[s].v[op->step_forward[s].head];
        op->step_forward[s].head++;
        op->step_forward[s].len--;
        pthread_mutex_unlock(&op->mtx);
        ring_send(&op->ring, op->self, s, &to, &seg);
        if (!cop_send(op, to, s, s == 0 && op->in != NULL ? op->in : op->work, op->tensor_bytes,
                      r.off, r.off + r.len, op->local_ranks[0])) {
            return false;
        }
        pthread_mutex_lock(&op->mtx);
        op->step_sent[s] += r.len;
    }
    pthread_mutex_unlock(&op->mtx);
    for (uint32_t s = 0; s < steps; s++) {
        if (op->step_expected[s] > 0 && !cop_wait_step(op, s)) {
            return false;
        }
    }
    return !cop_failed(op);
}

static bool
cop_broadcast(struct cop *op)
{
    uint32_t root_worker = op->worker_of[op->req->root];

    if (op->self != root_worker) {
        return cop_wait_step(op, 0);
    }
    for (uint32_t w = 0; w < op->n_workers; w++) {
        if (w != op->self &&
            !cop_send(op, w, 0, op->work, op->tensor_bytes, 0, op->tensor_bytes, op->req->root)) {
            return false;
        }
    }
    return true;
}

static bool
cop_all_gather(struct cop *op)
{
    for (uint32_t w = 0; w < op->n_workers; w++) {
        for (size_t i = 0; w != op->self && !op->early_sent[w] && i < op->n_local; i++) {
            size_t at = (size_t)op->local_ranks[i] * op->tensor_bytes;
            if (!cop_send(op, w, 0, op->gathered, (size_t)op->n_ranks * op->tensor_bytes, at,
                          at + op->tensor_bytes, op->local_ranks[i])) {
                return false;
            }
        }
    }
    return cop_wait_step(op, 0);
}

/* ---- an op from start to end ------------------------------------------------------------- */

/* Looks up the op's tensor on every local device and describes it (a missing one too). */
static void
cop_local_metas(struct cop *op)
{
    struct executor *ex = op->co->ex;
    dc_status ignored;

    for (size_t i = 0; i < op->n_local; i++) {
        uint32_t r = op->local_ranks[i];
        if (executor_lookup(ex, &op->devices[r].device, op->req->tensor, &op->local_tensors[i],
                            &ignored) != DC_OK) {
            op->local_tensors[i] = NULL;
            op->metas[r]         = (struct cop_meta){ true, DC_DTYPE_NONE, 0 };
        } else {
            op->metas[r] = (struct cop_meta){ true, op->local_tensors[i]->dtype,
                                              op->local_tensors[i]->elements };
        }
    }
}

/* A descriptions frame left (or did not): as a chunk, but its bytes are not data. */
static void
cop_meta_sent(void *arg, size_t bytes, dc_code code, const dc_status *st)
{
    (void)bytes;
    cop_link_sent(arg, 0, code, st);
}

/* Sends our descriptions to worker w as a frame on its data link (it said it takes them). */
static dc_code
cop_send_meta_frame(struct cop *op, uint32_t w, size_t len, uint32_t features, dc_status *st)
{
    struct dlink_hdr h = { .kind       = DLINK_DATA,
                           .flags      = DLINK_FLAG_OP_META,
                           .from       = op->self,
                           .group      = op->hash,
                           .generation = features,
                           .seq        = op->meta_step,
                           .offset     = 0,
                           .total      = len };
    dc_code code;

    pthread_mutex_lock(&op->mtx);
    op->link_in_flight++;
    op->link_pending[w]++;
    pthread_mutex_unlock(&op->mtx);
    if ((code = wgroups_op_send(op->co->wg, op->peers[w]->address, &h, op->meta_buf, len, op,
                                cop_meta_sent, &op->send_ctx[w], true, st)) != DC_OK) {
        pthread_mutex_lock(&op->mtx);
        op->link_in_flight--;
        op->link_pending[w]--;
        pthread_mutex_unlock(&op->mtx);
        status_prefix(st, "data link");
    }
    return code;
}

/* Whether descriptions frames with `needs` (WGROUPS_FEATURE_*) go to worker w: a link to it is
 * up already (dialing one now could hang on a peer that hangs, while the op's thread should
 * be answering its Execute with the blame) and its data port says it takes them. */
static bool
cop_link_takes(struct cop *op, uint32_t w, uint32_t needs)
{
    uint32_t features = 0;

    return op->co->wg != NULL &&
           wgroups_peer_linked(op->co->wg, op->peers[w]->address, &features) &&
           (features & needs) == needs;
}

/* The size of our tensors if they may go with our descriptions (FEATURE_EARLY), else 0: an
 * all-reduce that will be one direct exchange if every rank's tensor is as ours (else it
 * fails at the descriptions anyway), to peers that all take such frames on links up now (so
 * all of them can do a direct exchange too), in one frame. */
static size_t
cop_early_bytes(struct cop *op)
{
    const struct tensor *t0 = op->n_local > 0 ? op->local_tensors[0] : NULL;
    size_t bytes;

    if ((dc_op_kind)op->req->kind != DC_OP_ALL_REDUCE || t0 == NULL) {
        return 0;
    }
    bytes = t0->size_bytes;
    if (bytes == 0 || !cop_direct_fits(op, bytes) ||
        op->n_local * (META_ENTRY + bytes) > DLINK_CHUNK) {
        return 0;
    }
    for (size_t i = 1; i < op->n_local; i++) {
        const struct tensor *t = op->local_tensors[i];
        if (t == NULL || t->dtype != t0->dtype || t->elements != t0->elements ||
            t->size_bytes != bytes) {
            return 0;
        }
    }
    for (uint32_t w = 0; w < op->n_workers; w++) {
        if (w != op->self &&
            !cop_link_takes(op, w, WGROUPS_FEATURE_OP_META | WGROUPS_FEATURE_OP_EARLY)) {
            return 0;
        }
    }
    return bytes;
}

/* Sends this worker's descriptions to every peer: as a data link frame where its data port
 * takes them (with our tensors when cop_early_bytes says they may go), else in an Exchange
 * call. */
static bool
cop_send_metas(struct cop *op)
{
    Devcoord__V1__ExchangeRequest req = DEVCOORD__V1__EXCHANGE_REQUEST__INIT;
    size_t early                      = cop_early_bytes(op);
    size_t metas_len = op->n_local * META_ENTRY, frame_len = metas_len + op->n_local * early;
    uint8_t *buf = calloc(1, frame_len);
    dc_status st;

    for (size_t i = 0; buf != NULL && early > 0 && i < op->n_local; i++) {
        status_clear(&st);
        if (tensor_read(op->local_tensors[i], 0, buf + metas_len + i * early, early, &st) !=
            DC_OK) {
            early     = 0; /* described as it is; the data goes after the descriptions */
            frame_len = metas_len;
        }
    }
    if (buf == NULL) {
        status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory in op %s", op->id);
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &st);
        pthread_mutex_unlock(&op->mtx);
        return false;
    }
    for (size_t i = 0; i < op->n_local; i++) {
        uint8_t *e               = buf + i * META_ENTRY;
        uint32_t r               = op->local_ranks[i];
        const struct cop_meta *m = &op->metas[r];
        for (int b = 0; b < 4; b++) {
            e[b]     = (uint8_t)(r >> (8 * b));
            e[4 + b] = (uint8_t)((uint32_t)m->dtype >> (8 * b));
        }
        for (int b = 0; b < 8; b++) {
            e[8 + b] = (uint8_t)(m->elements >> (8 * b));
        }
    }
    req.op_id    = op->id;
    req.from     = op->self;
    req.step     = op->meta_step;
    req.rank     = op->local_ranks[0];
    req.features = FEATURE_DIRECT;
    op->meta_buf = buf; /* the op's from here: freed with it */
    for (uint32_t w = 0; w < op->n_workers; w++) {
        uint64_t left;
        if (w == op->self) {
            continue;
        }
        if (op->n_local * META_ENTRY <= DLINK_CHUNK &&
            cop_link_takes(op, w, WGROUPS_FEATURE_OP_META)) {
            op->early_sent[w] = early > 0;
            if (cop_send_meta_frame(op, w, early > 0 ? frame_len : metas_len,
                                    early > 0 ? FEATURE_DIRECT | FEATURE_EARLY : FEATURE_DIRECT,
                                    &st) != DC_OK) {
                pthread_mutex_lock(&op->mtx);
                cop_fail_locked(op, &st);
                pthread_mutex_unlock(&op->mtx);
                return false;
            }
            continue;
        }
        pthread_mutex_lock(&op->mtx);
        op->sends_in_flight++;
        pthread_mutex_unlock(&op->mtx);
        left = rpc_ms_until(op->deadline_ms);
        left = left > 0 ? left : 1;
        if (rpc_call_async(op->peers[w]->client, WORKER_SVC, M_WORKER_EXCHANGE, &req.base, buf,
                           op->n_local * META_ENTRY, (uint32_t)left, cop_sent, &op->send_ctx[w],
                           &st) != DC_OK) {
            pthread_mutex_lock(&op->mtx);
            op->sends_in_flight--;
            cop_fail_locked(op, &st);
            pthread_mutex_unlock(&op->mtx);
            return false;
        }
    }
    return true;
}

/* Applies the descriptions that came before the op was ready (parked with the data). */
static void
cop_take_parked_metas(struct cop *op)
{
    struct parked *metas = NULL, **pp;

    pthread_mutex_lock(&op->co->mtx);
    pthread_mutex_lock(&op->mtx);
    for (pp = &op->parked; *pp != NULL;) {
        struct parked *p = *pp;
        if (p->in->step == op->meta_step) {
            *pp     = p->next;
            p->next = metas;
            metas   = p;
        } else {
            pp = &p->next;
        }
    }
    pthread_mutex_unlock(&op->mtx);
    pthread_mutex_unlock(&op->co->mtx);
    while (metas != NULL) {
        struct parked *p = metas;
        metas            = p->next;
        cop_take(op, p);
        free(p);
    }
}

/* Waits for every peer's descriptions. */
static bool
cop_wait_metas(struct cop *op)
{
    char waiting[200];
    bool ok;

    pthread_mutex_lock(&op->mtx);
    while (!op->failed && op->metas_received < op->n_ranks - op->n_local) {
        uint32_t who = 0;
        for (uint32_t r = 0; r < op->n_ranks; r++) {
            if (!op->metas[r].known) {
                who = op->worker_of[r];
                break;
            }
        }
        snprintf(waiting, sizeof(waiting), "worker %.64s did not describe its tensors for op %.64s",
                 op->req->plan->workers[who]->name, op->id);
        if (!cop_wait_locked(op, waiting, BLAME_SENDER, who)) {
            break;
        }
    }
    ok = !op->failed;
    pthread_mutex_unlock(&op->mtx);
    return ok;
}

/* The verdict every worker reaches alike from the same descriptions: the op may go on only
 * when every device has the tensor, with the dtype and element count of rank 0's. */
static dc_code
cop_check_metas(struct cop *op, dc_status *st)
{
    const struct cop_meta *ref = &op->metas[0];
    char a[DC_DEVICE_TEXT_SIZE], b[DC_DEVICE_TEXT_SIZE];

    for (uint32_t r = 0; r < op->n_ranks; r++) {
        if (op->metas[r].dtype == DC_DTYPE_NONE) {
            cop_device_name(op, r, a, sizeof(a));
            status_set(st, DC_FAILED_PRECONDITION, "no tensor '%s' on %s", op->req->tensor, a);
            status_set_worker(st, op->devices[r].worker);
            return DC_FAILED_PRECONDITION;
        }
    }
    for (uint32_t r = 1; r < op->n_ranks; r++) {
        if (op->metas[r].dtype != ref->dtype || op->metas[r].elements != ref->elements) {
            cop_device_name(op, r, a, sizeof(a));
            cop_device_name(op, 0, b, sizeof(b));
            status_set(st, DC_FAILED_PRECONDITION,
                       "tensor '%s' on %s is %s with %llu elements, but on %s it is %s with %llu "
                       "elements",
                       op->req->tensor, a, dc_dtype_name(op->metas[r].dtype),
                       (unsigned long long)op->metas[r].elements, b, dc_dtype_name(ref->dtype),
                       (unsigned long long)ref->elements);
            status_set_worker(st, op->devices[r].worker);
            return DC_FAILED_PRECONDITION;
        }
    }
    op->dtype        = ref->dtype;
    op->elements     = ref->elements;
    op->elem_size    = dc_dtype_size(op->dtype);
    op->tensor_bytes = op->local_tensors[0]->size_bytes;
    return DC_OK;
}

/* Index of the local rank r in op->local_ranks. */
static size_t
cop_local_index(const struct cop *op, uint32_t r)
{
    for (size_t i = 0; i < op->n_local; i++) {
        if (op->local_ranks[i] == r) {
            return i;
        }
    }
    return 0;
}

/* What each step expects to receive. */
static void
cop_plan_steps(struct cop *op)
{
    dc_op_kind kind      = (dc_op_kind)op->req->kind;
    uint32_t root_worker = op->worker_of[op->req->root], seg;
    uint8_t *base;
    size_t start, end;
    enum apply_mode mode;

    if (cop_is_ring(op)) {
        for (uint32_t s = 0; s < ring_steps(&op->ring); s++) {
            switch (ring_recv(&op->ring, op->self, s, &seg)) {
            case RING_RECV_REDUCE:
            case RING_RECV_COPY:
                cop_segment(op, seg, &start, &end);
                op->step_expected[s] = end - start;
                break;
            case RING_RECV_FAN_IN:
                op->fan_in_step = s;
                for (uint32_t w = 0; w < op->n_workers; w++) {
                    if (cop_step_target(op, s, w, 0, &base, &start, &end, &mode)) {
                        op->fan_in_expected[w] = end - start;
                        op->step_expected[s] += end - start;
                    }
                }
                break;
            case RING_RECV_NONE:
                break;
            }
        }
    } else if (kind == DC_OP_ALL_GATHER || op->direct) {
        op->fan_in_step      = 0;
        op->step_expected[0] = (uint64_t)(op->n_ranks - op->n_local) * op->tensor_bytes;
        for (uint32_t r = 0; r < op->n_ranks; r++) {
            if (op->worker_of[r] != op->self) {
                op->fan_in_expected[op->worker_of[r]] += op->tensor_bytes;
            }
        }
    } else if (kind == DC_OP_BROADCAST && op->self != root_worker) {
        op->fan_in_step                  = 0;
        op->step_expected[0]             = op->tensor_bytes;
        op->fan_in_expected[root_worker] = op->tensor_bytes;
    }
}

/* A new staging tensor for the op's result `name` on local device i, shaped like shape[ndim]
 * of the op's dtype; its contents are undefined until written. */
static dc_code
cop_output_add(struct cop *op, size_t i, const char *name, const uint64_t *shape, size_t ndim,
               dc_status *st)
{
    struct staging_output *out = &op->outputs[op->n_outputs];
    dc_code code;

    if ((code = executor_create(op->co->ex, &op->devices[op->local_ranks[i]].device, op->dtype,
                                shape, ndim, &out->tensor, st)) != DC_OK) {
        return code;
    }
    out->device = op->devices[op->local_ranks[i]].device;
    snprintf(out->name, sizeof(out->name), "%s", name);
    op->n_outputs++;
    return DC_OK;
}

/* Staging tensors for `name` on every local device, each shaped as that device's tensor
 * (the same dtype and element count everywhere, the shape may differ); local index `skip`
 * gets none (SIZE_MAX: none skipped). */
static dc_code
cop_outputs_like_inputs(struct cop *op, size_t skip, dc_status *st)
{
    dc_code code = DC_OK;

    for (size_t i = 0; i < op->n_local && code == DC_OK; i++) {
        if (i != skip) {
            const struct tensor *t = op->local_tensors[i];
            code                   = cop_output_add(op, i, op->req->tensor, t->shape, t->ndim, st);
        }
    }
    return code;
}

/* Maps t as the op's work buffer. */
static dc_code
cop_map_work(struct cop *op, struct tensor *t, enum tensor_access access, dc_status *st)
{
    dc_code code = tensor_map(t, 0, op->tensor_bytes, access, &op->work_map, st);

    if (code == DC_OK) {
        op->work        = op->work_map.data;
        op->work_mapped = true;
    }
    return code;
}

/* Reduces local tensor i into the work buffer. */
static dc_code
cop_reduce_local(struct cop *op, size_t i, dc_status *st)
{
    struct tensor_map in;
    dc_code code;

    if ((code = tensor_map(op->local_tensors[i], 0, op->tensor_bytes, TENSOR_READ, &in, st)) !=
        DC_OK) {
        return code;
    }
    reduce_into(op->dtype, (dc_reduce_op)op->req->reduce, op->work, in.data, op->elements);
    return tensor_unmap(&in, st);
}

/* Allocates gathered (every rank's tensor, in rank order) and puts the local ranks' in. */
static dc_code
cop_gather_local(struct cop *op, dc_status *st)
{
    dc_code code = DC_OK;

    if (op->tensor_bytes != 0 && op->n_ranks > SIZE_MAX / op->tensor_bytes) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "all-gather output too large");
    }
    if ((op->gathered = malloc((size_t)op->n_ranks * op->tensor_bytes + 1)) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory for op %s", op->id);
    }
    for (size_t i = 0; i < op->n_local && code == DC_OK; i++) {
        code = tensor_read(op->local_tensors[i], 0,
                           op->gathered + (size_t)op->local_ranks[i] * op->tensor_bytes,
                           op->tensor_bytes, st);
    }
    return code;
}

/* Whether an all-reduce's ring can read this worker's only rank in place (op->in): its
 * reduce-scatter reduces each segment but this worker's own once and its all-gather copies
 * every segment but the one it finished (ring.h), so every byte of work is written by the
 * ring and none needs the input first. Not with one worker (no ring) or several local ranks
 * (their sum is made in work before data moves). */
static bool
cop_ring_in_place(const struct cop *op)
{
    return (dc_op_kind)op->req->kind == DC_OP_ALL_REDUCE && !op->direct && op->n_workers > 1 &&
           op->n_local == 1 && op->tensor_bytes > 0;
}

/* Everything before data moves: tensors, buffers, the local part of the reduction. No
 * stored tensor is written: results go to the op's staging tensors. */
static dc_code
cop_prepare(struct cop *op, dc_status *st)
{
    dc_op_kind kind = (dc_op_kind)op->req->kind;
    dc_code code    = DC_OK;

    switch (kind) {
    case DC_OP_ALL_REDUCE:
        /* On the first staging tensor, starting from the first local tensor; the other
         * staging tensors get the result at the end. */
        if ((code = cop_outputs_like_inputs(op, SIZE_MAX, st)) != DC_OK ||
            (code = cop_map_work(op, op->outputs[0].tensor, TENSOR_WRITE, st)) != DC_OK) {
            return code;
        }
        /* Every worker decides alike: from the same descriptions and the same features. */
        op->direct = op->peers_direct && cop_direct_fits(op, op->tensor_bytes);
        if (op->direct) {
            /* Every rank's tensor in gathered, reduced in rank order at the end. */
            code = cop_gather_local(op, st);
            break;
        }
        if (cop_ring_in_place(op)) {
            if ((code = tensor_map(op->local_tensors[0], 0, op->tensor_bytes, TENSOR_READ,
                                   &op->in_map, st)) != DC_OK) {
                return code;
            }
            op->in            = op->in_map.data;
            op->read_in_place = true;
            break;
        }
        if ((code = tensor_read(op->local_tensors[0], 0, op->work, op->tensor_bytes, st)) !=
            DC_OK) {
            return code;
        }
        for (size_t i = 1; i < op->n_local && code == DC_OK; i++) {
            code = cop_reduce_local(op, i, st);
        }
        break;
    case DC_OP_REDUCE:
        /* Only the root changes: work on a copy. */
        if ((op->work = malloc(op->tensor_bytes ? op->tensor_bytes : 1)) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory for op %s", op->id);
        }
        op->work_owned = true;
        code           = tensor_read(op->local_tensors[0], 0, op->work, op->tensor_bytes, st);
        for (size_t i = 1; i < op->n_local && code == DC_OK; i++) {
            code = cop_reduce_local(op, i, st);
        }
        break;
    case DC_OP_BROADCAST:
        /* The root's worker sends from the root's tensor, which does not change; the others
         * receive into their first staging tensor and copy it to the rest at the end. */
        if (op->self == op->worker_of[op->req->root]) {
            code = cop_map_work(op, op->local_tensors[cop_local_index(op, op->req->root)],
                                TENSOR_READ, st);
        } else if ((code = cop_outputs_like_inputs(op, SIZE_MAX, st)) == DC_OK) {
            code = cop_map_work(op, op->outputs[0].tensor, TENSOR_WRITE, st);
        }
        break;
    case DC_OP_ALL_GATHER:
        code = cop_gather_local(op, st);
        break;
    default:
        return DC_OK;
    }
    if (code == DC_OK) {
        cop_plan_steps(op);
    }
    return code;
}

/* Writes the work buffer to every staging tensor but the one it maps. */
static dc_code
cop_write_outputs(struct cop *op, dc_status *st)
{
    dc_code code = DC_OK;

    for (size_t i = 0; i < op->n_outputs && code == DC_OK; i++) {
        if (!op->work_mapped || op->outputs[i].tensor != op->work_map.tensor) {
            code = tensor_write(op->outputs[i].tensor, 0, op->work, op->tensor_bytes, st);
        }
    }
    return code;
}

/* Puts the results in the staging tensors (the mapped work buffer gets to its own when it is
 * unmapped, cop_release_work). */
static dc_code
cop_finish(struct cop *op, dc_status *st)
{
    dc_op_kind kind = (dc_op_kind)op->req->kind;
    bool mean       = (dc_reduce_op)op->req->reduce == DC_REDUCE_MEAN;
    dc_code code;

    switch (kind) {
    case DC_OP_ALL_REDUCE:
        if (op->direct) {
            /* Rank order on every worker: the same result everywhere, bit for bit. */
            memcpy(op->work, op->gathered, op->tensor_bytes);
            for (uint32_t r = 1; r < op->n_ranks; r++) {
                reduce_into(op->dtype, (dc_reduce_op)op->req->reduce, op->work,
                            op->gathered + (size_t)r * op->tensor_bytes, op->elements);
            }
        }
        if (mean) {
            reduce_finish_mean(op->dtype, op->work, op->elements, op->n_ranks);
        }
        return cop_write_outputs(op, st);
    case DC_OP_REDUCE: {
        size_t root = cop_local_index(op, op->req->root);
        if (op->self != op->worker_of[op->req->root]) {
            return DC_OK;
        }
        if (mean) {
            reduce_finish_mean(op->dtype, op->work, op->elements, op->n_ranks);
        }
        if ((code = cop_output_add(op, root, op->req->tensor, op->local_tensors[root]->shape,
                                   op->local_tensors[root]->ndim, st)) != DC_OK) {
            return code;
        }
        return cop_write_outputs(op, st);
    }
    case DC_OP_BROADCAST:
        if (op->self == op->worker_of[op->req->root] &&
            (code = cop_outputs_like_inputs(op, cop_local_index(op, op->req->root), st)) != DC_OK) {
            return code;
        }
        return cop_write_outputs(op, st);
    case DC_OP_ALL_GATHER: {
        uint64_t shape[DC_TENSOR_MAX_DIMS];
        const struct tensor *t0 = op->local_tensors[0];

        if (t0->ndim + 1 > DC_TENSOR_MAX_DIMS) {
            return status_set(st, DC_INVALID_ARGUMENT,
                              "all-gather of a %zu-dimensional tensor exceeds %d dimensions",
                              t0->ndim, DC_TENSOR_MAX_DIMS);
        }
        shape[0] = op->n_ranks;
        memcpy(shape + 1, t0->shape, t0->ndim * sizeof(*shape));
        for (size_t i = 0; i < op->n_local; i++) {
            if ((code = cop_output_add(op, i, op->req->output_tensor, shape, t0->ndim + 1, st)) !=
                    DC_OK ||
                (code = tensor_write(op->outputs[op->n_outputs - 1].tensor, 0, op->gathered,
                                     (size_t)op->n_ranks * op->tensor_bytes, st)) != DC_OK) {
                return code;
            }
        }
        return DC_OK;
    }
    default:
        return DC_OK;
    }
}

/* Hands the mapped work buffer back to the executor: from here the tensor holds what the op
 * wrote to it (a device executor copies it back now). Only once no handler can touch it. */
static dc_code
cop_release_work(struct cop *op, dc_status *st)
{
    dc_code code = DC_OK;

    if (op->in != NULL) {
        op->in = NULL;
        code   = tensor_unmap(&op->in_map, st);
    }
    if (!op->work_mapped) {
        return code;
    }
    op->work_mapped = false;
    op->work        = NULL;
    if (code != DC_OK) {
        dc_status ignored;
        (void)tensor_unmap(&op->work_map, &ignored);
        return code;
    }
    return tensor_unmap(&op->work_map, st);
}

static void
cop_free(struct cop *op)
{
    for (size_t i = 0; op->local_tensors != NULL && i < op->n_local; i++) {
        tensor_release(op->local_tensors[i]);
    }
    if (op->work_owned) {
        free(op->work);
    }
    for (size_t i = 0; i < op->n_outputs; i++) {
        tensor_release(op->outputs[i].tensor);
    }
    free(op->outputs);
    free(op->gathered);
    free(op->local_tensors);
    free(op->local_ranks);
    free(op->devices);
    free(op->worker_of);
    free(op->peers);
    free(op->step_expected);
    free(op->step_received);
    for (size_t i = 0; op->step_have != NULL && i < op->n_steps; i++) {
        ranges_free(&op->step_have[i]);
    }
    free(op->step_have);
    free(op->fan_in_expected);
    free(op->fan_in_received);
    free(op->bytes_from);
    for (size_t i = 0; op->step_forward != NULL && i < op->n_steps; i++) {
        free(op->step_forward[i].v);
    }
    free(op->step_forward);
    free(op->step_sent);
    free(op->metas);
    free(op->send_ctx);
    free(op->link);
    free(op->meta_buf);
    free(op->link_pending);
    for (uint32_t w = 0; op->early != NULL && w < op->n_workers; w++) {
        free(op->early[w]);
    }
    free(op->early);
    free(op->early_len);
    free(op->early_sent);
    pthread_cond_destroy(&op->cv);
    pthread_mutex_destroy(&op->mtx);
    free(op);
}

_Static_assert(OP_ID_MAX <= OUTCOME_ID_MAX, "the staging keeps whole op ids");

/* Hands the op's results to the staging, to be published by Commit. */
static dc_code
cop_hold(struct cop *op, dc_status *st)
{
    dc_device *devices = calloc(op->n_local, sizeof(*devices));
    struct staging_op held;
    dc_code code;

    if (devices == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory for op %s", op->id);
    }
    for (size_t i = 0; i < op->n_local; i++) {
        devices[i] = op->devices[op->local_ranks[i]].device;
    }
    held = (struct staging_op){ .op_id      = op->id,
                                .key        = op->req->idempotency_key,
                                .hash       = op->req->request_hash,
                                .devices    = devices,
                                .n_devices  = op->n_local,
                                .outputs    = op->outputs,
                                .n_outputs  = op->n_outputs,
                                .expires_ms = op->hold_until_ms };
    if ((code = staging_hold(op->co->staging, &held, st)) == DC_OK) {
        op->n_outputs = 0; /* the staging has the references now */
    }
    free(devices);
    return code;
}

static void
cop_run(void *arg)
{
    struct cop *op                    = arg;
    struct collectives *co            = op->co;
    Devcoord__V1__ExecuteResponse out = DEVCOORD__V1__EXECUTE_RESPONSE__INIT;
    struct parked *parked;
    dc_status st;
    bool ok = true, free_op;

    status_clear(&st);
    /* Nothing is touched until every worker knows every device's tensor: then all of them
     * reach the same verdict, and a refused op changes no tensor anywhere. */
    if (!cop_failed(op) && (dc_op_kind)op->req->kind != DC_OP_BARRIER) {
        cop_local_metas(op);
        cop_take_parked_metas(op);
        if ((op->n_workers == 1 || (cop_send_metas(op) && cop_wait_metas(op))) &&
            (cop_check_metas(op, &st) != DC_OK || cop_prepare(op, &st) != DC_OK ||
             cop_take_early(op, &st) != DC_OK)) {
            pthread_mutex_lock(&op->mtx);
            cop_fail_locked(op, &st);
            pthread_mutex_unlock(&op->mtx);
        }
    }
    if (!cop_failed(op) && op->n_workers > 1 && (dc_op_kind)op->req->kind != DC_OP_BARRIER) {
        cop_choose_links(op);
    }
    /* Data may flow now: take what arrived early. */
    pthread_mutex_lock(&co->mtx);
    pthread_mutex_lock(&op->mtx);
    op->phase = PHASE_READY;
    pthread_cond_broadcast(&op->cv); /* data link frames wait for it (cop_link_frame) */
    parked     = op->parked;
    op->parked = NULL;
    pthread_mutex_unlock(&op->mtx);
    pthread_mutex_unlock(&co->mtx);
    while (parked != NULL) {
        struct parked *p = parked;
        parked           = p->next;
        if (cop_failed(op)) {
            answer_exchange(p, DC_ABORTED, "op failed on the receiving worker");
        } else {
            cop_take(op, p);
        }
        free(p);
    }
    if (!cop_failed(op) && op->n_workers > 1) {
        switch ((dc_op_kind)op->req->kind) {
        case DC_OP_ALL_REDUCE:
        case DC_OP_REDUCE:
            ok = op->direct ? cop_all_gather(op) : cop_ring(op);
            break;
        case DC_OP_BROADCAST:
            ok = cop_broadcast(op);
            break;
        case DC_OP_ALL_GATHER:
            ok = cop_all_gather(op);
            break;
        default:
            break;
        }
    }
    /* No waiting for the last acknowledgements: what we sent in Exchange calls was copied into
     * their messages, and a peer that does not get it fails the op on its own. The op object
     * stays until its last send is answered (cop_sent frees it). What went to the data link
     * is sent from the op's memory: it must be written before that memory changes (a mean's
     * division, the end of the op). */
    cop_wait_links(op);
    pthread_mutex_lock(&op->mtx);
    ok = ok && !op->failed;
    pthread_mutex_unlock(&op->mtx);
    if (ok && cop_finish(op, &st) != DC_OK) {
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &st);
        pthread_mutex_unlock(&op->mtx);
        ok = false;
    }

    /* Leave the table, wait for handlers still applying data, release the work buffer,
     * answer, go. */
    pthread_mutex_lock(&co->mtx);
    for (struct cop **pp = &co->ops; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == op) {
            *pp = op->next;
            break;
        }
    }
    recent_add(co, op->id);
    pthread_mutex_lock(&op->mtx);
    op->phase = PHASE_DONE;
    pthread_cond_broadcast(&op->cv);
    parked     = op->parked;
    op->parked = NULL;
    pthread_mutex_unlock(&op->mtx);
    while (op->refs > 1) {
        pthread_cond_wait(&co->cv, &co->mtx);
    }
    pthread_mutex_unlock(&co->mtx);
    /* A handler may have failed the op since ok was read (data past what a step expects,
     * landing while cop_finish ran): it is not prepared then. */
    pthread_mutex_lock(&op->mtx);
    ok = ok && !op->failed;
    pthread_mutex_unlock(&op->mtx);
    /* No handler touches the work buffer any more: the tensor may have it back. */
    if (cop_release_work(op, &st) != DC_OK && ok) {
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &st);
        pthread_mutex_unlock(&op->mtx);
        ok = false;
    }
    /* Prepared: the results wait in the staging for Commit (a barrier has none to wait). */
    if (ok && (dc_op_kind)op->req->kind != DC_OP_BARRIER && cop_hold(op, &st) != DC_OK) {
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &st);
        pthread_mutex_unlock(&op->mtx);
        ok = false;
    }
    pthread_mutex_lock(&co->mtx);
    if (ok) {
        co->stats.ops_done++;
    } else {
        co->stats.ops_failed++;
    }
    co->stats.bytes_sent += op->bytes_sent;
    co->stats.bytes_received += op->bytes_received;
    co->stats.link_bytes_sent += op->link_bytes_sent;
    co->stats.link_bytes_received += op->link_bytes_received;
    co->stats.link_bytes_placed += op->link_bytes_placed;
    co->stats.link_bytes_forwarded += op->link_bytes_forwarded;
    co->stats.ops_direct += op->direct ? 1 : 0;
    co->stats.ops_early += op->direct && cop_sent_early(op) ? 1 : 0;
    co->stats.ops_ring_in_place += op->read_in_place ? 1 : 0;
    pthread_mutex_unlock(&co->mtx);
    while (parked != NULL) {
        struct parked *p = parked;
        parked           = p->next;
        answer_exchange(p, DC_ABORTED, "op ended on the receiving worker");
        free(p);
    }

    out.elapsed_us = rpc_now_us() - op->started_us;
    out.bytes_sent = op->bytes_sent;
    if (!ok) {
        *rpc_call_status(op->cd) = op->failure;
        log_info("op %s failed: %s: %s", op->id, dc_status_name(op->failure.code),
                 op->failure.message);
    }
    /* Sends still out fail quietly from here: answering frees the request they would name. */
    pthread_mutex_lock(&op->mtx);
    op->answering = true;
    pthread_mutex_unlock(&op->mtx);
    op->closure(&out, op->cd);
    pthread_mutex_lock(&op->mtx);
    op->thread_done = true;
    free_op         = op->sends_in_flight == 0;
    pthread_mutex_unlock(&op->mtx);
    if (free_op) {
        cop_free(op);
    }

    pthread_mutex_lock(&co->mtx);
    co->threads--;
    pthread_cond_broadcast(&co->cv);
    pthread_mutex_unlock(&co->mtx);
}

/* Checks an Execute request against itself and this worker, and builds the op. */
static dc_code
cop_new(struct collectives *co, const Devcoord__V1__ExecuteRequest *in, struct cop **out,
        dc_status *st)
{
    const Devcoord__V1__Plan *plan = in->plan;
    uint64_t epoch                 = membership_epoch(co->m);
    uint32_t timeout_ms            = in->timeout_ms ? in->timeout_ms : EXECUTE_DEFAULT_TIMEOUT_MS;
    uint64_t hold_ms;
    struct cop *op;
    dc_code code = DC_INVALID_ARGUMENT;

    *out = NULL;
    if (plan == NULL || plan->n_workers == 0 || plan->n_workers > PLAN_MAX_WORKERS ||
        plan->n_devices == 0 || plan->n_devices > PLAN_MAX_DEVICES || in->self >= plan->n_workers) {
        return status_set(st, DC_INVALID_ARGUMENT, "execute: malformed plan");
    }
    if (strlen(in->op_id) == 0 || strlen(in->op_id) > OP_ID_MAX ||
        (strlen(in->tensor) == 0 && in->kind != DEVCOORD__V1__OP_KIND__OP_BARRIER) ||
        strlen(in->tensor) > TENSOR_NAME_MAX || strlen(in->output_tensor) > TENSOR_NAME_MAX) {
        return status_set(st, DC_INVALID_ARGUMENT, "execute: bad op id or tensor name");
    }
    if (validate_idempotency_key(in->idempotency_key, st) != DC_OK) {
        status_prefix(st, "execute");
        return DC_INVALID_ARGUMENT;
    }
    if (in->hold_ms == 0 && in->kind != DEVCOORD__V1__OP_KIND__OP_BARRIER) {
        /* Its results would be staged for a Commit that never comes, and the op answered OK. */
        return status_set(st, DC_FAILED_PRECONDITION,
                          "execute: no hold_ms: this worker publishes results only on Commit, "
                          "which the coordinator does not send (upgrade the coordinator first)");
    }
    if (dc_op_kind_name((dc_op_kind)in->kind) == NULL ||
        ((in->kind == DEVCOORD__V1__OP_KIND__OP_ALL_REDUCE ||
          in->kind == DEVCOORD__V1__OP_KIND__OP_REDUCE) &&
         dc_reduce_op_name((dc_reduce_op)in->reduce) == NULL) ||
        in->root >= plan->n_devices ||
        (in->kind == DEVCOORD__V1__OP_KIND__OP_ALL_GATHER && strlen(in->output_tensor) == 0)) {
        return status_set(st, DC_INVALID_ARGUMENT, "execute: invalid operation");
    }
    if (strcmp(plan->workers[in->self]->name, co->cfg->name) != 0) {
        return status_set(st, DC_FAILED_PRECONDITION, "execute: plan is for worker %.64s, not %s",
                          plan->workers[in->self]->name, co->cfg->name);
    }
    if (in->epoch != epoch) {
        return status_set(st, DC_FAILED_PRECONDITION,
                          "execute: stale epoch %llu (this worker is at epoch %llu)",
                          (unsigned long long)in->epoch, (unsigned long long)epoch);
    }
    if ((op = calloc(1, sizeof(*op))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&op->mtx, NULL);
    clock_cond_init(&op->cv);
    op->co           = co;
    op->req          = in;
    op->self         = in->self;
    op->n_workers    = (uint32_t)plan->n_workers;
    op->n_ranks      = (uint32_t)plan->n_devices;
    op->fan_in_step  = SIZE_MAX;
    op->peers_direct = true;
    op->started_us   = rpc_now_us();
    op->deadline_ms  = rpc_now_ms() + timeout_ms;
    /* Held at most twice the op's time and a minute, whatever the request asks. */
    hold_ms = in->hold_ms;
    if (hold_ms == 0 || hold_ms > 2 * (uint64_t)timeout_ms + HOLD_MAX_EXTRA_MS) {
        hold_ms = 2 * (uint64_t)timeout_ms + HOLD_MAX_EXTRA_MS;
    }
    op->hold_until_ms = rpc_now_ms() + hold_ms;
    snprintf(op->id, sizeof(op->id), "%s", in->op_id);
    op->hash = dlink_group_hash(op->id);
    /* Steps 0..2W-1 may carry data (ring_steps); step 2W carries the tensor descriptions. */
    op->n_steps         = 2 * (size_t)op->n_workers + 1;
    op->meta_step       = 2 * op->n_workers;
    op->devices         = calloc(op->n_ranks, sizeof(*op->devices));
    op->worker_of       = calloc(op->n_ranks, sizeof(*op->worker_of));
    op->peers           = calloc(op->n_workers, sizeof(*op->peers));
    op->step_expected   = calloc(op->n_steps, sizeof(*op->step_expected));
    op->step_received   = calloc(op->n_steps, sizeof(*op->step_received));
    op->step_have       = calloc(op->n_steps, sizeof(*op->step_have));
    op->fan_in_expected = calloc(op->n_workers, sizeof(*op->fan_in_expected));
    op->fan_in_received = calloc(op->n_workers, sizeof(*op->fan_in_received));
    op->bytes_from      = calloc(op->n_workers, sizeof(*op->bytes_from));
    op->local_ranks     = calloc(op->n_ranks, sizeof(*op->local_ranks));
    op->step_forward    = calloc(op->n_steps, sizeof(*op->step_forward));
    op->step_sent       = calloc(op->n_steps, sizeof(*op->step_sent));
    op->metas           = calloc(op->n_ranks, sizeof(*op->metas));
    op->send_ctx        = calloc(op->n_workers, sizeof(*op->send_ctx));
    op->link            = calloc(op->n_workers, sizeof(*op->link));
    op->link_pending    = calloc(op->n_workers, sizeof(*op->link_pending));
    op->early           = calloc(op->n_workers, sizeof(*op->early));
    op->early_len       = calloc(op->n_workers, sizeof(*op->early_len));
    op->early_sent      = calloc(op->n_workers, sizeof(*op->early_sent));
    op->local_tensors   = calloc(op->n_ranks, sizeof(*op->local_tensors));
    if (op->devices == NULL || op->worker_of == NULL || op->peers == NULL ||
        op->step_expected == NULL || op->bytes_from == NULL || op->step_received == NULL ||
        op->step_have == NULL || op->fan_in_expected == NULL || op->fan_in_received == NULL ||
        op->local_ranks == NULL || op->local_tensors == NULL || op->step_forward == NULL ||
        op->step_sent == NULL || op->metas == NULL || op->send_ctx == NULL || op->link == NULL ||
        op->link_pending == NULL || op->early == NULL || op->early_len == NULL ||
        op->early_sent == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < op->n_steps; i++) {
        /* Chunks in order make one range per sender, Exchange calls in flight a few more;
         * in gathered, a sender's ranks may lie apart (rank order is the request's). */
        op->step_have[i].max =
            STEP_PIECES_MAX + STEP_PIECES_PER_WORKER * (size_t)op->n_workers + op->n_ranks;
    }
    for (uint32_t r = 0; r < op->n_ranks; r++) {
        if (device_ref_from_pb(plan->devices[r], &op->devices[r], st) != DC_OK) {
            status_prefix(st, "execute: plan device");
            goto fail;
        }
        op->worker_of[r] = UINT32_MAX;
    }
    for (uint32_t w = 0; w < op->n_workers; w++) {
        const Devcoord__V1__PlanWorker *pw = plan->workers[w];
        op->send_ctx[w]                    = (struct cop_send_ctx){ op, w };
        for (size_t i = 0; i < pw->n_ranks; i++) {
            uint32_t r = pw->ranks[i];
            if (r >= op->n_ranks || op->worker_of[r] != UINT32_MAX ||
                strcmp(op->devices[r].worker, pw->name) != 0) {
                code = status_set(st, DC_INVALID_ARGUMENT, "execute: plan ranks inconsistent");
                goto fail;
            }
            op->worker_of[r] = w;
            if (w == op->self) {
                op->local_ranks[op->n_local++] = r;
            }
        }
        if (w != op->self && (op->peers[w] = peer_get(co, pw->address, st)) == NULL) {
            code = st->code;
            goto fail;
        }
    }
    for (uint32_t r = 0; r < op->n_ranks; r++) {
        if (op->worker_of[r] == UINT32_MAX) {
            code = status_set(st, DC_INVALID_ARGUMENT, "execute: rank %u has no worker", r);
            goto fail;
        }
    }
    if (op->n_local == 0) {
        code = status_set(st, DC_INVALID_ARGUMENT, "execute: no device of this worker in the plan");
        goto fail;
    }
    if ((op->outputs = calloc(op->n_local, sizeof(*op->outputs))) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    op->ring = (struct ring){ .workers     = op->n_workers,
                              .to_root     = in->kind == DEVCOORD__V1__OP_KIND__OP_REDUCE,
                              .root_worker = op->worker_of[in->root] };
    *out     = op;
    return DC_OK;
fail:
    cop_free(op);
    return code;
}

/* Answers op's Execute with the op that committed its idempotency key here, if one did, and
 * frees op; false (op untouched) when none did. A different request under the same key is
 * refused. */
static bool
cop_answer_committed(struct collectives *co, struct cop *op,
                     Devcoord__V1__ExecuteResponse_Closure closure, void *cd)
{
    Devcoord__V1__ExecuteResponse out = DEVCOORD__V1__EXECUTE_RESPONSE__INIT;
    char committed[OUTCOME_ID_MAX + 1];
    uint64_t hash;

    if (!staging_committed_key(co->staging, op->req->idempotency_key, &hash, committed,
                               sizeof(committed))) {
        return false;
    }
    if (hash != op->req->request_hash) {
        status_set(rpc_call_status(cd), DC_FAILED_PRECONDITION,
                   "idempotency key '%.128s' was used by op %s for a different request",
                   op->req->idempotency_key, committed);
        cop_free(op);
        closure(NULL, cd);
        return true;
    }
    log_info("op %s: key '%.128s' committed here as op %s; not run again", op->id,
             op->req->idempotency_key, committed);
    out.already_committed = true;
    out.committed_op_id   = committed;
    cop_free(op);
    closure(&out, cd);
    return true;
}

static void
cop_supersede(struct cop *op)
{
    dc_device *devices = calloc(op->n_local, sizeof(*devices));

    if (devices == NULL) {
        return; /* the held ops expire on their own */
    }
    for (size_t i = 0; i < op->n_local; i++) {
        devices[i] = op->devices[op->local_ranks[i]].device;
    }
    staging_supersede(op->co->staging, devices, op->n_local, op->id);
    free(devices);
}

void
collectives_execute(struct collectives *co, const Devcoord__V1__ExecuteRequest *in,
                    Devcoord__V1__ExecuteResponse_Closure closure, void *cd)
{
    struct link_orphan *early;
    struct cop *op;
    dc_status *st = rpc_call_status(cd);
    bool known;

    if (cop_new(co, in, &op, st) != DC_OK) {
        closure(NULL, cd);
        return;
    }
    op->closure = closure;
    op->cd      = cd;
    op->refs    = 1;
    /* The coordinator starts an op only once the ops before it on its devices are decided:
     * staging still held for them here was not committed and never may be. Dropped before
     * the key is looked up, so a late Commit of an earlier op cannot publish (and record its
     * key) between the two. Not by an op that runs or ended here: that is a late or repeated
     * Execute (an op the coordinator aborted may have started the next one, prepared here
     * since), refused below, and must not discard what came after it. */
    pthread_mutex_lock(&co->mtx);
    known = cop_find_locked(co, op->id) != NULL || recent_has(co, op->id);
    pthread_mutex_unlock(&co->mtx);
    if (!known) {
        cop_supersede(op);
    }
    /* An op committed here under this key runs nothing again, whatever came since (this is
     * asked before the abort record: an Abort may overtake its Execute). */
    if (in->idempotency_key[0] != '\0' && cop_answer_committed(co, op, closure, cd)) {
        return;
    }

    pthread_mutex_lock(&co->mtx);
    if (co->stopping || cop_find_locked(co, op->id) != NULL || recent_has(co, op->id)) {
        pthread_mutex_unlock(&co->mtx);
        status_set(st, DC_ABORTED, "op %s already ran, was aborted, or the worker is stopping",
                   op->id);
        cop_free(op);
        closure(NULL, cd);
        return;
    }
    /* Chunks and descriptions that came before us are ours now. */
    early = link_orphans_take_locked(co, &op->hash, 0);
    for (struct parked **pp = &co->orphans; *pp != NULL;) {
        struct parked *p = *pp;
        if (strcmp(p->in->op_id, op->id) == 0) {
            *pp        = p->next;
            p->next    = op->parked;
            op->parked = p;
            co->orphan_bytes -= p->bytes;
        } else {
            pp = &p->next;
        }
    }
    op->next = co->ops;
    co->ops  = op;
    co->threads++;
    pthread_mutex_unlock(&co->mtx);
    for (struct link_orphan *o = early; o != NULL; o = o->next) {
        dc_status bad;
        /* Checked as cop_link_frame checks a frame of a running op (its connection may be
         * gone by now: a bad one only fails the op). */
        if (cop_frame_sender_ok(op, o->peer, &o->h, &bad) != DC_OK ||
            cop_link_meta(op, &o->h, o->data, &bad) != DC_OK) {
            pthread_mutex_lock(&op->mtx);
            cop_fail_locked(op, &bad);
            pthread_mutex_unlock(&op->mtx);
        }
    }
    link_orphans_free(early);

    /* Ops wait for their peers: they run on pool threads, never here (this may be an nng
     * callback), unless this thread may wait (collectives_run_here). */
    if (run_here) {
        cop_run(op);
    } else if (!tpool_submit(co->pool, cop_run, op)) {
        dc_status fail;
        status_set(&fail, DC_RESOURCE_EXHAUSTED, "no thread for op %s", op->id);
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &fail);
        pthread_mutex_unlock(&op->mtx);
        /* The op's own code answers and cleans up; it just runs here, failing at once. */
        cop_run(op);
    }
}

void
collectives_run_here(bool may_wait)
{
    run_here = may_wait;
}

void
collectives_abort(struct collectives *co, const Devcoord__V1__AbortRequest *in,
                  Devcoord__V1__AbortResponse_Closure closure, void *cd)
{
    Devcoord__V1__AbortResponse out = DEVCOORD__V1__ABORT_RESPONSE__INIT;
    struct cop *op;

    if (strlen(in->op_id) > OP_ID_MAX) {
        /* No op has such an id; cut to fit, it would name (and abort) one that does. */
        status_set(rpc_call_status(cd), DC_INVALID_ARGUMENT, "an op id of %zu bytes (at most %d)",
                   strlen(in->op_id), OP_ID_MAX);
        closure(NULL, cd);
        return;
    }
    pthread_mutex_lock(&co->mtx);
    if ((op = cop_find_locked(co, in->op_id)) != NULL) {
        dc_status st;
        status_set(&st, DC_ABORTED, "op %.64s aborted by the coordinator: %.400s", in->op_id,
                   in->reason != NULL ? in->reason->message : "no reason given");
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &st);
        pthread_mutex_unlock(&op->mtx);
    } else if (!recent_has(co, in->op_id)) {
        recent_add(co, in->op_id); /* its Execute, if it comes late, is refused */
    }
    pthread_mutex_unlock(&co->mtx);
    /* A prepared op waiting for Commit: its staging goes, its tensors stay as they were. */
    if (staging_abort(co->staging, in->op_id)) {
        log_info("op %.64s: staging discarded (aborted by the coordinator)", in->op_id);
    }
    closure(&out, cd);
}

void
collectives_commit(struct collectives *co, const Devcoord__V1__CommitRequest *in,
                   Devcoord__V1__CommitResponse_Closure closure, void *cd)
{
    Devcoord__V1__CommitResponse out = DEVCOORD__V1__COMMIT_RESPONSE__INIT;

    if (staging_commit(co->staging, in->op_id, &out.tensors, rpc_call_status(cd)) != DC_OK) {
        log_info("op %.64s: commit refused: %s", in->op_id, rpc_call_status(cd)->message);
        closure(NULL, cd);
        return;
    }
    closure(&out, cd);
}

struct collectives *
collectives_new(const struct config_worker *cfg, const char *token, struct executor *ex,
                struct membership *m, struct wgroups *wg)
{
    struct collectives *co = calloc(1, sizeof(*co));
    struct wgroups_op_sink sink;

    if (co == NULL) {
        return NULL;
    }
    co->cfg   = cfg;
    co->token = token;
    co->ex    = ex;
    co->m     = m;
    co->wg    = wg;
    co->chunk = CHUNK_BYTES;
    if (co->chunk + RPC_FRAME_OVERHEAD > cfg->max_message_bytes) {
        co->chunk = cfg->max_message_bytes > 2 * RPC_FRAME_OVERHEAD
                        ? cfg->max_message_bytes - RPC_FRAME_OVERHEAD
                        : RPC_FRAME_OVERHEAD;
    }
    if ((co->staging = staging_new(ex)) == NULL) {
        free(co);
        return NULL;
    }
    pthread_mutex_init(&co->mtx, NULL);
    clock_cond_init(&co->cv);
    clock_cond_init(&co->reaper_cv);
    /* Threads for ops come and go with the load; an idle worker keeps none after 30 s. */
    if ((co->pool = tpool_new("dc-op", 1024, 30000)) == NULL) {
        pthread_cond_destroy(&co->cv);
        pthread_cond_destroy(&co->reaper_cv);
        pthread_mutex_destroy(&co->mtx);
        staging_free(co->staging);
        free(co);
        return NULL;
    }
    if (pthread_create(&co->reaper, NULL, collectives_reaper, co) != 0) {
        tpool_free(co->pool);
        pthread_cond_destroy(&co->cv);
        pthread_cond_destroy(&co->reaper_cv);
        pthread_mutex_destroy(&co->mtx);
        staging_free(co->staging);
        free(co);
        return NULL;
    }
    if (wg != NULL) {
        sink = (struct wgroups_op_sink){ co, cop_link_frame, cop_link_place, cop_link_landed };
        wgroups_set_op_sink(wg, &sink);
    }
    return co;
}

void
collectives_free(struct collectives *co)
{
    struct link_orphan *early;
    struct parked *orphans;

    if (co == NULL) {
        return;
    }
    pthread_mutex_lock(&co->mtx);
    co->stopping = true;
    pthread_cond_signal(&co->reaper_cv);
    for (struct cop *op = co->ops; op != NULL; op = op->next) {
        dc_status st;
        status_set(&st, DC_UNAVAILABLE, "worker %s is shutting down", co->cfg->name);
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &st);
        pthread_mutex_unlock(&op->mtx);
    }
    while (co->threads > 0) {
        pthread_cond_wait(&co->cv, &co->mtx);
    }
    orphans     = co->orphans;
    co->orphans = NULL;
    pthread_cond_broadcast(&co->cv);
    pthread_mutex_unlock(&co->mtx);
    /* No op left: frames still coming find none; once this returns none comes in at all. */
    if (co->wg != NULL) {
        wgroups_set_op_sink(co->wg, NULL);
    }
    pthread_join(co->reaper, NULL);
    tpool_free(co->pool);
    pthread_mutex_lock(&co->mtx);
    early = link_orphans_take_locked(co, NULL, UINT64_MAX);
    pthread_mutex_unlock(&co->mtx);
    link_orphans_free(early);
    while (orphans != NULL) {
        struct parked *p = orphans;
        orphans          = p->next;
        answer_exchange(p, DC_UNAVAILABLE, "worker shutting down");
        free(p);
    }
    for (size_t i = 0; i < co->n_peers; i++) {
        rpc_client_close(co->peers[i]->client);
        free(co->peers[i]);
    }
    free(co->peers);
    staging_free(co->staging);
    pthread_cond_destroy(&co->cv);
    pthread_cond_destroy(&co->reaper_cv);
    pthread_mutex_destroy(&co->mtx);
    free(co);
}

void
collectives_stats(struct collectives *co, struct collectives_stats *out)
{
    pthread_mutex_lock(&co->mtx);
    *out = co->stats;
    pthread_mutex_unlock(&co->mtx);
}
