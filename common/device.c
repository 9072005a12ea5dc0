#include "device.h"

#include <stdio.h>
#include <string.h>

#include "status.h"

static const char *const backend_names[DC_BACKEND_COUNT] = {
    [DC_BACKEND_CPU] = "cpu",         [DC_BACKEND_CUDA] = "cuda",
    [DC_BACKEND_ROCM] = "rocm",       [DC_BACKEND_METAL] = "metal",
    [DC_BACKEND_VULKAN] = "vulkan",   [DC_BACKEND_WGPU] = "wgpu",
    [DC_BACKEND_WEBGPU] = "webgpu",   [DC_BACKEND_FLEX] = "flex",
    [DC_BACKEND_NDARRAY] = "ndarray", [DC_BACKEND_LIBTORCH] = "libtorch",
    [DC_BACKEND_REMOTE] = "remote",
};

static const char *const kind_names[DC_KIND_COUNT] = {
    [DC_KIND_DISCRETE] = "discrete", [DC_KIND_INTEGRATED] = "integrated",
    [DC_KIND_VIRTUAL] = "virtual",   [DC_KIND_CPU] = "cpu",
    [DC_KIND_DEFAULT] = "default",   [DC_KIND_CUDA] = "cuda",
    [DC_KIND_MPS] = "mps",           [DC_KIND_VULKAN] = "vulkan",
};

#define AUTODIFF_OPEN     "autodiff("
#define AUTODIFF_OPEN_LEN (sizeof(AUTODIFF_OPEN) - 1)

const char *
dc_backend_name(dc_backend backend)
{
    if ((unsigned)backend >= DC_BACKEND_COUNT) {
        return NULL;
    }
    return backend_names[backend];
}

static dc_backend
backend_lookup(const char *name, size_t len)
{
    for (int b = DC_BACKEND_CPU; b < DC_BACKEND_COUNT; b++) {
        if (strlen(backend_names[b]) == len && memcmp(backend_names[b], name, len) == 0) {
            return (dc_backend)b;
        }
    }
    return DC_BACKEND_NONE;
}

dc_backend
dc_backend_from_name(const char *name)
{
    return backend_lookup(name, strlen(name));
}

const char *
dc_kind_name(dc_kind kind)
{
    if ((unsigned)kind >= DC_KIND_COUNT) {
        return NULL;
    }
    return kind_names[kind];
}

static bool
backend_is_wgpu_family(dc_backend backend)
{
    return backend == DC_BACKEND_WGPU || backend == DC_BACKEND_WEBGPU ||
           backend == DC_BACKEND_VULKAN || backend == DC_BACKEND_METAL;
}

dc_kind
device_default_kind(dc_backend backend)
{
    if (backend_is_wgpu_family(backend)) {
        return DC_KIND_DEFAULT;
    }
    if (backend == DC_BACKEND_LIBTORCH) {
        return DC_KIND_CPU;
    }
    return DC_KIND_NONE;
}

bool
device_kind_allowed(dc_backend backend, dc_kind kind)
{
    if (backend_is_wgpu_family(backend)) {
        return kind == DC_KIND_DISCRETE || kind == DC_KIND_INTEGRATED || kind == DC_KIND_VIRTUAL ||
               kind == DC_KIND_CPU || kind == DC_KIND_DEFAULT;
    }
    if (backend == DC_BACKEND_LIBTORCH) {
        return kind == DC_KIND_CUDA || kind == DC_KIND_MPS || kind == DC_KIND_VULKAN ||
               kind == DC_KIND_CPU;
    }
    return false;
}

static const char *
kinds_of(dc_backend backend)
{
    if (backend_is_wgpu_family(backend)) {
        return "discrete, integrated, virtual, cpu or default";
    }
    return "cuda, mps, vulkan or cpu";
}

