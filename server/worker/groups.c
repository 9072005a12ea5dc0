/* A worker's side of groups: generations, matched calls, the exchange (see groups.h). One lock
 * (mtx) guards everything; answers only pack and queue a send, so they go out under it. */
#include "groups.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "address.h"
#include "auth.h"
#include "bufcache.h"
#include "clock.h"
#include "datalink.h"
#include "device.h"
#include "devcoord/v1/methods.h"
#include "dltls.h"
#include "log.h"
#include "lreduce.h"
#include "metrics.h"
#include "reduce.h"
#include "rpc.h"
#include "shmguard.h"
#include "status.h"
#include "threadname.h"
#include "validate.h"
#include "wire.h"

#define WORKER_SVC (&devcoord__v1__worker__descriptor)
/* How long a GroupEnd may take to reach a peer (nobody waits for it). */
#define GROUP_END_TIMEOUT_MS 5000
#define TIMER_TICK_MS        20
/* An op's frame up to this size is written by the op's own thread when its peer's sender is
 * idle (peer_send_inline_locked); larger ones, a ring's chunks, go through the sender. */
#define OP_INLINE_MAX ((size_t)64 << 10)
/* How long the op's thread may wait for a peer to take such a frame: one that stopped reading
 * must not hold the op past its deadline (only the op's thread would cancel it). Then the
 * connection is dropped and the frame goes to the sender, which the op can cancel. */
#define OP_INLINE_TIMEOUT_MS 1000
#define KINDS                (DC_OP_COUNT)
#define ENDED_WINDOW         (2 * GROUPS_MAX_CALLS)
/* How long a failure answer held for a send from the rank's region (region.sending) may wait
 * for that write to end before the connection it is written on is cut (held_sends_cut): the
 * rank's client waits 5 s past its deadline (client/group.c GROUP_MARGIN_MS), and a peer
 * slow but reading gets what time that leaves. */
#define HELD_SEND_MS 3000u

struct desc {
    dc_op_kind kind;
    dc_dtype dtype;
    uint64_t count;
    dc_reduce_op reduce;
    uint32_t root;
    uint64_t total; /* the rank's whole call, when the library split it (0: not split) */
    bool shared;    /* its bytes in the rank's region, in no message (not compared) */
};

/* Bytes shared by a call and the data link's threads: a part being sent, or one being
 * received into. The last reference gives it back to the worker's buffer cache (bufcache.h),
 * whichever thread drops it. One made by pbuf_wrap is a rank's region instead (reg): it pins
 * the mapping until its last reference goes. */
struct pbuf {
    atomic_size_t refs;
    size_t bytes;
    struct bufcache *bc;
    uint8_t *data;      /* what follows this header, or reg's memory */
    struct region *reg; /* pbuf_wrap's */
    size_t pad;         /* data 16-byte aligned, as malloc's */
};

_Static_assert(sizeof(struct pbuf) % 16 == 0, "pbuf data aligned as malloc's");

/* A part queued to a peer's data link sender: a group's (buf) or an op's (owner, data). */
struct sjob {
    struct pbuf *buf;
    size_t len; /* bytes from buf->data + h.offset, or from data */
    struct dlink_hdr h;
    char group_id[VALIDATE_GROUP_ID_SIZE];
    char worker[DC_WORKER_NAME_MAX + 1];
    /* An op's chunk (wgroups_op_send): its bytes stay the op's; done says when they are
     * written (or not). */
    const void *owner;
    const uint8_t *data;
    wgroups_sent_fn done;
    void *done_arg;
    bool cancelled; /* aborted while it was being written (wgroups_op_cancel, held_sends_cut) */
    struct sjob *next;
};

/* A cached connection to a peer's data address, watched for drops, and the data link to it:
 * a sender thread (started on first use) that writes the queued parts, dialing (GroupLink,
 * then the data port) when it has no connection. */
struct wpeer {
    struct wgroups *wg;
    char address[256];
    struct rpc_client *client;
    bool was_up;
    pthread_t sender;
    bool sender_started;
    pthread_cond_t cv;
    struct sjob *jobs, *jobs_tail;
    struct dlink_out *out;   /* set and cleared under mtx; written by its `sending` job only */
    struct dltls *tls;       /* the dialer's, for a tls+tcp:// data link */
    bool stale;              /* the RPC connection dropped since out was dialed */
    struct sjob *sending;    /* the job the sender (or an op's thread) writes now (outside mtx) */
    bool inline_busy;        /* an op's thread writes `sending` itself: the sender waits */
    bool dialing;            /* wgroups_peer_link dials: the sender waits for it */
    uint64_t link_failed_ms; /* when wgroups_peer_link last failed to dial (0: never) */
    uint32_t features;       /* its GroupLink answer's, as of the last dial */
};

struct gworker {
    char name[DC_WORKER_NAME_MAX + 1];
    struct wpeer *peer; /* NULL for this worker */
    uint32_t *ranks;
    size_t n_ranks;
};

/* A failure answer held back (wcall_fail_locals) until no frame is landing in the rank's
 * region any more. */
struct held_answer {
    Devcoord__V1__GroupCallResponse_Closure closure;
    void *cd;
    struct dlink_conn *link;
    dc_status st;
    struct held_answer *next;
};

/* A rank's shared memory region (GroupMap), mapped until the generation ends. */
struct region {
    uint64_t id;
    uint32_t rank;
    uint8_t *base;
    size_t bytes;
    int slot;    /* in the SIGBUS guard's registry */
    bool shrunk; /* its object shrank: zero pages now, refused until unmapped */
    /* pbuf_wrap's buffers on it, and REGION_RETIRED once unmapped by its rank or the
     * generation's end: the last of the two to go unmaps it (region_retire, region_unpin). */
    atomic_uint pins;
    /* Frames of a ring running in the region being read into it by data link threads, and
     * the failure answers waiting for them to end (mtx): a rank must not hear its call
     * failed while a peer's bytes may still land in its memory. */
    unsigned landing;
    /* Likewise the group jobs queued or being written whose bytes are in the region: a rank
     * must not hear its call failed while a send may still read its memory, which the rank
     * may then overwrite before the bytes leave. */
    unsigned sending;
    struct held_answer *held;
    uint64_t held_ms; /* when the first of `held` was held (held_sends_cut) */
    struct region *next;
};

#define REGION_RETIRED 0x80000000u

/* What one of this worker's ranks passed to a call. */
struct lpart {
    bool in;
    struct desc d;
    const uint8_t *data; /* the call's attachment or its region: valid until it is answered */
    size_t bytes;
    Devcoord__V1__GroupCallResponse_Closure closure;
    void *cd;
    struct region *reg; /* a call on shared memory: the result goes to out, not the reply */
    uint8_t *out;
    struct dlink_conn *link; /* made on the call link: answered there, not by closure */
    struct pbuf *buf;        /* data's, when the call link read it into one (held) */
};

/* What another worker sent for a call. */
struct ppart {
    bool in;
    bool *called;   /* from a partial note: which of its ranks had called (NULL: unknown) */
    struct desc *d; /* one per rank of that worker, in its order */
    uint8_t *data;
    size_t bytes;
    bool has_data;
    struct pbuf *buf; /* data, when it comes over the data link */
    size_t received;  /* of buf's bytes */
};

/* A large all-reduce between workers goes round the ring of the group's workers in plan
 * order: W - 1 reduce-scatter steps (step s sends segment (pos - s) mod W, reduced so far, to
 * the next worker and reduces the segment the previous one sends into acc), then W - 1
 * all-gather steps (the finished segments travel on, landing straight in acc). Every worker
 * ends with the same bytes in acc; each sends and receives 2 (W - 1) / W of the part instead
 * of (W - 1) parts. Segments from the previous worker may come before this worker's own part
 * is ready: they wait in rs_in.
 *
 * A large reduce-scatter takes the reduce-scatter steps alone (scatter): worker pos ends
 * holding segment (pos + 1) mod W reduced from every worker, so segment k is made of the
 * blocks of worker k - 1's ranks (ring_scatter_fits: each worker's ranks are consecutive),
 * and each worker sends and receives (W - 1) / W of the part instead of (W - 1) parts. Its
 * frames carry RING_SCATTER beside their step. */
#define RING_SCATTER 0x2000u /* a ring frame's flag: below it, step + 1 (2 (W - 1) < 8192) */
struct ring {
    uint32_t n, pos, next, prev; /* workers; this one's place; its neighbours */
    bool scatter;                /* a reduce-scatter: W - 1 steps, segments by worker */
    size_t *seg;                 /* scatter: segment k's first byte seg[2k], its bytes seg[2k+1] */
    size_t elems, elem, bytes;
    struct pbuf *acc;   /* this worker's part, then the result (NULL until it is ready) */
    struct pbuf *rs_in; /* reduce-scatter segments from prev, each at its own offset */
    size_t *got;        /* bytes received per step (2 (n - 1) steps) */
    uint32_t done;      /* steps processed */
    size_t part;        /* bytes of step `done` processed: frames of a step come in order */
    bool broken;        /* a frame that does not fit: the descs will disagree */
};

struct wcall {
    uint64_t seq;
    struct ring *ring;   /* NULL: the direct exchange */
    struct lpart *local; /* per rank of this worker */
    size_t n_local_in;
    struct ppart *peer; /* per worker of the group (self's unused) */
    size_t n_peer_in;
    uint8_t *mine; /* this worker's part, once every local rank is in (mine_buf's bytes) */
    struct pbuf *mine_buf;
    /* A reduce-scatter's ring reading the worker's only rank's input in its region, read-only
     * (wcall_make_mine): step 0 sends from it and each reduce reads it beside the peer's
     * segment, so mine_buf (the ring's acc) takes no copy of it. NULL otherwise. */
    struct pbuf *in_buf;
    /* A ring reading the inputs of several ranks of this worker in their regions: the ranks'
     * but the first's (an all-reduce's ring runs in the first's region, wcall_ring_in_region;
     * a reduce-scatter's reads it as in_buf, wcall_scatter_in_regions), each reduced into a
     * segment of acc as that segment is first reduced, then the last slot the ring's rs_in
     * (ring_start, ring_advance). */
    const void **fold;
    size_t n_fold;
    size_t mine_bytes;
    bool sent;
    bool noted;                     /* a partial note went to the peers */
    uint64_t started_ms;            /* when any part of it first came, here or from a peer */
    uint64_t first_ms, deadline_ms; /* from this worker's first rank's call */
    uint64_t first_us;
    bool stall_logged;
    dc_status shrunk; /* a rank's region shrank while read (here or at a peer): the call fails */
    struct wcall *next;
};

struct wgroup {
    char id[VALIDATE_GROUP_ID_SIZE];
    uint64_t hash; /* dlink_group_hash(id): how data frames name it */
    uint64_t generation;
    size_t n; /* ranks */
    char (*names)[DC_DEVICE_TEXT_SIZE];
    struct gworker *workers;
    size_t n_workers;
    uint32_t self;
    bool ended;
    dc_status end;
    struct wcall *calls;
    size_t n_calls;
    uint64_t calls_done;
    /* The calls that ended here last (a window of ENDED_WINDOW): what a peer still sends for
     * one (a ring frame, a part after this worker failed the call) is dropped, not taken for
     * a new call, and a rank that calls one again is told it ended. */
    uint64_t ended_seqs[ENDED_WINDOW];
    size_t n_ended;
    uint64_t local_seq_max; /* the highest call any of this worker's ranks has made */
    struct region *regions;
    uint64_t last_region;
    struct wgroup *next;
};

struct wgroups {
    const struct config_worker *cfg;
    const char *token;
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    struct wgroup *groups;
    size_t n_groups;
    struct wpeer **peers;
    size_t n_peers;
    bool stopping;
    bool leaving; /* wgroups_leaving: the worker is stopping, groups end unannounced */
    pthread_t timer;
    size_t held, max_held; /* peers' parts kept until their call completes */
    uint64_t calls_total[KINDS];
    uint64_t stalls_total;
    uint64_t shm_calls_total, call_bytes_in, call_bytes_out;
    uint64_t link_calls_total;    /* calls taken on the call link */
    uint64_t parts_out, parts_in; /* small calls' parts sent and taken as DLINK_PART frames */
    uint64_t in_place_total;      /* group calls reduced in place (wcall_finish_in_place) */
    size_t shm_mapped;
    struct histo call_seconds;
    /* All-reduces of one-worker groups on shared memory, in place (lreduce.h); the job's
     * buffers, one per rank (GROUPS_MAX_RANKS), under mtx. */
    struct lreduce *lr;
    const uint8_t **lr_in;
    uint8_t **lr_out;
    struct dlink_server *dl;
    struct dltls *dl_tls;
    char dl_address[300]; /* what GroupLink tells peers */
    uint64_t link_bytes_out, link_bytes_in;
    uint64_t ring_calls_total;
    uint64_t ring_scatter_total;   /* reduce-scatters round the ring */
    uint64_t ring_in_region_total; /* of those, run in the rank's region (no copy) */
    /* Where DLINK_FLAG_OP frames go (collective.c), and the reader threads inside it. */
    struct wgroups_op_sink op_sink;
    unsigned op_sink_busy;
    pthread_cond_t op_sink_cv;
    struct wgroups_control control;
    struct bufcache *bufs; /* every pbuf's bytes (groups.buffer_cache_bytes) */
    uint64_t bufs_trimmed_ms;
};

/* ---- small helpers ----------------------------------------------------------------------- */

static struct pbuf *
pbuf_new(struct wgroups *wg, size_t bytes)
{
    struct pbuf *b = bytes <= BUFCACHE_MAX_BYTES - sizeof(*b)
                         ? bufcache_take(wg->bufs, sizeof(*b) + (bytes ? bytes : 1))
                         : NULL;

    if (b != NULL) {
        atomic_init(&b->refs, 1);
        b->bytes = bytes;
        b->bc    = wg->bufs;
        b->data  = (uint8_t *)(b + 1);
        b->reg   = NULL;
    }
    return b;
}

/* A pbuf over bytes of region r (no copy): r stays mapped while it lives. mtx held. */
static struct pbuf *
pbuf_wrap(struct region *r, uint8_t *data, size_t bytes)
{
    struct pbuf *b = calloc(1, sizeof(*b));

    if (b != NULL) {
        atomic_init(&b->refs, 1);
        b->bytes = bytes;
        b->data  = data;
        b->reg   = r;
        atomic_fetch_add(&r->pins, 1);
    }
    return b;
}

static void
region_destroy(struct region *r)
{
    shmguard_retire(r->slot);
    munmap(r->base, r->bytes);
    free(r);
}

/* r, taken off its group's list: unmapped now, or by the last pbuf_wrap buffer on it.
 * mtx held. */
static void
region_retire(struct wgroups *wg, struct region *r)
{
    wg->shm_mapped -= r->bytes;
    if (atomic_fetch_or(&r->pins, REGION_RETIRED) == 0) {
        region_destroy(r);
    }
}

static void
region_unpin(struct region *r)
{
    if (atomic_fetch_sub(&r->pins, 1) == (REGION_RETIRED | 1u)) {
        region_destroy(r);
    }
}

static struct pbuf *
pbuf_hold(struct pbuf *b)
{
    atomic_fetch_add(&b->refs, 1);
    return b;
}

static void
pbuf_drop(struct pbuf *b)
{
    if (b != NULL && atomic_fetch_sub(&b->refs, 1) == 1) {
        if (b->reg != NULL) {
            region_unpin(b->reg);
            free(b);
        } else {
            bufcache_give(b->bc, b);
        }
    }
}

static bool
kind_has_data(dc_op_kind k)
{
    return k != DC_OP_BARRIER;
}

static bool
kind_uses_reduce(dc_op_kind k)
{
    return k == DC_OP_ALL_REDUCE || k == DC_OP_REDUCE || k == DC_OP_REDUCE_SCATTER;
}

/* Elements each rank passes: count, but count per rank for reduce-scatter. */
static size_t
input_elements(const struct desc *d, size_t n_ranks)
{
    return d->kind == DC_OP_REDUCE_SCATTER ? (size_t)d->count * n_ranks : (size_t)d->count;
}

static bool
kind_uses_root(dc_op_kind k)
{
    return k == DC_OP_REDUCE || k == DC_OP_BROADCAST;
}

static struct desc
desc_from_pb(const Devcoord__V1__GroupCallDesc *pb)
{
    struct desc d = { 0 };

    if (pb != NULL) {
        d = (struct desc){ (dc_op_kind)pb->kind,
                           (dc_dtype)pb->dtype,
                           pb->count,
                           (dc_reduce_op)pb->reduce,
                           pb->root,
                           pb->total,
                           pb->shared };
    }
    return d;
}

static void
desc_to_pb(const struct desc *d, uint32_t rank, Devcoord__V1__GroupCallDesc *pb)
{
    devcoord__v1__group_call_desc__init(pb);
    pb->rank   = rank;
    pb->kind   = (Devcoord__V1__OpKind)d->kind;
    pb->dtype  = (Devcoord__V1__DType)d->dtype;
    pb->count  = d->count;
    pb->reduce = (Devcoord__V1__ReduceOp)d->reduce;
    pb->root   = d->root;
    pb->total  = d->total;
    pb->shared = d->shared;
}

static const char *
name_or(const char *name, const char *what)
{
    return name != NULL ? name : what;
}

/* What a rank passed, as far as it differs from `other`: "f64[1024]", "broadcast", ... */
static void
desc_text(const struct desc *d, const struct desc *other, char *buf, size_t cap)
{
    if (d->kind != other->kind) {
        snprintf(buf, cap, "%s", name_or(dc_op_kind_name(d->kind), "an unknown kind"));
    } else if (kind_has_data(d->kind) &&
               (d->dtype != other->dtype || d->count != other->count || d->total != other->total)) {
        snprintf(buf, cap, "%s[%llu]", name_or(dc_dtype_name(d->dtype), "?"),
                 (unsigned long long)(d->total ? d->total : d->count));
    } else if (kind_uses_reduce(d->kind) && d->reduce != other->reduce) {
        snprintf(buf, cap, "reduce %s", name_or(dc_reduce_op_name(d->reduce), "?"));
    } else {
        snprintf(buf, cap, "root %u", d->root);
    }
}

static bool
desc_differs(const struct desc *a, const struct desc *b)
{
    return a->kind != b->kind ||
           (kind_has_data(a->kind) &&
            (a->dtype != b->dtype || a->count != b->count || a->total != b->total)) ||
           (kind_uses_reduce(a->kind) && a->reduce != b->reduce) ||
           (kind_uses_root(a->kind) && a->root != b->root);
}

static size_t
local_index(const struct wgroup *g, uint32_t rank, bool *found)
{
    const struct gworker *me = &g->workers[g->self];

    for (size_t i = 0; i < me->n_ranks; i++) {
        if (me->ranks[i] == rank) {
            *found = true;
            return i;
        }
    }
    *found = false;
    return 0;
}

static struct wgroup *
group_find(struct wgroups *wg, const char *id)
{
    for (struct wgroup *g = wg->groups; g != NULL; g = g->next) {
        if (strcmp(g->id, id) == 0) {
            return g;
        }
    }
    return NULL;
}

/* ---- ending calls ------------------------------------------------------------------------ */

static void
wcall_free(struct wgroups *wg, struct wgroup *g, struct wcall *c)
{
    if (c == NULL) {
        return;
    }
    for (size_t w = 0; c->peer != NULL && w < g->n_workers; w++) {
        if (c->peer[w].data != NULL) {
            wg->held -= c->peer[w].bytes;
        }
        free(c->peer[w].called);
        free(c->peer[w].d);
        if (c->peer[w].buf != NULL) {
            pbuf_drop(c->peer[w].buf);
        } else {
            free(c->peer[w].data);
        }
    }
    free(c->peer);
    for (size_t i = 0; c->local != NULL && i < g->workers[g->self].n_ranks; i++) {
        pbuf_drop(c->local[i].buf);
    }
    free(c->local);
    pbuf_drop(c->mine_buf);
    pbuf_drop(c->in_buf);
    free(c->fold);
    if (c->ring != NULL) {
        if (c->ring->rs_in != NULL) {
            wg->held -= c->ring->bytes;
        }
        pbuf_drop(c->ring->acc);
        pbuf_drop(c->ring->rs_in);
        free(c->ring->got);
        free(c->ring->seg);
        free(c->ring);
    }
    free(c);
}

/* Unlinks c from g, which remembers it ended. mtx held. */
static void
wcall_unlink(struct wgroup *g, struct wcall *c)
{
    for (struct wcall **pp = &g->calls; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            g->n_calls--;
            g->ended_seqs[g->n_ended++ % ENDED_WINDOW] = c->seq;
            return;
        }
    }
}

/* Whether call seq of g ended here lately (wcall_unlink). mtx held. */
static bool
wcall_ended(const struct wgroup *g, uint64_t seq)
{
    size_t n = g->n_ended < ENDED_WINDOW ? g->n_ended : ENDED_WINDOW;

    for (size_t i = 0; i < n; i++) {
        if (g->ended_seqs[i] == seq) {
            return true;
        }
    }
    return false;
}

