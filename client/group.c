/* Groups in libdevcoord (design §13): join and leave through the coordinator, then every call
 * straight to this rank's worker (GroupCall), its bytes in the attachment both ways, or, for a
 * buffer of dc_group_alloc on the worker's host, in shared memory both map. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "auth.h"
#include "client.h"
#include "device.h"
#include "dlframe.h"
#include "dltls.h"
#include "status.h"
#include "threadname.h"
#include "clock.h"

/* A call's RPC waits this much longer than the call's own deadline, so that the worker's
 * answer (naming the missing ranks) arrives before the client gives up. */
#define GROUP_MARGIN_MS       5000u
#define GROUP_CALL_TIMEOUT_MS 30000u
#define GROUP_ID_SIZE         17
/* The most bytes one call carries each way (the default message limit less the envelope);
 * a blocking call larger than that is split into several. */
#define GROUP_CALL_BYTES_MAX TENSOR_CHUNK_MAX
/* A blocking call of one message whose plain buffers hold this many bytes or more goes
 * through the staging block (group_call_small): copying them costs less than carrying them
 * to the worker and back. */
#define GROUP_STAGE_MIN_BYTES (64u * 1024)
/* The call link's setup (GroupCallLink, then the dial) is bounded by this. */
#define LINK_DIAL_MS 2000u
/* Asynchronous calls of one message on plain memory in flight at once through staging
 * blocks of their own (group_call_async); more go with their bytes. */
#define ASYNC_STAGES 4

/* A block of dc_group_alloc: shared memory the worker maps as region (0: plain memory). */
struct block {
    uint8_t *base;
    size_t bytes;
    uint64_t region;
    struct block *next;
};

/* A staging block of asynchronous calls (one of the group's blocks), taken by one call from
 * its start until its result is copied out (request_done). */
struct astage {
    uint8_t *base;
    size_t bytes;
    bool busy;
};

struct dc_group {
    dc_client *client;
    char id[GROUP_ID_SIZE];
    uint64_t generation;
    uint32_t rank, size;
    char (*names)[DC_DEVICE_TEXT_SIZE];
    char worker[CLIENT_ADDRESS_MAX + 1];
    uint32_t call_timeout_ms;
    uint32_t n_workers;  /* the workers of the group's ranks (1: calls never cross workers) */
    pthread_mutex_t mtx; /* one call at a time; guards seq, splitting, split_threads */
    pthread_cond_t order_cv;
    uint64_t seq;
    bool splitting;         /* a call split into parts is taking its seqs: others wait */
    unsigned split_threads; /* asynchronous split calls still running (leave waits) */
    pthread_mutex_t blocks_mtx;
    struct block *blocks;
    /* The staging block of calls past one message (group_call_whole), one of blocks, shared
     * with the worker; used with the group's order held, as large as the largest call. */
    void *stage;
    size_t stage_bytes;
    /* The worker could not map a staging block: calls of one message carry their bytes
     * (group_call_small). Used with the group's order held. */
    bool stage_small_off;
    /* Agreed by every rank (whole_agree): calls of up to whole_yes bytes can be made whole,
     * of whole_no or more (0: none yet) cannot. Used with the group's order held. */
    size_t whole_yes, whole_no;
    /* The call link (GroupCallLink): blocking calls as frames on the worker's data port, one
     * thread at a time (link_mtx; another thread's call meanwhile goes as an RPC). */
    pthread_mutex_t link_mtx;
    struct dlink_out *link;
    struct dltls *link_tls;
    bool link_off; /* calls go as RPCs: turned off, or the link could not be opened */
    /* Staging blocks of asynchronous calls; off once the worker could not map one. */
    pthread_mutex_t astage_mtx;
    pthread_cond_t astage_cv; /* a request ended (dc_group_leave waits for all) */
    struct astage astage[ASYNC_STAGES];
    bool astage_off;
    /* Asynchronous requests whose reply uses g (a staging block, or a whole call whose
     * refusal must reach whole_forget); astage_mtx. */
    unsigned async_pending;
    /* An asynchronous whole call was refused because the ranks' calls did not match: the
     * next holder of the group's order forgets what was agreed (group_call_piece's rule). */
    atomic_bool whole_forget;
};

static uint32_t
add_margin(uint32_t ms)
{
    return ms > UINT32_MAX - GROUP_MARGIN_MS ? UINT32_MAX : ms + GROUP_MARGIN_MS;
}

static void block_release(struct block *b);

static void
group_free(dc_group *g)
{
    if (g != NULL) {
        /* The worker unmaps its side when the generation ends. */
        while (g->blocks != NULL) {
            struct block *b = g->blocks;
            g->blocks       = b->next;
            block_release(b);
        }
        dlink_out_close(g->link);
        dltls_free(g->link_tls);
        pthread_mutex_destroy(&g->link_mtx);
        pthread_cond_destroy(&g->astage_cv);
        pthread_mutex_destroy(&g->astage_mtx);
        pthread_mutex_destroy(&g->blocks_mtx);
        pthread_cond_destroy(&g->order_cv);
        pthread_mutex_destroy(&g->mtx);
        free(g->names);
        free(g);
    }
}

/* The join's answer into a new group. */
static dc_code
group_from_reply(dc_client *c, const Devcoord__V1__GroupJoinResponse *resp,
                 const dc_group_options *opts, dc_group **out, dc_status *st)
{
    const Devcoord__V1__Plan *plan = resp->plan;
    dc_group *g;

    if (plan == NULL || resp->size == 0 || resp->rank >= resp->size ||
        plan->n_devices != resp->size) {
        return status_set(st, DC_INTERNAL, "malformed reply: GroupJoin without a plan");
    }
    if ((g = calloc(1, sizeof(*g))) == NULL ||
        (g->names = calloc(resp->size, sizeof(*g->names))) == NULL) {
        free(g);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&g->mtx, NULL);
    clock_cond_init(&g->order_cv);
    pthread_mutex_init(&g->blocks_mtx, NULL);
    pthread_mutex_init(&g->link_mtx, NULL);
    pthread_mutex_init(&g->astage_mtx, NULL);
    clock_cond_init(&g->astage_cv);
    if (getenv("DEVCOORD_GROUP_CALL_LINK") != NULL &&
        strcmp(getenv("DEVCOORD_GROUP_CALL_LINK"), "0") == 0) {
        g->link_off = true;
    }
    g->client     = c;
    g->generation = resp->generation;
    g->rank       = resp->rank;
    g->size       = resp->size;
    g->n_workers  = (uint32_t)plan->n_workers;
    g->call_timeout_ms =
        opts != NULL && opts->call_timeout_ms ? opts->call_timeout_ms : GROUP_CALL_TIMEOUT_MS;
    if (client_copy_field(g->id, sizeof(g->id), resp->group_id, "group id", st) != DC_OK ||
        client_copy_field(g->worker, sizeof(g->worker), resp->worker_address, "worker address",
                          st) != DC_OK) {
        group_free(g);
        return DC_INTERNAL;
    }
    for (size_t r = 0; r < g->size; r++) {
        dc_device_ref ref;
        if (device_ref_from_pb(plan->devices[r], &ref, st) != DC_OK) {
            group_free(g);
            return status_set(st, DC_INTERNAL, "malformed reply: device %zu of the group", r);
        }
        dc_device_ref_format(&ref, g->names[r], sizeof(g->names[r]));
    }
    *out = g;
    return DC_OK;
}

dc_code
dc_group_join(dc_client *c, const char *devices, const char *self, const dc_group_options *opts,
              dc_group **out, dc_status *st)
{
    Devcoord__V1__GroupJoinRequest req = DEVCOORD__V1__GROUP_JOIN_REQUEST__INIT;
    Devcoord__V1__DeviceRef self_pb    = DEVCOORD__V1__DEVICE_REF__INIT;
    Devcoord__V1__Device self_dev      = DEVCOORD__V1__DEVICE__INIT;
    Devcoord__V1__DeviceRef *refs      = NULL;
    Devcoord__V1__Device *devs         = NULL;
    Devcoord__V1__DeviceRef **ptrs     = NULL;
    dc_device_ref *list                = NULL, me;
    struct rpc_reply r                 = { 0 };
    uint32_t join_ms;
    size_t n = 0;
    dc_code code;

    status_clear(st);
    if (out == NULL || devices == NULL || self == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "%s is NULL",
                          out == NULL ? "out" : (devices == NULL ? "devices" : "self"));
    }
    *out = NULL;
    if (c == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "client is NULL");
    }
    if ((code = dc_device_list_parse(devices, &list, &n, st)) != DC_OK) {
        return code;
    }
    if ((code = dc_device_ref_parse(self, strlen(self), &me, st)) != DC_OK) {
        status_prefix(st, "invalid self");
        goto out;
    }
    if ((refs = calloc(n ? n : 1, sizeof(*refs))) == NULL ||
        (devs = calloc(n ? n : 1, sizeof(*devs))) == NULL ||
        (ptrs = calloc(n ? n : 1, sizeof(*ptrs))) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        device_ref_to_pb(&list[i], &refs[i], &devs[i]);
        ptrs[i] = &refs[i];
    }
    device_ref_to_pb(&me, &self_pb, &self_dev);
    req.devices    = ptrs;
    req.n_devices  = n;
    req.self       = &self_pb;
    req.timeout_ms = opts != NULL ? opts->timeout_ms : 0;
    join_ms        = req.timeout_ms ? req.timeout_ms : client_op_timeout(c);
    code = client_coord_call(c, M_COORDINATOR_GROUP_JOIN, &req.base, add_margin(join_ms), &r, st);
    if (code == DC_OK) {
        if (r.body == NULL) {
            code = status_set(st, DC_INTERNAL, "malformed reply: GroupJoin without a body");
        } else {
            code =
                group_from_reply(c, (const Devcoord__V1__GroupJoinResponse *)r.body, opts, out, st);
        }
    }