dc_code
device_normalize(dc_device *dev, dc_status *st)
{
    const char *bname = dc_backend_name(dev->backend);

    if (dev->backend == DC_BACKEND_NONE || bname == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "unknown backend %d", (int)dev->backend);
    }
    if (dev->kind == DC_KIND_NONE) {
        dev->kind = device_default_kind(dev->backend);
        return DC_OK;
    }
    if (!device_kind_allowed(dev->backend, dev->kind)) {
        const char *kname = dc_kind_name(dev->kind);
        if (kname == NULL) {
            return status_set(st, DC_INVALID_ARGUMENT, "unknown device kind %d", (int)dev->kind);
        }
        return status_set(st, DC_INVALID_ARGUMENT, "backend %s has no kind %s", bname, kname);
    }
    return DC_OK;
}

static bool
is_lower(char c)
{
    return c >= 'a' && c <= 'z';
}

static bool
is_alpha(char c)
{
    return is_lower(c) || (c >= 'A' && c <= 'Z');
}

static bool
is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool
is_worker_char(char c)
{
    return is_alpha(c) || is_digit(c) || c == '.' || c == '_' || c == '-';
}

bool
device_worker_name_valid(const char *name, size_t len)
{
    if (len == 0 || len > DC_WORKER_NAME_MAX || !(is_alpha(name[0]) || is_digit(name[0]))) {
        return false;
    }
    for (size_t i = 1; i < len; i++) {
        if (!is_worker_char(name[i])) {
            return false;
        }
    }
    return true;
}

/* Quotes one character for an error message: 'x', or \xNN when it does not print. */
static const char *
char_quote(char c, char buf[8])
{
    unsigned char u = (unsigned char)c;
    if (u >= 0x20 && u < 0x7f && c != '\'') {
        snprintf(buf, 8, "'%c'", c);
    } else {
        snprintf(buf, 8, "\\x%02x", u);
    }
    return buf;
}

/* The parser: a cursor over the text; each step either advances or fills st. */
struct parser {
    const char *text;
    size_t len;
    size_t pos;
    dc_status *st;
};

static bool
parser_at_end(const struct parser *p)
{
    return p->pos >= p->len;
}

static dc_code
parser_expected(struct parser *p, const char *what)
{
    char q[8];
    if (parser_at_end(p)) {
        return status_set(p->st, DC_INVALID_ARGUMENT, "expected %s at %zu, found the end", what,
                          p->pos);
    }
    return status_set(p->st, DC_INVALID_ARGUMENT, "expected %s at %zu, found %s", what, p->pos,
                      char_quote(p->text[p->pos], q));
}

static dc_code
parse_worker(struct parser *p, size_t slash, dc_device_ref *out)
{
    char q[8];

    if (slash == 0) {
        return status_set(p->st, DC_INVALID_ARGUMENT, "expected a worker name before '/' at 0");
    }
    if (!(is_alpha(p->text[0]) || is_digit(p->text[0]))) {
        return status_set(p->st, DC_INVALID_ARGUMENT,
                          "worker name must start with a letter or digit, found %s at 0",
                          char_quote(p->text[0], q));
    }
    for (size_t i = 1; i < slash; i++) {
        if (!is_worker_char(p->text[i])) {
            return status_set(p->st, DC_INVALID_ARGUMENT,
                              "invalid character %s in worker name at %zu (expected a letter, "
                              "digit, '.', '_' or '-')",
                              char_quote(p->text[i], q), i);
        }
    }
    if (slash > DC_WORKER_NAME_MAX) {
        return status_set(p->st, DC_INVALID_ARGUMENT, "worker name longer than %d characters at %d",
                          DC_WORKER_NAME_MAX, DC_WORKER_NAME_MAX);
    }
    memcpy(out->worker, p->text, slash);
    out->worker[slash] = '\0';
    p->pos             = slash + 1;
    return DC_OK;
}

/* A run of letters starting at p->pos: its length. */
static size_t
parser_word(const struct parser *p)
{
    size_t n = 0;
    while (p->pos + n < p->len && is_alpha(p->text[p->pos + n])) {
        n++;
    }
    return n;
}