/* Whether the rank of p still waits for its answer. */
static bool
lpart_waiting(const struct lpart *p)
{
    return p->in && (p->closure != NULL || p->link != NULL);
}

static void
pbuf_release(void *b)
{
    pbuf_drop(b);
}

/* Answers p's rank: out and the result's bytes (none on shared memory), or st's error (st not
 * NULL). Once. ref (NULL or a hold of the buffer data is in) is the answer's to drop: a call
 * link's answer is written straight from it and lets go of it once written, no copy. */
static void
lpart_answer(struct lpart *p, const Devcoord__V1__GroupCallResponse *out, const dc_status *st,
             const void *data, size_t bytes, struct pbuf *ref)
{
    if (p->link != NULL && st == NULL && bytes > 0 && ref != NULL && ref->reg == NULL) {
        dlink_call_answer_ref(p->link, data, bytes, pbuf_release, ref);
        ref = NULL;
    } else if (p->link != NULL) {
        dlink_call_answer(p->link, st, data, bytes);
    } else if (st != NULL) {
        *rpc_call_status(p->cd) = *st;
        p->closure(NULL, p->cd);
    } else {
        if (bytes > 0) {
            rpc_call_set_reply_attachment(p->cd, data, bytes);
        }
        p->closure(out, p->cd);
    }
    p->closure = NULL;
    p->link    = NULL;
    pbuf_drop(ref);
}

/* Once no frame lands in region r and no send reads it, the answers held for it go. mtx
 * held. */
static void
region_settle(struct region *r)
{
    if (r->landing > 0 || r->sending > 0) {
        return;
    }
    r->held_ms = 0;
    while (r->held != NULL) {
        struct held_answer *h = r->held;
        struct lpart p        = { .in = true, .closure = h->closure, .cd = h->cd, .link = h->link };
        r->held               = h->next;
        lpart_answer(&p, NULL, &h->st, NULL, 0, NULL);
        free(h);
    }
}

/* A frame read into region r has ended. mtx held. */
static void
region_landed(struct region *r)
{
    r->landing--;
    region_settle(r);
}

/* Answers every local rank of c still waiting with st; a rank whose region a frame is being
 * read into, or a send reads or will read (a job queued from it still goes: a peer may need
 * it to reach the same verdict), hears it once none does (region_settle): a frame at most
 * the data link's payload bound later, the sends at most about HELD_SEND_MS (held_sends_cut).
 * mtx held. */
static void
wcall_fail_locals(struct wgroup *g, struct wcall *c, const dc_status *st)
{
    for (size_t i = 0; i < g->workers[g->self].n_ranks; i++) {
        struct lpart *p = &c->local[i];
        struct held_answer *h;
        if (!lpart_waiting(p)) {
            continue;
        }
        if (p->reg != NULL && (p->reg->landing > 0 || p->reg->sending > 0) &&
            (h = malloc(sizeof(*h))) != NULL) {
            *h           = (struct held_answer){ p->closure, p->cd, p->link, *st, p->reg->held };
            p->reg->held = h;
            if (p->reg->held_ms == 0) {
                p->reg->held_ms = rpc_now_ms();
            }
            p->closure = NULL;
            p->link    = NULL;
            continue;
        }
        lpart_answer(p, NULL, st, NULL, 0, NULL);
    }
}

/* Unmaps every region of g (no call may use them any more). mtx held. */
static void
regions_free(struct wgroups *wg, struct wgroup *g)
{
    while (g->regions != NULL) {
        struct region *r = g->regions;
        g->regions       = r->next;
        region_retire(wg, r);
    }
}

/* Ends g's generation with st: every pending call fails, later ones too. mtx held. */
static void
group_end_locked(struct wgroups *wg, struct wgroup *g, const dc_status *st)
{
    if (!g->ended) {
        g->ended = true;
        g->end   = *st;
        log_warn("group %s generation %llu ended: %s", g->id, (unsigned long long)g->generation,
                 st->message);
    }
    while (g->calls != NULL) {
        struct wcall *c = g->calls;
        wcall_unlink(g, c);
        wcall_fail_locals(g, c, st);
        wcall_free(wg, g, c);
    }
    regions_free(wg, g);
}

/* A GroupEnd a peer answered, or did not: nothing to do either way (nng thread). */
static void
end_told(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    (void)arg;
    (void)reply;
    (void)keep;
    if (code != DC_OK) {
        log_debug("a peer did not take a GroupEnd: %s", st->message);
    }
}

/* Ends g here for a reason its peers cannot see (this worker refused the part or the data
 * one of them sent, or lost its data connection), and tells each of them (GroupEnd, not
 * waited for): their ranks then hear why at once, not at their calls' deadline. mtx held. */
static void
group_refuse_locked(struct wgroups *wg, struct wgroup *g, const dc_status *st)
{
    Devcoord__V1__GroupEndRequest req = DEVCOORD__V1__GROUP_END_REQUEST__INIT;
    Devcoord__V1__Status status       = DEVCOORD__V1__STATUS__INIT;

    if (g->ended) {
        return;
    }
    group_end_locked(wg, g, st);
    if (wg->stopping || wg->leaving) {
        /* The peers see this worker go anyway. A GroupEnd sent now would also race the close
         * of the peer's client with the peer's own close (both often stop at once), and
         * nng 1.5.2 can then keep the request's message for good. */
        return;
    }
    status.code    = (Devcoord__V1__Code)st->code;
    status.message = (char *)st->message;
    status.worker  = (char *)st->worker;
    req.group_id   = g->id;
    req.generation = g->generation;
    req.from       = g->self;
    req.status     = &status;
    for (size_t w = 0; w < g->n_workers; w++) {
        dc_status why;
        if (w == g->self || g->workers[w].peer == NULL) {
            continue;
        }
        /* Packed and queued here; a peer that cannot be reached finds out by itself. */
        if (rpc_call_async(g->workers[w].peer->client, WORKER_SVC, M_WORKER_GROUP_END, &req.base,
                           NULL, 0, GROUP_END_TIMEOUT_MS, end_told, NULL, &why) != DC_OK) {
            log_debug("group %s: cannot tell worker %s it ended: %s", g->id, g->workers[w].name,
                      why.message);
        }
    }
}

static void
group_free(struct wgroup *g)
{
    if (g == NULL) {
        return;
    }
    for (size_t w = 0; g->workers != NULL && w < g->n_workers; w++) {
        free(g->workers[w].ranks);
    }
    free(g->workers);
    free(g->names);
    free(g);
}

/* ---- peers ------------------------------------------------------------------------------- */

/* A peer's connection came up or dropped (nng thread): a drop ends every group using it. */
static void
peer_on_connection(void *arg, bool up)
{
    struct wpeer *p    = arg;
    struct wgroups *wg = p->wg;

    pthread_mutex_lock(&wg->mtx);
    if (up) {
        p->was_up = true;
    } else {
        p->stale = true; /* its data link too, most likely: dial again before the next use */
    }
    if (!up && p->was_up && !wg->stopping) {
        for (struct wgroup *g = wg->groups; g != NULL; g = g->next) {
            for (size_t w = 0; w < g->n_workers; w++) {
                if (g->workers[w].peer == p && !g->ended) {
                    dc_status st;
                    status_set(&st, DC_UNAVAILABLE,
                               "worker %s of group %s is unreachable (its connection at %s "
                               "dropped): join again",
                               g->workers[w].name, g->id, p->address);
                    status_set_worker(&st, g->workers[w].name);
                    group_end_locked(wg, g, &st);
                }
            }
        }
    }
    pthread_mutex_unlock(&wg->mtx);
}

