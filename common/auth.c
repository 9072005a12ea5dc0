#include "auth.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <yaml.h>

#include "device.h"
#include "dltls.h"
#include "rpc.h"

/* Room for tens of thousands of 64-character tokens with their worker names. */
#define TOKENS_FILE_MAX (16u << 20)
#define PEM_FILE_MAX    (1u << 20)

struct auth_token {
    char *token;
    size_t len;
    enum auth_role role;
    bool any_name; /* a worker token that may register any name (no names given) */
    char **names;  /* the worker names it may register otherwise, sorted */
    size_t n_names;
    unsigned line, column; /* of the token in the file */
};

/* The lookup index: tokens by their keyed digest (see token_digest). */
struct auth_slot {
    uint64_t digest;
    size_t index; /* into auth.tokens */
};

struct auth {
    atomic_uint refs;          /* auth_hold and auth_free */
    struct auth_token *tokens; /* in file order */
    size_t n, cap;
    struct auth_slot *slots; /* n of them, sorted by digest, then index */
    uint8_t key[16];         /* token_digest's key: random, never leaves the process */
};

static const struct {
    const char *name;
    enum auth_role role;
} role_names[] = {
    { "worker", ROLE_WORKER },
    { "trainer", ROLE_TRAINER },
    { "operator", ROLE_OPERATOR },
};

static const char *
role_name(enum auth_role r)
{
    for (size_t i = 0; i < sizeof(role_names) / sizeof(role_names[0]); i++) {
        if (role_names[i].role == r) {
            return role_names[i].name;
        }
    }
    return "none";
}

/* ---- constant time and randomness ---------------------------------------------------------- */

bool
auth_equal(const void *a, size_t alen, const void *b, size_t blen)
{
    const unsigned char *x = a, *y = b;
    size_t n                 = alen > blen ? alen : blen;
    volatile unsigned char d = (unsigned char)(alen != blen);

    for (size_t i = 0; i < n; i++) {
        d |= (unsigned char)((i < alen ? x[i] : 0) ^ (i < blen ? y[i] : 0));
    }
    return d == 0;
}

dc_code
auth_random_bytes(void *buf, size_t len, dc_status *st)
{
    unsigned char *p = buf;

    /* getrandom(2) without flags reads the kernel's CSPRNG (as /dev/urandom does, without
     * needing a file descriptor), blocking only until it was first seeded at boot. */
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return status_set(st, DC_UNAVAILABLE, "no random bytes: %s", strerror(errno));
        }
        p += n;
        len -= (size_t)n;
    }
    return DC_OK;
}

