#include "collective.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "device.h"
#include "devcoord/v1/methods.h"
#include "log.h"
#include "reduce.h"
#include "rpc.h"
#include "tpool.h"

#define WORKER_SVC (&devcoord__v1__worker__descriptor)

#define CHUNK_BYTES      (512u << 10) /* bytes per Exchange call */
#define SEND_WINDOW      8            /* Exchange calls in flight per op */
#define ORPHAN_MAX_BYTES ((size_t)256 << 20)
#define ORPHAN_MAX_MS    10000
#define RECENT_OPS       512
#define OP_ID_MAX        64
#define PLAN_MAX_WORKERS 4096
#define PLAN_MAX_DEVICES (1u << 20)

/* An Exchange call waiting for its op to start (or to be ready for data). */
struct parked {
    const Devcoord__V1__ExchangeRequest *in;
    Devcoord__V1__ExchangeResponse_Closure closure;
    void *cd;
    size_t bytes;
    uint64_t expires_ms;
    struct parked *next;
};

struct peer {
    char address[256];
    struct rpc_client *client;
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

struct ready_queue {
    struct range *v;
    size_t head, len, cap;
};

/* One op in flight on this worker. */
struct cop {
    struct collectives *co;
    char id[OP_ID_MAX + 1];
    const Devcoord__V1__ExecuteRequest *req;
    Devcoord__V1__ExecuteResponse_Closure closure;
    void *cd;
    uint64_t started_us;

    uint32_t self, W, N;
    dc_device_ref *devices; /* plan devices, rank order */
    uint32_t *owner;        /* rank -> worker index */
    size_t n_local;
    uint32_t *local_ranks;
    struct tensor **tensors; /* per local rank */
    struct peer **peers;     /* per worker index (NULL for self) */

    dc_dtype dtype;
    size_t elements, esize, bytes;
    uint8_t *buf; /* the op's data (a tensor's storage or owned) */
    bool buf_owned;
    uint8_t *gather; /* all-gather output, N * bytes */

    size_t n_steps;
    uint64_t *expected, *received;
    /* Ring ops: ranges that arrived at step s - 1 and go on at step s; bytes sent per step. */
    struct ready_queue *ready;
    uint64_t *sent;

    /* What every rank's tensor is, learned from the peers before anything is touched. */
    struct cop_meta *metas;
    uint32_t meta_step; /* the Exchange step that carries them */
    size_t metas_received;
    struct cop_send_ctx *send_ctx; /* per worker index: the callback argument of a send */
    bool answering;   /* the op's thread answers: its request (op->req) goes with the answer */
    bool thread_done; /* the op's thread has answered; the last send frees it */
    uint64_t *expected_from, *received_from; /* per worker, for the many-to-one step */
    uint64_t *data_from;                     /* per worker, every data byte it sent us */
    size_t multi_step;                       /* that step, or SIZE_MAX */

    pthread_mutex_t mtx;
    pthread_cond_t cv;
    enum cop_phase phase;
    bool failed;
    dc_status fail;
    unsigned inflight;
    uint64_t deadline_ms;
    uint64_t bytes_sent, bytes_received;
    struct parked *parked;

    int refs; /* guarded by co->mtx: the op thread and each handler applying data */
    struct cop *next;
};

struct collectives {
    const struct config_worker *cfg;
    const char *token;
    struct executor *ex;
    struct membership *m;
    size_t chunk;
    struct tpool *pool;