/* The connection to the peer at address, opened on first use and kept. mtx held. */
static struct wpeer *
peer_get_locked(struct wgroups *wg, const char *address, dc_status *st)
{
    struct wpeer *p, **grow;

    for (size_t i = 0; i < wg->n_peers; i++) {
        if (strcmp(wg->peers[i]->address, address) == 0) {
            return wg->peers[i];
        }
    }
    if ((grow = realloc(wg->peers, (wg->n_peers + 1) * sizeof(*grow))) == NULL) {
        status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    wg->peers = grow;
    if ((p = calloc(1, sizeof(*p))) == NULL) {
        status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    p->wg = wg;
    clock_cond_init(&p->cv);
    snprintf(p->address, sizeof(p->address), "%s", address);
    if (auth_client_open_watched(address, wg->token, &wg->cfg->tls, wg->cfg->max_message_bytes, 500,
                                 peer_on_connection, p, &p->client, st) != DC_OK) {
        pthread_cond_destroy(&p->cv);
        free(p);
        return NULL;
    }
    wg->peers[wg->n_peers++] = p;
    return p;
}

/* ---- GroupSetup -------------------------------------------------------------------------- */

static dc_code
group_from_setup(struct wgroups *wg, const Devcoord__V1__GroupSetupRequest *in, struct wgroup **out,
                 dc_status *st)
{
    const Devcoord__V1__Plan *plan = in->plan;
    struct wgroup *g               = NULL;
    bool *taken                    = NULL;
    size_t n_taken                 = 0;
    dc_code rv                     = DC_OK;

    if (plan == NULL || plan->n_devices == 0 || plan->n_workers == 0 ||
        plan->n_devices > GROUPS_MAX_RANKS || plan->n_workers > plan->n_devices ||
        in->self >= plan->n_workers || strlen(in->group_id) >= VALIDATE_GROUP_ID_SIZE) {
        return status_set(st, DC_INVALID_ARGUMENT, "malformed group setup");
    }
    if ((g = calloc(1, sizeof(*g))) == NULL ||
        (g->names = calloc(plan->n_devices, sizeof(*g->names))) == NULL ||
        (g->workers = calloc(plan->n_workers, sizeof(*g->workers))) == NULL ||
        (taken = calloc(plan->n_devices, sizeof(*taken))) == NULL) {
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    snprintf(g->id, sizeof(g->id), "%s", in->group_id);
    g->hash       = dlink_group_hash(g->id);
    g->generation = in->generation;
    g->n          = plan->n_devices;
    g->n_workers  = plan->n_workers;
    g->self       = in->self;
    for (size_t r = 0; r < g->n; r++) {
        dc_device_ref ref;
        if (device_ref_from_pb(plan->devices[r], &ref, st) != DC_OK) {
            rv = status_set(st, DC_INVALID_ARGUMENT, "malformed group setup: device %zu", r);
            goto out;
        }
        dc_device_ref_format(&ref, g->names[r], sizeof(g->names[r]));
    }
    /* Every rank on exactly one worker, every worker with at least one. */
    for (size_t w = 0; w < g->n_workers; w++) {
        const Devcoord__V1__PlanWorker *pw = plan->workers[w];
        struct gworker *gw                 = &g->workers[w];
        snprintf(gw->name, sizeof(gw->name), "%s", pw->name);
        if (pw->n_ranks == 0 || pw->n_ranks > g->n ||
            (gw->ranks = calloc(pw->n_ranks, sizeof(*gw->ranks))) == NULL) {
            rv = status_set(st, DC_INVALID_ARGUMENT, "malformed group setup: worker %zu", w);
            goto out;
        }
        for (size_t k = 0; k < pw->n_ranks; k++) {
            if (pw->ranks[k] >= g->n || taken[pw->ranks[k]]) {
                rv = status_set(st, DC_INVALID_ARGUMENT, "malformed group setup: rank");
                goto out;
            }
            gw->ranks[k]        = pw->ranks[k];
            taken[pw->ranks[k]] = true;
            n_taken++;
        }
        gw->n_ranks = pw->n_ranks;
    }
    if (n_taken != g->n) {
        rv = status_set(st, DC_INVALID_ARGUMENT, "malformed group setup: ranks of no worker");
        goto out;
    }
    for (size_t w = 0; w < g->n_workers; w++) {
        if (w != g->self &&
            (g->workers[w].peer = peer_get_locked(wg, plan->workers[w]->address, st)) == NULL) {
            rv = st->code;
            goto out;
        }
    }
out:
    free(taken);
    if (rv != DC_OK) {
        group_free(g);
        return rv;
    }
    *out = g;
    return DC_OK;
}

static dc_code link_start_locked(struct wgroups *wg, dc_status *st);

void
wgroups_setup(struct wgroups *wg, const Devcoord__V1__GroupSetupRequest *in,
              Devcoord__V1__GroupSetupResponse_Closure closure, void *cd)
{
    Devcoord__V1__GroupSetupResponse out = DEVCOORD__V1__GROUP_SETUP_RESPONSE__INIT;
    struct wgroup *g                     = NULL, *old;
    dc_status st;
    dc_code code;

    status_clear(&st);
    pthread_mutex_lock(&wg->mtx);
    old = wg->stopping ? NULL : group_find(wg, in->group_id);
    if (!wg->stopping && old == NULL && wg->n_groups >= GROUPS_MAX) {
        /* Make room: the oldest group with no call in progress goes. */
        struct wgroup **victim = NULL;
        for (struct wgroup **pp = &wg->groups; *pp != NULL; pp = &(*pp)->next) {
            if ((*pp)->calls == NULL) {
                victim = pp;
            }
        }
        if (victim != NULL) {
            struct wgroup *v = *victim;
            *victim          = v->next;
            regions_free(wg, v);
            group_free(v);
            wg->n_groups--;
        }
    }
    if (wg->stopping) {
        code = status_set(&st, DC_UNAVAILABLE, "worker shutting down");
    } else if ((code = link_start_locked(wg, &st)) != DC_OK) {
        log_error("cannot open the data link for group %s: %s", in->group_id, st.message);
    } else if (old == NULL && wg->n_groups >= GROUPS_MAX) {
        code = status_set(&st, DC_RESOURCE_EXHAUSTED, "too many groups on this worker (%d)",
                          GROUPS_MAX);
    } else if ((code = group_from_setup(wg, in, &g, &st)) == DC_OK) {
        if (old != NULL) {
            dc_status why;
            status_set(&why, DC_ABORTED, "group %s generation %llu was replaced by generation %llu",
                       old->id, (unsigned long long)old->generation,
                       (unsigned long long)g->generation);
            group_end_locked(wg, old, &why);
            for (struct wgroup **pp = &wg->groups; *pp != NULL; pp = &(*pp)->next) {
                if (*pp == old) {
                    *pp = old->next;
                    break;
                }
            }
            group_free(old);
            wg->n_groups--;
        }
        g->next    = wg->groups;
        wg->groups = g;
        wg->n_groups++;
    }
    pthread_mutex_unlock(&wg->mtx);
    if (code != DC_OK) {
        *rpc_call_status(cd)      = st;
        rpc_call_status(cd)->code = code;
        closure(NULL, cd);
        return;
    }
    closure(&out, cd);
}

/* ---- computing a call -------------------------------------------------------------------- */

/* Whether r's object shrank under an access (the guard put zero pages there): if so st says
 * so, and r is refused from then on. mtx held. */
static bool
region_shrank(const struct wgroup *g, struct region *r, dc_status *st)
{
    if (r == NULL || (!r->shrunk && !shmguard_broken(r->slot))) {
        return false;
    }
    if (!r->shrunk) {
        r->shrunk = true;
        log_warn("group %s: shared memory region %llu of rank %u shrank under the worker; "
                 "refusing it until it is unmapped",
                 g->id, (unsigned long long)r->id, r->rank);
    }
    status_set(st, DC_INVALID_ARGUMENT,
               "shared memory region %llu of rank %u shrank under the worker (its object was "
               "truncated after GroupMap; unmap it and map a new one)",
               (unsigned long long)r->id, r->rank);
    return true;
}

/* This worker's part of c: its ranks' data reduced (all-reduce, reduce), the root's (broadcast,
 * when it is here) or concatenated in rank order (all-gather). mtx held. */
static dc_code check_desc(const struct wgroups *wg, const struct wgroup *g, const struct desc *d,
                          bool shared, dc_status *st);

/* The most bytes a part of a call from a peer may have: one message's, or a call's on shared
 * memory (its input lies in one region of a rank: at most groups.shm_max_bytes). What peers'
 * parts hold at once is bounded apart (max_held). */
static uint64_t
group_part_max(const struct wgroups *wg)
{
    uint64_t most = wg->cfg->max_message_bytes;

    return wg->cfg->group_shm_max_bytes > most ? wg->cfg->group_shm_max_bytes : most;
}

/* Whether every rank of c on this worker is in, each on its shared memory. mtx held. */
static bool
wcall_local_shared(const struct wgroup *g, const struct wcall *c)
{
    const struct gworker *me = &g->workers[g->self];

    for (size_t i = 0; i < me->n_ranks; i++) {
        if (!c->local[i].in || !c->local[i].d.shared) {
            return false;
        }
    }
    return true;
}

/* Whether bytes at a and at b, a_len and b_len of them, share any. */
static bool
bytes_overlap(const uint8_t *a, size_t a_len, const uint8_t *b, size_t b_len)
{
    return a < b + b_len && b < a + a_len;
}

/* Whether reduce-scatter or all-gather c's results (out_bytes each) are fit for lreduce: each
 * overlaps no input, or is exactly its rank's own block (of block bytes) of its input (a
 * reduce-scatter's), or its input is exactly its own block of it (an all-gather's). Each
 * result is checked against every input: IN_PLACE_BLOCKS_MAX ranks at most. mtx held. */
#define IN_PLACE_BLOCKS_MAX 64
static bool
block_outs_apart(const struct wgroup *g, const struct wcall *c, size_t block, size_t out_bytes)
{
    const struct gworker *me = &g->workers[g->self];
    bool gather              = c->local[0].d.kind == DC_OP_ALL_GATHER;

    if (me->n_ranks > IN_PLACE_BLOCKS_MAX) {
        return false;
    }
    for (size_t i = 0; i < me->n_ranks; i++) {
        const struct lpart *p = &c->local[i];
        size_t own            = (size_t)me->ranks[i] * block; /* its block's offset */
        bool aliased          = gather ? p->data == p->out + own : p->out == p->data + own;
        for (size_t k = 0; k < me->n_ranks; k++) {
            const struct lpart *q = &c->local[k];
            if (bytes_overlap(p->out, out_bytes, q->data, q->bytes) && !(k == i && aliased)) {
                return false;
            }
        }
    }
    return true;
}

/* Whether reduce or broadcast c, each rank's buffer (bytes) its input and its result, has
 * its root's buffer apart from every other rank's: the one written is never read. mtx
 * held. */
static bool
rooted_apart(const struct wgroup *g, const struct wcall *c, size_t bytes)
{
    const struct gworker *me = &g->workers[g->self];
    bool found;
    size_t root = local_index(g, c->local[0].d.root, &found);

    if (!found) {
        return false;
    }
    for (size_t i = 0; i < me->n_ranks; i++) {
        if (c->local[i].out != c->local[i].data ||
            (i != root && bytes_overlap(c->local[root].data, bytes, c->local[i].data, bytes))) {
            return false;
        }
    }
    return true;
}

/* Whether c runs in place in its ranks' shared memory (wcall_finish_in_place): a call of a
 * group whose ranks are all on this worker, every one on its region, all agreeing and well
 * formed, and any kind but a barrier. An all-reduce's results are where their inputs are or
 * overlap them nowhere, rank order's first aligned for the dtype; a reduce-scatter's and
 * all-gather's, as block_outs_apart; a reduce's and broadcast's, as rooted_apart. Anything
 * else takes the general path. mtx held. */
static bool
wcall_in_place(const struct wgroups *wg, const struct wgroup *g, const struct wcall *c)
{
    const struct gworker *me = &g->workers[g->self];
    const struct desc *d     = &c->local[0].d;
    size_t elem = dc_dtype_size(d->dtype), block = (size_t)d->count * elem, in_bytes, out_bytes;
    bool blocks = d->kind == DC_OP_REDUCE_SCATTER || d->kind == DC_OP_ALL_GATHER;
    bool rooted = d->kind == DC_OP_REDUCE || d->kind == DC_OP_BROADCAST;
    dc_status why;

    if (g->n_workers != 1 || me->n_ranks != g->n ||
        (d->kind != DC_OP_ALL_REDUCE && !blocks && !rooted) || c->shrunk.code != DC_OK ||
        check_desc(wg, g, d, wcall_local_shared(g, c), &why) != DC_OK) {
        return false;
    }
    in_bytes  = d->kind == DC_OP_REDUCE_SCATTER ? block * g->n : block;
    out_bytes = d->kind == DC_OP_ALL_GATHER ? block * g->n : block;
    for (size_t i = 0; i < me->n_ranks; i++) {
        const struct lpart *p = &c->local[i];
        if (!p->in || p->reg == NULL || p->data == NULL || p->out == NULL || p->bytes != in_bytes ||
            desc_differs(&p->d, d) ||
            (!blocks && p->out != p->data && bytes_overlap(p->out, block, p->data, block))) {
            return false;
        }
    }
    return blocks   ? block_outs_apart(g, c, block, out_bytes)
           : rooted ? rooted_apart(g, c, block)
                    : (uintptr_t)c->local[0].out % elem == 0;
}

/* c (wcall_in_place) reduced (or gathered) straight from its ranks' regions into theirs,
 * split over the worker's reducing threads, and answered: no buffer, no copy but the
 * results'. mtx held. */
static void
wcall_finish_in_place(struct wgroups *wg, struct wgroup *g, struct wcall *c)
{
    const struct gworker *me            = &g->workers[g->self];
    Devcoord__V1__GroupCallResponse out = DEVCOORD__V1__GROUP_CALL_RESPONSE__INIT;
    struct lreduce_job j                = { .dtype = c->local[0].d.dtype,
                                            .op    = c->local[0].d.reduce,
                                            .count = (size_t)c->local[0].d.count,
                                            .n     = me->n_ranks,
                                            .in    = wg->lr_in,
                                            .out   = wg->lr_out };
    dc_op_kind kind                     = c->local[0].d.kind;
    bool found;
    size_t root = local_index(g, c->local[0].d.root, &found); /* a reduce's, a broadcast's */
    dc_status st;

    for (size_t i = 0; i < me->n_ranks; i++) {
        /* By rank where a rank's block is: a reduce-scatter's results, an all-gather's
         * inputs. */
        wg->lr_in[kind == DC_OP_ALL_GATHER ? me->ranks[i] : i]      = c->local[i].data;
        wg->lr_out[kind == DC_OP_REDUCE_SCATTER ? me->ranks[i] : i] = c->local[i].out;
    }
    switch (kind) {
    case DC_OP_REDUCE_SCATTER:
    case DC_OP_ALL_GATHER:
        j.block  = j.count;
        j.count  = j.count * me->n_ranks;
        j.gather = kind == DC_OP_ALL_GATHER;
        break;
    case DC_OP_REDUCE: /* every input into the root's buffer alone */
        j.block       = j.count;
        j.n_out       = 1;
        wg->lr_out[0] = c->local[root].out;
        break;
    case DC_OP_BROADCAST: /* the root's input into every buffer (but its own) */
        j.block      = j.count;
        j.gather     = true;
        j.n          = 1;
        j.n_out      = me->n_ranks;
        wg->lr_in[0] = c->local[root].data;
        break;
    default:
        break;
    }
    if (!lreduce_run(wg->lr, &j, LREDUCE_MIN_SLICE_BYTES)) {
        /* wcall_in_place let through a call whose job does not add up: none was touched. */
        status_set(&st, DC_INTERNAL,
                   "group %s call %llu: the worker's in-place %s of %zu elements for %zu ranks "
                   "does not add up (a bug: please report it)",
                   g->id, (unsigned long long)c->seq, dc_op_kind_name(kind), j.count, j.n);
        wcall_fail_locals(g, c, &st);
        return;
    }
    for (size_t i = 0; i < me->n_ranks; i++) {
        if (region_shrank(g, c->local[i].reg, &st)) {
            /* Zeros went into every rank's result: the call fails for all of them. */
            wcall_fail_locals(g, c, &st);
            return;
        }
    }
    out.elapsed_us = rpc_now_us() - c->first_us;
    for (size_t i = 0; i < me->n_ranks; i++) {
        wg->shm_calls_total++;
        lpart_answer(&c->local[i], &out, NULL, NULL, 0, NULL);
    }
    g->calls_done++;
    wg->in_place_total++;
    wg->calls_total[kind]++;
    histo_observe(&wg->call_seconds, out.elapsed_us);
}

/* Whether a reduce-scatter of g can go round the ring (struct ring): each worker's ranks
 * are consecutive in rank order, so its blocks of the result are one segment. */
static bool
ring_scatter_fits(const struct wgroup *g)
{
    for (size_t w = 0; w < g->n_workers; w++) {
        const struct gworker *gw = &g->workers[w];
        for (size_t k = 1; k < gw->n_ranks; k++) {
            if (gw->ranks[k] != gw->ranks[0] + k) {
                return false;
            }
        }
    }
    return true;
}

/* Whether a call of this kind, with a part of `bytes` per worker, goes round the ring of g's
 * workers: an all-reduce of at least GROUPS_RING_MIN_BYTES, 8 bytes a worker or more, or a
 * reduce-scatter of that size whose workers' ranks are consecutive. */
static bool
ring_fits(const struct wgroup *g, dc_op_kind kind, size_t bytes)
{
    if (g->n_workers < 2 || bytes < GROUPS_RING_MIN_BYTES) {
        return false;
    }
    if (kind == DC_OP_REDUCE_SCATTER) {
        return bytes % g->n == 0 && ring_scatter_fits(g);
    }
    return kind == DC_OP_ALL_REDUCE && bytes / 8 >= g->n_workers;
}

/* Whether c's ring can run in its first local rank's region: an all-reduce for the ring,
 * every rank of this worker in place on shared memory, no two ranks' buffers overlapping
 * (IN_PLACE_BLOCKS_MAX ranks at most: the check is quadratic). mtx held. */
static bool
wcall_ring_in_region(const struct wgroup *g, const struct wcall *c)
{
    size_t n = g->workers[g->self].n_ranks;

    if (n > IN_PLACE_BLOCKS_MAX || c->local[0].d.kind != DC_OP_ALL_REDUCE ||
        !ring_fits(g, c->local[0].d.kind, c->local[0].bytes)) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const struct lpart *p = &c->local[i];
        if (!p->in || p->reg == NULL || p->reg->shrunk || p->out == NULL || p->out != p->data ||
            p->bytes != c->local[0].bytes) {
            return false;
        }
        for (size_t j = 0; j < i; j++) {
            if (bytes_overlap(p->data, p->bytes, c->local[j].data, c->local[j].bytes)) {
                return false;
            }
        }
    }
    return true;
}

/* Whether reduce-scatter c (a part of bytes) goes round the ring reading its inputs in place:
 * every rank of this worker's on shared memory, whole. mtx held. */
static bool
wcall_scatter_in_regions(const struct wgroup *g, const struct wcall *c, size_t bytes)
{
    if (c->local[0].d.kind != DC_OP_REDUCE_SCATTER || !ring_fits(g, DC_OP_REDUCE_SCATTER, bytes)) {
        return false;
    }
    for (size_t i = 0; i < g->workers[g->self].n_ranks; i++) {
        const struct lpart *p = &c->local[i];
        if (!p->in || p->buf != NULL || p->reg == NULL || p->reg->shrunk) {
            return false;
        }
    }
    return true;
}

/* Lists in c->fold the inputs of this worker's ranks but the first, with a slot after them
 * for the ring's rs_in (none with one rank). false when out of memory. mtx held. */
static bool
wcall_fold_others(const struct wgroup *g, struct wcall *c)
{
    size_t n = g->workers[g->self].n_ranks;

    if (n > 1 && (c->fold = calloc(n, sizeof(*c->fold))) == NULL) {
        return false;
    }
    for (size_t i = 1; i < n; i++) {
        c->fold[c->n_fold++] = c->local[i].data;
    }
    return true;
}

static dc_code
wcall_make_mine(struct wgroups *wg, struct wgroup *g, struct wcall *c, dc_status *st)
{
    const struct gworker *me = &g->workers[g->self];
    const struct desc *d     = &c->local[0].d;
    size_t bytes             = c->local[0].bytes;

    dc_status why;

    if (wcall_in_place(wg, g, c)) {
        return DC_OK; /* nothing to send: wcall_finish_in_place reads the regions */
    }
    for (size_t i = 1; i < me->n_ranks; i++) {
        if (desc_differs(&c->local[i].d, d)) {
            return DC_OK; /* no data: every worker will see the disagreement in the descs */
        }
    }
    if (check_desc(wg, g, d, wcall_local_shared(g, c), &why) != DC_OK) {
        return DC_OK; /* no data either: every worker will refuse the call */
    }
    switch (d->kind) {
    case DC_OP_ALL_REDUCE:
        if (wcall_ring_in_region(g, c)) {
            /* The ring reduces straight in the first rank's region, which ends holding the
             * result: no copy in, none out for that rank (wcall_try_finish answers it last,
             * once no send reads it any more). The other ranks' inputs are reduced in
             * segment by segment with the ring's (c->fold): one pass over each. */
            if ((c->mine_buf = pbuf_wrap(c->local[0].reg, c->local[0].out, bytes)) == NULL ||
                !wcall_fold_others(g, c)) {
                return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            }
            c->mine       = c->mine_buf->data;
            c->mine_bytes = bytes;
            break;
        }
        /* fall through */
    case DC_OP_REDUCE:
    case DC_OP_REDUCE_SCATTER:
        if (wcall_scatter_in_regions(g, c, bytes)) {
            /* Round the ring, read in place in the ranks' regions (in_buf the first's, the
             * others' in c->fold; only read: reduced from into mine_buf, and sent from when
             * alone): the ring's accumulator starts empty, each segment written once, by its
             * reduce (ring_start, ring_advance). */
            if ((c->in_buf = pbuf_wrap(c->local[0].reg, (uint8_t *)c->local[0].data, bytes)) ==
                    NULL ||
                (c->mine_buf = pbuf_new(wg, bytes)) == NULL || !wcall_fold_others(g, c)) {
                return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            }
        } else if (d->kind != DC_OP_REDUCE && c->local[0].buf != NULL) {
            /* The first rank's bytes, read by its call link into a buffer of their own: the
             * part is reduced in them, no copy (not for a reduce: it answers a rank that is
             * not its root with its own bytes unchanged). */
            c->mine_buf = pbuf_hold(c->local[0].buf);
        } else if ((c->mine_buf = pbuf_new(wg, bytes)) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        } else {
            memcpy(c->mine_buf->data, c->local[0].data, bytes);
        }
        c->mine = c->mine_buf->data;
        for (size_t i = 1; i < me->n_ranks && c->in_buf == NULL; i++) {
            reduce_into(d->dtype, d->reduce, c->mine, c->local[i].data, input_elements(d, g->n));
        }
        c->mine_bytes = bytes;
        break;
    case DC_OP_BROADCAST:
        for (size_t i = 0; i < me->n_ranks; i++) {
            if (me->ranks[i] == d->root) {
                if ((c->mine_buf = pbuf_new(wg, bytes)) == NULL) {
                    return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
                }
                c->mine = c->mine_buf->data;
                memcpy(c->mine, c->local[i].data, bytes);
                c->mine_bytes = bytes;
            }
        }
        break;
    case DC_OP_ALL_GATHER:
        if ((c->mine_buf = pbuf_new(wg, bytes * me->n_ranks)) == NULL) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        c->mine = c->mine_buf->data;
        for (size_t i = 0; i < me->n_ranks; i++) {
            memcpy(c->mine + i * bytes, c->local[i].data, bytes);
        }
        c->mine_bytes = bytes * me->n_ranks;
        break;
    default:
        break;
    }
    for (size_t i = 0; i < me->n_ranks; i++) {
        if (region_shrank(g, c->local[i].reg, &c->shrunk)) {
            /* Zeros are no one's data: send none, the call fails here (and at the peers). */
            pbuf_drop(c->mine_buf);
            pbuf_drop(c->in_buf);
            c->in_buf     = NULL;
            c->mine_buf   = NULL;
            c->mine       = NULL;
            c->mine_bytes = 0;
            break;
        }
    }
    return DC_OK;
}

static uint32_t ring_steps(const struct ring *r);

/* The data worker w contributed to c (this worker's own part for self). */
static const uint8_t *
part_data(const struct wgroup *g, const struct wcall *c, size_t w, size_t *bytes)
{
    if (w == g->self) {
        *bytes = c->mine_bytes;
        return c->mine;
    }
    *bytes = c->peer[w].has_data ? c->peer[w].bytes : 0;
    return c->peer[w].has_data ? c->peer[w].data : NULL;
}

/* Whether every local rank of c takes its result in its region. mtx held. */
static bool
wcall_outs_shared(const struct wgroup *g, const struct wcall *c)
{
    for (size_t i = 0; i < g->workers[g->self].n_ranks; i++) {
        if (c->local[i].out == NULL) {
            return false;
        }
    }
    return true;
}

/* All-gather c's result (bytes a rank) put together at out from every worker's part (this
 * worker's own the copy wcall_make_mine made: no source is in a rank's region), but for
 * block `skip` when that block is already there (the rank's input is it). mtx held. */
static void
wcall_gather_into(const struct wgroup *g, const struct wcall *c, uint8_t *out, size_t bytes,
                  size_t skip)
{
    for (size_t w = 0; w < g->n_workers; w++) {
        size_t nb;
        const uint8_t *p         = part_data(g, c, w, &nb);
        const struct gworker *gw = &g->workers[w];
        for (size_t k = 0; k < gw->n_ranks; k++) {
            if (gw->ranks[k] != skip) {
                memcpy(out + (size_t)gw->ranks[k] * bytes, p + k * bytes, bytes);
            }
        }
    }
}

/* Every rank's desc in rank order, from this worker's calls and the peers' parts. */
static void
wcall_descs(const struct wgroup *g, const struct wcall *c, struct desc *out)
{
    for (size_t w = 0; w < g->n_workers; w++) {
        const struct gworker *gw = &g->workers[w];
        for (size_t k = 0; k < gw->n_ranks; k++) {
            out[gw->ranks[k]] = w == g->self ? c->local[k].d : c->peer[w].d[k];
        }
    }
}

/* The call's result into *res (res_bytes of its data; NULL when it has none), the same
 * bytes on every worker. The caller drops *res. mtx held. */
/* Why two ranks' descs of one call may differ in count: one made it whole, one in parts. */
static const char *
split_hint(const struct desc *a, const struct desc *b)
{
    if ((a->total == 0) == (b->total == 0) || a->kind != b->kind || a->count == b->count) {
        return "";
    }
    return ": one made a call larger than one message whole (on shared memory), the other in "
           "parts (it could not share memory with its worker); every rank of a group must, or "
           "none";
}

static dc_code
wcall_compute(struct wgroups *wg, struct wgroup *g, struct wcall *c, struct pbuf **res,
              size_t *res_bytes, dc_status *st)
{
    struct desc *all = calloc(g->n, sizeof(*all));
    const struct desc *d;
    size_t elem, bytes, nb;
    uint8_t *out;
    dc_code rv  = DC_OK;
    bool shared = true;

    *res       = NULL;
    *res_bytes = 0;
    if (all == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    wcall_descs(g, c, all);
    for (size_t r = 1; r < g->n; r++) {
        if (desc_differs(&all[r], &all[0])) {
            char mine[64], first[64];
            desc_text(&all[r], &all[0], mine, sizeof(mine));
            desc_text(&all[0], &all[r], first, sizeof(first));
            /* client/group.c (group_call_piece) knows these words: keep them. */
            rv = status_set(st, DC_INVALID_ARGUMENT,
                            "rank %zu (%s) passed %s, rank 0 passed %s (group %s, call %llu)%s", r,
                            g->names[r], mine, first, g->id, (unsigned long long)c->seq,
                            split_hint(&all[r], &all[0]));
            goto out;
        }
    }
    d = &all[0];
    for (size_t r = 0; r < g->n; r++) {
        shared = shared && all[r].shared;
    }
    if ((rv = check_desc(wg, g, d, shared, st)) != DC_OK) {
        goto out;
    }
    elem  = dc_dtype_size(d->dtype);
    bytes = input_elements(d, g->n) * elem;
    if (!kind_has_data(d->kind)) {
        goto out;
    }
    if (c->ring != NULL && c->ring->acc != NULL && !c->ring->broken &&
        c->ring->done == ring_steps(c->ring) && c->ring->bytes == bytes) {
        /* Round the ring: every worker holds the same reduced bytes already (a scatter's:
         * the blocks of this worker's ranks, where its answers read). The answers only read
         * them (the sender may still be reading them too): no copy, one buffer fewer per
         * call, but for a mean, which is finished in a buffer of its own. */
        if (c->ring->scatter) {
            wg->ring_scatter_total++;
        } else {
            wg->ring_calls_total++;
            wg->ring_in_region_total +=
                c->mine_buf != NULL && c->mine_buf == c->ring->acc && c->mine_buf->reg != NULL;
        }
        if (d->reduce != DC_REDUCE_MEAN) {
            *res       = pbuf_hold(c->ring->acc);
            *res_bytes = bytes;
            goto out;
        }
        if ((*res = pbuf_new(wg, bytes)) == NULL) {
            rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        memcpy((*res)->data, c->ring->acc->data, bytes);
        *res_bytes = bytes;
        reduce_finish_mean(d->dtype, (*res)->data, input_elements(d, g->n), g->n);
        goto out;
    }
    for (size_t w = 0; w < g->n_workers; w++) {
        size_t want      = d->kind == DC_OP_ALL_GATHER ? bytes * g->workers[w].n_ranks : bytes;
        const uint8_t *p = part_data(g, c, w, &nb);
        bool needs       = d->kind != DC_OP_BROADCAST;
        if (d->kind == DC_OP_BROADCAST) {
            for (size_t k = 0; k < g->workers[w].n_ranks; k++) {
                needs = needs || g->workers[w].ranks[k] == d->root;
            }
        }
        if (needs && (p == NULL || nb != want)) {
            rv = status_set(st, DC_INTERNAL, "group call %llu: worker %s sent %zu bytes, not %zu",
                            (unsigned long long)c->seq, g->workers[w].name, nb, want);
            goto out;
        }
    }
    nb = d->kind == DC_OP_ALL_GATHER ? bytes * g->n : bytes;
    if (d->kind == DC_OP_ALL_GATHER && wcall_outs_shared(g, c)) {
        *res_bytes = nb; /* no res: wcall_gather_into puts each rank's result together */
        goto out;
    }
    if ((*res = pbuf_new(wg, nb)) == NULL) {
        rv = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    out        = (*res)->data;
    *res_bytes = nb;
    for (size_t w = 0; w < g->n_workers; w++) {
        size_t pb;
        const uint8_t *p         = part_data(g, c, w, &pb);
        const struct gworker *gw = &g->workers[w];
        switch (d->kind) {
        case DC_OP_ALL_REDUCE:
        case DC_OP_REDUCE:
        case DC_OP_REDUCE_SCATTER:
            if (w == 0) {
                memcpy(out, p, bytes);
            } else {
                reduce_into(d->dtype, d->reduce, out, p, input_elements(d, g->n));
            }
            break;
        case DC_OP_BROADCAST:
            if (p != NULL) {
                memcpy(out, p, bytes);
            }
            break;
        case DC_OP_ALL_GATHER:
            for (size_t k = 0; k < gw->n_ranks; k++) {
                memcpy(out + (size_t)gw->ranks[k] * bytes, p + k * bytes, bytes);
            }
            break;
        default:
            break;
        }
    }
    if (d->reduce == DC_REDUCE_MEAN && kind_uses_reduce(d->kind)) {
        reduce_finish_mean(d->dtype, out, input_elements(d, g->n), g->n);
    }
out:
    free(all);
    return rv;
}

/* Whether every rank passed what rank 0 did (all descs are in). mtx held. */
static bool
wcall_agrees(const struct wgroup *g, const struct wcall *c)
{
    struct desc *all = calloc(g->n, sizeof(*all));
    bool same        = all != NULL;

    if (all != NULL) {
        wcall_descs(g, c, all);
        for (size_t r = 1; r < g->n && same; r++) {
            same = !desc_differs(&all[r], &all[0]);
        }
    }
    free(all);
    return same;
}

/* How many of c's local ranks hold the buffer its part is in (read into it by their call
 * link, wcall_make_mine). mtx held. */
static size_t
wcall_aliases(const struct wgroup *g, const struct wcall *c)
{
    size_t n = 0;

    for (size_t i = 0; i < g->workers[g->self].n_ranks; i++) {
        n += c->local[i].buf != NULL && c->local[i].buf == c->mine_buf;
    }
    return n;
}

/* Once c's result is made (and holds the ring's buffer if it is the result): c lets go of the
 * buffer its part is in, so the answers hold the last references. mtx held. */
static void
wcall_let_go_of_part(struct wcall *c)
{
    struct pbuf *mine = c->mine_buf;

    if (mine == NULL) {
        return;
    }
    for (size_t i = 0; i < c->n_local_in; i++) {
        if (c->local[i].buf == mine) {
            c->local[i].buf = NULL;
            pbuf_drop(mine);
        }
    }
    if (c->ring != NULL && c->ring->acc == mine) {
        c->ring->acc = NULL;
        pbuf_drop(mine);
    }
    c->mine_buf = NULL;
    c->mine     = NULL;
    pbuf_drop(mine);
}

/* Answers c's local ranks when every part is in, and frees it. mtx held. */
static void
wcall_try_finish(struct wgroups *wg, struct wgroup *g, struct wcall *c)
{
    const struct gworker *me            = &g->workers[g->self];
    Devcoord__V1__GroupCallResponse out = DEVCOORD__V1__GROUP_CALL_RESPONSE__INIT;
    struct pbuf *res                    = NULL;
    size_t res_bytes                    = 0;
    dc_status st;
    dc_op_kind kind;

    if (c->n_local_in < me->n_ranks || c->n_peer_in + 1 < g->n_workers || !c->sent) {
        return;
    }
    for (size_t w = 0; w < g->n_workers; w++) {
        if (c->peer[w].buf != NULL && c->peer[w].received < c->peer[w].bytes) {
            return; /* its bytes are still on the data link */
        }
    }
    if (c->ring != NULL && c->ring->done < ring_steps(c->ring) && !c->ring->broken &&
        c->shrunk.code == DC_OK && wcall_agrees(g, c)) {
        return; /* still going round the ring */
    }
    if (c->in_buf != NULL && c->shrunk.code == DC_OK && atomic_load(&c->in_buf->refs) > 1) {
        return; /* a send from the rank's input is still going: its end calls this again */
    }
    if (c->mine_buf != NULL && c->ring != NULL && c->ring->acc == c->mine_buf &&
        c->shrunk.code == DC_OK && atomic_load(&c->mine_buf->refs) > 2 + wcall_aliases(g, c)) {
        /* A send from the ring's bytes or a frame into them is still going; the last one to
         * end calls this again. In a rank's region (wcall_ring_in_region), its answer must not
         * come before; in a buffer, the rank's next call would take another while this one
         * lives (a buffer more per worker, issue 17's flat RSS). */
        return;
    }
    wcall_unlink(g, c);
    status_clear(&st);
    kind = c->local[0].d.kind;
    if (c->shrunk.code != DC_OK) {
        wcall_fail_locals(g, c, &c->shrunk);
    } else if (wcall_in_place(wg, g, c)) {
        wcall_finish_in_place(wg, g, c);
    } else if (wcall_compute(wg, g, c, &res, &res_bytes, &st) != DC_OK) {
        log_info("group %s call %llu failed: %s", g->id, (unsigned long long)c->seq, st.message);
        wcall_fail_locals(g, c, &st);
    } else {
        const uint8_t *result = res != NULL ? res->data : NULL;
        /* The ring ran in the first rank's region (wcall_ring_in_region), which the others'
         * results were copied from as they came (ring_copies_out): it is answered last, or
         * its next call could write it first. */
        size_t first = result != NULL && result == c->local[0].out && me->n_ranks > 1;
        /* An all-gather with no result buffer (every result in a region, wcall_compute). */
        bool gather    = kind == DC_OP_ALL_GATHER && result == NULL && res_bytes > 0;
        out.elapsed_us = rpc_now_us() - c->first_us;
        if (!gather) {
            wcall_let_go_of_part(c); /* wcall_gather_into reads this worker's part below */
        }
        for (size_t j = 0; j < me->n_ranks; j++) {
            size_t i        = (j + first) % me->n_ranks;
            struct lpart *p = &c->local[i];
            const uint8_t *give;
            size_t give_bytes;
            struct pbuf *ref = NULL; /* for the answer, which takes it over */
            bool unchanged   = kind == DC_OP_REDUCE && me->ranks[i] != p->d.root;
            if (unchanged) {
                give       = p->data; /* unchanged */
                give_bytes = p->bytes;
                ref        = p->buf;
                p->buf     = NULL;
            } else if (kind == DC_OP_REDUCE_SCATTER) {
                give_bytes = res_bytes / g->n; /* this rank's block of the result */
                give       = result + (size_t)me->ranks[i] * give_bytes;
            } else {
                give       = result;
                give_bytes = res_bytes;
            }
            if (!unchanged) {
                /* The last rank takes the call's own hold of the result: once its answer is
                 * written, nothing here holds the buffer for the rank's next call to wait on. */
                ref = j + 1 == me->n_ranks ? res : res != NULL ? pbuf_hold(res) : NULL;
                res = j + 1 == me->n_ranks ? NULL : res;
            }
            if (p->out != NULL) {
                /* Shared memory: the result in place, checked against the region at the call. */
                if (gather) {
                    size_t block = give_bytes / g->n, own = me->ranks[i];
                    wcall_gather_into(g, c, p->out, block,
                                      p->data == p->out + own * block ? own : SIZE_MAX);
                } else if (give != p->out && give_bytes > 0 && !first) {
                    memmove(p->out, give, give_bytes);
                }
                wg->shm_calls_total++;
                if (region_shrank(g, p->reg, &st)) {
                    lpart_answer(p, NULL, &st, NULL, 0, ref);
                    continue;
                }
                give_bytes = 0;
            }
            wg->call_bytes_out += give_bytes;
            lpart_answer(p, &out, NULL, give, give_bytes, ref);
        }
        g->calls_done++;
        if ((unsigned)kind < KINDS) {
            wg->calls_total[kind]++;
        }
        histo_observe(&wg->call_seconds, out.elapsed_us);
    }
    pbuf_drop(res);
    wcall_free(wg, g, c);
}

/* ---- the exchange ------------------------------------------------------------------------ */

struct exch_ctx {
    struct wgroups *wg;
    char group_id[VALIDATE_GROUP_ID_SIZE];
    uint64_t generation;
    size_t to;
};

/* A peer answered (or did not answer) this worker's part (nng thread). */
static void
exch_done(void *arg, dc_code code, const dc_status *st, struct rpc_reply *reply, bool *keep)
{
    struct exch_ctx *x = arg;
    struct wgroup *g;

    (void)reply;
    (void)keep;
    if (code != DC_OK) {
        struct wgroups *wg = x->wg;
        pthread_mutex_lock(&x->wg->mtx);
        g = group_find(x->wg, x->group_id);
        if (g != NULL && g->generation == x->generation && !g->ended && !x->wg->stopping) {
            dc_status end;
            status_set(&end, code == DC_INVALID_ARGUMENT ? DC_INVALID_ARGUMENT : DC_UNAVAILABLE,
                       "worker %s of group %s: %s", g->workers[x->to].name, g->id, st->message);
            status_set_worker(&end, g->workers[x->to].name);
            group_end_locked(wg, g, &end);
        }
        pthread_mutex_unlock(&x->wg->mtx);
    }
    free(x);
}

/* ---- the data link: sending ------------------------------------------------------------- */

/* Ends every group that uses peer p with UNAVAILABLE: why says what failed. The other
 * workers are told (group_refuse_locked): a peer whose data connection dropped may well be
 * alive, and would otherwise wait for this worker's parts until its calls' deadline. mtx
 * held. */
static void
peer_lost_locked(struct wgroups *wg, const char *address, const char *why)
{
    if (wg->stopping) {
        return;
    }
    for (struct wgroup *g = wg->groups; g != NULL; g = g->next) {
        for (size_t w = 0; w < g->n_workers; w++) {
            if (g->workers[w].peer != NULL && strcmp(g->workers[w].peer->address, address) == 0 &&
                !g->ended) {
                dc_status st;
                status_set(&st, DC_UNAVAILABLE,
                           "worker %s of group %s is unreachable (%s, at %s): join again",
                           g->workers[w].name, g->id, why, address);
                status_set_worker(&st, g->workers[w].name);
                group_refuse_locked(wg, g, &st);
            }
        }
    }
}

/* Asks the peer where its data link listens (GroupLink) and dials it. Sender thread, no lock. */
static dc_code
peer_link(struct wgroups *wg, struct wpeer *p, struct dlink_out **out, uint32_t *features,
          dc_status *st)
{
    Devcoord__V1__GroupLinkRequest req = DEVCOORD__V1__GROUP_LINK_REQUEST__INIT;
    Devcoord__V1__GroupLinkResponse *resp;
    struct rpc_reply reply;
    dc_code code;
    char host[256];

    memset(&reply, 0, sizeof(reply));
    if ((code = rpc_call(p->client, WORKER_SVC, M_WORKER_GROUP_LINK, &req.base, NULL, 0, 2000,
                         &reply, st)) != DC_OK) {
        rpc_reply_free(&reply);
        return code;
    }
    resp = (Devcoord__V1__GroupLinkResponse *)reply.body;
    if (resp == NULL || resp->secret.len != DLINK_SECRET_SIZE || resp->address == NULL ||
        (strncmp(resp->address, "tcp://", 6) != 0 &&
         strncmp(resp->address, "tls+tcp://", 10) != 0)) {
        rpc_reply_free(&reply);
        return status_set(st, DC_UNAVAILABLE, "its GroupLink answer is malformed");
    }
    if (strncmp(resp->address, "tls+", 4) == 0 && p->tls == NULL) {
        auth_url_host(resp->address, host, sizeof(host));
        if ((code = auth_dltls_client(wg->cfg->tls.ca, wg->cfg->tls.cert, wg->cfg->tls.key, host,
                                      &p->tls, st)) != DC_OK) {
            rpc_reply_free(&reply);
            return code;
        }
    }
    code      = dlink_dial(resp->address, strncmp(resp->address, "tls+", 4) == 0 ? p->tls : NULL,
                           resp->secret.data, wg->cfg->advertise, 2000, out, st);
    *features = resp->features;
    rpc_reply_free(&reply);
    return code;
}

static void
sjob_free(struct sjob *j)
{
    pbuf_drop(j->buf);
    free(j);
}

/* The rank's region a group's job sends from (counted in its `sending` from peer_queue_locked
 * to sjob_free_locked), or NULL. */
static struct region *
sjob_region(const struct sjob *j)
{
    return j->buf != NULL ? j->buf->reg : NULL;
}

/* sjob_free for a group's job: a send from a rank's region has ended (region_settle). mtx
 * held. */
static void
sjob_free_locked(struct sjob *j)
{
    struct region *r = sjob_region(j);

    if (r != NULL) {
        r->sending--;
        region_settle(r);
    }
    sjob_free(j);
}

/* Moves the jobs queued to p that `match` picks onto the front of the list *into. mtx held. */
static void
peer_unqueue_locked(struct wpeer *p, bool (*match)(const struct sjob *j, const void *arg),
                    const void *arg, struct sjob **into)
{
    p->jobs_tail = NULL;
    for (struct sjob **pp = &p->jobs; *pp != NULL;) {
        struct sjob *j = *pp;
        if (match(j, arg)) {
            *pp     = j->next;
            j->next = *into;
            *into   = j;
        } else {
            p->jobs_tail = j;
            pp           = &j->next;
        }
    }
}

/* Ends an op's job: tells its owner how it went (outside mtx), frees it. */
static void
sjob_done(struct sjob *j, dc_code code, const dc_status *st)
{
    if (j->done != NULL) {
        j->done(j->done_arg, code == DC_OK ? j->len : 0, code, st);
    }
    sjob_free(j);
}

static struct wcall *wcall_find(const struct wgroup *g, uint64_t seq);

/* One peer's sender: writes queued parts in order; a failure ends the job's group (after one
 * retry on a fresh connection when the failed one was kept from before, e.g. the peer
 * restarted since). */
static void *
peer_sender(void *arg)
{
    struct wpeer *p    = arg;
    struct wgroups *wg = p->wg;

    thread_name_set("dc-link-tx");
    pthread_mutex_lock(&wg->mtx);
    for (;;) {
        struct sjob *j;
        struct wgroup *g;
        dc_status st;
        dc_code code = DC_OK;

        while (!wg->stopping && (p->jobs == NULL || p->inline_busy)) {
            pthread_cond_wait(&p->cv, &wg->mtx);
        }
        if (wg->stopping) {
            break;
        }
        j       = p->jobs;
        p->jobs = j->next;
        if (p->jobs == NULL) {
            p->jobs_tail = NULL;
        }
        if (j->owner == NULL) {
            g = group_find(wg, j->group_id);
            if (g == NULL || g->generation != j->h.generation || g->ended) {
                sjob_free_locked(j);
                continue;
            }
        }
        p->sending = j;
        status_clear(&st);
        for (int attempt = 0; attempt < 2 && !wg->stopping; attempt++) {
            struct dlink_out *o;
            uint32_t features = 0;
            bool fresh;
            /* One dialer at a time (wgroups_peer_link dials too). */
            while (p->dialing && !wg->stopping) {
                pthread_cond_wait(&p->cv, &wg->mtx);
            }
            o     = p->out;
            fresh = o == NULL || p->stale;
            if (fresh) {
                p->dialing = true;
            }
            if (p->stale && o != NULL) {
                p->out = NULL;
                pthread_mutex_unlock(&wg->mtx);
                dlink_out_close(o);
                pthread_mutex_lock(&wg->mtx);
                o = NULL;
            }
            p->stale = false;
            pthread_mutex_unlock(&wg->mtx);
            status_clear(&st);
            code = o == NULL ? peer_link(wg, p, &o, &features, &st) : DC_OK;
            pthread_mutex_lock(&wg->mtx);
            if (code == DC_OK && o != p->out) {
                p->features = features;
            }
            if (fresh) {
                p->dialing = false;
                pthread_cond_broadcast(&p->cv);
            }
            if (code != DC_OK) {
                break;
            }
            if (wg->stopping) {
                if (o != p->out) {
                    dlink_out_close(o); /* dialed just now: nobody else has it */
                }
                code = status_set(&st, DC_UNAVAILABLE, "worker shutting down");
                break;
            }
            p->out = o;
            if (j->cancelled) {
                code = status_set(&st, DC_ABORTED, "the op ended before its data was sent");
                break;
            }
            pthread_mutex_unlock(&wg->mtx);
            code =
                j->h.kind == DLINK_PART
                    ? dlink_send_frame(o, &j->h, j->buf->data, j->len, &st)
                    : dlink_send(o, &j->h, j->owner != NULL ? j->data : j->buf->data + j->h.offset,
                                 j->len, &st);
            pthread_mutex_lock(&wg->mtx);
            if (code == DC_OK) {
                if (j->h.kind == DLINK_PART) {
                    wg->parts_out++;
                } else if (j->owner == NULL) {
                    wg->link_bytes_out += j->len;
                }
                break;
            }
            p->out = NULL;
            pthread_mutex_unlock(&wg->mtx);
            dlink_out_close(o);
            pthread_mutex_lock(&wg->mtx);
            if (fresh || wg->stopping || j->cancelled) {
                break;
            }
        }
        p->sending = NULL;
        if (j->owner != NULL) {
            if (code == DC_OK && wg->stopping) {
                code = status_set(&st, DC_UNAVAILABLE, "worker shutting down");
            }
            pthread_mutex_unlock(&wg->mtx);
            sjob_done(j, code, &st);
            pthread_mutex_lock(&wg->mtx);
            continue;
        }
        g = group_find(wg, j->group_id);
        if (g != NULL && (g->generation != j->h.generation || g->ended)) {
            g = NULL;
        }
        if (code != DC_OK && !wg->stopping && g != NULL && !j->cancelled) {
            dc_status end;
            status_set(&end, DC_UNAVAILABLE, "worker %s of group %s is unreachable: %s", j->worker,
                       g->id, st.message);
            status_set_worker(&end, j->worker);
            group_end_locked(wg, g, &end);
        } else if (g != NULL && j->buf != NULL) {
            /* Sent from a call's bytes (a rank's region, the ring's buffer): its call may
             * have waited for this send alone. */
            struct wcall *c = wcall_find(g, j->h.seq);
            sjob_free_locked(j);
            if (c != NULL) {
                wcall_try_finish(wg, g, c);
            }
            continue;
        }
        sjob_free_locked(j);
    }
    while (p->jobs != NULL) {
        struct sjob *j = p->jobs;
        dc_status st;
        p->jobs = j->next;
        if (j->owner == NULL) {
            sjob_free_locked(j);
            continue;
        }
        status_set(&st, DC_UNAVAILABLE, "worker shutting down");
        pthread_mutex_unlock(&wg->mtx);
        sjob_done(j, DC_UNAVAILABLE, &st);
        pthread_mutex_lock(&wg->mtx);
    }
    p->jobs_tail = NULL;
    pthread_mutex_unlock(&wg->mtx);
    return NULL;
}

/* Starts p's sender thread if it has none. mtx held. */
static dc_code
peer_sender_start_locked(struct wpeer *p, dc_status *st)
{
    if (!p->sender_started) {
        if (pthread_create(&p->sender, NULL, peer_sender, p) != 0) {
            return status_set(st, DC_RESOURCE_EXHAUSTED, "cannot start a data link sender");
        }
        p->sender_started = true;
    }
    return DC_OK;
}

/* Appends j to p's queue. mtx held. */
static void
peer_enqueue_locked(struct wpeer *p, struct sjob *j)
{
    if (p->jobs_tail != NULL) {
        p->jobs_tail->next = j;
    } else {
        p->jobs = j;
    }
    p->jobs_tail = j;
    pthread_cond_broadcast(&p->cv); /* the sender, among wgroups_peer_link's waiters */
}

/* Queues bytes [off, off + len) of buf (a part of buf->bytes) to worker w's sender; flags
 * as the frame carries them. mtx held. */
static dc_code
peer_queue_locked(struct wgroup *g, struct wcall *c, size_t w, struct pbuf *buf, size_t off,
                  size_t len, uint16_t flags, dc_status *st)
{
    struct wpeer *p = g->workers[w].peer;
    struct sjob *j  = calloc(1, sizeof(*j));

    if (j == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (peer_sender_start_locked(p, st) != DC_OK) {
        free(j);
        return st->code;
    }
    j->buf = pbuf_hold(buf);
    j->len = len;
    if (buf->reg != NULL) {
        buf->reg->sending++; /* until sjob_free_locked; the job's buf pins the region */
    }
    j->h = (struct dlink_hdr){ .kind       = DLINK_DATA,
                               .flags      = flags,
                               .from       = g->self,
                               .group      = g->hash,
                               .generation = g->generation,
                               .seq        = c->seq,
                               .offset     = off,
                               .total      = buf->bytes };
    snprintf(j->group_id, sizeof(j->group_id), "%s", g->id);
    snprintf(j->worker, sizeof(j->worker), "%s", g->workers[w].name);
    peer_enqueue_locked(p, j);
    return DC_OK;
}

/* ---- the data link for ops (collective.c) ------------------------------------------------ */

/* How long a peer whose data link could not be dialed is left on RPC before the next try. */
#define LINK_RETRY_MS 5000

/* Queues c's whole part to worker w as one DLINK_PART frame: buf holds pb_len bytes of the
 * packed GroupExchangeRequest, then the part's bytes (len in all). mtx held. */
static dc_code
peer_queue_part_locked(struct wgroup *g, struct wcall *c, size_t w, struct pbuf *buf, size_t len,
                       size_t pb_len, dc_status *st)
{
    struct wpeer *p = g->workers[w].peer;

    if (peer_queue_locked(g, c, w, buf, 0, len, 0, st) != DC_OK) {
        return st->code;
    }
    /* peer_queue_locked appended its job last, under the same lock. */
    p->jobs_tail->h.kind   = DLINK_PART;
    p->jobs_tail->h.offset = pb_len;
    p->jobs_tail->h.total  = len;
    return DC_OK;
}

/* c's part as one DLINK_PART payload (req packed, then the bytes it carries), or NULL when it
 * does not fit in one (it then goes as the GroupExchange RPC). mtx held. */
static struct pbuf *
part_pack(struct wgroups *wg, const Devcoord__V1__GroupExchangeRequest *req, const struct wcall *c,
          size_t *len, size_t *pb_len)
{
    size_t bytes = req->has_data ? c->mine_bytes : 0;
    struct pbuf *b;

    *pb_len = protobuf_c_message_get_packed_size(&req->base);
    if (*pb_len > DLINK_CHUNK || bytes > DLINK_CHUNK - *pb_len ||
        (b = pbuf_new(wg, *pb_len + bytes)) == NULL) {
        return NULL;
    }
    protobuf_c_message_pack(&req->base, b->data);
    if (bytes > 0) {
        memcpy(b->data + *pb_len, c->mine, bytes);
    }
    *len = *pb_len + bytes;
    return b;
}

dc_code
wgroups_peer_link(struct wgroups *wg, const char *address, dc_status *st)
{
    struct dlink_out *o = NULL;
    struct wpeer *p;
    uint32_t f = 0;
    dc_code code;

    pthread_mutex_lock(&wg->mtx);
    if (wg->stopping) {
        pthread_mutex_unlock(&wg->mtx);
        return status_set(st, DC_UNAVAILABLE, "worker shutting down");
    }
    if ((p = peer_get_locked(wg, address, st)) == NULL) {
        pthread_mutex_unlock(&wg->mtx);
        return st->code;
    }
    while (p->dialing && !wg->stopping) {
        pthread_cond_wait(&p->cv, &wg->mtx);
    }
    if (p->out != NULL || wg->stopping) {
        /* A stale one is dialed again by the sender before it writes. */
        pthread_mutex_unlock(&wg->mtx);
        return wg->stopping ? status_set(st, DC_UNAVAILABLE, "worker shutting down") : DC_OK;
    }
    if (p->link_failed_ms != 0 && rpc_now_ms() - p->link_failed_ms < LINK_RETRY_MS) {
        pthread_mutex_unlock(&wg->mtx);
        return status_set(st, DC_UNAVAILABLE, "no data link to %s (its dial failed lately)",
                          address);
    }
    p->dialing = true;
    p->stale   = false;
    pthread_mutex_unlock(&wg->mtx);
    code = peer_link(wg, p, &o, &f, st);
    pthread_mutex_lock(&wg->mtx);
    p->dialing = false;
    pthread_cond_broadcast(&p->cv);
    if (code == DC_OK && wg->stopping) {
        dlink_out_close(o);
        code = status_set(st, DC_UNAVAILABLE, "worker shutting down");
    } else if (code == DC_OK) {
        p->out            = o;
        p->features       = f;
        p->link_failed_ms = 0;
    } else {
        p->link_failed_ms = rpc_now_ms();
        if (p->link_failed_ms == 0) {
            p->link_failed_ms = 1;
        }
    }
    pthread_mutex_unlock(&wg->mtx);
    return code;
}

/* Whether p's data link is up and usable now (not being dialed, not from before a drop).
 * mtx held. */
static bool
peer_up_locked(const struct wpeer *p)
{
    return p->out != NULL && !p->stale && !p->dialing;
}

bool
wgroups_peer_linked(struct wgroups *wg, const char *address, uint32_t *features)
{
    bool up = false;

    pthread_mutex_lock(&wg->mtx);
    for (size_t i = 0; i < wg->n_peers && !up && !wg->stopping; i++) {
        const struct wpeer *p = wg->peers[i];
        if (strcmp(p->address, address) == 0 && peer_up_locked(p)) {
            up        = true;
            *features = p->features;
        }
    }
    pthread_mutex_unlock(&wg->mtx);
    return up;
}

/* Writes op job j to p on the caller's thread: p is linked and idle (no job queued or being
 * written), so nothing is overtaken, and a small frame goes straight into the socket instead
 * of waking the sender, whose hand-off costs a small op a thread switch per frame. The sender
 * takes no job meanwhile (inline_busy); wgroups_op_cancel and shutdown abort the connection
 * as they would the sender's write. On failure, the peer's not taking the frame within
 * OP_INLINE_TIMEOUT_MS included, the connection is dropped and the job goes back to the head
 * of the queue: the sender dials a fresh connection and tries once more, as it does for a
 * job that failed on a kept connection. mtx held; unlocks it. */
static void
peer_send_inline_locked(struct wgroups *wg, struct wpeer *p, struct sjob *j)
{
    struct dlink_out *o = p->out;
    dc_status st;
    dc_code code;

    p->sending     = j;
    p->inline_busy = true;
    pthread_mutex_unlock(&wg->mtx);
    status_clear(&st);
    code = dlink_send_within(o, &j->h, j->data, j->len, OP_INLINE_TIMEOUT_MS, &st);
    pthread_mutex_lock(&wg->mtx);
    p->sending     = NULL;
    p->inline_busy = false;
    if (code != DC_OK) {
        p->out = NULL;
        if (!wg->stopping && !j->cancelled) {
            j->next = p->jobs;
            p->jobs = j;
            if (p->jobs_tail == NULL) {
                p->jobs_tail = j;
            }
            j = NULL;
        }
    } else if (wg->stopping) {
        code = status_set(&st, DC_UNAVAILABLE, "worker shutting down");
    }
    pthread_cond_broadcast(&p->cv); /* the sender, and a shutdown waiting for us */
    pthread_mutex_unlock(&wg->mtx);
    if (code != DC_OK) {
        dlink_out_close(o);
        if (j != NULL && j->cancelled) {
            code = status_set(&st, DC_ABORTED, "the op ended before its data was sent");
        }
    }
    if (j != NULL) {
        sjob_done(j, code, &st);
    }
}

dc_code
wgroups_op_send(struct wgroups *wg, const char *address, const struct dlink_hdr *h,
                const uint8_t *data, size_t len, const void *owner, wgroups_sent_fn done, void *arg,
                bool may_write, dc_status *st)
{
    struct wpeer *p = NULL;
    struct sjob *j;

    pthread_mutex_lock(&wg->mtx);
    for (size_t i = 0; i < wg->n_peers && p == NULL; i++) {
        if (strcmp(wg->peers[i]->address, address) == 0) {
            p = wg->peers[i];
        }
    }
    if (wg->stopping || p == NULL) {
        pthread_mutex_unlock(&wg->mtx);
        return status_set(st, DC_UNAVAILABLE, "no data link to %s", address);
    }
    if (peer_sender_start_locked(p, st) != DC_OK) {
        pthread_mutex_unlock(&wg->mtx);
        return st->code;
    }
    if ((j = calloc(1, sizeof(*j))) == NULL) {
        pthread_mutex_unlock(&wg->mtx);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    j->h      = *h;
    j->h.kind = DLINK_DATA;
    j->h.flags |= DLINK_FLAG_OP;
    j->len      = len;
    j->data     = data;
    j->owner    = owner;
    j->done     = done;
    j->done_arg = arg;
    if (may_write && len <= OP_INLINE_MAX && p->jobs == NULL && p->sending == NULL &&
        peer_up_locked(p)) {
        peer_send_inline_locked(wg, p, j); /* unlocks */
        return DC_OK;
    }
    peer_enqueue_locked(p, j);
    pthread_mutex_unlock(&wg->mtx);
    return DC_OK;
}

static bool
sjob_owned_by(const struct sjob *j, const void *owner)
{
    return j->owner == owner;
}

void
wgroups_op_cancel(struct wgroups *wg, const void *owner, bool abort_current)
{
    struct sjob *gone = NULL;
    dc_status st;

    pthread_mutex_lock(&wg->mtx);
    for (size_t i = 0; i < wg->n_peers; i++) {
        struct wpeer *p = wg->peers[i];
        peer_unqueue_locked(p, sjob_owned_by, owner, &gone);
        if (abort_current && p->sending != NULL && p->sending->owner == owner) {
            p->sending->cancelled = true;
            if (p->out != NULL) {
                dlink_out_abort(p->out); /* its write fails at once; the next job dials again */
            }
        }
    }
    pthread_mutex_unlock(&wg->mtx);
    status_set(&st, DC_ABORTED, "the op ended before its data was sent");
    while (gone != NULL) {
        struct sjob *j = gone;
        gone           = j->next;
        sjob_done(j, DC_ABORTED, &st);
    }
}

void
wgroups_set_op_sink(struct wgroups *wg, const struct wgroups_op_sink *sink)
{
    pthread_mutex_lock(&wg->mtx);
    if (sink != NULL) {
        wg->op_sink = *sink;
    } else {
        /* No new frame goes to it; a frame placed still lands with it (link_op_landed). */
        wg->op_sink.frame = NULL;
        wg->op_sink.place = NULL;
        while (wg->op_sink_busy > 0) {
            pthread_cond_wait(&wg->op_sink_cv, &wg->mtx);
        }
        memset(&wg->op_sink, 0, sizeof(wg->op_sink));
    }
    pthread_mutex_unlock(&wg->mtx);
}

void
wgroups_set_control(struct wgroups *wg, const struct wgroups_control *control)
{
    pthread_mutex_lock(&wg->mtx);
    wg->control = *control;
    pthread_mutex_unlock(&wg->mtx);
}

/* ---- the ring ---------------------------------------------------------------------------- */

/* Segment k's first byte: boundaries on multiples of 8 bytes, so on an element of every
 * dtype, the last segment taking the rest; a scatter's from seg. */
static size_t
ring_off(const struct ring *r, uint32_t k)
{
    if (r->scatter) {
        return r->seg[2 * k];
    }
    return k >= r->n ? r->bytes : (size_t)(((uint64_t)(r->bytes / 8) * k / r->n) * 8);
}

static size_t
ring_len(const struct ring *r, uint32_t k)
{
    return r->scatter ? r->seg[2 * k + 1] : ring_off(r, k + 1) - ring_off(r, k);
}

static uint32_t
ring_steps(const struct ring *r)
{
    return r->scatter ? r->n - 1 : 2 * (r->n - 1);
}

/* A ring frame's step (its flags less RING_SCATTER, less one). */
static uint32_t
ring_frame_step(const struct dlink_hdr *h)
{
    return (uint32_t)(h->flags & ~RING_SCATTER) - 1;
}

/* The segment this worker receives at step s (and sends on at step s + 1). */
static uint32_t
ring_recv_seg(const struct ring *r, uint32_t s)
{
    return s < r->n - 1 ? (r->pos + 2 * r->n - s - 1) % r->n
                        : (r->pos + 2 * r->n - (s - (r->n - 1))) % r->n;
}

/* Whether c goes round the ring: a large all-reduce with data (ring_fits). The same answer
 * on every worker whose ranks passed the same call. */
static bool
ring_wanted(const struct wgroup *g, const struct wcall *c)
{
    return c->mine != NULL && ring_fits(g, c->local[0].d.kind, c->mine_bytes);
}

/* c's ring, made for a part of `bytes` (a reduce-scatter's: scatter) on first use (by this
 * worker's part or the first segment from the previous worker). NULL when out of memory.
 * mtx held. */
static struct ring *
ring_get(const struct wgroup *g, struct wcall *c, size_t bytes, bool scatter)
{
    struct ring *r = c->ring;

    if (r != NULL) {
        if (r->bytes != bytes || r->scatter != scatter) {
            r->broken = true;
        }
        return r;
    }
    if ((r = calloc(1, sizeof(*r))) == NULL ||
        (r->got = calloc(2 * g->n_workers, sizeof(*r->got))) == NULL ||
        (scatter && (r->seg = calloc(2 * g->n_workers, sizeof(*r->seg))) == NULL)) {
        if (r != NULL) {
            free(r->got);
        }
        free(r);
        return NULL;
    }
    r->n       = (uint32_t)g->n_workers;
    r->pos     = g->self;
    r->next    = (g->self + 1) % r->n;
    r->prev    = (g->self + r->n - 1) % r->n;
    r->bytes   = bytes;
    r->scatter = scatter;
    if (scatter && !ring_fits(g, DC_OP_REDUCE_SCATTER, bytes)) {
        r->broken = true; /* not a ring this worker would go round: the descs will tell */
    } else if (scatter) {
        size_t block = bytes / g->n;
        for (uint32_t k = 0; k < r->n; k++) {
            const struct gworker *gw = &g->workers[(k + r->n - 1) % r->n];
            r->seg[2 * k]            = (size_t)gw->ranks[0] * block;
            r->seg[2 * k + 1]        = gw->n_ranks * block;
        }
    }
    c->ring = r;
    return r;
}

/* c's ring's acc over n elements from byte off, with several ranks on this worker
 * (c->fold): op every local input there, then, with peer, the previous worker's segment
 * (rs_in). An all-reduce's acc is the first rank's region, holding its input; a
 * reduce-scatter's starts empty, made by the first rank's input (in_buf) op the second's. In
 * rank order either way. mtx held. */
static void
ring_fold(struct wcall *c, size_t off, size_t n, bool peer)
{
    const struct desc *d = &c->local[0].d;
    struct ring *r       = c->ring;
    size_t first = 0, n_src = c->n_fold;

    if (peer) {
        c->fold[n_src++] = r->rs_in->data;
    }
    if (c->in_buf != NULL) {
        reduce_pair(d->dtype, d->reduce, r->acc->data + off, c->in_buf->data + off,
                    (const uint8_t *)c->fold[0] + off, n);
        first = 1;
    }
    reduce_into_many(d->dtype, d->reduce, r->acc->data + off, c->fold + first, n_src - first, off,
                     n);
}

/* Whether c's ring copies each final segment to the other local ranks' results as it lands:
 * an all-reduce in the first rank's region with more ranks here (an in_buf is a
 * reduce-scatter's), but for a MEAN, divided once the ring is done. */
static bool
ring_copies_out(const struct wcall *c)
{
    return c->n_fold > 0 && c->in_buf == NULL && c->local[0].d.reduce != DC_REDUCE_MEAN;
}

/* Processes the steps whose segment is in, in order, and queues what each lets this worker
 * send; ends the generation when a send cannot be queued. mtx held. */
static void
ring_advance(struct wgroups *wg, struct wgroup *g, struct wcall *c)
{
    struct ring *r       = c->ring;
    const struct desc *d = &c->local[0].d;
    dc_status st;

    /* Chunk by chunk as frames land: a chunk is reduced and passed on while the next one is
     * still on the wire. */
    while (!r->broken && r->acc != NULL && r->done < ring_steps(r)) {
        uint32_t s = r->done, k = ring_recv_seg(r, s);
        size_t off = ring_off(r, k) + r->part, len = r->got[s] - r->part;
        if (r->got[s] > ring_len(r, k)) {
            r->broken = true; /* more than the segment: not a peer of this version */
            return;
        }
        if (len == 0 && r->got[s] < ring_len(r, k)) {
            return;
        }
        if (s < r->n - 1 && len > 0 && c->n_fold > 0) {
            ring_fold(c, off, len / r->elem, true);
        } else if (s < r->n - 1 && len > 0 && c->in_buf != NULL) {
            reduce_pair(d->dtype, d->reduce, r->acc->data + off, c->in_buf->data + off,
                        r->rs_in->data + off, len / r->elem);
        } else if (s < r->n - 1 && len > 0) {
            reduce_into(d->dtype, d->reduce, r->acc->data + off, r->rs_in->data + off,
                        len / r->elem);
        }
        if (ring_copies_out(c) && s + 2 >= r->n && len > 0) {
            /* Final bytes (the last reduce-scatter step's, an all-gather step's): to the other
             * local ranks' results now, from cache, while the next frame is on the wire. */
            for (size_t i = 1; i <= c->n_fold; i++) {
                memcpy(c->local[i].out + off, r->acc->data + off, len);
            }
        }
        r->part += len;
        if (r->part == ring_len(r, k)) {
            r->done++;
            r->part = 0;
        }
        if (r->done == r->n - 1 && r->rs_in != NULL) {
            /* Reduce-scatter over: its segments are all reduced in. Given back now, not with
             * the call: a peer's next call may need one before this call ends here. */
            wg->held -= r->bytes;
            pbuf_drop(r->rs_in);
            r->rs_in = NULL;
        }
        if (s + 1 < ring_steps(r) && len > 0 &&
            peer_queue_locked(g, c, r->next, r->acc, off, len,
                              (uint16_t)((s + 2) | (r->scatter ? RING_SCATTER : 0)),
                              &st) != DC_OK) {
            group_end_locked(wg, g, &st);
            return;
        }
    }
}

/* This worker's part is ready: it becomes the ring's accumulator, its own segment goes to
 * the next worker, and segments that came early are reduced. mtx held. */
static dc_code
ring_start(struct wgroups *wg, struct wgroup *g, struct wcall *c, dc_status *st)
{
    bool scatter   = c->local[0].d.kind == DC_OP_REDUCE_SCATTER;
    struct ring *r = ring_get(g, c, c->mine_bytes, scatter);

    if (r == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    r->elem  = dc_dtype_size(c->local[0].d.dtype);
    r->elems = r->bytes / r->elem;
    r->acc   = pbuf_hold(c->mine_buf);
    if (r->broken) {
        return DC_OK; /* the descs disagree: the call fails once they are all in */
    }
    if (c->n_fold > 0) {
        /* This worker's own segment, sent at step 0: every local rank's input in it. */
        ring_fold(c, ring_off(r, r->pos), ring_len(r, r->pos) / r->elem, false);
    }
    /* Step 0 sends this worker's own bytes: the rank's region when read in place alone. */
    if (peer_queue_locked(g, c, r->next, c->in_buf != NULL && c->n_fold == 0 ? c->in_buf : r->acc,
                          ring_off(r, r->pos), ring_len(r, r->pos),
                          (uint16_t)(1 | (scatter ? RING_SCATTER : 0)), st) != DC_OK) {
        return st->code;
    }
    ring_advance(wg, g, c);
    return DC_OK;
}

/* A frame of a part or ring step must start where the bytes of that part or step so far end:
 * one connection carries them in order, so a frame elsewhere is repeated or out of place,
 * and counting it would complete the part with bytes that never came. */
static dc_code
frame_in_order(const struct dlink_hdr *h, uint64_t expected, dc_status *st)
{
    if (h->offset != expected) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "a data frame at byte %llu where byte %llu was next (repeated or out "
                          "of order)",
                          (unsigned long long)h->offset, (unsigned long long)expected);
    }
    return DC_OK;
}

/* Where a ring frame from the previous worker lands, or NULL (the call's ring cannot take
 * it: it is marked broken). mtx held. */
static uint8_t *
ring_frame_dst(struct wgroups *wg, const struct wgroup *g, struct wcall *c,
               const struct dlink_hdr *h, struct pbuf **pin, dc_status *st)
{
    struct ring *r = ring_get(g, c, (size_t)h->total, (h->flags & RING_SCATTER) != 0);
    uint32_t s     = ring_frame_step(h), k;

    if (r == NULL) {
        status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    if (r->broken) {
        return NULL;
    }
    k = ring_recv_seg(r, s);
    if (h->from != r->prev || s >= ring_steps(r) || h->offset < ring_off(r, k) ||
        h->offset + h->length > ring_off(r, k) + ring_len(r, k)) {
        status_set(st, DC_INVALID_ARGUMENT, "a ring frame outside its step (step %u)", s);
        return NULL;
    }
    if (frame_in_order(h, ring_off(r, k) + r->got[s], st) != DC_OK) {
        return NULL;
    }
    if (s < r->n - 1) {
        if (r->rs_in == NULL && r->done >= r->n - 1) {
            status_set(st, DC_INVALID_ARGUMENT, "a ring frame for a step already done (step %u)",
                       s);
            return NULL;
        }
        if (r->rs_in == NULL) {
            if (r->bytes > wg->max_held - wg->held || (r->rs_in = pbuf_new(wg, r->bytes)) == NULL) {
                status_set(st, DC_RESOURCE_EXHAUSTED,
                           "group parts waiting on this worker hold %zu bytes already", wg->held);
                return NULL;
            }
            wg->held += r->bytes;
        }
        *pin = pbuf_hold(r->rs_in);
        return r->rs_in->data + h->offset;
    }
    if (r->acc == NULL) {
        status_set(st, DC_INVALID_ARGUMENT, "a ring's all-gather frame before its start");
        return NULL;
    }
    *pin = pbuf_hold(r->acc);
    return r->acc->data + h->offset;
}

/* Sends this worker's part of c to every other worker: the whole part (every local rank in),
 * or a partial note naming the local ranks in so far. mtx held. */
static void
wcall_send(struct wgroups *wg, struct wgroup *g, struct wcall *c, bool partial)
{
    const struct gworker *me               = &g->workers[g->self];
    Devcoord__V1__GroupExchangeRequest req = DEVCOORD__V1__GROUP_EXCHANGE_REQUEST__INIT;
    Devcoord__V1__GroupCallDesc *descs     = calloc(me->n_ranks, sizeof(*descs));
    Devcoord__V1__GroupCallDesc **ptrs     = calloc(me->n_ranks, sizeof(*ptrs));
    struct pbuf *part                      = NULL;
    size_t part_len = 0, pb_len = 0;
    bool ring, link;
    dc_status st;

    status_clear(&st);
    if (partial) {
        c->noted = true;
    } else {
        c->sent = true;
    }
    if (descs == NULL || ptrs == NULL || (!partial && wcall_make_mine(wg, g, c, &st) != DC_OK)) {
        if (st.code == DC_OK) {
            status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        group_end_locked(wg, g, &st);
        goto out;
    }
    for (size_t i = 0; i < me->n_ranks; i++) {
        if (c->local[i].in) {
            desc_to_pb(&c->local[i].d, me->ranks[i], &descs[req.n_calls]);
            ptrs[req.n_calls] = &descs[req.n_calls];
            req.n_calls++;
        }
    }
    req.group_id     = g->id;
    req.generation   = g->generation;
    req.seq          = c->seq;
    req.from         = g->self;
    req.calls        = ptrs;
    ring             = !partial && ring_wanted(g, c);
    req.has_data     = !partial && c->mine != NULL && !ring;
    link             = req.has_data && c->mine_bytes >= GROUPS_LINK_MIN_BYTES;
    req.stream_bytes = link ? c->mine_bytes : 0;
    req.partial      = partial;
    if (!partial && c->shrunk.code != DC_OK) {
        req.failed = c->shrunk.message;
    }
    if (ring && ring_start(wg, g, c, &st) != DC_OK) {
        group_end_locked(wg, g, &st);
        goto out;
    }
    if (!partial && !ring && !link) {
        /* A small part goes whole on the data link, with no reply to wait for. */
        part = part_pack(wg, &req, c, &part_len, &pb_len);
    }
    for (size_t w = 0; w < g->n_workers && !g->ended; w++) {
        struct exch_ctx *x;
        uint64_t until_ms = rpc_ms_until(c->deadline_ms);
        uint32_t left     = until_ms > 0 ? (uint32_t)until_ms : 1;
        if (w == g->self) {
            continue;
        }
        if (part != NULL) {
            if (peer_queue_part_locked(g, c, w, part, part_len, pb_len, &st) != DC_OK) {
                group_end_locked(wg, g, &st);
            }
            continue;
        }
        if ((x = calloc(1, sizeof(*x))) == NULL) {
            status_set(&st, DC_RESOURCE_EXHAUSTED, "out of memory");
            group_end_locked(wg, g, &st);
            break;
        }
        *x = (struct exch_ctx){ wg, "", g->generation, w };
        snprintf(x->group_id, sizeof(x->group_id), "%s", g->id);
        if (link && peer_queue_locked(g, c, w, c->mine_buf, 0, c->mine_bytes, 0, &st) != DC_OK) {
            free(x);
            group_end_locked(wg, g, &st);
            break;
        }
        if (rpc_call_async(g->workers[w].peer->client, WORKER_SVC, M_WORKER_GROUP_EXCHANGE,
                           &req.base, req.has_data && !link ? c->mine : NULL,
                           req.has_data && !link ? c->mine_bytes : 0, left, exch_done, x,
                           &st) != DC_OK) {
            dc_status end;
            free(x);
            status_set(&end, DC_UNAVAILABLE, "worker %s of group %s: %s", g->workers[w].name, g->id,
                       st.message);
            status_set_worker(&end, g->workers[w].name);
            group_end_locked(wg, g, &end);
        }
    }
out:
    pbuf_drop(part);
    free(descs);
    free(ptrs);
}

static struct wcall *
wcall_find(const struct wgroup *g, uint64_t seq)
{
    for (struct wcall *c = g->calls; c != NULL; c = c->next) {
        if (c->seq == seq) {
            return c;
        }
    }
    return NULL;
}

/* The call of seq in g, made on first use. NULL with st set past the bound. mtx held. */
static struct wcall *
wcall_get(struct wgroups *wg, struct wgroup *g, uint64_t seq, uint32_t timeout_ms, dc_status *st)
{
    struct wcall *c = wcall_find(g, seq);
    size_t n_local  = g->workers[g->self].n_ranks;

    if (c != NULL) {
        return c;
    }
    if (g->n_calls >= GROUPS_MAX_CALLS) {
        status_set(st, DC_RESOURCE_EXHAUSTED, "group %s has %d calls in progress on this worker",
                   g->id, GROUPS_MAX_CALLS);
        return NULL;
    }
    if ((c = calloc(1, sizeof(*c))) == NULL ||
        (c->local = calloc(n_local, sizeof(*c->local))) == NULL ||
        (c->peer = calloc(g->n_workers, sizeof(*c->peer))) == NULL) {
        wcall_free(wg, g, c);
        status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    c->seq         = seq;
    c->started_ms  = rpc_now_ms();
    c->first_ms    = c->started_ms;
    c->first_us    = rpc_now_us();
    c->deadline_ms = c->first_ms + (timeout_ms ? timeout_ms : GROUPS_DEFAULT_TIMEOUT_MS);
    c->next        = g->calls;
    g->calls       = c;
    g->n_calls++;
    return c;
}

/* The group and generation a call or exchange names, or why not. mtx held. */
static struct wgroup *
group_current(struct wgroups *wg, const char *id, uint64_t generation, dc_status *st)
{
    struct wgroup *g = group_find(wg, id);

    if (g == NULL) {
        status_set(st, DC_FAILED_PRECONDITION, "no group %.32s on this worker: join first", id);
        return NULL;
    }
    if (g->generation != generation) {
        status_set(st, DC_FAILED_PRECONDITION,
                   "group %s is at generation %llu, not %llu: join again", g->id,
                   (unsigned long long)g->generation, (unsigned long long)generation);
        return NULL;
    }
    if (g->ended) {
        *st = g->end;
        return NULL;
    }
    return g;
}

/* A rank's own call, checked alone (the others are compared once all are in), or the call
 * of all once they agree. shared: every rank's bytes (this one's, or all of them) are on
 * shared memory, in no message, so only size_t bounds its count (the data link's parts of
 * it are bounded by group_part_max, peers' parts held by max_held). */
static dc_code
check_desc(const struct wgroups *wg, const struct wgroup *g, const struct desc *d, bool shared,
           dc_status *st)
{
    size_t elem = dc_dtype_size(d->dtype);
    size_t room = shared ? SIZE_MAX
                  : wg->cfg->max_message_bytes > RPC_FRAME_OVERHEAD
                      ? wg->cfg->max_message_bytes - RPC_FRAME_OVERHEAD
                      : 0;

    if (d->kind <= DC_OP_NONE || d->kind >= DC_OP_COUNT) {
        return status_set(st, DC_INVALID_ARGUMENT, "invalid operation: unknown group call kind");
    }
    if (!kind_has_data(d->kind)) {
        return DC_OK;
    }
    if (elem == 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "invalid operation: unknown dtype");
    }
    if (d->count == 0) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid operation: count 0: a group %s needs at least one element",
                          dc_op_kind_name(d->kind));
    }
    if (kind_uses_reduce(d->kind) &&
        (d->reduce <= DC_REDUCE_NONE || d->reduce >= DC_REDUCE_COUNT)) {
        return status_set(st, DC_INVALID_ARGUMENT, "invalid operation: %s needs a reduce op",
                          dc_op_kind_name(d->kind));
    }
    if (kind_uses_root(d->kind) && d->root >= g->n) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid operation: root %u outside a group of %zu ranks", d->root, g->n);
    }
    /* What one message must carry: the rank's input, or all-gather's whole result. */
    if (d->count >
        room / elem / (d->kind == DC_OP_ALL_GATHER || d->kind == DC_OP_REDUCE_SCATTER ? g->n : 1)) {
        if (shared) {
            return status_set(st, DC_OUT_OF_RANGE, "invalid operation: count too large");
        }
        return status_set(st, DC_OUT_OF_RANGE,
                          "group call of %llu %s elements is larger than one message "
                          "(limits.max_message_bytes %llu): split it",
                          (unsigned long long)d->count, dc_dtype_name(d->dtype),
                          (unsigned long long)wg->cfg->max_message_bytes);
    }
    return DC_OK;
}

/* A well-formed call carries the bytes its desc says. A call whose desc does not hold
 * (check_desc) still takes part, without data: the others learn what it passed, and every
 * rank gets the same refusal (the disagreement, or what is wrong when all agree). */
static dc_code
check_call(const struct wgroups *wg, const struct wgroup *g, const struct desc *d, size_t bytes,
           dc_status *st)
{
    dc_status why;

    if (check_desc(wg, g, d, false, &why) == DC_OK && kind_has_data(d->kind) &&
        bytes != input_elements(d, g->n) * dc_dtype_size(d->dtype)) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "group call carries %zu bytes, not %zu %s elements", bytes,
                          input_elements(d, g->n), dc_dtype_name(d->dtype));
    }
    return DC_OK;
}

bool
wgroups_shm_name_ok(const char *name)
{
    size_t pre = strlen(GROUPS_SHM_NAME_PREFIX);

    if (name == NULL || strncmp(name, GROUPS_SHM_NAME_PREFIX, pre) != 0 ||
        strlen(name) != pre + GROUPS_SHM_NAME_HEX) {
        return false;
    }
    for (const char *p = name + pre; *p != '\0'; p++) {
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) {
            return false;
        }
    }
    return true;
}

bool
wgroups_shm_range_ok(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

static struct region *
region_find(const struct wgroup *g, uint32_t rank, uint64_t id)
{
    for (struct region *r = g->regions; r != NULL; r = r->next) {
        if (r->id == id && r->rank == rank) {
            return r;
        }
    }
    return NULL;
}

/* A call on shared memory: its input and result inside the rank's region, into p's data and
 * out. The desc must hold (check_desc) for the sizes to mean anything. mtx held. */
static dc_code
shm_call_place(const struct wgroups *wg, struct wgroup *g, uint32_t rank,
               const Devcoord__V1__GroupCallRequest *in, const struct desc *d, struct lpart *p,
               dc_status *st)
{
    struct region *r = region_find(g, rank, in->region);
    size_t elem      = dc_dtype_size(d->dtype), in_bytes, out_bytes;

    if (r == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "rank %u has no shared memory region %llu in group %s: map it first",
                          rank, (unsigned long long)in->region, g->id);
    }
    if (region_shrank(g, r, st)) {
        return DC_INVALID_ARGUMENT;
    }
    p->reg = r;
    if (check_desc(wg, g, d, true, st) != DC_OK) {
        status_clear(st);
        return DC_OK; /* takes part without data, as check_call lets it: all get the refusal */
    }
    in_bytes  = kind_has_data(d->kind) ? input_elements(d, g->n) * elem : 0;
    out_bytes = !kind_has_data(d->kind)       ? 0
                : d->kind == DC_OP_ALL_GATHER ? (size_t)d->count * elem * g->n
                                              : (size_t)d->count * elem;
    if (!wgroups_shm_range_ok(in->send_offset, in_bytes, r->bytes) ||
        !wgroups_shm_range_ok(in->recv_offset, out_bytes, r->bytes)) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "group call on region %llu: input %llu+%zu or result %llu+%zu bytes "
                          "outside its %zu bytes",
                          (unsigned long long)r->id, (unsigned long long)in->send_offset, in_bytes,
                          (unsigned long long)in->recv_offset, out_bytes, r->bytes);
    }
    p->data  = r->base + in->send_offset;
    p->bytes = in_bytes;
    p->out   = r->base + in->recv_offset;
    return DC_OK;
}