static uint64_t
load_le64(const unsigned char *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

#define ROTL64(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND(v0, v1, v2, v3) \
    do {                         \
        v0 += v1;                \
        v1 = ROTL64(v1, 13);     \
        v1 ^= v0;                \
        v0 = ROTL64(v0, 32);     \
        v2 += v3;                \
        v3 = ROTL64(v3, 16);     \
        v3 ^= v2;                \
        v0 += v3;                \
        v3 = ROTL64(v3, 21);     \
        v3 ^= v0;                \
        v2 += v1;                \
        v1 = ROTL64(v1, 17);     \
        v1 ^= v2;                \
        v2 = ROTL64(v2, 32);     \
    } while (0)

/*
 * The lookup key of a token: SipHash-2-4 under a random key made when the file is loaded.
 *
 * Why keyed, and why this keeps lookups safe to time. Finding a token by digest (a binary
 * search over the sorted digests) takes a path that depends on the digest of what a caller
 * sent, and only then compares the one candidate in full, in constant time. Watching that
 * path could at most tell a caller where the digests of the real tokens lie. With a public
 * hash that would be worth something: the digest of a weak token (a word, a short string)
 * could be searched for offline. Under a key the caller never sees, the digest of its guess
 * is unrelated to the digests of the real tokens (SipHash is a PRF), so the path says
 * nothing about them; what a caller can learn is only whether its token is known, which the
 * answer tells it anyway. The time of the digest itself depends on the length only.
 */
static uint64_t
token_digest(const uint8_t key[16], const char *token, size_t len)
{
    const unsigned char *in = (const unsigned char *)token;
    uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
    uint64_t last = (uint64_t)len << 56;
    size_t i;

    for (i = 0; i + 8 <= len; i += 8) {
        uint64_t m = load_le64(in + i);
        v3 ^= m;
        SIPROUND(v0, v1, v2, v3);
        SIPROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    for (size_t k = 0; i + k < len; k++) {
        last |= (uint64_t)in[i + k] << (8 * k);
    }
    v3 ^= last;
    SIPROUND(v0, v1, v2, v3);
    SIPROUND(v0, v1, v2, v3);
    v0 ^= last;
    v2 ^= 0xff;
    for (int r = 0; r < 4; r++) {
        SIPROUND(v0, v1, v2, v3);
    }
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- the tokens --------------------------------------------------------------------------- */

static void
auth_token_clear(struct auth_token *t)
{
    if (t->token != NULL) {
        /* Do not leave tokens in freed memory. */
        memset(t->token, 0, t->len);
        free(t->token);
    }
    for (size_t i = 0; i < t->n_names; i++) {
        free(t->names[i]);
    }
    free(t->names);
    memset(t, 0, sizeof(*t));
}

struct auth *
auth_hold(struct auth *a)
{
    if (a != NULL) {
        atomic_fetch_add(&a->refs, 1);
    }
    return a;
}

void
auth_free(struct auth *a)
{
    if (a == NULL || atomic_fetch_sub(&a->refs, 1) != 1) {
        return;
    }
    for (size_t i = 0; i < a->n; i++) {
        auth_token_clear(&a->tokens[i]);
    }
    free(a->tokens);
    free(a->slots);
    memset(a->key, 0, sizeof(a->key));
    free(a);
}

/* Reads a whole file of at most max bytes, NUL-terminated. */
static dc_code
read_file(const char *path, size_t max, char **out, size_t *len, dc_status *st)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    size_t n;

    if (f == NULL) {
        return status_set(st, DC_NOT_FOUND, "%s: cannot open: %s", path, strerror(errno));
    }
    if ((buf = malloc(max + 1)) == NULL) {
        fclose(f);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    n = fread(buf, 1, max + 1, f);
    fclose(f);
    if (n > max) {
        free(buf);
        return status_set(st, DC_INVALID_ARGUMENT, "%s: larger than %zu bytes", path, max);
    }
    buf[n] = '\0';
    *out   = buf;
    *len   = n;
    return DC_OK;
}

static bool
token_chars_ok(const char *t, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c <= 0x20 || c >= 0x7f) {
            return false;
        }
    }
    return len > 0 && len <= AUTH_TOKEN_MAX;
}

static int
slot_cmp(const void *x, const void *y)
{
    const struct auth_slot *a = x, *b = y;

    if (a->digest != b->digest) {
        return a->digest < b->digest ? -1 : 1;
    }
    return a->index < b->index ? -1 : a->index > b->index;
}

static int
name_cmp(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

/* Position of the first slot whose digest is >= digest. */
static size_t
slot_lower_bound(const struct auth *a, uint64_t digest)
{
    size_t lo = 0, hi = a->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->slots[mid].digest < digest) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* The entry of token, or NULL. Every entry sharing its digest (almost always none but the
 * one) is compared in full, in constant time. */
static const struct auth_token *
auth_find(const struct auth *a, const char *token)
{
    size_t len                     = strnlen(token, AUTH_TOKEN_MAX + 1);
    const struct auth_token *found = NULL;
    uint64_t digest;

    if (a == NULL || len == 0 || len > AUTH_TOKEN_MAX) {
        return NULL;
    }
    digest = token_digest(a->key, token, len);
    for (size_t i = slot_lower_bound(a, digest); i < a->n && a->slots[i].digest == digest; i++) {
        const struct auth_token *t = &a->tokens[a->slots[i].index];
        if (auth_equal(t->token, t->len, token, len)) {
            found = t;
        }
    }
    return found;
}

/* Sorts the index and each token's names; refuses a token listed twice (naming the first
 * repeat in the file). */
static dc_code
auth_index(struct auth *a, const char *name, dc_status *st)
{
    const struct auth_token *dup = NULL;

    if ((a->slots = calloc(a->n, sizeof(*a->slots))) == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < a->n; i++) {
        a->slots[i] =
            (struct auth_slot){ token_digest(a->key, a->tokens[i].token, a->tokens[i].len), i };
        if (a->tokens[i].n_names > 1) {
            qsort(a->tokens[i].names, a->tokens[i].n_names, sizeof(char *), name_cmp);
        }
    }
    qsort(a->slots, a->n, sizeof(*a->slots), slot_cmp);
    /* Equal tokens have equal digests, so they sit in one run of equal digests. */
    for (size_t run = 0, i = 1; i < a->n; i++) {
        const struct auth_token *t = &a->tokens[a->slots[i].index];
        if (a->slots[i].digest != a->slots[run].digest) {
            run = i;
            continue;
        }
        for (size_t k = run; k < i; k++) {
            const struct auth_token *u = &a->tokens[a->slots[k].index];
            if (auth_equal(u->token, u->len, t->token, t->len) && (dup == NULL || t < dup)) {
                dup = t;
            }
        }
    }
    if (dup != NULL) {
        return status_set(st, DC_INVALID_ARGUMENT, "%s:%u:%u: token listed twice", name, dup->line,
                          dup->column);
    }
    return DC_OK;
}

/* ---- reading a tokens file ---------------------------------------------------------------- */

/* A tokens file being read, one YAML event at a time. Messages never quote the file's text:
 * a misplaced token would end up in the log. */
struct tokens_reader {
    const char *name;
    yaml_parser_t parser;
    yaml_event_t ev; /* the current event, when have_ev */
    bool have_ev;
    struct auth *a;
    dc_status *st;
};

static unsigned
ev_line(const struct tokens_reader *r)
{
    return (unsigned)r->ev.start_mark.line + 1;
}

static unsigned
ev_column(const struct tokens_reader *r)
{
    return (unsigned)r->ev.start_mark.column + 1;
}

/* Fails with "file:line:column: what" at the current event. */
static dc_code __attribute__((format(printf, 2, 3)))
reader_fail(struct tokens_reader *r, const char *fmt, ...)
{
    char what[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return status_set(r->st, DC_INVALID_ARGUMENT, "%s:%u:%u: %s", r->name, ev_line(r), ev_column(r),
                      what);
}

/* Moves to the next event. Aliases are refused: nothing in a tokens file needs one, and
 * they would let a small file name one token many times over. */
static dc_code
reader_next(struct tokens_reader *r)
{
    if (r->have_ev) {
        yaml_event_delete(&r->ev);
        r->have_ev = false;
    }
    if (!yaml_parser_parse(&r->parser, &r->ev)) {
        return status_set(r->st, DC_INVALID_ARGUMENT, "%s:%zu:%zu: %s", r->name,
                          r->parser.problem_mark.line + 1, r->parser.problem_mark.column + 1,
                          r->parser.problem != NULL ? r->parser.problem : "syntax error");
    }
    r->have_ev = true;
    if (r->ev.type == YAML_ALIAS_EVENT) {
        return reader_fail(r, "aliases are not allowed in a tokens file");
    }
    return DC_OK;
}

static bool
reader_at_scalar(const struct tokens_reader *r)
{
    return r->ev.type == YAML_SCALAR_EVENT;
}

/* The current event, a scalar, as t's token. */
static dc_code
reader_token(struct tokens_reader *r, struct auth_token *t)
{
    const char *v = reader_at_scalar(r) ? (const char *)r->ev.data.scalar.value : "";
    size_t vlen   = reader_at_scalar(r) ? r->ev.data.scalar.length : 0;

    if (!token_chars_ok(v, vlen) || strlen(v) != vlen) {
        return reader_fail(r, "a token is 1 to %d printable characters without blanks",
                           AUTH_TOKEN_MAX);
    }
    if ((t->token = strndup(v, vlen)) == NULL) {
        return status_set(r->st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    t->len    = vlen;
    t->line   = ev_line(r);
    t->column = ev_column(r);
    return DC_OK;
}

/* The current event, a scalar, as t's role. */
static dc_code
reader_role(struct tokens_reader *r, struct auth_token *t)
{
    if (reader_at_scalar(r)) {
        for (size_t i = 0; i < sizeof(role_names) / sizeof(role_names[0]); i++) {
            if (strcmp((const char *)r->ev.data.scalar.value, role_names[i].name) == 0) {
                t->role = role_names[i].role;
                return DC_OK;
            }
        }
    }
    return reader_fail(r, "unknown role (expected worker, trainer or operator)");
}

/* Adds t (taking what it owns) to the tokens. */
static dc_code
reader_add(struct tokens_reader *r, struct auth_token *t)
{
    struct auth *a = r->a;

    if (a->n == a->cap) {
        size_t cap              = a->cap ? a->cap * 2 : 16;
        struct auth_token *grow = realloc(a->tokens, cap * sizeof(*grow));
        if (grow == NULL) {
            auth_token_clear(t);
            return status_set(r->st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        a->tokens = grow;
        a->cap    = cap;
    }
    a->tokens[a->n++] = *t;
    memset(t, 0, sizeof(*t));
    return DC_OK;
}

/* `token: role` pairs, after the mapping's start. */
static dc_code
reader_pairs(struct tokens_reader *r)
{
    struct auth_token t = { 0 };
    dc_code code;

    while ((code = reader_next(r)) == DC_OK && r->ev.type != YAML_MAPPING_END_EVENT) {
        if ((code = reader_token(r, &t)) != DC_OK || (code = reader_next(r)) != DC_OK) {
            break;
        }
        if (r->ev.type == YAML_MAPPING_START_EVENT || r->ev.type == YAML_SEQUENCE_START_EVENT) {
            code = reader_fail(r, "expected 'token: role' pairs, found a %s",
                               r->ev.type == YAML_MAPPING_START_EVENT ? "mapping" : "list");
            break;
        }
        if ((code = reader_role(r, &t)) != DC_OK) {
            break;
        }
        t.any_name = true;
        if ((code = reader_add(r, &t)) != DC_OK) {
            break;
        }
    }
    auth_token_clear(&t);
    return code;
}

/* An entry's names list, after its start. */
static dc_code
reader_names(struct tokens_reader *r, struct auth_token *t)
{
    dc_code code;

    while ((code = reader_next(r)) == DC_OK && r->ev.type != YAML_SEQUENCE_END_EVENT) {
        const char *v = reader_at_scalar(r) ? (const char *)r->ev.data.scalar.value : "";
        size_t vlen   = reader_at_scalar(r) ? r->ev.data.scalar.length : 0;
        char **grow;

        if (strlen(v) != vlen || !device_worker_name_valid(v, vlen)) {
            return reader_fail(r, "invalid worker name (expected [A-Za-z0-9][A-Za-z0-9._-]{0,62})");
        }
        if ((grow = realloc(t->names, (t->n_names + 1) * sizeof(*grow))) == NULL) {
            return status_set(r->st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        t->names = grow;
        if ((t->names[t->n_names] = strndup(v, vlen)) == NULL) {
            return status_set(r->st, DC_RESOURCE_EXHAUSTED, "out of memory");
        }
        t->n_names++;
    }
    return code;
}

/* One `{token: ..., role: ..., names: [...]}` entry, after the mapping's start. */
static dc_code
reader_entry(struct tokens_reader *r)
{
    static const char *const keys[] = { "token", "role", "names" };
    enum { KEY_TOKEN, KEY_ROLE, KEY_NAMES, KEY_COUNT };
    struct auth_token t  = { 0 };
    bool seen[KEY_COUNT] = { false };
    unsigned line = ev_line(r), column = ev_column(r);
    unsigned names_line = 0, names_column = 0;
    dc_code code;

    while ((code = reader_next(r)) == DC_OK && r->ev.type != YAML_MAPPING_END_EVENT) {
        int k = KEY_COUNT;
        for (int i = 0; reader_at_scalar(r) && i < KEY_COUNT; i++) {
            if (strcmp((const char *)r->ev.data.scalar.value, keys[i]) == 0) {
                k = i;
            }
        }
        if (k == KEY_COUNT) {
            /* Not quoted: a token written where a key belongs would go to the log. */
            code = reader_fail(r, "unknown key (expected token, role or names)");
            break;
        }
        if (seen[k]) {
            code = reader_fail(r, "%s given twice in one entry", keys[k]);
            break;
        }
        seen[k]      = true;
        names_line   = k == KEY_NAMES ? ev_line(r) : names_line;
        names_column = k == KEY_NAMES ? ev_column(r) : names_column;
        if ((code = reader_next(r)) != DC_OK) {
            break;
        }
        if (k == KEY_TOKEN) {
            code = reader_token(r, &t);
        } else if (k == KEY_ROLE) {
            code = reader_role(r, &t);
        } else if (r->ev.type != YAML_SEQUENCE_START_EVENT) {
            code = reader_fail(r, "names is a list of worker names, like [wa, wb]");
        } else {
            code = reader_names(r, &t);
        }
        if (code != DC_OK) {
            break;
        }
    }
    if (code == DC_OK && (!seen[KEY_TOKEN] || !seen[KEY_ROLE])) {
        code = status_set(r->st, DC_INVALID_ARGUMENT, "%s:%u:%u: an entry needs a token and a role",
                          r->name, line, column);
    } else if (code == DC_OK && seen[KEY_NAMES] && t.role != ROLE_WORKER) {
        code = status_set(r->st, DC_INVALID_ARGUMENT, "%s:%u:%u: names are for worker tokens only",
                          r->name, names_line, names_column);
    } else if (code == DC_OK) {
        t.any_name = !seen[KEY_NAMES];
        code       = reader_add(r, &t);
    }
    auth_token_clear(&t);
    return code;
}

/* A list of entries, after its start. */
static dc_code
reader_entries(struct tokens_reader *r)
{
    dc_code code;

    while ((code = reader_next(r)) == DC_OK && r->ev.type != YAML_SEQUENCE_END_EVENT) {
        if (r->ev.type != YAML_MAPPING_START_EVENT) {
            return reader_fail(r, "expected an entry {token: ..., role: ..., names: [...]}");
        }
        if ((code = reader_entry(r)) != DC_OK) {
            return code;
        }
    }
    return code;
}

dc_code
auth_parse(const char *name, const char *data, size_t len, struct auth **out, dc_status *st)
{
    struct tokens_reader r = { .name = name, .st = st };
    bool have_document     = false;
    dc_code code;

    *out = NULL;
    if ((r.a = calloc(1, sizeof(*r.a))) == NULL || !yaml_parser_initialize(&r.parser)) {
        free(r.a);
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    atomic_init(&r.a->refs, 1);
    yaml_parser_set_input_string(&r.parser, (const unsigned char *)data, len);
    if ((code = auth_random_bytes(r.a->key, sizeof(r.a->key), st)) != DC_OK) {
        goto out;
    }
    while ((code = reader_next(&r)) == DC_OK && r.ev.type != YAML_STREAM_END_EVENT) {
        bool node = r.ev.type == YAML_MAPPING_START_EVENT ||
                    r.ev.type == YAML_SEQUENCE_START_EVENT || r.ev.type == YAML_SCALAR_EVENT;
        if (node && have_document) {
            code = reader_fail(&r, "a tokens file holds one document");
        } else if (r.ev.type == YAML_MAPPING_START_EVENT) {
            code = reader_pairs(&r);
        } else if (r.ev.type == YAML_SEQUENCE_START_EVENT) {
            code = reader_entries(&r);
        } else if (r.ev.type == YAML_SCALAR_EVENT) {
            code = reader_fail(&r, "expected 'token: role' pairs or a list of entries "
                                   "{token: ..., role: ..., names: [...]}");
        }
        if (code != DC_OK) {
            break;
        }
        have_document |= node;
    }
    if (code == DC_OK && r.a->n == 0) {
        code = status_set(st, DC_INVALID_ARGUMENT, "%s: no tokens", name);
    }
    if (code == DC_OK) {
        code = auth_index(r.a, name, st);
    }
out:
    if (r.have_ev) {
        yaml_event_delete(&r.ev);
    }
    yaml_parser_delete(&r.parser);
    if (code != DC_OK) {
        auth_free(r.a);
        return code;
    }
    *out = r.a;
    return DC_OK;
}

dc_code
auth_load(const char *path, struct auth **out, dc_status *st)
{
    char *data = NULL;
    size_t len = 0;
    dc_code code;

    if ((code = read_file(path, TOKENS_FILE_MAX, &data, &len, st)) != DC_OK) {
        return code;
    }
    code = auth_parse(path, data, len, out, st);
    memset(data, 0, len);
    free(data);
    return code;
}

/* ---- the table in use, swapped on reload ---------------------------------------------------- */

struct auth_current {
    pthread_mutex_t mtx; /* guards `a` only: held for a pointer copy and a reference count */
    struct auth *a;
};

dc_code
auth_current_new(struct auth *a, struct auth_current **out, dc_status *st)
{
    struct auth_current *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        return status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&c->mtx, NULL);
    c->a = a;
    *out = c;
    return DC_OK;
}

struct auth *
auth_current_get(struct auth_current *c)
{
    struct auth *a;

    pthread_mutex_lock(&c->mtx);
    a = auth_hold(c->a);
    pthread_mutex_unlock(&c->mtx);
    return a;
}

void
auth_current_set(struct auth_current *c, struct auth *a)
{
    struct auth *old;

    pthread_mutex_lock(&c->mtx);
    old  = c->a;
    c->a = a;
    pthread_mutex_unlock(&c->mtx);
    /* Freed here, or by the last call still checking a token against it. */
    auth_free(old);
}

void
auth_current_free(struct auth_current *c)
{
    if (c == NULL) {
        return;
    }
    auth_free(c->a);
    pthread_mutex_destroy(&c->mtx);
    free(c);
}

dc_code
auth_current_check(struct auth_current *c, const struct auth_rule *rules, size_t n_rules,
                   const ProtobufCMethodDescriptor *method, const char *token, dc_status *st)
{
    struct auth *a = auth_current_get(c);
    dc_code code   = auth_check(a, rules, n_rules, method, token, st);

    auth_free(a);
    return code;
}

bool
auth_current_worker_may_be(struct auth_current *c, const char *token, const char *name)
{
    struct auth *a = auth_current_get(c);
    bool ok        = auth_worker_may_be(a, token, name);

    auth_free(a);
    return ok;
}

/* ---- lookups ------------------------------------------------------------------------------ */

enum auth_role
auth_role_of(const struct auth *a, const char *token)
{
    const struct auth_token *t = auth_find(a, token);

    return t != NULL ? t->role : ROLE_NONE;
}

bool
auth_worker_may_be(const struct auth *a, const char *token, const char *name)
{
    const struct auth_token *t = auth_find(a, token);

    if (t == NULL || t->role != ROLE_WORKER) {
        return false;
    }
    /* Names are no secret: an ordinary search is fine here. */
    return t->any_name || (t->n_names > 0 &&
                           bsearch(&name, t->names, t->n_names, sizeof(char *), name_cmp) != NULL);
}

const char *
auth_token_with(const struct auth *a, enum auth_role role)
{
    for (size_t i = 0; a != NULL && i < a->n; i++) {
        if (a->tokens[i].role == role) {
            return a->tokens[i].token;
        }
    }
    return NULL;
}

dc_code
auth_check(const struct auth *a, const struct auth_rule *rules, size_t n_rules,
           const ProtobufCMethodDescriptor *method, const char *token, dc_status *st)
{
    enum auth_role role;
    unsigned allowed = ROLE_NONE;
    char who[64]     = "";

    if (token == NULL || token[0] == '\0') {
        return status_set(st, DC_UNAUTHENTICATED,
                          "%s needs a token (--token-file or "
                          "DEVCOORD_TOKEN)",
                          method->name);
    }
    if ((role = auth_role_of(a, token)) == ROLE_NONE) {
        return status_set(st, DC_UNAUTHENTICATED, "unknown token");
    }
    for (size_t i = 0; i < n_rules; i++) {
        if (strcmp(rules[i].method, method->name) == 0) {
            allowed = rules[i].roles;
        }
    }
    if ((allowed & role) != 0) {
        return DC_OK;
    }
    for (size_t i = 0; i < sizeof(role_names) / sizeof(role_names[0]); i++) {
        if (allowed & role_names[i].role) {
            size_t n = strlen(who);
            snprintf(who + n, sizeof(who) - n, "%s%s", n ? " or " : "", role_names[i].name);
        }
    }
    return status_set(st, DC_PERMISSION_DENIED, "%s needs role %s; this token has role %s",
                      method->name, who[0] ? who : "(none)", role_name(role));
}

dc_code
auth_read_token_file(const char *path, char **out, dc_status *st)
{
    char *data = NULL, *start, *end;
    size_t len = 0;
    dc_code code;

    if ((code = read_file(path, 64 * 1024, &data, &len, st)) != DC_OK) {
        return code;
    }
    start = data;
    while (*start == ' ' || *start == '\t') {
        start++;
    }
    end = start + strcspn(start, "\r\n");
    while (end > start && (end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }
    if (!token_chars_ok(start, (size_t)(end - start))) {
        code = status_set(st, DC_INVALID_ARGUMENT,
                          "%s: the first line must hold the token (1 to %d printable characters)",
                          path, AUTH_TOKEN_MAX);
    } else if ((*out = strndup(start, (size_t)(end - start))) == NULL) {
        code = status_set(st, DC_RESOURCE_EXHAUSTED, "out of memory");
    }
    memset(data, 0, len);
    free(data);
    return code;
}

void
auth_url_host(const char *url, char *host, size_t cap)
{
    const char *p = strstr(url, "://");
    size_t n;

    p = p != NULL ? p + 3 : url;
    if (*p == '[') {
        p++;
        n = strcspn(p, "]");
    } else {
        n = strcspn(p, ":/");
    }
    snprintf(host, cap, "%.*s", (int)n, p);
}

/* Frees what tls_read_pems read, the key's bytes wiped first. */
static void
tls_pems_free(char *ca_pem, char *cert_pem, char *key_pem)
{
    if (key_pem != NULL) {
        memset(key_pem, 0, strlen(key_pem));
    }
    free(ca_pem);
    free(cert_pem);
    free(key_pem);
}

/* The files' PEM text (a NULL path: NULL). On failure nothing is left to free. */
static dc_code
tls_read_pems(const char *ca, const char *cert, const char *key, char **ca_pem, char **cert_pem,
              char **key_pem, dc_status *st)
{
    size_t len;
    dc_code code = DC_OK;

    *ca_pem = *cert_pem = *key_pem = NULL;
    if ((ca != NULL && (code = read_file(ca, PEM_FILE_MAX, ca_pem, &len, st)) != DC_OK) ||
        (cert != NULL && (code = read_file(cert, PEM_FILE_MAX, cert_pem, &len, st)) != DC_OK) ||
        (key != NULL && (code = read_file(key, PEM_FILE_MAX, key_pem, &len, st)) != DC_OK)) {
        tls_pems_free(*ca_pem, *cert_pem, *key_pem);
        *ca_pem = *cert_pem = *key_pem = NULL;
    }
    return code;
}

static dc_code
tls_load(nng_tls_config *cfg, const char *ca, const char *cert, const char *key, dc_status *st)
{
    char *ca_pem, *cert_pem, *key_pem;
    dc_code code;
    int rv;

    if ((code = tls_read_pems(ca, cert, key, &ca_pem, &cert_pem, &key_pem, st)) != DC_OK) {
        return code;
    }
    if (ca_pem != NULL && (rv = nng_tls_config_ca_chain(cfg, ca_pem, NULL)) != 0) {
        code = status_set(st, DC_INVALID_ARGUMENT, "%s: not a usable CA certificate: %s", ca,
                          nng_strerror(rv));
        goto out;
    }
    if (cert_pem != NULL && key_pem != NULL &&
        (rv = nng_tls_config_own_cert(cfg, cert_pem, key_pem, NULL)) != 0) {
        code = status_set(st, DC_INVALID_ARGUMENT, "%s / %s: not a usable certificate and key: %s",
                          cert, key, nng_strerror(rv));
    }
out:
    tls_pems_free(ca_pem, cert_pem, key_pem);
    return code;
}

dc_code
auth_tls_server(const struct config_tls *tls, nng_tls_config **out, dc_status *st)
{
    nng_tls_config *cfg;
    dc_code code;
    int rv;

    if (tls->cert == NULL || tls->key == NULL) {
        return status_set(st, DC_INVALID_ARGUMENT,
                          "a tls+tcp:// listener needs tls.cert and tls.key");
    }
    if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_SERVER)) != 0) {
        return status_set(st, DC_UNAVAILABLE, "TLS: %s", nng_strerror(rv));
    }
    if ((code = tls_load(cfg, tls->require_client_cert ? tls->ca : NULL, tls->cert, tls->key,
                         st)) != DC_OK ||
        (rv = nng_tls_config_auth_mode(cfg, tls->require_client_cert ? NNG_TLS_AUTH_MODE_REQUIRED
                                                                     : NNG_TLS_AUTH_MODE_NONE)) !=
            0) {
        if (code == DC_OK) {
            code = status_set(st, DC_INVALID_ARGUMENT, "TLS: %s", nng_strerror(rv));
        }
        nng_tls_config_free(cfg);
        return code;
    }
    *out = cfg;
    return DC_OK;
}

dc_code
auth_tls_client(const char *ca, const char *cert, const char *key, const char *server_name,
                nng_tls_config **out, dc_status *st)
{
    nng_tls_config *cfg;
    dc_code code;
    int rv;

    if ((cert == NULL) != (key == NULL)) {
        return status_set(st, DC_INVALID_ARGUMENT, "a client certificate needs both cert and key");
    }
    if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT)) != 0) {
        return status_set(st, DC_UNAVAILABLE, "TLS: %s", nng_strerror(rv));
    }
    /* Without a CA the server cannot be verified: refuse rather than trust anyone. */
    if (ca == NULL) {
        nng_tls_config_free(cfg);
        return status_set(st, DC_INVALID_ARGUMENT,
                          "a tls+tcp:// dialer needs a CA certificate to verify the server");
    }
    if ((code = tls_load(cfg, ca, cert, key, st)) != DC_OK ||
        (rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED)) != 0 ||
        (server_name != NULL && (rv = nng_tls_config_server_name(cfg, server_name)) != 0)) {
        if (code == DC_OK) {
            code = status_set(st, DC_INVALID_ARGUMENT, "TLS: %s", nng_strerror(rv));
        }
        nng_tls_config_free(cfg);
        return code;
    }
    *out = cfg;
    return DC_OK;
}

dc_code
auth_dltls_server(const struct config_tls *tls, struct dltls **out, dc_status *st)
{
    const char *ca = tls->require_client_cert ? tls->ca : NULL;
    char *ca_pem, *cert_pem, *key_pem;
    nng_tls_config *nng;
    dc_code code;

    if ((code = auth_tls_server(tls, &nng, st)) != DC_OK) {
        return code;
    }
    if ((code = tls_read_pems(ca, tls->cert, tls->key, &ca_pem, &cert_pem, &key_pem, st)) !=
        DC_OK) {
        nng_tls_config_free(nng);
        return code;
    }
    code = dltls_new(true, ca_pem, cert_pem, key_pem, tls->require_client_cert, NULL, nng, out, st);
    tls_pems_free(ca_pem, cert_pem, key_pem);
    return code;
}

dc_code
auth_dltls_client(const char *ca, const char *cert, const char *key, const char *server_name,
                  struct dltls **out, dc_status *st)
{
    char *ca_pem, *cert_pem, *key_pem;
    nng_tls_config *nng;
    dc_code code;

    if ((code = auth_tls_client(ca, cert, key, server_name, &nng, st)) != DC_OK) {
        return code;
    }
    if ((code = tls_read_pems(ca, cert, key, &ca_pem, &cert_pem, &key_pem, st)) != DC_OK) {
        nng_tls_config_free(nng);
        return code;
    }
    code = dltls_new(false, ca_pem, cert_pem, key_pem, true, server_name, nng, out, st);
    tls_pems_free(ca_pem, cert_pem, key_pem);
    return code;
}

dc_code
auth_client_open(const char *url, const char *token, const struct config_tls *tls,
                 size_t max_message_bytes, uint32_t reconnect_max_ms, struct rpc_client **out,
                 dc_status *st)
{
    return auth_client_open_watched(url, token, tls, max_message_bytes, reconnect_max_ms, NULL,
                                    NULL, out, st);
}

dc_code
auth_client_open_watched(const char *url, const char *token, const struct config_tls *tls,
                         size_t max_message_bytes, uint32_t reconnect_max_ms,
                         void (*on_connection)(void *arg, bool up), void *arg,
                         struct rpc_client **out, dc_status *st)
{
    struct rpc_client_opts opts = { 0 };
    nng_tls_config *cfg         = NULL;
    char host[256];
    dc_code code;

    if (strncmp(url, "tls+", 4) == 0) {
        auth_url_host(url, host, sizeof(host));
        if ((code = auth_tls_client(tls->ca, tls->cert, tls->key, host, &cfg, st)) != DC_OK) {
            return code;
        }
    }
    opts.url               = url;
    opts.token             = token;
    opts.tls               = cfg;
    opts.max_message_bytes = max_message_bytes;
    opts.reconnect_min_ms  = 20;
    opts.reconnect_max_ms  = reconnect_max_ms;
    opts.on_connection     = on_connection;
    opts.on_connection_arg = arg;
    code                   = rpc_client_open(&opts, out, st);
    /* The dialer holds its own reference. */
    if (cfg != NULL) {
        nng_tls_config_free(cfg);
    }
    return code;
}
