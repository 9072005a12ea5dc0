/* The data link (common/datalink.c): frame headers from the wire, then a real data port
 * on 127.0.0.1 with a HELLO, a part landing in the memory named for it, and hostile peers. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "datalink.h"

#define MAX_FRAME (4u << 20)

static struct dlink_hdr
data_hdr(uint64_t offset, uint32_t length, uint64_t total)
{
    return (struct dlink_hdr){ .kind       = DLINK_DATA,
                               .from       = 1,
                               .length     = length,
                               .group      = dlink_group_hash("00000000000000ab"),
                               .generation = 3,
                               .seq        = 7,
                               .offset     = offset,
                               .total      = total };
}

static void
test_header_round_trip(void **state)
{
    struct dlink_hdr h = data_hdr(4096, 1024, 8192), back;
    uint8_t raw[DLINK_HDR_SIZE];
    dc_status st;

    (void)state;
    h.flags = 7;
    dlink_hdr_encode(&h, raw);
    assert_int_equal(raw[0], 'D');
    assert_int_equal(raw[3], 'L');
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_OK);
    assert_int_equal(back.kind, h.kind);
    assert_int_equal(back.flags, h.flags);
    assert_int_equal(back.from, h.from);
    assert_int_equal(back.length, h.length);
    assert_true(back.group == h.group && back.generation == h.generation && back.seq == h.seq);
    assert_true(back.offset == h.offset && back.total == h.total);
}

static void
test_header_refusals(void **state)
{
    struct dlink_hdr h, back;
    uint8_t raw[DLINK_HDR_SIZE];
    dc_status st;

    (void)state;
    /* Garbage: not our magic. */
    memset(raw, 0xA5, sizeof(raw));
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "magic"));
    /* Wrong version. */
    h = data_hdr(0, 16, 16);
    dlink_hdr_encode(&h, raw);
    raw[4] = DLINK_VERSION + 1;
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "version"));
    /* Unknown kind. */
    h.kind = 9;
    dlink_hdr_encode(&h, raw);
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "kind"));
    /* A huge announced length or part: refused before anything is allocated. */
    h = data_hdr(0, UINT32_MAX, UINT64_MAX);
    dlink_hdr_encode(&h, raw);
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_OUT_OF_RANGE);
    assert_non_null(strstr(st.message, "larger than this worker takes"));
    h = data_hdr(0, 16, MAX_FRAME + 1ull);
    dlink_hdr_encode(&h, raw);
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_OUT_OF_RANGE);
    /* An op's frame names its op's buffer, which nothing allocates from the header: its total
     * may exceed the frame limit, its length may not, and its bytes stay inside the total. */
    h.flags = DLINK_FLAG_OP;
    dlink_hdr_encode(&h, raw);
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_OK);
    assert_int_equal(back.flags, DLINK_FLAG_OP);
    h       = data_hdr(0, MAX_FRAME + 1u, UINT64_MAX);
    h.flags = DLINK_FLAG_OP;
    dlink_hdr_encode(&h, raw);
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_OUT_OF_RANGE);
    h       = data_hdr(UINT64_MAX - 4, 16, UINT64_MAX);
    h.flags = DLINK_FLAG_OP;
    dlink_hdr_encode(&h, raw);
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_INVALID_ARGUMENT);
    /* Bytes outside the part, including an offset that would wrap. */
    h = data_hdr(8, 16, 16);
    dlink_hdr_encode(&h, raw);
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_INVALID_ARGUMENT);
    h = data_hdr(UINT64_MAX - 4, 16, 16);
    dlink_hdr_encode(&h, raw);
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_INVALID_ARGUMENT);
    /* HELLO too short for the secret, or too long for an address. */
    h = (struct dlink_hdr){ .kind = DLINK_HELLO, .length = DLINK_SECRET_SIZE - 1 };
    dlink_hdr_encode(&h, raw);
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_INVALID_ARGUMENT);
    h.length = DLINK_SECRET_SIZE + DLINK_ADDRESS_MAX + 1;
    dlink_hdr_encode(&h, raw);
    assert_int_equal(dlink_hdr_decode(raw, MAX_FRAME, &back, &st), DC_INVALID_ARGUMENT);
}

/* ---- a real data port ------------------------------------------------------------------ */

struct sink {
    pthread_mutex_t mtx;
    uint8_t *dst;
    size_t bytes, received;
    int begins, ends, lost;
    char peer[DLINK_ADDRESS_MAX + 1];
    /* Op frames (DLINK_FLAG_OP): how many came, their bytes, the last one's first byte; a
     * payload starting with 0xFF is refused. */
    int op_frames;
    size_t op_bytes;
    uint64_t op_offset;
    /* Op frames at offset 0 are placed in place_dst (op_place), read within place_wait_ms;
     * op_landed counts them, ok or not, and the bytes of those ok. */
    uint8_t *place_dst;
    uint32_t place_wait_ms;
    int landed_ok, landed_failed, landed_wrong_pin;
    size_t landed_bytes;
    uint32_t begin_wait_ms; /* what sink_begin asks a frame's payload to take at most */
};

static bool
sink_op(void *arg, const char *peer, const struct dlink_hdr *h, const uint8_t *payload,
        dc_status *why)
{
    struct sink *s = arg;
    bool ok        = h->length == 0 || payload[0] != 0xFF;

    (void)peer;
    pthread_mutex_lock(&s->mtx);
    if (ok) {
        s->op_frames++;
        s->op_bytes += h->length;
        s->op_offset = h->offset;
    } else {
        status_set(why, DC_INVALID_ARGUMENT, "op frame outside its op");
    }
    pthread_mutex_unlock(&s->mtx);
    return ok;
}

static uint8_t *
sink_place(void *arg, const char *peer, const struct dlink_hdr *h, void **pin, uint32_t *wait_ms)
{
    struct sink *s = arg;

    (void)peer;
    if (s->place_dst == NULL || h->offset != 0) {
        return NULL;
    }
    *pin     = s;
    *wait_ms = s->place_wait_ms;
    return s->place_dst;
}

static bool
sink_landed(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok,
            dc_status *why)
{
    struct sink *s = arg;

    (void)peer;
    (void)why;
    pthread_mutex_lock(&s->mtx);
    s->landed_wrong_pin += pin != s;
    if (ok) {
        s->landed_ok++;
        s->landed_bytes += h->length;
    } else {
        s->landed_failed++;
    }
    pthread_mutex_unlock(&s->mtx);
    return true;
}

static void
sink_begin(void *arg, const char *peer, const struct dlink_hdr *h, uint8_t **dst, void **pin,
           uint32_t *wait_ms)
{
    struct sink *s = arg;

    pthread_mutex_lock(&s->mtx);
    *wait_ms = s->begin_wait_ms;
    s->begins++;
    snprintf(s->peer, sizeof(s->peer), "%s", peer);
    if (s->dst != NULL && h->total == s->bytes) {
        *dst = s->dst + h->offset;
        *pin = s;
    }
    pthread_mutex_unlock(&s->mtx);
}