/* A rank's call, with its bytes (data, in buf when not NULL: given to the call, which drops it
 * when it does not keep it), answered by closure and cd or on the call link. */
static void
call_take(struct wgroups *wg, const Devcoord__V1__GroupCallRequest *in, const void *data,
          size_t bytes, struct pbuf *buf, Devcoord__V1__GroupCallResponse_Closure closure, void *cd,
          struct dlink_conn *link)
{
    struct lpart shm = { 0 };
    struct desc d    = desc_from_pb(in->call);
    uint32_t rank    = in->call != NULL ? in->call->rank : 0;
    struct wgroup *g;
    struct wcall *c;
    struct lpart *p;
    size_t li;
    bool local = false;
    dc_status st;
    dc_code code = DC_OK;

    d.shared = in->region != 0; /* the worker says so, not the rank */
    status_clear(&st);
    pthread_mutex_lock(&wg->mtx);
    if (in->call == NULL) {
        code = status_set(&st, DC_INVALID_ARGUMENT, "group call without a call");
    } else if ((g = group_current(wg, in->group_id, in->generation, &st)) == NULL) {
        code = st.code;
    } else if ((li = local_index(g, rank, &local)), !local) {
        code = status_set(&st, DC_INVALID_ARGUMENT, "rank %u of group %s is not on this worker",
                          rank, g->id);
    } else if (in->region != 0 && bytes != 0) {
        code = status_set(&st, DC_INVALID_ARGUMENT,
                          "group call on a shared memory region carries %zu bytes", bytes);
    } else if (in->region != 0 &&
               (code = shm_call_place(wg, g, rank, in, &d, &shm, &st)) != DC_OK) {
    } else if (in->region == 0 && (code = check_call(wg, g, &d, bytes, &st)) != DC_OK) {
    } else if (wcall_ended(g, in->seq)) {
        code = status_set(&st, DC_ABORTED, "call %llu of group %s already ended on this worker",
                          (unsigned long long)in->seq, g->id);
    } else if ((c = wcall_get(wg, g, in->seq, in->timeout_ms, &st)) == NULL) {
        code = st.code;
    } else if ((p = &c->local[li])->in) {
        code = status_set(&st, DC_ALREADY_EXISTS, "rank %u already made call %llu", rank,
                          (unsigned long long)in->seq);
    } else {
        if (in->region != 0) {
            *p = (struct lpart){ .in      = true,
                                 .d       = d,
                                 .data    = shm.data,
                                 .bytes   = shm.bytes,
                                 .closure = closure,
                                 .cd      = cd,
                                 .reg     = shm.reg,
                                 .out     = shm.out,
                                 .link    = link };
        } else {
            *p  = (struct lpart){ .in      = true,
                                  .d       = d,
                                  .data    = data,
                                  .bytes   = bytes,
                                  .closure = closure,
                                  .cd      = cd,
                                  .link    = link,
                                  .buf     = buf };
            buf = NULL; /* the call's now */
            wg->call_bytes_in += bytes;
        }
        wg->link_calls_total += link != NULL;
        if (in->seq > g->local_seq_max) {
            g->local_seq_max = in->seq;
        }
        if (c->n_local_in++ == 0) {
            /* The first of this worker's ranks sets the call's clock (a peer's part may
             * have made the call earlier, with the default deadline). */
            c->first_ms = rpc_now_ms();
            c->first_us = rpc_now_us();
            c->deadline_ms =
                c->first_ms + (in->timeout_ms ? in->timeout_ms : GROUPS_DEFAULT_TIMEOUT_MS);
        }
        if (c->n_local_in == g->workers[g->self].n_ranks) {
            wcall_send(wg, g, c, false);
        }
        if (!g->ended) {
            wcall_try_finish(wg, g, c);
        }
    }
    pthread_mutex_unlock(&wg->mtx);
    pbuf_drop(buf);
    if (code != DC_OK) {
        struct lpart refused = { .in = true, .closure = closure, .cd = cd, .link = link };
        st.code              = code;
        lpart_answer(&refused, NULL, &st, NULL, 0, NULL);
    }
}