out:
    rpc_reply_free(&r);
    free(list);
    free(refs);
    free(devs);
    free(ptrs);
    return code;
}

uint32_t
dc_group_rank(const dc_group *g)
{
    return g != NULL ? g->rank : 0;
}

uint32_t
dc_group_size(const dc_group *g)
{
    return g != NULL ? g->size : 0;
}

const char *
dc_group_id(const dc_group *g)
{
    return g != NULL ? g->id : "";
}

uint64_t
dc_group_generation(const dc_group *g)
{
    return g != NULL ? g->generation : 0;
}

const char *
dc_group_device(const dc_group *g, uint32_t rank)
{
    return g != NULL && rank < g->size ? g->names[rank] : NULL;
}

dc_code
dc_group_leave(dc_group *g, dc_status *st)
{
    Devcoord__V1__GroupLeaveRequest req = DEVCOORD__V1__GROUP_LEAVE_REQUEST__INIT;
    struct rpc_reply r                  = { 0 };
    dc_code code;

    status_clear(st);
    if (g == NULL) {
        return DC_OK;
    }
    /* An asynchronous split call still running uses g: it ends by its own deadline at most. */
    pthread_mutex_lock(&g->mtx);
    while (g->split_threads > 0 || g->splitting) {
        pthread_cond_wait(&g->order_cv, &g->mtx);
    }
    pthread_mutex_unlock(&g->mtx);
    /* So does an asynchronous call whose reply uses g (request_done: a staging block to copy
     * out of, a refusal to note). Any other request left unfinished touches only its own. */
    pthread_mutex_lock(&g->astage_mtx);
    while (g->async_pending > 0) {
        pthread_cond_wait(&g->astage_cv, &g->astage_mtx);
    }
    pthread_mutex_unlock(&g->astage_mtx);
    if (g->stage != NULL) {
        dc_group_free(g, g->stage); /* the worker unmaps it now, not at the generation's end */
        g->stage = NULL;
    }
    for (int i = 0; i < ASYNC_STAGES; i++) {
        if (g->astage[i].base != NULL) {
            dc_group_free(g, g->astage[i].base);
            g->astage[i].base = NULL;
        }
    }
    req.group_id   = g->id;
    req.generation = g->generation;
    req.rank       = g->rank;
    code = client_coord_call(g->client, M_COORDINATOR_GROUP_LEAVE, &req.base, g->client->timeout_ms,
                             &r, st);
    rpc_reply_free(&r);
    group_free(g);
    return code;
}

/* ---- calls ------------------------------------------------------------------------------- */

struct call {
    dc_op_kind kind;
    dc_dtype dtype;
    size_t count;
    dc_reduce_op reduce;
    uint32_t root;
    const void *send; /* count elements (none for a barrier) */
    void *recv;       /* recv_bytes of result (NULL: none) */
    size_t recv_bytes;
    size_t total;  /* a part of a split call: the whole call's count (0: not split) */
    bool in_split; /* a part, made by the call that holds the group's order */
};

/* A call started with an _async function. */
struct dc_request {
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    bool done;
    dc_code code;
    dc_status st;
    void *recv;
    size_t recv_bytes;
    /* Made in staging block `stage` of g (-1: none): its result, out_bytes at stage_out,
     * goes to recv once the reply is in (group_call_run cleared recv_bytes: the reply
     * carries none). g: set when the reply uses the group (counted in g->async_pending),
     * NULL otherwise. whole: an asynchronous whole call. */
    dc_group *g;
    bool whole;
    int stage;
    const uint8_t *stage_out;
    size_t out_bytes;
};

static void astage_give(dc_group *g, int slot);
static void async_end(dc_group *g);

/* Whether a call was refused because the ranks' calls do not match (wcall_compute's words:
 * "rank N (device) passed X, rank 0 passed Y (group ...)"): every rank then forgets what
 * the group agreed (group_call_piece). */
static bool
calls_differ(dc_code code, const dc_status *st)
{
    return code == DC_INVALID_ARGUMENT && strstr(st->message, ", rank 0 passed ") != NULL;
}

/* The result of a call's reply into recv: DC_INTERNAL when its size is not recv_bytes. */
static dc_code
take_result(const struct rpc_reply *r, void *recv, size_t recv_bytes, dc_status *st)
{
    if (recv_bytes == 0) {
        return DC_OK;
    }
    if (r->attachment_len != recv_bytes) {
        return status_set(st, DC_INTERNAL, "malformed reply: %zu result bytes, not %zu",
                          r->attachment_len, recv_bytes);
    }
    memcpy(recv, r->attachment, recv_bytes);
    return DC_OK;
}

/* An async call's reply (nng thread: copies and signals, never blocks). */
static void
request_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    dc_request *rq = arg;
    dc_status out  = *st;

    (void)keep;
    if (code == DC_OK) {
        code = take_result(reply, rq->recv, rq->recv_bytes, &out);
    }
    if (rq->stage >= 0) {
        if (code == DC_OK && rq->out_bytes > 0) {
            memcpy(rq->recv, rq->stage_out, rq->out_bytes);
        }
        astage_give(rq->g, rq->stage);
    }
    if (rq->whole && calls_differ(code, &out)) {
        atomic_store(&rq->g->whole_forget, true); /* for the next holder of the order */
    }
    if (rq->g != NULL) {
        async_end(rq->g); /* g is not touched after this: dc_group_leave may free it */
    }
    pthread_mutex_lock(&rq->mtx);
    rq->code = code;
    rq->st   = out;
    rq->done = true;
    pthread_cond_broadcast(&rq->cv);
    pthread_mutex_unlock(&rq->mtx);
}

/* The region holding both of k's buffers (send: in_bytes, recv: recv_bytes) and their
 * offsets in it; 0 when they are not both in one shared block. */
static uint64_t
shm_place(dc_group *g, const struct call *k, size_t in_bytes, uint64_t *send_off,
          uint64_t *recv_off)
{
    const uint8_t *s = k->send, *r = k->recv;
    uint64_t region = 0;

    pthread_mutex_lock(&g->blocks_mtx);
    for (const struct block *b = g->blocks; b != NULL; b = b->next) {
        if (b->region != 0 && s >= b->base && (size_t)(s - b->base) <= b->bytes &&
            in_bytes <= b->bytes - (size_t)(s - b->base) && r >= b->base &&
            (size_t)(r - b->base) <= b->bytes &&
            k->recv_bytes <= b->bytes - (size_t)(r - b->base)) {
            region    = b->region;
            *send_off = (uint64_t)(s - b->base);
            *recv_off = (uint64_t)(r - b->base);
            break;
        }
    }
    pthread_mutex_unlock(&g->blocks_mtx);
    return region;
}

/* Opens g's call link to its worker w: asks where (GroupCallLink), dials, shows the secret.
 * false: this group's calls go as RPCs from now on. A worker without GroupCallLink, or a data
 * port the rank cannot reach (behind a port mapping), will not change within a generation,
 * and a dial that waits its bound on every call would cost more than the link gains.
 * link_mtx held. */