static dc_code
parse_backend(struct parser *p, dc_backend *out)
{
    size_t n      = parser_word(p);
    const char *w = p->text + p->pos;

    if (n == 0) {
        return parser_expected(p, "a backend");
    }
    *out = backend_lookup(w, n);
    if (*out != DC_BACKEND_NONE) {
        p->pos += n;
        return DC_OK;
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_lower(w[i])) {
            return status_set(p->st, DC_INVALID_ARGUMENT,
                              "unknown backend '%.*s' at %zu (backend names are lowercase)", (int)n,
                              w, p->pos);
        }
    }
    if (n == AUTODIFF_OPEN_LEN - 1 && memcmp(w, AUTODIFF_OPEN, n) == 0) {
        p->pos += n;
        return parser_expected(p, "'(' after autodiff");
    }
    return status_set(p->st, DC_INVALID_ARGUMENT,
                      "unknown backend '%.*s' at %zu (expected cpu, cuda, rocm, metal, vulkan, "
                      "wgpu, webgpu, flex, ndarray, libtorch or remote)",
                      (int)n, w, p->pos);
}

static dc_code
parse_index(struct parser *p, uint32_t *out)
{
    size_t start = p->pos;
    uint64_t v   = 0;

    if (parser_at_end(p) || !is_digit(p->text[p->pos])) {
        return parser_expected(p, "an index");
    }
    while (!parser_at_end(p) && is_digit(p->text[p->pos])) {
        v = v * 10 + (uint64_t)(p->text[p->pos] - '0');
        if (v > UINT32_MAX) {
            return status_set(p->st, DC_INVALID_ARGUMENT,
                              "index out of range at %zu (at most 4294967295)", start);
        }
        p->pos++;
    }
    *out = (uint32_t)v;
    return DC_OK;
}

static dc_code
parse_kind(struct parser *p, dc_backend backend, dc_kind *out)
{
    size_t n      = parser_word(p);
    const char *w = p->text + p->pos;

    for (int k = DC_KIND_DISCRETE; k < DC_KIND_COUNT; k++) {
        if (strlen(kind_names[k]) == n && memcmp(kind_names[k], w, n) == 0 &&
            device_kind_allowed(backend, (dc_kind)k)) {
            *out = (dc_kind)k;
            p->pos += n;
            return DC_OK;
        }
    }
    return status_set(p->st, DC_INVALID_ARGUMENT, "unknown kind '%.*s' for %s at %zu (expected %s)",
                      (int)n, w, dc_backend_name(backend), p->pos, kinds_of(backend));
}

static dc_code
parse_concrete(struct parser *p, dc_device *dev)
{
    dc_code rv;

    if ((rv = parse_backend(p, &dev->backend)) != DC_OK) {
        return rv;
    }
    dev->kind  = device_default_kind(dev->backend);
    dev->index = 0;
    if (parser_at_end(p) || p->text[p->pos] != ':') {
        return DC_OK;
    }
    p->pos++;
    if (!parser_at_end(p) && is_alpha(p->text[p->pos])) {
        if (dev->kind == DC_KIND_NONE) {
            return status_set(p->st, DC_INVALID_ARGUMENT,
                              "expected an index at %zu (backend %s has no kinds)", p->pos,
                              dc_backend_name(dev->backend));
        }
        if ((rv = parse_kind(p, dev->backend, &dev->kind)) != DC_OK) {
            return rv;
        }
        if (parser_at_end(p) || p->text[p->pos] != ':') {
            return DC_OK;
        }
        p->pos++;
    } else if (dev->kind != DC_KIND_NONE && (parser_at_end(p) || !is_digit(p->text[p->pos]))) {
        return parser_expected(p, "a kind or an index");
    }
    return parse_index(p, &dev->index);
}

