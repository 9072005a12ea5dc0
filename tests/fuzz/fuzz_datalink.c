/*
 * The receiving side of the workers' data link (common/datalink.c) on real bytes: one
 * data port on 127.0.0.1 per process, and per input a fresh TCP connection to it that carries
 * the input, then closes. The target waits (bounded) until the port is done with that
 * connection, then compares what the events got with what a model of the protocol, run on
 * the same bytes, says they must get:
 *   - no frame is delivered before a HELLO with the port's secret;
 *   - every data frame whose header decodes gets one frame_begin and then one frame_end,
 *     with that header, the HELLO's address as peer and the pin frame_begin gave;
 *   - a frame_end with ok has written exactly the input's bytes at that frame's payload into
 *     the memory frame_begin named (a buffer of exactly h->length bytes, so a write past it
 *     shows under ASan), and ok is false only when the input ends inside the payload;
 *   - a frame whose header does not decode, or a HELLO in the wrong place, ends the
 *     connection and counts as refused; so does a HELLO that is cut short, has the wrong
 *     secret or asks for a control link (DLINK_HELLO_CONTROL: this port has no control
 *     handler); an authenticated connection that ends reports peer_lost once.
 * Besides, dlink_hdr_decode is checked as a pure function on every header the model meets:
 * decoding bounds length and total by max_frame, a data frame's bytes by its part, a HELLO's
 * length by the secret and an address, and an accepted header encodes back to its bytes.
 * Nothing may be allocated from a header's length before the check: a malloc hook records the
 * largest allocation while an input runs, which must stay within MAX_FRAME and the input's own
 * size (libFuzzer's malloc limit, the rss limit, would only see the largest).
 *
 * Input: byte 0 picks how the rest goes on the wire (the fuzzer cannot guess a random secret):
 *   0: raw;
 *   1: after a valid HELLO from PEER with the port's secret;
 *   2: raw, but with the port's secret written over bytes [56, 88), where a HELLO's comes,
 *      so the fuzzer can shape the HELLO's header and address itself.
 * A data frame with flag bit 0 set gets no memory from frame_begin (the port reads its payload
 * and drops it), as a frame for a group no longer here would. A frame flagged DLINK_FLAG_OP
 * (SubmitOp's chunks) goes to op_frame with its payload, which takes it when its seq is even
 * and refuses it (the port then drops the connection) when odd; one with seq bit 1 set and
 * a payload is placed instead (op_place: a buffer of exactly its length), read straight
 * into it and landed (op_landed, ok or not), taken or refused by the same rule. A part frame
 * (DLINK_PART, a small group call's part) goes the same way, to the same handler. Call and answer
 * frames (the call link's) decode, but a data connection refuses them.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <sanitizer/allocator_interface.h>

#include "datalink.h"
#include "fuzz.h"
#include "log.h"

#define MAX_FRAME ((uint64_t)1 << 20)
/* Never reached (the target closes right after its bytes); long, so a slow machine does not
 * turn a valid HELLO into a refusal the model did not expect. */
#define HANDSHAKE_MS 5000
/* How long the port may take with one connection after the target closed its side. */
#define WAIT_MS 8000
#define PEER    "tcp://fuzz-peer:7500"
/* Bytes frame_begin's buffers start with, so a payload that was not written shows. */
#define FILL 0xA5

enum event_kind { EV_BEGIN, EV_END, EV_LOST, EV_OP, EV_PLACE, EV_LANDED };

struct event {
    enum event_kind kind;
    struct dlink_hdr h;
    char peer[DLINK_ADDRESS_MAX + 1];
    uint8_t *dst; /* EV_BEGIN, EV_PLACE: the buffer handed out (NULL: dropped); EV_OP: the
                   * payload */
    void *pin;
    bool ok;
    dc_code why; /* EV_LOST */
};

/* What the events got (their threads), under mtx. */
static pthread_mutex_t mtx = PTHREAD_MUTEX_INITIALIZER;
static struct event *events;
static size_t n_events, cap_events;

static struct dlink_server *srv;
static nng_stream_dialer *dialer;
static nng_aio *aio;
/* frame_end hands back pins; a dropped frame's pin points here. */
static int drop_pin;
/* The largest allocation since the input began, any thread. */
static atomic_size_t biggest;