static bool
link_open(dc_group *g, struct worker_conn *w)
{
    Devcoord__V1__GroupLinkRequest req = DEVCOORD__V1__GROUP_LINK_REQUEST__INIT;
    const Devcoord__V1__GroupLinkResponse *resp;
    const dc_client *c = g->client;
    struct rpc_reply r = { 0 };
    char host[256];
    dc_status st;
    bool tls;

    g->link_off = true; /* unless it opens */
    if (rpc_call(w->rpc, WORKER_SVC, M_WORKER_GROUP_CALL_LINK, &req.base, NULL, 0, LINK_DIAL_MS, &r,
                 &st) != DC_OK) {
        rpc_reply_free(&r);
        return false;
    }
    resp = (const Devcoord__V1__GroupLinkResponse *)r.body;
    if (resp == NULL || resp->secret.len != DLINK_SECRET_SIZE || resp->address == NULL ||
        (strncmp(resp->address, "tcp://", 6) != 0 &&
         strncmp(resp->address, "tls+tcp://", 10) != 0)) {
        rpc_reply_free(&r);
        return false;
    }
    tls = strncmp(resp->address, "tls+", 4) == 0;
    if (tls && g->link_tls == NULL) {
        auth_url_host(resp->address, host, sizeof(host));
        if (auth_dltls_client(c->tls_ca, c->tls_cert, c->tls_key,
                              c->tls_server_name != NULL ? c->tls_server_name : host, &g->link_tls,
                              &st) != DC_OK) {
            rpc_reply_free(&r);
            return false;
        }
    }
    if (dlink_dial(resp->address, tls ? g->link_tls : NULL, resp->secret.data, "rank", LINK_DIAL_MS,
                   &g->link, &st) != DC_OK) {
        rpc_reply_free(&r);
        return false;
    }
    rpc_reply_free(&r);
    g->link_off = false;
    return true;
}

/* Makes req on g's call link when it has one or can open it and no other thread of this rank
 * uses it: true, with the call's code. false: make it as an RPC. A link that failed is closed
 * (the call fails as an RPC would when its connection drops); the next call opens another.
 * A link dropped on its first call goes as the RPC, and so does every later call: a worker
 * at its connection bound (DLINK_MAX_CONNS) accepts a link and closes it unread, and would
 * close every new one the same way. */
static bool
link_call(dc_group *g, struct worker_conn *w, const Devcoord__V1__GroupCallRequest *req,
          const void *send, size_t bytes, void *recv, size_t recv_bytes, dc_code *code,
          dc_status *st)
{
    uint8_t pb[DLINK_CALL_PB_MAX];
    struct dlink_hdr h = { 0 };
    size_t pb_len;
    bool fresh;

    if (pthread_mutex_trylock(&g->link_mtx) != 0) {
        return false;
    }
    fresh = g->link == NULL;
    if (g->link_off || (g->link == NULL && !link_open(g, w)) ||
        (pb_len = protobuf_c_message_get_packed_size(&req->base)) > sizeof(pb)) {
        pthread_mutex_unlock(&g->link_mtx);
        return false;
    }
    protobuf_c_message_pack(&req->base, pb);
    h.from       = g->rank;
    h.group      = dlink_group_hash(g->id);
    h.generation = g->generation;
    h.seq        = req->seq;
    *code        = dlink_call(g->link, &h, pb, pb_len, send, bytes, recv, recv_bytes,
                              add_margin(g->call_timeout_ms), st);
    if (*code != DC_OK && st->transport) {
        dlink_out_close(g->link);
        g->link = NULL;
        if (fresh && *code == DC_UNAVAILABLE) {
            /* Closed, not timed out: unread, or if read (dropped after), the RPC is refused
             * as a second call of the seq, never made twice. */
            g->link_off = true;
            pthread_mutex_unlock(&g->link_mtx);
            return false;
        }
    }
    pthread_mutex_unlock(&g->link_mtx);
    return true;
}

/* One call: the next seq of g, to this rank's worker, the result into recv. With rq, it is
 * started and rq completes it; without, it is made and waited for: on the call link when it
 * can be. */
static dc_code
group_call_run(dc_group *g, const struct call *k, dc_request *rq, dc_status *st)
{
    Devcoord__V1__GroupCallRequest req = DEVCOORD__V1__GROUP_CALL_REQUEST__INIT;
    Devcoord__V1__GroupCallDesc desc   = DEVCOORD__V1__GROUP_CALL_DESC__INIT;
    size_t elem                        = dc_dtype_size(k->dtype), bytes;
    struct worker_conn *w;
    struct rpc_reply r = { 0 };
    size_t recv_bytes  = k->recv_bytes;
    dc_code code;

    status_clear(st);
    if (g == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "group is NULL");
    }
    if (k->kind != DC_OP_BARRIER) {
        if (elem == 0) {
            return status_set(st, DC_INVALID_ARGUMENT, "invalid operation: unknown dtype");
        }
        /* A count of 0 goes to the worker like any other: the other ranks must hear of it
         * (it is refused there, for every rank, as a disagreement or as empty). */
        if (k->count >
            SIZE_MAX / elem /
                (k->kind == DC_OP_ALL_GATHER || k->kind == DC_OP_REDUCE_SCATTER ? g->size : 1)) {
            return status_set(st, DC_INVALID_ARGUMENT, "invalid operation: count too large");
        }
        if (k->count > 0 && (k->send == NULL || (k->recv_bytes > 0 && k->recv == NULL))) {
            return status_set(st, DC_INVALID_ARGUMENT, "buffer is NULL");
        }
    }
    bytes = k->kind == DC_OP_BARRIER
                ? 0
                : k->count * elem * (k->kind == DC_OP_REDUCE_SCATTER ? g->size : 1);
    if ((code = client_worker_conn(g->client, g->worker, &w, st)) != DC_OK) {
        return code;
    }
    if (k->kind != DC_OP_BARRIER && k->count > 0 &&
        (req.region = shm_place(g, k, bytes, &req.send_offset, &req.recv_offset)) != 0) {
        bytes      = 0; /* neither way: the worker reads and writes the block */
        recv_bytes = 0;
        if (rq != NULL) {
            rq->recv_bytes = 0;
        }
    }
    desc.rank      = g->rank;
    desc.kind      = (Devcoord__V1__OpKind)k->kind;
    desc.dtype     = (Devcoord__V1__DType)k->dtype;
    desc.count     = k->count;
    desc.reduce    = (Devcoord__V1__ReduceOp)k->reduce;
    desc.root      = k->root;
    desc.total     = k->total;
    req.group_id   = g->id;
    req.generation = g->generation;
    req.call       = &desc;
    req.timeout_ms = g->call_timeout_ms;
    /* The k-th call of this rank is the k-th started, whichever thread starts it; a call
     * split into parts takes consecutive seqs, so the others wait for it to have taken them. */
    pthread_mutex_lock(&g->mtx);
    while (g->splitting && !k->in_split) {
        pthread_cond_wait(&g->order_cv, &g->mtx);
    }
    req.seq = ++g->seq;
    if (rq != NULL) {
        code = rpc_call_async(w->rpc, WORKER_SVC, M_WORKER_GROUP_CALL, &req.base, k->send, bytes,
                              add_margin(g->call_timeout_ms), request_done, rq, st);
        pthread_mutex_unlock(&g->mtx);
        return code;
    }
    pthread_mutex_unlock(&g->mtx);
    if (link_call(g, w, &req, k->send, bytes, k->recv, recv_bytes, &code, st)) {
        return code;
    }
    code = rpc_call(w->rpc, WORKER_SVC, M_WORKER_GROUP_CALL, &req.base, k->send, bytes,
                    add_margin(g->call_timeout_ms), &r, st);
    if (code == DC_OK) {
        code = take_result(&r, k->recv, recv_bytes, st);
    }
    rpc_reply_free(&r);
    return code;
}

/* Elements of one part of k when it is split into calls of one message each: the rank's
 * input (reduce-scatter: one block per rank) and its result (all-gather: every rank's) must
 * fit. Every rank splits the same call the same way. */
static size_t
part_elements(const dc_group *g, const struct call *k)
{
    size_t per = GROUP_CALL_BYTES_MAX / dc_dtype_size(k->dtype);

    if (k->kind == DC_OP_ALL_GATHER || k->kind == DC_OP_REDUCE_SCATTER) {
        per /= g->size;
    }
    return per > 0 ? per : 1;
}

static dc_request *group_call_async(dc_group *g, const struct call *k, dc_status *st);

/* What a call does when stage_reserve fails, for its message. */
#define IN_PARTS "this call goes in parts"
static dc_code stage_reserve(dc_group *g, size_t bytes, const char *then, dc_status *st);
static uint8_t *stage_block_new(dc_group *g, size_t bytes, const char *then, dc_status *st);
static void stage_drop(dc_group *g);
static dc_code group_call_parts(dc_group *g, const struct call *k, size_t per, dc_status *st);
static dc_code group_call_staged(dc_group *g, const struct call *k, size_t in_bytes, dc_status *st);
static bool worker_is_local(const char *address);

/* The most bytes a worker holds of one whole call in a group across workers (what peers send
 * it is bounded by its limits.max_inflight_bytes): an all-reduce's ring keeps a copy of its
 * input, a reduce's direct exchange one part from every other worker. A larger call goes as
 * several whole calls. */
#define GROUP_WHOLE_MAX (64u * 1024 * 1024)