    pthread_mutex_t mtx;
    pthread_cond_t cv; /* an op released a reference or ended */
    struct cop *ops;
    struct parked *orphans;
    size_t orphan_bytes;
    char recent[RECENT_OPS][OP_ID_MAX + 1];
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

/* Segment i of W of the op's buffer (elements split as evenly as they go). */
static void
cop_segment(const struct cop *op, uint32_t i, size_t *start, size_t *end)
{
    *start = (size_t)((uint64_t)i * op->elements / op->W) * op->esize;
    *end   = (size_t)((uint64_t)(i + 1) * op->elements / op->W) * op->esize;
}

static uint32_t
ring_mod(int64_t v, uint32_t w)
{
    int64_t m = v % (int64_t)w;
    return (uint32_t)(m < 0 ? m + w : m);
}

/* Records the first failure; later ones are dropped. Call with op->mtx held. */
static void
cop_fail_locked(struct cop *op, const dc_status *st)
{
    if (!op->failed) {
        op->failed = true;
        op->fail   = *st;
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
    co->recent_next = (co->recent_next + 1) % RECENT_OPS;
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
 * all-reduce: steps 0..W-2 reduce-scatter (send segment self-s, receive and reduce segment
 * self-1-s), steps W-1..2W-3 all-gather (send segment self+1-s', receive segment self-s').
 * reduce: the same W-1 reduce-scatter steps, then step W-1 sends each worker's finished
 * segment self+1 to the root's worker. Whatever lands at step s is the segment sent on at
 * step s+1, so each chunk is forwarded as soon as it lands: the steps overlap. */

static bool
cop_is_ring(const struct cop *op)
{
    dc_op_kind kind = (dc_op_kind)op->req->kind;
    return kind == DC_OP_ALL_REDUCE || kind == DC_OP_REDUCE;
}

/* Where this worker sends at step s, and which segment; false when it sends nothing. */
static bool
cop_ring_out(const struct cop *op, uint32_t s, uint32_t *to, uint32_t *seg)
{
    uint32_t W = op->W, next = (op->self + 1) % W, root_worker;

    if (s + 1 < W) {
        *to  = next;
        *seg = ring_mod((int64_t)op->self - s, W);
        return true;
    }
    if ((dc_op_kind)op->req->kind == DC_OP_ALL_REDUCE) {
        if (s >= 2 * (W - 1)) {
            return false;
        }
        *to  = next;
        *seg = ring_mod((int64_t)op->self + 1 - (s - (W - 1)), W);
        return true;
    }
    root_worker = op->owner[op->req->root];
    if (s == W - 1 && op->self != root_worker) {
        *to  = root_worker;
        *seg = (op->self + 1) % W;
        return true;
    }
    return false;
}

/* Queues a range received at step s - 1 to go on at step s. op->mtx held. */
static bool
cop_ready_push(struct cop *op, uint32_t s, size_t off, size_t len)
{
    struct ready_queue *q = &op->ready[s];

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

enum apply_mode { APPLY_REDUCE, APPLY_COPY };

/* Where a chunk of `step` lands: the buffer, the byte range it must fall in and how it is
 * applied. false when this worker expects nothing at that step. */
static bool
cop_step_target(const struct cop *op, uint32_t step, uint32_t rank, uint8_t **base, size_t *start,
                size_t *end, enum apply_mode *mode)
{
    uint32_t W = op->W, rs_steps = W - 1;
    dc_op_kind kind = (dc_op_kind)op->req->kind;

    *base = op->buf;
    if ((kind == DC_OP_ALL_REDUCE || kind == DC_OP_REDUCE) && step < rs_steps) {
        cop_segment(op, ring_mod((int64_t)op->self - 1 - step, W), start, end);
        *mode = APPLY_REDUCE;
        return true;
    }
    if (kind == DC_OP_ALL_REDUCE && step < 2 * rs_steps) {
        cop_segment(op, ring_mod((int64_t)op->self - (step - rs_steps), W), start, end);
        *mode = APPLY_COPY;
        return true;
    }
    *mode = APPLY_COPY;
    if (kind == DC_OP_REDUCE && step == rs_steps) {
        *start = 0;
        *end   = op->bytes;
        return op->self == op->owner[op->req->root];
    }
    if (kind == DC_OP_BROADCAST && step == 0) {
        *start = 0;
        *end   = op->bytes;
        return op->self != op->owner[op->req->root];
    }
    if (kind == DC_OP_ALL_GATHER && step == 0 && rank < op->N && op->owner[rank] != op->self) {
        *base  = op->gather;
        *start = (size_t)rank * op->bytes;
        *end   = *start + op->bytes;
        return true;
    }
    return false;
}

/* Records a peer's tensor descriptions (a META chunk). Any phase: they are what the op
 * waits for before it touches a tensor. */
static dc_code
cop_apply_meta(struct cop *op, uint32_t from, const uint8_t *data, size_t len, dc_status *st)
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
        if (rank >= op->N || op->owner[rank] != from || op->metas[rank].known ||
            dtype >= DC_DTYPE_COUNT) {
            pthread_mutex_unlock(&op->mtx);
            return status_set(st, DC_INVALID_ARGUMENT, "malformed tensor descriptions for op %s",
                              op->id);
        }
        op->metas[rank] = (struct cop_meta){ true, (dc_dtype)dtype, elements };
        op->metas_received++;
    }
    pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mtx);
    return DC_OK;
}

/* Applies one received chunk to a ready op. Runs on a server thread, without op->mtx while
 * the bytes move: chunks of one op never overlap (see cop_step_target). */
static dc_code
cop_apply(struct cop *op, const Devcoord__V1__ExchangeRequest *in, const uint8_t *data, size_t len,
          dc_status *st)
{
    uint8_t *base;
    size_t start, end;
    enum apply_mode mode;
    uint32_t to, seg;
    char mine[DC_DEVICE_TEXT_SIZE], theirs[DC_DEVICE_TEXT_SIZE];

    if (in->from >= op->W || in->from == op->self || in->rank >= op->N ||
        op->owner[in->rank] != in->from) {
        return status_set(st, DC_INVALID_ARGUMENT, "exchange from a worker outside op %s", op->id);
    }
    if (in->step == op->meta_step) {
        return cop_apply_meta(op, in->from, data, len, st);
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
    if (in->step >= op->n_steps ||
        !cop_step_target(op, in->step, in->rank, &base, &start, &end, &mode) ||
        in->offset < start || in->offset > end || len > end - in->offset || len % op->esize != 0 ||
        in->offset % op->esize != 0) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "exchange chunk outside op %s (step %u, offset %llu, %zu bytes)", op->id,
                          in->step, (unsigned long long)in->offset, len);
    }
    if (mode == APPLY_REDUCE) {
        reduce_into(op->dtype, (dc_reduce_op)op->req->reduce, base + in->offset, data,
                    len / op->esize);
    } else {
        memcpy(base + in->offset, data, len);
    }
    pthread_mutex_lock(&op->mtx);
    op->received[in->step] += len;
    if (in->step == op->multi_step) {
        op->received_from[in->from] += len;
    }
    if (op->received[in->step] > op->expected[in->step]) {
        dc_status dup;
        status_set(&dup, DC_INVALID_ARGUMENT, "op %s received more data than expected at step %u",
                   op->id, in->step);
        cop_fail_locked(op, &dup);
    } else if (cop_is_ring(op) && in->step + 1 < op->n_steps &&
               cop_ring_out(op, in->step + 1, &to, &seg) &&
               !cop_ready_push(op, in->step + 1, in->offset, len)) {
        dc_status oom;
        status_set(&oom, DC_RESOURCE_EXHAUSTED, "out of memory in op %s", op->id);
        cop_fail_locked(op, &oom);
    }
    op->bytes_received += len;
    op->data_from[in->from] += len;
    pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mtx);
    return DC_OK;
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
    struct parked p = { .in = in, .closure = closure, .cd = cd }, *copy;
    struct cop *op;
    char message[160];

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
    /* The peer is ahead of us: hold the chunk until our Execute arrives. */
    if (co->orphan_bytes + p.bytes > ORPHAN_MAX_BYTES || (copy = malloc(sizeof(*copy))) == NULL) {
        pthread_mutex_unlock(&co->mtx);
        answer_exchange(&p, DC_RESOURCE_EXHAUSTED, "too much data waiting for ops not started");
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

    pthread_mutex_lock(&co->mtx);
    while (!co->stopping) {
        struct timespec ts;
        struct parked *expired = NULL, **pp = &co->orphans;
        uint64_t now = rpc_now_ms();

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
        while (expired != NULL) {
            struct parked *p = expired;
            char message[160];
            expired = p->next;
            snprintf(message, sizeof(message), "no op %.64s on this worker", p->in->op_id);
            answer_exchange(p, DC_NOT_FOUND, message);
            free(p);
        }
        pthread_mutex_lock(&co->mtx);
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&co->cv, &co->mtx, &ts);
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
    op->inflight--;
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
    free_op = op->thread_done && op->inflight == 0;
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
        if (blame == BLAME_SENDER && op->data_from[who] > 0) {
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
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(left / 1000);
    ts.tv_nsec += (long)(left % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&op->cv, &op->mtx, &ts);
    return true;
}

/* Sends bytes [start, end) of base to worker `to` as chunks of `step`. */
static bool
cop_send(struct cop *op, uint32_t to, uint32_t step, const uint8_t *base, size_t start, size_t end,
         uint32_t rank)
{
    Devcoord__V1__ExchangeRequest req = DEVCOORD__V1__EXCHANGE_REQUEST__INIT;
    char waiting[200];

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
        while (!op->failed && op->inflight >= SEND_WINDOW &&
               cop_wait_locked(op, waiting, BLAME_ACKS, to)) {
        }
        if (op->failed) {
            pthread_mutex_unlock(&op->mtx);
            return false;
        }
        op->inflight++;
        pthread_mutex_unlock(&op->mtx);

        left       = op->deadline_ms > rpc_now_ms() ? op->deadline_ms - rpc_now_ms() : 1;
        req.offset = off;
        if (rpc_call_async(op->peers[to]->client, WORKER_SVC, M_WORKER_EXCHANGE, &req.base,
                           base + off, len, (uint32_t)left, cop_sent, &op->send_ctx[to],
                           &st) != DC_OK) {
            pthread_mutex_lock(&op->mtx);
            op->inflight--;
            cop_fail_locked(op, &st);
            pthread_mutex_unlock(&op->mtx);
            return false;
        }
        op->bytes_sent += len;
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
    while (!op->failed && op->received[step] < op->expected[step]) {
        uint32_t from = ring_mod((int64_t)op->self - 1, op->W);
        if (step == op->multi_step || (dc_op_kind)op->req->kind == DC_OP_BROADCAST) {
            for (uint32_t w = 0; w < op->W; w++) {
                if (op->received_from[w] < op->expected_from[w]) {
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
    const char *prev = op->req->plan->workers[ring_mod((int64_t)op->self - 1, op->W)]->name;
    uint32_t to, seg;
    size_t start, end;
    char waiting[200];

    snprintf(waiting, sizeof(waiting), "worker %.64s did not send its data for op %.64s", prev,
             op->id);
    pthread_mutex_lock(&op->mtx);
    if (cop_ring_out(op, 0, &to, &seg)) {
        cop_segment(op, seg, &start, &end);
        if (end > start && !cop_ready_push(op, 0, start, end - start)) {
            pthread_mutex_unlock(&op->mtx);
            return false;
        }
    }
    for (;;) {
        struct range r;
        uint32_t s;
        bool done = true;

        for (s = 0; s < op->n_steps && op->ready[s].len == 0; s++) {
        }
        if (s == op->n_steps) {
            for (uint32_t k = 0; k < op->n_steps && done; k++) {
                if (cop_ring_out(op, k, &to, &seg)) {
                    cop_segment(op, seg, &start, &end);
                    done = op->sent[k] == end - start;
                }
            }
            if (done || op->failed) {
                break;
            }
            if (!cop_wait_locked(op, waiting, BLAME_SENDER,
                                 ring_mod((int64_t)op->self - 1, op->W))) {
                break;
            }
            continue;
        }
        r = op->ready[s].v[op->ready[s].head];
        op->ready[s].head++;
        op->ready[s].len--;
        pthread_mutex_unlock(&op->mtx);
        cop_ring_out(op, s, &to, &seg);
        if (!cop_send(op, to, s, op->buf, r.off, r.off + r.len, op->local_ranks[0])) {
            return false;
        }
        op->sent[s] += r.len;
        pthread_mutex_lock(&op->mtx);
    }
    pthread_mutex_unlock(&op->mtx);
    for (uint32_t s = 0; s < op->n_steps; s++) {
        if (op->expected[s] > 0 && !cop_wait_step(op, s)) {
            return false;
        }
    }
    return !cop_failed(op);
}

static bool
cop_broadcast(struct cop *op)
{
    uint32_t root_worker = op->owner[op->req->root];

    if (op->self != root_worker) {
        return cop_wait_step(op, 0);
    }
    for (uint32_t w = 0; w < op->W; w++) {
        if (w != op->self && !cop_send(op, w, 0, op->buf, 0, op->bytes, op->req->root)) {
            return false;
        }
    }
    return true;
}

static bool
cop_all_gather(struct cop *op)
{
    for (uint32_t w = 0; w < op->W; w++) {
        for (size_t i = 0; w != op->self && i < op->n_local; i++) {
            size_t at = (size_t)op->local_ranks[i] * op->bytes;
            if (!cop_send(op, w, 0, op->gather, at, at + op->bytes, op->local_ranks[i])) {
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
        if (ex->ops->lookup(ex, &op->devices[r].device, op->req->tensor, &op->tensors[i],
                            &ignored) != DC_OK) {
            op->tensors[i] = NULL;
            op->metas[r]   = (struct cop_meta){ true, DC_DTYPE_NONE, 0 };
        } else {
            op->metas[r] =
                (struct cop_meta){ true, op->tensors[i]->dtype, op->tensors[i]->elements };
        }
    }
}

/* Sends this worker's descriptions to every peer. */
static bool
cop_send_metas(struct cop *op)
{
    Devcoord__V1__ExchangeRequest req = DEVCOORD__V1__EXCHANGE_REQUEST__INIT;
    uint8_t *buf                      = calloc(op->n_local, META_ENTRY);
    dc_status st;

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
    req.op_id = op->id;
    req.from  = op->self;
    req.step  = op->meta_step;
    req.rank  = op->local_ranks[0];
    for (uint32_t w = 0; w < op->W; w++) {
        uint64_t left;
        if (w == op->self) {
            continue;
        }
        pthread_mutex_lock(&op->mtx);
        op->inflight++;
        pthread_mutex_unlock(&op->mtx);
        left = op->deadline_ms > rpc_now_ms() ? op->deadline_ms - rpc_now_ms() : 1;
        if (rpc_call_async(op->peers[w]->client, WORKER_SVC, M_WORKER_EXCHANGE, &req.base, buf,
                           op->n_local * META_ENTRY, (uint32_t)left, cop_sent, &op->send_ctx[w],
                           &st) != DC_OK) {
            pthread_mutex_lock(&op->mtx);
            op->inflight--;
            cop_fail_locked(op, &st);
            pthread_mutex_unlock(&op->mtx);
            free(buf);
            return false;
        }
    }
    free(buf);
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
    while (!op->failed && op->metas_received < op->N - op->n_local) {
        uint32_t who = 0;
        for (uint32_t r = 0; r < op->N; r++) {
            if (!op->metas[r].known) {
                who = op->owner[r];
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

    for (uint32_t r = 0; r < op->N; r++) {
        if (op->metas[r].dtype == DC_DTYPE_NONE) {
            cop_device_name(op, r, a, sizeof(a));
            status_set(st, DC_FAILED_PRECONDITION, "no tensor '%s' on %s", op->req->tensor, a);
            status_set_worker(st, op->devices[r].worker);
            return DC_FAILED_PRECONDITION;
        }
    }
    for (uint32_t r = 1; r < op->N; r++) {
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
    op->dtype    = ref->dtype;
    op->elements = ref->elements;
    op->esize    = dc_dtype_size(op->dtype);
    op->bytes    = op->tensors[0]->size_bytes;
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
    dc_op_kind kind = (dc_op_kind)op->req->kind;
    uint8_t *base;
    size_t start, end;
    enum apply_mode mode;

    for (uint32_t s = 0; s < op->n_steps && kind != DC_OP_ALL_GATHER; s++) {
        if (cop_step_target(op, s, 0, &base, &start, &end, &mode)) {
            op->expected[s] = end - start;
        }
    }
    if (kind == DC_OP_REDUCE && op->self == op->owner[op->req->root]) {
        size_t own_start, own_end;
        cop_segment(op, (op->self + 1) % op->W, &own_start, &own_end);
        op->multi_step = op->W - 1;
        op->expected[op->W - 1] -= own_end - own_start;
        for (uint32_t w = 0; w < op->W; w++) {
            cop_segment(op, (w + 1) % op->W, &start, &end);
            op->expected_from[w] = w == op->self ? 0 : end - start;
        }
    } else if (kind == DC_OP_ALL_GATHER) {
        op->multi_step  = 0;
        op->expected[0] = (uint64_t)(op->N - op->n_local) * op->bytes;
        for (uint32_t r = 0; r < op->N; r++) {
            if (op->owner[r] != op->self) {
                op->expected_from[op->owner[r]] += op->bytes;
            }
        }
    } else if (kind == DC_OP_BROADCAST && op->self != op->owner[op->req->root]) {
        op->multi_step                              = 0;
        op->expected_from[op->owner[op->req->root]] = op->bytes;
    }
}

/* Everything before data moves: tensors, buffers, the local part of the reduction. */
static dc_code
cop_prepare(struct cop *op, dc_status *st)
{
    dc_op_kind kind = (dc_op_kind)op->req->kind;

    if (kind == DC_OP_BARRIER) {
        return DC_OK;
    }
    switch (kind) {
    case DC_OP_ALL_REDUCE:
        op->buf = op->tensors[0]->data; /* in place: every device gets the result */
        for (size_t i = 1; i < op->n_local; i++) {
            reduce_into(op->dtype, (dc_reduce_op)op->req->reduce, op->buf, op->tensors[i]->data,
                        op->elements);
        }
        break;
    case DC_OP_REDUCE:
        /* Only the root changes: work on a copy. */
        if ((op->buf = malloc(op->bytes ? op->bytes : 1)) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory for op %s", op->id);
        }
        op->buf_owned = true;
        memcpy(op->buf, op->tensors[0]->data, op->bytes);
        for (size_t i = 1; i < op->n_local; i++) {
            reduce_into(op->dtype, (dc_reduce_op)op->req->reduce, op->buf, op->tensors[i]->data,
                        op->elements);
        }
        break;
    case DC_OP_BROADCAST:
        op->buf = op->self == op->owner[op->req->root]
                      ? op->tensors[cop_local_index(op, op->req->root)]->data
                      : op->tensors[0]->data;
        break;
    case DC_OP_ALL_GATHER:
        if (op->bytes != 0 && op->N > SIZE_MAX / op->bytes) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "all-gather output too large");
        }
        if ((op->gather = malloc((size_t)op->N * op->bytes + 1)) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory for op %s", op->id);
        }
        for (size_t i = 0; i < op->n_local; i++) {
            memcpy(op->gather + (size_t)op->local_ranks[i] * op->bytes, op->tensors[i]->data,
                   op->bytes);
        }
        break;
    default:
        break;
    }
    cop_plan_steps(op);
    return DC_OK;
}

/* Writes the results to the local devices. */
static dc_code
cop_finish(struct cop *op, dc_status *st)
{
    dc_op_kind kind     = (dc_op_kind)op->req->kind;
    struct executor *ex = op->co->ex;
    bool mean           = (dc_reduce_op)op->req->reduce == DC_REDUCE_MEAN;

    switch (kind) {
    case DC_OP_ALL_REDUCE:
        if (mean) {
            reduce_finish_mean(op->dtype, op->buf, op->elements, op->N);
        }
        for (size_t i = 1; i < op->n_local; i++) {
            memcpy(op->tensors[i]->data, op->buf, op->bytes);
        }
        break;
    case DC_OP_REDUCE:
        if (op->self == op->owner[op->req->root]) {
            if (mean) {
                reduce_finish_mean(op->dtype, op->buf, op->elements, op->N);
            }
            memcpy(op->tensors[cop_local_index(op, op->req->root)]->data, op->buf, op->bytes);
        }
        break;
    case DC_OP_BROADCAST:
        for (size_t i = 0; i < op->n_local; i++) {
            if (op->tensors[i]->data != op->buf) {
                memcpy(op->tensors[i]->data, op->buf, op->bytes);
            }
        }
        break;
    case DC_OP_ALL_GATHER: {
        uint64_t shape[DC_TENSOR_MAX_DIMS];
        const struct tensor *t0 = op->tensors[0];

        if (t0->ndim + 1 > DC_TENSOR_MAX_DIMS) {
            return status_set(st, DC_INVALID_ARGUMENT,
                              "all-gather of a %zu-dimensional tensor exceeds %d dimensions",
                              t0->ndim, DC_TENSOR_MAX_DIMS);
        }
        shape[0] = op->N;
        memcpy(shape + 1, t0->shape, t0->ndim * sizeof(*shape));
        for (size_t i = 0; i < op->n_local; i++) {
            struct tensor *out;
            dc_code code = ex->ops->create(ex, op->dtype, shape, t0->ndim + 1, &out, st);
            if (code != DC_OK) {
                return code;
            }
            memcpy(out->data, op->gather, (size_t)op->N * op->bytes);
            code = ex->ops->store(ex, &op->devices[op->local_ranks[i]].device,
                                  op->req->output_tensor, out, st);
            tensor_release(out);
            if (code != DC_OK) {
                return code;
            }
        }
        break;
    }
    default:
        break;
    }
    return DC_OK;
}

static void
cop_free(struct cop *op)
{
    for (size_t i = 0; op->tensors != NULL && i < op->n_local; i++) {
        tensor_release(op->tensors[i]);
    }
    if (op->buf_owned) {
        free(op->buf);
    }
    free(op->gather);
    free(op->tensors);
    free(op->local_ranks);
    free(op->devices);
    free(op->owner);
    free(op->peers);
    free(op->expected);
    free(op->received);
    free(op->expected_from);
    free(op->received_from);
    free(op->data_from);
    for (size_t i = 0; op->ready != NULL && i < op->n_steps; i++) {
        free(op->ready[i].v);
    }
    free(op->ready);
    free(op->sent);
    free(op->metas);
    free(op->send_ctx);
    pthread_cond_destroy(&op->cv);
    pthread_mutex_destroy(&op->mtx);
    free(op);
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
        if ((op->W == 1 || (cop_send_metas(op) && cop_wait_metas(op))) &&
            (cop_check_metas(op, &st) != DC_OK || cop_prepare(op, &st) != DC_OK)) {
            pthread_mutex_lock(&op->mtx);
            cop_fail_locked(op, &st);
            pthread_mutex_unlock(&op->mtx);
        }
    }
    /* Data may flow now: take what arrived early. */
    pthread_mutex_lock(&co->mtx);
    pthread_mutex_lock(&op->mtx);
    op->phase  = PHASE_READY;
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
    if (!cop_failed(op) && op->W > 1) {
        switch ((dc_op_kind)op->req->kind) {
        case DC_OP_ALL_REDUCE:
        case DC_OP_REDUCE:
            ok = cop_ring(op);
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
    /* No waiting for the last acknowledgements: what we sent was copied into its messages,
     * and a peer that does not get it fails the op on its own. The op object stays until
     * its last send is answered (cop_sent frees it). */
    pthread_mutex_lock(&op->mtx);
    ok = ok && !op->failed;
    pthread_mutex_unlock(&op->mtx);
    if (ok && cop_finish(op, &st) != DC_OK) {
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &st);
        pthread_mutex_unlock(&op->mtx);
        ok = false;
    }

    /* Leave the table, wait for handlers still applying data, answer, go. */
    pthread_mutex_lock(&co->mtx);
    for (struct cop **pp = &co->ops; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == op) {
            *pp = op->next;
            break;
        }
    }
    recent_add(co, op->id);
    pthread_mutex_lock(&op->mtx);
    op->phase  = PHASE_DONE;
    parked     = op->parked;
    op->parked = NULL;
    pthread_mutex_unlock(&op->mtx);
    while (op->refs > 1) {
        pthread_cond_wait(&co->cv, &co->mtx);
    }
    if (ok) {
        co->stats.ops_done++;
    } else {
        co->stats.ops_failed++;
    }
    co->stats.bytes_sent += op->bytes_sent;
    co->stats.bytes_received += op->bytes_received;
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
        *rpc_call_status(op->cd) = op->fail;
        log_info("op %s failed: %s: %s", op->id, dc_status_name(op->fail.code), op->fail.message);
    }
    /* Sends still out fail quietly from here: answering frees the request they would name. */
    pthread_mutex_lock(&op->mtx);
    op->answering = true;
    pthread_mutex_unlock(&op->mtx);
    op->closure(&out, op->cd);
    pthread_mutex_lock(&op->mtx);
    op->thread_done = true;
    free_op         = op->inflight == 0;
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
    pthread_cond_init(&op->cv, NULL);
    op->co          = co;
    op->req         = in;
    op->self        = in->self;
    op->W           = (uint32_t)plan->n_workers;
    op->N           = (uint32_t)plan->n_devices;
    op->multi_step  = SIZE_MAX;
    op->started_us  = rpc_now_us();
    op->deadline_ms = rpc_now_ms() + (in->timeout_ms ? in->timeout_ms : 30000);
    snprintf(op->id, sizeof(op->id), "%s", in->op_id);
    /* Steps 0..2W-1 carry data; step 2W carries the tensor descriptions. */
    op->n_steps       = 2 * (size_t)op->W + 1;
    op->meta_step     = 2 * op->W;
    op->devices       = calloc(op->N, sizeof(*op->devices));
    op->owner         = calloc(op->N, sizeof(*op->owner));
    op->peers         = calloc(op->W, sizeof(*op->peers));
    op->expected      = calloc(op->n_steps, sizeof(*op->expected));
    op->received      = calloc(op->n_steps, sizeof(*op->received));
    op->expected_from = calloc(op->W, sizeof(*op->expected_from));
    op->received_from = calloc(op->W, sizeof(*op->received_from));
    op->data_from     = calloc(op->W, sizeof(*op->data_from));
    op->local_ranks   = calloc(op->N, sizeof(*op->local_ranks));
    op->ready         = calloc(op->n_steps, sizeof(*op->ready));
    op->sent          = calloc(op->n_steps, sizeof(*op->sent));
    op->metas         = calloc(op->N, sizeof(*op->metas));
    op->send_ctx      = calloc(op->W, sizeof(*op->send_ctx));
    op->tensors       = calloc(op->N, sizeof(*op->tensors));
    if (op->devices == NULL || op->owner == NULL || op->peers == NULL || op->expected == NULL ||
        op->data_from == NULL || op->received == NULL || op->expected_from == NULL ||
        op->received_from == NULL || op->local_ranks == NULL || op->tensors == NULL ||
        op->ready == NULL || op->sent == NULL || op->metas == NULL || op->send_ctx == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    for (uint32_t r = 0; r < op->N; r++) {
        if (device_ref_from_pb(plan->devices[r], &op->devices[r], st) != DC_OK) {
            status_prefix(st, "execute: plan device");
            goto fail;
        }
        op->owner[r] = UINT32_MAX;
    }
    for (uint32_t w = 0; w < op->W; w++) {
        const Devcoord__V1__PlanWorker *pw = plan->workers[w];
        op->send_ctx[w]                    = (struct cop_send_ctx){ op, w };
        for (size_t i = 0; i < pw->n_ranks; i++) {
            uint32_t r = pw->ranks[i];
            if (r >= op->N || op->owner[r] != UINT32_MAX ||
                strcmp(op->devices[r].worker, pw->name) != 0) {
                code = status_set(st, DC_INVALID_ARGUMENT, "execute: plan ranks inconsistent");
                goto fail;
            }
            op->owner[r] = w;
            if (w == op->self) {
                op->local_ranks[op->n_local++] = r;
            }
        }
        if (w != op->self && (op->peers[w] = peer_get(co, pw->address, st)) == NULL) {
            code = st->code;
            goto fail;
        }
    }
    for (uint32_t r = 0; r < op->N; r++) {
        if (op->owner[r] == UINT32_MAX) {
            code = status_set(st, DC_INVALID_ARGUMENT, "execute: rank %u has no worker", r);
            goto fail;
        }
    }
    if (op->n_local == 0) {
        code = status_set(st, DC_INVALID_ARGUMENT, "execute: no device of this worker in the plan");
        goto fail;
    }
    *out = op;
    return DC_OK;
fail:
    cop_free(op);
    return code;
}

void
collectives_execute(struct collectives *co, const Devcoord__V1__ExecuteRequest *in,
                    Devcoord__V1__ExecuteResponse_Closure closure, void *cd)
{
    struct cop *op;
    dc_status *st = rpc_call_status(cd);

    if (cop_new(co, in, &op, st) != DC_OK) {
        closure(NULL, cd);
        return;
    }
    op->closure = closure;
    op->cd      = cd;
    op->refs    = 1;

    pthread_mutex_lock(&co->mtx);
    if (co->stopping || cop_find_locked(co, op->id) != NULL || recent_has(co, op->id)) {
        pthread_mutex_unlock(&co->mtx);
        status_set(st, DC_ABORTED, "op %s already ran, was aborted, or the worker is stopping",
                   op->id);
        cop_free(op);
        closure(NULL, cd);
        return;
    }
    /* Chunks that came before us are ours now. */
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

    /* Ops wait for their peers: they run on pool threads, never here (this may be an nng
     * callback). */
    if (!tpool_submit(co->pool, cop_run, op)) {
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
collectives_abort(struct collectives *co, const Devcoord__V1__AbortRequest *in,
                  Devcoord__V1__AbortResponse_Closure closure, void *cd)
{
    Devcoord__V1__AbortResponse out = DEVCOORD__V1__ABORT_RESPONSE__INIT;
    struct cop *op;

    pthread_mutex_lock(&co->mtx);
    if ((op = cop_find_locked(co, in->op_id)) != NULL) {
        dc_status st;
        status_set(&st, DC_ABORTED, "op %.64s aborted by the coordinator: %.400s", in->op_id,
                   in->reason != NULL ? in->reason->message : "no reason given");
        pthread_mutex_lock(&op->mtx);
        cop_fail_locked(op, &st);
        pthread_mutex_unlock(&op->mtx);
    } else if (!recent_has(co, in->op_id) && strlen(in->op_id) <= OP_ID_MAX) {
        recent_add(co, in->op_id); /* its Execute, if it comes late, is refused */
    }
    pthread_mutex_unlock(&co->mtx);
    closure(&out, cd);
}

struct collectives *
collectives_new(const struct config_worker *cfg, const char *token, struct executor *ex,
                struct membership *m)
{
    struct collectives *co = calloc(1, sizeof(*co));

    if (co == NULL) {
        return NULL;
    }
    co->cfg   = cfg;
    co->token = token;
    co->ex    = ex;
    co->m     = m;
    co->chunk = CHUNK_BYTES;
    if (co->chunk + RPC_FRAME_OVERHEAD > cfg->max_message_bytes) {
        co->chunk = cfg->max_message_bytes > 2 * RPC_FRAME_OVERHEAD
                        ? cfg->max_message_bytes - RPC_FRAME_OVERHEAD
                        : RPC_FRAME_OVERHEAD;
    }
    pthread_mutex_init(&co->mtx, NULL);
    pthread_cond_init(&co->cv, NULL);
    /* Threads for ops come and go with the load; an idle worker keeps none after 30 s. */
    if ((co->pool = tpool_new(1024, 30000)) == NULL) {
        pthread_cond_destroy(&co->cv);
        pthread_mutex_destroy(&co->mtx);
        free(co);
        return NULL;
    }
    if (pthread_create(&co->reaper, NULL, collectives_reaper, co) != 0) {
        tpool_free(co->pool);
        pthread_cond_destroy(&co->cv);
        pthread_mutex_destroy(&co->mtx);
        free(co);
        return NULL;
    }
    return co;
}

void
collectives_free(struct collectives *co)
{
    struct parked *orphans;

    if (co == NULL) {
        return;
    }
    pthread_mutex_lock(&co->mtx);
    co->stopping = true;
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
    pthread_join(co->reaper, NULL);
    tpool_free(co->pool);
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
    pthread_cond_destroy(&co->cv);
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