dc_code
dc_device_ref_parse(const char *text, size_t len, dc_device_ref *out, dc_status *st)
{
    struct parser p = { .text = text, .len = len, .pos = 0, .st = st };
    const char *slash;
    dc_code rv;

    memset(out, 0, sizeof(*out));
    if (len == 0) {
        return status_set(st, DC_INVALID_ARGUMENT, "expected a device at 0, found the end");
    }
    if (len > DC_DEVICE_TEXT_MAX) {
        return status_set(st, DC_INVALID_ARGUMENT, "device reference longer than %d bytes at %d",
                          DC_DEVICE_TEXT_MAX, DC_DEVICE_TEXT_MAX);
    }
    if ((slash = memchr(text, '/', len)) != NULL &&
        (rv = parse_worker(&p, (size_t)(slash - text), out)) != DC_OK) {
        return rv;
    }
    while (p.len - p.pos >= AUTODIFF_OPEN_LEN &&
           memcmp(p.text + p.pos, AUTODIFF_OPEN, AUTODIFF_OPEN_LEN) == 0) {
        if (out->autodiff_depth == DC_AUTODIFF_MAX) {
            return status_set(st, DC_INVALID_ARGUMENT, "more than %d autodiff levels at %zu",
                              DC_AUTODIFF_MAX, p.pos);
        }
        out->autodiff_depth++;
        p.pos += AUTODIFF_OPEN_LEN;
    }
    if ((rv = parse_concrete(&p, &out->device)) != DC_OK) {
        return rv;
    }
    for (uint32_t i = 0; i < out->autodiff_depth; i++) {
        if (parser_at_end(&p) || p.text[p.pos] != ')') {
            return parser_expected(&p, "')'");
        }
        p.pos++;
    }
    if (!parser_at_end(&p)) {
        char q[8];
        return status_set(st, DC_INVALID_ARGUMENT, "unexpected %s at %zu",
                          char_quote(p.text[p.pos], q), p.pos);
    }
    return DC_OK;
}

/* Appends the len bytes at s at offset *n of buf; keeps counting past cap, as snprintf does. */
static void
put_mem(char *buf, size_t cap, size_t *n, const char *s, size_t len)
{
    if (*n < cap) {
        size_t room = cap - *n - 1;
        size_t k    = len < room ? len : room;
        memcpy(buf + *n, s, k);
        buf[*n + k] = '\0';
    }
    *n += len;
}

static void
put_str(char *buf, size_t cap, size_t *n, const char *s)
{
    put_mem(buf, cap, n, s, strlen(s));
}