/* The bytes of k's input on this rank (a reduce-scatter's: a block per rank). */
static size_t
call_in_bytes(const dc_group *g, const struct call *k)
{
    return k->count * dc_dtype_size(k->dtype) * (k->kind == DC_OP_REDUCE_SCATTER ? g->size : 1);
}

/* The bytes k takes in the staging block: its input, or its result when that is larger
 * (an all-gather's, every rank's block). */
static size_t
call_stage_bytes(const dc_group *g, const struct call *k)
{
    size_t in = call_in_bytes(g, k);

    return k->recv_bytes > in ? k->recv_bytes : in;
}

/* Whether this rank's buffers of k are in one block of dc_group_alloc, or its staging block
 * is (or can be made) `bytes` large (call_stage_bytes). The group's order held. */
static bool
piece_ready(dc_group *g, const struct call *k, size_t bytes)
{
    uint64_t send_off, recv_off;
    dc_status why;

    return shm_place(g, k, call_in_bytes(g, k), &send_off, &recv_off) != 0 ||
           stage_reserve(g, bytes, IN_PARTS, &why) == DC_OK;
}

/* Forgets what the group agreed (whole_yes, whole_no). The group's order held. */
static void
whole_forget_now(dc_group *g)
{
    g->whole_yes = 0;
    g->whole_no  = 0;
}

/* whole_forget_now, when an asynchronous whole call's refusal asked for it (request_done).
 * The group's order held. */
static void
whole_forget_pending(dc_group *g)
{
    if (atomic_exchange(&g->whole_forget, false)) {
        whole_forget_now(g);
    }
}

/* Whether every rank can make k, of `bytes`, whole (group_call_piece): known from an earlier
 * agreement of this group made for as many bytes or fewer (yes) or as many or more (no),
 * else agreed now by a one-element all-reduce (MIN of each rank's piece_ready), which every
 * rank makes at the same call since their calls match. The group's order held. */
static dc_code
whole_agree(dc_group *g, const struct call *k, size_t bytes, bool *agreed, dc_status *st)
{
    int64_t vote, least = 0;
    struct call v = { .kind       = DC_OP_ALL_REDUCE,
                      .dtype      = DC_DTYPE_I64,
                      .reduce     = DC_REDUCE_MIN,
                      .count      = 1,
                      .send       = &vote,
                      .recv       = &least,
                      .recv_bytes = sizeof(least),
                      .in_split   = true };
    dc_code code;

    whole_forget_pending(g);
    if (bytes <= g->whole_yes) {
        *agreed = true;
        return DC_OK;
    }
    if (g->whole_no != 0 && bytes >= g->whole_no) {
        *agreed = false;
        return DC_OK;
    }
    vote = piece_ready(g, k, bytes) ? 1 : 0;
    if ((code = group_call_run(g, &v, NULL, st)) != DC_OK) {
        return code;
    }
    *agreed = least == 1;
    if (*agreed) {
        g->whole_yes = bytes;
    } else {
        g->whole_no = bytes;
        if (g->stage_bytes > g->whole_yes) {
            stage_drop(g); /* made for the vote: no call agreed can use all of it */
        }
    }
    return DC_OK;
}

/* k (at most GROUP_WHOLE_MAX across workers) as one call when every rank agrees it can
 * (whole_agree), else in parts: its buffers in a block of dc_group_alloc as they are, or in
 * plain memory through the group's staging block (copied in, the call in place there, the
 * result copied out). A rank that agreed once but can no longer (its staging block cannot
 * grow) makes it in parts: the workers refuse that call for every rank (the counts differ,
 * and the message says why) rather than leave any waiting. The group's order held. */
static dc_code
group_call_piece_agreed(dc_group *g, const struct call *k, size_t per, dc_status *st)
{
    size_t in_bytes = call_in_bytes(g, k);
    size_t bytes    = call_stage_bytes(g, k);
    uint64_t send_off, recv_off;
    bool agreed;
    dc_code code;

    if ((code = whole_agree(g, k, bytes, &agreed, st)) != DC_OK) {
        return code;
    }
    if (!agreed) {
        return group_call_parts(g, k, per, st);
    }
    if (shm_place(g, k, in_bytes, &send_off, &recv_off) != 0) {
        return group_call_run(g, k, NULL, st);
    }
    if (stage_reserve(g, bytes, IN_PARTS, st) != DC_OK) {
        return group_call_parts(g, k, per, st);
    }
    return group_call_staged(g, k, in_bytes, st);
}

/* *staged: k made in place in the staging block at base (call_stage_bytes large), its input
 * copied there. The worker reads the input before it writes the result over it. On one
 * worker a reduce-scatter's result goes over the rank's own block of its input, and an
 * all-gather's input is the rank's own block of its result, where the worker reduces or
 * gathers straight from every rank's stage (lreduce). */
static void
stage_in(const dc_group *g, const struct call *k, size_t in_bytes, uint8_t *base,
         struct call *staged)
{
    uint8_t *in = base;

    *staged      = *k;
    staged->recv = base;
    if (k->kind == DC_OP_REDUCE_SCATTER && g->n_workers == 1) {
        staged->recv = base + (size_t)g->rank * k->recv_bytes;
    } else if (k->kind == DC_OP_ALL_GATHER && g->n_workers == 1) {
        in += (size_t)g->rank * in_bytes;
    }
    memcpy(in, k->send, in_bytes);
    staged->send = in;
}

/* k through the group's staging block (reserved for it, the group's order held): its input
 * copied in, the call in place there, the result copied out. */
static dc_code
group_call_staged(dc_group *g, const struct call *k, size_t in_bytes, dc_status *st)
{
    struct call staged;
    dc_code code;

    stage_in(g, k, in_bytes, g->stage, &staged);
    if ((code = group_call_run(g, &staged, NULL, st)) == DC_OK && k->recv_bytes > 0) {
        memcpy(k->recv, staged.recv, k->recv_bytes);
    }
    return code;
}

/* A free staging block of asynchronous calls holding `bytes`, taken (made, or made larger,
 * when none is: the smaller one freed); -1 when all ASYNC_STAGES are busy or a block cannot
 * be made (then never again; a refused mapping is said on stderr, stage_block_new). */
static int
astage_take(dc_group *g, size_t bytes)
{
    int slot = -1;
    struct astage *a;
    dc_status why;
    uint8_t *base;
    /* Sizes rounded up to a power of two (from 256 KiB), so that calls of a few sizes do
     * not remap their blocks over and over. */
    size_t want = 256u * 1024;

    while (want < bytes && want <= SIZE_MAX / 2) {
        want *= 2;
    }
    bytes = want >= bytes ? want : bytes;
    pthread_mutex_lock(&g->astage_mtx);
    for (int i = 0; i < ASYNC_STAGES && !g->astage_off; i++) {
        a = &g->astage[i];
        if (!a->busy && (slot < 0 || a->bytes >= bytes)) {
            slot = i;
            if (a->bytes >= bytes) {
                break;
            }
        }
    }
    if (slot >= 0) {
        g->astage[slot].busy = true;
    }
    pthread_mutex_unlock(&g->astage_mtx);
    if (slot < 0 || g->astage[slot].bytes >= bytes) {
        return slot;
    }
    /* Busy: the slot is this thread's alone until astage_give. */
    a = &g->astage[slot];
    if (a->base != NULL) {
        dc_group_free(g, a->base);
        a->base  = NULL;
        a->bytes = 0;
    }
    base = stage_block_new(g, bytes, "asynchronous calls carry their bytes from now on", &why);
    pthread_mutex_lock(&g->astage_mtx);
    a->base  = base;
    a->bytes = base != NULL ? bytes : 0;
    if (base == NULL) {
        a->busy       = false;
        g->astage_off = true;
        slot          = -1;
    }
    pthread_mutex_unlock(&g->astage_mtx);
    return slot;
}

static void
astage_give(dc_group *g, int slot)
{
    pthread_mutex_lock(&g->astage_mtx);
    g->astage[slot].busy = false;
    pthread_mutex_unlock(&g->astage_mtx);
}

/* rq's reply will use g (request_done ends it with async_end). */
static void
async_begin(dc_group *g, dc_request *rq)
{
    rq->g = g;
    pthread_mutex_lock(&g->astage_mtx);
    g->async_pending++;
    pthread_mutex_unlock(&g->astage_mtx);
}

static void
async_end(dc_group *g)
{
    pthread_mutex_lock(&g->astage_mtx);
    g->async_pending--;
    pthread_cond_broadcast(&g->astage_cv);
    pthread_mutex_unlock(&g->astage_mtx);
}

/* group_call_piece_agreed; a call the workers refuse because the ranks' calls do not match
 * also forgets what this group agreed before. The ranks' memories of it can part: a rank
 * whose vote failed alone (its link dropped with the answer on the way) remembers nothing
 * while the others remember yes, and one that agreed but can no longer stage goes in parts
 * while the others go whole. Their next call then fails on every rank with that refusal,
 * so every rank forgets, and the one after is voted on again, by all. Any other failure
 * keeps the agreement: it may be one rank's alone (its region shrank), and forgetting then
 * would part them. The group's order held. */
