/* The data link's frames and its dialing side (dlframe.h). */
#include "dlframe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlsock.h"
#include "rpc.h"

/* ---- framing ----------------------------------------------------------------------------- */

static void
put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void
put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void
put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint16_t
get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t
get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static uint64_t
get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

void
dlink_hdr_encode(const struct dlink_hdr *h, uint8_t out[DLINK_HDR_SIZE])
{
    put32(out, DLINK_MAGIC);
    out[4] = DLINK_VERSION;
    out[5] = h->kind;
    put16(out + 6, h->flags);
    put32(out + 8, h->from);
    put32(out + 12, h->length);
    put64(out + 16, h->group);
    put64(out + 24, h->generation);
    put64(out + 32, h->seq);
    put64(out + 40, h->offset);
    put64(out + 48, h->total);
}

dc_code
dlink_hdr_decode(const uint8_t in[DLINK_HDR_SIZE], uint64_t max_frame, struct dlink_hdr *h,
                 dc_status *st)
{
    if (get32(in) != DLINK_MAGIC) {
        return status_set(st, DC_INVALID_ARGUMENT, "data link: not a devcoord frame (magic %08x)",
                          get32(in));
    }
    if (in[4] != DLINK_VERSION) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "data link: frame version %u, this worker speaks %u", in[4],
                          DLINK_VERSION);
    }
    h->kind       = in[5];
    h->flags      = get16(in + 6);
    h->from       = get32(in + 8);
    h->length     = get32(in + 12);
    h->group      = get64(in + 16);
    h->generation = get64(in + 24);
    h->seq        = get64(in + 32);
    h->offset     = get64(in + 40);
    h->total      = get64(in + 48);
    if (h->kind < DLINK_HELLO || h->kind > DLINK_PART) {
        return status_set(st, DC_INVALID_ARGUMENT, "data link: unknown frame kind %u", h->kind);
    }
    if (h->length > max_frame || ((h->flags & DLINK_FLAG_OP) == 0 && h->total > max_frame)) {
        return status_set(st, DC_OUT_OF_RANGE,
                          "data link: frame of %u bytes (part of %llu) is larger than "
                          "this worker takes (%llu)",
                          h->length, (unsigned long long)h->total, (unsigned long long)max_frame);
    }
    if (h->kind == DLINK_DATA && (h->offset > h->total || h->length > h->total - h->offset)) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "data link: frame bytes %llu+%u outside its part of %llu",
                          (unsigned long long)h->offset, h->length, (unsigned long long)h->total);
    }
    if (h->kind == DLINK_PART && h->offset > h->length) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "data link: part frame of %u bytes with a %llu-byte request", h->length,
                          (unsigned long long)h->offset);
    }
    if (h->kind == DLINK_CALL && (h->offset > h->length || h->offset > DLINK_CALL_PB_MAX)) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "data link: call frame of %u bytes with a %llu-byte request", h->length,
                          (unsigned long long)h->offset);
    }
    if (h->kind == DLINK_HELLO &&
        (h->length < DLINK_SECRET_SIZE || h->length > DLINK_SECRET_SIZE + DLINK_ADDRESS_MAX)) {
        return status_set(st, DC_INVALID_ARGUMENT, "data link: HELLO of %u bytes", h->length);
    }
    return DC_OK;
}

uint64_t
dlink_group_hash(const char *id)
{
    uint64_t h = 1469598103934665603ull;

    for (const unsigned char *p = (const unsigned char *)id; *p != '\0'; p++) {
        h = (h ^ *p) * 1099511628211ull;
    }
    return h;
}

/* ---- moving bytes ------------------------------------------------------------------------ */

/* ---- the sending side -------------------------------------------------------------------- */

struct dlink_out {
    struct dlsock *sock;
};

dc_code
dlink_dial(const char *url, struct dltls *tls, const uint8_t *secret, const char *self,
           uint32_t timeout_ms, struct dlink_out **out, dc_status *st)
{
    return dlink_dial_as(url, tls, secret, self, 0, timeout_ms, out, st);
}