static void
put_u32(char *buf, size_t cap, size_t *n, uint32_t v)
{
    char digits[16];
    size_t at = sizeof(digits) - 1;

    /* By hand: listings format a name per device, and snprintf was most of that cost. */
    digits[at] = '\0';
    do {
        digits[--at] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    put_str(buf, cap, n, digits + at);
}

size_t
dc_device_format(const dc_device *dev, char *buf, size_t cap)
{
    const char *bname = dc_backend_name(dev->backend);
    dc_kind kind      = dev->kind;
    size_t n          = 0;

    if (cap > 0) {
        buf[0] = '\0';
    }
    put_str(buf, cap, &n, bname != NULL ? bname : "invalid");
    if (kind == DC_KIND_NONE) {
        kind = device_default_kind(dev->backend);
    }
    if (kind != DC_KIND_NONE && dc_kind_name(kind) != NULL) {
        put_str(buf, cap, &n, ":");
        put_str(buf, cap, &n, dc_kind_name(kind));
    }
    put_str(buf, cap, &n, ":");
    put_u32(buf, cap, &n, dev->index);
    return n;
}

size_t
dc_device_ref_format(const dc_device_ref *ref, char *buf, size_t cap)
{
    /* A reference built by hand may claim any depth: write at most what parsing allows, so
     * DC_DEVICE_TEXT_SIZE always suffices. */
    uint32_t depth = ref->autodiff_depth < DC_AUTODIFF_MAX ? ref->autodiff_depth : DC_AUTODIFF_MAX;
    size_t n       = 0;

    if (cap > 0) {
        buf[0] = '\0';
    }
    if (ref->worker[0] != '\0') {
        put_str(buf, cap, &n, ref->worker);
        put_str(buf, cap, &n, "/");
    }
    for (uint32_t i = 0; i < depth; i++) {
        put_str(buf, cap, &n, AUTODIFF_OPEN);
    }
    n += dc_device_format(&ref->device, n < cap ? buf + n : NULL, n < cap ? cap - n : 0);
    for (uint32_t i = 0; i < depth; i++) {
        put_str(buf, cap, &n, ")");
    }
    return n;
}

size_t
device_cluster_name(const char *worker, const dc_device *dev, char *buf, size_t cap)
{
    size_t n = 0;

    /* What dc_device_ref_format writes for { worker, *dev, depth 0 }, without copying the
     * worker name into a reference first. */
    if (cap > 0) {
        buf[0] = '\0';
    }
    if (worker[0] != '\0') {
        /* At most what a reference's worker holds, as the copy into one did. */
        put_mem(buf, cap, &n, worker, strnlen(worker, DC_WORKER_NAME_MAX));
        put_str(buf, cap, &n, "/");
    }
    n += dc_device_format(dev, n < cap ? buf + n : NULL, n < cap ? cap - n : 0);
    return n;
}

int
device_ref_compare_concrete(const dc_device_ref *a, const dc_device_ref *b)
{
    int c      = strcmp(a->worker, b->worker);
    dc_kind ka = a->device.kind ? a->device.kind : device_default_kind(a->device.backend);
    dc_kind kb = b->device.kind ? b->device.kind : device_default_kind(b->device.backend);

    if (c != 0) {
        return c;
    }
    if (a->device.backend != b->device.backend) {
        return a->device.backend < b->device.backend ? -1 : 1;
    }
    if (ka != kb) {
        return ka < kb ? -1 : 1;
    }
    if (a->device.index != b->device.index) {
        return a->device.index < b->device.index ? -1 : 1;
    }
    return 0;
}

dc_code
device_from_pb(const Devcoord__V1__Device *pb, dc_device *out, dc_status *st)
{
    if (pb == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "device missing");
    }
    out->backend = (dc_backend)pb->backend;
    out->kind    = (dc_kind)pb->kind;
    out->index   = pb->index;
    return device_normalize(out, st);
}

dc_code
device_ref_from_pb(const Devcoord__V1__DeviceRef *pb, dc_device_ref *out, dc_status *st)
{
    size_t wlen;
    dc_code rv;

    memset(out, 0, sizeof(*out));
    if (pb == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "device missing");
    }
    wlen = pb->worker != NULL ? strnlen(pb->worker, DC_WORKER_NAME_MAX + 1) : 0;
    if (wlen > 0 && !device_worker_name_valid(pb->worker, wlen)) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "invalid worker name (expected [A-Za-z0-9][A-Za-z0-9._-]{0,62})");
    }
    if ((rv = device_from_pb(pb->device, &out->device, st)) != DC_OK) {
        return rv;
    }
    /* The text form allows 16 levels; so does the wire (it is a counter, not a nest, but a
     * huge one would make formatting, and every message naming the device, unbounded). */
    if (pb->autodiff_depth > DC_AUTODIFF_MAX) {
        return status_set(st, DC_INVALID_ARGUMENT, "autodiff depth %u exceeds %d",
                          pb->autodiff_depth, DC_AUTODIFF_MAX);
    }
    memcpy(out->worker, pb->worker, wlen);
    out->worker[wlen]   = '\0';
    out->autodiff_depth = pb->autodiff_depth;
    return DC_OK;
}

void
device_to_pb(const dc_device *dev, Devcoord__V1__Device *pb)
{
    devcoord__v1__device__init(pb);
    pb->backend = (Devcoord__V1__Backend)dev->backend;
    pb->kind    = (Devcoord__V1__Kind)dev->kind;
    pb->index   = dev->index;
}

void
device_ref_to_pb(dc_device_ref *ref, Devcoord__V1__DeviceRef *pb, Devcoord__V1__Device *dev)
{
    devcoord__v1__device_ref__init(pb);
    device_to_pb(&ref->device, dev);
    pb->worker         = ref->worker;
    pb->device         = dev;
    pb->autodiff_depth = ref->autodiff_depth;
}