static dc_code
group_call_piece(dc_group *g, const struct call *k, size_t per, dc_status *st)
{
    dc_code code = group_call_piece_agreed(g, k, per, st);

    if (calls_differ(code, st)) {
        whole_forget_now(g);
    }
    return code;
}

/* The most elements of one whole call of k (group_call_whole): all of them on one worker;
 * across workers GROUP_WHOLE_MAX bytes a worker holds of it (a reduce's part from every other
 * worker), at least one. */
static size_t
whole_piece_most(const dc_group *g, const struct call *k)
{
    size_t held = k->kind == DC_OP_REDUCE && g->n_workers > 1 ? g->n_workers - 1 : 1;
    size_t most = g->n_workers == 1 ? k->count : GROUP_WHOLE_MAX / held / dc_dtype_size(k->dtype);

    return most > 0 ? most : 1;
}

/* A call on shared memory carries no byte in a message, so a large all-reduce, reduce or
 * broadcast is one call (on one worker the worker reduces straight in the ranks' memory;
 * across workers one ring, pipelined over the data link, instead of one per message); across
 * workers one per GROUP_WHOLE_MAX bytes a worker holds of it (a reduce's part from every
 * other worker). Every rank does the same, so their calls stay matched. The group's order
 * held. */
static dc_code
group_call_whole(dc_group *g, const struct call *k, size_t per, dc_status *st)
{
    size_t elem = dc_dtype_size(k->dtype), most = whole_piece_most(g, k);
    dc_code code = DC_OK;

    for (size_t off = 0, len; off < k->count && code == DC_OK; off += len) {
        struct call piece = *k;

        len              = k->count - off < most ? k->count - off : most;
        piece.count      = len;
        piece.send       = (const uint8_t *)k->send + off * elem;
        piece.recv       = (uint8_t *)k->recv + off * elem;
        piece.recv_bytes = k->recv_bytes > 0 ? len * elem : 0;
        code             = group_call_piece(g, &piece, per, st);
    }
    return code;
}

/* Takes the group's order for a call split into parts: until order_give, other calls of
 * this rank wait before taking a seq, so the parts' seqs follow each other. `thread`: an
 * asynchronous split call's thread holds it (dc_group_leave waits for those). */
static void
order_take(dc_group *g, bool thread)
{
    pthread_mutex_lock(&g->mtx);
    while (g->splitting) {
        pthread_cond_wait(&g->order_cv, &g->mtx);
    }
    g->splitting = true;
    if (thread) {
        g->split_threads++;
    }
    pthread_mutex_unlock(&g->mtx);
}

static void
order_give(dc_group *g, bool thread)
{
    pthread_mutex_lock(&g->mtx);
    g->splitting = false;
    if (thread) {
        g->split_threads--;
    }
    pthread_cond_broadcast(&g->order_cv);
    pthread_mutex_unlock(&g->mtx);
}

/* k, larger than one message, the group's order held: one call (group_call_whole) but for
 * all-gather and reduce-scatter, whose blocks are per rank, so that a piece cannot be a
 * range of the buffers: one whose every rank's blocks (a reduce-scatter's input, an
 * all-gather's result) are at most GROUP_WHOLE_MAX goes whole as one piece (across workers
 * a reduce-scatter's ring keeps a copy of its input, as an all-reduce's does; an
 * all-gather's worker holds the result), a larger one in parts. */
static dc_code
group_call_split_held(dc_group *g, const struct call *whole, size_t per, dc_status *st)
{
    struct call held = *whole;
    size_t elem      = dc_dtype_size(held.dtype);

    held.in_split = true; /* its calls take their seqs without waiting for the order */
    if (held.send == NULL || held.recv == NULL) {
        return group_call_parts(g, &held, per, st); /* which refuses it */
    }
    if ((held.kind == DC_OP_REDUCE_SCATTER || held.kind == DC_OP_ALL_GATHER) &&
        held.count <= GROUP_WHOLE_MAX / elem / g->size) {
        return group_call_piece(g, &held, per, st);
    }
    if (held.kind != DC_OP_ALL_GATHER && held.kind != DC_OP_REDUCE_SCATTER &&
        held.count <= SIZE_MAX / elem) {
        return group_call_whole(g, &held, per, st);
    }
    return group_call_parts(g, &held, per, st);
}

/* k as a series of calls of one message each, the group's order held. All-gather's and
 * reduce-scatter's blocks are per rank, so each part goes through tmp: [rank][part] there,
 * [rank][count] in the user's buffer. */
static dc_code
group_call_parts(dc_group *g, const struct call *whole, size_t per, dc_status *st)
{
    struct call held     = *whole;
    const struct call *k = &held;
    size_t elem = dc_dtype_size(k->dtype), n = g->size, len;
    bool blocks  = k->kind == DC_OP_ALL_GATHER || k->kind == DC_OP_REDUCE_SCATTER;
    uint8_t *tmp = NULL;
    dc_code code = DC_OK;

    held.in_split = true; /* its parts take their seqs without waiting for the order */
    if (k->count > SIZE_MAX / elem / n || k->send == NULL || k->recv == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          k->send == NULL || k->recv == NULL
                              ? "buffer is NULL"
                              : "invalid operation: count too large");
    }
    if (blocks && (tmp = malloc(n * per * elem)) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t off = 0; off < k->count && code == DC_OK; off += len) {
        const uint8_t *send = k->send;
        uint8_t *recv       = k->recv;
        struct call part    = *k;

        len        = k->count - off < per ? k->count - off : per;
        part.count = len;
        part.total = k->count;
        if (k->kind == DC_OP_ALL_GATHER) {
            part.send       = send + off * elem;
            part.recv       = tmp;
            part.recv_bytes = n * len * elem;
        } else if (k->kind == DC_OP_REDUCE_SCATTER) {
            for (size_t r = 0; r < n; r++) {
                memcpy(tmp + r * len * elem, send + (r * k->count + off) * elem, len * elem);
            }
            part.send       = tmp;
            part.recv       = recv + off * elem;
            part.recv_bytes = len * elem;
        } else {
            part.send       = send + off * elem;
            part.recv       = recv + off * elem;
            part.recv_bytes = len * elem;
        }
        if ((code = group_call_run(g, &part, NULL, st)) == DC_OK && k->kind == DC_OP_ALL_GATHER) {
            for (size_t r = 0; r < n; r++) {
                memcpy(recv + (r * k->count + off) * elem, tmp + r * len * elem, len * elem);
            }
        }
    }
    free(tmp);
    return code;
}

static dc_code
group_call_split(dc_group *g, const struct call *k, size_t per, dc_status *st)
{
    dc_code code;

    order_take(g, false);
    code = group_call_split_held(g, k, per, st);
    order_give(g, false);
    return code;
}

/* An asynchronous call larger than one message: a thread of its own makes its parts, the
 * group's order taken by the caller before it returns (so the calls it starts next come
 * after every part) and given back once the parts are made. */
struct split_job {
    dc_group *g;
    struct call k;
    size_t per;
    dc_request *rq;
};

static void *
split_thread(void *arg)
{
    struct split_job *j = arg;
    dc_request *rq      = j->rq;
    dc_status st;
    dc_code code;

    thread_name_set("dc-split");
    status_clear(&st);
    code = group_call_split_held(j->g, &j->k, j->per, &st);
    order_give(j->g, true); /* g is not touched after this: dc_group_leave may free it */
    free(j);
    pthread_mutex_lock(&rq->mtx);
    rq->code = code;
    rq->st   = st;
    rq->done = true;
    pthread_cond_broadcast(&rq->cv);
    pthread_mutex_unlock(&rq->mtx);
    return NULL;
}

static dc_request *
group_call_async_split(dc_group *g, const struct call *k, size_t per, dc_status *st)
{
    struct split_job *j = calloc(1, sizeof(*j));
    dc_request *rq      = calloc(1, sizeof(*rq));
    pthread_attr_t attr;
    pthread_t thread;
    int rv;

    if (j == NULL || rq == NULL) {
        free(j);
        free(rq);
        status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&rq->mtx, NULL);
    clock_cond_init(&rq->cv);
    rq->stage = -1; /* finished by split_thread, not request_done */
    *j        = (struct split_job){ .g = g, .k = *k, .per = per, .rq = rq };
    order_take(g, true);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rv = pthread_create(&thread, &attr, split_thread, j);
    pthread_attr_destroy(&attr);
    if (rv != 0) {
        order_give(g, true);
        pthread_cond_destroy(&rq->cv);
        pthread_mutex_destroy(&rq->mtx);
        free(rq);
        free(j);
        status_set(st, DC_RESOURCE_EXHAUSTED, "cannot start a thread for an asynchronous %s: %s",
                   dc_op_kind_name(k->kind), strerror(rv));
        return NULL;
    }
    return rq;
}