void
wgroups_call(struct wgroups *wg, const Devcoord__V1__GroupCallRequest *in,
             Devcoord__V1__GroupCallResponse_Closure closure, void *cd)
{
    size_t bytes     = 0;
    const void *data = rpc_call_attachment(cd, &bytes);

    call_take(wg, in, data, bytes, NULL, closure, cd, NULL);
}

/* Where a call link reads a call's bytes: a buffer the call can keep (the ring reduces in it
 * and the answer is written from it, no copy). */
static uint8_t *
link_call_place(void *arg, size_t bytes, void **pin)
{
    struct pbuf *b = pbuf_new(arg, bytes);

    *pin = b;
    return b != NULL ? b->data : NULL;
}

static void
link_call_unpin(void *arg, void *pin)
{
    (void)arg;
    pbuf_drop(pin);
}

/* A call on the call link (the data port's thread of that connection). */
static void
link_call(void *arg, struct dlink_conn *conn, const uint8_t *pb, size_t pb_len, const uint8_t *data,
          size_t bytes, void *pin)
{
    struct wgroups *wg = arg;
    Devcoord__V1__GroupCallRequest *in;
    dc_status st;

    /* A request of at most DLINK_CALL_PB_MAX bytes, with no recursion: bounded as it is. */
    in = devcoord__v1__group_call_request__unpack(NULL, pb_len, pb);
    if (in == NULL) {
        status_set(&st, DC_INVALID_ARGUMENT, "call link: the call's request does not decode");
        dlink_call_answer(conn, &st, NULL, 0);
        pbuf_drop(pin);
        return;
    }
    call_take(wg, in, data, bytes, pin, NULL, NULL, conn);
    devcoord__v1__group_call_request__free_unpacked(in, NULL);
}