static void
malloc_hook(const volatile void *p, size_t size)
{
    size_t seen = atomic_load_explicit(&biggest, memory_order_relaxed);

    (void)p;
    while (size > seen && !atomic_compare_exchange_weak_explicit(
                              &biggest, &seen, size, memory_order_relaxed, memory_order_relaxed)) {
    }
}

static void
free_hook(const volatile void *p)
{
    (void)p;
}

static struct event *
event_add(enum event_kind kind, const char *peer)
{
    struct event *e;

    if (n_events == cap_events) {
        size_t cap        = cap_events ? 2 * cap_events : 64;
        struct event *mem = realloc(events, cap * sizeof(*mem));
        if (mem == NULL) {
            fuzz_finding("out of memory recording events");
        }
        events     = mem;
        cap_events = cap;
    }
    e = &events[n_events++];
    memset(e, 0, sizeof(*e));
    e->kind = kind;
    snprintf(e->peer, sizeof(e->peer), "%s", peer);
    return e;
}

/* A buffer for a frame's payload, exactly h->length bytes (1 for none) filled with FILL, so
 * bytes not written show. mtx held. */
static uint8_t *
payload_buffer(const struct dlink_hdr *h)
{
    uint8_t *b;

    /* h->length has been checked against the port's limits by now; if not, the malloc limit
     * says so. */
    if ((b = malloc(h->length ? h->length : 1)) == NULL) {
        fuzz_finding("cannot allocate %u bytes for a frame", h->length);
    }
    memset(b, FILL, h->length);
    return b;
}

/* frame_end's or op_landed's event. */
static void
event_end(enum event_kind kind, const char *peer, const struct dlink_hdr *h, void *pin, bool ok)
{
    struct event *e;

    pthread_mutex_lock(&mtx);
    e      = event_add(kind, peer);
    e->h   = *h;
    e->pin = pin;
    e->ok  = ok;
    pthread_mutex_unlock(&mtx);
}

/* What op_frame and op_landed say of a whole op frame: taken when its seq is even. */
static bool
op_taken(const struct dlink_hdr *h, dc_status *why)
{
    if ((h->seq & 1) != 0) {
        status_set(why, DC_INVALID_ARGUMENT, "fuzz: op frame refused (odd seq)");
        return false;
    }
    return true;
}

static void
ev_begin(void *arg, const char *peer, const struct dlink_hdr *h, uint8_t **dst, void **pin,
         uint32_t *wait_ms)
{
    struct event *e;

    (void)arg;
    (void)wait_ms;
    pthread_mutex_lock(&mtx);
    e    = event_add(EV_BEGIN, peer);
    e->h = *h;
    if ((h->flags & 1) == 0) {
        e->dst = payload_buffer(h);
        *dst   = e->dst;
        *pin   = e->dst;
    } else {
        *pin = &drop_pin;
    }
    e->pin = *pin;
    pthread_mutex_unlock(&mtx);
}

static void
ev_end(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok)
{
    (void)arg;
    event_end(EV_END, peer, h, pin, ok);
}

static bool
ev_op(void *arg, const char *peer, const struct dlink_hdr *h, const uint8_t *payload,
      dc_status *why)
{
    struct event *e;

    (void)arg;
    pthread_mutex_lock(&mtx);
    e      = event_add(EV_OP, peer);
    e->h   = *h;
    e->dst = payload_buffer(h);
    memcpy(e->dst, payload, h->length);
    pthread_mutex_unlock(&mtx);
    return op_taken(h, why);
}

/* Op frames with seq bit 1 set are placed (see placed()). */
static uint8_t *
ev_place(void *arg, const char *peer, const struct dlink_hdr *h, void **pin, uint32_t *wait_ms)
{
    struct event *e;

    (void)arg;
    if ((h->seq & 2) == 0) {
        return NULL;
    }
    pthread_mutex_lock(&mtx);
    e        = event_add(EV_PLACE, peer);
    e->h     = *h;
    e->dst   = payload_buffer(h);
    e->pin   = e->dst;
    *pin     = e->dst;
    *wait_ms = HANDSHAKE_MS;
    pthread_mutex_unlock(&mtx);
    return e->dst;
}

static bool
ev_landed(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok,
          dc_status *why)
{
    (void)arg;
    event_end(EV_LANDED, peer, h, pin, ok);
    return !ok || op_taken(h, why);
}