/* Whether k of one message (in_bytes of input, bytes in a staging block) is worth copying
 * through a staging block: its buffers are plain memory of GROUP_STAGE_MIN_BYTES or more
 * and the worker is on this host (copying costs less than carrying the bytes to the worker
 * and back). */
static bool
stage_worth(dc_group *g, const struct call *k, size_t in_bytes, size_t bytes)
{
    uint64_t send_off, recv_off;

    return bytes >= GROUP_STAGE_MIN_BYTES && k->send != NULL && k->recv != NULL &&
           worker_is_local(g->worker) && shm_place(g, k, in_bytes, &send_off, &recv_off) == 0;
}

/* Blocking call k of one message at most: through the staging block when its buffers are
 * plain memory of GROUP_STAGE_MIN_BYTES or more and the worker is on this host (copied in,
 * the call in place there, where the worker reduces without a byte through a socket: lreduce
 * on one worker, the ring in the rank's region across workers; the result copied out), else
 * with its bytes in the call. Each rank chooses alone: ranks of both ways may meet in a call
 * of one message. A worker that cannot map the block is asked once: calls carry their bytes
 * from then on. */
static dc_code
group_call_small(dc_group *g, const struct call *k, dc_status *st)
{
    size_t in_bytes = call_in_bytes(g, k), bytes = call_stage_bytes(g, k);
    struct call held = *k;
    dc_code code;

    if (!stage_worth(g, k, in_bytes, bytes)) {
        return group_call_run(g, k, NULL, st);
    }
    order_take(g, false);
    if (g->stage_small_off ||
        stage_reserve(g, bytes, "calls of one message carry their bytes", st) != DC_OK) {
        g->stage_small_off = true;
        order_give(g, false);
        status_clear(st);
        return group_call_run(g, k, NULL, st);
    }
    held.in_split = true; /* the order is held here: its seq is taken without waiting */
    code          = group_call_staged(g, &held, in_bytes, st);
    order_give(g, false);
    return code;
}

/* A blocking call: one message, or split into several when it is larger. */
static dc_code
group_call(dc_group *g, const struct call *k, dc_status *st)
{
    dc_status local;
    size_t per;

    if (st == NULL) {
        st = &local; /* the paths below read back what they set (st->transport) */
    }
    if (g == NULL || k->kind == DC_OP_BARRIER || dc_dtype_size(k->dtype) == 0) {
        return group_call_run(g, k, NULL, st);
    }
    if (k->count <= (per = part_elements(g, k))) {
        return k->in_split ? group_call_run(g, k, NULL, st) : group_call_small(g, k, st);
    }
    return group_call_split(g, k, per, st);
}

/* For an asynchronous call of one message k: the staging block it is made in (*staged, its
 * input copied there), when its buffers are plain memory of GROUP_STAGE_MIN_BYTES or more and
 * the worker is on this host, as a blocking call's (group_call_small) but each call in a
 * block of its own, taken until its reply is in; else -1 (its bytes go in the call). */
static int
async_stage(dc_group *g, const struct call *k, struct call *staged)
{
    size_t in_bytes, bytes;
    int slot;

    if (g == NULL || k->kind == DC_OP_BARRIER || k->count == 0 || dc_dtype_size(k->dtype) == 0) {
        return -1;
    }
    in_bytes = call_in_bytes(g, k);
    bytes    = call_stage_bytes(g, k);
    if (!stage_worth(g, k, in_bytes, bytes) || (slot = astage_take(g, bytes)) < 0) {
        return -1;
    }
    stage_in(g, k, in_bytes, g->astage[slot].base, staged);
    return slot;
}

/* Whether k, larger than one message, can start as one asynchronous call that holds the
 * group's order only until it has its seq: an all-reduce, reduce or broadcast of one piece
 * (group_call_whole) of at most GROUP_WHOLE_MAX bytes, of a size the ranks agreed on before
 * (whole_yes; the first call of a size goes through group_call_async_split, which votes), on
 * shared memory as it is or through a staging block of its own (*stage, its input copied
 * there). true: the order is taken, *staged is the call to make (in_split). */
static bool
async_whole_take(dc_group *g, const struct call *k, struct call *staged, int *stage)
{
    size_t in_bytes = call_in_bytes(g, k), bytes = call_stage_bytes(g, k);
    uint64_t send_off, recv_off;

    *stage = -1;
    if ((k->kind != DC_OP_ALL_REDUCE && k->kind != DC_OP_REDUCE && k->kind != DC_OP_BROADCAST) ||
        k->send == NULL || k->recv == NULL || bytes > GROUP_WHOLE_MAX ||
        k->count > whole_piece_most(g, k) || !worker_is_local(g->worker)) {
        return false;
    }
    order_take(g, false);
    whole_forget_pending(g);
    *staged = *k;
    if (bytes > g->whole_yes || (shm_place(g, k, in_bytes, &send_off, &recv_off) == 0 &&
                                 (*stage = astage_take(g, bytes)) < 0)) {
        order_give(g, false);
        return false;
    }
    if (*stage >= 0) {
        stage_in(g, k, in_bytes, g->astage[*stage].base, staged);
    }
    staged->in_split = true; /* the order is held: its seq is taken without waiting */
    return true;
}

/* Starts k; NULL (st says why) when it could not start. */
static dc_request *
group_call_async(dc_group *g, const struct call *k, dc_status *st)
{
    dc_status local;
    struct call staged;
    dc_request *rq;
    size_t per;
    bool whole = false;
    int stage  = -1;
    dc_code code;

    if (st == NULL) {
        st = &local;
    }
    status_clear(st);
    if (g != NULL && !k->in_split && k->kind != DC_OP_BARRIER && dc_dtype_size(k->dtype) != 0 &&
        k->count > (per = part_elements(g, k))) {
        if (!async_whole_take(g, k, &staged, &stage)) {
            return group_call_async_split(g, k, per, st);
        }
        whole = true;
    } else {
        stage = async_stage(g, k, &staged);
    }
    if ((rq = calloc(1, sizeof(*rq))) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        pthread_mutex_init(&rq->mtx, NULL);
        clock_cond_init(&rq->cv);
        rq->recv       = k->recv;
        rq->recv_bytes = k->recv_bytes;
        rq->stage      = stage;
        rq->whole      = whole;
        if (stage >= 0) {
            /* In place in its staging block, the result copied out when the reply is in. */
            rq->stage_out = staged.recv;
            rq->out_bytes = k->recv_bytes;
        }
        if (stage >= 0 || whole) {
            async_begin(g, rq);
            k = &staged;
        }
        code = group_call_run(g, k, rq, st);
    }
    if (whole) {
        order_give(g, false); /* its seq is taken */
    }
    if (code != DC_OK) {
        if (stage >= 0) {
            astage_give(g, stage);
        }
        if (rq != NULL) {
            if (rq->g != NULL) {
                async_end(g);
            }
            pthread_cond_destroy(&rq->cv);
            pthread_mutex_destroy(&rq->mtx);
            free(rq);
        }
        return NULL;
    }
    return rq;
}

dc_code
dc_wait(dc_request *req, dc_status *st)
{
    dc_code code;

    status_clear(st);
    if (req == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "request is NULL");
    }
    pthread_mutex_lock(&req->mtx);
    while (!req->done) {
        pthread_cond_wait(&req->cv, &req->mtx);
    }
    pthread_mutex_unlock(&req->mtx);
    code = req->code;
    if (st != NULL) {
        *st = req->st;
    }
    pthread_cond_destroy(&req->cv);
    pthread_mutex_destroy(&req->mtx);
    free(req);
    return code;
}

dc_code
dc_test(dc_request *req, bool *done, dc_status *st)
{
    dc_code code = DC_OK;

    status_clear(st);
    if (req == NULL || done == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "%s is NULL", req == NULL ? "request" : "done");
    }
    pthread_mutex_lock(&req->mtx);
    *done = req->done;
    if (req->done) {
        code = req->code;
        if (st != NULL) {
            *st = req->st;
        }
    }
    pthread_mutex_unlock(&req->mtx);
    return code;
}

/* The calls: struct call for each kind, made blocking or started. */

static struct call
call_all_reduce(void *buf, size_t count, dc_dtype dtype, dc_reduce_op op)
{
    return (struct call){ .kind       = DC_OP_ALL_REDUCE,
                          .dtype      = dtype,
                          .count      = count,
                          .reduce     = op,
                          .send       = buf,
                          .recv       = buf,
                          .recv_bytes = count * dc_dtype_size(dtype) };
}