static void
sink_end(void *arg, const char *peer, const struct dlink_hdr *h, void *pin, bool ok)
{
    struct sink *s = arg;

    (void)peer;
    pthread_mutex_lock(&s->mtx);
    s->ends++;
    if (ok && pin != NULL) {
        s->received += h->length;
    }
    pthread_mutex_unlock(&s->mtx);
}

static void
sink_lost(void *arg, const char *peer, const dc_status *why)
{
    struct sink *s = arg;

    (void)peer;
    (void)why;
    pthread_mutex_lock(&s->mtx);
    s->lost++;
    pthread_mutex_unlock(&s->mtx);
}

/* *field, read under mtx (a counter another thread bumps under it). */
static int
locked_get(pthread_mutex_t *mtx, const int *field)
{
    int v;
    pthread_mutex_lock(mtx);
    v = *field;
    pthread_mutex_unlock(mtx);
    return v;
}

static int
sink_get(struct sink *s, const int *field)
{
    return locked_get(&s->mtx, field);
}

/* Waits (bounded: 3 s) until *field of s reaches want; the caller asserts what it then is. */
static void
sink_wait(struct sink *s, const int *field, int want)
{
    for (int i = 0; i < 300 && sink_get(s, field) < want; i++) {
        nng_msleep(10);
    }
}

/* A server on 127.0.0.1 with events ev and HELLO bound handshake_ms; its URL into url. */
static struct dlink_server *
start_with(const struct dlink_events *ev, uint32_t handshake_ms, char *url, size_t cap)
{
    struct dlink_server *srv;
    dc_status st;

    assert_int_equal(
        dlink_server_start("tcp://127.0.0.1:0", NULL, MAX_FRAME, handshake_ms, ev, &srv, &st),
        DC_OK);
    snprintf(url, cap, "tcp://127.0.0.1:%d", dlink_server_port(srv));
    return srv;
}

static struct dlink_server *
start(struct sink *s, char *url, size_t cap)
{
    struct dlink_events ev = { s,    sink_begin, sink_end, sink_lost,  sink_op,     NULL, 0,
                               NULL, NULL,       0,        sink_place, sink_landed, NULL, NULL };

    return start_with(&ev, 300, url, cap);
}

/* Waits (bounded) for the server to refuse `want` connections in all. */
static void
wait_refused(struct dlink_server *srv, uint64_t want)
{
    for (int i = 0; i < 300 && dlink_server_refused(srv) < want; i++) {
        nng_msleep(10);
    }
    assert_int_equal(dlink_server_refused(srv), want);
}

/* Waits (bounded) for the server to be done with `want` connections in all. */
static void
wait_finished(struct dlink_server *srv, uint64_t want)
{
    for (int i = 0; i < 300 && dlink_server_finished(srv) < want; i++) {
        nng_msleep(10);
    }
    assert_int_equal(dlink_server_finished(srv), want);
}

/* A raw TCP connection to url, with its dialer and an aio to use on it. */
static nng_stream *
raw_dial(const char *url, nng_stream_dialer **d, nng_aio **aio)
{
    assert_int_equal(nng_aio_alloc(aio, NULL, NULL), 0);
    assert_int_equal(nng_stream_dialer_alloc(d, url), 0);
    nng_stream_dialer_dial(*d, *aio);
    nng_aio_wait(*aio);
    assert_int_equal(nng_aio_result(*aio), 0);
    return nng_aio_get_output(*aio, 0);
}

static void
raw_close(nng_stream *s, nng_stream_dialer *d, nng_aio *aio)
{
    nng_stream_close(s);
    nng_stream_free(s);
    nng_stream_dialer_free(d);
    nng_aio_free(aio);
}

/* A raw TCP client: sends bytes, then reports whether the server closed the connection. */
static bool
raw_send_then_closed(const char *url, const void *bytes, size_t len)
{
    nng_stream_dialer *d;
    nng_stream *s;
    nng_aio *aio;
    nng_iov iov;
    uint8_t buf[16];
    bool closed;

    s = raw_dial(url, &d, &aio);
    if (len > 0) {
        iov = (nng_iov){ (void *)bytes, len };
        nng_aio_set_iov(aio, 1, &iov);
        nng_stream_send(s, aio);
        nng_aio_wait(aio);
    }
    iov = (nng_iov){ buf, sizeof(buf) };
    nng_aio_set_iov(aio, 1, &iov);
    nng_aio_set_timeout(aio, 3000);
    nng_stream_recv(s, aio);
    nng_aio_wait(aio);
    closed = nng_aio_result(aio) != NNG_ETIMEDOUT;
    raw_close(s, d, aio);
    return closed;
}