static void
ev_lost(void *arg, const char *peer, const dc_status *why)
{
    struct event *e;

    (void)arg;
    fuzz_check_status(why);
    pthread_mutex_lock(&mtx);
    e      = event_add(EV_LOST, peer);
    e->why = why->code;
    pthread_mutex_unlock(&mtx);
}

/* ---- the model ------------------------------------------------------------------------- */

struct model_frame {
    struct dlink_hdr h;
    size_t payload; /* where its payload starts in the bytes sent */
    bool ok;        /* all of it was sent */
};

struct model {
    bool refused, authed;
    char peer[DLINK_ADDRESS_MAX + 1];
    dc_code lost; /* authed: the code peer_lost gets */
    struct model_frame *frames;
    size_t n_frames;
};

static bool
hdr_equal(const struct dlink_hdr *a, const struct dlink_hdr *b)
{
    return a->kind == b->kind && a->flags == b->flags && a->from == b->from &&
           a->length == b->length && a->group == b->group && a->generation == b->generation &&
           a->seq == b->seq && a->offset == b->offset && a->total == b->total;
}

/* dlink_hdr_decode as a pure function: what it accepts is within its bounds and encodes back
 * to the same bytes; what it refuses has a code and a message. */
static dc_code
check_decode(const uint8_t raw[DLINK_HDR_SIZE], uint64_t max_frame, struct dlink_hdr *h)
{
    uint8_t again[DLINK_HDR_SIZE];
    struct dlink_hdr h2;
    dc_status st, st2;
    dc_code code;

    status_clear(&st);
    code = dlink_hdr_decode(raw, max_frame, h, &st);
    fuzz_check_status(&st);
    if (code != DC_OK) {
        if ((code != DC_INVALID_ARGUMENT && code != DC_OUT_OF_RANGE) || st.code != code ||
            st.message[0] == '\0') {
            fuzz_finding("dlink_hdr_decode refused with code %d, status %d '%s'", (int)code,
                         (int)st.code, st.message);
        }
        return code;
    }
    if (h->kind < DLINK_HELLO || h->kind > DLINK_PART) {
        fuzz_finding("decoded a frame of kind %u", h->kind);
    }
    if ((h->kind == DLINK_CALL || h->kind == DLINK_PART) && h->offset > h->length) {
        fuzz_finding("decoded a %s frame of %u bytes whose request has %llu",
                     h->kind == DLINK_CALL ? "call" : "part", h->length,
                     (unsigned long long)h->offset);
    }
    if (h->kind == DLINK_CALL && h->offset > DLINK_CALL_PB_MAX) {
        fuzz_finding("decoded a call frame with a request of %llu bytes",
                     (unsigned long long)h->offset);
    }
    if (h->length > max_frame || ((h->flags & DLINK_FLAG_OP) == 0 && h->total > max_frame)) {
        fuzz_finding("decoded length %u, total %llu above max_frame %llu", h->length,
                     (unsigned long long)h->total, (unsigned long long)max_frame);
    }
    if (h->kind == DLINK_DATA && (h->offset > h->total || h->total - h->offset < h->length)) {
        fuzz_finding("decoded a data frame of bytes %llu+%u of a part of %llu",
                     (unsigned long long)h->offset, h->length, (unsigned long long)h->total);
    }
    if (h->kind == DLINK_HELLO &&
        (h->length < DLINK_SECRET_SIZE || h->length > DLINK_SECRET_SIZE + DLINK_ADDRESS_MAX)) {
        fuzz_finding("decoded a HELLO of %u bytes", h->length);
    }
    dlink_hdr_encode(h, again);
    if (memcmp(again, raw, DLINK_HDR_SIZE) != 0) {
        fuzz_finding("a decoded header encodes to other bytes");
    }
    status_clear(&st2);
    if (dlink_hdr_decode(again, max_frame, &h2, &st2) != DC_OK || !hdr_equal(h, &h2)) {
        fuzz_finding("a decoded header does not decode the same after encoding");
    }
    return DC_OK;
}

/* An op's or a small call's part: read whole, then handed to its handler (ev_op). */
static bool
whole(const struct dlink_hdr *h)
{
    return (h->flags & DLINK_FLAG_OP) != 0 || h->kind == DLINK_PART;
}