static struct call
call_reduce(void *buf, size_t count, dc_dtype dtype, dc_reduce_op op, uint32_t root)
{
    return (struct call){ .kind       = DC_OP_REDUCE,
                          .dtype      = dtype,
                          .count      = count,
                          .reduce     = op,
                          .root       = root,
                          .send       = buf,
                          .recv       = buf,
                          .recv_bytes = count * dc_dtype_size(dtype) };
}

static struct call
call_broadcast(void *buf, size_t count, dc_dtype dtype, uint32_t root)
{
    return (struct call){ .kind       = DC_OP_BROADCAST,
                          .dtype      = dtype,
                          .count      = count,
                          .root       = root,
                          .send       = buf,
                          .recv       = buf,
                          .recv_bytes = count * dc_dtype_size(dtype) };
}

static struct call
call_all_gather(const dc_group *g, const void *send, void *recv, size_t count, dc_dtype dtype)
{
    return (struct call){ .kind       = DC_OP_ALL_GATHER,
                          .dtype      = dtype,
                          .count      = count,
                          .send       = send,
                          .recv       = recv,
                          .recv_bytes = g != NULL ? count * dc_dtype_size(dtype) * g->size : 0 };
}

static struct call
call_reduce_scatter(const void *send, void *recv, size_t count, dc_dtype dtype, dc_reduce_op op)
{
    return (struct call){ .kind       = DC_OP_REDUCE_SCATTER,
                          .dtype      = dtype,
                          .count      = count,
                          .reduce     = op,
                          .send       = send,
                          .recv       = recv,
                          .recv_bytes = count * dc_dtype_size(dtype) };
}

static struct call
call_barrier(void)
{
    return (struct call){ .kind = DC_OP_BARRIER };
}

dc_code
dc_all_reduce(dc_group *g, void *buf, size_t count, dc_dtype dtype, dc_reduce_op op, dc_status *st)
{
    struct call k = call_all_reduce(buf, count, dtype, op);
    return group_call(g, &k, st);
}

dc_code
dc_reduce(dc_group *g, void *buf, size_t count, dc_dtype dtype, dc_reduce_op op, uint32_t root,
          dc_status *st)
{
    struct call k = call_reduce(buf, count, dtype, op, root);
    return group_call(g, &k, st);
}

dc_code
dc_broadcast(dc_group *g, void *buf, size_t count, dc_dtype dtype, uint32_t root, dc_status *st)
{
    struct call k = call_broadcast(buf, count, dtype, root);
    return group_call(g, &k, st);
}

dc_code
dc_all_gather(dc_group *g, const void *send, void *recv, size_t count, dc_dtype dtype,
              dc_status *st)
{
    struct call k = call_all_gather(g, send, recv, count, dtype);
    return group_call(g, &k, st);
}

dc_code
dc_reduce_scatter(dc_group *g, const void *send, void *recv, size_t count, dc_dtype dtype,
                  dc_reduce_op op, dc_status *st)
{
    struct call k = call_reduce_scatter(send, recv, count, dtype, op);
    return group_call(g, &k, st);
}

dc_code
dc_barrier(dc_group *g, dc_status *st)
{
    struct call k = call_barrier();
    return group_call(g, &k, st);
}

dc_request *
dc_all_reduce_async(dc_group *g, void *buf, size_t count, dc_dtype dtype, dc_reduce_op op,
                    dc_status *st)
{
    struct call k = call_all_reduce(buf, count, dtype, op);
    return group_call_async(g, &k, st);
}

dc_request *
dc_reduce_async(dc_group *g, void *buf, size_t count, dc_dtype dtype, dc_reduce_op op,
                uint32_t root, dc_status *st)
{
    struct call k = call_reduce(buf, count, dtype, op, root);
    return group_call_async(g, &k, st);
}

dc_request *
dc_broadcast_async(dc_group *g, void *buf, size_t count, dc_dtype dtype, uint32_t root,
                   dc_status *st)
{
    struct call k = call_broadcast(buf, count, dtype, root);
    return group_call_async(g, &k, st);
}

dc_request *
dc_all_gather_async(dc_group *g, const void *send, void *recv, size_t count, dc_dtype dtype,
                    dc_status *st)
{
    struct call k = call_all_gather(g, send, recv, count, dtype);
    return group_call_async(g, &k, st);
}

dc_request *
dc_reduce_scatter_async(dc_group *g, const void *send, void *recv, size_t count, dc_dtype dtype,
                        dc_reduce_op op, dc_status *st)
{
    struct call k = call_reduce_scatter(send, recv, count, dtype, op);
    return group_call_async(g, &k, st);
}

dc_request *
dc_barrier_async(dc_group *g, dc_status *st)
{
    struct call k = call_barrier();
    return group_call_async(g, &k, st);
}

/* ---- shared memory ----------------------------------------------------------------------- */

#define SHM_PREFIX "/devcoord-"
#define SHM_HEX    32

static void
block_release(struct block *b)
{
    if (b->region != 0) {
        munmap(b->base, b->bytes);
    } else {
        free(b->base);
    }
    free(b);
}

/* Whether the worker at address is on this host: only then can it open our shared memory.
 * TLS or not (it guards the bytes on the network; shared memory never leaves the host). */
static bool
worker_is_local(const char *address)
{
    static const char *const local[] = { "tcp://127.",
                                         "tcp://localhost:", "tcp://[::1]:", "ipc://" };

    if (strncmp(address, "tls+tcp://", 10) == 0) {
        address += 4; /* as tcp:// */
    }
    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++) {
        if (strncmp(address, local[i], strlen(local[i])) == 0) {
            return true;
        }
    }
    return false;
}

/* Asks g's worker to map (name, bytes) or unmap region `unmap`; the region into *region. */
static dc_code
group_map_rpc(dc_group *g, const char *name, size_t bytes, uint64_t unmap, uint64_t *region,
              dc_status *st)
{
    Devcoord__V1__GroupMapRequest req = DEVCOORD__V1__GROUP_MAP_REQUEST__INIT;
    struct worker_conn *w;
    struct rpc_reply r = { 0 };
    dc_code code;

    req.group_id   = g->id;
    req.generation = g->generation;
    req.rank       = g->rank;
    req.name       = (char *)name;
    req.bytes      = bytes;
    req.unmap      = unmap;
    if ((code = client_worker_conn(g->client, g->worker, &w, st)) == DC_OK &&
        (code = rpc_call(w->rpc, WORKER_SVC, M_WORKER_GROUP_MAP, &req.base, NULL, 0,
                         g->client->timeout_ms, &r, st)) == DC_OK &&
        region != NULL) {
        const Devcoord__V1__GroupMapResponse *resp = (const Devcoord__V1__GroupMapResponse *)r.body;
        if (resp == NULL || resp->region == 0) {
            code = status_set(st, DC_INTERNAL, "malformed reply: GroupMap without a region");
        } else {
            *region = resp->region;
        }
    }
    rpc_reply_free(&r);
    return code;
}

/* b as shared memory the worker maps: created here (exclusive, 0600), opened by the worker,
 * then unlinked at once whatever happened, so no name outlives this call even if a process
 * dies later; the two mappings keep the memory until both are gone. Its pages are allocated
 * now: a file only sized would map, and the first touch of a page /dev/shm cannot hold (a
 * container's is 64 MiB by default) would kill the process with SIGBUS. */
static dc_code
block_share(dc_group *g, struct block *b, dc_status *st)
{
    char name[sizeof(SHM_PREFIX) + SHM_HEX];
    unsigned char rnd[SHM_HEX / 2];
    void *base = MAP_FAILED;
    dc_code code;
    int fd, rv;

    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        return status_set(st, DC_UNAVAILABLE, "no random bytes for a shared memory name");
    }
    memcpy(name, SHM_PREFIX, strlen(SHM_PREFIX));
    for (size_t i = 0; i < sizeof(rnd); i++) {
        snprintf(name + strlen(SHM_PREFIX) + 2 * i, 3, "%02x", rnd[i]);
    }
    if ((fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600)) < 0) {
        return status_set(st, DC_UNAVAILABLE, "shm_open %s failed", name);
    }
    if (b->bytes > (size_t)INT64_MAX) {
        rv = EFBIG;
    } else if ((rv = posix_fallocate(fd, 0, (off_t)b->bytes)) == 0 &&
               (base = mmap(NULL, b->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
                   MAP_FAILED) {
        rv = errno;
    }
    if (rv != 0) {
        close(fd);
        shm_unlink(name);
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "cannot allocate %zu bytes of shared memory: %s", b->bytes,
                          rv == ENOSPC ? "/dev/shm has no room for them (a container's holds 64 "
                                         "MiB unless --shm-size says more)"
                                       : strerror(rv));
    }
    close(fd);
    code = group_map_rpc(g, name, b->bytes, 0, &b->region, st);
    shm_unlink(name);
    if (code != DC_OK) {
        munmap(base, b->bytes);
        return code;
    }
    b->base = base;
    return DC_OK;
}