dc_code
dlink_dial_as(const char *url, struct dltls *tls, const uint8_t *secret, const char *self,
              uint16_t hello_flags, uint32_t timeout_ms, struct dlink_out **out, dc_status *st)
{
    struct dlink_out *o = calloc(1, sizeof(*o));
    size_t self_len     = strnlen(self, DLINK_ADDRESS_MAX);
    uint8_t hello[DLINK_SECRET_SIZE + DLINK_ADDRESS_MAX];
    uint8_t raw[DLINK_HDR_SIZE];
    struct dlink_hdr h = { .kind = DLINK_HELLO, .flags = hello_flags };
    nng_iov iov[2];
    int rv;

    *out = NULL;
    if (o == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    if ((rv = dlsock_dial(url, tls, timeout_ms, &o->sock)) != 0) {
        goto fail;
    }
    memcpy(hello, secret, DLINK_SECRET_SIZE);
    memcpy(hello + DLINK_SECRET_SIZE, self, self_len);
    h.length = (uint32_t)(DLINK_SECRET_SIZE + self_len);
    dlink_hdr_encode(&h, raw);
    iov[0] = (nng_iov){ raw, sizeof(raw) };
    iov[1] = (nng_iov){ hello, h.length };
    if ((rv = dlsock_send_all(o->sock, iov, 2, (nng_duration)timeout_ms)) != 0) {
        goto fail;
    }
    *out = o;
    return DC_OK;
fail:
    dlink_out_close(o);
    return status_set(st, DC_UNAVAILABLE, "cannot open the data link to %s: %s", url,
                      nng_strerror(rv));
}

dc_code
dlink_send(struct dlink_out *o, const struct dlink_hdr *h, const uint8_t *data, size_t len,
           dc_status *st)
{
    return dlink_send_within(o, h, data, len, 0, st);
}

dc_code
dlink_send_within(struct dlink_out *o, const struct dlink_hdr *h, const uint8_t *data, size_t len,
                  uint32_t timeout_ms, dc_status *st)
{
    nng_duration timeout = timeout_ms > 0 ? (nng_duration)timeout_ms : NNG_DURATION_INFINITE;
    uint64_t until       = timeout_ms > 0 ? rpc_now_ms() + timeout_ms : 0;
    struct dlink_hdr f   = *h;
    size_t done          = 0;

    f.kind = DLINK_DATA;
    do {
        uint8_t raw[DLINK_HDR_SIZE];
        size_t n = len - done < DLINK_CHUNK ? len - done : DLINK_CHUNK;
        nng_iov iov[2];
        int rv;

        f.length = (uint32_t)n;
        f.offset = h->offset + done;
        dlink_hdr_encode(&f, raw);
        iov[0] = (nng_iov){ raw, sizeof(raw) };
        iov[1] = (nng_iov){ (void *)(data + done), n };
        if (until != 0) {
            uint64_t now = rpc_now_ms();
            timeout      = now < until ? (nng_duration)(until - now) : 1;
        }
        if ((rv = dlsock_send_all(o->sock, iov, n > 0 ? 2 : 1, timeout)) != 0) {
            return status_set(st, DC_UNAVAILABLE, "its data connection failed (%s)",
                              nng_strerror(rv));
        }
        done += n;
    } while (done < len);
    return DC_OK;
}

dc_code
dlink_send_frame(struct dlink_out *o, const struct dlink_hdr *h, const uint8_t *data, size_t len,
                 dc_status *st)
{
    struct dlink_hdr f = *h;
    uint8_t raw[DLINK_HDR_SIZE];
    nng_iov iov[2];
    int rv;

    if (len > UINT32_MAX) {
        return status_set(st, DC_INVALID_ARGUMENT, "data link: a frame of %zu bytes", len);
    }
    f.length = (uint32_t)len;
    dlink_hdr_encode(&f, raw);
    iov[0] = (nng_iov){ raw, sizeof(raw) };
    iov[1] = (nng_iov){ (void *)data, len };
    if ((rv = dlsock_send_all(o->sock, iov, len > 0 ? 2 : 1, NNG_DURATION_INFINITE)) != 0) {
        return status_set(st, DC_UNAVAILABLE, "its data connection failed (%s)", nng_strerror(rv));
    }
    return DC_OK;
}

void
dlink_out_abort(struct dlink_out *o)
{
    if (o != NULL) {
        dlsock_shutdown(o->sock);
    }
}

void
dlink_out_close(struct dlink_out *o)
{
    if (o == NULL) {
        return;
    }
    dlsock_free(o->sock);
    free(o);
}

void
dlink_out_idle_begin(struct dlink_out *o)
{
    dlsock_idle_begin(o->sock);
}

bool
dlink_out_idle_end(struct dlink_out *o)
{
    return dlsock_idle_end(o->sock);
}

/* Marks the link unusable (closed) after a transport failure rv: st says so. */
static dc_code
dlink_call_failed(struct dlink_out *o, int rv, dc_status *st)
{
    dlink_out_abort(o);
    status_set(st, rv == NNG_ETIMEDOUT ? DC_DEADLINE_EXCEEDED : DC_UNAVAILABLE,
               "call link to the worker: %s", nng_strerror(rv));
    st->transport = true;
    return st->code;
}

/* Sends a DLINK_CALL frame: h's group, generation, seq and from; pb then data. */
static dc_code
dlink_call_write(struct dlink_out *o, const struct dlink_hdr *h, const void *pb, size_t pb_len,
                 const void *data, size_t bytes, uint32_t timeout_ms, dc_status *st)
{
    struct dlink_hdr f = *h;
    uint8_t raw[DLINK_HDR_SIZE];
    nng_iov iov[3];
    int rv;

    if (pb_len > DLINK_CALL_PB_MAX || bytes > UINT32_MAX - pb_len) {
        return status_set(st, DC_INVALID_ARGUMENT, "call link: a call of %zu bytes", bytes);
    }
    f.kind   = DLINK_CALL;
    f.flags  = 0;
    f.offset = pb_len;
    f.length = (uint32_t)(pb_len + bytes);
    f.total  = f.length;
    dlink_hdr_encode(&f, raw);
    iov[0] = (nng_iov){ raw, sizeof(raw) };
    iov[1] = (nng_iov){ (void *)pb, pb_len };
    iov[2] = (nng_iov){ (void *)data, bytes };
    if ((rv = dlsock_send_all(o->sock, iov, bytes > 0 ? 3 : 2, (nng_duration)timeout_ms)) != 0) {
        return dlink_call_failed(o, rv, st);
    }
    return DC_OK;
}

/* Reads the answer's header to the call of seq into *a, checked against max_answer (the most
 * an answer may carry). DC_OK, or a failure with st->transport set and the connection closed
 * (unusable). */
static dc_code
dlink_call_header(struct dlink_out *o, uint64_t seq, size_t max_answer, uint32_t timeout_ms,
                  struct dlink_hdr *a, dc_status *st)
{
    uint8_t raw[DLINK_HDR_SIZE];
    nng_iov iov     = { raw, sizeof(raw) };
    const char *why = NULL;
    int rv;

    if ((rv = dlsock_recv_all(o->sock, &iov, 1, (nng_duration)timeout_ms)) != 0) {
        return dlink_call_failed(o, rv, st);
    }
    if (dlink_hdr_decode(raw,
                         max_answer > DLINK_ANSWER_ERROR_MAX ? max_answer : DLINK_ANSWER_ERROR_MAX,
                         a, st) != DC_OK) {
        why = st->message;
    } else if (a->kind != DLINK_ANSWER || a->seq != seq) {
        why = "not the answer to this call";
    } else if (a->offset != DC_OK &&
               (a->offset > DC_UNAUTHENTICATED || a->length > DLINK_ANSWER_ERROR_MAX)) {
        why = "a malformed error";
    }
    if (why != NULL) {
        char keep[sizeof(st->message)];
        snprintf(keep, sizeof(keep), "%s", why);
        dlink_out_abort(o);
        status_set(st, DC_INTERNAL, "call link: malformed answer: %s", keep);
        st->transport = true; /* the connection is closed: unusable */
        return DC_INTERNAL;
    }
    return DC_OK;
}

/* Sends a call and reads its answer's header (both above). */
static dc_code
dlink_call_start(struct dlink_out *o, const struct dlink_hdr *h, const void *pb, size_t pb_len,
                 const void *data, size_t bytes, size_t max_answer, uint32_t timeout_ms,
                 struct dlink_hdr *a, dc_status *st)
{
    dc_code code;

    if ((code = dlink_call_write(o, h, pb, pb_len, data, bytes, timeout_ms, st)) != DC_OK) {
        return code;
    }
    return dlink_call_header(o, h->seq, max_answer, timeout_ms, a, st);
}

/* Reads the answer's payload (a->length bytes) into buf (an error's into text), within
 * timeout_ms: DC_OK, the answer's error with its message, or a transport failure. */
static dc_code
dlink_call_finish(struct dlink_out *o, const struct dlink_hdr *a, void *buf, uint32_t timeout_ms,
                  dc_status *st)
{
    char text[DLINK_ANSWER_ERROR_MAX + 1];
    nng_iov iov = a->offset == DC_OK && buf != NULL ? (nng_iov){ buf, a->length }
                                                    : (nng_iov){ text, a->length };
    dc_code code;
    size_t nul;
    int rv;

    if ((rv = dlsock_recv_all(o->sock, &iov, 1, (nng_duration)timeout_ms)) != 0) {
        return dlink_call_failed(o, rv, st);
    }
    if (a->offset == DC_OK) {
        return DC_OK;
    }
    code            = (dc_code)a->offset;
    text[a->length] = '\0';
    nul             = strnlen(text, a->length);
    status_set(st, code, "%s", nul < a->length ? text + nul + 1 : "");
    if (nul > 0 && nul < a->length) {
        status_set_worker(st, text);
    }
    return code;
}

dc_code
dlink_call(struct dlink_out *o, const struct dlink_hdr *h, const void *pb, size_t pb_len,
           const void *data, size_t bytes, void *recv, size_t recv_bytes, uint32_t timeout_ms,
           dc_status *st)
{
    struct dlink_hdr a;
    dc_code code;

    if ((code = dlink_call_start(o, h, pb, pb_len, data, bytes, recv_bytes, timeout_ms, &a, st)) !=
        DC_OK) {
        return code;
    }
    if (a.offset == DC_OK && a.length != recv_bytes && recv_bytes != 0) {
        dlink_out_abort(o);
        status_set(st, DC_INTERNAL, "call link: malformed answer: a result of the wrong size");
        st->transport = true;
        return DC_INTERNAL;
    }
    /* A result nobody asked for (recv_bytes 0) is read and dropped, as GroupCall's is. */
    return dlink_call_finish(o, &a, recv_bytes != 0 ? recv : NULL, timeout_ms, st);
}

dc_code
dlink_call_send(struct dlink_out *o, const struct dlink_hdr *h, const void *data, size_t bytes,
                uint32_t timeout_ms, dc_status *st)
{
    return dlink_call_write(o, h, NULL, 0, data, bytes, timeout_ms, st);
}

dc_code
dlink_call_recv_any(struct dlink_out *o, uint64_t seq, size_t max_answer, uint32_t timeout_ms,
                    nng_msg **answer, dc_status *st)
{
    struct dlink_hdr a;
    nng_msg *m = NULL;
    dc_code code;

    *answer = NULL;
    if ((code = dlink_call_header(o, seq, max_answer, timeout_ms, &a, st)) != DC_OK) {
        return code;
    }
    if (a.offset == DC_OK && nng_msg_alloc(&m, a.length) != 0) {
        dlink_out_abort(o);
        status_set(st, DC_RESOURCE_EXHAUSTED, "call link: out of memory for an answer of %u bytes",
                   a.length);
        st->transport = true;
        return DC_RESOURCE_EXHAUSTED;
    }
    if ((code = dlink_call_finish(o, &a, m != NULL ? nng_msg_body(m) : NULL, timeout_ms, st)) !=
        DC_OK) {
        nng_msg_free(m);
        return code;
    }
    *answer = m;
    return DC_OK;
}