/* ---- GroupMap --------------------------------------------------------------------------- */

/* Opens and maps the rank's object in, checked, as a new region of g. mtx held. */
static dc_code
region_map(struct wgroups *wg, struct wgroup *g, const Devcoord__V1__GroupMapRequest *in,
           uint64_t *id, dc_status *st)
{
    uint64_t max = wg->cfg->group_shm_max_bytes;
    size_t n = 0, mapped = 0;
    struct region *r;
    struct stat sb;
    void *base;
    int fd, slot;

    if (!wgroups_shm_name_ok(in->name)) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "shared memory name %.80s is not " GROUPS_SHM_NAME_PREFIX
                          " and %d lowercase hex digits",
                          in->name, GROUPS_SHM_NAME_HEX);
    }
    for (r = g->regions; r != NULL; r = r->next) {
        if (r->rank == in->rank) {
            n++;
            mapped += r->bytes;
        }
    }
    if (in->bytes == 0 || in->bytes > max || in->bytes > max - mapped ||
        n >= GROUPS_SHM_MAX_REGIONS) {
        return status_set(st, in->bytes == 0 ? DC_INVALID_ARGUMENT : DC_RESOURCE_EXHAUSTED,
                          "rank %u may not map %llu more bytes of shared memory (it has %zu in "
                          "%zu regions; at most %llu in %d: groups.shm_max_bytes)",
                          in->rank, (unsigned long long)in->bytes, mapped, n,
                          (unsigned long long)max, GROUPS_SHM_MAX_REGIONS);
    }
    /* glibc's shm_open adds O_NOFOLLOW and O_CLOEXEC; the name has no '/' after the first. */
    if ((fd = shm_open(in->name, O_RDWR, 0)) < 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "cannot open shared memory %s: %s", in->name,
                          strerror(errno));
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != in->bytes) {
        close(fd);
        return status_set(st, DC_INVALID_ARGUMENT, "shared memory %s is not %llu bytes long",
                          in->name, (unsigned long long)in->bytes);
    }
    base = mmap(NULL, (size_t)in->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "cannot map shared memory %s: %s", in->name,
                          strerror(errno));
    }
    if ((r = calloc(1, sizeof(*r))) == NULL) {
        munmap(base, (size_t)in->bytes);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if ((slot = shmguard_publish(base, (size_t)in->bytes)) < 0) {
        munmap(base, (size_t)in->bytes);
        free(r);
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "this worker maps %d shared memory regions already, its most",
                          SHMGUARD_MAX);
    }
    *r = (struct region){ .id    = ++g->last_region,
                          .rank  = in->rank,
                          .base  = base,
                          .bytes = (size_t)in->bytes,
                          .slot  = slot,
                          .next  = g->regions };
    atomic_init(&r->pins, 0);
    g->regions = r;
    wg->shm_mapped += r->bytes;
    *id = r->id;
    return DC_OK;
}

/* Unmaps the rank's region id, unless a call still uses it. mtx held. */
static dc_code
region_unmap(struct wgroups *wg, struct wgroup *g, uint32_t rank, uint64_t id, dc_status *st)
{
    for (struct region **pp = &g->regions; *pp != NULL; pp = &(*pp)->next) {
        struct region *r = *pp;
        if (r->id != id || r->rank != rank) {
            continue;
        }
        for (struct wcall *c = g->calls; c != NULL; c = c->next) {
            for (size_t i = 0; i < g->workers[g->self].n_ranks; i++) {
                if (c->local[i].in && c->local[i].reg == r) {
                    return status_set(st, DC_FAILED_PRECONDITION,
                                      "region %llu is in use by call %llu", (unsigned long long)id,
                                      (unsigned long long)c->seq);
                }
            }
        }
        *pp = r->next;
        region_retire(wg, r);
        return DC_OK;
    }
    return status_set(st, DC_NOT_FOUND, "rank %u has no region %llu", rank, (unsigned long long)id);
}

void
wgroups_map(struct wgroups *wg, const Devcoord__V1__GroupMapRequest *in,
            Devcoord__V1__GroupMapResponse_Closure closure, void *cd)
{
    Devcoord__V1__GroupMapResponse out = DEVCOORD__V1__GROUP_MAP_RESPONSE__INIT;
    struct wgroup *g;
    bool local = false;
    dc_status st;
    dc_code code;

    status_clear(&st);
    pthread_mutex_lock(&wg->mtx);
    if ((g = group_current(wg, in->group_id, in->generation, &st)) == NULL) {
        code = st.code;
    } else if (local_index(g, in->rank, &local), !local) {
        code = status_set(&st, DC_INVALID_ARGUMENT, "rank %u of group %s is not on this worker",
                          in->rank, g->id);
    } else if (in->unmap != 0) {
        code = region_unmap(wg, g, in->rank, in->unmap, &st);
    } else {
        code = region_map(wg, g, in, &out.region, &st);
    }
    pthread_mutex_unlock(&wg->mtx);
    if (code != DC_OK) {
        st.code              = code;
        *rpc_call_status(cd) = st;
        closure(NULL, cd);
        return;
    }
    closure(&out, cd);
}

/* The buffer a peer's part of c arrives in over the data link (total bytes), made on first
 * use by the data frame or the GroupExchange naming it, whichever comes first. mtx held. */