void *
dc_group_alloc(dc_group *g, size_t bytes, dc_status *st)
{
    struct block *b;
    dc_status why;

    status_clear(st);
    if (g == NULL || bytes == 0) {
        status_set(st, DC_INVALID_ARGUMENT, g == NULL ? "group is NULL" : "bytes is 0");
        return NULL;
    }
    if ((b = calloc(1, sizeof(*b))) == NULL) {
        status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    b->bytes = bytes;
    if (!worker_is_local(g->worker) || block_share(g, b, &why) != DC_OK) {
        /* Plain memory: calls on it copy as any other buffer's do. */
        b->region = 0;
        if ((b->base = malloc(bytes)) == NULL) {
            free(b);
            status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            return NULL;
        }
        if (worker_is_local(g->worker)) {
            fprintf(stderr,
                    "devcoord: group %s rank %u: %zu bytes not shared with worker %s (%s: %s)\n",
                    g->id, g->rank, bytes, g->worker, dc_status_name(why.code), why.message);
        }
    }
    pthread_mutex_lock(&g->blocks_mtx);
    b->next   = g->blocks;
    g->blocks = b;
    pthread_mutex_unlock(&g->blocks_mtx);
    return b->base;
}

void
dc_group_free(dc_group *g, void *buf)
{
    struct block *b = NULL;
    dc_status st;

    if (g == NULL || buf == NULL) {
        return;
    }
    pthread_mutex_lock(&g->blocks_mtx);
    for (struct block **pp = &g->blocks; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->base == buf) {
            b   = *pp;
            *pp = b->next;
            break;
        }
    }
    pthread_mutex_unlock(&g->blocks_mtx);
    if (b != NULL) {
        if (b->region != 0) {
            (void)group_map_rpc(g, "", 0, b->region, NULL, &st); /* or at generation end */
        }
        block_release(b);
    }
}

/* Frees g's staging block, if any. The group's order held. */
static void
stage_drop(dc_group *g)
{
    if (g->stage != NULL) {
        dc_group_free(g, g->stage);
        g->stage       = NULL;
        g->stage_bytes = 0;
    }
}

/* A new staging block of `bytes`, one of g's blocks, shared with its worker; NULL when it
 * cannot be (the worker remote, out of memory, the mapping refused: the refusal said on
 * stderr with what the calls do then). */
static uint8_t *
stage_block_new(dc_group *g, size_t bytes, const char *then, dc_status *st)
{
    struct block *b;

    if (!worker_is_local(g->worker)) {
        status_set(st, DC_UNAVAILABLE, "worker %s is not on this host", g->worker);
        return NULL;
    }
    if ((b = calloc(1, sizeof(*b))) == NULL) {
        status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    b->bytes = bytes;
    if (block_share(g, b, st) != DC_OK) {
        fprintf(stderr,
                "devcoord: group %s rank %u: no staging block of %zu bytes shared with worker "
                "%s (%s: %s): %s\n",
                g->id, g->rank, bytes, g->worker, dc_status_name(st->code), st->message, then);
        free(b);
        return NULL;
    }
    pthread_mutex_lock(&g->blocks_mtx);
    b->next   = g->blocks;
    g->blocks = b;
    pthread_mutex_unlock(&g->blocks_mtx);
    return b->base;
}

/* g's staging block, at least bytes large and shared with its worker: kept, or made anew
 * (the smaller one freed); when it cannot be shared, stderr says so and what the call does
 * then. The group's order held. */
static dc_code
stage_reserve(dc_group *g, size_t bytes, const char *then, dc_status *st)
{
    if (g->stage != NULL && g->stage_bytes >= bytes) {
        return DC_OK;
    }
    stage_drop(g);
    if ((g->stage = stage_block_new(g, bytes, then, st)) == NULL) {
        return st->code;
    }
    g->stage_bytes = bytes;
    return DC_OK;
}

bool
dc_group_buffer_shared(dc_group *g, const void *buf)
{
    const uint8_t *p = buf;
    bool shared      = false;

    if (g == NULL || p == NULL) {
        return false;
    }
    pthread_mutex_lock(&g->blocks_mtx);
    for (const struct block *b = g->blocks; b != NULL && !shared; b = b->next) {
        shared = b->region != 0 && p >= b->base && p < b->base + b->bytes;
    }
    pthread_mutex_unlock(&g->blocks_mtx);
    return shared;
}

/* ---- listing ----------------------------------------------------------------------------- */

void
dc_group_list_free(dc_group_list *list)
{
    if (list == NULL) {
        return;
    }
    for (size_t i = 0; i < list->n; i++) {
        free(list->groups[i].devices);
        free(list->groups[i].stalled);
    }
    free(list->groups);
    free(list);
}

/* What the worker at address says of gi's calls, added to gi; a worker that does not answer
 * (or no longer knows the group) adds nothing. */
static void
group_worker_status(dc_client *c, const char *address, dc_group_info *gi)
{
    Devcoord__V1__GroupStatusRequest req = DEVCOORD__V1__GROUP_STATUS_REQUEST__INIT;
    const Devcoord__V1__GroupStatusResponse *resp;
    struct rpc_reply r = { 0 };
    struct worker_conn *w;
    dc_group_stalled *grow;
    dc_status st;

    req.group_id = gi->group_id;
    if (client_worker_conn(c, address, &w, &st) != DC_OK ||
        rpc_call(w->rpc, WORKER_SVC, M_WORKER_GROUP_STATUS, &req.base, NULL, 0, c->timeout_ms, &r,
                 &st) != DC_OK ||
        (resp = (const Devcoord__V1__GroupStatusResponse *)r.body) == NULL ||
        resp->generation != gi->generation) {
        goto out;
    }
    if (resp->calls > gi->calls) {
        gi->calls = resp->calls;
    }
    if (resp->n_stalled > gi->n_devices ||
        (grow = realloc(gi->stalled, (gi->n_stalled + resp->n_stalled + 1) * sizeof(*grow))) ==
            NULL) {
        goto out;
    }
    gi->stalled = grow;
    for (size_t i = 0; i < resp->n_stalled; i++) {
        dc_group_stalled *s = &gi->stalled[gi->n_stalled];
        s->rank             = resp->stalled[i]->rank;
        s->waiting_ms       = resp->stalled[i]->waiting_ms;
        if (client_copy_field(s->device, sizeof(s->device), resp->stalled[i]->device, "device",
                              &st) == DC_OK) {
            gi->n_stalled++;
        }
    }
out:
    rpc_reply_free(&r);
}

dc_code
dc_list_groups(dc_client *c, const char *group_id, dc_group_list **out, dc_status *st)
{
    Devcoord__V1__ListGroupsRequest req = DEVCOORD__V1__LIST_GROUPS_REQUEST__INIT;
    const Devcoord__V1__ListGroupsResponse *resp;
    struct rpc_reply r = { 0 };
    dc_group_list *l   = NULL;
    dc_code code;

    status_clear(st);
    if (out == NULL || c == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "%s is NULL", out == NULL ? "out" : "client");
    }
    *out         = NULL;
    req.group_id = (char *)(group_id != NULL ? group_id : "");
    if ((code = client_coord_call(c, M_COORDINATOR_LIST_GROUPS, &req.base, c->timeout_ms, &r,
                                  st)) != DC_OK) {
        goto out;
    }
    /* No groups: an empty body, which may come as none. */
    resp = (const Devcoord__V1__ListGroupsResponse *)r.body;
    if ((l = calloc(1, sizeof(*l))) == NULL ||
        (l->groups = calloc((resp != NULL ? resp->n_groups : 0) + 1, sizeof(*l->groups))) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; resp != NULL && i < resp->n_groups; i++) {
        const Devcoord__V1__GroupInfo *pb = resp->groups[i];
        dc_group_info *gi                 = &l->groups[l->n++];
        gi->generation                    = pb->generation;
        gi->joined                        = pb->joined;
        gi->joining                       = pb->joining;
        if ((gi->devices = calloc(pb->n_devices + 1, sizeof(*gi->devices))) == NULL) {
            code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        gi->n_devices = pb->n_devices;
        if ((code = client_copy_field(gi->group_id, sizeof(gi->group_id), pb->group_id, "group id",
                                      st)) != DC_OK) {
            goto out;
        }
        for (size_t d = 0; d < pb->n_devices; d++) {
            if ((code = client_copy_field(gi->devices[d], sizeof(gi->devices[d]), pb->devices[d],
                                          "device", st)) != DC_OK) {
                goto out;
            }
        }
        for (size_t a = 0; a < pb->n_worker_addresses && gi->generation > 0; a++) {
            group_worker_status(c, pb->worker_addresses[a], gi);
        }
    }
    *out = l;
    l    = NULL;
out:
    dc_group_list_free(l);
    rpc_reply_free(&r);
    return code;
}