/* An op frame the port reads straight into the buffer ev_place hands out. */
static bool
placed(const struct dlink_hdr *h)
{
    return h->kind == DLINK_DATA && (h->flags & DLINK_FLAG_OP) != 0 && h->length > 0 &&
           (h->seq & 2) != 0;
}

/* What the port must do with these bytes (the connection closing after them). */
static void
model_run(struct model *m, const uint8_t *b, size_t len)
{
    const uint8_t *secret = dlink_server_secret(srv);
    struct dlink_hdr h;
    dc_code code;
    size_t pos = 0;

    memset(m, 0, sizeof(*m));
    if (len < DLINK_HDR_SIZE || check_decode(b, MAX_FRAME, &h) != DC_OK || h.kind != DLINK_HELLO ||
        len - DLINK_HDR_SIZE < h.length ||
        memcmp(b + DLINK_HDR_SIZE, secret, DLINK_SECRET_SIZE) != 0 ||
        (h.flags & DLINK_HELLO_CONTROL) != 0) {
        m->refused = true;
        return;
    }
    m->authed = true;
    snprintf(m->peer, sizeof(m->peer), "%.*s", (int)(h.length - DLINK_SECRET_SIZE),
             (const char *)b + DLINK_HDR_SIZE + DLINK_SECRET_SIZE);
    pos = DLINK_HDR_SIZE + h.length;
    /* At most one frame per header's worth of bytes. */
    if ((m->frames = calloc(len / DLINK_HDR_SIZE + 1, sizeof(*m->frames))) == NULL) {
        fuzz_finding("out of memory in the model");
    }
    for (;;) {
        struct model_frame *f;

        if (len - pos < DLINK_HDR_SIZE) {
            m->lost = DC_UNAVAILABLE;
            return;
        }
        if ((code = check_decode(b + pos, MAX_FRAME, &h)) != DC_OK ||
            (h.kind != DLINK_DATA && h.kind != DLINK_PART)) {
            m->refused = true;
            m->lost    = code != DC_OK ? code : DC_INVALID_ARGUMENT;
            return;
        }
        pos += DLINK_HDR_SIZE;
        if (whole(&h) && h.length > DLINK_CHUNK) {
            m->refused = true; /* an op or part frame is read whole into a chunk, or refused */
            m->lost    = DC_INVALID_ARGUMENT;
            return;
        }
        if (whole(&h) && !placed(&h) && len - pos < h.length) {
            m->lost = DC_UNAVAILABLE; /* cut short: op_frame never sees it */
            return;
        }
        f          = &m->frames[m->n_frames++];
        f->h       = h;
        f->payload = pos;
        if (len - pos < h.length) {
            m->lost = DC_UNAVAILABLE;
            return;
        }
        f->ok = true;
        pos += h.length;
        if (whole(&h) && (h.seq & 1) != 0) {
            m->refused = true; /* op_frame (or part) refused it */
            m->lost    = DC_INVALID_ARGUMENT;
            return;
        }
    }
}

/* ---- the connection -------------------------------------------------------------------- */

static void
start_once(void)
{
    struct dlink_events ev = { NULL,  ev_begin, ev_end, ev_lost,  ev_op,     NULL, 0,
                               ev_op, NULL,     0,      ev_place, ev_landed, NULL, NULL };
    char url[64];
    dc_status st;
    int rv;

    if (srv != NULL) {
        return;
    }
    /* Every refused connection is a warning: the fuzzer makes thousands a second. */
    log_configure(LOG_ERROR, LOG_FORMAT_TEXT, "fuzz_datalink");
    if (__sanitizer_install_malloc_and_free_hooks(malloc_hook, free_hook) == 0) {
        fprintf(stderr, "fuzz_datalink: cannot install the malloc hook\n");
        exit(1);
    }
    status_clear(&st);
    if (dlink_server_start("tcp://127.0.0.1:0", NULL, MAX_FRAME, HANDSHAKE_MS, &ev, &srv, &st) !=
        DC_OK) {
        fprintf(stderr, "fuzz_datalink: cannot start the data port: %s\n", st.message);
        exit(1);
    }
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", dlink_server_port(srv));
    if ((rv = nng_stream_dialer_alloc(&dialer, url)) != 0 ||
        (rv = nng_aio_alloc(&aio, NULL, NULL)) != 0) {
        fprintf(stderr, "fuzz_datalink: %s\n", nng_strerror(rv));
        exit(1);
    }
}