static void
test_a_part_lands_where_the_receiver_says(void **state)
{
    struct sink s = { .bytes = 3u << 20 };
    size_t n      = s.bytes;
    uint8_t *src  = malloc(n);
    struct dlink_server *srv;
    struct dlink_out *o;
    struct dlink_hdr h = data_hdr(0, 0, n);
    char url[64];
    dc_status st;

    (void)state;
    pthread_mutex_init(&s.mtx, NULL);
    assert_non_null(src);
    assert_non_null(s.dst = calloc(1, n));
    for (size_t i = 0; i < n; i++) {
        src[i] = (uint8_t)(i * 7 + 1);
    }
    srv = start(&s, url, sizeof(url));
    assert_int_equal(
        dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://127.0.0.1:9", 2000, &o, &st), DC_OK);
    assert_int_equal(dlink_send(o, &h, src, n, &st), DC_OK);
    sink_wait(&s, &s.ends, (int)(n / DLINK_CHUNK));
    pthread_mutex_lock(&s.mtx);
    assert_int_equal(s.received, n);
    assert_int_equal(s.begins, (int)((n + DLINK_CHUNK - 1) / DLINK_CHUNK));
    assert_string_equal(s.peer, "tcp://127.0.0.1:9");
    pthread_mutex_unlock(&s.mtx);
    assert_memory_equal(s.dst, src, n);
    /* The sender going away is a lost peer. */
    dlink_out_close(o);
    sink_wait(&s, &s.lost, 1);
    assert_int_equal(sink_get(&s, &s.lost), 1);
    assert_int_equal(dlink_server_refused(srv), 0);
    wait_finished(srv, 1);
    dlink_server_free(srv);
    free(s.dst);
    free(src);
    pthread_mutex_destroy(&s.mtx);
}

/* An empty part (a zero-element tensor) is one frame of no bytes: it lands, and the link stays
 * up for the next one. nng reads zero bytes as the peer closing, so the port must not ask. */
static void
test_an_empty_part_keeps_the_link(void **state)
{
    uint8_t landing[1] = { 0 };
    struct sink s      = { .dst = landing, .bytes = 0 };
    struct dlink_server *srv;
    struct dlink_out *o;
    struct dlink_hdr h = data_hdr(0, 0, 0);
    char url[64];
    dc_status st;

    (void)state;
    pthread_mutex_init(&s.mtx, NULL);
    srv = start(&s, url, sizeof(url));
    assert_int_equal(
        dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://127.0.0.1:9", 2000, &o, &st), DC_OK);
    assert_int_equal(dlink_send(o, &h, landing, 0, &st), DC_OK);
    h.seq++;
    assert_int_equal(dlink_send(o, &h, landing, 0, &st), DC_OK);
    sink_wait(&s, &s.ends, 2);
    assert_int_equal(sink_get(&s, &s.begins), 2);
    assert_int_equal(sink_get(&s, &s.ends), 2);
    assert_int_equal(sink_get(&s, &s.lost), 0);
    assert_int_equal(dlink_server_finished(srv), 0);
    dlink_out_close(o);
    wait_finished(srv, 1);
    assert_int_equal(sink_get(&s, &s.lost), 1);
    assert_int_equal(dlink_server_refused(srv), 0);
    dlink_server_free(srv);
    pthread_mutex_destroy(&s.mtx);
}

static void
test_hostile_peers_are_dropped_without_a_frame(void **state)
{
    struct sink s = { 0 };
    struct dlink_server *srv;
    struct dlink_out *o;
    uint8_t wrong[DLINK_SECRET_SIZE] = { 0 };
    uint8_t raw[DLINK_HDR_SIZE + DLINK_SECRET_SIZE];
    struct dlink_hdr h;
    char url[64], garbage[200];
    dc_status st;

    (void)state;
    pthread_mutex_init(&s.mtx, NULL);
    srv = start(&s, url, sizeof(url));
    /* Garbage instead of a HELLO. */
    memset(garbage, 'G', sizeof(garbage));
    assert_true(raw_send_then_closed(url, garbage, sizeof(garbage)));
    wait_refused(srv, 1);
    /* A short frame, then silence: the HELLO's deadline closes it. */
    assert_true(raw_send_then_closed(url, "DCDL", 4));
    wait_refused(srv, 2);
    /* Nothing at all. */
    assert_true(raw_send_then_closed(url, NULL, 0));
    wait_refused(srv, 3);
    /* A HELLO with the wrong secret: the dial succeeds (it only sends), the server drops it. */
    assert_int_equal(dlink_dial(url, NULL, wrong, "tcp://x:1", 2000, &o, &st), DC_OK);
    wait_refused(srv, 4);
    dlink_out_close(o);
    /* A DATA frame first. */
    h = data_hdr(0, 16, 16);
    dlink_hdr_encode(&h, raw);
    assert_true(raw_send_then_closed(url, raw, DLINK_HDR_SIZE));
    wait_refused(srv, 5);
    /* A good HELLO, then a frame announcing 4 GiB: dropped, never allocated. */
    h = (struct dlink_hdr){ .kind = DLINK_HELLO, .length = DLINK_SECRET_SIZE };
    dlink_hdr_encode(&h, raw);
    memcpy(raw + DLINK_HDR_SIZE, dlink_server_secret(srv), DLINK_SECRET_SIZE);
    {
        uint8_t two[sizeof(raw) + DLINK_HDR_SIZE];
        memcpy(two, raw, sizeof(raw));
        h = data_hdr(0, UINT32_MAX, UINT32_MAX);
        dlink_hdr_encode(&h, two + sizeof(raw));
        assert_true(raw_send_then_closed(url, two, sizeof(two)));
    }
    wait_refused(srv, 6);
    wait_finished(srv, 6);
    /* A good peer that announces what nobody wants: read and dropped, the link stays up. */
    assert_int_equal(dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://y:2", 2000, &o, &st),
                     DC_OK);
    h = data_hdr(0, 0, 64);
    assert_int_equal(dlink_send(o, &h, (const uint8_t *)garbage, 64, &st), DC_OK);
    assert_int_equal(dlink_send(o, &h, (const uint8_t *)garbage, 64, &st), DC_OK);
    sink_wait(&s, &s.ends, 2);
    assert_int_equal(sink_get(&s, &s.ends), 2);
    /* Of the refused ones, only the peer that had shown the secret counts as a lost peer (its
     * groups end): the one announcing 4 GiB. */
    assert_int_equal(sink_get(&s, &s.lost), 1);
    assert_int_equal(dlink_server_refused(srv), 6);
    /* That one is still open. */
    assert_int_equal(dlink_server_finished(srv), 6);
    dlink_out_close(o);
    dlink_server_free(srv); /* with a connection possibly still open: bounded, joins all */
    pthread_mutex_destroy(&s.mtx);
}

/* Op frames go to op_frame with their payload, never to frame_begin; one the op refuses, or
 * one longer than a chunk, drops the connection. */
static void
test_op_frames_go_to_the_op(void **state)
{
    struct sink s = { 0 };
    size_t n      = DLINK_CHUNK + 1000;
    uint8_t *src  = malloc(n);
    struct dlink_server *srv;
    struct dlink_out *o;
    struct dlink_hdr h = data_hdr(4096, 0, (uint64_t)MAX_FRAME * 4);
    uint8_t raw[DLINK_HDR_SIZE + DLINK_SECRET_SIZE + DLINK_HDR_SIZE];
    char url[64];
    dc_status st;

    (void)state;
    pthread_mutex_init(&s.mtx, NULL);
    assert_non_null(src);
    memset(src, 0x11, n);
    srv     = start(&s, url, sizeof(url));
    h.flags = DLINK_FLAG_OP;
    assert_int_equal(
        dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://127.0.0.1:9", 2000, &o, &st), DC_OK);
    /* Sent as two frames (a chunk, then the rest), both to op_frame. */
    assert_int_equal(dlink_send(o, &h, src, n, &st), DC_OK);
    sink_wait(&s, &s.op_frames, 2);
    pthread_mutex_lock(&s.mtx);
    assert_int_equal(s.op_frames, 2);
    assert_int_equal(s.op_bytes, n);
    assert_int_equal(s.op_offset, 4096 + DLINK_CHUNK);
    assert_int_equal(s.begins, 0);
    pthread_mutex_unlock(&s.mtx);
    /* One the op refuses: the connection drops (a lost peer, a refused connection). */
    src[0] = 0xFF;
    assert_int_equal(dlink_send(o, &h, src, 16, &st), DC_OK);
    wait_refused(srv, 1);
    sink_wait(&s, &s.lost, 1);
    assert_int_equal(sink_get(&s, &s.lost), 1);
    dlink_out_close(o);
    /* One announcing more than a chunk: dropped before its payload is read. */
    h = (struct dlink_hdr){ .kind = DLINK_HELLO, .length = DLINK_SECRET_SIZE };
    dlink_hdr_encode(&h, raw);
    memcpy(raw + DLINK_HDR_SIZE, dlink_server_secret(srv), DLINK_SECRET_SIZE);
    h       = data_hdr(0, DLINK_CHUNK + 1, DLINK_CHUNK + 1);
    h.flags = DLINK_FLAG_OP;
    dlink_hdr_encode(&h, raw + DLINK_HDR_SIZE + DLINK_SECRET_SIZE);
    assert_true(raw_send_then_closed(url, raw, sizeof(raw)));
    wait_refused(srv, 2);
    assert_int_equal(sink_get(&s, &s.op_frames), 2);
    dlink_server_free(srv);
    free(src);
    pthread_mutex_destroy(&s.mtx);
}

/* An op frame the receiver places (op_place) is read straight into the memory it names and
 * landed once; one it does not place goes to op_frame as before. A placed frame whose bytes
 * stop coming is given up after the wait op_place set: landed not ok, the connection dropped. */
static void
test_placed_op_frames_land_in_place(void **state)
{
    struct sink s = { 0 };
    size_t n      = DLINK_CHUNK + 1000;
    uint8_t *src = malloc(n), *dst = calloc(1, DLINK_CHUNK);
    struct dlink_server *srv;
    struct dlink_out *o;
    struct dlink_hdr h = data_hdr(0, 0, (uint64_t)MAX_FRAME * 4);
    uint8_t raw[DLINK_HDR_SIZE + DLINK_SECRET_SIZE + DLINK_HDR_SIZE + 10] = { 0 };
    char url[64];
    dc_status st;

    (void)state;
    pthread_mutex_init(&s.mtx, NULL);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < n; i++) {
        src[i] = (uint8_t)(i * 7 + 1);
    }
    s.place_dst     = dst;
    s.place_wait_ms = 300;
    srv             = start(&s, url, sizeof(url));
    h.flags         = DLINK_FLAG_OP;
    assert_int_equal(
        dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://127.0.0.1:9", 2000, &o, &st), DC_OK);
    /* Two frames: the first (offset 0) placed, the rest to op_frame. */
    assert_int_equal(dlink_send(o, &h, src, n, &st), DC_OK);
    sink_wait(&s, &s.op_frames, 1);
    pthread_mutex_lock(&s.mtx);
    assert_int_equal(s.landed_ok, 1);
    assert_int_equal(s.landed_failed, 0);
    assert_int_equal(s.landed_bytes, DLINK_CHUNK);
    assert_int_equal(s.op_frames, 1);
    assert_int_equal(s.op_bytes, 1000);
    assert_int_equal(s.op_offset, DLINK_CHUNK);
    assert_int_equal(s.begins, 0);
    pthread_mutex_unlock(&s.mtx);
    assert_memory_equal(dst, src, DLINK_CHUNK);
    dlink_out_close(o);

    /* A placed frame cut short, the connection left open: given up after place_wait_ms. */
    h = (struct dlink_hdr){ .kind = DLINK_HELLO, .length = DLINK_SECRET_SIZE };
    dlink_hdr_encode(&h, raw);
    memcpy(raw + DLINK_HDR_SIZE, dlink_server_secret(srv), DLINK_SECRET_SIZE);
    h       = data_hdr(0, 100, 100);
    h.flags = DLINK_FLAG_OP;
    dlink_hdr_encode(&h, raw + DLINK_HDR_SIZE + DLINK_SECRET_SIZE);
    /* Closed by the port: it waits 300 ms, the raw client 3 s. */
    assert_true(raw_send_then_closed(url, raw, sizeof(raw)));
    sink_wait(&s, &s.landed_failed, 1);
    pthread_mutex_lock(&s.mtx);
    assert_int_equal(s.landed_failed, 1);
    assert_int_equal(s.landed_ok, 1);
    assert_int_equal(s.landed_wrong_pin, 0);
    pthread_mutex_unlock(&s.mtx);
    dlink_server_free(srv);
    free(src);
    free(dst);
    pthread_mutex_destroy(&s.mtx);
}

/* ---- parts of small calls ---------------------------------------------------------------- */

static void
test_part_frames_come_whole(void **state)
{
    struct sink s = { .mtx = PTHREAD_MUTEX_INITIALIZER };
    /* Parts go to the same kind of handler as op frames: sink_op counts them. */
    struct dlink_events ev = { &s,      sink_begin, sink_end, sink_lost, NULL, NULL, 0,
                               sink_op, NULL,       0,        NULL,      NULL, NULL, NULL };
    struct dlink_hdr h     = { .kind = DLINK_PART, .seq = 9, .offset = 3 };
    uint8_t payload[10]    = { 7, 1, 2, 3, 4, 5, 6, 7, 8, 9 };
    uint8_t *big           = calloc(1, DLINK_CHUNK + 1);
    struct dlink_server *srv;
    struct dlink_out *o;
    char url[64];
    dc_status st;

    (void)state;
    assert_non_null(big);
    srv = start_with(&ev, 300, url, sizeof(url));
    assert_int_equal(
        dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://127.0.0.1:9", 2000, &o, &st), DC_OK);
    assert_int_equal(dlink_send_frame(o, &h, payload, sizeof(payload), &st), DC_OK);
    sink_wait(&s, &s.op_frames, 1);
    pthread_mutex_lock(&s.mtx);
    assert_int_equal(s.op_frames, 1);
    assert_int_equal(s.op_offset, 3);
    assert_int_equal(s.op_bytes, sizeof(payload));
    pthread_mutex_unlock(&s.mtx);
    /* One the receiver refuses drops the connection: a lost peer. */
    payload[0] = 0xFF;
    assert_int_equal(dlink_send_frame(o, &h, payload, sizeof(payload), &st), DC_OK);
    wait_refused(srv, 1);
    dlink_out_close(o);
    /* Larger than a chunk, or a request past its end: dropped unread. */
    assert_int_equal(
        dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://127.0.0.1:9", 2000, &o, &st), DC_OK);
    /* The port may close before all of it is written: only the refusal counts. */
    (void)dlink_send_frame(o, &h, big, DLINK_CHUNK + 1, &st);
    wait_refused(srv, 2);
    dlink_out_close(o);
    assert_int_equal(
        dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://127.0.0.1:9", 2000, &o, &st), DC_OK);
    h.offset = sizeof(payload) + 1;
    (void)dlink_send_frame(o, &h, payload, sizeof(payload), &st);
    wait_refused(srv, 3);
    dlink_out_close(o);
    dlink_server_free(srv);
    assert_int_equal(s.op_frames, 1); /* the refused one and the dropped ones never counted */
    assert_int_equal(s.begins, 0);
    free(big);
    pthread_mutex_destroy(&s.mtx);
}

/* ---- the call link ---------------------------------------------------------------------- */

struct later {
    struct dlink_conn *c;
    uint8_t data[8];
};

static void *
answer_later(void *arg)
{
    struct later *l = arg;

    nng_msleep(20);
    dlink_call_answer(l->c, NULL, l->data, sizeof(l->data));
    free(l);
    return NULL;
}

/* Answers by what pb says: "ok" echoes the data, "err" fails naming a worker, "short" gives
 * one byte fewer than was sent, "later" answers from another thread. */
static void
echo_call(void *arg, struct dlink_conn *c, const uint8_t *pb, size_t pb_len, const uint8_t *data,
          size_t bytes, void *pin)
{
    dc_status st;

    (void)arg;
    (void)pin;
    if (pb_len == 3 && memcmp(pb, "err", 3) == 0) {
        status_set(&st, DC_NOT_FOUND, "no group like %zu bytes", bytes);
        status_set_worker(&st, "node-x");
        dlink_call_answer(c, &st, NULL, 0);
    } else if (pb_len == 5 && memcmp(pb, "short", 5) == 0) {
        dlink_call_answer(c, NULL, data, bytes - 1);
    } else if (pb_len == 5 && memcmp(pb, "later", 5) == 0 && bytes == 8) {
        struct later *l = malloc(sizeof(*l));
        pthread_t t;
        assert_non_null(l);
        l->c = c;
        memcpy(l->data, data, 8);
        assert_int_equal(pthread_create(&t, NULL, answer_later, l), 0);
        pthread_detach(t);
    } else {
        dlink_call_answer(c, NULL, data, bytes);
    }
}

static void
test_call_link_calls_and_answers(void **state)
{
    struct sink s          = { .mtx = PTHREAD_MUTEX_INITIALIZER };
    struct dlink_events ev = { &s,   sink_begin, sink_end, sink_lost, sink_op, echo_call, 1024,
                               NULL, NULL,       0,        NULL,      NULL,    NULL,      NULL };
    struct dlink_hdr h     = { .seq = 5 };
    uint8_t in[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, out[8], big[2048] = { 0 };
    struct dlink_server *srv;
    struct dlink_out *o;
    char url[64];
    dc_status st;

    (void)state;
    srv = start_with(&ev, 300, url, sizeof(url));
    assert_memory_not_equal(dlink_server_call_secret(srv), dlink_server_secret(srv),
                            DLINK_SECRET_SIZE);
    assert_int_equal(dlink_dial(url, NULL, dlink_server_call_secret(srv), "rank", 2000, &o, &st),
                     DC_OK);
    /* The answer's bytes land in the caller's buffer, from this thread or another. */
    assert_int_equal(dlink_call(o, &h, "ok", 2, in, 8, out, 8, 2000, &st), DC_OK);
    assert_memory_equal(out, in, 8);
    memset(out, 0, sizeof(out));
    h.seq++;
    assert_int_equal(dlink_call(o, &h, "later", 5, in, 8, out, 8, 2000, &st), DC_OK);
    assert_memory_equal(out, in, 8);
    /* An error comes back with its code, message and worker; the link stays. */
    h.seq++;
    assert_int_equal(dlink_call(o, &h, "err", 3, in, 8, out, 8, 2000, &st), DC_NOT_FOUND);
    assert_string_equal(st.message, "no group like 8 bytes");
    assert_string_equal(st.worker, "node-x");
    assert_false(st.transport);
    h.seq++;
    assert_int_equal(dlink_call(o, &h, "ok", 2, in, 0, NULL, 0, 2000, &st), DC_OK);
    /* A result of the wrong size is malformed: the link is closed and says so. */
    h.seq++;
    assert_int_equal(dlink_call(o, &h, "short", 5, in, 8, out, 8, 2000, &st), DC_INTERNAL);
    assert_true(st.transport);
    assert_non_null(strstr(st.message, "wrong size"));
    assert_int_not_equal(dlink_call(o, &h, "ok", 2, in, 8, out, 8, 500, &st), DC_OK);
    assert_true(st.transport);
    dlink_out_close(o);
    /* A call larger than call_max drops the connection before its bytes are read. */
    assert_int_equal(dlink_dial(url, NULL, dlink_server_call_secret(srv), "rank", 2000, &o, &st),
                     DC_OK);
    assert_int_equal(dlink_call(o, &h, "ok", 2, big, sizeof(big), big, sizeof(big), 2000, &st),
                     DC_UNAVAILABLE);
    assert_true(st.transport);
    dlink_out_close(o);
    wait_refused(srv, 1);
    /* The peers' secret opens a data connection, on which a call frame is refused. */
    assert_int_equal(
        dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://127.0.0.1:9", 2000, &o, &st), DC_OK);
    assert_int_not_equal(dlink_call(o, &h, "ok", 2, in, 8, out, 8, 2000, &st), DC_OK);
    assert_true(st.transport);
    dlink_out_close(o);
    wait_refused(srv, 2);
    dlink_server_free(srv);
    assert_int_equal(s.begins, 0);
    pthread_mutex_destroy(&s.mtx);
}

static void raw_send(nng_stream *conn, nng_aio *aio, const void *bytes, size_t len);

/* Buffers a call link reads calls into (call_place), and answers written from them. */
struct placed {
    pthread_mutex_t mtx;
    int placed, unpinned, released;
    uint8_t *last; /* the last buffer placed */
};

static uint8_t *
placed_take(void *arg, size_t bytes, void **pin)
{
    struct placed *p = arg;
    uint8_t *b       = malloc(bytes);

    pthread_mutex_lock(&p->mtx);
    p->placed++;
    p->last = b;
    pthread_mutex_unlock(&p->mtx);
    *pin = b;
    return b;
}

static void
placed_unpin(void *arg, void *pin)
{
    struct placed *p = arg;

    pthread_mutex_lock(&p->mtx);
    p->unpinned++;
    pthread_mutex_unlock(&p->mtx);
    free(pin);
}

/* What placed_release gets: the buffer and whom to count its release to. */
struct placed_answer {
    struct placed *p;
    uint8_t *b;
};

static void
placed_release(void *arg)
{
    struct placed_answer *a = arg;

    pthread_mutex_lock(&a->p->mtx);
    a->p->released++;
    pthread_mutex_unlock(&a->p->mtx);
    free(a->b);
    free(a);
}

/* "ref": answers from the placed buffer itself, its bytes reversed there; "copy": answers
 * with a copy and gives the buffer back at once. */
static void
placed_call(void *arg, struct dlink_conn *c, const uint8_t *pb, size_t pb_len, const uint8_t *data,
            size_t bytes, void *pin)
{
    struct placed *p = arg;
    uint8_t *b       = pin;

    assert_non_null(pin);
    assert_ptr_equal(data, pin);
    pthread_mutex_lock(&p->mtx);
    assert_ptr_equal(p->last, pin);
    pthread_mutex_unlock(&p->mtx);
    if (pb_len == 3 && memcmp(pb, "ref", 3) == 0) {
        for (size_t i = 0; i < bytes / 2; i++) {
            uint8_t t        = b[i];
            b[i]             = b[bytes - 1 - i];
            b[bytes - 1 - i] = t;
        }
        struct placed_answer *a = malloc(sizeof(*a));
        assert_non_null(a);
        *a = (struct placed_answer){ .p = p, .b = b };
        dlink_call_answer_ref(c, b, bytes, placed_release, a);
    } else {
        dlink_call_answer(c, NULL, data, bytes);
        placed_unpin(arg, pin);
    }
}

/* With call_place, a call's bytes are read straight into the owner's buffer, which the handler
 * keeps: it may answer from it with no copy (released once written), and a call cut off
 * mid-frame gives the buffer back. */
static void
test_call_link_reads_into_owner_buffers_and_answers_from_them(void **state)
{
    struct placed p        = { .mtx = PTHREAD_MUTEX_INITIALIZER };
    struct dlink_events ev = { .arg        = &p,
                               .call       = placed_call,
                               .call_max   = (uint64_t)4 << 20,
                               .call_place = placed_take,
                               .call_unpin = placed_unpin };
    size_t big             = (size_t)3 << 20; /* more than the socket takes at once */
    uint8_t *in = malloc(big), *out = malloc(big);
    uint8_t hello[DLINK_HDR_SIZE + DLINK_SECRET_SIZE], hdr[DLINK_HDR_SIZE];
    struct dlink_hdr h = { .seq = 1 };
    struct dlink_server *srv;
    struct dlink_out *o;
    nng_stream_dialer *d;
    nng_stream *conn;
    nng_aio *aio;
    char url[64];
    dc_status st;

    (void)state;
    assert_non_null(in);
    assert_non_null(out);
    for (size_t i = 0; i < big; i++) {
        in[i] = (uint8_t)(i * 7 + i / 251);
    }
    srv = start_with(&ev, 300, url, sizeof(url));
    assert_int_equal(dlink_dial(url, NULL, dlink_server_call_secret(srv), "rank", 2000, &o, &st),
                     DC_OK);
    for (int round = 1; round <= 3; round++) {
        assert_int_equal(dlink_call(o, &h, "ref", 3, in, big, out, big, 5000, &st), DC_OK);
        for (size_t i = 0; i < big; i++) {
            if (out[i] != in[big - 1 - i]) {
                fail_msg("round %d: byte %zu of the answer is %u, not %u", round, i, out[i],
                         in[big - 1 - i]);
            }
        }
        h.seq++;
        /* Released once written: by the time the next call is read at the latest. */
        assert_int_equal(locked_get(&p.mtx, &p.placed), round);
    }
    for (int i = 0; i < 300 && locked_get(&p.mtx, &p.released) < 3; i++) {
        nng_msleep(10);
    }
    assert_int_equal(locked_get(&p.mtx, &p.released), 3);
    /* The copying answer still works beside it; a call with no bytes places nothing. */
    assert_int_equal(dlink_call(o, &h, "copy", 4, in, 4096, out, 4096, 2000, &st), DC_OK);
    assert_memory_equal(out, in, 4096);
    assert_int_equal(locked_get(&p.mtx, &p.placed), 4);
    dlink_out_close(o);
    /* A call's header and part of its bytes, then the caller goes: the buffer placed for it
     * is given back, no call made. */
    h = (struct dlink_hdr){ .kind = DLINK_HELLO, .length = DLINK_SECRET_SIZE };
    dlink_hdr_encode(&h, hello);
    memcpy(hello + DLINK_HDR_SIZE, dlink_server_call_secret(srv), DLINK_SECRET_SIZE);
    conn = raw_dial(url, &d, &aio);
    raw_send(conn, aio, hello, sizeof(hello));
    h = (struct dlink_hdr){
        .kind = DLINK_CALL, .seq = 9, .length = 3 + 1000, .offset = 3, .total = 3 + 1000
    };
    dlink_hdr_encode(&h, hdr);
    raw_send(conn, aio, hdr, sizeof(hdr));
    raw_send(conn, aio, "ref", 3);
    raw_send(conn, aio, in, 400);
    for (int i = 0; i < 300 && locked_get(&p.mtx, &p.placed) < 5; i++) {
        nng_msleep(10);
    }
    raw_close(conn, d, aio);
    wait_finished(srv, 2);
    assert_int_equal(locked_get(&p.mtx, &p.placed), 5);
    assert_int_equal(locked_get(&p.mtx, &p.unpinned), 2); /* "copy"'s, and the cut call's */
    assert_int_equal(locked_get(&p.mtx, &p.released), 3);
    dlink_server_free(srv);
    pthread_mutex_destroy(&p.mtx);
    free(in);
    free(out);
}

/* A peer that takes the connection and never reads: a bounded send gives up (the connection
 * then unusable) instead of waiting for it forever; what fits in the socket's buffers goes. */
static void
test_a_bounded_send_gives_up_on_a_peer_that_does_not_read(void **state)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t alen       = sizeof(a);
    uint8_t secret[DLINK_SECRET_SIZE] = { 0 };
    size_t big                        = (size_t)64 << 20;
    uint8_t *data                     = calloc(1, big);
    struct dlink_hdr h                = data_hdr(0, 0, big);
    struct dlink_out *o               = NULL;
    char url[64];
    dc_status st;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    (void)state;
    assert_non_null(data);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 4), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    /* The kernel completes the connection from the backlog: nobody accepts or reads. */
    assert_int_equal(dlink_dial(url, NULL, secret, "tcp://127.0.0.1:9", 2000, &o, &st), DC_OK);
    assert_int_equal(dlink_send_within(o, &h, data, 4096, 200, &st), DC_OK);
    assert_int_equal(dlink_send_within(o, &h, data, big, 200, &st), DC_UNAVAILABLE);
    assert_non_null(strstr(st.message, "its data connection failed"));
    dlink_out_close(o);
    close(fd);
    free(data);
}

/* A trickled HELLO: the handshake bound is the whole HELLO's, not each byte's. */
static void
test_a_hello_trickled_byte_by_byte_is_cut_off_at_the_handshake_bound(void **state)
{
    struct sink s = { .mtx = PTHREAD_MUTEX_INITIALIZER };
    struct dlink_server *srv;
    struct dlink_hdr h = { .kind = DLINK_HELLO, .length = DLINK_SECRET_SIZE };
    uint8_t raw[DLINK_HDR_SIZE + DLINK_SECRET_SIZE];
    nng_stream_dialer *d;
    nng_stream *conn;
    nng_aio *aio;
    size_t sent = 0;
    char url[64];

    (void)state;
    srv = start(&s, url, sizeof(url)); /* HELLO bound: 300 ms */
    dlink_hdr_encode(&h, raw);
    memcpy(raw + DLINK_HDR_SIZE, dlink_server_secret(srv), DLINK_SECRET_SIZE);
    conn = raw_dial(url, &d, &aio);
    /* A good HELLO, one byte every 50 ms (each far inside the bound, all of it 4.4 s). */
    for (; sent < sizeof(raw) && dlink_server_refused(srv) == 0; sent++) {
        nng_iov iov = { raw + sent, 1 };
        nng_aio_set_iov(aio, 1, &iov);
        nng_stream_send(conn, aio);
        nng_aio_wait(aio);
        if (nng_aio_result(aio) != 0) {
            break;
        }
        nng_msleep(50);
    }
    wait_refused(srv, 1);
    assert_true(sent < sizeof(raw));
    raw_close(conn, d, aio);
    dlink_server_free(srv);
    assert_int_equal(s.begins, 0);
}

/* Sends len bytes on a raw connection (made by raw_dial). */
static void
raw_send(nng_stream *conn, nng_aio *aio, const void *bytes, size_t len)
{
    nng_iov iov = { (void *)bytes, len };

    nng_aio_set_iov(aio, 1, &iov);
    nng_stream_send(conn, aio);
    nng_aio_wait(aio);
    assert_int_equal(nng_aio_result(aio), 0);
}

/* A peer that stops mid-frame is dropped once the frame has had the handshake bound plus a
 * millisecond per kilobyte, letting go of what it was being read into (a group's region, a
 * buffer); a peer quiet between frames keeps its link. */
static void
test_a_frame_stalled_mid_payload_is_cut_off(void **state)
{
    uint8_t region[4000], hello[DLINK_HDR_SIZE + DLINK_SECRET_SIZE], hdr[DLINK_HDR_SIZE];
    uint8_t payload[2000] = { 0 };
    struct sink s = { .mtx = PTHREAD_MUTEX_INITIALIZER, .dst = region, .bytes = sizeof(region) };
    struct dlink_hdr h = { .kind = DLINK_HELLO, .length = DLINK_SECRET_SIZE };
    struct dlink_server *srv;
    nng_stream_dialer *d;
    nng_stream *conn;
    nng_aio *aio;
    char url[64];

    (void)state;
    srv = start(&s, url, sizeof(url)); /* bound: 300 ms, + 1 ms per KB of a frame */
    dlink_hdr_encode(&h, hello);
    memcpy(hello + DLINK_HDR_SIZE, dlink_server_secret(srv), DLINK_SECRET_SIZE);
    conn = raw_dial(url, &d, &aio);
    raw_send(conn, aio, hello, sizeof(hello));
    /* A whole frame into the region, then quiet for twice the bound: the link stays. */
    h = data_hdr(0, 1000, sizeof(region));
    dlink_hdr_encode(&h, hdr);
    raw_send(conn, aio, hdr, sizeof(hdr));
    raw_send(conn, aio, payload, 1000);
    sink_wait(&s, &s.ends, 1);
    nng_msleep(600);
    assert_int_equal(sink_get(&s, &s.lost), 0);
    assert_int_equal(dlink_server_refused(srv), 0);
    /* The next frame's header and half its bytes, then nothing: dropped, the frame ended
     * not ok (the region is let go), the peer lost. */
    h = data_hdr(1000, 2000, sizeof(region));
    dlink_hdr_encode(&h, hdr);
    raw_send(conn, aio, hdr, sizeof(hdr));
    raw_send(conn, aio, payload, 1000);
    sink_wait(&s, &s.lost, 1);
    assert_int_equal(sink_get(&s, &s.lost), 1);
    assert_int_equal(sink_get(&s, &s.ends), 2);
    pthread_mutex_lock(&s.mtx);
    assert_int_equal(s.received, 1000); /* the first frame's */
    pthread_mutex_unlock(&s.mtx);
    raw_close(conn, d, aio);
    /* The same for an op frame read into the link's own buffer (offset 8: not placed). */
    conn = raw_dial(url, &d, &aio);
    raw_send(conn, aio, hello, sizeof(hello));
    h       = data_hdr(8, 100, 200);
    h.flags = DLINK_FLAG_OP;
    dlink_hdr_encode(&h, hdr);
    raw_send(conn, aio, hdr, sizeof(hdr));
    raw_send(conn, aio, payload, 50);
    sink_wait(&s, &s.lost, 2);
    assert_int_equal(sink_get(&s, &s.lost), 2);
    assert_int_equal(sink_get(&s, &s.op_frames), 0);
    raw_close(conn, d, aio);
    wait_finished(srv, 2);
    dlink_server_free(srv);
    /* frame_begin may ask for less than the link's bound (a group's call deadline): 200 ms
     * against a 60 s handshake bound. */
    s.begin_wait_ms = 200;
    {
        struct dlink_events ev = {
            &s,   sink_begin, sink_end, sink_lost,  sink_op,     NULL, 0,
            NULL, NULL,       0,        sink_place, sink_landed, NULL, NULL
        };
        srv = start_with(&ev, 60000, url, sizeof(url));
    }
    memcpy(hello + DLINK_HDR_SIZE, dlink_server_secret(srv), DLINK_SECRET_SIZE);
    conn = raw_dial(url, &d, &aio);
    raw_send(conn, aio, hello, sizeof(hello));
    h = data_hdr(0, 2000, sizeof(region));
    dlink_hdr_encode(&h, hdr);
    raw_send(conn, aio, hdr, sizeof(hdr));
    raw_send(conn, aio, payload, 1000);
    sink_wait(&s, &s.lost, 3);
    assert_int_equal(sink_get(&s, &s.lost), 3);
    assert_int_equal(sink_get(&s, &s.ends), 3);
    raw_close(conn, d, aio);
    wait_finished(srv, 1);
    dlink_server_free(srv);
    pthread_mutex_destroy(&s.mtx);
}

static void
refuse_control(void *arg, struct dlink_conn *c, const uint8_t *frame, size_t len)
{
    dc_status st;

    (void)arg;
    (void)frame;
    (void)len;
    status_set(&st, DC_UNIMPLEMENTED, "nothing here");
    dlink_call_answer(c, &st, NULL, 0);
}

/* A server that takes only control links (the coordinator's call link has no data events):
 * a peer showing its secret without the control flag is refused, whatever it then sends. */
static void
test_a_server_without_data_events_refuses_data_connections(void **state)
{
    struct dlink_events ev = { .control = refuse_control, .control_max = 1024 };
    struct dlink_hdr h     = data_hdr(0, 64, 64);
    uint8_t payload[64]    = { 0 };
    struct dlink_server *srv;
    struct dlink_out *o;
    char url[64];
    dc_status st;

    (void)state;
    srv = start_with(&ev, 300, url, sizeof(url));
    /* Closed at once after HELLO. */
    assert_int_equal(dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://x:1", 2000, &o, &st),
                     DC_OK);
    dlink_out_close(o);
    wait_refused(srv, 1);
    /* A data frame behind the HELLO. */
    assert_int_equal(dlink_dial(url, NULL, dlink_server_secret(srv), "tcp://x:1", 2000, &o, &st),
                     DC_OK);
    (void)dlink_send(o, &h, payload, sizeof(payload), &st); /* may already see it closed */
    wait_refused(srv, 2);
    dlink_out_close(o);
    wait_finished(srv, 2);
    dlink_server_free(srv);
}

/* An answer whose buffer cannot grow: the caller is told so, nothing is written where the
 * answer would not fit, and the link goes on. */
static void
test_an_answer_that_cannot_get_its_buffer_fails_the_call_alone(void **state)
{
    struct sink s          = { .mtx = PTHREAD_MUTEX_INITIALIZER };
    struct dlink_events ev = { .arg = &s, .call = echo_call, .call_max = 1024 };
    struct dlink_hdr h     = { .seq = 1 };
    uint8_t in[8]          = { 1, 2, 3, 4, 5, 6, 7, 8 }, out[8];
    struct dlink_server *srv;
    struct dlink_out *o;
    char url[64];
    dc_status st;

    (void)state;
    srv = start_with(&ev, 300, url, sizeof(url));
    assert_int_equal(dlink_dial(url, NULL, dlink_server_call_secret(srv), "rank", 2000, &o, &st),
                     DC_OK);
    /* The link's first answer needs a buffer (it has none yet). */
    dlink_answer_fail_after(1);
    assert_int_equal(dlink_call(o, &h, "ok", 2, in, 8, out, 8, 2000, &st), DC_RESOURCE_EXHAUSTED);
    assert_string_equal(st.message, "out of memory for the answer");
    assert_false(st.transport);
    h.seq++;
    assert_int_equal(dlink_call(o, &h, "ok", 2, in, 8, out, 8, 2000, &st), DC_OK);
    assert_memory_equal(out, in, 8);
    dlink_out_close(o);
    dlink_server_free(srv);
    pthread_mutex_destroy(&s.mtx);
}

/* A control link's answerer does not wait for a caller slow to read: a large answer goes as
 * far as the socket takes it at once, the connection's thread writes the rest. */
struct big_answer {
    pthread_mutex_t mtx;
    bool returned;
    uint8_t *reply;
    size_t bytes;
};

static void
answer_big(void *arg, struct dlink_conn *c, const uint8_t *frame, size_t len)
{
    struct big_answer *b = arg;

    (void)frame;
    (void)len;
    dlink_call_answer(c, NULL, b->reply, b->bytes);
    pthread_mutex_lock(&b->mtx);
    b->returned = true;
    pthread_mutex_unlock(&b->mtx);
}

static bool
big_answer_returned(struct big_answer *b)
{
    bool r;

    pthread_mutex_lock(&b->mtx);
    r = b->returned;
    pthread_mutex_unlock(&b->mtx);
    return r;
}

static void
test_a_control_answer_does_not_wait_for_a_slow_reader(void **state)
{
    struct big_answer b    = { .mtx = PTHREAD_MUTEX_INITIALIZER, .bytes = (size_t)32 << 20 };
    struct dlink_events ev = { .arg = &b, .control = answer_big, .control_max = 1024 };
    struct dlink_hdr h     = { .seq = 9 };
    struct dlink_server *srv;
    struct dlink_out *o;
    nng_msg *answer = NULL;
    char url[64];
    dc_status st;

    (void)state;
    b.reply = malloc(b.bytes); /* 32 MiB: far past what socket buffers hold */
    assert_non_null(b.reply);
    for (size_t i = 0; i < b.bytes; i++) {
        b.reply[i] = (uint8_t)(i * 7);
    }
    /* A handshake bound far past the wait below: an answerer that waited would still wait. */
    srv = start_with(&ev, 20000, url, sizeof(url));
    assert_int_equal(dlink_dial_as(url, NULL, dlink_server_secret(srv), "coordinator",
                                   DLINK_HELLO_CONTROL, 2000, &o, &st),
                     DC_OK);
    assert_int_equal(dlink_call_send(o, &h, "req", 3, 2000, &st), DC_OK);
    /* Nobody reads yet: the answerer is done all the same. */
    for (int i = 0; i < 300 && !big_answer_returned(&b); i++) {
        nng_msleep(10);
    }
    assert_true(big_answer_returned(&b));
    /* The whole answer, in order, once read. */
    assert_int_equal(dlink_call_recv_any(o, h.seq, b.bytes, 10000, &answer, &st), DC_OK);
    assert_int_equal(nng_msg_len(answer), b.bytes);
    assert_memory_equal(nng_msg_body(answer), b.reply, b.bytes);
    nng_msg_free(answer);
    dlink_out_close(o);
    dlink_server_free(srv);
    free(b.reply);
    pthread_mutex_destroy(&b.mtx);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_round_trip),
        cmocka_unit_test(test_header_refusals),
        cmocka_unit_test(test_a_part_lands_where_the_receiver_says),
        cmocka_unit_test(test_an_empty_part_keeps_the_link),
        cmocka_unit_test(test_hostile_peers_are_dropped_without_a_frame),
        cmocka_unit_test(test_op_frames_go_to_the_op),
        cmocka_unit_test(test_placed_op_frames_land_in_place),
        cmocka_unit_test(test_part_frames_come_whole),
        cmocka_unit_test(test_call_link_calls_and_answers),
        cmocka_unit_test(test_call_link_reads_into_owner_buffers_and_answers_from_them),
        cmocka_unit_test(test_a_bounded_send_gives_up_on_a_peer_that_does_not_read),
        cmocka_unit_test(test_a_hello_trickled_byte_by_byte_is_cut_off_at_the_handshake_bound),
        cmocka_unit_test(test_a_frame_stalled_mid_payload_is_cut_off),
        cmocka_unit_test(test_a_server_without_data_events_refuses_data_connections),
        cmocka_unit_test(test_an_answer_that_cannot_get_its_buffer_fails_the_call_alone),
        cmocka_unit_test(test_a_control_answer_does_not_wait_for_a_slow_reader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