static dc_code
ppart_buffer(struct wgroups *wg, struct ppart *p, uint64_t total, dc_status *st)
{
    if (p->buf != NULL) {
        return p->buf->bytes == total
                   ? DC_OK
                   : status_set(st, DC_INVALID_ARGUMENT,
                                "group exchange: %llu bytes announced, %zu on the data link",
                                (unsigned long long)total, p->buf->bytes);
    }
    if (p->data != NULL) {
        return status_set(st, DC_ALREADY_EXISTS, "duplicate group exchange");
    }
    if (total > group_part_max(wg)) {
        return status_set(st, DC_OUT_OF_RANGE,
                          "group part of %llu bytes is larger than this worker takes (%llu: "
                          "limits.max_message_bytes, or groups.shm_max_bytes for a call on "
                          "shared memory)",
                          (unsigned long long)total, (unsigned long long)group_part_max(wg));
    }
    if (total > wg->max_held - wg->held) {
        return status_set(st, DC_RESOURCE_EXHAUSTED,
                          "group parts waiting on this worker hold %zu bytes already (limit %zu)",
                          wg->held, wg->max_held);
    }
    if ((p->buf = pbuf_new(wg, (size_t)total)) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    p->data  = p->buf->data;
    p->bytes = (size_t)total;
    wg->held += p->bytes;
    return DC_OK;
}

/* A peer's partial note: which of its ranks have called. mtx held. */
static dc_code
peer_note(const struct gworker *gw, struct ppart *p, const Devcoord__V1__GroupExchangeRequest *in,
          dc_status *st)
{
    if (p->called == NULL && (p->called = calloc(gw->n_ranks, sizeof(*p->called))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t k = 0; k < in->n_calls; k++) {
        for (size_t i = 0; in->calls[k] != NULL && i < gw->n_ranks; i++) {
            if (gw->ranks[i] == in->calls[k]->rank) {
                p->called[i] = true;
            }
        }
    }
    return DC_OK;
}

/* Peer in->from's part of c is in (p): counts it, notes the failure it reports (its rank's
 * shared memory shrank) and finishes c when that was the last part missing. wg->mtx held. */
static void
wcall_peer_in(struct wgroups *wg, struct wgroup *g, struct wcall *c, struct ppart *p,
              const Devcoord__V1__GroupExchangeRequest *in)
{
    p->in = true;
    c->n_peer_in++;
    if (in->failed != NULL && in->failed[0] != '\0' && c->shrunk.code == DC_OK) {
        status_set(&c->shrunk, DC_INVALID_ARGUMENT, "worker %s: %.300s", g->workers[in->from].name,
                   in->failed);
    }
    wcall_try_finish(wg, g, c);
}

/* A peer's part of a call of g (GroupExchange, or a DLINK_PART frame), its bytes in data. mtx
 * held. */
static dc_code
exchange_take_locked(struct wgroups *wg, struct wgroup *g,
                     const Devcoord__V1__GroupExchangeRequest *in, const void *data, size_t bytes,
                     dc_status *st)
{
    struct wcall *c;
    struct ppart *p;
    dc_code code = DC_OK;

    if (in->from >= g->n_workers || in->from == g->self ||
        in->n_calls > g->workers[in->from].n_ranks ||
        (!in->partial && in->n_calls != g->workers[in->from].n_ranks)) {
        code = status_set(st, DC_INVALID_ARGUMENT, "malformed group exchange");
    } else if (in->partial) {
        /* A progress note only matters to a call under way here; one that comes late (its
         * call done, or its whole part already in) is dropped. */
        if ((c = wcall_find(g, in->seq)) != NULL && !(p = &c->peer[in->from])->in) {
            code = peer_note(&g->workers[in->from], p, in, st);
        }
    } else if (wcall_ended(g, in->seq)) {
        /* The call ended here first (failed, or its deadline passed): nothing to take. */
    } else if ((c = wcall_get(wg, g, in->seq, 0, st)) == NULL) {
        code = st->code;
    } else if ((p = &c->peer[in->from])->in) {
        code = status_set(st, DC_ALREADY_EXISTS, "duplicate group exchange");
    } else if (in->has_data && in->stream_bytes > 0) {
        /* The bytes come (or came) over the data link. */
        if ((code = ppart_buffer(wg, p, in->stream_bytes, st)) == DC_OK &&
            (p->d = calloc(in->n_calls, sizeof(*p->d))) == NULL) {
            code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        if (code == DC_OK) {
            for (size_t k = 0; k < in->n_calls; k++) {
                p->d[k] = desc_from_pb(in->calls[k]);
            }
            p->has_data = true;
            wcall_peer_in(wg, g, c, p, in);
        }
    } else if (p->buf != NULL) {
        code = status_set(st, DC_INVALID_ARGUMENT,
                          "group exchange without data after data on the data link");
    } else if (in->has_data && bytes > wg->max_held - wg->held) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED,
                          "group parts waiting on this worker hold %zu bytes already (limit %zu)",
                          wg->held, wg->max_held);
    } else if ((p->d = calloc(in->n_calls, sizeof(*p->d))) == NULL ||
               (in->has_data && (p->data = malloc(bytes ? bytes : 1)) == NULL)) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        for (size_t k = 0; k < in->n_calls; k++) {
            p->d[k] = desc_from_pb(in->calls[k]);
        }
        if (in->has_data && bytes > 0) {
            memcpy(p->data, data, bytes);
        }
        p->bytes    = bytes;
        p->has_data = in->has_data;
        if (p->data != NULL) {
            wg->held += bytes;
        }
        wcall_peer_in(wg, g, c, p, in);
    }
    return code;
}

void
wgroups_exchange(struct wgroups *wg, const Devcoord__V1__GroupExchangeRequest *in,
                 Devcoord__V1__GroupExchangeResponse_Closure closure, void *cd)
{
    Devcoord__V1__GroupExchangeResponse out = DEVCOORD__V1__GROUP_EXCHANGE_RESPONSE__INIT;
    size_t bytes                            = 0;
    const void *data                        = rpc_call_attachment(cd, &bytes);
    struct wgroup *g;
    dc_status st;
    dc_code code;

    status_clear(&st);
    pthread_mutex_lock(&wg->mtx);
    if ((g = group_current(wg, in->group_id, in->generation, &st)) == NULL) {
        code = st.code;
    } else {
        code = exchange_take_locked(wg, g, in, data, bytes, &st);
    }
    pthread_mutex_unlock(&wg->mtx);
    if (code != DC_OK) {
        st.code              = code;
        *rpc_call_status(cd) = st;
        closure(NULL, cd);
        return;
    }
    closure(&out, cd);
}

void
wgroups_end(struct wgroups *wg, const Devcoord__V1__GroupEndRequest *in,
            Devcoord__V1__GroupEndResponse_Closure closure, void *cd)
{
    Devcoord__V1__GroupEndResponse out = DEVCOORD__V1__GROUP_END_RESPONSE__INIT;
    struct wgroup *g;
    dc_status st;

    status_clear(&st);
    pthread_mutex_lock(&wg->mtx);
    if ((g = group_find(wg, in->group_id)) == NULL || g->generation != in->generation) {
        /* A generation this worker no longer has: nothing left to end. */
    } else if (in->from >= g->n_workers || in->from == g->self || in->status == NULL ||
               in->status->code == DEVCOORD__V1__CODE__OK) {
        status_set(&st, DC_INVALID_ARGUMENT, "malformed group end");
    } else if (!g->ended && !wg->stopping) {
        dc_status why, end;
        wire_status_from_pb(in->status, &why);
        status_set(&end, why.code, "worker %s ended generation %llu of group %s: %s",
                   g->workers[in->from].name, (unsigned long long)g->generation, g->id,
                   why.message);
        status_set_worker(&end, why.worker[0] != '\0' ? why.worker : g->workers[in->from].name);
        group_end_locked(wg, g, &end);
    }
    pthread_mutex_unlock(&wg->mtx);
    if (st.code != DC_OK) {
        *rpc_call_status(cd) = st;
        closure(NULL, cd);
        return;
    }
    closure(&out, cd);
}

/* A peer's whole part of a small call on its data link (DLINK_PART): taken as GroupExchange
 * takes it. A part of a generation no longer here is dropped, as a data frame's bytes are; one
 * this worker refuses ends the group here and on its peers (group_refuse_locked). false (the
 * connection drops): a request that does not decode or names another sender. */
static bool
link_part(void *arg, const char *peer, const struct dlink_hdr *h, const uint8_t *payload,
          dc_status *why)
{
    struct wgroups *wg = arg;
    Devcoord__V1__GroupExchangeRequest *in;
    struct wgroup *g;
    dc_status st;
    bool ok = true;

    /* At most DLINK_CHUNK bytes, with no recursion: bounded as it is. */
    if ((in = devcoord__v1__group_exchange_request__unpack(NULL, (size_t)h->offset, payload)) ==
        NULL) {
        status_set(why, DC_INVALID_ARGUMENT, "data link: a part whose request does not decode");
        return false;
    }
    status_clear(&st);
    pthread_mutex_lock(&wg->mtx);
    if (wg->stopping || (g = group_current(wg, in->group_id, in->generation, &st)) == NULL) {
        /* gone: dropped */
    } else if (in->from >= g->n_workers || in->from == g->self || in->seq != h->seq ||
               in->partial || in->stream_bytes != 0 ||
               strcmp(g->workers[in->from].peer->address, peer) != 0) {
        ok = false;
        status_set(why, DC_INVALID_ARGUMENT,
                   "data link: a part of group %s from worker %u, not "
                   "what this connection's sender may send",
                   g->id, in->from);
    } else if (exchange_take_locked(wg, g, in, payload + h->offset, h->length - (size_t)h->offset,
                                    &st) != DC_OK) {
        dc_status end;
        status_set(&end, st.code, "worker %s of group %s sent call %llu's part: %s",
                   g->workers[in->from].name, g->id, (unsigned long long)in->seq, st.message);
        status_set_worker(&end, g->workers[in->from].name);
        group_refuse_locked(wg, g, &end);
    } else {
        wg->parts_in++;
    }
    pthread_mutex_unlock(&wg->mtx);
    devcoord__v1__group_exchange_request__free_unpacked(in, NULL);
    return ok;
}

/* ---- the data link: receiving ----------------------------------------------------------- */

/* The group and call a data frame names, if it is current here and from whom it says. */
static struct wgroup *
frame_group(struct wgroups *wg, const char *peer, const struct dlink_hdr *h)
{
    for (struct wgroup *g = wg->groups; g != NULL; g = g->next) {
        if (g->hash == h->group && g->generation == h->generation && !g->ended &&
            h->from < g->n_workers && h->from != g->self && g->workers[h->from].peer != NULL &&
            strcmp(g->workers[h->from].peer->address, peer) == 0) {
            return g;
        }
    }
    return NULL;
}

/* How long past its call's deadline a frame into a rank's region may still come: the rank's
 * failure answer waits for it (region_landed), and its client waits 5 s past the deadline
 * (client/group.c GROUP_MARGIN_MS). */
#define REGION_FRAME_SLACK_MS 2000u

static void
link_frame_begin(void *arg, const char *peer, const struct dlink_hdr *h, uint8_t **dst, void **pin,
                 uint32_t *wait_ms)
{
    struct wgroups *wg = arg;
    struct wgroup *g   = NULL;
    struct wcall *c;
    dc_status st;

    status_clear(&st);
    pthread_mutex_lock(&wg->mtx);
    if (!wg->stopping && (g = frame_group(wg, peer, h)) != NULL && wcall_ended(g, h->seq)) {
        /* A frame of a call that ended here: read and dropped. */
    } else if (!wg->stopping && g != NULL && h->flags != 0) {
        struct pbuf *b = NULL;
        if ((c = wcall_get(wg, g, h->seq, 0, &st)) != NULL &&
            (*dst = ring_frame_dst(wg, g, c, h, &b, &st)) != NULL) {
            *pin = b;
            if (b->reg != NULL) {
                uint64_t now = rpc_now_ms();
                uint64_t wait =
                    (c->deadline_ms > now ? c->deadline_ms - now : 0) + REGION_FRAME_SLACK_MS;
                b->reg->landing++; /* into the rank's region: region_landed at its end */
                *wait_ms = wait < UINT32_MAX ? (uint32_t)wait : UINT32_MAX;
            }
        } else if (st.code != DC_OK) {
            dc_status end;
            status_set(&end, st.code, "worker %s of group %s sent call %llu's data: %s",
                       g->workers[h->from].name, g->id, (unsigned long long)h->seq, st.message);
            status_set_worker(&end, g->workers[h->from].name);
            group_refuse_locked(wg, g, &end);
        }
    } else if (!wg->stopping && g != NULL) {
        if ((c = wcall_get(wg, g, h->seq, 0, &st)) == NULL ||
            ppart_buffer(wg, &c->peer[h->from], h->total, &st) != DC_OK ||
            frame_in_order(h, c->peer[h->from].received, &st) != DC_OK) {
            dc_status end;
            status_set(&end, st.code, "worker %s of group %s sent call %llu's data: %s",
                       g->workers[h->from].name, g->id, (unsigned long long)h->seq, st.message);
            status_set_worker(&end, g->workers[h->from].name);
            group_refuse_locked(wg, g, &end);
        } else {
            struct pbuf *b = c->peer[h->from].buf;
            *dst           = b->data + h->offset;
            *pin           = pbuf_hold(b);
        }
    }
    pthread_mutex_unlock(&wg->mtx);
}

static void
link_frame_end(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok)
{
    struct wgroups *wg = arg;
    struct pbuf *into  = pin;
    struct wgroup *g;
    struct wcall *c;

    pthread_mutex_lock(&wg->mtx);
    if (into != NULL && into->reg != NULL) {
        region_landed(into->reg); /* the pin keeps the region until pbuf_drop below */
    }
    if (pin != NULL && ok && h->flags != 0 && (g = frame_group(wg, peer, h)) != NULL &&
        (c = wcall_find(g, h->seq)) != NULL && c->ring != NULL &&
        (pin == c->ring->rs_in || pin == c->ring->acc)) {
        c->ring->got[ring_frame_step(h)] += h->length;
        wg->link_bytes_in += h->length;
        pbuf_drop(pin); /* its bytes are in: wcall_try_finish may wait for no one else */
        pin = NULL;
        ring_advance(wg, g, c);
        if (!g->ended && c->ring->done == ring_steps(c->ring)) {
            wcall_try_finish(wg, g, c);
        }
    } else if (pin != NULL && ok && h->flags == 0 && (g = frame_group(wg, peer, h)) != NULL &&
               (c = wcall_find(g, h->seq)) != NULL && c->peer[h->from].buf == pin) {
        struct ppart *p = &c->peer[h->from];
        p->received += h->length;
        wg->link_bytes_in += h->length;
        if (p->in && p->received >= p->bytes) {
            wcall_try_finish(wg, g, c);
        }
    }
    pthread_mutex_unlock(&wg->mtx);
    pbuf_drop(pin);
}

/* The op sink, kept busy (wgroups_set_op_sink(NULL) waits for op_sink_release), into *sink:
 * false when none is set. */
static bool
op_sink_take(struct wgroups *wg, struct wgroups_op_sink *sink)
{
    pthread_mutex_lock(&wg->mtx);
    *sink = wg->op_sink;
    if (sink->frame == NULL) {
        pthread_mutex_unlock(&wg->mtx);
        return false;
    }
    wg->op_sink_busy++;
    pthread_mutex_unlock(&wg->mtx);
    return true;
}

/* A call into the op sink is over: wgroups_set_op_sink(NULL) may be waiting for it. */
static void
op_sink_release(struct wgroups *wg)
{
    pthread_mutex_lock(&wg->mtx);
    if (--wg->op_sink_busy == 0) {
        pthread_cond_broadcast(&wg->op_sink_cv);
    }
    pthread_mutex_unlock(&wg->mtx);
}

/* An op's frame: to the op sink, outside mtx (it may wait for its op to be ready). */
static bool
link_op_frame(void *arg, const char *peer, const struct dlink_hdr *h, const uint8_t *payload,
              dc_status *why)
{
    struct wgroups *wg = arg;
    struct wgroups_op_sink sink;
    bool ok;

    if (!op_sink_take(wg, &sink)) {
        return true; /* no collectives (stopping): dropped */
    }
    ok = sink.frame(sink.arg, peer, h, payload, why);
    op_sink_release(wg);
    return ok;
}

/* Where an op frame's payload may go straight (the op sink's place), outside mtx. A frame
 * placed keeps the sink busy until link_op_landed, so the sink is not unset under it. */
static uint8_t *
link_op_place(void *arg, const char *peer, const struct dlink_hdr *h, void **pin, uint32_t *wait_ms)
{
    struct wgroups *wg = arg;
    struct wgroups_op_sink sink;
    uint8_t *dst = NULL;

    if (!op_sink_take(wg, &sink)) {
        return NULL; /* no collectives (stopping): op_frame drops it */
    }
    if (sink.place == NULL || (dst = sink.place(sink.arg, peer, h, pin, wait_ms)) == NULL) {
        op_sink_release(wg);
    }
    return dst;
}

/* The end of a frame link_op_place placed: the sink is the one that placed it (still set,
 * as it was kept busy). */
static bool
link_op_landed(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok,
               dc_status *why)
{
    struct wgroups *wg = arg;
    struct wgroups_op_sink sink;
    bool took;

    pthread_mutex_lock(&wg->mtx);
    sink = wg->op_sink;
    pthread_mutex_unlock(&wg->mtx);
    took = sink.landed(sink.arg, peer, h, pin, ok, why);
    op_sink_release(wg);
    return took;
}

/* A control link's call: to the control handler (set once, kept until the data port
 * closes), outside mtx; refused before it is set. */
static void
link_control(void *arg, struct dlink_conn *conn, const uint8_t *frame, size_t len)
{
    struct wgroups *wg = arg;
    struct wgroups_control control;

    pthread_mutex_lock(&wg->mtx);
    control = wg->control;
    pthread_mutex_unlock(&wg->mtx);
    if (control.call == NULL) {
        dc_status st;
        status_set(&st, DC_UNAVAILABLE, "control links are not served yet");
        dlink_call_answer(conn, &st, NULL, 0);
        return;
    }
    control.call(control.arg, conn, frame, len);
}

static void
link_peer_lost(void *arg, const char *peer, const dc_status *why)
{
    struct wgroups *wg = arg;

    pthread_mutex_lock(&wg->mtx);
    peer_lost_locked(wg, peer, why->message);
    pthread_mutex_unlock(&wg->mtx);
}

/* Where the data port listens, with the peers' secret or (call) the call link's, opening the
 * port first if need be. */
static void
link_answer(struct wgroups *wg, bool call, Devcoord__V1__GroupLinkResponse_Closure closure,
            void *cd)
{
    Devcoord__V1__GroupLinkResponse out = DEVCOORD__V1__GROUP_LINK_RESPONSE__INIT;

    pthread_mutex_lock(&wg->mtx);
    if (link_start_locked(wg, rpc_call_status(cd)) != DC_OK) {
        pthread_mutex_unlock(&wg->mtx);
        closure(NULL, cd);
        return;
    }
    out.address  = wg->dl_address;
    out.features = call ? 0
                        : WGROUPS_FEATURE_OP_META | WGROUPS_FEATURE_OP_EARLY |
                              (wg->control.call != NULL ? WGROUPS_FEATURE_CONTROL : 0);
    out.secret.data =
        (uint8_t *)(call ? dlink_server_call_secret(wg->dl) : dlink_server_secret(wg->dl));
    out.secret.len = DLINK_SECRET_SIZE;
    /* Packed by the closure, under the lock: the address lives in wg. */
    closure(&out, cd);
    pthread_mutex_unlock(&wg->mtx);
}

void
wgroups_link(struct wgroups *wg, const Devcoord__V1__GroupLinkRequest *in,
             Devcoord__V1__GroupLinkResponse_Closure closure, void *cd)
{
    (void)in;
    link_answer(wg, false, closure, cd);
}

void
wgroups_call_link(struct wgroups *wg, const Devcoord__V1__GroupLinkRequest *in,
                  Devcoord__V1__GroupLinkResponse_Closure closure, void *cd)
{
    (void)in;
    link_answer(wg, true, closure, cd);
}

/* The data port, opened on first need (the first GroupSetup or GroupLink), not at start: a
 * port the kernel picks then cannot be one that a daemon started next to this one was told
 * to listen on. The listen address's scheme and host, groups.data_port or a port the kernel
 * picks; peers are told the advertised host with that port. mtx held. */
static dc_code
link_start_locked(struct wgroups *wg, dc_status *st)
{
    static const struct dlink_events ev_template = { NULL,
                                                     link_frame_begin,
                                                     link_frame_end,
                                                     link_peer_lost,
                                                     link_op_frame,
                                                     link_call,
                                                     0,
                                                     link_part,
                                                     link_control,
                                                     0,
                                                     link_op_place,
                                                     link_op_landed,
                                                     link_call_place,
                                                     link_call_unpin };
    struct dlink_events ev                       = ev_template;
    const char *listen = wg->cfg->listen, *adv = wg->cfg->advertise;
    bool tls = strncmp(listen, "tls+", 4) == 0;
    char host[256], ahost[256], url[300];
    dc_code code;

    if (wg->dl != NULL) {
        return DC_OK;
    }
    if (wg->stopping) {
        return status_set(st, DC_UNAVAILABLE, "worker shutting down");
    }
    ev.arg         = wg;
    ev.call_max    = wg->cfg->max_message_bytes;
    ev.control_max = (uint64_t)wg->cfg->max_message_bytes + RPC_FRAME_OVERHEAD;
    auth_url_host(listen, host, sizeof(host));
    auth_url_host(adv != NULL ? adv : listen, ahost, sizeof(ahost));
    address_url(url, sizeof(url), tls ? "tls+tcp" : "tcp", host[0] ? host : "0.0.0.0",
                wg->cfg->group_data_port);
    if (tls && wg->dl_tls == NULL &&
        (code = auth_dltls_server(&wg->cfg->tls, &wg->dl_tls, st)) != DC_OK) {
        return code;
    }
    if ((code = dlink_server_start(url, wg->dl_tls, group_part_max(wg),
                                   wg->cfg->handshake_timeout_ms ? wg->cfg->handshake_timeout_ms
                                                                 : 10000,
                                   &ev, &wg->dl, st)) != DC_OK) {
        return code;
    }
    address_url(wg->dl_address, sizeof(wg->dl_address), tls ? "tls+tcp" : "tcp",
                ahost[0] ? ahost : "127.0.0.1", (unsigned)dlink_server_port(wg->dl));
    log_info("data link listening on %s (advertised as %s)", url, wg->dl_address);
    return DC_OK;
}

/* ---- GroupStatus ------------------------------------------------------------------------- */

/* This worker's ranks missing from a call of g that some rank made at least stall_ms ago, into
 * out (room for every local rank); returns how many. mtx held. */