/* Connects, sends the bytes (the port may close early: a refusal), closes. */
static void
send_bytes(const uint8_t *b, size_t len)
{
    nng_stream *s;
    nng_iov iov;
    int rv;

    nng_aio_set_timeout(aio, WAIT_MS);
    nng_stream_dialer_dial(dialer, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio)) != 0) {
        fuzz_finding("cannot connect to the data port: %s", nng_strerror(rv));
    }
    s = nng_aio_get_output(aio, 0);
    while (len > 0) {
        iov = (nng_iov){ (void *)b, len };
        nng_aio_set_iov(aio, 1, &iov);
        nng_stream_send(s, aio);
        nng_aio_wait(aio);
        if ((rv = nng_aio_result(aio)) == NNG_ETIMEDOUT) {
            fuzz_finding("the data port stopped reading %zu bytes before the end", len);
        }
        if (rv != 0) {
            break;
        }
        b += nng_aio_count(aio);
        len -= nng_aio_count(aio);
    }
    nng_stream_close(s);
    nng_stream_free(s);
}

/* ---- the comparison -------------------------------------------------------------------- */

static void
check_events(const struct model *m, const uint8_t *b)
{
    const char *peer = m->authed ? m->peer : "";
    size_t i         = 0;

    for (size_t k = 0; k < m->n_frames; k++) {
        const struct model_frame *f = &m->frames[k];
        const struct event *e       = i < n_events ? &events[i] : NULL;
        const struct event *end     = i + 1 < n_events ? &events[i + 1] : NULL;

        if (placed(&f->h)) {
            if (e == NULL || e->kind != EV_PLACE || !hdr_equal(&e->h, &f->h) ||
                strcmp(e->peer, peer) != 0) {
                fuzz_finding("placed op frame %zu (%u bytes): no op_place with its header and "
                             "peer",
                             k, f->h.length);
            }
            if (end == NULL || end->kind != EV_LANDED || !hdr_equal(&end->h, &f->h) ||
                end->pin != e->pin || strcmp(end->peer, peer) != 0) {
                fuzz_finding("placed op frame %zu: op_place without its op_landed", k);
            }
            if (end->ok != f->ok) {
                fuzz_finding("placed op frame %zu: op_landed ok=%d, but %s of its %u bytes were "
                             "sent",
                             k, end->ok, f->ok ? "all" : "not all", f->h.length);
            }
            if (end->ok && memcmp(e->dst, b + f->payload, f->h.length) != 0) {
                fuzz_finding("placed op frame %zu: the payload in place is not the bytes sent", k);
            }
            i += 2;
            continue;
        }
        if (whole(&f->h)) {
            if (e == NULL || e->kind != EV_OP || !hdr_equal(&e->h, &f->h) ||
                strcmp(e->peer, peer) != 0) {
                fuzz_finding("op frame %zu (%u bytes): no op_frame with its header and peer", k,
                             f->h.length);
            }
            if (memcmp(e->dst, b + f->payload, f->h.length) != 0) {
                fuzz_finding("op frame %zu: the payload delivered is not the bytes sent", k);
            }
            i++;
            continue;
        }
        if (e == NULL || e->kind != EV_BEGIN) {
            fuzz_finding("data frame %zu (%u bytes at %llu): no frame_begin", k, f->h.length,
                         (unsigned long long)f->h.offset);
        }
        if (!hdr_equal(&e->h, &f->h) || strcmp(e->peer, peer) != 0) {
            fuzz_finding("data frame %zu: frame_begin got another header or peer '%s'", k, e->peer);
        }
        if (end == NULL || end->kind != EV_END) {
            fuzz_finding("data frame %zu: frame_begin without frame_end", k);
        }
        if (!hdr_equal(&end->h, &f->h) || end->pin != e->pin || strcmp(end->peer, peer) != 0) {
            fuzz_finding("data frame %zu: frame_end got another header, pin or peer", k);
        }
        if (end->ok != f->ok) {
            fuzz_finding("data frame %zu: frame_end ok=%d, but %s of its %u bytes were sent", k,
                         end->ok, f->ok ? "all" : "not all", f->h.length);
        }
        if (end->ok && e->dst != NULL && memcmp(e->dst, b + f->payload, f->h.length) != 0) {
            fuzz_finding("data frame %zu: the payload delivered is not the bytes sent", k);
        }
        i += 2;
    }
    if (m->authed) {
        if (i >= n_events || events[i].kind != EV_LOST) {
            fuzz_finding("an authenticated connection ended without peer_lost");
        }
        if (strcmp(events[i].peer, peer) != 0 || events[i].why != m->lost) {
            fuzz_finding("peer_lost for '%s' with code %d, expected '%s' with %d", events[i].peer,
                         (int)events[i].why, peer, (int)m->lost);
        }
        i++;
    }
    if (i != n_events) {
        fuzz_finding("%zu events for %zu data frames (%s): %zu more than expected, the first "
                     "of kind %d",
                     n_events, m->n_frames, m->authed ? "after HELLO" : "no valid HELLO",
                     n_events - i, (int)events[i].kind);
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint64_t conns;
    struct dlink_hdr h;
    struct model m;
    uint64_t refused;
    uint8_t *wire;
    size_t len = 0;
    int mode;

    if (size == 0) {
        return 0;
    }
    start_once();
    atomic_store(&biggest, 0);
    mode = data[0] % 3;
    data++;
    size--;
    /* The pure decoder on the input's first header, against limits either side of it. */
    if (size >= DLINK_HDR_SIZE) {
        check_decode(data, MAX_FRAME, &h);
        check_decode(data, UINT64_MAX, &h);
        check_decode(data, 0, &h);
    }

    /* The bytes that go on the wire: a buffer of their own, so the model's reads are checked. */
    if ((wire = malloc(DLINK_HDR_SIZE + sizeof(PEER) + DLINK_SECRET_SIZE + size)) == NULL) {
        return 0;
    }
    if (mode == 1) {
        struct dlink_hdr hello = { .kind   = DLINK_HELLO,
                                   .length = DLINK_SECRET_SIZE + sizeof(PEER) - 1 };
        dlink_hdr_encode(&hello, wire);
        memcpy(wire + DLINK_HDR_SIZE, dlink_server_secret(srv), DLINK_SECRET_SIZE);
        memcpy(wire + DLINK_HDR_SIZE + DLINK_SECRET_SIZE, PEER, sizeof(PEER) - 1);
        len = DLINK_HDR_SIZE + hello.length;
    }
    memcpy(wire + len, data, size);
    if (mode == 2 && size >= DLINK_HDR_SIZE + DLINK_SECRET_SIZE) {
        memcpy(wire + DLINK_HDR_SIZE, dlink_server_secret(srv), DLINK_SECRET_SIZE);
    }
    len += size;
    model_run(&m, wire, len);

    refused = dlink_server_refused(srv);
    send_bytes(wire, len);
    conns++;
    for (nng_time start = nng_clock(); dlink_server_finished(srv) < conns;) {
        if (nng_clock() - start > WAIT_MS) {
            fuzz_finding("the data port still holds a connection %d ms after it closed", WAIT_MS);
        }
        nng_msleep(1);
    }
    if (dlink_server_finished(srv) != conns) {
        fuzz_finding("the data port finished %llu connections of %llu",
                     (unsigned long long)dlink_server_finished(srv), (unsigned long long)conns);
    }
    /* The target's own: the frames' buffers (checked lengths), the input's copies. */
    if (atomic_load(&biggest) > MAX_FRAME + size + 4096) {
        fuzz_finding("%zu bytes allocated for an input of %zu bytes (max_frame %llu)",
                     atomic_load(&biggest), size, (unsigned long long)MAX_FRAME);
    }
    if (dlink_server_refused(srv) - refused != (m.refused ? 1 : 0)) {
        fuzz_finding("the data port refused %llu connections, the model %d",
                     (unsigned long long)(dlink_server_refused(srv) - refused), m.refused);
    }

    pthread_mutex_lock(&mtx);
    check_events(&m, wire);
    for (size_t i = 0; i < n_events; i++) {
        if (events[i].kind == EV_BEGIN || events[i].kind == EV_OP || events[i].kind == EV_PLACE) {
            free(events[i].dst);
        }
    }
    n_events = 0;
    pthread_mutex_unlock(&mtx);
    free(m.frames);
    free(wire);
    return 0;
}