static size_t
stalled_ranks(const struct wgroup *g, uint64_t now, uint64_t stall_ms,
              Devcoord__V1__GroupStalledRank *out)
{
    const struct gworker *me = &g->workers[g->self];
    size_t n                 = 0;

    for (size_t k = 0; k < me->n_ranks; k++) {
        uint64_t waiting = 0;
        for (const struct wcall *c = g->calls; c != NULL; c = c->next) {
            /* A peer's part for a call this worker's ranks have moved past (theirs failed
             * at its deadline) waits for nobody: it only expires. */
            bool past = c->n_local_in == 0 && c->seq < g->local_seq_max;
            if (!past && !c->local[k].in && now - c->started_ms >= stall_ms &&
                now - c->started_ms > waiting) {
                waiting = now - c->started_ms;
            }
        }
        if (waiting > 0) {
            devcoord__v1__group_stalled_rank__init(&out[n]);
            out[n].rank       = me->ranks[k];
            out[n].device     = (char *)g->names[me->ranks[k]];
            out[n].waiting_ms = waiting;
            n++;
        }
    }
    return n;
}

void
wgroups_status(struct wgroups *wg, const Devcoord__V1__GroupStatusRequest *in,
               Devcoord__V1__GroupStatusResponse_Closure closure, void *cd)
{
    Devcoord__V1__GroupStatusResponse out   = DEVCOORD__V1__GROUP_STATUS_RESPONSE__INIT;
    Devcoord__V1__GroupStalledRank *stalled = NULL;
    Devcoord__V1__GroupStalledRank **ptrs   = NULL;
    struct wgroup *g;

    pthread_mutex_lock(&wg->mtx);
    if ((g = group_find(wg, in->group_id)) == NULL) {
        status_set(rpc_call_status(cd), DC_NOT_FOUND, "no group %.32s on this worker",
                   in->group_id);
    } else {
        size_t n_local = g->workers[g->self].n_ranks;
        if ((stalled = calloc(n_local, sizeof(*stalled))) == NULL ||
            (ptrs = calloc(n_local, sizeof(*ptrs))) == NULL) {
            status_set(rpc_call_status(cd), DC_RESOURCE_EXHAUSTED, "out of memory");
        } else {
            out.generation = g->generation;
            out.calls      = g->calls_done;
            out.n_stalled  = stalled_ranks(g, rpc_now_ms(), wg->cfg->group_stall_warn_ms, stalled);
            for (size_t i = 0; i < out.n_stalled; i++) {
                ptrs[i] = &stalled[i];
            }
            out.stalled = ptrs;
        }
    }
    /* Packed by the closure, under the lock: the names point into the group. */
    closure(rpc_call_status(cd)->code == DC_OK ? &out : NULL, cd);
    pthread_mutex_unlock(&wg->mtx);
    free(stalled);
    free(ptrs);
}

/* ---- the timer: deadlines and stalls ----------------------------------------------------- */

/* "rank 1 (node-b/cpu:0), rank 2 (...)": the ranks whose part of c is not in. */
static void
missing_ranks(const struct wgroup *g, const struct wcall *c, char *buf, size_t cap)
{
    size_t len = 0;

    buf[0] = '\0';
    for (size_t w = 0; w < g->n_workers; w++) {
        const struct gworker *gw = &g->workers[w];
        for (size_t k = 0; k < gw->n_ranks; k++) {
            bool missing = w == g->self ? !c->local[k].in
                                        : !c->peer[w].in &&
                                              (c->peer[w].called == NULL || !c->peer[w].called[k]);
            uint32_t r   = gw->ranks[k];
            if (missing && len + strlen(g->names[r]) + 32 < cap) {
                len += (size_t)snprintf(buf + len, cap - len, "%srank %u (%s)", len ? ", " : "", r,
                                        g->names[r]);
            }
        }
    }
}

/* Whether job j, from a rank's region, keeps that rank's answer held too long
 * (held_sends_cut); arg: the time now. */
static bool
sjob_held_overdue(const struct sjob *j, const void *arg)
{
    const struct region *r = sjob_region(j);
    uint64_t now           = *(const uint64_t *)arg;

    return r != NULL && r->held != NULL && now - r->held_ms >= HELD_SEND_MS;
}

/* A rank whose failure answer has waited HELD_SEND_MS for sends from its region (a peer that
 * stopped reading, or one too slow for what is queued) stops waiting: the connection a
 * sender writes such a job on is cut (the write fails at once, the next job dials again) and
 * the jobs still queued from the region are dropped, so the rank is answered
 * (region_settle) within its client's margin (unless the job is still dialing: then once
 * the dial ends, the job not written). The peer takes the cut as a lost connection, as any
 * dropped data link: it ends the generations of the groups it shares with this worker
 * (peer_lost_locked); this worker does not end the call's group for it. mtx held. */
static void
held_sends_cut(struct wgroups *wg, uint64_t now)
{
    for (size_t i = 0; i < wg->n_peers; i++) {
        struct wpeer *p = wg->peers[i];
        struct sjob *j = p->sending, *drop = NULL;
        peer_unqueue_locked(p, sjob_held_overdue, &now, &drop);
        while (drop != NULL) {
            struct sjob *q = drop;
            drop           = q->next;
            sjob_free_locked(q);
        }
        if (j == NULL || j->cancelled || !sjob_held_overdue(j, &now)) {
            continue;
        }
        j->cancelled = true;
        log_warn("group %s: cut the data link to worker %s: a send from rank %u's memory had not "
                 "ended %u ms after its call failed",
                 j->group_id, j->worker, sjob_region(j)->rank, HELD_SEND_MS);
        if (p->out != NULL) {
            dlink_out_abort(p->out);
        }
    }
}

static void
wgroups_tick_locked(struct wgroups *wg, uint64_t now)
{
    held_sends_cut(wg, now);
    for (struct wgroup *g = wg->groups; g != NULL; g = g->next) {
        for (struct wcall *c = g->calls, *next; c != NULL; c = next) {
            char names[DC_STATUS_MESSAGE_MAX - 128];
            next = c->next;
            if (now >= c->deadline_ms) {
                dc_status st;
                missing_ranks(g, c, names, sizeof(names));
                status_set(&st, DC_DEADLINE_EXCEEDED,
                           "group %s call %llu: deadline passed waiting for %s", g->id,
                           (unsigned long long)c->seq, names);
                wcall_unlink(g, c);
                wcall_fail_locals(g, c, &st);
                wcall_free(wg, g, c);
                continue;
            }
            if (!c->noted && !c->sent && c->n_local_in > 0 &&
                now - c->first_ms >= (c->deadline_ms - c->first_ms) / 2) {
                wcall_send(wg, g, c, true);
                if (g->ended) {
                    break;
                }
            }
            if (!c->stall_logged && !(c->n_local_in == 0 && c->seq < g->local_seq_max) &&
                now - c->started_ms >= wg->cfg->group_stall_warn_ms) {
                c->stall_logged = true;
                wg->stalls_total++;
                missing_ranks(g, c, names, sizeof(names));
                log_warn("group %s call %llu stalled for %llu ms waiting for %s", g->id,
                         (unsigned long long)c->seq, (unsigned long long)(now - c->started_ms),
                         names);
            }
        }
    }
}

static void *
wgroups_timer(void *arg)
{
    struct wgroups *wg = arg;

    thread_name_set("dc-group-timer");
    pthread_mutex_lock(&wg->mtx);
    while (!wg->stopping) {
        uint64_t now = rpc_now_ms();
        wgroups_tick_locked(wg, now);
        if (now - wg->bufs_trimmed_ms >= GROUPS_BUFFER_IDLE_MS / 4) {
            /* Unmapping takes a while: not under mtx. */
            wg->bufs_trimmed_ms = now;
            pthread_mutex_unlock(&wg->mtx);
            bufcache_trim(wg->bufs, GROUPS_BUFFER_IDLE_MS);
            pthread_mutex_lock(&wg->mtx);
            continue;
        }
        clock_cond_wait_ms(&wg->cv, &wg->mtx, TIMER_TICK_MS);
    }
    pthread_mutex_unlock(&wg->mtx);
    return NULL;
}

void
wgroups_metrics_render(struct wgroups *wg, struct mbuf *b)
{
    struct bufcache_stats bs;

    pthread_mutex_lock(&wg->mtx);
    mbuf_printf(b, "# HELP devcoord_group_calls_total Group calls completed on this worker, by "
                   "kind.\n"
                   "# TYPE devcoord_group_calls_total counter\n");
    for (int k = DC_OP_ALL_REDUCE; k < DC_OP_COUNT; k++) {
        mbuf_printf(b, "devcoord_group_calls_total{kind=\"%s\"} %llu\n",
                    dc_op_kind_name((dc_op_kind)k), (unsigned long long)wg->calls_total[k]);
    }
    mbuf_printf(b,
                "# HELP devcoord_group_stalls_total Group calls a rank was missing from for "
                "longer than the stall warning.\n"
                "# TYPE devcoord_group_stalls_total counter\n"
                "devcoord_group_stalls_total %llu\n"
                "# HELP devcoord_group_shm_calls_total Group calls of a rank made on shared "
                "memory: no bytes in the request or the reply.\n"
                "# TYPE devcoord_group_shm_calls_total counter\n"
                "devcoord_group_shm_calls_total %llu\n"
                "# HELP devcoord_group_in_place_calls_total All-reduces of one-worker groups "
                "reduced in place in their ranks' shared memory, split across threads.\n"
                "# TYPE devcoord_group_in_place_calls_total counter\n"
                "devcoord_group_in_place_calls_total %llu\n"
                "# HELP devcoord_group_call_bytes_received_total Bytes ranks sent in GroupCall "
                "requests.\n"
                "# TYPE devcoord_group_call_bytes_received_total counter\n"
                "devcoord_group_call_bytes_received_total %llu\n"
                "# HELP devcoord_group_call_bytes_sent_total Result bytes sent in GroupCall "
                "replies.\n"
                "# TYPE devcoord_group_call_bytes_sent_total counter\n"
                "devcoord_group_call_bytes_sent_total %llu\n"
                "# HELP devcoord_group_shm_mapped_bytes Ranks' shared memory this worker maps.\n"
                "# TYPE devcoord_group_shm_mapped_bytes gauge\n"
                "devcoord_group_shm_mapped_bytes %zu\n"
                "# HELP devcoord_group_link_bytes_sent_total Bytes of group parts this worker "
                "sent its peers over the data link.\n"
                "# TYPE devcoord_group_link_bytes_sent_total counter\n"
                "devcoord_group_link_bytes_sent_total %llu\n"
                "# HELP devcoord_group_link_bytes_received_total Bytes of group parts this "
                "worker received from its peers over the data link.\n"
                "# TYPE devcoord_group_link_bytes_received_total counter\n"
                "devcoord_group_link_bytes_received_total %llu\n"
                "# HELP devcoord_group_link_refused_total Connections to the data port refused "
                "(no or wrong HELLO, a malformed or oversized frame, too many connections).\n"
                "# TYPE devcoord_group_link_refused_total counter\n"
                "devcoord_group_link_refused_total %llu\n"
                "# HELP devcoord_group_ring_calls_total Group all-reduces whose workers went "
                "round the ring (reduce-scatter, then all-gather) on the data link.\n"
                "# TYPE devcoord_group_ring_calls_total counter\n"
                "devcoord_group_ring_calls_total %llu\n"
                "# HELP devcoord_group_ring_in_region_calls_total Of those, calls whose ring "
                "ran in the rank's shared memory (one rank on this worker, in place): no copy "
                "in or out.\n"
                "# TYPE devcoord_group_ring_in_region_calls_total counter\n"
                "devcoord_group_ring_in_region_calls_total %llu\n"
                "# HELP devcoord_group_call_link_calls_total Group calls of a rank taken on its "
                "call link (frames on the data port) instead of a GroupCall RPC.\n"
                "# TYPE devcoord_group_call_link_calls_total counter\n"
                "devcoord_group_call_link_calls_total %llu\n"
                "# HELP devcoord_group_link_parts_sent_total Parts of small group calls sent "
                "whole on the data link (a frame each, no reply awaited).\n"
                "# TYPE devcoord_group_link_parts_sent_total counter\n"
                "devcoord_group_link_parts_sent_total %llu\n"
                "# HELP devcoord_group_link_parts_received_total Parts of small group calls "
                "taken whole from the data link.\n"
                "# TYPE devcoord_group_link_parts_received_total counter\n"
                "devcoord_group_link_parts_received_total %llu\n",
                (unsigned long long)wg->stalls_total, (unsigned long long)wg->shm_calls_total,
                (unsigned long long)wg->in_place_total, (unsigned long long)wg->call_bytes_in,
                (unsigned long long)wg->call_bytes_out, wg->shm_mapped,
                (unsigned long long)wg->link_bytes_out, (unsigned long long)wg->link_bytes_in,
                (unsigned long long)(wg->dl != NULL ? dlink_server_refused(wg->dl) : 0),
                (unsigned long long)wg->ring_calls_total,
                (unsigned long long)wg->ring_in_region_total,
                (unsigned long long)wg->link_calls_total, (unsigned long long)wg->parts_out,
                (unsigned long long)wg->parts_in);
    mbuf_printf(b,
                "# HELP devcoord_group_ring_reduce_scatter_calls_total Group reduce-scatters "
                "whose workers went round the ring (its reduce-scatter steps alone) on the "
                "data link.\n"
                "# TYPE devcoord_group_ring_reduce_scatter_calls_total counter\n"
                "devcoord_group_ring_reduce_scatter_calls_total %llu\n",
                (unsigned long long)wg->ring_scatter_total);
    pthread_mutex_unlock(&wg->mtx);
    bufcache_stats(wg->bufs, &bs);
    mbuf_printf(b,
                "# HELP devcoord_group_buffer_cache_hits_total Group call buffers taken from "
                "the buffer cache (groups.buffer_cache_bytes) instead of newly mapped.\n"
                "# TYPE devcoord_group_buffer_cache_hits_total counter\n"
                "devcoord_group_buffer_cache_hits_total %llu\n"
                "# HELP devcoord_group_buffer_cache_misses_total Large group call buffers "
                "newly mapped: none of their size was kept.\n"
                "# TYPE devcoord_group_buffer_cache_misses_total counter\n"
                "devcoord_group_buffer_cache_misses_total %llu\n"
                "# HELP devcoord_group_buffer_cache_unmapped_total Large group call buffers "
                "unmapped: given back to a full cache, or idle.\n"
                "# TYPE devcoord_group_buffer_cache_unmapped_total counter\n"
                "devcoord_group_buffer_cache_unmapped_total %llu\n"
                "# HELP devcoord_group_buffer_cache_kept_bytes Bytes of group call buffers "
                "kept for reuse (at most groups.buffer_cache_bytes).\n"
                "# TYPE devcoord_group_buffer_cache_kept_bytes gauge\n"
                "devcoord_group_buffer_cache_kept_bytes %zu\n"
                "# HELP devcoord_group_buffer_cache_mapped_bytes Bytes of large group call "
                "buffers mapped: in use and kept.\n"
                "# TYPE devcoord_group_buffer_cache_mapped_bytes gauge\n"
                "devcoord_group_buffer_cache_mapped_bytes %zu\n"
                "# HELP devcoord_group_buffer_cache_max_bytes groups.buffer_cache_bytes.\n"
                "# TYPE devcoord_group_buffer_cache_max_bytes gauge\n"
                "devcoord_group_buffer_cache_max_bytes %zu\n",
                (unsigned long long)bs.hits, (unsigned long long)bs.misses,
                (unsigned long long)bs.unmapped, bs.kept_bytes, bs.mapped_bytes, bs.max_bytes);
    mbuf_printf(b, "# HELP devcoord_group_call_seconds Time from a group call's first rank to "
                   "its result.\n"
                   "# TYPE devcoord_group_call_seconds histogram\n");
    histo_render(b, "devcoord_group_call_seconds", "", &wg->call_seconds);
}

/* ---- life -------------------------------------------------------------------------------- */

struct wgroups *
wgroups_new(const struct config_worker *cfg, const char *token)
{
    struct wgroups *wg = calloc(1, sizeof(*wg));
    long cpus          = sysconf(_SC_NPROCESSORS_ONLN);

    if (wg == NULL) {
        return NULL;
    }
    if (shmguard_install() != 0) {
        log_error("cannot install the SIGBUS handler for shared memory: %s", strerror(errno));
        free(wg);
        return NULL;
    }
    wg->cfg      = cfg;
    wg->token    = token;
    wg->max_held = cfg->max_inflight_bytes ? (size_t)cfg->max_inflight_bytes
                                           : (size_t)RPC_WORKER_DEFAULT_MAX_INFLIGHT;
    histo_init(&wg->call_seconds, histo_seconds, histo_seconds_n);
    /* One reducing thread per core beside the one that completes a call. */
    if ((wg->lr_in = calloc(GROUPS_MAX_RANKS, sizeof(*wg->lr_in))) == NULL ||
        (wg->lr_out = calloc(GROUPS_MAX_RANKS, sizeof(*wg->lr_out))) == NULL ||
        (wg->lr = lreduce_new(cpus > 1 ? (unsigned)(cpus > 8 ? 7 : cpus - 1) : 0)) == NULL ||
        (wg->bufs = bufcache_new((size_t)cfg->group_buffer_cache_bytes)) == NULL) {
        lreduce_free(wg->lr);
        free(wg->lr_in);
        free(wg->lr_out);
        free(wg);
        return NULL;
    }
    pthread_mutex_init(&wg->mtx, NULL);
    clock_cond_init(&wg->cv);
    clock_cond_init(&wg->op_sink_cv);
    if (pthread_create(&wg->timer, NULL, wgroups_timer, wg) != 0) {
        pthread_cond_destroy(&wg->op_sink_cv);
        pthread_cond_destroy(&wg->cv);
        pthread_mutex_destroy(&wg->mtx);
        bufcache_free(wg->bufs);
        lreduce_free(wg->lr);
        free(wg->lr_in);
        free(wg->lr_out);
        free(wg);
        return NULL;
    }
    return wg;
}

void
wgroups_shutdown(struct wgroups *wg)
{
    dc_status st;

    if (wg == NULL) {
        return;
    }
    pthread_mutex_lock(&wg->mtx);
    if (wg->stopping) {
        pthread_mutex_unlock(&wg->mtx);
        return;
    }
    wg->stopping = true;
    pthread_cond_broadcast(&wg->cv);
    status_set(&st, DC_UNAVAILABLE, "worker shutting down");
    for (struct wgroup *g = wg->groups; g != NULL; g = g->next) {
        group_end_locked(wg, g, &st);
    }
    for (size_t i = 0; i < wg->n_peers; i++) {
        pthread_cond_broadcast(&wg->peers[i]->cv);
        if (wg->peers[i]->out != NULL) {
            dlink_out_abort(wg->peers[i]->out); /* a send under way fails at once */
        }
    }
    /* An op's thread writing a frame itself uses its peer's connection until it returns. */
    for (size_t i = 0; i < wg->n_peers; i++) {
        while (wg->peers[i]->inline_busy) {
            pthread_cond_wait(&wg->peers[i]->cv, &wg->mtx);
        }
    }
    pthread_mutex_unlock(&wg->mtx);
    pthread_join(wg->timer, NULL);
    for (size_t i = 0; i < wg->n_peers; i++) {
        if (wg->peers[i]->sender_started) {
            pthread_join(wg->peers[i]->sender, NULL);
            wg->peers[i]->sender_started = false;
        }
        dlink_out_close(wg->peers[i]->out);
        wg->peers[i]->out = NULL;
    }
    /* The data port's threads take mtx: not under it. */
    dlink_server_free(wg->dl);
    wg->dl = NULL;
    /* Closing waits for the exchange callbacks, which take mtx: not under it. Nothing opens
     * or uses a peer once stopping is set. */
    for (size_t i = 0; i < wg->n_peers; i++) {
        rpc_client_close(wg->peers[i]->client);
        wg->peers[i]->client = NULL;
    }
}

void
wgroups_leaving(struct wgroups *wg)
{
    if (wg == NULL) {
        return;
    }
    pthread_mutex_lock(&wg->mtx);
    wg->leaving = true;
    pthread_mutex_unlock(&wg->mtx);
}

void
wgroups_free(struct wgroups *wg)
{
    if (wg == NULL) {
        return;
    }
    wgroups_shutdown(wg);
    for (size_t i = 0; i < wg->n_peers; i++) {
        dltls_free(wg->peers[i]->tls);
        pthread_cond_destroy(&wg->peers[i]->cv);
        free(wg->peers[i]);
    }
    dltls_free(wg->dl_tls);
    free(wg->peers);
    while (wg->groups != NULL) {
        struct wgroup *g = wg->groups;
        wg->groups       = g->next;
        regions_free(wg, g);
        group_free(g);
    }
    bufcache_free(wg->bufs); /* every pbuf is back: the calls and the threads are gone */
    lreduce_free(wg->lr);
    free(wg->lr_in);
    free(wg->lr_out);
    pthread_cond_destroy(&wg->op_sink_cv);
    pthread_cond_destroy(&wg->cv);
    pthread_mutex_destroy(&wg->mtx);
    free(wg);
}
